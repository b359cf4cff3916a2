// tarfa's GPU kernels: the canonical reduction order of spec/EXACTNESS.md on a warp, so that a
// product computed here has the bits of the same product on the CPU (decode/src/canon.rs, the
// scalar reference).
//
// Compiled at run time by NVRTC with --fmad=false (nvrtc.rs): no multiply and add are ever
// contracted behind our back; every fused multiply-add below is written as __fmaf_rn, and every
// other operation carries its rounding (_rn) explicitly.
//
// The order: a dot product over n elements is one warp. Lane l takes elements l, l+32, l+64, ...
// in increasing order, acc = fma(w_k, x_k, acc) from +0.0; then the lanes fold by the fixed tree
// lane i += lane i+16 (i < 16), then +8, +4, +2, +1 (__shfl_down_sync gives lane i the value of
// lane i+s, so lane i adds exactly l[i] + l[i+s], as canon::fold_lanes does). Lane 0 holds it.
//
// The constants of tarfa's exp are canon.rs's, as bit patterns (checked by a decode test that
// reads this file).

#define TARFA_LOG2E 0x3fb8aa3b
#define TARFA_LN2_HI 0x3f317200
#define TARFA_LN2_LO 0x35bfbe8e
#define TARFA_P7 0x39500d01
#define TARFA_P6 0x3ab60b61
#define TARFA_P5 0x3c088889
#define TARFA_P4 0x3d2aaaab
#define TARFA_P3 0x3e2aaaab
#define TARFA_P2 0x3f000000

// The fold of a warp's 32 lane partials by the fixed tree (canon::fold_lanes): lane i adds lane
// i+16, then +8, +4, +2, +1. The result is in lane 0. Every lane of the warp must call it.
__device__ __forceinline__ float tarfa_warp_fold(float acc) {
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 8));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 4));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 2));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 1));
    return acc;
}

// The canonical dot of row `w` (n elements of `dtype`) and `x`; the result in lane 0.
__device__ float tarfa_warp_dot(const unsigned char* w, int dtype, const float* x, int n, int lane) {
    float acc = 0.0f;
    for (int k = lane; k < n; k += 32) {
        acc = __fmaf_rn(tarfa_weight(w, dtype, k), x[k], acc);
    }
    acc = tarfa_warp_fold(acc);
    return acc;
}

__device__ __forceinline__ float tarfa_pow2i(int k) {
    return __int_as_float((k + 127) << 23);
}

// canon::exp: clamp, n = round_ties_even(x * log2 e), Cody-Waite reduction in two fused steps,
// degree-7 Horner with fused multiply-adds, two exact powers of two.
__device__ float tarfa_exp(float x) {
    if (isnan(x)) {
        return x;
    }
    x = fminf(fmaxf(x, -104.0f), 89.0f);
    float n = rintf(__fmul_rn(x, __int_as_float(TARFA_LOG2E)));
    float r = __fmaf_rn(-n, __int_as_float(TARFA_LN2_HI), x);
    r = __fmaf_rn(-n, __int_as_float(TARFA_LN2_LO), r);
    float p = __int_as_float(TARFA_P7);
    p = __fmaf_rn(p, r, __int_as_float(TARFA_P6));
    p = __fmaf_rn(p, r, __int_as_float(TARFA_P5));
    p = __fmaf_rn(p, r, __int_as_float(TARFA_P4));
    p = __fmaf_rn(p, r, __int_as_float(TARFA_P3));
    p = __fmaf_rn(p, r, __int_as_float(TARFA_P2));
    p = __fmaf_rn(p, r, 1.0f);
    p = __fmaf_rn(p, r, 1.0f);
    int ni = (int)n;
    int k1 = ni >> 1;
    return __fmul_rn(__fmul_rn(p, tarfa_pow2i(k1)), tarfa_pow2i(ni - k1));
}

// canon::silu: g / (1 + exp(-g)) (torch's formula).
__device__ __forceinline__ float tarfa_silu(float g) {
    return __fdiv_rn(g, __fadd_rn(1.0f, tarfa_exp(-g)));
}

// A clamped SwiGLU's inputs (kernels::MatJob::clamped; GLM-5.3-Flash): with limit > 0 the gate
// clamped above at limit and the up to [-limit, limit] (a NaN stays NaN), else as they are.
__device__ __forceinline__ void tarfa_swiglu_clamp(float& g, float& u, float limit) {
    if (limit > 0.0f) {
        g = g > limit ? limit : g;
        u = u < -limit ? -limit : (u > limit ? limit : u);
    }
}

// silu(g) * u (canon::silu, then one product).
__device__ __forceinline__ float tarfa_silu_mul(float g, float u) {
    return __fmul_rn(tarfa_silu(g), u);
}

// canon::sigmoid: 1 / (1 + tarfa exp(−x)).
__device__ __forceinline__ float tarfa_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, tarfa_exp(-x)));
}

// ================================================================================================
// The resident decoder (device.rs): every step of a token's forward pass on the device, the
// activations never leaving it, each operation the bits of the CPU's (decode/src/canon.rs and
// decode/src/blocks.rs). Positions and the token are read from `params` ([token, position]) so
// that one sequence of launches serves every step.
// ================================================================================================

#define TARFA_FULL 0xffffffffu

// Dynamic shared memory (a CPU emulation of these kernels, cuda-emu/, defines it its own way).
#ifndef TARFA_DYNAMIC_SHARED
#define TARFA_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

// Programmatic dependent launch (sm_90 and later; the host asks for it per launch): a kernel may
// start while the one before it in the stream is still running. Every engine kernel calls
// tarfa_grid_enter() before it reads anything an earlier launch wrote (or writes anything an
// earlier launch reads): it waits until the previous launch has completed and its memory is
// visible, then lets the next launch start. Before that point a kernel touches only what no
// launch writes: its weights and its parameters. So at most one launch runs ahead, and only to
// load weights (a tiled product's first stages, an RMSNorm's weights); the bits are the same
// whether the launches overlap or not (without the host's request, or before sm_90, the wait
// returns at once and the launches are serial).
#if !defined(TARFA_GRID_DEP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void tarfa_grid_enter() {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
#elif !defined(TARFA_GRID_DEP)
__device__ __forceinline__ void tarfa_grid_enter() {}
#endif

// p = softmax(z) over n values on one warp (canon's softmax): the max, e_i = tarfa exp(z_i − max),
// their canonical sum (lane partials folded by the tree), each e_i divided by it. p may be z.
__device__ void tarfa_warp_softmax(const float* z, float* p, int n, int lane) {
    float m = __int_as_float(0xff800000);  // -inf
    for (int i = lane; i < n; i += 32) m = fmaxf(m, z[i]);
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(TARFA_FULL, m, o));
    float acc = 0.0f;
    for (int i = lane; i < n; i += 32) {
        float e = tarfa_exp(__fsub_rn(z[i], m));
        p[i] = e;
        acc = __fadd_rn(acc, e);
    }
    float s = __shfl_sync(TARFA_FULL, tarfa_warp_fold(acc), 0);
    for (int i = lane; i < n; i += 32) p[i] = __fdiv_rn(p[i], s);
}
