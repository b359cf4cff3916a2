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

// ================================================================================================
// The resident decoder (cuda_engine.rs): every step of a token's forward pass on the device, the
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

// Eight consecutive weights k..k+7 of a row, one at a time (any alignment, any type).
__device__ __forceinline__ void tarfa_weights8(const unsigned char* row, int dtype, int k, float* w) {
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = tarfa_weight(row, dtype, k + j);
}

// The eight bf16 weights of one 16-byte load, widened (exact).
__device__ __forceinline__ void tarfa_unpack_bf16x8(uint4 v, float* w) {
    unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        w[2 * j] = __int_as_float(u[j] << 16);
        w[2 * j + 1] = __int_as_float(u[j] & 0xffff0000u);
    }
}

// acc[j] = fma(w[j], xv[j], acc[j]) for j = 0..7: one step of each of the thread's eight
// logical lanes.
__device__ __forceinline__ void tarfa_fma8(const float* w, const float* xv, float* acc) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fmaf_rn(w[j], xv[j], acc[j]);
}

// x[k .. k+7]: two 16-byte loads when `vec`, else one element at a time.
__device__ __forceinline__ void tarfa_x8(const float* x, int k, int vec, float* xv) {
    if (vec) {
        float4 a = *(const float4*)(x + k);
        float4 b = *(const float4*)(x + k + 4);
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) xv[j] = x[k + j];
    }
}

// How many 32-element chunks a thread loads before it multiplies: the loads of one batch (the
// weights and x) are all in flight together (a matrix-vector product is bound by memory latency,
// not arithmetic). The multiply-adds still run chunk by chunk in increasing k, so the batch
// changes no bit.
#define TARFA_BATCH 8

// The canonical accumulation of R rows with the same x, by the four threads sub = 0..3 of a
// quad: thread `sub` holds the logical lanes 8·sub .. 8·sub+7 of each row (element k goes to
// logical lane k mod 32, and each lane takes its elements in increasing k, one fused multiply-add
// each, from +0). `vec`: every row and x are 16-byte aligned at each chunk (checked on the host),
// so a bf16 chunk is one 16-byte load and an f32 chunk two.
//
// B: chunks per batch. XB: x of a batch loaded with its weights (x in global memory); else x is
// read chunk by chunk (x staged in shared memory, so a deeper batch of weights fits in registers).
template <int R, int B, bool XB>
__device__ __forceinline__ void tarfa_quad_acc(const unsigned char* const* rows, int dtype,
                                               const float* x, int cols, int sub, int vec,
                                               float (*acc)[8]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][j] = 0.0f;
    int full = cols / 32;
    int c = 0;
    if (vec && dtype == TARFA_BF16) {
        for (; c + B <= full; c += B) {
            uint4 wv[R][B];
            float xv[XB ? B : 1][8];
#pragma unroll
            for (int b = 0; b < B; ++b)
#pragma unroll
                for (int r = 0; r < R; ++r)
                    wv[r][b] = *(const uint4*)(rows[r] + (long long)((c + b) * 32 + sub * 8) * 2);
            if (XB) {
#pragma unroll
                for (int b = 0; b < B; ++b) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[XB ? b : 0]);
            }
#pragma unroll
            for (int b = 0; b < B; ++b) {
                if (!XB) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[0]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float w[8];
                    tarfa_unpack_bf16x8(wv[r][b], w);
                    tarfa_fma8(w, xv[XB ? b : 0], acc[r]);
                }
            }
        }
    } else if (vec) {
        for (; c + B / 2 <= full; c += B / 2) {
            float4 wv[R][B / 2][2];
            float xv[XB ? B / 2 : 1][8];
#pragma unroll
            for (int b = 0; b < B / 2; ++b)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float4* p = (const float4*)(rows[r] + (long long)((c + b) * 32 + sub * 8) * 4);
                    wv[r][b][0] = p[0];
                    wv[r][b][1] = p[1];
                }
            if (XB) {
#pragma unroll
                for (int b = 0; b < B / 2; ++b) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[XB ? b : 0]);
            }
#pragma unroll
            for (int b = 0; b < B / 2; ++b) {
                if (!XB) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[0]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float4 lo = wv[r][b][0], hi = wv[r][b][1];
                    float w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                    tarfa_fma8(w, xv[XB ? b : 0], acc[r]);
                }
            }
        }
    }
    // What the batches left (and every chunk when not `vec`): one chunk at a time.
    for (; c < full; ++c) {
        int k = c * 32 + sub * 8;
        float xv[8];
        tarfa_x8(x, k, vec, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float w[8];
            if (vec && dtype == TARFA_BF16) {
                tarfa_unpack_bf16x8(*(const uint4*)(rows[r] + (long long)k * 2), w);
            } else {
                tarfa_weights8(rows[r], dtype, k, w);
            }
            tarfa_fma8(w, xv, acc[r]);
        }
    }
    int tail = full * 32 + sub * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (tail + j < cols) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                acc[r][j] = __fmaf_rn(tarfa_weight(rows[r], dtype, tail + j), x[tail + j], acc[r][j]);
            }
        }
    }
}

// The fold of a quad's 32 logical lanes (canon::fold_lanes): +16 is the quad partner two threads
// on, +8 the next thread, +4, +2, +1 within the thread's own registers. The result is in the
// quad's thread 0. Every thread of the warp must call it (shuffles).
__device__ __forceinline__ float tarfa_quad_fold(float* acc) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], __shfl_down_sync(TARFA_FULL, acc[j], 2));
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], __shfl_down_sync(TARFA_FULL, acc[j], 1));
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 4]);
    acc[0] = __fadd_rn(acc[0], acc[2]);
    acc[1] = __fadd_rn(acc[1], acc[3]);
    return __fadd_rn(acc[0], acc[1]);
}

// The canonical dot of one row with x on a quad; the result in the quad's thread 0.
__device__ float tarfa_quad_dot(const unsigned char* row, int dtype, const float* x, int cols,
                                int sub, int vec) {
    float acc[1][8];
    tarfa_quad_acc<1, TARFA_BATCH, true>(&row, dtype, x, cols, sub, vec, acc);
    return tarfa_quad_fold(acc[0]);
}

// One matrix-vector product of a tarfa_e_matvec launch: y = W x (+ bias), stored or added to y.
struct TarfaMatJob {
    const unsigned char* w;
    const float* x;
    float* y;
    const unsigned char* bias;  // null: none
    int rows;
    int cols;
    int dtype;
    int bias_dtype;
    int accumulate;  // y[r] = y[r] + (W x + b)[r], as a residual connection adds
    int vec;
};

#define TARFA_MAX_JOBS 4

struct TarfaMatJobs {
    TarfaMatJob job[TARFA_MAX_JOBS];
    int row_start[TARFA_MAX_JOBS + 1];  // job i's rows are quads row_start[i] .. row_start[i+1]
    int n;
    // > 0: every job's x is job[0].x, `vec`, and its first `stage` floats (every job's cols) are
    // copied to dynamic shared memory first, then read from there (deeper batches of weights).
    int stage;
};

// The job owning row q of a launch and the row's number in it (*r), chosen by value (no dynamic
// index into the parameter block).
__device__ __forceinline__ TarfaMatJob tarfa_job_of(const TarfaMatJobs& jobs, int q, int* r) {
    TarfaMatJob j = jobs.job[0];
    *r = q;
    if (jobs.n > 1 && q >= jobs.row_start[1]) { j = jobs.job[1]; *r = q - jobs.row_start[1]; }
    if (jobs.n > 2 && q >= jobs.row_start[2]) { j = jobs.job[2]; *r = q - jobs.row_start[2]; }
    if (jobs.n > 3 && q >= jobs.row_start[3]) { j = jobs.job[3]; *r = q - jobs.row_start[3]; }
    return j;
}

// Chunks per batch when x is in shared memory (its registers free for weights).
#define TARFA_BATCH_STAGED 16

