// Matrix-vector products of the resident decoder on quads: four threads per output row, each
// holding eight of the canonical order's 32 logical lanes (tarfa_quad_acc), folded by the tree
// (tarfa_quad_fold); up to four products of one input in one launch (tarfa_e_matvec).

// Eight consecutive weights k..k+7 of a row (k a multiple of 8): a block type's eight lie in one
// group, dequantised with its scale found once; a plain type's one at a time (any alignment).
__device__ __forceinline__ void tarfa_weights8(const unsigned char* row, int dtype, int k, float* w) {
    if (dtype >= TARFA_Q8_0) {
        tarfa_dequant_run(row, dtype, k, 8, w);
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
    long long quad = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 4;
    int sub = threadIdx.x & 3;
    int total = jobs.row_start[jobs.n];
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
