//! Atomic publishing (§7): write beside the destination under a temporary name, fsync the file,
//! rename it into place, fsync the directory. A crash at any moment leaves either the old file or
//! the complete new one under the final name, never a partial file that looks complete.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// A file being written under a temporary name; removed on drop unless published.
#[derive(Debug)]
pub struct PendingFile {
    tmp: PathBuf,
    dest: PathBuf,
    file: File,
    published: bool,
    direct: bool,
}

/// The temporary name used for `dest`: `.NAME.tmp-PID` in the same directory, so the rename
/// stays within one filesystem. Leftovers from a killed run start with `.` and end in `.tmp-*`.
pub fn temp_path_for(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

impl PendingFile {
    /// Create the temporary file for `dest` (replacing a leftover of this process id).
    pub fn create(dest: &Path) -> Result<PendingFile> {
        Self::create_with(dest, false)
    }

    /// Like [`Self::create`]; with `direct`, try `O_DIRECT` first and fall back to buffered
    /// writes where the filesystem refuses it (tmpfs, some network filesystems).
    pub fn create_with(dest: &Path, direct: bool) -> Result<PendingFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = temp_path_for(dest);
        let open = |flags: i32| {
            OpenOptions::new()
                .write(true)
                .read(true)
                .create(true)
                .truncate(true)
                .custom_flags(flags)
                .open(&tmp)
        };
        let (file, direct) = match direct.then(|| open(libc::O_DIRECT)) {
            Some(Ok(f)) => (f, true),
            _ => (
                open(0).map_err(|e| Error::io(&tmp, "create temporary file", e))?,
                false,
            ),
        };
        Ok(PendingFile {
            tmp,
            dest: dest.to_path_buf(),
            file,
            published: false,
            direct,
        })
    }

    /// Whether writes bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Switch to buffered writes (after the filesystem refused an `O_DIRECT` write).
    pub fn drop_direct(&mut self) -> Result<()> {
        use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
        fcntl_getfl(&self.file)
            .and_then(|flags| fcntl_setfl(&self.file, flags - OFlags::DIRECT))
            .map_err(|e| Error::io(&self.tmp, "fcntl", e.into()))?;
        self.direct = false;
        Ok(())
    }

    /// The open temporary file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The final path.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// fsync, rename over the destination, fsync the directory.
    pub fn publish(mut self) -> Result<()> {
        // A failure after the rename leaves no temporary name for `drop` to remove.
        publish_file(&self.file, &self.tmp, &self.dest)?;
        self.published = true;
        Ok(())
    }
}

/// Publish `file`, written under the temporary name `tmp` beside `dest`: fsync it, rename it over
/// `dest`, fsync the directory. [`PendingFile::publish`] does this; a writer that keeps its own
/// temporary file across runs (`tarfa fetch`'s resumable partial file) calls it directly.
pub fn publish_file(file: &File, tmp: &Path, dest: &Path) -> Result<()> {
    file.sync_all().map_err(|e| Error::io(tmp, "fsync", e))?;
    std::fs::rename(tmp, dest).map_err(|e| Error::io(dest, "rename into place", e))?;
    sync_parent(dest)
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// fsync the directory holding `path`, so a rename into it is durable.
pub fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, "fsync directory", e))
}

/// Publish `bytes` as `dest` atomically.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let p = PendingFile::create(dest)?;
    (&p.file)
        .write_all(bytes)
        .map_err(|e| Error::io(&p.tmp, "write", e))?;
    p.publish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpublished_file_leaves_no_trace_and_published_one_replaces_atomically() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join("x.jnf");
        {
            let p = PendingFile::create(&dest).expect("create");
            assert!(temp_path_for(&dest).exists());
            drop(p);
        }
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 0);
        write_atomic(&dest, b"one").expect("publish");
        write_atomic(&dest, b"two").expect("publish again");
        assert_eq!(std::fs::read(&dest).expect("read"), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
    }
}
