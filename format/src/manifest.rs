//! The model manifest (§8): `manifest.json` in a model directory, written last. It records the
//! architecture config verbatim, the tokenizer files, which layers are present, every file with
//! its size and hashes, and where the conversion came from.

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::source_path::{check_source_path, SourcePathFault};

/// File name of the manifest inside a model directory.
pub const MANIFEST_NAME: &str = "manifest.json";
/// File name of the trunk file (embeddings, final norm, output head, other model-level tensors).
pub const TRUNK_NAME: &str = "trunk.jnf";
/// The `format` value of a v1 manifest.
pub const FORMAT_NAME: &str = "jnf-model";
/// Largest manifest a reader accepts (GGUF tokenizer arrays make big ones).
pub const MAX_MANIFEST_LEN: u64 = 512 << 20;

/// The lock file a conversion holds in its output directory (§8.3): hidden, never listed in the
/// manifest, the only hidden file a model directory may hold besides a conversion's temporaries.
pub const CONVERT_LOCK_NAME: &str = ".tarfa-convert.lock";

/// `0-3, 7, 9-10`: ascending layer numbers as ranges, for messages.
pub fn layer_ranges(v: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            v[i].to_string()
        } else {
            format!("{}-{}", v[i], v[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// File name of the JNF file of one layer.
pub fn layer_file_name(layer: u32) -> String {
    format!("layer-{layer:05}.jnf")
}

/// What a listed file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// `trunk.jnf`.
    Trunk,
    /// `layer-NNNNN.jnf`.
    Layer,
    /// A file copied verbatim from the source (config, tokenizer, generation config).
    Aux,
}

impl FileKind {
    /// Its name in the manifest (`trunk`, `layer`, `aux`).
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Trunk => "trunk",
            FileKind::Layer => "layer",
            FileKind::Aux => "aux",
        }
    }
}

/// One file of the model directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Name relative to the model directory (no directories in v1).
    pub path: String,
    /// What it is.
    pub kind: FileKind,
    /// The layer, for a layer file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<u32>,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256, hex: the root digest for JNF files (§5.4), of the whole file for aux files.
    pub sha256: String,
    /// BLAKE3, hex, with the same meaning.
    pub blake3: String,
    /// For a JNF file: each source file its regions were read from, with the identity that file
    /// had when this file's bytes were last checked against it, and a digest of the exact source
    /// bytes it holds (§8.1, §8.2). Omitted for aux files and by older writers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<SourceRead>>,
}

/// What one JNF file read from one source file (`files[].sources[]`, §8.1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRead {
    /// The source file: a `path` of `conversion.sources`.
    pub path: String,
    /// Its size when the file's bytes were last checked against it.
    pub size: u64,
    /// Its modification time then, nanoseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime_ns: Option<i64>,
    /// Its status-change time then, nanoseconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctime_ns: Option<i64>,
    /// BLAKE3 (hex) of the 32-byte BLAKE3s of the file's regions read from this source, in index
    /// order ([`tensors_blake3`]): a digest of exactly the source bytes the file holds.
    pub tensors_blake3: String,
}

impl SourceRead {
    /// The source's identity as recorded: size, mtime, ctime.
    pub fn identity(&self) -> SourceIdentity {
        SourceIdentity {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
        }
    }
}

/// The cheap identity of a source file as a run saw it (§8.2): size, modification time and
/// status-change time. Equal identities let a later run trust layers checked against the file
/// before; a different one makes it re-check them against the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceIdentity {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: Option<i64>,
    /// Status-change time, nanoseconds since the epoch.
    pub ctime_ns: Option<i64>,
}

impl SourceIdentity {
    /// The identity of an open file (`fstat`): of the bytes read through it.
    pub fn of(meta: &std::fs::Metadata) -> SourceIdentity {
        use std::os::unix::fs::MetadataExt;
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        SourceIdentity {
            size: meta.len(),
            mtime_ns: Some(ns(meta.mtime(), meta.mtime_nsec())),
            ctime_ns: Some(ns(meta.ctime(), meta.ctime_nsec())),
        }
    }
}

impl std::fmt::Display for SourceIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
        write!(
            f,
            "size {}, mtime_ns {}, ctime_ns {}",
            self.size,
            t(self.mtime_ns),
            t(self.ctime_ns)
        )
    }
}

/// For each source file a JNF file's regions were read from (in order of first appearance), the
/// BLAKE3 of the concatenated 32-byte BLAKE3s of those regions, in index order (§8.1
/// `files[].sources[].tensors_blake3`). A region's bytes are its source range's bytes, so this
/// digests exactly the source bytes the file holds. Regions without a source are left out.
pub fn tensors_blake3(r: &crate::JnfReader) -> Vec<(String, [u8; 32])> {
    let mut t = TensorsBlake3::default();
    for rec in r.regions() {
        t.add(r.index().str(rec.src_file), &rec.blake3);
    }
    t.finish()
}

/// [`tensors_blake3`] a region at a time (for a pass over a file with
/// [`crate::reader::scan_index`]).
#[derive(Debug, Default)]
pub struct TensorsBlake3 {
    per: Vec<(String, blake3::Hasher)>,
}

impl TensorsBlake3 {
    /// The next region in index order: its source file (empty: none) and its BLAKE3.
    pub fn add(&mut self, file: &str, blake3: &[u8; 32]) {
        if file.is_empty() {
            return;
        }
        let h = match self.per.iter_mut().position(|(p, _)| p == file) {
            Some(i) => &mut self.per[i].1,
            None => {
                self.per.push((file.to_string(), blake3::Hasher::new()));
                &mut self.per.last_mut().expect("just pushed").1
            }
        };
        h.update(blake3);
    }

