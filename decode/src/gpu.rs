//! Routed experts on the GPU (feature `cuda`): [`GpuExperts`] computes an expert's SwiGLU with
//! tarfa-cuda's [`GpuCompute`] kernels (the canonical order on a warp), keeping experts in a VRAM
//! cache of a chosen size (least recently used out first; size 0 copies each expert for each
//! use). BF16 and F32 experts only: a quantised expert stays on the CPU. No unsafe here.

use std::collections::HashMap;

use tarfa_cuda::offload::{DeviceBytes, ExpertJob, GpuCompute, GpuMatrix};
use tarfa_cuda::Gpu;
use tarfa_cuda::GpuDtype;
use tarfa_format::Role;

use crate::blocks::{self, Batch};
use crate::error::{DecodeError, ExpertFault, Result};
use crate::experts::ExpertView;
use crate::offload::{placed, ExpertOffload, GpuOptions, OffloadReport};
use crate::weights::{MatrixRef, WeightSlice};

/// VRAM left free when the cache size is not given.
const VRAM_MARGIN: u64 = 1 << 30;

/// (host address, bytes, rows, cols, element type) of a trunk matrix.
type TrunkKey = (usize, usize, usize, usize, GpuDtype);

#[derive(Debug)]
struct Entry {
    bytes: DeviceBytes,
    gate: GpuMatrix,
    up: GpuMatrix,
    down: GpuMatrix,
    last_use: u64,
}

/// Experts computed on one GPU.
#[derive(Debug)]
pub struct GpuExperts {
    gpu: Gpu,
    compute: GpuCompute,
    cache: HashMap<(u32, u32), Entry>,
    used: u64,
    cap: u64,
    clock: u64,
    fraction: f64,
    report: OffloadReport,
    /// Trunk and layer matrices, resident once uploaded, by the address, size, shape and type of
    /// their host bytes (the decoder's `TensorStore` owns them, unmoved, for its whole life;
    /// matrices given to [`ExpertOffload::linear`] must outlive this offload).
    trunk: HashMap<TrunkKey, (DeviceBytes, GpuMatrix)>,
    trunk_on: bool,
}

impl GpuExperts {
    /// Open GPU `o.ordinal`, compile the kernels, size the cache.
    pub fn open(o: &GpuOptions) -> Result<GpuExperts> {
        let gpu = Gpu::open(o.ordinal)?;
        let compute = GpuCompute::new(&gpu)?;
        let cap = match o.vram_bytes {
            Some(b) => b,
            None => (compute.mem_info()?.0 as u64).saturating_sub(VRAM_MARGIN),
        };
        let report = OffloadReport {
            device: format!("{} (CUDA device {})", compute.name(), o.ordinal),
            cache_bytes: cap,
            ..OffloadReport::default()
        };
        Ok(GpuExperts {
            gpu,
            compute,
            cache: HashMap::new(),
            used: 0,
            cap,
            clock: 0,
            fraction: o.fraction,
            report,
            trunk: HashMap::new(),
            trunk_on: o.trunk,
        })
    }

    /// The resident copy of trunk matrix `m` (uploaded on first use), or `None` if it runs on
    /// the CPU: a quantised type, an empty matrix, the trunk kept on the CPU, or no room left in
    /// VRAM for it (the bits are the same either way).
    fn trunk_matrix(&mut self, m: &MatrixRef<'_>) -> Option<TrunkKey> {
        let dtype = gpu_dtype(m)?;
        if !self.trunk_on || m.rows == 0 || m.cols == 0 {
            return None;
        }
        let bytes = raw(m);
        let key = (bytes.as_ptr() as usize, bytes.len(), m.rows, m.cols, dtype);
        if !self.trunk.contains_key(&key) {
            let free = self.compute.mem_info().map_or(0, |(free, _)| free as u64);
            if free < bytes.len() as u64 + VRAM_MARGIN {
                self.report.trunk_on_cpu += 1;
                return None;
            }
            let Ok(up) = self.compute.upload(bytes) else {
                self.report.trunk_on_cpu += 1;
                return None;
            };
            self.report.trunk_bytes += bytes.len() as u64;
            // Resident trunk bytes come out of the expert cache's share of VRAM.
            self.cap = self.cap.saturating_sub(bytes.len() as u64);
            self.evict_for(0, &[]);
            let gm = GpuMatrix {
                offset: 0,
                rows: m.rows,
                cols: m.cols,
                dtype,
            };
            self.trunk.insert(key, (up, gm));
        }
        Some(key)
    }

