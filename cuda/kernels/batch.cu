// ================================================================================================
// Prompts as matrices: a chunk of T tokens of one sequence in one pass (Engine::prompt).
//
// Every output is the value the one-token kernels give it: a product's (row, token) is the
// canonical dot — element k in logical lane k mod 32, each lane's fused multiply-adds in
// increasing k from +0, the lanes folded by the fixed tree — with its bias, then added to the
// residual when it accumulates; only which outputs share a block's registers changes. A warp holds
// the 32 lane partials of RW × TW outputs (lane l of the warp is logical lane l of each), so a
// weight read into shared memory serves TW tokens and a token's x RW rows: the register blocking
// of a matrix product with the dot's order untouched. Past a row's last element the tiles hold
// +0, and a lane whose element would lie there takes no step, as the CPU's lane has none.
// ================================================================================================

#define TARFA_MM_THREADS 256
#define TARFA_MM_RW 8                                   // rows per warp
#define TARFA_MM_TW 8                                   // tokens per warp
#define TARFA_MM_WR 4                                   // warps along rows
#define TARFA_MM_WT 2                                   // warps along tokens
#define TARFA_MM_BR (TARFA_MM_RW * TARFA_MM_WR)         // rows per block: 32
#define TARFA_MM_BT (TARFA_MM_TW * TARFA_MM_WT)         // tokens per block: 16
#define TARFA_MM_KC 64                                  // elements of k per stage
static_assert(TARFA_MM_THREADS == 32 * TARFA_MM_WR * TARFA_MM_WT, "a warp per sub-tile");
static_assert(TARFA_MM_BR * TARFA_MM_KC == 8 * TARFA_MM_THREADS, "eight weights per thread a stage");
static_assert(TARFA_MM_BT * TARFA_MM_KC == 4 * TARFA_MM_THREADS, "four x values per thread a stage");

// This thread's operands in a block's tile (each thread loads eight weights of row
// threadIdx.x / 8 and four x values of column threadIdx.x / 16 a stage): its row of `dtype` (null:
// past the matrix, read as +0) and its token column (null: none, +0); K elements each. `vec_w`:
// every row is 16-byte aligned at each multiple of 8 elements; `vec_x`: every column at each
// multiple of 4 (checked by the host).
struct TarfaMmTile {
    const unsigned char* row;
    int dtype;
    const float* col;
    int k;
    int vec_w;
    int vec_x;
};

// This thread's share of a stage at k0: eight consecutive weights of one row, four consecutive x
// values of one column (widened or dequantised as every kernel does: tarfa_weight's values).
__device__ __forceinline__ void tarfa_mm_fetch(const TarfaMmTile& t, int k0, float* w, float* x) {
    int wk = k0 + (threadIdx.x % 8) * 8;
    const unsigned char* row = t.row;
    int dt = t.dtype;
    if (row && t.vec_w && wk + 8 <= t.k && dt == TARFA_BF16) {
        tarfa_unpack_bf16x8(*(const uint4*)(row + (long long)wk * 2), w);
    } else if (row && t.vec_w && wk + 8 <= t.k && dt == TARFA_F32) {
        float4 a = *(const float4*)(row + (long long)wk * 4);
        float4 b = *(const float4*)(row + (long long)wk * 4 + 16);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
        w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) w[j] = row && wk + j < t.k ? tarfa_weight(row, dt, wk + j) : 0.0f;
    }
    int xk = k0 + (threadIdx.x % 16) * 4;
    const float* col = t.col;
    if (col && t.vec_x && xk + 4 <= t.k) {
        float4 a = *(const float4*)(col + xk);
        x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) x[j] = col && xk + j < t.k ? col[xk + j] : 0.0f;
    }
}

__device__ __forceinline__ void tarfa_mm_put(float (*ws)[TARFA_MM_KC], float (*xs)[TARFA_MM_KC],
                                             const float* w, const float* x) {
    int r = threadIdx.x / 8, wk = (threadIdx.x % 8) * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) ws[r][wk + j] = w[j];
    int c = threadIdx.x / 16, xk = (threadIdx.x % 16) * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) xs[c][xk + j] = x[j];
}

