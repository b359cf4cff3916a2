#!/usr/bin/env bash
# The bundled example of README.md: convert the tiny Qwen3-MoE checkpoint in fixtures/hf (made by
# transformers' save_pretrained) into a JNF model directory, inspect it, and verify every byte
# against the source. Rerunning it shows
# the resume path: every layer is already present and checked, so nothing is rewritten.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
out=target/example/qwen3_moe
cargo build --release -q
./target/release/tarfa convert fixtures/hf/qwen3_moe -o "$out"
./target/release/tarfa inspect "$out"
./target/release/tarfa verify "$out" --source fixtures/hf/qwen3_moe
