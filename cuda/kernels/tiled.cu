// ================================================================================================
// Tiled products: a block's rows streamed through shared memory.
//
// A quad's own loads (above) keep too few bytes in flight when a product has few rows (o_proj:
// 2,048 rows of 8 KiB; the router: 128), and a thread waits for each batch before it multiplies.
// Here every thread of a block copies a block's rows (up to TARFA_TILE_MAX_ROWS) into a ring of
// shared-memory stages with asynchronous copies (cp.async, sm_80 and later), several stages in
// flight, while the rows' quads run their canonical accumulation on the stages already landed.
// Which thread loads a weight changes no bit: each quad still takes its row's elements in
// increasing k, eight logical lanes per thread, one fused multiply-add each, exactly as
// tarfa_quad_acc does (for rows of whole 32-element chunks, which the host checks).
// ================================================================================================

#define TARFA_TILE_THREADS 128
#define TARFA_TILE_MAX_ROWS 32
// The ring: stages (STAGES − 1 in flight), and weight bytes per stage; a slot also holds each
// row's 16 bytes of padding. The host may compile another ring (TARFA_CUDA_TILE, passed as -D
// and checked by tile.rs's TileGeometry): it changes which thread copies which bytes and
// when, never an operation or its order.
#ifndef TARFA_TILE_STAGES
#define TARFA_TILE_STAGES 4
#endif
#ifndef TARFA_TILE_STAGE_BYTES
#define TARFA_TILE_STAGE_BYTES 8192
#endif
// Two stages at least (one landing while one is read); every thread the same number of 16-byte
// pieces of a stage; a stage wide enough for 32 columns of x and of a full block of F32 rows.
static_assert(TARFA_TILE_STAGES >= 2, "the ring needs two stages");
static_assert(TARFA_TILE_STAGE_BYTES % (16 * TARFA_TILE_THREADS) == 0,
              "a stage is whole 16-byte pieces for each thread");
static_assert(TARFA_TILE_STAGE_BYTES / (4 + TARFA_TILE_MAX_ROWS * 4) >= 32,
              "a stage holds 32 columns of x and of 32 F32 rows");
#define TARFA_TILE_SLOT (TARFA_TILE_STAGE_BYTES + TARFA_TILE_MAX_ROWS * 16)
// Dynamic shared memory of a tiled launch: the rows' addresses, then the ring.
#define TARFA_TILE_HEAD (TARFA_TILE_MAX_ROWS * 8)
#define TARFA_TILE_SHARED (TARFA_TILE_HEAD + TARFA_TILE_STAGES * TARFA_TILE_SLOT)

// Asynchronous 16-byte copies from global to shared memory, in groups (the emulation, cuda-emu/,
// defines them its own way: each copy is made when its group is waited for).
// Before sm_80 (no cp.async) each copy is a plain load and store, made at once.
#if !defined(TARFA_CP_ASYNC) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ void tarfa_cp_async16(void* dst, const void* src) {
    unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void tarfa_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's newest groups are still in flight.
template <int N>
__device__ __forceinline__ void tarfa_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#elif !defined(TARFA_CP_ASYNC)
__device__ __forceinline__ void tarfa_cp_async16(void* dst, const void* src) {
    *(uint4*)dst = *(const uint4*)src;
}
__device__ __forceinline__ void tarfa_cp_commit() {}
template <int N>
__device__ __forceinline__ void tarfa_cp_wait() {}
#endif

// A thread's share of each stage's copies: the same pieces of every stage (the stage's columns
// move by w), so their addresses are worked out once (a division per piece per stage cost more
// than the copies). Piece j of thread t is the (t + j·threads)-th 16 bytes of a stage: x's
// columns first (its first xb bytes; none when x is in shared memory whole), then each row's. A thread keeps its pieces in registers (20 bytes each: 4 at
// 8 KiB stages, 32 at 64 KiB, where they may spill to local memory).
#define TARFA_TILE_PIECES (TARFA_TILE_STAGE_BYTES / 16 / TARFA_TILE_THREADS)
struct TarfaTilePieces {
    const unsigned char* src[TARFA_TILE_PIECES];  // at stage 0
    int dst[TARFA_TILE_PIECES];                   // offset in a slot
    int step[TARFA_TILE_PIECES];                  // bytes src moves per stage
    int col[TARFA_TILE_PIECES];                   // first column within the stage
    int n;
};

