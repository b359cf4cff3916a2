// The routers on one warp: the softmax router's native top-k (blocks::softmax_topk) and GLM's
// sigmoid group router (blocks::sigmoid_group_topk), each selection in canon's total order with
// its fixed tie rule.

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
// With `gw` (not null), also *gw = sigmoid(*gz): Qwen3.5's shared-expert gate (the weight of its
// shared expert's output, `sigmoid(shared_expert_gate · x)`), which may be the folded slot's
// weight wts[k].
__device__ void tarfa_topk(const float* z, int n, int k, int renorm, float* probs, int* ids,
                           float* wts, const float* gz, float* gw) {
    int lane = threadIdx.x;
    if (gw && lane == 0) *gw = tarfa_sigmoid(*gz);
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

extern "C" __global__ void tarfa_e_topk(const float* z, int n, int k, int renorm, float* probs,
                                        int* ids, float* wts, const float* gz, float* gw) {
    tarfa_grid_enter();
    tarfa_topk(z, n, k, renorm, probs, ids, wts, gz, gw);
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
// kept (score descending, ties: the lower group) and every other expert's c set to −∞; the k
// largest c in selection order (ties: the lower id); each slot's weight the unbiased s, divided
// by (their canonical sum + 1e-20) when `renorm`, then multiplied by `scale`. `scratch` holds
// 3·n floats (s, c, the group scores). The orders are the CPU's `descending` (0.0 and −0.0
// equal, else f32::total_cmp), so ties fall where they fall there. A NaN logit does not: the
// GPU's arithmetic gives NaN its own sign and payload (spec/EXACTNESS.md: finite inputs only).
__device__ void tarfa_sigmoid_topk(const float* z, int n, const unsigned char* bias, int bias_dtype,
                                   int k, int n_group, int topk_group, int renorm, float scale,
                                   float* scratch, int* ids, float* wts) {
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
            if (!(g == last_id || tarfa_before(gkey(g), g, last_key, last_id)))
                c[i] = __int_as_float(0xff800000);  // -inf
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

extern "C" __global__ void tarfa_e_sigmoid_topk(const float* z, int n, const unsigned char* bias,
                                                int bias_dtype, int k, int n_group,
                                                int topk_group, int renorm, float scale,
                                                float* scratch, int* ids, float* wts) {
    tarfa_grid_enter();
    tarfa_sigmoid_topk(z, n, bias, bias_dtype, k, n_group, topk_group, renorm, scale, scratch, ids,
                       wts);
}
