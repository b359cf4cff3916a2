//! Test-only: tarfa's CUDA kernels (`cuda/kernels/`, compiled unchanged as C++)
//! run on the CPU by a small emulation of the CUDA features they use (`emu/emu.h`: a thread per
//! CUDA thread, barriers for `__syncthreads`/`__syncwarp`, warp shuffles through shared arrays,
//! the `_rn` intrinsics as IEEE-754 single operations, `__fmaf_rn` as `fmaf`). A machine without a
//! GPU — CI — can then hold each kernel to the CPU decoder's bits (tests/kernels.rs). It proves the
//! kernels' arithmetic and reduction order, not the GPU's hardware or the driver: the GPU test
//! (`decode/tests/gpu.rs`, `TARFA_REQUIRE_GPU=1`) does that on the GPU machine.
//!
//! Each wrapper launches its kernel with the geometry `cuda/src/device.rs` uses (quads of
//! 4 threads per output row in blocks of 256; a warp per head; a block per head; one warp for the
//! router) after checking every slice holds what the kernel reads or writes. A launch's blocks run
//! one at a time, in descending order: a kernel whose blocks needed a lower-numbered one to have
//! run first (to read what it stores in the same launch) fails here, as it could on a GPU, rather
//! than pass by the luck of ascending order. Not a shipped crate.
//!
//! Programmatic dependent launch is checked here too: every buffer [`EmuDevice`] allocates (the
//! engine's activations, never its uploaded weights) is inaccessible while a launch runs until its
//! first thread passes `tarfa_grid_enter`, so a kernel touching one early dies of SIGSEGV
//! (`tests/guard.rs`).
//!
//! The tiled kernels are compiled at several rings of shared-memory stages ([`tiles`]: the
//! default and the others `build.rs` lists, `emu/tile.cc` once for each), so the tests hold each
//! ring to the same bits; a tiled launch takes more than 48 KiB only where the host allowed it,
//! as on the GPU. A block that stores past the dynamic shared memory its launch asked for aborts
//! (256 guard bytes after it are checked when the block ends).
//!
//! `unsafe` is denied here as in the runtime, and allowed only where the FFI into the emulation is
//! called: each kernel wrapper below and [`EmuDevice`]'s `launch` carry `#[allow(unsafe_code)]`,
//! with the size checks before the call and a `SAFETY` argument at it. The `extern "C"` block
//! declares the emulated kernels (C++ built by `build.rs` from `emu/` and `cuda/kernels/`): the
//! engine's `tarfa_e_*` and the offload path's four (`offload_*`, offload.rs's geometry).

#![deny(unsafe_code)]
#![allow(clippy::too_many_arguments)]

/// Element types as the kernels number them: the engine's own ([`tarfa_cuda::GpuDtype`]).
pub use tarfa_cuda::GpuDtype as Dt;

/// A weight matrix or vector in host memory, in the kernels' byte form.
#[derive(Clone, Debug)]
pub struct W {
    /// Element bytes.
    pub bytes: Vec<u8>,
    /// Element type.
    pub dt: Dt,
}

impl W {
    /// BF16 weights from their bit patterns.
    pub fn bf16(bits: &[u16]) -> W {
        W {
            bytes: bits.iter().flat_map(|b| b.to_le_bytes()).collect(),
            dt: Dt::Bf16,
        }
    }

    /// `f32` weights.
    pub fn f32(v: &[f32]) -> W {
        W {
            bytes: v.iter().flat_map(|b| b.to_le_bytes()).collect(),
            dt: Dt::F32,
        }
    }

    /// Bytes of an F16 or a GGUF block type as stored (whole blocks).
    pub fn quant(dt: Dt, bytes: Vec<u8>) -> W {
        assert!(bytes.len().is_multiple_of(dt.block().1));
        W { bytes, dt }
    }

    fn elems(&self) -> usize {
        let (e, b) = self.dt.block();
        self.bytes.len() / b * e
    }

    /// The bytes at a 16-byte aligned address (as cudaMalloc gives), for wide loads.
    fn aligned(&self) -> Aligned {
        Aligned::new(&self.bytes)
    }
}

/// Bytes copied to a 256-byte aligned buffer.
struct Aligned {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    fn new(b: &[u8]) -> Aligned {
        let mut buf = vec![0u8; b.len() + 256];
        let off = (256 - (buf.as_ptr() as usize % 256)) % 256;
        buf[off..off + b.len()].copy_from_slice(b);
        Aligned {
            buf,
            off,
            len: b.len(),
        }
    }

    fn ptr(&self) -> *const u8 {
        self.buf[self.off..].as_ptr()
    }

    fn addr(&self) -> u64 {
        self.ptr() as u64
    }