__device__ __forceinline__ void tarfa_tile_pieces(const unsigned char* const* rowp, int n,
                                                  const float* x, int esz, int w, int pitch,
                                                  int xb, TarfaTilePieces* t) {
    int xp = xb / 16;
    int per_row = w * esz / 16;
    int total = xp + n * per_row;
    t->n = 0;
#pragma unroll
    for (int j = 0; j < TARFA_TILE_PIECES; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < total) {
            if (p < xp) {
                t->src[j] = (const unsigned char*)(x + p * 4);
                t->dst[j] = p * 16;
                t->step[j] = w * 4;
                t->col[j] = p * 4;
            } else {
                int i = (p - xp) / per_row;
                int o = (p - xp) - i * per_row;
                t->src[j] = rowp[i] + o * 16;
                t->dst[j] = xb + i * pitch + o * 16;
                t->step[j] = w * esz;
                t->col[j] = o * 16 / esz;
            }
            t->n = j + 1;
        }
    }
}

// Stage `s` of the tile into `slot`: x[c0 .. c0 + ws) first, then columns [c0, c0 + ws) of each
// row i at w·4 + i·pitch (c0 = s·w, ws = min(w, cols − c0): a last, narrower stage copies only
// its columns, at the same places). x's pieces (the first xb = w·4 bytes of a slot) when `xs`,
// the weights' when `wts`.
__device__ __forceinline__ void tarfa_tile_issue(const TarfaTilePieces& t, int ws, int s,
                                                 unsigned char* slot, int xb, bool xs, bool wts) {
#pragma unroll
    for (int j = 0; j < TARFA_TILE_PIECES; ++j) {
        if (j < t.n && t.col[j] < ws && (t.dst[j] < xb ? xs : wts))
            tarfa_cp_async16(slot + t.dst[j], t.src[j] + (long long)s * t.step[j]);
    }
}

// The canonical accumulation (tarfa_quad_acc's, for cols a multiple of 32) of the rows
// quad·R .. quad·R + R − 1 of the tile with x (cols floats, 16-byte aligned, the same for the
// whole block), for quads < `quads`; other threads get zeros. Every thread of the block must call
// it (it copies and waits with them). rowp: the tile's n row addresses (16-byte aligned), in
// shared memory; ring: the stages. Unless `xsh`, a stage holds x's columns as well as the
// weights': a quad's reads are all from shared memory (x read from global memory at each chunk
// left every chunk waiting for an L2 round trip). With `xsh` (x whole in shared memory, once
// `enter` has run) the stages hold weights only. With `ahead`, the weights of the first stages
// are issued before `enter()` — which must call tarfa_grid_enter (the rows' addresses must not
// depend on an earlier launch's output) — x's after it; else the caller has entered already.
template <int R, class Enter>
__device__ void tarfa_tile_acc(const unsigned char* const* rowp, int n, int cols, int dtype,
                               const float* x, const float* xsh, unsigned char* ring, int quad,
                               int quads, int sub, float (*acc)[8], bool ahead, Enter enter) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][j] = 0.0f;
    // Each thread's share of a stage's copies (TARFA_TILE_PIECES) assumes the block's size; x in
    // shared memory is filled by `enter`, which runs only `ahead`.
    if (blockDim.x != TARFA_TILE_THREADS || (xsh && !ahead)) __trap();
    int esz = dtype == TARFA_BF16 ? 2 : 4;
    int xe = xsh ? 0 : 4;  // bytes of x per column a stage holds
    // Columns per stage: whole chunks of x and of each row, each row padded by 16 bytes (so that
    // the quads of a warp, reading the same columns of different rows, meet different banks).
    int w = TARFA_TILE_STAGE_BYTES / (xe + n * esz) / 32 * 32;
    if (w > cols) w = cols;
    int pitch = w * esz + 16;
    int xb = w * xe;
    int stages = (cols + w - 1) / w;
    bool mine = quad < quads;
    TarfaTilePieces pieces;
    tarfa_tile_pieces(rowp, n, x, esz, w, pitch, xb, &pieces);
    if (ahead) {
        // The first stages' weights, uncommitted: they join stage 0's group, committed below.
#pragma unroll
        for (int s = 0; s < TARFA_TILE_STAGES - 1; ++s) {
            if (s < stages) {
                int ws = cols - s * w < w ? cols - s * w : w;
                tarfa_tile_issue(pieces, ws, s, ring + s * TARFA_TILE_SLOT, xb, false, true);
            }
        }
        enter();
    }
