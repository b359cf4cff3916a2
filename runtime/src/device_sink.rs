//! Host-to-device copies of landed experts (feature `cuda`): the ring registered with the driver
//! of a [`Gpu`] (tarfa-cuda's device), and each landed, checked expert copied on to the GPU on
//! its own stream. With the feature off, `device_sink_absent.rs` stands in with the same names;
//! no [`Gpu`] can be opened there.
//!
//! The unsafe code here, and the contracts it keeps:
//! - `HostRegistration`: `cuMemHostRegister_v2` of the ring's anonymous mapping (flags
//!   `PORTABLE`; not write-combined, so CPU reads for BLAKE3 stay fast), undone by
//!   `cuMemHostUnregister` before the ring unmaps it (the ring drops the registration first).
//!   The mapping stays anonymous, so io_uring may register the same pages as fixed buffers.
//! - [`DeviceSink::copy`]: `cuMemcpyHtoDAsync_v2` from a slot into device memory. The slot is
//!   first turned into an `InGpuCopy`, which nothing can write or free; an event recorded
//!   after the copy is kept with it, and only once that event is seen complete (or the stream
//!   synchronised) is the slot released to the ring. Errors never release a slot whose copy
//!   may be in flight: it is leaked instead.
//! - `DeviceBuffer`: `cuMemAlloc_v2`/`cuMemFree_v2`; a buffer that a copy may still write when
//!   its sink is dropped (the stream could not be synchronised) is leaked, not freed.

#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use tarfa_cuda::{drv, CudaError, Gpu};

use crate::pinned::{InGpuCopy, LandedSlot, PinnedRing};
use crate::prefetch::LandedExpert;
use crate::H2dFigures;

/// Page-lock `ring` and register it with `gpu`'s context (once; again is a no-op), so that copies
/// from its slots to VRAM are DMA from pinned memory instead of a staged copy of pageable memory.
/// The registration lives as long as the ring.
pub fn register_ring(gpu: &Gpu, ring: &PinnedRing) -> Result<(), CudaError> {
    ring.register_cuda(gpu.context())
}

/// `cuMemHostRegister_v2` of one host range; unregisters when dropped.
pub(crate) struct HostRegistration {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
}

// SAFETY: the value only holds the range's address, to unregister it; CUDA registrations are
// process-wide and may be undone from any thread once the context is bound.
unsafe impl Send for HostRegistration {}
// SAFETY: as above; a shared reference exposes only the context.
unsafe impl Sync for HostRegistration {}

impl fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostRegistration({:p})", self.ptr)
    }
}

impl HostRegistration {
    /// Page-lock and register `[ptr, ptr + len)` with the driver for `ctx`.
    ///
    /// # Safety
    /// The range is one mapping owned by the caller that stays mapped until this value is
    /// dropped; it was not registered before.
    pub(crate) unsafe fn new(
        ctx: &Arc<CudaContext>,
        ptr: *mut u8,
        len: usize,
    ) -> Result<HostRegistration, CudaError> {
        ctx.bind_to_thread().map_err(drv("context bind"))?;
        // PORTABLE: pinned for every context. Never WRITECOMBINED (CPU reads must stay cached).
        // SAFETY: the caller's contract: a live mapping of `len` bytes, registered once.
        unsafe {
            sys::cuMemHostRegister_v2(ptr.cast::<c_void>(), len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        }
        .result()
        .map_err(drv("cuMemHostRegister of the expert ring"))?;
        Ok(HostRegistration {
            ctx: Arc::clone(ctx),
            ptr,
        })
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        // The ring drops this only when no slot token (and so no copy) remains; see pinned.rs.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` is the start of a range registered by new() and not yet unregistered.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast::<c_void>()) };
        }
    }
}

/// Device memory from `cuMemAlloc_v2`.
struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    len: usize,
    /// A copy into it may still run: never free it.
    leak: bool,
}