    fn floats(&self) -> Vec<f32> {
        self.buf[self.off..self.off + self.len]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

fn fl(v: &[f32]) -> Aligned {
    Aligned::new(&v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
}

use tarfa_cuda::{warp_rows, MatJob, MatJobs, MoeArgs as Moe, TileGeometry};

extern "C" {
    fn emu_matvec(g: u32, b: u32, s: u32, jobs: *const MatJobs);
    fn emu_wmatvec(g: u32, b: u32, s: u32, jobs: *const MatJobs);
    fn emu_guard(p: *mut u8, n: usize, on: i32);
    fn emu_read_before_enter(x: *const f32, out: *mut f32);
    fn emu_embed(g: u32, b: u32, s: u32, t: *const u8, dt: i32, h: i32, p: *const i32, x: *mut f32);
    fn emu_rms_norm(
        g: u32,
        b: u32,
        s: u32,
        x: *const f32,
        w: *const u8,
        dt: i32,
        n: i32,
        eps: f32,
        out: *mut f32,
    );
    fn emu_attention(
        g: u32,
        b: u32,
        s: u32,
        q: *const f32,
        k: *const f32,
        v: *const f32,
        qn: *const u8,
        kn: *const u8,
        ndt: i32,
        norm: i32,
        eps: f32,
        heads: i32,
        kvh: i32,
        d: i32,
        half: i32,
        cos: *const f32,
        sin: *const f32,
        params: *const i32,
        kc: *mut f32,
        vc: *mut f32,
        window: i32,
        scaling: f32,
        scores: *mut f32,
        cap: i32,
        out: *mut f32,
        sh_scores: i32,
        qstride: i32,
        gated: i32,
        sinks: *const u8,
        sink_dtype: i32,
    );
    fn emu_delta_heads(
        g: u32,
        b: u32,
        s: u32,
        mixed: *const f32,
        conv_w: *const u8,
        conv_dtype: i32,
        kernel: i32,
        hist: *mut f32,
        params: *const i32,
        z: *const f32,
        bv: *const f32,
        av: *const f32,
        dt_bias: *const u8,
        dt_dtype: i32,
        a_log: *const u8,
        a_dtype: i32,
        a_neg: i32,
        norm_w: *const u8,
        ndtype: i32,
        k_heads: i32,
        v_heads: i32,
        dk: i32,
        dv: i32,
        q_div: f32,
        eps: f32,
        state: *mut f32,
        out: *mut f32,
    );
    fn emu_hc_weights(
        g: u32,
        b: u32,
        s: u32,
        mix: *const f32,
        base: *const u8,
        bdtype: i32,
        scale: *const u8,
        sdtype: i32,
        n: i32,
        eps: f32,
        iters: i32,
        out: *mut f32,
    );
    fn emu_hc_collapse(
        g: u32,
        b: u32,
        s: u32,
        x: *const f32,
        w: *const f32,
        n: i32,
        hidden: i32,
        c: *mut f32,
    );
    fn emu_hc_expand(
        g: u32,
        b: u32,
        s: u32,
        x: *mut f32,
        w: *const f32,
        y: *const f32,
        n: i32,
        hidden: i32,
    );
    fn emu_hc_mean(g: u32, b: u32, s: u32, x: *const f32, n: i32, hidden: i32, out: *mut f32);
    fn emu_kda_heads(
        g: u32,
        b: u32,
        s: u32,
        mixed: *const f32,
        conv_w: *const u8,
        conv_dtype: i32,
        kernel: i32,
        hist: *mut f32,
        params: *const i32,
        f: *const f32,
        bv: *const f32,
        gate: *const f32,
        dt_bias: *const u8,
        dt_dtype: i32,
        a_log: *const u8,
        a_dtype: i32,
        a_neg: i32,
        has_lb: i32,
        lb: f32,
        norm_w: *const u8,
        ndtype: i32,
        heads: i32,
        dim: i32,
        q_scale: f32,
        eps: f32,
        state: *mut f32,
        out: *mut f32,
    );
    fn emu_topk(
        g: u32,
        b: u32,
        s: u32,
        z: *const f32,
        n: i32,
        k: i32,
        renorm: i32,
        probs: *mut f32,
        ids: *mut i32,
        wts: *mut f32,
        gz: *const f32,
        gw: *mut f32,
    );
    fn emu_gate_up(
        g: u32,
        b: u32,
        s: u32,
        m: *const Moe,
        ids: *const i32,
        k: i32,
        x: *const f32,
        h: *mut f32,
    );
    fn emu_down(
        g: u32,
        b: u32,
        s: u32,
        m: *const Moe,
        ids: *const i32,
        k: i32,
        h: *const f32,
        y: *mut f32,
    );
    fn emu_wgate_up(
        g: u32,
        b: u32,
        s: u32,
        m: *const Moe,
        ids: *const i32,
        k: i32,
        x: *const f32,
        h: *mut f32,
    );
    fn emu_wdown(
        g: u32,
        b: u32,
        s: u32,
        m: *const Moe,
        ids: *const i32,
        k: i32,
        h: *const f32,
        y: *mut f32,
    );
    fn emu_tmatvec(
        g: u32,
        b: u32,
        s: u32,
        optin: u32,
        stages: i32,
        bytes: i32,
        jobs: *const MatJobs,
        nr: i32,
        nw: *const u8,
        ndtype: i32,
        eps: f32,
        xn: *mut f32,
    ) -> i32;
    fn emu_tgate_up(
        g: u32,
        b: u32,
        s: u32,
        optin: u32,
        stages: i32,
        bytes: i32,
        m: *const Moe,
        ids: *const i32,
        k: i32,
        x: *const f32,
        h: *mut f32,
        np: i32,
    ) -> i32;
    fn emu_tdown(
        g: u32,
        b: u32,
        s: u32,
        optin: u32,
        stages: i32,
        bytes: i32,
        m: *const Moe,
        ids: *const i32,
        k: i32,
        h: *const f32,
        y: *mut f32,
        nr: i32,
    ) -> i32;
    fn emu_combine_norm(
        g: u32,
        b: u32,
        s: u32,
        y: *const f32,
        w: *const f32,
        k: i32,
        n: i32,
        sh: *const f32,
        shw: *const f32,
        x: *mut f32,
        nw: *const u8,
        ndt: i32,
        eps: f32,
        out: *mut f32,
    );
    fn emu_combine(
        g: u32,
        b: u32,
        s: u32,
        y: *const f32,
        w: *const f32,
        k: i32,
        hidden: i32,
        sh: *const f32,
        shw: *const f32,
        x: *mut f32,
        set: i32,
    );
    fn emu_sigmoid_topk(
        g: u32,
        b: u32,
        s: u32,
        z: *const f32,
        n: i32,
        bias: *const u8,
        bias_dtype: i32,
        k: i32,
        n_group: i32,
        topk_group: i32,
        renorm: i32,
        scale: f32,
        scratch: *mut f32,
        ids: *mut i32,
        wts: *mut f32,
    );
    fn emu_mm(g: u32, b: u32, s: u32, jobs: *const MatJobs, tokens: i32);
    fn emu_moe_group(
        g: u32,
        b: u32,
        s: u32,
        ids: *const i32,
        pairs: i32,
        n: i32,
        order: *mut i32,
        tiles: *mut i32,
    );
    fn emu_mm_gate_up(
        g: u32,
        b: u32,
        s: u32,
        m: *const Moe,
        order: *const i32,
        tiles: *const i32,
        max_tiles: i32,
        kk: i32,
        x: *const f32,
        h: *mut f32,
    );
    fn emu_mm_down(
        g: u32,
        b: u32,
        s: u32,
        m: *const Moe,
        order: *const i32,
        tiles: *const i32,
        max_tiles: i32,
        h: *const f32,
        y: *mut f32,
    );
    fn emu_embed_many(
        g: u32,
        b: u32,
        s: u32,
        t: *const u8,
        dt: i32,
        h: i32,
        tokens: *const i32,
        per: i32,
        x: *mut f32,
    );
    fn emu_kv_store(
        g: u32,
        b: u32,
        s: u32,
        k: *const f32,
        v: *const f32,
        kn: *const u8,
        ndtype: i32,
        norm: i32,
        eps: f32,
        kv_heads: i32,
        d: i32,
        half: i32,
        cos: *const f32,
        sin: *const f32,
        pos0: i32,
        kcache: *mut f32,
        vcache: *mut f32,
    );
    fn emu_attention_many(
        g: u32,
        b: u32,
        s: u32,
        q: *const f32,
        qn: *const u8,
        ndtype: i32,
        norm: i32,
        eps: f32,
        heads: i32,
        kv_heads: i32,
        d: i32,
        half: i32,
        cos: *const f32,
        sin: *const f32,
        pos0: i32,
        kcache: *mut f32,
        vcache: *mut f32,
        window: i32,
        scaling: f32,
        scores: *mut f32,
        cap: i32,
        out: *mut f32,
        sh_scores: i32,
        qstride: i32,
        gated: i32,
        quads: i32,
    );
    fn emu_topk_many(
        g: u32,
        b: u32,
        s: u32,
        z: *const f32,
        n: i32,
        k: i32,
        renorm: i32,
        probs: *mut f32,
        ids: *mut i32,
        wts: *mut f32,
        stride: i32,
    );
    fn emu_mla_heads(
        g: u32,
        b: u32,
        s: u32,
        q: *mut f32,
        latent: *const f32,
        kvb: *const f32,
        nope: i32,
        rope: i32,
        vd: i32,
        rank: i32,
        interleave: i32,
        cos: *const f32,
        sin: *const f32,
        params: *const i32,
        k: *mut f32,
        v: *mut f32,
    );
    fn emu_widen_heads(
        g: u32,
        b: u32,
        s: u32,
        v: *const f32,
        heads: i32,
        vd: i32,
        d: i32,
        scale: f32,
        out: *mut f32,
    );
    fn emu_narrow_heads(
        g: u32,
        b: u32,
        s: u32,
        attn: *const f32,
        heads: i32,
        d: i32,
        vd: i32,
        out: *mut f32,
    );
    fn emu_sigmoid_topk_many(
        g: u32,
        b: u32,
        s: u32,
        z: *const f32,
        n: i32,
        bias: *const u8,
        bias_dtype: i32,
        k: i32,
        n_group: i32,
        topk_group: i32,
        renorm: i32,
        scale: f32,
        scratch: *mut f32,
        ids: *mut i32,
        wts: *mut f32,
        stride: i32,
    );
    fn emu_swiglu_gate(
        g: u32,
        b: u32,
        s: u32,
        gate: *const u8,
        up: *const u8,
        dtype: i32,
        rows: i32,
        cols: i32,
        tokens: i32,
        limit: f32,
        x: *const f32,
        h: *mut f32,
    );
    fn emu_offload_matvec(
        g: u32,
        b: u32,
        s: u32,
        w: *const u8,
        dtype: i32,
        rows: i32,
        cols: i32,
        tokens: i32,
        x: *const f32,
        y: *mut f32,
    );
    fn emu_swiglu_gate_many(
        g: u32,
        b: u32,
        s: u32,
        gate_ptrs: *const u64,
        up_ptrs: *const u64,
        tok_start: *const i32,
        n_experts: i32,
        dtype: i32,
        rows: i32,
        cols: i32,
        total: i32,
        limit: f32,
        x: *const f32,
        h: *mut f32,
    );
    fn emu_matvec_many(
        g: u32,
        b: u32,
        s: u32,
        w_ptrs: *const u64,
        tok_start: *const i32,
        n_experts: i32,
        dtype: i32,
        rows: i32,
        cols: i32,
        total: i32,
        x: *const f32,
        y: *mut f32,
    );
}

const BLOCK: u32 = 256;
/// Threads of a tiled launch (`TARFA_TILE_THREADS`).
const TILE_THREADS: u32 = 128;

/// The rings the tiled kernels are compiled for here: the default first, then the others
/// `build.rs` lists.
pub fn tiles() -> Vec<TileGeometry> {
    env!("TARFA_EMU_TILES")
        .split(';')
        .map(|t| TileGeometry::parse(t).expect("build.rs lists rings the kernels take"))
        .collect()
}

/// The shared memory an emulated block may take when the host opts in: an H200's (227 KiB).
pub const SHARED_OPT_IN: u32 = 232_448;

/// The ring's numbers as the emulation's dispatch takes them, after what the host allows the
/// tiled kernels (as `CudaDevice` sets `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` for
/// them): all a block may take.
fn ring_args(ring: TileGeometry) -> (u32, i32, i32) {
    (
        SHARED_OPT_IN,
        ring.stages() as i32,
        ring.stage_bytes() as i32,
    )
}

fn blocks(threads: usize) -> u32 {
    threads.div_ceil(BLOCK as usize).max(1) as u32
}

/// One product of a [`matvec`] launch.
#[derive(Clone, Debug)]
pub struct Product {
    /// `[rows, cols]`.
    pub w: W,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// `cols` inputs.
    pub x: Vec<f32>,
    /// A bias of `rows` elements.
    pub bias: Option<W>,
    /// Add to `y0` (a residual) instead of storing.
    pub accumulate: Option<Vec<f32>>,
    /// Use wide loads (the engine sets it when `cols` is a multiple of 8 and the type is BF16
    /// or F32: a block type read with wide loads would be misread, so it is refused here).
    pub vec: bool,
}

/// `tarfa_e_matvec` with up to four products in one launch; each product's `y`.
pub fn matvec(products: &[Product]) -> Vec<Vec<f32>> {
    matvec_launch(products, None, None).0
}

/// `tarfa_e_tmatvec` (the tiled kernel, compiled for `ring`: one of [`tiles`]) with `nr` rows
/// per block: the products share their columns (a multiple of 32), element type and x, as the
/// engine launches it.
pub fn matvec_tiled(products: &[Product], nr: usize, ring: TileGeometry) -> Vec<Vec<f32>> {
    matvec_tiled_checks(products, nr);
    matvec_launch(products, Some((nr, ring)), None).0
}

/// `tarfa_e_tmatvec` taking its x in through an RMSNorm (weights `w`, `eps`): the products
/// (as [`matvec_tiled`]'s) of `w · RMSNorm(x)`, x being job 0's, normalised by every block
/// itself; also returns what block 0 writes of the normed x.
pub fn matvec_tiled_normed(
    products: &[Product],
    nr: usize,
    ring: TileGeometry,
    w: &W,
    eps: f32,
) -> (Vec<Vec<f32>>, Vec<f32>) {
    assert!(products[0].cols.is_multiple_of(32) && w.elems() == products[0].cols);
    matvec_tiled_checks(products, nr);
    let (outs, xn) = matvec_launch(products, Some((nr, ring)), Some((w, eps)));
    (outs, xn.unwrap_or_default())
}

fn matvec_tiled_checks(products: &[Product], nr: usize) {
    assert!((1..=TILE_MAX_ROWS).contains(&nr));
    assert!(products.iter().all(|p| p.vec
        && p.cols.is_multiple_of(32)
        && p.cols == products[0].cols
        && p.w.dt == products[0].w.dt
        && p.x == products[0].x));
}

/// Product `p`'s job reading `x` and writing `y` (addresses), and the weight and bias buffers it
/// points into (to be kept alive while it runs).
fn product_job(p: &Product, x: u64, y: u64) -> (MatJob, Aligned, Option<Aligned>) {
    assert_eq!(p.w.elems(), p.rows * p.cols);
    assert!(!p.vec || (p.cols.is_multiple_of(8) && p.w.dt.wide()));
    let w = p.w.aligned();
    let b = p.bias.as_ref().map(|b| {
        assert_eq!(b.elems(), p.rows);
        b.aligned()
    });
    let job = MatJob {
        w: w.addr(),
        x,
        y,
        bias: b.as_ref().map_or(0, |b| b.addr()),
        rows: p.rows as i32,
        cols: p.cols as i32,
        dtype: p.w.dt.code(),
        bias_dtype: p.bias.as_ref().map_or(0, |b| b.dt.code()),
        accumulate: i32::from(p.accumulate.is_some()),
        vec: i32::from(p.vec),
    };
    (job, w, b)
}

/// Rows of a tiled launch's block at most (`TARFA_TILE_MAX_ROWS`).
pub const TILE_MAX_ROWS: usize = 32;

#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
fn matvec_launch(
    products: &[Product],
    tile: Option<(usize, TileGeometry)>,
    norm: Option<(&W, f32)>,
) -> (Vec<Vec<f32>>, Option<Vec<f32>>) {
    assert!((1..=4).contains(&products.len()));
    let mut keep = Vec::new();
    let mut outs = Vec::new();
    let mut m = MatJobs::default();
    let mut rows = 0;
    for (i, p) in products.iter().enumerate() {
        assert_eq!(p.x.len(), p.cols);
        let x = fl(&p.x);
        let y = fl(p.accumulate.as_deref().unwrap_or(&vec![0.0; p.rows]));
        assert_eq!(y.len, p.rows * 4);
        let (job, w, b) = product_job(p, x.addr(), y.addr());
        m.job[i] = job;
        m.row_start[i] = rows;
        rows += p.rows as i32;
        keep.push((w, x, b));
        outs.push(y);
    }
    m.row_start[products.len()] = rows;
    m.n = products.len() as i32;
    let nw = norm.map(|(w, _)| w.aligned());
    let xn_out = norm.map(|_| fl(&vec![0.0; products[0].cols]));
    // SAFETY: every job's buffers are alive (`keep`, `outs`) and hold rows × cols weights,
    // cols inputs, rows outputs and rows bias elements (asserted above). Tiled: job 0's x is every
    // job's (asserted by `matvec_tiled`), and the block has the ring's shared memory, and with a
    // norm cols floats more; its weights (`nw`) and `xn_out` hold cols elements.
    unsafe {
        match tile {
            // As the engine chooses (`warp_rows`): a warp per row with a K type, else a quad.
            None if warp_rows(products.iter().map(|p| p.w.dt.code())) => {
                emu_wmatvec(blocks(rows as usize * 32), BLOCK, 0, &m)
            }
            None => emu_matvec(blocks(rows as usize * 4), BLOCK, 0, &m),
            Some((nr, ring)) => {
                let (optin, stages, bytes) = ring_args(ring);
                let grid = (rows as usize).div_ceil(nr) as u32;
                let sh = ring.shared();
                let (nw, ndt, eps, sh) = match (&nw, norm) {
                    (Some(a), Some((w, eps))) => (
                        a.ptr(),
                        w.dt.code(),
                        eps,
                        sh + tile_norm_shared(products[0].cols) as u32,
                    ),
                    _ => (std::ptr::null(), 0, 0.0, sh),
                };
                let xn = xn_out
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |b| b.ptr() as *mut f32);
                let r = emu_tmatvec(
                    grid,
                    TILE_THREADS,
                    sh,
                    optin,
                    stages,
                    bytes,
                    &m,
                    nr as i32,
                    nw,
                    ndt,
                    eps,
                    xn,
                );
                assert_eq!(r, 0, "no tiled kernels compiled for {ring:?}");
            }
        }
    };
    drop((keep, nw));
    let outs = outs.iter().map(|y| y.floats()).collect();
    (outs, xn_out.map(|b| b.floats()))
}

/// `tarfa_e_mm` (a prompt pass's products): the products (up to four, each with `x` unused)
/// over the tokens `xs` (each `cols` floats, every product's columns alike); each product's
/// outputs token after token (`xs.len() × rows`). A product that accumulates adds to its
/// `accumulate` rows, the same for every token.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn mm(products: &[Product], xs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    assert!((1..=4).contains(&products.len()) && !xs.is_empty());
    let cols = products[0].cols;
    let x: Vec<f32> = xs
        .iter()
        .flat_map(|v| {
            assert_eq!(v.len(), cols);
            v.iter().copied()
        })
        .collect();
    let x = fl(&x);
    let mut keep = Vec::new();
    let mut outs = Vec::new();
    let mut m = MatJobs::default();
    let mut rows = 0;
    let mut tiles = 0;
    for (i, p) in products.iter().enumerate() {
        assert_eq!(p.cols, cols);
        let y0 = p.accumulate.clone().unwrap_or_else(|| vec![0.0; p.rows]);
        let y = fl(&y0.repeat(xs.len()));
        let (job, w, b) = product_job(p, x.addr(), y.addr());
        m.job[i] = job;
        m.row_start[i] = rows;
        rows += p.rows as i32;
        tiles += p.rows.div_ceil(MM_ROWS);
        keep.push((w, b));
        outs.push(y);
    }
    m.row_start[products.len()] = rows;
    m.n = products.len() as i32;
    let grid = (tiles * xs.len().div_ceil(MM_TOKENS)) as u32;
    // SAFETY: every job's buffers are alive (`keep`, `outs`, `x`) and hold rows × cols weights,
    // tokens × cols inputs, tokens × rows outputs and rows bias elements (asserted above); a
    // block per row tile and token tile, 256 threads.
    unsafe { emu_mm(grid, 256, 0, &m, xs.len() as i32) };
    drop((keep, x));
    outs.iter().map(|y| y.floats()).collect()
}

/// Rows and tokens of a `tarfa_e_mm` block (`TARFA_MM_BR`, `TARFA_MM_BT`).
const MM_ROWS: usize = 32;
const MM_TOKENS: usize = 16;

/// `tarfa_e_combine_norm`: `x += Σ_s y[s] · wts[s]` (slot order) `+ shared` (when given; with
/// its weight, `+ weight · shared`), then `w · RMSNorm(x)`; returns the new x and the normed
/// output. `y` holds `wts.len()` rows of `x.len()` floats, `shared` one.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn combine_norm(
    y: &[f32],
    wts: &[f32],
    shared: Option<(&[f32], Option<f32>)>,
    x: &[f32],
    w: &W,
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let n = x.len();
    assert_eq!(y.len(), wts.len() * n);
    assert_eq!(w.elems(), n);
    assert!(shared.is_none_or(|s| s.0.len() == n));
    let (ya, wa, xa, nw) = (fl(y), fl(wts), fl(x), w.aligned());
    let sh = shared.map(|s| fl(s.0));
    let shp = sh
        .as_ref()
        .map_or(std::ptr::null(), |a| a.ptr() as *const f32);
    let shw = shared.and_then(|s| s.1).map(|g| fl(&[g]));
    let shwp = shw
        .as_ref()
        .map_or(std::ptr::null(), |a| a.ptr() as *const f32);
    let out = fl(&vec![0.0; n]);
    // SAFETY: y holds k × n floats, wts k, x, out and (when not null) sh n, w n elements.
    unsafe {
        emu_combine_norm(
            1,
            BLOCK,
            0,
            ya.ptr() as _,
            wa.ptr() as _,
            wts.len() as i32,
            n as i32,
            shp,
            shwp,
            xa.ptr() as *mut f32,
            nw.ptr(),
            w.dt.code(),
            eps,
            out.ptr() as *mut f32,
        )
    };
    (xa.floats(), out.floats())
}

