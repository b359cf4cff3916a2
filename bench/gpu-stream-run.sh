#!/usr/bin/env bash
# Issue 12 on the GPU machine: experts streamed from NVMe to the GPU, cold cache, against the
# storage bound, on a Qwen3-MoE-shaped model of tens of GiB generated on that disk; the same model
# all resident in VRAM against the HBM bound; GPU-streamed logits compared with the CPU's.
#   bash bench/gpu-stream-run.sh WORKDIR [LAYERS] [TOKENS]
# Needs (carried, git-ignored): target/device/{tarfa-cuda,synth_decode_checkpoint,gpu-test};
# optionally target/device/tarfa-cuda-base (an earlier build, its gpu-stream run side by side).
# OUT: where logs and logits go (default WORKDIR/out).
set -uo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
W=${1:?usage: gpu-stream-run.sh WORKDIR [LAYERS] [TOKENS]}
LAYERS=${2:-20}
TOKENS=${3:-16}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
df -h "$W" | tail -1
nproc; free -g | sed -n 2p
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== GPU test binary (TARFA_REQUIRE_GPU=1)"
  TARFA_REQUIRE_GPU=1 t "$B/gpu-test" --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right" | head -40
fi
echo "== checkpoint: $LAYERS layers"
rm -rf "$W/src" "$W/jnf"
t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 > /dev/null || exit 2
t "$B/tarfa-cuda" convert "$W/src" -o "$W/jnf" --quiet || exit 2
rm -rf "$W/src"
du -sb "$W/jnf" | awk '{printf "model: %.2f GB (%.2f GiB)\n", $1/1e9, $1/2^30}'
P="--tokens 11,22,33,44 -n 8 --ignore-eos"
echo "== logits: CPU streamed (reference) against the GPU streamed (no VRAM cache) and a VRAM cache of 2 GiB"
t "$B/tarfa-cuda" run "$W/jnf" $P --logits-out "$O/s-cpu.npy" > /dev/null
t "$B/tarfa-cuda" run "$W/jnf" $P --device cuda --vram-gib 0 --logits-out "$O/s-gpu0.npy"
t "$B/tarfa-cuda" run "$W/jnf" $P --device cuda --vram-gib 2 --gpu-offload-only --logits-out "$O/s-gpu2.npy"
for f in s-gpu0 s-gpu2; do
  same_bytes "$O/s-cpu.npy" "$O/$f.npy" "$f == cpu"
done
if [ -x "$B/tarfa-cuda-base" ]; then
  echo "== earlier build: gpu-stream"
  t "$B/tarfa-cuda-base" bench-decode "$W/jnf" --modes gpu-stream --prompt-tokens 2 --tokens "$TOKENS" --runs 3 2>&1 | sed 's/^/base: /'
fi
echo "== bench-decode: stream, gpu-stream (cold cache, against the storage bound), gpu (all in VRAM, against the HBM bound)"
t "$B/tarfa-cuda" bench-decode "$W/jnf" --modes stream,gpu-stream --prompt-tokens 2 --tokens "$TOKENS" --runs 3
t "$B/tarfa-cuda" bench-decode "$W/jnf" --modes gpu --tokens 128 --runs 3
end_claims
