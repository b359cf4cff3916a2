//! Experts for the decoder: streamed from disk through the runtime's [`ExpertSource`] (checked
//! as they land), kept in a RAM cache of a chosen size, or all resident. Where an expert came
//! from never changes what is computed with it: the same bytes, viewed in place.

use std::collections::HashMap;
use std::sync::Arc;

use tarfa_format::{Dtype, Role};
use tarfa_runtime::{ExpertSource, ModelExperts};

use crate::error::{DecodeError, ExpertFault, Result};
use crate::weights::{MatrixRef, WeightSlice};

/// How experts are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExpertMode {
    /// Read from disk when selected; a cache of [`ExpertOptions::cache_bytes`] keeps some.
    #[default]
    Stream,
    /// Every expert read (and checked) once at start and kept in RAM.
    Resident,
}

impl std::str::FromStr for ExpertMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<ExpertMode, String> {
        match s {
            "stream" => Ok(ExpertMode::Stream),
            "resident" => Ok(ExpertMode::Resident),
            _ => Err(format!("unknown expert mode {s:?} (stream, resident)")),
        }
    }
}

/// One region of an expert: its role, element type, shape and place in the extent.
#[derive(Clone, Debug)]
pub struct ExpertPart {
    /// Role in the expert.
    pub role: Role,
    /// Region name (the source tensor's).
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Offset from the start of the extent.
    pub start: usize,
    /// Exact length.
    pub len: usize,
}

/// The regions of one expert, from its layer file's index.
#[derive(Clone, Debug)]
pub struct ExpertLayout {
    /// Layer.
    pub layer: u32,
    /// Expert.
    pub expert: u32,
    /// Its regions in file order.
    pub parts: Vec<ExpertPart>,
    /// Extent length.
    pub extent_len: usize,
    /// Bytes of its regions (padding excluded).
    pub data_len: usize,
}

/// An expert's weights viewed in place (in a ring slot or a cache entry).
#[derive(Clone, Debug)]
pub struct ExpertView<'a> {
    /// Layer.
    pub layer: u32,
    /// Expert.
    pub expert: u32,
    parts: Vec<(Role, MatrixRef<'a>)>,
    extent: &'a [u8],
}

impl<'a> ExpertView<'a> {
    fn new(layout: &'a ExpertLayout, bytes: &'a [u8]) -> Result<ExpertView<'a>> {
        let bad = |fault: ExpertFault| DecodeError::BadExpert {
            layer: layout.layer,
            expert: layout.expert,
            fault,
        };
        let mut parts = Vec::with_capacity(layout.parts.len());
        for p in &layout.parts {
            let b = bytes
                .get(p.start..p.start.saturating_add(p.len))
                .ok_or_else(|| {
                    bad(ExpertFault::OutsideExtent {
                        region: p.name.clone(),
                    })
                })?;
            // The index's shape is row-major (a GGUF tensor's `ne` reversed): `[rows, cols]` with
            // `cols` the row length (GGUF's ne[0]), a whole number of blocks for a quantised type.
            let (rows, cols) = match p.shape[..] {
                [r, c] => (r, c),
                [n] => (1, n),
                _ => {
                    return Err(bad(ExpertFault::Rank {
                        region: p.name.clone(),
                        shape: p.shape.clone(),
                    }))
                }
            };
            let data = WeightSlice::from_bytes(p.dtype, b).ok_or_else(|| {
                bad(if crate::quant::is_supported(p.dtype) {
                    ExpertFault::PartialBlock {
                        region: p.name.clone(),
                        dtype: p.dtype,
                        bytes: b.len(),
                    }
                } else {
                    ExpertFault::Unsupported {
                        region: p.name.clone(),
                        dtype: p.dtype,
                    }
                })
            })?;
            let (_, block_elems) = data.block_geometry();
            if rows.checked_mul(cols) != Some(data.len()) || cols % block_elems != 0 {
                return Err(bad(ExpertFault::ElementCount {
                    region: p.name.clone(),
                    dtype: p.dtype,
                    elems: data.len(),
                    shape: p.shape.clone(),
                    block_elems,
                }));
            }
            parts.push((
                p.role,
                MatrixRef {
                    name: &p.name,
                    rows,
                    cols,
                    data,
                },
            ));
        }
        Ok(ExpertView {
            layer: layout.layer,
            expert: layout.expert,
            parts,
            extent: bytes,
        })
    }

    /// The region of `role`.
    pub fn part(&self, role: Role) -> Option<MatrixRef<'a>> {
        self.parts.iter().find(|p| p.0 == role).map(|p| p.1)
    }

    /// The bytes every part lies in: the expert's extent, in its ring slot or cache entry.
    pub fn extent(&self) -> &'a [u8] {
        self.extent
    }

    /// Roles present, in file order.
    pub fn roles(&self) -> impl Iterator<Item = Role> + '_ {
        self.parts.iter().map(|p| p.0)
    }
}

