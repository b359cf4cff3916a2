//! GGUF to JNF, held to gguf-py (the format's own Python library): every JNF extent of a converted
//! GGUF equals gguf-py's tensor bytes cut per expert, every other tensor is byte-identical, every
//! key/value is in the manifest with its type, quantized experts keep their type and bytes, and
//! layer ranges, reruns and split sets behave as for safetensors.
//!
//! The gguf-py view comes from `fixtures/gguf/expert_slices.py`. A missing python3 or gguf
//! package skips these tests, saying so, or fails them where tools are required (`tarfa_testtools`:
//! `TARFA_REQUIRE_TOOLS=1`, as `.ci/run` sets, or `CI`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value as Json};
use sha2::{Digest, Sha256};
use tarfa_converter::{convert, ConvertError, ExpertFault, Options, OutputFault, Quiet, Summary};
use tarfa_format::manifest::Manifest;
use tarfa_format::JnfReader;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf")
}

/// gguf-py's view of one GGUF file (see `fixtures/gguf/expert_slices.py`).
fn py_view(path: &Path) -> Json {
    let out = Command::new("python3")
        .arg("-B")
        .arg(fixtures().join("expert_slices.py"))
        .arg(path)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "expert_slices.py {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("expert_slices.py prints JSON")
}

fn run(src: &Path, out: &Path, layers: Option<(u32, u32)>) -> Summary {
    let opts = Options {
        layers,
        direct_io: false,
        ..Options::default()
    };
    convert(src, out, &opts, &Quiet).unwrap_or_else(|e| panic!("convert {}: {e}", src.display()))
}

/// One region of a converted model: what it claims to come from and the hash of its bytes.
#[derive(Debug)]
struct RegionView {
    file: String,
    name: String,
    src_file: String,
    src_tensor: String,
    dtype: String,
    src_shape: Vec<u64>,
    sha256: String,
}

fn regions(out: &Path) -> Vec<RegionView> {
    let m = Manifest::load(out).expect("manifest");
    let mut v = Vec::new();
    for f in m.files.iter().filter(|f| f.path.ends_with(".jnf")) {
        let r = JnfReader::open(out.join(&f.path)).expect("open jnf");
        let idx = r.index();
        for (i, rec) in r.regions().iter().enumerate() {
            let bytes = r.read_region_verified(i as u32).expect("region bytes");
            v.push(RegionView {
                file: f.path.clone(),
                name: idx.str(rec.name).to_string(),
                src_file: idx.str(rec.src_file).to_string(),
                src_tensor: idx.str(rec.src_tensor).to_string(),
                dtype: rec
                    .dtype()
                    .map(|d| d.name().to_string())
                    .unwrap_or_default(),
                src_shape: rec.src_shape().to_vec(),
                sha256: hex::encode(Sha256::digest(&bytes)),
            });
        }
    }
    v
}

/// `name[e]` → `(name, Some(e))`; a whole tensor → `(name, None)`.
fn expert_of(region: &str) -> (&str, Option<usize>) {
    match region.strip_suffix(']').and_then(|r| r.rsplit_once('[')) {
        Some((t, e)) => (t, e.parse().ok()),
        None => (region, None),
    }
}

