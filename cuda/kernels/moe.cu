// Routed experts and the combine: the selected experts' SwiGLU on quads (gate and up, then
// down) — on warps when a K type is among them (tarfa_warp_acc) — and the combine of their
// outputs into the residual in slot order (blocks::combine), optionally with the next layer's
// input RMSNorm fused in.

// A layer's experts (or its dense MLP as one expert): per-expert matrix addresses.
struct TarfaMoe {
    const unsigned long long* gate;
    const unsigned long long* up;
    const unsigned long long* down;
    int n_experts;
    int inter;
    int hidden;
    int dtype_g;
    int dtype_u;
    int dtype_d;
    int vec_gu;
    int vec_d;
    // Above 0: every SwiGLU's gate and up clamped first (tarfa_swiglu_clamp; GLM-5.3-Flash's
    // swiglu_limit); 0, as they are.
    float limit;
};

// The unit (a quad or a warp) `unit`'s slot and row among k slots of `rows` rows each, and the
// slot's expert: a unit past the last computes the last row again and writes nothing (`live`).
struct TarfaSlotRow {
    int slot;
    int r;
    int e;
    bool live;
};

__device__ __forceinline__ TarfaSlotRow tarfa_slot_row(const TarfaMoe& m, const int* ids, int k,
                                                      long long unit, int rows) {
    long long total = (long long)k * rows;
    TarfaSlotRow s;
    s.live = unit < total;
    long long q = s.live ? unit : total - 1;
    s.slot = (int)(q / rows);
    s.r = (int)(q % rows);
    s.e = ids[s.slot];
    if (s.e < 0 || s.e >= m.n_experts) s.e = 0;  // never: ids come from tarfa_e_topk
    return s;
}

// Row r of expert e's matrix in `table` (cols elements of dtype a row).
__device__ __forceinline__ const unsigned char* tarfa_expert_row(const unsigned long long* table,
                                                                 int e, int r, int dtype,
                                                                 int cols) {
    return (const unsigned char*)table[e] + (long long)r * tarfa_row_bytes(dtype, cols);
}

// h[s][r] = silu(gate_e[r] · x) · (up_e[r] · x) for the expert e = ids[s] of each of k slots (the
// two dots clamped first when m.limit > 0, as in every gate/up kernel of the engine).
extern "C" __global__ void tarfa_e_moe_gate_up(TarfaMoe m, const int* ids, int k, const float* x,
                                               float* h) {
    tarfa_grid_enter();
    int sub = threadIdx.x & 3;
    TarfaSlotRow u = tarfa_slot_row(m, ids, k, ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 4, m.inter);
    const unsigned char* gr = tarfa_expert_row(m.gate, u.e, u.r, m.dtype_g, m.hidden);
    const unsigned char* ur = tarfa_expert_row(m.up, u.e, u.r, m.dtype_u, m.hidden);
    float acc[2][8];
    if (m.dtype_g == m.dtype_u) {
        // gate and up together: both rows' loads in flight at once, each row its own canonical dot.
        const unsigned char* rows[2] = {gr, ur};
        tarfa_quad_acc<2, TARFA_BATCH, true>(rows, m.dtype_g, x, m.hidden, sub, m.vec_gu, acc);
    } else {
        // Of two types (a GGUF may quantise them differently): each row alone, the same dots.
        tarfa_quad_acc<1, TARFA_BATCH, true>(&gr, m.dtype_g, x, m.hidden, sub, m.vec_gu, &acc[0]);
        tarfa_quad_acc<1, TARFA_BATCH, true>(&ur, m.dtype_u, x, m.hidden, sub, m.vec_gu, &acc[1]);
    }
    float g = tarfa_quad_fold(acc[0]);
    float v = tarfa_quad_fold(acc[1]);
    tarfa_swiglu_clamp(g, v, m.limit);
    if (u.live && sub == 0) h[(long long)u.slot * m.inter + u.r] = tarfa_silu_mul(g, v);
}

// y[s][r] = down_e[r] · h[s] for the expert e = ids[s] of each slot.
extern "C" __global__ void tarfa_e_moe_down(TarfaMoe m, const int* ids, int k, const float* h,
                                            float* y) {
    tarfa_grid_enter();
    int sub = threadIdx.x & 3;
    TarfaSlotRow u = tarfa_slot_row(m, ids, k, ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 4, m.hidden);
    const unsigned char* row = tarfa_expert_row(m.down, u.e, u.r, m.dtype_d, m.inter);
    float v = tarfa_quad_dot(row, m.dtype_d, h + (long long)u.slot * m.inter, m.inter, sub, m.vec_d);
    if (u.live && sub == 0) y[(long long)u.slot * m.hidden + u.r] = v;
}