// Up to four products of one input in one launch (q, k and v; o; the router; lm_head): one quad
// per output row. A row's value: the canonical dot, then + bias, then + the old y (accumulate).
extern "C" __global__ void tarfa_e_matvec(TarfaMatJobs jobs) {
    TARFA_DYNAMIC_SHARED(float, xs);
    tarfa_grid_enter();
    if (jobs.stage > 0) {
        const float* x = jobs.job[0].x;
        for (int i = threadIdx.x; i < jobs.stage; i += blockDim.x) xs[i] = x[i];
        __syncthreads();
    }
    long long quad = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 4;
    int sub = threadIdx.x & 3;
    int total = jobs.row_start[jobs.n];
    bool live = quad < total;
    int q = live ? (int)quad : total - 1;  // dead quads compute a real row for the shuffles
    int r;
    TarfaMatJob j = tarfa_job_of(jobs, q, &r);
    long long esz = j.dtype == TARFA_BF16 ? 2 : 4;
    const unsigned char* row = j.w + (long long)r * j.cols * esz;
    float v;
    if (jobs.stage > 0) {
        float acc[1][8];
        tarfa_quad_acc<1, TARFA_BATCH_STAGED, false>(&row, j.dtype, xs, j.cols, sub, 1, acc);
        v = tarfa_quad_fold(acc[0]);
    } else {
        v = tarfa_quad_dot(row, j.dtype, j.x, j.cols, sub, j.vec);
    }
    if (live && sub == 0) {
        if (j.bias) v = __fadd_rn(v, tarfa_weight(j.bias, j.bias_dtype, r));
        j.y[r] = j.accumulate ? __fadd_rn(j.y[r], v) : v;
    }
}

// x = the embedding row of params[0] (widened; the host checked the id against the vocabulary).
extern "C" __global__ void tarfa_e_embed(const unsigned char* table, int dtype, int hidden,
                                         const int* params, float* x) {
    tarfa_grid_enter();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < hidden) {
        x[i] = tarfa_weight(table, dtype, (long long)params[0] * hidden + i);
    }
}

// rsqrt(dot(x, x) / n + eps) on one warp (canon::rms_scale); every lane returns it.
__device__ float tarfa_rms_scale(const float* x, int n, float eps, int lane) {
    float acc = 0.0f;
    for (int k = lane; k < n; k += 32) acc = __fmaf_rn(x[k], x[k], acc);
    acc = tarfa_warp_fold(acc);
    float dot = __shfl_sync(TARFA_FULL, acc, 0);
    float ms = __fdiv_rn(dot, (float)n);
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(ms, eps)));
}

// Elements of x an RMSNorm block copies to shared memory for its scale (larger n: read in place).
#define TARFA_RMS_STAGE 4096
// Elements per thread loaded before the scale is known.
#define TARFA_RMS_AHEAD 4

// rsqrt(mean(x²) + eps) of x (n floats every thread of the block may read), for every thread:
// warp 0 finds it (tarfa_rms_scale) and hands it on through `slot` (shared memory). It begins
// with a barrier, so the block's earlier stores to x are seen.
__device__ __forceinline__ float tarfa_block_scale(const float* x, int n, float eps, float* slot) {
    __syncthreads();
    if (threadIdx.x < 32) {
        float r = tarfa_rms_scale(x, n, eps, threadIdx.x);
        if (threadIdx.x == 0) *slot = r;
    }
    __syncthreads();
    return *slot;
}

// An RMSNorm block's start: each thread loads its first TARFA_RMS_AHEAD weights (wv) while the
// launch before may still run, then enters (tarfa_grid_enter).
__device__ __forceinline__ void tarfa_rms_enter(const unsigned char* w, int wdtype, int n, float* wv) {
#pragma unroll
    for (int j = 0; j < TARFA_RMS_AHEAD; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < n) wv[j] = tarfa_weight(w, wdtype, i);
    }
    tarfa_grid_enter();
}

// The end of an RMSNorm block once every x[i] is final and each thread holds its first
// TARFA_RMS_AHEAD elements' weights (wv) and values (xv): warp 0 finds the scale from `sum_of`
// (x, or its copy in shared memory), then every thread writes its outputs.
__device__ __forceinline__ void tarfa_block_rms_tail(const float* x, const float* sum_of,
                                                     const unsigned char* w, int wdtype, int n,
                                                     float eps, const float* wv, const float* xv,
                                                     float* out) {
    __shared__ float scale;
    float r = tarfa_block_scale(sum_of, n, eps, &scale);
#pragma unroll
    for (int j = 0; j < TARFA_RMS_AHEAD; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < n) out[i] = __fmul_rn(wv[j], __fmul_rn(xv[j], r));
    }
    int rest = TARFA_RMS_AHEAD * blockDim.x;
    for (int i = threadIdx.x + rest; i < n; i += blockDim.x) {
        out[i] = __fmul_rn(tarfa_weight(w, wdtype, i), __fmul_rn(x[i], r));
    }
}

// out = w · (x · rsqrt(mean(x²) + eps)) (canon::rms_norm) on one block, element i of x given by
// xval(i) (called once per element; afterwards x[i] must hold it): warp 0 finds the scale. Every
// thread first loads its first TARFA_RMS_AHEAD weights (before tarfa_grid_enter: while the
// launch before may still run), then as many values, copied to shared memory, so that the
// weights' loads (from HBM) overlap the scale's sum and the sum reads shared memory (the loads
// were each a round trip in turn).
template <class XVal>
__device__ __forceinline__ void tarfa_block_rms_norm(XVal xval, const float* x,
                                                     const unsigned char* w, int wdtype, int n,
                                                     float eps, float* out) {
    __shared__ float xs[TARFA_RMS_STAGE];
    bool staged = n <= TARFA_RMS_STAGE;
    float wv[TARFA_RMS_AHEAD], xv[TARFA_RMS_AHEAD];
    tarfa_rms_enter(w, wdtype, n, wv);
#pragma unroll
    for (int j = 0; j < TARFA_RMS_AHEAD; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < n) {
            xv[j] = xval(i);
            if (staged) xs[i] = xv[j];
        }
    }
    int rest = TARFA_RMS_AHEAD * blockDim.x;
    for (int i = threadIdx.x + rest; i < n; i += blockDim.x) {
        float v = xval(i);
        if (staged) xs[i] = v;
    }
    tarfa_block_rms_tail(x, staged ? xs : x, w, wdtype, n, eps, wv, xv, out);
}

// RMSNorm of x into out (tarfa_block_rms_norm), one block.
extern "C" __global__ void tarfa_e_rms_norm(const float* x, const unsigned char* w, int wdtype,
                                            int n, float eps, float* out) {
    tarfa_block_rms_norm([&](int i) { return x[i]; }, x, w, wdtype, n, eps, out);
}

// Elements per lane a head's warp loads ahead (heads up to 256 wide).
#define TARFA_HEAD_AHEAD 8
// Keys (positions) an attention warp loads at once for its scores.
#define TARFA_ATTN_ROWS 4

// One head's RMSNorm (when `norm`) and NeoX RoPE on the first 2·half dims (blocks::rope_heads:
// y_j = x_j·c + (−x_{j+h})·s, y_{j+h} = x_{j+h}·c + x_j·s, no fused multiply-add), by one warp:
// x (d floats) into dst (d floats); c and s: the position's cos and sin rows; buf: d floats of
// the warp's own shared scratch (not dst: a lane reads its partner's element while others write).
__device__ void tarfa_head_norm_rope(const float* x, const unsigned char* nw, int ndtype, int norm,
                                     float eps, int d, int half, const float* c, const float* s,
                                     int lane, float* buf, float* dst) {
    // A lane's elements i = lane + 32·j: x, the norm's weight and the rotation's cos and sin, all
    // loaded at once (one round trip; they were four in turn) when d ≤ 32·TARFA_HEAD_AHEAD.
    if (d <= 32 * TARFA_HEAD_AHEAD) {
        float xv[TARFA_HEAD_AHEAD], wv[TARFA_HEAD_AHEAD], cv[TARFA_HEAD_AHEAD], sv[TARFA_HEAD_AHEAD];
#pragma unroll
        for (int j = 0; j < TARFA_HEAD_AHEAD; ++j) {
            int i = lane + 32 * j;
            if (i < d) {
                xv[j] = x[i];
                wv[j] = norm ? tarfa_weight(nw, ndtype, i) : 1.0f;
                int t = i < half ? i : i - half;
                cv[j] = i < 2 * half ? c[t] : 0.0f;
                sv[j] = i < 2 * half ? s[t] : 0.0f;
            }
        }
        float r = 0.0f;
        if (norm) {
            // tarfa_rms_scale on the registers: lane l's elements in increasing order, one fused
            // multiply-add each from +0, then the fold.
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < TARFA_HEAD_AHEAD; ++j)
                if (lane + 32 * j < d) acc = __fmaf_rn(xv[j], xv[j], acc);
            acc = tarfa_warp_fold(acc);
            float dot = __shfl_sync(TARFA_FULL, acc, 0);
            r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(dot, (float)d), eps)));
        }
