#!/usr/bin/env bash
# Issue 24 on the GPU machine's 16 cores: tarfa's CPU prompt (pp512) and decode (tg32) beside
# llama.cpp's CPU build on the same weights, as `tarfa bench-decode --peer` prints them — this
# build and an earlier one (BASE, to show what a change gained) in the same call.
#   bash bench/cpu-prompt-run.sh WORKDIR
# WORKDIR is bench/serve-run.sh's, on the same machine right after it: its BF16 GGUF
# (model.gguf), the JNF converted from it (jnf/) and its llama.cpp CUDA build tree (llama-build/),
# to which llama-bench is added here. llama-bench runs on the CPU alone: CUDA_VISIBLE_DEVICES is
# empty (no GPU for the CUDA build to offload a prompt's products to) and -ngl 0; -t 16, -r 3.
# tarfa: `bench-decode --modes resident --prompt-tokens 512 -n 32 --runs 3` with 16 threads, its
# logits checked bit-identical across runs; each build's table beside llama-bench's JSON.
# Needs (carried): target/device/tarfa-cuda (this build), and BASE (default
# target/device/tarfa-base: a release build of the commit to compare with; skipped if absent).
# OUT: where the JSON and logs go (default WORKDIR/out).
set -uo pipefail
R=$(pwd)
W=${1:?usage: cpu-prompt-run.sh WORKDIR}
O=${OUT:-$W/out}
BASE=${BASE:-$R/target/device/tarfa-base}
mkdir -p "$O"
for f in "$W/model.gguf" "$W/jnf/manifest.json" "$W/llama-build" "$R/target/device/tarfa-cuda"; do
  [ -e "$f" ] || { echo "missing: $f (run bench/serve-run.sh $W first, on this machine)"; exit 2; }
done
echo "== machine"
nproc; grep -m1 'model name' /proc/cpuinfo; free -g | head -2
echo "== llama-bench (CPU build of the same tree)"
cmake --build "$W/llama-build" --target llama-bench -j 16 > "$O/llama-bench-build.log" 2>&1 \
  || { tail -20 "$O/llama-bench-build.log"; exit 1; }
sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || true
cat "$W/model.gguf" > /dev/null # llama.cpp maps the file: read it into the page cache first
CUDA_VISIBLE_DEVICES= "$W/llama-build/bin/llama-bench" -m "$W/model.gguf" -p 512 -n 32 -t 16 -ngl 0 -r 3 -o json \
  > "$O/llama-bench-cpu.json" 2> "$O/llama-bench-cpu.log" || { tail -20 "$O/llama-bench-cpu.log"; exit 1; }
python3 -c "
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f\"llama-bench pp{r['n_prompt']} tg{r['n_gen']}: {r['avg_ts']:.2f} tok/s (backends {r['backends']}, ngl {r['n_gpu_layers']}, {r['n_threads']} threads)\")
" "$O/llama-bench-cpu.json"
rc=0
for b in "$R/target/device/tarfa-cuda" "$BASE"; do
  [ -x "$b" ] || { echo "(no $b)"; continue; }
  echo "== tarfa: $b"
  "$b" bench-decode "$W/jnf" --modes resident --prompt-tokens 512 -n 32 --runs 3 --mem-gib 2 \
    --peer "$O/llama-bench-cpu.json" 2>&1 | tee "$O/bench-decode-$(basename "$b").txt" || rc=1
done
exit $rc