/// A Gated DeltaNet layer's widths and weights, as `tarfa_e_delta_heads` takes them.
#[derive(Clone, Debug)]
pub struct DeltaIn<'a> {
    /// Key heads, value heads, key width, value width, convolution length.
    pub k_heads: usize,
    /// Value heads.
    pub v_heads: usize,
    /// Key head width.
    pub dk: usize,
    /// Value head width.
    pub dv: usize,
    /// Convolution length.
    pub kernel: usize,
    /// The convolution's weights, `[conv_dim, kernel]`.
    pub conv: &'a W,
    /// `dt_bias` (`v_heads`).
    pub dt_bias: &'a W,
    /// `A_log` (`v_heads`), or with `a_neg` the rates' negations `−exp(A_log)` (a GGUF's
    /// `ssm_a`).
    pub a_log: &'a W,
    /// Whether `a_log` holds `−exp(A_log)`.
    pub a_neg: bool,
    /// The gated norm's weight (`dv`).
    pub norm: &'a W,
    /// Its epsilon.
    pub eps: f32,
}

/// One token at position `pos` through a DeltaNet layer as the engine launches it:
/// `tarfa_e_delta_heads`, a block of [`tarfa_cuda::delta_block`] threads per value head, 2·dk +
/// 2·dv floats of shared memory. `hist` (the convolution's ring: `kernel · conv_dim` floats,
/// position p in row p mod kernel) and `state` (`v_heads · dv · dk`) are advanced; returns the
/// heads' output.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn delta_step(
    d: &DeltaIn<'_>,
    pos: usize,
    hist: &mut Vec<f32>,
    state: &mut Vec<f32>,
    (mixed, z, b, a): (&[f32], &[f32], &[f32], &[f32]),
) -> Vec<f32> {
    let cd = 2 * d.k_heads * d.dk + d.v_heads * d.dv;
    let vd = d.v_heads * d.dv;
    assert!(d.kernel >= 1 && d.v_heads.is_multiple_of(d.k_heads));
    assert_eq!(
        (mixed.len(), z.len(), b.len(), a.len()),
        (cd, vd, d.v_heads, d.v_heads)
    );
    assert_eq!(hist.len(), d.kernel * cd);
    assert_eq!(state.len(), d.v_heads * d.dv * d.dk);
    assert_eq!(d.conv.elems(), cd * d.kernel);
    assert_eq!((d.dt_bias.elems(), d.a_log.elems()), (d.v_heads, d.v_heads));
    assert_eq!(d.norm.elems(), d.dv);
    let (ma, cw, hs) = (fl(mixed), d.conv.aligned(), fl(hist));
    let (za, ba, aa) = (fl(z), fl(b), fl(a));
    let (dt, al, nw) = (d.dt_bias.aligned(), d.a_log.aligned(), d.norm.aligned());
    let (st, out) = (fl(state), fl(&vec![0.0; vd]));
    let params = [0i32, pos as i32];
    // SAFETY: sizes asserted above: mixed conv_dim floats, the weights conv_dim × kernel
    // elements, the ring kernel × conv_dim floats; z and out v_heads·dv, b and a v_heads, the
    // state v_heads·dv·dk; shared memory 2·dk + 2·dv floats.
    unsafe {
        emu_delta_heads(
            d.v_heads as u32,
            tarfa_cuda::delta_block(d.dv),
            ((2 * d.dk + 2 * d.dv) * 4) as u32,
            ma.ptr() as _,
            cw.ptr(),
            d.conv.dt.code(),
            d.kernel as i32,
            hs.ptr() as *mut f32,
            params.as_ptr(),
            za.ptr() as _,
            ba.ptr() as _,
            aa.ptr() as _,
            dt.ptr(),
            d.dt_bias.dt.code(),
            al.ptr(),
            d.a_log.dt.code(),
            i32::from(d.a_neg),
            nw.ptr(),
            d.norm.dt.code(),
            d.k_heads as i32,
            d.v_heads as i32,
            d.dk as i32,
            d.dv as i32,
            (d.dk as f64).sqrt() as f32,
            d.eps,
            st.ptr() as *mut f32,
            out.ptr() as *mut f32,
        );
    }
    *hist = hs.floats();
    *state = st.floats();
    out.floats()
}

