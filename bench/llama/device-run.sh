#!/usr/bin/env bash
# Issue 10's comparison with llama.cpp on the GPU machine (16 cores, no network, no Rust): build
# llama-bench from the pruned llama.cpp sources, generate a Qwen3-MoE checkpoint of LAYERS layers
# (10: 12.73 GB), convert it to JNF with `tarfa convert` and to a BF16 GGUF, run
# `llama-bench -p 8 -n 32 -t 16`, then `tarfa run` on the same weights. From the repository root:
#   bash bench/llama/device-run.sh WORKDIR [LAYERS]
# Needs (carried, git-ignored): target/device/{tarfa,synth_decode_checkpoint} (stripped release
# builds), bench/llama/llama-cpp-src.tar.xz, bench/llama/wheels/. See bench/llama/README.md.
# Environment: THREADS (16), SHARDS (8), OUT (where llama-bench.json and the build log go; the
# device tool's $OUT when set, else WORKDIR/out).
set -uo pipefail
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: device-run.sh WORKDIR [LAYERS]}
LAYERS=${2:-10}
T=${THREADS:-16}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
t() { local s rc; s=$(date +%s%N); "$@"; rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
drop() { sync; if echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then echo "[caches dropped]"; else echo "[WARNING: caches NOT dropped: warm-cache figure]"; fi; }
for f in "$B/tarfa" "$B/synth_decode_checkpoint" "$H/llama-cpp-src.tar.xz"; do
  [ -e "$f" ] || { echo "missing: $f (carry it)"; exit 2; }
done

echo "== machine"
nproc; uname -r; grep -m1 'model name' /proc/cpuinfo
grep -m1 '^flags' /proc/cpuinfo | grep -oE 'avx512[a-z_0-9]*|amx[a-z_0-9]*' | sort -u | tr '\n' ' '; echo
free -g | head -2; df -h "$W" | tail -1

echo "== gguf (Python package, from the carried wheel)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$H"/wheels/*.whl || exit 2
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import gguf, numpy; print("gguf from", gguf.__file__, "numpy", numpy.__version__)' || exit 2

echo "== llama-bench: build (CPU only, -march=native)"
t bash "$H/build-llama-bench.sh" "$W" "$T" > "$O/llama-build.log" 2>&1 || { tail -40 "$O/llama-build.log"; exit 2; }
tail -3 "$O/llama-build.log"
LB=$W/llama-build/bin/llama-bench

echo "== checkpoint: $LAYERS layers"
rm -rf "$W/src" "$W/jnf" "$W/model.gguf"
t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" "${SHARDS:-8}" || exit 2
du -sb "$W/src"
t "$B/tarfa" convert "$W/src" -o "$W/jnf" --quiet || exit 2
t python3 "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" --verify || exit 2
ls -l "$W/model.gguf"; df -h "$W" | tail -1

echo "== llama.cpp: llama-bench -p 8 -n 32 -t $T (5 repetitions after a warm-up; table on stderr, JSON in $O)"
# All-resident: llama.cpp maps the GGUF, so a cold page cache would make its timed runs fault
# experts in from disk (seen: tg32 57 ± 38 t/s cold against 110 warm on 2 cores). Read it in first.
drop; t sh -c "cat '$W/model.gguf' > /dev/null"
t "$LB" -m "$W/model.gguf" -p 8 -n 32 -t "$T" -o json -oe md > "$O/llama-bench.json"
python3 - "$O/llama-bench.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    test = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"llama.cpp {test}: {r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} tokens/s over {len(r['samples_ts'])} runs "
          f"(samples {r['samples_ts']}), {r['n_threads']} threads, model {r['model_size']} bytes, "
          f"{r['model_n_params']} params, cpu {r['cpu_info']!r}")
EOF

echo "== tarfa run"
# bench-decode drops the page cache itself before each streamed run and measures its own
# baselines in the same run: the memory read rate (resident bound) and the disk read rate (stream
# bound: fio if present, else the runtime's io_uring reads with checks off).
t "$B/tarfa" bench-decode "$W/jnf" --threads "$T" --runs 2 --tokens 32 --prompt-tokens 8 --json > "$O/bench-decode.json"
cat "$O/bench-decode.json"
TARFA_PROFILE=1 t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 64 --experts resident --threads "$T" > /dev/null
# The same greedy run on 1 thread, scalar kernels, pread, token-by-token prompt: identical logits.
t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 4 --experts resident --logits-out "$O/a.npy" > /dev/null
t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 4 --threads 1 --isa scalar --backend pread --no-batch-prompt --logits-out "$O/b.npy" > /dev/null
cmp "$O/a.npy" "$O/b.npy" && echo "logits: 16 threads avx512 resident == 1 thread scalar pread streamed, byte for byte"

echo "== done"; df -h "$W" | tail -1
