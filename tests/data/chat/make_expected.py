#!/usr/bin/env python3
"""Generate tests/data/chat/expected.json: reference renders of real chat templates.

The C++ Jinja-subset renderer is tested against these outputs. Every template in
templates/*.jinja is rendered for every conversation in conversations.json, with
add_generation_prompt in {false, true} (plus a few per-template kwargs variants,
see EXTRA_VARIANTS), exactly the way Hugging Face transformers'
`tokenizer.apply_chat_template(..., tokenize=False)` renders them
(transformers/utils/chat_template_utils.py, _cached_compile_jinja_template and
render_jinja_template; checked against transformers 5.24.0):

  * env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[<{% generation %} tag>, jinja2.ext.loopcontrols])
  * filter  tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
            = json.dumps(...) with those defaults (NOT jinja2's HTML-escaping tojson)
  * globals raise_exception(msg) -> raises jinja2.TemplateError(msg)
            strftime_now(fmt)    -> datetime.now().strftime(fmt); here the clock is
                                    frozen at FIXED_NOW so the output is reproducible
            dict(...)            -> plain dict constructor
            namespace(...)       -> jinja2 Namespace that rejects "_"-prefixed names
  * messages: keys whose value is None are dropped (transformers'
    _normalize_chat_messages), a reasoning field (reasoning_content / thinking /
    reasoning) is aliased to both "reasoning_content" and "thinking"
  * template.render(messages=..., tools=<list or None>, documents=None,
                    add_generation_prompt=<bool>, **special_tokens, **kwargs)
    special tokens come from TOKENS below (a token that is None is not passed,
    like a token missing from tokenizer.special_tokens_map).

When rendering raises (raise_exception, a TypeError from `str + dict`, an
undefined-variable error, ...), the case records error="<ExceptionType>: <msg>"
and output=null. The C++ side only needs to agree that it is an error; the
message text is informative (Python wording).

Requirements: Python 3.8+ and `pip install jinja2` (3.1.6 was used; transformers
refuses older versions). transformers itself is NOT needed.

Also renders the small templates of snippets.json (the renderer's semantics one by one) into
snippets_expected.json.

Usage:  python3 tests/data/chat/make_expected.py   (rewrites expected.json next to it)
        python3 tests/data/chat/make_expected.py --check   (exit 1 if expected.json differs)
"""

import argparse
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_DIR = os.path.join(HERE, "templates")
CONVERSATIONS = os.path.join(HERE, "conversations.json")
EXPECTED = os.path.join(HERE, "expected.json")

# strftime_now() always sees this instant (transformers uses datetime.now()).
FIXED_NOW = datetime.datetime(2026, 7, 26, 0, 0, 0)