// One level of the canonical fold (canon::fold_lanes: lane i += lane i + o, for o = 16, 8, 4, 2, 1)
// of N values a lane holds, each the partial of another dot: the pair of lanes o apart split them,
// the lower lane (bit o clear) taking the first N/2 dots' nodes and the upper lane the rest, each
// adding its own partial to its partner's: every dot's node is still l[i] + l[i + o] of the tree
// (an addition of two values, in either order the same bits). After the levels 16..1 a lane holds
// N/32 dots whole, and 62 shuffles did the work of 64 warp folds' 320.
template <int N>
__device__ __forceinline__ void tarfa_mm_fold_level(float* a, int lane, int o) {
    bool hi = (lane & o) != 0;
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
        float send = hi ? a[j] : a[j + N / 2];
        float keep = hi ? a[j + N / 2] : a[j];
        a[j] = __fadd_rn(keep, __shfl_xor_sync(TARFA_FULL, send, o));
    }
}
static_assert(TARFA_MM_RW * TARFA_MM_TW == 64, "the fold leaves each lane two dots");

// The tile's BR × BT canonical dots into out[r][c] (shared memory; every thread may read them
// after the block's barrier at the end). Stages of KC elements pass through two shared buffers:
// the next stage's loads are issued before this one's multiply-adds. Lane l of warp (wr, wt)
// accumulates elements l, l + 32, … of rows wr·RW + i and columns wt·TW + j in increasing k.
__device__ __forceinline__ void tarfa_mm_tile(const TarfaMmTile& t,
                                              float (*out)[TARFA_MM_BT]) {
    __shared__ float ws[2][TARFA_MM_BR][TARFA_MM_KC];
    __shared__ float xs[2][TARFA_MM_BT][TARFA_MM_KC];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int wr = warp % TARFA_MM_WR, wt = warp / TARFA_MM_WR;
    float acc[TARFA_MM_RW][TARFA_MM_TW];
#pragma unroll
    for (int i = 0; i < TARFA_MM_RW; ++i)
#pragma unroll
        for (int j = 0; j < TARFA_MM_TW; ++j) acc[i][j] = 0.0f;
    int stages = (t.k + TARFA_MM_KC - 1) / TARFA_MM_KC;
    float w[8], x[4];
    if (stages > 0) {
        tarfa_mm_fetch(t, 0, w, x);
        tarfa_mm_put(ws[0], xs[0], w, x);
    }
    __syncthreads();
    for (int s = 0; s < stages; ++s) {
        int b = s & 1;
        if (s + 1 < stages) tarfa_mm_fetch(t, (s + 1) * TARFA_MM_KC, w, x);
        // The last stage may run past K: a lane past it takes no step (the CPU's lane has no
        // element there; a step of the +0 padding could turn a −0 partial into +0).
        bool tail = (s + 1) * TARFA_MM_KC > t.k;  // the same for the whole block
#pragma unroll
        for (int kk = 0; kk < TARFA_MM_KC; kk += 32) {
            if (tail && s * TARFA_MM_KC + kk + lane >= t.k) continue;
            float wv[TARFA_MM_RW], xv[TARFA_MM_TW];
#pragma unroll
            for (int i = 0; i < TARFA_MM_RW; ++i) wv[i] = ws[b][wr * TARFA_MM_RW + i][kk + lane];
#pragma unroll
            for (int j = 0; j < TARFA_MM_TW; ++j) xv[j] = xs[b][wt * TARFA_MM_TW + j][kk + lane];
#pragma unroll
            for (int i = 0; i < TARFA_MM_RW; ++i)
#pragma unroll
                for (int j = 0; j < TARFA_MM_TW; ++j) acc[i][j] = __fmaf_rn(wv[i], xv[j], acc[i][j]);
        }
        if (s + 1 < stages) tarfa_mm_put(ws[b ^ 1], xs[b ^ 1], w, x);
        __syncthreads();
    }
    // The fold of the warp's RW·TW dots at once: each level of the tree halves the values a lane
    // holds (tarfa_mm_fold_level); the last leaves each lane two dots.
    float* a = &acc[0][0];
    tarfa_mm_fold_level<TARFA_MM_RW * TARFA_MM_TW>(a, lane, 16);
    tarfa_mm_fold_level<TARFA_MM_RW * TARFA_MM_TW / 2>(a, lane, 8);
    tarfa_mm_fold_level<TARFA_MM_RW * TARFA_MM_TW / 4>(a, lane, 4);
    tarfa_mm_fold_level<TARFA_MM_RW * TARFA_MM_TW / 8>(a, lane, 2);
    tarfa_mm_fold_level<TARFA_MM_RW * TARFA_MM_TW / 16>(a, lane, 1);
    // Lane bits b4..b0 chose the upper half at levels 16..1: its dots are v = b4 b3 b2 b1 b0 j.
    int v0 = ((lane >> 4 & 1) << 5) | ((lane >> 3 & 1) << 4) | ((lane >> 2 & 1) << 3) |
             ((lane >> 1 & 1) << 2) | ((lane & 1) << 1);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        int v = v0 + j;
        out[wr * TARFA_MM_RW + v / TARFA_MM_TW][wt * TARFA_MM_TW + v % TARFA_MM_TW] = a[j];
    }
    __syncthreads();
}