#pragma unroll
        for (int j = 0; j < TARFA_HEAD_AHEAD; ++j) {
            int i = lane + 32 * j;
            if (i < d) {
                if (norm) xv[j] = __fmul_rn(wv[j], __fmul_rn(xv[j], r));
                buf[i] = xv[j];
            }
        }
        __syncwarp();
#pragma unroll
        for (int j = 0; j < TARFA_HEAD_AHEAD; ++j) {
            int i = lane + 32 * j;
            if (i < d) {
                float y;
                if (i < half) {
                    y = __fadd_rn(__fmul_rn(xv[j], cv[j]), __fmul_rn(-buf[i + half], sv[j]));
                } else if (i < 2 * half) {
                    y = __fadd_rn(__fmul_rn(xv[j], cv[j]), __fmul_rn(buf[i - half], sv[j]));
                } else {
                    y = xv[j];
                }
                dst[i] = y;
            }
        }
    } else {
        if (norm) {
            float r = tarfa_rms_scale(x, d, eps, lane);
            for (int i = lane; i < d; i += 32) buf[i] = __fmul_rn(tarfa_weight(nw, ndtype, i), __fmul_rn(x[i], r));
        } else {
            for (int i = lane; i < d; i += 32) buf[i] = x[i];
        }
        __syncwarp();
        for (int i = lane; i < d; i += 32) {
            float y;
            if (i < half) {
                y = __fadd_rn(__fmul_rn(buf[i], c[i]), __fmul_rn(-buf[i + half], s[i]));
            } else if (i < 2 * half) {
                int j = i - half;
                y = __fadd_rn(__fmul_rn(buf[i], c[j]), __fmul_rn(buf[j], s[j]));
            } else {
                y = buf[i];
            }
            dst[i] = y;
        }
    }
    __syncwarp();
}

// Attention of one token at position pos = params[1] over the keys first..pos (blocks::attend),
// with that token's q/k RMSNorm (when `norm`) and RoPE (tarfa_head_norm_rope) in the same launch:
// one block per query head h. Warp 0 rotates q's head h into shared memory, warp 1 the token's key
// of h's KV head; the first query head of each KV head's group stores that key and the token's v
// in the caches' row pos for the steps after. Every block takes row pos from its own shared key
// and from v (the same bits the cache gets), never from the caches, which other blocks of this
// launch are writing. Scores (a warp each: the canonical dot of k and q, times scaling), softmax
// on warp 0 (max, tarfa exp, the canonical sum, divide), then Σ_t a_t v_t for each of the d
// outputs in the canonical order: 32 lane partials (position index t mod 32, fused multiply-add
// in increasing t) in shared memory, folded by the fixed tree. The scores are kept in shared
// memory after the partials when there are at most `sh_scores` of them (else in `scores`); then
// come q, the key and the two warps' scratch (4·d floats). Each warp's q elements in registers
// when d ≤ 32·TARFA_HEAD_AHEAD.
extern "C" __global__ void tarfa_e_attention(const float* q, const float* k, const float* v,
                                             const unsigned char* qn, const unsigned char* kn,
                                             int ndtype, int norm, float eps, int heads,
                                             int kv_heads, int d, int half, const float* cos_tab,
                                             const float* sin_tab, const int* params,
                                             float* kcache, float* vcache, int window,
                                             float scaling, float* scores, int cap, float* out,
                                             int sh_scores) {
    TARFA_DYNAMIC_SHARED(float, part);  // [32][d], sh_scores floats, q, key, 2 × scratch
    tarfa_grid_enter();
    int h = blockIdx.x;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int warps = blockDim.x / 32;
    int pos = params[1];
    int first = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    int n = pos - first + 1;
    int group = heads / kv_heads;
    int kvh = h / group;
    long long width = (long long)kv_heads * d;
    float* qh = part + 32 * d + sh_scores;
    float* kh = qh + d;
    const float* vh = v + (long long)kvh * d;
    {
        const float* c = cos_tab + (long long)pos * half;
        const float* s = sin_tab + (long long)pos * half;
        if (warp == 0) {
            tarfa_head_norm_rope(q + (long long)h * d, qn, ndtype, norm, eps, d, half, c, s, lane,
                                 kh + d, qh);
        } else if (warp == 1) {
            tarfa_head_norm_rope(k + (long long)kvh * d, kn, ndtype, norm, eps, d, half, c, s,
                                 lane, kh + 2 * d, kh);
            if (h % group == 0) {
                float* kd = kcache + (long long)pos * width + (long long)kvh * d;
                float* vd = vcache + (long long)pos * width + (long long)kvh * d;
                for (int i = lane; i < d; i += 32) {
                    kd[i] = kh[i];
                    vd[i] = vh[i];
                }
            }
        }
    }
    __syncthreads();
    // Key row i (position first + i): the cache's, the last one this block's own.
    auto key = [&](int i) -> const float* {
        return i == n - 1 ? kh : kcache + (long long)(first + i) * width + (long long)kvh * d;
    };
    float* sc = n <= sh_scores ? part + 32 * d : scores + (long long)h * cap;
    if (d <= 32 * TARFA_HEAD_AHEAD) {
        float qv[TARFA_HEAD_AHEAD];
#pragma unroll
        for (int j = 0; j < TARFA_HEAD_AHEAD; ++j) qv[j] = lane + 32 * j < d ? qh[lane + 32 * j] : 0.0f;
        // A warp's rows i, i + warps, … taken TARFA_ATTN_ROWS at a time: their keys loaded
        // together (one round trip for the batch), then each row's dot on its own, as before.
        for (int i0 = warp; i0 < n; i0 += TARFA_ATTN_ROWS * warps) {
            float kv[TARFA_ATTN_ROWS][TARFA_HEAD_AHEAD];
#pragma unroll
            for (int b = 0; b < TARFA_ATTN_ROWS; ++b) {
                int i = i0 + b * warps;
                const float* kk = i < n ? key(i) : kh;
#pragma unroll
                for (int j = 0; j < TARFA_HEAD_AHEAD; ++j)
                    kv[b][j] = i < n && lane + 32 * j < d ? kk[lane + 32 * j] : 0.0f;
            }
#pragma unroll
            for (int b = 0; b < TARFA_ATTN_ROWS; ++b) {
                int i = i0 + b * warps;
                if (i >= n) break;  // the same for the whole warp
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < TARFA_HEAD_AHEAD; ++j)
                    if (lane + 32 * j < d) acc = __fmaf_rn(kv[b][j], qv[j], acc);
                acc = tarfa_warp_fold(acc);
                if (lane == 0) sc[i] = __fmul_rn(acc, scaling);
            }
        }
    } else {
        for (int i = warp; i < n; i += warps) {
            const float* kk = key(i);
            float acc = 0.0f;
            for (int e = lane; e < d; e += 32) acc = __fmaf_rn(kk[e], qh[e], acc);
            acc = tarfa_warp_fold(acc);
            if (lane == 0) sc[i] = __fmul_rn(acc, scaling);
        }
    }
    __syncthreads();
    if (warp == 0) {
        tarfa_warp_softmax(sc, sc, n, lane);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < 32 * d; idx += blockDim.x) {
        int l = idx / d, dd = idx % d;
        const float* vc = vcache + (long long)kvh * d + dd;
        float acc = 0.0f;
        // Positions i ≡ l (mod 32) in increasing order; the last one (i = n − 1, this token's)
        // from v itself.
#pragma unroll 4
        for (int i = l; i < n - 1; i += 32) acc = __fmaf_rn(sc[i], vc[(long long)(first + i) * width], acc);
        if ((n - 1) % 32 == l) acc = __fmaf_rn(sc[n - 1], vh[dd], acc);
        part[idx] = acc;
    }
    __syncthreads();
    for (int step = 16; step > 0; step /= 2) {
        for (int idx = threadIdx.x; idx < step * d; idx += blockDim.x) {
            part[idx] = __fadd_rn(part[idx], part[idx + step * d]);
        }
        __syncthreads();
    }
    for (int dd = threadIdx.x; dd < d; dd += blockDim.x) out[(long long)h * d + dd] = part[dd];
}

