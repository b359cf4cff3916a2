//! What `tarfa inspect` reports about a JNF file or a model directory, as data (serialisable to
//! JSON); the binary only prints it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::layout::{Role, NONE};
use crate::manifest::{FileKind, Manifest};
use crate::reader::JnfReader;

/// One region.
#[derive(Clone, Debug, Serialize)]
pub struct RegionSummary {
    /// Region number.
    pub index: u32,
    /// Name.
    pub name: String,
    /// File offset.
    pub offset: u64,
    /// Exact length.
    pub length: u64,
    /// Dtype name.
    pub dtype: String,
    /// Row-major shape.
    pub shape: Vec<u64>,
    /// Layer, if any.
    pub layer: Option<u32>,
    /// Expert, if any.
    pub expert: Option<u32>,
    /// Role name.
    pub role: &'static str,
    /// SHA-256, hex.
    pub sha256: String,
    /// BLAKE3, hex.
    pub blake3: String,
    /// Provenance, if the region came from a source file.
    pub source: Option<SourceSummary>,
}

/// A region's provenance.
#[derive(Clone, Debug, Serialize)]
pub struct SourceSummary {
    /// Source file.
    pub file: String,
    /// Source tensor.
    pub tensor: String,
    /// Byte range start in the source file.
    pub begin: u64,
    /// Byte range end (exclusive).
    pub end: u64,
    /// Shape of the whole source tensor.
    pub shape: Vec<u64>,
}

/// One expert.
#[derive(Clone, Debug, Serialize)]
pub struct ExpertSummary {
    /// Layer.
    pub layer: u32,
    /// Expert.
    pub expert: u32,
    /// Extent offset.
    pub extent_offset: u64,
    /// Extent length.
    pub extent_len: u64,
    /// Region numbers of its projections.
    pub regions: Vec<u32>,
    /// Expert digest, SHA-256.
    pub sha256: String,
    /// Expert digest, BLAKE3.
    pub blake3: String,
}

/// Totals per dtype.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DtypeTotal {
    /// Regions of this dtype.
    pub regions: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One JNF file.
#[derive(Clone, Debug, Serialize)]
pub struct FileSummary {
    /// Path as given.
    pub path: String,
    /// `major.minor`.
    pub version: String,
    /// File length.
    pub file_len: u64,
    /// Must-understand flags.
    pub required_flags: u64,
    /// Optional flags.
    pub optional_flags: u64,
    /// First layer.
    pub layer_first: u32,
    /// Layer count.
    pub layer_count: u32,
    /// Experts per layer.
    pub experts_per_layer: u32,
    /// Bytes of region data.
    pub data_bytes: u64,
    /// Index offset.
    pub index_offset: u64,
    /// Index length.
    pub index_len: u64,
    /// Root digest, SHA-256.
    pub root_sha256: String,
    /// Root digest, BLAKE3.
    pub root_blake3: String,
    /// Totals per dtype name.
    pub dtypes: BTreeMap<String, DtypeTotal>,
    /// Every region.
    pub regions: Vec<RegionSummary>,
    /// Every expert.
    pub experts: Vec<ExpertSummary>,
}

/// A model directory: its manifest and each JNF file's summary.
#[derive(Clone, Debug, Serialize)]
pub struct ModelSummary {
    /// Directory as given.
    pub dir: String,
    /// The manifest.
    pub manifest: Manifest,
    /// Summaries of the JNF files, in manifest order.
    pub files: Vec<FileSummary>,
    /// Files whose size or root digest differs from the manifest (a cheap check; `tarfa verify`
    /// reads every byte).
    pub mismatches: Vec<String>,
}

