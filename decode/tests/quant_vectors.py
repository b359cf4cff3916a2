#!/usr/bin/env python3
"""Test vectors for decode/tests/quant.rs: GGUF element types dequantised by gguf-py (the format's
own library, `gguf.quants.dequantize`), the reference tarfa's dequantisation must equal bit for
bit.

    python3 decode/tests/quant_vectors.py OUT_DIR
    python3 decode/tests/quant_vectors.py --dequantize-gguf FILE.gguf OUT_DIR
    python3 decode/tests/quant_vectors.py --unsupported-gguf OUT.gguf
    python3 decode/tests/quant_vectors.py --requantise-gguf SRC.gguf OUT_Q.gguf OUT_F.gguf

The first writes OUT_DIR/manifest.json and, per case, OUT_DIR/<case>.bin (the quantised bytes) and
OUT_DIR/<case>.f32 (gguf-py's float32 output, little-endian). Cases per type:

- "random": blocks of random bytes whose F16 scale fields are set to finite halves (normal values
  over many binades of both signs, subnormals, zeros, the largest half), plus blocks of all-zero
  and all-one quant bits (the extreme q values);
- "real": realistic weights quantised: the BF16 weights of fixtures/hf/qwen3_moe (every tensor,
  laid end to end in rows of 256) and gaussian rows with outliers. gguf-py quantises where it can
  (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, TQ1_0, TQ2_0, MXFP4); for the K-quants and
  IQ4_NL/IQ4_XS, which gguf-py only dequantises, the simple quantisers below write a valid
  encoding (checked: its gguf-py dequantisation is close to the input).

The second writes every tensor of a GGUF file dequantised by gguf-py: OUT_DIR/manifest.json
(name, type, row-major shape) and OUT_DIR/<i>.f32. The third writes a tiny MoE GGUF whose output
matrix is IQ3_S and whose expert stacks are IQ2_XXS (types the decoder does not compute with).

The fourth rewrites a GGUF model with its matrices quantised (a different 32-element-block type per
kind of tensor: Q4_0, Q5_1 and F16 experts; Q8_0, Q4_1, Q5_0, MXFP4, IQ4_NL, Q4_0 attention and
dense FFN matrices; Q8_0 embedding, router and a bias) into OUT_Q, and the same model with each of
those tensors replaced by gguf-py's F32 dequantisation into OUT_F: the two must decode to the same
logits bits.

Deterministic (seeded). Needs gguf (0.19.0 checked) and numpy.
"""

import json
import warnings
from importlib import metadata
import struct
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q, GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(20261201)
# Random E8M0 scales of 254 and 255 overflow MXFP4 values to infinity, as ggml would; not news.
warnings.filterwarnings("ignore", category=RuntimeWarning)

TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
         "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "TQ1_0", "TQ2_0", "IQ4_NL", "IQ4_XS", "MXFP4"]

# Byte offsets of each type's F16 scale fields within a block (ggml-common.h layouts).
SCALES = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
    "TQ1_0": [52], "TQ2_0": [64], "IQ4_NL": [0], "IQ4_XS": [0],
}
# MXFP4's scale is one E8M0 byte: every value is a valid scale, left random (0 and 255 forced below).


def finite_halves(n):
    """n finite F16 bit patterns: normal values of both signs over 2^-24..2^4, with edge values."""
    mag = np.exp2(RNG.uniform(-26, 4, n)).astype(np.float32)
    sign = np.where(RNG.random(n) < 0.5, -1.0, 1.0).astype(np.float32)
    h = (mag * sign).astype(np.float16).view(np.uint16).copy()
    edges = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF,
                      0x3C00, 0xBC00], dtype=np.uint16)
    k = min(n, len(edges))
    h[:k] = edges[:k]
    # Any pattern left non-finite by the cast (none expected) becomes one.
    bad = (h & 0x7C00) == 0x7C00
    h[bad] = 0x3C00
    return h