# bos/eos per template, as in each model's tokenizer_config.json. None = the model
# has no such token set (e.g. Qwen's bos_token is null), so it is not passed at all.
TOKENS = {
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "HuggingFaceH4-zephyr-7b-beta.jinja": ("<s>", "</s>"),
    "HuggingFaceTB-SmolLM3-3B.jinja": (None, "<|im_end|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>"),
    "Qwen-QwQ-32B.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": (None, "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("<|end_of_text|>", "<|end_of_text|>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "microsoft-phi-4.jinja": ("<|endoftext|>", "<|im_end|>"),
    "mistralai-Mistral-7B-Instruct-v0.2.jinja": ("<s>", "</s>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "mistralai-Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>"),
    "mistralai-Mixtral-8x7B-Instruct-v0.1.jinja": ("<s>", "</s>"),
    "openai-gpt-oss-120b.jinja": ("<|startoftext|>", "<|return|>"),
    "teknium-OpenHermes-2.5-Mistral-7B.jinja": ("<s>", "<|im_end|>"),
}

# Extra template kwargs rendered in addition to the plain (kwargs={}) cases.
EXTRA_VARIANTS = {
    "Qwen-Qwen3-0.6B.jinja": [{"enable_thinking": False}],
    "HuggingFaceTB-SmolLM3-3B.jinja": [{"enable_thinking": False}],
    "openai-gpt-oss-120b.jinja": [{"reasoning_effort": "high"}],
}

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class GenerationExtension(jinja2.ext.Extension):
    """transformers' AssistantTracker without the tracking: `{% generation %}...{% endgeneration %}`
    renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


class TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError("underscore-prefixed namespace attribute %r" % (name,))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def make_env():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationExtension, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def prepare_messages(messages):
    out = []
    for m in messages:
        # _normalize_chat_messages drops keys whose value is None, except "content": a null content
        # stays None, as json.loads gives it to jinja2 (tool-call turns test `content is none`).
        m = {k: v for k, v in m.items() if v is not None or k == "content"}
        reasoning = next((m[k] for k in _REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:  # _alias_reasoning_fields
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


def render_case(template, conv, add_generation_prompt, bos, eos, kwargs):
    ctx = {}
    if bos is not None:
        ctx["bos_token"] = bos
    if eos is not None:
        ctx["eos_token"] = eos
    ctx.update(kwargs)
    try:
        out = template.render(
            messages=prepare_messages(conv["messages"]),
            tools=conv.get("tools"),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **ctx,
        )
        return out, None
    except Exception as e:  # noqa: BLE001 - every failure is a recorded expectation
        return None, "%s: %s" % (type(e).__name__, e)


def build():
    with open(CONVERSATIONS, encoding="utf-8") as f:
        conversations = json.load(f)["conversations"]
    env = make_env()
    cases = []
    names = sorted(n for n in os.listdir(TEMPLATE_DIR) if n.endswith(".jinja"))
    missing = [n for n in names if n not in TOKENS]
    if missing:
        sys.exit("no TOKENS entry for: %s" % ", ".join(missing))
    for name in names:
        with open(os.path.join(TEMPLATE_DIR, name), encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        bos, eos = TOKENS[name]
        for kwargs in [{}] + EXTRA_VARIANTS.get(name, []):
            for conv in conversations:
                for agp in (False, True):
                    out, err = render_case(template, conv, agp, bos, eos, kwargs)
                    cases.append(
                        {
                            "template": name,
                            "conversation": conv["name"],
                            "add_generation_prompt": agp,
                            "kwargs": kwargs,
                            "bos_token": bos,
                            "eos_token": eos,
                            "jinja2_version": jinja2.__version__,
                            "output": out,
                            "error": err,
                        }
                    )
    return cases


SNIPPETS = os.path.join(HERE, "snippets.json")
SNIPPETS_EXPECTED = os.path.join(HERE, "snippets_expected.json")


def build_snippets():
    """Each template of snippets.json rendered with messages=[{role: user, content: hi}], no tools."""
    with open(SNIPPETS, encoding="utf-8") as f:
        snippets = json.load(f)["snippets"]
    env = make_env()
    conv = {"messages": [{"role": "user", "content": "hi"}]}
    out = []
    for src in snippets:
        try:
            template = env.from_string(src)
        except jinja2.TemplateSyntaxError as e:
            out.append({"template": src, "output": None, "error": "TemplateSyntaxError: %s" % e})
            continue
        text, err = render_case(template, conv, False, "<s>", "</s>", {})
        out.append({"template": src, "output": text, "error": err})
    return out


def dump(cases):
    # One case per line: compact, yet diffs stay readable.
    return "[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with expected.json instead of writing it")
    args = ap.parse_args()
    text = dump(build())
    snippets = dump(build_snippets())
    if args.check:
        same = True
        for path, want in ((EXPECTED, text), (SNIPPETS_EXPECTED, snippets)):
            with open(path, encoding="utf-8") as f:
                ok = f.read() == want
            print("%s is %s" % (os.path.basename(path), "up to date" if ok else "OUT OF DATE"))
            same = same and ok
        return 0 if same else 1
    with open(EXPECTED, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    with open(SNIPPETS_EXPECTED, "w", encoding="utf-8", newline="\n") as f:
        f.write(snippets)
    cases = json.loads(text)
    n_err = sum(1 for c in cases if c["error"] is not None)
    print("wrote %s: %d cases, %d ok, %d error (jinja2 %s)" % (EXPECTED, len(cases), len(cases) - n_err, n_err, jinja2.__version__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
