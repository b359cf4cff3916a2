//! Stand-in for `gpu.rs` when tarfa-cuda is built without the `driver` feature: the same names,
//! and every way in says at run time that CUDA is absent (as candle's dummy backend does).

use std::convert::Infallible;

use crate::CudaError;

/// Whether this build has CUDA support compiled in.
pub const CUDA_BUILT: bool = false;

const NOT_BUILT: &str =
    "tarfa was built without CUDA (the `cuda` feature); rebuild with `--features cuda`";

/// One CUDA device: none can be opened in this build.
#[derive(Clone, Debug)]
pub struct Gpu(Infallible);

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

    /// Free and total VRAM in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        match self.0 {}
    }

    /// This build only: no `Gpu` exists, so whatever holds one is unreachable
    /// (`match *gpu.never() {}`).
    pub fn never(&self) -> &Infallible {
        &self.0
    }
}
