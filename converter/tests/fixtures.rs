//! Every checkpoint converts losslessly: each source tensor, as the safetensors crate reads it,
//! is in the output with identical bytes, in the right file, with provenance pointing at exactly
//! those bytes of the source; nothing is dropped and nothing added; every expert extent is
//! aligned; every hash checks; the manifest lists every layer and the copied config files.
//!
//! Checkpoints: the five made by transformers' `save_pretrained` (`fixtures/hf/`), and generated
//! ones: fused, sharded in three, with an MTP layer, Mixtral-named and sharded, and fused in the
//! other dimension order with biases.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use sha2::Digest;
use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_format::layout::NONE;
use tarfa_format::manifest::{layer_file_name, FileKind, Manifest, MANIFEST_NAME, TRUNK_NAME};
use tarfa_format::{Dtype, JnfReader, Role, ALIGN};

use common::{fixture, run, source_shards, FIXTURES};

/// The layer a tensor name belongs to: a `layers.L` pair of segments.
fn layer_of(name: &str) -> Option<u32> {
    let segs: Vec<&str> = name.split('.').collect();
    segs.windows(2)
        .find(|w| w[0] == "layers" && w[1].bytes().all(|b| b.is_ascii_digit()))
        .and_then(|w| w[1].parse().ok())
}

/// What a tensor name says about experts: `Some((Some(e), role))` for `experts.E.proj.{weight,bias}`,
/// `Some((None, role))` for a fused stack `experts.proj[_bias]`, `None` for anything else.
fn expert_role(name: &str) -> Option<(Option<u32>, Role)> {
    let segs: Vec<&str> = name.split('.').collect();
    let at = segs.iter().position(|s| *s == "experts")?;
    let role = |proj: &str, bias: bool| match (proj, bias) {
        ("gate_proj" | "w1", false) => Role::Gate,
        ("up_proj" | "w3", false) => Role::Up,
        ("down_proj" | "w2", false) => Role::Down,
        ("gate_up_proj", false) => Role::GateUp,
        ("gate_up_proj", true) => Role::GateUpBias,
        ("down_proj", true) => Role::DownBias,
        _ => panic!("{name}: an expert tensor this test does not know"),
    };
    match &segs[at + 1..] {
        [e, proj, suffix] if e.bytes().all(|b| b.is_ascii_digit()) => Some((
            Some(e.parse().expect("expert number")),
            role(proj, *suffix == "bias"),
        )),
        [proj] => Some((
            None,
            match proj.strip_suffix("_bias") {
                Some(p) => role(p, true),
                None => role(proj, false),
            },
        )),
        other => panic!("{name}: unexpected expert name tail {other:?}"),
    }
}

/// A region the source says must be in the output: its name, the source bytes it holds, its
/// shape, and its expert.
struct ExpectedRegion {
    name: String,
    begin: u64,
    end: u64,
    shape: Vec<u64>,
    expert: Option<u32>,
}

/// The output directory, opened: every JNF file by name, and the manifest.
struct Converted {
    files: BTreeMap<String, JnfReader>,
    manifest: Manifest,
}

impl Converted {
    /// The (file, region index) of a region name, searched in every file.
    fn find(&self, name: &str) -> Option<(&str, &JnfReader, u32)> {
        self.files
            .iter()
            .find_map(|(f, r)| r.region_by_name(name).map(|i| (f.as_str(), r, i)))
    }
}

