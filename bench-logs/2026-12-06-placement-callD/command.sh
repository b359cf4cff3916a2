# call D: the whole model in VRAM, this build against 4721a1c (tg32-shaped, alternating rounds), then
# the CPU-experts placement with per-part CUDA graphs against --no-cuda-graphs (alternating rounds).
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=target/device W=/tmp/w
nvidia-smi --query-gpu=name --format=csv,noheader
$B/synth_decode_checkpoint $W/src 10 8 > /dev/null && $B/tarfa-cuda convert $W/src -o $W/jnf --quiet || exit 2
rm -rf $W/src
for r in 1 2 3; do for b in tarfa-cuda tarfa-base; do
  echo "== round $r $b tg32-shaped"; $B/$b bench-decode $W/jnf --modes gpu --prompt-tokens 1 --tokens 32 --runs 21 2>&1 | grep -E "\| gpu \||rror"
done; done
P="--tokens 11,22,33,44,55,66,77,88 -n 64 --experts resident --device cuda --vram-gib 4 --json"
for r in 1 2 3 4; do for g in "" "--no-cuda-graphs"; do
  echo "== round $r placed ${g:-graphs}"
  $B/tarfa-cuda run $W/jnf $P $g 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print('decode', d['decode']['tokens_per_s'], 'graph_steps', d['gpu']['graph_steps'], 'cpu_moe_layers', d['gpu']['cpu_moe_layers'])"
done; done
