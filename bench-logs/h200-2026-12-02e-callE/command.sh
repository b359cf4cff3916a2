# device call E (issue 12): the GPU tests at the final HEAD (the folds reverted; the wide-expert case)
[ -e /work/main/decode ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
{ nvidia-smi --query-gpu=name --format=csv,noheader; sha256sum target/device/gpu-test target/device/tarfa-cuda
TARFA_REQUIRE_GPU=1 target/device/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right"; } > "$OUT/run.txt" 2>&1
