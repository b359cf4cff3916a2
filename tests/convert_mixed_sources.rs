//! Issue 13, item 5, as a user meets it: `tarfa convert --layers 0`, the checkpoint's layer-0
//! bytes change under the same header (a fine-tune saved over it), `tarfa convert --layers 1`
//! is refused with exit 1, naming the source file, the layer and the tensor, and the directory
//! still verifies as the piece it was; converting both layers then gives a clean model.

mod common;

use std::os::unix::fs::FileExt;

use common::{path, tarfa};

#[test]
fn a_layers_run_over_layers_of_an_earlier_version_of_the_source_exits_1_naming_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/qwen3_moe");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    for e in std::fs::read_dir(&fixture).expect("fixture") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), src.join(e.file_name())).expect("copy");
    }
    let out = tmp.path().join("out");
    let (code, stdout, err) = tarfa(&[
        "convert",
        path(&src),
        "-o",
        path(&out),
        "--layers",
        "0",
        "-q",
    ]);
    assert_eq!(code, 0, "{stdout}{err}");
    let manifest = std::fs::read(out.join("manifest.json")).expect("manifest");

    let (at, tensor) = {
        let r = tarfa_format::JnfReader::open(out.join("layer-00000.jnf")).expect("open");
        let i = r.regions().len() - 1;
        let rec = &r.regions()[i];
        (rec.src_begin, r.index().str(rec.src_tensor).to_string())
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(src.join("model.safetensors"))
        .expect("open source");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x02], at).expect("write");
    drop(f);

    let (code, stdout, err) = tarfa(&[
        "convert",
        path(&src),
        "-o",
        path(&out),
        "--layers",
        "1",
        "-q",
    ]);
    assert_eq!(code, 1, "{stdout}{err}");
    for want in [
        "model.safetensors",
        "layer 0",
        tensor.as_str(),
        "nothing was written",
    ] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
    assert_eq!(
        std::fs::read(out.join("manifest.json")).expect("manifest"),
        manifest
    );
    assert!(!out.join("layer-00001.jnf").exists());

    let (code, stdout, err) = tarfa(&["convert", path(&src), "-o", path(&out), "-q", "--verify"]);
    assert_eq!(code, 0, "{stdout}{err}");
    let (code, stdout, err) = tarfa(&["verify", path(&out), "--source", path(&src)]);
    assert_eq!(code, 0, "{stdout}{err}");
}
