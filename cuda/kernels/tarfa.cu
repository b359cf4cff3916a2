// tarfa's GPU kernels: the one translation unit, its files included in dependence order. NVRTC
// compiles it flattened (cuda/build.rs: no headers are given to NVRTC, so the build script
// inlines each #include "..." below); the CPU emulation (cuda-emu/emu/) includes this file as
// C++. Every kernel follows spec/EXACTNESS.md's canonical order; common.cuh says how.

#include "dequant.cuh"
#include "common.cuh"
#include "offload.cu"
#include "matvec.cu"
#include "norm.cu"
#include "attention.cu"
#include "mla.cu"
#include "deltanet.cu"
#include "kda.cu"
#include "mhc.cu"
#include "route.cu"
#include "moe.cu"
#include "tiled.cu"
#include "batch.cu"
