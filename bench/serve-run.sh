#!/usr/bin/env bash
# Issue 25 on the GPU machine: `tarfa serve` beside llama.cpp's `llama-server --parallel 8` on the
# same weights — TTFT and aggregate tokens/s at concurrency 1 and 8, and whether each server's
# texts are the same bytes at both (tarfa's must be: a difference fails the run; llama-server's
# are reported). A Qwen3-MoE-shaped checkpoint of LAYERS layers (10: 12.73 GB) from
# synth_decode_checkpoint, written as a BF16 GGUF with a byte-level BPE tokenizer added (the
# generated checkpoint has none, and both servers stream text), which llama-server reads and
# `tarfa convert` turns into tarfa's JNF: one tokenizer and one set of weights for both.
#   bash bench/serve-run.sh WORKDIR [LAYERS]
# The load (bench/serve_load.py, standard library only): the same seeded prompts of PROMPT (64)
# token ids for both servers, N (128) tokens each (`ignore_eos`, `temperature` 0: greedy on
# both), 8 requests one at a time, then 32 requests 8 at a time. Each server runs alone (one
# GPU), started, waited for on GET /health, measured, stopped:
#   tarfa-cuda serve JNF --parallel 8 --device cuda --experts resident --prompt-cache 0
#   llama-server -m model.gguf -ngl 99 --parallel 8 -c 8×(PROMPT+N) rounded up (flash attention:
#     its default, auto); every request with "cache_prompt": false
# Both prompt caches are off: the concurrency-8 run repeats the concurrency-1 run's 8 prompts, and
# a prefix served from a cache would flatter its TTFT (tarfa refuses llama-server's cache_prompt
# field, so it is passed to llama-server only).
# llama-server is built with CUDA (sm_90) from the same llama.cpp sources as llama-bench
# (bench/llama/llama-cpp-cuda-src.tar.xz, commit 0c1e570) plus its server sources, which that
# tarball leaves out: bench/llama/llama-server-src.tar.xz, tools/server (without tests and bench),
# tools/cli and tools/ui's CMake files and templates, scripts/ui-assets.cmake, from the same
# sdist (llama_cpp_python-0.3.36, sha256 832db069…a1e2e, as bench/llama/make-llama-src.sh fetches
# it); built with no web UI (LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF: no network). Made with
#   (cd SDIST/vendor && tar -cf - --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-10-01 \
#     --exclude=llama.cpp/tools/server/tests --exclude=llama.cpp/tools/server/bench \
#     llama.cpp/tools/server llama.cpp/tools/cli llama.cpp/tools/ui/{CMakeLists.txt,sources.cmake,ui.cpp.in,ui.h.in} \
#     llama.cpp/scripts/ui-assets.cmake | xz -9 -T0 > bench/llama/llama-server-src.tar.xz)
# It builds (niced) in the background while the checkpoint, GGUF and JNF are made, and is waited
# for before anything is timed.
# Needs (carried, git-ignored): target/device/{tarfa-cuda,synth_decode_checkpoint} (a
# `--features cuda` release build of tarfa, with `tarfa serve`), bench/llama/llama-cpp-cuda-src.tar.xz,
# bench/llama/llama-server-src.tar.xz and bench/llama/wheels/ (the gguf wheel). The `run` tool:
#   carry: ["target/device", "bench/llama/llama-cpp-cuda-src.tar.xz",
#           "bench/llama/llama-server-src.tar.xz", "bench/llama/wheels"]
#   command: set -o pipefail; OUT=$OUT bash bench/serve-run.sh /tmp/sv 2>&1 | tee $OUT/serve-run.log
# OUT: where logs, each run's JSON (every request's text) and the table go (default WORKDIR/out).
# Environment: PROMPT (64), N (128), JOBS (16, the build's). Disk: the checkpoint (12.7 GB), then
# the GGUF and the JNF (25.5 GB at once). Exits 1 when tarfa's texts differ across concurrency.
set -euo pipefail
source "$(dirname "$0")/claims.sh"
R=$(pwd)
B=$R/target/device
H=$R/bench/llama
W=${1:?usage: serve-run.sh WORKDIR [LAYERS]}
LAYERS=${2:-10}
PROMPT=${PROMPT:-64}
N=${N:-128}
O=${OUT:-$W/out}
mkdir -p "$W" "$O"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t() { local s rc=0; s=$(date +%s%N); "$@" || rc=$?; echo "TIME $(( ($(date +%s%N) - s) / 1000000 )) ms rc=$rc: $*" >&2; return $rc; }
for f in "$B/tarfa-cuda" "$B/synth_decode_checkpoint" "$H/llama-cpp-cuda-src.tar.xz" "$H/llama-server-src.tar.xz"; do
  [ -e "$f" ] || { echo "missing: $f (carry it; see this script's header)" >&2; exit 2; }
