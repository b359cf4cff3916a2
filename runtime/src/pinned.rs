//! Every line of unsafe code in this crate: the pinned slot memory, and the two points where it
//! is handed to the kernel (io_uring reads; nothing else writes into a slot but safe slices).
//!
//! The ownership rule that makes the rest safe: a slot is always owned by exactly one of
//! - the free list of its [`PinnedRing`],
//! - a [`SlotWrite`] (exclusive, writable; the CPU or the kernel may be filling it),
//! - a [`LandedSlot`] (filled; read-only, shareable),
//! - an [`InGpuCopy`] (feature `cuda`: a GPU copy engine may still be reading it; the host may
//!   neither write nor free it).
//!
//! While the kernel may write a slot, its [`SlotWrite`] sits in [`UringReads`]' in-flight table
//! and is handed back only when the completion for it has been reaped; dropping [`UringReads`]
//! first waits for every read it started. A slot returns to the free list only when the token
//! holding it is dropped, so it is never reused while the kernel may still touch it.
//!
//! With the `cuda` feature, a [`LandedSlot`] handed to a GPU copy becomes an [`InGpuCopy`]: it
//! leaves that state only through [`InGpuCopy::release`], whose contract is that the copy's
//! completion was observed (its event completed, or its stream was synchronised). Dropping an
//! `InGpuCopy` without that proof leaks the slot, and with it the ring's mapping and its CUDA
//! registration, rather than let a copy engine read memory that is being rewritten or unmapped.
//! The CUDA calls themselves (registration, copies) are in the sibling module `device_sink`.

#![allow(unsafe_code)]

use std::fmt;
use std::io;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

/// Slot alignment and granule: `O_DIRECT` needs 4096-aligned memory, offsets and lengths.
pub const SLOT_ALIGN: usize = 4096;

/// Whether the ring's pages are locked in RAM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinState {
    /// `mlock` succeeded: the pages cannot be swapped out.
    Locked,
    /// `mlock` was refused; the ring still works, pageable.
    Unlocked {
        /// Why (`EPERM`, `ENOMEM` with the `RLIMIT_MEMLOCK` in force).
        reason: String,
    },
    /// Locking was not asked for.
    NotRequested,
}

/// `slots` buffers of `slot_len` bytes each, 4096-aligned, in one anonymous mapping.
pub struct PinnedRing {
    base: NonNull<u8>,
    map_len: usize,
    slot_len: usize,
    slots: u32,
    pin: PinState,
    free: Mutex<Vec<u32>>,
    /// The mapping's `cuMemHostRegister`, once asked for; undone before the unmap.
    #[cfg(feature = "cuda")]
    cuda_registration: Mutex<Option<crate::device_sink::HostRegistration>>,
}

impl fmt::Debug for PinnedRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedRing")
            .field("slots", &self.slots)
            .field("slot_len", &self.slot_len)
            .field("pin", &self.pin)
            .field("free", &self.free_count())
            .finish()
    }
}

// SAFETY: the mapping is plain memory owned by the ring; access to each slot's bytes is governed
// by the token that owns the slot (see the module docs), and the free list is behind a mutex.
unsafe impl Send for PinnedRing {}
// SAFETY: as above; shared references only read ring metadata or take the mutex.
unsafe impl Sync for PinnedRing {}

