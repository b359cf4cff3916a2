# device call B (issue 23): qwen3_5_moe's whole forward pass on the GPU against llama.cpp's CUDA
# build, a Qwen3.5-MoE-shaped 8-layer model (6 Gated DeltaNet + 2 gated-attention layers, 256
# experts of 512 top-8 + a gated shared expert; SYNTH_FAMILY=qwen3_5_moe synth_decode_checkpoint),
# the GGUF written by bench/llama/safetensors_to_gguf.py (llama.cpp's qwen35moe).
(TARFA_REQUIRE_GPU=1 target/device/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right|SKIPPED" | tee $OUT/gputest.txt)
SKIP_TESTS=1 SYNTH_FAMILY=qwen3_5_moe LLAMA=1 TG32="tarfa:target/device/tarfa-cuda" bash bench/gpu-whole-run.sh /tmp/w 8 > $OUT/run.txt 2>&1; echo "rc=$?"
cp /tmp/w/out/llama-bench-cuda.json /tmp/w/out/whole.json $OUT/ 2>/dev/null; tail -25 $OUT/run.txt
# call C (the machine still warm): two paired rounds, llama-bench tg32 (-p 0 -n 32 -r 10) against
# tarfa bench-decode --modes gpu --prompt-tokens 1 --tokens 32 --runs 21, the order turning; then
# the kernels' times under Nsight Compute (300 kernels of the whole pass).
OUT=/tmp/w/out2 bash bench/gpu-llama-rounds.sh /tmp/w 2 tarfa:target/device/tarfa-cuda | tee $OUT/rounds.txt
TARFA_BIN=target/device/tarfa-cuda bash bench/gpu-kernel-times.sh /tmp/w/jnf 400 300 > $OUT/kernel-times.txt 2>&1