/// One hyper-connection site of one token as the engine launches it: `tarfa_e_hc_weights` (one
/// thread) on `mix` (`(2 + n)·n` values), then `tarfa_e_hc_collapse` of the streams `x`
/// (`n·hidden`) and `tarfa_e_hc_expand` of `y` into them (a thread per element, blocks of 128).
/// Returns the weights (`[pre | post | comb]`), the collapsed input and the new streams.
#[allow(unsafe_code)] // the FFI calls into the emulation, SAFETY at each
pub fn hc_site(
    (n, eps, iters): (usize, f32, usize),
    mix: &[f32],
    (base, scale): (&W, &W),
    x: &[f32],
    y: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let hidden = y.len();
    assert!((1..=8).contains(&n) && iters >= 1);
    assert_eq!(
        (mix.len(), base.elems(), scale.elems()),
        ((2 + n) * n, (2 + n) * n, 3)
    );
    assert_eq!(x.len(), n * hidden);
    let (ma, ba, sa) = (fl(mix), base.aligned(), scale.aligned());
    let w = fl(&vec![0.0; (2 + n) * n]);
    let (xa, ya, c) = (fl(x), fl(y), fl(&vec![0.0; hidden]));
    let blocks = hidden.div_ceil(128) as u32;
    // SAFETY: mix and w (2 + n)·n floats, base (2 + n)·n elements, scale 3; x n·hidden floats,
    // y and c hidden; n ≤ 8 (the kernels' TARFA_HC_MAX); a thread per element, past the end
    // idle.
    unsafe {
        emu_hc_weights(
            1,
            32,
            0,
            ma.ptr() as _,
            ba.ptr(),
            base.dt.code(),
            sa.ptr(),
            scale.dt.code(),
            n as i32,
            eps,
            iters as i32,
            w.ptr() as *mut f32,
        );
        emu_hc_collapse(
            blocks,
            128,
            0,
            xa.ptr() as _,
            w.ptr() as _,
            n as i32,
            hidden as i32,
            c.ptr() as *mut f32,
        );
        emu_hc_expand(
            blocks,
            128,
            0,
            xa.ptr() as *mut f32,
            w.ptr() as _,
            ya.ptr() as _,
            n as i32,
            hidden as i32,
        );
    }
    (w.floats(), c.floats(), xa.floats())
}

/// `tarfa_e_hc_mean` of the streams `x` (`n·hidden`), a thread per element.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn hc_mean(n: usize, x: &[f32]) -> Vec<f32> {
    assert!((1..=8).contains(&n) && x.len().is_multiple_of(n));
    let hidden = x.len() / n;
    let (xa, out) = (fl(x), fl(&vec![0.0; hidden]));
    // SAFETY: x n·hidden floats, out hidden; a thread per element, past the end idle.
    unsafe {
        emu_hc_mean(
            hidden.div_ceil(128) as u32,
            128,
            0,
            xa.ptr() as _,
            n as i32,
            hidden as i32,
            out.ptr() as *mut f32,
        );
    }
    out.floats()
}

/// A KDA layer's widths and weights, as `tarfa_e_kda_heads` takes them.
#[derive(Clone, Debug)]
pub struct KdaIn<'a> {
    /// Heads.
    pub heads: usize,
    /// A head's width (keys and values alike).
    pub dim: usize,
    /// Convolution length.
    pub kernel: usize,
    /// The q, k and v convolutions' weights stacked, `[3·heads·dim, kernel]`.
    pub conv: &'a W,
    /// `dt_bias` (`heads·dim`).
    pub dt_bias: &'a W,
    /// `A_log` (`heads`), or with `a_neg` the rates' negations.
    pub a_log: &'a W,
    /// Whether `a_log` holds `−exp(A_log)`.
    pub a_neg: bool,
    /// `linear_lower_bound`, or none (the softplus gate).
    pub lower_bound: Option<f32>,
    /// The output norm's weight (`dim`).
    pub norm: &'a W,
    /// Its epsilon.
    pub eps: f32,
}

/// One token at position `pos` through a KDA layer as the engine launches it:
/// `tarfa_e_kda_heads`, a block of [`tarfa_cuda::delta_block`] threads per head, 5·dim floats
/// of shared memory. `hist` (the convolutions' ring: `kernel · 3·heads·dim` floats) and `state`
/// (`heads · dim · dim`) are advanced; returns the heads' output.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn kda_step(
    d: &KdaIn<'_>,
    pos: usize,
    hist: &mut Vec<f32>,
    state: &mut Vec<f32>,
    (mixed, f, b, gate): (&[f32], &[f32], &[f32], &[f32]),
) -> Vec<f32> {
    let w = d.heads * d.dim;
    assert!(d.kernel >= 1);
    assert_eq!(
        (mixed.len(), f.len(), b.len(), gate.len()),
        (3 * w, w, d.heads, w)
    );
    assert_eq!(hist.len(), d.kernel * 3 * w);
    assert_eq!(state.len(), d.heads * d.dim * d.dim);
    assert_eq!(d.conv.elems(), 3 * w * d.kernel);
    assert_eq!((d.dt_bias.elems(), d.a_log.elems()), (w, d.heads));
    assert_eq!(d.norm.elems(), d.dim);
    let (ma, cw, hs) = (fl(mixed), d.conv.aligned(), fl(hist));
    let (fa, ba, ga) = (fl(f), fl(b), fl(gate));
    let (dt, al, nw) = (d.dt_bias.aligned(), d.a_log.aligned(), d.norm.aligned());
    let (st, out) = (fl(state), fl(&vec![0.0; w]));
    let params = [0i32, pos as i32];
    // SAFETY: sizes asserted above: mixed 3w floats, the weights 3w × kernel elements, the ring
    // kernel × 3w floats; f, gate and out w, b heads, the state heads·dim²; shared memory 5·dim
    // floats.
    unsafe {
        emu_kda_heads(
            d.heads as u32,
            tarfa_cuda::delta_block(d.dim),
            (5 * d.dim * 4) as u32,
            ma.ptr() as _,
            cw.ptr(),
            d.conv.dt.code(),
            d.kernel as i32,
            hs.ptr() as *mut f32,
            params.as_ptr(),
            fa.ptr() as _,
            ba.ptr() as _,
            ga.ptr() as _,
            dt.ptr(),
            d.dt_bias.dt.code(),
            al.ptr(),
            d.a_log.dt.code(),
            i32::from(d.a_neg),
            i32::from(d.lower_bound.is_some()),
            d.lower_bound.unwrap_or(0.0),
            nw.ptr(),
            d.norm.dt.code(),
            d.heads as i32,
            d.dim as i32,
            (1.0 / (d.dim as f64).sqrt()) as f32,
            d.eps,
            st.ptr() as *mut f32,
            out.ptr() as *mut f32,
        );
    }
    *hist = hs.floats();
    *state = st.floats();
    out.floats()
}

/// `tarfa_e_rms_norm`: `w · (x · rsqrt(mean(x²) + eps))`.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn rms_norm(x: &[f32], w: &W, eps: f32) -> Vec<f32> {
    assert_eq!(w.elems(), x.len());
    let (xa, wa, out) = (fl(x), w.aligned(), fl(&vec![0.0; x.len()]));
    // SAFETY: x, w and out hold n elements.
    unsafe {
        emu_rms_norm(
            1,
            BLOCK,
            0,
            xa.ptr() as _,
            wa.ptr(),
            w.dt.code(),
            x.len() as i32,
            eps,
            out.ptr() as *mut f32,
        )
    };
    out.floats()
}

/// `tarfa_e_embed`: row `token` of `[vocab, hidden]`.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn embed(table: &W, hidden: usize, token: u32) -> Vec<f32> {
    assert!((token as usize + 1) * hidden <= table.elems());
    let (t, p, x) = (table.aligned(), [token as i32, 0], fl(&vec![0.0; hidden]));
    // SAFETY: the row lies in the table; x holds hidden floats.
    unsafe {
        emu_embed(
            blocks(hidden),
            BLOCK,
            0,
            t.ptr(),
            table.dt.code(),
            hidden as i32,
            p.as_ptr(),
            x.ptr() as *mut f32,
        )
    };
    x.floats()
}

/// The shapes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Rotated dims / 2.
    pub half: usize,
}

/// One token's attention inputs for [`attention`]: its q, k and v as the projections give them
/// (before the q/k norm and RoPE), the norms' weights, the RoPE tables, its position and the
/// caches (rows before `pos` filled; `cap` rows of `kv_heads × d`).
#[derive(Debug)]
pub struct AttnIn<'a> {
    /// `heads × d`.
    pub q: &'a [f32],
    /// `kv_heads × d`.
    pub k: &'a [f32],
    /// `kv_heads × d`.
    pub v: &'a [f32],
    /// q's and k's per-head RMSNorm weights (`d` each), or none.
    pub norms: Option<(&'a W, &'a W)>,
    /// The norms' epsilon.
    pub eps: f32,
    /// RoPE cosines, `half` per position.
    pub cos: &'a [f32],
    /// RoPE sines, `half` per position.
    pub sin: &'a [f32],
    /// The token's position.
    pub pos: usize,
    /// The key cache.
    pub kcache: &'a [f32],
    /// The value cache.
    pub vcache: &'a [f32],
    /// Sliding window.
    pub window: Option<usize>,
    /// The scores' scaling.
    pub scaling: f32,
    /// Scores in shared memory (else in global memory).
    pub shared_scores: bool,
    /// Each head's sink logit (`heads` elements), or none.
    pub sinks: Option<&'a W>,
}

