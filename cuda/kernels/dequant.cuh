// Dequantisation: the element types of a weight and how each element of a row is found, as the
// CPU finds it (decode/src/quant.rs and weights.rs, the references). Nothing here adds: the
// canonical dots that use these values are in common.cuh and matvec.cu.

// Element types of a weight (GpuDtype::code). BF16 and F32 are plain arrays; F16 too; the others
// are GGUF's blocks (ggml's layouts, a row whole blocks), each element dequantised as gguf-py
// 0.19 computes it in numpy float32 (decode/src/quant.rs, the CPU's reference): every product
// and difference one rounded operation, in its order, so an element is the CPU's bits.
#define TARFA_BF16 0
#define TARFA_F32 1
#define TARFA_F16 2
#define TARFA_Q8_0 3
#define TARFA_Q4_0 4
#define TARFA_Q4_K 5
#define TARFA_Q5_K 6
#define TARFA_Q6_K 7
#define TARFA_Q4_1 8
#define TARFA_Q5_0 9
#define TARFA_Q5_1 10

// Bytes of a row of `cols` elements (cols whole blocks for the block types; the host checks).
__device__ __forceinline__ long long tarfa_row_bytes(int dtype, long long cols) {
    switch (dtype) {
        case TARFA_BF16:
        case TARFA_F16: return cols * 2;
        case TARFA_F32: return cols * 4;
        case TARFA_Q8_0: return cols / 32 * 34;
        case TARFA_Q4_0: return cols / 32 * 18;
        case TARFA_Q4_K: return cols / 256 * 144;
        case TARFA_Q5_K: return cols / 256 * 176;
        case TARFA_Q6_K: return cols / 256 * 210;
        case TARFA_Q4_1: return cols / 32 * 20;
        case TARFA_Q5_0: return cols / 32 * 22;
        default: return cols / 32 * 24;  // TARFA_Q5_1
    }
}

// IEEE half to float, exact (weights::f16_to_f32): a NaN keeps its payload, unquieted; a finite
// half's exponent and mantissa moved into place make 2^-112 times its magnitude, scaled by 2^112.
__device__ __forceinline__ float tarfa_f16(const unsigned char* p) {
    unsigned int h = (unsigned int)p[0] | ((unsigned int)p[1] << 8);
    unsigned int sign = (h & 0x8000u) << 16;
    unsigned int rest = h & 0x7fffu;
    unsigned int bits;
    if (rest >= 0x7c00u) {
        bits = 0x7f800000u | ((rest & 0x3ffu) << 13);
    } else {
        bits = __float_as_int(__fmul_rn(__int_as_float(rest << 13), __int_as_float((127 + 112) << 23)));
    }
    return __int_as_float(sign | bits);
}

// A Q4_K/Q5_K block's 6-bit scale and minimum of group g < 8 (scale_min_k4 of quant.rs).
__device__ __forceinline__ void tarfa_scale_min_k4(const unsigned char* s, int g, int* sc, int* mn) {
    if (g < 4) {
        *sc = s[g] & 0x3f;
        *mn = s[g + 4] & 0x3f;
    } else {
        *sc = (s[g + 4] & 0x0f) | ((s[g - 4] >> 2) & 0x30);
        *mn = (s[g + 4] >> 4) | ((s[g] >> 2) & 0x30);
    }
}

// ---- A block type's elements, a warp's lanes at a time ----------------------------------------
// The products of a block type run a warp per row (matvec.cu, tarfa_warp_rows): lane l takes the
// elements l, l + 32, l + 64, ... — the canonical order's logical lane l — so chunk c (elements
// 32c .. 32c + 31) is one element per lane, and the warp reads the chunk's bytes together. What
// a whole chunk shares (its group's scale and minimum, a Q5 block's fifth bits) is found once per
// chunk by one lane (tarfa_chunk_params) and shuffled to the others; each lane's element is then
// its quant bits (tarfa_chunk_quant) put through tarfa_chunk_weight. The values are gguf-py
// 0.19's in numpy float32 (decode/src/quant.rs): every product and difference one rounded
// operation, in its order — `d·q`, `(d·q)+m`, `(d·sc)·q − (dmin·m)`, `(d·sc)·(q−32)`.

// What chunk c of a row shares: a and m the scale and minimum (Q6_K: the scales of its two
// 16-element groups), h a Q5_0/Q5_1 block's fifth bits.
struct TarfaChunk {
    float a;
    float m;
    unsigned int h;
};

__device__ __forceinline__ unsigned int tarfa_u32(const unsigned char* p) {
    return (unsigned int)p[0] | ((unsigned int)p[1] << 8) | ((unsigned int)p[2] << 16) |
           ((unsigned int)p[3] << 24);
}

