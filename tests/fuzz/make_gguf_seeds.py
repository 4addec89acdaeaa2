#!/usr/bin/env python3
"""Writes small, valid GGUF files as fuzz seeds into the directory given (the build generates them;
model-format files are not committed): a tiny llama model with a SentencePiece vocab (F32 + Q8_0 + F16
tensors), a byte-level BPE vocab-only file, and a file with every metadata value type including
nested arrays.   usage: make_gguf_seeds.py OUT_DIR"""
import os
import struct
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else "fuzz-seeds/gguf"
T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def val(t, v):
    if t == T_STR:
        return s(v)
    if t == T_ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(val(et, i) for i in items)
    fmt = {T_U8: "B", T_I8: "b", T_U16: "H", T_I16: "h", T_U32: "I", T_I32: "i", T_F32: "f",
           T_BOOL: "?", T_U64: "Q", T_I64: "q", T_F64: "d"}[t]
    return struct.pack("<" + fmt, v)


def gguf(kvs, tensors, align=32):
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + val(t, v)
    off = 0
    blobs = []
    for name, ggml_type, ne, data in tensors:
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", ggml_type, off)
        blobs.append((off, data))
        off += (len(data) + align - 1) // align * align
    out += b"\0" * ((-len(out)) % align)
    base = len(out)
    for o, d in blobs:
        out += b"\0" * (base + o - len(out)) + d
    out += b"\0" * ((-len(out)) % align)
    return out


def f32(n, scale=0.01):
    return struct.pack("<%df" % n, *[((i * 37) % 17 - 8) * scale for i in range(n)])


def q8_0(n):
    blocks = b""
    for _ in range(n // 32):
        blocks += struct.pack("<e", 0.01) + bytes(((i * 7) % 255) - 127 & 0xFF for i in range(32))
    return blocks


def tiny_llama():
    E, F, V, L = 32, 64, 12, 1
    toks = ["<unk>", "<s>", "</s>", "<0x0A>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "<0x41>", "c"]
    types = [2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 6, 1]
    kvs = [
        ("general.architecture", T_STR, "llama"),
        ("general.name", T_STR, "fuzz-seed"),
        ("llama.context_length", T_U32, 64),
        ("llama.embedding_length", T_U32, E),
        ("llama.block_count", T_U32, L),
        ("llama.feed_forward_length", T_U32, F),
        ("llama.attention.head_count", T_U32, 4),
        ("llama.attention.head_count_kv", T_U32, 2),
        ("llama.rope.dimension_count", T_U32, 8),
        ("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-5),
        ("tokenizer.ggml.model", T_STR, "llama"),
        ("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
        ("tokenizer.ggml.scores", T_ARR, (T_F32, [0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -1.5, -2.5, -0.5, 0.0, -4.0])),
        ("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
        ("tokenizer.ggml.bos_token_id", T_U32, 1),
        ("tokenizer.ggml.eos_token_id", T_U32, 2),
        ("tokenizer.ggml.unknown_token_id", T_U32, 0),
    ]
    ts = [("token_embd.weight", 0, [E, V], f32(E * V))]
    for l in range(L):
        p = "blk.%d." % l
        ts += [(p + "attn_norm.weight", 0, [E], f32(E, 0.1)),
               (p + "attn_q.weight", 8, [E, E], q8_0(E * E)),
               (p + "attn_k.weight", 1, [E, E // 2], struct.pack("<%de" % (E * E // 2), *[0.01] * (E * E // 2))),
               (p + "attn_v.weight", 0, [E, E // 2], f32(E * E // 2)),
               (p + "attn_output.weight", 0, [E, E], f32(E * E)),
               (p + "ffn_norm.weight", 0, [E], f32(E, 0.1)),
               (p + "ffn_gate.weight", 0, [E, F], f32(E * F)),
               (p + "ffn_up.weight", 0, [E, F], f32(E * F)),
               (p + "ffn_down.weight", 0, [F, E], f32(E * F))]
    ts.append(("output_norm.weight", 0, [E], f32(E, 0.1)))
    return gguf(kvs, ts)


def bpe_vocab():
    byte_chars = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    toks = byte_chars + ["\u0120", "\u0120a", "he", "llo", "hello", "<|endoftext|>"]
    merges = ["h e", "l l", "ll o", "he llo", "\u0120 a"]
    kvs = [("general.architecture", T_STR, "gpt2"),
           ("tokenizer.ggml.model", T_STR, "gpt2"),
           ("tokenizer.ggml.pre", T_STR, "gpt-2"),
           ("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
           ("tokenizer.ggml.token_type", T_ARR, (T_I32, [1] * (len(toks) - 1) + [3])),
           ("tokenizer.ggml.merges", T_ARR, (T_STR, merges)),
           ("tokenizer.ggml.bos_token_id", T_U32, len(toks) - 1),
           ("tokenizer.ggml.eos_token_id", T_U32, len(toks) - 1)]
    return gguf(kvs, [])


def all_types():
    kvs = [("u8", T_U8, 1), ("i8", T_I8, -1), ("u16", T_U16, 2), ("i16", T_I16, -2), ("u32", T_U32, 3),
           ("i32", T_I32, -3), ("f32", T_F32, 1.5), ("bool", T_BOOL, True), ("str", T_STR, "x"),
           ("u64", T_U64, 4), ("i64", T_I64, -4), ("f64", T_F64, 2.5),
           ("nested", T_ARR, (T_ARR, [(T_I32, [1, 2]), (T_STR, ["a"])])),
           ("general.alignment", T_U32, 64)]
    return gguf(kvs, [("t", 0, [4, 2], f32(8))], align=64)


os.makedirs(OUT, exist_ok=True)
for name, data in [("tiny_llama.gguf", tiny_llama()), ("bpe_vocab.gguf", bpe_vocab()), ("all_types.gguf", all_types())]:
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    pass