/// `tarfa_e_attention` of one token at `a.pos`: its q/k normed and rotated, k and v stored in
/// the caches' row `pos`, attention over rows `0..=pos` (or the window). Returns (out, kcache,
/// vcache).
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn attention(sh: Heads, a: &AttnIn<'_>) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (d, width, pos) = (sh.d, sh.kv_heads * sh.d, a.pos);
    assert_eq!(a.q.len(), sh.heads * d);
    assert_eq!((a.k.len(), a.v.len()), (width, width));
    assert!(a.cos.len() >= (pos + 1) * sh.half && a.sin.len() >= (pos + 1) * sh.half);
    assert!(a.kcache.len() >= (pos + 1) * width && a.vcache.len() == a.kcache.len());
    let cap = a.kcache.len() / width;
    let (qa, ka, va) = (fl(a.q), fl(a.k), fl(a.v));
    let zero = W::f32(&vec![0.0; d]);
    let (qn, kn) = a.norms.unwrap_or((&zero, &zero));
    assert_eq!((qn.elems(), kn.elems()), (d, d));
    let (qna, kna) = (qn.aligned(), kn.aligned());
    // Tables of at least one float: a zero-length buffer would have no address to pass.
    let (ca, sa) = (fl(&[a.cos, &[0.0]].concat()), fl(&[a.sin, &[0.0]].concat()));
    let (kc, vc) = (fl(a.kcache), fl(a.vcache));
    // A head's scores and its sink: cap + 1 floats.
    let scores = fl(&vec![0.0; sh.heads * (cap + 1)]);
    let out = fl(&vec![0.0; sh.heads * d]);
    let params = [0i32, pos as i32];
    let sh_scores = if a.shared_scores { cap + 1 } else { 0 };
    if let Some(s) = a.sinks {
        assert_eq!(s.elems(), sh.heads);
    }
    let sinks = a.sinks.map(W::aligned);
    // SAFETY: sizes asserted above; scores hold heads × (cap + 1) floats; shared memory 36 × d
    // floats and sh_scores more; the sinks (when given) heads elements.
    unsafe {
        emu_attention(
            sh.heads as u32,
            512,
            ((36 * d + sh_scores) * 4) as u32,
            qa.ptr() as _,
            ka.ptr() as _,
            va.ptr() as _,
            qna.ptr(),
            kna.ptr(),
            qn.dt.code(),
            i32::from(a.norms.is_some()),
            a.eps,
            sh.heads as i32,
            sh.kv_heads as i32,
            d as i32,
            sh.half as i32,
            ca.ptr() as _,
            sa.ptr() as _,
            params.as_ptr(),
            kc.ptr() as *mut f32,
            vc.ptr() as *mut f32,
            a.window.map_or(0, |w| w as i32),
            a.scaling,
            scores.ptr() as *mut f32,
            cap as i32 + 1,
            out.ptr() as *mut f32,
            sh_scores as i32,
            d as i32,
            0,
            sinks.as_ref().map_or(std::ptr::null(), |s| s.ptr()),
            a.sinks.map_or(0, |s| s.dt.code()),
        )
    };
    (out.floats(), kc.floats(), vc.floats())
}

/// A prompt pass's attention (`tarfa_e_kv_store`, then `tarfa_e_attention_many`, or with `quads`
/// `tarfa_e_attention_quads`: four query heads of a group a block), no q/k norm and no rotation: the tokens' q, k and v (each token's `heads × d` and `kv_heads × d`) at
/// positions `pos0..pos0 + q.len()`, the caches' earlier rows `kc`, `vc` (`pos0` rows), the scores
/// in shared memory or (`shared_scores` false) in global memory. Returns each token's output
/// (`heads × d`) and the caches after.
#[allow(unsafe_code, clippy::too_many_arguments)] // the FFI calls into the emulation, SAFETY at each
pub fn attention_many(
    sh: Heads,
    q: &[Vec<f32>],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    (kc, vc): (&[f32], &[f32]),
    window: Option<usize>,
    scaling: f32,
    shared_scores: bool,
    quads: bool,
) -> (Vec<Vec<f32>>, Vec<f32>, Vec<f32>) {
    let (d, width, t) = (sh.d, sh.kv_heads * sh.d, q.len());
    assert_eq!(sh.half, 0, "no rotation here");
    assert!(t >= 1 && k.len() == t && v.len() == t);
    assert!(q.iter().all(|r| r.len() == sh.heads * d));
    assert!(k.iter().chain(v).all(|r| r.len() == width));
    assert!(kc.len() == vc.len() && kc.len().is_multiple_of(width));
    let pos0 = kc.len() / width;
    let cap = pos0 + t;
    let grow = |c: &[f32]| fl(&[c, &vec![f32::NAN; t * width]].concat());
    let (kca, vca) = (grow(kc), grow(vc));
    let (qa, ka, va) = (fl(&q.concat()), fl(&k.concat()), fl(&v.concat()));
    let zero = W::f32(&vec![0.0; d]).aligned();
    let (ca, sa) = (fl(&[0.0]), fl(&[0.0]));
    let scores = fl(&vec![0.0; t * sh.heads * cap]);
    let out = fl(&vec![0.0; t * sh.heads * d]);
    let sh_scores = if shared_scores { cap } else { 0 };
    // SAFETY: k and v hold t × width floats, the caches cap × width (rows pos0.. written here),
    // the norm weight d floats (unused: no norm), the tables one float (no rotation: half 0);
    // one warp a block, d floats of shared memory.
    unsafe {
        emu_kv_store(
            (sh.kv_heads * t) as u32,
            32,
            (d * 4) as u32,
            ka.ptr() as _,
            va.ptr() as _,
            zero.ptr(),
            Dt::F32.code(),
            0,
            1e-6,
            sh.kv_heads as i32,
            d as i32,
            0,
            ca.ptr() as _,
            sa.ptr() as _,
            pos0 as i32,
            kca.ptr() as *mut f32,
            vca.ptr() as *mut f32,
        )
    };
    // A block per (token, head) with 36 × d floats of shared memory before the scores, or per
    // (token, KV head, four of its group's heads) with 8 × d floats before four heads' scores.
    let (blocks, threads, shared) = if quads {
        let per = (sh.heads / sh.kv_heads).div_ceil(4);
        (t * sh.kv_heads * per, 256, 8 * d + 4 * sh_scores)
    } else {
        (t * sh.heads, 512, 36 * d + sh_scores)
    };
    // SAFETY: q holds t × heads·d floats, the caches cap rows (all written), scores
    // t × heads × cap floats, out t × heads·d; shared memory as the kernel's comment says.
    unsafe {
        emu_attention_many(
            blocks as u32,
            threads,
            (shared * 4) as u32,
            qa.ptr() as _,
            zero.ptr(),
            Dt::F32.code(),
            0,
            1e-6,
            sh.heads as i32,
            sh.kv_heads as i32,
            d as i32,
            0,
            ca.ptr() as _,
            sa.ptr() as _,
            pos0 as i32,
            kca.ptr() as *mut f32,
            vca.ptr() as *mut f32,
            window.map_or(0, |w| w as i32),
            scaling,
            scores.ptr() as *mut f32,
            cap as i32,
            out.ptr() as *mut f32,
            sh_scores as i32,
            d as i32,
            0,
            i32::from(quads),
        )
    };
    let rows = out
        .floats()
        .chunks_exact(sh.heads * d)
        .map(<[f32]>::to_vec)
        .collect();
    (rows, kca.floats(), vca.floats())
}

/// The `(expert, weight)` slots a router kernel wrote.
fn route(ids: &[i32], wts: &Aligned) -> Vec<(u32, f32)> {
    ids.iter()
        .zip(wts.floats())
        .map(|(&e, w)| (e as u32, w))
        .collect()
}

/// `tarfa_e_topk`: the `(expert, weight)` route of router logits `z`.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn topk(z: &[f32], k: usize, renorm: bool) -> Vec<(u32, f32)> {
    assert!(k >= 1 && k <= z.len());
    let (za, probs) = (fl(z), fl(&vec![0.0; z.len()]));
    let mut ids = vec![-1i32; k];
    let wts = fl(&vec![0.0; k]);
    // SAFETY: z and probs hold n floats, ids and wts k.
    unsafe {
        emu_topk(
            1,
            32,
            0,
            za.ptr() as _,
            z.len() as i32,
            k as i32,
            i32::from(renorm),
            probs.ptr() as *mut f32,
            ids.as_mut_ptr(),
            wts.ptr() as *mut f32,
            std::ptr::null(),
            std::ptr::null_mut(),
        )
    };
    route(&ids, &wts)
}

/// `tarfa_e_sigmoid_topk`: the `(expert, weight)` route of router logits `z` under GLM-4.5's
/// sigmoid router with the correction `bias` (`z.len()` elements), `n_group` groups of which
/// `topk_group` are kept, renormalised when `renorm`, scaled by `scale`.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn sigmoid_topk(
    z: &[f32],
    bias: &W,
    k: usize,
    (n_group, topk_group): (usize, usize),
    renorm: bool,
    scale: f32,
) -> Vec<(u32, f32)> {
    let n = z.len();
    assert!(k >= 1 && k <= n && bias.elems() == n);
    assert!(n_group >= 1 && n.is_multiple_of(n_group) && (1..=n_group).contains(&topk_group));
    let (za, ba, scratch) = (fl(z), bias.aligned(), fl(&vec![0.0; 3 * n]));
    let mut ids = vec![-1i32; k];
    let wts = fl(&vec![0.0; k]);
    // SAFETY: z holds n floats, bias n elements of its type, scratch 3n floats, ids and wts k.
    unsafe {
        emu_sigmoid_topk(
            1,
            32,
            0,
            za.ptr() as _,
            n as i32,
            ba.ptr(),
            bias.dt.code(),
            k as i32,
            n_group as i32,
            topk_group as i32,
            i32::from(renorm),
            scale,
            scratch.ptr() as *mut f32,
            ids.as_mut_ptr(),
            wts.ptr() as *mut f32,
        )
    };
    route(&ids, &wts)
}

/// One expert's weights: gate, up `[inter, hidden]`, down `[hidden, inter]`.
#[derive(Clone, Debug)]
pub struct Expert {
    /// Gate.
    pub gate: W,
    /// Up.
    pub up: W,
    /// Down.
    pub down: W,
}

/// `tarfa_e_moe_gate_up`, `tarfa_e_moe_down` and `tarfa_e_moe_combine` for the experts `ids`
/// (with weights `wts`) of `experts`: returns `x + Σ_s down_s(silu(gate_s x) ⊙ up_s x) · w_s`,
/// each SwiGLU's two dots clamped at `limit` first when there is one (`TarfaMoe::limit`).
#[allow(clippy::too_many_arguments)] // the launch's own arguments
pub fn moe(
    experts: &[Expert],
    inter: usize,
    hidden: usize,
    ids: &[u32],
    wts: &[f32],
    x: &[f32],
    residual: &[f32],
    limit: Option<f32>,
) -> Vec<f32> {
    moe_launch(experts, (inter, hidden, limit), ids, wts, x, residual, None)
}

