//! Stand-in for the `cuda` module when tarfa is built without the `cuda` feature: the same names,
//! and every way in says at run time that CUDA is absent (as candle's dummy backend does). A
//! [`DeviceSink`] cannot exist in this build, so its methods are never reached.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::pinned::{LandedSlot, PinnedRing};
use crate::prefetch::LandedExpert;

/// Whether this build has CUDA support compiled in.
pub const CUDA_BUILT: bool = false;

const NOT_BUILT: &str =
    "tarfa was built without CUDA (the `cuda` feature); rebuild with `--features cuda`";

/// What went wrong on the GPU side.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No CUDA here: this build lacks the feature.
    #[error("CUDA is absent: {0}")]
    Absent(String),
    /// A model whose attention heads are wider than the whole-model GPU decoder's kernels take
    /// (their shared memory holds [`crate::gpu_engine::MAX_HEAD_DIM`] floats a head): a limit of
    /// this path, not a caller's mistake (the decoder leaves such a model to the offload path
    /// before it builds an engine).
    #[error("head_dim {head_dim} is above the {max} the GPU decoder's attention kernels take; run with --gpu-offload-only (attention on the CPU) or --device cpu")]
    HeadDimTooLarge {
        /// The model's head dimension.
        head_dim: usize,
        /// The kernels' limit.
        max: usize,
    },
    /// `TARFA_CUDA_TILE` (the ring of the tiled products, a measuring knob) names one the kernels
    /// or the device cannot take ([`crate::gpu_engine::TileGeometry`]).
    #[error("TARFA_CUDA_TILE={value}: {why}; it takes STAGES,STAGE_BYTES (2..=16 stages, each a multiple of 2048 bytes in 6144..=65536, the ring within the device's shared memory), e.g. 6,16384, or unset for 4,8192")]
    BadTileGeometry {
        /// The value given.
        value: String,
        /// Why it is refused.
        why: String,
    },
    /// The API was used against its rules.
    #[error("{0}")]
    Usage(String),
}

#[derive(Clone, Copy, Debug)]
enum Never {}

/// One CUDA device: none can be opened in this build.
#[derive(Clone, Debug)]
pub struct Gpu(Never);

impl Gpu {
    /// Always [`CudaError::Absent`]: built without CUDA.
    pub fn open(_ordinal: usize) -> Result<Gpu, CudaError> {
        Err(CudaError::Absent(NOT_BUILT.into()))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        match self.0 {}
    }

    /// The device's number.
    pub fn ordinal(&self) -> usize {
        match self.0 {}
    }
}

/// The pure host-to-device rate of a registered ring.
#[derive(Clone, Copy, Debug)]
pub struct H2dFigures {
    /// Bytes copied.
    pub bytes: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl H2dFigures {
    /// Decimal gigabytes per second.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// Copies landed slots to the GPU: none can be made in this build.
pub struct DeviceSink(Never);

impl fmt::Debug for DeviceSink {
    fn fmt(&self, _f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {}
    }
}

impl DeviceSink {
    /// Unreachable: no [`Gpu`] exists in this build.
    pub fn new(
        gpu: &Gpu,
        _ring: &Arc<PinnedRing>,
        _max_in_flight: usize,
    ) -> Result<DeviceSink, CudaError> {
        match gpu.0 {}
    }

    /// Copies started and not yet seen complete.
    pub fn in_flight(&self) -> usize {
        match self.0 {}
    }

    /// Copies started in all, and their bytes.
    pub fn copied(&self) -> (u64, u64) {
        match self.0 {}
    }

    /// Copy a checked expert to the device.
    pub fn copy_expert(&mut self, _x: LandedExpert) -> Result<(), CudaError> {
        match self.0 {}
    }

    /// Copy a landed slot to the device.
    pub fn copy(&mut self, _slot: LandedSlot) -> Result<(), CudaError> {
        match self.0 {}
    }

    /// Release the slots of completed copies.
    pub fn poll(&mut self) -> Result<usize, CudaError> {
        match self.0 {}
    }

    /// Wait for every copy started.
    pub fn finish(&mut self) -> Result<(), CudaError> {
        match self.0 {}
    }

    /// Read back a slot's device copy.
    pub fn read_back(&mut self, _slot: u32, _len: usize) -> Result<Vec<u8>, CudaError> {
        match self.0 {}
    }

    /// The pure host-to-device rate of the ring.
    pub fn bench_h2d(&mut self, _repeats: usize) -> Result<H2dFigures, CudaError> {
        match self.0 {}
    }
}
