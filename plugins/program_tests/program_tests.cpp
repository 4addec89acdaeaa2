// "program_tests": a verifier (ABI 2.2) that runs candidate code against the task's tests in a sandbox
// and scores the share of tests that pass.
//
//   [verifier]
//   name = "program_tests"
//   interpreter = "/usr/bin/python3"  # runs the candidate and the tests (Python 3.7+); an absolute path
//   timeout_s = 5.0          # wall-clock limit per candidate, all its tests (0.1 .. 600); CPU time alike
//   memory_mb = 512          # address space per process (RLIMIT_AS), 16 .. 65536
//   max_processes = 16       # processes the candidate may have (RLIMIT_NPROC), 1 .. 4096
//   max_file_mb = 16         # the largest file it may write (RLIMIT_FSIZE), 1 .. 4096
//   prepend_prompt = false   # true: the program is the prompt followed by the candidate (a completion
//                            # of a given signature, HumanEval-style)
//
// The task (the request's JSON object: `loom verify`'s task line, `loom ab`'s JSONL line) gives
// "tests": a list of Python snippets (an assert, a call); the score is the share that run without an
// exception. The code is the candidate's first fenced block (```python … ```) when it has one, else its
// whole text.
//
// Who decides a verdict. The candidate's code never runs in a process that reports one:
//   - the candidate's process (a python that loads its code once; a fresh fork of it per test) runs in
//     a PID namespace of its own, so it cannot see, signal or trace anything outside; it holds one
//     socket, to its test's judge, and nothing else (no report channel, no test source);
//   - the judge (a python of ours, a fresh fork per test) runs the test with the candidate's top-level
//     names bound to references: calling `f(1)` asks the candidate over the socket, whose answer comes
//     back as plain data read with ast.literal_eval (None, numbers, strings, bytes, lists, tuples,
//     dicts, sets, named tuples); anything else stays a reference that can be called, indexed and
//     iterated further but compares equal only to itself — the candidate's __eq__, __hash__ or any
//     other code of its never runs in the judge. Its exceptions come back as exceptions of that class
//     (or of one made with its name and first builtin base); it dying, exiting or answering out of
//     protocol fails the test whatever the test catches. Builtins cannot be shadowed by the candidate;
//   - a test passes when its judge process wrote so on a pipe of its own and exited 0; their parent
//     (a python that never runs candidate code nor reads its data) writes one byte per test on the
//     report pipe to this process, in order. That pipe is the only channel trusted: the candidate
//     never holds it (every process starts with only the descriptors it is given), and its stdout
//     and stderr go to /dev/null. Each test costs two forks (a few ms); the next test's candidate
//     process is forked while a test runs.
// What that costs: values passed to the candidate are copies (in-place changes do not come back), the
// test cannot pass it callables of its own, and candidate-defined objects compare by identity.
//
// The sandbox — all of it, or the candidate does not run (the verifier fails with the reason):
//   - an init of ours (not Python) is PID 1 of new PID, network, mount, IPC and UTS namespaces (and a
//     user namespace: as root it maps only nobody, 65534; without one, root's own namespaces and a
//     drop to nobody); killing it at the verdict ends every process of the run, wherever it moved
//     (setsid, double fork) — the PID namespace, not a process group, is what is killed;
//   - a mount namespace whose root is an empty read-only tmpfs holding only read-only binds of /usr,
//     /bin, /lib* (symlinks kept as such), the interpreter's prefix, /etc/ld.so.cache and
//     /etc/localtime, a made-up /etc/passwd and /etc/group, /dev/{null,zero,full,random,urandom},
//     the harness at /loom, and the candidate's temporary directory read-write at /task (its cwd,
//     HOME and TMPDIR); the host's root is unmounted (pivot_root), there is no /proc, /sys or /tmp,
//     so no other file, and no Unix socket with a path, can be reached; abstract Unix sockets and
//     the network are the new network namespace's (a down loopback);
//   - Landlock: nothing may be written, created or removed outside /task (and /dev's devices);
//   - seccomp (x86-64, AArch64): no namespaces (clone/unshare/setns), mount, ptrace,
//     process_vm_*, bpf, io_uring, keyctl, perf_event_open, userfaultfd, module or kexec calls;
//   - rlimits per process: CPU seconds, address space, file size, open files (64), no core dumps;
//     processes: max_processes plus the sandbox's own six; no capabilities, no new privileges;
//   - the wall-clock limit: at timeout_s the namespaces' init is killed, with everything in them.
// LOOM_SANDBOX_DISABLE=landlock|netns|mountns (tests only) makes that part count as missing;
// LOOM_SANDBOX_DISABLE=userns makes root use its own namespaces (the fallback) and others refuse.
#include "loom/sdk/plugin.hpp"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/seccomp.h>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <sched.h>
#include <set>
#include <string>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 1U
#endif