// Which job of `jobs` owns row tile `rt` (each job's rows in tiles of BR, in job order) and the
// tile's first row in it; -1 past the last.
__device__ __forceinline__ int tarfa_mm_job(const TarfaMatJobs& jobs, int rt, int* r0) {
    int first = 0;
    for (int i = 0; i < jobs.n && i < TARFA_MAX_JOBS; ++i) {
        int rows = jobs.row_start[i + 1] - jobs.row_start[i];
        int tiles = (rows + TARFA_MM_BR - 1) / TARFA_MM_BR;
        if (rt < first + tiles) {
            *r0 = (rt - first) * TARFA_MM_BR;
            return i;
        }
        first += tiles;
    }
    return -1;
}

// The products of tarfa_e_matvec over `tokens` tokens: token t's x is job.x + t·cols and its
// output job.y + t·rows (each value: the canonical dot, + bias, + the old y when accumulating).
// Block b: token tile b mod ⌈tokens / BT⌉ (so the blocks that share a row tile run together and
// its weights come from L2) of row tile b / that, row tiles numbered across the jobs.
extern "C" __global__ void __launch_bounds__(TARFA_MM_THREADS) tarfa_e_mm(TarfaMatJobs jobs, int tokens) {
    __shared__ float out[TARFA_MM_BR][TARFA_MM_BT];
    tarfa_grid_enter();
    int nt = (tokens + TARFA_MM_BT - 1) / TARFA_MM_BT;
    int t0 = (blockIdx.x % nt) * TARFA_MM_BT, r0 = 0;
    int ji = tarfa_mm_job(jobs, blockIdx.x / nt, &r0);
    if (ji < 0) return;  // the same for the whole block
    TarfaMatJob j = jobs.job[0];
    if (ji == 1) j = jobs.job[1];
    if (ji == 2) j = jobs.job[2];
    if (ji == 3) j = jobs.job[3];
    int rows = jobs.row_start[ji + 1] - jobs.row_start[ji];
    TarfaMmTile t;
    int mr = r0 + threadIdx.x / 8, mc = t0 + threadIdx.x / 16;
    t.row = mr < rows ? j.w + (long long)mr * tarfa_row_bytes(j.dtype, j.cols) : nullptr;
    t.dtype = j.dtype;
    t.col = mc < tokens ? j.x + (long long)mc * j.cols : nullptr;
    t.k = j.cols;
    t.vec_w = j.vec;
    t.vec_x = j.cols % 4 == 0;
    tarfa_mm_tile(t, out);
    for (int i = threadIdx.x; i < TARFA_MM_BR * TARFA_MM_BT; i += blockDim.x) {
        int r = i % TARFA_MM_BR, c = i / TARFA_MM_BR;
        if (r0 + r < rows && t0 + c < tokens) {
            float v = out[r][c];
            if (j.bias) v = __fadd_rn(v, tarfa_weight(j.bias, j.bias_dtype, r0 + r));
            float* y = j.y + (long long)(t0 + c) * rows + r0 + r;
            *y = j.accumulate ? __fadd_rn(*y, v) : v;
        }
    }
}