    /// Each source file with its digest, in order of first appearance.
    pub fn finish(self) -> Vec<(String, [u8; 32])> {
        self.per
            .into_iter()
            .map(|(p, h)| (p, *h.finalize().as_bytes()))
            .collect()
    }
}

/// The source checkpoint's architecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Architecture {
    /// `"safetensors"`, `"gguf"` or `"synthetic"` (test vectors).
    pub source_format: String,
    /// HF `config.json` verbatim, or the GGUF key/values.
    pub config: serde_json::Value,
    /// Number of layers of the full model (transformer blocks, MTP layers included).
    pub num_layers: u32,
}

/// One source file the conversion read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Name relative to the source directory.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the whole file, hex, when the conversion read all of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// SHA-256 of the file's header (safetensors: the 8-byte length and the JSON), hex: names
    /// the source's layout without reading its data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_sha256: Option<String>,
    /// Modification time when the last run opened it, nanoseconds since the epoch (§8.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime_ns: Option<i64>,
    /// Status-change time when the last run opened it, nanoseconds since the epoch (§8.2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctime_ns: Option<i64>,
}

impl SourceFile {
    /// The identity the last run saw.
    pub fn identity(&self) -> SourceIdentity {
        SourceIdentity {
            size: self.size,
            mtime_ns: self.mtime_ns,
            ctime_ns: self.ctime_ns,
        }
    }

    /// Does `other` name the same source layout: path, size and hashes, the identity's times
    /// aside (they change when a file is touched or copied; §8.2)?
    pub fn same_layout(&self, other: &SourceFile) -> bool {
        (&self.path, self.size, &self.sha256, &self.header_sha256)
            == (&other.path, other.size, &other.sha256, &other.header_sha256)
    }
}

/// Where the model directory came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conversion {
    /// Tool name.
    pub tool: String,
    /// Tool version.
    pub tool_version: String,
    /// Source files read.
    pub sources: Vec<SourceFile>,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// `[major, minor]`; a reader refuses another major and ignores fields it does not know
    /// (a later minor may add some).
    pub format_version: [u16; 2],
    /// Architecture config.
    pub architecture: Architecture,
    /// Names of the tokenizer files among `files` (empty when the tokenizer is in the config).
    pub tokenizer: Vec<String>,
    /// Layers present, ascending.
    pub layers: Vec<u32>,
    /// Every file of the directory except the manifest itself.
    pub files: Vec<FileEntry>,
    /// Provenance of the conversion.
    pub conversion: Conversion,
}

/// A JSON value parsed with every object's keys checked unique, at every level.
struct NoDuplicateKeys(serde_json::Value);

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::{Error as _, MapAccess, SeqAccess, Visitor};
        use serde_json::Value;
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NoDuplicateKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_bool<E>(self, b: bool) -> std::result::Result<Self::Value, E> {
                Ok(NoDuplicateKeys(Value::Bool(b)))
            }
            fn visit_i64<E>(self, n: i64) -> std::result::Result<Self::Value, E> {
                Ok(NoDuplicateKeys(Value::from(n)))
            }
            fn visit_u64<E>(self, n: u64) -> std::result::Result<Self::Value, E> {
                Ok(NoDuplicateKeys(Value::from(n)))
            }
            fn visit_f64<E: serde::de::Error>(self, n: f64) -> std::result::Result<Self::Value, E> {
                serde_json::Number::from_f64(n)
                    .map(|n| NoDuplicateKeys(Value::Number(n)))
                    .ok_or_else(|| E::custom("a non-finite number"))
            }
            fn visit_str<E>(self, s: &str) -> std::result::Result<Self::Value, E> {
                Ok(NoDuplicateKeys(Value::String(s.to_string())))
            }
            fn visit_string<E>(self, s: String) -> std::result::Result<Self::Value, E> {
                Ok(NoDuplicateKeys(Value::String(s)))
            }
            fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
                Ok(NoDuplicateKeys(Value::Null))
            }
            fn visit_none<E>(self) -> std::result::Result<Self::Value, E> {
                Ok(NoDuplicateKeys(Value::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut v = Vec::new();
                while let Some(NoDuplicateKeys(x)) = a.next_element()? {
                    v.push(x);
                }
                Ok(NoDuplicateKeys(Value::Array(v)))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut m = serde_json::Map::new();
                while let Some(k) = a.next_key::<String>()? {
                    let NoDuplicateKeys(x) = a.next_value()?;
                    if m.insert(k.clone(), x).is_some() {
                        return Err(A::Error::custom(format!("duplicate key {k:?}")));
                    }
                }
                Ok(NoDuplicateKeys(Value::Object(m)))
            }
        }
        d.deserialize_any(V)
    }
}

/// The manifest field holding [`content_digest`] of everything else in it.
pub const DIGEST_KEY: &str = "digest";

/// SHA-256 (hex) of the manifest's content without its top-level `digest` field, in the canonical
/// JSON of spec §8.1.2: RFC 8785 (JCS), integers kept exact ([`crate::jcs`]). Any change to the
/// manifest's content after it was written changes it; whitespace and key order do not.
pub fn content_digest(v: &serde_json::Value) -> String {
    use sha2::Digest;
    let mut bytes = Vec::new();
    crate::jcs::write(v, &mut bytes, Some(DIGEST_KEY));
    hex::encode(sha2::Sha256::digest(&bytes))
}

