#!/usr/bin/env bash
# Why a kernel of `tarfa run --device cuda` takes its time (issue 12): Nsight Compute's speed of
# light, memory, occupancy and warp-stall sections for a few launches of the kernels whose names
# match REGEX (default: the tiled products), kernels launched one by one.
#   bash bench/gpu-kernel-detail.sh JNF_DIR [REGEX] [SKIP] [COUNT]
# Needs target/device/tarfa-cuda (carried; TARFA_BIN names another build) and ncu on the PATH or
# in /usr/local/cuda/bin.
set -uo pipefail
B=$(pwd)/target/device
J=${1:?usage: gpu-kernel-detail.sh JNF_DIR [REGEX] [SKIP] [COUNT]}
RE=${2:-tarfa_e_t}
SKIP=${3:-40}
COUNT=${4:-5}
export PATH=$PATH:/usr/local/cuda/bin
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu here" >&2; exit 2; }
"$NCU" --clock-control none -k "regex:$RE" --launch-skip "$SKIP" --launch-count "$COUNT" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section LaunchStats \
  "${TARFA_BIN:-$B/tarfa-cuda}" run "$J" --tokens 11,22,33,44 -n 8 --ignore-eos --experts resident --device cuda \
  --no-cuda-graphs 2>&1 | grep -E "tarfa_e_|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Stall|stall|One or More|Grid Size|Shared Memory Configuration Size|Dynamic Shared" | head -${LINES_MAX:-200}
