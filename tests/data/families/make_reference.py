#!/usr/bin/env python3
"""Reference logits from llama.cpp (through llama-cpp-python) for a `loom synth` model of every family.

For each family (llama, llama3, mistral, qwen2, qwen3, gemma2, phi3, smollm3, qwen3moe) this writes the same
random-weight file the C++ test writes (`loom synth --shape tiny-d64 --arch A --type f32 --vocab-from
stories260K.gguf`; the mixtures of experts `--shape tiny-moe`, 3 of 8 experts a token; smollm3 `--shape
tiny-d64x4`, whose fourth layer has no RoPE; gpt-oss `--shape tiny-oss` (learned sinks, a window of 128 on
layer 0, YaRN, biased experts): the synthesis is deterministic), evaluates a fixed prompt of token ids in llama.cpp with an f32 KV cache,
and records the logits at a few positions and 32 greedy tokens after the prompt's first 16. The C++ test
(tests/golden/test_families.cpp) needs no Python: it reads reference.json.

  python3 -m venv .venv-llama && .venv-llama/bin/pip install llama-cpp-python   # compiles llama.cpp
  .venv-llama/bin/python tests/data/families/make_reference.py build/bin/loom ../shared/models [ARCH …]

With ARCH names only those families are recomputed; the others keep their entries in reference.json.

The vocabulary is stories260K's (512 tokens), except for phi3, whose llama.cpp loader wants Phi-3's own
special tokens: vocab/ggml-vocab-phi-3.gguf (32064). Logits are kept for at most 1024 ids per position
(every k-th id, plus the 16 highest), so the file stays small.

The prompt is 300 tokens, longer than the sliding window the synth files have (256), so Gemma 2's local
layers cut it; llama.cpp does not apply a window to `llama` files, so for `mistral` (a llama file with
attention.sliding_window) only positions inside the window are compared.
"""
import json
import os
import subprocess
import sys
import tempfile

import llama_cpp
import numpy as np

ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3", "gemma2", "phi3", "smollm3", "qwen3moe", "qwen3moe_mxfp4",
         "gpt-oss", "gpt-oss_mxfp4"]
# A file of another type than f32 (the name's family, the synth options added): the experts in MXFP4 (llama.cpp
# multiplies them on q8_0-rounded activations, the reference exactly: their logits agree within the tolerance)
VARIANTS = {"qwen3moe_mxfp4": ("qwen3moe", ["--expert-type", "mxfp4"]),
            "gpt-oss_mxfp4": ("gpt-oss", ["--expert-type", "mxfp4"])}
# The logits' tolerance (of their scale) where llama.cpp rounds activations: 2e-3 measured for MXFP4's q8_0
TOLERANCE = {"qwen3moe_mxfp4": 5e-3, "gpt-oss_mxfp4": 5e-3}  # else 1e-3
VOCAB = {"phi3": "vocab/ggml-vocab-phi-3.gguf"}  # else stories260K.gguf
SHAPE = "tiny-d64"
SHAPES = {"qwen3moe": "tiny-moe", "qwen3moe_mxfp4": "tiny-moe", "smollm3": "tiny-d64x4", "gpt-oss": "tiny-oss",
          "gpt-oss_mxfp4": "tiny-oss"}  # else SHAPE
N_PROMPT = 300
WINDOW = 256  # what loom synth writes for this shape: max(16, n_ctx / 4)
POSITIONS = [0, 1, 7, 63, 200, 255, 299]
GREEDY_FROM, GREEDY_STEPS = 16, 32


def prompt(n_vocab):
    return [1] + [(i * 37 + 11) % (n_vocab - 3) + 3 for i in range(N_PROMPT - 1)]


def main():
    loom, models, only = sys.argv[1], sys.argv[2], sys.argv[3:]
    here = os.path.dirname(os.path.abspath(__file__))
    out = {"_comment": __doc__.split("\n\n")[0], "llama_cpp_python": llama_cpp.__version__, "shape": SHAPE,
           "families": {}}
    if only:
        with open(os.path.join(here, "reference.json")) as f:
            out["families"] = json.load(f)["families"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in only or ARCHS:
            arch, extra = VARIANTS.get(name, (name, []))
            path = os.path.join(tmp, name + ".gguf")
            vocab = VOCAB.get(arch, "stories260K.gguf")
            shape = SHAPES.get(name, SHAPE)
            subprocess.run([loom, "synth", "--shape", shape, "--arch", arch, "--type", "f32", *extra, "--vocab-from",
                            os.path.join(models, vocab), "-o", path], check=True, stdout=subprocess.DEVNULL)
            llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True,
                                  n_threads=2, type_k=0, type_v=0, verbose=False)
            n_vocab = llm.n_vocab()
            toks = prompt(n_vocab)
            positions = [p for p in POSITIONS if arch != "mistral" or p < WINDOW]
            llm.reset()
            llm.eval(toks)
            scores = np.array(llm.scores[: len(toks)], dtype=np.float64)
            step = max(1, n_vocab // 1024)
            logits = {}
            for p in positions:
                ids = sorted(set(range(0, n_vocab, step)) | set(int(i) for i in np.argsort(-scores[p])[:16]))
                logits[str(p)] = {"ids": ids, "values": [float(f"{scores[p][i]:.7g}") for i in ids]}
            llm.reset()
            llm.eval(toks[:GREEDY_FROM])
            greedy = []
            for _ in range(GREEDY_STEPS):
                t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                greedy.append(t)
                llm.eval([t])
            out["families"][name] = {"arch": arch, "synth_args": " ".join(extra), "vocab": vocab, "shape": shape,
                                     "tolerance": TOLERANCE.get(name, 1e-3),
                                     "prompt": toks, "logits": logits,
                                     "greedy_from": GREEDY_FROM, "greedy": greedy}
            print(f"{name}: {len(positions)} positions, greedy {greedy[:8]}…")
            del llm
    with open(os.path.join(here, "reference.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
