//! What the verifier found: faults that each name a file and, where there is one, the tensor,
//! layer, expert, projection, byte offset and the two hashes; and the totals of what was read.

use serde::Serialize;

/// The class of a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The manifest is missing, unreadable or breaks its rules.
    Manifest,
    /// A file the manifest lists is not there.
    MissingFile,
    /// A file in the directory that the manifest does not list.
    ExtraFile,
    /// A file whose size differs from the manifest's.
    Size,
    /// A JNF file whose root digest differs from the manifest's, or an aux file whose hash does,
    /// or a JNF file whose regions are not the source tensors its manifest entry's `sources`
    /// record (source files and `tensors_blake3`).
    FileHash,
    /// A JNF file that breaks a structural rule of the spec (header, footer, index).
    Structure,
    /// A JNF file whose header says another layer than its name and the manifest.
    WrongLayer,
    /// A region whose bytes do not match its recorded hashes.
    RegionHash,
    /// An expert whose recomputed digest differs from the recorded one.
    ExpertDigest,
    /// The index bytes read directly from the disk do not match the footer's hashes.
    IndexHash,
    /// A padding byte that is not zero.
    Padding,
    /// A region whose bytes differ from the source checkpoint's bytes at its provenance.
    SourceMismatch,
    /// A source file that cannot be read where the provenance points, or whose header differs
    /// from the one converted.
    Source,
    /// The disk returned an error reading a file.
    ReadError,
    /// The model is not whole: layers of its config, the trunk, or (with a source) source
    /// tensors are in no file of it.
    Incomplete,
    /// The manifest's architecture config (the one the decoder computes with) differs from the
    /// model directory's `config.json`, or, with `--source`, from the source's config (HF
    /// `config.json`, a GGUF's key/values).
    Config,
    /// Files of the model were checked against different versions of one source file: their
    /// manifest entries record another identity (size, mtime, ctime) of it than the
    /// conversion's (spec §8.2) — layers of two generations of a source presented as one model.
    MixedSources,
    /// A file whose check stopped on an internal error (a bug in the verifier): it is not
    /// verified, so the report cannot pass.
    Unchecked,
}

impl FaultKind {
    /// The kind in words, for people (the JSON name with spaces: `extra file`).
    pub fn words(self) -> &'static str {
        match self {
            FaultKind::Manifest => "manifest",
            FaultKind::MissingFile => "missing file",
            FaultKind::ExtraFile => "extra file",
            FaultKind::Size => "size",
            FaultKind::FileHash => "file hash",
            FaultKind::Structure => "structure",
            FaultKind::WrongLayer => "wrong layer",
            FaultKind::RegionHash => "region hash",
            FaultKind::ExpertDigest => "expert digest",
            FaultKind::IndexHash => "index hash",
            FaultKind::Padding => "padding",
            FaultKind::SourceMismatch => "source mismatch",
            FaultKind::Source => "source",
            FaultKind::ReadError => "read error",
            FaultKind::Incomplete => "incomplete",
            FaultKind::Config => "config",
            FaultKind::MixedSources => "mixed sources",
            FaultKind::Unchecked => "unchecked",
        }
    }
}

/// One fault, located as precisely as the check allows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Fault {
    /// What class of fault.
    pub kind: FaultKind,
    /// The file in the model directory (or the source file, for `Source`).
    pub file: String,
    /// The tensor (region name), if the fault is in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<String>,
    /// Layer, if known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<u32>,
    /// Expert, if the fault is in an expert.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert: Option<u32>,
    /// Projection role, if the fault is in an expert.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub projection: Option<String>,
    /// Offset in the file of the first faulty byte (or of the faulty region).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Offset in the source file of the first differing byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_offset: Option<u64>,
    /// Expected hash or value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Actual hash or value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<String>,
    /// A sentence saying what is wrong.
    pub detail: String,
}

impl Fault {
    /// A fault with only a kind, a file and a sentence.
    pub fn new(kind: FaultKind, file: impl Into<String>, detail: impl Into<String>) -> Fault {
        Fault {
            kind,
            file: file.into(),
            tensor: None,
            layer: None,
            expert: None,
            projection: None,
            offset: None,
            source_offset: None,
            expected: None,
            actual: None,
            detail: detail.into(),
        }
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let mut s = format!("{}: {}", self.file, self.kind.words());
        if let Some(t) = &self.tensor {
            s += &format!(" in '{t}'");
        }
        match (self.layer, self.expert, &self.projection) {
            (Some(l), Some(e), Some(p)) => s += &format!(" (layer {l} expert {e} {p})"),
            (Some(l), None, _) => s += &format!(" (layer {l})"),
            _ => {}
        }
        if let Some(o) = self.offset {
            s += &format!(" at byte {o}");
        }
        if let Some(o) = self.source_offset {
            s += &format!(" (source byte {o})");
        }
        s += &format!(": {}", self.detail);
        if let (Some(e), Some(a)) = (&self.expected, &self.actual) {
            s += &format!(" [expected {e}, actual {a}]");
        }
        s
    }
}

/// The outcome of a verification.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The model directory.
    pub dir: String,
    /// The source directory compared against, if any.
    pub source: Option<String>,
    /// JNF files whose every byte was read.
    pub files_read: u64,
    /// JNF files checked only structurally (outside `--layers` or `--sample`).
    pub files_structure_only: u64,
    /// Bytes of JNF files read (with `O_DIRECT` where allowed).
    pub bytes_read: u64,
    /// Regions whose hashes were recomputed.
    pub regions_checked: u64,
    /// Experts whose digests were recomputed.
    pub experts_checked: u64,
    /// Bytes compared with the source checkpoint.
    pub source_bytes_compared: u64,
    /// Whether every JNF file read in full was read with `O_DIRECT`, bypassing the page cache
    /// (false when it was not asked for, or the filesystem refused it for some file); with no file
    /// read, whether it was asked for.
    pub direct_io: bool,
    /// Layers of the model (`0..num_layers`) the manifest does not list.
    pub missing_layers: Vec<u32>,
    /// `n/N` when sampling.
    pub sample: Option<String>,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Every fault found.
    pub faults: Vec<Fault>,
}
