#!/usr/bin/env bash
# The test command of README.md and CI: installs what the tests need on a fresh machine, then runs
# formatting, lints and every test of the workspace. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never

if ! command -v cargo >/dev/null; then
  echo "error: cargo not found; install Rust (rustup) first" >&2
  exit 2
fi
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy rustfmt

# gguf-py cross-checks (gguf/tests/gguf_py_agreement.rs) need the format's own Python library;
# the second JNF reader (tests/jnf_reader.py, run by tests/python_reader.rs) checks BLAKE3 with
# the blake3 package.
if ! python3 -c 'import gguf, blake3' >/dev/null 2>&1; then
  python3 -m pip install --quiet --disable-pip-version-check gguf numpy blake3
fi

# tarfa fetch's range-request tests (fetch/tests/nginx.rs) serve a model with nginx on loopback.
if [ "$(id -u)" = 0 ]; then
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nginx)
fi

# The CUDA kernels are compiled as C++ for their CPU emulation (cuda-emu/, C++20) and by NVRTC
# (runtime's cuda feature test; PyPI's nvidia-cuda-nvrtc wheel: the NVRTC library alone, no GPU).
if [ "$(id -u)" = 0 ] && ! command -v g++ >/dev/null; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y g++
fi
NVRTC_DIR=${TARFA_NVRTC_DIR:-$HOME/.cache/tarfa/nvrtc-13.5.37}
if [ ! -e "$NVRTC_DIR/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$NVRTC_DIR" nvidia-cuda-nvrtc==13.5.37
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo clippy, cuda feature (builds without a CUDA toolkit: libcuda is loaded at run time)"
cargo clippy -p tarfa --features cuda --all-targets --locked -- -D warnings
# The decoder's GPU path and its GPU test (decode/tests/gpu.rs) exist only with the feature.
cargo clippy -p tarfa-decode --features cuda --all-targets --locked -- -D warnings
cargo clippy -p tarfa-runtime --features cuda --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
echo "== the CUDA kernels compile under NVRTC with the decoder's options (no GPU needed)"
LD_LIBRARY_PATH="$NVRTC_DIR/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TARFA_REQUIRE_NVRTC=1 \
  cargo test -p tarfa-runtime --features cuda --locked --lib cuda_compute
echo "== fuzz: every cargo-fuzz target for ${TARFA_FUZZ_SECONDS:-10} s (scripts/fuzz-ci.sh)"
bash scripts/fuzz-ci.sh
