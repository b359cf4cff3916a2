#!/usr/bin/env bash
# The shortest useful GPU session (issue 12): the GPU tests, a 10-layer checkpoint, the new
# build's whole-model logits `cmp`-equal to the CPU's, then the new build against another one in
# alternating rounds, at 128 steps and at llama-bench's tg32 shape (1 prompt token, 32 steps).
#   bash bench/gpu-quick-ab.sh WORKDIR OTHER_BINARY [ROUNDS]
# Needs (carried): target/device/{tarfa-cuda,gpu-test,synth_decode_checkpoint} and OTHER_BINARY.
# OUT: where the logits go (default WORKDIR/out).
set -uo pipefail
source "$(dirname "$0")/claims.sh"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=target/device
W=${1:?usage: gpu-quick-ab.sh WORKDIR OTHER_BINARY [ROUNDS]}
OTHER=${2:?other binary}
ROUNDS=${3:-2}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
TARFA_REQUIRE_GPU=1 "$B/gpu-test" --test-threads=1 2>&1 | grep -E "^test |test result|panicked" || claim_failed "the GPU tests"
"$B/synth_decode_checkpoint" "$W/src" 10 8 > /dev/null && "$B/tarfa-cuda" convert "$W/src" -o "$W/jnf" --quiet || exit 2
rm -rf "$W/src"
# No --ignore-eos here: the A/B builds may predate it; the synthetic checkpoints have no end-of-sequence token, so -n is always run whole.
P="--tokens 11,22,33,44,55,66,77,88 -n 32"
"$B/tarfa-cuda" run "$W/jnf" $P --experts resident --logits-out "$O/cpu.npy" > /dev/null 2>&1
"$B/tarfa-cuda" run "$W/jnf" $P --experts resident --device cuda --logits-out "$O/whole.npy" > /dev/null 2>&1
same_bytes "$O/cpu.npy" "$O/whole.npy" "whole (new build) == cpu"
for r in $(seq 1 "$ROUNDS"); do
  for b in "$B/tarfa-cuda" "$OTHER"; do
    echo "== round $r $b: 128 steps"
    "$b" bench-decode "$W/jnf" --modes gpu --tokens 128 --runs 5 2>&1 | grep -E "\| gpu \||rror"
    echo "== round $r $b: tg32-shaped"
    "$b" bench-decode "$W/jnf" --modes gpu --prompt-tokens 1 --tokens 32 --runs 21 2>&1 | grep -E "\| gpu \||rror"
  done
done
end_claims
