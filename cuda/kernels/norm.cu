// The embedding lookup and RMSNorm (canon::rms_scale, blocks::rms_norm) of the resident
// decoder: the scale on one warp by the canonical order, the block's threads applying it.

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

// RMSNorm of x into out (tarfa_block_rms_norm), one block; over a chunk of tokens (Engine::prompt)
// block b normalises the b-th n floats of x into those of out.
extern "C" __global__ void tarfa_e_rms_norm(const float* x, const unsigned char* w, int wdtype,
                                            int n, float eps, float* out) {
    x += (long long)blockIdx.x * n;
    out += (long long)blockIdx.x * n;
    tarfa_block_rms_norm([&](int i) { return x[i]; }, x, w, wdtype, n, eps, out);
}
