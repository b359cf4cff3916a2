//! A heap buffer aligned to 4096 bytes, as `O_DIRECT` needs for the memory it reads into or
//! writes from. The only unsafe code of this crate is here.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use crate::layout::ALIGN;

/// `len` zero-initialised bytes at an address that is a multiple of 4096.
#[derive(Debug)]
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads, like &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocate `len` bytes (rounded up to a multiple of 4096, at least 4096), zeroed.
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.max(1).div_ceil(ALIGN as usize) * ALIGN as usize;
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    fn layout(len: usize) -> Layout {
        match Layout::from_size_align(len, ALIGN as usize) {
            Ok(l) => l,
            Err(_) => panic!("aligned buffer of {len} bytes overflows the address space"),
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_is_page_aligned_zeroed_and_rounded_up() {
        let b = AlignedBuf::new(5000);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        assert_eq!(b.len(), 8192);
        assert!(b.iter().all(|&x| x == 0));
    }
}
