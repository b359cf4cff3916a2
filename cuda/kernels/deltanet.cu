// Qwen3.5's Gated DeltaNet token mixer, one token (decode/src/family/qwen3_5_moe.rs,
// `delta_step`) in one launch, tarfa_e_delta_heads, a block per value head: the causal depthwise
// convolution of the head's channels over the last `kernel` projected vectors with SiLU, the
// L2-normalised q and k, the decay, the delta-rule recurrence on the head's f32 state and the
// gated RMSNorm.
// Each operation is the CPU's, in its order: the canonical dot for every dot, tarfa's exp, the
// same f64 logarithm in softplus.

// The most threads of a tarfa_e_delta_heads block (the host's delta_block): its launch bound, so
// that the compiler keeps a thread's rows, q and k (48 floats; 56 with kda.cu's decay per key
// channel) within the registers 512 threads may each have (128).
#define TARFA_DELTA_THREADS 512
// The longest convolution tarfa_delta_conv_at takes (its dot's products each have a lane).
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

// The causal depthwise convolution of channel ch at position pos, with SiLU: silu(dot(w[ch],
// [x(pos − kernel + 1), …, x(pos − 1), mixed[ch]])) — the canonical dot (kernel ≤ 32: product j
// in lane j, one fused multiply-add from +0, then the fold over the 32 lanes). The history is a
// ring of `kernel` rows of `channels` floats: x(p) is row p mod kernel (zeros before the first
// token: the ring is zeroed when a sequence starts). Row pos mod kernel is the one this step
// writes (the token's value, by one block) and no step reads it, so blocks may read and write
// the ring in one launch.
__device__ float tarfa_delta_conv_at(const float* mixed, const unsigned char* w, int wdtype,
                                     int channels, int kernel, const float* hist, int pos,
                                     int ch) {
    float lanes[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) lanes[j] = 0.0f;
    for (int j = 0; j < kernel && j < TARFA_DELTA_MAX_KERNEL; ++j) {
        int p = pos - (kernel - 1) + j;  // the position of window element j
        float x = j + 1 < kernel ? hist[(long long)(((p % kernel) + kernel) % kernel) * channels + ch]
                                 : mixed[ch];
        lanes[j] = __fmaf_rn(tarfa_weight(w, wdtype, (long long)ch * kernel + j), x, 0.0f);
    }
    for (int step = 16; step > 0; step /= 2) {
        for (int i = 0; i < step; ++i) lanes[i] = __fadd_rn(lanes[i], lanes[i + step]);
    }
    return tarfa_silu(lanes[0]);
}

// x (d floats, in shared memory) L2-normalised in place by one warp: x · rsqrt(dot(x, x) +
// 1e-6), then, when `apply_div` (q), divided by `div` (the f32 of √dk). Each lane writes only the
// elements it read, after the sum.
__device__ void tarfa_delta_l2(float* x, int d, float div, int apply_div, int lane) {
    float acc = 0.0f;
    for (int i = lane; i < d; i += 32) acc = __fmaf_rn(x[i], x[i], acc);
    float dot = __shfl_sync(TARFA_FULL, tarfa_warp_fold(acc), 0);
    float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(dot, 1e-6f)));
    for (int i = lane; i < d; i += 32) {
        float v = __fmul_rn(x[i], r);
        x[i] = apply_div ? __fdiv_rn(v, div) : v;
    }
}

