// tarfa's GPU kernels: the canonical reduction order of spec/EXACTNESS.md on a warp, so that a
// product computed here has the bits of the same product on the CPU (decode/src/canon.rs, the
// scalar reference).
//
// Compiled at run time by NVRTC with --fmad=false (cuda_compute.rs): no multiply and add are ever
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

// Element types of a weight matrix.
#define TARFA_BF16 0
#define TARFA_F32 1

__device__ __forceinline__ float tarfa_weight(const unsigned char* w, int dtype, long long k) {
    if (dtype == TARFA_BF16) {
        unsigned int bits = ((const unsigned short*)w)[k];
        return __int_as_float(bits << 16);
    }
    return ((const float*)w)[k];
}

// The canonical dot of row `w` (n elements of `dtype`) and `x`; the result in lane 0.
__device__ float tarfa_warp_dot(const unsigned char* w, int dtype, const float* x, int n, int lane) {
    float acc = 0.0f;
    for (int k = lane; k < n; k += 32) {
        acc = __fmaf_rn(tarfa_weight(w, dtype, k), x[k], acc);
    }
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 16));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 8));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 4));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 2));
    acc = __fadd_rn(acc, __shfl_down_sync(0xffffffffu, acc, 1));
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

// h[t][r] = silu(gate[r] . x[t]) * (up[r] . x[t]) for r < rows, t < tokens: one warp per (r, t).
// gate and up are [rows, cols] of `dtype`; x is [tokens, cols]; h is [tokens, rows].
extern "C" __global__ void tarfa_swiglu_gate(const unsigned char* gate, const unsigned char* up,
                                             int dtype, int rows, int cols, int tokens,
                                             const float* x, float* h) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= (long long)rows * tokens) {
        return;  // whole warps only: blockDim is a multiple of 32
    }
    int r = (int)(warp % rows);
    int t = (int)(warp / rows);
    long long esz = dtype == TARFA_BF16 ? 2 : 4;
    const float* xt = x + (long long)t * cols;
    float g = tarfa_warp_dot(gate + (long long)r * cols * esz, dtype, xt, cols, lane);
    float u = tarfa_warp_dot(up + (long long)r * cols * esz, dtype, xt, cols, lane);
    if (lane == 0) {
        h[(long long)t * rows + r] = tarfa_silu_mul(g, u);
    }
}

// y[t][r] = w[r] . x[t]: one warp per (r, t). w is [rows, cols] of `dtype`.
extern "C" __global__ void tarfa_matvec(const unsigned char* w, int dtype, int rows, int cols,
                                        int tokens, const float* x, float* y) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= (long long)rows * tokens) {
        return;
    }
    int r = (int)(warp % rows);
    int t = (int)(warp / rows);
    long long esz = dtype == TARFA_BF16 ? 2 : 4;
    float v = tarfa_warp_dot(w + (long long)r * cols * esz, dtype, x + (long long)t * cols, cols, lane);
    if (lane == 0) {
        y[(long long)t * rows + r] = v;
    }
}

// The expert `e` whose tokens hold row `t` of the batch: tok_start[e] <= t < tok_start[e + 1].
__device__ __forceinline__ int tarfa_expert_of(const int* tok_start, int n_experts, int t) {
    int lo = 0, hi = n_experts - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tok_start[mid] <= t) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// Several experts of one shape at once: expert e's tokens are rows tok_start[e] ..
// tok_start[e+1] of x ([total, cols]); h[t][r] = silu(gate_e[r] . x[t]) * (up_e[r] . x[t]).
// gate_ptrs / up_ptrs hold each expert's matrix address. One warp per (row, token), each output
// exactly the one-expert kernel's.
extern "C" __global__ void tarfa_swiglu_gate_many(const unsigned long long* gate_ptrs,
                                                  const unsigned long long* up_ptrs,
                                                  const int* tok_start, int n_experts, int dtype,
                                                  int rows, int cols, int total,
                                                  const float* x, float* h) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= (long long)rows * total) {
        return;
    }
    int r = (int)(warp % rows);
    int t = (int)(warp / rows);
    int e = tarfa_expert_of(tok_start, n_experts, t);
    long long esz = dtype == TARFA_BF16 ? 2 : 4;
    const float* xt = x + (long long)t * cols;
    const unsigned char* g = (const unsigned char*)gate_ptrs[e] + (long long)r * cols * esz;
    const unsigned char* u = (const unsigned char*)up_ptrs[e] + (long long)r * cols * esz;
    float gv = tarfa_warp_dot(g, dtype, xt, cols, lane);
    float uv = tarfa_warp_dot(u, dtype, xt, cols, lane);
    if (lane == 0) {
        h[(long long)t * rows + r] = tarfa_silu_mul(gv, uv);
    }
}

// y[t][r] = w_e[r] . x[t] for the expert e owning row t (as above).
extern "C" __global__ void tarfa_matvec_many(const unsigned long long* w_ptrs, const int* tok_start,
                                             int n_experts, int dtype, int rows, int cols,
                                             int total, const float* x, float* y) {
    long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x % 32;
    if (warp >= (long long)rows * total) {
        return;
    }
    int r = (int)(warp % rows);
    int t = (int)(warp / rows);
    int e = tarfa_expert_of(tok_start, n_experts, t);
    long long esz = dtype == TARFA_BF16 ? 2 : 4;
    const unsigned char* w = (const unsigned char*)w_ptrs[e] + (long long)r * cols * esz;
    float v = tarfa_warp_dot(w, dtype, x + (long long)t * cols, cols, lane);
    if (lane == 0) {
        y[(long long)t * rows + r] = v;
    }
}
