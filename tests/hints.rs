//! The common mistakes of a new user (review findings 22 and 23): each gets the hint that says
//! what to do instead, and the exit code README.md states (1: the input is not what the command
//! reads or is inconsistent; 2: tarfa could not run).

mod common;

use std::path::Path;

use common::{gguf_fixture, golden, path, tarfa};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hf")
        .join(name)
}

/// `tarfa args` exits `code` with `hint` (a part of it) on a `hint:` line of stderr.
fn expect_hint(args: &[&str], code: i32, hint: &str) {
    let (c, out, err) = tarfa(args);
    assert_eq!(c, code, "{args:?}: {out}{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("hint: ") && l.contains(hint)),
        "{args:?}: no hint {hint:?} in:\n{err}"
    );
}

#[test]
fn a_directory_without_a_manifest_is_exit_1_in_inspect_and_verify_alike() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    expect_hint(&["inspect", path(&empty)], 1, "JNF model directory");
    expect_hint(&["verify", path(&empty)], 1, "JNF model directory");
    let missing = tmp.path().join("missing");
    for cmd in ["inspect", "verify"] {
        let (c, _, err) = tarfa(&[cmd, path(&missing)]);
        assert_eq!(c, 2, "{cmd} of a path that is not there: {err}");
    }
}

#[test]
fn a_checkpoint_given_where_a_jnf_model_is_wanted_says_convert_it_first() {
    let ck = fixture("qwen3_moe");
    expect_hint(&["inspect", path(&ck)], 1, "tarfa convert");
    expect_hint(
        &["verify", path(&ck)],
        1,
        "give the checkpoint to verify as --source",
    );
    let st = ck.join("model.safetensors");
    expect_hint(&["inspect", path(&st)], 1, "tarfa convert");
}

#[test]
fn convert_of_a_safetensors_file_a_gguf_directory_or_a_url_names_what_to_give() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let ck = fixture("qwen3_moe");
    expect_hint(
        &[
            "convert",
            path(&ck.join("model.safetensors")),
            "-o",
            path(&out),
        ],
        1,
        &format!("tarfa convert {} -o OUT", path(&ck)),
    );
    let gg = tmp.path().join("gg");
    std::fs::create_dir(&gg).expect("mkdir");
    std::fs::copy(gguf_fixture("moe-model.gguf"), gg.join("moe-model.gguf")).expect("copy");
    expect_hint(
        &["convert", path(&gg), "-o", path(&out)],
        1,
        "give the GGUF file itself",
    );
    expect_hint(&["inspect", path(&gg)], 1, "holds a GGUF file");
    for url in [
        "hf://owner/repo/model.gguf",
        "https://example.invalid/m.gguf",
    ] {
        expect_hint(&["convert", url, "-o", path(&out)], 2, "tarfa fetch");
    }
    assert!(!out.exists(), "nothing written");
}

#[test]
fn an_interrupted_conversion_says_rerun_convert_and_a_rerun_says_what_it_repaired() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let src = fixture("qwen3_moe");
    let (c, o, e) = tarfa(&["convert", path(&src), "-o", path(&out), "-q"]);
    assert_eq!(c, 0, "{o}{e}");

    // A byte of layer 0's data flipped: the rerun rewrites it and says it repaired it.
    let layer0 = out.join("layer-00000.jnf");
    let mut bytes = std::fs::read(&layer0).expect("read");
    bytes[4096 + 100] ^= 0xff;
    std::fs::write(&layer0, &bytes).expect("write");
    let (c, o, e) = tarfa(&["convert", path(&src), "-o", path(&out), "--json", "-q"]);
    assert_eq!(c, 0, "{o}{e}");
    let doc: serde_json::Value = serde_json::from_str(&o).expect("json");
    assert_eq!(doc["layers_replaced"], serde_json::json!([0]), "{doc}");
    std::fs::write(&layer0, &bytes).expect("write");
    let (c, o, e) = tarfa(&["convert", path(&src), "-o", path(&out), "-q"]);
    assert_eq!(c, 0, "{o}{e}");
    assert!(o.contains("repaired: layer 0"), "{o}");
    let (c, o, e) = tarfa(&["convert", path(&src), "-o", path(&out), "-q"]);
    assert_eq!(c, 0, "{o}{e}");
    assert!(!o.contains("repaired"), "nothing to repair: {o}");

    // A conversion killed before its manifest (written last).
    std::fs::remove_file(out.join("manifest.json")).expect("rm");
    expect_hint(
        &["inspect", path(&out)],
        1,
        "rerun the same tarfa convert to resume",
    );
    expect_hint(
        &["verify", path(&out)],
        1,
        "rerun the same tarfa convert to resume",
    );
}

