#!/usr/bin/env python3
"""Write a valid safetensors checkpoint of one MoE layer with N zero-byte experts.

It is the model of issue 13, finding 8 ("1M zero-byte experts"): every expert is a slice of a
fused stack whose rows are empty, so the files are a few hundred bytes while the plan, the writer
and the index hold N experts. Used to measure convert and verify memory and time (BENCHMARKS.md,
"Many experts").

    scripts/gen-many-experts.py DIR N [--per-expert]

--per-expert writes `experts.E.down_proj.weight` tensors (one header entry per expert) instead
of the two fused stacks `experts.gate_up_proj` [N, 0, 8] and `experts.down_proj` [N, 8, 0].
No dependency beyond the standard library.
"""
import json
import os
import struct
import sys


def main() -> None:
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(__doc__)
        return
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    per_expert = "--per-expert" in sys.argv[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    out, n = args[0], int(args[1])
    os.makedirs(out, exist_ok=True)
    p = "model.layers.0.mlp.experts"
    header = {}
    if per_expert:
        for e in range(n):
            header[f"{p}.{e}.down_proj.weight"] = {
                "dtype": "BF16", "shape": [8, 0], "data_offsets": [0, 0]}
    else:
        header[f"{p}.gate_up_proj"] = {
            "dtype": "BF16", "shape": [n, 0, 8], "data_offsets": [0, 0]}
        header[f"{p}.down_proj"] = {
            "dtype": "BF16", "shape": [n, 8, 0], "data_offsets": [0, 0]}
    blob = json.dumps(header, separators=(",", ":")).encode()
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "num_hidden_layers": 1, "num_experts": n, "num_experts_per_tok": 1}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)


if __name__ == "__main__":
    main()