#pragma unroll
    for (int s = 0; s < TARFA_TILE_STAGES - 1; ++s) {
        if (s < stages) {
            int ws = cols - s * w < w ? cols - s * w : w;
            tarfa_tile_issue(pieces, ws, s, ring + s * TARFA_TILE_SLOT, xb, true, !ahead);
        }
        tarfa_cp_commit();
    }
    for (int s = 0; s < stages; ++s) {
        // Stage s has landed (this thread's copies, then everyone's): STAGES − 1 + s groups are
        // committed, stage s's the (s + 1)-th, so at most STAGES − 2 newer may stay in flight.
        tarfa_cp_wait<TARFA_TILE_STAGES - 2>();
        __syncthreads();
        // Everyone is past stage s − 1's compute: its slot takes stage s + STAGES − 1.
        int t = s + TARFA_TILE_STAGES - 1;
        if (t < stages) {
            int ws = cols - t * w < w ? cols - t * w : w;
            tarfa_tile_issue(pieces, ws, t, ring + (t % TARFA_TILE_STAGES) * TARFA_TILE_SLOT, xb, true, true);
        }
        tarfa_cp_commit();
        if (mine) {
            const unsigned char* slot = ring + (s % TARFA_TILE_STAGES) * TARFA_TILE_SLOT;
            const float* xs = xsh ? xsh + s * w : (const float*)slot;
            const unsigned char* rows = slot + xb + quad * R * pitch;
            int ws = cols - s * w < w ? cols - s * w : w;
#pragma unroll 2
            for (int c = 0; c < ws; c += 32) {
                float xv[8];
                tarfa_x8(xs, c + sub * 8, 1, xv);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const unsigned char* p = rows + r * pitch + (c + sub * 8) * esz;
                    float wv[8];
                    if (dtype == TARFA_BF16) {
                        tarfa_unpack_bf16x8(*(const uint4*)p, wv);
                    } else {
                        float4 lo = ((const float4*)p)[0], hi = ((const float4*)p)[1];
                        wv[0] = lo.x; wv[1] = lo.y; wv[2] = lo.z; wv[3] = lo.w;
                        wv[4] = hi.x; wv[5] = hi.y; wv[6] = hi.z; wv[7] = hi.w;
                    }
                    tarfa_fma8(wv, xv, acc[r]);
                }
            }
        }
    }
}

// Dynamic shared memory a tiled block taking its x in through an RMSNorm of n elements has
// beyond the ring: x, then the norm's scale (in a 16-byte piece of its own).
#define TARFA_TILE_NORM_SHARED(n) (4 * (n) + 16)

// 16-byte pieces (four elements) of x a thread of a tiled block holds in registers for the
// RMSNorm it takes in, with their weights loaded before tarfa_grid_enter (8 · 4 · 128 = 4,096
// elements; the rest are loaded as they are needed).
#define TARFA_TILE_NORM_AHEAD 8

// The weights of a thread's first pieces of a tiled block's RMSNorm (n elements): loaded while
// the launch before may still run (they are no launch's output).
__device__ __forceinline__ void tarfa_tile_norm_weights(const unsigned char* w, int wdtype, int n,
                                                        float (*wv)[4]) {
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (4 * p < n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) wv[j][e] = tarfa_weight(w, wdtype, 4 * p + e);
        }
    }
}