/// Convert `src` into a new directory and prove the conversion lossless against the safetensors
/// crate's reading of the source. Returns the opened output for checks of one family.
fn convert_and_check(src: &Path, out: &Path) -> Converted {
    let summary = run(src, out, None).expect("conversion succeeds");
    let shards = source_shards(src);
    assert!(!shards.is_empty(), "{}: no shards", src.display());

    // Every output file: structurally valid (open) and every byte hashed and checked.
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(out).expect("list output") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        assert!(!name.contains(".tmp-"), "temporary file {name} left behind");
        if name.ends_with(".jnf") {
            let r = JnfReader::open(out.join(&name))
                .unwrap_or_else(|e| panic!("{name}: does not open: {e}"));
            r.verify_data()
                .unwrap_or_else(|e| panic!("{name}: verify_data: {e}"));
            files.insert(name, r);
        }
    }
    let manifest = Manifest::load(out).expect("manifest loads and checks");
    let got = Converted { files, manifest };

    // Every source tensor is in the output: whole, or as per-expert slices of a fused stack.
    let mut claimed: BTreeSet<(String, u32)> = BTreeSet::new();
    let mut source_layers = BTreeSet::new();
    for shard in &shards {
        let st = shard.tensors();
        for (name, view) in st.tensors() {
            let layer = layer_of(&name);
            source_layers.extend(layer);
            let want_file = layer.map_or(TRUNK_NAME.to_string(), layer_file_name);
            let want_dtype = Dtype::from_name(&format!("{:?}", view.dtype()));
            let (span_begin, span_end) = shard.span(&name);
            let role = expert_role(&name);
            let view_shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            let shape = &view_shape;
            let slices: Vec<ExpectedRegion> = match role {
                Some((None, _)) => {
                    let e_count = shape[0];
                    let per = (span_end - span_begin) / e_count;
                    assert_eq!(per * e_count, span_end - span_begin, "{name}: uneven stack");
                    (0..e_count)
                        .map(|e| ExpectedRegion {
                            name: format!("{name}[{e}]"),
                            begin: span_begin + e * per,
                            end: span_begin + (e + 1) * per,
                            shape: shape[1..].to_vec(),
                            expert: Some(e as u32),
                        })
                        .collect()
                }
                _ => vec![ExpectedRegion {
                    name: name.clone(),
                    begin: span_begin,
                    end: span_end,
                    shape: shape.clone(),
                    expert: role.and_then(|r| r.0),
                }],
            };
            let mut joined = Vec::with_capacity(view.data().len());
            for ExpectedRegion {
                name: region,
                begin: b,
                end: e,
                shape,
                expert,
            } in slices
            {
                let (file, r, i) = got
                    .find(&region)
                    .unwrap_or_else(|| panic!("{name}: region {region} is not in the output"));
                assert_eq!(file, want_file, "{region}: in the wrong file");
                assert!(
                    claimed.insert((file.to_string(), i)),
                    "{region}: claimed twice"
                );
                let rec = &r.regions()[i as usize];
                let idx = r.index();
                let bytes = r.read_region(i).expect("read region");
                assert_eq!(rec.dtype(), want_dtype, "{region}: dtype");
                assert_eq!(rec.shape(), shape.as_slice(), "{region}: shape");
                assert_eq!(rec.src_shape(), view_shape, "{region}: source shape");
                assert_eq!(idx.str(rec.src_file), shard.rel, "{region}: src_file");
                assert_eq!(idx.str(rec.src_tensor), name, "{region}: src_tensor");
                assert_eq!(
                    (rec.src_begin, rec.src_end),
                    (b, e),
                    "{region}: source byte range"
                );
                assert!(
                    bytes == shard.bytes[b as usize..e as usize],
                    "{region}: bytes differ from the source bytes its provenance names"
                );
                assert_eq!(rec.offset % ALIGN, 0, "{region}: region offset unaligned");
                match (role, expert) {
                    (Some((_, role)), Some(e)) => {
                        assert_eq!(rec.role, role.code(), "{region}: role");
                        assert_eq!(rec.expert, e, "{region}: expert");
                        let l = layer.expect("expert tensors are in a layer");
                        assert_eq!(
                            r.projection(l, e, role),
                            Some(i),
                            "{region}: projection({l}, {e}, {}) lookup",
                            role.name()
                        );
                    }
                    _ => {
                        assert_eq!(rec.role, Role::Tensor.code(), "{region}: role");
                        assert_eq!(rec.expert, NONE, "{region}: a plain tensor has no expert");
                    }
                }
                joined.extend_from_slice(&bytes);
            }
            assert!(
                joined == view.data(),
                "{name}: output bytes differ from the safetensors crate's reading"
            );
        }
    }

    // Nothing extra: every region of every file was claimed by a source tensor.
    let regions: usize = got.files.values().map(|r| r.regions().len()).sum();
    assert_eq!(
        regions,
        claimed.len(),
        "regions in the output vs from the source"
    );

    // Every expert extent starts and ends on a 4096-byte boundary, and sits in its layer's file.
    for (file, r) in &got.files {
        for x in r.experts() {
            assert_eq!(
                x.extent_offset % ALIGN,
                0,
                "{file}: expert {} offset",
                x.expert
            );
            assert_eq!(
                x.extent_len % ALIGN,
                0,
                "{file}: expert {} length",
                x.expert
            );
            assert_eq!(
                file,
                &layer_file_name(x.layer),
                "expert of layer {}",
                x.layer
            );
        }
    }

    // The manifest: every layer, every file with its size and hash; config files copied verbatim.
    let m = &got.manifest;
    assert_eq!(
        m.layers,
        source_layers.iter().copied().collect::<Vec<_>>(),
        "manifest layers"
    );
    assert_eq!(summary.layers_present, m.layers);
    assert_eq!(
        summary.layers_written, m.layers,
        "a first run writes every layer"
    );
    assert!(m.architecture.num_layers > *source_layers.last().unwrap_or(&0));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("config JSON");
    assert_eq!(m.architecture.config, config, "config recorded verbatim");
    for name in ["config.json", "generation_config.json", "tokenizer.json"] {
        let Ok(want) = std::fs::read(src.join(name)) else {
            continue;
        };
        if name == "tokenizer.json" {
            assert_eq!(m.tokenizer, vec![name.to_string()], "the tokenizer files");
        }
        assert!(
            std::fs::read(out.join(name)).expect("copied") == want,
            "{name} is not byte-identical"
        );
        let e = m
            .files
            .iter()
            .find(|f| f.path == name)
            .unwrap_or_else(|| panic!("{name} not in the manifest"));
        assert_eq!(e.kind, FileKind::Aux);
        assert_eq!(e.sha256, hex::encode(sha2::Sha256::digest(&want)));
    }
    for (file, r) in &got.files {
        let e = m
            .files
            .iter()
            .find(|f| &f.path == file)
            .unwrap_or_else(|| panic!("{file} not in the manifest"));
        assert_eq!(
            e.size,
            std::fs::metadata(out.join(file)).expect("stat").len()
        );
        assert_eq!(
            e.sha256,
            hex::encode(r.root().sha256),
            "{file}: root sha256"
        );
        assert_eq!(
            e.blake3,
            hex::encode(r.root().blake3),
            "{file}: root blake3"
        );
    }
    let listed: BTreeSet<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
    for e in std::fs::read_dir(out).expect("list") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        if name != MANIFEST_NAME && name != ".tarfa-convert.lock" {
            assert!(
                listed.contains(name.as_str()),
                "{name} is not in the manifest"
            );
        }
    }
    got
}