namespace {

namespace fs = std::filesystem;

// The child's exit code that means the sandbox could not be set up (the reason is on the status pipe).
constexpr int k_sandbox_failed = 121;
constexpr unsigned k_nobody = 65534;

// ---- the Python halves (written to <dir>/loom; each file is k_codec and its main) ----

// The wire format and the value codec, shared by the judge and the candidate's side.
constexpr const char* k_codec = R"PY(import ast, builtins, collections, os, struct, sys

# The wire: frames of a 4-byte big-endian length and the repr() of a tuple of plain literals, read
# back with ast.literal_eval (never eval, pickle or marshal). A value is a tagged node: ('v', x) for
# None/bool/int/str/bytes, ('f', float.hex()), ('l', [nodes]) for a list, ... and ('r', id, type)
# for an object that is not plain data: a reference to the candidate's object, never the object.
MAX_MSG = 1 << 20
LITERALS = (type(None), bool, int, str, bytes)
SEQUENCES = {'l': list, 't': tuple, 's': set, 'z': frozenset}
SEQUENCE_TAGS = {list: 'l', tuple: 't', set: 's', frozenset: 'z'}
NAMED = {collections.OrderedDict: 'OrderedDict', collections.Counter: 'Counter',
         collections.defaultdict: 'defaultdict', collections.deque: 'deque'}
_tuple_classes = {}


def read_exact(fd, n):
    parts = []
    while n:
        b = os.read(fd, min(n, MAX_MSG))
        if not b:
            raise EOFError('the channel was closed')
        parts.append(b)
        n -= len(b)
    return b''.join(parts)


def frame(msg):
    data = repr(msg).encode('utf-8')
    if len(data) > MAX_MSG:
        raise ValueError('a message over %d bytes' % MAX_MSG)
    return struct.pack('>I', len(data)) + data


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def recv(fd):
    n = struct.unpack('>I', read_exact(fd, 4))[0]
    if n > MAX_MSG:
        raise ValueError('a message over %d bytes' % MAX_MSG)
    return ast.literal_eval(read_exact(fd, n).decode('utf-8'))


def encode(x, ref, depth=0):
    t = type(x)
    if t in LITERALS:
        if t is int and x.bit_length() > 12000:
            return ('x', hex(x))
        return ('v', x)
    if t is float:
        return ('f', x.hex())
    if t is complex:
        return ('c', x.real.hex(), x.imag.hex())
    if depth > 48:
        raise ValueError('a value nested too deeply')
    d = depth + 1
    tag = SEQUENCE_TAGS.get(t)
    if tag:
        return (tag, [encode(y, ref, d) for y in x])
    if t is dict:
        return ('d', [(encode(k, ref, d), encode(v, ref, d)) for k, v in x.items()])
    if t is bytearray:
        return ('b', bytes(x))
    if t in NAMED:
        if t is collections.deque:
            return ('k', 'deque', [encode(y, ref, d) for y in x])
        return ('k', NAMED[t], [(encode(k, ref, d), encode(v, ref, d)) for k, v in x.items()])
    if isinstance(x, tuple) and type(getattr(t, '_fields', None)) is tuple:
        return ('n', t.__name__, list(t._fields), [encode(y, ref, d) for y in tuple.__iter__(x)])
    for base in (int, float, str, bytes, complex):  # an IntEnum, a numpy float: the value
        if isinstance(x, base) and not isinstance(x, bool):
            return encode(base(x), ref, d)
    m = t.__module__
    if m == 'numpy' and hasattr(x, 'tolist'):  # numpy scalars and arrays: Python values and lists
        return encode(x.tolist(), ref, d)
    if m == 'fractions' and t is sys.modules['fractions'].Fraction:
        return ('q', 'Fraction', x.numerator, x.denominator)
    if m in ('decimal', '_decimal', '_pydecimal') and t.__name__ == 'Decimal':
        return ('q', 'Decimal', str(x))
    if m == 'datetime' and getattr(x, 'tzinfo', None) is None and t.__name__ in ('date', 'datetime', 'time'):
        return ('q', t.__name__, x.isoformat())
    if m == 'datetime' and t.__name__ == 'timedelta':
        return ('q', 'timedelta', x.days, x.seconds, x.microseconds)
    return ref(x)


def _pairs(items, ref, depth):
    if type(items) is not list:
        raise ValueError('malformed value')
    out = []
    for p in items:
        if type(p) is not tuple or len(p) != 2:
            raise ValueError('malformed value')
        out.append((decode(p[0], ref, depth), decode(p[1], ref, depth)))
    return out


def _tuple_class(name, fields):
    key = (name, fields)
    cls = _tuple_classes.get(key)
    if cls is None:
        cls = _tuple_classes[key] = collections.namedtuple(name, fields)
    return cls


def _value_type(n):
    # The standard library's value types, made here from their parts.
    kind, parts = n[1], n[2:]
    if kind == 'Fraction' and len(parts) == 2 and all(type(p) is int for p in parts):
        import fractions
        return fractions.Fraction(*parts)
    if kind == 'Decimal' and len(parts) == 1 and type(parts[0]) is str and len(parts[0]) < 65536:
        import decimal
        return decimal.Decimal(parts[0])
    if kind in ('date', 'datetime', 'time') and len(parts) == 1 and type(parts[0]) is str and len(parts[0]) < 64:
        import datetime
        return getattr(datetime, kind).fromisoformat(parts[0])
    if kind == 'timedelta' and len(parts) == 3 and all(type(p) is int for p in parts):
        import datetime
        return datetime.timedelta(*parts)
    raise ValueError('malformed value')


def decode(n, ref, depth=0):
    if type(n) is not tuple or not n or depth > 100:
        raise ValueError('malformed value')
    tag, k, d = n[0], len(n), depth + 1
    if tag == 'v' and k == 2 and type(n[1]) in LITERALS:
        return n[1]
    if tag == 'f' and k == 2 and type(n[1]) is str:
        return float.fromhex(n[1])
    if tag in SEQUENCES and k == 2 and type(n[1]) is list:
        return SEQUENCES[tag]([decode(y, ref, d) for y in n[1]])
    if tag == 'd' and k == 2:
        return dict(_pairs(n[1], ref, d))
    if tag == 'x' and k == 2 and type(n[1]) is str and len(n[1]) < 65536:
        return int(n[1], 16)
    if tag == 'c' and k == 3 and type(n[1]) is str and type(n[2]) is str:
        return complex(float.fromhex(n[1]), float.fromhex(n[2]))
    if tag == 'b' and k == 2 and type(n[1]) is bytes:
        return bytearray(n[1])
    if tag == 'k' and k == 3 and n[1] in NAMED.values():
        if n[1] == 'deque':
            if type(n[2]) is not list:
                raise ValueError('malformed value')
            return collections.deque([decode(y, ref, d) for y in n[2]])
        pairs = _pairs(n[2], ref, d)
        if n[1] == 'defaultdict':
            return collections.defaultdict(None, pairs)
        return collections.OrderedDict(pairs) if n[1] == 'OrderedDict' else collections.Counter(dict(pairs))
    if tag == 'q' and k >= 3:
        return _value_type(n)
    if (tag == 'n' and k == 4 and type(n[1]) is str and type(n[2]) is list and type(n[3]) is list and
            len(n[2]) == len(n[3]) <= 255 and all(type(f) is str for f in n[2])):
        return _tuple_class(n[1], tuple(n[2]))(*[decode(y, ref, d) for y in n[3]])
    return ref(n)
)PY";

constexpr const char* k_judge = R"PY(
# ---- the judge: runs each test (trusted code) against references to the candidate's objects ----
import array, importlib, json, socket

TESTS_FD, REPORT_FD, CTRL_FD = 0, 3, 4
STDLIB = getattr(sys, 'stdlib_module_names', None) or frozenset((
    'abc', 'array', 'bisect', 'collections', 'copy', 'datetime', 'decimal', 'fractions', 'functools',
    'heapq', 'itertools', 'json', 'math', 'operator', 'random', 're', 'statistics', 'string', 'sys',
    'time', 'typing', 'unicodedata', 'os', 'cmath', 'enum', 'dataclasses'))
NOISY = frozenset(('antigravity', 'this', '__hello__', '__phello__', 'idlelib', 'tkinter', 'turtle',
                   'turtledemo', '__main__'))


DUNDERS = frozenset(('__name__', '__qualname__', '__doc__', '__module__', '__dict__'))


class Broken(BaseException):
    """The candidate's side failed (it died, answered out of protocol, exited): the test fails
    whatever it catches."""


class CandidateError(Exception):
    """An exception of the candidate's that has no class here."""


def _stdlib(module):
    parts = module.split('.')
    return all(p.isidentifier() for p in parts) and parts[0] in STDLIB and parts[0] not in NOISY