// ---- Routed experts over a chunk ----------------------------------------------------------------
// The chunk's (token, slot) pairs p = token · kk + slot (kk slots a token, the folded shared
// experts' among them) grouped by expert: `order` lists the pairs expert by expert (each expert's
// in increasing p), `tiles` holds [count, then (expert, first, n) per tile]: up to BT pairs of one
// expert, order[first .. first + n). Each selected expert's rows are read once per tile of its
// pairs; every pair's output is its own canonical dots, so the grouping changes no bit.

// One block: ids[p] for p < pairs (experts < n_experts ≤ 1024), into order and tiles.
extern "C" __global__ void tarfa_e_moe_group(const int* ids, int pairs, int n_experts, int* order,
                                             int* tiles) {
    __shared__ int count[1024];  // experts ≤ 1024 (the host checks)
    __shared__ int start[1025];
    __shared__ int tile0[1025];
    tarfa_grid_enter();
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
        int c = 0;
        for (int p = 0; p < pairs; ++p) c += ids[p] == e;
        count[e] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, tl = 0;
        for (int e = 0; e < n_experts; ++e) {
            start[e] = s;
            tile0[e] = tl;
            s += count[e];
            tl += (count[e] + TARFA_MM_BT - 1) / TARFA_MM_BT;
        }
        start[n_experts] = s;
        tile0[n_experts] = tl;
        tiles[0] = tl;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
        int at = start[e];
        for (int p = 0; p < pairs; ++p)
            if (ids[p] == e) order[at++] = p;
        int tl = tile0[e];
        for (int c = 0; c < count[e]; c += TARFA_MM_BT, ++tl) {
            tiles[1 + 3 * tl] = e;
            tiles[2 + 3 * tl] = start[e] + c;
            tiles[3 + 3 * tl] = count[e] - c < TARFA_MM_BT ? count[e] - c : TARFA_MM_BT;
        }
    }
}

// Block b's pair tile (b mod max_tiles) and row tile (b / max_tiles); false when past the count.
__device__ __forceinline__ bool tarfa_mm_pairs(const int* tiles, int max_tiles, int* e, int* first,
                                               int* n, int* rt) {
    int ti = blockIdx.x % max_tiles;
    *rt = blockIdx.x / max_tiles;
    if (ti >= tiles[0]) return false;
    *e = tiles[1 + 3 * ti];
    *first = tiles[2 + 3 * ti];
    *n = tiles[3 + 3 * ti];
    return true;
}

// h[p][r] = silu(gate_e[r] · x[p / kk]) · (up_e[r] · x[p / kk]) for each pair p of expert e, a
// tile's rows BR/2 gate rows and the same BR/2 up rows (tarfa_e_moe_gate_up's values).
extern "C" __global__ void __launch_bounds__(TARFA_MM_THREADS) tarfa_e_mm_gate_up(
    TarfaMoe m, const int* order, const int* tiles, int max_tiles, int kk, const float* x, float* h) {
    __shared__ float out[TARFA_MM_BR][TARFA_MM_BT];
    __shared__ int pair[TARFA_MM_BT];
    tarfa_grid_enter();
    int e, first, n, rt;
    if (!tarfa_mm_pairs(tiles, max_tiles, &e, &first, &n, &rt)) return;
    const int half = TARFA_MM_BR / 2;
    int r0 = rt * half;
    TarfaMmTile t;
    int mr = threadIdx.x / 8, mc = threadIdx.x / 16;
    int rr = r0 + mr % half;
    bool up = mr >= half;
    t.dtype = up ? m.dtype_u : m.dtype_g;
    t.row = rr < m.inter ? tarfa_expert_row(up ? m.up : m.gate, e, rr, t.dtype, m.hidden) : nullptr;
    int p = mc < n ? order[first + mc] : -1;
    if (threadIdx.x < TARFA_MM_BT) pair[threadIdx.x] = threadIdx.x < n ? order[first + threadIdx.x] : -1;
    t.col = p >= 0 ? x + (long long)(p / kk) * m.hidden : nullptr;
    t.k = m.hidden;
    t.vec_w = m.vec_gu;
    t.vec_x = m.hidden % 4 == 0;
    tarfa_mm_tile(t, out);
    for (int i = threadIdx.x; i < half * TARFA_MM_BT; i += blockDim.x) {
        int r = i % half, c = i / half;
        if (r0 + r < m.inter && c < n) {
            float g = out[r][c], u = out[r + half][c];
            tarfa_swiglu_clamp(g, u, m.limit);
            h[(long long)pair[c] * m.inter + r0 + r] = tarfa_silu_mul(g, u);
        }
    }
}

