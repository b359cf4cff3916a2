// Multi-head latent attention's step between its products and the attention core
// (family/mla.rs, DeepSeek-V3's `DeepseekV3Attention`): each head's query and key assembled from
// the query's product, the latent and `kv_b_proj`'s product, their rotated dims turned by RoPE,
// the values padded to the key's width (the heads' outputs are narrowed back to the values'
// width for `o_proj` by attention.cu's tarfa_e_narrow_heads). Copies and RoPE only: no
// reduction.

// One block per head h at position pos = params[1], the query's and key's rotated dims (`rope`,
// after the `nope` others; with `interleave` stored as pairs (x0, x1), (x2, x3), … and taken as
// the NeoX halves [x0, x2, … | x1, x3, …] first, mla::deinterleave) turned by the NeoX rotation
// of the position's cos and sin rows (rope::Rope::apply: y_j = x_j·c + (−x_{j+h})·s,
// y_{j+h} = x_{j+h}·c + x_j·s, no fused multiply-add):
// - q (heads × (nope + rope)): head h's rotated dims in place;
// - k (heads × (nope + rope)): head h's [kvb's first nope of head h | the latent's rotated dims,
//   the one key every head shares, after its first `rank`];
// - v (heads × (nope + rope)): head h's [kvb's last vd of head h | zeros].
// kvb holds per head [k_nope (nope) | v (vd)]. Shared memory: `rope` floats (the query's
// rotated dims, read whole before any is written: with `interleave` a pair's elements are other
// threads' outputs).
extern "C" __global__ void tarfa_e_mla_heads(float* q, const float* latent, const float* kvb,
                                             int nope, int rope, int vd, int rank, int interleave,
                                             const float* cos_tab, const float* sin_tab,
                                             const int* params, float* k, float* v) {
    TARFA_DYNAMIC_SHARED(float, qr);  // [rope]
    tarfa_grid_enter();
    int h = blockIdx.x;
    int qk = nope + rope;
    int half = rope / 2;
    int pos = params[1];
    const float* c = cos_tab + (long long)pos * half;
    const float* s = sin_tab + (long long)pos * half;
    float* qh = q + (long long)h * qk;
    const float* kvh = kvb + (long long)h * (nope + vd);
    float* kh = k + (long long)h * qk;
    float* vh = v + (long long)h * qk;
    const float* kr = latent + rank;
    for (int i = threadIdx.x; i < rope; i += blockDim.x) {
        int src = interleave ? (i < half ? 2 * i : 2 * (i - half) + 1) : i;
        qr[i] = qh[nope + src];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float a = qr[j], b = qr[j + half];
        qh[nope + j] = __fadd_rn(__fmul_rn(a, c[j]), __fmul_rn(-b, s[j]));
        qh[nope + j + half] = __fadd_rn(__fmul_rn(b, c[j]), __fmul_rn(a, s[j]));
        float ka = kr[interleave ? 2 * j : j];
        float kb = kr[interleave ? 2 * j + 1 : j + half];
        kh[nope + j] = __fadd_rn(__fmul_rn(ka, c[j]), __fmul_rn(-kb, s[j]));
        kh[nope + j + half] = __fadd_rn(__fmul_rn(kb, c[j]), __fmul_rn(ka, s[j]));
    }
    for (int i = threadIdx.x; i < qk; i += blockDim.x) {
        if (i < nope) kh[i] = kvh[i];
        vh[i] = i < vd ? kvh[nope + i] : 0.0f;
    }
}
