// GLM-5.3-Flash's manifold-constrained hyper-connections (decode/src/family/mhc.rs): the
// residual is n streams of the hidden width, x [n·hidden] stream-major. Around each sublayer a
// site's mixing weights (tarfa_e_hc_weights, from the site's fn · norm(x), a matrix product of
// the engine's), the sublayer's input (tarfa_e_hc_collapse) and the streams after it
// (tarfa_e_hc_expand); after the last layer the streams' mean (tarfa_e_hc_mean). Each operation
// the CPU's, in its order: sums over streams left to right from stream 0, each product rounded
// then added; comb's row and column sums canon::sum's (lane k, the tree).

// The most streams the kernels take (hc_mult; GLM-5.3-Flash has 4).
#define TARFA_HC_MAX 8

// canon::sum of n ≤ 32 values by one thread: value k added to lane k (from +0), then the
// lanes' fixed tree.
__device__ float tarfa_small_sum(const float* v, int n) {
    float l[32];
    for (int i = 0; i < 32; ++i) l[i] = 0.0f;
    for (int k = 0; k < n; ++k) l[k % 32] = __fadd_rn(l[k % 32], v[k]);
    for (int step = 16; step > 0; step /= 2) {
        for (int i = 0; i < step; ++i) l[i] = __fadd_rn(l[i], l[i + step]);
    }
    return l[0];
}

// One site's weights of one token from its mix values ((2 + n)·n: mix = fn · norm(x)), by one
// thread (mhc::weights): out = [pre (n) | post (n) | comb (n·n, comb[k·n + h] from stream k into
// stream h)]. pre[h] = sigmoid(mix[h]·s0 + base[h]) + eps; post[h] = 2·sigmoid(mix[n + h]·s1 +
// base[n + h]); comb's rows softmax(mix·s2 + base) + eps, then each column divided by its sum
// + eps, then iters − 1 times each row and then each column.
extern "C" __global__ void tarfa_e_hc_weights(const float* mix, const unsigned char* base,
                                              int bdtype, const unsigned char* scale, int sdtype,
                                              int n, float eps, int iters, float* out) {
    tarfa_grid_enter();
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    float s0 = tarfa_weight(scale, sdtype, 0);
    float s1 = tarfa_weight(scale, sdtype, 1);
    float s2 = tarfa_weight(scale, sdtype, 2);
    for (int h = 0; h < n; ++h) {
        float b = tarfa_weight(base, bdtype, h);
        out[h] = __fadd_rn(tarfa_sigmoid(__fadd_rn(__fmul_rn(mix[h], s0), b)), eps);
        float bp = tarfa_weight(base, bdtype, n + h);
        out[n + h] = __fmul_rn(2.0f, tarfa_sigmoid(__fadd_rn(__fmul_rn(mix[n + h], s1), bp)));
    }
    float c[TARFA_HC_MAX * TARFA_HC_MAX];
    for (int i = 0; i < n * n; ++i) {
        c[i] = __fadd_rn(__fmul_rn(mix[2 * n + i], s2), tarfa_weight(base, bdtype, 2 * n + i));
    }
    float v[TARFA_HC_MAX];
    for (int i = 0; i < n; ++i) {
        float* row = c + i * n;
        float m = __int_as_float(0xff800000);  // -inf
        for (int j = 0; j < n; ++j) m = fmaxf(m, row[j]);
        for (int j = 0; j < n; ++j) row[j] = tarfa_exp(__fsub_rn(row[j], m));
        float s = tarfa_small_sum(row, n);
        for (int j = 0; j < n; ++j) row[j] = __fadd_rn(__fdiv_rn(row[j], s), eps);
    }
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {
            for (int i = 0; i < n; ++i) {
                float d = __fadd_rn(tarfa_small_sum(c + i * n, n), eps);
                for (int j = 0; j < n; ++j) c[i * n + j] = __fdiv_rn(c[i * n + j], d);
            }
        }
        for (int j = 0; j < n; ++j) {
            for (int i = 0; i < n; ++i) v[i] = c[i * n + j];
            float d = __fadd_rn(tarfa_small_sum(v, n), eps);
            for (int i = 0; i < n; ++i) c[i * n + j] = __fdiv_rn(c[i * n + j], d);
        }
    }
    for (int i = 0; i < n * n; ++i) out[2 * n + i] = c[i];
}

// The sublayer's input c[d] = Σ_h pre[h] · x[h·hidden + d] (w: tarfa_e_hc_weights's), a thread
// per d.
extern "C" __global__ void tarfa_e_hc_collapse(const float* x, const float* w, int n, int hidden,
                                               float* c) {
    tarfa_grid_enter();
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= hidden) return;
    float acc = __fmul_rn(w[0], x[d]);
    for (int h = 1; h < n; ++h) acc = __fadd_rn(acc, __fmul_rn(w[h], x[(long long)h * hidden + d]));
    c[d] = acc;
}

// The streams after a sublayer whose output is y: x[h·hidden + d] = post[h] · y[d] +
// Σ_k comb[k·n + h] · x[k·hidden + d] (the old streams), a thread per d, in place.
extern "C" __global__ void tarfa_e_hc_expand(float* x, const float* w, const float* y, int n,
                                             int hidden) {
    tarfa_grid_enter();
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= hidden) return;
    const float* post = w + n;
    const float* comb = w + 2 * n;
    float old[TARFA_HC_MAX];
    for (int k = 0; k < n; ++k) old[k] = x[(long long)k * hidden + d];
    for (int h = 0; h < n; ++h) {
        float acc = __fmul_rn(comb[h], old[0]);
        for (int k = 1; k < n; ++k) acc = __fadd_rn(acc, __fmul_rn(comb[k * n + h], old[k]));
        x[(long long)h * hidden + d] = __fadd_rn(__fmul_rn(post[h], y[d]), acc);
    }
}

// The streams' mean out[d] = (Σ_k x[k·hidden + d]) / n, a thread per d.
extern "C" __global__ void tarfa_e_hc_mean(const float* x, int n, int hidden, float* out) {
    tarfa_grid_enter();
    int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= hidden) return;
    float acc = x[d];
    for (int k = 1; k < n; ++k) acc = __fadd_rn(acc, x[(long long)k * hidden + d]);
    out[d] = __fdiv_rn(acc, (float)n);
}