fn experts_per_layer(c: &Converted, layer: u32) -> u32 {
    c.files[&layer_file_name(layer)].header().experts_per_layer
}

#[test]
fn every_fixture_converts_with_every_tensor_byte_identical_and_provenance_exact() {
    for name in FIXTURES {
        let out = tempfile::tempdir().expect("tempdir");
        let c = convert_and_check(&fixture(name), out.path());
        assert!(!c.manifest.layers.is_empty(), "{name}: no layers");
    }
}

#[test]
fn qwen3_moe_fixture_has_four_per_expert_experts_in_each_layer() {
    let out = tempfile::tempdir().expect("tempdir");
    let c = convert_and_check(&fixture("qwen3_moe"), out.path());
    assert_eq!(c.manifest.layers, vec![0, 1]);
    for l in [0, 1] {
        assert_eq!(experts_per_layer(&c, l), 4);
    }
}

#[test]
fn qwen3_moe_b_fixture_has_a_dense_layer_eight_experts_attention_biases_and_no_lm_head() {
    let out = tempfile::tempdir().expect("tempdir");
    let c = convert_and_check(&fixture("qwen3_moe_b"), out.path());
    assert_eq!(c.manifest.layers, vec![0, 1, 2]);
    for l in [0, 2] {
        assert_eq!(experts_per_layer(&c, l), 8);
    }
    let dense = &c.files["layer-00001.jnf"];
    assert_eq!(dense.header().experts_per_layer, 0);
    assert!(dense.experts().is_empty());
    for t in [
        "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.self_attn.q_proj.bias",
        "model.layers.1.self_attn.o_proj.bias",
    ] {
        assert!(dense.region_by_name(t).is_some(), "{t} missing");
    }
    assert!(
        c.find("lm_head.weight").is_none(),
        "tied embeddings: no lm_head.weight"
    );
    assert!(c.find("model.embed_tokens.weight").is_some());
}