/// Convert `src` and check every region against gguf-py's bytes of every part; returns the
/// output directory (kept alive by the returned TempDir).
fn convert_and_cross_check(src: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    run(src, &out, None);
    let m = Manifest::load(&out).expect("manifest");
    assert_eq!(m.architecture.source_format, "gguf");
    assert!(
        m.tokenizer.is_empty(),
        "a GGUF's tokenizer is in the config"
    );
    // (part, tensor) -> gguf-py's entry.
    let mut want: BTreeMap<(String, String), Json> = BTreeMap::new();
    for s in &m.conversion.sources {
        let view = py_view(&src.parent().expect("dir").join(&s.path));
        for t in view["tensors"].as_array().expect("tensors") {
            let name = t["name"].as_str().expect("name").to_string();
            want.insert((s.path.clone(), name), t.clone());
        }
    }
    let mut covered = BTreeSet::new();
    for r in regions(&out) {
        let key = (r.src_file.clone(), r.src_tensor.clone());
        let py = want.get(&key).unwrap_or_else(|| {
            panic!(
                "{}: region {} names {key:?}, not in gguf-py's view",
                r.file, r.name
            )
        });
        assert_eq!(r.dtype, py["type"], "{}: type of {}", r.file, r.name);
        assert_eq!(
            json!(r.src_shape),
            py["shape"],
            "{}: shape of {}",
            r.file,
            r.name
        );
        let (tensor, e) = expert_of(&r.name);
        assert_eq!(tensor, r.src_tensor, "{}: region name", r.file);
        let expected = match e {
            Some(e) => &py["experts"][e],
            None => &py["sha256"],
        };
        assert_eq!(
            r.sha256, *expected,
            "{}: bytes of {} differ from gguf-py's",
            r.file, r.name
        );
        assert!(covered.insert((key, e)), "{} written twice", r.name);
    }
    // Nothing dropped: every tensor whole, or every expert of every stack.
    for (key, py) in &want {
        match py["experts"].as_array() {
            Some(es) => {
                for e in 0..es.len() {
                    assert!(
                        covered.contains(&(key.clone(), Some(e))),
                        "{key:?} expert {e} missing"
                    );
                }
            }
            None => assert!(covered.contains(&(key.clone(), None)), "{key:?} missing"),
        }
    }
    (tmp, out)
}

#[test]
fn every_extent_equals_gguf_py_bytes_cut_per_expert() {
    if !tarfa_testtools::python_gguf() {
        return;
    }
    for name in [
        "moe.gguf",
        "moe-model.gguf",
        "split-00001-of-00003.gguf",
        "split-00002-of-00003.gguf",
        "metadata.gguf",
        "quants.gguf",
    ] {
        convert_and_cross_check(&fixtures().join(name));
    }
}

#[test]
fn quantized_experts_keep_their_type_and_grid() {
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let (_tmp, out) = convert_and_cross_check(&fixtures().join("moe-model.gguf"));
    let m = Manifest::load(&out).expect("manifest");
    assert_eq!(
        m.architecture.num_layers, 3,
        "block_count counts the nextn layer"
    );
    assert_eq!(m.layers, vec![0, 1, 2]);
    let roles = |layer: u32| -> (u32, Vec<(String, String)>) {
        let r = JnfReader::open(out.join(format!("layer-{layer:05}.jnf"))).expect("layer");
        let x = r.expert(layer, 0);
        let roles = x
            .map(|x| {
                (x.first_region..x.first_region + x.region_count)
                    .map(|i| {
                        let rec = &r.regions()[i as usize];
                        let role = tarfa_format::Role::from_code(rec.role)
                            .map(|r| r.name().to_string())
                            .unwrap_or_default();
                        let dtype = rec
                            .dtype()
                            .map(|d| d.name().to_string())
                            .unwrap_or_default();
                        (role, dtype)
                    })
                    .collect()
            })
            .unwrap_or_default();
        (r.header().experts_per_layer, roles)
    };
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(roles(0), (0, vec![]), "layer 0 is dense");
    assert_eq!(
        roles(1),
        (
            4,
            vec![s("gate", "Q4_K"), s("up", "Q5_K"), s("down", "Q8_0")]
        )
    );
    let (n, r2) = roles(2);
    assert_eq!(n, 4);
    let mut r2: Vec<String> = r2.into_iter().map(|(r, d)| format!("{r}:{d}")).collect();
    r2.sort();
    assert_eq!(
        r2,
        [
            "down:Q6_K",
            "down_bias:F32",
            "gate_up:Q8_0",
            "gate_up_bias:F32"
        ]
    );
    // nextn, router and shared-expert tensors are plain tensors of their layer.
    let l1 = JnfReader::open(out.join("layer-00001.jnf")).expect("layer 1");
    for t in [
        "blk.1.ffn_gate_inp.weight",
        "blk.1.exp_probs_b.bias",
        "blk.1.ffn_up_shexp.weight",
    ] {
        assert!(l1.region_by_name(t).is_some(), "{t}");
    }
    let l2 = JnfReader::open(out.join("layer-00002.jnf")).expect("layer 2");
    assert!(l2.region_by_name("blk.2.nextn.eh_proj.weight").is_some());
    let trunk = JnfReader::open(out.join("trunk.jnf")).expect("trunk");
    let names: Vec<&str> = (0..trunk.regions().len() as u32)
        .map(|i| trunk.name(i))
        .collect();
    assert_eq!(
        names,
        ["token_embd.weight", "output_norm.weight", "output.weight"]
    );
}