/// [`moe`] with the tiled kernels compiled for `ring` (one of [`tiles`]): `tarfa_e_tmoe_gate_up`
/// with `pairs` (slot, row) pairs per block, `tarfa_e_tmoe_down` with `rows` rows per block, a
/// divisor of hidden; inter and hidden multiples of 32.
pub fn moe_tiled(
    experts: &[Expert],
    inter: usize,
    hidden: usize,
    ids: &[u32],
    wts: &[f32],
    x: &[f32],
    residual: &[f32],
    (pairs, rows, limit): (usize, usize, Option<f32>),
    ring: TileGeometry,
) -> Vec<f32> {
    assert!(inter.is_multiple_of(32) && hidden.is_multiple_of(32));
    assert!((1..=TILE_MAX_ROWS / 2).contains(&pairs) && (1..=TILE_MAX_ROWS).contains(&rows));
    assert!(
        hidden.is_multiple_of(rows),
        "a down block's rows are of one slot"
    );
    moe_launch(
        experts,
        (inter, hidden, limit),
        ids,
        wts,
        x,
        residual,
        Some((pairs, rows, ring)),
    )
}

#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
fn moe_launch(
    experts: &[Expert],
    (inter, hidden, limit): (usize, usize, Option<f32>),
    ids: &[u32],
    wts: &[f32],
    x: &[f32],
    residual: &[f32],
    tile: Option<(usize, usize, TileGeometry)>,
) -> Vec<f32> {
    let k = ids.len();
    assert_eq!(wts.len(), k);
    assert_eq!((x.len(), residual.len()), (hidden, hidden));
    assert!(ids.iter().all(|&e| (e as usize) < experts.len()));
    let held: Vec<[Aligned; 3]> = experts
        .iter()
        .map(|e| {
            assert_eq!(
                (e.gate.elems(), e.up.elems(), e.down.elems()),
                (inter * hidden, inter * hidden, hidden * inter)
            );
            let types = |x: &Expert| (x.gate.dt, x.up.dt, x.down.dt);
            assert_eq!(types(e), types(&experts[0]));
            [e.gate.aligned(), e.up.aligned(), e.down.aligned()]
        })
        .collect();
    let table = |i: usize| -> Vec<u64> { held.iter().map(|h| h[i].addr()).collect() };
    let (g, u, dn) = (table(0), table(1), table(2));
    let (dg, du, dd) = (experts[0].gate.dt, experts[0].up.dt, experts[0].down.dt);
    let m = Moe {
        gate: g.as_ptr() as u64,
        up: u.as_ptr() as u64,
        down: dn.as_ptr() as u64,
        n_experts: experts.len() as i32,
        inter: inter as i32,
        hidden: hidden as i32,
        dtype_g: experts[0].gate.dt.code(),
        dtype_u: experts[0].up.dt.code(),
        dtype_d: experts[0].down.dt.code(),
        vec_gu: i32::from(dg.wide() && dg == du && hidden.is_multiple_of(8)),
        vec_d: i32::from(dd.wide() && inter.is_multiple_of(8)),
        limit: limit.unwrap_or(0.0),
    };
    let ids_i: Vec<i32> = ids.iter().map(|&e| e as i32).collect();
    let (xa, h, y, w, out) = (
        fl(x),
        fl(&vec![0.0; k * inter]),
        fl(&vec![0.0; k * hidden]),
        fl(wts),
        fl(residual),
    );
    // SAFETY: every expert buffer is alive (`held`) with the sizes asserted; the address tables
    // (`g`, `u`, `dn`) too; ids < n_experts; h holds k × inter floats, y k × hidden, x hidden.
    unsafe {
        let (ids_p, ki, hp, yp) = (ids_i.as_ptr(), k as i32, h.ptr(), y.ptr());
        match tile {
            None => {
                // As the engine chooses (`warp_rows`): a warp per row with a K type.
                let (xp, hw) = (xa.ptr() as *const f32, hp as *mut f32);
                if warp_rows([m.dtype_g, m.dtype_u]) {
                    emu_wgate_up(blocks(k * inter * 32), BLOCK, 0, &m, ids_p, ki, xp, hw);
                } else {
                    emu_gate_up(blocks(k * inter * 4), BLOCK, 0, &m, ids_p, ki, xp, hw);
                }
                if warp_rows([m.dtype_d]) {
                    emu_wdown(
                        blocks(k * hidden * 32),
                        BLOCK,
                        0,
                        &m,
                        ids_p,
                        ki,
                        hp as _,
                        yp as _,
                    );
                } else {
                    emu_down(
                        blocks(k * hidden * 4),
                        BLOCK,
                        0,
                        &m,
                        ids_p,
                        ki,
                        hp as _,
                        yp as _,
                    );
                }
            }
            Some((np, nr, ring)) => {
                let gb = (k * inter).div_ceil(np) as u32;
                let db = (k * hidden).div_ceil(nr) as u32;
                let (t, sh) = (TILE_THREADS, ring.shared());
                let (o, st, by) = ring_args(ring);
                let xp = xa.ptr() as _;
                let gu = emu_tgate_up(gb, t, sh, o, st, by, &m, ids_p, ki, xp, hp as _, np as i32);
                let d = emu_tdown(
                    db, t, sh, o, st, by, &m, ids_p, ki, hp as _, yp as _, nr as i32,
                );
                assert_eq!((gu, d), (0, 0), "no tiled kernels compiled for {ring:?}");
            }
        }
        emu_combine(
            blocks(hidden),
            BLOCK,
            0,
            y.ptr() as _,
            w.ptr() as _,
            k as i32,
            hidden as i32,
            std::ptr::null(),
            std::ptr::null(),
            out.ptr() as *mut f32,
            0,
        );
    }
    out.floats()
}

// ---- the offload path's kernels (kernels/offload.cu) ------------------------------------------

/// Threads of an offload launch (`offload.rs`'s `BLOCK`): four warps, a warp per output row and
/// token.
const OFFLOAD_BLOCK: u32 = 128;

/// The grid `offload.rs` launches for `rows` × `tokens` warps.
fn offload_grid(rows: usize, tokens: usize) -> u32 {
    (rows * tokens)
        .div_ceil((OFFLOAD_BLOCK / 32) as usize)
        .max(1) as u32
}

/// The offload path's one-expert SwiGLU for each of `xs` (hidden floats each), as `offload.rs`'s
/// `GpuCompute::swiglu` launches it: `tarfa_swiglu_gate` (h = silu(gate x) ⊙ up x, the dots
/// clamped with a `limit`) then `tarfa_matvec` (y = down h); each token's y.
#[allow(unsafe_code)] // the FFI calls into the emulation, SAFETY at the calls
pub fn offload_swiglu(
    e: &Expert,
    inter: usize,
    hidden: usize,
    xs: &[Vec<f32>],
    limit: Option<f32>,
) -> Vec<Vec<f32>> {
    let t = xs.len();
    assert!(t > 0 && xs.iter().all(|x| x.len() == hidden));
    assert_eq!(
        (e.gate.elems(), e.up.elems(), e.down.elems()),
        (inter * hidden, inter * hidden, hidden * inter)
    );
    assert_eq!(e.gate.dt, e.up.dt);
    let (g, u, d) = (e.gate.aligned(), e.up.aligned(), e.down.aligned());
    let (x, h, y) = (
        fl(&xs.concat()),
        fl(&vec![0.0; t * inter]),
        fl(&vec![0.0; t * hidden]),
    );
    // SAFETY: gate and up hold inter × hidden weights, down hidden × inter; x holds t × hidden
    // floats, h t × inter, y t × hidden; whole warps past rows × tokens return.
    unsafe {
        emu_swiglu_gate(
            offload_grid(inter, t),
            OFFLOAD_BLOCK,
            0,
            g.ptr(),
            u.ptr(),
            e.gate.dt.code(),
            inter as i32,
            hidden as i32,
            t as i32,
            limit.unwrap_or(0.0),
            x.ptr() as _,
            h.ptr() as *mut f32,
        );
        emu_offload_matvec(
            offload_grid(hidden, t),
            OFFLOAD_BLOCK,
            0,
            d.ptr(),
            e.down.dt.code(),
            hidden as i32,
            inter as i32,
            t as i32,
            h.ptr() as _,
            y.ptr() as *mut f32,
        );
    }
    y.floats().chunks(hidden).map(<[f32]>::to_vec).collect()
}

/// `tarfa_matvec` alone (an offloaded trunk product): `w x` for each of `xs`.
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn offload_matvec(w: &W, rows: usize, cols: usize, xs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let t = xs.len();
    assert!(t > 0 && xs.iter().all(|x| x.len() == cols));
    assert_eq!(w.elems(), rows * cols);
    let (wa, x, y) = (w.aligned(), fl(&xs.concat()), fl(&vec![0.0; t * rows]));
    // SAFETY: w holds rows × cols weights, x t × cols floats, y t × rows.
    unsafe {
        emu_offload_matvec(
            offload_grid(rows, t),
            OFFLOAD_BLOCK,
            0,
            wa.ptr(),
            w.dt.code(),
            rows as i32,
            cols as i32,
            t as i32,
            x.ptr() as _,
            y.ptr() as *mut f32,
        );
    }
    y.floats().chunks(rows).map(<[f32]>::to_vec).collect()
}

/// The offload path's SwiGLU of several experts of one shape in two launches, as
/// `GpuCompute::swiglu_many` makes them: expert e's tokens are `groups[e]` (rows
/// `tok_start[e]..tok_start[e + 1]` of one batch); `tarfa_swiglu_gate_many` then
/// `tarfa_matvec_many`. Each group's outputs, in its tokens' order.
#[allow(unsafe_code)] // the FFI calls into the emulation, SAFETY at the calls
pub fn offload_swiglu_many(
    experts: &[Expert],
    inter: usize,
    hidden: usize,
    groups: &[Vec<Vec<f32>>],
    limit: Option<f32>,
) -> Vec<Vec<Vec<f32>>> {
    assert_eq!(experts.len(), groups.len());
    assert!(!experts.is_empty());
    let held: Vec<[Aligned; 3]> = experts
        .iter()
        .map(|e| {
            assert_eq!(
                (e.gate.elems(), e.up.elems(), e.down.elems()),
                (inter * hidden, inter * hidden, hidden * inter)
            );
            assert_eq!(
                (e.gate.dt, e.down.dt),
                (experts[0].gate.dt, experts[0].down.dt)
            );
            assert_eq!(e.up.dt, e.gate.dt);
            [e.gate.aligned(), e.up.aligned(), e.down.aligned()]
        })
        .collect();
    let table = |i: usize| -> Vec<u64> { held.iter().map(|h| h[i].addr()).collect() };
    let (gp, up, dp) = (table(0), table(1), table(2));
    let mut tok_start = vec![0i32];
    for g in groups {
        assert!(g.iter().all(|x| x.len() == hidden));
        tok_start.push(tok_start[tok_start.len() - 1] + g.len() as i32);
    }
    let total = *tok_start.last().unwrap_or(&0) as usize;
    assert!(total > 0);
    let flat: Vec<f32> = groups.iter().flatten().flatten().copied().collect();
    let (x, h, y) = (
        fl(&flat),
        fl(&vec![0.0; total * inter]),
        fl(&vec![0.0; total * hidden]),
    );
    let n = experts.len() as i32;
    // SAFETY: every expert buffer is alive (`held`) with the sizes asserted, and so are the
    // address tables; tok_start has n + 1 rising entries ending at total; x holds total × hidden
    // floats, h total × inter, y total × hidden.
    unsafe {
        emu_swiglu_gate_many(
            offload_grid(inter, total),
            OFFLOAD_BLOCK,
            0,
            gp.as_ptr(),
            up.as_ptr(),
            tok_start.as_ptr(),
            n,
            experts[0].gate.dt.code(),
            inter as i32,
            hidden as i32,
            total as i32,
            limit.unwrap_or(0.0),
            x.ptr() as _,
            h.ptr() as *mut f32,
        );
        emu_matvec_many(
            offload_grid(hidden, total),
            OFFLOAD_BLOCK,
            0,
            dp.as_ptr(),
            tok_start.as_ptr(),
            n,
            experts[0].down.dt.code(),
            hidden as i32,
            inter as i32,
            total as i32,
            h.ptr() as _,
            y.ptr() as *mut f32,
        );
    }
    let ys = y.floats();
    let mut rows = ys.chunks(hidden).map(<[f32]>::to_vec);
    groups
        .iter()
        .map(|g| rows.by_ref().take(g.len()).collect())
        .collect()
}

