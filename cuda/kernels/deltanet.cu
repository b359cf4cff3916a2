// Qwen3.5's Gated DeltaNet token mixer, one token (decode/src/family/qwen3_5_moe.rs,
// `delta_step`): the causal depthwise convolution over the last `kernel` projected vectors with
// SiLU (tarfa_e_delta_conv), then per value head the L2-normalised q and k, the decay, the
// delta-rule recurrence on the head's f32 state and the gated RMSNorm (tarfa_e_delta_heads).
// Each operation is the CPU's, in its order: the canonical dot for every dot, tarfa's exp, the
// same f64 logarithm in softplus.

// The widest key head tarfa_e_delta_heads keeps in registers (TARFA_DELTA_AHEAD per lane).
#define TARFA_DELTA_AHEAD 8
// State rows a warp of tarfa_e_delta_heads loads at once.
#define TARFA_DELTA_ROWS 4
// The most threads of a tarfa_e_delta_heads block (the host's delta_block): its launch bound, so
// that the compiler keeps a thread's rows, q and k (48 floats) within the registers 512 threads
// may each have (128).
#define TARFA_DELTA_THREADS 512
// The longest convolution tarfa_e_delta_conv takes (its dot's products each have a lane).
#define TARFA_DELTA_MAX_KERNEL 32

// canon::ln_f64: v = m·2^e with m in [√½, √2), ln m = 2·atanh((m−1)/(m+1)) by its series to
// degree 41, each operation rounded as Rust's f64 arithmetic rounds it (no contraction but the
// series' fused multiply-adds). For finite v > 0.
__device__ double tarfa_ln_f64(double v) {
    long long bits = __double_as_longlong(v);
    long long e = ((bits >> 52) & 0x7ff) - 1023;
    double m = __longlong_as_double((bits & 0x000fffffffffffffLL) | 0x3ff0000000000000LL);
    const double sqrt2 = __longlong_as_double(0x3ff6a09e667f3bcdLL);  // std's SQRT_2
    const double ln2 = __longlong_as_double(0x3fe62e42fefa39efLL);    // std's LN_2
    if (m > sqrt2) {
        m = __ddiv_rn(m, 2.0);
        e += 1;
    }
    double s = __ddiv_rn(__dsub_rn(m, 1.0), __dadd_rn(m, 1.0));
    double s2 = __dmul_rn(s, s);
    double p = 0.0;
    for (int k = 20; k >= 0; --k) p = __fma_rn(p, s2, __ddiv_rn(1.0, (double)(2 * k + 1)));
    return __dadd_rn(__dmul_rn(__dmul_rn(2.0, s), p), __dmul_rn((double)e, ln2));
}

// canon::softplus (torch's, β 1, threshold 20): x above 20 (and NaN) as it is, else
// ln(1 + e^x) with tarfa's e^x in f32 and the logarithm in f64 (u − u²/2 below 2⁻²⁰), rounded
// once to f32.
__device__ float tarfa_softplus(float x) {
    if (isnan(x) || x > 20.0f) return x;
    double u = (double)tarfa_exp(x);
    double l = u < __longlong_as_double(0x3eb0000000000000LL)  // 2^-20
                   ? __dsub_rn(u, __dmul_rn(__dmul_rn(0.5, u), u))
                   : tarfa_ln_f64(__dadd_rn(1.0, u));
    return __double2float_rn(l);
}

// The causal depthwise convolution of one token, a thread per channel: out[ch] =
// silu(dot(w[ch], [state[0][ch], …, state[kernel−2][ch], mixed[ch]])) — the canonical dot
// (kernel ≤ 32: product j in lane j, then the fold) — and the channel's history shifted by one,
// the token's value last (state: kernel − 1 rows of `channels` floats, oldest first, zeros
// before the first token).
extern "C" __global__ void tarfa_e_delta_conv(const float* mixed, const unsigned char* w,
                                              int wdtype, int channels, int kernel, float* state,
                                              float* out) {
    tarfa_grid_enter();
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= channels) return;
    float lanes[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) lanes[j] = 0.0f;
    float now = mixed[ch];
    for (int j = 0; j < kernel && j < TARFA_DELTA_MAX_KERNEL; ++j) {
        float x = j + 1 < kernel ? state[(long long)j * channels + ch] : now;
        lanes[j] = __fmaf_rn(tarfa_weight(w, wdtype, (long long)ch * kernel + j), x, 0.0f);
    }
    for (int step = 16; step > 0; step /= 2) {
        for (int i = 0; i < step; ++i) lanes[i] = __fadd_rn(lanes[i], lanes[i + step]);
    }
    out[ch] = tarfa_silu(lanes[0]);
    for (int j = 0; j + 1 < kernel - 1; ++j) {
        state[(long long)j * channels + ch] = state[(long long)(j + 1) * channels + ch];
    }
    if (kernel > 1) state[(long long)(kernel - 2) * channels + ch] = now;
}

// x (d floats) L2-normalised by one warp into dst: x · rsqrt(dot(x, x) + 1e-6), then, when
// `apply_div` (q), divided by `div` (the f32 of √dk).
__device__ void tarfa_delta_l2(const float* x, int d, float div, int apply_div, int lane,
                               float* dst) {
    float acc = 0.0f;
    for (int i = lane; i < d; i += 32) acc = __fmaf_rn(x[i], x[i], acc);
    float dot = __shfl_sync(TARFA_FULL, tarfa_warp_fold(acc), 0);
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(dot, 1e-6f)));
    for (int i = lane; i < d; i += 32) {
        float v = __fmul_rn(x[i], r);
        dst[i] = apply_div ? __fdiv_rn(v, div) : v;
    }
}