/// gguf_dump.py's form of one of our typed config values: floats as their bit patterns.
fn dump_form(typ: &str, v: &Json) -> Json {
    let float_bits = |v: &Json, wide: bool| -> Json {
        if let Some(s) = v.as_str() {
            let bits = match s {
                "inf" if wide => f64::INFINITY.to_bits(),
                "-inf" if wide => f64::NEG_INFINITY.to_bits(),
                "inf" => u64::from(f32::INFINITY.to_bits()),
                "-inf" => u64::from(f32::NEG_INFINITY.to_bits()),
                s => u64::from_str_radix(s.strip_prefix("nan:0x").expect("nan:0x…"), 16)
                    .expect("hex bits"),
            };
            return json!(bits);
        }
        let x = v.as_f64().expect("a float is a number or a string");
        if wide {
            json!(x.to_bits())
        } else {
            json!((x as f32).to_bits())
        }
    };
    match typ {
        "f32" => float_bits(v, false),
        "f64" => float_bits(v, true),
        _ => v.clone(),
    }
}

fn py_type(typ: &str) -> &'static str {
    match typ {
        "u8" => "UINT8",
        "i8" => "INT8",
        "u16" => "UINT16",
        "i16" => "INT16",
        "u32" => "UINT32",
        "i32" => "INT32",
        "f32" => "FLOAT32",
        "bool" => "BOOL",
        "string" => "STRING",
        "array" => "ARRAY",
        "u64" => "UINT64",
        "i64" => "INT64",
        "f64" => "FLOAT64",
        other => panic!("unknown type name {other:?}"),
    }
}

/// An array of our form as gguf_dump.py's `{"t": "ARRAY", "elem": …, "v": […]}`.
fn dump_array(a: &Json) -> Json {
    let elem = a["elem"].as_str().expect("elem");
    let items: Vec<Json> = a["value"]
        .as_array()
        .expect("array value")
        .iter()
        .map(|x| {
            if elem == "array" {
                dump_array(x)
            } else {
                dump_form(elem, x)
            }
        })
        .collect();
    json!({"t": "ARRAY", "elem": py_type(elem), "v": items})
}