/// Summarise one JNF file (opening it validates its structure).
pub fn summarize_file(path: &Path) -> Result<FileSummary> {
    let r = JnfReader::open(path)?;
    let idx = r.index();
    let opt = |v: u32| (v != NONE).then_some(v);
    let mut dtypes: BTreeMap<String, DtypeTotal> = BTreeMap::new();
    let regions = idx
        .regions
        .iter()
        .enumerate()
        .map(|(i, rec)| {
            let dtype = rec.dtype().map_or("?", |d| d.name()).to_string();
            let t = dtypes.entry(dtype.clone()).or_default();
            t.regions += 1;
            t.bytes += rec.length;
            let file = idx.str(rec.src_file);
            RegionSummary {
                index: i as u32,
                name: idx.name(i as u32).to_string(),
                offset: rec.offset,
                length: rec.length,
                dtype,
                shape: rec.shape().to_vec(),
                layer: opt(rec.layer),
                expert: opt(rec.expert),
                role: Role::from_code(rec.role).map_or("?", Role::name),
                sha256: hex::encode(rec.sha256),
                blake3: hex::encode(rec.blake3),
                source: (!file.is_empty()).then(|| SourceSummary {
                    file: file.to_string(),
                    tensor: idx.str(rec.src_tensor).to_string(),
                    begin: rec.src_begin,
                    end: rec.src_end,
                    shape: rec.src_shape().to_vec(),
                }),
            }
        })
        .collect();
    let experts = idx
        .experts
        .iter()
        .map(|e| ExpertSummary {
            layer: e.layer,
            expert: e.expert,
            extent_offset: e.extent_offset,
            extent_len: e.extent_len,
            regions: (e.first_region..e.first_region + e.region_count).collect(),
            sha256: hex::encode(e.sha256),
            blake3: hex::encode(e.blake3),
        })
        .collect();
    let h = r.header();
    let f = r.footer();
    Ok(FileSummary {
        path: path.display().to_string(),
        version: format!("{}.{}", h.major, h.minor),
        file_len: f.file_len,
        required_flags: h.required_flags,
        optional_flags: h.optional_flags,
        layer_first: h.layer_first,
        layer_count: h.layer_count,
        experts_per_layer: h.experts_per_layer,
        data_bytes: idx.regions.iter().map(|r| r.length).sum(),
        index_offset: f.index_offset,
        index_len: f.index_len,
        root_sha256: hex::encode(r.root().sha256),
        root_blake3: hex::encode(r.root().blake3),
        dtypes,
        regions,
        experts,
    })
}

/// Summarise a model directory: load its manifest, open every JNF file it lists, and compare
/// each one's size and root digest with the manifest.
pub fn summarize_model(dir: &Path) -> Result<ModelSummary> {
    let manifest = Manifest::load(dir)?;
    let mut files = Vec::new();
    let mut mismatches = Vec::new();
    for f in &manifest.files {
        let path = dir.join(&f.path);
        if f.kind == FileKind::Aux {
            let size = std::fs::metadata(&path)
                .map_err(|e| Error::io(&path, "stat", e))?
                .len();
            if size != f.size {
                mismatches.push(format!(
                    "{}: {size} bytes, manifest says {}",
                    f.path, f.size
                ));
            }
            continue;
        }
        let s = summarize_file(&path)?;
        let (want_first, want_count) = match f.kind {
            FileKind::Layer => (f.layer.unwrap_or(0), 1),
            _ => (0, 0),
        };
        if (s.layer_first, s.layer_count) != (want_first, want_count) {
            mismatches.push(format!(
                "{}: holds layers {}+{}, the manifest lists it as {:?} {:?}",
                f.path, s.layer_first, s.layer_count, f.kind, f.layer
            ));
        }
        if s.file_len != f.size || s.root_sha256 != f.sha256 || s.root_blake3 != f.blake3 {
            mismatches.push(format!(
                "{}: size {} root sha256 {} differ from the manifest's {} {}",
                f.path, s.file_len, s.root_sha256, f.size, f.sha256
            ));
        }
        files.push(s);
    }
    Ok(ModelSummary {
        dir: dir.display().to_string(),
        manifest,
        files,
        mismatches,
    })
}