impl PinnedRing {
    /// Map `slots` × `slot_len` bytes (`slot_len` rounded up to 4096) and, if `lock`, `mlock`
    /// them (a refusal is reported in [`Self::pin_state`], not an error).
    pub fn new(slots: u32, slot_len: usize, lock: bool) -> io::Result<Arc<PinnedRing>> {
        if slots == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a ring needs at least one slot",
            ));
        }
        let slot_len = slot_len.max(1).div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let map_len = slot_len.checked_mul(slots as usize).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "ring size overflows usize")
        })?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choice; no existing
        // memory is affected. Anonymous mappings are page-aligned (4096 on every Linux target
        // we build for) and zero-filled.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        if base.as_ptr() as usize % SLOT_ALIGN != 0 {
            // SAFETY: unmapping exactly the mapping made above, which nothing else refers to.
            unsafe { libc::munmap(raw, map_len) };
            return Err(io::Error::other(
                "mmap returned memory that is not 4096-aligned",
            ));
        }
        // Transparent huge pages where the kernel allows them: a 2 MiB page is one DMA segment,
        // so a multi-MiB O_DIRECT read needs far fewer segments (and block requests) than with
        // 4 KiB pages. Only advice: ignoring the result is correct.
        // SAFETY: madvise on a range we own; MADV_HUGEPAGE never changes contents.
        unsafe { libc::madvise(raw, map_len, libc::MADV_HUGEPAGE) };
        let pin = if lock {
            // SAFETY: mlock on a range we own; it only changes residency, never contents.
            if unsafe { libc::mlock(raw, map_len) } == 0 {
                PinState::Locked
            } else {
                let e = io::Error::last_os_error();
                let mut lim = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                // SAFETY: getrlimit writes into the struct we pass.
                let limit = if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0 {
                    format!(" (RLIMIT_MEMLOCK {} bytes)", lim.rlim_cur)
                } else {
                    String::new()
                };
                PinState::Unlocked {
                    reason: format!("mlock of {map_len} bytes refused: {e}{limit}"),
                }
            }
        } else {
            PinState::NotRequested
        };
        Ok(Arc::new(PinnedRing {
            base,
            map_len,
            slot_len,
            slots,
            pin,
            free: Mutex::new((0..slots).rev().collect()),
            #[cfg(feature = "cuda")]
            cuda_registration: Mutex::new(None),
        }))
    }

    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes per slot (a multiple of 4096).
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Whether the pages are locked.
    pub fn pin_state(&self) -> &PinState {
        &self.pin
    }

    /// Slots on the free list (neither being filled nor lent out).
    pub fn free_count(&self) -> usize {
        self.free_list().len()
    }

    /// Take a free slot for writing, if any.
    pub fn try_claim(self: &Arc<Self>) -> Option<SlotWrite> {
        let index = self.free_list().pop()?;
        Some(SlotWrite(RingSlot {
            ring: Arc::clone(self),
            index,
        }))
    }

    fn free_list(&self) -> MutexGuard<'_, Vec<u32>> {
        // A panic while holding this lock cannot leave the Vec half-updated (push/pop only).
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn slot_ptr(&self, index: u32) -> *mut u8 {
        debug_assert!(index < self.slots);
        // In bounds: index < slots, so the offset is below map_len.
        self.base
            .as_ptr()
            .wrapping_add(index as usize * self.slot_len)
    }

    /// The whole mapping: its first byte and its length.
    #[cfg(feature = "cuda")]
    pub(crate) fn mapping(&self) -> (*mut u8, usize) {
        (self.base.as_ptr(), self.map_len)
    }

    /// Register the mapping with CUDA (once; later calls with the same context are no-ops).
    /// The registration lives as long as the ring and is undone before the unmap.
    #[cfg(feature = "cuda")]
    pub(crate) fn register_cuda(
        &self,
        ctx: &Arc<cudarc::driver::CudaContext>,
    ) -> Result<(), tarfa_cuda::CudaError> {
        let mut reg = self
            .cuda_registration
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(r) = reg.as_ref() {
            return if r.context() == ctx {
                Ok(())
            } else {
                Err(tarfa_cuda::CudaError::Usage(
                    "the ring is registered with another CUDA context".into(),
                ))
            };
        }
        // SAFETY: [base, base + map_len) is this ring's own mapping; it stays mapped until
        // Drop, which drops the registration first.
        *reg = Some(unsafe {
            crate::device_sink::HostRegistration::new(ctx, self.base.as_ptr(), self.map_len)
        }?);
        Ok(())
    }

    /// Whether the mapping is registered with CUDA (never, in a build without the feature).
    pub fn cuda_registered(&self) -> bool {
        #[cfg(feature = "cuda")]
        let registered = self
            .cuda_registration
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        #[cfg(not(feature = "cuda"))]
        let registered = false;
        registered
    }

    fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.slots)
            .map(|i| libc::iovec {
                iov_base: self.slot_ptr(i).cast(),
                iov_len: self.slot_len,
            })
            .collect()
    }
}

