#!/usr/bin/env python3
"""Test vectors for Loom's GGUF block types from an independent implementation: gguf-py's numpy
dequantizers (`pip install gguf numpy`). tests/unit/test_dtype.cpp reads the result.

    python3 tests/data/dtypes/make_vectors.py --loom build/bin/loom   # writes tests/data/dtypes/vectors.json

"dequantize": for every type Loom reads, a few blocks of random bytes (the f16 scale fields set to
finite values: positive, negative, subnormal and zero) and gguf.quants.dequantize's floats for them.
Loom's dequantize_row must give the same floats bit for bit.

"quantize": one row of N(0,1) values ("input") written as an f32 GGUF tensor, converted by
`loom quantize --type T` for every type Loom writes, read back with gguf-py's GGUFReader (which checks
the file's layout: type, shape, sizes), and gguf-py's floats for Loom's blocks. Loom's quantize_row
must give the same bytes (a changed quantizer means: run this script again) and its dequantize_row
the same floats. For f16, bf16, q8_0, q4_0 and mxfp4 Loom's blocks must also be the bytes of gguf-py's
reference quantizers (checked here).

Floats and bytes are stored as hex strings (little-endian float32 bits / raw bytes), so they compare exactly.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

HERE = os.path.dirname(os.path.abspath(__file__))

# name → (GGML type, byte offsets of the block's f16 scale fields)
TYPES = {
    "f32": (T.F32, None),
    "f16": (T.F16, None),
    "bf16": (T.BF16, None),
    "q4_0": (T.Q4_0, [0]),
    "q4_1": (T.Q4_1, [0, 2]),
    "q5_0": (T.Q5_0, [0]),
    "q5_1": (T.Q5_1, [0, 2]),
    "q8_0": (T.Q8_0, [0]),
    "q2_k": (T.Q2_K, [80, 82]),
    "q3_k": (T.Q3_K, [108]),
    "q4_k": (T.Q4_K, [0, 2]),
    "q5_k": (T.Q5_K, [0, 2]),
    "q6_k": (T.Q6_K, [208]),
    "iq4_nl": (T.IQ4_NL, [0]),
    "iq4_xs": (T.IQ4_XS, [0]),
    "mxfp4": (T.MXFP4, []),  # its scale: the E8M0 byte at 0 (E8M0_BYTES)
}
# MXFP4's E8M0 scale bytes of the dequantize vectors' four blocks: the two subnormal ones, 2^-1, and 2^5.
E8M0_BYTES = [0, 1, 127, 133]
N_INPUT = 256  # values in the "quantize" row: one 256-value super-block, eight blocks of 32


def hexf(a: np.ndarray) -> str:
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


def random_blocks(name: str, rng: np.random.Generator) -> bytes:
    qtype, scale_offsets = TYPES[name]
    if qtype == T.F32:
        return rng.standard_normal(64).astype("<f4").tobytes()
    if qtype == T.F16:
        return (rng.standard_normal(64) * 4).astype("<f2").tobytes()
    if qtype == T.BF16:
        bits = rng.standard_normal(64).astype("<f4").view("<u4") >> 16
        return bits.astype("<u2").tobytes()
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = 3 if block == 256 else 4
    data = bytearray(rng.integers(0, 256, size=n_blocks * size, dtype=np.uint8).tobytes())
    for b in range(n_blocks):
        if qtype == T.MXFP4:
            data[b * size] = E8M0_BYTES[b]
        for k, off in enumerate(scale_offsets):
            # positive, negative, subnormal or zero; the second field of a block differs from the first
            kind = (b + k) % (4 if block == 32 else 3)
            mag = float(2.0 ** rng.uniform(-10, -2))
            v = [mag, -mag, 2.0**-20, 0.0][kind]
            data[b * size + off : b * size + off + 2] = np.array([v], dtype="<f2").tobytes()
    return bytes(data)


def dequant_vectors(rng: np.random.Generator) -> list:
    out = []
    for name, (qtype, _) in TYPES.items():
        raw = random_blocks(name, rng)
        y = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).ravel()
        assert np.all(np.isfinite(y)), name
        out.append({"type": name, "n": int(y.size), "bytes": raw.hex(), "values": hexf(y)})
    return out


def quant_vectors(loom: str, rng: np.random.Generator) -> tuple:
    x = rng.standard_normal(N_INPUT).astype(np.float32)
    out = []
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "in.gguf")
        w = GGUFWriter(src, "llama")
        w.add_tensor("w.weight", x.reshape(1, N_INPUT))  # a 2-D tensor: ne = [256, 1]
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        for name, (qtype, _) in TYPES.items():
            if name == "f32":
                continue
            dst = os.path.join(d, name + ".gguf")
            cmd = [loom, "quantize", src, "--type", name, "-o", dst]
            subprocess.run(cmd, check=True, capture_output=True)
            t = GGUFReader(dst).tensors[0]
            assert t.tensor_type == qtype, (name, t.tensor_type)
            assert [int(v) for v in t.shape] == [N_INPUT, 1], (name, t.shape)
            raw = np.asarray(t.data).view(np.uint8).tobytes()
            y = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).ravel()
            assert y.size == N_INPUT, name
            rms = float(np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2)))
            note = ""
            if name in ("f16", "bf16", "q8_0", "q4_0", "mxfp4"):  # Loom keeps ggml's reference quantizer for these
                ref = np.asarray(quantize(x.reshape(1, N_INPUT), qtype)).view(np.uint8).tobytes()
                assert ref == raw, f"{name}: loom's blocks differ from gguf-py's reference quantizer's"
                note = ", the same bytes as gguf-py's reference quantizer"
            print(f"{name:7s} relative RMS error {rms:.4f} (gguf-py's reading of loom's blocks{note})")
            out.append({"type": name, "bytes": raw.hex(), "values": hexf(y)})
    return x, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", required=True, help="the loom executable (for the quantize vectors)")
    ap.add_argument("-o", "--output", default=os.path.join(HERE, "vectors.json"))
    a = ap.parse_args()
    rng = np.random.default_rng(20240611)
    doc = {
        "generator": "tests/data/dtypes/make_vectors.py (gguf-py's gguf.quants.dequantize)",
        "dequantize": dequant_vectors(rng),
    }
    x, q = quant_vectors(a.loom, rng)
    doc["quantize"] = {"input": hexf(x), "types": q}
    with open(a.output, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{a.output}: {os.path.getsize(a.output)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