/// The digest as tarfa computed it before §8.1.2 adopted JCS (keys in UTF-8 order, serde_json's
/// numbers): recognised only to tell the user to convert again, never accepted.
fn pre_jcs_digest(v: &serde_json::Value) -> String {
    use serde_json::Value;
    use sha2::Digest;
    fn canon(v: &Value, out: &mut String, top: bool) {
        match v {
            Value::Object(o) => {
                let mut keys: Vec<&String> =
                    o.keys().filter(|k| !top || *k != DIGEST_KEY).collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    canon(&o[k.as_str()], out, false);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    canon(x, out, false);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut text = String::new();
    canon(v, &mut text, true);
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A plain file name: no directory separators, not `.`/`..`, not hidden.
pub fn is_plain_name(s: &str) -> bool {
    !s.is_empty() && !s.contains(['/', '\\', '\0']) && !s.starts_with('.')
}

/// The most layers (decoder and MTP layers together) a model may have: every layer count read
/// from a config, a GGUF's key/values or a manifest is bounded by it before anything is sized by
/// it (a GGUF's `block_count` of 2^64 − 1 grew `run` until the OOM killer came).
pub const MAX_LAYERS: u64 = 4096;

/// The layers an architecture config declares: its decoder layers and its MTP (nextn) layers,
/// which a model's layer files follow (`model.layers.{main}..` / `blk.{main}..`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeclaredLayers {
    /// The key that declares them: `num_hidden_layers` (or `text_config.num_hidden_layers`),
    /// or a GGUF's `{arch}.block_count`.
    pub key: String,
    /// Decoder layers.
    pub main: u64,
    /// MTP layers after them: HF `num_nextn_predict_layers` (or transformers' alias
    /// `num_mtp_layers`, or Qwen3-Next's `mtp_num_hidden_layers`), GGUF
    /// `{arch}.nextn_predict_layers`.
    pub mtp: u64,
}

/// A model's layer count and its config disagree, or a count is beyond [`MAX_LAYERS`]. Each
/// would make the decoder compute another model than the checkpoint (layers listed and checked
/// but never run) or size something by an absurd count; convert, verify and run refuse it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayerCountFault {
    /// A count beyond [`MAX_LAYERS`].
    #[error("{key} is {count}: more layers than any model tarfa takes (at most {MAX_LAYERS})")]
    TooMany {
        /// What gave it.
        key: String,
        /// The count.
        count: u64,
    },
    /// More MTP layers than layers.
    #[error(
        "{key} says {mtp} of the {total} layers are MTP (nextn) layers: no decoder layer is left"
    )]
    NoDecoderLayer {
        /// The MTP key.
        key: String,
        /// MTP layers.
        mtp: u64,
        /// All layers.
        total: u64,
    },
    /// Layers (files) beyond what the config declares: they would be checked and never run.
    #[error("the checkpoint has {layers} layers (0..{layers}) but its config declares {} ({key}{}): {} would never run; the config and the weights disagree", main + mtp, if *mtp > 0 { format!(", {mtp} of them MTP layers") } else { String::new() }, layer_span(*main + *mtp, *layers))]
    BeyondConfig {
        /// The declaring key.
        key: String,
        /// Decoder layers declared.
        main: u64,
        /// MTP layers declared.
        mtp: u64,
        /// Layers the checkpoint holds.
        layers: u64,
    },
}

fn layer_span(from: u64, to: u64) -> String {
    if to == from + 1 {
        format!("layer {from}")
    } else {
        format!("layers {from}..{to}")
    }
}

/// The layers `config` (of a `source_format` model) declares; `None` where it does not say.
pub fn declared_layers(
    source_format: &str,
    config: &serde_json::Value,
) -> std::result::Result<Option<DeclaredLayers>, LayerCountFault> {
    let bounded = |key: String, count: u64| {
        if count > MAX_LAYERS {
            Err(LayerCountFault::TooMany { key, count })
        } else {
            Ok(count)
        }
    };
    if source_format == "gguf" {
        let Some(arch) = config
            .get("general.architecture")
            .and_then(|a| a.get("value"))
            .and_then(|a| a.as_str())
        else {
            return Ok(None);
        };
        let kv = |k: &str| config.get(format!("{arch}.{k}"))?.get("value")?.as_u64();
        let key = format!("{arch}.block_count");
        let Some(total) = kv("block_count") else {
            return Ok(None);
        };
        let total = bounded(key.clone(), total)?;
        let mtp = kv("nextn_predict_layers").unwrap_or(0);
        if mtp >= total {
            return Err(LayerCountFault::NoDecoderLayer {
                key: format!("{arch}.nextn_predict_layers"),
                mtp,
                total,
            });
        }
        return Ok(Some(DeclaredLayers {
            key,
            main: total - mtp,
            mtp,
        }));
    }
    let in_text = |k: &str| {
        config.get(k).map(|v| (k.to_string(), v)).or_else(|| {
            Some((
                format!("text_config.{k}"),
                config.get("text_config")?.get(k)?,
            ))
        })
    };
    let Some((key, main)) = in_text("num_hidden_layers") else {
        return Ok(None);
    };
    let Some(main) = main.as_u64() else {
        return Ok(None);
    };
    let main = bounded(key.clone(), main)?;
    // DeepSeek's and GLM's key; transformers' alias of it; Qwen3-Next's.
    let mtp = match [
        "num_nextn_predict_layers",
        "num_mtp_layers",
        "mtp_num_hidden_layers",
    ]
    .into_iter()
    .find_map(in_text)
    {
        Some((k, v)) => bounded(k, v.as_u64().unwrap_or(0))?,
        None => 0,
    };
    Ok(Some(DeclaredLayers { key, main, mtp }))
}

