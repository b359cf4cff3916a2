#!/usr/bin/env bash
# GPU decode A/B on the device machine: builds and settings side by side in one session, in
# alternating rounds (a drift of the machine's clocks then touches every side alike).
#   bash bench/gpu-ab.sh MODEL_DIR RUNS ROUNDS SPEC...
# SPEC: LABEL:BINARY[:VAR=VALUE[+VAR=VALUE...]] (values may hold commas) — e.g. pdl:target/device/tarfa-cuda
# nopdl:target/device/tarfa-cuda:TARFA_CUDA_PDL=0. Each side: tarfa bench-decode MODEL_DIR
# --modes gpu --tokens 128 --runs RUNS; its lines are printed with the label in front.
set -uo pipefail
M=${1:?usage: gpu-ab.sh MODEL_DIR RUNS ROUNDS SPEC...}
RUNS=${2:?runs}
ROUNDS=${3:?rounds}
shift 3
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for round in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    IFS=: read -r label bin vars <<< "$spec"
    envs=()
    [ -n "${vars:-}" ] && IFS=+ read -r -a envs <<< "$vars"
    echo "== round $round: $label ($bin ${envs[*]:-})"
    env "${envs[@]}" "$bin" bench-decode "$M" --modes gpu --tokens 128 --runs "$RUNS" 2>&1 | sed "s/^/$label: /"
  done
done
