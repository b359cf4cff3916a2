# device calls A and B (issue 23): glm4_moe's whole forward pass on the H200 against llama.cpp's
# CUDA build, GLM-4.5-shaped 10-layer model (11.68 GB: layer 0 dense, 128 experts top-8 + 1 shared).
# A: the GPU test binary (decode/tests/gpu.rs, TARFA_REQUIRE_GPU=1), then the whole run.
(TARFA_REQUIRE_GPU=1 target/device/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right|SKIPPED" | tee $OUT/gputest.txt)
SKIP_TESTS=1 SYNTH_FAMILY=glm4_moe LLAMA=1 TG32="tarfa:target/device/tarfa-cuda" bash bench/gpu-whole-run.sh /tmp/w 10 > $OUT/run.txt 2>&1
# B (the machine still warm): three paired rounds, llama-bench tg32 (-p 0 -n 32 -r 10) against
# tarfa bench-decode --modes gpu --prompt-tokens 1 --tokens 32 --runs 21, the order turning.
OUT=/tmp/w/out2 bash bench/gpu-llama-rounds.sh /tmp/w 3 tarfa:target/device/tarfa-cuda | tee $OUT/rounds.txt
