# device call B (issue 12): paired rounds, same machine as call A (needs /tmp/w/{jnf,model.gguf,llama-build})
[ -e /work/main/decode ] || { mkdir -p /work && ln -sfn "$PWD" /work/main; }
ls /tmp/w/llama-build/bin/llama-bench /tmp/w/model.gguf > /dev/null || { echo "call A's files are gone (fresh machine)"; exit 3; }
mkdir -p /tmp/w/out
OUT=$OUT bash bench/gpu-llama-rounds.sh /tmp/w 2 new:target/device/tarfa-cuda > "$OUT/rounds.txt" 2>&1
echo "rc=$?" >> "$OUT/rounds.txt"