done
SERVER_PID=
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2> /dev/null || true
    wait "$SERVER_PID" 2> /dev/null || true
    SERVER_PID=
  fi
}
BUILD_PID=
cleanup() { stop_server; [ -z "$BUILD_PID" ] || kill "$BUILD_PID" 2> /dev/null || true; }
trap cleanup EXIT
nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader

echo "== llama-server CUDA build, in the background (niced; waited for before anything is timed)"
(
  s=$(date +%s)
  rc=0
  {
    rm -rf "$W/llama.cpp" "$W/llama-build"
    tar xJf "$H/llama-cpp-cuda-src.tar.xz" -C "$W"
    tar xJf "$H/llama-server-src.tar.xz" -C "$W"
    cat "$W/llama.cpp/TARFA-SOURCE.txt"
    nice -n 19 cmake -S "$W/llama.cpp" -B "$W/llama-build" $(command -v ninja > /dev/null && echo -G Ninja) \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" \
      -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DGGML_CCACHE=OFF -DLLAMA_BUILD_COMMIT=0c1e570 -DCMAKE_BUILD_TYPE=Release
    nice -n 19 cmake --build "$W/llama-build" --target llama-server -j "${JOBS:-16}"
    "$W/llama-build/bin/llama-server" --version
  } > "$O/llama-build.log" 2>&1 || rc=$?
  echo "$rc $(( $(date +%s) - s ))" > "$W/llama-build.done"
) &
BUILD_PID=$!

echo "== checkpoint: $LAYERS layers; its BF16 GGUF with a byte-level BPE tokenizer; the JNF from that GGUF"
rm -rf "$W/src" "$W/jnf" "$W/model.gguf"
t "$B/synth_decode_checkpoint" "$W/src" "$LAYERS" 8 > /dev/null
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$H"/wheels/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# safetensors_to_gguf.py writes tokenizer.ggml.model "none" (llama-bench needs no text; llama-server
# asserts on it). Here its add_tokenizer_model("none") becomes a GPT-2-style tokenizer of the
# config's vocabulary: the 256 byte-level characters, then "Ġt" (one merge: "Ġ t"), then "Ġw0",
# "Ġw1", … (each id its own text: " w0", " w1", …), the last id "<|endoftext|>" (control; EOS and
# BOS, no BOS added). llama-server decodes it with its own byte-level decoder, tarfa rebuilds it
# from the GGUF's keys (pre-tokenizer "gpt-2"); the prompts are token ids, so no text is encoded.
t python3 - "$H/safetensors_to_gguf.py" "$W/src" "$W/model.gguf" <<'PY'
import json, runpy, sys
import gguf

script, src = sys.argv[1], sys.argv[2]
vocab = json.load(open(f"{src}/config.json"))["vocab_size"]
assert vocab >= 4, vocab
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):  # GPT-2's bytes_to_unicode
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
byte_char = dict(zip(bs, map(chr, cs)))
tokens = [byte_char[b] for b in range(min(256, vocab - 2))]
tokens.append("Ġt")
i = 0
while len(tokens) < vocab - 1:
    tokens.append(f"Ġw{i}")
    i += 1
tokens.append("<|endoftext|>")
assert len(tokens) == vocab == len(set(tokens)) and "Ġ" in tokens and "t" in tokens
types = [gguf.TokenType.NORMAL] * (vocab - 1) + [gguf.TokenType.CONTROL]
plain = gguf.GGUFWriter.add_tokenizer_model


def with_tokenizer(self, model):
    if model != "none":
        return plain(self, model)
    plain(self, "gpt2")
    self.add_tokenizer_pre("gpt-2")
    self.add_token_list(tokens)
    self.add_token_types(types)
    self.add_token_merges(["Ġ t"])
    self.add_eos_token_id(vocab - 1)
    self.add_bos_token_id(vocab - 1)
    self.add_add_bos_token(False)
    print(f"tokenizer: gpt2 (byte-level BPE), {vocab} tokens, 1 merge, EOS {vocab - 1}", file=sys.stderr)


gguf.GGUFWriter.add_tokenizer_model = with_tokenizer
sys.argv = [script, src, sys.argv[3]]
runpy.run_path(script, run_name="__main__")
PY
rm -rf "$W/src"
t "$B/tarfa-cuda" convert "$W/model.gguf" -o "$W/jnf" --quiet
du -sb "$W/jnf" | awk '{printf "model: %.2f GB (%.2f GiB)\n", $1/1e9, $1/2^30}'

