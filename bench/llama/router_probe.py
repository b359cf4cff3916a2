#!/usr/bin/env python3
"""How a generated checkpoint's layer-0 router spreads tokens: a float64 numpy forward of layer 0
at position 0 (one token, so attention is o_proj of v) for N random tokens, printing the hidden
state's scale, the router's top-k, and how many distinct experts the N tokens chose (a uniform
router: E * (1 - (1 - k/E)^N), about 82 of 128 for N = 16, k = 8).

    python3 bench/llama/router_probe.py SRC_DIR [N]
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from safetensors_to_gguf import Source  # noqa: E402


def main() -> None:
    d = Path(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    cfg = json.loads((d / "config.json").read_text())
    src = Source(d)
    f = lambda name: src.f32(name).astype(np.float64)  # noqa: E731
    eps = float(cfg.get("rms_norm_eps", 1e-6))
    rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w  # noqa: E731
    p = "model.layers.0"
    emb = f("model.embed_tokens.weight")
    wv, wo = f(f"{p}.self_attn.v_proj.weight"), f(f"{p}.self_attn.o_proj.weight")
    hd = src.shape(f"{p}.self_attn.q_norm.weight")[0]
    nh = src.shape(f"{p}.self_attn.q_proj.weight")[0] // hd
    nkv = wv.shape[0] // hd
    ln1, ln2 = f(f"{p}.input_layernorm.weight"), f(f"{p}.post_attention_layernorm.weight")
    gate = f(f"{p}.mlp.gate.weight")
    k = int(cfg.get("num_experts_per_tok", 8))
    chosen = set()
    for t in np.random.default_rng(0).integers(0, emb.shape[0], n):
        x = emb[t]
        v = (wv @ rms(x, ln1)).reshape(nkv, hd)
        x2 = x + wo @ np.repeat(v, nh // nkv, axis=0).reshape(-1)
        logits = gate @ rms(x2, ln2)
        top = np.argsort(-logits)[:k]
        chosen.update(int(e) for e in top)
        print(f"token {t:6d}: |x| rms {np.sqrt((x * x).mean()):.3g}, router max {logits.max():.3g}, "
              f"finite {bool(np.isfinite(logits).all())}, top-{k} {sorted(int(e) for e in top)}")
    e = gate.shape[0]
    print(f"{len(chosen)} distinct experts of {e} for {n} tokens (uniform: {e * (1 - (1 - k / e) ** n):.0f})")


if __name__ == "__main__":
    main()