impl Drop for PinnedRing {
    fn drop(&mut self) {
        // Every token holds an Arc to the ring, so none is left; io_uring registrations hold one
        // too (UringReads keeps an Arc), so the kernel is done with the memory. A slot whose GPU
        // copy was not seen to finish is leaked with its Arc, so no copy can be in flight either.
        #[cfg(feature = "cuda")]
        drop(
            self.cuda_registration
                .get_mut()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        // SAFETY: unmapping the mapping made in new(); no reference into it survives.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
    }
}

/// Ownership of one slot; returns it to the free list when dropped.
struct RingSlot {
    ring: Arc<PinnedRing>,
    index: u32,
}

impl Drop for RingSlot {
    fn drop(&mut self) {
        self.ring.free_list().push(self.index);
    }
}

/// Exclusive ownership of one slot, for filling it.
pub struct SlotWrite(RingSlot);

impl fmt::Debug for SlotWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlotWrite({})", self.0.index)
    }
}

impl SlotWrite {
    /// The slot's number in its ring (its registered-buffer index).
    pub fn index(&self) -> u32 {
        self.0.index
    }

    /// Bytes the slot holds.
    pub fn capacity(&self) -> usize {
        self.0.ring.slot_len
    }

    /// The whole slot, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let ring = &self.0.ring;
        // SAFETY: this token is the slot's only owner (module rule), so no other reference to
        // these bytes exists, and the kernel is not writing them: a SlotWrite inside an
        // in-flight table is not reachable by its caller. The range lies inside the mapping.
        unsafe { std::slice::from_raw_parts_mut(ring.slot_ptr(self.0.index), ring.slot_len) }
    }

    /// The slot is filled: its first `len` bytes become readable, shared.
    pub fn land(self, len: usize) -> LandedSlot {
        let SlotWrite(slot) = self;
        LandedSlot {
            len: len.min(slot.ring.slot_len),
            slot,
        }
    }
}

/// A filled slot: `len` bytes, read-only. Dropping it frees the slot.
pub struct LandedSlot {
    slot: RingSlot,
    len: usize,
}

impl fmt::Debug for LandedSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LandedSlot({}, {} bytes)", self.slot.index, self.len)
    }
}

impl LandedSlot {
    /// The slot's number in its ring.
    pub fn index(&self) -> u32 {
        self.slot.index
    }
}

#[cfg(feature = "cuda")]
impl LandedSlot {
    /// Whether the slot belongs to `ring`.
    pub(crate) fn is_of(&self, ring: &Arc<PinnedRing>) -> bool {
        Arc::ptr_eq(&self.slot.ring, ring)
    }

    /// Hand the slot to a GPU copy: from now on the host neither writes nor frees it until
    /// [`InGpuCopy::release`].
    pub(crate) fn into_gpu_copy(self) -> InGpuCopy {
        let LandedSlot { slot, len } = self;
        InGpuCopy {
            slot: Some(slot),
            len,
        }
    }
}

/// A landed slot that a GPU copy engine may still be reading (see the module docs). Dropping it
/// without [`Self::release`] leaks the slot (and so keeps the ring mapped and registered).
#[cfg(feature = "cuda")]
pub struct InGpuCopy {
    slot: Option<RingSlot>,
    len: usize,
}

#[cfg(feature = "cuda")]
impl fmt::Debug for InGpuCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let index = self.slot.as_ref().map(|s| s.index);
        write!(f, "InGpuCopy({index:?}, {} bytes)", self.len)
    }
}

#[cfg(feature = "cuda")]
impl InGpuCopy {
    /// The slot's number in its ring.
    pub(crate) fn index(&self) -> u32 {
        self.slot.as_ref().map_or(u32::MAX, |s| s.index)
    }

    /// Where the slot's bytes are, and how many were landed: the source of the copy. Valid while
    /// this token lives (the slot is neither written nor freed meanwhile).
    pub(crate) fn host_ptr(&self) -> (*const u8, usize) {
        match &self.slot {
            Some(s) => (s.ring.slot_ptr(s.index).cast_const(), self.len),
            None => (std::ptr::null(), 0),
        }
    }

    /// Return the slot to its ring's free list.
    ///
    /// # Safety
    /// Every GPU operation that reads the slot has completed: the caller observed the
    /// completion of an event recorded after the last copy from it on its stream, or
    /// synchronised that stream (or the context), after enqueueing that copy.
    pub(crate) unsafe fn release(mut self) {
        drop(self.slot.take());
    }
}

#[cfg(feature = "cuda")]
impl Drop for InGpuCopy {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            // Completion never observed: the copy engine may still read the slot. Leak it, and
            // with it an Arc of the ring, so the memory is neither reused nor unmapped.
            std::mem::forget(slot);
        }
    }
}

