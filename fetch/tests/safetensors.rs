//! The MTP head out of Hugging Face safetensors shards: `model.layers.{num_hidden_layers}.*`
//! found through the index and config.json, `mtp.*` without either; remote equals local.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::bytes;
use common::server::{Fault, FaultServer};
use tarfa_fetch::safetensors::{read_header, write_header};
use tarfa_fetch::{FetchOptions, Fetcher, HttpConfig, RetryPolicy, Selection, Silent};
use tarfa_gguf::FileSource;

type Tensor = (String, String, Vec<u64>, u64);

fn write_shard(
    path: &Path,
    tensors: &[(&str, &str, Vec<u64>)],
    seed: u64,
) -> Vec<(String, Vec<u8>)> {
    let specs: Vec<Tensor> = tensors
        .iter()
        .map(|(n, d, s)| {
            let elem = if *d == "F32" { 4 } else { 2 };
            (
                n.to_string(),
                d.to_string(),
                s.clone(),
                s.iter().product::<u64>() * elem,
            )
        })
        .collect();
    let meta = serde_json::json!({"format": "pt"});
    let (mut file, _, _) = write_header(&specs, Some(&meta), "shard").expect("header");
    let mut out = Vec::new();
    for (i, t) in specs.iter().enumerate() {
        let b = bytes(seed + i as u64, t.3 as usize);
        file.extend_from_slice(&b);
        out.push((t.0.clone(), b));
    }
    std::fs::write(path, file).expect("write shard");
    out
}