impl DeviceBuffer {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<DeviceBuffer, CudaError> {
        ctx.bind_to_thread().map_err(drv("context bind"))?;
        // SAFETY: a plain allocation of `len` bytes in the bound context.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }.map_err(drv("cuMemAlloc"))?;
        Ok(DeviceBuffer {
            ctx: Arc::clone(ctx),
            ptr,
            len,
            leak: false,
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if !self.leak && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by new(), freed once; the sink synchronised its stream first.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// Copies landed slots of one ring into a device buffer the size of the ring (slot `i` to
/// offset `i × slot_len`), asynchronously on its own stream, and gives each slot back to the
/// ring only after its copy's event completed. See the module docs.
pub struct DeviceSink {
    // Drop: the body synchronises the stream and releases or leaks the slots; then the fields go.
    in_flight: VecDeque<(InGpuCopy, CudaEvent)>,
    spare: Vec<CudaEvent>,
    stream: Arc<CudaStream>,
    buf: DeviceBuffer,
    ring: Arc<PinnedRing>,
    gpu: Gpu,
    max_in_flight: usize,
    copies: u64,
    bytes: u64,
}

impl fmt::Debug for DeviceSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceSink")
            .field("gpu", &self.gpu)
            .field("device_bytes", &self.buf.len)
            .field("in_flight", &self.in_flight.len())
            .field("copies", &self.copies)
            .finish()
    }
}

impl DeviceSink {
    /// Register `ring` with `gpu` (once per ring), allocate a device buffer of the ring's size,
    /// and make a stream. At most `max_in_flight` copies (≥ 1) hold slots at once: a further
    /// copy first waits for the oldest, so the reader keeps slots to read into.
    pub fn new(
        gpu: &Gpu,
        ring: &Arc<PinnedRing>,
        max_in_flight: usize,
    ) -> Result<DeviceSink, CudaError> {
        ring.register_cuda(gpu.context())?;
        let (_, map_len) = ring.mapping();
        let buf = DeviceBuffer::new(gpu.context(), map_len)?;
        let stream = gpu.context().new_stream().map_err(drv("stream creation"))?;
        Ok(DeviceSink {
            in_flight: VecDeque::new(),
            spare: Vec::new(),
            stream,
            buf,
            ring: Arc::clone(ring),
            gpu: gpu.clone(),
            max_in_flight: max_in_flight.max(1),
            copies: 0,
            bytes: 0,
        })
    }

    /// Copies started and not yet seen complete (their slots are held).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Copies started in all, and their bytes.
    pub fn copied(&self) -> (u64, u64) {
        (self.copies, self.bytes)
    }

    /// Copy a checked expert to the device (offset `slot × slot_len`); its slot is held until
    /// the copy completes.
    pub fn copy_expert(&mut self, x: LandedExpert) -> Result<(), CudaError> {
        self.copy(x.into_slot())
    }

    /// Copy a landed slot to the device at offset `slot × slot_len`; the slot is held until the
    /// copy completes (see [`Self::poll`], [`Self::finish`]).
    pub fn copy(&mut self, slot: LandedSlot) -> Result<(), CudaError> {
        if !slot.is_of(&self.ring) {
            return Err(CudaError::Usage("slot from another ring".into()));
        }
        while self.in_flight.len() >= self.max_in_flight {
            self.wait_oldest()?;
        }
        self.poll()?;
        let event = match self.spare.pop() {
            Some(e) => e,
            None => self
                .gpu
                .context()
                .new_event(None)
                .map_err(drv("event creation"))?,
        };
        let copy = slot.into_gpu_copy();
        let (src, len) = copy.host_ptr();
        let dst = self.buf.ptr + (copy.index() as u64) * self.ring.slot_len() as u64;
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(drv("context bind"))?;
        // SAFETY: the source is the slot owned by `copy`, `len` ≤ slot_len bytes inside the
        // registered ring, neither written nor freed until `copy` is released after this copy's
        // event completes (or leaked); the destination lies inside `buf` (offset index ×
        // slot_len + len ≤ map_len), which outlives the copy (the sink synchronises before it
        // frees it, or leaks it).
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.stream.cu_stream()) }
            .result();
        if let Err(e) = r {
            // `copy` dropped unreleased: the slot is leaked, never reused.
            drop(copy);
            return Err(CudaError::Driver {
                op: "cuMemcpyHtoDAsync",
                source: e,
            });
        }
        if let Err(e) = event.record(&self.stream) {
            // Without an event, only a synchronised stream proves the copy done.
            if self.stream.synchronize().is_ok() {
                // SAFETY: the stream was synchronised after the copy was enqueued.
                unsafe { copy.release() };
            }
            return Err(CudaError::Driver {
                op: "cuEventRecord",
                source: e,
            });
        }
        self.copies += 1;
        self.bytes += len as u64;
        self.in_flight.push_back((copy, event));
        Ok(())
    }

