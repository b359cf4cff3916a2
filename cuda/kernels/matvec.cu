// Matrix-vector products of the resident decoder on quads: four threads per output row, each
// holding eight of the canonical order's 32 logical lanes (tarfa_quad_acc), folded by the tree
// (tarfa_quad_fold); up to four products of one input in one launch (tarfa_e_matvec).

// Eight consecutive weights k..k+7 of a row (k a multiple of 8): a block type's eight lie in one
// chunk, dequantised with its shared values found once (dequant.cuh); a plain type's one at a
// time (any alignment).
__device__ __forceinline__ void tarfa_weights8(const unsigned char* row, int dtype, int k, float* w) {
    if (dtype >= TARFA_Q8_0) {
        long long c = k / 32;
        TarfaChunk p = tarfa_chunk_params(row, dtype, c);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            int l = k % 32 + j;
            w[j] = tarfa_chunk_weight(dtype, c, l, tarfa_chunk_quant(row, dtype, c, l), p);
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j] = tarfa_weight(row, dtype, k + j);
}

// The eight bf16 weights of one 16-byte load, widened (exact).
__device__ __forceinline__ void tarfa_unpack_bf16x8(uint4 v, float* w) {
    unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        w[2 * j] = __int_as_float(u[j] << 16);
        w[2 * j + 1] = __int_as_float(u[j] & 0xffff0000u);
    }
}

// acc[j] = fma(w[j], xv[j], acc[j]) for j = 0..7: one step of each of the thread's eight
// logical lanes.
__device__ __forceinline__ void tarfa_fma8(const float* w, const float* xv, float* acc) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fmaf_rn(w[j], xv[j], acc[j]);
}

// x[k .. k+7]: two 16-byte loads when `vec`, else one element at a time.
__device__ __forceinline__ void tarfa_x8(const float* x, int k, int vec, float* xv) {
    if (vec) {
        float4 a = *(const float4*)(x + k);
        float4 b = *(const float4*)(x + k + 4);
        xv[0] = a.x; xv[1] = a.y; xv[2] = a.z; xv[3] = a.w;
        xv[4] = b.x; xv[5] = b.y; xv[6] = b.z; xv[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) xv[j] = x[k + j];
    }
}

// How many 32-element chunks a thread loads before it multiplies: the loads of one batch (the
// weights and x) are all in flight together (a matrix-vector product is bound by memory latency,
// not arithmetic). The multiply-adds still run chunk by chunk in increasing k, so the batch
// changes no bit.
#define TARFA_BATCH 8

// The canonical accumulation of R rows with the same x, by the four threads sub = 0..3 of a
// quad: thread `sub` holds the logical lanes 8·sub .. 8·sub+7 of each row (element k goes to
// logical lane k mod 32, and each lane takes its elements in increasing k, one fused multiply-add
// each, from +0). `vec`: every row and x are 16-byte aligned at each chunk (checked on the host),
// so a bf16 chunk is one 16-byte load and an f32 chunk two.
//
// B: chunks per batch. XB: x of a batch loaded with its weights (x in global memory); else x is
// read chunk by chunk (x staged in shared memory, so a deeper batch of weights fits in registers).
template <int R, int B, bool XB>
__device__ __forceinline__ void tarfa_quad_acc(const unsigned char* const* rows, int dtype,
                                               const float* x, int cols, int sub, int vec,
                                               float (*acc)[8]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r][j] = 0.0f;
    int full = cols / 32;
    int c = 0;
    if (vec && dtype == TARFA_BF16) {
        for (; c + B <= full; c += B) {
            uint4 wv[R][B];
            float xv[XB ? B : 1][8];
#pragma unroll
            for (int b = 0; b < B; ++b)
#pragma unroll
                for (int r = 0; r < R; ++r)
                    wv[r][b] = *(const uint4*)(rows[r] + (long long)((c + b) * 32 + sub * 8) * 2);
            if (XB) {
#pragma unroll
                for (int b = 0; b < B; ++b) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[XB ? b : 0]);
            }
#pragma unroll
            for (int b = 0; b < B; ++b) {
                if (!XB) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[0]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float w[8];
                    tarfa_unpack_bf16x8(wv[r][b], w);
                    tarfa_fma8(w, xv[XB ? b : 0], acc[r]);
                }
            }
        }
    } else if (vec) {
        for (; c + B / 2 <= full; c += B / 2) {
            float4 wv[R][B / 2][2];
            float xv[XB ? B / 2 : 1][8];
#pragma unroll
            for (int b = 0; b < B / 2; ++b)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float4* p = (const float4*)(rows[r] + (long long)((c + b) * 32 + sub * 8) * 4);
                    wv[r][b][0] = p[0];
                    wv[r][b][1] = p[1];
                }
            if (XB) {
#pragma unroll
                for (int b = 0; b < B / 2; ++b) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[XB ? b : 0]);
            }