// y[p][r] = down_e[r] · h[p] for each pair p of expert e (tarfa_e_moe_down's values).
extern "C" __global__ void __launch_bounds__(TARFA_MM_THREADS) tarfa_e_mm_down(
    TarfaMoe m, const int* order, const int* tiles, int max_tiles, const float* h, float* y) {
    __shared__ float out[TARFA_MM_BR][TARFA_MM_BT];
    __shared__ int pair[TARFA_MM_BT];
    tarfa_grid_enter();
    int e, first, n, rt;
    if (!tarfa_mm_pairs(tiles, max_tiles, &e, &first, &n, &rt)) return;
    int r0 = rt * TARFA_MM_BR;
    TarfaMmTile t;
    int mr = r0 + threadIdx.x / 8, mc = threadIdx.x / 16;
    t.row = mr < m.hidden ? tarfa_expert_row(m.down, e, mr, m.dtype_d, m.inter) : nullptr;
    t.dtype = m.dtype_d;
    int p = mc < n ? order[first + mc] : -1;
    if (threadIdx.x < TARFA_MM_BT) pair[threadIdx.x] = threadIdx.x < n ? order[first + threadIdx.x] : -1;
    t.col = p >= 0 ? h + (long long)p * m.inter : nullptr;
    t.k = m.inter;
    t.vec_w = m.vec_d;
    t.vec_x = m.inter % 4 == 0;
    tarfa_mm_tile(t, out);
    for (int i = threadIdx.x; i < TARFA_MM_BR * TARFA_MM_BT; i += blockDim.x) {
        int r = i % TARFA_MM_BR, c = i / TARFA_MM_BR;
        if (r0 + r < m.hidden && c < n) y[(long long)pair[c] * m.hidden + r0 + r] = out[r][c];
    }
}

// ---- The glue over a chunk ---------------------------------------------------------------------

// x[t] = the embedding row of tokens[t], for t < T: block b covers elements of token b / per.
extern "C" __global__ void tarfa_e_embed_many(const unsigned char* table, int dtype, int hidden,
                                              const int* tokens, int per, float* x) {
    tarfa_grid_enter();
    int t = blockIdx.x / per;
    int i = (blockIdx.x % per) * blockDim.x + threadIdx.x;
    if (i < hidden) {
        x[(long long)t * hidden + i] = tarfa_weight(table, dtype, (long long)tokens[t] * hidden + i);
    }
}

// The keys and values of the chunk's tokens into the caches (tarfa_e_attention's store): block b
// is token b / kv_heads at position pos0 + that, KV head b mod kv_heads; one warp; shared memory d
// floats.
extern "C" __global__ void tarfa_e_kv_store(const float* k, const float* v, const unsigned char* kn,
                                            int ndtype, int norm, float eps, int kv_heads, int d,
                                            int half, const float* cos_tab, const float* sin_tab,
                                            int pos0, float* kcache, float* vcache) {
    TARFA_DYNAMIC_SHARED(float, buf);
    tarfa_grid_enter();
    int t = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads;
    int lane = threadIdx.x;
    long long width = (long long)kv_heads * d;
    long long pos = pos0 + t;
    const float* c = cos_tab + pos * half;
    const float* s = sin_tab + pos * half;
    float* kd = kcache + pos * width + (long long)kvh * d;
    float* vd = vcache + pos * width + (long long)kvh * d;
    tarfa_head_norm_rope(k + (long long)t * width + (long long)kvh * d, kn, ndtype, norm, eps, d, half,
                         c, s, lane, buf, kd);
    const float* vs = v + (long long)t * width + (long long)kvh * d;
    for (int i = lane; i < d; i += 32) vd[i] = vs[i];
}