#[test]
fn qwen3_5_moe_fixture_keeps_linear_attention_and_the_shared_expert_as_layer_tensors() {
    let out = tempfile::tempdir().expect("tempdir");
    let c = convert_and_check(&fixture("qwen3_5_moe_text"), out.path());
    assert_eq!(c.manifest.layers, vec![0, 1, 2, 3]);
    let r = &c.files["layer-00000.jnf"];
    for t in [
        "model.layers.0.linear_attn.conv1d.weight",
        "model.layers.0.mlp.shared_expert.down_proj.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
    ] {
        let i = r.region_by_name(t).unwrap_or_else(|| panic!("{t} missing"));
        assert_eq!(r.regions()[i as usize].role, Role::Tensor.code(), "{t}");
    }
    assert_eq!(experts_per_layer(&c, 3), 4);
}

#[test]
fn glm4_moe_dense_first_layer_has_no_experts_and_bias_and_shared_experts_are_kept() {
    let out = tempfile::tempdir().expect("tempdir");
    let c = convert_and_check(&fixture("glm4_moe"), out.path());
    assert_eq!(c.manifest.layers, vec![0, 1, 2]);
    let dense = &c.files["layer-00000.jnf"];
    assert_eq!(dense.header().experts_per_layer, 0);
    assert!(dense.experts().is_empty());
    assert!(dense
        .region_by_name("model.layers.0.mlp.gate_proj.weight")
        .is_some());
    for l in [1u32, 2] {
        assert_eq!(experts_per_layer(&c, l), 4);
        let r = &c.files[&layer_file_name(l)];
        let bias = format!("model.layers.{l}.mlp.gate.e_score_correction_bias");
        let i = r.region_by_name(&bias).unwrap_or_else(|| panic!("{bias}"));
        assert_eq!(r.regions()[i as usize].dtype(), Some(Dtype::F32), "{bias}");
        for p in ["gate_proj", "up_proj", "down_proj"] {
            let t = format!("model.layers.{l}.mlp.shared_experts.{p}.weight");
            let i = r
                .region_by_name(&t)
                .unwrap_or_else(|| panic!("{t} missing"));
            assert_eq!(r.regions()[i as usize].role, Role::Tensor.code(), "{t}");
        }
    }
}

fn assert_mixtral_roles(c: &Converted, layers: u32, experts: u32) {
    for l in 0..layers {
        let r = &c.files[&layer_file_name(l)];
        assert_eq!(r.header().experts_per_layer, experts);
        for e in 0..experts {
            for (role, w) in [(Role::Gate, "w1"), (Role::Up, "w3"), (Role::Down, "w2")] {
                let i = r
                    .projection(l, e, role)
                    .unwrap_or_else(|| panic!("layer {l} expert {e}: no {}", role.name()));
                assert_eq!(
                    r.name(i),
                    format!("model.layers.{l}.block_sparse_moe.experts.{e}.{w}.weight"),
                    "{} must be {w}",
                    role.name()
                );
            }
        }
    }
}

