# device call A (issue 12): the all-resident comparison on a 20-layer (25 GB) Qwen3-MoE-shaped model
[ -e /work/main/decode ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
mkdir -p /tmp/w/out
LLAMA=1 VIA_GGUF=1 OUT=/tmp/w/out TG32="new:target/device/tarfa-cuda" bash bench/gpu-whole-run.sh /tmp/w 20 > "$OUT/run.txt" 2>&1
echo "rc=$?" >> "$OUT/run.txt"
cp /tmp/w/out/*.json "$OUT/" 2>/dev/null
tail -40 /tmp/w/out/llama-build.log > "$OUT/llama-build-tail.log" 2>/dev/null
ls -la /tmp/w /tmp/w/llama-build/bin 2>/dev/null | head -30 >> "$OUT/run.txt"