#[test]
fn every_command_that_reads_a_model_directory_refuses_a_checkpoint_or_an_empty_one_with_exit_1() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let ck = fixture("qwen3_moe");
    for cmd in [
        vec!["run", "--tokens", "1", "-n", "1"],
        vec!["bench-io", "--quiet"],
        vec!["bench-decode"],
    ] {
        let missing = tmp.path().join("missing");
        let [ck_args, empty_args, missing_args] = [&ck, &empty, &missing].map(|dir| {
            let mut a = vec![cmd[0], path(dir)];
            a.extend_from_slice(&cmd[1..]);
            a
        });
        expect_hint(&ck_args, 1, "give the checkpoint to verify as --source");
        expect_hint(&empty_args, 1, "JNF model directory");
        let (c, _, err) = tarfa(&missing_args);
        assert_eq!(c, 2, "{cmd:?} of a path that is not there: {err}");
    }
}

/// A file given where a model directory is wanted (`tarfa run x.gguf`) is exit 1 with the hint
/// that fits the file, in every command that reads a model directory — not exit 2 with the
/// operating system's "Not a directory".
#[test]
fn a_file_given_where_a_model_directory_is_wanted_is_exit_1_with_the_hint_that_fits_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let gguf = gguf_fixture("metadata.gguf");
    let st = fixture("qwen3_moe").join("model.safetensors");
    let jnf = golden("tiny-moe/layer-00000.jnf");
    let notes = tmp.path().join("notes.txt");
    std::fs::write(&notes, b"not a model").expect("write");
    let files: [(&Path, &str); 4] = [
        (&gguf, "is a GGUF file: convert it first"),
        (&st, "is a file of a Hugging Face checkpoint"),
        (&jnf, "give the model directory that holds it"),
        (&notes, "give the directory, not a file"),
    ];
    for cmd in [
        vec!["run", "--tokens", "1", "-n", "1"],
        vec!["verify"],
        vec!["bench-io", "--quiet"],
        vec!["bench-decode"],
    ] {
        for (file, hint) in files {
            let mut args = vec![cmd[0], path(file)];
            args.extend_from_slice(&cmd[1..]);
            expect_hint(&args, 1, hint);
            let (_, _, err) = tarfa(&args);
            assert!(
                err.contains("a file, not a JNF model directory") && !err.contains("os error"),
                "{args:?}: {err}"
            );
        }
    }
    // inspect reads files too: one that is neither JNF nor GGUF is the wrong file, not a
    // damaged one.
    expect_hint(&["inspect", path(&notes)], 1, "a .jnf file or a .gguf file");
    let (_, _, err) = tarfa(&["inspect", path(&notes)]);
    assert!(!err.contains("damaged"), "{err}");
}

/// `tarfa args`: exit code and stderr.
fn code_and_err(args: &[&str]) -> (i32, String) {
    let (c, _, err) = tarfa(args);
    (c, err)
}

/// A copy of the qwen3_moe fixture at `dir`.
fn copy_fixture(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    for e in std::fs::read_dir(fixture("qwen3_moe")).expect("read fixture") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.join(e.file_name())).expect("copy");
    }
}