class Remote:
    """A reference to one of the candidate's objects. Calls, attributes, items, len(), iter() and
    the conversions are asked of the candidate, whose answers come back as plain values. It compares
    equal only to itself: an object's own __eq__ never runs here."""
    __slots__ = ('_c', '_i', '_t', '__weakref__')

    def __init__(self, conn, i, t):
        object.__setattr__(self, '_c', conn)
        object.__setattr__(self, '_i', i)
        object.__setattr__(self, '_t', t)

    def _ask(self, op, *args):
        return object.__getattribute__(self, '_c').request(op, object.__getattribute__(self, '_i'), *args)

    def __getattr__(self, name):
        # Not the protocols asked of any object (numpy's __array_interface__ would take the candidate's
        # word for an address): of the dunder names, only these are asked.
        if name.startswith('__') and name.endswith('__') and name not in DUNDERS or name in ('_c', '_i', '_t'):
            raise AttributeError(name)
        return self._ask('getattr', name)

    def __setattr__(self, name, value):
        self._ask('setattr', name, self._c.encode(value))

    def __delattr__(self, name):
        self._ask('delattr', name)

    def __call__(self, *args, **kwargs):
        c = self._c
        return self._ask('call', [c.encode(a) for a in args], [(k, c.encode(v)) for k, v in kwargs.items()])

    def __getitem__(self, key):
        return self._ask('getitem', self._c.encode(key))

    def __setitem__(self, key, value):
        self._ask('setitem', self._c.encode(key), self._c.encode(value))

    def __delitem__(self, key):
        self._ask('delitem', self._c.encode(key))

    def _typed(self, op, types):
        r = self._ask(op)
        if type(r) not in types:
            raise TypeError('%s() of the candidate\'s %s returned %s' % (op, self._t, type(r).__name__))
        return r

    def __len__(self):
        return self._typed('len', (int,))

    def __iter__(self):
        return self._typed('iter', (Remote,))

    def __next__(self):
        return self._ask('next')

    def __bool__(self):
        return self._typed('bool', (bool,))

    def __str__(self):
        return self._typed('str', (str,))

    def __int__(self):
        return self._typed('int', (int, bool))

    def __index__(self):
        return self._typed('index', (int, bool))

    def __float__(self):
        return self._typed('float', (float,))

    def __repr__(self):
        try:
            r = self._ask('repr')
            if type(r) is str:
                return r
        except Exception:
            pass
        return '<the candidate\'s %s>' % self._t


class Conn:
    """The judge's end of one test's channel to its candidate process."""

    def __init__(self, fd):
        self.fd, self.broken = fd, False
        self.remotes, self.classes, self.names = {}, {}, {}

    def encode(self, value):
        return encode(value, self._ref_out)

    def _ref_out(self, x):
        if type(x) is Remote and x._c is self:
            return ('r', x._i)
        raise TypeError('only plain values (None, numbers, strings, bytes, lists, tuples, dicts, sets) and '
                        'the candidate\'s own objects can be passed to the candidate, not %s' % type(x).__name__)

    def request(self, *msg):
        if self.broken:
            raise Broken('the candidate\'s process is gone')
        try:
            write_all(self.fd, frame(msg))
            r = recv(self.fd)
            if type(r) is tuple and len(r) == 2 and r[0] == 'ok':
                return decode(r[1], self._ref_in)
            if type(r) is not tuple or len(r) != 6 or r[0] != 'exc':
                raise ValueError('malformed reply')
            cls = self._class(*r[1:5])
            args = decode(r[5], self._ref_in)
            if type(args) is not tuple:
                raise ValueError('malformed reply')
        except Exception as e:
            self.broken = True
            raise Broken('the candidate\'s side failed: %s: %s' % (type(e).__name__, e)) from None
        except BaseException:
            self.broken = True
            raise
        if not issubclass(cls, Exception):  # SystemExit, KeyboardInterrupt, GeneratorExit...
            self.broken = True
            raise Broken('the candidate raised %s' % cls.__name__)
        if issubclass(cls, (StopIteration, StopAsyncIteration)) and msg[0] != 'next':
            # only an iterator's end; from a call it would end the test's loop over map(f, ...) early
            raise RuntimeError('the candidate raised %s' % cls.__name__)
        try:
            e = cls.__new__(cls, *args)
            e.args = args
        except Exception:
            e = CandidateError(*args)
        raise e

    def _ref_in(self, n):
        tag, k = n[0], len(n)
        if tag == 'r' and k == 3 and type(n[1]) is int and type(n[2]) is str:
            r = self.remotes.get(n[1])
            if r is None:
                r = self.remotes[n[1]] = Remote(self, n[1], n[2][:200])
            return r
        if tag == 'm' and k == 3 and type(n[1]) is str and type(n[2]) is int:
            if _stdlib(n[1]):  # the candidate's module of the standard library: the judge's own
                try:
                    return importlib.import_module(n[1])
                except Exception:
                    pass
            return self._ref_in(('r', n[2], 'module'))
        if tag == 'e' and k == 5:
            return self._class(*n[1:])
        raise ValueError('malformed value')

    def _class(self, cid, module, qualname, mro):
        """The class of an exception the candidate raised: the builtin or standard-library class of that
        name, else (its own class) a class made here with its name and first builtin base."""
        if (type(cid) not in (int, type(None)) or type(module) is not str or type(qualname) is not str or
                type(mro) is not list or len(mro) > 64 or not all(type(m) is str for m in mro)):
            raise ValueError('malformed exception')
        cls = self.classes.get(cid)
        if cls is not None:
            return cls
        if module == 'builtins':
            cls = getattr(builtins, qualname, None)
        elif _stdlib(module) and all(p.isidentifier() for p in qualname.split('.')):
            try:
                cls = importlib.import_module(module)
                for p in qualname.split('.'):
                    cls = getattr(cls, p)
            except Exception:
                cls = None
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            base = Exception
            for m in mro[1:]:
                b = getattr(builtins, m, None)
                if isinstance(b, type) and issubclass(b, BaseException):
                    base = b
                    break
            name = qualname.rpartition('.')[2][:200] or 'CandidateError'
            cls = type(name, (base,), {'__module__': 'candidate', '__qualname__': name})
        if cid is not None:
            self.classes[cid] = cls
        return cls

    def global_(self, name):
        v = self.names.get(name)
        if v is None:
            v = self.request('global', name)
            if type(v) is Remote or isinstance(v, type) or type(v) is type(sys):
                self.names[name] = v  # the candidate's functions, classes, modules: fetched once
        return v


class Names(dict):
    """The test's globals: its own names, then the candidate's top-level names (fetched when used, so
    the test sees their current values), then the builtins (which the candidate cannot shadow)."""
    __slots__ = ('conn',)

    def __missing__(self, name):
        if type(name) is not str or name.startswith('__') or hasattr(builtins, name):
            raise KeyError(name)
        try:
            return self.conn.global_(name)
        except NameError:
            raise KeyError(name) from None


def judge(src, fd):
    conn = Conn(fd)
    g = Names()
    g.conn = conn
    g['__builtins__'], g['__name__'] = builtins, '__main__'
    try:
        exec(compile(src, '<test>', 'exec'), g)
    except BaseException:
        return False
    return not conn.broken


def hand_off(ctrl):
    """A socket to a fresh fork of the loaded candidate (made as soon as the candidate reads this)."""
    a, b = socket.socketpair()
    try:
        ctrl.sendmsg([b'T'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [b.fileno()]))])
    except BaseException:
        a.close()
        raise
    finally:
        b.close()
    return a


