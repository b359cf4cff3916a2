//! Prompts as matrices ([`Engine::prompt`]): a chunk of a sequence's tokens in one pass of the
//! layers, each product a matrix product over the chunk's tokens (`kernels/batch.cu`), each
//! routed expert read once for all the chunk's tokens that chose it. Every value is the one
//! [`Engine::step`] gives it: the same canonical dots, norms, RoPE, attention, top-k and combine,
//! only batched; a chunk of any size gives the same bits (`cuda-emu/tests/whole_model.rs`).

// `EngineDevice::launch` is an `unsafe fn`: its contract is the kernel's buffer sizes.
#![allow(unsafe_code)]

use super::*;

/// Tokens in one pass at most: a longer chunk runs as several (the chunk size changes no bit).
pub const PROMPT_PASS: usize = 512;

/// Rows a `tarfa_e_mm*` block computes and the tokens (or pairs) it takes (`kernels/batch.cu`'s
/// `TARFA_MM_BR`, `TARFA_MM_BT`) and its threads.
const MM_ROWS: usize = 32;
const MM_TOKENS: usize = 16;
const MM_THREADS: u32 = 256;

/// Query heads a `tarfa_e_attention_quads` block takes (`TARFA_ATTN_Q`), and its threads.
const ATTN_Q: usize = 4;
const ATTN_Q_THREADS: u32 = 256;

/// Bytes of attention scores a pass may keep in global memory (a context longer than a block's
/// shared memory holds: `tokens × heads × cap` floats); a pass takes fewer tokens to stay within.
const SCORES_BUDGET: usize = 256 << 20;

/// Experts a layer may have for the pass's grouping kernel (`tarfa_e_moe_group`'s tables),
/// counting the folded shared experts.
const GROUP_MAX_EXPERTS: usize = 1024;

/// The buffers of a pass of up to `tokens` tokens (made at the first pass, grown as needed).
#[derive(Debug)]
pub(super) struct PassBufs<B> {
    tokens: usize,
    tok: B,
    x: B,
    xn: B,
    q: B,
    k: B,
    v: B,
    attn: B,
    z: B,
    probs: B,
    /// The routed slots, `top_k` a token, and (`fids`, `fwts`) `top_k + 1` a token with the
    /// folded shared experts' slot preset (id `n`, weight 1).
    ids: B,
    wts: B,
    fids: B,
    fwts: B,
    /// One expert for every token (a dense MLP, unfolded shared experts) and weight 1.
    zeros: B,
    ones: B,
    order: B,
    tiles: B,
    /// `order` and `tiles` of `zeros`: every token to expert 0.
    order1: B,
    tiles1: B,
    h: B,
    y: B,
    hs: B,
    ys: B,
    /// Attention scores past what a block keeps in shared memory: `tokens × heads × cap`
    /// floats, made when a pass's context needs them.
    scores: Option<(B, usize)>,
    /// Every token's logits, made when asked for.
    logits: Option<B>,
}

impl<D: EngineDevice> Engine<D> {
    /// Whether [`Engine::prompt`] runs this model's chunks as matrices: every layer attention of
    /// the first form without sinks or narrower values (a DeltaNet or KDA layer's recurrence, MLA,
    /// MiMo-V2-Flash's attention and hyper-connections run token by token), no layer's experts on the host, no
    /// gated shared experts, at most [`GROUP_MAX_EXPERTS`] experts a layer; and not switched off
    /// ([`Engine::set_prompt_matrices`]).
    pub fn prompts_as_matrices(&self) -> bool {
        let s = self.shape;
        self.prompt_matrices
            && s.swa.is_none()
            && s.values.is_none()
            && s.hyper.is_none()
            && self.layers.iter().all(|l| {
                matches!(&l.mixer, DevMixer::Attention(at) if at.sinks.is_none())
                    && !l.host
                    && l.shared_gate.is_none()
                    && l.experts.gate.len() <= GROUP_MAX_EXPERTS
            })
    }