def random_blocks(name, n_blocks):
    qt = Q[name]
    block, size = GGML_QUANT_SIZES[qt]
    b = RNG.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    if block > 1:
        # Extreme quant bits: all-zero and all-one blocks (scales set below).
        b[1, :] = 0x00
        b[2, :] = 0xFF
        b[3, :] = 0xAA
        b[4, :] = 0x55
    if name == "MXFP4":
        b[0, 0], b[1, 0], b[2, 0], b[3, 0] = 0, 1, 2, 255
    if name in SCALES:
        for off in SCALES[name]:
            h = finite_halves(n_blocks)
            RNG.shuffle(h[11:])
            b[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
        # Blocks with both scales at edge values together.
        for off in SCALES[name]:
            b[5:16, off:off + 2] = finite_halves(11).view(np.uint8).reshape(11, 2)
    return b


def real_weights():
    """The BF16 tensors of fixtures/hf/qwen3_moe end to end, as float32 rows of 256."""
    p = ROOT / "fixtures/hf/qwen3_moe/model.safetensors"
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    vals = []
    for k, v in sorted(header.items()):
        if k == "__metadata__" or v["dtype"] != "BF16":
            continue
        a, e = v["data_offsets"]
        bits = np.frombuffer(raw[8 + n + a:8 + n + e], dtype=np.uint16)
        vals.append((bits.astype(np.uint32) << 16).view(np.float32))
    x = np.concatenate(vals)
    rows = len(x) // 256
    return x[:rows * 256].reshape(rows, 256)


def gaussian_rows(rows, cols):
    x = RNG.standard_normal((rows, cols)).astype(np.float32) * np.float32(0.02)
    # Outliers, and a row of zeros (zero scales), a constant row, a one-signed row.
    idx = RNG.integers(0, x.size, size=x.size // 97)
    x.reshape(-1)[idx] *= np.float32(40)
    x[1] = 0
    x[2] = np.float32(0.125)
    x[3] = np.abs(x[3])
    return x


# Simple K-quant quantisers (any valid encoding will do; these are near-minimal RMS-free ones).

def _f16(v):
    return v.astype(np.float16)


def _div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0, a / np.where(b == 0, 1, b))


def _min_scale(x, groups, qmax, sbits):
    """Per-group scale/min with sbits-bit sub-scales: returns d16, dmin16, sc, mn, q."""
    n = x.shape[0]
    g = x.reshape(n, groups, -1)
    lo = np.minimum(g.min(-1), 0)
    s = (g.max(-1) - lo) / qmax
    top = (1 << sbits) - 1
    d = _f16(s.max(-1, keepdims=True) / top)
    dmin = _f16((-lo).max(-1, keepdims=True) / top)
    sc = np.clip(np.round(_div(s, d.astype(np.float32))), 0, top).astype(np.uint8)
    mn = np.clip(np.round(_div(-lo, dmin.astype(np.float32))), 0, top).astype(np.uint8)
    step = d.astype(np.float32) * sc
    off = dmin.astype(np.float32) * mn
    q = np.clip(np.round(_div(g + off[..., None], step[..., None])), 0, qmax).astype(np.uint8)
    return d, dmin, sc, mn, q.reshape(n, -1)


def _sym_scale(x, groups, qlo, qhi, sbits_lo, sbits_hi):
    n = x.shape[0]
    g = x.reshape(n, groups, -1)
    s = np.abs(g).max(-1) / (-qlo)
    d = _f16(s.max(-1, keepdims=True) / sbits_hi)
    sc = np.clip(np.round(_div(s, d.astype(np.float32))), sbits_lo, sbits_hi).astype(np.int32)
    step = d.astype(np.float32) * sc
    q = np.clip(np.round(_div(g, step[..., None])), qlo, qhi).astype(np.int32)
    return d, sc, q.reshape(n, -1)


def _pack_scales_k4(sc, mn):
    s = np.zeros((sc.shape[0], 12), dtype=np.uint8)
    for j in range(4):
        s[:, j] = sc[:, j] | ((sc[:, j + 4] >> 4) << 6)
        s[:, j + 4] = mn[:, j] | ((mn[:, j + 4] >> 4) << 6)
        s[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
    return s


def quant_q4_k(x):
    d, dmin, sc, mn, q = _min_scale(x, 8, 15, 6)
    qs = np.zeros((x.shape[0], 128), dtype=np.uint8)
    for i in range(4):
        qs[:, 32 * i:32 * i + 32] = q[:, 64 * i:64 * i + 32] | (q[:, 64 * i + 32:64 * i + 64] << 4)
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), _pack_scales_k4(sc, mn), qs], axis=1)