#pragma unroll
            for (int b = 0; b < B / 2; ++b) {
                if (!XB) tarfa_x8(x, (c + b) * 32 + sub * 8, 1, xv[0]);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float4 lo = wv[r][b][0], hi = wv[r][b][1];
                    float w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
                    tarfa_fma8(w, xv[XB ? b : 0], acc[r]);
                }
            }
        }
    }
    // What the batches left (and every chunk when not `vec`): one chunk at a time.
    for (; c < full; ++c) {
        int k = c * 32 + sub * 8;
        float xv[8];
        tarfa_x8(x, k, vec, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            float w[8];
            if (vec && dtype == TARFA_BF16) {
                tarfa_unpack_bf16x8(*(const uint4*)(rows[r] + (long long)k * 2), w);
            } else {
                tarfa_weights8(rows[r], dtype, k, w);
            }
            tarfa_fma8(w, xv, acc[r]);
        }
    }
    int tail = full * 32 + sub * 8;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        if (tail + j < cols) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                acc[r][j] = __fmaf_rn(tarfa_weight(rows[r], dtype, tail + j), x[tail + j], acc[r][j]);
            }
        }
    }
}

// The fold of a quad's 32 logical lanes (canon::fold_lanes): +16 is the quad partner two threads
// on, +8 the next thread, +4, +2, +1 within the thread's own registers. The result is in the
// quad's thread 0. Every thread of the warp must call it (shuffles).
__device__ __forceinline__ float tarfa_quad_fold(float* acc) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], __shfl_down_sync(TARFA_FULL, acc[j], 2));
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = __fadd_rn(acc[j], __shfl_down_sync(TARFA_FULL, acc[j], 1));
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] = __fadd_rn(acc[j], acc[j + 4]);
    acc[0] = __fadd_rn(acc[0], acc[2]);
    acc[1] = __fadd_rn(acc[1], acc[3]);
    return __fadd_rn(acc[0], acc[1]);
}

// The canonical dot of one row with x on a quad; the result in the quad's thread 0.
__device__ float tarfa_quad_dot(const unsigned char* row, int dtype, const float* x, int cols,
                                int sub, int vec) {
    float acc[1][8];
    tarfa_quad_acc<1, TARFA_BATCH, true>(&row, dtype, x, cols, sub, vec, acc);
    return tarfa_quad_fold(acc[0]);
}

// ---- A warp per row: the K types -------------------------------------------------------------
// A launch whose matrices include a K type (Q4_K, Q5_K, Q6_K) takes the warp kernels
// (tarfa_e_wmatvec here, tarfa_e_wmoe_gate_up and tarfa_e_wmoe_down in moe.cu; the host's rule
// is hal.rs's `warp_rows`): a warp per output row, lane l the canonical order's logical lane l,
// taking elements l, l + 32, ... in increasing order, one fused multiply-add each from +0, folded
// by the same tree (tarfa_warp_fold) — the bits of the quad's accumulation. A quad's four threads
// dequantised their eight elements of a chunk in turn, and a product's few rows (2,048 for
// o_proj) left most of the GPU idle; a warp puts eight times the threads on a row, and what a
// chunk's elements share is found once, by one lane (dequant.cuh). They are kernels of their own
// so that their registers, not the quad kernels' wide batches, set how many warps a
// multiprocessor holds. Another type in the launch (any type may sit beside a K type) takes the
// generic path below, element by element.

