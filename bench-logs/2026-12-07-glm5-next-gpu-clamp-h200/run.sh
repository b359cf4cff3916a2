set -u
[ -d /work/main ] || { mkdir -p /work; ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=$PWD/target/device
nvidia-smi --query-gpu=name --format=csv,noheader
fail=0
for src in fixtures/hf/glm5_next fixtures/hf/glm5_next_b fixtures/gguf/from_hf/glm5_next.gguf fixtures/gguf/glm5_next_q.gguf; do
  n=$(basename $src); rm -rf /tmp/m; $B/tarfa-cuda convert $src --output /tmp/m >/dev/null 2>&1 || { echo "$n convert failed"; fail=1; continue; }
  case $n in *_q.gguf) P="--tokens 122,95,81,7,9";; *) P="-p The_quick_brown_fox";; esac
  $B/tarfa-cuda run /tmp/m $P -n 24 --ignore-eos --device cpu --logits-out /tmp/cpu.npy >/dev/null 2>/tmp/cpu.err || { echo "$n cpu failed"; tail -3 /tmp/cpu.err; fail=1; continue; }
  $B/tarfa-cuda run /tmp/m $P -n 24 --ignore-eos --device cuda --logits-out /tmp/cuda.npy >/dev/null 2>/tmp/cuda.err || { echo "$n cuda failed"; tail -3 /tmp/cuda.err; fail=1; continue; }
  if cmp /tmp/cpu.npy /tmp/cuda.npy; then echo "$n: --device cuda logits cmp-equal to cpu"; else echo "$n: DIFFER"; fail=1; fi
  grep -E "^gpu:" /tmp/cuda.err | head -2
done
TARFA_REQUIRE_GPU=1 $B/gpu-test --test-threads=1 2>&1 | grep -E "^test |test result|panicked|assert" | head -40
echo "fail=$fail"
