// The tiled kernels' entry points at the ring this translation unit compiled cuda/kernels/tarfa.cu for
// (TARFA_TILE_STAGES stages of TARFA_TILE_STAGE_BYTES), named after it: emu_tmatvec_4_8192 for
// the default (launch.cc), emu_tmatvec_6_16384 for a ring tile.cc is compiled for, ...
// `optin`: the dynamic shared memory the host allowed the tiled kernels above 48 KiB (0: none),
// as CUDA's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES. A launch with less than the ring's
// shared memory aborts. Structs by pointer, as void* (each translation unit has its own copy of
// the kernels' types).
#define TARFA_EMU_CAT_(name, stages, bytes) name##_##stages##_##bytes
#define TARFA_EMU_CAT(name, stages, bytes) TARFA_EMU_CAT_(name, stages, bytes)
#define TARFA_EMU_RING(name) TARFA_EMU_CAT(name, TARFA_TILE_STAGES, TARFA_TILE_STAGE_BYTES)
#define TARFA_EMU_RUN_TILED(call)                                                            \
    do {                                                                                     \
        if (shared < TARFA_TILE_SHARED) std::abort();                                        \
        tarfa_emu_launch(grid, block, shared, [&] { call; }, optin > 48 * 1024 ? optin : 48 * 1024); \
    } while (0)

extern "C" {
void TARFA_EMU_RING(emu_tmatvec)(G, unsigned int optin, const void* jobs, int nr,
                                 const unsigned char* nw, int ndtype, float eps, float* xn) {
    TarfaMatJobs j = *(const TarfaMatJobs*)jobs;
    // Taking x in through a norm, a block keeps x (and the norm's scale) after the ring.
    if (nw && shared < TARFA_TILE_SHARED + TARFA_TILE_NORM_SHARED((unsigned int)j.job[0].cols)) std::abort();
    TARFA_EMU_RUN_TILED(tarfa_e_tmatvec(j, nr, nw, ndtype, eps, xn));
}
void TARFA_EMU_RING(emu_tgate_up)(G, unsigned int optin, const void* m, const int* ids, int k,
                                  const float* x, float* h, int np) {
    TarfaMoe mm = *(const TarfaMoe*)m;
    TARFA_EMU_RUN_TILED(tarfa_e_tmoe_gate_up(mm, ids, k, x, h, np));
}
void TARFA_EMU_RING(emu_tdown)(G, unsigned int optin, const void* m, const int* ids, int k,
                               const float* h, float* y, int nr) {
    TarfaMoe mm = *(const TarfaMoe*)m;
    TARFA_EMU_RUN_TILED(tarfa_e_tmoe_down(mm, ids, k, h, y, nr));
}
}