// Chunks whose loads a lane issues together before their multiply-adds (which stay in order).
#define TARFA_WARP_BATCH 4

// tarfa_warp_acc for a K type (DT: Q4_K, Q5_K or Q6_K; rows of whole 256-element blocks, eight
// chunks each): the block's chunks unrolled, so every byte offset and shift is a constant (the
// generic path's 64-bit index arithmetic and type switches, per element, cost several times the
// element's own work). The same values as tarfa_chunk_params and tarfa_chunk_weight, in the same
// order: lane i finds the group values of lane i's place in a window of blocks (Q4_K/Q5_K: group
// i mod 8 of block i / 8; Q6_K: scale i mod 16 of block i / 16), and each lane takes its element's
// by a shuffle.
template <int DT, int R>
__device__ __forceinline__ void tarfa_warp_acc_k(const unsigned char* const* rows, const float* x,
                                                 int cols, int lane, float* acc) {
    constexpr int BB = DT == TARFA_Q4_K ? 144 : DT == TARFA_Q5_K ? 176 : 210;
    constexpr int PER = DT == TARFA_Q6_K ? 16 : 8;  // group values per block
    constexpr int WIN = 32 / PER;                   // blocks one window's lanes hold values of
    int nb = cols / 256;
    for (int b0 = 0; b0 < nb; b0 += WIN) {
        int n = nb - b0 < WIN ? nb - b0 : WIN;
        float pa[R], pm[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            pa[r] = 0.0f;
            pm[r] = 0.0f;
            if (lane / PER < n) {
                const unsigned char* b = rows[r] + (long long)(b0 + lane / PER) * BB;
                if (DT == TARFA_Q6_K) {
                    pa[r] = __fmul_rn(tarfa_f16(b + 208), (float)(signed char)b[192 + lane % 16]);
                } else {
                    int sc, mn;
                    tarfa_scale_min_k4(b + 4, lane % 8, &sc, &mn);
                    pa[r] = __fmul_rn(tarfa_f16(b), (float)sc);
                    pm[r] = __fmul_rn(tarfa_f16(b + 2), (float)mn);
                }
            }
        }
        for (int j = 0; j < n; ++j) {  // the same for every lane: the shuffles are whole-warp
            int bi = b0 + j;
            const float* xb = x + (long long)bi * 256 + lane;
            float xv[8];
            unsigned int q[R][8];
#pragma unroll
            for (int cc = 0; cc < 8; ++cc) xv[cc] = xb[32 * cc];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const unsigned char* b = rows[r] + (long long)bi * BB + lane;
#pragma unroll
                for (int cc = 0; cc < 8; ++cc) {
                    if (DT == TARFA_Q4_K) {
                        q[r][cc] = b[16 + 32 * (cc / 2)];
                    } else if (DT == TARFA_Q5_K) {
                        q[r][cc] = b[48 + 32 * (cc / 2)] | ((unsigned int)b[16] << 8);
                    } else {
                        q[r][cc] = b[64 * (cc / 4) + 32 * (cc % 2)] | ((unsigned int)b[128 + 32 * (cc / 4)] << 8);
                    }
                }
            }
#pragma unroll
            for (int cc = 0; cc < 8; ++cc) {
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float w;
                    if (DT == TARFA_Q6_K) {
                        int t = cc % 4;
                        float a = __shfl_sync(TARFA_FULL, pa[r], j * 16 + 8 * (cc / 4) + 2 * t + lane / 16);
                        int v = (int)((q[r][cc] >> (4 * (t / 2))) & 0x0fu) |
                                (int)(((q[r][cc] >> (8 + 2 * t)) & 0x03u) << 4);
                        w = __fmul_rn(a, (float)(v - 32));
                    } else {
                        float a = __shfl_sync(TARFA_FULL, pa[r], j * 8 + cc);
                        float m = __shfl_sync(TARFA_FULL, pm[r], j * 8 + cc);
                        int v = (int)((q[r][cc] >> (4 * (cc % 2))) & 0x0fu);
                        if (DT == TARFA_Q5_K) v |= (int)(((q[r][cc] >> (8 + cc)) & 1u) << 4);
                        w = __fsub_rn(__fmul_rn(a, (float)v), m);
                    }
                    acc[r] = __fmaf_rn(w, xv[cc], acc[r]);
                }
            }
        }
    }
}