// The key of canon's total order on f32 (f32::total_cmp) as a signed integer.
__device__ __forceinline__ int tarfa_total_key(float v) {
    int b = __float_as_int(v);
    return b ^ (int)(((unsigned int)(b >> 31)) >> 1);
}

// The warp's best (key, id) of its lanes' candidates (id −1: none), all lanes given it: the
// largest key, ties to the lower id.
__device__ __forceinline__ void tarfa_warp_best(int* best_key, int* best_id) {
    for (int o = 16; o > 0; o /= 2) {
        int ok = __shfl_xor_sync(TARFA_FULL, *best_key, o);
        int oi = __shfl_xor_sync(TARFA_FULL, *best_id, o);
        bool take = oi >= 0 && (*best_id < 0 || ok > *best_key || (ok == *best_key && oi < *best_id));
        if (take) {
            *best_key = ok;
            *best_id = oi;
        }
    }
}

// Router probabilities per lane the top-k holds in registers (up to 256 experts).
#define TARFA_TOPK_AHEAD 8

// tarfa_e_topk for n (hence k) ≤ 32·TARFA_TOPK_AHEAD, all in registers: lane l holds the logits,
// probabilities and keys of experts l, l + 32, … and the weights of slots l, l + 32, …; a
// slot's probability comes back from its winning key (the key is a bijection on f32 bits), so
// no round trip through memory stands between one slot and the next. The same operations in the
// same order as tarfa_warp_softmax, the selection and the renormalisation below.
__device__ __forceinline__ void tarfa_topk_held(const float* z, int n, int k, int renorm,
                                                float* probs, int* ids, float* wts, int lane) {
    float pv[TARFA_TOPK_AHEAD], wv[TARFA_TOPK_AHEAD];
    int keys[TARFA_TOPK_AHEAD];
#pragma unroll
    for (int j = 0; j < TARFA_TOPK_AHEAD; ++j) pv[j] = lane + 32 * j < n ? z[lane + 32 * j] : 0.0f;
    float m = __int_as_float(0xff800000);  // -inf
#pragma unroll
    for (int j = 0; j < TARFA_TOPK_AHEAD; ++j)
        if (lane + 32 * j < n) m = fmaxf(m, pv[j]);
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(TARFA_FULL, m, o));
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < TARFA_TOPK_AHEAD; ++j) {
        if (lane + 32 * j < n) {
            pv[j] = tarfa_exp(__fsub_rn(pv[j], m));
            acc = __fadd_rn(acc, pv[j]);
        }
    }
    float sum = __shfl_sync(TARFA_FULL, tarfa_warp_fold(acc), 0);
#pragma unroll
    for (int j = 0; j < TARFA_TOPK_AHEAD; ++j) {
        int i = lane + 32 * j;
        keys[j] = 0;
        wv[j] = 0.0f;
        if (i < n) {
            pv[j] = __fdiv_rn(pv[j], sum);
            probs[i] = pv[j];
            keys[j] = tarfa_total_key(pv[j]);
        }
    }
    int prev_key = 0, prev_id = -1;
    for (int slot = 0; slot < k; ++slot) {
        int best_key = 0, best_id = -1;
#pragma unroll
        for (int j = 0; j < TARFA_TOPK_AHEAD; ++j) {
            int i = lane + 32 * j;
            int key = keys[j];
            bool after = slot == 0 || key < prev_key || (key == prev_key && i > prev_id);
            bool better = best_id < 0 || key > best_key || (key == best_key && i < best_id);
            if (i < n && after && better) {
                best_key = key;
                best_id = i;
            }
        }
        tarfa_warp_best(&best_key, &best_id);
        prev_key = best_key;
        prev_id = best_id;
        // The winner's probability: the key's inverse (tarfa_total_key is its own inverse).
        float p = __int_as_float(tarfa_total_key(__int_as_float(best_key)));
#pragma unroll
        for (int j = 0; j < TARFA_TOPK_AHEAD; ++j)
            if (slot == lane + 32 * j) wv[j] = p;
        if (lane == 0) ids[slot] = best_id;
    }
    float t = 0.0f;
    if (renorm) {
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < TARFA_TOPK_AHEAD; ++j)
            if (lane + 32 * j < k) a = __fadd_rn(a, wv[j]);
        a = tarfa_warp_fold(a);
        t = __shfl_sync(TARFA_FULL, a, 0);
    }
#pragma unroll
    for (int j = 0; j < TARFA_TOPK_AHEAD; ++j)
        if (lane + 32 * j < k) wts[lane + 32 * j] = renorm ? __fdiv_rn(wv[j], t) : wv[j];
}

// The softmax router's native top-k (blocks::softmax_topk) on one warp: p = softmax(z), the k
// largest p (total order, descending; ties: the lower id) in selection order, renormalised by
// their canonical sum when `renorm`. p is kept in `probs` (n floats). Up to 32·TARFA_TOPK_AHEAD
// experts in registers (tarfa_topk_held); more through memory, each round reading p again.
extern "C" __global__ void tarfa_e_topk(const float* z, int n, int k, int renorm, float* probs,
                                        int* ids, float* wts) {
    tarfa_grid_enter();
    int lane = threadIdx.x;
    if (n <= 32 * TARFA_TOPK_AHEAD) {
        tarfa_topk_held(z, n, k, renorm, probs, ids, wts, lane);
        return;
    }
    tarfa_warp_softmax(z, probs, n, lane);
    __syncwarp();
    // Selection: each round takes the best (key, id) strictly after the previous one in the
    // order (key descending, id ascending).
    int prev_key = 0, prev_id = -1;
    for (int slot = 0; slot < k; ++slot) {
        int best_key = 0, best_id = -1;
        for (int i = lane; i < n; i += 32) {
            int key = tarfa_total_key(probs[i]);
            bool after = slot == 0 || key < prev_key || (key == prev_key && i > prev_id);
            bool better = best_id < 0 || key > best_key || (key == best_key && i < best_id);
            if (after && better) {
                best_key = key;
                best_id = i;
            }
        }
        tarfa_warp_best(&best_key, &best_id);
        prev_key = best_key;
        prev_id = best_id;
        if (lane == 0) {
            ids[slot] = best_id;
            wts[slot] = probs[best_id];
        }
    }
    __syncwarp();
    if (renorm) {
        float a = 0.0f;
        for (int i = lane; i < k; i += 32) a = __fadd_rn(a, wts[i]);
        a = tarfa_warp_fold(a);
        float t = __shfl_sync(TARFA_FULL, a, 0);
        __syncwarp();
        for (int i = lane; i < k; i += 32) wts[i] = __fdiv_rn(wts[i], t);
    }
}

// canon::sigmoid: 1 / (1 + tarfa exp(−x)).
__device__ __forceinline__ float tarfa_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, tarfa_exp(-x)));
}

// The key of blocks::sigmoid_group_topk's order (larger first, 0.0 and −0.0 equal: −0.0 + 0.0 is
// +0.0; otherwise f32::total_cmp's), as tarfa_total_key takes it.
__device__ __forceinline__ int tarfa_score_key(float v) { return tarfa_total_key(__fadd_rn(v, 0.0f)); }