// ---- the engine's device: host memory and the emulated kernels ----------------------------------

use tarfa_cuda::{tile_norm_shared, Arg, CudaError, EngineDevice, Geometry, Kernel};

/// The resident decoder's device emulated on the CPU: buffers in host memory (256-byte aligned,
/// never moved, so their addresses are what the kernels see), copies in issue order (all of them
/// synchronous), kernels run by the emulation. No graphs: the engine launches one by one. Its
/// tiled kernels are those compiled for one ring (the default, unless [`EmuDevice::with_tile`]).
#[derive(Debug, Default)]
pub struct EmuDevice {
    tile: TileGeometry,
    launches: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl EmuDevice {
    /// The device with its tiled kernels at `tile`: one of the rings compiled in ([`tiles`]),
    /// within [`SHARED_OPT_IN`] (allowed the tiled kernels above 48 KiB, as on the GPU).
    pub fn with_tile(tile: TileGeometry) -> Result<EmuDevice, CudaError> {
        if !tiles().contains(&tile) {
            return Err(CudaError::Usage(format!(
                "the emulation has no tiled kernels for {} stages of {} bytes (cuda-emu/build.rs lists its rings)",
                tile.stages(),
                tile.stage_bytes()
            )));
        }
        Ok(EmuDevice {
            tile: tile.within(SHARED_OPT_IN)?,
            launches: Default::default(),
        })
    }

    /// The count of kernels launched on this device, which stays readable after the device
    /// has moved into an engine.
    pub fn launch_count(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        self.launches.clone()
    }
}

/// A host buffer standing for a device buffer.
#[derive(Debug)]
pub struct EmuBuf {
    bytes: Vec<u8>,
    off: usize,
    len: usize,
    /// Whole pages registered with the emulation's guard (an activation), or 0.
    guarded: usize,
}

const PAGE: usize = 4096;

impl EmuBuf {
    fn new(len: usize) -> EmuBuf {
        // A Vec's heap buffer never moves while it is not resized: the aligned start stays put.
        let bytes = vec![0u8; len + 256];
        let off = (256 - (bytes.as_ptr() as usize % 256)) % 256;
        EmuBuf {
            bytes,
            off,
            len,
            guarded: 0,
        }
    }

    /// An activation: page-aligned whole pages of its own, registered with the guard that makes
    /// them inaccessible to a kernel until it enters (`tarfa_grid_enter`, emu.h).
    #[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
    fn guarded(len: usize) -> EmuBuf {
        let pages = len.div_ceil(PAGE).max(1) * PAGE;
        let bytes = vec![0u8; pages + PAGE];
        let off = (PAGE - (bytes.as_ptr() as usize % PAGE)) % PAGE;
        let b = EmuBuf {
            bytes,
            off,
            len,
            guarded: pages,
        };
        // SAFETY: [ptr, ptr + pages) are whole pages inside this buffer's own heap block (pages
        // + one page long, starting at its first page boundary), unregistered in `drop` before
        // the block is freed; the guard only changes their protection while a launch runs.
        unsafe { emu_guard(b.bytes[off..].as_ptr() as *mut u8, pages, 1) };
        b
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.off..self.off + self.len]
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[self.off..self.off + self.len]
    }
}

impl Drop for EmuBuf {
    #[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
    fn drop(&mut self) {
        if self.guarded > 0 {
            // SAFETY: drops the range `guarded` registered (no launch runs: launches are
            // synchronous and hold no buffer across calls).
            unsafe { emu_guard(self.bytes[self.off..].as_ptr() as *mut u8, self.guarded, 0) };
        }
    }
}

/// A kernel that reads an activation before `tarfa_grid_enter` dies of SIGSEGV under the
/// emulation's guard: runs one that does, on a guarded buffer (for the test that shows it).
#[allow(unsafe_code)] // the FFI call into the emulation, SAFETY at the call
pub fn read_an_activation_before_entering() -> Vec<f32> {
    let x = EmuBuf::guarded(32 * 4);
    let out = fl(&[0.0; 32]);
    // SAFETY: x holds 32 floats (registered whole pages), out 32.
    unsafe { emu_read_before_enter(x.bytes().as_ptr() as *const f32, out.ptr() as *mut f32) };
    out.floats()
}

impl EngineDevice for EmuDevice {
    type Buf = EmuBuf;
    type Graph = ();

    fn name(&self) -> String {
        "CPU emulation of the CUDA kernels (cuda-emu)".into()
    }

    fn tile(&self) -> TileGeometry {
        self.tile
    }

    fn tile_shared_max(&self) -> u32 {
        SHARED_OPT_IN
    }

    fn alloc(&self, len: usize) -> Result<EmuBuf, CudaError> {
        Ok(EmuBuf::guarded(len.max(1)))
    }

    fn upload(&self, bytes: &[u8]) -> Result<EmuBuf, CudaError> {
        let mut b = EmuBuf::new(bytes.len().max(1));
        b.bytes_mut()[..bytes.len()].copy_from_slice(bytes);
        Ok(b)
    }

    fn write(&self, buf: &mut EmuBuf, offset: usize, bytes: &[u8]) -> Result<(), CudaError> {
        let dst = buf
            .bytes_mut()
            .get_mut(offset..offset + bytes.len())
            .ok_or_else(|| CudaError::Usage("a write past the end of a buffer".into()))?;
        dst.copy_from_slice(bytes);
        Ok(())
    }

    fn read(&self, buf: &EmuBuf, len: usize) -> Result<Vec<u8>, CudaError> {
        buf.bytes()
            .get(..len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| CudaError::Usage("a read past the end of a buffer".into()))
    }

    fn copy(&self, src: &EmuBuf, dst: &mut EmuBuf, len: usize) -> Result<(), CudaError> {
        let s = src
            .bytes()
            .get(..len)
            .ok_or_else(|| CudaError::Usage("a copy past the end of a buffer".into()))?;
        dst.bytes_mut()
            .get_mut(..len)
            .ok_or_else(|| CudaError::Usage("a copy past the end of a buffer".into()))?
            .copy_from_slice(s);
        Ok(())
    }

    fn addr(&self, buf: &EmuBuf) -> u64 {
        buf.bytes().as_ptr() as u64
    }

    fn sync(&self) -> Result<(), CudaError> {
        Ok(())
    }

