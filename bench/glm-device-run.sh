#!/usr/bin/env bash
# Issue 11's decode benchmark of a second family on the GPU machine (16 cores, no Rust): generate
# a GLM-4.5-shaped checkpoint of LAYERS layers (10: 11.7 GB, layer 0 dense) with
# `SYNTH_FAMILY=glm4_moe synth_decode_checkpoint`, convert it with `tarfa convert`, then
# `tarfa bench-decode` (streamed from a cold page cache against the storage bound it measures,
# resident against the memory bound it measures; every run's logits checked identical) and a
# bit-identity check (16 threads AVX-512 resident vs 1 thread scalar pread token by token).
#   bash bench/glm-device-run.sh WORKDIR [LAYERS]
# Needs (carried, git-ignored): target/device/{tarfa,synth_decode_checkpoint}, stripped release
# builds. Writes OUT (default WORKDIR/out): bench-decode.json, a.npy, b.npy.
set -uo pipefail
B=$(pwd)/target/device
W=${1:?usage: glm-device-run.sh WORKDIR [LAYERS]}
LAYERS=${2:-10}
T=${THREADS:-16}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
echo "== machine"; nproc; grep -m1 'model name' /proc/cpuinfo; free -g | head -2; df -h "$W" | tail -1
rm -rf "$W/src" "$W/jnf"
SYNTH_FAMILY=glm4_moe t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" "${SHARDS:-8}" || exit 2
du -sb "$W/src"
t "$B/tarfa" convert "$W/src" -o "$W/jnf" --quiet || exit 2
rm -rf "$W/src"
echo "== tarfa bench-decode"
t "$B/tarfa" bench-decode "$W/jnf" --threads "$T" --runs 2 --tokens 32 --prompt-tokens 8 --json > "$O/bench-decode.json"
cat "$O/bench-decode.json"
TARFA_PROFILE=1 t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 64 --experts resident --threads "$T" > /dev/null
t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 4 --experts resident --logits-out "$O/a.npy" > /dev/null
t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 4 --threads 1 --isa scalar --backend pread --no-batch-prompt --logits-out "$O/b.npy" > /dev/null
cmp "$O/a.npy" "$O/b.npy" && echo "logits: $T threads avx512 resident == 1 thread scalar pread streamed token by token, byte for byte"
echo "== done"
