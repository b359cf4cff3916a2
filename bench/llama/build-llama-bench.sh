#!/usr/bin/env bash
# Build llama.cpp's llama-bench (and llama-quantize), CPU only, from bench/llama/llama-cpp-src.tar.xz; with CUDA=1,
# with its CUDA backend for the H200 (sm_90) from bench/llama/llama-cpp-cuda-src.tar.xz.
#   [CUDA=1] bash bench/llama/build-llama-bench.sh WORKDIR [JOBS]
# Leaves WORKDIR/llama.cpp (sources), WORKDIR/llama-build and WORKDIR/llama-build/bin/llama-bench.
# GGML_NATIVE=ON compiles ggml-cpu with -march=native: AVX-512 (and AVX512-BF16 where the CPU has
# it) on the GPU machine. Needs cmake >= 3.14, a C/C++17 compiler; no network.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${1:?usage: build-llama-bench.sh WORKDIR [JOBS]}
J=${2:-$(nproc)}
mkdir -p "$W"
rm -rf "$W/llama.cpp" "$W/llama-build"
SRC=llama-cpp-src.tar.xz CUDA_OPTS=(-DGGML_CUDA=OFF)
if [ "${CUDA:-0}" = 1 ]; then
  SRC=llama-cpp-cuda-src.tar.xz
  CUDA_OPTS=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}")
fi
tar xJf "$HERE/$SRC" -C "$W"
cat "$W/llama.cpp/TARFA-SOURCE.txt"
cmake -S "$W/llama.cpp" -B "$W/llama-build" $(command -v ninja > /dev/null && echo -G Ninja) \
  "${CUDA_OPTS[@]}" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DGGML_CCACHE=OFF -DLLAMA_BUILD_COMMIT=0c1e570 -DCMAKE_BUILD_TYPE=Release
cmake --build "$W/llama-build" --target llama-bench llama-quantize -j "$J"
"$W/llama-build/bin/llama-bench" --help > /dev/null
echo "built: $W/llama-build/bin/llama-bench"
# what -march=native turns on here (ggml-cpu is compiled with it): AVX-512 shows as __AVX512F__
echo | cc -march=native -dM -E - | grep -oE '__(AVX512[A-Z0-9_]*|AVX2|FMA|F16C|AMX_[A-Z0-9]*)__' | sort | tr '\n' ' '; echo
