//! The whole-forward-pass GPU kernels (`cuda/kernels/`, `tarfa_e_*`), run on the
//! CPU by the emulation, give the CPU decoder's bits (`canon`, `blocks`, `rope`) on random
//! inputs of many shapes: widths that are and are not multiples of 8 and 32 (the wide-load and
//! tail paths), BF16 and F32 weights, biases, residual accumulation, windows, ties in the
//! router. Each assertion compares `f32::to_bits`.

use tarfa_cuda_emu as emu;
use tarfa_decode::blocks::{self, AttnShape, KvCache, MoeOutputs};
use tarfa_decode::canon;
use tarfa_decode::quant::QuantType;
use tarfa_decode::rope::Rope;
use tarfa_decode::weights::{MatrixRef, WeightSlice};
use tarfa_decode::Isa;

/// xorshift64*: reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Roughly N(0, s²)-sized values of mixed magnitude.
    fn f(&mut self, s: f32) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let e = (self.next() % 6) as i32 - 3;
        u * s * 2f32.powi(e)
    }

    fn vec(&mut self, n: usize, s: f32) -> Vec<f32> {
        (0..n).map(|_| self.f(s)).collect()
    }

    fn bf16(&mut self, n: usize, s: f32) -> Vec<u16> {
        (0..n).map(|_| (self.f(s).to_bits() >> 16) as u16).collect()
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn widen(b: &[u16]) -> Vec<f32> {
    b.iter().map(|&x| canon::bf16_to_f32(x)).collect()
}

/// Weights of `n` elements in `dt`, and their values.
fn weights(r: &mut Rng, n: usize, dt: emu::Dt, s: f32) -> (emu::W, Vec<f32>) {
    match dt {
        emu::Dt::Bf16 => {
            let b = r.bf16(n, s);
            (emu::W::bf16(&b), widen(&b))
        }
        emu::Dt::F32 => {
            let v = r.vec(n, s);
            (emu::W::f32(&v), v)
        }
        q => quantised(r, n, q),
    }
}

/// A finite F16 of either sign: mostly moderate (exponent 2^-12 .. 2^-3, any mantissa), one in
/// eight subnormal and one in sixteen zero, so that every finite branch of the widening is met.
fn f16_bits(r: &mut Rng) -> [u8; 2] {
    let sign = (r.next() % 2) << 15;
    let h = match r.next() % 16 {
        0 => sign,
        1 | 2 => sign | (1 + r.next() % 1023),
        _ => sign | ((3 + r.next() % 10) << 10) | (r.next() % 1024),
    };
    (h as u16).to_le_bytes()
}

/// The decoder's type of an F16 or GGUF block type, and where each block's F16 scales lie.
fn layout(dt: emu::Dt) -> (QuantType, &'static [usize]) {
    match dt {
        emu::Dt::F16 => (QuantType::F16, &[0]),
        emu::Dt::Q8_0 => (QuantType::Q8_0, &[0]),
        emu::Dt::Q4_0 => (QuantType::Q4_0, &[0]),
        emu::Dt::Q4_K => (QuantType::Q4_K, &[0, 2]),
        emu::Dt::Q5_K => (QuantType::Q5_K, &[0, 2]),
        emu::Dt::Q6_K => (QuantType::Q6_K, &[208]),
        emu::Dt::Q4_1 => (QuantType::Q4_1, &[0, 2]),
        emu::Dt::Q5_0 => (QuantType::Q5_0, &[0]),
        emu::Dt::Q5_1 => (QuantType::Q5_1, &[0, 2]),
        other => unreachable!("{other:?} is not quantised"),
    }
}

/// `n` elements (whole blocks) of an F16 or GGUF block type: random quants, moderate F16 scales
/// (d, and dmin where the type has one) at their places in each block; and the values as the CPU
/// dequantises them (`tarfa_decode::quant`, gguf-py's arithmetic).
fn quantised(r: &mut Rng, n: usize, dt: emu::Dt) -> (emu::W, Vec<f32>) {
    let (be, bb) = dt.block();
    assert!(n.is_multiple_of(be), "{n} elements of {dt:?}");
    let (ty, scales) = layout(dt);
    let mut bytes: Vec<u8> = (0..n / be * bb).map(|_| r.next() as u8).collect();
    for b in bytes.chunks_exact_mut(bb) {
        for &o in scales {
            b[o..o + 2].copy_from_slice(&f16_bits(r));
        }
    }
    let mut v = vec![0.0f32; n];
    ty.dequantize(&bytes, &mut v).expect("whole blocks");
    assert!(v.iter().all(|x| x.is_finite()));
    (emu::W::quant(dt, bytes), v)
}

#[test]
fn matvec_products_are_canonical_dots_with_bias_and_residual() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for &cols in &[1usize, 7, 8, 16, 31, 32, 33, 40, 64, 100, 256, 2048] {
        for dt in [emu::Dt::Bf16, emu::Dt::F32] {
            let mut products = Vec::new();
            let mut want = Vec::new();
            for (j, rows) in [3usize, 1, 17, 64].into_iter().enumerate() {
                let (w, wv) = weights(&mut r, rows * cols, dt, 1.0);
                let x = r.vec(cols, 2.0);
                let bias = (j % 2 == 1).then(|| weights(&mut r, rows, dt, 0.5));
                let acc = (j >= 2).then(|| r.vec(rows, 4.0));
                let y: Vec<f32> = (0..rows)
                    .map(|i| {
                        let mut v = canon::dot_f32(&wv[i * cols..(i + 1) * cols], &x);
                        if let Some((_, b)) = &bias {
                            v += b[i];
                        }
                        match &acc {
                            Some(a) => a[i] + v,
                            None => v,
                        }
                    })
                    .collect();
                want.push(bits(&y));
                products.push(emu::Product {
                    w,
                    rows,
                    cols,
                    x,
                    bias: bias.map(|b| b.0),
                    accumulate: acc,
                    vec: cols % 8 == 0 && j != 1,
                });
            }
            let got: Vec<Vec<u32>> = emu::matvec(&products).iter().map(|y| bits(y)).collect();
            assert_eq!(got, want, "cols {cols}, {dt:?}");
            // BF16 rows: the dot of the widened weights is the decoder's dot_bf16 too.
            if dt == emu::Dt::Bf16 {
                let b = r.bf16(cols, 1.0);
                let x = r.vec(cols, 1.0);
                let y = emu::matvec(&[emu::Product {
                    w: emu::W::bf16(&b),
                    rows: 1,
                    cols,
                    x: x.clone(),
                    bias: None,
                    accumulate: None,
                    vec: cols % 8 == 0,
                }]);
                assert_eq!(y[0][0].to_bits(), canon::dot_bf16(&b, &x).to_bits());
            }
        }
    }
}

#[test]
fn rms_norm_and_embedding_are_the_cpus() {
    let mut r = Rng(7);
    for &n in &[1usize, 5, 32, 100, 2048, 4099] {
        for dt in [emu::Dt::Bf16, emu::Dt::F32] {
            let x = r.vec(n, 3.0);
            let (w, wv) = weights(&mut r, n, dt, 1.0);
            let mut want = vec![0.0f32; n];
            canon::rms_norm(&x, |i| wv[i], 1e-6, &mut want);
            assert_eq!(
                bits(&emu::rms_norm(&x, &w, 1e-6)),
                bits(&want),
                "n {n} {dt:?}"
            );
        }
    }
    let (table, tv) = weights(&mut r, 50 * 24, emu::Dt::Bf16, 1.0);
    for t in [0u32, 17, 49] {
        let got = emu::embed(&table, 24, t);
        assert_eq!(
            bits(&got),
            bits(&tv[t as usize * 24..(t as usize + 1) * 24])
        );
    }
}

