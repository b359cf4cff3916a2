//! Every file tarfa reads by name is opened here: only a regular file, opened without blocking
//! and checked by `fstat` on the descriptor read from, and whole-file reads bounded by a limit
//! the caller states.
//!
//! A FIFO where a shard, a manifest or a tokenizer should be would block `open(2)` forever; a
//! link to `/dev/zero` would read until memory runs out; a directory or a socket is no input at
//! all. So a path is first looked at with `stat` (a device is never opened), then opened with
//! `O_NONBLOCK` (a FIFO swapped in since cannot block) and `fstat`ed, and `O_NONBLOCK` is cleared
//! again: io_uring would otherwise answer a read of the file with `EAGAIN`.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// The path names something other than a regular file (links followed).
    #[error("{}: {kind}, not a regular file", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is: `"a FIFO"`, `"a character device"`, `"a directory"`, ...
        kind: &'static str,
    },
    /// The file holds more than the caller's limit.
    #[error("{}: more than {limit} bytes, the limit for this file", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// The limit, bytes.
        limit: u64,
    },
    /// An I/O call failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl FsError {
    /// Whether the file does not exist (the `stat` or `open` said `ENOENT`).
    pub fn is_not_found(&self) -> bool {
        matches!(self, FsError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// The path the error names.
    pub fn path(&self) -> &Path {
        match self {
            FsError::NotRegular { path, .. }
            | FsError::TooLarge { path, .. }
            | FsError::Io { path, .. } => path,
        }
    }
}

/// For APIs that speak `std::io::Error`: the kind says which case, the message names the path.
impl From<FsError> for std::io::Error {
    fn from(e: FsError) -> std::io::Error {
        let kind = match &e {
            FsError::NotRegular { .. } => std::io::ErrorKind::InvalidInput,
            FsError::TooLarge { .. } => std::io::ErrorKind::FileTooLarge,
            FsError::Io { source, .. } => source.kind(),
        };
        std::io::Error::new(kind, e)
    }
}

/// What a file type is in words (`"a FIFO"`, `"a directory"`, ...), or `None` for a regular file.
pub(crate) fn kind_of(t: std::fs::FileType) -> Option<&'static str> {
    Some(if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    })
}

/// A regular file open for reading, with its length at open.
#[derive(Debug)]
pub struct RegularFile {
    /// The open file (blocking mode, as an ordinary `File::open` gives).
    pub file: File,
    /// Its length when opened (`fstat`).
    pub len: u64,
}

/// Open `path` for reading if it is a regular file (links followed), never blocking on a FIFO.
pub fn open_regular(path: &Path) -> Result<RegularFile, FsError> {
    open_regular_with(path, 0)
}

/// [`open_regular`] with extra `open(2)` flags, e.g. `libc::O_DIRECT`.
pub fn open_regular_with(path: &Path, flags: i32) -> Result<RegularFile, FsError> {
    let io = |op: &'static str| {
        move |source: std::io::Error| FsError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    let not_regular = |kind| FsError::NotRegular {
        path: path.to_path_buf(),
        kind,
    };
    // Looked at before opening: opening a device can have effects of its own. (Part of
    // opening, so its failure is told as one: `open: No such file or directory`.)
    let meta = std::fs::metadata(path).map_err(io("open"))?;
    if let Some(kind) = kind_of(meta.file_type()) {
        return Err(not_regular(kind));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io("open"))?;
    // What was opened, not what the name pointed at a moment ago.
    let meta = file.metadata().map_err(io("stat"))?;
    if let Some(kind) = kind_of(meta.file_type()) {
        return Err(not_regular(kind));
    }
    let fl = rustix::fs::fcntl_getfl(&file).map_err(|e| io("fcntl")(e.into()))?;
    rustix::fs::fcntl_setfl(&file, fl - rustix::fs::OFlags::NONBLOCK)
        .map_err(|e| io("fcntl")(e.into()))?;
    Ok(RegularFile {
        file,
        len: meta.len(),
    })
}

/// All of the regular file `path`, refused if it holds more than `limit` bytes. At most
/// `limit + 1` bytes are read whatever its size said at open: a file may grow while read.
pub fn read_regular(path: &Path, limit: u64) -> Result<Vec<u8>, FsError> {
    let f = open_regular(path)?;
    if f.len > limit {
        return Err(FsError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(f.len as usize);
    f.file
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|source| FsError::Io {
            path: path.to_path_buf(),
            op: "read",
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(FsError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(bytes)
}

/// [`read_regular`], with `Ok(None)` when nothing is at `path`.
pub fn read_regular_if_exists(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, FsError> {
    match read_regular(path, limit) {
        Err(e) if e.is_not_found() => Ok(None),
        other => other.map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let ok = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mkfifo {}", path.display());
    }

    #[test]
    fn anything_but_a_regular_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        for (path, kind) in [
            (&fifo, "a FIFO"),
            (&zero, "a character device"),
            (&sock, "a socket"),
            (&dir.path().to_path_buf(), "a directory"),
        ] {
            match read_regular(path, 1 << 20) {
                Err(FsError::NotRegular { path: p, kind: k }) => {
                    assert_eq!((&p, k), (path, kind));
                }
                other => panic!("{}: {other:?}", path.display()),
            }
            assert!(matches!(
                open_regular(path),
                Err(FsError::NotRegular { .. })
            ));
        }
    }

    #[test]
    fn a_read_stops_at_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, [7u8; 100]).expect("write");
        assert_eq!(read_regular(&p, 100).expect("read").len(), 100);
        assert!(matches!(
            read_regular(&p, 99),
            Err(FsError::TooLarge { limit: 99, .. })
        ));
        assert!(read_regular_if_exists(&dir.path().join("none"), 9)
            .expect("absent is not an error")
            .is_none());
    }

    #[test]
    fn the_file_returned_is_in_blocking_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").expect("write");
        let f = open_regular(&p).expect("open");
        let fl = rustix::fs::fcntl_getfl(&f.file).expect("getfl");
        assert!(!fl.contains(rustix::fs::OFlags::NONBLOCK));
        assert_eq!(f.len, 1);
    }
}