    /// Make room for `need` bytes, least recently used first, never evicting `keep`; whether it
    /// fits now.
    fn evict_for(&mut self, need: u64, keep: &[(u32, u32)]) -> bool {
        while self.used + need > self.cap {
            let Some((&key, _)) = self
                .cache
                .iter()
                .filter(|(k, _)| !keep.contains(k))
                .min_by_key(|(_, e)| e.last_use)
            else {
                return false;
            };
            if let Some(e) = self.cache.remove(&key) {
                self.used -= e.bytes.len() as u64;
            }
        }
        true
    }

    /// Copy expert `e`'s gate, up and down into one VRAM buffer.
    fn upload(&mut self, e: &ExpertView<'_>, hidden: usize) -> Result<Entry> {
        let (gate, up, down) = blocks::expert_projections(e, hidden)?;
        let (Some(gd), Some(ud), Some(dd)) = (gpu_dtype(&gate), gpu_dtype(&up), gpu_dtype(&down))
        else {
            return Err(DecodeError::BadExpert {
                layer: e.layer,
                expert: e.expert,
                fault: ExpertFault::QuantisedOnGpu,
            });
        };
        if gd != ud {
            return Err(DecodeError::BadExpert {
                layer: e.layer,
                expert: e.expert,
                fault: ExpertFault::MixedGateUpOnGpu,
            });
        }
        // The extent as it landed, in one copy (from the ring slot: pinned memory once
        // `register_ring` took): each matrix at its offset in it, aligned for its element type.
        let extent = e.extent();
        let place = |m: &MatrixRef<'_>, dtype: GpuDtype| -> Result<GpuMatrix> {
            let b = raw(m);
            (b.as_ptr() as usize)
                .checked_sub(extent.as_ptr() as usize)
                .filter(|&o| o % dtype.block().1 == 0)
                .filter(|&o| {
                    o.checked_add(b.len())
                        .is_some_and(|end| end <= extent.len())
                })
                .map(|offset| GpuMatrix {
                    offset,
                    rows: m.rows,
                    cols: m.cols,
                    dtype,
                })
                .ok_or_else(|| DecodeError::BadExpert {
                    layer: e.layer,
                    expert: e.expert,
                    fault: ExpertFault::OutsideExtent {
                        region: m.name.to_string(),
                    },
                })
        };
        let (g, u, d) = (place(&gate, gd)?, place(&up, ud)?, place(&down, dd)?);
        let bytes = self.compute.upload(extent)?;
        self.report.uploads += 1;
        self.report.upload_bytes += extent.len() as u64;
        Ok(Entry {
            bytes,
            gate: g,
            up: u,
            down: d,
            last_use: self.clock,
        })
    }
}

fn gpu_dtype(m: &MatrixRef<'_>) -> Option<GpuDtype> {
    match m.data {
        WeightSlice::Bf16(_) => Some(GpuDtype::Bf16),
        WeightSlice::F32(_) => Some(GpuDtype::F32),
        _ => None,
    }
}

fn raw<'a>(m: &MatrixRef<'a>) -> &'a [u8] {
    match m.data {
        WeightSlice::Bf16(w) => bytemuck::cast_slice(w),
        WeightSlice::F32(w) => bytemuck::cast_slice(w),
        _ => &[],
    }
}

impl ExpertOffload for GpuExperts {
    fn takes(&self, e: &ExpertView<'_>) -> bool {
        let dt = |r: Role| e.part(r).map(|m| gpu_dtype(&m));
        // Every part BF16 or F32, and gate and up of one type (the kernel reads both as one).
        placed(e.layer, e.expert, self.fraction)
            && [Role::Gate, Role::Up, Role::Down, Role::GateUp]
                .iter()
                .filter_map(|&r| e.part(r))
                .all(|m| gpu_dtype(&m).is_some())
            && dt(Role::Gate) == dt(Role::Up)
    }