#[test]
fn attention_norms_rotates_and_stores_the_token_as_the_cpu_does() {
    let mut r = Rng(11);
    for &(heads, kv_heads, d, rotary) in &[
        (4usize, 2usize, 8usize, 8usize),
        (4, 2, 16, 16),
        (8, 2, 128, 128),
        (3, 1, 64, 32),
        (2, 2, 40, 20),
        (2, 1, 288, 256),
    ] {
        let sh = emu::Heads {
            heads,
            kv_heads,
            d,
            half: rotary / 2,
        };
        let mut rope = Rope::new(1e6, rotary);
        let pos = 37;
        rope.ensure(pos + 1);
        let (cos, sin) = rope.tables();
        for norm in [true, false] {
            for dt in [emu::Dt::Bf16, emu::Dt::F32] {
                let q = r.vec(heads * d, 2.0);
                let k = r.vec(kv_heads * d, 2.0);
                let v = r.vec(kv_heads * d, 2.0);
                let (qn, qnv) = weights(&mut r, d, dt, 1.0);
                let (kn, knv) = weights(&mut r, d, dt, 1.0);
                let width = kv_heads * d;
                let mut old_k = r.vec((pos + 2) * width, 1.0);
                let mut old_v = r.vec((pos + 2) * width, 1.0);
                // Row pos is the token's to store: a block that read it from the caches instead
                // of its own key and v would meet NaN (the emulation runs the storing block last).
                old_k[pos * width..(pos + 1) * width].fill(f32::NAN);
                old_v[pos * width..(pos + 1) * width].fill(f32::NAN);
                let scaling = (1.0 / (d as f64).sqrt()) as f32;
                let (out, gk, gv) = emu::attention(
                    sh,
                    &emu::AttnIn {
                        q: &q,
                        k: &k,
                        v: &v,
                        norms: norm.then_some((&qn, &kn)),
                        eps: 1e-6,
                        cos,
                        sin,
                        pos,
                        kcache: &old_k,
                        vcache: &old_v,
                        window: None,
                        scaling,
                        shared_scores: true,
                        sinks: None,
                    },
                );
                // The CPU: norm_heads (canon::rms_norm per head), then Rope::apply per head.
                let cpu = |x: &[f32], w: &[f32]| -> Vec<f32> {
                    let mut out = Vec::new();
                    for head in x.chunks_exact(d) {
                        let mut h = head.to_vec();
                        if norm {
                            canon::rms_norm(head, |i| w[i], 1e-6, &mut h);
                        }
                        rope.apply(&mut h, pos);
                        out.extend(h);
                    }
                    out
                };
                let (want_q, want_kt) = (cpu(&q, &qnv), cpu(&k, &knv));
                let mut want_k = old_k.clone();
                want_k[pos * width..(pos + 1) * width].copy_from_slice(&want_kt);
                assert_eq!(bits(&gk), bits(&want_k), "k cache {sh:?} {norm} {dt:?}");
                let mut want_v = old_v.clone();
                want_v[pos * width..(pos + 1) * width].copy_from_slice(&v);
                assert_eq!(bits(&gv), bits(&want_v), "v cache {sh:?}");
                // blocks::attend over the cache's rows before pos and the token's rotated key.
                let rows = |c: &[f32]| -> Vec<Vec<f32>> {
                    c[..(pos + 1) * width]
                        .chunks_exact(width)
                        .map(<[f32]>::to_vec)
                        .collect()
                };
                let shape = AttnShape {
                    heads,
                    kv_heads,
                    head_dim: d,
                    window: None,
                };
                let mut qs = vec![vec![0.0; heads * d]; pos];
                qs.push(want_q);
                let cpu_out = blocks::attend(
                    Isa::Scalar,
                    shape,
                    &mut KvCache::default(),
                    0,
                    &qs,
                    &rows(&want_k),
                    &rows(&want_v),
                );
                assert_eq!(bits(&out), bits(&cpu_out[pos]), "out {sh:?} {norm} {dt:?}");
            }
        }
    }
}

/// An attention case: `n` tokens' random q, k and v, `blocks::attend`'s output at every position
/// (the scalar path, the caches filled from position 0) and the scaling `1/√d`.
struct Case {
    q: Vec<Vec<f32>>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    cpu: Vec<Vec<f32>>,
    scaling: f32,
}

impl Case {
    /// `tarfa_e_attention` of the last of the case's `n` tokens (no norm, no rotation), the
    /// earlier ones in the caches (the token's own row NaN: the kernel must take its key and
    /// value from k and v), with `sinks` or none: its output and the caches after.
    fn last(
        &self,
        sh: emu::Heads,
        window: Option<usize>,
        shared: bool,
        sinks: Option<&emu::W>,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (n, width) = (self.q.len(), sh.kv_heads * sh.d);
        let mut kc = self.k[..n - 1].concat();
        let mut vc = self.v[..n - 1].concat();
        kc.extend(vec![f32::NAN; width]);
        vc.extend(vec![f32::NAN; width]);
        emu::attention(
            sh,
            &emu::AttnIn {
                q: &self.q[n - 1],
                k: &self.k[n - 1],
                v: &self.v[n - 1],
                norms: None,
                eps: 1e-6,
                cos: &[],
                sin: &[],
                pos: n - 1,
                kcache: &kc,
                vcache: &vc,
                window,
                scaling: self.scaling,
                shared_scores: shared,
                sinks,
            },
        )
    }

    fn new(
        r: &mut Rng,
        heads: usize,
        kv_heads: usize,
        d: usize,
        n: usize,
        window: Option<usize>,
    ) -> Case {
        let width = kv_heads * d;
        let q: Vec<Vec<f32>> = (0..n).map(|_| r.vec(heads * d, 1.5)).collect();
        let k: Vec<Vec<f32>> = (0..n).map(|_| r.vec(width, 1.5)).collect();
        let v: Vec<Vec<f32>> = (0..n).map(|_| r.vec(width, 1.5)).collect();
        let shape = AttnShape {
            heads,
            kv_heads,
            head_dim: d,
            window,
        };
        let mut cache = KvCache::default();
        let cpu = blocks::attend(Isa::Scalar, shape, &mut cache, 0, &q, &k, &v);
        let scaling = (1.0 / (d as f64).sqrt()) as f32;
        Case {
            q,
            k,
            v,
            cpu,
            scaling,
        }
    }
}

#[test]
fn attention_of_the_last_position_is_blocks_attend() {
    let mut r = Rng(13);
    for &(heads, kv_heads, d) in &[
        (4usize, 2usize, 8usize),
        (4, 2, 16),
        (8, 2, 128),
        // Heads of 64 and 256 beside 128 (the widths llama-style models use), and others.
        (4, 2, 64),
        (2, 1, 256),
        (6, 3, 40),
        (2, 1, 288),
    ] {
        for &n in &[1usize, 2, 31, 32, 33, 70] {
            for window in [None, Some(5), Some(64)] {
                let case = Case::new(&mut r, heads, kv_heads, d, n, window);
                let sh = emu::Heads {
                    heads,
                    kv_heads,
                    d,
                    half: 0,
                };
                for shared in [true, false] {
                    let (got, gk, gv) = case.last(sh, window, shared, None);
                    assert_eq!(
                        bits(&got),
                        bits(&case.cpu[n - 1]),
                        "heads {heads}/{kv_heads} d {d} n {n} window {window:?} shared {shared}"
                    );
                    assert_eq!(bits(&gk), bits(&case.k.concat()), "k stored, n {n}");
                    assert_eq!(bits(&gv), bits(&case.v.concat()), "v stored, n {n}");
                }
            }
        }
    }
}

/// Attention sinks (MiMo-V2-Flash): each head's logit joins its softmax last and its weight is
/// dropped (`blocks::attend_with`), the sinks BF16 or F32, the scores in shared memory or in
/// global memory (a head's row holding the sink after its `n` scores), with and without a window.
#[test]
fn attention_with_sinks_is_blocks_attend_with() {
    let mut r = Rng(17);
    for &(heads, kv_heads, d) in &[(4usize, 2usize, 8usize), (8, 2, 64), (2, 1, 40)] {
        for &n in &[1usize, 31, 32, 33, 70] {
            for window in [None, Some(5)] {
                for dt in [emu::Dt::Bf16, emu::Dt::F32] {
                    let case = Case::new(&mut r, heads, kv_heads, d, n, window);
                    let (sinks, sinkv) = weights(&mut r, heads, dt, 3.0);
                    let shape = AttnShape {
                        heads,
                        kv_heads,
                        head_dim: d,
                        window,
                    };
                    let cpu = blocks::attend_with(
                        Isa::Scalar,
                        shape,
                        case.scaling,
                        Some(&sinkv),
                        &mut KvCache::default(),
                        0,
                        &case.q,
                        &case.k,
                        &case.v,
                    );
                    let sh = emu::Heads {
                        heads,
                        kv_heads,
                        d,
                        half: 0,
                    };
                    for shared in [true, false] {
                        let (got, _, _) = case.last(sh, window, shared, Some(&sinks));
                        assert_eq!(
                            bits(&got),
                            bits(&cpu[n - 1]),
                            "heads {heads}/{kv_heads} d {d} n {n} {window:?} {dt:?} shared {shared}"
                        );
                    }
                }
            }
        }
    }
}

