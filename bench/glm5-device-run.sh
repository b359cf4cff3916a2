#!/usr/bin/env bash
# Issue 27 on the GPU machine: a generated GLM-5.3-Flash-shaped model (`glm5_next` at
# GLM-5.3-Flash's widths, fewer experts: converter/examples/synth_decode_checkpoint.rs with
# SYNTH_FAMILY=glm5_next) decoded with `--device cuda` beside llama.cpp's CUDA build on the same
# weights (its `glm5-next` GGUF, written by bench/llama/safetensors_to_gguf.py), and streamed from
# a cold cache against the storage bound. glm5_next has no whole-model GPU path yet: tarfa runs it
# on the offload path (experts, dense MLPs and matrix products on the GPU; hyper-connections, KDA,
# attention and routing on the CPU), where llama-bench -ngl 99 runs every layer on the GPU. The
# GPU's logits are compared with the CPU's.
#   bash bench/glm5-device-run.sh WORKDIR [LAYERS [EXPERTS]]
# FAMILY=deepseek_v3 (no EXPERTS): a DeepSeek-V3 (MLA) checkpoint at Moonlight-16B-A3B's widths
# instead (64 experts; 10 layers make 11.9 GB), its deepseek2 GGUF beside it; FAMILY=mimo_v2_flash:
# MiMo-V2-Flash's widths with EXPERTS routed experts (default 32; 8 layers make 13.9 GB), its
# mimo2 GGUF beside it. Both run their whole forward pass on the GPU engine.
# Defaults: 8 layers (KDA, KDA, KDA, DSA, ...; layer 0 dense) of 32 experts: 14.63 GB.
# Needs (carried, git-ignored): target/device/{tarfa-cuda,synth_decode_checkpoint},
# bench/llama/llama-cpp-cuda-src.tar.xz (CUDA=1 bash bench/llama/make-llama-src.sh) and
# bench/llama/wheels/ (the gguf wheel). OUT: where logs and logits go (default WORKDIR/out).
# llama.cpp builds in the background during the untimed steps (checkpoint, GGUF, logits); it is
# waited for before anything is timed, as is the file AFTER names when set (another job on the
# machine writes it when done). NO_LLAMA=1: tarfa's side only. Exits 1 when the GPU's
# logits differ from the CPU's or any step fails.
set -uo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: [FAMILY=glm5_next|deepseek_v3|mimo_v2_flash] glm5-device-run.sh WORKDIR [LAYERS [EXPERTS]]}
FAMILY=${FAMILY:-glm5_next}
case $FAMILY in
  glm5_next) export GLM5_EXPERTS=${3:-32} ;;
  mimo_v2_flash) export MIMO_EXPERTS=${3:-32} ;;
  deepseek_v3) [ -z "${3:-}" ] || { echo "error: EXPERTS applies to glm5_next and mimo_v2_flash only" >&2; exit 2; } ;;
  *) echo "error: FAMILY=$FAMILY: glm5_next, deepseek_v3 or mimo_v2_flash" >&2; exit 2 ;;
