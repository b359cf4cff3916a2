//! Generator of the golden test vectors in `fixtures/golden/` (spec §10). Everything here is
//! deterministic: the same code writes the same bytes, so a test regenerates the vectors and fails
//! when the committed ones are stale (`TARFA_BLESS=1` rewrites them).

use std::path::{Path, PathBuf};

use crate::dtype::Dtype;
use crate::error::Result;
use crate::hash::dual_hash;
use crate::layout::Role;
use crate::manifest::{
    layer_file_name, Architecture, Conversion, FileEntry, FileKind, Manifest, FORMAT_NAME,
    TRUNK_NAME,
};
use crate::writer::{FileLayout, JnfWriter, Provenance, RegionSpec};

/// Deterministic bytes for a region, from its name: splitmix64 keyed by the name's BLAKE3.
/// BF16 regions get finite values in [-0.125, 0.125) so a decoder can use them.
pub fn region_bytes(name: &str, dtype: Dtype, len: u64) -> Vec<u8> {
    let seed = blake3::hash(name.as_bytes());
    let mut s = u64::from_le_bytes(seed.as_bytes()[..8].try_into().unwrap_or([0; 8]));
    let mut next = move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let len = len as usize;
    let mut out = Vec::with_capacity(len);
    if dtype == Dtype::BF16 {
        while out.len() < len {
            let unit = (next() >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            let v = (unit - 0.5) * 0.25;
            out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
        }
    } else {
        while out.len() < len {
            out.extend_from_slice(&next().to_le_bytes());
        }
    }
    out.truncate(len);
    out
}

fn spec(name: &str, dtype: Dtype, shape: &[u64], layer: Option<u32>) -> RegionSpec {
    RegionSpec {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        layer,
        source: None,
    }
}

fn data(s: &RegionSpec) -> Vec<u8> {
    region_bytes(&s.name, s.dtype, s.byte_len().unwrap_or(0))
}

/// The smallest useful file, dumped byte by byte in the spec's worked example.
fn hex_example(path: &Path) -> Result<()> {
    let mut w = JnfWriter::create(path, FileLayout::trunk())?;
    let s = spec("w", Dtype::BF16, &[2, 2], None);
    w.tensor(
        &s,
        &mut &[0x80, 0x3f, 0x00, 0x40, 0x40, 0x40, 0x80, 0x40][..],
    )?; // 1, 2, 3, 4
    w.finish()?;
    Ok(())
}

/// Regions of 4095, 4096 and 4097 bytes, a zero-size tensor and a rank-0 scalar.
fn edge_sizes(path: &Path) -> Result<()> {
    let mut w = JnfWriter::create(path, FileLayout::trunk())?;
    for s in [
        spec("bytes_4095", Dtype::U8, &[4095], None),
        spec("empty", Dtype::BF16, &[0, 8], None),
        spec("bytes_4096", Dtype::U8, &[4096], None),
        spec("bytes_4097", Dtype::U8, &[4097], None),
        spec("scalar", Dtype::F32, &[], None),
    ] {
        w.tensor(&s, &mut &data(&s)[..])?;
    }
    w.finish()?;
    Ok(())
}

/// Experts sliced from fused 3-D source tensors, with provenance pointing into the source:
/// `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I], per expert.
fn fused(path: &Path) -> Result<()> {
    const E: u64 = 3;
    let (h, i) = (8u64, 16u64);
    let gu_len = 2 * i * h * 2;
    let down_len = h * i * 2;
    let (gu_base, down_base) = (1000u64, 1000 + E * gu_len);
    let mut w = JnfWriter::create(path, FileLayout::layer(5, E as u32))?;
    for e in 0..E {
        let mut x = w.begin_expert(5, e as u32)?;
        let mut gu = spec(
            &format!("model.layers.5.mlp.experts.{e}.gate_up_proj"),
            Dtype::BF16,
            &[2 * i, h],
            None,
        );
        gu.source = Some(Provenance {
            file: "model.safetensors".into(),
            tensor: "model.layers.5.mlp.experts.gate_up_proj".into(),
            begin: gu_base + e * gu_len,
            shape: vec![E, 2 * i, h],
        });
        x.projection(Role::GateUp, &gu, &mut &data(&gu)[..])?;
        let mut d = spec(
            &format!("model.layers.5.mlp.experts.{e}.down_proj"),
            Dtype::BF16,
            &[h, i],
            None,
        );
        d.source = Some(Provenance {
            file: "model.safetensors".into(),
            tensor: "model.layers.5.mlp.experts.down_proj".into(),
            begin: down_base + e * down_len,
            shape: vec![E, h, i],
        });
        x.projection(Role::Down, &d, &mut &data(&d)[..])?;
        w = x.end_expert()?;
    }
    w.finish()?;
    Ok(())
}

/// Shape of a generated model directory.
#[derive(Clone, Copy, Debug)]
pub struct TinyModel {
    /// Layers.
    pub layers: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Hidden size.
    pub hidden: u64,
    /// Expert intermediate size.
    pub inter: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Dtype of the expert projections.
    pub expert_dtype: Dtype,
}

impl TinyModel {
    /// Name of a generated expert projection.
    pub fn projection_name(layer: u32, expert: u32, role: Role) -> String {
        format!(
            "model.layers.{layer}.mlp.experts.{expert}.{}_proj.weight",
            role.name()
        )
    }

    fn projection_spec(&self, layer: u32, expert: u32, role: Role) -> RegionSpec {
        let (h, i) = (self.hidden, self.inter);
        let shape = if role == Role::Down { [h, i] } else { [i, h] };
        spec(
            &Self::projection_name(layer, expert, role),
            self.expert_dtype,
            &shape,
            None,
        )
    }

    /// The expected bytes of one projection.
    pub fn projection_bytes(&self, layer: u32, expert: u32, role: Role) -> Vec<u8> {
        data(&self.projection_spec(layer, expert, role))
    }

    /// Write the model directory: trunk, one file per layer, config, manifest.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, "mkdir", e))?;
        let (h, v) = (self.hidden, self.vocab);
        let mut files = Vec::new();
        let mut w = JnfWriter::create(dir.join(TRUNK_NAME), FileLayout::trunk())?;
        for s in [
            spec("model.embed_tokens.weight", Dtype::BF16, &[v, h], None),
            spec("model.norm.weight", Dtype::BF16, &[h], None),
            spec("lm_head.weight", Dtype::BF16, &[v, h], None),
        ] {
            w.tensor(&s, &mut &data(&s)[..])?;
        }
        let t = w.finish()?;
        files.push(entry(
            TRUNK_NAME,
            FileKind::Trunk,
            None,
            t.file_len,
            &t.root,
        ));
        for l in 0..self.layers {
            let name = layer_file_name(l);
            let mut w = JnfWriter::create(dir.join(&name), FileLayout::layer(l, self.experts))?;
            for (n, shape) in [
                ("input_layernorm.weight", vec![h]),
                ("self_attn.q_proj.weight", vec![h, h]),
                ("self_attn.k_proj.weight", vec![h / 2, h]),
                ("self_attn.v_proj.weight", vec![h / 2, h]),
                ("self_attn.o_proj.weight", vec![h, h]),
                ("post_attention_layernorm.weight", vec![h]),
                ("mlp.gate.weight", vec![u64::from(self.experts), h]),
            ] {
                let s = spec(
                    &format!("model.layers.{l}.{n}"),
                    Dtype::BF16,
                    &shape,
                    Some(l),
                );
                w.tensor(&s, &mut &data(&s)[..])?;
            }
            for e in 0..self.experts {
                let mut x = w.begin_expert(l, e)?;
                for role in [Role::Gate, Role::Up, Role::Down] {
                    let s = self.projection_spec(l, e, role);
                    x.projection(role, &s, &mut &data(&s)[..])?;
                }
                w = x.end_expert()?;
            }
            let f = w.finish()?;
            files.push(entry(&name, FileKind::Layer, Some(l), f.file_len, &f.root));
        }
        let config = serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "hidden_size": h,
            "moe_intermediate_size": self.inter,
            "num_hidden_layers": self.layers,
            "num_experts": self.experts,
            "num_experts_per_tok": self.experts.min(2),
            "vocab_size": v,
        });
        let mut config_bytes = serde_json::to_vec_pretty(&config).unwrap_or_default();
        config_bytes.push(b'\n');
        crate::publish::write_atomic(&dir.join("config.json"), &config_bytes)?;
        let ch = dual_hash(&config_bytes);
        files.push(entry(
            "config.json",
            FileKind::Aux,
            None,
            config_bytes.len() as u64,
            &ch,
        ));
        Manifest {
            format: FORMAT_NAME.into(),
            format_version: [1, 0],
            architecture: Architecture {
                source_format: "synthetic".into(),
                config,
                num_layers: self.layers,
            },
            tokenizer: vec![],
            layers: (0..self.layers).collect(),
            files,
            conversion: Conversion {
                tool: "tarfa-format golden generator".into(),
                tool_version: "1".into(),
                sources: vec![],
            },
        }
        .publish(dir)
    }
}

