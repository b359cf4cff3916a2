# call E: the GPU tests after the review's fixes (KV growth made whole before old buffers go,
# --n-cpu-moe counted as llama.cpp counts layers), and --n-cpu-moe's refusals on a fixture.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=target/device
nvidia-smi --query-gpu=name --format=csv,noheader
TARFA_REQUIRE_GPU=1 $B/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|left|right" | head -40
$B/tarfa-cuda convert fixtures/hf/glm4_moe_b -o /tmp/g --quiet > /dev/null 2>&1
for n in 3 4 5; do
  echo "== --n-cpu-moe $n on glm4_moe_b (4 layers, 0 and 1 dense)"
  $B/tarfa-cuda run /tmp/g --tokens 1,2,3 -n 4 --device cuda --n-cpu-moe $n 2>&1 | grep -E "gpu:|compute:|error"; echo "rc=${PIPESTATUS[0]}"
done