/// The rule convert, verify and run hold a model to: at most [`MAX_LAYERS`] layers, and none
/// beyond the decoder and MTP layers its config declares (fewer is an incomplete model, a matter
/// for the completeness checks).
pub fn check_layer_count(
    source_format: &str,
    config: &serde_json::Value,
    layers: u64,
) -> std::result::Result<(), LayerCountFault> {
    if layers > MAX_LAYERS {
        return Err(LayerCountFault::TooMany {
            key: "the layer count".into(),
            count: layers,
        });
    }
    if let Some(d) = declared_layers(source_format, config)? {
        if layers > d.main + d.mtp {
            return Err(LayerCountFault::BeyondConfig {
                key: d.key,
                main: d.main,
                mtp: d.mtp,
                layers,
            });
        }
    }
    Ok(())
}

/// The keys (dotted paths: `rope_parameters.rope_theta`) whose values differ between two
/// architecture configs, or that one has and the other lacks, in key order; at most `limit`.
/// Empty when the configs are equal. Used to hold the manifest's config — the one the decoder
/// computes with — to the model directory's `config.json` and to the source's.
pub fn config_differences(
    a: &serde_json::Value,
    b: &serde_json::Value,
    limit: usize,
) -> Vec<String> {
    fn walk(
        a: &serde_json::Value,
        b: &serde_json::Value,
        at: &str,
        out: &mut Vec<String>,
        limit: usize,
    ) {
        if out.len() >= limit || a == b {
            return;
        }
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let path = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    match (x.get(k), y.get(k)) {
                        (Some(p), Some(q)) => walk(p, q, &path, out, limit),
                        _ => {
                            if out.len() < limit {
                                out.push(path)
                            }
                        }
                    }
                }
            }
            _ => out.push(if at.is_empty() {
                "(the whole config)".into()
            } else {
                at.to_string()
            }),
        }
    }
    let mut out = Vec::new();
    walk(a, b, "", &mut out, limit);
    out
}

impl Architecture {
    /// The layers the model needs to run: `0..` its decoder layers as its config declares them;
    /// the MTP (nextn) layers after them may be left out of a model (they serve speculative
    /// decoding, not the forward pass). `num_layers` where the config does not say.
    pub fn required_layers(&self) -> u32 {
        match declared_layers(&self.source_format, &self.config) {
            Ok(Some(d)) => {
                u32::try_from(d.main).map_or(self.num_layers, |m| m.min(self.num_layers))
            }
            _ => self.num_layers,
        }
    }

    /// [`check_layer_count`] of this architecture's config and `num_layers`.
    pub fn check_layer_count(&self) -> std::result::Result<(), LayerCountFault> {
        check_layer_count(
            &self.source_format,
            &self.config,
            u64::from(self.num_layers),
        )
    }
}

/// What is wrong with a manifest: one variant per rule of §8.1 (and of reading it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestFault {
    /// Not JSON, or a duplicate key (the parser's words).
    #[error("{0}")]
    NotJson(String),
    /// The JSON does not have the manifest's fields and types (the parser's words).
    #[error("{0}")]
    Schema(String),
    /// No `digest` field.
    #[error("no \"digest\" field")]
    NoDigest,
    /// The digest is of the canonical JSON used before RFC 8785.
    #[error("digest {recorded} is of the canonical JSON tarfa used before JNF v1.0 adopted RFC 8785 (JCS, spec §8.1.2): this manifest was written by an older tarfa; convert the model again with this one")]
    PreJcsDigest {
        /// The digest recorded.
        recorded: String,
    },
    /// The digest does not match the content.
    #[error("digest mismatch: the manifest was changed after it was written (recorded {recorded}, content hashes to {actual})")]
    DigestMismatch {
        /// The digest recorded.
        recorded: String,
        /// The content's digest.
        actual: String,
    },
    /// `format` is not `jnf-model`.
    #[error("format is {0:?}, not \"jnf-model\"")]
    NotJnfModel(String),
    /// An unsupported major version.
    #[error("format major version {0} is not supported (this reader implements 1)")]
    UnsupportedMajor(u16),
    /// An unknown `source_format`.
    #[error("source_format {0:?} is not safetensors, gguf or synthetic")]
    UnknownSourceFormat(String),
    /// A source path that breaks the source-path rule (§5.1, [`crate::source_path`]).
    #[error("source path {path:?} is not a plain relative path: {fault}")]
    BadSourcePath {
        /// The path.
        path: String,
        /// The clause it breaks.
        fault: SourcePathFault,
    },
    /// A source's `sha256` or `header_sha256` that is not 64 lowercase hex digits.
    #[error("source {0:?}: sha256 and header_sha256 must be 64 lowercase hex digits")]
    BadSourceHash(String),
    /// A source listed twice.
    #[error("source {0:?} is listed twice")]
    SourceTwice(String),
    /// A file name that is not plain.
    #[error("file name {0:?} is not a plain name")]
    NotPlainName(String),
    /// A file listed twice.
    #[error("file {0:?} is listed twice")]
    FileTwice(String),
    /// A file hash that is not 64 lowercase hex digits.
    #[error("file {0:?}: hashes must be 64 lowercase hex digits")]
    BadFileHash(String),
    /// An aux file with `sources`.
    #[error("file {0:?}: an aux file has no \"sources\" (only JNF files do)")]
    AuxWithSources(String),
    /// A file's source read naming a source `conversion.sources` lacks.
    #[error("file {file:?}: source {source_path:?} is not in conversion.sources")]
    UnlistedSourceRead {
        /// The file.
        file: String,
        /// The source it names.
        source_path: String,
    },
    /// A file naming one source twice.
    #[error("file {file:?}: source {source_path:?} is listed twice")]
    SourceReadTwice {
        /// The file.
        file: String,
        /// The source.
        source_path: String,
    },
    /// A `tensors_blake3` that is not 64 lowercase hex digits.
    #[error(
        "file {file:?}: source {source_path:?}: tensors_blake3 must be 64 lowercase hex digits"
    )]
    BadTensorsBlake3 {
        /// The file.
        file: String,
        /// The source.
        source_path: String,
    },
    /// A layer file not named `layer-NNNNN.jnf` of its layer.
    #[error("layer {layer} file must be named {want}")]
    WrongLayerFileName {
        /// The layer.
        layer: u32,
        /// Its name.
        want: String,
    },
    /// A kind and layer that do not go together (or a trunk/aux name that breaks its kind).
    #[error("file {path:?}: kind {kind} {} is not allowed", .layer.map_or("without a layer".to_string(), |l| format!("with layer {l}")))]
    BadKind {
        /// The file.
        path: String,
        /// Its kind.
        kind: String,
        /// Its layer.
        layer: Option<u32>,
    },
    /// More than one trunk file.
    #[error("more than one trunk file")]
    TwoTrunks,
    /// `layers` not strictly ascending.
    #[error("layers must be ascending without repeats")]
    LayersNotAscending,
    /// `layers` and the layer files disagree.
    #[error("layers {layers:?} do not match the layer files {files:?}")]
    LayersMismatch {
        /// `layers`.
        layers: Vec<u32>,
        /// The layer files' layers.
        files: Vec<u32>,
    },
    /// A layer at or past `num_layers`.
    #[error("layer {layer} is not below num_layers {num_layers}")]
    LayerOutOfRange {
        /// The layer.
        layer: u32,
        /// `architecture.num_layers`.
        num_layers: u32,
    },
    /// A tokenizer file that is not an aux file of the manifest.
    #[error("tokenizer file {0:?} is not listed as an aux file")]
    TokenizerNotAux(String),
}