// Chunk c's shared values (c counts chunks from `row`, which may be a table of whole-block rows).
__device__ __forceinline__ TarfaChunk tarfa_chunk_params(const unsigned char* row, int dtype,
                                                        long long c) {
    TarfaChunk p = {0.0f, 0.0f, 0u};
    if (dtype == TARFA_Q8_0) {
        p.a = tarfa_f16(row + c * 34);
    } else if (dtype == TARFA_Q4_0) {
        p.a = tarfa_f16(row + c * 18);
    } else if (dtype == TARFA_Q4_1) {
        const unsigned char* b = row + c * 20;
        p.a = tarfa_f16(b);
        p.m = tarfa_f16(b + 2);
    } else if (dtype == TARFA_Q5_0) {
        const unsigned char* b = row + c * 22;
        p.a = tarfa_f16(b);
        p.h = tarfa_u32(b + 2);
    } else if (dtype == TARFA_Q5_1) {
        const unsigned char* b = row + c * 24;
        p.a = tarfa_f16(b);
        p.m = tarfa_f16(b + 2);
        p.h = tarfa_u32(b + 4);
    } else if (dtype == TARFA_Q4_K || dtype == TARFA_Q5_K) {
        const unsigned char* b = row + c / 8 * (dtype == TARFA_Q5_K ? 176 : 144);
        int sc, mn;
        tarfa_scale_min_k4(b + 4, (int)(c % 8), &sc, &mn);
        p.a = __fmul_rn(tarfa_f16(b), (float)sc);
        p.m = __fmul_rn(tarfa_f16(b + 2), (float)mn);
    } else {  // TARFA_Q6_K: chunk 4i + t of a block is elements 128i + 32t .. 128i + 32t + 31
        const unsigned char* b = row + c / 8 * 210;
        int i = (int)(c % 8) / 4, t = (int)(c % 4);
        float d = tarfa_f16(b + 208);
        p.a = __fmul_rn(d, (float)(signed char)b[192 + 8 * i + 2 * t]);
        p.m = __fmul_rn(d, (float)(signed char)b[192 + 8 * i + 2 * t + 1]);
    }
    return p;
}

// The quant bits of element 32c + l (lane l < 32): its byte, and (Q5_K, Q6_K) its high bits'
// byte in bits 8..15.
__device__ __forceinline__ unsigned int tarfa_chunk_quant(const unsigned char* row, int dtype,
                                                          long long c, int l) {
    switch (dtype) {
        case TARFA_Q8_0: return row[c * 34 + 2 + l];
        case TARFA_Q4_0: return row[c * 18 + 2 + l % 16];
        case TARFA_Q4_1: return row[c * 20 + 4 + l % 16];
        case TARFA_Q5_0: return row[c * 22 + 6 + l % 16];
        case TARFA_Q5_1: return row[c * 24 + 8 + l % 16];
        case TARFA_Q4_K: return row[c / 8 * 144 + 16 + 32 * (c % 8 / 2) + l];
        case TARFA_Q5_K: {
            const unsigned char* b = row + c / 8 * 176;
            return b[48 + 32 * (c % 8 / 2) + l] | ((unsigned int)b[16 + l] << 8);
        }
        default: {  // TARFA_Q6_K: ql of element 128i + 32t + l is byte 64i + 32(t mod 2) + l
            const unsigned char* b = row + c / 8 * 210;
            int i = (int)(c % 8) / 4, t = (int)(c % 4);
            return b[64 * i + 32 * (t % 2) + l] | ((unsigned int)b[128 + 32 * i + l] << 8);
        }
    }
}

// Element 32c + l's value from its quant bits q and its chunk's shared values p.
__device__ __forceinline__ float tarfa_chunk_weight(int dtype, long long c, int l, unsigned int q,
                                                    const TarfaChunk& p) {
    int lo = (int)((q >> (l < 16 ? 0 : 4)) & 0x0fu);  // Q4_0 … Q5_1: elements 16.. are high nibbles
    switch (dtype) {
        case TARFA_Q8_0: return __fmul_rn((float)(signed char)(unsigned char)q, p.a);
        case TARFA_Q4_0: return __fmul_rn(p.a, (float)(lo - 8));
        case TARFA_Q4_1: return __fadd_rn(__fmul_rn(p.a, (float)lo), p.m);
        case TARFA_Q5_0: return __fmul_rn(p.a, (float)((lo | (int)(((p.h >> l) & 1u) << 4)) - 16));
        case TARFA_Q5_1: return __fadd_rn(__fmul_rn(p.a, (float)(lo | (int)(((p.h >> l) & 1u) << 4))), p.m);
        case TARFA_Q4_K:
        case TARFA_Q5_K: {
            int g = (int)(c % 8);
            int v = (int)((q >> (4 * (g % 2))) & 0x0fu);
            if (dtype == TARFA_Q5_K) v |= (int)(((q >> (8 + g)) & 1u) << 4);
            return __fsub_rn(__fmul_rn(p.a, (float)v), p.m);
        }
        default: {  // TARFA_Q6_K
            int t = (int)(c % 4);
            int v = (int)((q >> (4 * (t / 2))) & 0x0fu) | (int)(((q >> (8 + 2 * t)) & 0x03u) << 4);
            return __fmul_rn(l < 16 ? p.a : p.m, (float)(v - 32));
        }
    }
}

// Element k of a row (or vector) of `dtype`; of a block type, k may run across rows (a table of
// whole-block rows: an embedding).
__device__ __forceinline__ float tarfa_weight(const unsigned char* w, int dtype, long long k) {
    if (dtype == TARFA_BF16) {
        unsigned int bits = ((const unsigned short*)w)[k];
        return __int_as_float(bits << 16);
    }
    if (dtype == TARFA_F32) return ((const float*)w)[k];
    if (dtype == TARFA_F16) return tarfa_f16(w + 2 * k);
    long long c = k / 32;
    int l = (int)(k % 32);
    return tarfa_chunk_weight(dtype, c, l, tarfa_chunk_quant(w, dtype, c, l),
                              tarfa_chunk_params(w, dtype, c));
}
