#!/usr/bin/env python3
"""Generate golden vectors for tests/model/test_dequant.c.

For each GGML block type loom dequantizes (Q5_0 and Q5_K included), writes tests/model/data/<type>.raw
(random blocks, with the f16 scale fields set to ordinary values so results
are finite) and <type>.f32 (little-endian float32 as computed by the `gguf`
Python package, llama.cpp's own reference: gguf.quants.dequantize). F16 and
BF16 vectors include zeros, subnormals, infinities and NaNs.

    pip install gguf numpy && python3 tests/model/gen_dequant.py
(or PYTHONPATH=<llama.cpp>/gguf-py, e.g. the copy in the llama-cpp-python sdist
that bench/cpu_vs_llamacpp.sh unpacks under ~/.cache/loom/llamacpp)
Deterministic (fixed seed); re-running rewrites identical files.
"""
import os
import numpy as np
from gguf import GGMLQuantizationType as T, quants
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
rng = np.random.default_rng(20240611)
NBLOCKS = 6


def f16_bytes(vals):
    return np.asarray(vals, dtype="<f2").view(np.uint8)


def blocks(qtype):
    """Random blocks of qtype; (offset, count) of f16 fields to overwrite."""
    blck, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(NBLOCKS, size), dtype=np.uint8)
    f16_fields = {
        T.Q8_0: [0],          # d
        T.Q4_0: [0],          # d
        T.Q4_1: [0, 2],       # d, m
        T.Q4_K: [0, 2],       # d, dmin
        T.Q6_K: [208],        # d (after ql[128], qh[64], scales[16])
        T.Q5_0: [0],          # d (then qh[4], qs[16])
        T.Q5_K: [0, 2],       # d, dmin (then scales[12], qh[32], qs[128])
    }[qtype]
    for b in range(NBLOCKS):
        for off in f16_fields:
            v = rng.uniform(-0.05, 0.05) if b else 0.0  # block 0: zero scale edge case
            raw[b, off:off + 2] = f16_bytes([v])
    return blck, raw


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, qtype in [("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("q4_1", T.Q4_1), ("q4_k", T.Q4_K), ("q6_k", T.Q6_K)]:
        blck, raw = blocks(qtype)
        ref = quants.dequantize(raw, qtype).astype("<f4").reshape(-1)
        assert ref.size == NBLOCKS * blck and np.all(np.isfinite(ref))
        raw.tofile(os.path.join(OUT, name + ".raw"))
        ref.tofile(os.path.join(OUT, name + ".f32"))
    # 16-bit floats: every special class plus random patterns
    special = [0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x3c00, 0xbc00]
    bits = np.array(special + list(rng.integers(0, 65536, size=244)), dtype="<u2")
    bits.tofile(os.path.join(OUT, "f16.raw"))
    with np.errstate(all="ignore"):
        bits.view("<f2").astype("<f4").tofile(os.path.join(OUT, "f16.f32"))
    bbits = np.array([0x0000, 0x8000, 0x0001, 0x7f80, 0xff80, 0x3f80, 0x7f7f] + list(rng.integers(0, 65536, size=249)),
                     dtype="<u2")
    bbits.tofile(os.path.join(OUT, "bf16.raw"))
    (bbits.astype("<u4") << 16).view("<f4").tofile(os.path.join(OUT, "bf16.f32"))
    # Q5_0 last, so the files above keep their bytes (one random stream)
    blck, raw = blocks(T.Q5_0)
    ref = quants.dequantize(raw, T.Q5_0).astype("<f4").reshape(-1)
    assert ref.size == NBLOCKS * blck and np.all(np.isfinite(ref))
    raw.tofile(os.path.join(OUT, "q5_0.raw"))
    ref.tofile(os.path.join(OUT, "q5_0.f32"))
    # Q5_K after it, for the same reason
    blck, raw = blocks(T.Q5_K)
    ref = quants.dequantize(raw, T.Q5_K).astype("<f4").reshape(-1)
    assert ref.size == NBLOCKS * blck and np.all(np.isfinite(ref))
    raw.tofile(os.path.join(OUT, "q5_k.raw"))
    ref.tofile(os.path.join(OUT, "q5_k.f32"))


if __name__ == "__main__":
    main()
