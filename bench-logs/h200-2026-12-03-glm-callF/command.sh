# device call F (issue 23), at 09305a1 (gpu_resident's open and build sharing one prepare step):
# the GPU test binary; a 3-layer GLM-4.5-shaped model's whole pass against the CPU (cmp), and
# --vram-gib 1's warning.
B=target/device
(TARFA_REQUIRE_GPU=1 $B/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right|SKIPPED" | tee $OUT/gputest.txt)
SYNTH_FAMILY=glm4_moe $B/synth_decode_checkpoint /tmp/g/src 3 8; $B/tarfa-cuda convert /tmp/g/src -o /tmp/g/jnf --quiet
P="--tokens 11,22,33,44,55,66,77,88 -n 16"
$B/tarfa-cuda run /tmp/g/jnf $P --experts resident --logits-out /tmp/g/cpu.npy
$B/tarfa-cuda run /tmp/g/jnf $P --experts resident --device cuda --logits-out /tmp/g/gpu.npy
cmp /tmp/g/cpu.npy /tmp/g/gpu.npy
$B/tarfa-cuda run /tmp/g/jnf $P --device cuda --vram-gib 1
