#!/usr/bin/env bash
# On the GPU machine: each fixture (a transformers-made checkpoint under fixtures/hf/ or a GGUF
# under fixtures/gguf/) converted, run 24 greedy steps on `--device cpu` and on `--device cuda`,
# the logits compared byte for byte; then decode/tests/gpu.rs (TARFA_REQUIRE_GPU=1).
#   bash bench/gpu-fixtures-run.sh FIXTURE...
# Needs (carried, git-ignored): target/device/tarfa-cuda (a `--features cuda` release build) and
# target/device/gpu-test (decode/tests/gpu.rs built likewise; SKIP_TESTS=1 leaves it out).
# The tests find their fixtures under /work/main (linked to this checkout when absent).
# Exits 1 when any logits differ or a test fails.
set -uo pipefail
source "$(dirname "$0")/claims.sh"
[ -d /work/main ] || { mkdir -p /work; ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=$PWD/target/device
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
nvidia-smi --query-gpu=name --format=csv,noheader
for src in "$@"; do
  n=$(basename "$src")
  rm -rf "$T/m" "$T/cpu.npy" "$T/cuda.npy"
  "$B/tarfa-cuda" convert "$src" --output "$T/m" > "$T/convert.log" 2>&1 || { claim_failed "$n: convert"; tail -3 "$T/convert.log"; continue; }
  # Quantised fixtures carry no tokenizer: token ids.
  case $n in *_q.gguf) P="--tokens 122,95,81,7,9";; *) P="-p The_quick_brown_fox";; esac
  for d in cpu cuda; do
    "$B/tarfa-cuda" run "$T/m" $P -n 24 --ignore-eos --device $d --logits-out "$T/$d.npy" > /dev/null 2> "$T/$d.err" \
      || { claim_failed "$n: --device $d run"; tail -3 "$T/$d.err"; }
  done
  same_bytes "$T/cpu.npy" "$T/cuda.npy" "$n: --device cuda == cpu"
  grep -E "^gpu:" "$T/cuda.err" | head -2
done
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  TARFA_REQUIRE_GPU=1 "$B/gpu-test" --test-threads=1 > "$T/tests.log" 2>&1 || claim_failed "decode/tests/gpu.rs"
  grep -E "^test |test result|panicked|assert" "$T/tests.log" | head -40
fi
end_claims