// Whether (key a, id ia) comes before (key b, id ib) in the order: key descending, id ascending.
__device__ __forceinline__ bool tarfa_before(int a, int ia, int b, int ib) {
    return a > b || (a == b && ia < ib);
}

// The best (key, id) of keys[i] for i < n strictly after (prev_key, prev_id) in the order (any
// candidate when prev_id < 0), the warp's lanes each taking i = lane, lane + 32, …; all lanes get
// it (id −1: none).
template <typename Key>
__device__ __forceinline__ void tarfa_next_best(Key key, int n, int prev_key, int prev_id,
                                                int lane, int* best_key, int* best_id) {
    *best_key = 0;
    *best_id = -1;
    for (int i = lane; i < n; i += 32) {
        int kk = key(i);
        bool after = prev_id < 0 || tarfa_before(prev_key, prev_id, kk, i);
        bool better = *best_id < 0 || tarfa_before(kk, i, *best_key, *best_id);
        if (after && better) {
            *best_key = kk;
            *best_id = i;
        }
    }
    tarfa_warp_best(best_key, best_id);
}

// GLM-4.5's router (DeepSeek-V3 style, blocks::sigmoid_group_topk) on one warp, the CPU's
// operations in its order: s = sigmoid(z); c = s + bias (selection only); with n_group > 1, each
// of the n_group equal groups scored by the sum of its two largest c, the topk_group best groups
// kept (score descending, ties: the lower group) and every other expert's c set to +0.0; the k
// largest c in selection order (ties: the lower id); each slot's weight the unbiased s, divided
// by (their canonical sum + 1e-20) when `renorm`, then multiplied by `scale`. `scratch` holds
// 3·n floats (s, c, the group scores). The orders are the CPU's `descending` (0.0 and −0.0
// equal, else f32::total_cmp), so ties fall where they fall there. A NaN logit does not: the
// GPU's arithmetic gives NaN its own sign and payload (spec/EXACTNESS.md: finite inputs only).
extern "C" __global__ void tarfa_e_sigmoid_topk(const float* z, int n, const unsigned char* bias,
                                                int bias_dtype, int k, int n_group,
                                                int topk_group, int renorm, float scale,
                                                float* scratch, int* ids, float* wts) {
    tarfa_grid_enter();
    int lane = threadIdx.x;
    float* s = scratch;
    float* c = scratch + n;
    float* gs = scratch + 2 * (long long)n;
    for (int i = lane; i < n; i += 32) {
        float v = tarfa_sigmoid(z[i]);
        s[i] = v;
        c[i] = __fadd_rn(v, tarfa_weight(bias, bias_dtype, i));
    }
    __syncwarp();
    int size = n_group > 0 ? n / n_group : n;
    if (n_group > 1 && size >= 2) {
        // Each lane scores its groups: the two largest in the order, summed.
        for (int g = lane; g < n_group; g += 32) {
            const float* cg = c + (long long)g * size;
            int k1 = 0, i1 = -1, k2 = 0, i2 = -1;
            for (int i = 0; i < size; ++i) {
                int kk = tarfa_score_key(cg[i]);
                if (i1 < 0 || tarfa_before(kk, i, k1, i1)) {
                    k2 = k1;
                    i2 = i1;
                    k1 = kk;
                    i1 = i;
                } else if (i2 < 0 || tarfa_before(kk, i, k2, i2)) {
                    k2 = kk;
                    i2 = i;
                }
            }
            gs[g] = __fadd_rn(cg[i1], cg[i2]);
        }
        __syncwarp();
        // The topk_group-th best group (key, id): every group at or before it is kept.
        auto gkey = [&](int g) { return tarfa_score_key(gs[g]); };
        int last_key = 0, last_id = -1;
        for (int r = 0; r < topk_group; ++r) {
            int bk, bi;
            tarfa_next_best(gkey, n_group, last_key, last_id, lane, &bk, &bi);
            last_key = bk;
            last_id = bi;
        }
        for (int i = lane; i < n; i += 32) {
            int g = i / size;
            if (!(g == last_id || tarfa_before(gkey(g), g, last_key, last_id))) c[i] = 0.0f;
        }
        __syncwarp();
    }
    auto ckey = [&](int i) { return tarfa_score_key(c[i]); };
    int prev_key = 0, prev_id = -1;
    for (int slot = 0; slot < k; ++slot) {
        int bk, bi;
        tarfa_next_best(ckey, n, prev_key, prev_id, lane, &bk, &bi);
        prev_key = bk;
        prev_id = bi;
        if (lane == 0) {
            ids[slot] = bi;
            wts[slot] = s[bi];
        }
    }
    __syncwarp();
    float t = 0.0f;
    if (renorm) {
        float a = 0.0f;
        for (int i = lane; i < k; i += 32) a = __fadd_rn(a, wts[i]);
        a = tarfa_warp_fold(a);
        t = __fadd_rn(__shfl_sync(TARFA_FULL, a, 0), 1e-20f);
    }
    __syncwarp();
    for (int i = lane; i < k; i += 32) {
        float w = wts[i];
        if (renorm) w = __fdiv_rn(w, t);
        wts[i] = __fmul_rn(w, scale);
    }
}

// A layer's experts (or its dense MLP as one expert): per-expert matrix addresses.
struct TarfaMoe {
    const unsigned long long* gate;
    const unsigned long long* up;
    const unsigned long long* down;
    int n_experts;
    int inter;
    int hidden;
    int dtype_gu;
    int dtype_d;
    int vec_gu;
    int vec_d;
};

// h[s][r] = silu(gate_e[r] · x) · (up_e[r] · x) for the expert e = ids[s] of each of k slots.
extern "C" __global__ void tarfa_e_moe_gate_up(TarfaMoe m, const int* ids, int k, const float* x,
                                               float* h) {
    tarfa_grid_enter();
    long long quad = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 4;
    int sub = threadIdx.x & 3;
    long long total = (long long)k * m.inter;
    bool live = quad < total;
    long long q = live ? quad : total - 1;
    int slot = (int)(q / m.inter);
    int r = (int)(q % m.inter);
    int e = ids[slot];
    if (e < 0 || e >= m.n_experts) e = 0;  // never: ids come from tarfa_e_topk
    long long esz = m.dtype_gu == TARFA_BF16 ? 2 : 4;
    long long off = (long long)r * m.hidden * esz;
    // gate and up together: both rows' loads in flight at once, each row its own canonical dot.
    const unsigned char* rows[2] = {(const unsigned char*)m.gate[e] + off, (const unsigned char*)m.up[e] + off};
    float acc[2][8];
    tarfa_quad_acc<2, TARFA_BATCH, true>(rows, m.dtype_gu, x, m.hidden, sub, m.vec_gu, acc);
    float g = tarfa_quad_fold(acc[0]);
    float u = tarfa_quad_fold(acc[1]);
    if (live && sub == 0) h[(long long)slot * m.inter + r] = tarfa_silu_mul(g, u);
}

// y[s][r] = down_e[r] · h[s] for the expert e = ids[s] of each slot.
extern "C" __global__ void tarfa_e_moe_down(TarfaMoe m, const int* ids, int k, const float* h,
                                            float* y) {
    tarfa_grid_enter();
    long long quad = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 4;
    int sub = threadIdx.x & 3;
    long long total = (long long)k * m.hidden;
    bool live = quad < total;
    long long q = live ? quad : total - 1;
    int slot = (int)(q / m.hidden);
    int r = (int)(q % m.hidden);
    int e = ids[slot];
    if (e < 0 || e >= m.n_experts) e = 0;
    long long esz = m.dtype_d == TARFA_BF16 ? 2 : 4;
    const unsigned char* row = (const unsigned char*)m.down[e] + (long long)r * m.inter * esz;
    float v = tarfa_quad_dot(row, m.dtype_d, h + (long long)slot * m.inter, m.inter, sub, m.vec_d);
    if (live && sub == 0) y[(long long)slot * m.hidden + r] = v;
}

