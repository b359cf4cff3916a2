//! A heap buffer aligned to 4096 bytes, as `O_DIRECT` needs for the memory it reads into or
//! writes from. Safe code: a zeroed `Vec` one page longer than asked, viewed from its first
//! page-aligned byte (the `Vec` never grows, so its heap bytes never move).

use std::ops::{Deref, DerefMut};

use crate::layout::ALIGN;

/// `len` zero-initialised bytes at an address that is a multiple of 4096.
#[derive(Debug)]
pub struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// Allocate `len` bytes (rounded up to a multiple of 4096, at least 4096), zeroed.
    pub fn new(len: usize) -> AlignedBuf {
        let page = ALIGN as usize;
        let len = len.max(1).div_ceil(page) * page;
        let total = match len.checked_add(page) {
            Some(t) => t,
            None => panic!("aligned buffer of {len} bytes overflows the address space"),
        };
        let bytes = vec![0u8; total];
        // align_offset on a u8 pointer to a power of two always succeeds, and is < page.
        let start = bytes.as_ptr().align_offset(page);
        AlignedBuf { bytes, start, len }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
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
