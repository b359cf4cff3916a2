// tarfa's CUDA kernels (cuda/kernels/, included unchanged) run on the CPU by the
// emulation of emu.h, each behind a C entry point: grid, block and dynamic shared bytes first,
// then the kernel's own arguments (structs by pointer). The tiled kernels' entry points also take
// the shared memory the host allowed them and their ring, picking the copy compiled for it.
#include "emu.h"
#include "../../cuda/kernels/tarfa.cu"

#define G unsigned int grid, unsigned int block, unsigned int shared
#define RUN(call) tarfa_emu_launch(grid, block, shared, [&] { call; })
#include "tiled.h"
#include "tiles.h"

extern "C" {
// Register (on != 0) or drop a guarded range: page-aligned, whole pages (see emu.h).
void emu_guard(void* p, size_t n, int on) {
    std::lock_guard<std::mutex> g(tarfa_emu_guard_m);
    auto& v = tarfa_emu_guarded;
    for (size_t i = 0; i < v.size(); ++i) {
        if (v[i].p == p) {
            v.erase(v.begin() + (long)i);
            break;
        }
    }
    if (on) v.push_back({p, n});
}
// A kernel that reads a guarded buffer before entering (never a real one): for the test that
// shows the guard has teeth.
void emu_read_before_enter(const float* x, float* out) {
    tarfa_emu_launch(1, 32, 0, [&] {
        float v = x[threadIdx.x];
        tarfa_grid_enter();
        out[threadIdx.x] = v;
    });
}
void emu_matvec(G, const TarfaMatJobs* jobs) { TarfaMatJobs j = *jobs; RUN(tarfa_e_matvec(j)); }
void emu_wmatvec(G, const TarfaMatJobs* jobs) { TarfaMatJobs j = *jobs; RUN(tarfa_e_wmatvec(j)); }
void emu_embed(G, const unsigned char* table, int dtype, int hidden, const int* params, float* x) {
    RUN(tarfa_e_embed(table, dtype, hidden, params, x));
}
void emu_rms_norm(G, const float* x, const unsigned char* w, int wdtype, int n, float eps, float* out) {
    RUN(tarfa_e_rms_norm(x, w, wdtype, n, eps, out));
}
void emu_attention(G, const float* q, const float* k, const float* v, const unsigned char* qn,
                   const unsigned char* kn, int ndtype, int norm, float eps, int heads,
                   int kv_heads, int d, int half, const float* cos_tab, const float* sin_tab,
                   const int* params, float* kcache, float* vcache, int window, float scaling,
                   float* scores, int cap, float* out, int sh_scores, int qstride, int gated,
                   const unsigned char* sinks, int sink_dtype) {
    RUN(tarfa_e_attention(q, k, v, qn, kn, ndtype, norm, eps, heads, kv_heads, d, half, cos_tab,
                          sin_tab, params, kcache, vcache, window, scaling, scores, cap, out,
                          sh_scores, qstride, gated, sinks, sink_dtype));
}
void emu_delta_heads(G, const float* mixed, const unsigned char* conv_w, int conv_dtype,
                     int kernel, float* hist, const int* params, const float* z, const float* b,
                     const float* a, const unsigned char* dt_bias, int dt_dtype,
                     const unsigned char* a_log, int a_dtype, int a_neg,
                     const unsigned char* norm_w, int ndtype, int k_heads, int v_heads, int dk,
                     int dv, float q_div, float eps, float* state, float* out) {
    RUN(tarfa_e_delta_heads(mixed, conv_w, conv_dtype, kernel, hist, params, z, b, a, dt_bias,
                            dt_dtype, a_log, a_dtype, a_neg, norm_w, ndtype, k_heads, v_heads, dk,
                            dv, q_div, eps, state, out));
}
void emu_kda_heads(G, const float* mixed, const unsigned char* conv_w, int conv_dtype, int kernel,
                   float* hist, const int* params, const float* f, const float* b,
                   const float* gate, const unsigned char* dt_bias, int dt_dtype,
                   const unsigned char* a_log, int a_dtype, int a_neg, int has_lb, float lb,
                   const unsigned char* norm_w, int ndtype, int heads, int dim, float q_scale,
                   float eps, float* state, float* out) {
    RUN(tarfa_e_kda_heads(mixed, conv_w, conv_dtype, kernel, hist, params, f, b, gate, dt_bias,
                          dt_dtype, a_log, a_dtype, a_neg, has_lb, lb, norm_w, ndtype, heads, dim,
                          q_scale, eps, state, out));
}
void emu_hc_weights(G, const float* mix, const unsigned char* base, int bdtype,
                    const unsigned char* scale, int sdtype, int n, float eps, int iters,
                    float* out) {
    RUN(tarfa_e_hc_weights(mix, base, bdtype, scale, sdtype, n, eps, iters, out));
}
void emu_hc_collapse(G, const float* x, const float* w, int n, int hidden, float* c) {
    RUN(tarfa_e_hc_collapse(x, w, n, hidden, c));
}
void emu_hc_expand(G, float* x, const float* w, const float* y, int n, int hidden) {
    RUN(tarfa_e_hc_expand(x, w, y, n, hidden));
}
void emu_hc_mean(G, const float* x, int n, int hidden, float* out) {
    RUN(tarfa_e_hc_mean(x, n, hidden, out));
}
void emu_topk(G, const float* z, int n, int k, int renorm, float* probs, int* ids, float* wts,
              const float* gz, float* gw) {
    RUN(tarfa_e_topk(z, n, k, renorm, probs, ids, wts, gz, gw));
}
void emu_sigmoid_topk(G, const float* z, int n, const unsigned char* bias, int bias_dtype, int k,
                      int n_group, int topk_group, int renorm, float scale, float* scratch,
                      int* ids, float* wts) {
    RUN(tarfa_e_sigmoid_topk(z, n, bias, bias_dtype, k, n_group, topk_group, renorm, scale,
                             scratch, ids, wts));
}
void emu_gate_up(G, const TarfaMoe* m, const int* ids, int k, const float* x, float* h) {
    TarfaMoe mm = *m;
    RUN(tarfa_e_moe_gate_up(mm, ids, k, x, h));
}
void emu_down(G, const TarfaMoe* m, const int* ids, int k, const float* h, float* y) {
    TarfaMoe mm = *m;
    RUN(tarfa_e_moe_down(mm, ids, k, h, y));
}
void emu_wgate_up(G, const TarfaMoe* m, const int* ids, int k, const float* x, float* h) {
    TarfaMoe mm = *m;
    RUN(tarfa_e_wmoe_gate_up(mm, ids, k, x, h));
}
void emu_wdown(G, const TarfaMoe* m, const int* ids, int k, const float* h, float* y) {
    TarfaMoe mm = *m;
    RUN(tarfa_e_wmoe_down(mm, ids, k, h, y));
}
// The tiled kernels at a ring of `stages` of `bytes`: the default's (tiled.h, above) or another's
// compiled in (tile.cc, once per ring in tiles.h, which build.rs writes). Returns 0, or -1 for a
// ring not compiled in.
#define TARFA_EMU_DECLARE(S, B)                                                                   \
    void TARFA_EMU_CAT(emu_tmatvec, S, B)(G, unsigned int, const void*, int, const unsigned char*, \
                                          int, float, float*);                                     \
    void TARFA_EMU_CAT(emu_tgate_up, S, B)(G, unsigned int, const void*, const int*, int,         \
                                           const float*, float*, int);                             \
    void TARFA_EMU_CAT(emu_tdown, S, B)(G, unsigned int, const void*, const int*, int,            \
                                        const float*, float*, int);
TARFA_EMU_TILES(TARFA_EMU_DECLARE)
#define TARFA_EMU_PICK(S, B, call)       \
    if (stages == S && bytes == B) {     \
        call;                            \
        return 0;                        \
    }
#define TARFA_EMU_TMATVEC(S, B) \
    TARFA_EMU_PICK(S, B, TARFA_EMU_CAT(emu_tmatvec, S, B)(grid, block, shared, optin, jobs, nr, nw, ndtype, eps, xn))
#define TARFA_EMU_TGATE_UP(S, B) \
    TARFA_EMU_PICK(S, B, TARFA_EMU_CAT(emu_tgate_up, S, B)(grid, block, shared, optin, m, ids, k, x, h, np))
#define TARFA_EMU_TDOWN(S, B) \
    TARFA_EMU_PICK(S, B, TARFA_EMU_CAT(emu_tdown, S, B)(grid, block, shared, optin, m, ids, k, h, y, nr))
int emu_tmatvec(G, unsigned int optin, int stages, int bytes, const TarfaMatJobs* jobs, int nr,
                const unsigned char* nw, int ndtype, float eps, float* xn) {
    TARFA_EMU_TILES(TARFA_EMU_TMATVEC)
    return -1;
}
int emu_tgate_up(G, unsigned int optin, int stages, int bytes, const TarfaMoe* m, const int* ids,
                 int k, const float* x, float* h, int np) {
    TARFA_EMU_TILES(TARFA_EMU_TGATE_UP)
    return -1;
}
int emu_tdown(G, unsigned int optin, int stages, int bytes, const TarfaMoe* m, const int* ids, int k,
              const float* h, float* y, int nr) {
    TARFA_EMU_TILES(TARFA_EMU_TDOWN)
    return -1;
}
void emu_combine_norm(G, const float* y, const float* wts, int k, int n, const float* sh,
                      const float* shw, float* x, const unsigned char* w, int wdtype, float eps,
                      float* out) {
    RUN(tarfa_e_combine_norm(y, wts, k, n, sh, shw, x, w, wdtype, eps, out));
}
void emu_combine(G, const float* y, const float* wts, int k, int hidden, const float* sh,
                 const float* shw, float* x, int set) {
    RUN(tarfa_e_moe_combine(y, wts, k, hidden, sh, shw, x, set));
}
// Prompts as matrices (batch.cu).
void emu_mm(G, const TarfaMatJobs* jobs, int tokens) { TarfaMatJobs j = *jobs; RUN(tarfa_e_mm(j, tokens)); }
void emu_moe_group(G, const int* ids, int pairs, int n_experts, int* order, int* tiles) {
    RUN(tarfa_e_moe_group(ids, pairs, n_experts, order, tiles));
}
void emu_mm_gate_up(G, const TarfaMoe* m, const int* order, const int* tiles, int max_tiles, int kk,
                    const float* x, float* h) {
    TarfaMoe mm = *m;
    RUN(tarfa_e_mm_gate_up(mm, order, tiles, max_tiles, kk, x, h));
}
void emu_mm_down(G, const TarfaMoe* m, const int* order, const int* tiles, int max_tiles,
                 const float* h, float* y) {
    TarfaMoe mm = *m;
    RUN(tarfa_e_mm_down(mm, order, tiles, max_tiles, h, y));
}
void emu_embed_many(G, const unsigned char* table, int dtype, int hidden, const int* tokens, int per,
                    float* x) {
    RUN(tarfa_e_embed_many(table, dtype, hidden, tokens, per, x));
}
void emu_kv_store(G, const float* k, const float* v, const unsigned char* kn, int ndtype, int norm,
                  float eps, int kv_heads, int d, int half, const float* cos_tab,
                  const float* sin_tab, int pos0, float* kcache, float* vcache) {
    RUN(tarfa_e_kv_store(k, v, kn, ndtype, norm, eps, kv_heads, d, half, cos_tab, sin_tab, pos0,
                         kcache, vcache));
}
// tarfa_e_attention_many, or with `quads` tarfa_e_attention_quads (the same arguments).
void emu_attention_many(G, const float* q, const unsigned char* qn, int ndtype, int norm, float eps,
                        int heads, int kv_heads, int d, int half, const float* cos_tab,
                        const float* sin_tab, int pos0, float* kcache, float* vcache, int window,
                        float scaling, float* scores, int cap, float* out, int sh_scores,
                        int qstride, int gated, int quads) {
    if (quads) {
        RUN(tarfa_e_attention_quads(q, qn, ndtype, norm, eps, heads, kv_heads, d, half, cos_tab,
                                    sin_tab, pos0, kcache, vcache, window, scaling, scores, cap,
                                    out, sh_scores, qstride, gated));
    } else {
        RUN(tarfa_e_attention_many(q, qn, ndtype, norm, eps, heads, kv_heads, d, half, cos_tab,
                                   sin_tab, pos0, kcache, vcache, window, scaling, scores, cap, out,
                                   sh_scores, qstride, gated));
    }
}
void emu_topk_many(G, const float* z, int n, int k, int renorm, float* probs, int* ids, float* wts,
                   int stride) {
    RUN(tarfa_e_topk_many(z, n, k, renorm, probs, ids, wts, stride));
}
void emu_sigmoid_topk_many(G, const float* z, int n, const unsigned char* bias, int bias_dtype,
                           int k, int n_group, int topk_group, int renorm, float scale,
                           float* scratch, int* ids, float* wts, int stride) {
    RUN(tarfa_e_sigmoid_topk_many(z, n, bias, bias_dtype, k, n_group, topk_group, renorm, scale,
                                  scratch, ids, wts, stride));
}
void emu_mla_heads(G, float* q, const float* latent, const float* kvb, int nope, int rope, int vd,
                   int rank, int interleave, const float* cos_tab, const float* sin_tab,
                   const int* params, float* k, float* v) {
    RUN(tarfa_e_mla_heads(q, latent, kvb, nope, rope, vd, rank, interleave, cos_tab, sin_tab,
                          params, k, v));
}
void emu_widen_heads(G, const float* v, int heads, int vd, int d, float scale, float* out) {
    RUN(tarfa_e_widen_heads(v, heads, vd, d, scale, out));
}
void emu_narrow_heads(G, const float* attn, int heads, int d, int vd, float* out) {
    RUN(tarfa_e_narrow_heads(attn, heads, d, vd, out));
}
// The offload path's kernels (offload.cu). They are launched without programmatic dependent
// launch (offload.rs: plain cuLaunchKernel, one stream), so they never call tarfa_grid_enter; the
// emulation's check that every thread enters once is met here, before the body, where a
// non-dependent launch's whole body may run.
#define RUN_PLAIN(call) tarfa_emu_launch(grid, block, shared, [&] { tarfa_grid_enter(); call; })
void emu_swiglu_gate(G, const unsigned char* gate, const unsigned char* up, int dtype, int rows,
                     int cols, int tokens, float limit, const float* x, float* h) {
    RUN_PLAIN(tarfa_swiglu_gate(gate, up, dtype, rows, cols, tokens, limit, x, h));
}
void emu_offload_matvec(G, const unsigned char* w, int dtype, int rows, int cols, int tokens,
                        const float* x, float* y) {
    RUN_PLAIN(tarfa_matvec(w, dtype, rows, cols, tokens, x, y));
}
void emu_swiglu_gate_many(G, const unsigned long long* gate_ptrs, const unsigned long long* up_ptrs,
                          const int* tok_start, int n_experts, int dtype, int rows, int cols,
                          int total, float limit, const float* x, float* h) {
    RUN_PLAIN(tarfa_swiglu_gate_many(gate_ptrs, up_ptrs, tok_start, n_experts, dtype, rows, cols,
                                     total, limit, x, h));
}
void emu_matvec_many(G, const unsigned long long* w_ptrs, const int* tok_start, int n_experts,
                     int dtype, int rows, int cols, int total, const float* x, float* y) {
    RUN_PLAIN(tarfa_matvec_many(w_ptrs, tok_start, n_experts, dtype, rows, cols, total, x, y));
}
}
