#!/usr/bin/env python3
"""Write a Qwen3-MoE, GLM-4.5 (GLM-4-MoE), Qwen3.5-MoE, GLM-5.3-Flash or DeepSeek-V3 safetensors
checkpoint (BF16), or a MiMo-V2-Flash one, as a BF16 GGUF that llama.cpp's `qwen3moe` /
`glm4moe` / `qwen35moe` / `glm5-next` / `deepseek2` / `mimo2` architecture loads, for
`llama-bench` on the same weights as `tarfa run`.

    python3 bench/llama/safetensors_to_gguf.py SRC_DIR OUT.gguf [--verify]

SRC_DIR: one `model.safetensors`, or shards with `model.safetensors.index.json` (or just
`*.safetensors` files), plus `config.json` -- as written by `converter/examples/synth_checkpoint.rs`,
`converter/examples/synth_decode_checkpoint.rs` (SYNTH_FAMILY=glm4_moe for GLM) or by
transformers' `save_pretrained`. config.json's model_type picks the family: qwen3_moe (or none)
or glm4_moe.

Qwen3-MoE (`qwen3moe`):

* Tensor names are llama.cpp's (token_embd, blk.N.attn_norm, attn_q/k/v/output, attn_q_norm,
  attn_k_norm, ffn_norm, ffn_gate_inp, ffn_{gate,up,down}_exps stacked [E, ...], output_norm,
  output). Per-expert `experts.X.{gate,up,down}_proj.weight` are stacked in expert order, fused
  `experts.gate_up_proj` [E, 2I, H] is split in its gate and up halves, `experts.down_proj`
  [E, H, I] is taken as it is.
* Norm weights (1-D) are written as F32, widened exactly from BF16; every other tensor's bytes are
  the source's bytes, unchanged (`--verify` re-reads the GGUF with gguf's reader and checks both).
* Missing config keys are derived from the tensor shapes: head_dim from q_norm, heads from q_proj /
  k_proj rows. Defaults: rms_norm_eps 1e-6, rope_theta 1e6, context length 40960.
* Tokenizer: `tokenizer.ggml.model = "none"` plus `qwen3moe.vocab_size`: llama.cpp then makes
  vocab_size dummy tokens, which is all llama-bench needs (it feeds random token ids).
  Note: llama.cpp's qwen3moe graph always renormalises the top-k router weights (as
  norm_topk_prob = true); the config's norm_topk_prob is not stored anywhere in the GGUF.

GLM-4.5 (`glm4moe`), names and key/values as llama.cpp's convert_hf_to_gguf.py (Glm4MoeModel)
writes them and src/models/glm4-moe.cpp reads them:

* Per layer: attn_norm, attn_{q,k,v}.weight and .bias, attn_output, attn_{q,k}_norm when present
  (use_qk_norm), post_attention_norm (HF post_attention_layernorm: llama.cpp's GLM graph reads
  ATTN_POST_NORM, not ffn_norm). The first first_k_dense_replace layers: ffn_{gate,up,down} (dense
  MLP); the others: ffn_gate_inp (router), exp_probs_b.bias (e_score_correction_bias, F32),
  ffn_{gate,up,down}_exps stacked as above, ffn_{gate,up,down}_shexp (shared experts).
* Keys: rope.dimension_count = head_dim * partial_rotary_factor (llama.cpp ropes the first
  n_rot dims, NeoX order, with no Q/K permutation), expert_count = n_routed_experts,
  expert_shared_count, leading_dense_block_count, expert_gating_func = 2 (sigmoid),
  expert_weights_scale = routed_scaling_factor, expert_weights_norm = norm_topk_prob,
  expert_group_count / expert_group_used_count = n_group / topk_group, nextn_predict_layers = 0.
  MTP (NextN) layers, if the checkpoint has them, are left out (block_count = num_hidden_layers).
  Tokenizer as for qwen3moe (`glm4moe.vocab_size`, model "none").
* 1-D tensors (norms, q/k/v biases, e_score_correction_bias) are written as F32, widened exactly
  from BF16 (or copied when the source has them in F32, as real GLM checkpoints do for the bias).
  Every GGUF name is checked against gguf-py's own HF -> GGUF tensor name map.

Qwen3.5-MoE (`qwen3_5_moe_text` -> `qwen35moe`; `qwen3_5_moe` with a text_config: its text
model), as llama.cpp's convert_hf_to_gguf.py (Qwen3_5MoeTextModel) writes it and
src/models/qwen35moe.cpp reads it (commit 0c1e570): zero-centred norms + 1 (not the DeltaNet
`norm`), A_log -> ssm_a = -exp(A_log), conv1d squeezed to [C, K] in F32, the DeltaNet value heads
moved from HF's grouped order to ggml's tiled order (v_head_order), the ssm / rope-section /
recurrent-layer keys; see plan_q35. `--verify` also recomputes those transforms from whole
tensors (check_q35).

DeepSeek-V3 (`deepseek_v3` -> `deepseek2`, plan_ds): llama.cpp's split MLA form as
convert_hf_to_gguf.py's DeepseekV2Model writes it (kv_b_proj as attn_k_b, each head's key rows
transposed, and attn_v_b), norms and the correction bias in F32, the key/values by
fixtures/gguf/make_from_hf.py's deepseek_keys (the fixtures' writer); a query LoRA is needed
(llama.cpp's deepseek2 reads q_lora_rank except at its "lite" layer counts). On a 2-layer
checkpoint from `SYNTH_FAMILY=deepseek_v3`, `tarfa convert` of the GGUF and of the safetensors
give `cmp`-equal logits and llama.cpp 0c1e570's `llama-bench` runs it.

MiMo-V2-Flash (`mimo_v2_flash` -> `mimo2`): the keys of fixtures/gguf/make_from_hf.py's
mimo2_main (per-layer key/value heads and window pattern, value length and scale, both RoPE
bases), the sinks as attn_sinks in F32. On a 2-layer checkpoint from
`SYNTH_FAMILY=mimo_v2_flash`, `tarfa convert` of the GGUF and of the safetensors give
`cmp`-equal logits and llama.cpp 0c1e570's `llama-bench` runs it.

GLM-5.3-Flash (`glm5_next`, as `converter/examples/synth_decode_checkpoint.rs` writes it with
SYNTH_FAMILY=glm5_next): llama.cpp's `glm5-next`, written by fixtures/gguf/make_from_hf.py's
glm5_write (the writer of the glm5_next GGUF fixtures, which tarfa's tests hold to
convert_hf_to_gguf.py's Glm5NextModel) as `--outtype bf16` does: 1-D tensors, norms, the router,
the hyper-connections, the indexer's compressor and head weights (indexer.proj), the KDA
convolutions, ssm_a and ssm_dt in F32, matrices BF16 as stored.
That writer holds the stacked experts in memory until the file is written (about the model's
size: GPU machine only); `--verify` does not apply to it.

`--verify` also re-reads every key/value.

Only numpy and gguf are used; the source's headers are parsed here and its data copied with
os.pread in 16 MiB chunks, so memory stays low (under 100 MB) whatever the checkpoint's size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import time
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("error: the gguf package is missing (pip install gguf, or the wheel in bench/llama/wheels)")

ARCH = "qwen3moe"
GLM_ARCH = "glm4moe"
Q35_ARCH = "qwen35moe"
BF16 = "BF16"


CHUNK = 16 << 20


class Source:
    """Header-only safetensors reader: name -> (file, dtype, shape, offset, nbytes). Data is read
    with os.pread in 16 MiB chunks, so memory stays a few chunks whatever the checkpoint's size."""

    def __init__(self, src: Path) -> None:
        self.tensors: dict[str, tuple[Path, str, list[int], int, int]] = {}
        index = src / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in src.glob("*.safetensors"))
        if not files:
            sys.exit(f"error: {src}: no safetensors files")
        for f in files:
            path = src / f
            with open(path, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            base = 8 + n
            size = path.stat().st_size
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                a, b = info["data_offsets"]
                if base + b > size:
                    sys.exit(f"error: {path}: {name} runs past the end of the file")
                if info["dtype"] != BF16 and not (info["dtype"] == "F32" and len(info["shape"]) == 1):
                    sys.exit(f"error: {name} is {info['dtype']}; only BF16 sources (and F32 1-D tensors) are handled")
                self.tensors[name] = (path, info["dtype"], list(info["shape"]), base + a, b - a)
        self._fds: dict[Path, int] = {}

    def shape(self, name: str) -> list[int]:
        return self.tensors[name][2]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def span(self, name: str, start: int = 0, nbytes: int | None = None) -> "Spans":
        """Bytes [start, start + nbytes) of the tensor's data."""
        path, dtype, _, off, n = self.tensors[name]
        if dtype != BF16:
            sys.exit(f"error: {name} is {dtype}: wanted BF16 for a matrix")
        nbytes = n - start if nbytes is None else nbytes
        assert 0 <= start and start + nbytes <= n
        return Spans(self, [(path, off + start, nbytes)])

    def f32(self, name: str) -> np.ndarray:
        """A (small) BF16 tensor widened exactly to F32 (an F32 one as it is)."""
        path, dtype, shape, off, n = self.tensors[name]
        if dtype == "F32":
            return np.frombuffer(os.pread(self.fd(path), n, off), dtype="<f4").reshape(shape).astype(np.float32)
        raw = np.frombuffer(os.pread(self.fd(path), n, off), dtype=np.uint16).reshape(shape)
        return (raw.astype(np.uint32) << 16).view(np.float32)


class Spans:
    """Byte ranges of source files written one after the other as one GGUF tensor (several for
    the stacked experts). Duck-types what GGUFWriter.write_tensor_data uses of an ndarray:
    nbytes and tofile()."""

    def __init__(self, src: Source, spans: list[tuple[Path, int, int]]) -> None:
        self.src = src
        self.spans = spans
        self.nbytes = sum(n for _, _, n in spans)

    def __add__(self, other: "Spans") -> "Spans":
        return Spans(self.src, self.spans + other.spans)

    def chunks(self):
        for path, off, n in self.spans:
            fd = self.src.fd(path)
            end = off + n
            while off < end:
                b = os.pread(fd, min(CHUNK, end - off), off)
                if not b:
                    sys.exit(f"error: {path}: short read at {off}")
                yield b
                off += len(b)

    def tofile(self, fout) -> None:
        for b in self.chunks():
            fout.write(b)


def stacked_experts(src: Source, out: list, e: str, b: str, n_exp: int) -> None:
    """Append ffn_{gate,up,down}_exps of HF prefix e (`model.layers.N.mlp.experts`) as GGUF block b:
    per-expert tensors stacked in expert order, or fused gate_up_proj [E, 2I, H] split in its
    halves and down_proj [E, H, I] as it is. No bytes are read here: the producers read them."""
    if src.has(f"{e}.gate_up_proj"):  # fused [E, 2I, H], [E, H, I]
        ne, two_i, hh = src.shape(f"{e}.gate_up_proj")
        i = two_i // 2
        half = i * hh * 2  # bytes of one expert's gate (or up) half

        def halves(n: str = f"{e}.gate_up_proj", ne: int = ne, half: int = half, first: int = 0) -> Spans:
            out_ = src.span(n, first * half, half)
            for x in range(1, ne):
                out_ = out_ + src.span(n, (2 * x + first) * half, half)
            return out_

        out.append((f"{b}.ffn_gate_exps.weight", [ne, i, hh], BF16, lambda h=halves: h(first=0)))
        out.append((f"{b}.ffn_up_exps.weight", [ne, i, hh], BF16, lambda h=halves: h(first=1)))
        out.append((f"{b}.ffn_down_exps.weight", src.shape(f"{e}.down_proj"), BF16, lambda n=f"{e}.down_proj": src.span(n)))
    else:
        for proj, g in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"), ("down_proj", "ffn_down_exps")):
            names = [f"{e}.{x}.{proj}.weight" for x in range(n_exp)]
            missing = [n for n in names if not src.has(n)]
            if missing:
                sys.exit(f"error: missing {missing[0]} (and {len(missing) - 1} more)")
            shape = [n_exp] + src.shape(names[0])
            out.append((f"{b}.{g}.weight", shape, BF16, lambda ns=names: sum((src.span(n) for n in ns[1:]), src.span(ns[0]))))


def plan(src: Source, cfg: dict) -> tuple[list[tuple[str, list[int], str, object]], dict]:
    """Qwen3-MoE: every GGUF tensor in write order: (gguf name, numpy-order shape, 'BF16' | 'F32',
    producer)."""
    p = "model.layers"
    layers = int(cfg["num_hidden_layers"])
    n_exp = int(cfg.get("num_experts", cfg.get("num_local_experts", 0)))
    hidden = int(cfg["hidden_size"])
    out: list[tuple[str, list[int], str, object]] = []

    def bf16(gname: str, hname: str) -> None:
        out.append((gname, src.shape(hname), BF16, lambda h=hname: src.span(h)))

    def norm(gname: str, hname: str) -> None:
        out.append((gname, src.shape(hname), "F32", lambda h=hname: src.f32(h)))

    bf16("token_embd.weight", "model.embed_tokens.weight")
    q_norm = src.shape(f"{p}.0.self_attn.q_norm.weight")[0]
    for l in range(layers):
        h = f"{p}.{l}"
        b = f"blk.{l}"
        if not src.has(f"{h}.mlp.gate.weight"):
            sys.exit(f"error: layer {l} has no router ({h}.mlp.gate.weight): dense layers are not handled")
        norm(f"{b}.attn_norm.weight", f"{h}.input_layernorm.weight")
        bf16(f"{b}.attn_q.weight", f"{h}.self_attn.q_proj.weight")
        bf16(f"{b}.attn_k.weight", f"{h}.self_attn.k_proj.weight")
        bf16(f"{b}.attn_v.weight", f"{h}.self_attn.v_proj.weight")
        bf16(f"{b}.attn_output.weight", f"{h}.self_attn.o_proj.weight")
        norm(f"{b}.attn_q_norm.weight", f"{h}.self_attn.q_norm.weight")
        norm(f"{b}.attn_k_norm.weight", f"{h}.self_attn.k_norm.weight")
        norm(f"{b}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight")
        bf16(f"{b}.ffn_gate_inp.weight", f"{h}.mlp.gate.weight")
        stacked_experts(src, out, f"{h}.mlp.experts", b, n_exp)
    norm("output_norm.weight", "model.norm.weight")
    if src.has("lm_head.weight") and not cfg.get("tie_word_embeddings", False):
        bf16("output.weight", "lm_head.weight")

    # hyper-parameters, from config.json or the shapes
    head_dim = int(cfg.get("head_dim") or q_norm)
    q_rows = src.shape(f"{p}.0.self_attn.q_proj.weight")[0]
    k_rows = src.shape(f"{p}.0.self_attn.k_proj.weight")[0]
    n_head = int(cfg.get("num_attention_heads") or q_rows // head_dim)
    n_kv = int(cfg.get("num_key_value_heads") or k_rows // head_dim)
    if n_head * head_dim != q_rows or n_kv * head_dim != k_rows:
        sys.exit(f"error: q_proj rows {q_rows} / k_proj rows {k_rows} disagree with {n_head} x {head_dim} / {n_kv} x {head_dim}")
    rope = cfg.get("rope_parameters") or {}
    gate_shape = src.shape(f"{p}.0.mlp.gate.weight")
    if n_exp == 0:
        n_exp = gate_shape[0]
    if not src.has(f"{p}.0.mlp.experts.gate_up_proj"):
        moe_i = src.shape(f"{p}.0.mlp.experts.0.gate_proj.weight")[0]
    else:
        moe_i = src.shape(f"{p}.0.mlp.experts.gate_up_proj")[1] // 2
    hp = {
        "layers": layers,
        "hidden": hidden,
        "ctx": int(cfg.get("max_position_embeddings", 40960)),
        "ff": int(cfg.get("intermediate_size", moe_i)),
        "moe_i": int(cfg.get("moe_intermediate_size", moe_i)),
        "n_head": n_head,
        "n_kv": n_kv,
        "head_dim": head_dim,
        "rope_theta": float(cfg.get("rope_theta", rope.get("rope_theta", 1_000_000.0))),
        "eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "n_exp": n_exp,
        "top_k": int(cfg.get("num_experts_per_tok", min(8, n_exp))),
        "vocab": src.shape("model.embed_tokens.weight")[0],
    }
    return out, hp


class Planner:
    """A plan's tensors in write order (name, shape, kind, producer), each GGUF name checked
    against gguf-py's own HF -> GGUF map of `arch` (experts merged, the correction bias renamed
    as convert_hf_to_gguf.py renames it)."""

    def __init__(self, src: Source, arch, layers: int) -> None:
        self.src = src
        self.names = gguf.get_tensor_name_map(arch, layers)
        self.out: list[tuple[str, list[int], str, object]] = []

    def check(self, gname: str, hname: str) -> None:
        h = re.sub(r"\.experts\.\d+\.", ".experts.", hname).replace("e_score_correction_bias", "e_score_correction.bias")
        want = self.names.get_name(h, try_suffixes=(".weight", ".bias"))
        if want != gname:
            sys.exit(f"error: {hname} -> {gname}, but gguf's name map says {want}")

    def bf16(self, gname: str, hname: str) -> None:
        """The source's bytes as they are."""
        self.check(gname, hname)
        self.out.append((gname, self.src.shape(hname), BF16, lambda h=hname: self.src.span(h)))

    def f32(self, gname: str, hname: str) -> None:
        """A 1-D tensor (norm, bias) widened exactly to F32."""
        self.check(gname, hname)
        if len(self.src.shape(hname)) != 1:
            sys.exit(f"error: {hname}: {self.src.shape(hname)}, wanted 1-D")
        self.out.append((gname, self.src.shape(hname), "F32", lambda h=hname: self.src.f32(h)))


def plan_glm(src: Source, cfg: dict) -> tuple[list[tuple[str, list[int], str, object]], dict]:
    """GLM-4.5 (glm4_moe -> glm4moe): every GGUF tensor in write order, as plan(). Names follow
    llama.cpp's convert_hf_to_gguf.py (Glm4MoeModel) and are checked against gguf-py's name map."""
    p = "model.layers"
    layers = int(cfg["num_hidden_layers"])
    hidden = int(cfg["hidden_size"])
    n_dense = int(cfg.get("first_k_dense_replace", 0))
    n_exp = int(cfg.get("n_routed_experts") or src.shape(f"{p}.{n_dense}.mlp.gate.weight")[0])
    n_shared = int(cfg.get("n_shared_experts", 0))
    pl = Planner(src, gguf.MODEL_ARCH.GLM4_MOE, layers)
    out, check, bf16, f32 = pl.out, pl.check, pl.bf16, pl.f32

    bf16("token_embd.weight", "model.embed_tokens.weight")
    for l in range(layers):
        h = f"{p}.{l}"
        b = f"blk.{l}"
        f32(f"{b}.attn_norm.weight", f"{h}.input_layernorm.weight")
        for x in "qkv":
            bf16(f"{b}.attn_{x}.weight", f"{h}.self_attn.{x}_proj.weight")
            if src.has(f"{h}.self_attn.{x}_proj.bias"):
                f32(f"{b}.attn_{x}.bias", f"{h}.self_attn.{x}_proj.bias")
        bf16(f"{b}.attn_output.weight", f"{h}.self_attn.o_proj.weight")
        for x in "qk":
            if src.has(f"{h}.self_attn.{x}_norm.weight"):
                f32(f"{b}.attn_{x}_norm.weight", f"{h}.self_attn.{x}_norm.weight")
        f32(f"{b}.post_attention_norm.weight", f"{h}.post_attention_layernorm.weight")
        moe = src.has(f"{h}.mlp.gate.weight")
        if moe != (l >= n_dense):
            sys.exit(f"error: layer {l} {'has' if moe else 'has no'} router, but first_k_dense_replace is {n_dense}")
        if not moe:
            for x in ("gate", "up", "down"):
                bf16(f"{b}.ffn_{x}.weight", f"{h}.mlp.{x}_proj.weight")
            continue
        bf16(f"{b}.ffn_gate_inp.weight", f"{h}.mlp.gate.weight")
        if not src.has(f"{h}.mlp.gate.e_score_correction_bias"):
            sys.exit(f"error: {h}.mlp.gate.e_score_correction_bias is missing (llama.cpp's glm4moe requires exp_probs_b)")
        f32(f"{b}.exp_probs_b.bias", f"{h}.mlp.gate.e_score_correction_bias")
        at = len(out)
        stacked_experts(src, out, f"{h}.mlp.experts", b, n_exp)
        for gname, _, _, _ in out[at:]:
            x = gname.split(".")[2].split("_")[1]  # gate / up / down
            check(gname, f"{h}.mlp.experts.0.{x}_proj.weight")
        if n_shared > 0:
            for x in ("gate", "up", "down"):
                bf16(f"{b}.ffn_{x}_shexp.weight", f"{h}.mlp.shared_experts.{x}_proj.weight")
        elif src.has(f"{h}.mlp.shared_experts.gate_proj.weight"):
            sys.exit(f"error: {h} has shared experts, but n_shared_experts is {n_shared}")
    f32("output_norm.weight", "model.norm.weight")
    if src.has("lm_head.weight") and not cfg.get("tie_word_embeddings", False):
        bf16("output.weight", "lm_head.weight")
    skipped = [n for n in src.tensors if re.match(rf"{re.escape(p)}\.(\d+)\.", n) and int(n.split(".")[2]) >= layers]
    if skipped:
        print(f"note: {len(skipped)} tensors of MTP (NextN) layers >= {layers} left out", file=sys.stderr)

    head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
    q_rows = src.shape(f"{p}.0.self_attn.q_proj.weight")[0]
    k_rows = src.shape(f"{p}.0.self_attn.k_proj.weight")[0]
    n_head = int(cfg.get("num_attention_heads") or q_rows // head_dim)
    n_kv = int(cfg.get("num_key_value_heads") or k_rows // head_dim)
    if n_head * head_dim != q_rows or n_kv * head_dim != k_rows:
        sys.exit(f"error: q_proj rows {q_rows} / k_proj rows {k_rows} disagree with {n_head} x {head_dim} / {n_kv} x {head_dim}")
    e0 = f"{p}.{n_dense}.mlp.experts"
    moe_i = (src.shape(f"{e0}.gate_up_proj")[1] // 2 if src.has(f"{e0}.gate_up_proj")
             else src.shape(f"{e0}.0.gate_proj.weight")[0])
    moe_i = int(cfg.get("moe_intermediate_size", moe_i))
    if n_shared > 0 and src.shape(f"{p}.{n_dense}.mlp.shared_experts.gate_proj.weight")[0] != moe_i * n_shared:
        sys.exit(f"error: shared expert width {src.shape(f'{p}.{n_dense}.mlp.shared_experts.gate_proj.weight')[0]}"
                 f" != moe_intermediate_size {moe_i} x n_shared_experts {n_shared} (llama.cpp's glm4moe assumes it)")
    rope = cfg.get("rope_parameters") or {}
    prf = float(cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5)))
    hp = {
        "layers": layers,
        "hidden": hidden,
        "ctx": int(cfg.get("max_position_embeddings", 131072)),
        "ff": int(cfg.get("intermediate_size", moe_i)),
        "moe_i": moe_i,
        "n_head": n_head,
        "n_kv": n_kv,
        "head_dim": head_dim,
        "n_rot": int(head_dim * prf),
        "rope_theta": float(cfg.get("rope_theta", rope.get("rope_theta", 1_000_000.0))),
        "eps": float(cfg.get("rms_norm_eps", 1e-5)),
        "n_exp": n_exp,
        "top_k": int(cfg.get("num_experts_per_tok", 8)),
        "n_shared": n_shared,
        "n_dense": n_dense,
        "scale": float(cfg.get("routed_scaling_factor", 1.0)),
        "norm": bool(cfg.get("norm_topk_prob", True)),
        "n_group": cfg.get("n_group"),
        "topk_group": cfg.get("topk_group"),
        "vocab": src.shape("model.embed_tokens.weight")[0],
    }
    return out, hp


def v_head_order(n_k: int, per_k: int) -> list[int]:
    """llama.cpp's order of Gated DeltaNet value heads: new head v * n_k + k is HF head
    k * per_k + v. HF groups the value heads by key head (value head j reads key head
    j // per_k, a repeat_interleave); ggml broadcasts by tiling (value head j reads key head
    j % n_k), so convert_hf_to_gguf.py (_LinearAttentionVReorderBase) moves the heads."""
    return [k * per_k + v for v in range(per_k) for k in range(n_k)]


def plan_q35(src: Source, cfg: dict, pre: str) -> tuple[list[tuple[str, list[int], str, object]], dict]:
    """Qwen3.5-MoE (qwen3_5_moe_text -> qwen35moe): every GGUF tensor in write order, as plan(),
    with the transforms of llama.cpp's convert_hf_to_gguf.py (Qwen3_5MoeTextModel:
    _LinearAttentionVReorderBase, Qwen3NextModel, Qwen2MoeModel). `pre` is the HF prefix of the
    text model's tensors ("model" or "model.language_model")."""
    p = f"{pre}.layers"
    layers = int(cfg["num_hidden_layers"])
    hidden = int(cfg["hidden_size"])
    every = int(cfg.get("full_attention_interval", 4))
    types = cfg.get("layer_types") or ["full_attention" if (l + 1) % every == 0 else "linear_attention"
                                       for l in range(layers)]
    if len(types) != layers or any(t not in ("full_attention", "linear_attention") for t in types):
        sys.exit(f"error: layer_types {types!r}: wanted {layers} of full_attention / linear_attention")
    n_k = int(cfg.get("linear_num_key_heads", 16))
    n_v = int(cfg.get("linear_num_value_heads", 32))
    dk = int(cfg.get("linear_key_head_dim", 128))
    dv = int(cfg.get("linear_value_head_dim", 128))
    kernel = int(cfg.get("linear_conv_kernel_dim", 4))
    if n_v % n_k:
        sys.exit(f"error: linear_num_value_heads {n_v} is not a multiple of linear_num_key_heads {n_k}")
    per_k = n_v // n_k
    order = v_head_order(n_k, per_k)
    key_dim, value_dim = n_k * dk, n_v * dv
    conv_dim = 2 * key_dim + value_dim
    n_exp = int(cfg.get("num_experts") or src.shape(f"{p}.0.mlp.gate.weight")[0])
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35MOE, layers)
    out: list[tuple[str, list[int], str, object]] = []

    def check(gname: str, hname: str) -> None:
        # gguf-py's map of the HF name as convert_hf_to_gguf passes it (experts merged, the
        # text model's prefix as "model.", dt_bias renamed dt_proj.bias)
        h = re.sub(r"\.experts\.\d+\.", ".experts.", hname.replace(f"{pre}.", "model.", 1))
        h = h.replace(".dt_bias", ".dt_proj.bias")
        want = names.get_name(h, try_suffixes=(".weight", ".bias"))
        if want != gname:
            sys.exit(f"error: {hname} -> {gname}, but gguf's name map says {want}")

    def want_shape(hname: str, shape: list[int]) -> None:
        if src.shape(hname) != shape:
            sys.exit(f"error: {hname}: {src.shape(hname)}, wanted {shape}")

    def bf16(gname: str, hname: str) -> None:
        check(gname, hname)
        out.append((gname, src.shape(hname), BF16, lambda h=hname: src.span(h)))

    def f32(gname: str, hname: str, shape: list[int], fn=lambda x: x) -> None:
        check(gname, hname)
        out.append((gname, shape, "F32", lambda h=hname, fn=fn, shape=shape:
                    np.ascontiguousarray(fn(src.f32(h)), dtype=np.float32).reshape(shape)))

    def one_plus(x: np.ndarray) -> np.ndarray:  # zero-centred RMSNorm weight, applied as 1 + w
        return x + np.float32(1.0)

    def rows(hname: str, first: int, heads: list[int], head_rows: int) -> Spans:
        """Rows [0, first) of a BF16 matrix, then its blocks of head_rows rows in `heads` order:
        a row permutation is a list of byte ranges of the source."""
        row = src.shape(hname)[1] * 2
        out_ = src.span(hname, 0, first * row) if first else None
        for hd in heads:
            s = src.span(hname, (first + hd * head_rows) * row, head_rows * row)
            out_ = s if out_ is None else out_ + s
        return out_

    def v_rows(gname: str, hname: str, first: int, head_rows: int) -> None:
        check(gname, hname)
        out.append((gname, src.shape(hname), BF16,
                    lambda h=hname, f=first, r=head_rows: rows(h, f, order, r)))

    def v_vec(x: np.ndarray) -> np.ndarray:  # [n_v] per value head
        return x.reshape(n_k, per_k).T.reshape(-1)

    def bf16_matrix(hname: str) -> np.ndarray:
        path, _, shape, off, n = src.tensors[hname]
        return np.frombuffer(os.pread(src.fd(path), n, off), dtype=np.uint16).reshape(shape)

    bf16("token_embd.weight", f"{pre}.embed_tokens.weight")
    for l in range(layers):
        h = f"{p}.{l}"
        b = f"blk.{l}"
        f32(f"{b}.attn_norm.weight", f"{h}.input_layernorm.weight", [hidden], one_plus)
        if types[l] == "full_attention":
            a = f"{h}.self_attn"
            # q_proj: per head [q_h | gate_h] (2 * heads * head_dim rows), as llama.cpp's graph
            # splits it: no reordering.
            for x in "qkv":
                bf16(f"{b}.attn_{x}.weight", f"{a}.{x}_proj.weight")
            bf16(f"{b}.attn_output.weight", f"{a}.o_proj.weight")
            hd = src.shape(f"{a}.q_norm.weight")[0]
            f32(f"{b}.attn_q_norm.weight", f"{a}.q_norm.weight", [hd], one_plus)
            f32(f"{b}.attn_k_norm.weight", f"{a}.k_norm.weight", [hd], one_plus)
            for x in ("q", "k", "v", "o"):
                if src.has(f"{a}.{x}_proj.bias"):
                    sys.exit(f"error: {a}.{x}_proj.bias: attention biases are not handled")
        else:
            a = f"{h}.linear_attn"
            want_shape(f"{a}.in_proj_qkv.weight", [conv_dim, hidden])
            want_shape(f"{a}.in_proj_z.weight", [value_dim, hidden])
            want_shape(f"{a}.in_proj_b.weight", [n_v, hidden])
            want_shape(f"{a}.in_proj_a.weight", [n_v, hidden])
            want_shape(f"{a}.conv1d.weight", [conv_dim, 1, kernel])
            want_shape(f"{a}.out_proj.weight", [hidden, value_dim])
            # q and k rows stay, the value rows (heads of dv rows) move
            v_rows(f"{b}.attn_qkv.weight", f"{a}.in_proj_qkv.weight", 2 * key_dim, dv)
            v_rows(f"{b}.attn_gate.weight", f"{a}.in_proj_z.weight", 0, dv)
            v_rows(f"{b}.ssm_beta.weight", f"{a}.in_proj_b.weight", 0, 1)
            v_rows(f"{b}.ssm_alpha.weight", f"{a}.in_proj_a.weight", 0, 1)
            # conv1d [C, 1, K] squeezed to [C, K], F32 (ggml_ssm_conv reads F32 only); its value
            # channels move with the heads
            f32(f"{b}.ssm_conv1d.weight", f"{a}.conv1d.weight", [conv_dim, kernel],
                lambda x: np.concatenate([x.reshape(conv_dim, kernel)[:2 * key_dim],
                                          x.reshape(conv_dim, kernel)[2 * key_dim:]
                                          .reshape(n_k, per_k, dv, kernel).transpose(1, 0, 2, 3)
                                          .reshape(value_dim, kernel)]))
            f32(f"{b}.ssm_dt.bias", f"{a}.dt_bias", [n_v], v_vec)
            # A_log -> ssm_a = -exp(A_log) (f32, as torch computes it in convert_hf_to_gguf.py)
            f32(f"{b}.ssm_a", f"{a}.A_log", [n_v], lambda x: -np.exp(v_vec(x)))
            # the gated output norm is applied as w in both: no + 1
            f32(f"{b}.ssm_norm.weight", f"{a}.norm.weight", [dv])
            check(f"{b}.ssm_out.weight", f"{a}.out_proj.weight")
            out.append((f"{b}.ssm_out.weight", [hidden, value_dim], BF16,
                        lambda hn=f"{a}.out_proj.weight": np.ascontiguousarray(
                            bf16_matrix(hn).reshape(hidden, n_k, per_k, dv).transpose(0, 2, 1, 3)
                            .reshape(hidden, value_dim))))
        f32(f"{b}.post_attention_norm.weight", f"{h}.post_attention_layernorm.weight", [hidden], one_plus)
        bf16(f"{b}.ffn_gate_inp.weight", f"{h}.mlp.gate.weight")
        at = len(out)
        stacked_experts(src, out, f"{h}.mlp.experts", b, n_exp)
        for gname, _, _, _ in out[at:]:
            x = gname.split(".")[2].split("_")[1]  # gate / up / down
            check(gname, f"{h}.mlp.experts.0.{x}_proj.weight")
        for x in ("gate", "up", "down"):
            bf16(f"{b}.ffn_{x}_shexp.weight", f"{h}.mlp.shared_expert.{x}_proj.weight")
        # [1, H]: llama.cpp declares it {n_embd} and accepts ne {H, 1}; BF16 like the router
        want_shape(f"{h}.mlp.shared_expert_gate.weight", [1, hidden])
        bf16(f"{b}.ffn_gate_inp_shexp.weight", f"{h}.mlp.shared_expert_gate.weight")
    f32("output_norm.weight", f"{pre}.norm.weight", [hidden], one_plus)
    if src.has("lm_head.weight") and not cfg.get("tie_word_embeddings", False):
        bf16("output.weight", "lm_head.weight")
    skipped = [n for n in src.tensors if n.startswith("mtp.") or n.startswith("model.visual.")]
    if skipped:
        print(f"note: {len(skipped)} MTP / vision tensors left out", file=sys.stderr)

    full = types.index("full_attention") if "full_attention" in types else None
    if full is None:
        sys.exit("error: no full_attention layer: llama.cpp's qwen35moe needs one to read the head sizes")
    head_dim = int(cfg.get("head_dim", 256))
    n_head = int(cfg.get("num_attention_heads", 16))
    n_kv = int(cfg.get("num_key_value_heads", 2))
    want_shape(f"{p}.{full}.self_attn.q_proj.weight", [2 * n_head * head_dim, hidden])
    want_shape(f"{p}.{full}.self_attn.k_proj.weight", [n_kv * head_dim, hidden])
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        sys.exit(f"error: rope_type {rope.get('rope_type')!r}: only the default rope is handled")
    prf = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    sections = list(rope.get("mrope_section", [11, 11, 10]))[:4]
    sections += [0] * (4 - len(sections))
    e0 = f"{p}.0.mlp.experts"
    moe_i = (src.shape(f"{e0}.gate_up_proj")[1] // 2 if src.has(f"{e0}.gate_up_proj")
             else src.shape(f"{e0}.0.gate_proj.weight")[0])
    moe_i = int(cfg.get("moe_intermediate_size", moe_i))
    shared_i = int(cfg.get("shared_expert_intermediate_size", src.shape(f"{p}.0.mlp.shared_expert.gate_proj.weight")[0]))
    if src.shape(f"{p}.0.mlp.shared_expert.gate_proj.weight")[0] != shared_i:
        sys.exit("error: shared expert width disagrees with shared_expert_intermediate_size")
    hp = {
        "layers": layers,
        "hidden": hidden,
        "ctx": int(cfg.get("max_position_embeddings", 262144)),
        "moe_i": moe_i,
        "shared_i": shared_i,
        "n_head": n_head,
        "n_kv": n_kv,
        "head_dim": head_dim,
        "n_rot": int(head_dim * prf),
        "sections": sections,
        "rope_theta": float(rope.get("rope_theta", cfg.get("rope_theta", 10_000_000.0))),
        "eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "n_exp": n_exp,
        "top_k": int(cfg.get("num_experts_per_tok", 8)),
        "conv_kernel": kernel,
        "state_size": dk,
        "group_count": n_k,
        "dt_rank": n_v,
        "inner_size": value_dim,
        "recurrent": [t == "linear_attention" for t in types],
        "every": every,
        "vocab": src.shape(f"{pre}.embed_tokens.weight")[0],
    }
    if dk != dv:
        sys.exit(f"error: linear_key_head_dim {dk} != linear_value_head_dim {dv}: llama.cpp's qwen35moe takes both as ssm.state_size")
    return out, hp


def check_q35(path: Path, src: Source, cfg: dict, pre: str) -> None:
    """An independent check of the Qwen3.5 transforms, on whole tensors and as
    convert_hf_to_gguf.py writes them (_reorder_v_heads: reshape the head axis to
    [n_k, per_k, d] and swap the first two): every linear_attn tensor, and the norms' + 1."""
    n_k = int(cfg.get("linear_num_key_heads", 16))
    n_v = int(cfg.get("linear_num_value_heads", 32))
    dk = int(cfg.get("linear_key_head_dim", 128))
    dv = int(cfg.get("linear_value_head_dim", 128))
    per_k = n_v // n_k

    def reorder(t: np.ndarray, dim: int, hd: int) -> np.ndarray:
        shape = list(t.shape)
        t = t.reshape(shape[:dim] + [n_k, per_k, hd] + shape[dim + 1:])
        return np.swapaxes(t, dim, dim + 1).reshape(shape)

    def load(name: str) -> np.ndarray:
        path_, dtype, shape, off, n = src.tensors[name]
        raw = os.pread(src.fd(path_), n, off)
        if dtype == "F32":
            return np.frombuffer(raw, dtype="<f4").reshape(shape)
        return (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)

    r = gguf.GGUFReader(path)
    got = {t.name: t for t in r.tensors}

    def gg(name: str) -> np.ndarray:
        t = got[name]
        d = np.asarray(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.BF16:
            d = (d.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return d.reshape([int(x) for x in reversed(t.shape)])

    n = 0
    for l in range(int(cfg["num_hidden_layers"])):
        a = f"{pre}.layers.{l}.linear_attn"
        b = f"blk.{l}"
        if not src.has(f"{a}.in_proj_qkv.weight"):
            for hn, gn in ((f"{pre}.layers.{l}.self_attn.q_norm.weight", f"{b}.attn_q_norm.weight"),
                           (f"{pre}.layers.{l}.self_attn.k_norm.weight", f"{b}.attn_k_norm.weight")):
                assert np.array_equal(gg(gn), load(hn) + np.float32(1)), gn
                n += 1
            continue
        qkv = load(f"{a}.in_proj_qkv.weight")
        q, k, v = qkv[:n_k * dk], qkv[n_k * dk:2 * n_k * dk], qkv[2 * n_k * dk:]
        conv = load(f"{a}.conv1d.weight").squeeze()
        want = {
            f"{b}.attn_qkv.weight": np.concatenate([q, k, reorder(v, 0, dv)]),
            f"{b}.attn_gate.weight": reorder(load(f"{a}.in_proj_z.weight"), 0, dv),
            f"{b}.ssm_beta.weight": reorder(load(f"{a}.in_proj_b.weight"), 0, 1),
            f"{b}.ssm_alpha.weight": reorder(load(f"{a}.in_proj_a.weight"), 0, 1),
            f"{b}.ssm_conv1d.weight": np.concatenate([conv[:2 * n_k * dk], reorder(conv[2 * n_k * dk:], 0, dv)]),
            f"{b}.ssm_dt.bias": reorder(load(f"{a}.dt_bias")[:, None], 0, 1)[:, 0],
            f"{b}.ssm_a": -np.exp(reorder(load(f"{a}.A_log")[:, None], 0, 1)[:, 0]),
            f"{b}.ssm_norm.weight": load(f"{a}.norm.weight"),
            f"{b}.ssm_out.weight": reorder(load(f"{a}.out_proj.weight"), 1, dv),
        }
        for gn, w in want.items():
            if not np.array_equal(gg(gn), w.astype(np.float32)):
                sys.exit(f"check: {gn} differs from convert_hf_to_gguf.py's transform")
            n += 1
    for hn, gn in ((f"{pre}.norm.weight", "output_norm.weight"),
                   (f"{pre}.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
                   (f"{pre}.layers.0.post_attention_layernorm.weight", "blk.0.post_attention_norm.weight")):
        if not np.array_equal(gg(gn), load(hn) + np.float32(1)):
            sys.exit(f"check: {gn} != 1 + {hn}")
        n += 1
    print(f"check: {n} Qwen3.5 tensors equal to convert_hf_to_gguf.py's transforms of the source", file=sys.stderr)


def verify(path: Path, tensors: list, kv: dict) -> None:
    """Re-read the GGUF: its key/values and tensor directory with gguf's own reader, then every
    tensor's bytes (pread, chunk by chunk) against what was meant: the source's bytes, or for
    norms (and biases) the exact F32 widening of them."""
    t0 = time.time()
    r = gguf.GGUFReader(path)
    for key, (value, vtype) in kv.items():
        f = r.fields.get(key)
        if f is None:
            sys.exit(f"verify: key {key} missing")
        got_v = f.contents()
        same = (np.float32(got_v) == np.float32(value)) if isinstance(value, float) else got_v == value
        if f.types[:1] != [vtype] or not same:
            sys.exit(f"verify: key {key}: {got_v!r} ({f.types}), wanted {value!r} ({vtype})")
    got = {t.name: t for t in r.tensors}
    if len(got) != len(tensors) or len(r.tensors) != len(tensors):
        sys.exit(f"verify: {len(r.tensors)} tensors in the GGUF, {len(tensors)} planned")
    fd = os.open(path, os.O_RDONLY)
    for name, shape, kind, make in tensors:
        t = got[name]
        want_type = gguf.GGMLQuantizationType.BF16 if kind == BF16 else gguf.GGMLQuantizationType.F32
        if t.tensor_type != want_type or [int(x) for x in reversed(t.shape)] != shape:
            sys.exit(f"verify: {name}: {t.tensor_type.name} {list(t.shape)}, wanted {kind} {shape[::-1]}")
        if int(t.n_bytes) != int(np.prod(shape)) * (2 if kind == BF16 else 4):
            sys.exit(f"verify: {name}: {t.n_bytes} bytes")
        at = int(t.data_offset)
        want = make()
        chunks = want.chunks() if isinstance(want, Spans) else [want.tobytes()]
        for b in chunks:
            if os.pread(fd, len(b), at) != b:
                sys.exit(f"verify: {name}: bytes differ from the source near file offset {at}")
            at += len(b)
    os.close(fd)
    print(f"verify: {len(kv)} key/values as written, {len(tensors)} tensors equal to the source ({time.time() - t0:.1f} s)",
          file=sys.stderr)


def plan_ds(src: Source, cfg: dict) -> list[tuple[str, list[int], str, object]]:
    """DeepSeek-V3 (deepseek_v3 -> deepseek2): every GGUF tensor in write order, as plan(), in
    llama.cpp's split MLA form (convert_hf_to_gguf.py's DeepseekV2Model): kv_b_proj written as
    attn_k_b [heads, rank, nope] (each head's key rows transposed) and attn_v_b [heads, v, rank]
    (fixtures/gguf/make_from_hf.py's split_kv_b, which tarfa's GGUF tests hold to the converter);
    norms, the correction bias and kv_a_layernorm in F32. Names checked against gguf-py's map."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "gguf"))
    import make_from_hf

    p = "model.layers"
    layers = int(cfg["num_hidden_layers"])
    n_dense = int(cfg.get("first_k_dense_replace", 0))
    n_exp = int(cfg["n_routed_experts"])
    pl = Planner(src, gguf.MODEL_ARCH.DEEPSEEK2, layers)
    out, check, bf16, f32 = pl.out, pl.check, pl.bf16, pl.f32

    def kv_b(h: str, which: int):
        # The whole kv_b_proj's bits as uint16, split as the converter splits it.
        n = f"{h}.self_attn.kv_b_proj.weight"
        raw = np.frombuffer(b"".join(src.span(n).chunks()), dtype=np.uint16).reshape(src.shape(n))
        return make_from_hf.split_kv_b(cfg, raw)[which]

    heads, rank = int(cfg["num_attention_heads"]), int(cfg["kv_lora_rank"])
    nope, v = int(cfg["qk_nope_head_dim"]), int(cfg["v_head_dim"])
    bf16("token_embd.weight", "model.embed_tokens.weight")
    for l in range(layers):
        h = f"{p}.{l}"
        b = f"blk.{l}"
        a = f"{h}.self_attn"
        f32(f"{b}.attn_norm.weight", f"{h}.input_layernorm.weight")
        if src.has(f"{a}.q_a_proj.weight"):
            bf16(f"{b}.attn_q_a.weight", f"{a}.q_a_proj.weight")
            f32(f"{b}.attn_q_a_norm.weight", f"{a}.q_a_layernorm.weight")
            bf16(f"{b}.attn_q_b.weight", f"{a}.q_b_proj.weight")
        else:
            bf16(f"{b}.attn_q.weight", f"{a}.q_proj.weight")
        bf16(f"{b}.attn_kv_a_mqa.weight", f"{a}.kv_a_proj_with_mqa.weight")
        f32(f"{b}.attn_kv_a_norm.weight", f"{a}.kv_a_layernorm.weight")
        check(f"{b}.attn_k_b.weight", f"{a}.k_b_proj.weight")
        check(f"{b}.attn_v_b.weight", f"{a}.v_b_proj.weight")
        out.append((f"{b}.attn_k_b.weight", [heads, rank, nope], BF16, lambda h=h: kv_b(h, 0)))
        out.append((f"{b}.attn_v_b.weight", [heads, v, rank], BF16, lambda h=h: kv_b(h, 1)))
        bf16(f"{b}.attn_output.weight", f"{a}.o_proj.weight")
        f32(f"{b}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight")
        if l < n_dense:
            for x in ("gate", "up", "down"):
                bf16(f"{b}.ffn_{x}.weight", f"{h}.mlp.{x}_proj.weight")
            continue
        bf16(f"{b}.ffn_gate_inp.weight", f"{h}.mlp.gate.weight")
        f32(f"{b}.exp_probs_b.bias", f"{h}.mlp.gate.e_score_correction_bias")
        stacked_experts(src, out, f"{h}.mlp.experts", b, n_exp)
        for x in ("gate", "up", "down"):
            bf16(f"{b}.ffn_{x}_shexp.weight", f"{h}.mlp.shared_experts.{x}_proj.weight")
    f32("output_norm.weight", "model.norm.weight")
    bf16("output.weight", "lm_head.weight")
    return out


def deepseek_v3(src: Source, cfg: dict, args) -> None:
    """DeepSeek-V3 as llama.cpp's deepseek2 (split MLA), its key/values by
    fixtures/gguf/make_from_hf.py's deepseek_keys (the fixtures' writer)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "gguf"))
    import make_from_hf

    tensors = plan_ds(src, cfg)
    arch = gguf.MODEL_ARCH.DEEPSEEK2
    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(f"{args.src.name} (tarfa bench/llama/safetensors_to_gguf.py)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_block_count(int(cfg["num_hidden_layers"]))
    w.add_context_length(int(cfg.get("max_position_embeddings", 4096)))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))
    rope = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
    w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))
    # Its vocab_size, the rope, MLA, expert and router keys, as the fixtures' GGUFs have them.
    make_from_hf.deepseek_keys(w, cfg, rope, False)
    hp = {k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "n_routed_experts", "kv_lora_rank")}
    kv = write_planned(w, tensors, args, hp)
    if args.verify:
        verify(args.out, tensors, kv)