impl Manifest {
    /// Check the rules of §8 that need no file system: returns what is wrong.
    pub fn check(&self) -> std::result::Result<(), ManifestFault> {
        if self.format != FORMAT_NAME {
            return Err(ManifestFault::NotJnfModel(self.format.clone()));
        }
        if self.format_version[0] != 1 {
            return Err(ManifestFault::UnsupportedMajor(self.format_version[0]));
        }
        if !["safetensors", "gguf", "synthetic"].contains(&self.architecture.source_format.as_str())
        {
            return Err(ManifestFault::UnknownSourceFormat(
                self.architecture.source_format.clone(),
            ));
        }
        for src in &self.conversion.sources {
            if let Err(fault) = check_source_path(&src.path) {
                return Err(ManifestFault::BadSourcePath {
                    path: src.path.clone(),
                    fault,
                });
            }
            let bad_hash = |h: &Option<String>| h.as_deref().is_some_and(|h| !is_hex64(h));
            if bad_hash(&src.sha256) || bad_hash(&src.header_sha256) {
                return Err(ManifestFault::BadSourceHash(src.path.clone()));
            }
        }
        let mut source_paths = BTreeSet::new();
        for src in &self.conversion.sources {
            if !source_paths.insert(src.path.as_str()) {
                return Err(ManifestFault::SourceTwice(src.path.clone()));
            }
        }
        let mut names = BTreeSet::new();
        let mut file_layers = BTreeSet::new();
        let mut trunks = 0;
        for f in &self.files {
            if !is_plain_name(&f.path) || f.path == MANIFEST_NAME {
                return Err(ManifestFault::NotPlainName(f.path.clone()));
            }
            if !names.insert(f.path.as_str()) {
                return Err(ManifestFault::FileTwice(f.path.clone()));
            }
            if !is_hex64(&f.sha256) || !is_hex64(&f.blake3) {
                return Err(ManifestFault::BadFileHash(f.path.clone()));
            }
            if let Some(reads) = &f.sources {
                if f.kind == FileKind::Aux {
                    return Err(ManifestFault::AuxWithSources(f.path.clone()));
                }
                let mut seen = BTreeSet::new();
                for s in reads {
                    if !self.conversion.sources.iter().any(|c| c.path == s.path) {
                        return Err(ManifestFault::UnlistedSourceRead {
                            file: f.path.clone(),
                            source_path: s.path.clone(),
                        });
                    }
                    if !seen.insert(s.path.as_str()) {
                        return Err(ManifestFault::SourceReadTwice {
                            file: f.path.clone(),
                            source_path: s.path.clone(),
                        });
                    }
                    if !is_hex64(&s.tensors_blake3) {
                        return Err(ManifestFault::BadTensorsBlake3 {
                            file: f.path.clone(),
                            source_path: s.path.clone(),
                        });
                    }
                }
            }
            match (f.kind, f.layer) {
                (FileKind::Layer, Some(l)) => {
                    if f.path != layer_file_name(l) {
                        return Err(ManifestFault::WrongLayerFileName {
                            layer: l,
                            want: layer_file_name(l),
                        });
                    }
                    file_layers.insert(l);
                }
                (FileKind::Trunk, None) if f.path == TRUNK_NAME => trunks += 1,
                (FileKind::Aux, None) if !f.path.ends_with(".jnf") => {}
                _ => {
                    return Err(ManifestFault::BadKind {
                        path: f.path.clone(),
                        kind: f.kind.name().to_string(),
                        layer: f.layer,
                    })
                }
            }
        }
        if trunks > 1 {
            return Err(ManifestFault::TwoTrunks);
        }
        if !self.layers.windows(2).all(|w| w[0] < w[1]) {
            return Err(ManifestFault::LayersNotAscending);
        }
        let listed: BTreeSet<u32> = self.layers.iter().copied().collect();
        if listed != file_layers {
            return Err(ManifestFault::LayersMismatch {
                layers: self.layers.clone(),
                files: file_layers.into_iter().collect(),
            });
        }
        if let Some(&l) = self
            .layers
            .iter()
            .find(|&&l| l >= self.architecture.num_layers)
        {
            return Err(ManifestFault::LayerOutOfRange {
                layer: l,
                num_layers: self.architecture.num_layers,
            });
        }
        for t in &self.tokenizer {
            if !self
                .files
                .iter()
                .any(|f| &f.path == t && f.kind == FileKind::Aux)
            {
                return Err(ManifestFault::TokenizerNotAux(t.clone()));
            }
        }
        Ok(())
    }

