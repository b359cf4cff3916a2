//! What gets selected from a GGUF: globs add to --mtp, a glob that matches nothing and a model
//! without an MTP head are clear errors.

mod common;

use std::io::Read;

use common::{write_glm, BLOCKS, NEXTN};
use tarfa_fetch::error::SelectFault;
use tarfa_fetch::{FetchError, FetchOptions, Fetcher, Selection, Silent};
use tarfa_gguf::{Dtype, GgufWriter, Value};

fn fetcher(mtp: bool, globs: &[&str]) -> Fetcher {
    Fetcher::new(FetchOptions {
        selection: Selection {
            mtp,
            globs: globs.iter().map(|g| g.to_string()).collect(),
        },
        ..FetchOptions::default()
    })
}

#[test]
fn globs_add_the_trunk_tensors_that_mtp_leaves_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let src = model.parts[0].display().to_string();
    let f = fetcher(true, &["token_embd.weight", "output*"]);
    let plan = f.plan(&src).expect("plan");
    assert_eq!(plan.tensors.len(), model.mtp_tensors.len() + 3);
    let out = root.path().join("draft.gguf");
    f.fetch(&plan, &out, &Silent).expect("fetch");
    let draft = tarfa_gguf::GgufFile::open(&out).expect("open");
    for name in ["token_embd.weight", "output.weight", "output_norm.weight"] {
        assert!(draft.header().tensor(name).is_some(), "{name}");
    }
    // Only the glob, no --mtp: one tensor.
    let plan = fetcher(false, &["blk.0.attn_q.weight"])
        .plan(&src)
        .expect("plan");
    assert_eq!(plan.tensors.len(), 1);
    let mtp_blocks: Vec<u64> = model
        .mtp_tensors
        .iter()
        .filter_map(|n| n.split('.').nth(1)?.parse().ok())
        .collect();
    assert!(mtp_blocks.iter().all(|&b| b >= BLOCKS - NEXTN));
}

#[test]
fn a_glob_that_matches_nothing_is_an_error_naming_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let e = fetcher(true, &["blk.*.no_such"])
        .plan(&model.parts[1].display().to_string())
        .expect_err("must fail");
    assert!(
        matches!(
            &e,
            FetchError::NothingSelected {
                why: SelectFault::GlobMatchesNone { glob },
                ..
            } if glob == "blk.*.no_such"
        ),
        "{e}"
    );
    assert!(e.to_string().contains("blk.*.no_such"), "{e}");
}

#[test]
fn a_gguf_without_an_mtp_head_says_so() {
    let root = tempfile::tempdir().expect("tempdir");
    let f32 = Dtype::from_name("F32").expect("F32");
    // No nextn key at all.
    let mut w = GgufWriter::new(32);
    w.add_kv("general.architecture", Value::String("qwen3moe".into()))
        .add_kv("qwen3moe.block_count", Value::U32(2))
        .add_tensor("blk.1.attn_norm.weight", f32, vec![8]);
    let p = root.path().join("plain.gguf");
    let data: Vec<Box<dyn Read>> = vec![Box::new(std::io::Cursor::new(vec![0u8; 32]))];
    w.write_file(&p, data).expect("write");
    let e = fetcher(true, &[])
        .plan(&p.display().to_string())
        .expect_err("must fail");
    assert!(
        matches!(
            &e,
            FetchError::NothingSelected {
                why: SelectFault::NoGgufMtp { key, arch },
                ..
            } if key == "qwen3moe.nextn_predict_layers" && arch == "qwen3moe"
        ),
        "{e}"
    );
    assert!(e.to_string().contains("no MTP head"), "{e}");

    // The key says one MTP block, but the converter dropped its tensors.
    let mut w = GgufWriter::new(32);
    w.add_kv("general.architecture", Value::String("deepseek2".into()))
        .add_kv("deepseek2.block_count", Value::U32(2))
        .add_kv("deepseek2.nextn_predict_layers", Value::U32(1))
        .add_tensor("blk.0.attn_norm.weight", f32, vec![8]);
    let p = root.path().join("dropped.gguf");
    let data: Vec<Box<dyn Read>> = vec![Box::new(std::io::Cursor::new(vec![0u8; 32]))];
    w.write_file(&p, data).expect("write");
    let e = fetcher(true, &[])
        .plan(&p.display().to_string())
        .expect_err("must fail");
    assert!(
        matches!(
            &e,
            FetchError::NothingSelected {
                why: SelectFault::MtpBlockEmpty {
                    first: 1,
                    last: 1,
                    block: 1,
                    ..
                },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("block 1 has no tensors"), "{e}");
}

#[test]
fn nothing_asked_is_its_own_fault() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let e = fetcher(false, &[])
        .plan(&model.parts[1].display().to_string())
        .expect_err("must fail");
    assert!(
        matches!(
            e,
            FetchError::NothingSelected {
                why: SelectFault::NothingAsked,
                ..
            }
        ),
        "{e}"
    );
}
