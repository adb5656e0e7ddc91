#!/usr/bin/env python3
"""Write a copy of a GGUF file whose linear weights with a multiple of 256
columns are re-quantized to Q5_K (GGML type 13); everything else is copied
as it is. For an end-to-end check of loom's Q5_K path against llama.cpp on
the same file (SmolLM2-135M: the ffn_down weights, 1536 columns; its other
matrices have 576 columns, which no K-quant block fits).

    PYTHONPATH=<llama.cpp>/gguf-py python3 tests/model/make_q5k_gguf.py IN.gguf OUT.gguf

The quantizer is a plain one (each sub-block of 32: its min and range, 6-bit
scales and mins under f16 super-block scales, codes rounded to 0..31), not
llama.cpp's search; it checks its own blocks with gguf-py's Q5_K decoder.
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, quants


def f16(v):
    return np.asarray(v, dtype="<f2")


def q5k_blocks(x):
    """x (rows, cols), cols % 256 == 0 -> uint8 (rows, cols / 256 * 176)."""
    rows, cols = x.shape
    sb = x.reshape(-1, 8, 32).astype(np.float64)           # (nsb, 8, 32)
    lo = np.minimum(sb.min(axis=2), 0.0)                    # (nsb, 8)
    rng = sb.max(axis=2) - lo
    sc = rng / 31.0
    mn = -lo
    d = f16(sc.max(axis=1) / 63.0)
    dmin = f16(mn.max(axis=1) / 63.0)
    df, dmf = d.astype(np.float64), dmin.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        qsc = np.where(df[:, None] > 0, np.rint(sc / df[:, None]), 0).clip(0, 63).astype(np.int64)
        qmn = np.where(dmf[:, None] > 0, np.rint(mn / dmf[:, None]), 0).clip(0, 63).astype(np.int64)
        a = df[:, None] * qsc
        c = dmf[:, None] * qmn
        q = np.where(a[:, :, None] > 0, np.rint((sb + c[:, :, None]) / a[:, :, None]), 0)
    q = q.clip(0, 31).astype(np.int64)                      # (nsb, 8, 32)
    nsb = sb.shape[0]
    out = np.zeros((nsb, 176), dtype=np.uint8)
    out[:, 0:2] = d.view(np.uint8).reshape(nsb, 2)
    out[:, 2:4] = dmin.view(np.uint8).reshape(nsb, 2)
    for j in range(4):
        out[:, 4 + j] = (qsc[:, j] & 63) | ((qsc[:, j + 4] >> 4) << 6)
        out[:, 8 + j] = (qmn[:, j] & 63) | ((qmn[:, j + 4] >> 4) << 6)
        out[:, 12 + j] = (qsc[:, j + 4] & 15) | ((qmn[:, j + 4] & 15) << 4)
    qh = np.zeros((nsb, 32), dtype=np.int64)
    for j in range(8):
        qh |= ((q[:, j] >> 4) & 1) << j
    out[:, 16:48] = qh
    for i in range(4):
        out[:, 48 + 32 * i:80 + 32 * i] = (q[:, 2 * i] & 15) | ((q[:, 2 * i + 1] & 15) << 4)
    return out.reshape(rows, cols // 256 * 176)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        st = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=st)
    out = []
    for t in r.tensors:
        data, ttype = t.data, t.tensor_type
        cols = int(t.shape[0])
        if len(t.shape) == 2 and cols % 256 == 0 and t.name.endswith(".weight") and "token_embd" not in t.name \
                and ttype not in (T.F32, T.F16, T.BF16, T.Q5_K):
            x = quants.dequantize(t.data, ttype).reshape(int(t.shape[1]), cols).astype(np.float32)
            data = q5k_blocks(x)
            back = quants.dequantize(data, T.Q5_K).reshape(x.shape)
            err = np.abs(back - x).max() / max(np.abs(x).max(), 1e-30)
            assert err < 0.05, f"{t.name}: Q5_K round trip off by {err:.3g} of max|x|"
            ttype = T.Q5_K
            print(f"{t.name}: {t.tensor_type.name} -> Q5_K (max error {err:.3g} of max|x|)")
        out.append((t.name, data, ttype))
    for name, data, ttype in out:
        w.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, data, ttype in out:
        w.write_tensor_data(data)
    w.close()


if __name__ == "__main__":
    main()