impl Deref for LandedSlot {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: a LandedSlot is made only from a SlotWrite, i.e. after any read into the slot
        // completed; nothing can write the slot until this token is dropped. len <= slot_len.
        unsafe { std::slice::from_raw_parts(self.slot.ring.slot_ptr(self.slot.index), self.len) }
    }
}

#[cfg(target_os = "linux")]
pub use uring::UringReads;

#[cfg(target_os = "linux")]
mod uring {
    use super::*;
    use io_uring::{cqueue, opcode, squeue, types, IoUring};
    use std::os::fd::RawFd;

    /// Most buffers one ring may register (`IORING_MAX_REG_BUFFERS`, older kernels: 1 << 14).
    const MAX_REG_BUFFERS: u32 = 1 << 14;
    /// Most bytes per registered buffer.
    const MAX_REG_BUFFER_LEN: usize = 1 << 30;

    struct InFlight {
        slot: SlotWrite,
        tag: usize,
        file: u32,
        offset: u64,
        len: usize,
        done: usize,
    }

    /// An io_uring with the layer files registered, and the ring's slots registered as fixed
    /// buffers when the kernel allows. Reads are `READ_FIXED` (or `READ`) of whole extents.
    pub struct UringReads {
        // Field order is drop order: the io_uring (and its buffer registration) goes before the
        // Arc that keeps the slot memory mapped.
        uring: IoUring,
        pinned: Arc<PinnedRing>,
        fixed_buffers: bool,
        in_flight: Vec<Option<InFlight>>,
        count: usize,
        unsubmitted: usize,
        broken: bool,
        /// Test hook: the next continuation of a short read fails as if the submission had.
        #[cfg(test)]
        fail_resubmit: bool,
    }

