//! What a path given on the command line looks like, for the hints of the common mistakes
//! (a checkpoint where a JNF model is wanted, a file where its directory is, a URL), and the
//! error that carries such a hint and its exit code.

use std::path::{Path, PathBuf};

/// An error with the hint that says what to do instead, and its exit code (README: 1 the input is
/// not what the command reads, 2 it could not run).
#[derive(Debug)]
pub struct Refused {
    /// README's exit code.
    pub code: u8,
    /// What is wrong.
    pub message: String,
    /// What to do instead.
    pub hint: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

/// What a directory without `manifest.json` holds, as far as the hint goes.
#[derive(Debug, PartialEq, Eq)]
pub enum NotAModel {
    /// A Hugging Face checkpoint (`config.json`, `*.safetensors`).
    Checkpoint,
    /// GGUF files (the first named).
    Gguf(PathBuf),
    /// JNF files of a conversion whose manifest was never written (it is written last).
    Interrupted,
    /// Nothing recognisable.
    Other,
}

/// Does `s` name a remote source (`http://`, `https://`, `hf://`)?
pub fn is_url(s: &str) -> bool {
    ["http://", "https://", "hf://"]
        .iter()
        .any(|p| s.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p)))
}

/// Is `p` named like a file of a safetensors checkpoint (a shard or its index)?
pub fn is_safetensors_file(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.ends_with(".safetensors") || name.ends_with(".safetensors.index.json")
}

/// What `dir` (a directory with no `manifest.json`) holds.
pub fn not_a_model(dir: &Path) -> NotAModel {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect(),
        Err(_) => return NotAModel::Other,
    };
    names.sort();
    let jnf = |n: &String| n.ends_with(".jnf") || n == ".tarfa-convert.lock";
    if names.iter().any(jnf) {
        return NotAModel::Interrupted;
    }
    if names
        .iter()
        .any(|n| n == "config.json" || is_safetensors_file(Path::new(n)))
    {
        return NotAModel::Checkpoint;
    }
    match names.iter().find(|n| n.ends_with(".gguf")) {
        Some(g) => NotAModel::Gguf(dir.join(g)),
        None => NotAModel::Other,
    }
}

/// What a command that reads a JNF model directory says when given something else.
pub fn reads_a_model_dir(command: &str) -> String {
    format!("{command} reads a JNF model directory (a tarfa convert output, holding manifest.json)")
}

/// Does the regular file at `p` start with `magic`?
fn starts_with_magic(p: &Path, magic: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let mut head = vec![0u8; magic.len()];
    tarfa_format::fsio::open_regular(p)
        .is_ok_and(|f| f.file.read_exact_at(&mut head, 0).is_ok() && head == magic)
}

/// Is `p` a JNF file by name or by its first bytes?
pub fn is_jnf_file(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "jnf") || starts_with_magic(p, &tarfa_format::layout::MAGIC)
}

/// `path` refused when it is there but is not a directory (a file where `command` reads a JNF
/// model directory): exit 1, with the hint that fits the file (a GGUF, a checkpoint's file, one
/// JNF file) or else that the command reads a directory.
pub fn refuse_a_file(path: &Path, command: &str) -> Result<(), Refused> {
    if !path.exists() || path.is_dir() {
        return Ok(());
    }
    let p = path.display();
    let parent = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map_or(".".into(), |d| d.display().to_string());
    let hint = if crate::inspect_gguf::is_gguf(path) {
        format!(
            "{p} is a GGUF file: convert it first (tarfa convert {p} -o MODEL_DIR) and give MODEL_DIR to {command}, or inspect it as it is (tarfa inspect {p})"
        )
    } else if is_safetensors_file(path) {
        format!(
            "{p} is a file of a Hugging Face checkpoint: convert the checkpoint's directory first (tarfa convert {parent} -o MODEL_DIR) and give MODEL_DIR to {command}"
        )
    } else if is_jnf_file(path) {
        format!(
            "{p} is one JNF file: give the model directory that holds it ({parent}), or inspect the file (tarfa inspect {p})"
        )
    } else {
        format!(
            "{}: give the directory, not a file",
            reads_a_model_dir(command)
        )
    };
    Err(Refused {
        code: 1,
        message: format!("{p}: a file, not a JNF model directory"),
        hint,
    })
}

/// `dir` refused when it is a file (see [`refuse_a_file`]) or a directory without
/// `manifest.json` (exit 1, with the hint of what it holds, else `usage`), for every command that
/// reads a model directory. A path that is not there is left to the command's own open (exit 2).
pub fn require_model_dir(
    dir: &Path,
    command: &str,
    usage: impl FnOnce() -> String,
) -> Result<(), Refused> {
    refuse_a_file(dir, command)?;
    let manifest = tarfa_format::manifest::MANIFEST_NAME;
    // Named as the directory it is, not as the manifest inside it that could not be opened.
    if std::fs::symlink_metadata(dir).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        return Err(Refused {
            code: 2,
            message: format!("{}: no such model directory", dir.display()),
            hint: usage(),
        });
    }
    if !dir.is_dir() || dir.join(manifest).symlink_metadata().is_ok() {
        return Ok(());
    }
    Err(Refused {
        code: 1,
        message: format!(
            "{}: no {manifest}: not a JNF model directory",
            dir.display()
        ),
        hint: model_dir_hint(dir).unwrap_or_else(usage),
    })
}

/// The hint for `dir`, a directory given where a JNF model directory is wanted (`inspect`,
/// `verify`, `run`, `bench-io`, `bench-decode`).
pub fn model_dir_hint(dir: &Path) -> Option<String> {
    let d = dir.display();
    match not_a_model(dir) {
        NotAModel::Checkpoint => Some(format!(
            "{d} is a Hugging Face checkpoint, not a JNF model: convert it first (tarfa convert {d} -o MODEL_DIR), then use MODEL_DIR; give the checkpoint to verify as --source"
        )),
        NotAModel::Gguf(g) => Some(format!(
            "{d} holds a GGUF file: inspect it as it is (tarfa inspect {}), or convert it (tarfa convert {} -o MODEL_DIR)",
            g.display(),
            g.display()
        )),
        NotAModel::Interrupted => Some(format!(
            "{d} holds JNF files but no manifest (written last): a conversion into it did not finish; rerun the same tarfa convert to resume (layers already written are checked and kept)"
        )),
        NotAModel::Other => None,
    }
}