esac
LAYERS=${2:-8}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
rm -f "$O"/cpu.npy "$O"/gpu.npy "$O"/gpu-stream.npy "$W/llama-build.done"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
# run WHAT ARGS...: a tarfa step whose failure is a failed claim; its summary lines shown.
run() {
  local what=$1 log="$O/$1.log"
  shift
  t "$@" > /dev/null 2> "$log" || claim_failed "$what: exit $?"
  grep -E "^(prompt|compute|gpu|warning|error|TIME)" "$log"
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
df -h "$W" | tail -1
LLAMA=1
[ "${NO_LLAMA:-0}" = 1 ] && LLAMA=0
if [ "$LLAMA" = 1 ]; then
  echo "== llama.cpp CUDA build, in the background (niced)"
  ( s=$(date +%s); CUDA=1 nice -n 19 bash "$H/build-llama-bench.sh" "$W" 16 > "$O/llama-build.log" 2>&1
    echo "$? $(( $(date +%s) - s ))" > "$W/llama-build.done" ) &
fi
echo "== checkpoint: $FAMILY, $LAYERS layers${GLM5_EXPERTS:+ of $GLM5_EXPERTS experts}${MIMO_EXPERTS:+ of $MIMO_EXPERTS experts}"
rm -rf "$W/src" "$W/jnf" "$W/model.gguf"
SYNTH_FAMILY=$FAMILY t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 || exit 2
t "$B/tarfa-cuda" convert "$W/src" -o "$W/jnf" --quiet || exit 2
if [ "$LLAMA" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$H"/wheels/*.whl || exit 2
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} t python3 "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" || exit 2
fi
rm -rf "$W/src"
du -sb "$W/jnf" | awk '{printf "model: %.2f GB (%.2f GiB)\n", $1/1e9, $1/2^30}'
P="--tokens 11,22,33,44,55,66,77,88 -n 24 --ignore-eos"
echo "== CPU, experts resident (reference logits)"
run cpu "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --logits-out "$O/cpu.npy"
echo "== GPU (--device cuda), experts resident"
run gpu "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --logits-out "$O/gpu.npy"
echo "== GPU (--device cuda), experts streamed, no VRAM expert cache"
run gpu-stream "$B/tarfa-cuda" run "$W/jnf" $P --device cuda --vram-gib 0 --logits-out "$O/gpu-stream.npy"
same_bytes "$O/cpu.npy" "$O/gpu.npy" "--device cuda == cpu"
same_bytes "$O/cpu.npy" "$O/gpu-stream.npy" "--device cuda --vram-gib 0 == cpu"
if [ "$LLAMA" = 1 ]; then
  echo "== waiting for the llama.cpp build (nothing is timed while it runs)"
  wait
  read -r rc secs < "$W/llama-build.done"
  echo "llama.cpp build: rc=$rc in $secs s"
  [ "$rc" = 0 ] || { tail -30 "$O/llama-build.log"; claim_failed "llama.cpp build"; LLAMA=0; }
fi
if [ -n "${AFTER:-}" ]; then
  echo "== waiting for $AFTER (nothing is timed while the other job runs)"
  waited=0
  while [ ! -e "$AFTER" ]; do
    sleep 2
    waited=$((waited + 2))
    [ "$waited" -lt 1800 ] || { claim_failed "$AFTER never appeared (30 min)"; break; }
  done
fi
if [ "$LLAMA" = 1 ]; then
  echo "== llama-bench -ngl 99 -p 0 -n 32 -r 3 (at $(date +%T); flash attention at its default)"
  t "$W/llama-build/bin/llama-bench" -m "$W/model.gguf" -ngl 99 -p 0 -n 32 -r 3 -o json > "$O/llama-bench-cuda.json" 2> "$O/llama-bench-cuda.err" \
    || { tail -20 "$O/llama-bench-cuda.err"; claim_failed "llama-bench"; }
  python3 - "$O/llama-bench-cuda.json" <<'PY' || claim_failed "llama-bench's JSON"
import json, sys
rows = json.load(open(sys.argv[1]))
if not rows:
    sys.exit("llama-bench gave no rows")
for r in rows:
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"llama.cpp CUDA {test}: {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} tokens/s over {len(r['samples_ts'])} runs, "
          f"ngl {r.get('n_gpu_layers')}, model {r['model_size']} bytes, gpu {r.get('gpu_info')!r}")
PY
fi
# bench-decode stops with an error when any run's logits differ from the first's.
echo "== tg32-shaped: bench-decode --modes gpu --prompt-tokens 1 -n 32 --runs 3 (at $(date +%T))"
t "$B/tarfa-cuda" bench-decode "$W/jnf" --modes gpu --prompt-tokens 1 -n 32 --runs 3 > "$O/tg32.txt" 2>&1 \
  || claim_failed "bench-decode --modes gpu"
tail -12 "$O/tg32.txt"
echo "== cold cache: bench-decode --modes stream,gpu-stream (against the storage bound)"
t "$B/tarfa-cuda" bench-decode "$W/jnf" --modes stream,gpu-stream --prompt-tokens 2 -n 8 --runs 2 > "$O/stream.txt" 2>&1 \
  || claim_failed "bench-decode --modes stream,gpu-stream"
tail -16 "$O/stream.txt"
end_claims