    impl fmt::Debug for UringReads {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("UringReads")
                .field("entries", &self.uring.params().sq_entries())
                .field("fixed_buffers", &self.fixed_buffers)
                .field("in_flight", &self.count)
                .finish()
        }
    }

    impl UringReads {
        /// A ring of at least `queue_depth` entries over `files` (O_DIRECT descriptors that must
        /// stay open as long as this value) and the slots of `pinned`. `want_fixed`: register
        /// the slots as fixed buffers; if the kernel refuses, plain reads are used and
        /// [`Self::fixed_buffers`] says so.
        pub fn new(
            queue_depth: u32,
            files: &[RawFd],
            pinned: &Arc<PinnedRing>,
            want_fixed: bool,
        ) -> io::Result<UringReads> {
            let entries = queue_depth.clamp(1, 1 << 15).next_power_of_two();
            let uring: IoUring = IoUring::builder().build(entries)?;
            let mut probe = io_uring::Probe::new();
            uring.submitter().register_probe(&mut probe)?;
            for (code, name) in [
                (opcode::ReadFixed::CODE, "READ_FIXED"),
                (opcode::Read::CODE, "READ"),
            ] {
                if !probe.is_supported(code) {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("io_uring lacks IORING_OP_{name}"),
                    ));
                }
            }
            uring.submitter().register_files(files)?;
            let mut fixed_buffers = false;
            if want_fixed
                && pinned.slots() <= MAX_REG_BUFFERS
                && pinned.slot_len() <= MAX_REG_BUFFER_LEN
            {
                let iov = pinned.iovecs();
                // SAFETY: each iovec spans one slot of `pinned`'s mapping, which stays mapped
                // while this UringReads lives (it holds an Arc, dropped after the io_uring that
                // holds the registration).
                fixed_buffers = unsafe { uring.submitter().register_buffers(&iov) }.is_ok();
            }
            Ok(UringReads {
                uring,
                pinned: Arc::clone(pinned),
                fixed_buffers,
                in_flight: (0..pinned.slots()).map(|_| None).collect(),
                count: 0,
                unsubmitted: 0,
                broken: false,
                #[cfg(test)]
                fail_resubmit: false,
            })
        }

        /// Whether reads use registered (fixed) buffers.
        pub fn fixed_buffers(&self) -> bool {
            self.fixed_buffers
        }

        /// Submission queue entries.
        pub fn entries(&self) -> u32 {
            self.uring.params().sq_entries()
        }

        /// Reads started and not yet reaped.
        pub fn in_flight(&self) -> usize {
            self.count
        }

        /// Queue a read of `len` bytes at `offset` of registered file `file` into `slot`; it is
        /// pushed to the kernel by [`Self::submit`] or [`Self::reap`] (batched submission).
        pub fn start(
            &mut self,
            slot: SlotWrite,
            tag: usize,
            file: u32,
            offset: u64,
            len: usize,
        ) -> io::Result<()> {
            if self.broken {
                return Err(io::Error::other("io_uring failed earlier"));
            }
            if len > self.pinned.slot_len() || len > u32::MAX as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("read of {len} bytes does not fit a slot"),
                ));
            }
            if !Arc::ptr_eq(&slot.0.ring, &self.pinned) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "slot from another ring",
                ));
            }
            let index = slot.index();
            let entry = InFlight {
                slot,
                tag,
                file,
                offset,
                len,
                done: 0,
            };
            self.push(&entry)?;
            self.in_flight[index as usize] = Some(entry);
            self.count += 1;
            self.debug_check_count();
            Ok(())
        }

        /// `count` is the number of occupied in-flight entries: `Drop` waits for `count`
        /// completions, so one counted but not in flight would make it wait forever.
        fn debug_check_count(&self) {
            debug_assert_eq!(
                self.count,
                self.in_flight.iter().filter(|r| r.is_some()).count(),
                "reads counted in flight differ from the in-flight table"
            );
        }

        fn sqe(&self, r: &InFlight) -> squeue::Entry {
            let index = r.slot.index();
            let buf = self.pinned.slot_ptr(index).wrapping_add(r.done);
            let len = (r.len - r.done) as u32;
            let fd = types::Fixed(r.file);
            let at = r.offset + r.done as u64;
            let e = if self.fixed_buffers {
                opcode::ReadFixed::new(fd, buf, len, index as u16)
                    .offset(at)
                    .build()
            } else {
                opcode::Read::new(fd, buf, len).offset(at).build()
            };
            e.user_data(u64::from(index))
        }

        fn push(&mut self, r: &InFlight) -> io::Result<()> {
            let sqe = self.sqe(r);
            loop {
                // SAFETY: the entry's buffer is the slot owned by `r.slot`, which is (or is about
                // to be, before any completion can be reaped) kept in the in-flight table until
                // its completion is reaped, so the memory stays valid and unaliased while the
                // kernel writes it; the file index refers to a registered descriptor.
                let pushed = unsafe { self.uring.submission().push(&sqe) };
                if pushed.is_ok() {
                    self.unsubmitted += 1;
                    return Ok(());
                }
                // Queue full: hand what is queued to the kernel and retry.
                self.submit()?;
            }
        }

        /// Queue the rest of a short read (`push`, or the test hook's failure).
        fn resubmit(&mut self, r: &InFlight) -> io::Result<()> {
            #[cfg(test)]
            if std::mem::take(&mut self.fail_resubmit) {
                return Err(io::Error::other(
                    "injected: resubmitting a short read failed",
                ));
            }
            self.push(r)
        }

        /// Hand queued entries to the kernel in one system call.
        pub fn submit(&mut self) -> io::Result<()> {
            if self.unsubmitted == 0 {
                return Ok(());
            }
            loop {
                match self.uring.submit() {
                    Ok(_) => {
                        self.unsubmitted = 0;
                        return Ok(());
                    }
                    Err(e) if retryable(&e) => continue,
                    Err(e) => {
                        self.broken = true;
                        return Err(e);
                    }
                }
            }
        }

        /// Wait until at least `min` reads have finished (0: do not wait), submitting what is
        /// queued; push each finished read (its slot, tag and outcome) to `done`. A short read
        /// is continued where it stopped; a read that returns 0 bytes is an unexpected EOF.
        pub fn reap(
            &mut self,
            min: usize,
            done: &mut Vec<(usize, SlotWrite, io::Result<()>)>,
        ) -> io::Result<()> {
            let target = done.len() + min.min(self.count);
            loop {
                let want = usize::from(done.len() < target);
                let r = if want > 0 || self.unsubmitted > 0 {
                    self.uring.submit_and_wait(want)
                } else {
                    Ok(0)
                };
                match r {
                    Ok(_) => self.unsubmitted = 0,
                    Err(e) if retryable(&e) => {}
                    Err(e) => {
                        self.broken = true;
                        return Err(e);
                    }
                }
                // Every collected completion is accounted for before an error is returned:
                // one dropped here would stay counted in flight with nothing left to reap.
                let cqes: Vec<cqueue::Entry> = self.uring.completion().collect();
                let mut first_err = None;
                for c in cqes {
                    if let Err(e) = self.complete(c, done) {
                        first_err.get_or_insert(e);
                    }
                }
                self.debug_check_count();
                if let Some(e) = first_err {
                    return Err(e);
                }
                if done.len() >= target {
                    return Ok(());
                }
            }
        }

        fn complete(
            &mut self,
            c: cqueue::Entry,
            done: &mut Vec<(usize, SlotWrite, io::Result<()>)>,
        ) -> io::Result<()> {
            let index = c.user_data() as usize;
            let Some(mut r) = self.in_flight.get_mut(index).and_then(Option::take) else {
                self.broken = true;
                return Err(io::Error::other(format!(
                    "io_uring completion for unknown slot {index}"
                )));
            };
            let res = c.result();
            let outcome = if res < 0 {
                Err(io::Error::from_raw_os_error(-res))
            } else if res == 0 {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("end of file after {} of {} bytes", r.done, r.len),
                ))
            } else {
                r.done += res as usize;
                if r.done < r.len {
                    // Short read: continue from where it stopped, same slot. If the continuation
                    // cannot be queued, nothing is in flight for the slot: the read finishes
                    // with that error (and is uncounted) rather than wait forever.
                    match self.resubmit(&r) {
                        Ok(()) => {
                            self.in_flight[index] = Some(r);
                            return Ok(());
                        }
                        Err(e) => Err(e),
                    }
                } else {
                    Ok(())
                }
            };
            self.count -= 1;
            done.push((r.tag, r.slot, outcome));
            Ok(())
        }
    }

    fn retryable(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN))
    }

    impl Drop for UringReads {
        fn drop(&mut self) {
            // The kernel may still be writing slots of reads not reaped: wait for all of them
            // before their SlotWrites (and so the slots) are released.
            let mut sink = Vec::new();
            while self.count > 0 {
                if self.reap(1, &mut sink).is_err() {
                    // Cannot tell whether the kernel is done: leak the in-flight slots (and the
                    // ring memory with them) rather than let them be reused.
                    for r in self.in_flight.iter_mut().filter_map(Option::take) {
                        std::mem::forget(r.slot);
                    }
                    std::mem::forget(Arc::clone(&self.pinned));
                    return;
                }
                sink.clear();
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use std::os::fd::AsRawFd;
        use std::time::Duration;

        #[test]
        fn a_short_read_whose_continuation_fails_ends_with_its_error_and_drop_returns() {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("short");
            std::fs::write(&path, vec![7u8; 4096]).expect("write");
            let file = std::fs::File::open(&path).expect("open");
            let ring = PinnedRing::new(2, 8192, false).expect("ring");
            let reads =
                UringReads::new(4, &[file.as_raw_fd()], &ring, true).map_err(|e| e.to_string());
            let Some(mut reads) = tarfa_testtools::available(tarfa_testtools::Tool::IoUring, reads)
            else {
                return;
            };
            reads.fail_resubmit = true;
            let slot = ring.try_claim().expect("a free slot");
            // 8192 bytes of a 4096-byte file: the first completion is a short read.
            reads.start(slot, 7, 0, 0, 8192).expect("start");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let mut done = Vec::new();
                let reaped = reads.reap(1, &mut done).map_err(|e| e.to_string());
                let left = reads.in_flight();
                drop(reads); // waits for every read counted in flight
                let done: Vec<_> = done
                    .into_iter()
                    .map(|(tag, _, r)| (tag, r.map_err(|e| e.to_string())))
                    .collect();
                let _ = tx.send((reaped, left, done));
            });
            let (reaped, left, done) = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("reap and drop return (a read counted in flight with none queued hangs)");
            assert_eq!(reaped, Ok(()));
            assert_eq!(left, 0);
            assert_eq!(done.len(), 1, "{done:?}");
            assert_eq!(done[0].0, 7);
            let e = done[0].1.as_ref().expect_err("the read failed");
            assert!(e.contains("injected"), "{e}");
            assert_eq!(ring.free_count(), 2, "the slot is free again");
        }
    }
}
