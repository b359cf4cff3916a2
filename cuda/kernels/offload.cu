// The offload path's kernels (offload.rs): products for a decoder whose attention, norms and
// routing run on the CPU — one expert's or a batch of experts' SwiGLU gate and down products, a
// warp per output row and token, the canonical dot (tarfa_warp_dot).

// gate and up are [rows, cols] of `dtype`; x is [tokens, cols]; h is [tokens, rows]; a `limit`
// above 0 clamps the two dots first (tarfa_swiglu_clamp).
extern "C" __global__ void tarfa_swiglu_gate(const unsigned char* gate, const unsigned char* up,
                                             int dtype, int rows, int cols, int tokens,
                                             float limit, const float* x, float* h) {
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
        tarfa_swiglu_clamp(g, u, limit);
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
                                                  int rows, int cols, int total, float limit,
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
        tarfa_swiglu_clamp(gv, uv, limit);
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
