//! One CUDA device ([`Gpu`], its primary context), opened or said absent.
//!
//! libcuda is loaded when first needed (cudarc's `dynamic-loading`): a build with the feature
//! runs on a machine without the NVIDIA driver or without a GPU, and [`Gpu::open`] answers
//! [`CudaError::Absent`] there instead of failing to start or panicking. Without the `driver`
//! feature `gpu_absent.rs` stands in with the same names.

#![allow(unsafe_code)]

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext};

use crate::error::drv;
use crate::CudaError;

/// Whether this build has CUDA support compiled in.
pub const CUDA_BUILT: bool = true;

/// One CUDA device (its primary context).
#[derive(Clone)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    name: String,
}

impl fmt::Debug for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpu")
            .field("ordinal", &self.ctx.ordinal())
            .field("name", &self.name)
            .finish()
    }
}

impl Gpu {
    /// Open device `ordinal`, or say why CUDA is absent.
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        // SAFETY: only tries to dlopen libcuda under its usual names; no other precondition.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::Absent(
                "the NVIDIA driver library (libcuda.so) was not found; install the driver, or run without the GPU".into(),
            ));
        }
        result::init().map_err(|e| CudaError::Absent(format!("cuInit failed: {e}")))?;
        let count = result::device::get_count()
            .map_err(|e| CudaError::Absent(format!("cannot count CUDA devices: {e}")))?;
        if count <= 0 {
            return Err(CudaError::Absent("no CUDA device is visible".into()));
        }
        if ordinal >= count as usize {
            return Err(CudaError::Absent(format!(
                "CUDA device {ordinal} asked for, {count} visible"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("context creation"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        Ok(Gpu { ctx, name })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its driver context (the runtime registers its expert ring with it and copies landed
    /// experts on it).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's number.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Free and total VRAM in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        self.ctx.mem_get_info().map_err(drv("memory query"))
    }
}
