//! Stand-in for `device_sink.rs` when the runtime is built without the `cuda` feature: the same
//! names. No [`Gpu`] can be opened in this build (tarfa-cuda says CUDA is absent), so a
//! [`DeviceSink`] cannot exist and its methods are never reached.

use std::fmt;
use std::sync::Arc;

use tarfa_cuda::{CudaError, Gpu};

use crate::pinned::{LandedSlot, PinnedRing};
use crate::prefetch::LandedExpert;
use crate::H2dFigures;

/// Page-lock and register `ring` with `gpu`: unreachable, no [`Gpu`] exists in this build.
pub fn register_ring(gpu: &Gpu, _ring: &PinnedRing) -> Result<(), CudaError> {
    match *gpu.never() {}
}

/// Copies landed slots to the GPU: none can be made in this build.
pub struct DeviceSink(std::convert::Infallible);

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
        match *gpu.never() {}
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