// A warp's state rows j0, j0 + warps, … ROWS at a time (each row AHEAD · 32 ≥ dk wide): their
// state loaded together (one round trip for the batch), then each row's operations in turn —
// the decay, m = S_j·k, δ = (v_j − m)·β, S_j + k·δ (each product rounded, then the sum),
// o_j = S_j·q — o_j into os[j]. The decay is `decay` for every element, or with CH (KDA's, on
// the key axis) ds[i] for the elements of key channel i.
template <int AHEAD, int ROWS, bool CH>
__device__ __forceinline__ void tarfa_delta_rows(float* st, int dk, int dv, const float* qs,
                                                 const float* ks, const float* vs, float decay,
                                                 const float* ds, float beta, int warp, int warps,
                                                 int lane, float* os) {
    float kv[AHEAD], qv[AHEAD], dc[AHEAD];
#pragma unroll
    for (int t = 0; t < AHEAD; ++t) {
        int i = lane + 32 * t;
        kv[t] = i < dk ? ks[i] : 0.0f;
        qv[t] = i < dk ? qs[i] : 0.0f;
        dc[t] = CH ? (i < dk ? ds[i] : 0.0f) : decay;
    }
    for (int j0 = warp; j0 < dv; j0 += ROWS * warps) {
        float r[ROWS][AHEAD];
#pragma unroll
        for (int b = 0; b < ROWS; ++b) {
            int j = j0 + b * warps;
            const float* row = st + (long long)(j < dv ? j : 0) * dk;
#pragma unroll
            for (int t = 0; t < AHEAD; ++t) {
                int i = lane + 32 * t;
                r[b][t] = j < dv && i < dk ? row[i] : 0.0f;
            }
        }
#pragma unroll
        for (int b = 0; b < ROWS; ++b) {
            int j = j0 + b * warps;
            if (j >= dv) break;  // the same for the whole warp
            float* row = st + (long long)j * dk;
            float acc = 0.0f;
#pragma unroll
            for (int t = 0; t < AHEAD; ++t) {
                if (lane + 32 * t < dk) {
                    r[b][t] = __fmul_rn(r[b][t], dc[t]);
                    acc = __fmaf_rn(r[b][t], kv[t], acc);
                }
            }
            float m = __shfl_sync(TARFA_FULL, tarfa_warp_fold(acc), 0);
            float delta = __fmul_rn(__fsub_rn(vs[j], m), beta);
            acc = 0.0f;
#pragma unroll
            for (int t = 0; t < AHEAD; ++t) {
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
}

// One token through a Gated DeltaNet layer, a block per value head h (at least two warps, any
// number: geometry only; shared memory 2·dk + 2·dv floats). mixed is in_proj_qkv · x, [q
// (k_heads·dk) | k (k_heads·dk) | v (v_heads·dv)]; head h reads key head h / (v_heads /
// k_heads). The block convolves its channels (tarfa_delta_conv_at: its key head's q and k — as
// every block of that key head does, the same bits — and its own v), and stores the token's
// value of each in the history's row pos mod kernel (q and k by the key head's first block).
// Then q and k L2-normalised (q also divided by q_div, the f32 of √dk); β = sigmoid(b[h]); the
// decay e^g, g = −rate · softplus(a[h] + dt_bias[h]), the rate e^(A_log[h]) or, with a_neg,
// −a_log[h] (the weights hold −e^(A_log) as a GGUF's ssm_a does: the CPU's Rates::Neg); the
// head's state S (dv rows of dk floats at state + h·dv·dk, row j holding column j of the CPU's
// S) advanced row by row
// (tarfa_delta_rows); then the gated RMSNorm out = (w · (o · rsqrt(mean(o²) + eps))) · silu(z)
// into out[h·dv ..].
extern "C" __global__ void __launch_bounds__(TARFA_DELTA_THREADS) tarfa_e_delta_heads(
    const float* mixed, const unsigned char* conv_w, int conv_dtype, int kernel, float* hist,
    const int* params, const float* z, const float* b, const float* a,
    const unsigned char* dt_bias, int dt_dtype, const unsigned char* a_log, int a_dtype, int a_neg,
    const unsigned char* norm_w, int ndtype, int k_heads, int v_heads, int dk, int dv,
    float q_div, float eps, float* state, float* out) {
    TARFA_DYNAMIC_SHARED(float, sm);  // q [dk], k [dk], v [dv], o [dv]
    tarfa_grid_enter();
    int h = blockIdx.x;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int warps = blockDim.x / 32;
    int group = v_heads / k_heads;
    int kh = h / group;
    int pos = params[1];
    int key_dim = k_heads * dk;
    int channels = 2 * key_dim + v_heads * dv;
    float* qs = sm;
    float* ks = sm + dk;
    float* vs = sm + 2 * dk;
    float* os = vs + dv;
    // The block's channels: q's dk, k's dk, then its v's dv.
    for (int c = threadIdx.x; c < 2 * dk + dv; c += blockDim.x) {
        int ch = c < dk ? kh * dk + c
                 : c < 2 * dk ? key_dim + kh * dk + (c - dk)
                              : 2 * key_dim + h * dv + (c - 2 * dk);
        sm[c] = tarfa_delta_conv_at(mixed, conv_w, conv_dtype, channels, kernel, hist, pos, ch);
        if (c >= 2 * dk || h % group == 0) {
            hist[(long long)(pos % kernel) * channels + ch] = mixed[ch];
        }
    }
    __syncthreads();
    if (warp == 0) {
        tarfa_delta_l2(qs, dk, q_div, 1, lane);
    } else if (warp == 1) {
        tarfa_delta_l2(ks, dk, 1.0f, 0, lane);
    }
    __syncthreads();
    float beta = tarfa_sigmoid(b[h]);
    float sp = tarfa_softplus(__fadd_rn(a[h], tarfa_weight(dt_bias, dt_dtype, h)));
    float stored = tarfa_weight(a_log, a_dtype, h);
    float rate = a_neg ? -stored : tarfa_exp(stored);
    float g = __fmul_rn(-rate, sp);
    float decay = tarfa_exp(g);
    float* st = state + (long long)h * dv * dk;
    // Key heads up to 128 wide: eight rows a warp at once; wider (up to 256): four.
    if (dk <= 128) {
        tarfa_delta_rows<4, 8, false>(st, dk, dv, qs, ks, vs, decay, nullptr, beta, warp, warps,
                                      lane, os);
    } else {
        tarfa_delta_rows<8, 4, false>(st, dk, dv, qs, ks, vs, decay, nullptr, beta, warp, warps,
                                      lane, os);
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
