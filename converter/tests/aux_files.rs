//! Config, generation config and tokenizer files travel with the model: copied byte for byte into
//! the model directory, listed in the manifest with their hashes, the tokenizer ones named as the
//! tokenizer; files that are neither stay behind.

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options, Quiet};
use tarfa_format::manifest::{FileKind, Manifest};

#[test]
fn tokenizer_and_config_files_are_copied_verbatim_and_listed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
    write_checkpoint(&src, &SynthSpec::small()).expect("checkpoint");
    let files: [(&str, &[u8]); 5] = [
        (
            "tokenizer.json",
            b"{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n",
        ),
        ("tokenizer_config.json", b"{\"eos_token\": \"</s>\"}"),
        (
            "chat_template.jinja",
            b"{% for m in messages %}{{ m.content }}{% endfor %}",
        ),
        ("generation_config.json", b"{\"do_sample\": false}"),
        ("README.md", b"# not part of the model\n"),
    ];
    for (name, bytes) in files {
        std::fs::write(src.join(name), bytes).expect("write");
    }
    convert(&src, &out, &Options::default(), &Quiet).expect("convert");
    let m = Manifest::load(&out).expect("manifest");
    for (name, bytes) in &files[..4] {
        assert_eq!(
            &std::fs::read(out.join(name)).expect("copied"),
            bytes,
            "{name}"
        );
        let e = m.files.iter().find(|f| f.path == *name).expect("listed");
        assert_eq!((e.kind, e.size), (FileKind::Aux, bytes.len() as u64));
        assert_eq!(
            e.sha256,
            hex::encode(tarfa_format::hash::dual_hash(bytes).sha256)
        );
    }
    assert_eq!(
        m.tokenizer,
        [
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja"
        ],
        "the tokenizer files, in the converter's fixed order"
    );
    assert!(
        !out.join("README.md").exists(),
        "only model files are copied"
    );
    assert!(m.files.iter().any(|f| f.path == "config.json"));
}
