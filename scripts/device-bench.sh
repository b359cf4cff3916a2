#!/usr/bin/env bash
# The GPU machine's figures in BENCHMARKS.md: convert (at 1, 2, 4 and 8 jobs), verify and stream
# a generated checkpoint with the release binaries alone (the GPU machine has no Rust toolchain).
# Build here, strip, and run from the repository root there:
#   cargo build --release -p tarfa --bin tarfa && cargo build --release -p tarfa-converter --example synth_checkpoint
#   strip -o target/device/tarfa target/release/tarfa
#   strip -o target/device/synth_checkpoint target/release/examples/synth_checkpoint
#   bash scripts/device-bench.sh WORKDIR GIB > log
# Every timed step starts from a cold page cache (needs root; a refusal is printed).
set -uo pipefail
B=$(pwd)/target/device
W=${1:?workdir}; GIB=${2:-8}
mkdir -p "$W"
drop() { sync; if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo "[caches dropped]"; else echo "[WARNING: caches NOT dropped: warm-cache figure]"; fi; }
t() { local s; s=$(date +%s%N); "$@"; local rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*"; }
echo "== machine"; nproc; uname -r; grep -m1 'model name' /proc/cpuinfo; free -g | head -2; df -h "$W" | tail -1
t "$B/synth_checkpoint" "$W/src" "$GIB" 8
for run in 1 2; do
  drop; t sh -c "cat $W/src/*.safetensors > /dev/null"
  for j in 1 2 4 8; do
    drop; t "$B/tarfa" convert "$W/src" -o "$W/out$j" --quiet -j "$j"
    if [ "$j" != 4 ] || [ "$run" = 1 ]; then rm -rf "$W/out$j"; fi
  done
  drop; t "$B/tarfa" convert "$W/src" -o "$W/outb" --quiet --buffered; rm -rf "$W/outb"
  drop; t sh -c "cp -r $W/src $W/cp && sync"; rm -rf "$W/cp"
done
drop; t sh -c "cat $W/src/*.safetensors $W/out4/*.jnf > /dev/null"
drop; t "$B/tarfa" verify "$W/out4" --source "$W/src" --quiet
drop; t "$B/tarfa" verify "$W/out4" --quiet
drop; t sh -c "cat $W/out4/*.jnf > /dev/null"
command -v fio || echo "fio: not installed here"
t "$B/tarfa" bench-io "$W/out4" --qd 1,32,128 --runs 3 --gib 2 --quiet