/// A prompt pass's attention (`tarfa_e_kv_store` then `tarfa_e_attention_many`): every token's
/// output is `blocks::attend`'s at its position, over the earlier rows of the caches and the
/// pass's own keys, with a window or none, its scores in shared memory or in global memory
/// (each (token, head) its own row there); the caches hold every key and value after.
#[test]
fn a_prompt_pass_attention_is_blocks_attend_at_each_position() {
    let mut r = Rng(29);
    for &(heads, kv_heads, d) in &[
        (4usize, 2usize, 8usize),
        (8, 2, 128),
        (6, 3, 40),
        (12, 1, 16),
        (16, 2, 64),
    ] {
        for &(pos0, t) in &[(0usize, 3usize), (33, 7)] {
            for window in [None, Some(5)] {
                let n = pos0 + t;
                let Case {
                    q,
                    k,
                    v,
                    cpu,
                    scaling,
                } = Case::new(&mut r, heads, kv_heads, d, n, window);
                let (kc, vc) = (k[..pos0].concat(), v[..pos0].concat());
                // A block per query head, or four of a group's (group 2 and 6: the last block
                // of a group holds fewer).
                let quads: &[bool] = if d.is_multiple_of(8) {
                    &[false, true]
                } else {
                    &[false]
                };
                for (shared, &quads) in [true, false]
                    .into_iter()
                    .flat_map(|s| quads.iter().map(move |q| (s, q)))
                {
                    let (got, gk, gv) = emu::attention_many(
                        emu::Heads {
                            heads,
                            kv_heads,
                            d,
                            half: 0,
                        },
                        &q[pos0..],
                        &k[pos0..],
                        &v[pos0..],
                        (&kc, &vc),
                        window,
                        scaling,
                        shared,
                        quads,
                    );
                    let at = format!("heads {heads}/{kv_heads} d {d} pos0 {pos0} t {t} window {window:?} shared {shared} quads {quads}");
                    for (i, row) in got.iter().enumerate() {
                        assert_eq!(bits(row), bits(&cpu[pos0 + i]), "{at}: token {i}");
                    }
                    assert_eq!(bits(&gk), bits(&k.concat()), "{at}: k stored");
                    assert_eq!(bits(&gv), bits(&v.concat()), "{at}: v stored");
                }
            }
        }
    }
}

#[test]
fn the_router_top_k_is_softmax_topk_ties_included() {
    let mut r = Rng(17);
    for &(n, k) in &[
        (4usize, 2usize),
        (8, 3),
        (64, 8),
        (128, 8),
        (100, 1),
        (160, 32),
        (256, 33),
        (300, 8),
    ] {
        for renorm in [false, true] {
            let mut z = r.vec(n, 4.0);
            // Ties: equal logits give equal probabilities; the lower id first. The largest value
            // at ids that share a warp lane (i, i+32, ...) and others, so ties are selected.
            let top = z.iter().copied().fold(f32::MIN, f32::max) + 1.0;
            for i in (3..n).step_by(32).chain((1..n).step_by(7)).take(k + 2) {
                z[i] = top;
            }
            for i in (0..n).step_by(5) {
                z[i] = z[0];
            }
            let want = blocks::softmax_topk(Isa::Scalar, &z, k, renorm);
            let got = emu::topk(&z, k, renorm);
            let b = |v: &[(u32, f32)]| v.iter().map(|x| (x.0, x.1.to_bits())).collect::<Vec<_>>();
            assert_eq!(b(&got), b(&want), "n {n} k {k} renorm {renorm}");
        }
    }
}

fn m(v: &[f32], rows: usize, cols: usize) -> MatrixRef<'_> {
    MatrixRef {
        name: "w",
        rows,
        cols,
        data: WeightSlice::F32(v),
    }
}

/// A routed-experts case: the experts, x, the residual, the slots' ids and weights, and the
/// CPU's result (blocks::swiglu per expert on f32 views of the same values, the slot-order
/// combine of MoeOutputs, then the residual add).
struct MoeCase {
    experts: Vec<emu::Expert>,
    x: Vec<f32>,
    residual: Vec<f32>,
    ids: Vec<u32>,
    wts: Vec<f32>,
    /// Each SwiGLU clamped at this limit first, or none.
    limit: Option<f32>,
    want: Vec<u32>,
}

impl MoeCase {
    /// The case's bits from `emu::moe` (the quad or warp kernels).
    fn run(&self, inter: usize, hidden: usize) -> Vec<u32> {
        let (x, res) = (&self.x, &self.residual);
        bits(&emu::moe(
            &self.experts,
            inter,
            hidden,
            &self.ids,
            &self.wts,
            x,
            res,
            self.limit,
        ))
    }
}

fn moe_case(
    r: &mut Rng,
    shape: (usize, usize, usize, usize),
    (dgu, dd): (emu::Dt, emu::Dt),
) -> MoeCase {
    moe_case_of(r, shape, (dgu, dgu, dd))
}

/// [`moe_case`] with gate, up and down each of its own type.
fn moe_case_of(
    r: &mut Rng,
    shape: (usize, usize, usize, usize),
    types: (emu::Dt, emu::Dt, emu::Dt),
) -> MoeCase {
    moe_case_clamped(r, shape, types, None)
}

/// [`moe_case_of`] with every SwiGLU clamped at `limit` (GLM-5.3-Flash's `swiglu_limit`).
fn moe_case_clamped(
    r: &mut Rng,
    (hidden, inter, n_exp, k): (usize, usize, usize, usize),
    (dg, du, dd): (emu::Dt, emu::Dt, emu::Dt),
    limit: Option<f32>,
) -> MoeCase {
    let mut experts = Vec::new();
    let mut raw = Vec::new();
    for _ in 0..n_exp {
        let (g, gv) = weights(r, inter * hidden, dg, 0.5);
        let (u, uv) = weights(r, inter * hidden, du, 0.5);
        let (dn, dv) = weights(r, hidden * inter, dd, 0.5);
        experts.push(emu::Expert {
            gate: g,
            up: u,
            down: dn,
        });
        raw.push((gv, uv, dv));
    }
    let x = r.vec(hidden, 2.0);
    let residual = r.vec(hidden, 2.0);
    let ids: Vec<u32> = (0..k as u32).map(|s| (s * 3 + 1) % n_exp as u32).collect();
    let wts = r.vec(k, 1.0);
    let route: Vec<(u32, f32)> = ids.iter().copied().zip(wts.iter().copied()).collect();
    let mut outs = MoeOutputs::new(std::slice::from_ref(&route));
    for (s, &e) in ids.iter().enumerate() {
        let (gv, uv, dv) = &raw[e as usize];
        let y = blocks::swiglu(
            Isa::Scalar,
            m(gv, inter, hidden),
            m(uv, inter, hidden),
            m(dv, hidden, inter),
            std::slice::from_ref(&x),
            limit,
        );
        outs.put(0, s, &y[0], wts[s]);
    }
    let mut want = vec![residual.clone()];
    blocks::add_into(&mut want, &outs.combine());
    MoeCase {
        experts,
        x,
        residual,
        ids,
        wts,
        limit,
        want: bits(&want[0]),
    }
}

