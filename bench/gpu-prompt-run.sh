#!/usr/bin/env bash
# Issue 24 on the GPU machine: a 512-token prompt on the GPU (pp512) and tg32, tarfa beside
# llama.cpp CUDA's `llama-bench -ngl 99 -p 512 -n 32` on the same weights, for a Qwen3-MoE-shaped
# and a GLM-4.5-shaped checkpoint of LAYERS layers (10: 12.7 and 11.7 GB) from
# synth_decode_checkpoint, each written as a BF16 GGUF (bench/llama/safetensors_to_gguf.py) and
# converted with `tarfa convert`. Prompts as matrices (this build's default) and stepped token by
# token (TARFA_CUDA_PROMPT=0: the path before) in the same call, as `tarfa bench-decode --modes gpu
# --prompt-tokens 512 -n 32 --runs 3 --peer llama-bench.json` prints them.
# Exactness first, on each model: the greedy run of a 600-token prompt (two passes) (8 steps) on the GPU with the
# prompt as one matrix pass, in chunks of 7 (-b 7) and 64, token by token (TARFA_CUDA_PROMPT=0), and
# on the CPU (16 threads, experts resident): every logits file the same bytes (claims.sh).
#   bash bench/gpu-prompt-run.sh WORKDIR [LAYERS]
# Needs (carried, git-ignored): target/device/{tarfa-cuda,synth_decode_checkpoint} (a `--features
# cuda` release build and the generator), bench/llama/llama-cpp-cuda-src.tar.xz, bench/llama/wheels/.
#   carry: ["target/device", "bench/llama/llama-cpp-cuda-src.tar.xz", "bench/llama/wheels"]
#   command: set -o pipefail; OUT=$OUT bash bench/gpu-prompt-run.sh /tmp/gp 2>&1 | tee $OUT/run.log
# llama-bench is built (CUDA, sm_90) in the background while the first checkpoint is made, and
# waited for before anything is timed. OUT: logs, JSON and logits (default WORKDIR/out).
# FAMILIES (default "qwen3_moe glm4_moe"); OTHER: another build whose prompts (as matrices) are
# timed beside this one's (an A/B of a kernel change); MODES (default "matrices steps"; also
# "noquads": TARFA_CUDA_ATTN_QUADS=0); ROUNDS (default 1): the modes timed in turn that often; QUICK=1:
# the exactness check on one pass and chunks of 7 only. Disk: three copies of one checkpoint at a time.
set -uo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: gpu-prompt-run.sh WORKDIR [LAYERS]}
LAYERS=${2:-10}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc=0; s=$(date +%s%N); "$@" || rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
for f in "$B/tarfa-cuda" "$B/synth_decode_checkpoint" "$H/llama-cpp-cuda-src.tar.xz"; do
  [ -e "$f" ] || { echo "missing: $f (carry it; see this script's header)" >&2; exit 2; }