    /// Run prompts as matrices where the model takes it (the default), or step their tokens one by
    /// one (`false`, for measuring): the same bits.
    pub fn set_prompt_matrices(&mut self, on: bool) {
        self.prompt_matrices = on;
    }

    /// Run a pass's attention four query heads of a KV head's group a block, the keys and values
    /// read once for the four (`tarfa_e_attention_quads`; the default where the heads take it:
    /// [`quads_take`]), or a block per query head (`false`, for measuring): the same bits.
    pub fn set_attention_quads(&mut self, on: bool) {
        self.attention_quads = on;
    }

    /// Whether this model's passes run their attention four query heads a block: heads the
    /// kernel takes, in groups of two or more (a group of one would leave three of a block's four
    /// heads empty).
    fn quads(&self) -> bool {
        let s = self.shape;
        self.attention_quads && quads_take(s.head_dim) && s.heads >= 2 * s.kv_heads.max(1)
    }

    /// Scores an attention block of a pass keeps in shared memory for each of its heads, with
    /// caches of `cap` rows: a longer context's go to global memory.
    fn pass_sh_scores(&self, cap: usize) -> usize {
        let d = self.shape.head_dim;
        if self.quads() {
            ((SHARED_MAX / 4).saturating_sub(2 * ATTN_Q * d) / ATTN_Q).min(cap)
        } else {
            sh_scores(d, cap)
        }
    }

    /// Run `tokens` of `seq` at positions `pos..pos + tokens.len()` (positions from `pos` on are
    /// overwritten), as [`Engine::step`] would one by one, in passes of at most [`PROMPT_PASS`]
    /// tokens whose products are matrix products. The logits of every token when `all_logits`,
    /// else of the last. `rope` as for `step`, covering the last position. Where the model
    /// does not take it ([`Engine::prompts_as_matrices`]), or for one token, the tokens are
    /// stepped one by one.
    #[allow(clippy::too_many_arguments)]
    pub fn prompt(
        &mut self,
        seq: &mut EngineSeq<D::Buf>,
        tokens: &[u32],
        pos: usize,
        rope: RopeTables<'_>,
        all_logits: bool,
        host: &mut HostExperts<'_>,
    ) -> Result<Vec<Vec<f32>>, CudaError> {
        let mut out = Vec::new();
        if tokens.len() < 2 || !self.prompts_as_matrices() {
            for (i, &t) in tokens.iter().enumerate() {
                let want = all_logits || i + 1 == tokens.len();
                if let Some(l) = self.step(seq, t, pos + i, rope, want, host)? {
                    out.push(l);
                }
            }
            return Ok(out);
        }
        let mut at = 0;
        while at < tokens.len() {
            let n = (tokens.len() - at).min(self.pass_tokens(pos + at));
            let last = at + n == tokens.len();
            let part = &tokens[at..at + n];
            out.extend(self.pass(seq, part, pos + at, rope, all_logits, last)?);
            at += n;
        }
        Ok(out)
    }

    /// Tokens of a pass from position `start`: [`PROMPT_PASS`], or fewer where its context is
    /// longer than an attention block keeps scores for in shared memory, so that the scores in
    /// global memory (tokens × heads × the caches' capacity) stay within [`SCORES_BUDGET`].
    fn pass_tokens(&self, start: usize) -> usize {
        let s = self.shape;
        let end = start.saturating_add(PROMPT_PASS);
        // The capacity the caches will have at `end` (they double).
        let mut cap = self.cap.max(1);
        while cap < end {
            cap = cap.saturating_mul(2);
        }
        if end <= self.pass_sh_scores(cap) {
            return PROMPT_PASS;
        }
        (SCORES_BUDGET / (4 * s.heads.max(1)).saturating_mul(cap).max(1)).clamp(1, PROMPT_PASS)
    }

