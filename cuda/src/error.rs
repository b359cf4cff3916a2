//! The CUDA crate's one error type: the device's (absent, a driver call) and the engine's (a head
//! too wide for its kernels, a ring `TARFA_CUDA_TILE` names that they cannot take). One
//! definition for both builds: the driver's variant exists only with the `driver` feature.

/// What went wrong on the GPU side: CUDA absent, a driver call, a model or a switch the kernels
/// cannot take, or the API used against its rules.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No CUDA here: the build lacks the feature, the driver library is missing, or there is no
    /// device. Said in words, never a panic.
    #[error("CUDA is absent: {0}")]
    Absent(String),
    /// A driver call failed.
    #[cfg(feature = "driver")]
    #[error("CUDA {op} failed: {source}")]
    Driver {
        /// What was being done.
        op: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// A model whose attention heads are wider than the whole-model GPU decoder's kernels take
    /// (their shared memory holds [`crate::MAX_HEAD_DIM`] floats a head): a limit of
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
    /// or the device cannot take ([`crate::TileGeometry`]).
    #[error("TARFA_CUDA_TILE={value}: {why}; it takes STAGES,STAGE_BYTES (2..=16 stages, each a multiple of 2048 bytes in 6144..=65536, the ring within the device's shared memory), e.g. 6,16384, or unset for 4,8192")]
    BadTileGeometry {
        /// The value given.
        value: String,
        /// Why it is refused.
        why: String,
    },
    /// The API was used against its rules (a slot of another ring, a busy ring).
    #[error("{0}")]
    Usage(String),
}

/// The driver's error of `op`, as a [`CudaError`].
#[cfg(feature = "driver")]
pub fn drv(op: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    move |source| CudaError::Driver { op, source }
}
