//! A tmpfs mounted for one test: a small filesystem the test can fill, or one whose `O_DIRECT`
//! support differs from the build disk's.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{available, Tool};

/// A tmpfs mounted at a directory for the life of the value (unmounted on drop).
#[derive(Debug)]
pub struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    /// Mount a tmpfs of `size` (mount's `size=` option: `20m`) at `at`, created if absent; or
    /// the skip/fail of [`available`] where mounting is not allowed (not root).
    #[track_caller]
    pub fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        available(Tool::Tmpfs, try_mount(at, size))
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.at
    }
}

fn try_mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
    std::fs::create_dir_all(at).map_err(|e| format!("create {}: {e}", at.display()))?;
    let out = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if out.status.success() {
        Ok(Tmpfs {
            at: at.to_path_buf(),
        })
    } else {
        Err(format!(
            "mount -t tmpfs: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.at).status();
    }
}
