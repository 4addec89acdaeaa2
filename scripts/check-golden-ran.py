#!/usr/bin/env python3
"""Fails when a golden test (ctest label `golden`) was skipped or did not run in the last ctest run of a
build directory (its Testing/Temporary/LastTest.log) — CI's check that the models were found, without
running the golden tests a second time.

usage: check-golden-ran.py BUILD_DIR
"""
import re
import subprocess
import sys

build = sys.argv[1]
# Read first: `ctest -N` below writes a fresh (empty) LastTest.log.
log = open(f"{build}/Testing/Temporary/LastTest.log", errors="replace").read()
listing = subprocess.run(["ctest", "--test-dir", build, "-L", "golden", "-N"], capture_output=True, text=True,
                         check=True).stdout
golden = [n.strip() for n in re.findall(r"Test +#\d+: (.+)", listing)]
if not golden:
    sys.exit(f"check-golden-ran: no golden tests listed in {build}")
outputs = {}
for block in re.split(r"^(?=\d+/\d+ Testing: )", log, flags=re.M): # one test: its command, output, result
    m = re.search(r"^\d+/\d+ Test: (.+)$", block, re.M)
    if m:
        outputs[m.group(1).strip()] = block
bad = []
for name in golden:
    out = outputs.get(name)
    if out is None:
        bad.append(f"{name}: did not run")
    elif re.search(r"SKIPPED|Skipped", out):
        line = next((l for l in out.splitlines() if "SKIPPED" in l or "Skipped" in l), "")
        bad.append(f"{name}: skipped ({line.strip()[:160]})")
for b in bad:
    print("check-golden-ran:", b, file=sys.stderr)
if bad:
    sys.exit(1)
print(f"check-golden-ran: all {len(golden)} golden tests ran, none skipped")
