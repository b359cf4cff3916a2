set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=target/device; W=/tmp/w; O=$OUT
mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
s=$(date +%s); TARFA_REQUIRE_GPU=1 $B/gpu-test --test-threads=1 > $O/gpu-test.log 2>&1; echo "gpu-test rc=$? $(( $(date +%s)-s ))s"; grep -E "^test |test result|panicked" $O/gpu-test.log
s=$(date +%s); $B/synth_decode_checkpoint $W/src 10 8 > /dev/null && $B/tarfa-cuda convert $W/src -o $W/jnf --quiet || exit 2; rm -rf $W/src; echo "model $(( $(date +%s)-s ))s"
P="--tokens 11,22,33,44,55,66,77,88 -n 32"
$B/tarfa-cuda run $W/jnf $P --experts resident --logits-out $O/cpu.npy > /dev/null 2>&1
$B/tarfa-cuda run $W/jnf $P --experts resident --device cuda --logits-out $O/whole.npy > /dev/null 2>&1
$B/tarfa-base run $W/jnf $P --experts resident --device cuda --logits-out $O/whole-base.npy > /dev/null 2>&1
cmp $O/cpu.npy $O/whole.npy && cmp $O/cpu.npy $O/whole-base.npy && echo "logits: whole new == whole base == cpu" || { echo "LOGITS DIFFER"; exit 3; }
for r in 1 2 3; do for b in tarfa-cuda tarfa-base; do
  echo "== round $r $b tg32-shaped"; $B/$b bench-decode $W/jnf --modes gpu --prompt-tokens 1 --tokens 32 --runs 21 2>&1 | grep -E "\| gpu \||rror"
done; done
