// Attention of one token over the KV cache (blocks::attend): per-head q/k RMSNorm and NeoX RoPE,
// the cache's new row, scores by the canonical dot, tarfa's softmax, the weighted sum of values
// in position order.

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

// The attention of one query head at position `pos` once its q is rotated (qh, in shared memory
// after the 32 × d partials and sh_scores scores of `part`) and its key and value at pos are known
// (kh, vh: the bits the caches hold at pos): scores over the keys first..pos (a warp each: the
// canonical dot of k and q, times scaling), softmax on warp 0 (max, tarfa exp, the canonical
// sum, divide), then Σ_t a_t v_t for each of the d outputs in the canonical order: 32 lane
// partials (position index t mod 32, fused multiply-add in increasing t) in shared memory, folded
// by the fixed tree, into out_h (d floats; times sigmoid(gate[i]) when `gated`). With
// `has_sink` the softmax runs over the scores and then `sink` (blocks::attend_with: the last
// element of the canonical sum and a candidate for the max), whose weight is then dropped.
// Scores past sh_scores (the sink counted) go to scores_h. The whole block calls it.
__device__ void tarfa_attend(const float* qh, const float* kh, const float* vh, const float* kcache,
                             const float* vcache, int pos, int window, int kvh, int d,
                             long long width, float scaling, float* scores_h, float* part,
                             int sh_scores, const float* gate, int gated, float* out_h, float sink,
                             int has_sink) {
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int warps = blockDim.x / 32;
    int first = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    int n = pos - first + 1;
    // Key row i (position first + i): the cache's, the last one this block's own.
    auto key = [&](int i) -> const float* {
        return i == n - 1 ? kh : kcache + (long long)(first + i) * width + (long long)kvh * d;
    };
    float* sc = n + has_sink <= sh_scores ? part + 32 * d : scores_h;
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
        if (has_sink && lane == 0) sc[n] = sink;
        __syncwarp();
        tarfa_warp_softmax(sc, sc, n + has_sink, lane);
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
    for (int dd = threadIdx.x; dd < d; dd += blockDim.x) {
        out_h[dd] = gated ? __fmul_rn(part[dd], tarfa_sigmoid(gate[dd])) : part[dd];
    }
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
// when d ≤ 32·TARFA_HEAD_AHEAD. Query head h is q[h·qstride ..][0..d); with `gated` (Qwen3.5's
// gated attention: qstride = 2d, each head [q_h | gate_h]) the output is multiplied by
// sigmoid(gate_h) (canon::sigmoid, one product), as common::attention does before o_proj. With
// `sinks` (not null) head h's softmax takes the sink logit sinks[h] (of element type sink_dtype)
// last; `cap` is the stride of a head's scores in `scores`.
extern "C" __global__ void tarfa_e_attention(const float* q, const float* k, const float* v,
                                             const unsigned char* qn, const unsigned char* kn,
                                             int ndtype, int norm, float eps, int heads,
                                             int kv_heads, int d, int half, const float* cos_tab,
                                             const float* sin_tab, const int* params,
                                             float* kcache, float* vcache, int window,
                                             float scaling, float* scores, int cap, float* out,
                                             int sh_scores, int qstride, int gated,
                                             const unsigned char* sinks, int sink_dtype) {
    TARFA_DYNAMIC_SHARED(float, part);  // [32][d], sh_scores floats, q, key, 2 × scratch
    tarfa_grid_enter();
    int h = blockIdx.x;
    int lane = threadIdx.x % 32;
    int warp = threadIdx.x / 32;
    int pos = params[1];
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
            tarfa_head_norm_rope(q + (long long)h * qstride, qn, ndtype, norm, eps, d, half, c, s, lane,
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
    tarfa_attend(qh, kh, vh, kcache, vcache, pos, window, kvh, d, width, scaling,
                 scores + (long long)h * cap, part, sh_scores, q + (long long)h * qstride + d, gated,
                 out + (long long)h * d, sinks ? tarfa_weight(sinks, sink_dtype, h) : 0.0f,
                 sinks ? 1 : 0);
}

// out (heads × d) = each head's vd values (v: heads × vd) times `scale`, padded with +0 to d
// (common::attention's values of MiMo-V2-Flash: narrower and scaled, one product each).
extern "C" __global__ void tarfa_e_widen_heads(const float* v, int heads, int vd, int d,
                                               float scale, float* out) {
    tarfa_grid_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)heads * d) {
        long long h = i / d, j = i % d;
        out[i] = j < vd ? __fmul_rn(v[h * vd + j], scale) : 0.0f;
    }
}

// out (heads × vd) = each head's first vd outputs of attn (heads × d): values narrower than keys
// (MLA, MiMo-V2-Flash), as the CPU narrows the heads before o_proj.
extern "C" __global__ void tarfa_e_narrow_heads(const float* attn, int heads, int d, int vd,
                                                float* out) {
    tarfa_grid_enter();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < (long long)heads * vd) {
        long long h = i / vd;
        out[i] = attn[h * d + i % vd];
    }
}
