#!/usr/bin/env bash
# Issue 12 on the GPU machine: the whole forward pass on the H200 (`tarfa run --device cuda`, a
# qwen3_moe model that fits in VRAM) against the CPU (logits compared byte for byte), against
# the offload path (layers on the CPU, experts and products on the GPU), and with LLAMA=1 against
# llama.cpp's CUDA build on the same weights (a BF16 GGUF written with the gguf package).
# SYNTH_FAMILY=glm4_moe: a GLM-4.5-shaped model instead (synth_decode_checkpoint reads it).
# Exits 1 when any logits differ from the CPU's.
#   [LLAMA=1 [VIA_GGUF=1]] [TEST_TILE=S,B] [AB="SPEC..."] [TG32="LABEL:BINARY[:VAR=V]..."] bash bench/gpu-whole-run.sh WORKDIR [LAYERS]
# QUANT=TYPE (with LLAMA=1 VIA_GGUF=1): the BF16 GGUF quantised by llama.cpp's llama-quantize to
# TYPE (e.g. Q4_K_M) before anything reads it; both engines then run that GGUF.
# VIA_GGUF=1 (with LLAMA=1): tarfa's JNF is converted from the GGUF written for llama.cpp, so a
# model of tens of GiB fits the device's disk twice (safetensors, then GGUF, then JNF from it;
# e.g. 20 layers: 25.2 GB each, 64 GB free): `LLAMA=1 VIA_GGUF=1 bash bench/gpu-whole-run.sh /tmp/w 20`,
# then `bash bench/gpu-llama-rounds.sh /tmp/w 2 new:target/device/tarfa-cuda`.
# With LLAMA=1 llama.cpp builds in the background (niced) while the unmeasured steps run (tests,
# checkpoint, logits), and is waited for before anything is timed. AB: sides for bench/gpu-ab.sh
# (AB_RUNS runs, AB_ROUNDS rounds; default 5, 2), run after the logits, while llama.cpp may still
# be building (niced; the sides alternate rounds).
# TEST_TILE: the GPU tests and a logits comparison again with TARFA_CUDA_TILE=S,B.
# TG32: sides measured as llama-bench's tg32 is (one prompt token, 32 greedy steps, 21 runs).
# Needs (carried, git-ignored): target/device/{tarfa-cuda,synth_decode_checkpoint,gpu-test};
# with LLAMA=1 also bench/llama/llama-cpp-cuda-src.tar.xz (CUDA=1 bash bench/llama/make-llama-src.sh)
# and bench/llama/wheels/ (the gguf wheel). OUT: where logs and logits go (default WORKDIR/out).
set -uo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: gpu-whole-run.sh WORKDIR [LAYERS]}
LAYERS=${2:-10}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader
if [ "${VIA_GGUF:-0}" = 1 ] && [ "${LLAMA:-0}" != 1 ]; then
  echo "VIA_GGUF=1 needs LLAMA=1 (the GGUF is written for llama.cpp)" >&2; exit 2
fi
if [ -n "${QUANT:-}" ] && [ "${VIA_GGUF:-0}" != 1 ]; then
  echo "QUANT=$QUANT needs LLAMA=1 VIA_GGUF=1 (tarfa converts llama-quantize's GGUF)" >&2; exit 2
fi
if [ "${LLAMA:-0}" = 1 ]; then
  echo "== llama.cpp CUDA build, in the background"
  ( s=$(date +%s); CUDA=1 nice -n 19 bash "$H/build-llama-bench.sh" "$W" 16 > "$O/llama-build.log" 2>&1
    echo "$? $(( $(date +%s) - s ))" > "$W/llama-build.done" ) &
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== GPU test binary (TARFA_REQUIRE_GPU=1)"
  TARFA_REQUIRE_GPU=1 t "$B/gpu-test" --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right" | head -40
  if [ -n "${TEST_TILE:-}" ]; then
    echo "== GPU test binary, tiled products' ring TARFA_CUDA_TILE=$TEST_TILE"
    TARFA_CUDA_TILE=$TEST_TILE TARFA_REQUIRE_GPU=1 t "$B/gpu-test" --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right" | head -40
  fi