// One token through every value head of a Gated DeltaNet layer, a block per head h (at least two
// warps, any number: geometry only; shared memory 2·dk + dv floats): c is the convolution's output [q (k_heads·dk) | k
// (k_heads·dk) | v (v_heads·dv)]; head h reads key head h / (v_heads / k_heads). q and k
// L2-normalised (q also divided by q_div, the f32 of √dk); β = sigmoid(b[h]); the decay
// e^g, g = −e^(A_log[h]) · softplus(a[h] + dt_bias[h]). The head's state S (dv rows of dk
// floats at state + h·dv·dk, row j holding column j of the CPU's S) decays, then each row, a
// warp's: m = S_j·k, δ = (v_j − m)·β, S_j += k·δ (each product rounded, then the sum),
// o_j = S_j·q. Then the gated RMSNorm out = (w · (o · rsqrt(mean(o²) + eps))) · silu(z) into
// out[h·dv ..].
extern "C" __global__ void __launch_bounds__(TARFA_DELTA_THREADS) tarfa_e_delta_heads(const float* c, const float* z, const float* b,
                                               const float* a, const unsigned char* dt_bias,
                                               int dt_dtype, const unsigned char* a_log,
                                               int a_dtype,
                                               const unsigned char* norm_w, int ndtype,
                                               int k_heads, int v_heads, int dk, int dv,
                                               float q_div, float eps, float* state, float* out) {
    TARFA_DYNAMIC_SHARED(float, sm);  // q [dk], k [dk], o [dv]
    tarfa_grid_enter();
    int h = blockIdx.x;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int warps = blockDim.x / 32;
    int kh = h / (v_heads / k_heads);
    long long key_dim = (long long)k_heads * dk;
    float* qs = sm;
    float* ks = sm + dk;
    float* os = sm + 2 * dk;
    if (warp == 0) {
        tarfa_delta_l2(c + (long long)kh * dk, dk, q_div, 1, lane, qs);
    } else if (warp == 1) {
        tarfa_delta_l2(c + key_dim + (long long)kh * dk, dk, 1.0f, 0, lane, ks);
    }
    __syncthreads();
    const float* v = c + 2 * key_dim + (long long)h * dv;
    float beta = tarfa_sigmoid(b[h]);
    float sp = tarfa_softplus(__fadd_rn(a[h], tarfa_weight(dt_bias, dt_dtype, h)));
    float g = __fmul_rn(-tarfa_exp(tarfa_weight(a_log, a_dtype, h)), sp);
    float decay = tarfa_exp(g);
    float kv[TARFA_DELTA_AHEAD], qv[TARFA_DELTA_AHEAD];
#pragma unroll
    for (int t = 0; t < TARFA_DELTA_AHEAD; ++t) {
        int i = lane + 32 * t;
        kv[t] = i < dk ? ks[i] : 0.0f;
        qv[t] = i < dk ? qs[i] : 0.0f;
    }
    // A warp's rows j0, j0 + warps, … TARFA_DELTA_ROWS at a time: their state loaded together
    // (one round trip for the batch), then each row's operations in turn.
    for (int j0 = warp; j0 < dv; j0 += TARFA_DELTA_ROWS * warps) {
        float r[TARFA_DELTA_ROWS][TARFA_DELTA_AHEAD];
#pragma unroll
        for (int b = 0; b < TARFA_DELTA_ROWS; ++b) {
            int j = j0 + b * warps;
            const float* row = state + ((long long)h * dv + (j < dv ? j : 0)) * dk;
#pragma unroll
            for (int t = 0; t < TARFA_DELTA_AHEAD; ++t) {
                int i = lane + 32 * t;
                r[b][t] = j < dv && i < dk ? row[i] : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < TARFA_DELTA_ROWS; ++b) {
            int j = j0 + b * warps;
            if (j >= dv) break;  // the same for the whole warp
            float* row = state + ((long long)h * dv + j) * dk;
            float acc = 0.0f;
#pragma unroll
            for (int t = 0; t < TARFA_DELTA_AHEAD; ++t) {
                if (lane + 32 * t < dk) {
                    r[b][t] = __fmul_rn(r[b][t], decay);
                    acc = __fmaf_rn(r[b][t], kv[t], acc);
                }
            }
            float m = __shfl_sync(TARFA_FULL, tarfa_warp_fold(acc), 0);
            float delta = __fmul_rn(__fsub_rn(v[j], m), beta);
            acc = 0.0f;
#pragma unroll
            for (int t = 0; t < TARFA_DELTA_AHEAD; ++t) {
                int i = lane + 32 * t;
                if (i < dk) {
                    r[b][t] = __fadd_rn(r[b][t], __fmul_rn(kv[t], delta));
                    row[i] = r[b][t];
                    acc = __fmaf_rn(r[b][t], qv[t], acc);
                }
            }
            acc = tarfa_warp_fold(acc);
            if (lane == 0) os[j] = acc;
        }
    }
    __shared__ float scale;
    __syncthreads();
    if (warp == 0) {
        float rs = tarfa_rms_scale(os, dv, eps, lane);
        if (lane == 0) scale = rs;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        float y = __fmul_rn(tarfa_weight(norm_w, ndtype, i), __fmul_rn(os[i], scale));
        out[(long long)h * dv + i] = __fmul_rn(y, tarfa_silu(z[(long long)h * dv + i]));
    }
}
