# Device call D (2026-12-04): why the warp kernels are no faster: Nsight Compute's sections for
# the warp build's expert and matvec kernels and the base's quad ones, on the Q4_K_M model.
set -u
W=/tmp/w
OUT=$OUT bash bench/gpu-quant-ab.sh $W 10 Q4_K_M 0 warp:target/device/tarfa-cuda > $OUT/ab.log 2>&1; echo "ab rc=$?" >> $OUT/ab.log
tail -3 $OUT/ab.log
LINES_MAX=400 timeout 200 bash bench/gpu-kernel-detail.sh $W/jnf 'tarfa_e_w' 30 4 > $OUT/detail-warp.log 2>&1
TARFA_BIN=target/device/tarfa-base LINES_MAX=400 timeout 120 bash bench/gpu-kernel-detail.sh $W/jnf 'tarfa_e_moe|tarfa_e_matvec' 30 4 > $OUT/detail-base.log 2>&1
cat $OUT/detail-warp.log | head -150; echo ===== base; head -120 $OUT/detail-base.log
