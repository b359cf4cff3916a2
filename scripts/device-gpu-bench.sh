#!/usr/bin/env bash
# The GPU machine's "Expert streaming to VRAM" figures in BENCHMARKS.md: the runtime's GPU test
# (every expert byte-identical in VRAM), then bench-io with and without --to-gpu on a generated
# checkpoint, with the release binaries alone (the GPU machine has no Rust toolchain). Build here:
#   cargo build --release -p tarfa --features cuda --bin tarfa
#   cargo build --release -p tarfa-converter --example synth_checkpoint
#   cargo test --release -p tarfa-runtime --features cuda --test gpu --no-run   # prints its path
#   strip -o target/device/tarfa target/release/tarfa
#   strip -o target/device/synth_checkpoint target/release/examples/synth_checkpoint
#   strip -o target/device/gpu_test target/release/deps/gpu-HASH
#   bash scripts/device-gpu-bench.sh WORKDIR GIB > log
# Every bench-io run starts from a cold page cache (needs root; a refusal is printed).
set -uo pipefail
B=$(pwd)/target/device
W=${1:?workdir}; GIB=${2:-6}
mkdir -p "$W"
t() { local s; s=$(date +%s%N); "$@"; local rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*"; }
echo "== machine"; nproc; uname -r; grep -m1 'model name' /proc/cpuinfo; free -g | head -2; df -h "$W" | tail -1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
command -v fio || echo "fio: not installed here"
echo "== GPU test (runtime/tests/gpu.rs)"
t timeout 120 "$B/gpu_test" --nocapture
echo "== data"
t "$B/synth_checkpoint" "$W/src" "$GIB" 8
t "$B/tarfa" convert "$W/src" -o "$W/out" --quiet
rm -rf "$W/src"
echo "== bench-io"
t timeout 200 "$B/tarfa" bench-io "$W/out" --qd 32,128 --runs 3 --gib 2
echo "== bench-io --to-gpu"
t timeout 330 "$B/tarfa" bench-io "$W/out" --qd 32,128 --runs 3 --gib 2 --to-gpu
