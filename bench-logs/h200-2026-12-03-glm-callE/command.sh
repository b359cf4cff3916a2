# device call E (issue 23), at a31b4ba (tarfa 3c0aa335…): the GPU test binary; the 10-layer
# 12.7 GB qwen3_moe model, this build against 97cddcf's (4e50c9c7…, before issue 23) in three
# rounds (NO_LLAMA=1); a 4-layer GLM-4.5-shaped model through a BF16 GGUF (gguf-py), converted from
# the GGUF, its whole pass on the GPU against the CPU (cmp), and --vram-gib 1 (the warning).
B=target/device
(TARFA_REQUIRE_GPU=1 $B/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right|SKIPPED" | tee $OUT/gputest.txt)
$B/synth_decode_checkpoint /tmp/q/src 10 8 >/dev/null && $B/tarfa-cuda convert /tmp/q/src -o /tmp/q/jnf --quiet
NO_LLAMA=1 OUT=/tmp/q/out bash bench/gpu-llama-rounds.sh /tmp/q 3 new:$B/tarfa-cuda old:$B/tarfa-old | tee $OUT/qwen3-ab.txt
SYNTH_FAMILY=glm4_moe $B/synth_decode_checkpoint /tmp/g/src 4 8; python3 bench/llama/safetensors_to_gguf.py /tmp/g/src /tmp/g/m.gguf
$B/tarfa-cuda convert /tmp/g/m.gguf -o /tmp/g/jnf --quiet
P="--tokens 11,22,33,44,55,66,77,88 -n 32"
$B/tarfa-cuda run /tmp/g/jnf $P --experts resident --logits-out /tmp/g/cpu.npy
$B/tarfa-cuda run /tmp/g/jnf $P --experts resident --device cuda --logits-out /tmp/g/gpu.npy
cmp /tmp/g/cpu.npy /tmp/g/gpu.npy
$B/tarfa-cuda run /tmp/g/jnf $P --experts resident --device cuda --vram-gib 1