def quant_q5_k(x):
    d, dmin, sc, mn, q = _min_scale(x, 8, 31, 6)
    lo, hi = q & 0xF, q >> 4
    qs = np.zeros((x.shape[0], 128), dtype=np.uint8)
    for i in range(4):
        qs[:, 32 * i:32 * i + 32] = lo[:, 64 * i:64 * i + 32] | (lo[:, 64 * i + 32:64 * i + 64] << 4)
    qh = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for g in range(8):
        qh |= hi[:, 32 * g:32 * g + 32] << g
    return np.concatenate([d.view(np.uint8), dmin.view(np.uint8), _pack_scales_k4(sc, mn), qh, qs],
                          axis=1)


def quant_q2_k(x):
    d, dmin, sc, mn, q = _min_scale(x, 16, 3, 4)
    scales = (sc | (mn << 4)).astype(np.uint8)
    qs = np.zeros((x.shape[0], 64), dtype=np.uint8)
    for i in range(2):
        for s in range(4):
            qs[:, 32 * i:32 * i + 32] |= q[:, 128 * i + 32 * s:128 * i + 32 * s + 32] << (2 * s)
    return np.concatenate([scales, qs, d.view(np.uint8), dmin.view(np.uint8)], axis=1)


def quant_q3_k(x):
    d, sc, q = _sym_scale(x, 16, -4, 3, -32, 31)
    u = (sc + 32).astype(np.uint8)
    scales = np.zeros((x.shape[0], 12), dtype=np.uint8)
    for j in range(16):
        scales[:, j % 8] |= (u[:, j] & 0xF) << (4 * (j // 8))
        scales[:, 8 + j % 4] |= (u[:, j] >> 4) << (2 * (j // 4))
    qu = (q + 4).astype(np.uint8)
    ql, hb = qu & 3, qu >> 2
    qs = np.zeros((x.shape[0], 64), dtype=np.uint8)
    for i in range(2):
        for s in range(4):
            qs[:, 32 * i:32 * i + 32] |= ql[:, 128 * i + 32 * s:128 * i + 32 * s + 32] << (2 * s)
    hmask = np.zeros((x.shape[0], 32), dtype=np.uint8)
    for s in range(8):
        hmask |= hb[:, 32 * s:32 * s + 32] << s
    return np.concatenate([hmask, qs, scales, d.view(np.uint8)], axis=1)


def quant_q6_k(x):
    d, sc, q = _sym_scale(x, 16, -32, 31, -128, 127)
    qu = (q + 32).astype(np.uint8)
    lo, hi = qu & 0xF, qu >> 4
    ql = np.zeros((x.shape[0], 128), dtype=np.uint8)
    qh = np.zeros((x.shape[0], 64), dtype=np.uint8)
    for i in range(2):
        for m in range(64):
            ql[:, 64 * i + m] = lo[:, 128 * i + m] | (lo[:, 128 * i + 64 + m] << 4)
        for t in range(4):
            qh[:, 32 * i:32 * i + 32] |= hi[:, 128 * i + 32 * t:128 * i + 32 * t + 32] << (2 * t)
    return np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d.view(np.uint8)], axis=1)


IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      dtype=np.float32)


def _nearest(x, step):
    """Index of the IQ4 table value nearest x / step (per element)."""
    err = np.abs(step[..., None] * IQ4_VALUES - x[..., None])
    return np.argmin(err, axis=-1).astype(np.uint8)


def quant_iq4_nl(x):
    n = x.shape[0] * x.shape[1] // 32
    g = x.reshape(n, 32)
    d = _f16(np.abs(g).max(-1, keepdims=True) / 127)
    q = _nearest(g, np.broadcast_to(d.astype(np.float32), g.shape))
    qs = q[:, :16] | (q[:, 16:] << 4)
    return np.concatenate([d.view(np.uint8), qs], axis=1)


def quant_iq4_xs(x):
    n = x.shape[0] * x.shape[1] // 256
    g = x.reshape(n, 8, 32)
    dg = np.abs(g).max(-1) / 127
    d = _f16(dg.max(-1, keepdims=True) / 31)
    sc = np.clip(np.round(_div(dg, d.astype(np.float32))), -32, 31).astype(np.int32)
    step = d.astype(np.float32) * sc
    q = _nearest(g, np.broadcast_to(step[..., None], g.shape))
    u = (sc + 32).astype(np.uint16)
    sl = np.zeros((n, 4), dtype=np.uint8)
    sh = np.zeros(n, dtype=np.uint16)
    qs = np.zeros((n, 128), dtype=np.uint8)
    for k in range(8):
        sl[:, k // 2] |= ((u[:, k] & 0xF) << (4 * (k % 2))).astype(np.uint8)
        sh |= (u[:, k] >> 4) << (2 * k)
        qs[:, 16 * k:16 * k + 16] = q[:, k, :16] | (q[:, k, 16:] << 4)
    return np.concatenate([d.view(np.uint8), sh.reshape(n, 1).view(np.uint8), sl, qs], axis=1)


K_QUANT = {"Q2_K": quant_q2_k, "Q3_K": quant_q3_k, "Q4_K": quant_q4_k, "Q5_K": quant_q5_k,
           "Q6_K": quant_q6_k, "IQ4_NL": quant_iq4_nl, "IQ4_XS": quant_iq4_xs}

# How far an encoding of ours may be from its input (relative RMS), to catch a packing mistake.
K_TOLERANCE = {"Q2_K": 0.6, "Q3_K": 0.5, "Q4_K": 0.15, "Q5_K": 0.08, "Q6_K": 0.05,
               "IQ4_NL": 0.15, "IQ4_XS": 0.15}


def quantise(name, x):
    """Quantised bytes of float32 rows x, shape (rows, row bytes)."""
    if name in K_QUANT:
        rows, cols = x.shape
        blocks = K_QUANT[name](x.reshape(-1, 256))
        block, size = GGML_QUANT_SIZES[Q[name]]
        assert blocks.dtype == np.uint8 and blocks.size == x.size // block * size, name
        out = blocks.reshape(rows, -1)
        back = dequantize(out, Q[name]).astype(np.float64)
        err = np.sqrt(np.mean((back - x) ** 2)) / max(np.sqrt(np.mean(x.astype(np.float64) ** 2)), 1e-30)
        assert err < K_TOLERANCE[name], f"{name}: quantiser error {err}"
        return out
    return np.ascontiguousarray(quantize(x, Q[name])).view(np.uint8).reshape(x.shape[0], -1)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cases = []

    def emit(case, name, data, rows, cols):
        qt = Q[name]
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(rows, -1)
        f = dequantize(data, qt)
        assert f.dtype == np.float32 and f.shape == (rows, cols), (name, f.shape)
        (out / f"{case}.bin").write_bytes(data.tobytes())
        (out / f"{case}.f32").write_bytes(np.ascontiguousarray(f).astype("<f4").tobytes())
        block, _ = GGML_QUANT_SIZES[qt]
        cases.append({"case": case, "type": name, "rows": rows, "cols": cols,
                      "blocks": rows * cols // block})

    real = real_weights()
    gauss = gaussian_rows(256, 512)
    for name in TYPES:
        block, size = GGML_QUANT_SIZES[Q[name]]
        if block == 1:
            # 8192 random elements (NaN, infinities, subnormals among them), rows of 32.
            emit(f"{name}.random", name, random_blocks(name, 8192), 256, 32)
        else:
            # 4096 random blocks of 32 elements, or 1024 of 256; one block per row.
            n = 4096 if block == 32 else 1024
            emit(f"{name}.random", name, random_blocks(name, n), n, block)
        emit(f"{name}.real_fixture", name, quantise(name, real), real.shape[0], real.shape[1])
        emit(f"{name}.real_gauss", name, quantise(name, gauss), gauss.shape[0], gauss.shape[1])

    (out / "manifest.json").write_text(json.dumps({"gguf": metadata.version("gguf"),
                                                   "numpy": np.__version__, "cases": cases},
                                                  indent=1))


def dequantize_gguf(path, out):
    out.mkdir(parents=True, exist_ok=True)
    tensors = []
    for i, t in enumerate(gguf.GGUFReader(path).tensors):
        f = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype="<f4")
        (out / f"{i}.f32").write_bytes(f.tobytes())
        tensors.append({"name": t.name, "type": t.tensor_type.name, "shape": list(f.shape),
                        "file": f"{i}.f32"})
    (out / "manifest.json").write_text(json.dumps({"tensors": tensors}, indent=1))


def unsupported_gguf(path):
    hidden, ff, n_expert, vocab = 256, 32, 2, 8
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_count(n_expert)
    w.add_expert_used_count(1)

    def raw(qtype, *shape):
        block, size = GGML_QUANT_SIZES[qtype]
        return RNG.integers(0, 256, size=(*shape[:-1], shape[-1] // block * size), dtype=np.uint8)

    def add_quant(name, qtype, data):
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)

    w.add_tensor("token_embd.weight", RNG.standard_normal((vocab, hidden)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("blk.0.ffn_gate_inp.weight", RNG.standard_normal((n_expert, hidden)).astype(np.float32))
    add_quant("blk.0.ffn_gate_exps.weight", Q.IQ2_XXS, raw(Q.IQ2_XXS, n_expert, ff, hidden))
    add_quant("blk.0.ffn_up_exps.weight", Q.IQ2_XXS, raw(Q.IQ2_XXS, n_expert, ff, hidden))
    add_quant("blk.0.ffn_down_exps.weight", Q.Q8_0,
              quantize(RNG.standard_normal((n_expert, hidden, ff)).astype(np.float32), Q.Q8_0))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    add_quant("output.weight", Q.IQ3_S, raw(Q.IQ3_S, vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


REQUANT_PLAN = {
    "ffn_gate_exps.weight": Q.Q4_0, "ffn_up_exps.weight": Q.Q5_1, "ffn_down_exps.weight": Q.F16,
    "attn_q.weight": Q.Q8_0, "attn_k.weight": Q.Q4_1, "attn_v.weight": Q.Q5_0,
    "attn_output.weight": Q.MXFP4, "ffn_gate.weight": Q.IQ4_NL, "ffn_up.weight": Q.Q4_0,
    "ffn_down.weight": Q.Q8_0, "token_embd.weight": Q.Q8_0, "ffn_gate_inp.weight": Q.Q8_0,
    "attn_q.bias": Q.Q8_0,
}


def requantise_gguf(src, out_q, out_f):
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    ws = [gguf.GGUFWriter(out_q, arch), gguf.GGUFWriter(out_f, arch)]
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        for w in ws:
            w.add_key_value(name, f.contents(), vt, sub_type=sub)
    for t in r.tensors:
        qt = next((q for k, q in REQUANT_PLAN.items() if t.name.endswith(k)), None)
        x = None if qt is None else dequantize(t.data, t.tensor_type)
        if qt is None or x.shape[-1] % GGML_QUANT_SIZES[qt][0] != 0:
            for w in ws:
                w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
            continue
        if qt == Q.F16:
            qb = x.astype(np.float16)
            ws[0].add_tensor(t.name, qb)
            ws[1].add_tensor(t.name, qb.astype(np.float32))
            continue
        if qt == Q.IQ4_NL:
            qb = quant_iq4_nl(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        else:
            qb = quantize(x, qt)
        ws[0].add_tensor(t.name, qb, raw_shape=qb.shape, raw_dtype=qt)
        ws[1].add_tensor(t.name, np.ascontiguousarray(dequantize(qb, qt), dtype=np.float32))
    for w in ws:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


if __name__ == "__main__":
    if sys.argv[1] == "--dequantize-gguf":
        dequantize_gguf(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1] == "--requantise-gguf":
        requantise_gguf(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    elif sys.argv[1] == "--unsupported-gguf":
        unsupported_gguf(Path(sys.argv[2]))
    else:
        main()
