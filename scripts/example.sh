#!/usr/bin/env bash
# The bundled example of README.md: convert the tiny Qwen3-MoE checkpoint in fixtures/hf (made by
# transformers' save_pretrained) into a JNF model directory, inspect it, verify every byte against
# the source, then run it: greedy text from a prompt, experts streamed from disk and checked as
# they land, the same tokens transformers generates (fixtures/reference/qwen3_moe). Rerunning it
# shows the resume path: every layer is already present and checked, so nothing is rewritten.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
out=target/example/qwen3_moe
cargo build --release -q
./target/release/tarfa convert fixtures/hf/qwen3_moe -o "$out"
./target/release/tarfa inspect "$out"
./target/release/tarfa verify "$out" --source fixtures/hf/qwen3_moe
./target/release/tarfa run "$out" --prompt "The quick brown fox" -n 32