#[test]
fn a_source_that_is_not_a_checkpoint_gets_a_source_hint_never_the_damaged_jnf_one() {
    // Issue 26, finding 14: tarfa's own output, a file of no known kind and a damaged shard,
    // given to convert as its source.
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    copy_fixture(&src);
    let model = tmp.path().join("model");
    let (c, err) = code_and_err(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(c, 0, "{err}");
    let out = tmp.path().join("out");
    let other = tmp.path().join("weights.bin");
    std::fs::write(&other, [7u8; 10_000]).expect("write");
    let damaged = tmp.path().join("damaged");
    copy_fixture(&damaged);
    let shard = damaged.join("model.safetensors");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .expect("open");
    f.set_len(5000).expect("truncate");
    let cases = [
        (model.join("layer-00000.jnf"), "tarfa inspect"),
        (model.clone(), "use it as it is"),
        (other, "convert reads a Hugging Face checkpoint directory"),
        (damaged, "the source checkpoint is incomplete or damaged"),
    ];
    for (source, hint) in cases {
        let args = ["convert", path(&source), "-o", path(&out)];
        let (c, err) = code_and_err(&args);
        assert_eq!(c, 1, "{args:?}: {err}");
        let hints: Vec<&str> = err.lines().filter(|l| l.starts_with("hint: ")).collect();
        assert!(hints.iter().any(|h| h.contains(hint)), "{args:?}: {err}");
        assert!(
            !err.contains("spec/JNF_V1.md") && !err.contains("not written by a conforming"),
            "{args:?}: the damaged-JNF hint for a source: {err}"
        );
        assert!(!out.exists(), "{args:?} created {}", out.display());
    }
}

#[test]
fn a_dangling_shard_without_an_index_is_not_said_to_be_listed_in_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    copy_fixture(&src);
    std::fs::remove_file(src.join("model.safetensors")).expect("rm");
    std::os::unix::fs::symlink(tmp.path().join("gone"), src.join("model.safetensors"))
        .expect("symlink");
    let (c, err) = code_and_err(&["convert", path(&src), "-o", path(&tmp.path().join("o"))]);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("dangling symbolic link"), "{err}");
    assert!(!err.contains("index.json"), "{err}");
}

#[test]
fn an_empty_checkpoint_is_refused_not_converted_to_an_empty_model() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    copy_fixture(&src);
    // A safetensors file with an empty header: no tensors.
    let mut empty = 8u64.to_le_bytes().to_vec();
    empty.extend_from_slice(b"{}      ");
    std::fs::write(src.join("model.safetensors"), empty).expect("write");
    let out = tmp.path().join("out");
    let (c, err) = code_and_err(&["convert", path(&src), "-o", path(&out)]);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("no tensors"), "{err}");
    assert!(
        !out.join("manifest.json").exists(),
        "an empty model was written"
    );
}

#[test]
fn an_output_inside_the_source_directory_or_naming_a_file_is_refused_before_writing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    copy_fixture(&src);
    let before: Vec<_> = std::fs::read_dir(&src).expect("ls").collect();
    for inside in [src.join("out"), src.join("a/b")] {
        let (c, err) = code_and_err(&["convert", path(&src), "-o", path(&inside)]);
        assert_eq!(c, 2, "{err}");
        assert!(err.contains("inside the source directory"), "{err}");
        assert_eq!(
            std::fs::read_dir(&src).expect("ls").count(),
            before.len(),
            "something was written into the source directory"
        );
    }
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"mine").expect("write");
    let (c, err) = code_and_err(&["convert", path(&src), "-o", path(&file)]);
    assert_eq!(c, 2, "{err}");
    assert!(err.contains("a file, not a directory"), "{err}");
    assert!(!err.contains("rerun"), "a resume hint for a file: {err}");
    assert_eq!(std::fs::read(&file).expect("read"), b"mine");
}

#[test]
fn a_gguf_lacking_a_declared_layer_is_said_so_by_convert_never_hinted_to_add_it_with_layers() {
    // metadata.gguf: block_count 2, tensors of block 0 only. Converting it said "1 of 2 layers
    // present" with exit 0, and run then hinted `--layers 1`, which selects no layer of it.
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let gguf = gguf_fixture("metadata.gguf");
    let (c, err) = code_and_err(&["convert", path(&gguf), "-o", path(&out), "--quiet"]);
    assert_eq!(c, 1, "{err}");
    assert!(
        err.contains("holds no tensors of layer 1") && err.contains("(2 layers)"),
        "{err}"
    );
    assert!(!err.contains("--layers 1"), "{err}");
    for line in err.lines().filter(|l| l.contains("--layers ")) {
        assert!(
            line.contains("cannot add them"),
            "a --layers run is hinted: {line}"
        );
    }
    // What the model's incomplete hint says at run: never that this source can supply it.
    let (c, _, err) = tarfa(&["run", path(&out), "--tokens", "1", "-n", "1"]);
    assert_eq!(c, 1, "{err}");
    assert!(err.contains("cannot supply it"), "{err}");
}