done
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
BUILD_PID=
trap '[ -z "$BUILD_PID" ] || kill "$BUILD_PID" 2> /dev/null || true' EXIT
# A warm machine keeps WORKDIR: a build that succeeded there is used again. NO_PEER=1: no
# llama.cpp (an A/B of tarfa builds alone, when device time is short).
if [ "${NO_PEER:-0}" != 1 ] && ! { [ -e "$W/lb.done" ] && [ "$(cut -d' ' -f1 "$W/lb.done")" = 0 ]; }; then
  rm -f "$W/lb.done"
  (
    s=$(date +%s)
    rc=0
    CUDA=1 nice -n 19 bash "$H/build-llama-bench.sh" "$W/lb" 16 > "$O/llama-build.log" 2>&1 || rc=$?
    echo "$rc $(( $(date +%s) - s ))" > "$W/lb.done"
  ) &
  BUILD_PID=$!
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$H"/wheels/*.whl || exit 2
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
LB=$W/lb/llama-build/bin/llama-bench
for fam in ${FAMILIES:-qwen3_moe glm4_moe}; do
  echo "== $fam: $LAYERS layers"
  rm -rf "$W/src" "$W/jnf" "$W/model.gguf"
  SYNTH_FAMILY=$fam t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 > /dev/null || exit 2
  [ "${NO_PEER:-0}" = 1 ] || t python3 "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" > /dev/null || exit 2
  t "$B/tarfa-cuda" convert "$W/src" -o "$W/jnf" --quiet || exit 2
  rm -rf "$W/src"
  vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['architecture']['config']['vocab_size'])" "$W/jnf/manifest.json")
  toks=$(python3 -c "import sys; v=int(sys.argv[1]); print(','.join(str((i * 7919 + 13) % v) for i in range(600)))" "$vocab")
  run() { t "$B/tarfa-cuda" run "$W/jnf" --tokens "$toks" -n 8 --ignore-eos --experts resident "$@" > /dev/null; }
  echo "-- exactness: a 600-token prompt (two passes), 8 greedy steps"
  run --device cuda --logits-out "$O/$fam-gpu.npy"
  run --device cuda -b 7 --logits-out "$O/$fam-gpu-b7.npy"
  [ "${QUICK:-0}" = 1 ] || run --device cuda -b 64 --logits-out "$O/$fam-gpu-b64.npy"
  [ "${QUICK:-0}" = 1 ] || TARFA_CUDA_PROMPT=0 run --device cuda --logits-out "$O/$fam-gpu-steps.npy"
  run --device cpu --threads 16 --logits-out "$O/$fam-cpu.npy"
  same_bytes "$O/$fam-gpu.npy" "$O/$fam-cpu.npy" "$fam: GPU prompt as one pass = the CPU's"
  same_bytes "$O/$fam-gpu-b7.npy" "$O/$fam-cpu.npy" "$fam: GPU prompt in chunks of 7 = the CPU's"
  if [ "${QUICK:-0}" != 1 ]; then
    same_bytes "$O/$fam-gpu-b64.npy" "$O/$fam-cpu.npy" "$fam: GPU prompt in chunks of 64 = the CPU's"
    same_bytes "$O/$fam-gpu-steps.npy" "$O/$fam-cpu.npy" "$fam: GPU prompt token by token = the CPU's"
  fi
  peer=()
  if [ "${NO_PEER:-0}" = 1 ]; then
    :
  elif [ -n "$BUILD_PID" ]; then
    echo "== waiting for the llama-bench build"
    wait "$BUILD_PID"
  fi
  BUILD_PID=
  if [ "${NO_PEER:-0}" != 1 ]; then
    read -r brc bs < "$W/lb.done"
    echo "llama-bench build: rc=$brc in $bs s (in the background)"
    [ "$brc" = 0 ] || { tail -30 "$O/llama-build.log"; exit 1; }
    echo "-- llama-bench -ngl 99 -p 512 -n 32"
    cat "$W/model.gguf" > /dev/null
    t "$LB" -m "$W/model.gguf" -ngl 99 -p 512 -n 32 -r 3 -o json > "$O/$fam-llama-bench.json" 2> "$O/$fam-llama-bench.log" \
      || { tail -20 "$O/$fam-llama-bench.log"; claim_failed "llama-bench ran"; }
    peer=(--peer "$O/$fam-llama-bench.json")
  fi
  for round in $(seq 1 "${ROUNDS:-1}"); do
    for mode in ${MODES:-matrices steps} ${OTHER:+other}; do
      echo "-- tarfa bench-decode, prompt $mode (round $round)"
      bin=$B/tarfa-cuda
      sw=()
      case $mode in
        other) bin=$OTHER ;;
        steps) sw=(TARFA_CUDA_PROMPT=0) ;;
        noquads) sw=(TARFA_CUDA_ATTN_QUADS=0) ;;
      esac
      env "${sw[@]}" "$bin" bench-decode "$W/jnf" --modes gpu \
        --prompt-tokens 512 -n 32 --runs 3 "${peer[@]}" 2>&1 | tee "$O/$fam-bench-$mode-$round.txt" \
        || claim_failed "bench-decode ($fam, $mode)"
    done
  done
done
end_claims