/// The combine fused with the next layer's input norm gives the CPU's new residual (slot-order
/// combine of MoeOutputs, then the add) and its RMSNorm (canon::rms_norm), for hidden sizes
/// within and past the kernel's shared copy of x and past its four elements per thread, and slot
/// counts within its loads ahead (up to 9: top-8 and a folded shared expert) and past them;
/// without shared experts, with GLM's added as they are, and with Qwen3.5's weighted by their
/// gate.
#[test]
fn combine_then_norm_in_one_launch_is_the_cpus() {
    let mut r = Rng(29);
    for &(n, k) in &[
        (32usize, 2usize),
        (100, 8),
        (1024, 7),
        (2048, 8),
        (4099, 3),
        (100, 9),
        (64, 10),
    ] {
        for dt in [emu::Dt::Bf16, emu::Dt::F32] {
            let ys: Vec<Vec<f32>> = (0..k).map(|_| r.vec(n, 2.0)).collect();
            let wts = r.vec(k, 1.0);
            let x = r.vec(n, 3.0);
            let (w, wv) = weights(&mut r, n, dt, 1.0);
            let shared = r.vec(n, 2.0);
            let gate = canon::sigmoid(r.f(4.0));
            // No shared experts, GLM's plain ones, Qwen3.5's gated one.
            for (with_shared, gated) in [(false, false), (true, false), (true, true)] {
                let route: Vec<(u32, f32)> = (0..k as u32).zip(wts.iter().copied()).collect();
                let mut outs = MoeOutputs::new(std::slice::from_ref(&route));
                for (s, y) in ys.iter().enumerate() {
                    outs.put(0, s, y, wts[s]);
                }
                // GLM's MoE layer `routed + shared`, Qwen3.5's `routed + gate · shared`
                // (qwen3_5_moe's `moe`), then the residual add.
                let mut m = outs.combine();
                if with_shared {
                    for (o, &sh) in m[0].iter_mut().zip(&shared) {
                        *o += if gated { gate * sh } else { sh };
                    }
                }
                let mut want_x = vec![x.clone()];
                blocks::add_into(&mut want_x, &m);
                let mut want = vec![0.0f32; n];
                canon::rms_norm(&want_x[0], |i| wv[i], 1e-6, &mut want);
                let sh = with_shared.then_some((&shared[..], gated.then_some(gate)));
                let (got_x, got) = emu::combine_norm(&ys.concat(), &wts, sh, &x, &w, 1e-6);
                let case = format!("n {n} k {k} {dt:?} shared {with_shared} gated {gated}");
                assert_eq!(bits(&got_x), bits(&want_x[0]), "x: {case}");
                assert_eq!(bits(&got), bits(&want), "norm: {case}");
            }
        }
    }
}

/// GLM-4.5's sigmoid group router on the GPU selects the experts and computes the weights of
/// `blocks::sigmoid_group_topk` bit for bit: with and without groups, renormalised or not,
/// scaled, at expert counts within and past a warp's lanes, k past a warp's lanes, every group
/// kept, with ties among the experts' scores (the lower id first) and among the groups' (groups
/// 0 and 1 the best two and equal: with one group kept, the lower); the bias in BF16 and F32.
#[test]
fn the_sigmoid_group_router_is_sigmoid_group_topk() {
    let mut r = Rng(41);
    for &(n, k, n_group, topk_group) in &[
        (4usize, 2usize, 1usize, 1usize),
        (8, 3, 4, 2),
        (8, 3, 4, 1),
        (64, 8, 8, 4),
        (128, 8, 1, 1),
        (160, 8, 8, 3),
        (256, 8, 8, 4),
        (96, 6, 32, 5),
        (300, 9, 50, 7),
        (64, 8, 4, 4),
        (256, 40, 8, 3),
    ] {
        for dt in [emu::Dt::Bf16, emu::Dt::F32] {
            // A shift of −3 puts every selection score below 0: dropped groups must still lose
            // (masked with −∞, not 0).
            for (renorm, scale, shift) in [
                (true, 1.0f32, 0.0f32),
                (false, 2.5, 0.0),
                (true, 2.5, 0.0),
                (true, 1.0, -3.0),
            ] {
                let mut z = r.vec(n, 4.0);
                let (_, mut bv) = weights(&mut r, n, dt, 0.5);
                for v in &mut bv {
                    *v += shift;
                }
                // Ties among experts: equal logits and biases at ids of different lanes and
                // groups; among groups: group 1 a copy of group 0.
                for i in (5..n).step_by(13) {
                    z[i] = z[3];
                    bv[i] = bv[3];
                }
                // Groups 0 and 1 made the best two, so with one group kept the tie decides.
                let size = n / n_group;
                if n_group > 1 {
                    for i in 0..size {
                        bv[i] += 1.0;
                        z[size + i] = z[i];
                        bv[size + i] = bv[i];
                    }
                }
                // In BF16 the values cut to BF16 (the CPU is given the same values).
                let bias = match dt {
                    emu::Dt::F32 => emu::W::f32(&bv),
                    emu::Dt::Bf16 => {
                        let bits: Vec<u16> =
                            bv.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                        bv = widen(&bits);
                        emu::W::bf16(&bits)
                    }
                    other => {
                        unreachable!("the sigmoid router's bias is F32 or BF16 here: {other:?}")
                    }
                };
                let want = blocks::sigmoid_group_topk(
                    &z,
                    WeightSlice::F32(&bv),
                    k,
                    n_group,
                    topk_group,
                    renorm,
                    scale,
                );
                let got = emu::sigmoid_topk(&z, &bias, k, (n_group, topk_group), renorm, scale);
                let b =
                    |v: &[(u32, f32)]| v.iter().map(|x| (x.0, x.1.to_bits())).collect::<Vec<_>>();
                assert_eq!(
                    b(&got),
                    b(&want),
                    "n {n} k {k} groups {topk_group}/{n_group} {dt:?} renorm {renorm} scale {scale} \
                     shift {shift}"
                );
            }
        }
    }
}

const MOE_TYPES: [(emu::Dt, emu::Dt); 3] = [
    (emu::Dt::Bf16, emu::Dt::Bf16),
    (emu::Dt::F32, emu::Dt::Bf16),
    (emu::Dt::Bf16, emu::Dt::F32),
];

#[test]
fn routed_experts_and_their_combine_are_the_cpus() {
    let mut r = Rng(19);
    for &shape in &[
        (32usize, 16usize, 8usize, 2usize),
        (32, 16, 8, 3),
        (40, 20, 4, 4),
        (256, 96, 16, 8),
        (100, 33, 5, 2),
        (32, 16, 12, 10),
    ] {
        for types in MOE_TYPES {
            let c = moe_case(&mut r, shape, types);
            let (hidden, inter, ..) = shape;
            assert_eq!(c.run(inter, hidden), c.want, "{shape:?} {types:?}");
        }
    }
}

/// GLM-5.3-Flash's clamped SwiGLU (`swiglu_limit`: the gate above at the limit, the up to
/// `[-limit, limit]`, then SiLU and the product) in every gate/up kernel the engine launches for
/// experts — a quad per row (BF16, F32), a warp per row (the K types), the tiled kernels at every
/// ring — is `blocks::swiglu`'s with the same limit; and the limit bites (the bits differ from the
/// unclamped experts').
#[test]
fn clamped_swiglus_are_the_cpus_in_every_expert_kernel() {
    let mut r = Rng(61);
    let limit = Some(1.5f32);
    let quads = MOE_TYPES.iter().map(|&(gu, d)| (gu, gu, d));
    let warps = [(emu::Dt::Q4_K, emu::Dt::Q6_K, emu::Dt::Q8_0)];
    for (shape, types) in quads
        .map(|t| ((64usize, 32usize, 8usize, 4usize), t))
        .chain(warps.map(|t| ((256, 256, 3, 2), t)))
    {
        let (hidden, inter, ..) = shape;
        let c = moe_case_clamped(&mut r, shape, types, limit);
        let (x, res) = (&c.x, &c.residual);
        let open = emu::moe(&c.experts, inter, hidden, &c.ids, &c.wts, x, res, None);
        assert_ne!(
            bits(&open),
            c.want,
            "{shape:?} {types:?}: the limit never bit"
        );
        let got = emu::moe(&c.experts, inter, hidden, &c.ids, &c.wts, x, res, limit);
        assert_eq!(bits(&got), c.want, "{shape:?} {types:?}");
        // The tiled kernels on one type (their clamp is one line of each, whatever the type).
        if types == (emu::Dt::Bf16, emu::Dt::Bf16, emu::Dt::Bf16) {
            for ring in emu::tiles() {
                let t = (7, 16, limit);
                let got =
                    emu::moe_tiled(&c.experts, inter, hidden, &c.ids, &c.wts, x, res, t, ring);
                assert_eq!(bits(&got), c.want, "{shape:?} {types:?} tiled {ring:?}");
            }
        }
    }
}

