//! The model directory a conversion writes into (spec §8.3): what in it is tarfa's own, the lock
//! that keeps two conversions out, and the removal of a killed run's temporary files.
//!
//! A conversion replaces or removes only files it wrote, recognised by name *and* content: the
//! manifest (JSON whose `format` is `jnf-model`), `trunk.jnf` and `layer-NNNNN.jnf` of a layer
//! of this checkpoint (starting with the JNF magic), aux files equal to the source's or to the
//! copy the directory's manifest lists, the lock file, and temporary files `.NAME.tmp-PID` of
//! those names (§7) that a killed conversion left: PID is no running process (other than this
//! one) and the content is what tarfa writes under NAME (see [`temp_fault`]). Anything else — a
//! foreign file, a live writer's temporary file, a subdirectory, a link, the GGUF being
//! converted — makes the directory unusable, and the error names it; `tarfa verify` would report
//! it as an extra file, so convert refuses to write a directory that could never verify.

use std::fs::File;
use std::path::Path;

use tarfa_format::layout::MAGIC;
use tarfa_format::manifest::{
    layer_file_name, FileKind, Manifest, FORMAT_NAME, MANIFEST_NAME, MAX_MANIFEST_LEN, TRUNK_NAME,
};

use crate::convert::{aux_files, MAX_AUX_LEN};
use crate::error::{ConvertError, ForeignFile, OutputFault};
use crate::source::Checkpoint;

/// The lock file (hidden; not listed in the manifest).
pub use tarfa_format::manifest::CONVERT_LOCK_NAME as LOCK_NAME;

/// The layer of `layer-NNNNN.jnf`, spelled exactly as [`layer_file_name`] writes it.
fn layer_of(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("layer-")?.strip_suffix(".jnf")?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let layer = digits.parse().ok()?;
    (layer_file_name(layer) == name).then_some(layer)
}

/// A name a conversion publishes: the manifest, the trunk, a layer file, an aux file.
fn is_output_name(name: &str) -> bool {
    name == MANIFEST_NAME
        || name == TRUNK_NAME
        || layer_of(name).is_some()
        || aux_files().any(|a| a == name)
}

/// NAME and PID of `.NAME.tmp-PID`, for a NAME a conversion publishes and a PID a process can
/// have (a positive `i32`): the name of a temporary file of §7.
fn temp_name_parts(name: &str) -> Option<(&str, u32)> {
    let (base, pid) = name.strip_prefix('.')?.rsplit_once(".tmp-")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) || !is_output_name(base) {
        return None;
    }
    let pid: i32 = pid.parse().ok().filter(|&p| p > 0)?;
    Some((base, pid.unsigned_abs()))
}

/// `.NAME.tmp-PID` for a NAME a conversion publishes: a temporary file of §7.
fn is_temp_name(name: &str) -> bool {
    temp_name_parts(name).is_some()
}