    /// One pass of [`Engine::prompt`]: its logits (every token's when `all`, else the last
    /// token's when `last`).
    fn pass(
        &mut self,
        seq: &mut EngineSeq<D::Buf>,
        tokens: &[u32],
        pos: usize,
        rope: RopeTables<'_>,
        all: bool,
        last: bool,
    ) -> Result<Vec<Vec<f32>>, CudaError> {
        if !self.finished {
            return Err(CudaError::Usage("the GPU decoder was not finished".into()));
        }
        self.check_seq(seq)?;
        let s = self.shape;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= s.vocab) {
            return Err(CudaError::Usage(format!(
                "token {t} is outside the vocabulary of {}",
                s.vocab
            )));
        }
        let n = tokens.len();
        let end = pos
            .checked_add(n)
            .ok_or_else(|| CudaError::Usage("position too large".into()))?;
        int(end, "a position")?;
        self.ensure_cap(seq, end)?;
        self.ensure_rope(end, rope)?;
        self.ensure_pass(n, end, all)?;
        let toks: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        let pb = self
            .pass
            .as_mut()
            .ok_or_else(|| CudaError::Usage("no pass buffers".into()))?;
        self.dev.write(&mut pb.tok, 0, &toks)?;
        self.pass_layers(seq, n, pos)?;
        let out = self.pass_logits(n, all, last)?;
        self.report.steps += n as u64;
        self.report.prompt_passes += 1;
        self.report.prompt_pass_tokens += n as u64;
        Ok(out)
    }

    /// Make (or grow) the pass buffers for `n` tokens, the attention scores for a context of
    /// `end` positions if a block cannot keep them, and every token's logits when `all`.
    fn ensure_pass(&mut self, n: usize, end: usize, all: bool) -> Result<(), CudaError> {
        let s = self.shape;
        let have = self.pass.as_ref().map_or(0, |p| p.tokens);
        let spill = end > self.pass_sh_scores(self.cap);
        // A buffer replaced below may still be read by the last pass's launches.
        self.dev.sync()?;
        if have < n {
            let t = n.max(have.saturating_mul(2)).min(PROMPT_PASS.max(n));
            self.pass = Some(self.pass_bufs(t)?);
        }
        let dev = &self.dev;
        let pb = self
            .pass
            .as_mut()
            .ok_or_else(|| CudaError::Usage("no pass buffers".into()))?;
        if spill {
            let need = n * s.heads * self.cap;
            if pb.scores.as_ref().is_none_or(|(_, len)| *len < need) {
                pb.scores = None;
                pb.scores = Some((dev.alloc(need.max(1) * 4)?, need));
            }
        }
        if all && pb.logits.is_none() {
            pb.logits = Some(dev.alloc(pb.tokens * s.vocab * 4)?);
        }
        Ok(())
    }

    /// The buffers of a pass of `t` tokens.
    fn pass_bufs(&self, t: usize) -> Result<PassBufs<D::Buf>, CudaError> {
        let s = self.shape;
        let dev = &self.dev;
        let z = |n: usize| dev.alloc(n.max(1) * 4);
        let h = s.hidden;
        let k = s.top_k.max(1);
        let qd = s.heads * s.head_dim;
        let q_rows = if s.attn_gate { 2 * qd } else { qd };
        let kvd = s.kv_heads * s.head_dim;
        let experts = self
            .layers
            .iter()
            .map(|l| l.router.as_ref().map_or(1, |r| r.rows))
            .max()
            .unwrap_or(1);
        // The widest slot set of any layer: its slots a token times their width.
        let (mut hw, mut shw) = (1, 1);
        for l in &self.layers {
            let kk = match &l.router {
                Some(_) => k + usize::from(l.fold),
                None => 1,
            };
            hw = hw.max(kk * l.experts.inter);
            if let (Some(t), false) = (&l.shared, l.fold) {
                shw = shw.max(t.inter);
            }
        }
        let fill = |n: usize, v: [u8; 4]| dev.upload(&v.repeat(n.max(1)));
        let n_max =
            i32::try_from(experts).map_err(|_| CudaError::Usage("too many experts".into()))?;
        // The folded slot of every token: id n, weight 1 (`Layer::fold`).
        let mut fids = Vec::with_capacity(t * (k + 1) * 4);
        let mut fwts = Vec::with_capacity(t * (k + 1) * 4);
        for _ in 0..t {
            fids.extend(std::iter::repeat_n(0u8, k * 4));
            fids.extend(n_max.to_le_bytes());
            fwts.extend(std::iter::repeat_n(0u8, k * 4));
            fwts.extend(1.0f32.to_le_bytes());
        }
        let pairs = t * (k + 1);
        let tiles = 1 + 3 * (pairs.div_ceil(MM_TOKENS) + experts + 1);
        let pb = PassBufs {
            tokens: t,
            tok: z(t)?,
            x: z(t * h)?,
            xn: z(t * h)?,
            q: z(t * q_rows)?,
            k: z(t * kvd)?,
            v: z(t * kvd)?,
            attn: z(t * qd)?,
            z: z(t * experts)?,
            probs: z(t * 3 * experts)?,
            ids: z(t * k)?,
            wts: z(t * k)?,
            fids: dev.upload(&fids)?,
            fwts: dev.upload(&fwts)?,
            zeros: fill(t, 0i32.to_le_bytes())?,
            ones: fill(t, 1.0f32.to_le_bytes())?,
            order: z(pairs)?,
            tiles: z(tiles)?,
            order1: z(t)?,
            tiles1: z(1 + 3 * (t.div_ceil(MM_TOKENS) + 2))?,
            h: z(t * hw)?,
            y: z(t * (k + 1) * h)?,
            hs: z(t * shw)?,
            ys: z(t * h)?,
            scores: None,
            logits: None,
        };
        Ok(pb)
    }

    /// Every layer over the pass's `n` tokens at positions `pos..pos + n`: x and xn the last
    /// layer's output and its final norm.
    fn pass_layers(&self, seq: &EngineSeq<D::Buf>, n: usize, pos: usize) -> Result<(), CudaError> {
        let s = self.shape;
        let pb = self
            .pass
            .as_ref()
            .ok_or_else(|| CudaError::Usage("no pass buffers".into()))?;
        let p = |b: &D::Buf| self.dev.addr(b);
        let (x, xn) = (p(&pb.x), p(&pb.xn));
        let k = s.top_k.max(1);
        self.embed_many(p(&pb.tok), x, n)?;
        // Every token to expert 0: the grouping of a dense MLP's and unfolded shared experts'.
        let one = (p(&pb.order1), p(&pb.tiles1), n.div_ceil(MM_TOKENS) + 1);
        self.group(p(&pb.zeros), n, 1, one.0, one.1)?;
        for (i, l) in self.layers.iter().enumerate() {
            if i == 0 {
                self.norm_many(x, &l.in_norm, xn, n)?;
            }
            let (DevMixer::Attention(at), Some(SeqLayer::Kv { k: kc, v: vc })) =
                (&l.mixer, seq.layers.get(i))
            else {
                return Err(foreign_layout(i));
            };
            let (q, kb, vb, attn) = (p(&pb.q), p(&pb.k), p(&pb.v), p(&pb.attn));
            self.mm(
                &[
                    self.job(&at.q, xn, q, at.bias[0].as_ref(), false),
                    self.job(&at.k, xn, kb, at.bias[1].as_ref(), false),
                    self.job(&at.v, xn, vb, at.bias[2].as_ref(), false),
                ],
                n,
            )?;
            self.kv_store(at, (kb, vb), (p(kc), p(vc)), n, pos)?;
            self.attention_many(at, q, (p(kc), p(vc)), attn, n, pos)?;
            self.mm(&[self.job(&at.o, attn, x, at.bias[3].as_ref(), true)], n)?;
            self.norm_many(x, &l.post_norm, xn, n)?;
            let (h, y) = (p(&pb.h), p(&pb.y));
            let (wts, kk) = match &l.router {
                Some(router) => {
                    let (ids, wts, kk) = match l.fold {
                        true => (p(&pb.fids), p(&pb.fwts), k + 1),
                        false => (p(&pb.ids), p(&pb.wts), k),
                    };
                    self.mm(&[self.job(router, xn, p(&pb.z), None, false)], n)?;
                    self.topk_many(l, (p(&pb.z), p(&pb.probs)), (ids, wts, kk), n)?;
                    let experts = l.experts.gate.len();
                    let (order, tiles) = (p(&pb.order), p(&pb.tiles));
                    self.group(ids, n * kk, experts, order, tiles)?;
                    let max_tiles = (n * kk).div_ceil(MM_TOKENS) + experts;
                    self.swiglu_many(&l.experts, (order, tiles, max_tiles), kk, xn, h, y)?;
                    (wts, kk)
                }
                None => {
                    self.swiglu_many(&l.experts, one, 1, xn, h, y)?;
                    (p(&pb.ones), 1)
                }
            };
            let sh = match &l.shared {
                Some(t) if !l.fold => {
                    let ys = p(&pb.ys);
                    self.swiglu_many(t, one, 1, xn, p(&pb.hs), ys)?;
                    ys
                }
                _ => 0,
            };
            let next = self
                .layers
                .get(i + 1)
                .map_or(&self.final_norm, |n| &n.in_norm);
            self.combine_many(y, wts, kk, sh, x, (next, xn), n)?;
        }
        Ok(())
    }

    /// The logits of the pass: every token's (`all`), else the last token's when `last`.
    fn pass_logits(&self, n: usize, all: bool, last: bool) -> Result<Vec<Vec<f32>>, CudaError> {
        let s = self.shape;
        let pb = self
            .pass
            .as_ref()
            .ok_or_else(|| CudaError::Usage("no pass buffers".into()))?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let xn = self.dev.addr(&pb.xn);
        if all {
            let logits = pb
                .logits
                .as_ref()
                .ok_or_else(|| CudaError::Usage("no logits buffer".into()))?;
            self.mm(&[self.job(head, xn, self.dev.addr(logits), None, false)], n)?;
            let v = f32s(&self.dev.read(logits, n * s.vocab * 4)?);
            return Ok(v.chunks_exact(s.vocab).map(<[f32]>::to_vec).collect());
        }
        if !last {
            return Ok(Vec::new());
        }
        let at = xn + ((n - 1) * s.hidden * 4) as u64;
        self.matvec(&[self.job(head, at, self.dev.addr(&self.a.logits), None, false)])?;
        Ok(vec![f32s(&self.dev.read(&self.a.logits, s.vocab * 4)?)])
    }

    /// The products `jobs` over `n` tokens (each job's x and y hold `n` rows of its columns and
    /// rows), one launch.
    fn mm(&self, jobs: &[MatJob], n: usize) -> Result<(), CudaError> {
        let (m, _) = Self::mat_jobs(jobs)?;
        let tiles: usize = jobs
            .iter()
            .map(|j| (j.rows as usize).div_ceil(MM_ROWS))
            .sum();
        // SAFETY: each job's `w` is a resident matrix of `rows × cols` elements of `dtype`
        // (checked at upload), `x` a pass buffer of `n × cols` floats, `y` of `n × rows`, `bias`
        // (when set) `rows` elements; `vec` only for wide types with `cols` a multiple of 8
        // (rows 16-byte aligned); the pass buffers are 256-byte aligned; a block per row tile of
        // a job and token tile, 256 threads, static shared memory only.
        unsafe {
            self.dev.launch(
                Kernel::Mm,
                geo(tiles * n.div_ceil(MM_TOKENS), MM_THREADS, 0)?,
                &[Arg::Jobs(m), Arg::I32(int(n, "a pass's tokens")?)],
            )
        }
    }

    fn embed_many(&self, tok: u64, x: u64, n: usize) -> Result<(), CudaError> {
        let h = self.shape.hidden;
        let per = h.div_ceil(BLOCK as usize);
        // SAFETY: `tok` holds n token ids < vocab (checked in `pass`), the table is
        // `vocab × hidden`, x holds n × hidden floats.
        unsafe {
            self.dev.launch(
                Kernel::EmbedMany,
                geo(per * n, BLOCK, 0)?,
                &[
                    Arg::Ptr(self.embed.ptr),
                    Arg::I32(self.embed.dtype.code()),
                    Arg::I32(h as i32),
                    Arg::Ptr(tok),
                    Arg::I32(per as i32),
                    Arg::Ptr(x),
                ],
            )
        }
    }

    /// out = RMSNorm_w of each of the n tokens' x (`tarfa_e_rms_norm`, a block a token).
    fn norm_many(
        &self,
        x: u64,
        w: &DevTensor<D::Buf>,
        out: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        // SAFETY: `x` and `out` hold n × hidden floats, `w` hidden elements.
        unsafe {
            self.dev.launch(
                Kernel::RmsNorm,
                geo(n, RMS_BLOCK, 0)?,
                &[
                    Arg::Ptr(x),
                    Arg::Ptr(w.ptr),
                    Arg::I32(w.dtype.code()),
                    Arg::I32(w.cols as i32),
                    Arg::F32(self.shape.eps),
                    Arg::Ptr(out),
                ],
            )
        }
    }

    /// The pass's keys (`k`, normed and rotated) and values into the caches at `pos..pos + n`.
    fn kv_store(
        &self,
        at: &DevAttention<D::Buf>,
        (k, v): (u64, u64),
        (kc, vc): (u64, u64),
        n: usize,
        pos: usize,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let (norm, kn, ndt) = match &at.qk_norm {
            Some((_, kn)) => (1i32, kn.ptr, kn.dtype.code()),
            None => (0, 0, 0),
        };
        // SAFETY: a block (one warp) per token and KV head; k and v hold n × kv_heads·d floats,
        // the norm weight d elements, the caches `seq.cap × kv_heads·d` floats with
        // pos + n ≤ seq.cap (ensure_cap in `pass`), the RoPE tables `cap × half` with
        // pos + n rows written (ensure_rope); shared memory d floats.
        unsafe {
            self.dev.launch(
                Kernel::KvStore,
                geo(s.kv_heads * n, 32, (s.head_dim * 4) as u32)?,
                &[
                    Arg::Ptr(k),
                    Arg::Ptr(v),
                    Arg::Ptr(kn),
                    Arg::I32(ndt),
                    Arg::I32(norm),
                    Arg::F32(s.eps),
                    Arg::I32(s.kv_heads as i32),
                    Arg::I32(s.head_dim as i32),
                    Arg::I32((s.rotary_dim / 2) as i32),
                    Arg::Ptr(self.dev.addr(&self.cos)),
                    Arg::Ptr(self.dev.addr(&self.sin)),
                    Arg::I32(pos as i32),
                    Arg::Ptr(kc),
                    Arg::Ptr(vc),
                ],
            )
        }
    }

    /// Attention of the pass's tokens (their keys stored, `kv_store`) into `attn`.
    fn attention_many(
        &self,
        at: &DevAttention<D::Buf>,
        q: u64,
        (kc, vc): (u64, u64),
        attn: u64,
        n: usize,
        pos: usize,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let d = s.head_dim;
        let (norm, qn, ndt) = match &at.qk_norm {
            Some((qn, _)) => (1i32, qn.ptr, qn.dtype.code()),
            None => (0, 0, 0),
        };
        let qstride = if s.attn_gate { 2 * d } else { d };
        let window = s.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let sh = self.pass_sh_scores(self.cap);
        let scores = self
            .pass
            .as_ref()
            .and_then(|p| p.scores.as_ref())
            .map_or(0, |(b, _)| self.dev.addr(b));
        // Four query heads of a group a block (their keys and values read once), or one.
        let (kernel, blocks, threads, shared) = if self.quads() {
            let quads = (s.heads / s.kv_heads.max(1)).div_ceil(ATTN_Q);
            let shared = 2 * ATTN_Q * d + ATTN_Q * sh;
            let blocks = n * s.kv_heads * quads;
            (Kernel::AttentionQuads, blocks, ATTN_Q_THREADS, shared)
        } else {
            (Kernel::AttentionMany, s.heads * n, ATTN_BLOCK, 36 * d + sh)
        };
        // SAFETY: a block per token and query head (or four of a KV head's group, heads
        // d ≤ 256 wide, a multiple of 8: `quads_take`); q holds n × heads·qstride floats, attn
        // n × heads·d, the caches hold rows 0..pos + n (stored by `kv_store` before), the RoPE
        // tables those rows; a context longer than `sh` has the pass's scores (n × heads × cap
        // floats, ensure_pass); shared memory as the kernel's comment in kernels/batch.cu.
        unsafe {
            self.dev.launch(
                kernel,
                geo(blocks, threads, (shared * 4) as u32)?,
                &[
                    Arg::Ptr(q),
                    Arg::Ptr(qn),
                    Arg::I32(ndt),
                    Arg::I32(norm),
                    Arg::F32(s.eps),
                    Arg::I32(s.heads as i32),
                    Arg::I32(s.kv_heads as i32),
                    Arg::I32(d as i32),
                    Arg::I32((s.rotary_dim / 2) as i32),
                    Arg::Ptr(self.dev.addr(&self.cos)),
                    Arg::Ptr(self.dev.addr(&self.sin)),
                    Arg::I32(pos as i32),
                    Arg::Ptr(kc),
                    Arg::Ptr(vc),
                    Arg::I32(window),
                    Arg::F32(s.scaling),
                    Arg::Ptr(scores),
                    Arg::I32(self.cap as i32),
                    Arg::Ptr(attn),
                    Arg::I32(sh as i32),
                    Arg::I32(qstride as i32),
                    Arg::I32(i32::from(s.attn_gate)),
                ],
            )
        }
    }

    /// Each token's top-k of its router logits `z` into its `kk` slots (the first `top_k`
    /// written; a folded slot preset).
    fn topk_many(
        &self,
        l: &Layer<D::Buf>,
        (z, probs): (u64, u64),
        (ids, wts, kk): (u64, u64, usize),
        n: usize,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let rows = l.router.as_ref().map_or(0, |r| r.rows) as i32;
        let (ki, renorm, stride) = (s.top_k as i32, i32::from(s.norm_topk_prob), kk as i32);
        match &l.route {
            // SAFETY: a warp per token; z holds n × rows floats, probs n × 3·rows, ids and wts
            // n × kk (kk ≥ top_k ≤ rows).
            DevRoute::Softmax => unsafe {
                self.dev.launch(
                    Kernel::TopkMany,
                    geo(n, 32, 0)?,
                    &[
                        Arg::Ptr(z),
                        Arg::I32(rows),
                        Arg::I32(ki),
                        Arg::I32(renorm),
                        Arg::Ptr(probs),
                        Arg::Ptr(ids),
                        Arg::Ptr(wts),
                        Arg::I32(stride),
                    ],
                )
            },
            // SAFETY: as above; the bias holds rows elements, the groups divide rows.
            DevRoute::SigmoidGroup {
                bias,
                n_group,
                topk_group,
                scale,
            } => unsafe {
                self.dev.launch(
                    Kernel::SigmoidTopkMany,
                    geo(n, 32, 0)?,
                    &[
                        Arg::Ptr(z),
                        Arg::I32(rows),
                        Arg::Ptr(bias.ptr),
                        Arg::I32(bias.dtype.code()),
                        Arg::I32(ki),
                        Arg::I32(*n_group),
                        Arg::I32(*topk_group),
                        Arg::I32(renorm),
                        Arg::F32(*scale),
                        Arg::Ptr(probs),
                        Arg::Ptr(ids),
                        Arg::Ptr(wts),
                        Arg::I32(stride),
                    ],
                )
            },
        }
    }

    /// The `pairs` slots' experts (`ids`, each < `experts`) grouped: `order` and `tiles`.
    fn group(
        &self,
        ids: u64,
        pairs: usize,
        experts: usize,
        order: u64,
        tiles: u64,
    ) -> Result<(), CudaError> {
        // SAFETY: one block; ids and order hold `pairs` ints, tiles 1 + 3 × (the most tiles:
        // ⌈pairs / 16⌉ + experts) (pass_bufs), experts ≤ 1024 (prompts_as_matrices).
        unsafe {
            self.dev.launch(
                Kernel::MoeGroup,
                geo(1, 256, 0)?,
                &[
                    Arg::Ptr(ids),
                    Arg::I32(int(pairs, "a pass's slots")?),
                    Arg::I32(experts as i32),
                    Arg::Ptr(order),
                    Arg::Ptr(tiles),
                ],
            )
        }
    }

    /// `y[p] = down_e(silu(gate_e x) ⊙ up_e x)` of token `p / kk`'s `x` for every grouped pair
    /// `p` of expert `e` (`order`, `tiles`, at most `max_tiles` tiles), through `h`.
    fn swiglu_many(
        &self,
        t: &ExpertTable<D::Buf>,
        (order, tiles, max_tiles): (u64, u64, usize),
        kk: usize,
        xn: u64,
        h: u64,
        y: u64,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let m = t.args(&self.dev, (s.hidden, s.swiglu_limit))?;
        let mt = int(max_tiles, "a pass's tiles")?;
        // SAFETY: the tables hold every expert's gate/up (`inter × hidden`) and down
        // (`hidden × inter`) of their types; order and tiles were written by `group` for
        // pairs < n × kk (tokens < n), at most max_tiles tiles; xn holds n × hidden floats, h and
        // y the pairs' inter and hidden floats (pass_bufs: the widest layer's); `vec_*` only for
        // wide types with widths multiples of 8.
        unsafe {
            self.dev.launch(
                Kernel::MmGateUp,
                geo(t.inter.div_ceil(MM_ROWS / 2) * max_tiles, MM_THREADS, 0)?,
                &[
                    Arg::Moe(m),
                    Arg::Ptr(order),
                    Arg::Ptr(tiles),
                    Arg::I32(mt),
                    Arg::I32(kk as i32),
                    Arg::Ptr(xn),
                    Arg::Ptr(h),
                ],
            )?;
            self.dev.launch(
                Kernel::MmDown,
                geo(s.hidden.div_ceil(MM_ROWS) * max_tiles, MM_THREADS, 0)?,
                &[
                    Arg::Moe(m),
                    Arg::Ptr(order),
                    Arg::Ptr(tiles),
                    Arg::I32(mt),
                    Arg::Ptr(h),
                    Arg::Ptr(y),
                ],
            )
        }
    }

    /// Each token's combine of its `kk` slots (and the shared experts' `sh`) into x, then
    /// `out` = the norm `w` of the new x (`tarfa_e_combine_norm`, a block a token).
    #[allow(clippy::too_many_arguments)]
    fn combine_many(
        &self,
        y: u64,
        wts: u64,
        kk: usize,
        sh: u64,
        x: u64,
        (w, out): (&DevTensor<D::Buf>, u64),
        n: usize,
    ) -> Result<(), CudaError> {
        // SAFETY: y holds n × kk × hidden floats, wts n × kk, x, out and sh (when not 0)
        // n × hidden, w hidden elements; no gate weight.
        unsafe {
            self.dev.launch(
                Kernel::CombineNorm,
                geo(n, RMS_BLOCK, 0)?,
                &[
                    Arg::Ptr(y),
                    Arg::Ptr(wts),
                    Arg::I32(kk as i32),
                    Arg::I32(self.shape.hidden as i32),
                    Arg::Ptr(sh),
                    Arg::Ptr(0),
                    Arg::Ptr(x),
                    Arg::Ptr(w.ptr),
                    Arg::I32(w.dtype.code()),
                    Arg::F32(self.shape.eps),
                    Arg::Ptr(out),
                ],
            )
        }
    }
}

/// Whether `tarfa_e_attention_quads` takes heads of `d` elements: at most 32 · TARFA_HEAD_AHEAD
/// (its lanes hold a head's q in registers), a multiple of 8 (its value rows read 8 at a time).
pub(super) fn quads_take(d: usize) -> bool {
    d > 0 && d <= 256 && d % 8 == 0
}

/// Scores an attention block keeps in shared memory beside the 36 × d floats of its partials,
/// q, key and scratch (48 KiB in all), at most `cap`: a longer context's go to global memory.
pub(super) fn sh_scores(d: usize, cap: usize) -> usize {
    (SHARED_MAX / 4).saturating_sub(36 * d).min(cap)
}
