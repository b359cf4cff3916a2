# device call C (issue 12): top-k and combine taken into the experts' launches (8314a20) against 9524b4d and llama.cpp, 20 layers
[ -e /work/main/decode ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
mkdir -p /tmp/w/out /tmp/w/rounds
LLAMA=1 VIA_GGUF=1 OUT=/tmp/w/out bash bench/gpu-whole-run.sh /tmp/w 20 > "$OUT/run.txt" 2>&1
echo "rc=$?" >> "$OUT/run.txt"
cp /tmp/w/out/*.json "$OUT/" 2>/dev/null
OUT=/tmp/w/rounds bash bench/gpu-llama-rounds.sh /tmp/w 2 new:target/device/tarfa-cuda old:target/device/tarfa-cuda-9524b4d > "$OUT/rounds.txt" 2>&1
echo "rc=$?" >> "$OUT/rounds.txt"
tar -C /tmp/w -cf "$OUT/rounds.tar" rounds