/// Is `pid` a running process other than this one? (`kill(pid, 0)`: only "no such process"
/// says no; a process of another user, `EPERM`, is running.) This process's own id counts as not
/// running: no temporary file of it exists before the conversion creates one, so a file with it
/// is from an earlier process that had the same id (in a container, every run may have it).
fn is_other_live_process(pid: u32) -> bool {
    if pid == std::process::id() {
        return false;
    }
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// Is the temporary file at `path` (for the output NAME `base`) in content what a conversion
/// writes under that name, as a killed one leaves it? A JNF file starts with its header page, so
/// a partial one is empty or starts with the JNF magic; the manifest is written in one piece as
/// a pretty-printed JSON object, so it is empty or starts with `{` and a newline; an aux copy is
/// empty or a prefix of the source's file of that name.
fn is_our_temp_content(ck: &Checkpoint, path: &Path, base: &str) -> bool {
    if base == TRUNK_NAME || layer_of(base).is_some() {
        use std::os::unix::fs::FileExt;
        let Ok(f) = tarfa_format::fsio::open_regular(path) else {
            return false;
        };
        let mut head = [0u8; 8];
        return f.file.metadata().is_ok_and(|m| m.len() == 0)
            || (f.file.read_exact_at(&mut head, 0).is_ok() && head == MAGIC);
    }
    let limit = if base == MANIFEST_NAME {
        MAX_MANIFEST_LEN
    } else {
        MAX_AUX_LEN
    };
    let Ok(here) = read_bounded(path, limit) else {
        return false;
    };
    if here.is_empty() {
        return true;
    }
    if base == MANIFEST_NAME {
        return here.starts_with(b"{\n");
    }
    read_bounded(&ck.dir.join(base), MAX_AUX_LEN).is_ok_and(|src| src.starts_with(&here))
}

/// Why the temporary file `name` (`.NAME.tmp-PID`, [`is_temp_name`]) at `path` is not a leftover
/// of a killed conversion that this one may remove, or `None` when it is: its PID is no running
/// process other than this one (a live process may be writing it — tarfa never removes a file
/// that a running program may still be writing, whatever the content), and its content is what
/// a conversion writes under NAME ([`is_our_temp_content`]).
fn temp_fault(ck: &Checkpoint, path: &Path, name: &str) -> Option<ForeignFile> {
    let (base, pid) = temp_name_parts(name)?;
    if is_other_live_process(pid) {
        return Some(ForeignFile::LiveWriter { pid });
    }
    (!is_our_temp_content(ck, path, base)).then_some(ForeignFile::NotOurTemp)
}

/// Does another process hold the conversion lock of `out`? Probed without creating anything: a
/// shared `flock` on the lock file, if there is one, released at once.
fn lock_held_elsewhere(out: &Path) -> bool {
    let Ok(f) = tarfa_format::fsio::open_regular(&out.join(LOCK_NAME)) else {
        return false;
    };
    matches!(
        rustix::fs::flock(&f.file, rustix::fs::FlockOperation::NonBlockingLockShared),
        Err(rustix::io::Errno::WOULDBLOCK)
    )
}

/// All of `path` if it is a regular file of at most `limit` bytes.
fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, tarfa_format::fsio::FsError> {
    tarfa_format::fsio::read_regular(path, limit)
}

/// Is `path` a JNF model manifest (perhaps damaged, or from an older tarfa)?
fn is_jnf_manifest(path: &Path) -> bool {
    read_bounded(path, MAX_MANIFEST_LEN)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .is_some_and(|v| v.get("format").and_then(|f| f.as_str()) == Some(FORMAT_NAME))
}

/// Does `path` start with the JNF magic?
fn starts_with_jnf_magic(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 8];
    tarfa_format::fsio::open_regular(path).is_ok_and(|f| f.file.read_exact_at(&mut head, 0).is_ok())
        && head == MAGIC
}

/// Is the aux file `name` in the output the source's (the copy is a no-op) or the copy the old
/// manifest lists (the source's file changed since)?
fn is_our_aux(ck: &Checkpoint, old: Option<&Manifest>, out: &Path, name: &str) -> bool {
    let Ok(here) = read_bounded(&out.join(name), MAX_AUX_LEN) else {
        return false;
    };
    let src = ck.dir.join(name);
    if read_bounded(&src, MAX_AUX_LEN).is_ok_and(|b| b == here) {
        return true;
    }
    let h = tarfa_format::hash::dual_hash(&here);
    old.is_some_and(|m| {
        m.files.iter().any(|f| {
            f.kind == FileKind::Aux
                && f.path == name
                && f.size == here.len() as u64
                && f.sha256 == hex::encode(h.sha256)
                && f.blake3 == hex::encode(h.blake3)
        })
    })
}

