//! Review finding 6 and 7: a FIFO or a link to a device wherever convert reads a file — a shard,
//! the index, `config.json`, an aux file, a GGUF part, the output's manifest or layer file — is
//! refused at once, naming the file, instead of blocking forever or reading until memory runs
//! out; and an aux file over its limit is refused by the same bounded read.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, ConvertError, ForeignFile, Options, OutputFault, Quiet};
use tarfa_format::fsio::FsError;

/// Run `f`, failing the test if it has not returned within 20 s (a blocked `open` of a FIFO
/// never returns; its thread is left behind).
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

#[derive(Clone, Copy, Debug)]
enum Special {
    Fifo,
    DevZero,
}

impl Special {
    fn make(self, path: &Path) {
        match self {
            Special::Fifo => mkfifo(path),
            Special::DevZero => link_to_dev_zero(path),
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Special::Fifo => "a FIFO",
            Special::DevZero => "a character device",
        }
    }
}

fn convert_in_time(src: PathBuf, out: PathBuf) -> Result<(), ConvertError> {
    let what = format!("convert {}", src.display());
    within(&what, move || {
        convert(&src, &out, &Options::default(), &Quiet).map(|_| ())
    })
}

/// The error is "not a regular file" for exactly `path`, of the kind made.
fn assert_refused(r: Result<(), ConvertError>, path: &Path, special: Special) {
    match r {
        Err(ConvertError::File(FsError::NotRegular { path: p, kind })) => {
            assert_eq!((p.as_path(), kind), (path, special.kind()));
        }
        other => panic!("{} as {special:?}: {other:?}", path.display()),
    }
}

#[test]
fn a_fifo_or_device_as_any_source_file_is_refused_naming_it() {
    for name in [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
        "tokenizer.json",
        "generation_config.json",
    ] {
        for special in [Special::Fifo, Special::DevZero] {
            let tmp = tempfile::tempdir().expect("tempdir");
            let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
            let spec = SynthSpec {
                shards: 2,
                ..SynthSpec::small()
            };
            write_checkpoint(&src, &spec).expect("checkpoint");
            special.make(&src.join(name));
            let r = convert_in_time(src.clone(), out);
            assert_refused(r, &src.join(name), special);
        }
    }
}

#[test]
fn a_fifo_or_device_as_a_gguf_part_is_refused_naming_it() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf");
    for special in [Special::Fifo, Special::DevZero] {
        let tmp = tempfile::tempdir().expect("tempdir");
        for k in [1, 3] {
            let name = format!("split-0000{k}-of-00003.gguf");
            std::fs::copy(fixtures.join(&name), tmp.path().join(&name)).expect("copy");
        }
        let part2 = tmp.path().join("split-00002-of-00003.gguf");
        special.make(&part2);
        let r = convert_in_time(
            tmp.path().join("split-00001-of-00003.gguf"),
            tmp.path().join("out"),
        );
        match r {
            Err(ConvertError::Gguf(tarfa_gguf::Error::File(FsError::NotRegular {
                path,
                kind,
            }))) => assert_eq!((path, kind), (part2, special.kind())),
            other => panic!("{special:?}: {other:?}"),
        }
    }
}

#[test]
fn a_fifo_in_the_output_directory_is_refused_naming_it() {
    for name in ["manifest.json", "layer-00000.jnf", "config.json"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
        write_checkpoint(&src, &SynthSpec::small()).expect("checkpoint");
        convert(&src, &out, &Options::default(), &Quiet).expect("first conversion");
        mkfifo(&out.join(name));
        match convert_in_time(src, out.clone()) {
            Err(ConvertError::BadOutput {
                path,
                fault:
                    OutputFault::Foreign {
                        why: ForeignFile::NotRegular,
                    },
            }) => assert_eq!(path, out.join(name)),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn an_aux_file_over_its_limit_is_refused_without_reading_it_all() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
    write_checkpoint(&src, &SynthSpec::small()).expect("checkpoint");
    let big = src.join("tokenizer.json");
    // Sparse: 1 GiB of holes costs no disk.
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(1 << 30))
        .expect("sparse file");
    match convert(&src, &out, &Options::default(), &Quiet) {
        Err(ConvertError::File(FsError::TooLarge { path, limit })) => {
            assert_eq!(path, big);
            assert_eq!(limit, 256 << 20);
        }
        other => panic!("{other:?}"),
    }
}
