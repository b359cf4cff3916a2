#!/usr/bin/env bash
# Every cargo-fuzz target for a short time (issue 13, finding 19): part of the README's test
# command, so CI runs it. Stable toolchain with RUSTC_BOOTSTRAP=1 (cargo-fuzz's flags are nightly
# ones), AddressSanitizer on, corpora seeded from the golden vectors and the fixtures (see
# fuzz/README.md). A crash, leak, OOM or timeout fails the run and leaves the input under
# fuzz/artifacts/TARGET/.
#   TARFA_FUZZ_SECONDS (default 10): seconds per target.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="$HOME/.cargo/bin:$PATH" RUSTC_BOOTSTRAP=1
S=${TARFA_FUZZ_SECONDS:-10}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
mkdir -p corpus/gguf_reader corpus/decode_inputs corpus/chat_inputs
cargo run --quiet --release --locked --bin seed_corpus -- corpus
cp ../fixtures/gguf/*.gguf ../fixtures/gguf/hostile/*.gguf corpus/gguf_reader/
for f in ../fixtures/hf/*/config.json; do cp "$f" "corpus/decode_inputs/$(basename "$(dirname "$f")").json"; done
cp ../fixtures/reference/qwen3_moe/p0.fp32.npy corpus/decode_inputs/p0.npy
# Chat requests' messages (the template goldens' cases) and replies with tool calls.
cp seeds/chat_inputs/* corpus/chat_inputs/
for t in $(cd fuzz_targets && ls *.rs | sed "s/\.rs$//"); do
  echo "== fuzz $t ($S s)"
  log=$(mktemp)
  if ! cargo fuzz run "$t" --release -- -max_total_time="$S" -rss_limit_mb=2048 -print_final_stats=1 > "$log" 2>&1; then
    tail -40 "$log"
    echo "error: fuzz target $t found a fault (input under fuzz/artifacts/$t/)" >&2
    exit 1
  fi
  grep -E '^(Done|stat::number_of_executed_units)' "$log"
  rm -f "$log"
done