/// The tiled experts' kernels (rows streamed through shared memory by the whole block) give the
/// CPU's bits for any number of rows per block (the down product's dividing hidden, as the
/// engine's do), including gate/up blocks whose rows span two slots and rows longer than the
/// ring (stages reused), at every ring compiled in (so every ring gives the default's bits).
#[test]
fn tiled_routed_experts_are_the_cpus_for_any_rows_per_block() {
    let mut r = Rng(23);
    for &shape in &[
        (32usize, 32usize, 8usize, 2usize),
        (256, 96, 16, 8),
        (64, 160, 4, 3),
    ] {
        for types in MOE_TYPES {
            let c = moe_case(&mut r, shape, types);
            let (hidden, inter, ..) = shape;
            // One row per block only on the small shape: the emulation runs a block's 128
            // threads as OS threads, so thousands of blocks cost minutes.
            let one = (shape.0 == 32).then_some((1, 1));
            for tile in one.into_iter().chain([(3, 8), (16, 32), (7, 16)]) {
                for ring in emu::tiles() {
                    let got = emu::moe_tiled(
                        &c.experts,
                        inter,
                        hidden,
                        &c.ids,
                        &c.wts,
                        &c.x,
                        &c.residual,
                        (tile.0, tile.1, c.limit),
                        ring,
                    );
                    let at = format!("{shape:?} {types:?} tile {tile:?} {ring:?}");
                    assert_eq!(bits(&got), c.want, "{at}");
                }
            }
        }
    }
}

/// The tiled matrix-vector kernel gives the canonical dots (with bias and residual) of up to four
/// products sharing x, for any rows per block: blocks spanning two products, rows of one stage
/// and of many (the ring's stages reused), BF16 and F32, at every ring compiled in (so every
/// ring gives the default's bits).
/// Products of `rows` rows each, all of x's width, reading `x` (the launch's input), and the bits
/// each should give: canonical dots with `dot_x` (x itself, or what the launch makes of it),
/// the second product with a bias, the third and later accumulating into a residual.
fn tiled_case(
    r: &mut Rng,
    rows: &[usize],
    dt: emu::Dt,
    x: &[f32],
    dot_x: &[f32],
) -> (Vec<emu::Product>, Vec<Vec<u32>>) {
    let cols = x.len();
    let mut products = Vec::new();
    let mut want = Vec::new();
    for (j, &rows) in rows.iter().enumerate() {
        let (w, wv) = weights(r, rows * cols, dt, 1.0);
        let bias = (j % 2 == 1).then(|| weights(r, rows, dt, 0.5));
        let acc = (j >= 2).then(|| r.vec(rows, 4.0));
        let y: Vec<f32> = (0..rows)
            .map(|i| {
                let mut v = canon::dot_f32(&wv[i * cols..(i + 1) * cols], dot_x);
                if let Some((_, b)) = &bias {
                    v += b[i];
                }
                acc.as_ref().map_or(v, |a| a[i] + v)
            })
            .collect();
        want.push(bits(&y));
        products.push(emu::Product {
            w,
            rows,
            cols,
            x: x.to_vec(),
            bias: bias.map(|b| b.0),
            accumulate: acc,
            vec: true,
        });
    }
    (products, want)
}

#[test]
fn tiled_matvec_products_are_canonical_dots_for_any_rows_per_block() {
    let mut r = Rng(0x5151_2026);
    for &cols in &[32usize, 96, 320, 2048] {
        for dt in [emu::Dt::Bf16, emu::Dt::F32] {
            let x = r.vec(cols, 2.0);
            let (products, want) = tiled_case(&mut r, &[3, 1, 17, 40], dt, &x, &x);
            for nr in [1, 2, 5, 8, 32] {
                for ring in emu::tiles() {
                    let got: Vec<Vec<u32>> = emu::matvec_tiled(&products, nr, ring)
                        .iter()
                        .map(|y| bits(y))
                        .collect();
                    let at = format!("cols {cols}, {dt:?}, {nr} rows per block, {ring:?}");
                    assert_eq!(got, want, "{at}");
                }
            }
        }
    }
}

/// A prompt pass's products (`tarfa_e_mm`: a block's 32 rows × 16 tokens, a warp's 8 × 8 dots
/// folded together) are, for every token, the canonical dot of `canon::dot_f32` with its bias and
/// residual — the bits of the one-token kernels — for any width (whole chunks or not, a
/// stage's 64 or not), row count (a part-filled tile), token count (1, part of a tile, several
/// tiles) and element type (the wide ones and every block type the engine takes).
#[test]
fn prompt_products_are_each_tokens_canonical_dots() {
    let mut r = Rng(0x7070_2026);
    let cases: &[(usize, &[usize], usize, emu::Dt)] = &[
        (2048, &[40, 3], 19, emu::Dt::Bf16),
        (96, &[33, 1, 8, 64], 5, emu::Dt::F32),
        (72, &[17], 40, emu::Dt::Bf16),
        (45, &[9, 2], 3, emu::Dt::F32),
        (256, &[5], 2, emu::Dt::Q4_K),
        (64, &[7, 3], 17, emu::Dt::Q8_0),
        (256, &[6], 4, emu::Dt::Q6_K),
        (64, &[4], 1, emu::Dt::F16),
    ];
    for &(cols, rows, tokens, dt) in cases {
        let xs: Vec<Vec<f32>> = (0..tokens).map(|_| r.vec(cols, 2.0)).collect();
        let mut products = Vec::new();
        let mut want = Vec::new();
        for (j, &rows) in rows.iter().enumerate() {
            let (w, wv) = weights(&mut r, rows * cols, dt, 1.0);
            let bias = (j % 2 == 1).then(|| weights(&mut r, rows, emu::Dt::F32, 0.5));
            let acc = (j >= 2).then(|| r.vec(rows, 4.0));
            let mut y = Vec::new();
            for x in &xs {
                for i in 0..rows {
                    let mut v = canon::dot_f32(&wv[i * cols..(i + 1) * cols], x);
                    if let Some((_, b)) = &bias {
                        v += b[i];
                    }
                    y.push(acc.as_ref().map_or(v, |a| a[i] + v));
                }
            }
            want.push(bits(&y));
            products.push(emu::Product {
                w,
                rows,
                cols,
                x: Vec::new(),
                bias: bias.map(|b| b.0),
                accumulate: acc,
                vec: dt.wide() && cols % 8 == 0,
            });
        }
        let got: Vec<Vec<u32>> = emu::mm(&products, &xs).iter().map(|y| bits(y)).collect();
        assert_eq!(
            got, want,
            "cols {cols}, rows {rows:?}, {tokens} tokens, {dt:?}"
        );
    }
    // Products that underflow: every lane's partial is −0, and so is the dot; a width that ends
    // inside a stage must not step a lane past it (+0 + −0 would be +0).
    let (cols, rows) = (45, 3);
    let w = vec![-1e-30f32; rows * cols];
    let xs = vec![vec![1e-30f32; cols]; 2];
    let dot = canon::dot_f32(&w[..cols], &xs[0]);
    assert_eq!(dot.to_bits(), (-0.0f32).to_bits(), "the CPU's dot is −0");
    let p = emu::Product {
        w: emu::W::f32(&w),
        rows,
        cols,
        x: Vec::new(),
        bias: None,
        accumulate: None,
        vec: false,
    };
    let got = emu::mm(&[p], &xs);
    assert_eq!(
        bits(&got[0]),
        vec![dot.to_bits(); rows * 2],
        "underflowing products"
    );
}

/// A tiled launch that takes its x in through an RMSNorm (each block normalising x itself, as
/// the engine launches q/k/v, the router and `lm_head`) gives the bits of the norm's own launch
/// followed by the plain products: the normed x that block 0 stores is `canon::rms_norm`'s, and
/// each product the canonical dot with it. Widths past the 4,096 elements a thread's registers
/// hold take the loop after them.
#[test]
fn tiled_products_taking_x_through_a_norm_are_the_norm_then_the_products() {
    let mut r = Rng(0x0a0b_2026);
    for &cols in &[32usize, 96, 2048, 4224] {
        for dt in [emu::Dt::Bf16, emu::Dt::F32] {
            let x = r.vec(cols, 3.0);
            let (nw, nwv) = weights(&mut r, cols, dt, 1.0);
            let mut normed = vec![0.0f32; cols];
            canon::rms_norm(&x, |i| nwv[i], 1e-6, &mut normed);
            let (products, want) = tiled_case(&mut r, &[3, 1, 40], dt, &x, &normed);
            for nr in [1, 8, 32] {
                for ring in emu::tiles() {
                    let (got, xn) = emu::matvec_tiled_normed(&products, nr, ring, &nw, 1e-6);
                    let got: Vec<Vec<u32>> = got.iter().map(|y| bits(y)).collect();
                    let at = format!("cols {cols}, {dt:?}, {nr} rows per block, {ring:?}");
                    assert_eq!(bits(&xn), bits(&normed), "normed x, {at}");
                    assert_eq!(got, want, "{at}");
                }
            }
        }
    }
}

