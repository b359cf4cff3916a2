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

// Element types of a weight (GpuDtype::code). BF16 and F32 are plain arrays; F16 too; the others
// are GGUF's blocks (ggml's layouts, a row whole blocks), each element dequantised as gguf-py
// 0.19 computes it in numpy float32 (decode/src/quant.rs, the CPU's reference): every product
// and difference one rounded operation, in its order, so an element is the CPU's bits.
#define TARFA_BF16 0
#define TARFA_F32 1
#define TARFA_F16 2
#define TARFA_Q8_0 3
#define TARFA_Q4_0 4
#define TARFA_Q4_K 5
#define TARFA_Q5_K 6
#define TARFA_Q6_K 7
#define TARFA_Q4_1 8
#define TARFA_Q5_0 9
#define TARFA_Q5_1 10

// Bytes of a row of `cols` elements (cols whole blocks for the block types; the host checks).
__device__ __forceinline__ long long tarfa_row_bytes(int dtype, long long cols) {
    switch (dtype) {
        case TARFA_BF16:
        case TARFA_F16: return cols * 2;
        case TARFA_F32: return cols * 4;
        case TARFA_Q8_0: return cols / 32 * 34;
        case TARFA_Q4_0: return cols / 32 * 18;
        case TARFA_Q4_K: return cols / 256 * 144;
        case TARFA_Q5_K: return cols / 256 * 176;
        case TARFA_Q6_K: return cols / 256 * 210;
        case TARFA_Q4_1: return cols / 32 * 20;
        case TARFA_Q5_0: return cols / 32 * 22;
        default: return cols / 32 * 24;  // TARFA_Q5_1
    }
}

// IEEE half to float, exact (weights::f16_to_f32): a NaN keeps its payload, unquieted; a finite
// half's exponent and mantissa moved into place make 2^-112 times its magnitude, scaled by 2^112.
__device__ __forceinline__ float tarfa_f16(const unsigned char* p) {
    unsigned int h = (unsigned int)p[0] | ((unsigned int)p[1] << 8);
    unsigned int sign = (h & 0x8000u) << 16;
    unsigned int rest = h & 0x7fffu;
    unsigned int bits;
    if (rest >= 0x7c00u) {
        bits = 0x7f800000u | ((rest & 0x3ffu) << 13);
    } else {
        bits = __float_as_int(__fmul_rn(__int_as_float(rest << 13), __int_as_float((127 + 112) << 23)));
    }
    return __int_as_float(sign | bits);
}

// A Q4_K/Q5_K block's 6-bit scale and minimum of group g < 8 (scale_min_k4 of quant.rs).
__device__ __forceinline__ void tarfa_scale_min_k4(const unsigned char* s, int g, int* sc, int* mn) {
    if (g < 4) {
        *sc = s[g] & 0x3f;
        *mn = s[g + 4] & 0x3f;
    } else {
        *sc = (s[g + 4] & 0x0f) | ((s[g - 4] >> 2) & 0x30);
        *mn = (s[g + 4] >> 4) | ((s[g] >> 2) & 0x30);
    }
}