def mimo_v2_flash(src: Source, cfg: dict, args) -> None:
    """MiMo-V2-Flash as llama.cpp's mimo2, the keys as fixtures/gguf/make_from_hf.py's mimo2_main
    writes them (convert_hf_to_gguf.py's MimoV2Model): per-layer head_count_kv (the sliding
    layers twice the full ones') and sliding_window_pattern, value_length, the window, one
    rope.dimension_count for both kinds, rope.freq_base and rope.freq_base_swa,
    attention.value_scale, the sigmoid router; the sinks as blk.N.attn_sinks (F32), norms and the
    correction bias F32, matrices BF16 as they are."""
    arch = gguf.MODEL_ARCH.MIMO2
    an = gguf.MODEL_ARCH_NAMES[arch]
    if cfg.get("routed_scaling_factor") not in (None, 1.0):
        sys.exit("error: llama.cpp's mimo2 does not scale its routed experts")
    nl = int(cfg["num_hidden_layers"])
    rope = cfg["rope_parameters"]
    full, swa = rope["full_attention"], rope["sliding_attention"]
    if full["partial_rotary_factor"] != swa["partial_rotary_factor"]:
        sys.exit("error: llama.cpp's mimo2 rotates one width in both layer kinds")
    sliding = [1 if t == "sliding_attention" else 0 for t in cfg["layer_types"]]
    dense = [t == "dense" for t in cfg["mlp_layer_types"]]
    kv = int(cfg["num_key_value_heads"])
    pl = Planner(src, arch, nl)
    p = "model.layers"
    pl.bf16("token_embd.weight", "model.embed_tokens.weight")
    for l in range(nl):
        h, b, a = f"{p}.{l}", f"blk.{l}", f"{p}.{l}.self_attn"
        pl.f32(f"{b}.attn_norm.weight", f"{h}.input_layernorm.weight")
        for x in "qkv":
            pl.bf16(f"{b}.attn_{x}.weight", f"{a}.{x}_proj.weight")
        pl.bf16(f"{b}.attn_output.weight", f"{a}.o_proj.weight")
        if src.has(f"{a}.attention_sink_bias"):
            # MimoV2Model.filter_tensors: the sinks get a ".weight" suffix.
            pl.check(f"{b}.attn_sinks.weight", f"{a}.attention_sink_bias.weight")
            pl.out.append((f"{b}.attn_sinks.weight", src.shape(f"{a}.attention_sink_bias"), "F32",
                           lambda n=f"{a}.attention_sink_bias": src.f32(n)))
        pl.f32(f"{b}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight")
        if dense[l]:
            for x in ("gate", "up", "down"):
                pl.bf16(f"{b}.ffn_{x}.weight", f"{h}.mlp.{x}_proj.weight")
            continue
        pl.bf16(f"{b}.ffn_gate_inp.weight", f"{h}.mlp.gate.weight")
        pl.f32(f"{b}.exp_probs_b.bias", f"{h}.mlp.gate.e_score_correction_bias")
        stacked_experts(src, pl.out, f"{h}.mlp.experts", b, int(cfg["n_routed_experts"]))
    pl.f32("output_norm.weight", "model.norm.weight")
    pl.bf16("output.weight", "lm_head.weight")
    w = gguf.GGUFWriter(args.out, an)
    w.add_name(f"{args.src.name} (tarfa bench/llama/safetensors_to_gguf.py)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_block_count(nl)
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_head_count_kv([2 * kv if s else kv for s in sliding])
    w.add_rope_freq_base(float(full["rope_theta"]))
    w.add_rope_freq_base_swa(float(swa["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_expert_count(int(cfg["n_routed_experts"]))
    w.add_expert_used_count(int(cfg["num_experts_per_tok"]))
    w.add_expert_group_count(int(cfg["n_group"]))
    w.add_expert_group_used_count(int(cfg["topk_group"]))
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_key_length(int(cfg["head_dim"]))
    w.add_value_length(int(cfg["v_head_dim"]))
    w.add_sliding_window(int(cfg["sliding_window"]))
    w.add_array(f"{an}.attention.sliding_window_pattern", sliding)
    w.add_expert_feed_forward_length(int(cfg["moe_intermediate_size"]))
    w.add_rope_dimension_count(int(int(cfg["head_dim"]) * full["partial_rotary_factor"]))
    # gguf 0.19.0 has no add_attn_value_scale: the key as llama.cpp's constants.py names it.
    w.add_float32(f"{an}.attention.value_scale", float(cfg["attention_value_scale"]))
    w.add_vocab_size(src.shape("model.embed_tokens.weight")[0])
    kv_written = write_planned(w, pl.out, args, {"layers": nl, "sliding": sliding})
    if args.verify:
        verify(args.out, pl.out, kv_written)


def glm5_next(src: Source, top: dict, args) -> None:
    """GLM-5.3-Flash through fixtures/gguf/make_from_hf.py's glm5_write, the tensors mapped from
    the source files (read as the writer goes)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fixtures" / "gguf"))
    import make_from_hf

    raw = {}
    files = {}  # one read-only map a shard (a map a tensor would hold a descriptor each)
    for name, (path, dtype, shape, off, n) in src.tensors.items():
        if dtype not in (BF16, "F32"):
            sys.exit(f"error: {name} is {dtype}: only BF16 and F32 are handled")
        if path not in files:
            files[path] = np.memmap(path, dtype=np.uint8, mode="r")
        np_dtype = np.uint16 if dtype == BF16 else np.float32
        raw[name] = (dtype, files[path][off : off + n].view(np_dtype).reshape(shape))
    t0 = time.time()
    make_from_hf.glm5_write(raw, top, None, args.out, f"{args.src.name} (tarfa bench/llama/safetensors_to_gguf.py)",
                            f32_small=True)
    print(f"{args.out}: {os.path.getsize(args.out)} bytes, {time.time() - t0:.1f} s", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--verify", action="store_true", help="re-read the GGUF and compare every tensor")
    args = ap.parse_args()
    cfg = json.loads((args.src / "config.json").read_text())
    family = cfg.get("model_type") or "qwen3_moe"
    pre = "model"
    if family == "qwen3_5_moe":  # the multimodal wrapper: its text model only
        cfg, pre, family = cfg["text_config"], "model.language_model", "qwen3_5_moe_text"
    if family == "glm5_next":
        if args.verify:
            sys.exit("error: --verify is not implemented for glm5_next")
        glm5_next(Source(args.src), json.loads((args.src / "config.json").read_text()), args)
        return
    if family == "deepseek_v3":
        deepseek_v3(Source(args.src), cfg, args)
        return
    if family == "mimo_v2_flash":
        mimo_v2_flash(Source(args.src), cfg, args)
        return
    if family not in ("qwen3_moe", "glm4_moe", "qwen3_5_moe_text"):
        sys.exit(f"error: model_type {family!r}: only qwen3_moe, glm4_moe, qwen3_5_moe_text, glm5_next, "
                 "deepseek_v3 and mimo_v2_flash are handled")
    src = Source(args.src)
    if family == "qwen3_5_moe_text":
        tensors, hp = plan_q35(src, cfg, pre)
    else:
        tensors, hp = (plan_glm if family == "glm4_moe" else plan)(src, cfg)

    w = gguf.GGUFWriter(args.out, {"glm4_moe": GLM_ARCH, "qwen3_5_moe_text": Q35_ARCH}.get(family, ARCH))
    w.add_name(f"{args.src.name} (tarfa bench/llama/safetensors_to_gguf.py)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_block_count(hp["layers"])
    w.add_context_length(hp["ctx"])
    w.add_embedding_length(hp["hidden"])
    if "ff" in hp:  # qwen3_5_moe_text has no intermediate_size: convert_hf_to_gguf.py writes none
        w.add_feed_forward_length(hp["ff"])
    w.add_head_count(hp["n_head"])
    w.add_head_count_kv(hp["n_kv"])
    w.add_key_length(hp["head_dim"])
    w.add_value_length(hp["head_dim"])
    w.add_rope_freq_base(hp["rope_theta"])
    w.add_layer_norm_rms_eps(hp["eps"])
    w.add_expert_count(hp["n_exp"])
    w.add_expert_used_count(hp["top_k"])
    w.add_expert_feed_forward_length(hp["moe_i"])
    if family == "glm4_moe":  # as convert_hf_to_gguf.py's Glm4MoeModel.set_gguf_parameters
        w.add_rope_dimension_count(hp["n_rot"])
        w.add_expert_shared_count(hp["n_shared"])
        w.add_leading_dense_block_count(hp["n_dense"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_expert_weights_scale(hp["scale"])
        w.add_expert_weights_norm(hp["norm"])
        if hp["n_group"] is not None:
            w.add_expert_group_count(int(hp["n_group"]))
        if hp["topk_group"] is not None:
            w.add_expert_group_used_count(int(hp["topk_group"]))
        w.add_nextn_predict_layers(0)
    if family == "qwen3_5_moe_text":  # as Qwen3_5MoeTextModel (Qwen3NextModel, Qwen2MoeModel)
        w.add_expert_shared_feed_forward_length(hp["shared_i"])
        w.add_rope_dimension_sections(hp["sections"])
        w.add_ssm_conv_kernel(hp["conv_kernel"])
        w.add_ssm_state_size(hp["state_size"])
        w.add_ssm_group_count(hp["group_count"])
        w.add_ssm_time_step_rank(hp["dt_rank"])
        w.add_ssm_inner_size(hp["inner_size"])
        # add_recurrent_layers (gguf-py of llama.cpp 0c1e570) is not in gguf 0.19.0: the same key
        w.add_array(f"{Q35_ARCH}.attention.recurrent_layers", hp["recurrent"])
        w.add_full_attention_interval(hp["every"])
        w.add_rope_dimension_count(hp["n_rot"])
    w.add_vocab_size(hp["vocab"])
    kv = write_planned(w, tensors, args, hp)
    if args.verify:
        verify(args.out, tensors, kv)
        if family == "qwen3_5_moe_text":
            check_q35(args.out, src, cfg, pre)


def write_planned(w: gguf.GGUFWriter, tensors: list, args, hp: dict) -> dict:
    """The tokenizer ("none": llama.cpp makes vocab_size dummy tokens), the header, the
    key/values and every planned tensor (name, shape, kind, producer) in order; the key/values
    written, for --verify."""
    w.add_tokenizer_model("none")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    kv = {k: (v.value, v.type) for k, v in w.kv_data[0].items()}
    for name, shape, kind, _ in tensors:
        if kind == BF16:
            nbytes = int(np.prod(shape)) * 2
            w.add_tensor_info(name, shape, np.dtype(np.uint16), nbytes, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    t0 = time.time()
    total = 0
    for i, (name, shape, kind, make) in enumerate(tensors):
        data = make()
        w.write_tensor_data(data)
        total += data.nbytes
        if re.fullmatch(r"blk\.\d+\.ffn_down_exps\.weight", name):
            print(f"  {name}: {total / 1e9:.2f} GB written, {total / 1e9 / max(time.time() - t0, 1e-9):.2f} GB/s",
                  file=sys.stderr)
    w.close()
    size = os.path.getsize(args.out)
    print(f"{args.out}: {len(tensors)} tensors, {size} bytes, {hp}, {time.time() - t0:.1f} s", file=sys.stderr)
    return kv


if __name__ == "__main__":
    main()
