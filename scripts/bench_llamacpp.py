#!/usr/bin/env python3
"""Times llama.cpp (through the PyPI package llama-cpp-python) on a GGUF the way `loom bench` times
Loom: prefill `pp` tokens in one batch, then decode `tg` tokens one at a time. Prints one JSON object
per repetition: {"prefill_tok_s": ..., "decode_tok_s": ..., "peak_rss_bytes": ...}."""
import argparse
import json
import random
import resource
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--pp", type=int, default=512)
ap.add_argument("--tg", type=int, default=128)
ap.add_argument("-r", "--repetitions", type=int, default=1)
a = ap.parse_args()

try:
    from llama_cpp import Llama
except ImportError:
    sys.exit("bench_llamacpp.py: llama-cpp-python is not installed (scripts/bench-vs-llamacpp.sh installs it)")

llm = Llama(model_path=a.model, n_ctx=a.pp + a.tg + 16, n_batch=a.pp, n_ubatch=a.pp, n_threads=a.threads,
            n_threads_batch=a.threads, logits_all=False, verbose=False)
n_vocab = llm.n_vocab()
rng = random.Random(1234)
# warm-up
llm.reset()
llm.eval([llm.token_bos()] + [rng.randrange(3, n_vocab) for _ in range(15)])
for _ in range(a.repetitions):
    prompt = [llm.token_bos()] + [rng.randrange(3, n_vocab) for _ in range(a.pp - 1)]
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(a.tg):
        llm.eval([rng.randrange(3, n_vocab)])
    t2 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(json.dumps({"prefill_tok_s": a.pp / (t1 - t0), "decode_tok_s": a.tg / (t2 - t1),
                      "peak_rss_bytes": rss}), flush=True)