// A block type's run of `n` consecutive elements k..k+n-1 of a row (k and n within one of the
// block's groups: 32 elements, 16 for Q6_K), each as quant.rs dequantises it; the group's scale
// found once.
__device__ __forceinline__ void tarfa_dequant_run(const unsigned char* row, int dtype, long long k,
                                                  int n, float* w) {
    if (dtype == TARFA_Q8_0) {
        const unsigned char* b = row + k / 32 * 34;
        float d = tarfa_f16(b);
        int l = (int)(k % 32);
        for (int j = 0; j < n; ++j) w[j] = __fmul_rn((float)(signed char)b[2 + l + j], d);
    } else if (dtype == TARFA_Q4_0) {
        const unsigned char* b = row + k / 32 * 18;
        float d = tarfa_f16(b);
        int l = (int)(k % 32);
        for (int j = 0; j < n; ++j) {
            int e = l + j;
            int q = e < 16 ? (b[2 + e] & 0x0f) : (b[2 + e - 16] >> 4);
            w[j] = __fmul_rn(d, (float)(q - 8));
        }
    } else if (dtype == TARFA_Q4_1) {
        const unsigned char* b = row + k / 32 * 20;
        float d = tarfa_f16(b), m = tarfa_f16(b + 2);
        int l = (int)(k % 32);
        for (int j = 0; j < n; ++j) {
            int e = l + j;
            int q = e < 16 ? (b[4 + e] & 0x0f) : (b[4 + e - 16] >> 4);
            w[j] = __fadd_rn(__fmul_rn(d, (float)q), m);
        }
    } else if (dtype == TARFA_Q5_0 || dtype == TARFA_Q5_1) {
        // Q5_0: d, qh (u32), qs[16]; Q5_1: d, m, qh, qs. Element e's fifth bit is bit e of qh.
        int one = dtype == TARFA_Q5_1;
        const unsigned char* b = row + k / 32 * (one ? 24 : 22);
        float d = tarfa_f16(b), m = one ? tarfa_f16(b + 2) : 0.0f;
        const unsigned char* qhp = b + (one ? 4 : 2);
        unsigned int qh = (unsigned int)qhp[0] | ((unsigned int)qhp[1] << 8) |
                          ((unsigned int)qhp[2] << 16) | ((unsigned int)qhp[3] << 24);
        const unsigned char* qs = qhp + 4;
        int l = (int)(k % 32);
        for (int j = 0; j < n; ++j) {
            int e = l + j;
            int q = (e < 16 ? (qs[e] & 0x0f) : (qs[e - 16] >> 4)) | (int)(((qh >> e) & 1u) << 4);
            w[j] = one ? __fadd_rn(__fmul_rn(d, (float)q), m) : __fmul_rn(d, (float)(q - 16));
        }
    } else if (dtype == TARFA_Q4_K || dtype == TARFA_Q5_K) {
        int q5 = dtype == TARFA_Q5_K;
        const unsigned char* b = row + k / 256 * (q5 ? 176 : 144);
        int e = (int)(k % 256);
        int g = e / 32, l = e % 32;
        int sc, mn;
        tarfa_scale_min_k4(b + 4, g, &sc, &mn);
        float dg = __fmul_rn(tarfa_f16(b), (float)sc);
        float mg = __fmul_rn(tarfa_f16(b + 2), (float)mn);
        const unsigned char* qs = b + (q5 ? 48 : 16) + 32 * (g / 2);
        int shift = 4 * (g % 2);
        for (int j = 0; j < n; ++j) {
            int q = (qs[l + j] >> shift) & 0x0f;
            if (q5) q |= ((b[16 + l + j] >> g) & 1) << 4;
            w[j] = __fsub_rn(__fmul_rn(dg, (float)q), mg);
        }
    } else {  // TARFA_Q6_K: element 128i + 32t + 16h + m (the host passes no other type)
        const unsigned char* b = row + k / 256 * 210;
        int e = (int)(k % 256);
        int i = e / 128, t = (e % 128) / 32, hh = (e % 32) / 16, m = e % 16;
        float dg = __fmul_rn(tarfa_f16(b + 208), (float)(signed char)b[192 + 8 * i + 2 * t + hh]);
        const unsigned char* ql = b + 64 * i + 32 * (t % 2) + 16 * hh;
        const unsigned char* qh = b + 128 + 32 * i + 16 * hh;
        for (int j = 0; j < n; ++j) {
            int lo = (ql[m + j] >> (4 * (t / 2))) & 0x0f;
            int hi = (qh[m + j] >> (2 * t)) & 0x03;
            w[j] = __fmul_rn(dg, (float)((lo | (hi << 4)) - 32));
        }
    }
}

// Element k of a row (or vector) of `dtype`.
__device__ __forceinline__ float tarfa_weight(const unsigned char* w, int dtype, long long k) {
    if (dtype == TARFA_BF16) {
        unsigned int bits = ((const unsigned short*)w)[k];
        return __int_as_float(bits << 16);
    }
    if (dtype == TARFA_F32) return ((const float*)w)[k];
    if (dtype == TARFA_F16) return tarfa_f16(w + 2 * k);
    float v;
    tarfa_dequant_run(w, dtype, k, 1, &v);
    return v;
}

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

// silu(g) * u with silu(g) = g / (1 + exp(-g)) (torch's formula, canon::silu).
__device__ __forceinline__ float tarfa_silu_mul(float g, float u) {
    float s = __fdiv_rn(g, __fadd_rn(1.0f, tarfa_exp(-g)));
    return __fmul_rn(s, u);
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
