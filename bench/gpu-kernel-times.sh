#!/usr/bin/env bash
# Where the GPU's time goes in `tarfa run --device cuda` (issue 12): Nsight
# Compute times each kernel of a window of decode steps (kernels launched one by one, so ncu sees
# them; --clock-control none leaves the clocks as a plain run has them) and prints, per kernel
# name, its launches, mean duration and share of the window.
#   bash bench/gpu-kernel-times.sh JNF_DIR [SKIP] [COUNT]
# PROMPT=N times a prompt pass instead: N token ids run as matrices (issue 24), one token
# generated, the launches from SKIP (default then 0).
# Needs target/device/tarfa-cuda (carried; TARFA_BIN names another build) and ncu on the PATH or
# in /usr/local/cuda/bin.
set -uo pipefail
B=$(pwd)/target/device
J=${1:?usage: gpu-kernel-times.sh JNF_DIR [SKIP] [COUNT]}
SKIP=${2:-$([ -n "${PROMPT:-}" ] && echo 0 || echo 400)}
COUNT=${3:-300}
TOKENS=11,22,33,44,55,66,77,88
N=24
if [ -n "${PROMPT:-}" ]; then
  TOKENS=$(python3 -c "import sys; print(','.join(str(11 + (i * 7919) % 8000) for i in range(int(sys.argv[1]))))" "$PROMPT")
  N=1
fi
export PATH=$PATH:/usr/local/cuda/bin
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu here" >&2; exit 2; }
"$NCU" --clock-control none --metrics gpu__time_duration.sum --launch-skip "$SKIP" \
  --launch-count "$COUNT" --csv --page raw \
  "${TARFA_BIN:-$B/tarfa-cuda}" run "$J" --tokens "$TOKENS" -n "$N" --ignore-eos --experts resident \
  --device cuda --no-cuda-graphs > /tmp/ncu.out 2> /tmp/ncu.err || { tail -20 /tmp/ncu.err; exit 2; }
# ncu's own lines (==PROF==) and tarfa's summary share stdout with the CSV, whose lines are quoted
grep '^"' /tmp/ncu.out > "${OUT:-/tmp}/ncu.csv"
python3 - "${OUT:-/tmp}/ncu.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
unit = rows[0].get("gpu__time_duration.sum", "nsecond")  # the first row gives the units
scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6}.get(unit, 1.0)
t = collections.defaultdict(list)
for r in rows[1:]:
    v = r.get("gpu__time_duration.sum", "").replace(",", "")
    if v:
        t[r["Kernel Name"].split("(")[0]].append(float(v) * scale)
total = sum(sum(v) for v in t.values())
print(f"{len(rows) - 1} kernels timed, {total / 1e3:.1f} us in all (ns per launch below)")
for k, v in sorted(t.items(), key=lambda kv: -sum(kv[1])):
    print(f"{k:28s} {len(v):5d} launches  mean {sum(v) / len(v):9.0f} ns  {100 * sum(v) / total:5.1f} %")
PY