/// A two-layer checkpoint with one MTP layer (`model.layers.2.*`) in the second of two shards.
fn write_checkpoint(dir: &Path) -> HashMap<String, Vec<u8>> {
    let h = 64u64;
    let layer = |l: u64| -> Vec<(String, &'static str, Vec<u64>)> {
        vec![
            (
                format!("model.layers.{l}.input_layernorm.weight"),
                "BF16",
                vec![h],
            ),
            (
                format!("model.layers.{l}.self_attn.q_proj.weight"),
                "BF16",
                vec![h, h],
            ),
            (
                format!("model.layers.{l}.mlp.experts.0.up_proj.weight"),
                "BF16",
                vec![h, h],
            ),
            (
                format!("model.layers.{l}.mlp.experts.1.up_proj.weight"),
                "BF16",
                vec![h, h],
            ),
        ]
    };
    let mut s1: Vec<(String, &str, Vec<u64>)> =
        vec![("model.embed_tokens.weight".into(), "BF16", vec![128, h])];
    s1.extend(layer(0));
    s1.extend(layer(1));
    let mut s2 = layer(2);
    s2.extend([
        (
            "model.layers.2.eh_proj.weight".to_string(),
            "BF16",
            vec![h, 2 * h],
        ),
        ("model.layers.2.enorm.weight".to_string(), "F32", vec![h]),
        ("model.layers.2.hnorm.weight".to_string(), "F32", vec![h]),
        ("lm_head.weight".to_string(), "BF16", vec![128, h]),
        ("model.norm.weight".to_string(), "BF16", vec![h]),
    ]);
    let as_ref = |v: &[(String, &'static str, Vec<u64>)]| -> Vec<(String, &'static str, Vec<u64>)> {
        v.to_vec()
    };
    let mut all = HashMap::new();
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in [as_ref(&s1), as_ref(&s2)].iter().enumerate() {
        let name = format!("model-{:05}-of-00002.safetensors", i + 1);
        let specs: Vec<(&str, &str, Vec<u64>)> = shard
            .iter()
            .map(|(n, d, s)| (n.as_str(), *d, s.clone()))
            .collect();
        for (n, b) in write_shard(&dir.join(&name), &specs, 100 * (i as u64 + 1)) {
            weight_map.insert(n.clone(), serde_json::Value::from(name.clone()));
            all.insert(n, b);
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    let config = serde_json::json!({"num_hidden_layers": 2, "num_nextn_predict_layers": 1});
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    all
}

fn options(sel: Selection) -> FetchOptions {
    FetchOptions {
        selection: sel,
        http: HttpConfig {
            token: None,
            retry: RetryPolicy {
                attempts: 2,
                base_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(5),
            },
            timeout: Duration::from_secs(10),
            ..HttpConfig::default()
        },
        ..FetchOptions::default()
    }
}

fn fetch(sel: Selection, source: &str, out: &Path) -> tarfa_fetch::FetchReport {
    let f = Fetcher::new(options(sel));
    let plan = f.plan(source).expect("plan");
    f.fetch(&plan, out, &Silent).expect("fetch")
}

fn mtp() -> Selection {
    Selection {
        mtp: true,
        globs: Vec::new(),
    }
}

#[test]
fn mtp_layers_from_sharded_safetensors_remote_equal_local_and_the_source_bytes() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = write_checkpoint(root.path());
    let files: HashMap<String, Vec<u8>> = std::fs::read_dir(root.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                format!("/st/{}", e.file_name().to_string_lossy()),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    let server = FaultServer::start("127.0.0.1", files, Fault::None);
    let out = tempfile::tempdir().expect("tempdir");
    let local = out.path().join("local.safetensors");
    let remote = out.path().join("remote.safetensors");
    fetch(mtp(), &root.path().display().to_string(), &local);
    let url = format!("{}/st/model.safetensors.index.json", server.base);
    let r = fetch(mtp(), &url, &remote);
    assert!(std::fs::read(&local).expect("local") == std::fs::read(&remote).expect("remote"));
    // Only the second shard's header and the MTP bytes travelled (plus the index and config).
    assert!(server.seen().iter().all(|s| !s.path.contains("00001-of")));
    // Any shard stands for the checkpoint, through the index beside it.
    let via_shard = out.path().join("via_shard.safetensors");
    let shard_url = format!("{}/st/model-00001-of-00002.safetensors", server.base);
    fetch(mtp(), &shard_url, &via_shard);
    assert!(std::fs::read(&via_shard).expect("read") == std::fs::read(&local).expect("local"));
    assert!(r.bytes_transferred < r.tensor_bytes + r.source_header_bytes + 64 * 1024 + 4096);

    let h = read_header(&FileSource::open(&remote).expect("open")).expect("parse output");
    let file = std::fs::read(&remote).expect("read");
    let mut names: Vec<&str> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "model.layers.2.eh_proj.weight",
            "model.layers.2.enorm.weight",
            "model.layers.2.hnorm.weight",
            "model.layers.2.input_layernorm.weight",
            "model.layers.2.mlp.experts.0.up_proj.weight",
            "model.layers.2.mlp.experts.1.up_proj.weight",
            "model.layers.2.self_attn.q_proj.weight",
        ]
    );
    for t in &h.tensors {
        assert!(
            file[t.begin as usize..t.end as usize] == src[&t.name][..],
            "{}",
            t.name
        );
    }
    assert_eq!(h.metadata, Some(serde_json::json!({"format": "pt"})));

    // A glob adds what --mtp leaves out (the shared head).
    let with_head = out.path().join("head.safetensors");
    let sel = Selection {
        mtp: true,
        globs: vec!["lm_head.*".into()],
    };
    fetch(sel, &url, &with_head);
    let h = read_header(&FileSource::open(&with_head).expect("open")).expect("parse");
    assert_eq!(h.tensors.len(), 8);
}

#[test]
fn qwen_style_mtp_tensors_are_found_without_a_config() {
    let root = tempfile::tempdir().expect("tempdir");
    let p = root.path().join("model.safetensors");
    write_shard(
        &p,
        &[
            ("model.layers.0.mlp.gate.weight", "BF16", vec![8, 16]),
            ("mtp.fc.weight", "BF16", vec![16, 32]),
            ("mtp.layers.0.mlp.gate.weight", "BF16", vec![8, 16]),
            ("mtp.norm.weight", "F32", vec![16]),
        ],
        7,
    );
    let out = root.path().join("out.safetensors");
    let r = fetch(mtp(), &p.display().to_string(), &out);
    assert_eq!(r.tensors, 3);
    let h = read_header(&FileSource::open(&out).expect("open")).expect("parse");
    assert!(h.tensors.iter().all(|t| t.name.starts_with("mtp.")));
}

#[test]
fn a_checkpoint_without_an_mtp_head_is_a_clear_error() {
    let root = tempfile::tempdir().expect("tempdir");
    let p = root.path().join("model.safetensors");
    write_shard(
        &p,
        &[("model.layers.0.mlp.gate.weight", "BF16", vec![8, 16])],
        7,
    );
    std::fs::write(
        root.path().join("config.json"),
        r#"{"num_hidden_layers": 1}"#,
    )
    .expect("config");
    let f = Fetcher::new(options(mtp()));
    let e = f.plan(&p.display().to_string()).expect_err("must fail");
    assert!(
        matches!(
            e,
            tarfa_fetch::FetchError::NothingSelected {
                why: tarfa_fetch::error::SelectFault::NoMtpLayers { layers: 1 },
                ..
            }
        ),
        "{e}"
    );
    // Without config.json nothing tells the MTP layers.
    std::fs::remove_file(root.path().join("config.json")).expect("rm config");
    let e = f.plan(&p.display().to_string()).expect_err("must fail");
    assert!(
        matches!(
            e,
            tarfa_fetch::FetchError::NothingSelected {
                why: tarfa_fetch::error::SelectFault::NoMtpNoConfig,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_broken_index_is_refused_naming_the_rule() {
    use tarfa_fetch::{FetchError, IndexFault};
    let dir = tempfile::tempdir().expect("tempdir");
    write_checkpoint(dir.path());
    let index = dir.path().join("model.safetensors.index.json");
    let plan = |text: &str| {
        std::fs::write(&index, text).expect("index");
        Fetcher::new(options(mtp()))
            .plan(index.to_str().expect("utf8"))
            .expect_err("refused")
    };
    let fault = |e: FetchError| match e {
        FetchError::BadIndex { fault, .. } => fault,
        other => panic!("{other}"),
    };
    assert!(matches!(fault(plan("{")), IndexFault::NotJson { .. }));
    assert_eq!(fault(plan("{}")), IndexFault::NoWeightMap);
    assert!(matches!(
        fault(plan(r#"{"weight_map": {"w": "../x.safetensors"}}"#)),
        IndexFault::ShardName { tensor, .. } if tensor == "w"
    ));
    assert!(matches!(
        fault(plan(r#"{"weight_map": {"model.layers.2.enorm.weight": "model-00001-of-00002.safetensors"}}"#)),
        IndexFault::TensorMissing { tensor } if tensor == "model.layers.2.enorm.weight"
    ));
}