/// An expert's extent copied out of its slot into RAM, 8-byte aligned (regions are 4096-aligned
/// within the extent, so every view stays aligned).
#[derive(Debug)]
struct CachedExpert {
    words: Vec<u64>,
    len: usize,
    last_use: u64,
}

impl CachedExpert {
    fn from_bytes(b: &[u8]) -> CachedExpert {
        let mut words = vec![0u64; b.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..b.len()].copy_from_slice(b);
        CachedExpert {
            words,
            len: b.len(),
            last_use: 0,
        }
    }

    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.words)[..self.len]
    }
}

/// Counters of where experts came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpertStats {
    /// Experts read from disk (and checked).
    pub reads: u64,
    /// Bytes of those reads (whole extents).
    pub bytes_read: u64,
    /// Selections served from RAM.
    pub cache_hits: u64,
    /// Selections that needed a read.
    pub cache_misses: u64,
    /// Weight bytes of every expert computed with (region bytes, padding excluded), wherever it
    /// came from: what a decode step touches in experts.
    pub bytes_used: u64,
}

/// How to hold experts.
#[derive(Clone, Debug, Default)]
pub struct ExpertOptions {
    /// Stream or all resident.
    pub mode: ExpertMode,
    /// RAM cache size for [`ExpertMode::Stream`], in bytes (0: no cache).
    pub cache_bytes: u64,
}

/// The decoder's experts: the source, the cache, the counters.
#[derive(Debug)]
pub struct ExpertStore {
    source: ExpertSource,
    layouts: HashMap<(u32, u32), Arc<ExpertLayout>>,
    cache: Cache,
    stats: ExpertStats,
}

/// The RAM cache: least recently used out first (ties: lowest key, so runs are reproducible).
#[derive(Debug)]
struct Cache {
    map: HashMap<(u32, u32), CachedExpert>,
    used: u64,
    cap: u64,
    tick: u64,
}

impl Cache {
    fn insert(&mut self, key: (u32, u32), mut c: CachedExpert) {
        let need = c.len as u64;
        if need > self.cap {
            return;
        }
        while self.used + need > self.cap {
            let Some((&victim, _)) = self.map.iter().min_by_key(|(k, v)| (v.last_use, **k)) else {
                return;
            };
            if let Some(v) = self.map.remove(&victim) {
                self.used -= v.len as u64;
            }
        }
        self.tick += 1;
        c.last_use = self.tick;
        self.used += need;
        self.map.insert(key, c);
    }
}

impl ExpertStore {
    /// Over an opened source. Resident mode reads every expert now.
    pub fn new(source: ExpertSource, opts: &ExpertOptions) -> Result<ExpertStore> {
        let layouts = layouts(source.model())?;
        let mut store = ExpertStore {
            source,
            layouts,
            cache: Cache {
                map: HashMap::new(),
                used: 0,
                cap: match opts.mode {
                    ExpertMode::Resident => u64::MAX,
                    ExpertMode::Stream => opts.cache_bytes,
                },
                tick: 0,
            },
            stats: ExpertStats::default(),
        };
        if opts.mode == ExpertMode::Resident {
            let need = store.total_bytes();
            if let Some(avail) = mem_available() {
                if need > avail {
                    return Err(DecodeError::Options(
                        crate::error::OptionsFault::ResidentTooLarge {
                            need,
                            available: avail,
                        },
                    ));
                }
            }
            let all = store.source.model().all();
            for chunk in all.chunks(4096) {
                for landed in store.source.prefetch(chunk)? {
                    let landed = landed?;
                    store.stats.reads += 1;
                    store.stats.bytes_read += landed.bytes().len() as u64;
                    let key = (landed.layer(), landed.expert());
                    store
                        .cache
                        .insert(key, CachedExpert::from_bytes(landed.bytes()));
                }
            }
        }
        Ok(store)
    }