// The RMSNorm of x (n floats, n a multiple of 4, 16-byte aligned) with weights w (the first
// pieces' in wv, tarfa_tile_norm_weights), as tarfa_e_rms_norm computes it (tarfa_rms_scale on
// warp 0, then w_i · (x_i · r)), by a whole block into xs (n floats of dynamic shared memory,
// then one for the scale: a tiled kernel has no static shared memory), and into `out` too when
// not null. Called after tarfa_grid_enter (x is an earlier launch's output); every thread of the
// block calls it.
__device__ void tarfa_tile_norm(const float* x, const unsigned char* w, int wdtype, int n,
                                float eps, const float (*wv)[4], float* xs, float* out) {
    int n4 = n / 4;
    int held = TARFA_TILE_NORM_AHEAD * blockDim.x;
    float4 xv[TARFA_TILE_NORM_AHEAD];
    // Every load in flight at once (one round trip), then the stores to shared memory.
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < n4) xv[j] = ((const float4*)x)[p];
    }
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < n4) ((float4*)xs)[p] = xv[j];
    }
    for (int p = threadIdx.x + held; p < n4; p += blockDim.x) ((float4*)xs)[p] = ((const float4*)x)[p];
    float r = tarfa_block_scale(xs, n, eps, xs + n);
#pragma unroll
    for (int j = 0; j < TARFA_TILE_NORM_AHEAD; ++j) {
        int p = threadIdx.x + j * blockDim.x;
        if (p < n4) {
            float4 v;
            v.x = __fmul_rn(wv[j][0], __fmul_rn(xv[j].x, r));
            v.y = __fmul_rn(wv[j][1], __fmul_rn(xv[j].y, r));
            v.z = __fmul_rn(wv[j][2], __fmul_rn(xv[j].z, r));
            v.w = __fmul_rn(wv[j][3], __fmul_rn(xv[j].w, r));
            ((float4*)xs)[p] = v;
            if (out) ((float4*)out)[p] = v;
        }
    }
    for (int i = 4 * (threadIdx.x + held); i < n; i += 4 * blockDim.x) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = __fmul_rn(tarfa_weight(w, wdtype, i + e), __fmul_rn(xs[i + e], r));
            xs[i + e] = v;
            if (out) out[i + e] = v;
        }
    }
    __syncthreads();
}

// tarfa_e_matvec's products, tiled: `nr` rows per block (≤ TARFA_TILE_MAX_ROWS), a quad each.
// Every job has the same cols (a multiple of 32), dtype and x (job 0's), and is `vec`. With a norm
// weight `nw`, x is taken in through that RMSNorm (tarfa_tile_norm: each block normalises job 0's
// x itself, into the cols floats of shared memory after the ring, and its scale after them
// (TARFA_TILE_NORM_SHARED) — no launch of its own, and no round trip through memory; block 0
// also writes it to `xn` when that is not null, for a later launch).
extern "C" __global__ void tarfa_e_tmatvec(TarfaMatJobs jobs, int nr, const unsigned char* nw,
                                           int ndtype, float eps, float* xn) {
    TARFA_DYNAMIC_SHARED(float, tile);
    const unsigned char** rowp = (const unsigned char**)tile;
    unsigned char* ring = (unsigned char*)tile + TARFA_TILE_HEAD;
    float* xsh = nw ? (float*)((unsigned char*)tile + TARFA_TILE_SHARED) : nullptr;
    int total = jobs.row_start[jobs.n];
    int first = blockIdx.x * nr;
    int n = total - first < nr ? total - first : nr;
    int cols = jobs.job[0].cols, dtype = jobs.job[0].dtype;
    long long esz = dtype == TARFA_BF16 ? 2 : 4;
    if ((int)threadIdx.x < n) {
        int r;
        TarfaMatJob j = tarfa_job_of(jobs, first + threadIdx.x, &r);
        rowp[threadIdx.x] = j.w + (long long)r * cols * esz;
    }
    float wv[TARFA_TILE_NORM_AHEAD][4];
    if (nw) tarfa_tile_norm_weights(nw, ndtype, cols, wv);
    __syncthreads();
    int quad = threadIdx.x / 4, sub = threadIdx.x & 3;
    float acc[1][8];
    const float* x = jobs.job[0].x;
    tarfa_tile_acc<1>(rowp, n, cols, dtype, x, xsh, ring, quad, n, sub, acc, true, [&] {
        tarfa_grid_enter();
        if (nw) tarfa_tile_norm(x, nw, ndtype, cols, eps, wv, xsh, blockIdx.x == 0 ? xn : nullptr);
    });
    float v = tarfa_quad_fold(acc[0]);
    if (quad < n && sub == 0) {
        int r;
        TarfaMatJob j = tarfa_job_of(jobs, first + quad, &r);
        if (j.bias) v = __fadd_rn(v, tarfa_weight(j.bias, j.bias_dtype, r));
        j.y[r] = j.accumulate ? __fadd_rn(j.y[r], v) : v;
    }
}