// x[i] += Σ_s y[s][i] · w[s], the products rounded, added in slot order from slot 0
// (MoeOutputs), then the shared experts' output sh[i] when `sh` is not null (GLM's
// `routed + shared`), then the sum added to the residual; returns the new x[i]. Eight slots'
// products are loaded together, then added in order (the loads were each a round trip in turn).
__device__ __forceinline__ float tarfa_combine_at(const float* y, const float* wts, int k,
                                                  int hidden, const float* sh, float* x, int i) {
    float acc = 0.0f;
    for (int s0 = 0; s0 < k; s0 += 8) {
        float p[8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
            p[j] = s0 + j < k ? __fmul_rn(y[(long long)(s0 + j) * hidden + i], wts[s0 + j]) : 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
            if (s0 + j < k) acc = s0 + j == 0 ? p[j] : __fadd_rn(acc, p[j]);
    }
    if (sh) acc = __fadd_rn(acc, sh[i]);
    float v = __fadd_rn(x[i], acc);
    x[i] = v;
    return v;
}

// The experts' combine into the residual x (tarfa_combine_at, a thread per element).
extern "C" __global__ void tarfa_e_moe_combine(const float* y, const float* wts, int k, int hidden,
                                               const float* sh, float* x) {
    tarfa_grid_enter();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < hidden) tarfa_combine_at(y, wts, k, hidden, sh, x, i);
}

// Slots the combine's one-block form loads ahead (top-8 and a folded shared expert).
#define TARFA_COMBINE_AHEAD 9

// The combine, then the next layer's input RMSNorm of the new x (tarfa_e_rms_norm's operations)
// into `out`, in one block: one launch instead of two.
// When the block's threads hold every element (n ≤ TARFA_RMS_AHEAD · threads, staged) and there
// are at most TARFA_COMBINE_AHEAD slots (top-8 and a folded shared expert), every load of the combine — the slots' weights, each element's products
// and residual — is issued before the first add (a thread's elements were a round trip each in
// turn: each stored x before the next loaded), then the same adds in the same order.
extern "C" __global__ void tarfa_e_combine_norm(const float* y, const float* wts, int k, int n,
                                                const float* sh, float* x,
                                                const unsigned char* w, int wdtype, float eps,
                                                float* out) {
    if (k > TARFA_COMBINE_AHEAD || n > TARFA_RMS_AHEAD * (int)blockDim.x || n > TARFA_RMS_STAGE) {
        tarfa_block_rms_norm([&](int i) { return tarfa_combine_at(y, wts, k, n, sh, x, i); }, x,
                             w, wdtype, n, eps, out);
        return;
    }
    __shared__ float xs[TARFA_RMS_STAGE];
    float wv[TARFA_RMS_AHEAD], xv[TARFA_RMS_AHEAD];
    tarfa_rms_enter(w, wdtype, n, wv);
    float ws[TARFA_COMBINE_AHEAD], yv[TARFA_RMS_AHEAD][TARFA_COMBINE_AHEAD], shv[TARFA_RMS_AHEAD];
#pragma unroll
    for (int s = 0; s < TARFA_COMBINE_AHEAD; ++s) ws[s] = s < k ? wts[s] : 0.0f;
#pragma unroll
    for (int j = 0; j < TARFA_RMS_AHEAD; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < n) {
            xv[j] = x[i];
            shv[j] = sh ? sh[i] : 0.0f;
#pragma unroll
            for (int s = 0; s < TARFA_COMBINE_AHEAD; ++s) yv[j][s] = s < k ? y[(long long)s * n + i] : 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < TARFA_RMS_AHEAD; ++j) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < n) {
            // tarfa_combine_at's operations: products rounded, added in slot order from slot 0.
            float acc = 0.0f;
#pragma unroll
            for (int s = 0; s < TARFA_COMBINE_AHEAD; ++s) {
                if (s < k) {
                    float p = __fmul_rn(yv[j][s], ws[s]);
                    acc = s == 0 ? p : __fadd_rn(acc, p);
                }
            }
            if (sh) acc = __fadd_rn(acc, shv[j]);
            float v = __fadd_rn(xv[j], acc);
            x[i] = v;
            xv[j] = v;
            xs[i] = v;
        }
    }
    tarfa_block_rms_tail(x, xs, w, wdtype, n, eps, wv, xv, out);
}

// ================================================================================================
// Tiled products: a block's rows streamed through shared memory.
//
// A quad's own loads (above) keep too few bytes in flight when a product has few rows (o_proj:
// 2,048 rows of 8 KiB; the router: 128), and a thread waits for each batch before it multiplies.
// Here every thread of a block copies a block's rows (up to TARFA_TILE_MAX_ROWS) into a ring of
// shared-memory stages with asynchronous copies (cp.async, sm_80 and later), several stages in
// flight, while the rows' quads run their canonical accumulation on the stages already landed.
// Which thread loads a weight changes no bit: each quad still takes its row's elements in
// increasing k, eight logical lanes per thread, one fused multiply-add each, exactly as
// tarfa_quad_acc does (for rows of whole 32-element chunks, which the host checks).
// ================================================================================================

#define TARFA_TILE_THREADS 128
#define TARFA_TILE_MAX_ROWS 32
// The ring: stages (STAGES − 1 in flight), and weight bytes per stage; a slot also holds each
// row's 16 bytes of padding. The host may compile another ring (TARFA_CUDA_TILE, passed as -D
// and checked by gpu_engine.rs's TileGeometry): it changes which thread copies which bytes and
// when, never an operation or its order.
#ifndef TARFA_TILE_STAGES
#define TARFA_TILE_STAGES 4
#endif
#ifndef TARFA_TILE_STAGE_BYTES
#define TARFA_TILE_STAGE_BYTES 8192
#endif
// Two stages at least (one landing while one is read); every thread the same number of 16-byte
// pieces of a stage; a stage wide enough for 32 columns of x and of a full block of F32 rows.
static_assert(TARFA_TILE_STAGES >= 2, "the ring needs two stages");
static_assert(TARFA_TILE_STAGE_BYTES % (16 * TARFA_TILE_THREADS) == 0,
              "a stage is whole 16-byte pieces for each thread");
static_assert(TARFA_TILE_STAGE_BYTES / (4 + TARFA_TILE_MAX_ROWS * 4) >= 32,
              "a stage holds 32 columns of x and of 32 F32 rows");
#define TARFA_TILE_SLOT (TARFA_TILE_STAGE_BYTES + TARFA_TILE_MAX_ROWS * 16)
// Dynamic shared memory of a tiled launch: the rows' addresses, then the ring.
#define TARFA_TILE_HEAD (TARFA_TILE_MAX_ROWS * 8)
#define TARFA_TILE_SHARED (TARFA_TILE_HEAD + TARFA_TILE_STAGES * TARFA_TILE_SLOT)

// Asynchronous 16-byte copies from global to shared memory, in groups (the emulation, cuda-emu/,
// defines them its own way: each copy is made when its group is waited for).
// Before sm_80 (no cp.async) each copy is a plain load and store, made at once.
#if !defined(TARFA_CP_ASYNC) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void tarfa_cp_async16(void* dst, const void* src) {
    unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void tarfa_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's newest groups are still in flight.
template <int N>
__device__ __forceinline__ void tarfa_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#elif !defined(TARFA_CP_ASYNC)
__device__ __forceinline__ void tarfa_cp_async16(void* dst, const void* src) {
    *(uint4*)dst = *(const uint4*)src;
}
__device__ __forceinline__ void tarfa_cp_commit() {}
template <int N>
__device__ __forceinline__ void tarfa_cp_wait() {}
#endif

// A thread's share of each stage's copies: the same pieces of every stage (the stage's columns
// move by w), so their addresses are worked out once (a division per piece per stage cost more
// than the copies). Piece j of thread t is the (t + j·threads)-th 16 bytes of a stage: x's
// columns first (its first xb bytes; none when x is in shared memory whole), then each row's. A thread keeps its pieces in registers (20 bytes each: 4 at
// 8 KiB stages, 32 at 64 KiB, where they may spill to local memory).
#define TARFA_TILE_PIECES (TARFA_TILE_STAGE_BYTES / 16 / TARFA_TILE_THREADS)
struct TarfaTilePieces {
    const unsigned char* src[TARFA_TILE_PIECES];  // at stage 0
    int dst[TARFA_TILE_PIECES];                   // offset in a slot
    int step[TARFA_TILE_PIECES];                  // bytes src moves per stage
    int col[TARFA_TILE_PIECES];                   // first column within the stage
    int n;
};