    /// Bytes of all experts' extents.
    pub fn total_bytes(&self) -> u64 {
        self.layouts.values().map(|l| l.extent_len as u64).sum()
    }

    /// Bytes of the extents of `layer`'s experts.
    pub fn layer_bytes(&self, layer: u32) -> u64 {
        self.layouts
            .iter()
            .filter(|(k, _)| k.0 == layer)
            .map(|(_, l)| l.extent_len as u64)
            .sum()
    }

    /// Bytes held in RAM.
    pub fn cached_bytes(&self) -> u64 {
        self.cache.used
    }

    /// Counters so far.
    pub fn stats(&self) -> ExpertStats {
        self.stats
    }

    /// Every element type an expert region of this model has.
    pub fn region_dtypes(&self) -> std::collections::HashSet<Dtype> {
        self.layouts
            .values()
            .flat_map(|l| l.parts.iter().map(|p| p.dtype))
            .collect()
    }

    /// The experts of `layer`, by number.
    pub fn experts_of(&self, layer: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .layouts
            .keys()
            .filter(|k| k.0 == layer)
            .map(|k| k.1)
            .collect();
        v.sort_unstable();
        v
    }

    /// The source (for its report).
    pub fn source(&self) -> &ExpertSource {
        &self.source
    }

    /// Call `f` with every expert of `layer` in `experts` (each read at most once): first all
    /// the cached ones in one call, then the others as they land from disk, checked, one per call.
    /// `f`'s results must not depend on how experts are grouped or ordered (the decoder stores
    /// each expert's outputs by selection slot).
    pub fn with_experts(
        &mut self,
        layer: u32,
        experts: &[u32],
        mut f: impl FnMut(&[ExpertView<'_>]) -> Result<()>,
    ) -> Result<()> {
        let mut wanted: Vec<u32> = experts.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let mut missing = Vec::new();
        let mut hits = Vec::new();
        for &e in &wanted {
            if !self.layouts.contains_key(&(layer, e)) {
                return Err(DecodeError::BadExpert {
                    layer,
                    expert: e,
                    fault: ExpertFault::NotInModel,
                });
            }
            self.cache.tick += 1;
            if let Some(c) = self.cache.map.get_mut(&(layer, e)) {
                c.last_use = self.cache.tick;
                self.stats.cache_hits += 1;
                self.stats.bytes_used += self.layouts[&(layer, e)].data_len as u64;
                hits.push(e);
            } else {
                self.stats.cache_misses += 1;
                missing.push((layer, e));
            }
        }
        if !hits.is_empty() {
            let views = hits
                .iter()
                .map(|e| {
                    let key = (layer, *e);
                    ExpertView::new(&self.layouts[&key], self.cache.map[&key].bytes())
                })
                .collect::<Result<Vec<_>>>()?;
            f(&views)?;
        }
        if missing.is_empty() {
            return Ok(());
        }
        let prefetch = self.source.prefetch(&missing)?;
        for landed in prefetch {
            let landed = landed?;
            self.stats.reads += 1;
            self.stats.bytes_read += landed.bytes().len() as u64;
            let layout = Arc::clone(&self.layouts[&(landed.layer(), landed.expert())]);
            self.stats.bytes_used += layout.data_len as u64;
            f(&[ExpertView::new(&layout, landed.bytes())?])?;
            if self.cache.cap > 0 {
                let key = (landed.layer(), landed.expert());
                self.cache
                    .insert(key, CachedExpert::from_bytes(landed.bytes()));
            }
        }
        Ok(())
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (None where it cannot be read).
pub fn mem_available() -> Option<u64> {
    let text =
        tarfa_format::fsio::read_regular(std::path::Path::new("/proc/meminfo"), 1 << 20).ok()?;
    let text = String::from_utf8_lossy(&text);
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn layouts(model: &ModelExperts) -> Result<HashMap<(u32, u32), Arc<ExpertLayout>>> {
    let mut out = HashMap::with_capacity(model.len());
    for (layer, expert) in model.all() {
        let ext = model.get(layer, expert).expect("listed by all()");
        let reader = model.reader(ext.file);
        let mut parts = Vec::with_capacity(ext.regions.len());
        for span in &ext.regions {
            let rec = &reader.regions()[span.region as usize];
            let role = Role::from_code(span.role).ok_or(DecodeError::BadExpert {
                layer,
                expert,
                fault: ExpertFault::UnknownRole { code: span.role },
            })?;
            let dtype = rec.dtype().ok_or(DecodeError::BadExpert {
                layer,
                expert,
                fault: ExpertFault::UnknownDtype { code: rec.dtype },
            })?;
            // Refused here, when the store is built, not when the expert is first selected.
            if !crate::quant::is_supported(dtype) {
                return Err(DecodeError::BadExpert {
                    layer,
                    expert,
                    fault: ExpertFault::Unsupported {
                        region: reader.name(span.region).to_string(),
                        dtype,
                    },
                });
            }
            parts.push(ExpertPart {
                role,
                name: reader.name(span.region).to_string(),
                dtype,
                shape: rec.shape().iter().map(|&d| d as usize).collect(),
                start: span.start,
                len: span.len,
            });
        }
        let data_len = parts.iter().map(|p| p.len).sum();
        out.insert(
            (layer, expert),
            Arc::new(ExpertLayout {
                layer,
                expert,
                parts,
                extent_len: ext.len,
                data_len,
            }),
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantType;

    fn layout(dtype: Dtype, shape: Vec<usize>, len: usize) -> ExpertLayout {
        ExpertLayout {
            layer: 1,
            expert: 2,
            parts: vec![ExpertPart {
                role: Role::Gate,
                name: "blk.1.ffn_gate_exps.weight[2]".into(),
                dtype,
                shape,
                start: 0,
                len,
            }],
            extent_len: len,
            data_len: len,
        }
    }

    /// An F32 expert of `parts` (role, shape), laid out back to back.
    fn f32_layout(parts: &[(Role, Vec<usize>)]) -> ExpertLayout {
        let mut start = 0;
        let parts: Vec<ExpertPart> = parts
            .iter()
            .map(|(role, shape)| {
                let len = shape.iter().product::<usize>() * 4;
                let p = ExpertPart {
                    role: *role,
                    name: format!("e.{}", role.name()),
                    dtype: Dtype::F32,
                    shape: shape.clone(),
                    start,
                    len,
                };
                start += len;
                p
            })
            .collect();
        ExpertLayout {
            layer: 1,
            expert: 2,
            parts,
            extent_len: start,
            data_len: start,
        }
    }

    #[test]
    fn each_expert_fault_is_its_own_variant() {
        let fault = |parts: &[(Role, Vec<usize>)], bytes: usize, hidden: usize| {
            let l = f32_layout(parts);
            let bytes = vec![0u8; bytes];
            let e = ExpertView::new(&l, &bytes)
                .and_then(|v| crate::blocks::expert_projections(&v, hidden).map(drop))
                .expect_err("refused");
            match e {
                DecodeError::BadExpert {
                    layer: 1,
                    expert: 2,
                    fault,
                } => fault,
                e => panic!("expected BadExpert, got {e}"),
            }
        };
        let (g, u, d) = (Role::Gate, Role::Up, Role::Down);
        let gud = |gs: Vec<usize>, us: Vec<usize>, ds: Vec<usize>| vec![(g, gs), (u, us), (d, ds)];
        assert_eq!(
            fault(&[(g, vec![2, 4])], 16, 4),
            ExpertFault::OutsideExtent {
                region: "e.gate".into()
            }
        );
        assert_eq!(
            fault(&[(g, vec![1, 2, 4])], 32, 4),
            ExpertFault::Rank {
                region: "e.gate".into(),
                shape: vec![1, 2, 4]
            }
        );
        assert_eq!(
            fault(&[(g, vec![2, 4]), (Role::GateBias, vec![2])], 40, 4),
            ExpertFault::ForeignRole {
                role: Role::GateBias
            }
        );
        assert_eq!(
            fault(&[(g, vec![2, 4]), (u, vec![2, 4])], 64, 4),
            ExpertFault::NoDown
        );
        assert_eq!(
            fault(&[(g, vec![2, 4]), (d, vec![4, 2])], 64, 4),
            ExpertFault::NoGateUp
        );
        assert_eq!(
            fault(&gud(vec![2, 4], vec![2, 4], vec![4, 2]), 96, 3),
            ExpertFault::ShapesMisfit {
                gate: [2, 4],
                up: [2, 4],
                down: [4, 2],
                hidden: 3
            }
        );
        // The same expert fits a hidden size of 4.
        let l = f32_layout(&gud(vec![2, 4], vec![2, 4], vec![4, 2]));
        let bytes = vec![0u8; 96];
        let v = ExpertView::new(&l, &bytes).expect("view");
        assert!(crate::blocks::expert_projections(&v, 4).is_ok());
    }

    #[test]
    fn a_quantised_region_is_rows_of_whole_blocks_with_cols_the_gguf_row_length() {
        // The index's shape is GGUF's ne reversed: [rows, cols], cols = ne[0], the row length
        // that holds whole blocks. 3 rows of 512 Q4_K elements = 3 × 2 blocks of 144 bytes.
        let q4k = Dtype::from_name("Q4_K").expect("in the table");
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let bytes: Vec<u8> = (0..3 * 2 * 144)
            .map(|i| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Finite F16 scales (d, dmin at bytes 0..4 of each block): exponent bits < 0x7c.
                if i % 144 == 1 || i % 144 == 3 {
                    (rng as u8) & 0x3b
                } else {
                    rng as u8
                }
            })
            .collect();
        let l = layout(q4k, vec![3, 512], bytes.len());
        let v = ExpertView::new(&l, &bytes).expect("view");
        let m = v.part(Role::Gate).expect("gate");
        assert_eq!((m.rows, m.cols), (3, 512));
        let mut want = vec![0.0f32; 512];
        QuantType::Q4_K
            .dequantize(&bytes[288..576], &mut want)
            .expect("row 1");
        let row = m.row(1);
        for (i, w) in want.iter().enumerate() {
            assert_eq!(row.get(i).to_bits(), w.to_bits(), "row 1 element {i}");
        }
        // The same bytes with the dims the other way round ([512, 3]: GGUF's order, not
        // reversed) have rows of 3 elements, not whole blocks: refused, not mis-sliced.
        let l = layout(q4k, vec![512, 3], bytes.len());
        let e = ExpertView::new(&l, &bytes).expect_err("cols 3");
        assert!(
            matches!(
                &e,
                DecodeError::BadExpert {
                    fault: ExpertFault::ElementCount {
                        block_elems: 256,
                        ..
                    },
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("whole 256-element blocks"), "{e}");
        // Bytes that are not whole blocks, and a type this build does not compute with.
        let l = layout(q4k, vec![3, 512], bytes.len() - 1);
        let e = ExpertView::new(&l, &bytes).expect_err("short");
        assert!(
            matches!(
                &e,
                DecodeError::BadExpert {
                    fault: ExpertFault::PartialBlock { dtype, .. },
                    ..
                } if *dtype == q4k
            ),
            "{e}"
        );
        let iq = Dtype::from_name("IQ2_XXS").expect("in the table");
        let l = layout(iq, vec![3, 256], 3 * 66);
        let e = ExpertView::new(&l, &bytes).expect_err("IQ2_XXS");
        assert!(
            matches!(
                &e,
                DecodeError::BadExpert {
                    fault: ExpertFault::Unsupported { dtype, .. },
                    ..
                } if *dtype == iq
            ),
            "{e}"
        );
        let e = e.to_string();
        assert!(e.contains("IQ2_XXS") && e.contains("[2]"), "{e}");
    }

    #[test]
    fn available_memory_is_read_from_proc_meminfo() {
        let m = super::mem_available().expect("MemAvailable on Linux");
        assert!(m > 1 << 20, "{m} bytes");
    }
}
