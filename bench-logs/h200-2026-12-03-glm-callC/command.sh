# device calls C and D (issue 23): the shared expert folded into the routed launches as slot k
# ("fold", tarfa a477d587…) against the build before it ("nofold", 5953d208…, calls A/B) and
# llama.cpp's CUDA build, the GLM-4.5-shaped 10-layer model made afresh on a new machine.
(TARFA_REQUIRE_GPU=1 target/device/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right|SKIPPED" | tee $OUT/gputest.txt)
SKIP_TESTS=1 SYNTH_FAMILY=glm4_moe LLAMA=1 OUT=/tmp/w/out bash bench/gpu-whole-run.sh /tmp/w 10 > $OUT/run.txt 2>&1
OUT=/tmp/w/out2 bash bench/gpu-llama-rounds.sh /tmp/w 3 fold:target/device/tarfa-cuda nofold:target/device/tarfa-nofold | tee $OUT/rounds.txt
# D (warm): three more rounds, fold against llama.cpp alone.
OUT=/tmp/w/out3 bash bench/gpu-llama-rounds.sh /tmp/w 3 fold:target/device/tarfa-cuda | tee $OUT/rounds2.txt