/// The emulation has the tiled kernels at the default ring and at others — the shallowest the
/// host takes, and one above the 48 KiB a block takes unless the host allows it more — and its
/// engine device refuses a ring it was not compiled for, or one above its shared memory.
#[test]
fn the_emulation_has_rings_besides_the_default() {
    use tarfa_cuda::{CudaError, TileGeometry};
    let rings = emu::tiles();
    assert_eq!(rings[0], TileGeometry::DEFAULT);
    assert!(rings.iter().any(|r| r.stages() == 2), "{rings:?}");
    assert!(rings.iter().any(|r| r.needs_opt_in()), "{rings:?}");
    for r in &rings {
        assert!(emu::EmuDevice::with_tile(*r).is_ok(), "{r:?}");
    }
    let other = TileGeometry::new(5, 8192).expect("5,8192");
    assert!(matches!(
        emu::EmuDevice::with_tile(other),
        Err(CudaError::Usage(_))
    ));
}

/// The offload path's kernels (`kernels/offload.cu`: a warp per output row and token, the
/// canonical dot `tarfa_warp_dot`) give the CPU's bits: one expert's SwiGLU for a batch of tokens
/// (`tarfa_swiglu_gate`, then `tarfa_matvec` for down, unclamped and clamped) is `blocks::swiglu`; a product alone is
/// the canonical dot of each row; several experts of one shape in two launches
/// (`tarfa_swiglu_gate_many`, `tarfa_matvec_many`, an expert with no tokens among them) give each
/// expert's own result — for sizes below, at and past a warp's 32 lanes and odd ones.
#[test]
fn the_offload_paths_kernels_are_the_cpus() {
    let mut r = Rng(0x0ff1_0ad5);
    for &(hidden, inter) in &[
        (1usize, 1usize),
        (7, 5),
        (32, 16),
        (33, 64),
        (100, 3),
        (256, 96),
    ] {
        for (dgu, dd) in MOE_TYPES {
            let mut experts = Vec::new();
            let mut raw = Vec::new();
            for _ in 0..4 {
                let (g, gv) = weights(&mut r, inter * hidden, dgu, 0.5);
                let (u, uv) = weights(&mut r, inter * hidden, dgu, 0.5);
                let (dn, dv) = weights(&mut r, hidden * inter, dd, 0.5);
                experts.push(emu::Expert {
                    gate: g,
                    up: u,
                    down: dn,
                });
                raw.push((gv, uv, dv));
            }
            let cpu = |e: usize, xs: &[Vec<f32>], limit: Option<f32>| -> Vec<Vec<u32>> {
                let (gv, uv, dv) = &raw[e];
                let ys = blocks::swiglu(
                    Isa::Scalar,
                    m(gv, inter, hidden),
                    m(uv, inter, hidden),
                    m(dv, hidden, inter),
                    xs,
                    limit,
                );
                ys.iter().map(|y| bits(y)).collect()
            };
            let case = format!("hidden {hidden} inter {inter} {dgu:?}/{dd:?}");
            let xs: Vec<Vec<f32>> = (0..3).map(|_| r.vec(hidden, 2.0)).collect();
            // Unclamped, and clamped (GLM-5.3-Flash) at a limit the dots cross.
            for limit in [None, Some(0.3f32)] {
                let got = emu::offload_swiglu(&experts[1], inter, hidden, &xs, limit);
                let got: Vec<Vec<u32>> = got.iter().map(|y| bits(y)).collect();
                assert_eq!(got, cpu(1, &xs, limit), "swiglu {limit:?}, {case}");
            }
            if inter * hidden >= 64 {
                // The clamp matters at these sizes: without it the bits differ.
                let free = emu::offload_swiglu(&experts[1], inter, hidden, &xs, None);
                let free: Vec<Vec<u32>> = free.iter().map(|y| bits(y)).collect();
                assert_ne!(free, cpu(1, &xs, Some(0.3)), "clamp inert, {case}");
            }

            let ys = emu::offload_matvec(&experts[2].gate, inter, hidden, &xs);
            let want: Vec<Vec<u32>> = xs
                .iter()
                .map(|x| {
                    let y: Vec<f32> = (0..inter)
                        .map(|i| canon::dot_f32(&raw[2].0[i * hidden..(i + 1) * hidden], x))
                        .collect();
                    bits(&y)
                })
                .collect();
            let got: Vec<Vec<u32>> = ys.iter().map(|y| bits(y)).collect();
            assert_eq!(got, want, "matvec, {case}");

            let groups: Vec<Vec<Vec<f32>>> = [2usize, 0, 1, 3]
                .iter()
                .map(|&n| (0..n).map(|_| r.vec(hidden, 2.0)).collect())
                .collect();
            for limit in [None, Some(0.3f32)] {
                let got = emu::offload_swiglu_many(&experts, inter, hidden, &groups, limit);
                for (e, (g, y)) in groups.iter().zip(&got).enumerate() {
                    let y: Vec<Vec<u32>> = y.iter().map(|v| bits(v)).collect();
                    assert_eq!(
                        y,
                        cpu(e, g, limit),
                        "swiglu_many expert {e} {limit:?}, {case}"
                    );
                }
            }
        }
    }
}

/// Every kernel of the sources (`extern "C" __global__` in `cuda/kernels/`) is launched by the
/// emulation (`emu/launch.cc`, or `emu/tiled.h` for the tiled ones), so the tests above can hold
/// each to the CPU: a kernel added without an emulated entry point fails here.
#[test]
fn every_kernel_of_the_sources_has_an_emulated_entry_point() {
    let launchers = [
        include_str!("../emu/launch.cc"),
        include_str!("../emu/tiled.h"),
    ]
    .concat();
    let kernels: Vec<&str> = tarfa_cuda::KERNELS_CU
        .split("extern \"C\" __global__ void ")
        .skip(1)
        // A launch bound (`__launch_bounds__(N) name(`) stands before the name.
        .map(|rest| match rest.strip_prefix("__launch_bounds__(") {
            Some(r) => r.split_once(')').map_or(r, |(_, name)| name).trim_start(),
            None => rest,
        })
        .filter_map(|rest| rest.split('(').next())
        .collect();
    assert!(kernels.len() >= 18, "{kernels:?}");
    assert!(kernels.contains(&"tarfa_e_delta_heads"), "{kernels:?}");
    for k in &kernels {
        let called = ["RUN(", "RUN_PLAIN(", "TARFA_EMU_RUN_TILED("]
            .iter()
            .any(|m| launchers.contains(&format!("{m}{k}(")));
        assert!(called, "{k} has no emulated entry point in cuda-emu/emu/");
    }
}

/// The block types and F16 the engine takes (`GpuDtype`), beside BF16 and F32.
const QUANT_TYPES: [emu::Dt; 9] = [
    emu::Dt::F16,
    emu::Dt::Q8_0,
    emu::Dt::Q4_0,
    emu::Dt::Q4_K,
    emu::Dt::Q5_K,
    emu::Dt::Q6_K,
    emu::Dt::Q4_1,
    emu::Dt::Q5_0,
    emu::Dt::Q5_1,
];

/// One launch of products of x with a matrix of each `(type, rows)` (random weights, `cols`
/// columns): each its canonical dot on the decoder's dequantised values, bit for bit.
fn assert_launch_is_canonical(r: &mut Rng, cols: usize, mats: &[(emu::Dt, usize)]) {
    let x = r.vec(cols, 2.0);
    let mut want = Vec::new();
    let mut products = Vec::new();
    for &(dt, rows) in mats {
        let (w, wv) = weights(r, rows * cols, dt, 1.0);
        let y: Vec<f32> = (0..rows)
            .map(|i| canon::dot_f32(&wv[i * cols..(i + 1) * cols], &x))
            .collect();
        want.push(bits(&y));
        products.push(emu::Product {
            w,
            rows,
            cols,
            x: x.clone(),
            bias: None,
            accumulate: None,
            vec: false,
        });
    }
    let got: Vec<Vec<u32>> = emu::matvec(&products).iter().map(|y| bits(y)).collect();
    assert_eq!(got, want, "cols {cols}, {mats:?}");
}

