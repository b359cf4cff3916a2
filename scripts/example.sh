#!/usr/bin/env bash
# The bundled example of README.md: convert the tiny Qwen3-MoE checkpoint in fixtures/hf (made by
# transformers' save_pretrained) into a JNF model directory, inspect it, verify every byte against
# the source, then run it: greedy text from a prompt, experts streamed from disk and checked as
# they land, and the generated ids checked against the tokens transformers generated from the same
# checkpoint and prompt (fixtures/reference/qwen3_moe/reference.json): "matches transformers'
# greedy tokens: yes", or "no" and exit 1. Rerunning it shows the resume path: every layer is
# already present and checked, so nothing is rewritten.
#
# The binary is the one cargo reports building (so CARGO_TARGET_DIR and a build.target-dir in a
# cargo config are honoured), and the model directory is example/qwen3_moe under cargo's target
# directory. python3 (standard library only) reads cargo's and tarfa's JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
for tool in cargo python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "error: $tool not found; the example needs it (cargo: rustup; python3: your system's package)" >&2
    exit 2
  fi
done

reference=fixtures/reference/qwen3_moe/reference.json
# The prompt and the number of tokens are the reference's, so that the check compares like with like.
read -r n_tokens prompt < <(python3 -c '
import json, sys
ref = json.load(open(sys.argv[1]))
print(ref["n_new_tokens"], ref["prompts"][0]["text"])
' "$reference")

echo "== cargo build --release (the first build takes a few minutes; cargo shows its progress)" >&2
# --message-format=json puts one JSON message per line on stdout (diagnostics rendered on
# stderr, progress on stderr as usual); the tarfa binary's artifact message names its path.
tarfa=$(cargo build --release --locked --bin tarfa --message-format=json-render-diagnostics |
  python3 -c '
import json, sys
exe = None
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "tarfa" \
            and "bin" in m["target"].get("kind", []) and m.get("executable"):
        exe = m["executable"]
if exe is None:
    sys.exit("error: cargo reported no tarfa executable")
print(exe)
')
target_dir=$(cargo metadata --format-version 1 --no-deps --locked |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
out="$target_dir/example/qwen3_moe"
echo "== using $tarfa; the model directory is $out" >&2

"$tarfa" convert fixtures/hf/qwen3_moe -o "$out"
"$tarfa" inspect "$out"
"$tarfa" verify "$out" --source fixtures/hf/qwen3_moe

echo
echo "The fixture has random weights and a vocabulary of 128 tokens, so its text looks like noise"
echo "(repeating fragments such as 'zWZ&'): what proves the run is that its token ids are the"
echo "ones transformers' greedy generate() gives for this checkpoint and prompt, checked below."
echo "== tarfa run $out --prompt \"$prompt\" -n $n_tokens"
"$tarfa" run "$out" --prompt "$prompt" -n "$n_tokens"

# The same run as JSON, its generated ids compared with the reference's.
run_json=$("$tarfa" run "$out" --prompt "$prompt" -n "$n_tokens" --json)
python3 -c '
import json, sys
ref = json.load(open(sys.argv[1]))
run = json.loads(sys.argv[2])
prompt = next(p for p in ref["prompts"] if p["text"] == sys.argv[3])
want, got = prompt["fp32_tokens"], run["tokens"]
same = got == want
print("matches transformers\x27 greedy tokens:", "yes" if same else "no")
if not same:
    print(f"  tarfa:        {got}\n  transformers: {want} ({sys.argv[1]})", file=sys.stderr)
    sys.exit(1)
' "$reference" "$run_json" "$prompt"
