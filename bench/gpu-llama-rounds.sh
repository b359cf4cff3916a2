#!/usr/bin/env bash
# tarfa against llama.cpp's CUDA build at llama-bench's own workload, in alternating rounds of one
# session (issue 12): llama-bench tg32 (`-p 0 -n 32 -r 10`, flash attention at its default, auto)
# and each tarfa side shaped as it is (`bench-decode --modes gpu --prompt-tokens 1 --tokens 32
# --runs 21`); the order of the sides (llama.cpp among them) turns by one each round, so no side
# always runs first or last. Each binary's sha256 is printed first (the logs name the build).
# Run after `LLAMA=1 bash bench/gpu-whole-run.sh WORKDIR`, which leaves WORKDIR/{jnf,model.gguf}
# and llama-bench in WORKDIR/llama-build.
#   bash bench/gpu-llama-rounds.sh WORKDIR ROUNDS LABEL:BINARY[:VAR=V[+VAR=V...]]...
# Prints one line per measurement: `round R llama tg32 T ± S` and `round R LABEL tg32 T`.
# NO_LLAMA=1: tarfa's sides only (WORKDIR/jnf is all it needs), e.g. to compare builds or settings.
set -uo pipefail
W=${1:?usage: gpu-llama-rounds.sh WORKDIR ROUNDS SPEC...}
ROUNDS=${2:?rounds}
shift 2
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
O=${OUT:-$W/out}
mkdir -p "$O"
sides=(llama "$@")
[ "${NO_LLAMA:-0}" = 1 ] && sides=("$@")
for spec in "$@"; do
  IFS=: read -r label bin _ <<< "$spec"
  echo "$label: $(sha256sum "$bin" | cut -c1-16) $bin"
done
llama() {
  "$W/llama-build/bin/llama-bench" -m "$W/model.gguf" -ngl 99 -p 0 -n 32 -r 10 -o json \
    > "$O/llama-tg32-$1.json" 2> "$O/llama-tg32-$1.err" || { tail -5 "$O/llama-tg32-$1.err"; exit 2; }
  python3 - "$O/llama-tg32-$1.json" "$1" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))[0]
print(f"round {sys.argv[2]} llama tg32 {d['avg_ts']:.2f} ± {d['stddev_ts']:.2f} ({len(d['samples_ts'])} runs)")
PY
}
for r in $(seq 1 "$ROUNDS"); do
  n=${#sides[@]}
  for i in $(seq 0 $((n - 1))); do
    spec=${sides[$(( (i + r - 1) % n ))]}
    if [ "$spec" = llama ]; then
      llama "$r"
      continue
    fi
    IFS=: read -r label bin vars <<< "$spec"
    envs=()
    [ -n "${vars:-}" ] && IFS=+ read -r -a envs <<< "$vars"
    env "${envs[@]}" "$bin" bench-decode "$W/jnf" --modes gpu --prompt-tokens 1 --tokens 32 --runs 21 \
      > "$O/tarfa-tg32-$label-$r.txt" 2>&1
    t=$(awk -F'|' '$2 ~ /gpu/ {gsub(/ /, "", $4); print $4}' "$O/tarfa-tg32-$label-$r.txt")
    same=$(grep -c "bit-identical across all" "$O/tarfa-tg32-$label-$r.txt")
    echo "round $r $label tg32 ${t:-?} (logits bit-identical across runs: $same)"
  done
done
