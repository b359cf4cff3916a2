// GLM-5.3-Flash's Kimi delta attention (KDA) token mixer, one token (decode/src/family/kda.rs,
// `kda_step`) in one launch, tarfa_e_kda_heads, a block per head: the causal depthwise
// convolutions of the head's q, k and v channels with SiLU, the L2-normalised q (then scaled)
// and k, the forget gate per key channel, the delta-rule recurrence on the head's f32 state with
// that decay on the key axis, and the sigmoid-gated RMSNorm. Gated DeltaNet's pieces
// (deltanet.cu) where KDA computes as it does; each operation the CPU's, in its order.

// x (d floats, in shared memory) L2-normalised in place by one warp as FLA writes it:
// x / √(dot(x, x) + 1e-6) (a square root and a division, not Gated DeltaNet's reciprocal), then
// times `mul` when `apply_mul` (q: dim^-0.5). Each lane writes only the elements it read.
__device__ void tarfa_kda_l2(float* x, int d, float mul, int apply_mul, int lane) {
    float acc = 0.0f;
    for (int i = lane; i < d; i += 32) acc = __fmaf_rn(x[i], x[i], acc);
    float dot = __shfl_sync(TARFA_FULL, tarfa_warp_fold(acc), 0);
    float n = __fsqrt_rn(__fadd_rn(dot, 1e-6f));
    for (int i = lane; i < d; i += 32) {
        float v = __fdiv_rn(x[i], n);
        x[i] = apply_mul ? __fmul_rn(v, mul) : v;
    }
}

// transformers' KDA softplus (kda.rs's softplus_torch): g above 20 as it is, else
// ln(1 + e^g) with 1 + e^g summed in f32 and its logarithm in f64 (tarfa_ln_f64), rounded to
// f32. Not tarfa_softplus: no small-u branch, the sum in f32.
__device__ float tarfa_kda_softplus(float g) {
    if (g > 20.0f) return g;
    return __double2float_rn(tarfa_ln_f64((double)__fadd_rn(1.0f, tarfa_exp(g))));
}

// One token through a KDA layer, a block per head h (at least two warps, any number: geometry
// only; shared memory 5·dim floats). mixed is [q_proj·x | k_proj·x | v_proj·x] (3·heads·dim),
// conv_w their three convolutions' weights stacked ([3·heads·dim, kernel]); the history a ring
// of `kernel` rows of 3·heads·dim (tarfa_delta_conv_at). f is the forget gate's
// f_b_proj·f_a_proj·x, gate the output gate's, b b_proj·x (heads). Per key channel i of the
// head, g = f[i] + dt_bias[i] and the decay e^(lb·sigmoid(rate·g)) with a lower bound
// (has_lb), else e^(−rate·softplus(g)); the rate e^(A_log[h]) or, with a_neg, −a_log[h]. q and
// k L2-normalised (q times q_scale), β = sigmoid(b[h]), the state S (dim rows of dim floats at
// state + h·dim², row j holding column j of the CPU's S) advanced row by row with the decay of
// each key channel (tarfa_delta_rows), then out[h·dim ..] = (w · (o · rsqrt(mean(o²) + eps))) ·
// sigmoid(gate).
extern "C" __global__ void __launch_bounds__(TARFA_DELTA_THREADS) tarfa_e_kda_heads(
    const float* mixed, const unsigned char* conv_w, int conv_dtype, int kernel, float* hist,
    const int* params, const float* f, const float* b, const float* gate,
    const unsigned char* dt_bias, int dt_dtype, const unsigned char* a_log, int a_dtype, int a_neg,
    int has_lb, float lb, const unsigned char* norm_w, int ndtype, int heads, int dim,
    float q_scale, float eps, float* state, float* out) {
    TARFA_DYNAMIC_SHARED(float, sm);  // q [dim], k [dim], v [dim], o [dim], decay [dim]
    tarfa_grid_enter();
    int h = blockIdx.x;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int warps = blockDim.x / 32;
    int pos = params[1];
    int w = heads * dim;
    int channels = 3 * w;
    float* qs = sm;
    float* ks = sm + dim;
    float* vs = sm + 2 * dim;
    float* os = sm + 3 * dim;
    float* ds = sm + 4 * dim;
    float stored = tarfa_weight(a_log, a_dtype, h);
    float rate = a_neg ? -stored : tarfa_exp(stored);
    // The head's channels of q, k and v, each block its own: then each key channel's decay.
    for (int c = threadIdx.x; c < 3 * dim; c += blockDim.x) {
        int ch = (c / dim) * w + h * dim + c % dim;
        sm[c] = tarfa_delta_conv_at(mixed, conv_w, conv_dtype, channels, kernel, hist, pos, ch);
        hist[(long long)(pos % kernel) * channels + ch] = mixed[ch];
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        long long ch = (long long)h * dim + i;
        float g = __fadd_rn(f[ch], tarfa_weight(dt_bias, dt_dtype, ch));
        float e = has_lb ? __fmul_rn(lb, tarfa_sigmoid(__fmul_rn(rate, g)))
                         : __fmul_rn(-rate, tarfa_kda_softplus(g));
        ds[i] = tarfa_exp(e);
    }
    __syncthreads();
    if (warp == 0) {
        tarfa_kda_l2(qs, dim, q_scale, 1, lane);
    } else if (warp == 1) {
        tarfa_kda_l2(ks, dim, 1.0f, 0, lane);
    }
    __syncthreads();
    float beta = tarfa_sigmoid(b[h]);
    float* st = state + (long long)h * dim * dim;
    if (dim <= 128) {
        tarfa_delta_rows<4, 8, true>(st, dim, dim, qs, ks, vs, 0.0f, ds, beta, warp, warps, lane,
                                     os);
    } else {
        tarfa_delta_rows<8, 4, true>(st, dim, dim, qs, ks, vs, 0.0f, ds, beta, warp, warps, lane,
                                     os);
    }
    __shared__ float scale;
    __syncthreads();
    if (warp == 0) {
        float rs = tarfa_rms_scale(os, dim, eps, lane);
        if (lane == 0) scale = rs;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float y = __fmul_rn(tarfa_weight(norm_w, ndtype, i), __fmul_rn(os[i], scale));
        out[(long long)h * dim + i] = __fmul_rn(y, tarfa_sigmoid(gate[(long long)h * dim + i]));
    }
}
