#!/usr/bin/env bash
# The GPU machine's decode profile and scaling: a generated 10-layer Qwen3-MoE checkpoint (12.7 GB),
# converted, then `tarfa run` all-resident with TARFA_PROFILE=1 at 16, 8 and 4 threads, the
# kernels' matrix-vector rate, and `tarfa bench-decode --modes resident`. From the repo root:
#   bash bench/decode-profile.sh WORKDIR
# Needs target/device/{tarfa,synth_decode_checkpoint,matvec_rate} (stripped release builds).
set -uo pipefail
B=$(pwd)/target/device
W=${1:?workdir}
mkdir -p "$W"
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*"; return $rc; }
nproc; grep -m1 'model name' /proc/cpuinfo; cat /sys/kernel/mm/transparent_hugepage/enabled
[ -d "$W/jnf" ] || { t "$B/synth_decode_checkpoint" "$W/src" 10 8 && t "$B/tarfa" convert "$W/src" -o "$W/jnf" --quiet; } || exit 2
for th in 16 8; do "$B/matvec_rate" 32768 2048 "$th"; "$B/matvec_rate" 768 2048 "$th"; done
for th in 16 8 4; do
  TARFA_PROFILE=1 t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 64 --ignore-eos --experts resident --threads "$th" > /dev/null
done
t "$B/tarfa" bench-decode "$W/jnf" --modes resident --runs 3 --tokens 32
