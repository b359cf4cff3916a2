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

# python3 with gguf-py, numpy, blake3, openai and selenium for the tests: a venv of its own,
# first on PATH (scripts/python-venv.sh says why and where).
source scripts/python-venv.sh

# tarfa fetch's range-request tests (fetch/tests/nginx.rs) serve a model with nginx on loopback;
# benchkit/tests/fio.rs runs fio, bench-io's baseline. The tests that mount a tmpfs (a full disk,
# O_DIRECT on tmpfs) need root too. Without root they skip, saying so, unless
# TARFA_REQUIRE_TOOLS=1 (.ci/run), when they fail.
if [ "$(id -u)" = 0 ]; then
  missing=()
  command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || missing+=(nginx)
  command -v fio >/dev/null || missing+=(fio)
  # tests/serve.rs reads a golden SSE transcript with curl, as a user would.
  command -v curl >/dev/null || missing+=(curl)
  # tests/serve_page.rs drives tarfa serve's chat page in headless Chromium, through Debian's
  # chromedriver (selenium, from scripts/python-venv.sh, talks to it); both at these paths.
  [ -x /usr/bin/chromium ] || missing+=(chromium)
  [ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
  fi
fi

# The CUDA kernels are compiled as C++ for their CPU emulation (cuda-emu/, C++20) and by NVRTC
# (tarfa-cuda's driver feature test; PyPI's nvidia-cuda-nvrtc wheel: the NVRTC library alone, no GPU).
if [ "$(id -u)" = 0 ] && ! command -v g++ >/dev/null; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y g++
fi
NVRTC_DIR=${TARFA_NVRTC_DIR:-$HOME/.cache/tarfa/nvrtc-13.5.37}
if [ ! -e "$NVRTC_DIR/nvidia/cu13/lib/libnvrtc.so.13" ]; then
  # The venv's pip (python3 is the venv's here): --target puts the wheel's files in NVRTC_DIR.
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$NVRTC_DIR" nvidia-cuda-nvrtc==13.5.37
fi

# The build and the tests need several GiB of disk (target/, the tests' temporary models): say so
# up front, so that a run that dies of a full disk is recognised at once.
build_dir=${CARGO_TARGET_DIR:-target}
[ -d "$build_dir" ] || build_dir=.
avail_kib=$(df -Pk "$build_dir" | awk 'NR == 2 {print $4}')
echo "== disk: $((avail_kib / 1048576)) GiB free where the build runs"
if [ "$avail_kib" -lt $((10 * 1048576)) ]; then
  echo "warning: under 10 GiB free; the build and tests may fail with 'No space left on device'" >&2
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
cargo clippy -p tarfa-cuda --features driver --all-targets --locked -- -D warnings
echo "== cargo test"
# A test whose outside tool is missing prints one SKIPPED line and passes (crate tarfa-testtools);
# libtest hides a passing test's output, so each line is also logged and listed below. With
# TARFA_REQUIRE_TOOLS=1 such a test fails instead, and, so that no other skip hides either, the
# tests' output is shown (--show-output), kept, and any SKIPPED line in it is an error.
skip_log=$(mktemp)
test_log=$(mktemp)
trap 'rm -f "$skip_log" "$test_log"' EXIT
if [ "${TARFA_REQUIRE_TOOLS:-}" = 1 ]; then
  TARFA_SKIP_LOG=$skip_log cargo test --workspace --locked -- --show-output 2>&1 | tee "$test_log"
  # A missing GPU is hardware CI does not have, skipped with a "SKIPPED (hardware)" line (its
  # own TARFA_REQUIRE_GPU=1 makes it a failure on the GPU machine): listed below, not an error.
  # (Counted, not `grep -q`: under pipefail a -q that exits at its first match can kill the
  # first grep with SIGPIPE and turn a real skip into a pass.)
  if [ "$(grep SKIPPED "$test_log" | grep -cv 'SKIPPED (hardware)')" != 0 ]; then
    echo "error: TARFA_REQUIRE_TOOLS=1, yet tests were skipped:" >&2
    grep SKIPPED "$test_log" | grep -v 'SKIPPED (hardware)' >&2
    exit 1
  fi
else
  TARFA_SKIP_LOG=$skip_log cargo test --workspace --locked
fi
if [ -s "$skip_log" ]; then
  echo "== skipped for want of an outside tool (TARFA_REQUIRE_TOOLS=1 makes each a failure) or a GPU (TARFA_REQUIRE_GPU=1):"
  sort "$skip_log"
fi
echo "== the CUDA kernels compile under NVRTC with the decoder's options (no GPU needed)"
LD_LIBRARY_PATH="$NVRTC_DIR/nvidia/cu13/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" TARFA_REQUIRE_NVRTC=1 \
  cargo test -p tarfa-cuda --features driver --locked --lib nvrtc::
echo "== fuzz: every cargo-fuzz target for ${TARFA_FUZZ_SECONDS:-10} s (scripts/fuzz-ci.sh)"
bash scripts/fuzz-ci.sh
