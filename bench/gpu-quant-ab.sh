#!/usr/bin/env bash
# A/B of tarfa builds on a llama.cpp-quantised model, on the GPU machine, without llama.cpp's CUDA
# build: llama-quantize alone is built CPU-only (about a minute on 16 cores) from
# bench/llama/llama-cpp-cuda-src.tar.xz, the generated Qwen3-MoE-shaped checkpoint is written as a
# BF16 GGUF and quantised to TYPE (e.g. Q4_K_M), tarfa converts that GGUF, and each side's whole
# GPU pass must give the CPU's logits (cmp) before the sides alternate ROUNDS rounds of the
# tg32 shape (bench-decode --prompt-tokens 1 --tokens 32 --runs 21). Exits 1 when logits differ.
#   bash bench/gpu-quant-ab.sh WORKDIR LAYERS TYPE ROUNDS LABEL:BINARY...
# Needs (carried): target/device/{synth_decode_checkpoint,tarfa-cuda…}, bench/llama/wheels/,
# bench/llama/llama-cpp-cuda-src.tar.xz. OUT: where logs and logits go (default WORKDIR/out).
set -uo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: gpu-quant-ab.sh WORKDIR LAYERS TYPE ROUNDS LABEL:BINARY...}
LAYERS=${2:?layers}
TYPE=${3:?quant type}
ROUNDS=${4:?rounds}
shift 4
[ $# -ge 1 ] || { echo "no sides given" >&2; exit 2; }
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== llama-quantize (CPU-only build)"
rm -rf "$W/llama.cpp" "$W/lq"
tar xJf "$H/llama-cpp-cuda-src.tar.xz" -C "$W" || exit 2
t cmake -S "$W/llama.cpp" -B "$W/lq" -DGGML_CUDA=OFF -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DCMAKE_BUILD_TYPE=Release > "$O/lq-cmake.log" 2>&1 || { tail -20 "$O/lq-cmake.log"; exit 2; }
t cmake --build "$W/lq" --target llama-quantize -j 16 > "$O/lq-build.log" 2>&1 || { tail -20 "$O/lq-build.log"; exit 2; }
echo "== checkpoint: $LAYERS layers, BF16 GGUF, $TYPE"
rm -rf "$W/src" "$W/jnf" "$W/model.gguf" "$W/model-q.gguf"
t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 > /dev/null || exit 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$H"/wheels/*.whl || exit 2
PYTHONPATH=/tmp/site t python3 "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" > /dev/null || exit 2
rm -rf "$W/src"
t "$W/lq/bin/llama-quantize" "$W/model.gguf" "$W/model-q.gguf" "$TYPE" 16 > "$O/llama-quantize.log" 2>&1 || { tail -20 "$O/llama-quantize.log"; exit 2; }
grep -E "model size|quant size" "$O/llama-quantize.log"
rm -f "$W/model.gguf"
first=${1#*:}
t "$first" convert "$W/model-q.gguf" -o "$W/jnf" --quiet || exit 2
# No --ignore-eos here: the A/B builds may predate it; the synthetic checkpoints have no end-of-sequence token, so -n is always run whole.
P="--tokens 11,22,33,44,55,66,77,88 -n 64 --experts resident"
echo "== CPU reference logits"
t "$first" run "$W/jnf" $P --logits-out "$O/cpu.npy" > /dev/null || exit 2
for spec in "$@"; do
  label=${spec%%:*} bin=${spec#*:}
  t "$bin" run "$W/jnf" $P --device cuda --logits-out "$O/$label.npy" | grep -E "^(decode|gpu|prompt)" 
  same_bytes "$O/cpu.npy" "$O/$label.npy" "$label == cpu"
done
for round in $(seq 1 "$ROUNDS"); do
  for spec in "$@"; do
    label=${spec%%:*} bin=${spec#*:}
    echo "== round $round: $label"
    "$bin" bench-decode "$W/jnf" --modes gpu --prompt-tokens 1 --tokens 32 --runs 21 2>&1 | grep -E "^\| gpu|bit-identical" | sed "s/^/$label: /"
  done
  # The next round starts with the other side.
  set -- "${@:2}" "$1"
done
end_claims