// tarfa_e_moe_gate_up with a warp per (slot, row): gate or up of a K type.
extern "C" __global__ void tarfa_e_wmoe_gate_up(TarfaMoe m, const int* ids, int k, const float* x,
                                                float* h) {
    tarfa_grid_enter();
    int lane = threadIdx.x & 31;
    TarfaSlotRow u = tarfa_slot_row(m, ids, k, ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32, m.inter);
    const unsigned char* gr = tarfa_expert_row(m.gate, u.e, u.r, m.dtype_g, m.hidden);
    const unsigned char* ur = tarfa_expert_row(m.up, u.e, u.r, m.dtype_u, m.hidden);
    float acc[2];
    if (m.dtype_g == m.dtype_u) {
        const unsigned char* rows[2] = {gr, ur};
        tarfa_warp_acc<2>(rows, m.dtype_g, x, m.hidden, lane, acc);
    } else {
        tarfa_warp_acc<1>(&gr, m.dtype_g, x, m.hidden, lane, &acc[0]);
        tarfa_warp_acc<1>(&ur, m.dtype_u, x, m.hidden, lane, &acc[1]);
    }
    float g = tarfa_warp_fold(acc[0]);
    float v = tarfa_warp_fold(acc[1]);
    tarfa_swiglu_clamp(g, v, m.limit);
    if (u.live && lane == 0) h[(long long)u.slot * m.inter + u.r] = tarfa_silu_mul(g, v);
}

// tarfa_e_moe_down with a warp per row: down of a K type.
extern "C" __global__ void tarfa_e_wmoe_down(TarfaMoe m, const int* ids, int k, const float* h,
                                             float* y) {
    tarfa_grid_enter();
    int lane = threadIdx.x & 31;
    TarfaSlotRow u = tarfa_slot_row(m, ids, k, ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32, m.hidden);
    const unsigned char* row = tarfa_expert_row(m.down, u.e, u.r, m.dtype_d, m.inter);
    float acc[1];
    tarfa_warp_acc<1>(&row, m.dtype_d, h + (long long)u.slot * m.inter, m.inter, lane, acc);
    float v = tarfa_warp_fold(acc[0]);
    if (u.live && lane == 0) y[(long long)u.slot * m.hidden + u.r] = v;
}

// x[i] += Σ_s y[s][i] · w[s], the products rounded, added in slot order from slot 0
// (MoeOutputs), then the shared experts' output sh[i] when `sh` is not null (GLM's
// `routed + shared`; with `shw`, its product with *shw, Qwen3.5's `routed + gate · shared`), then
// the sum added to the residual — or with `set`, the sum alone stored (the MLP's output, which
// hyper-connections mix into their streams); returns the new x[i]. Eight slots'
// products are loaded together, then added in order (the loads were each a round trip in turn).
__device__ __forceinline__ float tarfa_shared_term(const float* sh, const float* shw, int i) {
    return shw ? __fmul_rn(*shw, sh[i]) : sh[i];
}

__device__ __forceinline__ float tarfa_combine_at(const float* y, const float* wts, int k,
                                                  int hidden, const float* sh, const float* shw,
                                                  float* x, int i, bool set = false) {
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
    if (sh) acc = __fadd_rn(acc, tarfa_shared_term(sh, shw, i));
    float v = set ? acc : __fadd_rn(x[i], acc);
    x[i] = v;
    return v;
}

// The experts' combine into the residual x, or with `set` stored there alone (tarfa_combine_at,
// a thread per element).
extern "C" __global__ void tarfa_e_moe_combine(const float* y, const float* wts, int k, int hidden,
                                               const float* sh, const float* shw, float* x,
                                               int set) {
    tarfa_grid_enter();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < hidden) tarfa_combine_at(y, wts, k, hidden, sh, shw, x, i, set != 0);
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
                                                const float* sh, const float* shw, float* x,
                                                const unsigned char* w, int wdtype, float eps,
                                                float* out) {
    // Over a chunk of tokens (Engine::prompt) block b is token b: its k slots' outputs, weights,
    // shared output and gate, residual and norm.
    long long b = blockIdx.x;
    y += b * k * n;
    wts += b * k;
    x += b * n;
    out += b * n;
    if (sh) sh += b * n;
    if (shw) shw += b;
    if (k > TARFA_COMBINE_AHEAD || n > TARFA_RMS_AHEAD * (int)blockDim.x || n > TARFA_RMS_STAGE) {
        tarfa_block_rms_norm([&](int i) { return tarfa_combine_at(y, wts, k, n, sh, shw, x, i); }, x,
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
            shv[j] = sh ? tarfa_shared_term(sh, shw, i) : 0.0f;
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