__device__ __forceinline__ void tarfa_tile_pieces(const unsigned char* const* rowp, int n,
                                                  const float* x, int esz, int w, int pitch,
                                                  int xb, TarfaTilePieces* t) {
    int xp = xb / 16;
    int per_row = w * esz / 16;
    int total = xp + n * per_row;
    t->n = 0;
#pragma unroll
    for (int j = 0; j < TARFA_TILE_PIECES; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < total) {
            if (p < xp) {
                t->src[j] = (const unsigned char*)(x + p * 4);
                t->dst[j] = p * 16;
                t->step[j] = w * 4;
                t->col[j] = p * 4;
            } else {
                int i = (p - xp) / per_row;
                int o = (p - xp) - i * per_row;
                t->src[j] = rowp[i] + o * 16;
                t->dst[j] = xb + i * pitch + o * 16;
                t->step[j] = w * esz;
                t->col[j] = o * 16 / esz;
            }
            t->n = j + 1;
        }
    }
}

// Stage `s` of the tile into `slot`: x[c0 .. c0 + ws) first, then columns [c0, c0 + ws) of each
// row i at w·4 + i·pitch (c0 = s·w, ws = min(w, cols − c0): a last, narrower stage copies only
// its columns, at the same places). x's pieces (the first xb = w·4 bytes of a slot) when `xs`,
// the weights' when `wts`.
__device__ __forceinline__ void tarfa_tile_issue(const TarfaTilePieces& t, int ws, int s,
                                                 unsigned char* slot, int xb, bool xs, bool wts) {
#pragma unroll
    for (int j = 0; j < TARFA_TILE_PIECES; ++j) {
        if (j < t.n && t.col[j] < ws && (t.dst[j] < xb ? xs : wts))
            tarfa_cp_async16(slot + t.dst[j], t.src[j] + (long long)s * t.step[j]);
    }
}

// The canonical accumulation (tarfa_quad_acc's, for cols a multiple of 32) of the rows
// quad·R .. quad·R + R − 1 of the tile with x (cols floats, 16-byte aligned, the same for the
// whole block), for quads < `quads`; other threads get zeros. Every thread of the block must call
// it (it copies and waits with them). rowp: the tile's n row addresses (16-byte aligned), in
// shared memory; ring: the stages. Unless `xsh`, a stage holds x's columns as well as the
// weights': a quad's reads are all from shared memory (x read from global memory at each chunk
// left every chunk waiting for an L2 round trip). With `xsh` (x whole in shared memory, once
// `enter` has run) the stages hold weights only. With `ahead`, the weights of the first stages
// are issued before `enter()` — which must call tarfa_grid_enter (the rows' addresses must not
// depend on an earlier launch's output) — x's after it; else the caller has entered already.
template <int R, class Enter>
__device__ void tarfa_tile_acc(const unsigned char* const* rowp, int n, int cols, int dtype,
                               const float* x, const float* xsh, unsigned char* ring, int quad,
                               int quads, int sub, float (*acc)[8], bool ahead, Enter enter) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][j] = 0.0f;
    // Each thread's share of a stage's copies (TARFA_TILE_PIECES) assumes the block's size; x in
    // shared memory is filled by `enter`, which runs only `ahead`.
    if (blockDim.x != TARFA_TILE_THREADS || (xsh && !ahead)) __trap();
    int esz = dtype == TARFA_BF16 ? 2 : 4;
    int xe = xsh ? 0 : 4;  // bytes of x per column a stage holds
    // Columns per stage: whole chunks of x and of each row, each row padded by 16 bytes (so that
    // the quads of a warp, reading the same columns of different rows, meet different banks).
    int w = TARFA_TILE_STAGE_BYTES / (xe + n * esz) / 32 * 32;
    if (w > cols) w = cols;
    int pitch = w * esz + 16;
    int xb = w * xe;
    int stages = (cols + w - 1) / w;
    bool mine = quad < quads;
    TarfaTilePieces pieces;
    tarfa_tile_pieces(rowp, n, x, esz, w, pitch, xb, &pieces);
    if (ahead) {
        // The first stages' weights, uncommitted: they join stage 0's group, committed below.
#pragma unroll
        for (int s = 0; s < TARFA_TILE_STAGES - 1; ++s) {
            if (s < stages) {
                int ws = cols - s * w < w ? cols - s * w : w;
                tarfa_tile_issue(pieces, ws, s, ring + s * TARFA_TILE_SLOT, xb, false, true);
            }
        }
        enter();
    }
#pragma unroll
    for (int s = 0; s < TARFA_TILE_STAGES - 1; ++s) {
        if (s < stages) {
            int ws = cols - s * w < w ? cols - s * w : w;
            tarfa_tile_issue(pieces, ws, s, ring + s * TARFA_TILE_SLOT, xb, true, !ahead);
        }
        tarfa_cp_commit();
    }
    for (int s = 0; s < stages; ++s) {
        // Stage s has landed (this thread's copies, then everyone's): STAGES − 1 + s groups are
        // committed, stage s's the (s + 1)-th, so at most STAGES − 2 newer may stay in flight.
        tarfa_cp_wait<TARFA_TILE_STAGES - 2>();
        __syncthreads();
        // Everyone is past stage s − 1's compute: its slot takes stage s + STAGES − 1.
        int t = s + TARFA_TILE_STAGES - 1;
        if (t < stages) {
            int ws = cols - t * w < w ? cols - t * w : w;
            tarfa_tile_issue(pieces, ws, t, ring + (t % TARFA_TILE_STAGES) * TARFA_TILE_SLOT, xb, true, true);
        }
        tarfa_cp_commit();
        if (mine) {
            const unsigned char* slot = ring + (s % TARFA_TILE_STAGES) * TARFA_TILE_SLOT;
            const float* xs = xsh ? xsh + s * w : (const float*)slot;
            const unsigned char* rows = slot + xb + quad * R * pitch;
            int ws = cols - s * w < w ? cols - s * w : w;
#pragma unroll 2
            for (int c = 0; c < ws; c += 32) {
                float xv[8];
                tarfa_x8(xs, c + sub * 8, 1, xv);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const unsigned char* p = rows + r * pitch + (c + sub * 8) * esz;
                    float wv[8];
                    if (dtype == TARFA_BF16) {
                        tarfa_unpack_bf16x8(*(const uint4*)p, wv);
                    } else {
                        float4 lo = ((const float4*)p)[0], hi = ((const float4*)p)[1];
                        wv[0] = lo.x; wv[1] = lo.y; wv[2] = lo.z; wv[3] = lo.w;
                        wv[4] = hi.x; wv[5] = hi.y; wv[6] = hi.z; wv[7] = hi.w;
                    }
                    tarfa_fma8(wv, xv, acc[r]);
                }
            }
        }
    }
}

// Dynamic shared memory a tiled block taking its x in through an RMSNorm of n elements has
// beyond the ring: x, then the norm's scale (in a 16-byte piece of its own).
#define TARFA_TILE_NORM_SHARED(n) (4 * (n) + 16)

// 16-byte pieces (four elements) of x a thread of a tiled block holds in registers for the
// RMSNorm it takes in, with their weights loaded before tarfa_grid_enter (8 · 4 · 128 = 4,096
// elements; the rest are loaded as they are needed).
#define TARFA_TILE_NORM_AHEAD 8

// The weights of a thread's first pieces of a tiled block's RMSNorm (n elements): loaded while
// the launch before may still run (they are no launch's output).
__device__ __forceinline__ void tarfa_tile_norm_weights(const unsigned char* w, int wdtype, int n,
                                                        float (*wv)[4]) {
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (4 * p < n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) wv[j][e] = tarfa_weight(w, wdtype, 4 * p + e);
        }
    }
}

