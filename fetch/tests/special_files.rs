//! Review findings 6 and 7 for a local fetch: a FIFO or a link to a device as a GGUF part,
//! `config.json`, the index or the resume journal is refused at once, naming it; and a journal
//! longer than its plan's can be is never read whole (the fetch starts over).

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use common::write_glm;
use tarfa_fetch::{FetchError, FetchOptions, Fetcher, Progress, Selection};
use tarfa_format::fsio::FsError;

fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: still blocked after 20 s"))
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

fn link_to_dev_zero(path: &Path) {
    let _ = std::fs::remove_file(path);
    std::os::unix::fs::symlink("/dev/zero", path).expect("symlink");
}

fn mtp() -> FetchOptions {
    FetchOptions {
        selection: Selection {
            mtp: true,
            globs: Vec::new(),
        },
        ..FetchOptions::default()
    }
}

fn plan_and_fetch(
    source: PathBuf,
    out: PathBuf,
    progress: &'static Notes,
) -> Result<(), FetchError> {
    within(&format!("fetch {}", source.display()), move || {
        let f = Fetcher::new(mtp());
        let plan = f.plan(&source.display().to_string())?;
        f.fetch(&plan, &out, progress).map(|_| ())
    })
}

fn not_regular(e: &FetchError) -> Option<(&Path, &'static str)> {
    match e {
        FetchError::File(FsError::NotRegular { path, kind })
        | FetchError::Gguf(tarfa_gguf::Error::File(FsError::NotRegular { path, kind })) => {
            Some((path, kind))
        }
        _ => None,
    }
}

/// Remarks made to the user.
#[derive(Debug, Default)]
struct Notes(Mutex<Vec<String>>);
impl Progress for Notes {
    fn note(&self, msg: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(msg.into());
    }
}

fn notes() -> &'static Notes {
    Box::leak(Box::default())
}

#[test]
fn a_fifo_or_device_as_a_gguf_part_is_refused_naming_it() {
    for (make, kind) in [
        (mkfifo as fn(&Path), "a FIFO"),
        (link_to_dev_zero, "a character device"),
    ] {
        let root = tempfile::tempdir().expect("tempdir");
        let model = write_glm(root.path());
        make(&model.parts[2]);
        let e = plan_and_fetch(
            model.parts[0].clone(),
            root.path().join("draft.gguf"),
            notes(),
        )
        .expect_err("refused");
        assert_eq!(
            not_regular(&e),
            Some((model.parts[2].as_path(), kind)),
            "{e}"
        );
    }
}

/// A one-tensor safetensors file holding a Qwen-style `mtp.*` tensor.
fn write_tiny_safetensors(path: &Path) {
    let mut header =
        br#"{"mtp.norm.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#.to_vec();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(&[1u8; 16]);
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn a_fifo_as_config_or_index_beside_a_safetensors_file_is_refused_naming_it() {
    // A shard of a sharded checkpoint is read through the index beside it.
    for (shard, name) in [
        ("model.safetensors", "config.json"),
        (
            "model-00001-of-00002.safetensors",
            "model.safetensors.index.json",
        ),
    ] {
        let root = tempfile::tempdir().expect("tempdir");
        let src = root.path().join(shard);
        write_tiny_safetensors(&src);
        mkfifo(&root.path().join(name));
        let e =
            plan_and_fetch(src, root.path().join("out.safetensors"), notes()).expect_err("refused");
        assert_eq!(
            not_regular(&e),
            Some((root.path().join(name).as_path(), "a FIFO")),
            "{e}"
        );
    }
}

#[test]
fn a_fifo_as_the_journal_is_refused_naming_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let out = root.path().join("draft.gguf");
    let journal = root.path().join("draft.gguf.tarfa-journal");
    mkfifo(&journal);
    let e = plan_and_fetch(model.parts[0].clone(), out, notes()).expect_err("refused");
    assert_eq!(not_regular(&e), Some((journal.as_path(), "a FIFO")), "{e}");
}

#[test]
fn a_journal_longer_than_its_plan_allows_is_not_read_and_the_fetch_starts_over() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let out = root.path().join("draft.gguf");
    // A partial file and a journal a killed run could not have written: 64 MiB (sparse).
    std::fs::write(root.path().join("draft.gguf.tarfa-partial"), b"").expect("partial");
    std::fs::File::create(root.path().join("draft.gguf.tarfa-journal"))
        .and_then(|f| f.set_len(64 << 20))
        .expect("journal");
    let progress = notes();
    plan_and_fetch(model.parts[0].clone(), out.clone(), progress).expect("fetch");
    let said = progress.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
    assert!(
        said.iter()
            .any(|n| n.starts_with("starting over: the journal is longer")),
        "{said:?}"
    );
    let f = Fetcher::new(mtp());
    let plan = f.plan(&model.parts[0].display().to_string()).expect("plan");
    assert_eq!(
        std::fs::metadata(&out).expect("published").len(),
        plan.total_len
    );
}
