# device call F (issue 12): attention's partials 8 at a time (HEAD) against 9524b4d, 10 layers, tg32 shape; exactness
[ -e /work/main/decode ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
B=target/device; W=/tmp/w; mkdir -p $W/rounds
{
$B/synth_decode_checkpoint $W/src 10 8 > /dev/null && $B/tarfa-cuda convert $W/src -o $W/jnf --quiet && rm -rf $W/src
echo "== rounds"
NO_LLAMA=1 OUT=$W/rounds bash bench/gpu-llama-rounds.sh $W 3 new:$B/tarfa-cuda old:$B/tarfa-cuda-9524b4d
echo "== exactness"
P="--tokens 11,22,33,44,55,66,77,88 -n 64"
$B/tarfa-cuda run $W/jnf $P --experts resident --logits-out $W/cpu.npy > /dev/null
$B/tarfa-cuda run $W/jnf $P --experts resident --device cuda --logits-out $W/g.npy | tail -1
cmp $W/cpu.npy $W/g.npy && echo "logits: gpu == cpu, byte for byte"
TARFA_REQUIRE_GPU=1 $B/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked"
echo "== done"
} > "$OUT/run.txt" 2>&1
tar -C $W -cf "$OUT/rounds.tar" rounds