#[test]
fn every_key_value_is_in_the_manifest_with_its_type() {
    if !tarfa_testtools::python_gguf() {
        return;
    }
    for name in [
        "metadata.gguf",
        "moe-model.gguf",
        "split-00003-of-00003.gguf",
    ] {
        let src = fixtures().join(name);
        let tmp = tempfile::tempdir().expect("tempdir");
        run(&src, tmp.path(), None);
        let m = Manifest::load(tmp.path()).expect("manifest");
        let config = m.architecture.config.as_object().expect("config object");
        // gguf-split writes the key/values into the first part only.
        let first = match name.strip_suffix("-00003-of-00003.gguf") {
            Some(prefix) => fixtures().join(format!("{prefix}-00001-of-00003.gguf")),
            None => src.clone(),
        };
        let py = py_view(&first);
        let mut n = 0;
        for kv in py["kv"].as_array().expect("kv") {
            let key = kv["key"].as_str().expect("key");
            if key.starts_with("split.") {
                assert!(
                    !config.contains_key(key),
                    "{name}: {key} describes the packaging"
                );
                continue;
            }
            n += 1;
            let ours = config
                .get(key)
                .unwrap_or_else(|| panic!("{name}: {key} missing from the manifest"));
            let typ = ours["type"].as_str().expect("type");
            let got = if typ == "array" {
                let mut a = dump_array(ours);
                a["key"] = json!(key);
                a
            } else {
                json!({"key": key, "t": py_type(typ), "v": dump_form(typ, &ours["value"])})
            };
            assert_eq!(&got, kv, "{name}: {key}");
        }
        assert_eq!(config.len(), n, "{name}: keys gguf-py does not have");
    }
}

fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("list")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .map(|n| {
            let b = std::fs::read(dir.join(&n)).expect("read");
            (n, b)
        })
        .collect()
}

#[test]
fn layer_ranges_in_two_runs_give_the_bytes_of_one_run() {
    let src = fixtures().join("moe-model.gguf");
    let tmp = tempfile::tempdir().expect("tempdir");
    let (one, two) = (tmp.path().join("one"), tmp.path().join("two"));
    run(&src, &one, None);
    let a = run(&src, &two, Some((0, 0)));
    assert_eq!(a.layers_written, vec![0]);
    assert_eq!(Manifest::load(&two).expect("manifest").layers, vec![0]);
    let b = run(&src, &two, Some((1, 2)));
    assert_eq!(b.layers_written, vec![1, 2]);
    assert!(!b.trunk_written, "the trunk was written by the first run");
    assert_eq!(files(&one), files(&two));
}

#[test]
fn a_rerun_skips_every_layer_already_present() {
    let src = fixtures().join("moe-model.gguf");
    let tmp = tempfile::tempdir().expect("tempdir");
    run(&src, tmp.path(), None);
    let before = files(tmp.path());
    let s = run(&src, tmp.path(), None);
    assert!(s.layers_written.is_empty() && !s.trunk_written);
    assert_eq!(s.layers_skipped, vec![0, 1, 2]);
    assert_eq!(files(tmp.path()), before);
}

#[test]
fn a_split_set_converts_the_same_from_any_part() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut outs = Vec::new();
    for k in 1..=3 {
        let out = tmp.path().join(format!("from-{k}"));
        run(
            &fixtures().join(format!("split-0000{k}-of-00003.gguf")),
            &out,
            None,
        );
        outs.push(files(&out));
    }
    assert_eq!(outs[0], outs[1]);
    assert_eq!(outs[0], outs[2]);
    let m = Manifest::load(&tmp.path().join("from-2")).expect("manifest");
    let parts: Vec<&str> = m
        .conversion
        .sources
        .iter()
        .map(|s| s.path.as_str())
        .collect();
    assert_eq!(
        parts,
        [
            "split-00001-of-00003.gguf",
            "split-00002-of-00003.gguf",
            "split-00003-of-00003.gguf"
        ]
    );
}

#[test]
fn the_header_hash_is_of_the_bytes_before_the_data_section() {
    let src = fixtures().join("moe.gguf");
    let tmp = tempfile::tempdir().expect("tempdir");
    run(&src, tmp.path(), None);
    let m = Manifest::load(tmp.path()).expect("manifest");
    let h = tarfa_gguf::GgufFile::open(&src).expect("gguf");
    let bytes = std::fs::read(&src).expect("read");
    let want = hex::encode(Sha256::digest(&bytes[..h.header().data_start as usize]));
    assert_eq!(
        m.conversion.sources[0].header_sha256.as_deref(),
        Some(want.as_str())
    );
    assert_eq!(m.conversion.sources[0].size, bytes.len() as u64);
}