// tarfa_e_moe_gate_up, tiled: `np` (slot, row) pairs per block (2·np ≤ TARFA_TILE_MAX_ROWS), the
// gate row and the up row of each in the tile, one quad per pair. hidden a multiple of 32.
extern "C" __global__ void tarfa_e_tmoe_gate_up(TarfaMoe m, const int* ids, int k, const float* x,
                                                float* h, int np) {
    TARFA_DYNAMIC_SHARED(float, tile);
    tarfa_grid_enter();
    const unsigned char** rowp = (const unsigned char**)tile;
    unsigned char* ring = (unsigned char*)tile + TARFA_TILE_HEAD;
    long long total = (long long)k * m.inter;
    long long first = (long long)blockIdx.x * np;
    int n = total - first < np ? (int)(total - first) : np;
    long long esz = m.dtype_g == TARFA_BF16 ? 2 : 4;
    if ((int)threadIdx.x < 2 * n) {
        long long q = first + threadIdx.x / 2;
        int e = ids[q / m.inter];
        if (e < 0 || e >= m.n_experts) e = 0;  // never: ids come from tarfa_e_topk
        const unsigned long long* table = (threadIdx.x & 1) ? m.up : m.gate;
        rowp[threadIdx.x] = (const unsigned char*)table[e] + (long long)(q % m.inter) * m.hidden * esz;
    }
    __syncthreads();
    int quad = threadIdx.x / 4, sub = threadIdx.x & 3;
    float acc[2][8];
    tarfa_tile_acc<2>(rowp, 2 * n, m.hidden, m.dtype_g, x, nullptr, ring, quad, n, sub, acc, false,
                      [] {});
    float g = tarfa_quad_fold(acc[0]);
    float u = tarfa_quad_fold(acc[1]);
    tarfa_swiglu_clamp(g, u, m.limit);
    if (quad < n && sub == 0) h[first + quad] = tarfa_silu_mul(g, u);
}

// tarfa_e_moe_down, tiled: `nr` of the k·hidden rows per block, a quad each, each row with its
// slot's h. inter a multiple of 32, and nr divides hidden (a block's rows are of one slot).
extern "C" __global__ void tarfa_e_tmoe_down(TarfaMoe m, const int* ids, int k, const float* h,
                                             float* y, int nr) {
    TARFA_DYNAMIC_SHARED(float, tile);
    tarfa_grid_enter();
    const unsigned char** rowp = (const unsigned char**)tile;
    unsigned char* ring = (unsigned char*)tile + TARFA_TILE_HEAD;
    long long total = (long long)k * m.hidden;
    long long first = (long long)blockIdx.x * nr;
    int n = total - first < nr ? (int)(total - first) : nr;
    long long esz = m.dtype_d == TARFA_BF16 ? 2 : 4;
    if ((int)threadIdx.x < n) {
        long long q = first + threadIdx.x;
        int e = ids[q / m.hidden];
        if (e < 0 || e >= m.n_experts) e = 0;
        rowp[threadIdx.x] = (const unsigned char*)m.down[e] + (long long)(q % m.hidden) * m.inter * esz;
    }
    __syncthreads();
    int quad = threadIdx.x / 4, sub = threadIdx.x & 3;
    float acc[1][8];
    tarfa_tile_acc<1>(rowp, n, m.inter, m.dtype_d, h + (long long)(first / m.hidden) * m.inter,
                      nullptr, ring, quad, n, sub, acc, false, [] {});
    float v = tarfa_quad_fold(acc[0]);
    if (quad < n && sub == 0) y[first + quad] = v;
}
