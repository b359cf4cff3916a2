# device call D (issue 23): the DeltaNet step in one launch (fused convolution, eight rows a warp;
# build 5ce5f67, `new`) against the build before it (6c37f5e, `base`) on a fresh Qwen3.5-MoE-shaped
# 8-layer model: the GPU tests, the new build's whole-pass logits against the CPU's, then
# alternating tg32-shaped rounds (no llama.cpp: NO_LLAMA=1), then the kernels' times.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
(TARFA_REQUIRE_GPU=1 target/device/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right|SKIPPED" | tee $OUT/gputest.txt)
mkdir -p /tmp/w && SYNTH_FAMILY=qwen3_5_moe target/device/synth_decode_checkpoint /tmp/w/src 8 8 > /dev/null && target/device/tarfa-cuda convert /tmp/w/src -o /tmp/w/jnf --quiet && rm -rf /tmp/w/src
P="--tokens 11,22,33,44,55,66,77,88 -n 64 --experts resident"
target/device/tarfa-cuda run /tmp/w/jnf $P --logits-out /tmp/w/cpu.npy > /dev/null 2>$OUT/cpu.txt
target/device/tarfa-cuda run /tmp/w/jnf $P --device cuda --logits-out /tmp/w/new.npy > /dev/null 2>$OUT/new.txt
target/device/tarfa-base run /tmp/w/jnf $P --device cuda --logits-out /tmp/w/base.npy > /dev/null 2>$OUT/base.txt
for f in new base; do cmp /tmp/w/cpu.npy /tmp/w/$f.npy && echo "logits: $f == cpu, byte for byte" || echo "LOGITS DIFFER: $f"; done | tee $OUT/logits.txt
NO_LLAMA=1 OUT=/tmp/w/out bash bench/gpu-llama-rounds.sh /tmp/w 3 new:target/device/tarfa-cuda base:target/device/tarfa-base | tee $OUT/rounds.txt
TARFA_BIN=target/device/tarfa-cuda timeout 150 bash bench/gpu-kernel-times.sh /tmp/w/jnf 400 300 > $OUT/kernel-times.txt 2>&1; head -14 $OUT/kernel-times.txt
# call E (the machine still warm): four more alternating rounds of the same two builds.
NO_LLAMA=1 OUT=/tmp/w/out bash bench/gpu-llama-rounds.sh /tmp/w 4 new:target/device/tarfa-cuda base:target/device/tarfa-base | tee $OUT/rounds2.txt