/// A GGUF weight is dequantised inside the canonical dot exactly as the CPU dequantises it
/// (`tarfa_decode::quant`, gguf-py's arithmetic) before its canonical dot: every product of each
/// type (three types in one launch, rows of one and several blocks; F16 also at widths that are
/// not whole 32-element chunks; scales normal, subnormal and zero), the embedding row of a
/// quantised table, and routed experts whose gate, up and down are three different types give
/// the CPU's bits.
#[test]
fn quantised_weights_are_dequantised_inside_the_canonical_dot_as_the_cpu_does() {
    let mut r = Rng(0x6767_7566);
    for &cols in &[256usize, 512] {
        for group in QUANT_TYPES.chunks(3) {
            let mats: Vec<_> = group
                .iter()
                .zip([2usize, 5, 3])
                .map(|(&t, n)| (t, n))
                .collect();
            assert_launch_is_canonical(&mut r, cols, &mats);
        }
    }
    // Rows of several windows of a warp's group values (a window: 32 lanes' worth, four K-type
    // blocks of 8 groups or two of Q6_K's 16), the last window part-filled, and the 32-element
    // types at five chunks.
    for dt in QUANT_TYPES.into_iter().filter(|t| t.block().0 > 1) {
        let cols = if dt.block().0 == 256 { 1280 } else { 1184 };
        assert_launch_is_canonical(&mut r, cols, &[(dt, 3)]);
    }
    // A K type beside other types in one launch: the warp kernels, the others on their generic
    // path (tarfa_warp_acc element by element), at 40 chunks: more than a window of 32.
    for [a, b, c] in [
        [emu::Dt::Q4_K, emu::Dt::Q8_0, emu::Dt::Q5_1],
        [emu::Dt::Q6_K, emu::Dt::Q4_0, emu::Dt::F16],
        [emu::Dt::Q5_K, emu::Dt::Q5_0, emu::Dt::Q4_1],
        [emu::Dt::Q4_K, emu::Dt::Bf16, emu::Dt::F32],
    ] {
        assert_launch_is_canonical(&mut r, 1280, &[(a, 3), (b, 2), (c, 4)]);
    }
    // F16 rows are plain: widths that are not whole chunks take the kernels' tail path.
    for cols in [7usize, 100] {
        assert_launch_is_canonical(&mut r, cols, &[(emu::Dt::F16, 3)]);
    }
    for dt in QUANT_TYPES {
        let (hidden, vocab) = (256, 4);
        let (t, tv) = weights(&mut r, vocab * hidden, dt, 1.0);
        for token in [0u32, 3] {
            let row = &tv[token as usize * hidden..(token as usize + 1) * hidden];
            assert_eq!(
                bits(&emu::embed(&t, hidden, token)),
                bits(row),
                "{dt:?} {token}"
            );
        }
    }
    // Experts of K types whose rows span several windows (gate and up: five blocks, three
    // windows of Q6_K's and two of Q5_K's; down: three blocks of Q6_K, two windows), gate and up
    // of different types.
    let (hidden, inter) = (1280usize, 768usize);
    let types = (emu::Dt::Q6_K, emu::Dt::Q5_K, emu::Dt::Q6_K);
    let c = moe_case_of(&mut r, (hidden, inter, 2, 2), types);
    assert_eq!(
        c.run(inter, hidden),
        c.want,
        "{types:?} at {hidden} × {inter}"
    );
    let (hidden, inter) = (256usize, 256usize);
    for types in [
        (emu::Dt::Q4_K, emu::Dt::Q6_K, emu::Dt::Q8_0),
        (emu::Dt::Q8_0, emu::Dt::Q8_0, emu::Dt::Q5_K),
        (emu::Dt::Q4_0, emu::Dt::F16, emu::Dt::Bf16),
        (emu::Dt::Q5_0, emu::Dt::Q4_1, emu::Dt::Q5_1),
        (emu::Dt::Q5_K, emu::Dt::Q5_K, emu::Dt::Q6_K),
        (emu::Dt::Q4_K, emu::Dt::Q5_0, emu::Dt::Q4_K),
    ] {
        let c = moe_case_of(&mut r, (hidden, inter, 3, 2), types);
        assert_eq!(c.run(inter, hidden), c.want, "{types:?}");
    }
}

/// The engine's block sizes are the decoder's (`tarfa_decode::quant`, the JNF dtype table's), so
/// a row's stride on the GPU is the bytes the CPU reads for it.
#[test]
fn the_engines_types_have_the_decoders_blocks() {
    for dt in QUANT_TYPES {
        let (w, _) = quantised(&mut Rng(1), dt.block().0, dt);
        let ty = layout(dt).0;
        assert_eq!(dt.block(), (ty.block_elems(), ty.block_bytes()), "{dt:?}");
        assert_eq!(w.bytes.len(), ty.block_bytes(), "{dt:?}");
        assert_eq!(
            dt.row_bytes(3 * ty.block_elems()),
            Some(3 * ty.block_bytes())
        );
    }
}

/// Qwen3.5's Gated DeltaNet step on the GPU (`tarfa_e_delta_heads` as the engine launches it) is
/// the CPU's `delta_step` bit for bit — the heads' output, the convolution's history (read back
/// from the GPU's ring) and every head's state — over tokens that carry the state: key heads
/// of 128 (four elements a lane, as Qwen3.5's) and of 40 (some lanes two, some one), value heads
/// of 128 and 72, two and three value heads a key head, convolutions of 4 and 3 (and 1: no
/// history), BF16 and F32 weights, and softplus's three branches (above its threshold 20, the
/// `f64` logarithm, and `u − u²/2` for tiny `e^x`).
/// The CPU's convolution history after token `t` (positions t − kernel + 2 ..= t, oldest first,
/// zeros before position 0) from the GPU's ring of `kernel` rows of `channels`: position p in
/// row p mod kernel, rows not yet written zero.
fn ring_history(hist: &[f32], kernel: usize, channels: usize, t: usize) -> Vec<f32> {
    (0..kernel - 1)
        .flat_map(|i| {
            let p = (t + 2 + i) as isize - kernel as isize;
            let row = p.rem_euclid(kernel as isize) as usize;
            hist[row * channels..(row + 1) * channels].to_vec()
        })
        .collect()
}

#[test]
fn the_deltanet_step_is_the_cpus_and_so_is_its_state() {
    use tarfa_decode::family::deltanet::{delta_step, DeltaDims, DeltaState, DeltaToken, Rates};
    let mut r = Rng(53);
    for &(k_heads, v_heads, dk, dv, kernel) in &[
        (2usize, 4usize, 128usize, 128usize, 4usize),
        (1, 3, 40, 72, 3),
        (1, 2, 32, 8, 1),
    ] {
        // The rates as `A_log` (a checkpoint's) and as `−exp(A_log)` stored (a GGUF's ssm_a).
        for (dt, a_neg) in [
            (emu::Dt::Bf16, false),
            (emu::Dt::F32, false),
            (emu::Dt::Bf16, true),
            (emu::Dt::F32, true),
        ] {
            let cd = 2 * k_heads * dk + v_heads * dv;
            let vd = v_heads * dv;
            let (conv, conv_v) = weights(&mut r, cd * kernel, dt, 0.5);
            let (dt_bias, dt_bias_v) = weights(&mut r, v_heads, dt, 1.0);
            let (a_log, a_log_v) = if a_neg {
                // A GGUF's ssm_a: −exp(A_log), negative as the converter stores it.
                let v: Vec<f32> = r.vec(v_heads, 1.0).iter().map(|x| -x.exp()).collect();
                match dt {
                    emu::Dt::Bf16 => {
                        let b: Vec<u16> = v.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                        (emu::W::bf16(&b), widen(&b))
                    }
                    _ => (emu::W::f32(&v), v),
                }
            } else {
                weights(&mut r, v_heads, dt, 1.0)
            };
            let (norm, norm_v) = weights(&mut r, dv, dt, 1.0);
            let eps = 1e-6;
            let dims = DeltaDims {
                kernel,
                k_heads,
                v_heads,
                dk,
                dv,
                eps,
            };
            let gpu_in = emu::DeltaIn {
                k_heads,
                v_heads,
                dk,
                dv,
                kernel,
                conv: &conv,
                dt_bias: &dt_bias,
                a_log: &a_log,
                a_neg,
                norm: &norm,
                eps,
            };
            let conv_m = MatrixRef {
                name: "conv1d",
                rows: cd,
                cols: kernel,
                data: WeightSlice::F32(&conv_v),
            };
            let mut cpu = DeltaState {
                conv: vec![vec![0.0; cd]; kernel - 1],
                s: vec![vec![0.0; dk * dv]; v_heads],
            };
            // The GPU's history: a ring of `kernel` rows, position p in row p mod kernel.
            let mut hist = vec![0.0; kernel * cd];
            let mut state = vec![0.0; v_heads * dv * dk];
            for t in 0..5 {
                let mixed = r.vec(cd, 4.0);
                let z = r.vec(vd, 4.0);
                let b = r.vec(v_heads, 4.0);
                let mut a = r.vec(v_heads, 4.0);
                if t == 2 {
                    a[0] = 30.0; // softplus(x) = x above 20
                    a[1] = -30.0; // e^x below 2^-20: u − u²/2
                }
                let want = delta_step(
                    Isa::Scalar,
                    &dims,
                    &mut cpu,
                    conv_m,
                    WeightSlice::F32(&dt_bias_v),
                    if a_neg {
                        Rates::Neg(WeightSlice::F32(&a_log_v))
                    } else {
                        Rates::Log(WeightSlice::F32(&a_log_v))
                    },
                    WeightSlice::F32(&norm_v),
                    &DeltaToken {
                        mixed: &mixed,
                        z: &z,
                        b: &b,
                        a: &a,
                    },
                );
                let got = emu::delta_step(&gpu_in, t, &mut hist, &mut state, (&mixed, &z, &b, &a));
                let case = format!(
                    "k {k_heads} v {v_heads} dk {dk} dv {dv} kernel {kernel} {dt:?} a_neg {a_neg} token {t}"
                );
                assert_eq!(bits(&got), bits(&want), "output: {case}");
                assert_eq!(bits(&state), bits(&cpu.s.concat()), "state: {case}");
                let ring = ring_history(&hist, kernel, cd, t);
                assert_eq!(bits(&ring), bits(&cpu.conv.concat()), "history: {case}");
            }
        }
    }
}