// The canonical accumulation of R rows of `dtype` with x (cols elements) by a warp: lane `lane`'s
// partial of each row in acc[r]. Every lane of the warp must call it (shuffles).
template <int R>
__device__ __forceinline__ void tarfa_warp_acc(const unsigned char* const* rows, int dtype,
                                               const float* x, int cols, int lane, float* acc) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    if (dtype < TARFA_Q8_0) {  // a plain type (another job of the launch is of a block type)
        for (int k = lane; k < cols; k += 32) {
            float xk = x[k];
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] = __fmaf_rn(tarfa_weight(rows[r], dtype, k), xk, acc[r]);
        }
        return;
    }
    if (dtype == TARFA_Q4_K) return tarfa_warp_acc_k<TARFA_Q4_K, R>(rows, x, cols, lane, acc);
    if (dtype == TARFA_Q5_K) return tarfa_warp_acc_k<TARFA_Q5_K, R>(rows, x, cols, lane, acc);
    if (dtype == TARFA_Q6_K) return tarfa_warp_acc_k<TARFA_Q6_K, R>(rows, x, cols, lane, acc);
    // Which of a chunk's shared values the type has (the others stay zero, unshuffled).
    bool has_m = dtype == TARFA_Q4_1 || dtype == TARFA_Q5_1 || dtype == TARFA_Q4_K ||
                 dtype == TARFA_Q5_K || dtype == TARFA_Q6_K;
    bool has_h = dtype == TARFA_Q5_0 || dtype == TARFA_Q5_1;
    int chunks = cols / 32;  // a block type's rows are whole blocks of 32 or 256
    for (int c0 = 0; c0 < chunks; c0 += 32) {
        int n = chunks - c0 < 32 ? chunks - c0 : 32;
        // Lane i finds the shared values of chunk c0 + i of each row.
        TarfaChunk mine[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            TarfaChunk z = {0.0f, 0.0f, 0u};
            mine[r] = lane < n ? tarfa_chunk_params(rows[r], dtype, c0 + lane) : z;
        }
        for (int j = 0; j < n; j += TARFA_WARP_BATCH) {
            unsigned int q[R][TARFA_WARP_BATCH];
            float xv[TARFA_WARP_BATCH];
#pragma unroll
            for (int b = 0; b < TARFA_WARP_BATCH; ++b) {
                if (j + b < n) {
                    long long c = c0 + j + b;
                    xv[b] = x[c * 32 + lane];
#pragma unroll
                    for (int r = 0; r < R; ++r) q[r][b] = tarfa_chunk_quant(rows[r], dtype, c, lane);
                }
            }
#pragma unroll
            for (int b = 0; b < TARFA_WARP_BATCH; ++b) {
                if (j + b < n) {  // the same for every lane: the shuffles are whole-warp
                    long long c = c0 + j + b;
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        TarfaChunk p;
                        p.a = __shfl_sync(TARFA_FULL, mine[r].a, j + b);
                        p.m = has_m ? __shfl_sync(TARFA_FULL, mine[r].m, j + b) : 0.0f;
                        p.h = has_h ? __shfl_sync(TARFA_FULL, mine[r].h, j + b) : 0u;
                        float w = tarfa_chunk_weight(dtype, c, lane, q[r][b], p);
                        acc[r] = __fmaf_rn(w, xv[b], acc[r]);
                    }
                }
            }
        }
    }
}

// One matrix-vector product of a tarfa_e_matvec launch: y = W x (+ bias), stored or added to y.
struct TarfaMatJob {
    const unsigned char* w;
    const float* x;
    float* y;
    const unsigned char* bias;  // null: none
    int rows;
    int cols;
    int dtype;
    int bias_dtype;
    int accumulate;  // y[r] = y[r] + (W x + b)[r], as a residual connection adds
    int vec;
};