    /// Read and check `DIR/manifest.json`.
    pub fn load(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_NAME);
        let bad = |fault: ManifestFault| Error::Manifest {
            path: path.clone(),
            fault,
        };
        let bytes = crate::fsio::read_regular(&path, MAX_MANIFEST_LEN)?;
        Self::from_bytes(&bytes).map_err(bad)
    }

    /// Parse and check manifest bytes (digest, then the rules of §8.1).
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Manifest, ManifestFault> {
        // A duplicate key is refused: JSON parsers disagree on which copy wins, so a manifest
        // with one could mean one thing to tarfa and another to an auditor's tool.
        let NoDuplicateKeys(mut v) =
            serde_json::from_slice(bytes).map_err(|e| ManifestFault::NotJson(e.to_string()))?;
        let recorded = v
            .as_object_mut()
            .and_then(|o| o.remove(DIGEST_KEY))
            .ok_or(ManifestFault::NoDigest)?;
        let actual = content_digest(&v);
        if recorded.as_str() != Some(actual.as_str()) {
            if recorded.as_str() == Some(pre_jcs_digest(&v).as_str()) {
                return Err(ManifestFault::PreJcsDigest {
                    recorded: recorded.as_str().unwrap_or_default().to_string(),
                });
            }
            return Err(ManifestFault::DigestMismatch {
                recorded: recorded.to_string(),
                actual,
            });
        }
        let m: Manifest =
            serde_json::from_value(v).map_err(|e| ManifestFault::Schema(e.to_string()))?;
        m.check()?;
        Ok(m)
    }

    /// Check, then publish as `DIR/manifest.json` atomically.
    pub fn publish(&self, dir: &Path) -> Result<()> {
        let path = dir.join(MANIFEST_NAME);
        self.check().map_err(|fault| Error::Manifest {
            path: path.clone(),
            fault,
        })?;
        let ser = |e: serde_json::Error| Error::Manifest {
            path: path.clone(),
            fault: ManifestFault::Schema(e.to_string()),
        };
        let mut v = serde_json::to_value(self).map_err(ser)?;
        let digest = content_digest(&v);
        if let Some(o) = v.as_object_mut() {
            o.insert(DIGEST_KEY.into(), serde_json::Value::String(digest));
        }
        let mut bytes = serde_json::to_vec_pretty(&v).map_err(ser)?;
        bytes.push(b'\n');
        if crate::fsio::read_regular(&path, bytes.len() as u64)
            .ok()
            .as_deref()
            == Some(&bytes[..])
        {
            return Ok(()); // already this manifest: a rerun that changed nothing rewrites nothing
        }
        crate::publish::write_atomic(&path, &bytes)
    }

    /// Layers of the model (`0..num_layers`) that `layers` does not list, ascending.
    pub fn missing_layers(&self) -> Vec<u32> {
        (0..self.architecture.num_layers)
            .filter(|l| self.layers.binary_search(l).is_err())
            .collect()
    }

    /// The entry of a layer's file.
    pub fn layer_file(&self, layer: u32) -> Option<&FileEntry> {
        self.files
            .iter()
            .find(|f| f.kind == FileKind::Layer && f.layer == Some(layer))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn mtp_layers_are_declared_under_every_familys_key() {
        for key in [
            "num_nextn_predict_layers",
            "num_mtp_layers",
            "mtp_num_hidden_layers",
        ] {
            let c = serde_json::json!({"num_hidden_layers": 4, key: 2});
            let d = super::declared_layers("safetensors", &c)
                .expect("bounded")
                .expect("declared");
            assert_eq!((d.main, d.mtp), (4, 2), "{key}");
            assert!(
                super::check_layer_count("safetensors", &c, 6).is_ok(),
                "{key}"
            );
            assert!(
                super::check_layer_count("safetensors", &c, 7).is_err(),
                "{key}"
            );
        }
    }

    use super::*;

    fn entry(path: &str, kind: FileKind, layer: Option<u32>) -> FileEntry {
        FileEntry {
            path: path.into(),
            kind,
            layer,
            size: 4096,
            sha256: "0".repeat(64),
            blake3: "1".repeat(64),
            sources: None,
        }
    }

    fn source(path: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            size: 8,
            sha256: None,
            header_sha256: None,
            mtime_ns: Some(1),
            ctime_ns: Some(2),
        }
    }

    fn read(path: &str) -> SourceRead {
        SourceRead {
            path: path.into(),
            size: 8,
            mtime_ns: Some(1),
            ctime_ns: Some(2),
            tensors_blake3: "2".repeat(64),
        }
    }

    #[test]
    fn source_reads_of_listed_sources_are_accepted_and_survive_publishing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut m = manifest();
        m.conversion.sources = vec![source("a.safetensors")];
        m.files[1].sources = Some(vec![read("a.safetensors")]);
        assert_eq!(m.check(), Ok(()));
        m.publish(dir.path()).expect("publish");
        assert_eq!(Manifest::load(dir.path()).expect("load"), m);
    }

    fn manifest() -> Manifest {
        Manifest {
            format: FORMAT_NAME.into(),
            format_version: [1, 0],
            architecture: Architecture {
                source_format: "synthetic".into(),
                config: serde_json::json!({}),
                num_layers: 2,
            },
            tokenizer: vec![],
            layers: vec![0, 1],
            files: vec![
                entry("trunk.jnf", FileKind::Trunk, None),
                entry("layer-00000.jnf", FileKind::Layer, Some(0)),
                entry("layer-00001.jnf", FileKind::Layer, Some(1)),
            ],
            conversion: Conversion {
                tool: "tarfa".into(),
                tool_version: "0".into(),
                sources: vec![],
            },
        }
    }

    #[test]
    fn a_duplicate_key_is_refused_even_when_the_digest_matches() {
        let dir = tempfile::tempdir().expect("tempdir");
        manifest().publish(dir.path()).expect("publish");
        let good = std::fs::read_to_string(dir.path().join(MANIFEST_NAME)).expect("read");
        // A second "layers" before the real one: serde_json alone would keep the last silently,
        // and the digest, over the parsed content, would still match.
        let bad = good.replacen("{", "{\n  \"layers\": [0],", 1);
        let e = Manifest::from_bytes(bad.as_bytes()).expect_err("refused");
        assert!(
            matches!(&e, ManifestFault::NotJson(t) if t.contains("duplicate key \"layers\"")),
            "{e}"
        );
        assert_eq!(
            Manifest::from_bytes(good.as_bytes()).expect("good"),
            manifest()
        );
    }

    #[test]
    fn a_manifest_that_is_not_a_regular_file_is_refused_without_reading_forever() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink("/dev/zero", dir.path().join(MANIFEST_NAME)).expect("link");
        let e = Manifest::load(dir.path()).expect_err("refused");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }

    /// Review finding 13: the digest is of RFC 8785 (JCS) canonical JSON, which no JSON
    /// library's version can move: `1e+300` (not serde_json's `1e300`), `-0` and `1.0` as
    /// ECMAScript writes them, keys in UTF-16 order (the emoji, D83D DE00, before U+E000, which
    /// UTF-8 order reverses), integers exact.
    #[test]
    fn content_digest_hashes_rfc8785_canonical_json() {
        use sha2::Digest;
        let v: serde_json::Value = serde_json::from_str(
            r#"{"digest": "left out", "f": [1e300, -0.0, 1.0, 1e-7, 0.1, 5e-324, 1e21],
                "\ud83d\ude00": 1, "\ue000": 2, "i": 18446744073709551615}"#,
        )
        .expect("JSON");
        let want = "{\"f\":[1e+300,0,1,1e-7,0.1,5e-324,1e+21],\"i\":18446744073709551615,\
                    \"\u{1f600}\":1,\"\u{e000}\":2}";
        assert_eq!(
            content_digest(&v),
            hex::encode(sha2::Sha256::digest(want.as_bytes()))
        );
    }

    /// A manifest sealed with the pre-JCS digest is refused, with a message that says to convert
    /// again. (Where the two forms are the same bytes — no float, every key in the BMP below
    /// U+E000 — the digest is the same and the manifest stays valid.)
    #[test]
    fn a_manifest_with_a_pre_jcs_digest_is_refused_and_told_to_convert_again() {
        let mut m = manifest();
        assert_eq!(
            pre_jcs_digest(&serde_json::to_value(&m).expect("value")),
            content_digest(&serde_json::to_value(&m).expect("value"))
        );
        m.architecture.config = serde_json::json!({"rope_theta": 10000.0});
        let mut v = serde_json::to_value(m).expect("value");
        let old = pre_jcs_digest(&v);
        assert_ne!(old, content_digest(&v));
        v.as_object_mut()
            .expect("object")
            .insert(DIGEST_KEY.into(), serde_json::Value::String(old));
        let e = Manifest::from_bytes(&serde_json::to_vec(&v).expect("json")).expect_err("refused");
        assert!(matches!(e, ManifestFault::PreJcsDigest { .. }), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("RFC 8785") && e.contains("convert the model again"),
            "{e}"
        );
    }

    #[test]
    fn every_single_bit_flip_of_a_published_manifest_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        manifest().publish(dir.path()).expect("publish");
        let path = dir.path().join(MANIFEST_NAME);
        let good = std::fs::read(&path).expect("read");
        assert_eq!(Manifest::load(dir.path()).expect("load"), manifest());
        for i in 0..good.len() {
            for bit in 0..8 {
                let mut b = good.clone();
                b[i] ^= 1 << bit;
                assert!(
                    Manifest::from_bytes(&b).is_err(),
                    "flip of bit {bit} of byte {i} ({:?}) went unnoticed",
                    good[i] as char
                );
            }
        }
    }

    /// Review finding 14: a source path obeys the rule a region's `src_file` obeys (§5.1), so
    /// `\` separates and `:`, NUL, `.` and `..` components are refused here as there.
    #[test]
    fn a_source_path_obeys_the_src_file_rule() {
        use SourcePathFault as F;
        let cases = [
            ("a\\..\\b", F::DotComponent),
            ("C:x", F::Colon),
            ("a\0b", F::Nul),
            ("a/./b", F::DotComponent),
            ("../b", F::DotComponent),
            ("/b", F::Absolute),
            ("a//b", F::EmptyComponent),
            ("", F::Empty),
        ];
        for (path, fault) in cases {
            let mut m = manifest();
            m.conversion.sources = vec![source(path)];
            assert_eq!(
                m.check(),
                Err(ManifestFault::BadSourcePath {
                    path: path.into(),
                    fault
                }),
                "{path:?}"
            );
        }
        let mut m = manifest();
        m.conversion.sources = vec![source("a\\b.safetensors")];
        assert_eq!(
            m.check(),
            Ok(()),
            "'\\' separates: a\\b is a path below the source"
        );
    }

    /// Finding 18/24: a kind and layer that do not go together are named in the manifest's own
    /// words (`layer`, `aux`), the layer as a number or its absence — no Rust syntax.
    #[test]
    fn a_bad_kind_is_told_in_the_manifests_words() {
        let mut m = manifest();
        m.files[1].layer = None;
        let e = m.check().expect_err("a layer file without a layer");
        assert!(matches!(e, ManifestFault::BadKind { .. }), "{e}");
        let text = e.to_string();
        assert!(text.contains("kind layer without a layer"), "{text}");
        let mut m = manifest();
        m.files.push(entry("notes.txt", FileKind::Aux, Some(0)));
        let text = m.check().expect_err("an aux file with a layer").to_string();
        assert!(text.contains("kind aux with layer 0"), "{text}");
        for rust in ["None", "Some(", "Layer", "Aux"] {
            assert!(!text.contains(rust), "{rust:?} in {text}");
        }
    }

    #[test]
    fn manifest_rules_reject_each_inconsistency() {
        assert_eq!(manifest().check(), Ok(()));
        type Mutation = Box<dyn Fn(&mut Manifest)>;
        let cases: Vec<(&str, &str, Mutation)> = vec![
            (
                "major",
                "UnsupportedMajor",
                Box::new(|m| m.format_version = [2, 0]),
            ),
            (
                "layer missing",
                "LayersMismatch",
                Box::new(|m| m.layers = vec![0]),
            ),
            (
                "extra layer",
                "LayersMismatch",
                Box::new(|m| m.layers = vec![0, 1, 2]),
            ),
            (
                "unsorted",
                "LayersNotAscending",
                Box::new(|m| m.layers = vec![1, 0]),
            ),
            (
                "dup file",
                "FileTwice",
                Box::new(|m| m.files.push(entry("trunk.jnf", FileKind::Aux, None))),
            ),
            (
                "path",
                "NotPlainName",
                Box::new(|m| m.files[0].path = "../x".into()),
            ),
            (
                "hash",
                "BadFileHash",
                Box::new(|m| m.files[1].sha256 = "XYZ".into()),
            ),
            (
                "name",
                "WrongLayerFileName",
                Box::new(|m| m.files[1].path = "layer-0.jnf".into()),
            ),
            (
                "tokenizer",
                "TokenizerNotAux",
                Box::new(|m| m.tokenizer = vec!["tokenizer.json".into()]),
            ),
            (
                "num_layers",
                "LayerOutOfRange",
                Box::new(|m| m.architecture.num_layers = 1),
            ),
            (
                "source hash",
                "BadSourceHash",
                Box::new(|m| {
                    let mut s = source("a.safetensors");
                    s.header_sha256 = Some("AB".into());
                    m.conversion.sources = vec![s];
                }),
            ),
            (
                "source listed twice",
                "SourceTwice",
                Box::new(|m| {
                    m.conversion.sources = vec![source("a.safetensors"), source("a.safetensors")]
                }),
            ),
            (
                "read of an unlisted source",
                "UnlistedSourceRead",
                Box::new(|m| m.files[1].sources = Some(vec![read("b.safetensors")])),
            ),
            (
                "read listed twice",
                "SourceReadTwice",
                Box::new(|m| {
                    m.files[1].sources = Some(vec![read("a.safetensors"), read("a.safetensors")])
                }),
            ),
            (
                "bad tensors_blake3",
                "BadTensorsBlake3",
                Box::new(|m| {
                    let mut r = read("a.safetensors");
                    r.tensors_blake3 = "AB".into();
                    m.files[1].sources = Some(vec![r]);
                }),
            ),
            (
                "aux with sources",
                "AuxWithSources",
                Box::new(|m| {
                    m.files.push(entry("config.json", FileKind::Aux, None));
                    m.files[3].sources = Some(vec![read("a.safetensors")]);
                }),
            ),
        ];
        for (what, variant, mutate) in cases {
            let mut m = manifest();
            m.conversion.sources = vec![source("a.safetensors")];
            assert_eq!(m.check(), Ok(()), "{what}: the base is valid");
            mutate(&mut m);
            let e = m.check().expect_err(what);
            assert!(
                format!("{e:?}").starts_with(variant),
                "{what} must be refused as {variant}, not {e:?}"
            );
        }
    }
}