/// May a conversion of `ck` write into `out`? Refuses a directory whose manifest names other
/// source shards, and the first entry (in name order) that is not tarfa's own, naming it.
/// `layers` says which layer numbers the checkpoint has; `copies_aux` is false for a GGUF (it
/// has no aux files). Reads only: run before anything is created in `out`.
pub(crate) fn check(
    out: &Path,
    ck: &Checkpoint,
    layers: &dyn Fn(u32) -> bool,
    copies_aux: bool,
    sources: &[tarfa_format::manifest::SourceFile],
) -> Result<(), ConvertError> {
    let rd = match std::fs::read_dir(out) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ConvertError::Io {
                path: out.to_path_buf(),
                op: "list",
                source,
            })
        }
    };
    let old = Manifest::load(out).ok();
    if let Some(old) = &old {
        // The layout (paths, sizes, header hashes), not the identities' times: a touched or
        // copied source is the same checkpoint if its bytes are, which §8.2's re-check decides.
        let same = old.conversion.sources.len() == sources.len()
            && old
                .conversion
                .sources
                .iter()
                .zip(sources)
                .all(|(a, b)| a.same_layout(b));
        if !same {
            return Err(ConvertError::BadOutput {
                path: out.to_path_buf(),
                fault: OutputFault::OtherCheckpoint,
            });
        }
    }
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let regular = match std::fs::symlink_metadata(&path) {
            Ok(m) => m.is_file(),
            // Gone since it was listed: a temporary file another conversion just published.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(ConvertError::Io {
                    path,
                    op: "stat",
                    source,
                })
            }
        };
        let why = if !regular {
            Some(ForeignFile::NotRegular)
        } else if name == LOCK_NAME {
            None
        } else if is_temp_name(&name) {
            temp_fault(ck, &path, &name)
        } else if name == MANIFEST_NAME {
            (!is_jnf_manifest(&path)).then_some(ForeignFile::NotAManifest)
        } else if name == TRUNK_NAME || layer_of(&name).is_some() {
            match layer_of(&name) {
                Some(layer) if !layers(layer) => Some(ForeignFile::NoSuchLayer { layer }),
                _ => (!starts_with_jnf_magic(&path)).then_some(ForeignFile::NotJnf),
            }
        } else if aux_files().any(|a| a == name) {
            (!copies_aux || !is_our_aux(ck, old.as_ref(), out, &name))
                .then_some(ForeignFile::OtherAux)
        } else {
            Some(ForeignFile::Unknown)
        };
        if let Some(why) = why {
            // A running conversion's temporary file belongs to a live process: say the
            // directory is in use rather than call the file foreign.
            if matches!(why, ForeignFile::LiveWriter { .. }) && lock_held_elsewhere(out) {
                return Err(ConvertError::BadOutput {
                    path: out.to_path_buf(),
                    fault: OutputFault::Locked,
                });
            }
            return Err(ConvertError::BadOutput {
                path,
                fault: OutputFault::Foreign { why },
            });
        }
    }
    Ok(())
}

/// Holds `OUT/.tarfa-convert.lock` (flock) for the duration of a conversion.
#[derive(Debug)]
pub(crate) struct OutputLock(#[allow(dead_code)] File);

/// Take the lock, or say that another conversion holds it.
pub(crate) fn lock(out: &Path) -> Result<OutputLock, ConvertError> {
    let path = out.join(LOCK_NAME);
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| ConvertError::Io {
            path: path.clone(),
            op: "create lock",
            source,
        })?;
    if rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return Err(ConvertError::BadOutput {
            path: out.to_path_buf(),
            fault: OutputFault::Locked,
        });
    }
    Ok(OutputLock(f))
}

/// Remove the temporary files a killed conversion left: `.NAME.tmp-PID` of names a conversion
/// publishes, of no running process, with content a conversion writes ([`temp_fault`]); nothing
/// else is touched (a file that appeared since [`check`] and is not one of those stays).
pub(crate) fn remove_leftovers(out: &Path, ck: &Checkpoint) -> Result<(), ConvertError> {
    let rd = std::fs::read_dir(out).map_err(|source| ConvertError::Io {
        path: out.to_path_buf(),
        op: "list",
        source,
    })?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_temp_name(&name)
            && e.file_type().is_ok_and(|t| t.is_file())
            && temp_fault(ck, &e.path(), &name).is_none()
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_names_a_conversion_publishes_and_their_temporary_files_are_its_own() {
        for ours in ["layer-00000.jnf", "layer-00047.jnf", "layer-123456.jnf"] {
            assert!(is_output_name(ours), "{ours}");
        }
        for foreign in [
            "layer-0.jnf",
            "layer-x0000.jnf",
            "layer-+0001.jnf",
            "model.gguf",
        ] {
            assert!(!is_output_name(foreign), "{foreign}");
        }
        for ours in [
            ".manifest.json.tmp-12",
            ".layer-00003.jnf.tmp-4242",
            ".config.json.tmp-1",
        ] {
            assert!(is_temp_name(ours), "{ours}");
        }
        for foreign in [
            ".notes.txt.tmp-12",
            ".manifest.json.tmp-",
            ".manifest.json.tmp-12a",
            ".manifest.json.tmp-0",
            ".manifest.json.tmp-2147483648",
            ".manifest.json.tmp-99999999999999999999",
            "manifest.json.tmp-12",
            ".x.tmp-1",
        ] {
            assert!(!is_temp_name(foreign), "{foreign}");
        }
    }
}