#define TARFA_MAX_JOBS 4

struct TarfaMatJobs {
    TarfaMatJob job[TARFA_MAX_JOBS];
    int row_start[TARFA_MAX_JOBS + 1];  // job i's rows are quads row_start[i] .. row_start[i+1]
    int n;
    // > 0: every job's x is job[0].x, `vec`, and its first `stage` floats (every job's cols) are
    // copied to dynamic shared memory first, then read from there (deeper batches of weights).
    int stage;
};

// The job owning row q of a launch and the row's number in it (*r), chosen by value (no dynamic
// index into the parameter block).
__device__ __forceinline__ TarfaMatJob tarfa_job_of(const TarfaMatJobs& jobs, int q, int* r) {
    TarfaMatJob j = jobs.job[0];
    *r = q;
    if (jobs.n > 1 && q >= jobs.row_start[1]) { j = jobs.job[1]; *r = q - jobs.row_start[1]; }
    if (jobs.n > 2 && q >= jobs.row_start[2]) { j = jobs.job[2]; *r = q - jobs.row_start[2]; }
    if (jobs.n > 3 && q >= jobs.row_start[3]) { j = jobs.job[3]; *r = q - jobs.row_start[3]; }
    return j;
}

// Chunks per batch when x is in shared memory (its registers free for weights).
#define TARFA_BATCH_STAGED 16

// Up to four products of one input in one launch (q, k and v; o; the router; lm_head): one quad
// per output row. A row's value: the canonical dot, then + bias, then + the old y (accumulate).
extern "C" __global__ void tarfa_e_matvec(TarfaMatJobs jobs) {
    TARFA_DYNAMIC_SHARED(float, xs);
    tarfa_grid_enter();
    if (jobs.stage > 0) {
        const float* x = jobs.job[0].x;
        for (int i = threadIdx.x; i < jobs.stage; i += blockDim.x) xs[i] = x[i];
        __syncthreads();
    }
    int total = jobs.row_start[jobs.n];
    long long quad = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 4;
    int sub = threadIdx.x & 3;
    bool live = quad < total;
    int q = live ? (int)quad : total - 1;  // dead quads compute a real row for the shuffles
    int r;
    TarfaMatJob j = tarfa_job_of(jobs, q, &r);
    const unsigned char* row = j.w + (long long)r * tarfa_row_bytes(j.dtype, j.cols);
    float v;
    if (jobs.stage > 0) {
        float acc[1][8];
        tarfa_quad_acc<1, TARFA_BATCH_STAGED, false>(&row, j.dtype, xs, j.cols, sub, 1, acc);
        v = tarfa_quad_fold(acc[0]);
    } else {
        v = tarfa_quad_dot(row, j.dtype, j.x, j.cols, sub, j.vec);
    }
    if (live && sub == 0) {
        if (j.bias) v = __fadd_rn(v, tarfa_weight(j.bias, j.bias_dtype, r));
        j.y[r] = j.accumulate ? __fadd_rn(j.y[r], v) : v;
    }
}

// tarfa_e_matvec's products with a warp per row (a K type among them): the same values.
// Warps past the last row compute the last row again and write nothing.
extern "C" __global__ void tarfa_e_wmatvec(TarfaMatJobs jobs) {
    tarfa_grid_enter();
    int total = jobs.row_start[jobs.n];
    long long wr = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    int q = wr < total ? (int)wr : total - 1;
    int r;
    TarfaMatJob j = tarfa_job_of(jobs, q, &r);
    const unsigned char* row = j.w + (long long)r * tarfa_row_bytes(j.dtype, j.cols);
    float acc[1];
    tarfa_warp_acc<1>(&row, j.dtype, j.x, j.cols, lane, acc);
    float v = tarfa_warp_fold(acc[0]);
    if (wr < total && lane == 0) {
        if (j.bias) v = __fadd_rn(v, tarfa_weight(j.bias, j.bias_dtype, r));
        j.y[r] = j.accumulate ? __fadd_rn(j.y[r], v) : v;
    }
}
