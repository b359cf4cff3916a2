# device call A (issue 23), build aba043b: the GPU test binary (decode/tests/gpu.rs,
# TARFA_REQUIRE_GPU=1), now with qwen3_5_moe_text whole on the GPU (graphs on and off, prompt
# batched and token by token, again after a reset).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64; TARFA_REQUIRE_GPU=1 target/device/gpu-test --test-threads=1 2>&1 | tee $OUT/gpu-test.txt