echo "== waiting for the llama-server build"
rc=0
wait "$BUILD_PID" || rc=$?
BUILD_PID=
read -r brc secs < "$W/llama-build.done"
echo "llama-server build: rc=$brc in $secs s (in the background)"
[ "$brc" = 0 ] || { tail -30 "$O/llama-build.log"; exit 2; }
tail -3 "$O/llama-build.log"

# start_server LABEL PORT COMMAND...: start it (log in $O/LABEL-server.log), wait for /health 200.
start_server() {
  local label=$1 port=$2 s i code
  shift 2
  s=$(date +%s%N)
  "$@" > "$O/$label-server.log" 2>&1 &
  SERVER_PID=$!
  for i in $(seq 1 600); do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health" || true)
    [ "$code" = 200 ] && { echo "$label: ready in $(( ($(date +%s%N) - s) / 1000000 )) ms (GET /health 200)"; return 0; }
    kill -0 "$SERVER_PID" 2> /dev/null || { echo "$label: the server exited" >&2; tail -20 "$O/$label-server.log" >&2; exit 2; }
    sleep 0.5
  done
  echo "$label: no /health 200 in 300 s" >&2; tail -20 "$O/$label-server.log" >&2; exit 2
}
LOAD=(python3 "$R/bench/serve_load.py" --max-tokens "$N" --prompt-tokens "$PROMPT" --seed 25)  # ids 1..1000
# measure LABEL PORT [EXTRA_JSON] [report]: concurrency 1 (8 requests), then 8 (32 requests) with
# its texts compared to concurrency 1's; "yes"/"no" in $O/LABEL-identical.txt.
measure() {
  local label=$1 port=$2 extra=${3:-"{}"} report=${4:-} rc=0 url
  url=http://127.0.0.1:$port
  echo "== $label: concurrency 1, 8 requests"
  t "${LOAD[@]}" "$url" --concurrency 1 --requests 8 --extra "$extra" --label "$label-c1" --out "$O/$label-c1.json"
  echo "== $label: concurrency 8, 32 requests (texts compared with concurrency 1's)"
  t "${LOAD[@]}" "$url" --concurrency 8 --requests 32 --extra "$extra" --label "$label-c8" --out "$O/$label-c8.json" \
    --compare "$O/$label-c1.json" ${report:+--report-only} | tee "$O/$label-compare.txt" || rc=$?
  if [ "$rc" -gt 1 ]; then echo "$label: the load failed (rc=$rc)" >&2; exit 2; fi
  if grep -q "^texts identical" "$O/$label-compare.txt"; then echo yes; else echo no; fi > "$O/$label-identical.txt"
  [ "$rc" = 0 ] || claim_failed "$label: texts at concurrency 8 differ from concurrency 1's"
}

echo "== tarfa serve (alone on the GPU)"
start_server tarfa 18089 "$B/tarfa-cuda" serve "$W/jnf" --port 18089 --parallel 8 --device cuda --experts resident --prompt-cache 0
measure tarfa 18089
stop_server
echo "== llama-server (alone on the GPU)"
CTX=$(( (8 * (PROMPT + N) + 1023) / 1024 * 1024 ))
start_server llama 18090 "$W/llama-build/bin/llama-server" -m "$W/model.gguf" -ngl 99 --parallel 8 -c "$CTX" \
  --host 127.0.0.1 --port 18090
measure llama 18090 '{"cache_prompt": false}' report
stop_server

echo "== table ($PROMPT prompt tokens + $N generated a request; TTFT median; aggregate tokens/s)"
python3 - "$O" <<'PY' | tee "$O/table.md"
import json, sys
o = sys.argv[1]
rows = {}
print("| server | concurrency | requests | TTFT median | TTFT p90 | aggregate tokens/s | bytes identical across concurrency |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for server in ("tarfa", "llama"):
    same = open(f"{o}/{server}-identical.txt").read().strip()
    for c in (1, 8):
        d = json.load(open(f"{o}/{server}-c{c}.json"))
        rows[server, c] = d
        name = "tarfa serve" if server == "tarfa" else "llama-server"
        print(f"| {name} | {c} | {len(d['requests'])} | {d['ttft_median_s'] * 1e3:.1f} ms | {d['ttft_p90_s'] * 1e3:.1f} ms "
              f"| {d['aggregate_tokens_per_s']:.1f} | {same} |")
print()
for c in (1, 8):
    a, b = rows["tarfa", c], rows["llama", c]
    print(f"concurrency {c}: tarfa/llama aggregate tokens/s {a['aggregate_tokens_per_s'] / b['aggregate_tokens_per_s']:.2f}×, "
          f"TTFT median {a['ttft_median_s'] / b['ttft_median_s']:.2f}× (below 1: tarfa's first token sooner)")
PY
end_claims