#[test]
fn the_output_may_be_neither_the_gguf_itself_nor_its_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("m.gguf");
    std::fs::copy(fixtures().join("moe.gguf"), &src).expect("copy");
    let err = convert(&src, &src, &Options::default(), &Quiet).expect_err("refused");
    assert!(
        matches!(
            err,
            ConvertError::BadOutput {
                fault: OutputFault::IsSourceFile { .. },
                ..
            }
        ),
        "{err}"
    );
    // Its own directory neither: the GGUF would be a file the manifest does not list, which
    // `tarfa verify` reports, so the model could never verify. Nothing is created there.
    for out in [tmp.path().to_path_buf(), tmp.path().join(".")] {
        let err = convert(&src, &out, &Options::default(), &Quiet).expect_err("refused");
        assert!(
            matches!(
                err,
                ConvertError::BadOutput {
                    fault: OutputFault::HoldsSource { .. },
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("holds the source m.gguf"), "{err}");
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, ["m.gguf"], "only the source is there");
    }
    assert_eq!(
        std::fs::read(&src).expect("read"),
        std::fs::read(fixtures().join("moe.gguf")).expect("read")
    );
}

#[test]
fn broken_ggufs_are_refused_with_the_gguf_reader_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bytes = std::fs::read(fixtures().join("moe-model.gguf")).expect("read");
    let cases: [(&str, Vec<u8>); 3] = [
        ("truncated.gguf", bytes[..bytes.len() - 100].to_vec()),
        (
            "lfs.gguf",
            b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n".to_vec(),
        ),
        ("magic-only", [&b"GGUF"[..], &[9, 0, 0, 0]].concat()),
    ];
    for (name, b) in cases {
        let src = tmp.path().join(name);
        std::fs::write(&src, &b).expect("write");
        let out = tmp.path().join(format!("out-{name}"));
        let err = convert(&src, &out, &Options::default(), &Quiet).expect_err(name);
        match &err {
            ConvertError::Gguf(e) => assert!(e.violation().is_some(), "{name}: {err}"),
            other => panic!("{name}: {other}"),
        }
        assert!(!out.join("manifest.json").exists());
    }
    // Another model's output directory is refused: its manifest lists other sources.
    let out = tmp.path().join("shared");
    run(&fixtures().join("moe.gguf"), &out, None);
    let err = convert(
        &fixtures().join("moe-model.gguf"),
        &out,
        &Options::default(),
        &Quiet,
    )
    .expect_err("other source");
    assert!(
        matches!(
            err,
            ConvertError::BadOutput {
                fault: OutputFault::OtherCheckpoint,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn an_expert_grid_with_unequal_stacks_is_refused() {
    // blk.0 stacks 4 gate experts but 2 up experts.
    let mut w = tarfa_gguf::GgufWriter::new(32);
    w.add_kv(
        "general.architecture",
        tarfa_gguf::Value::String("x".into()),
    );
    w.add_tensor(
        "blk.0.ffn_gate_exps.weight",
        tarfa_format::Dtype::F32,
        vec![8, 2, 4],
    );
    w.add_tensor(
        "blk.0.ffn_up_exps.weight",
        tarfa_format::Dtype::F32,
        vec![8, 2, 2],
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("bad.gguf");
    let data: Vec<Box<dyn std::io::Read>> = vec![
        Box::new(std::io::repeat(1).take(8 * 2 * 4 * 4)),
        Box::new(std::io::repeat(2).take(8 * 2 * 2 * 4)),
    ];
    w.write_file(&src, data).expect("write gguf");
    let err =
        convert(&src, &tmp.path().join("out"), &Options::default(), &Quiet).expect_err("refused");
    assert!(
        matches!(
            err,
            ConvertError::BadExperts {
                layer: 0,
                fault: ExpertFault::StackCounts { .. }
            }
        ),
        "{err}"
    );
}