#[test]
fn mixtral_fixture_maps_w1_w3_w2_to_gate_up_down() {
    let out = tempfile::tempdir().expect("tempdir");
    let c = convert_and_check(&fixture("mixtral"), out.path());
    assert_mixtral_roles(&c, 2, 4);
}

#[test]
fn generated_mixtral_style_sharded_checkpoint_maps_w1_w3_w2_to_gate_up_down() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    common::write_mixtral_style(&src, 3, 5);
    let c = convert_and_check(&src, &dir.path().join("out"));
    assert_mixtral_roles(&c, 3, 5);
    assert_eq!(c.manifest.conversion.sources.len(), 2);
}

#[test]
fn generated_fused_checkpoint_becomes_per_expert_slices_that_concatenate_to_the_source() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let spec = SynthSpec {
        fused: true,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("write checkpoint");
    let c = convert_and_check(&src, &dir.path().join("out"));
    for l in 0..spec.layers {
        let r = &c.files[&layer_file_name(l)];
        assert_eq!(r.header().experts_per_layer, spec.experts);
        for e in 0..spec.experts {
            let i = r.projection(l, e, Role::GateUp).expect("gate_up");
            assert_eq!(
                r.name(i),
                format!("model.layers.{l}.mlp.experts.gate_up_proj[{e}]")
            );
            assert!(r.projection(l, e, Role::Gate).is_none());
        }
    }
}

#[test]
fn fused_experts_in_the_other_dimension_order_with_biases_are_sliced_losslessly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    common::write_fused_transposed(&src, 2, 3);
    let c = convert_and_check(&src, &dir.path().join("out"));
    let r = &c.files["layer-00001.jnf"];
    for e in 0..3 {
        let x = r.expert(1, e).expect("expert record");
        assert_eq!(x.region_count, 4, "gate_up, down and their biases");
        let b = r.projection(1, e, Role::GateUpBias).expect("bias");
        assert_eq!(r.regions()[b as usize].dtype(), Some(Dtype::F32));
    }
}

#[test]
fn generated_checkpoint_in_three_shards_names_each_shard_in_provenance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let spec = SynthSpec {
        shards: 3,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("write checkpoint");
    let c = convert_and_check(&src, &dir.path().join("out"));
    let names: Vec<&str> = c
        .manifest
        .conversion
        .sources
        .iter()
        .map(|s| s.path.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "model-00001-of-00003.safetensors",
            "model-00002-of-00003.safetensors",
            "model-00003-of-00003.safetensors"
        ]
    );
    // The convert_and_check pass already compared each region's src_file to the shard the
    // safetensors crate found the tensor in; here every shard must actually be used.
    let used: BTreeSet<String> = c
        .files
        .values()
        .flat_map(|r| {
            r.regions()
                .iter()
                .map(|rec| r.index().str(rec.src_file).to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(used.len(), 3, "{used:?}");
}

#[test]
fn generated_mtp_layer_is_converted_as_layer_num_hidden_layers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    let spec = SynthSpec {
        mtp: true,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("write checkpoint");
    let c = convert_and_check(&src, &dir.path().join("out"));
    let n = spec.layers;
    assert_eq!(c.manifest.layers, (0..=n).collect::<Vec<_>>());
    assert_eq!(c.manifest.architecture.num_layers, n + 1);
    let mtp = &c.files[&layer_file_name(n)];
    assert_eq!(mtp.header().experts_per_layer, spec.experts);
    assert!(mtp
        .region_by_name(&format!("model.layers.{n}.eh_proj.weight"))
        .is_some());
}