// Attention of the chunk's tokens, their keys and values already in the caches
// (tarfa_e_kv_store): block b is token b / heads at position pos0 + that, query head b mod heads,
// as tarfa_e_attention computes it (tarfa_attend), its own key and value read from the caches
// (the bits it stored). Scores past `sh_scores` go to scores[(t · heads + h) · cap ..].
extern "C" __global__ void tarfa_e_attention_many(const float* q, const unsigned char* qn, int ndtype,
                                                  int norm, float eps, int heads, int kv_heads,
                                                  int d, int half, const float* cos_tab,
                                                  const float* sin_tab, int pos0, float* kcache,
                                                  float* vcache, int window, float scaling,
                                                  float* scores, int cap, float* out,
                                                  int sh_scores, int qstride, int gated) {
    TARFA_DYNAMIC_SHARED(float, part);  // as tarfa_e_attention's
    tarfa_grid_enter();
    int t = blockIdx.x / heads, h = blockIdx.x % heads;
    int lane = threadIdx.x % 32;
    int pos = pos0 + t;
    int group = heads / kv_heads;
    int kvh = h / group;
    long long width = (long long)kv_heads * d;
    float* qh = part + 32 * d + sh_scores;
    const float* qt = q + (long long)t * heads * qstride + (long long)h * qstride;
    if (threadIdx.x < 32) {
        tarfa_head_norm_rope(qt, qn, ndtype, norm, eps, d, half, cos_tab + (long long)pos * half,
                             sin_tab + (long long)pos * half, lane, qh + d, qh);
    }
    __syncthreads();
    const float* kl = kcache + (long long)pos * width + (long long)kvh * d;
    const float* vl = vcache + (long long)pos * width + (long long)kvh * d;
    tarfa_attend(qh, kl, vl, kcache, vcache, pos, window, kvh, d, width, scaling,
                 scores ? scores + ((long long)t * heads + h) * cap : nullptr, part, sh_scores, qt + d, gated,
                 out + (long long)t * heads * d + (long long)h * d, 0.0f, 0);
}

// ---- Attention over a chunk, query heads four at a time --------------------------------------
// tarfa_e_attention_many's values, with the keys and values a block reads serving up to
// TARFA_ATTN_Q query heads of one KV head's group (one token): each score is still one canonical
// dot (element i of the head in lane i mod 32, fused multiply-adds in increasing i, the fixed
// tree), each output element still Σ_t a_t v_t as 32 lane partials (position index t mod 32, in
// increasing t) folded by the fixed tree — only the folds of 32 such dots run together
// (tarfa_mm_fold_level), in registers instead of shared memory.
#define TARFA_ATTN_Q 4
// Key rows a warp takes at once for scores, and a head's output elements it takes at once in the
// weighted sum: with TARFA_ATTN_Q heads, 32 dots, one a lane after the fold.
#define TARFA_ATTN_QR (32 / TARFA_ATTN_Q)
#define TARFA_ATTN_QE (32 / TARFA_ATTN_Q)
#define TARFA_ATTN_Q_THREADS 256
static_assert(TARFA_ATTN_Q_THREADS / 32 >= TARFA_ATTN_Q, "a warp rotates each head's q");
static_assert(TARFA_ATTN_QE == 8, "two 16-byte loads of a value row a position");

