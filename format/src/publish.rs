//! Atomic publishing (§7): write beside the destination under a temporary name, fsync the file,
//! rename it into place, fsync the directory. A crash at any moment leaves either the old file or
//! the complete new one under the final name, never a partial file that looks complete.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use crate::error::{Error, OutputFault, Result};

/// What an output path is, found before anything is written ([`output_kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputKind {
    /// Absent, or a regular file: written under a temporary name beside it, renamed over it.
    Replace,
    /// A character device (`/dev/null`, a terminal) or a FIFO (which of the two, in words):
    /// written into as a stream, never replaced.
    Stream(&'static str),
}

/// What `dest` is as an output. A symbolic link is refused (naming its target), and so is
/// anything but a regular file, a character device or a FIFO: publishing by rename would replace
/// it (a device node, a link) where the user meant to write into it.
pub fn output_kind(dest: &Path) -> Result<OutputKind> {
    use std::os::unix::ffi::OsStrExt;
    let refuse = |fault| Error::Output {
        path: dest.to_path_buf(),
        fault,
    };
    let raw = dest.as_os_str().as_bytes();
    if raw.is_empty() || raw.ends_with(b"/") || dest.file_name().is_none() {
        return Err(refuse(OutputFault::NotWritable {
            kind: "a path that names no file (empty, or ending in '/' or '..')",
        }));
    }
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OutputKind::Replace),
        Err(e) => return Err(Error::io(dest, "stat the output", e)),
    };
    let t = meta.file_type();
    if t.is_symlink() {
        let target = std::fs::read_link(dest).unwrap_or_default();
        return Err(refuse(OutputFault::Symlink { target }));
    }
    match crate::fsio::kind_of(t) {
        None => Ok(OutputKind::Replace),
        Some(k @ ("a character device" | "a FIFO")) => Ok(OutputKind::Stream(k)),
        Some(kind) => Err(refuse(OutputFault::NotWritable { kind })),
    }
}

/// Refuse `dest` when it is one of `inputs` (the same device and inode, links followed): an
/// output must never overwrite what the command reads. Inputs that do not exist are skipped.
pub fn refuse_input(dest: &Path, inputs: &[PathBuf]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(d) = std::fs::metadata(dest) else {
        return Ok(());
    };
    for input in inputs {
        if let Ok(m) = std::fs::metadata(input) {
            if (m.dev(), m.ino()) == (d.dev(), d.ino()) {
                return Err(Error::Output {
                    path: dest.to_path_buf(),
                    fault: OutputFault::IsInput {
                        input: input.clone(),
                    },
                });
            }
        }
    }
    Ok(())
}

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