    fn swiglu_many(
        &mut self,
        items: &[(&ExpertView<'_>, &[Vec<f32>])],
        hidden: usize,
        limit: Option<f32>,
    ) -> Result<Vec<Batch>> {
        // Every expert of the call in VRAM: cached (kept for later), or, when the cache cannot
        // hold it, uploaded for this call only. The call's own experts are never evicted by it.
        let keys: Vec<(u32, u32)> = items.iter().map(|(e, _)| (e.layer, e.expert)).collect();
        let mut temps: HashMap<(u32, u32), Entry> = HashMap::new();
        for (e, _) in items {
            let key = (e.layer, e.expert);
            self.clock += 1;
            self.report.computed += 1;
            if let Some(entry) = self.cache.get_mut(&key) {
                entry.last_use = self.clock;
                self.report.vram_hits += 1;
                continue;
            }
            if temps.contains_key(&key) {
                continue;
            }
            let entry = self.upload(e, hidden)?;
            let size = entry.bytes.len() as u64;
            if self.evict_for(size, &keys) {
                self.used += size;
                self.cache.insert(key, entry);
            } else {
                temps.insert(key, entry);
            }
        }
        self.report.cached_bytes = self.used;
        let refs: Vec<Vec<&[f32]>> = items
            .iter()
            .map(|(_, xs)| xs.iter().map(|x| x.as_slice()).collect())
            .collect();
        let jobs: Vec<ExpertJob<'_>> = keys
            .iter()
            .zip(&refs)
            .map(|(k, xs)| {
                let e = self
                    .cache
                    .get(k)
                    .or_else(|| temps.get(k))
                    .expect("uploaded above");
                ExpertJob {
                    weights: &e.bytes,
                    gate: e.gate,
                    up: e.up,
                    down: e.down,
                    xs,
                }
            })
            .collect();
        // One call per run of same-shaped experts (a layer's experts all share one shape).
        let mut out = Vec::with_capacity(jobs.len());
        let mut i = 0;
        while i < jobs.len() {
            let shape = |j: &ExpertJob<'_>| (j.gate, j.down.rows, j.down.dtype);
            let same = |j: &ExpertJob<'_>| {
                let (a, b) = (shape(j), shape(&jobs[i]));
                (a.0.rows, a.0.cols, a.0.dtype, a.1, a.2)
                    == (b.0.rows, b.0.cols, b.0.dtype, b.1, b.2)
            };
            let n = jobs[i..].iter().take_while(|j| same(j)).count().max(1);
            out.extend(self.compute.swiglu_many(&jobs[i..i + n], limit)?);
            i += n;
        }
        Ok(out)
    }

    fn linear(&mut self, w: &MatrixRef<'_>, xs: &[Vec<f32>]) -> Option<Result<Batch>> {
        let key = self.trunk_matrix(w)?;
        let (b, m) = &self.trunk[&key];
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        self.report.trunk_products += 1;
        Some(self.compute.matmul(b, m, &refs).map_err(Into::into))
    }

    fn swiglu_dense(
        &mut self,
        gate: &MatrixRef<'_>,
        up: &MatrixRef<'_>,
        down: &MatrixRef<'_>,
        xs: &[Vec<f32>],
        limit: Option<f32>,
    ) -> Option<Result<Batch>> {
        if gpu_dtype(up)? != gpu_dtype(gate)? {
            return None;
        }
        let mut keys = Vec::with_capacity(3);
        for m in [gate, up, down] {
            keys.push(self.trunk_matrix(m)?);
        }
        let p = |k: &TrunkKey| {
            let (b, m) = &self.trunk[k];
            (b, m)
        };
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        self.report.trunk_products += 3;
        Some(
            self.compute
                .swiglu(p(&keys[0]), p(&keys[1]), p(&keys[2]), &refs, limit)
                .map_err(Into::into),
        )
    }

    fn use_ring(&mut self, ring: &tarfa_runtime::PinnedRing) {
        self.report.ring_registered = tarfa_runtime::register_ring(&self.gpu, ring).is_ok();
    }

    fn report(&self) -> OffloadReport {
        OffloadReport {
            cached_bytes: self.used,
            cache_bytes: self.cap,
            ..self.report.clone()
        }
    }
}