// Block b: token b / (kv_heads · quads) at position pos0 + that, KV head (b / quads) mod kv_heads,
// its group's query heads from (b mod quads) · TARFA_ATTN_Q (quads = ⌈group / TARFA_ATTN_Q⌉: the
// group's last block may hold fewer). The host launches it for d ≤ 32·TARFA_HEAD_AHEAD and
// d a multiple of 8 (tarfa_e_attention_many otherwise). Shared memory: the heads' rotated q
// (TARFA_ATTN_Q · d floats), their scratch (as many), then their scores, sh_scores floats a head,
// when there are at most sh_scores of them (else scores[(t · heads + h) · cap ..], as
// tarfa_e_attention_many's). Arguments as tarfa_e_attention_many's.
extern "C" __global__ void __launch_bounds__(TARFA_ATTN_Q_THREADS) tarfa_e_attention_quads(
    const float* q, const unsigned char* qn, int ndtype, int norm, float eps, int heads, int kv_heads,
    int d, int half, const float* cos_tab, const float* sin_tab, int pos0, float* kcache,
    float* vcache, int window, float scaling, float* scores, int cap, float* out, int sh_scores,
    int qstride, int gated) {
    TARFA_DYNAMIC_SHARED(float, smem);
    tarfa_grid_enter();
    int group = heads / kv_heads;
    int quads = (group + TARFA_ATTN_Q - 1) / TARFA_ATTN_Q;
    int t = blockIdx.x / (kv_heads * quads);
    int kvh = (blockIdx.x / quads) % kv_heads;
    int g0 = (blockIdx.x % quads) * TARFA_ATTN_Q;
    int h0 = kvh * group + g0;
    int nq = group - g0 < TARFA_ATTN_Q ? group - g0 : TARFA_ATTN_Q;
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    int pos = pos0 + t;
    int first = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    int n = pos - first + 1;
    long long width = (long long)kv_heads * d;
    const float* qt = q + (long long)t * heads * qstride;
    float* qs = smem;
    float* scratch = qs + TARFA_ATTN_Q * d;
    // Head h0 + i's scores at sc + i · scs.
    bool in_shared = n <= sh_scores;
    float* sc = in_shared ? scratch + TARFA_ATTN_Q * d
                          : (scores ? scores + ((long long)t * heads + h0) * cap : nullptr);
    long long scs = in_shared ? sh_scores : cap;
    if (warp < nq) {
        tarfa_head_norm_rope(qt + (long long)(h0 + warp) * qstride, qn, ndtype, norm, eps, d, half,
                             cos_tab + (long long)pos * half, sin_tab + (long long)pos * half, lane,
                             scratch + warp * d, qs + warp * d);
    }
    __syncthreads();
    // Scores: a warp's rows i0 .. i0 + QR − 1 against the quad's heads, dot (row b, head i) at
    // b · Q + i; after the fold lane v holds dot v. Rows past the last read the last (not kept).
    {
        float qv[TARFA_ATTN_Q][TARFA_HEAD_AHEAD];
#pragma unroll
        for (int i = 0; i < TARFA_ATTN_Q; ++i)
#pragma unroll
            for (int j = 0; j < TARFA_HEAD_AHEAD; ++j)
                qv[i][j] = i < nq && lane + 32 * j < d ? qs[i * d + lane + 32 * j] : 0.0f;
        for (int i0 = warp * TARFA_ATTN_QR; i0 < n; i0 += warps * TARFA_ATTN_QR) {
            float a[TARFA_ATTN_QR * TARFA_ATTN_Q];
#pragma unroll
            for (int b = 0; b < TARFA_ATTN_QR; ++b) {
                int i = i0 + b < n ? i0 + b : n - 1;
                const float* kk = kcache + (long long)(first + i) * width + (long long)kvh * d;
                float kv[TARFA_HEAD_AHEAD];
#pragma unroll
                for (int j = 0; j < TARFA_HEAD_AHEAD; ++j) kv[j] = lane + 32 * j < d ? kk[lane + 32 * j] : 0.0f;
#pragma unroll
                for (int h = 0; h < TARFA_ATTN_Q; ++h) {
                    float acc = 0.0f;
#pragma unroll
                    for (int j = 0; j < TARFA_HEAD_AHEAD; ++j)
                        if (lane + 32 * j < d) acc = __fmaf_rn(kv[j], qv[h][j], acc);
                    a[b * TARFA_ATTN_Q + h] = acc;
                }
            }
            tarfa_mm_fold_level<32>(a, lane, 16);
            tarfa_mm_fold_level<16>(a, lane, 8);
            tarfa_mm_fold_level<8>(a, lane, 4);
            tarfa_mm_fold_level<4>(a, lane, 2);
            tarfa_mm_fold_level<2>(a, lane, 1);
            int i = i0 + lane / TARFA_ATTN_Q, h = lane % TARFA_ATTN_Q;
            if (i < n && h < nq) sc[h * scs + i] = __fmul_rn(a[0], scaling);
        }
    }
    __syncthreads();
    if (warp < nq) tarfa_warp_softmax(sc + warp * scs, sc + warp * scs, n, lane);
    __syncthreads();
    // The weighted sum: a warp's output elements c·QE .. c·QE + QE − 1 of the quad's heads, lane l
    // the positions i ≡ l (mod 32) in increasing i, (head h, element e) at h · QE + e; after the
    // fold lane v holds value v.
    for (int c = warp; c < d / TARFA_ATTN_QE; c += warps) {
        float a[TARFA_ATTN_Q * TARFA_ATTN_QE];
#pragma unroll
        for (int j = 0; j < TARFA_ATTN_Q * TARFA_ATTN_QE; ++j) a[j] = 0.0f;
        const float* vb = vcache + (long long)kvh * d + c * TARFA_ATTN_QE;
        for (int i = lane; i < n; i += 32) {
            const float* vr = vb + (long long)(first + i) * width;
            float4 v0 = *(const float4*)vr, v1 = *(const float4*)(vr + 4);
            float vv[TARFA_ATTN_QE] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
            for (int h = 0; h < TARFA_ATTN_Q; ++h) {
                float s = h < nq ? sc[h * scs + i] : 0.0f;
#pragma unroll
                for (int e = 0; e < TARFA_ATTN_QE; ++e)
                    a[h * TARFA_ATTN_QE + e] = __fmaf_rn(s, vv[e], a[h * TARFA_ATTN_QE + e]);
            }
        }
        tarfa_mm_fold_level<32>(a, lane, 16);
        tarfa_mm_fold_level<16>(a, lane, 8);
        tarfa_mm_fold_level<8>(a, lane, 4);
        tarfa_mm_fold_level<4>(a, lane, 2);
        tarfa_mm_fold_level<2>(a, lane, 1);
        int h = lane / TARFA_ATTN_QE, dd = c * TARFA_ATTN_QE + lane % TARFA_ATTN_QE;
        if (h < nq) {
            const float* gate = qt + (long long)(h0 + h) * qstride + d;
            out[((long long)t * heads + h0 + h) * d + dd] =
                gated ? __fmul_rn(a[0], tarfa_sigmoid(gate[dd])) : a[0];
        }
    }
}

// The routers' top-k over a chunk: block b is token b (its z at b · n, its scratch at b · 3n,
// its slots at b · stride); one warp each (tarfa_topk, tarfa_sigmoid_topk).
extern "C" __global__ void tarfa_e_topk_many(const float* z, int n, int k, int renorm, float* probs,
                                             int* ids, float* wts, int stride) {
    tarfa_grid_enter();
    long long b = blockIdx.x;
    tarfa_topk(z + b * n, n, k, renorm, probs + b * n, ids + b * stride, wts + b * stride, nullptr,
               nullptr);
}

extern "C" __global__ void tarfa_e_sigmoid_topk_many(const float* z, int n, const unsigned char* bias,
                                                     int bias_dtype, int k, int n_group,
                                                     int topk_group, int renorm, float scale,
                                                     float* scratch, int* ids, float* wts,
                                                     int stride) {
    tarfa_grid_enter();
    long long b = blockIdx.x;
    tarfa_sigmoid_topk(z + b * n, n, bias, bias_dtype, k, n_group, topk_group, renorm, scale,
                       scratch + b * 3 * n, ids + b * stride, wts + b * stride);
}