// The RMSNorm of x (n floats, n a multiple of 4, 16-byte aligned) with weights w (the first
// pieces' in wv, tarfa_tile_norm_weights), as tarfa_e_rms_norm computes it (tarfa_rms_scale on
// warp 0, then w_i · (x_i · r)), by a whole block into xs (n floats of dynamic shared memory,
// then one for the scale: a tiled kernel has no static shared memory), and into `out` too when
// not null. Called after tarfa_grid_enter (x is an earlier launch's output); every thread of the
// block calls it.
__device__ void tarfa_tile_norm(const float* x, const unsigned char* w, int wdtype, int n,
                                float eps, const float (*wv)[4], float* xs, float* out) {
    int n4 = n / 4;
    int held = TARFA_TILE_NORM_AHEAD * blockDim.x;
    float4 xv[TARFA_TILE_NORM_AHEAD];
    // Every load in flight at once (one round trip), then the stores to shared memory.
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < n4) xv[j] = ((const float4*)x)[p];
    }
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < n4) ((float4*)xs)[p] = xv[j];
    }
    for (int p = threadIdx.x + held; p < n4; p += blockDim.x) ((float4*)xs)[p] = ((const float4*)x)[p];
    float r = tarfa_block_scale(xs, n, eps, xs + n);
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < n4) {
            float4 v;
            v.x = __fmul_rn(wv[j][0], __fmul_rn(xv[j].x, r));
            v.y = __fmul_rn(wv[j][1], __fmul_rn(xv[j].y, r));
            v.z = __fmul_rn(wv[j][2], __fmul_rn(xv[j].z, r));
            v.w = __fmul_rn(wv[j][3], __fmul_rn(xv[j].w, r));
            ((float4*)xs)[p] = v;
            if (out) ((float4*)out)[p] = v;
        }
    }
    for (int i = 4 * (threadIdx.x + held); i < n; i += 4 * blockDim.x) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = __fmul_rn(tarfa_weight(w, wdtype, i + e), __fmul_rn(xs[i + e], r));
            xs[i + e] = v;
            if (out) out[i + e] = v;
        }
    }
    __syncthreads();
}

// tarfa_e_matvec's products, tiled: `nr` rows per block (≤ TARFA_TILE_MAX_ROWS), a quad each.
// Every job has the same cols (a multiple of 32), dtype and x (job 0's), and is `vec`. With a norm
// weight `nw`, x is taken in through that RMSNorm (tarfa_tile_norm: each block normalises job 0's
// x itself, into the cols floats of shared memory after the ring, and its scale after them
// (TARFA_TILE_NORM_SHARED) — no launch of its own, and no round trip through memory; block 0
// also writes it to `xn` when that is not null, for a later launch).
extern "C" __global__ void tarfa_e_tmatvec(TarfaMatJobs jobs, int nr, const unsigned char* nw,
                                           int ndtype, float eps, float* xn) {
    TARFA_DYNAMIC_SHARED(float, tile);
    const unsigned char** rowp = (const unsigned char**)tile;
    unsigned char* ring = (unsigned char*)tile + TARFA_TILE_HEAD;
    float* xsh = nw ? (float*)((unsigned char*)tile + TARFA_TILE_SHARED) : nullptr;
    int total = jobs.row_start[jobs.n];
    int first = blockIdx.x * nr;
    int n = total - first < nr ? total - first : nr;
    int cols = jobs.job[0].cols, dtype = jobs.job[0].dtype;
    long long esz = dtype == TARFA_BF16 ? 2 : 4;
    if ((int)threadIdx.x < n) {
        int r;
        TarfaMatJob j = tarfa_job_of(jobs, first + threadIdx.x, &r);
        rowp[threadIdx.x] = j.w + (long long)r * cols * esz;
    }
    float wv[TARFA_TILE_NORM_AHEAD][4];
    if (nw) tarfa_tile_norm_weights(nw, ndtype, cols, wv);
    __syncthreads();
    int quad = threadIdx.x / 4, sub = threadIdx.x & 3;
    float acc[1][8];
    const float* x = jobs.job[0].x;
    tarfa_tile_acc<1>(rowp, n, cols, dtype, x, xsh, ring, quad, n, sub, acc, true, [&] {
        tarfa_grid_enter();
        if (nw) tarfa_tile_norm(x, nw, ndtype, cols, eps, wv, xsh, blockIdx.x == 0 ? xn : nullptr);
    });
    float v = tarfa_quad_fold(acc[0]);
    if (quad < n && sub == 0) {
        int r;
        TarfaMatJob j = tarfa_job_of(jobs, first + quad, &r);
        if (j.bias) v = __fadd_rn(v, tarfa_weight(j.bias, j.bias_dtype, r));
        j.y[r] = j.accumulate ? __fadd_rn(j.y[r], v) : v;
    }
}

// tarfa_e_moe_gate_up, tiled: `np` (slot, row) pairs per block (2·np ≤ TARFA_TILE_MAX_ROWS), the
// gate row and the up row of each in the tile, one quad per pair. hidden a multiple of 32.
extern "C" __global__ void tarfa_e_tmoe_gate_up(TarfaMoe m, const int* ids, int k, const float* x,
                                                float* h, int np) {
    TARFA_DYNAMIC_SHARED(float, tile);
    tarfa_grid_enter();
    const unsigned char** rowp = (const unsigned char**)tile;
    unsigned char* ring = (unsigned char*)tile + TARFA_TILE_HEAD;
    long long total = (long long)k * m.inter;
    long long first = (long long)blockIdx.x * np;
    int n = total - first < np ? (int)(total - first) : np;
    long long esz = m.dtype_gu == TARFA_BF16 ? 2 : 4;
    if ((int)threadIdx.x < 2 * n) {
        long long q = first + threadIdx.x / 2;
        int e = ids[q / m.inter];
        if (e < 0 || e >= m.n_experts) e = 0;  // never: ids come from tarfa_e_topk
        const unsigned long long* table = (threadIdx.x & 1) ? m.up : m.gate;
        rowp[threadIdx.x] = (const unsigned char*)table[e] + (long long)(q % m.inter) * m.hidden * esz;
    }
    __syncthreads();
    int quad = threadIdx.x / 4, sub = threadIdx.x & 3;
    float acc[2][8];
    tarfa_tile_acc<2>(rowp, 2 * n, m.hidden, m.dtype_gu, x, nullptr, ring, quad, n, sub, acc, false,
                      [] {});
    float g = tarfa_quad_fold(acc[0]);
    float u = tarfa_quad_fold(acc[1]);
    if (quad < n && sub == 0) h[first + quad] = tarfa_silu_mul(g, u);
}

// tarfa_e_moe_down, tiled: `nr` of the k·hidden rows per block, a quad each, each row with its
// slot's h. inter a multiple of 32, and nr divides hidden (a block's rows are of one slot).
extern "C" __global__ void tarfa_e_tmoe_down(TarfaMoe m, const int* ids, int k, const float* h,
                                             float* y, int nr) {
    TARFA_DYNAMIC_SHARED(float, tile);
    tarfa_grid_enter();
    const unsigned char** rowp = (const unsigned char**)tile;
    unsigned char* ring = (unsigned char*)tile + TARFA_TILE_HEAD;
    long long total = (long long)k * m.hidden;
    long long first = (long long)blockIdx.x * nr;
    int n = total - first < nr ? (int)(total - first) : nr;
    long long esz = m.dtype_d == TARFA_BF16 ? 2 : 4;
    if ((int)threadIdx.x < n) {
        long long q = first + threadIdx.x;
        int e = ids[q / m.hidden];
        if (e < 0 || e >= m.n_experts) e = 0;
        rowp[threadIdx.x] = (const unsigned char*)m.down[e] + (long long)(q % m.hidden) * m.inter * esz;
    }
    __syncthreads();
    int quad = threadIdx.x / 4, sub = threadIdx.x & 3;
    float acc[1][8];
    tarfa_tile_acc<1>(rowp, n, m.inter, m.dtype_d, h + (long long)(first / m.hidden) * m.inter,
                      nullptr, ring, quad, n, sub, acc, false, [] {});
    float v = tarfa_quad_fold(acc[0]);
    if (quad < n && sub == 0) y[first + quad] = v;
}