/// GLM-5.3-Flash's Kimi delta attention step on the GPU (`tarfa_e_kda_heads` as the engine will
/// launch it) is `kda::kda_step`'s, output and state, token after token: the three
/// convolutions, q and k L2-normalised by a division, the forget gate per key channel (with a
/// lower bound and with softplus, both of its branches), the decay on the key axis, the
/// sigmoid-gated norm; heads of one and two warps' rows, key heads past 128 (the kernel's wider
/// rows); rates as `A_log` and as `−exp(A_log)`.
#[test]
fn the_kda_step_is_the_cpus_and_so_is_its_state() {
    use tarfa_decode::family::deltanet::Rates;
    use tarfa_decode::family::kda::{kda_step, KdaShape, KdaToken, KdaWeights};
    let mut r = Rng(67);
    for &(heads, dim, kernel) in &[(2usize, 128usize, 4usize), (3, 40, 3), (1, 160, 1)] {
        for (dt, a_neg, lower_bound) in [
            (emu::Dt::Bf16, false, Some(-5.0f32)),
            (emu::Dt::F32, false, None),
            (emu::Dt::Bf16, true, None),
            (emu::Dt::F32, true, Some(-5.0)),
        ] {
            let w = heads * dim;
            let (conv, conv_v) = weights(&mut r, 3 * w * kernel, dt, 0.5);
            let (dt_bias, dt_bias_v) = weights(&mut r, w, dt, 1.0);
            let (a_log, a_log_v) = if a_neg {
                let v: Vec<f32> = r.vec(heads, 1.0).iter().map(|x| -x.exp()).collect();
                (emu::W::f32(&v), v)
            } else {
                weights(&mut r, heads, dt, 1.0)
            };
            let (norm, norm_v) = weights(&mut r, dim, dt, 1.0);
            let shape = KdaShape {
                heads,
                dim,
                kernel,
                lower_bound,
                eps: 1e-5,
            };
            let gpu_in = emu::KdaIn {
                heads,
                dim,
                kernel,
                conv: &conv,
                dt_bias: &dt_bias,
                a_log: &a_log,
                a_neg,
                lower_bound,
                norm: &norm,
                eps: shape.eps,
            };
            let third = |i: usize| m(&conv_v[i * w * kernel..(i + 1) * w * kernel], w, kernel);
            let cpu_w = KdaWeights {
                conv: [third(0), third(1), third(2)],
                dt_bias: WeightSlice::F32(&dt_bias_v),
                rates: match a_neg {
                    true => Rates::Neg(WeightSlice::F32(&a_log_v)),
                    false => Rates::Log(WeightSlice::F32(&a_log_v)),
                },
                norm: WeightSlice::F32(&norm_v),
            };
            let mut cpu = shape.new_state();
            let mut hist = vec![0.0; kernel * 3 * w];
            let mut state = vec![0.0; heads * dim * dim];
            for t in 0..5 {
                let mixed = r.vec(3 * w, 4.0);
                let mut f = r.vec(w, 4.0);
                let b = r.vec(heads, 4.0);
                let gate = r.vec(w, 4.0);
                if t == 2 {
                    f[0] = 30.0; // softplus(g) = g above 20
                    f[1] = -30.0;
                }
                let token = KdaToken {
                    mixed: &mixed,
                    f: &f,
                    b: &b,
                    gate: &gate,
                };
                let want = kda_step(Isa::Scalar, &shape, &mut cpu, &cpu_w, &token);
                let got = emu::kda_step(&gpu_in, t, &mut hist, &mut state, (&mixed, &f, &b, &gate));
                let case =
                    format!("heads {heads} dim {dim} kernel {kernel} {dt:?} a_neg {a_neg} lb {lower_bound:?} token {t}");
                assert_eq!(bits(&got), bits(&want), "output: {case}");
                assert_eq!(bits(&state), bits(&cpu.s.concat()), "state: {case}");
                let ring = ring_history(&hist, kernel, 3 * w, t);
                assert_eq!(bits(&ring), bits(&cpu.conv.concat()), "history: {case}");
            }
        }
    }
}

/// GLM-5.3-Flash's hyper-connections on the GPU (`kernels/mhc.cu` as the engine will launch
/// them) are `mhc`'s: a site's mixing weights (pre, post, and comb through its softmax and
/// Sinkhorn iterations, one and twenty of them), the sublayer's input collapsed from the
/// streams, the streams after the sublayer, and the streams' mean; four streams (the model's),
/// two and one; hidden sizes within one block and past it; BF16 and F32 weights.
#[test]
fn hyper_connection_sites_are_the_cpus() {
    use tarfa_decode::family::mhc::{self, HyperSpec};
    let mut r = Rng(71);
    for &(n, hidden, iters, dt) in &[
        (4usize, 300usize, 20usize, emu::Dt::Bf16),
        (4, 64, 1, emu::Dt::F32),
        (2, 129, 3, emu::Dt::F32),
        (1, 40, 2, emu::Dt::Bf16),
    ] {
        let spec = HyperSpec {
            streams: n,
            eps: 1e-6,
            iters,
            norm_eps: 1e-5,
        };
        let (base, base_v) = weights(&mut r, spec.mix(), dt, 1.0);
        let (scale, scale_v) = weights(&mut r, 3, dt, 1.0);
        for t in 0..3 {
            let mix = r.vec(spec.mix(), 4.0);
            let x = r.vec(n * hidden, 2.0);
            let y = r.vec(hidden, 2.0);
            let want = mhc::weights(
                &spec,
                &mix,
                WeightSlice::F32(&base_v),
                WeightSlice::F32(&scale_v),
            );
            let want_c = mhc::collapse_one(&spec, hidden, &want, &x);
            let mut want_x = x.clone();
            mhc::expand_one(&spec, hidden, &want, &mut want_x, &y);
            let (w, c, got_x) = emu::hc_site((n, spec.eps, iters), &mix, (&base, &scale), &x, &y);
            let case = format!("n {n} hidden {hidden} iters {iters} {dt:?} token {t}");
            let want_w = [&want.pre[..], &want.post, &want.comb].concat();
            assert_eq!(bits(&w), bits(&want_w), "weights: {case}");
            assert_eq!(bits(&c), bits(&want_c), "collapsed: {case}");
            assert_eq!(bits(&got_x), bits(&want_x), "streams: {case}");
            let mean = emu::hc_mean(n, &got_x);
            assert_eq!(
                bits(&mean),
                bits(&mhc::streams_mean(&spec, hidden, &want_x)),
                "mean: {case}"
            );
        }
    }
}
