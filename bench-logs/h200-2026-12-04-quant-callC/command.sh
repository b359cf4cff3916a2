# Device call C (2026-12-04): the warp kernels of their own (tarfa_e_wmatvec, tarfa_e_wmoe_*), A/B against HEAD
# (0f7208e) on a llama-quantize Q4_K_M model, then Nsight Compute kernel times of each side.
set -u
W=/tmp/w
OUT=$OUT bash bench/gpu-quant-ab.sh $W 10 Q4_K_M 2 base:target/device/tarfa-base warp:target/device/tarfa-cuda > $OUT/ab.log 2>&1; echo "ab rc=$?" >> $OUT/ab.log
for s in base:tarfa-base warp:tarfa-cuda; do
  l=${s%%:*}; b=${s#*:}
  OUT=$OUT TARFA_BIN=target/device/$b timeout 150 bash bench/gpu-kernel-times.sh $W/jnf 400 300 > $OUT/kt-$l.log 2>&1
  cp $OUT/ncu.csv $OUT/ncu-$l.csv 2>/dev/null
done
tail -40 $OUT/ab.log; for l in base warp; do echo "== $l"; head -14 $OUT/kt-$l.log; done