fn entry(
    path: &str,
    kind: FileKind,
    layer: Option<u32>,
    size: u64,
    h: &crate::DualHash,
) -> FileEntry {
    FileEntry {
        path: path.into(),
        kind,
        layer,
        size,
        sha256: hex::encode(h.sha256),
        blake3: hex::encode(h.blake3),
        sources: None,
    }
}

/// The two-layer, four-expert BF16 model of `fixtures/golden/tiny-moe/`.
pub const TINY_MOE: TinyModel = TinyModel {
    layers: 2,
    experts: 4,
    hidden: 16,
    inter: 24,
    vocab: 32,
    expert_dtype: Dtype::BF16,
};

/// The one-layer, one-expert Q8_0 model of `fixtures/golden/single-expert/`.
pub const SINGLE_EXPERT: TinyModel = TinyModel {
    layers: 1,
    experts: 1,
    hidden: 32,
    inter: 64,
    vocab: 8,
    expert_dtype: Dtype::Q8_0,
};

/// The manifest golden vector (spec §8.1.2): a valid manifest, written by hand, whose content
/// holds what JSON writers disagree on — exponents, `-0`, shortest digits and their ties,
/// integers on both sides of 2^53 and past 64 bits, escapes, keys that sort differently by
/// UTF-16 and by UTF-8 (the emoji and U+E000, RFC 8785 §3.2.3's example). `@DIGEST@` is
/// replaced by its digest.
pub const MANIFEST_JCS_TEXT: &str = r#"{
  "format": "jnf-model",
  "format_version": [1, 0],
  "architecture": {
    "source_format": "synthetic",
    "num_layers": 1,
    "config": {
      "floats": [1e300, 1E-7, 1.5e-7, 0.000001, -0.0, -0, 0.0, 0.1, 5e-324, -5e-324,
                 1.7976931348623157e308, 1e21, 1e20, 100.0, 1E2, 4.50, 2e-3,
                 333333333.33333329, 1424953923781206.25, 9.999999999999997e22, 1e23,
                 3.3999999521443642e38, 0.30000000000000004, -1e-300],
      "integers": [0, -1, 9007199254740992, 9007199254740993, 18446744073709551615,
                   -9223372036854775808, 1764547200123456789],
      "past_64_bits": [18446744073709551616, -9223372036854775809,
                       123456789012345678901234567890, 9007199254740993.0],
      "strings": ["\u00e9 é", "\ud83d\ude00 😀", "\u0000\u001f\b\t\n\f\r\u000b",
                  "\" \\ \/ /", "\u007f\u0080\u2028\u2029\ufeff", "\uE000\uffff", ""],
      "\u20ac": "Euro Sign",
      "\r": "Carriage Return",
      "\ufb33": "Hebrew Letter Dalet With Dagesh",
      "1": "One",
      "😀": "Emoji: Grinning Face",
      "\u0080": "Control",
      "\u00f6": "Latin Small Letter O With Diaeresis",
      "\ue000": "Private Use U+E000",
      "": "the empty key",
      "A": {"nested": {"z": null, "digest": "kept: only the top-level digest is left out"}},
      "a": [true, false, null, [], {}]
    }
  },
  "tokenizer": [],
  "layers": [],
  "files": [],
  "conversion": {
    "tool": "tarfa-format golden generator",
    "tool_version": "1",
    "sources": [
      {"path": "model.safetensors", "size": 18446744073709551615,
       "mtime_ns": 1764547200123456789, "ctime_ns": -9223372036854775808}
    ]
  },
  "digest": "@DIGEST@"
}
"#;