/// Remove the temporary files of `dest` ([`temp_path_for`]) that processes no longer running
/// left behind (killed mid-write): `.NAME.tmp-PID` whose PID has no `/proc` entry. A live
/// process's (another writer's, or this one's) is kept; without `/proc`, nothing is removed.
/// Processes are those of this PID namespace (a writer in another container sharing the
/// directory is not seen). Best effort: a file that cannot be listed or removed is left.
fn remove_stale_temps(dest: &Path) {
    let proc_ok = Path::new("/proc/self").exists();
    let (Some(name), true) = (dest.file_name(), proc_ok) else {
        return;
    };
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let dir = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(pid) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let is_file = e.file_type().is_ok_and(|t| t.is_file());
        if is_file && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl PendingFile {
    /// Create the temporary file for `dest` (replacing a leftover of this process id, and
    /// removing those of processes that are gone).
    pub fn create(dest: &Path) -> Result<PendingFile> {
        Self::create_with(dest, false)
    }

    /// Like [`Self::create`]; with `direct`, try `O_DIRECT` first and fall back to buffered
    /// writes where the filesystem refuses it (tmpfs, some network filesystems).
    pub fn create_with(dest: &Path, direct: bool) -> Result<PendingFile> {
        use std::os::unix::fs::OpenOptionsExt;
        // Only a regular file (or nothing) is ever replaced: never a device, FIFO or link.
        if let OutputKind::Stream(kind) = output_kind(dest)? {
            return Err(Error::Output {
                path: dest.to_path_buf(),
                fault: OutputFault::NotRegular { kind },
            });
        }
        remove_stale_temps(dest);
        let tmp = temp_path_for(dest);
        // A new file, never one that is there: a leftover of this process id (or a link planted
        // under the predictable name) is unlinked first, and O_EXCL follows no link.
        let open = |flags: i32| {
            let _ = std::fs::remove_file(&tmp);
            OpenOptions::new()
                .write(true)
                .read(true)
                .create_new(true)
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

/// Buffered writes into the temporary file (not for a `direct` one: O_DIRECT takes aligned
/// writes only).
impl std::io::Write for PendingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (&self.file).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        (&self.file).flush()
    }
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

/// Publish `bytes` as `dest` atomically. Only a regular file (or nothing) is replaced
/// ([`PendingFile::create`]); a model's files are never streamed into a device.
pub fn write_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let p = PendingFile::create(dest)?;
    (&p.file)
        .write_all(bytes)
        .map_err(|e| Error::io(&p.tmp, "write", e))?;
    p.publish()
}

/// Open `dest`, a character device or FIFO ([`OutputKind::Stream`]), for writing into: no link
/// followed (`O_NOFOLLOW`), and what was opened checked again (a regular file swapped in since
/// [`output_kind`] is refused: it would be written over without truncation). A FIFO's open waits
/// for its reader, as a shell's `>` does.
pub fn open_stream(dest: &Path) -> Result<File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dest)
        .map_err(|e| Error::io(dest, "open for writing", e))?;
    let t = f
        .metadata()
        .map_err(|e| Error::io(dest, "stat the output", e))?
        .file_type();
    if !(t.is_char_device() || t.is_fifo()) {
        return Err(Error::Output {
            path: dest.to_path_buf(),
            fault: OutputFault::NotWritable {
                kind: "no longer a device or FIFO",
            },
        });
    }
    Ok(f)
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

    /// Publishing never replaces anything but a regular file: a FIFO, a symbolic link and a
    /// directory are refused by every publisher (`PendingFile`, `write_atomic`), each left as
    /// it was, as is a path that names no file; `open_stream` writes into a FIFO, not through a
    /// link.
    #[test]
    fn only_a_regular_file_is_ever_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let ok = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mkfifo");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).expect("symlink");
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).expect("mkdir");
        let fault = |p: &Path| match PendingFile::create(p) {
            Err(Error::Output { fault, .. }) => fault.to_string(),
            other => panic!("{}: {other:?}", p.display()),
        };
        assert!(fault(&fifo).starts_with("a FIFO: this output is published as a file"));
        assert!(fault(&link).starts_with("a symbolic link to "));
        assert_eq!(fault(&sub), "a directory, not a file that can be written");
        assert!(matches!(
            write_atomic(&link, b"x"),
            Err(Error::Output {
                fault: OutputFault::Symlink { .. },
                ..
            })
        ));
        assert!(matches!(
            write_atomic(&fifo, b"x"),
            Err(Error::Output {
                fault: OutputFault::NotRegular { .. },
                ..
            })
        ));
        for bad in ["", "out/", "x/.."] {
            let p = if bad.is_empty() {
                PathBuf::new()
            } else {
                dir.path().join(bad)
            };
            assert!(
                matches!(output_kind(&p), Err(Error::Output { .. })),
                "{bad:?}"
            );
        }
        // The stream: a reader on the FIFO gets the bytes (waited for with a limit, so a writer
        // that never opens it fails the test instead of hanging it).
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let fifo = fifo.clone();
            std::thread::spawn(move || tx.send(std::fs::read(fifo).expect("read")));
        }
        {
            use std::io::Write;
            let mut f = open_stream(&fifo).expect("open the FIFO");
            f.write_all(b"through the pipe").expect("write");
        }
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the reader got the bytes");
        assert_eq!(got, b"through the pipe");
        assert!(
            matches!(open_stream(&link), Err(Error::Io { .. })),
            "O_NOFOLLOW"
        );
        let t = std::fs::symlink_metadata(&fifo).expect("fifo").file_type();
        assert!(t.is_fifo());
        assert!(std::fs::symlink_metadata(&link)
            .expect("link")
            .file_type()
            .is_symlink());
        assert!(!dir.path().join("elsewhere").exists());
        // Only the three entries made here: no temporary file left.
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 3);
    }

    /// A temporary left by a process that was killed mid-write is removed by the next writer of
    /// the same file; a live process's is kept (issue 26, finding 13).
    #[test]
    fn a_dead_writers_temporary_is_removed_and_a_live_ones_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join("logits.npy");
        // Above Linux's largest pid (2^22): no process has it.
        let dead = dir.path().join(".logits.npy.tmp-4194305");
        let live = dir.path().join(".logits.npy.tmp-1");
        let other = dir.path().join(".other.npy.tmp-4194305");
        for p in [&dead, &live, &other] {
            std::fs::write(p, b"partial").expect("write");
        }
        write_atomic(&dest, b"whole").expect("publish");
        assert!(!dead.exists(), "the dead writer's temporary is gone");
        assert!(live.exists(), "pid 1 is alive: its temporary stays");
        assert!(
            other.exists(),
            "another file's temporary is not this writer's"
        );
        assert_eq!(std::fs::read(&dest).expect("read"), b"whole");
    }

    /// An output that is an input (the same inode, through a hard link) is refused.
    #[test]
    fn an_output_that_is_an_input_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("in.json");
        std::fs::write(&input, b"{}").expect("write");
        let other = dir.path().join("other");
        std::fs::write(&other, b"x").expect("write");
        let hard = dir.path().join("out.npy");
        std::fs::hard_link(&input, &hard).expect("link");
        let inputs = [other.clone(), input.clone(), dir.path().join("absent")];
        match refuse_input(&hard, &inputs) {
            Err(Error::Output {
                fault: OutputFault::IsInput { input: i },
                ..
            }) => assert_eq!(i, input),
            other => panic!("{other:?}"),
        }
        refuse_input(&dir.path().join("new.npy"), &inputs).expect("a new file is no input");
        refuse_input(&other, &inputs[1..]).expect("not among these inputs");
    }
}
