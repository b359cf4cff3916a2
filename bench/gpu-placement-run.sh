#!/usr/bin/env bash
# Issue 23 on the GPU machine: a model that does not fit in the VRAM it is given. tarfa's whole
# forward pass on the GPU with the routed experts of its first MoE layers on the CPU
# (`--vram-gib VRAM`: as few layers as that needs; the number it chose printed) against
# llama.cpp's CUDA build with `--n-cpu-moe` set to the same number of layers (the same
# placement: the first N layers' experts on the CPU), on the same weights (a BF16 GGUF written
# with the gguf package), each side's peak VRAM sampled by nvidia-smi. Also tarfa's offload path
# (layers on the CPU) under the same --vram-gib, and the experts of 0, 1, half and all layers on
# the CPU checked for logits `cmp`-equal to the CPU's, each run's placement read back from its
# JSON. Exits 1 when any logits differ or a placement is not the one asked.
#   [NOGRAPH=1] [TG32=1] bash bench/gpu-placement-run.sh WORKDIR [LAYERS] [VRAM_GIB] [ROUNDS]
# NOGRAPH=1: each round also times tarfa with --no-cuda-graphs (its logits checked too).
# TG32=1: also the whole model in VRAM, tarfa's bench-decode tg32 shape and llama-bench -ngl 99.
# Needs (carried, git-ignored): target/device/{tarfa-cuda,synth_decode_checkpoint,gpu-test},
# bench/llama/llama-cpp-cuda-src.tar.xz (CUDA=1 bash bench/llama/make-llama-src.sh) and
# bench/llama/wheels/ (the gguf wheel). OUT: where logs and logits go (default WORKDIR/out).
set -uo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: gpu-placement-run.sh WORKDIR [LAYERS] [VRAM_GIB] [ROUNDS]}
LAYERS=${2:-10}
VRAM=${3:-4}
ROUNDS=${4:-2}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
# Run "$@" while nvidia-smi samples the VRAM in use every 100 ms; the peak (MiB) in $O/peak.txt.
peak() {
  local f="$O/vram.samples" rc p
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$f" &
  p=$!
  "$@"; rc=$?
  kill "$p"; wait "$p" 2> /dev/null
  echo "peak VRAM $(sort -n "$f" | tail -1) MiB" > "$O/peak.txt"
  return $rc
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== llama.cpp CUDA build, in the background (niced; waited for before anything is timed)"
( s=$(date +%s); CUDA=1 nice -n 19 bash "$H/build-llama-bench.sh" "$W" 16 > "$O/llama-build.log" 2>&1
  echo "$? $(( $(date +%s) - s ))" > "$W/llama-build.done" ) &
echo "== GPU test binary (TARFA_REQUIRE_GPU=1)"
TARFA_REQUIRE_GPU=1 t "$B/gpu-test" --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right" | head -40
echo "== checkpoint: $LAYERS layers, its JNF and its BF16 GGUF"
rm -rf "$W/src" "$W/jnf"
t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 > /dev/null || exit 2
t "$B/tarfa-cuda" convert "$W/src" -o "$W/jnf" --quiet || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$H"/wheels/*.whl || exit 2
PYTHONPATH=/tmp/site t python3 "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" || exit 2
rm -rf "$W/src"
du -sb "$W/jnf" | awk '{printf "model: %.2f GB (%.2f GiB)\n", $1/1e9, $1/2^30}'
P="--tokens 11,22,33,44,55,66,77,88 -n 64 --ignore-eos"
RUN=("$B/tarfa-cuda" run "$W/jnf" $P --experts resident)
echo "== logits (untimed): CPU, then --device cuda with the experts of 0, 1, half and all MoE layers on the CPU"
t "${RUN[@]}" --logits-out "$O/cpu.npy" > /dev/null
for n in 0 1 $((LAYERS / 2)) "$LAYERS"; do
  "${RUN[@]}" --device cuda --n-cpu-moe "$n" --logits-out "$O/ncmoe-$n.npy" --json > "$O/ncmoe-$n.json" 2> "$O/ncmoe-$n.log"
  # The placement read back: the whole pass on the GPU, the experts of layers 0..n on the CPU.
  got=$(python3 -c "import json; g=json.load(open('$O/ncmoe-$n.json'))['gpu']; print(g['whole_model'], g['cpu_moe_layers'])" 2> /dev/null)
  [ "$got" = "True $n" ] || claim_failed "--n-cpu-moe $n ran as ${got:-nothing}"
  same_bytes "$O/cpu.npy" "$O/ncmoe-$n.npy" "--n-cpu-moe $n == cpu (placement read back: $got)" || tail -3 "$O/ncmoe-$n.log"
done
"${RUN[@]}" --device cuda --vram-gib "$VRAM" --logits-out "$O/placed.npy" --json > "$O/placed.json" 2> "$O/placed.log"
same_bytes "$O/cpu.npy" "$O/placed.npy" "--vram-gib $VRAM == cpu" || tail -3 "$O/placed.log"
if [ "${NOGRAPH:-0}" = 1 ]; then
  "${RUN[@]}" --device cuda --vram-gib "$VRAM" --no-cuda-graphs --logits-out "$O/placed-nograph.npy" > /dev/null 2> "$O/placed-nograph.log"
  same_bytes "$O/cpu.npy" "$O/placed-nograph.npy" "--vram-gib $VRAM --no-cuda-graphs == cpu" || tail -3 "$O/placed-nograph.log"
fi
N=$(python3 -c "import json; print(json.load(open('$O/placed.json'))['gpu']['cpu_moe_layers'])")
echo "--vram-gib $VRAM: tarfa put the experts of the first $N MoE layers on the CPU"
echo "== waiting for the llama.cpp build"
wait
read -r rc secs < "$W/llama-build.done"
echo "llama.cpp build: rc=$rc in $secs s"
[ "$rc" = 0 ] || { tail -30 "$O/llama-build.log"; exit 2; }
rate() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('decode', d['decode']['tokens_per_s'], 'tokens/s; prompt', d['prompt']['tokens_per_s'], 'tokens/s; gpu', {k: d['gpu'][k] for k in ('cpu_moe_layers','steps','graph_steps')})" "$1"; }
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: tarfa --vram-gib $VRAM (experts of $N MoE layers on the CPU), -n 64"
  peak "${RUN[@]}" --device cuda --vram-gib "$VRAM" --json > "$O/tarfa-$r.json" 2> /dev/null
  rate "$O/tarfa-$r.json"; cat "$O/peak.txt"
  if [ "${NOGRAPH:-0}" = 1 ]; then
    echo "== round $r: tarfa --vram-gib $VRAM --no-cuda-graphs"
    peak "${RUN[@]}" --device cuda --vram-gib "$VRAM" --no-cuda-graphs --json > "$O/tarfa-nograph-$r.json" 2> /dev/null
    rate "$O/tarfa-nograph-$r.json"; cat "$O/peak.txt"
  fi
  echo "== round $r: llama.cpp llama-bench -ngl 99 --n-cpu-moe $N -p 8 -n 32"
  peak "$W/llama-build/bin/llama-bench" -m "$W/model.gguf" -ngl 99 -ncmoe "$N" -p 8 -n 32 -o json > "$O/llama-$r.json" 2> /dev/null
  python3 - "$O/llama-$r.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"llama.cpp CUDA --n-cpu-moe {r.get('n_cpu_moe')} {test}: {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} tokens/s over {len(r['samples_ts'])} runs, threads {r.get('n_threads')}")
PY
  cat "$O/peak.txt"
done
if [ "${TG32:-0}" = 1 ]; then
  echo "== the whole model in VRAM: tarfa bench-decode tg32-shaped, llama-bench -ngl 99 tg32"
  "$B/tarfa-cuda" bench-decode "$W/jnf" --modes gpu --prompt-tokens 1 --tokens 32 --runs 21 2>&1 | grep -E "\| gpu \||rror"
  "$W/llama-build/bin/llama-bench" -m "$W/model.gguf" -ngl 99 -p 8 -n 32 -o json > "$O/llama-whole.json" 2> /dev/null
  python3 -c "import json,sys; [print(f\"llama.cpp CUDA -ngl 99 {'pp' if r['n_prompt'] else 'tg'}{r['n_prompt'] or r['n_gen']}: {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f}\") for r in json.load(open('$O/llama-whole.json'))]"
fi
echo "== tarfa's offload path under the same --vram-gib (layers on the CPU, experts and products on the GPU)"
peak "${RUN[@]}" --device cuda --gpu-offload-only --vram-gib "$VRAM" --json > "$O/offload.json" 2> /dev/null
python3 -c "import json; d=json.load(open('$O/offload.json')); print('offload path: decode', d['decode']['tokens_per_s'], 'tokens/s')"
cat "$O/peak.txt"
end_claims