fi
echo "== checkpoint: $LAYERS layers"
rm -rf "$W/src" "$W/jnf"
t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 > /dev/null || exit 2
[ "${VIA_GGUF:-0}" = 1 ] || t "$B/tarfa-cuda" convert "$W/src" -o "$W/jnf" --quiet || exit 2
if [ "${LLAMA:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$H"/wheels/*.whl || exit 2
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  t python3 "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" || exit 2
fi
rm -rf "$W/src"
if [ -n "${QUANT:-}" ]; then
  # The BF16 GGUF quantised by llama.cpp's own llama-quantize (QUANT=Q4_K_M, Q8_0, …): the model
  # people run, in llama.cpp's mix of types; tarfa converts that file, so both read one GGUF.
  echo "== waiting for the llama.cpp build (llama-quantize)"
  wait
  read -r rc secs < "$W/llama-build.done"
  [ "$rc" = 0 ] || { tail -30 "$O/llama-build.log"; exit 2; }
  t "$W/llama-build/bin/llama-quantize" "$W/model.gguf" "$W/model-q.gguf" "$QUANT" 16 > "$O/llama-quantize.log" 2>&1 || { tail -20 "$O/llama-quantize.log"; exit 2; }
  grep -E "model size|quant size|type +[a-z0-9_]+: +[0-9]+ tensors" "$O/llama-quantize.log" | head -12
  mv "$W/model-q.gguf" "$W/model.gguf"
fi
if [ "${VIA_GGUF:-0}" = 1 ]; then
  # The JNF converted from the GGUF llama.cpp reads (the same weights, the same logit bits as
  # from the safetensors): the disk holds two copies of the model at once, not three.
  t "$B/tarfa-cuda" convert "$W/model.gguf" -o "$W/jnf" --quiet || exit 2
fi
du -sb "$W/jnf" | awk '{printf "model: %.2f GB (%.2f GiB)\n", $1/1e9, $1/2^30}'
P="--tokens 11,22,33,44,55,66,77,88 -n 64 --ignore-eos"
echo "== CPU, experts resident (reference logits)"
t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --logits-out "$O/cpu.npy" > /dev/null
echo "== GPU, whole forward pass, CUDA graphs (twice)"
t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --logits-out "$O/whole.npy" > /dev/null
t "$B/tarfa-cuda" run "$W/jnf" $P --device cuda --json > "$O/whole.json"
python3 -c "import json,sys; d=json.load(open('$O/whole.json')); print('decode', d['decode'], 'gpu', d['gpu'])"
echo "== GPU, whole forward pass, kernels launched one by one"
t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --no-cuda-graphs --logits-out "$O/whole-nograph.npy" > /dev/null
echo "== GPU, offload path (layers on the CPU, experts and products on the GPU)"
t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --gpu-offload-only --logits-out "$O/offload.npy" > /dev/null
echo "== GPU, whole forward pass, every norm its own launch (TARFA_CUDA_NORM_FUSE=0)"
TARFA_CUDA_NORM_FUSE=0 t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --logits-out "$O/whole-unfused.npy" > /dev/null
LOGITS="whole whole-nograph whole-unfused offload"
if [ -n "${TEST_TILE:-}" ]; then
  echo "== GPU, whole forward pass, TARFA_CUDA_TILE=$TEST_TILE"
  TARFA_CUDA_TILE=$TEST_TILE t "$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --logits-out "$O/whole-tile.npy" > /dev/null
  LOGITS="$LOGITS whole-tile"
fi
for f in $LOGITS; do
  same_bytes "$O/cpu.npy" "$O/$f.npy" "$f == cpu"
done
if [ -n "${AB:-}" ]; then
  # While llama.cpp may still be building (niced: the sides alternate, so any disturbance
  # touches them alike); llama-bench and TG32 wait for a quiet machine.
  echo "== A/B: $AB"
  # shellcheck disable=SC2086
  bash "$R/bench/gpu-ab.sh" "$W/jnf" "${AB_RUNS:-5}" "${AB_ROUNDS:-2}" $AB
fi
if [ "${LLAMA:-0}" = 1 ]; then
  echo "== waiting for the llama.cpp build"
  wait
  read -r rc secs < "$W/llama-build.done"
  echo "llama.cpp build: rc=$rc in $secs s (in the background)"
  [ "$rc" = 0 ] || { tail -30 "$O/llama-build.log"; exit 2; }
  tail -2 "$O/llama-build.log"
fi
for spec in ${TG32:-}; do
  IFS=: read -r label bin vars <<< "$spec"
  envs=()
  [ -n "${vars:-}" ] && IFS=+ read -r -a envs <<< "$vars"
  echo "== tg32-shaped: $label ($bin ${envs[*]:-}): bench-decode --prompt-tokens 1 --tokens 32 --runs 21"
  env "${envs[@]}" "$bin" bench-decode "$W/jnf" --modes gpu --prompt-tokens 1 --tokens 32 --runs 21 2>&1 | sed "s/^/$label: /"
done
if [ "${LLAMA:-0}" = 1 ]; then
  echo "== llama-bench -ngl 99 -p 8 -n 32 (flash attention: llama-bench's default, auto)"
  t "$W/llama-build/bin/llama-bench" -m "$W/model.gguf" -ngl 99 -p 8 -n 32 -o json -oe md > "$O/llama-bench-cuda.json"
  python3 - "$O/llama-bench-cuda.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"llama.cpp CUDA {test}: {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} tokens/s over {len(r['samples_ts'])} runs, "
          f"ngl {r.get('n_gpu_layers')}, model {r['model_size']} bytes, gpu {r.get('gpu_info')!r}")
PY
fi
# A mismatch fails the run (after the measurements, so their logs still come back).
end_claims