    // The trait's contract (`# Safety` of `EngineDevice::launch`) is what makes the FFI calls
    // sound; argument counts and kinds are checked before any call.
    #[allow(unsafe_code)]
    unsafe fn launch(&self, k: Kernel, geo: Geometry, args: &[Arg]) -> Result<(), CudaError> {
        self.launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (g, b, s) = (geo.grid, geo.block, geo.shared);
        let p = |i: usize| match args.get(i) {
            Some(Arg::Ptr(v)) => Ok(*v),
            other => Err(CudaError::Usage(format!(
                "{}: argument {i} is {other:?}, not an address",
                k.name()
            ))),
        };
        let n = |i: usize| match args.get(i) {
            Some(Arg::I32(v)) => Ok(*v),
            other => Err(CudaError::Usage(format!(
                "{}: argument {i} is {other:?}, not an int",
                k.name()
            ))),
        };
        let f = |i: usize| match args.get(i) {
            Some(Arg::F32(v)) => Ok(*v),
            other => Err(CudaError::Usage(format!(
                "{}: argument {i} is {other:?}, not a float",
                k.name()
            ))),
        };
        let count = |want: usize| {
            if args.len() == want {
                Ok(())
            } else {
                Err(CudaError::Usage(format!(
                    "{}: {} arguments, not {want}",
                    k.name(),
                    args.len()
                )))
            }
        };
        // SAFETY (every call below): the caller's contract — the arguments are the kernel's
        // parameters, every address in a live buffer with the sizes the kernel uses; the counts
        // and kinds are checked here.
        unsafe {
            match k {
                Kernel::Matvec | Kernel::WarpMatvec => {
                    count(1)?;
                    let Some(Arg::Jobs(j)) = args.first() else {
                        return Err(CudaError::Usage("matvec takes its jobs".into()));
                    };
                    if k == Kernel::Matvec {
                        emu_matvec(g, b, s, j);
                    } else {
                        emu_wmatvec(g, b, s, j);
                    }
                }
                Kernel::Embed => {
                    count(5)?;
                    emu_embed(g, b, s, p(0)? as _, n(1)?, n(2)?, p(3)? as _, p(4)? as _);
                }
                Kernel::RmsNorm => {
                    count(6)?;
                    emu_rms_norm(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        n(2)?,
                        n(3)?,
                        f(4)?,
                        p(5)? as _,
                    );
                }
                Kernel::Attention => {
                    count(27)?;
                    emu_attention(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        p(2)? as _,
                        p(3)? as _,
                        p(4)? as _,
                        n(5)?,
                        n(6)?,
                        f(7)?,
                        n(8)?,
                        n(9)?,
                        n(10)?,
                        n(11)?,
                        p(12)? as _,
                        p(13)? as _,
                        p(14)? as _,
                        p(15)? as _,
                        p(16)? as _,
                        n(17)?,
                        f(18)?,
                        p(19)? as _,
                        n(20)?,
                        p(21)? as _,
                        n(22)?,
                        n(23)?,
                        n(24)?,
                        p(25)? as _,
                        n(26)?,
                    );
                }
                Kernel::DeltaHeads => {
                    count(24)?;
                    emu_delta_heads(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        n(2)?,
                        n(3)?,
                        p(4)? as _,
                        p(5)? as _,
                        p(6)? as _,
                        p(7)? as _,
                        p(8)? as _,
                        p(9)? as _,
                        n(10)?,
                        p(11)? as _,
                        n(12)?,
                        n(13)?,
                        p(14)? as _,
                        n(15)?,
                        n(16)?,
                        n(17)?,
                        n(18)?,
                        n(19)?,
                        f(20)?,
                        f(21)?,
                        p(22)? as _,
                        p(23)? as _,
                    );
                }
                Kernel::HcWeights => {
                    count(9)?;
                    let (mix, base, scale) = (p(0)? as _, p(1)? as _, p(3)? as _);
                    emu_hc_weights(
                        g,
                        b,
                        s,
                        mix,
                        base,
                        n(2)?,
                        scale,
                        n(4)?,
                        n(5)?,
                        f(6)?,
                        n(7)?,
                        p(8)? as _,
                    );
                }
                Kernel::HcCollapse => {
                    count(5)?;
                    emu_hc_collapse(g, b, s, p(0)? as _, p(1)? as _, n(2)?, n(3)?, p(4)? as _);
                }
                Kernel::HcExpand => {
                    count(5)?;
                    emu_hc_expand(g, b, s, p(0)? as _, p(1)? as _, p(2)? as _, n(3)?, n(4)?);
                }
                Kernel::HcMean => {
                    count(4)?;
                    emu_hc_mean(g, b, s, p(0)? as _, n(1)?, n(2)?, p(3)? as _);
                }
                Kernel::KdaHeads => {
                    count(24)?;
                    emu_kda_heads(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        n(2)?,
                        n(3)?,
                        p(4)? as _,
                        p(5)? as _,
                        p(6)? as _,
                        p(7)? as _,
                        p(8)? as _,
                        p(9)? as _,
                        n(10)?,
                        p(11)? as _,
                        n(12)?,
                        n(13)?,
                        n(14)?,
                        f(15)?,
                        p(16)? as _,
                        n(17)?,
                        n(18)?,
                        n(19)?,
                        f(20)?,
                        f(21)?,
                        p(22)? as _,
                        p(23)? as _,
                    );
                }
                Kernel::Topk => {
                    count(9)?;
                    emu_topk(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        n(1)?,
                        n(2)?,
                        n(3)?,
                        p(4)? as _,
                        p(5)? as _,
                        p(6)? as _,
                        p(7)? as _,
                        p(8)? as _,
                    );
                }
                Kernel::GateUp | Kernel::Down | Kernel::WarpGateUp | Kernel::WarpDown => {
                    count(5)?;
                    let Some(Arg::Moe(m)) = args.first() else {
                        return Err(CudaError::Usage(
                            "the experts' kernels take their table".into(),
                        ));
                    };
                    let (ids, kk, a, o) = (p(1)? as _, n(2)?, p(3)? as _, p(4)? as _);
                    match k {
                        Kernel::GateUp => emu_gate_up(g, b, s, m, ids, kk, a, o),
                        Kernel::WarpGateUp => emu_wgate_up(g, b, s, m, ids, kk, a, o),
                        Kernel::Down => emu_down(g, b, s, m, ids, kk, a, o),
                        _ => emu_wdown(g, b, s, m, ids, kk, a, o),
                    }
                }
                Kernel::TiledMatvec => {
                    count(6)?;
                    let Some(Arg::Jobs(j)) = args.first() else {
                        return Err(CudaError::Usage("matvec takes its jobs".into()));
                    };
                    let (o, st, by) = ring_args(self.tile);
                    let (nw, ndt, eps, xn) = (p(2)? as _, n(3)?, f(4)?, p(5)? as _);
                    if emu_tmatvec(g, b, s, o, st, by, j, n(1)?, nw, ndt, eps, xn) != 0 {
                        return Err(CudaError::Usage("no tiled kernels for this ring".into()));
                    }
                }
                Kernel::TiledGateUp | Kernel::TiledDown => {
                    count(6)?;
                    let Some(Arg::Moe(m)) = args.first() else {
                        return Err(CudaError::Usage(
                            "the experts' kernels take their table".into(),
                        ));
                    };
                    let (ids, slots, t) = (p(1)? as _, n(2)?, n(5)?);
                    let (i, o) = (p(3)? as _, p(4)? as _);
                    let (oi, st, by) = ring_args(self.tile);
                    let r = if k == Kernel::TiledGateUp {
                        emu_tgate_up(g, b, s, oi, st, by, m, ids, slots, i, o, t)
                    } else {
                        emu_tdown(g, b, s, oi, st, by, m, ids, slots, i, o, t)
                    };
                    if r != 0 {
                        return Err(CudaError::Usage("no tiled kernels for this ring".into()));
                    }
                }
                Kernel::CombineNorm => {
                    count(11)?;
                    emu_combine_norm(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        n(2)?,
                        n(3)?,
                        p(4)? as _,
                        p(5)? as _,
                        p(6)? as _,
                        p(7)? as _,
                        n(8)?,
                        f(9)?,
                        p(10)? as _,
                    );
                }
                Kernel::Combine => {
                    count(8)?;
                    let (y, w, sh, shw) = (p(0)? as _, p(1)? as _, p(4)? as _, p(5)? as _);
                    emu_combine(g, b, s, y, w, n(2)?, n(3)?, sh, shw, p(6)? as _, n(7)?);
                }
                Kernel::Mm => {
                    count(2)?;
                    let Some(Arg::Jobs(j)) = args.first() else {
                        return Err(CudaError::Usage("mm takes its jobs".into()));
                    };
                    emu_mm(g, b, s, j, n(1)?);
                }
                Kernel::MoeGroup => {
                    count(5)?;
                    emu_moe_group(g, b, s, p(0)? as _, n(1)?, n(2)?, p(3)? as _, p(4)? as _);
                }
                Kernel::MmGateUp | Kernel::MmDown => {
                    let Some(Arg::Moe(m)) = args.first() else {
                        return Err(CudaError::Usage(
                            "the experts' kernels take their table".into(),
                        ));
                    };
                    let (order, tiles, max) = (p(1)? as _, p(2)? as _, n(3)?);
                    if k == Kernel::MmGateUp {
                        count(7)?;
                        emu_mm_gate_up(
                            g,
                            b,
                            s,
                            m,
                            order,
                            tiles,
                            max,
                            n(4)?,
                            p(5)? as _,
                            p(6)? as _,
                        );
                    } else {
                        count(6)?;
                        emu_mm_down(g, b, s, m, order, tiles, max, p(4)? as _, p(5)? as _);
                    }
                }
                Kernel::EmbedMany => {
                    count(6)?;
                    let (t, x) = (p(0)? as _, p(5)? as _);
                    emu_embed_many(g, b, s, t, n(1)?, n(2)?, p(3)? as _, n(4)?, x);
                }
                Kernel::KvStore => {
                    count(14)?;
                    emu_kv_store(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        p(2)? as _,
                        n(3)?,
                        n(4)?,
                        f(5)?,
                        n(6)?,
                        n(7)?,
                        n(8)?,
                        p(9)? as _,
                        p(10)? as _,
                        n(11)?,
                        p(12)? as _,
                        p(13)? as _,
                    );
                }
                Kernel::AttentionMany | Kernel::AttentionQuads => {
                    count(22)?;
                    emu_attention_many(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        n(2)?,
                        n(3)?,
                        f(4)?,
                        n(5)?,
                        n(6)?,
                        n(7)?,
                        n(8)?,
                        p(9)? as _,
                        p(10)? as _,
                        n(11)?,
                        p(12)? as _,
                        p(13)? as _,
                        n(14)?,
                        f(15)?,
                        p(16)? as _,
                        n(17)?,
                        p(18)? as _,
                        n(19)?,
                        n(20)?,
                        n(21)?,
                        i32::from(k == Kernel::AttentionQuads),
                    );
                }
                Kernel::TopkMany => {
                    count(8)?;
                    let (z, pr, ids, w) = (p(0)? as _, p(4)? as _, p(5)? as _, p(6)? as _);
                    emu_topk_many(g, b, s, z, n(1)?, n(2)?, n(3)?, pr, ids, w, n(7)?);
                }
                Kernel::SigmoidTopkMany => {
                    count(13)?;
                    emu_sigmoid_topk_many(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        n(1)?,
                        p(2)? as _,
                        n(3)?,
                        n(4)?,
                        n(5)?,
                        n(6)?,
                        n(7)?,
                        f(8)?,
                        p(9)? as _,
                        p(10)? as _,
                        p(11)? as _,
                        n(12)?,
                    );
                }
                Kernel::MlaHeads => {
                    count(13)?;
                    emu_mla_heads(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        p(1)? as _,
                        p(2)? as _,
                        n(3)?,
                        n(4)?,
                        n(5)?,
                        n(6)?,
                        n(7)?,
                        p(8)? as _,
                        p(9)? as _,
                        p(10)? as _,
                        p(11)? as _,
                        p(12)? as _,
                    );
                }
                Kernel::WidenHeads => {
                    count(6)?;
                    emu_widen_heads(g, b, s, p(0)? as _, n(1)?, n(2)?, n(3)?, f(4)?, p(5)? as _);
                }
                Kernel::NarrowHeads => {
                    count(5)?;
                    emu_narrow_heads(g, b, s, p(0)? as _, n(1)?, n(2)?, n(3)?, p(4)? as _);
                }
                Kernel::SigmoidTopk => {
                    count(12)?;
                    emu_sigmoid_topk(
                        g,
                        b,
                        s,
                        p(0)? as _,
                        n(1)?,
                        p(2)? as _,
                        n(3)?,
                        n(4)?,
                        n(5)?,
                        n(6)?,
                        n(7)?,
                        f(8)?,
                        p(9)? as _,
                        p(10)? as _,
                        p(11)? as _,
                    );
                }
            }
        }
        Ok(())
    }

    fn capture(
        &self,
        _f: &mut dyn FnMut() -> Result<(), CudaError>,
    ) -> Result<Option<()>, CudaError> {
        Ok(None)
    }

    fn replay(&self, _g: &()) -> Result<(), CudaError> {
        Err(CudaError::Usage("the emulation has no graphs".into()))
    }
}
