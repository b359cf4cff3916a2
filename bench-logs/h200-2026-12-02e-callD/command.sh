# device call D (issue 12): which MoE fold pays (b54124b: h by cp.async), 10 layers, tg32 shape; then exactness
[ -e /work/main/decode ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
B=target/device; W=/tmp/w; mkdir -p $W/rounds
{
nvidia-smi --query-gpu=name,clocks.max.memory --format=csv,noheader
$B/synth_decode_checkpoint $W/src 10 8 > /dev/null && $B/tarfa-cuda convert $W/src -o $W/jnf --quiet && rm -rf $W/src
echo "== rounds"
NO_LLAMA=1 OUT=$W/rounds bash bench/gpu-llama-rounds.sh $W 2 both:$B/tarfa-cuda topk:$B/tarfa-cuda:TARFA_CUDA_MOE_FUSE=topk combine:$B/tarfa-cuda:TARFA_CUDA_MOE_FUSE=combine none:$B/tarfa-cuda:TARFA_CUDA_MOE_FUSE=0 old:$B/tarfa-cuda-9524b4d
echo "== exactness"
P="--tokens 11,22,33,44,55,66,77,88 -n 64"
$B/tarfa-cuda run $W/jnf $P --experts resident --logits-out $W/cpu.npy | tail -1
for v in 1 topk combine; do
  TARFA_CUDA_MOE_FUSE=$v $B/tarfa-cuda run $W/jnf $P --experts resident --device cuda --logits-out $W/g-$v.npy > /dev/null
  cmp $W/cpu.npy $W/g-$v.npy && echo "logits: TARFA_CUDA_MOE_FUSE=$v == cpu, byte for byte"
done
TARFA_REQUIRE_GPU=1 $B/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
echo "== done"
} > "$OUT/run.txt" 2>&1
tar -C $W -cf "$OUT/rounds.tar" rounds
