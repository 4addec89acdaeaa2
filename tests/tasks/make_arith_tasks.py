#!/usr/bin/env python3
"""Multi-step arithmetic word problems with generated numbers and checkable answers, as JSONL for
`loom ab --prompts` ({"id", "prompt", "answer"} a line) — the task set of docs/decoders.md's
step-search measurements.

usage: make_arith_tasks.py [-n 200] [--seed 1] [--steps 2] [--shots 2] [--max 20] [--chat] > tasks.jsonl

Each prompt is a few-shot completion prompt: `--shots` worked examples (one equation a line, then
"The answer is N."), then the question and "Answer:". With --chat each task is a conversation instead
({"id", "messages", "answer"}, for a chat model's template): a system turn saying the answer's form,
each worked example as a user turn ("Question: …") and the assistant's reply, then the question as the
last user turn. The same problems and examples either way. Each problem takes `--steps` operations (2 or 3)
over numbers in 2..--max; every intermediate result is a positive integer (divisions are exact).
Deterministic for a seed.
"""
import argparse
import json
import random

NAMES = ["Tom", "Ann", "Sara", "Ben", "Lily", "Max", "Mia", "Sam", "Zoe", "Leo"]
SYSTEM = ("Solve the arithmetic word problem. Write one equation a line, then the last line: "
          "\"The answer is N.\"")
ITEMS = ["apples", "pencils", "stickers", "cookies", "marbles", "books", "coins", "cards"]


def problem(rng, steps, top):
    """A (question, [equation lines], answer) triple."""
    name, other = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    a = rng.randint(2, top)
    parts = [f"{name} has {a} {item}."]
    lines = []
    cur = a
    for _ in range(steps):
        kind = rng.choice(["add", "sub", "mul", "div"])
        if kind == "sub" and cur < 3:
            kind = "add"
        if kind == "div":
            divs = [d for d in range(2, 6) if cur % d == 0 and cur // d >= 1]
            if not divs:
                kind = "mul"
        if kind == "mul" and cur * 2 > 200:
            kind = "sub"
        if kind == "add":
            b = rng.randint(2, top)
            parts.append(f"{other} gives {name} {b} more {item}.")
            lines.append(f"{cur} + {b} = {cur + b}")
            cur += b
        elif kind == "sub":
            b = rng.randint(1, cur - 1)
            parts.append(f"{name} gives {b} {item} to {other}.")
            lines.append(f"{cur} - {b} = {cur - b}")
            cur -= b
        elif kind == "mul":
            b = rng.randint(2, 4)
            parts.append(f"Then the number of {item} {name} has becomes {b} times as many.")
            lines.append(f"{cur} * {b} = {cur * b}")
            cur *= b
        else:
            b = rng.choice(divs)
            parts.append(f"{name} splits the {item} into {b} equal groups and keeps one group.")
            lines.append(f"{cur} / {b} = {cur // b}")
            cur //= b
    parts.append(f"How many {item} does {name} have now?")
    return " ".join(parts), lines, cur


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, choices=[1, 2, 3, 4])
    ap.add_argument("--shots", type=int, default=2)
    ap.add_argument("--max", type=int, default=20)
    ap.add_argument("--chat", action="store_true", help="conversations (messages) instead of raw prompts")
    args = ap.parse_args()
    shots_rng = random.Random(10_000 + args.seed)
    examples = [problem(shots_rng, args.steps, args.max) for _ in range(args.shots)]
    shots = "".join(f"Question: {q}\nAnswer:\n" + "\n".join(lines) + f"\nThe answer is {ans}.\n\n"
                    for q, lines, ans in examples)
    turns = [{"role": "system", "content": SYSTEM}]
    for q, lines, ans in examples:
        turns += [{"role": "user", "content": f"Question: {q}"},
                  {"role": "assistant", "content": "\n".join(lines) + f"\nThe answer is {ans}."}]
    rng = random.Random(args.seed)
    for i in range(args.n):
        q, _, ans = problem(rng, args.steps, args.max)
        task = {"id": f"arith-{args.seed}-{i + 1}"}
        if args.chat:
            task["messages"] = turns + [{"role": "user", "content": f"Question: {q}"}]
        else:
            task["prompt"] = shots + f"Question: {q}\nAnswer:\n"
        task["answer"] = ans
        print(json.dumps(task))


if __name__ == "__main__":
    main()