    /// Release the slots of copies that have completed (in stream order); returns how many.
    pub fn poll(&mut self) -> Result<usize, CudaError> {
        let mut n = 0;
        while let Some((_, event)) = self.in_flight.front() {
            if !event.try_is_complete().map_err(drv("cuEventQuery"))? {
                break;
            }
            self.release_front();
            n += 1;
        }
        Ok(n)
    }

    fn release_front(&mut self) {
        if let Some((copy, event)) = self.in_flight.pop_front() {
            // SAFETY: called only after the event recorded after this copy was seen complete
            // (poll, wait_oldest) or the stream was synchronised (finish).
            unsafe { copy.release() };
            self.spare.push(event);
        }
    }

    fn wait_oldest(&mut self) -> Result<(), CudaError> {
        if let Some((_, event)) = self.in_flight.front() {
            event.synchronize().map_err(drv("cuEventSynchronize"))?;
            self.release_front();
        }
        Ok(())
    }

    /// Wait for every copy started and release their slots.
    pub fn finish(&mut self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        while !self.in_flight.is_empty() {
            self.release_front();
        }
        Ok(())
    }

    /// Read back `len` bytes of the device copy of slot `slot` (after [`Self::finish`]): for
    /// tests that the bytes on the GPU are the bytes that landed.
    pub fn read_back(&mut self, slot: u32, len: usize) -> Result<Vec<u8>, CudaError> {
        if slot >= self.ring.slots() || len > self.ring.slot_len() {
            return Err(CudaError::Usage(format!(
                "slot {slot} / {len} bytes is outside the ring"
            )));
        }
        self.finish()?;
        let mut out = vec![0u8; len];
        let src = self.buf.ptr + u64::from(slot) * self.ring.slot_len() as u64;
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(drv("context bind"))?;
        // SAFETY: synchronous copy of `len` bytes from inside `buf` (checked above) into `out`.
        unsafe { result::memcpy_dtoh_sync(&mut out, src) }.map_err(drv("cuMemcpyDtoH"))?;
        Ok(out)
    }

    /// The pure host-to-device rate of the registered ring: copy the whole ring `repeats`
    /// times. Every slot must be free (it claims them all for the duration).
    pub fn bench_h2d(&mut self, repeats: usize) -> Result<H2dFigures, CudaError> {
        self.finish()?;
        let mut held = Vec::with_capacity(self.ring.slots() as usize);
        while let Some(w) = self.ring.try_claim() {
            let len = w.capacity();
            held.push(w.land(len).into_gpu_copy());
        }
        if held.len() != self.ring.slots() as usize {
            for h in held {
                // SAFETY: no copy from these slots was enqueued.
                unsafe { h.release() };
            }
            return Err(CudaError::Usage(
                "bench_h2d needs every ring slot free".into(),
            ));
        }
        let (base, map_len) = self.ring.mapping();
        self.gpu
            .context()
            .bind_to_thread()
            .map_err(drv("context bind"))?;
        let t0 = Instant::now();
        let mut outcome = Ok(());
        for _ in 0..repeats.max(1) {
            // SAFETY: the whole mapping is the source; every slot of it is held in `held` (no
            // one writes or frees it) until the stream is synchronised below; the destination
            // is `buf`, of the mapping's size.
            let r = unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    self.buf.ptr,
                    base.cast_const().cast(),
                    map_len,
                    self.stream.cu_stream(),
                )
            }
            .result();
            if let Err(e) = r {
                outcome = Err(CudaError::Driver {
                    op: "cuMemcpyHtoDAsync",
                    source: e,
                });
                break;
            }
        }
        let synced = self.stream.synchronize();
        let elapsed = t0.elapsed();
        if synced.is_ok() {
            for h in held {
                // SAFETY: the stream was synchronised after every copy from these slots.
                unsafe { h.release() };
            }
        }
        // (Otherwise `held` drops unreleased: the slots are leaked, never reused.)
        synced.map_err(drv("cuStreamSynchronize"))?;
        outcome?;
        Ok(H2dFigures {
            bytes: map_len as u64 * repeats.max(1) as u64,
            elapsed,
        })
    }
}

impl Drop for DeviceSink {
    fn drop(&mut self) {
        if self.finish().is_err() {
            // The copies may still run: leak their slots (dropping InGpuCopy unreleased does)
            // and the device buffer they write.
            self.in_flight.clear();
            self.buf.leak = true;
        }
    }
}