def start(src, a, ctrl):
    """Test `src` in a fresh process of its own, on socket `a` to its candidate process."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            os.close(r)
            os.close(REPORT_FD)
            ctrl.close()
            ok = judge(src, a.fileno())
            os.write(w, b'P' if ok else b'F')
        finally:
            os._exit(0 if ok else 1)
    os.close(w)
    return pid, r


def passed(pid, r):
    """A test passed when its process said so and exited 0."""
    status = os.waitpid(pid, 0)[1]
    os.set_blocking(r, False)  # what it wrote is there (a process the test left may hold the pipe)
    try:
        got = os.read(r, 1)
    except BlockingIOError:
        got = b''
    os.close(r)
    return status == 0 and got == b'P'


def main():
    chunks = []
    while True:
        b = os.read(TESTS_FD, 1 << 20)
        if not b:
            break
        chunks.append(b)
    tests = json.loads(b''.join(chunks))
    try:
        ready = os.read(CTRL_FD, 1) == b'R'  # the candidate's code loaded
    except OSError:
        ready = False
    ctrl = socket.socket(fileno=CTRL_FD)
    following = None  # the next test's socket, handed to the candidate while this test runs
    for i, src in enumerate(tests):
        ok = False
        if ready:
            try:
                a, following = following or hand_off(ctrl), None
                pid, r = start(src, a, ctrl)
                a.close()
                if i + 1 < len(tests):
                    try:
                        following = hand_off(ctrl)
                    except Exception:
                        following = None
                ok = passed(pid, r)
            except Exception:
                ok = False
        os.write(REPORT_FD, b'P' if ok else b'F')

main()
)PY";

constexpr const char* k_candidate = R"PY(
# ---- the candidate's side: loads its code once, then serves each test from a fresh fork ----
import operator, socket, types

CTRL_FD = 3
OPS = {
    'getattr': lambda o, m: getattr(o, m[2]),
    'setattr': lambda o, m: setattr(o, m[2], value(m[3])),
    'delattr': lambda o, m: delattr(o, m[2]),
    'getitem': lambda o, m: o[value(m[2])],
    'setitem': lambda o, m: operator.setitem(o, value(m[2]), value(m[3])),
    'delitem': lambda o, m: operator.delitem(o, value(m[2])),
    'call': lambda o, m: o(*[value(a) for a in m[2]], **{k: value(v) for k, v in m[3]}),
    'len': lambda o, m: len(o), 'iter': lambda o, m: iter(o), 'next': lambda o, m: next(o),
    'bool': lambda o, m: bool(o), 'repr': lambda o, m: repr(o), 'str': lambda o, m: str(o),
    'int': lambda o, m: int(o), 'index': lambda o, m: operator.index(o), 'float': lambda o, m: float(o),
}
objects, ids = {}, {}


def ref_id(x):
    i = ids.get(id(x))
    if i is None:
        i = ids[id(x)] = len(objects) + 1
        objects[i] = x
    return i


def ref(x):
    if isinstance(x, types.ModuleType):
        return ('m', str(x.__name__), ref_id(x))
    if isinstance(x, type) and issubclass(x, BaseException):
        return ('e', None if x.__module__ == 'builtins' else ref_id(x), str(x.__module__),
                str(x.__qualname__), [str(c.__name__) for c in x.__mro__])
    return ('r', ref_id(x), str(type(x).__name__))


def own(n):
    if n[0] != 'r' or len(n) != 2:
        raise ValueError('malformed value')
    return objects[n[1]]


def value(n):
    return decode(n, own)


def reply(msg, ns):
    try:
        if msg[0] == 'global':
            try:
                result = ns[msg[1]]
            except KeyError:
                raise NameError('name %r is not defined' % msg[1]) from None
        else:
            result = OPS[msg[0]](objects[msg[1]], msg)
        try:
            return frame(('ok', encode(result, ref)))
        except (ValueError, RecursionError, MemoryError):  # too large or deep to send: a reference
            return frame(('ok', ref(result)))
    except BaseException as e:
        t = type(e)
        try:
            args = encode(e.args, ref)
            frame(args)
        except BaseException:
            args = ('t', [('v', str(e)[:65536])])
        return frame(('exc',) + ref(t)[1:] + (args,))


def serve(fd, ns):
    while True:
        try:
            msg = recv(fd)
        except BaseException:
            os._exit(0)
        write_all(fd, reply(msg, ns))


def main():
    with open('/loom/candidate.py', 'rb') as f:
        src = f.read()
    ns = {'__name__': '__candidate__', '__builtins__': builtins}
    try:
        exec(compile(src, 'candidate.py', 'exec'), ns)
    except BaseException:
        os._exit(3)
    os.write(CTRL_FD, b'R')
    ctrl = socket.socket(fileno=CTRL_FD)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        msg, anc, _, _ = ctrl.recvmsg(1, socket.CMSG_SPACE(4))
        if not msg:
            os._exit(0)
        fds = [int.from_bytes(d[:4], sys.byteorder) for lvl, typ, d in anc
               if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS]
        for fd in fds:
            if os.fork() == 0:
                ctrl.close()
                serve(fd, ns)
            os.close(fd)


try:
    main()
finally:
    os._exit(0)
)PY";

// Sandbox-internal paths (the mount namespace's view).
constexpr const char* k_task_dir = "/task";
constexpr const char* k_judge_py = "/loom/judge.py";
constexpr const char* k_candidate_py = "/loom/candidate_side.py";

std::string code_of(const std::string& text) {
  const size_t open = text.find("```");
  if (open == std::string::npos) return text;
  const size_t line = text.find('\n', open);
  if (line == std::string::npos) return text;
  const size_t close = text.find("```", line + 1);
  return text.substr(line + 1, (close == std::string::npos ? text.size() : close) - line - 1);
}

bool disabled(const char* part) {
  const char* d = std::getenv("LOOM_SANDBOX_DISABLE");
  return d && std::strstr(d, part) != nullptr;
}

[[noreturn]] void refuse(const std::string& why) {
  throw loom::sdk::Error("program_tests: the sandbox could not be set up (" + why +
                         "); refusing to run candidate code without it");
}

// ---- the forked processes: system calls only (no allocation: the parent may have other threads) ----

// Async-signal-safe reporting: the step that failed (and the path it was at), errno on the status pipe,
// then exit.
[[noreturn]] void child_fail(int fd, const char* what, const char* path = nullptr) {
  const int e = errno;
  char buf[400];
  size_t n = 0;
  for (const char* p = what; *p && n < 140; ++p)
    buf[n++] = *p;
  if (path) {
    for (const char* p = " of "; *p; ++p)
      buf[n++] = *p;
    for (const char* p = path; *p && n < 340; ++p)
      buf[n++] = *p;
  }
  const char* es = e ? strerrordesc_np(e) : nullptr;
  if (es) {
    buf[n++] = ':';
    buf[n++] = ' ';
    for (const char* p = es; *p && n < sizeof buf - 1; ++p)
      buf[n++] = *p;
  }
  if (write(fd, buf, n) < 0) { /* nothing more to do */
  }
  _exit(k_sandbox_failed);
}

// fork(), or a process in new namespaces (`flags`), without glibc's fork handlers.
pid_t raw_clone(unsigned long flags) {
  return static_cast<pid_t>(syscall(SYS_clone, flags | SIGCHLD, 0L, 0L, 0L, 0L));
}

void close_from(unsigned lo) {
  syscall(SYS_close_range, lo, ~0U, 0U);
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool write_file(const char* path, const char* data, size_t n) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = write_all(fd, data, n);
  close(fd);
  return ok;
}

// Puts `sources[i]` at descriptor `targets[i]` (the last one close-on-exec: the status pipe) and closes
// every other descriptor.
bool place_fds(const int* targets, const int* sources, int n) {
  int tmp[8];
  int top = 0;
  for (int i = 0; i < n; ++i) {
    tmp[i] = fcntl(sources[i], F_DUPFD_CLOEXEC, 32);
    if (tmp[i] < 0) return false;
  }
  for (int i = 0; i < n; ++i) {
    if (dup3(tmp[i], targets[i], i == n - 1 ? O_CLOEXEC : 0) < 0) return false;
    if (targets[i] > top) top = targets[i];
  }
  for (int fd = 0; fd < top; ++fd) { // the gaps
    bool used = false;
    for (int i = 0; i < n; ++i)
      used = used || targets[i] == fd;
    if (!used) close(fd);
  }
  close_from(static_cast<unsigned>(top) + 1);
  return true;
}

// One step of the new root's construction (all paths are the host's, under <dir>/root).
struct MountStep {
  enum Kind { Dir, Symlink, File, BindRo, BindRw, BindDev } kind = Dir;
  std::string target;
  std::string source;     // what is bound; a symlink's text; a file's contents
  bool file = false;      // a bind of a file (its mount point is an empty file)
  unsigned long keep = 0; // MS_NOSUID/MS_NODEV/MS_NOEXEC/MS_RDONLY the source's mount has (locked)
};

// Everything the forked processes need, made before the fork.
struct Plan {
  bool root = false, userns = true;
  std::string uid_map, gid_map; // "65534 <outer id> 1"
  std::vector<MountStep> steps;
  std::string new_root, put_old; // <dir>/root, <dir>/root/old
  std::string tests_json;
  std::vector<char*> judge_argv, candidate_argv, envp;
  const char* interpreter = nullptr;
  rlim_t cpu = 0, mem = 0, nproc = 0, fsize = 0;
  std::vector<sock_filter> filter;
};

[[noreturn]] void run_judge_or_candidate(const Plan& p, int status, const int* targets, const int* sources,
                                         int n, char* const* argv) {
  if (!place_fds(targets, sources, n)) child_fail(status, "placing the descriptors");
  status = targets[n - 1];
  if (!p.userns && (setresgid(k_nobody, k_nobody, k_nobody) || setresuid(k_nobody, k_nobody, k_nobody)))
    child_fail(status, "dropping to nobody");
  if (!p.filter.empty()) {
    const sock_fprog prog{static_cast<unsigned short>(p.filter.size()),
                          const_cast<sock_filter*>(p.filter.data())};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) != 0) child_fail(status, "seccomp filter");
  }
  if (chdir(k_task_dir) != 0) child_fail(status, "chdir /task");
  execve(p.interpreter, argv, p.envp.data());
  child_fail(status,
             "exec inside the sandbox (only /usr, /bin, /lib* and the interpreter's prefix are there)",
             p.interpreter);
}

// The new root's steps; `root_len` is the length of the prefix (<dir>/root) to leave out of messages.
void make_root(const Plan& p, int sfd) {
  const size_t root_len = p.new_root.size();
  for (const MountStep& s : p.steps) {
    const char* t = s.target.c_str();
    const char* inside = t + root_len; // the path as the sandbox sees it
    switch (s.kind) {
    case MountStep::Dir:
      if (mkdir(t, 0755) != 0 && errno != EEXIST) child_fail(sfd, "mkdir", inside);
      continue;
    case MountStep::Symlink:
      if (symlink(s.source.c_str(), t) != 0) child_fail(sfd, "symlink", inside);
      continue;
    case MountStep::File: {
      const int fd = open(t, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0 || !write_all(fd, s.source.data(), s.source.size())) child_fail(sfd, "writing", inside);
      close(fd);
      continue;
    }
    default:
      break;
    }
    if (s.file) {
      const int fd = open(t, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) child_fail(sfd, "a mount point", inside);
      close(fd);
    } else if (mkdir(t, 0755) != 0 && errno != EEXIST) {
      child_fail(sfd, "a mount point", inside);
    }
    if (mount(s.source.c_str(), t, nullptr, MS_BIND | MS_REC, nullptr) != 0)
      child_fail(sfd, "bind mount", s.source.c_str());
    unsigned long f = MS_BIND | MS_REMOUNT | MS_NOSUID | s.keep;
    if (s.kind == MountStep::BindRo) f |= MS_RDONLY | MS_NODEV;
    if (s.kind == MountStep::BindRw) f |= MS_NODEV;
    if (s.kind == MountStep::BindDev) f |= MS_NOEXEC;
    if (mount(nullptr, t, nullptr, f, nullptr) != 0) child_fail(sfd, "remount of the bind", inside);
  }
}

// Landlock: writes (and creating, removing, renaming) only beneath /task, and to /dev's devices.
void restrict_writes(int sfd) {
  const long abi = syscall(SYS_landlock_create_ruleset, nullptr, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (abi < 1) child_fail(sfd, "Landlock (Linux 5.13+, enabled in the kernel's LSM list)");
  uint64_t write_rights = LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR |
                          LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
                          LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG |
                          LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |
                          LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
  if (abi >= 2) write_rights |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) write_rights |= LANDLOCK_ACCESS_FS_TRUNCATE;
  landlock_ruleset_attr ra{};
  ra.handled_access_fs = write_rights;
  const int rs = static_cast<int>(syscall(SYS_landlock_create_ruleset, &ra, sizeof ra, 0));
  if (rs < 0) child_fail(sfd, "landlock_create_ruleset");
  const auto allow = [&](const char* path, uint64_t rights) {
    landlock_path_beneath_attr pb{};
    pb.allowed_access = rights;
    pb.parent_fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (pb.parent_fd < 0 || syscall(SYS_landlock_add_rule, rs, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) != 0)
      child_fail(sfd, "landlock_add_rule");
    close(pb.parent_fd);
  };
  allow(k_task_dir, write_rights);
  allow("/dev", LANDLOCK_ACCESS_FS_WRITE_FILE | (abi >= 3 ? LANDLOCK_ACCESS_FS_TRUNCATE : 0));
  if (syscall(SYS_landlock_restrict_self, rs, 0) != 0) child_fail(sfd, "landlock_restrict_self");
  close(rs);
}

// The namespaces' init (PID 1): builds the root, sets the limits, starts the judge and (in a PID
// namespace of its own, under a reaper) the candidate's process, and ends everything when the judge
// is done. Its descriptors on entry: sync (7), report (8), status (9).
[[noreturn]] void run_init(const Plan& p) {
  constexpr int sync_fd = 7, report_fd = 8, sfd = 9;
  char go = 0;
  ssize_t got;
  while ((got = read(sync_fd, &go, 1)) < 0 && errno == EINTR) {
  }
  if (got != 1) _exit(k_sandbox_failed); // the parent could not map the ids (it said why)
  close(sync_fd);
  const int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
    child_fail(sfd, "/dev/null");
  if (p.userns && (setresgid(k_nobody, k_nobody, k_nobody) || setresuid(k_nobody, k_nobody, k_nobody)))
    child_fail(sfd, "becoming nobody in the user namespace");
  if (sethostname("sandbox", 7) != 0) child_fail(sfd, "sethostname in the UTS namespace");
  // The new root: nothing of the host's but what the plan binds.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) child_fail(sfd, "making / private");
  if (mount("tmpfs", p.new_root.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=512,mode=755") !=
      0)
    child_fail(sfd, "tmpfs for the new root");
  make_root(p, sfd);
  if (mkdir(p.put_old.c_str(), 0700) != 0) child_fail(sfd, "mkdir old root");
  if (syscall(SYS_pivot_root, p.new_root.c_str(), p.put_old.c_str()) != 0) child_fail(sfd, "pivot_root");
  if (chdir("/") != 0 || umount2("/old", MNT_DETACH) != 0 || rmdir("/old") != 0)
    child_fail(sfd, "unmounting the host's root");
  if (mount(nullptr, "/", nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) != 0)
    child_fail(sfd, "read-only remount of the new root");
  // Limits, privileges, Landlock: inherited by everything started from here.
  const rlimit lc{p.cpu, p.cpu}, lm{p.mem, p.mem}, lp{p.nproc, p.nproc}, lf{p.fsize, p.fsize}, ln{64, 64},
      l0{0, 0};
  if (setrlimit(RLIMIT_CPU, &lc) || setrlimit(RLIMIT_AS, &lm) || setrlimit(RLIMIT_FSIZE, &lf) ||
      setrlimit(RLIMIT_NOFILE, &ln) || setrlimit(RLIMIT_CORE, &l0) || setrlimit(RLIMIT_NPROC, &lp))
    child_fail(sfd, "setrlimit");
  for (int cap = 0; prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0; ++cap) {
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
    child_fail(sfd, "clearing ambient capabilities");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) child_fail(sfd, "no_new_privs");
  restrict_writes(sfd);
  // The judge's tests, on a descriptor only it gets.
  const int tests = static_cast<int>(syscall(SYS_memfd_create, "tests", MFD_CLOEXEC));
  if (tests < 0 || !write_all(tests, p.tests_json.data(), p.tests_json.size()) ||
      lseek(tests, 0, SEEK_SET) != 0)
    child_fail(sfd, "memfd for the tests");
  int ctrl[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctrl) != 0) child_fail(sfd, "socketpair");
  const pid_t judge = raw_clone(0);
  if (judge < 0) child_fail(sfd, "fork of the judge");
  if (judge == 0) {
    const int targets[] = {0, 1, 2, 3, 4, 5}, sources[] = {tests, devnull, devnull, report_fd, ctrl[0], sfd};
    run_judge_or_candidate(p, sfd, targets, sources, 6, p.judge_argv.data());
  }
  const pid_t reaper = raw_clone(CLONE_NEWPID);
  if (reaper < 0) child_fail(sfd, "a PID namespace for the candidate");
  if (reaper == 0) { // PID 1 of the candidate's namespace: its processes end with it
    const pid_t cand = raw_clone(0);
    if (cand < 0) child_fail(sfd, "fork of the candidate's process");
    if (cand == 0) {
      const int targets[] = {0, 1, 2, 3, 5}, sources[] = {devnull, devnull, devnull, ctrl[1], sfd};
      run_judge_or_candidate(p, sfd, targets, sources, 5, p.candidate_argv.data());
    }
    close_from(0);
    for (;;) {
      int st = 0;
      const pid_t w = waitpid(-1, &st, 0);
      if (w == cand || (w < 0 && errno != EINTR)) _exit(0);
    }
  }
  close(tests);
  close(ctrl[0]);
  close(ctrl[1]);
  close(report_fd);
  for (;;) { // when the judge is done, so is everything: init's exit ends both namespaces
    int st = 0;
    const pid_t w = waitpid(-1, &st, 0);
    if (w == judge || (w < 0 && errno != EINTR)) _exit(0);
  }
}

void itoa(char*& p, unsigned long v) {
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n)
    *p++ = tmp[--n];
}

bool write_id_maps(const Plan& p, pid_t pid) {
  char path[64];
  const auto at = [&](const char* leaf) {
    char* q = path;
    for (const char* s = "/proc/"; *s; ++s)
      *q++ = *s;
    itoa(q, static_cast<unsigned long>(pid));
    *q++ = '/';
    for (const char* s = leaf; *s; ++s)
      *q++ = *s;
    *q = 0;
    return path;
  };
  return write_file(at("setgroups"), "deny", 4) &&
         write_file(at("uid_map"), p.uid_map.data(), p.uid_map.size()) &&
         write_file(at("gid_map"), p.gid_map.data(), p.gid_map.size());
}

// The first child (in the parent's namespaces): starts init in the new namespaces, maps its ids, waits.
[[noreturn]] void run_outer(Plan& p, int sync_r, int sync_w, int report_w, int status_w) {
  setpgid(0, 0);
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &dfl, nullptr);
  sigaction(SIGPIPE, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (p.root && setgroups(0, nullptr) != 0) child_fail(status_w, "clearing supplementary groups");
  constexpr unsigned long ns = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS;
  pid_t init = -1;
  if (p.userns) init = raw_clone(ns | CLONE_NEWUSER);
  if (init < 0 && p.root) { // root without user namespaces: root's own namespaces, nobody's uid below
    p.userns = false;
    init = raw_clone(ns);
  }
  if (init < 0)
    child_fail(status_w, p.root ? "new PID, network, mount, IPC and UTS namespaces"
                                : "a user namespace with new PID, network, mount, IPC and UTS namespaces");
  if (init == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int targets[] = {7, 8, 9}, sources[] = {sync_r, report_w, status_w};
    if (!place_fds(targets, sources, 3)) child_fail(status_w, "placing the descriptors");
    run_init(p);
  }
  close(sync_r);
  close(report_w);
  if (p.userns && !write_id_maps(p, init)) {
    kill(init, SIGKILL);
    child_fail(status_w, "writing the user namespace's uid/gid maps");
  }
  if (!write_all(sync_w, "g", 1)) child_fail(status_w, "starting init");
  close(sync_w);
  int st = 0;
  while (waitpid(init, &st, 0) < 0 && errno == EINTR) {
  }
  _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
}

// seccomp: what neither the judge nor the candidate needs and a sandbox escape would.
std::vector<sock_filter> make_filter() {
  std::vector<sock_filter> f;
#if defined(__x86_64__)
  constexpr uint32_t arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
  constexpr uint32_t arch = AUDIT_ARCH_AARCH64;
#else
  return f; // other architectures: the namespaces, Landlock and the limits only
#endif
  constexpr uint32_t eperm = SECCOMP_RET_ERRNO | EPERM;
  const auto stmt = [&](uint16_t code, uint32_t k) { f.push_back(sock_filter{code, 0, 0, k}); };
  const auto jump = [&](uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) {
    f.push_back(sock_filter{code, jt, jf, k});
  };
  stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch));
  jump(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0);
  stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
  stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr));
#if defined(__x86_64__)
  jump(BPF_JMP | BPF_JGE | BPF_K, 0x40000000U, 0, 1); // the x32 ABI
  stmt(BPF_RET | BPF_K, eperm);
#endif
  // clang-format off
  const long denied[] = {
      SYS_ptrace, SYS_process_vm_readv, SYS_process_vm_writev, SYS_mount, SYS_umount2, SYS_pivot_root,
      SYS_chroot, SYS_unshare, SYS_setns, SYS_keyctl, SYS_add_key, SYS_request_key, SYS_bpf,
      SYS_perf_event_open, SYS_userfaultfd, SYS_open_by_handle_at, SYS_name_to_handle_at, SYS_kexec_load,
      SYS_init_module, SYS_finit_module, SYS_delete_module, SYS_swapon, SYS_swapoff, SYS_reboot, SYS_acct,
      SYS_quotactl, SYS_syslog, SYS_kcmp, SYS_sethostname, SYS_setdomainname, SYS_settimeofday,
      SYS_clock_settime, SYS_clock_adjtime, SYS_adjtimex, SYS_vhangup,
#ifdef SYS_kexec_file_load
      SYS_kexec_file_load,
#endif
#ifdef SYS_io_uring_setup
      SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register,
#endif
#ifdef SYS_open_tree
      SYS_open_tree, SYS_move_mount, SYS_fsopen, SYS_fsconfig, SYS_fsmount, SYS_fspick,
#endif
#ifdef SYS_mount_setattr
      SYS_mount_setattr,
#endif
#ifdef SYS_pidfd_getfd
      SYS_pidfd_getfd,
#endif
#ifdef SYS_iopl
      SYS_iopl, SYS_ioperm,
#endif
#ifdef SYS_uselib
      SYS_uselib,
#endif
  };
  // clang-format on
  for (const long nr : denied) {
    jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1);
    stmt(BPF_RET | BPF_K, eperm);
  }
#ifdef SYS_clone3
  jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1); // its flags are out of reach: glibc falls back to clone
  stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
#endif
  constexpr uint32_t new_ns = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
                              CLONE_NEWNET | CLONE_NEWCGROUP;
  jump(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3);
  stmt(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[0])); // the flags' low word
  jump(BPF_JMP | BPF_JSET | BPF_K, new_ns, 0, 1);
  stmt(BPF_RET | BPF_K, eperm);
  stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
  return f;
}

class ProgramTests final : public loom::sdk::Verifier {
public:
  explicit ProgramTests(const loom::sdk::Config& cfg) {
    interpreter_ = cfg.get_str("interpreter", "/usr/bin/python3");
    if (interpreter_.empty() || interpreter_[0] != '/')
      throw loom::sdk::Error("program_tests: interpreter must be an absolute path, got \"" + interpreter_ +
                             "\"");
    if (access(interpreter_.c_str(), X_OK) != 0)
      throw loom::sdk::Error("program_tests: interpreter \"" + interpreter_ +
                             "\" is not an executable file; install Python 3 or set interpreter");
    timeout_s_ = cfg.get_f64("timeout_s", 5.0);
    if (!(timeout_s_ >= 0.1 && timeout_s_ <= 600))
      throw loom::sdk::Error("program_tests: timeout_s must be in [0.1, 600], got " +
                             std::to_string(timeout_s_));
    const auto int_key = [&](const char* k, int64_t def, int64_t lo, int64_t hi) {
      const int64_t v = cfg.get_i64(k, def);
      if (v < lo || v > hi)
        throw loom::sdk::Error("program_tests: " + std::string(k) + " must be an integer in [" +
                               std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                               std::to_string(v));
      return v;
    };
    memory_mb_ = int_key("memory_mb", 512, 16, 65536);
    max_processes_ = int_key("max_processes", 16, 1, 4096);
    max_file_mb_ = int_key("max_file_mb", 16, 1, 4096);
    prepend_prompt_ = cfg.get_bool("prepend_prompt", false);
  }

  double score(std::string_view prompt, std::string_view text) override {
    return score_task(prompt, text, {});
  }

  double score_task(std::string_view prompt, std::string_view text, std::string_view task) override {
    if (task.empty())
      throw loom::sdk::Error(
          "program_tests: the request has no task: give its tests as {\"tests\": [\"assert "
          "f(1) == 2\", …]} (a task line of loom verify / loom ab)");
    nlohmann::json tj;
    try {
      tj = nlohmann::json::parse(task);
    } catch (const nlohmann::json::exception& e) {
      throw loom::sdk::Error(std::string("program_tests: the task is not JSON (") + e.what() + ")");
    }
    if (!tj.is_object() || !tj.contains("tests") || !tj["tests"].is_array() || tj["tests"].empty())
      throw loom::sdk::Error(
          "program_tests: the task has no \"tests\" (a non-empty list of Python snippets)");
    for (const auto& t : tj["tests"])
      if (!t.is_string()) throw loom::sdk::Error("program_tests: every test must be a string of Python code");
    const size_t n_tests = tj["tests"].size();
    const std::string code =
        (prepend_prompt_ ? std::string(prompt) : std::string()) + code_of(std::string(text)) + "\n";
    const Run run = run_sandboxed(code, tj["tests"].dump(), n_tests);
    return static_cast<double>(run.passed) / static_cast<double>(n_tests);
  }

private:
  struct Run {
    size_t passed = 0;
    bool timed_out = false;
  };

  // The flags a remount of a bind of `path` must keep (a namespace's mounts are locked to them).
  static unsigned long locked_flags(const std::string& path) {
    struct statvfs v {};
    if (statvfs(path.c_str(), &v) != 0) return 0;
    unsigned long f = 0;
    if (v.f_flag & ST_NOSUID) f |= MS_NOSUID;
    if (v.f_flag & ST_NODEV) f |= MS_NODEV;
    if (v.f_flag & ST_NOEXEC) f |= MS_NOEXEC;
    if (v.f_flag & ST_RDONLY) f |= MS_RDONLY;
    return f;
  }

  // The new root's steps: the system's directories, the interpreter's prefix, a few files, the devices,
  // the harness and the task's directory.
  std::vector<MountStep> root_steps(const fs::path& dir) const {
    const std::string root = (dir / "root").string();
    std::vector<MountStep> steps;
    std::set<std::string> made, covered;
    const auto parents = [&](const std::string& path) { // mkdir -p of the path's parents
      for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1))
        if (made.insert(path.substr(0, at)).second)
          steps.push_back({MountStep::Dir, root + path.substr(0, at), {}, false, 0});
    };
    const auto add = [&](MountStep::Kind kind, const std::string& at, const std::string& source, bool file) {
      parents(at);
      if (kind == MountStep::Dir && !made.insert(at).second) return;
      steps.push_back({kind, root + at, source, file, kind >= MountStep::BindRo ? locked_flags(source) : 0});
    };
    const auto is_covered = [&](const std::string& p) {
      for (const auto& c : covered)
        if (p == c || p.rfind(c + "/", 0) == 0) return true;
      return false;
    };
    for (const char* top : {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}) {
      struct stat st {};
      if (lstat(top, &st) != 0) continue;
      if (S_ISLNK(st.st_mode)) {
        std::error_code ec;
        const fs::path to = fs::read_symlink(top, ec);
        if (ec) continue;
        add(MountStep::Symlink, top, to.string(), false);
      } else if (S_ISDIR(st.st_mode)) {
        add(MountStep::BindRo, top, top, false);
      } else {
        continue;
      }
      covered.insert(top);
    }
    // The interpreter's prefix (/opt/conda for /opt/conda/bin/python3; a venv's own directory), as
    // configured and as resolved.
    std::error_code ec;
    for (const fs::path& exe : {fs::path(interpreter_), fs::canonical(interpreter_, ec)}) {
      const std::string prefix = exe.parent_path().parent_path().lexically_normal().string();
      if (exe.empty() || prefix.size() < 2 || prefix[0] != '/' || is_covered(prefix)) continue;
      add(MountStep::BindRo, prefix, prefix, false);
      covered.insert(prefix);
    }
    add(MountStep::Dir, "/etc", {}, false);
    struct stat st {};
    if (stat("/etc/ld.so.cache", &st) == 0 && S_ISREG(st.st_mode))
      add(MountStep::BindRo, "/etc/ld.so.cache", "/etc/ld.so.cache", true);
    if (lstat("/etc/localtime", &st) == 0) {
      if (S_ISLNK(st.st_mode)) {
        const fs::path to = fs::read_symlink("/etc/localtime", ec);
        if (!ec) add(MountStep::Symlink, "/etc/localtime", to.string(), false);
      } else if (S_ISREG(st.st_mode)) {
        add(MountStep::BindRo, "/etc/localtime", "/etc/localtime", true);
      }
    }
    add(MountStep::File, "/etc/passwd",
        "root:x:0:0:root:/:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/task:/usr/sbin/nologin\n", false);
    add(MountStep::File, "/etc/group", "root:x:0:\nnogroup:x:65534:\n", false);
    add(MountStep::Dir, "/dev", {}, false);
    for (const char* d : {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"})
      if (stat(d, &st) == 0 && S_ISCHR(st.st_mode)) add(MountStep::BindDev, d, d, true);
    add(MountStep::BindRo, "/loom", (dir / "loom").string(), false);
    add(MountStep::BindRw, k_task_dir, (dir / "task").string(), false);
    return steps;
  }

  Run run_sandboxed(const std::string& code, const std::string& tests_json, size_t n_tests) const {
    if (disabled("landlock")) refuse("Landlock unavailable (LOOM_SANDBOX_DISABLE)");
    if (disabled("netns")) refuse("network namespace unavailable (LOOM_SANDBOX_DISABLE)");
    if (disabled("mountns")) refuse("mount namespace unavailable (LOOM_SANDBOX_DISABLE)");
    const bool root = geteuid() == 0;
    if (!root && disabled("userns")) refuse("user namespace unavailable (LOOM_SANDBOX_DISABLE)");
    // <dir>: loom/ (the harness and the candidate's code, read-only inside), task/ (the candidate's
    // directory) and root/ (where the new root is mounted).
    std::string tmpl = (fs::temp_directory_path() / "loom-program-tests-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw loom::sdk::Error(std::string("program_tests: cannot make a temporary directory: ") +
                             std::strerror(errno));
    const fs::path dir = tmpl;
    struct Cleanup {
      fs::path d;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(d, ec);
      }
    } cleanup{dir};
    std::error_code ec;
    fs::create_directory(dir / "loom", ec);
    fs::create_directory(dir / "task", ec);
    fs::create_directory(dir / "root", ec);
    const auto put = [&](const char* name, const std::string& body) {
      std::ofstream f(dir / "loom" / name, std::ios::binary);
      f << body;
      if (!f) throw loom::sdk::Error("program_tests: cannot write " + (dir / "loom" / name).string());
    };
    put("candidate.py", code);
    put("judge.py", std::string(k_codec) + k_judge);
    put("candidate_side.py", std::string(k_codec) + k_candidate);
    // Inside, the processes are nobody: they may cross <dir>, read loom/, and own task/.
    if (chmod(dir.c_str(), 0711) != 0 || chmod((dir / "loom").c_str(), 0755) != 0 ||
        chmod((dir / "root").c_str(), 0755) != 0)
      throw loom::sdk::Error("program_tests: cannot set the permissions of " + dir.string());
    for (const char* f : {"candidate.py", "judge.py", "candidate_side.py"})
      chmod((dir / "loom" / f).c_str(), 0644);
    if (root && chown((dir / "task").c_str(), k_nobody, k_nobody) != 0)
      throw loom::sdk::Error(std::string("program_tests: cannot hand the directory to nobody: ") +
                             std::strerror(errno));

    // Everything the children need, made before fork (they only make system calls).
    Plan plan;
    plan.root = root;
    plan.userns = !disabled("userns");
    const unsigned outer_uid = root ? k_nobody : geteuid(), outer_gid = root ? k_nobody : getegid();
    plan.uid_map = "65534 " + std::to_string(outer_uid) + " 1\n";
    plan.gid_map = "65534 " + std::to_string(outer_gid) + " 1\n";
    plan.steps = root_steps(dir);
    plan.new_root = (dir / "root").string();
    plan.put_old = (dir / "root" / "old").string();
    plan.tests_json = tests_json;
    std::string interp = interpreter_, isolated = "-I", no_pyc = "-B", judge_py = k_judge_py,
                cand_py = k_candidate_py;
    plan.interpreter = interp.c_str();
    plan.judge_argv = {interp.data(), isolated.data(), no_pyc.data(), judge_py.data(), nullptr};
    plan.candidate_argv = {interp.data(), isolated.data(), no_pyc.data(), cand_py.data(), nullptr};
    std::vector<std::string> envs = {"PATH=/usr/bin:/bin", "HOME=/task", "TMPDIR=/task", "LANG=C.UTF-8"};
    for (auto& e : envs)
      plan.envp.push_back(e.data());
    plan.envp.push_back(nullptr);
    plan.cpu = static_cast<rlim_t>(std::ceil(timeout_s_)) + 1;
    plan.mem = static_cast<rlim_t>(memory_mb_) << 20;
    // init, the judge, a test's judge, the reaper, the loaded candidate and the next test's fork of it
    plan.nproc = static_cast<rlim_t>(max_processes_) + 6;
    plan.fsize = static_cast<rlim_t>(max_file_mb_) << 20;
    plan.filter = make_filter();

    int report[2], status_pipe[2], sync_pipe[2];
    if (pipe2(report, O_CLOEXEC) != 0)
      throw loom::sdk::Error(std::string("program_tests: pipe: ") + std::strerror(errno));
    if (pipe2(status_pipe, O_CLOEXEC) != 0 || pipe2(sync_pipe, O_CLOEXEC) != 0) {
      close(report[0]);
      close(report[1]);
      throw loom::sdk::Error(std::string("program_tests: pipe: ") + std::strerror(errno));
    }
    const pid_t pid = fork();
    if (pid < 0) {
      for (const int fd : {report[0], report[1], status_pipe[0], status_pipe[1], sync_pipe[0], sync_pipe[1]})
        close(fd);
      throw loom::sdk::Error(std::string("program_tests: fork: ") + std::strerror(errno));
    }
    if (pid == 0) run_outer(plan, sync_pipe[0], sync_pipe[1], report[1], status_pipe[1]);
    close(report[1]);
    close(status_pipe[1]);
    close(sync_pipe[0]);
    close(sync_pipe[1]);
    // One byte per test from the judge ('P' passed), until it is done or the clock runs out.
    std::string got;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000));
    bool timed_out = false;
    while (got.size() < n_tests) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        timed_out = true;
        break;
      }
      pollfd p{report[0], POLLIN, 0};
      const int r = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      if (r <= 0) continue;
      char buf[4096];
      const ssize_t n = read(report[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break; // the judge is gone
      got.append(buf, static_cast<size_t>(n));
    }
    kill(-pid, SIGKILL); // the outer child and init (whose death ends every process of its namespaces)
    kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    close(report[0]);
    std::string why;
    pollfd sp{status_pipe[0], POLLIN, 0};
    while (poll(&sp, 1, 2000) > 0) {
      char buf[256];
      const ssize_t n = read(status_pipe[0], buf, sizeof buf);
      if (n <= 0 || why.size() > 1000) break;
      why.append(buf, static_cast<size_t>(n));
    }
    close(status_pipe[0]);
    if (!why.empty()) refuse(why);
    Run run;
    run.timed_out = timed_out;
    for (size_t i = 0; i < got.size() && i < n_tests; ++i)
      if (got[i] == 'P') ++run.passed;
    return run;
  }

  std::string interpreter_;
  double timeout_s_ = 5.0;
  int64_t memory_mb_ = 512, max_processes_ = 16, max_file_mb_ = 16;
  bool prepend_prompt_ = false;
};

} // namespace

LOOM_PLUGIN_DEFINE("program_tests", "1.0.0", LOOM_VERIFIER("program_tests", ProgramTests));
