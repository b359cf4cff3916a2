#!/usr/bin/env bash
# Issue 12's first measurements on the GPU machine: a generated Qwen3-MoE checkpoint of LAYERS
# layers (10: 12.73 GB) decoded on the CPU (16 threads, experts resident) and with
# `--device cuda` (routed experts and the trunk's matrix products on the H200, experts kept in
# VRAM once used; then streamed from a cold page cache with no VRAM cache), every run's logits
# compared byte for byte with the CPU's. Then the GPU test binary (decode/tests/gpu.rs) with
# TARFA_REQUIRE_GPU=1.
#   bash bench/gpu-device-run.sh WORKDIR [LAYERS]
# Needs (carried, git-ignored): target/device/{tarfa-cuda,synth_decode_checkpoint,gpu-test}:
#   cargo build --release --features cuda && strip -o target/device/tarfa-cuda target/release/tarfa
#   cargo test --release -p tarfa-decode --features cuda --test gpu --no-run   (strip the binary
#   it names to target/device/gpu-test)
set -uo pipefail
source "$(dirname "$0")/claims.sh"
B=$(pwd)/target/device
W=${1:?usage: gpu-device-run.sh WORKDIR [LAYERS]}
LAYERS=${2:-10}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null && echo "[caches dropped]" || echo "[WARNING: caches NOT dropped]"; }
echo "== GPU test binary"
TARFA_REQUIRE_GPU=1 t "$B/gpu-test" --test-threads=1 2>&1 | tail -4 || claim_failed "the GPU tests"
echo "== checkpoint: $LAYERS layers"
rm -rf "$W/src" "$W/jnf"
t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 > /dev/null || exit 2
t "$B/tarfa-cuda" convert "$W/src" -o "$W/jnf" --quiet || exit 2
rm -rf "$W/src"
P="--tokens 11,22,33,44,55,66,77,88 -n 64 --ignore-eos"
echo "== CPU, 16 threads, experts resident"
t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --logits-out "$O/cpu.npy" > /dev/null
echo "== GPU: experts and trunk on the H200, VRAM cache (default size)"
t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --logits-out "$O/gpu.npy" > /dev/null
TARFA_PROFILE=1 t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda > /dev/null
echo "== GPU, experts streamed from a cold page cache, no VRAM expert cache"
drop
t "$B/tarfa-cuda" run "$W/jnf" $P --device cuda --vram-gib 0 --logits-out "$O/gpu-stream.npy" > /dev/null
echo "== GPU, half of the experts on the CPU, trunk on the CPU"
t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --gpu-experts 0.5 --cpu-trunk --logits-out "$O/gpu-mixed.npy" > /dev/null
for f in gpu gpu-stream gpu-mixed; do
  same_bytes "$O/cpu.npy" "$O/$f.npy" "$f == cpu"
done
end_claims
