//! The read-only file map of the `mmap` comparison backend: the one unsafe call of this crate
//! outside `pinned` and `cuda`.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;

/// Map `file` read-only, whole.
///
/// Why this is sound for us: the map is never written through, and JNF files are published once
/// (temp + rename) and never written in place. The remaining hazard is the one of every file
/// map: if another process truncates the file while it is mapped, touching the lost pages
/// raises SIGBUS instead of returning an error. The `mmap` backend is a comparison backend only;
/// the default backends read with `pread`/io_uring and see a short read as an error.
pub(crate) fn map_read_only(file: &File) -> io::Result<memmap2::Mmap> {
    // SAFETY: see above; the map's bytes are only read as `&[u8]`.
    unsafe { memmap2::Mmap::map(file) }
}
