//! Where GGUF bytes come from. The reader only ever asks for a byte range, so the same parser
//! serves a local file (pread) and, later, an HTTP server answering range requests.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A fixed-length sequence of bytes readable at any offset.
pub trait ByteSource: Send + Sync {
    /// Total length in bytes.
    fn len(&self) -> u64;
    /// Fill `buf` with the bytes at `offset..offset + buf.len()`; an error if any lies past
    /// [`ByteSource::len`].
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// A name for messages: a path or a URL.
    fn name(&self) -> String;
    /// True when the source holds no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A local file read with `pread`; its length is taken once, at open.
#[derive(Debug)]
pub struct FileSource {
    file: File,
    len: u64,
    path: PathBuf,
}

impl FileSource {
    /// Open `path` for reading: a regular file only (a FIFO or a device is refused, naming it).
    pub fn open(path: &Path) -> Result<FileSource, tarfa_format::fsio::FsError> {
        let tarfa_format::fsio::RegularFile { file, len } = tarfa_format::fsio::open_regular(path)?;
        Ok(FileSource {
            file,
            len,
            path: path.to_path_buf(),
        })
    }

    /// The path this source reads.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ByteSource for FileSource {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        self.file.read_exact_at(buf, offset)
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }
}

/// Bytes held in memory: for tests, the fuzzer, and headers already fetched.
#[derive(Debug, Clone)]
pub struct MemSource {
    bytes: Vec<u8>,
    name: String,
}

impl MemSource {
    /// Wrap `bytes`, calling them `name` in messages.
    pub fn new(name: impl Into<String>, bytes: Vec<u8>) -> MemSource {
        MemSource {
            bytes,
            name: name.into(),
        }
    }
}

impl ByteSource for MemSource {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(offset, buf.len(), self.len())?;
        // check_range proved offset + buf.len() <= len, so both fit in usize.
        let start = usize::try_from(offset).map_err(|_| past_end())?;
        buf.copy_from_slice(&self.bytes[start..start + buf.len()]);
        Ok(())
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

fn past_end() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "read past the end of the source",
    )
}

fn check_range(offset: u64, len: usize, total: u64) -> io::Result<()> {
    let end = offset.checked_add(len as u64).ok_or_else(past_end)?;
    if end > total {
        return Err(past_end());
    }
    Ok(())
}
