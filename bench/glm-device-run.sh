#!/usr/bin/env bash
# Issue 11's decode benchmark of a second family on the GPU machine (16 cores, no network, no
# Rust): build llama-bench from the pruned llama.cpp sources, generate a GLM-4.5-shaped checkpoint
# of LAYERS layers (10: 11.7 GB, layer 0 dense) with `SYNTH_FAMILY=glm4_moe
# synth_decode_checkpoint`, convert it with `tarfa convert` and to a BF16 `glm4moe` GGUF
# (bench/llama/safetensors_to_gguf.py --verify), run `llama-bench -p 8 -n 32 -t 16` on a warm page
# cache, then `tarfa bench-decode` (streamed from a cold page cache against the storage bound it
# measures, resident against the memory bound it measures; every run's logits checked identical)
# and a bit-identity check (16 threads AVX-512 resident vs 1 thread scalar pread token by token).
#   bash bench/glm-device-run.sh WORKDIR [LAYERS]
# Needs (carried, git-ignored): target/device/{tarfa,synth_decode_checkpoint} (stripped release
# builds), bench/llama/llama-cpp-src.tar.xz, bench/llama/wheels/. See bench/llama/README.md.
# Environment: THREADS (16), SHARDS (8), OUT (default WORKDIR/out; the device tool's $OUT when
# set). Writes to OUT: llama-build.log, llama-bench.json, bench-decode.json, a.npy, b.npy.
# Disk in WORKDIR: source + JNF + GGUF, 3 x 11.7 GB at 10 layers; the source is removed once the
# JNF and the GGUF are written.
set -uo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: glm-device-run.sh WORKDIR [LAYERS]}
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

echo "== checkpoint: GLM-4.5-shaped, $LAYERS layers"
rm -rf "$W/src" "$W/jnf" "$W/model.gguf"
SYNTH_FAMILY=glm4_moe t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" "${SHARDS:-8}" || exit 2
du -sb "$W/src"
t "$B/tarfa" convert "$W/src" -o "$W/jnf" --quiet || exit 2
t python3 "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" --verify || exit 2
ls -l "$W/model.gguf"; df -h "$W" | tail -1
rm -rf "$W/src"

echo "== llama.cpp: llama-bench -p 8 -n 32 -t $T (5 repetitions after a warm-up; table on stderr, JSON in $O)"
# All-resident: llama.cpp maps the GGUF, so a cold page cache would make its timed runs fault
# experts in from disk. Read it in first.
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

echo "== tarfa bench-decode"
# The first resident pass on a fresh VM has been seen at half speed: warm the machine's memory
# once with a short resident run before measuring.
t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 4 --ignore-eos --experts resident --threads "$T" > /dev/null
t "$B/tarfa" bench-decode "$W/jnf" --threads "$T" --runs 2 --tokens 32 --prompt-tokens 8 --json > "$O/bench-decode.json"
cat "$O/bench-decode.json"
TARFA_PROFILE=1 t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 64 --ignore-eos --experts resident --threads "$T" > /dev/null
t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 4 --ignore-eos --experts resident --logits-out "$O/a.npy" > /dev/null
t "$B/tarfa" run "$W/jnf" --tokens 1,2,3,4,5,6,7,8 -n 4 --ignore-eos --threads 1 --isa scalar --backend pread --no-batch-prompt --logits-out "$O/b.npy" > /dev/null
same_bytes "$O/a.npy" "$O/b.npy" "$T threads avx512 resident == 1 thread scalar pread streamed token by token"
df -h "$W" | tail -1
end_claims