/// `manifest-jcs/manifest.json` (a model directory of no files) and, beside it,
/// `manifest-jcs.canonical.json`: the canonical bytes its digest hashes.
fn manifest_jcs(dir: &Path) -> Result<()> {
    let path = dir
        .join("manifest-jcs")
        .join(crate::manifest::MANIFEST_NAME);
    let bad = |detail: String| crate::Error::Manifest {
        path: path.clone(),
        fault: crate::manifest::ManifestFault::NotJson(detail),
    };
    let mut v: serde_json::Value =
        serde_json::from_str(MANIFEST_JCS_TEXT).map_err(|e| bad(e.to_string()))?;
    if let Some(o) = v.as_object_mut() {
        o.remove(crate::manifest::DIGEST_KEY);
    }
    let canonical = crate::jcs::to_vec(&v);
    let text = MANIFEST_JCS_TEXT.replace("@DIGEST@", &crate::manifest::content_digest(&v));
    let sub = dir.join("manifest-jcs");
    std::fs::create_dir_all(&sub).map_err(|e| crate::Error::io(&sub, "mkdir", e))?;
    crate::publish::write_atomic(&path, text.as_bytes())?;
    crate::publish::write_atomic(&dir.join("manifest-jcs.canonical.json"), &canonical)
}

/// Write every golden vector under `dir`; returns their paths relative to `dir`, sorted.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::io(dir, "mkdir", e))?;
    hex_example(&dir.join("hex-example.jnf"))?;
    edge_sizes(&dir.join("edge-sizes.jnf"))?;
    fused(&dir.join("fused-gate-up.jnf"))?;
    TINY_MOE.write(&dir.join("tiny-moe"))?;
    SINGLE_EXPERT.write(&dir.join("single-expert"))?;
    manifest_jcs(dir)?;
    let mut out = Vec::new();
    collect(dir, dir, &mut out).map_err(|e| crate::Error::io(dir, "list", e))?;
    out.sort();
    Ok(out)
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            collect(root, &p, out)?;
        } else if let Ok(rel) = p.strip_prefix(root) {
            out.push(rel.to_path_buf());
        }
    }
    Ok(())
}
