#!/usr/bin/env bash
# tarfa against llama.cpp itself on the GGUF fixtures written in llama.cpp's naming
# (fixtures/gguf/from_hf/, by fixtures/gguf/make_from_hf.py): each converted and run greedy by
# tarfa, and run greedy by llama.cpp's llama-completion (--temp 0) on the same file and prompt;
# the generated text must be the same (tarfa prints the generated text alone; llama-completion the
# prompt and then it, on its first line: texts that print no newline compare whole). Tiny random models: their logits' top two are far apart
# on most steps, so the same text says both engines read every key/value and tensor alike.
#   bash bench/llama/greedy-agreement.sh LLAMA_BIN_DIR [TARFA]
# LLAMA_BIN_DIR: a llama.cpp build's bin/ with llama-completion (build-llama-bench.sh's
# cmake, target llama-completion); TARFA: a release build (default target/release/tarfa).
# The fixtures llama.cpp cannot load (said in make_from_hf.py) are left out: qwen3_moe_b (a
# dense layer and attention biases qwen3moe lacks) and the "bytes unchanged" variants that keep
# 1-D tensors and convolutions in BF16 (llama.cpp's converter writes them F32 and its CPU
# kernels assert it). Exits 1 when any text differs.
set -uo pipefail
source "$(dirname "$0")/../claims.sh"
L=${1:?usage: greedy-agreement.sh LLAMA_BIN_DIR [TARFA]}
T=${2:-target/release/tarfa}
P="The quick brown fox jumps over"
N=16
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
for f in glm5_next.f32-small qwen3_next_b qwen3_next_b.ssm-in qwen3_5_moe_text mimo_v2_flash_b \
         deepseek_v3.f32-small glm4_moe.f32-small; do
  g=fixtures/gguf/from_hf/$f.gguf
  rm -rf "$D/m"
  "$T" convert "$g" -o "$D/m" --quiet > /dev/null 2>&1 || { claim_failed "$f: tarfa convert"; continue; }
  tarfa=$("$T" run "$D/m" -p "$P" -n $N --ignore-eos 2> /dev/null) || { claim_failed "$f: tarfa run"; continue; }
  # llama-completion echoes the prompt, then the generated text, on its first line.
  llama=$("$L/llama-completion" -m "$g" -p "$P" -n $N --temp 0 --ignore-eos -no-cnv -t "$(nproc)" 2> /dev/null | head -1)
  if [ "$P$tarfa" = "$llama" ]; then
    echo "$f: same greedy text ($N tokens): [$tarfa]"
  else
    claim_failed "$f: tarfa [$tarfa], llama.cpp [${llama#"$P"}]"
  fi
done
end_claims
