//! Typed errors. Every MUST of `spec/JNF_V1.md` maps to one [`Violation`] variant, named in the
//! spec beside the rule; each names what broke and where (byte offset, region, expert).

use std::path::PathBuf;

/// A breach of a JNF v1 rule, found in bytes a reader was given or a writer was asked to emit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// §2: the file is shorter than the header page.
    #[error("file is {len} bytes, shorter than the 4096-byte header page")]
    FileTooShort {
        /// Actual length.
        len: u64,
    },
    /// §2: the first 8 bytes are not the JNF magic.
    #[error("bad magic {found}: not a JNF file")]
    BadMagic {
        /// The first bytes, in hex.
        found: String,
    },
    /// §2.1: a major version this reader does not implement.
    #[error("JNF major version {major} is not supported (this reader implements 1)")]
    UnsupportedMajor {
        /// Major version found.
        major: u16,
    },
    /// §2.1: a must-understand flag this reader does not know.
    #[error("unknown must-understand flags {flags:#018x}")]
    UnknownRequiredFlags {
        /// The unknown bits.
        flags: u64,
    },
    /// §2: the header's own BLAKE3 does not match its bytes.
    #[error("header hash mismatch: header bytes 0..48 were changed")]
    HeaderHashMismatch,
    /// §2.1: a header field breaks a rule of its own.
    #[error("header field {field}: {detail}")]
    BadHeaderField {
        /// The field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// §2.2: the file does not end in a JNF footer.
    #[error("file is {len} bytes and does not end in a JNF footer: truncated, or bytes appended")]
    NoFooter {
        /// Actual length.
        len: u64,
    },
    /// §2.2: the footer's BLAKE3 does not match the footer and the header page.
    #[error("footer hash mismatch: the footer or the header page was changed")]
    FooterHashMismatch,
    /// §2: a reserved byte is not zero.
    #[error("reserved byte at offset {offset} is {value:#04x}, must be zero")]
    NonZeroReserved {
        /// Absolute file offset.
        offset: u64,
        /// The byte found.
        value: u8,
    },
    /// §2: the file is not as long as its header says (truncated or appended to).
    #[error("file is {actual} bytes but its footer says {expected}: truncated or appended to")]
    FileLenMismatch {
        /// `file_len` from the footer.
        expected: u64,
        /// Actual length.
        actual: u64,
    },
    /// §3: an offset or length that must be a multiple of 4096 is not.
    #[error("{what} at {value} is not a multiple of 4096")]
    Misaligned {
        /// What is misaligned (`"region 3 'x' offset"`, `"index offset"`).
        what: String,
        /// The offending value.
        value: u64,
    },
    /// §3/§5: the index does not lie where the layout says it must.
    #[error("index at {offset}+{len} must start at {expected} (right after the last region) and end within the file of {file_len} bytes")]
    IndexPlacement {
        /// `index_offset`.
        offset: u64,
        /// `index_len`.
        len: u64,
        /// Where it must start.
        expected: u64,
        /// File length.
        file_len: u64,
    },
    /// §6: a count or length larger than the file or the format's limits allow.
    #[error("{what} is {value}, more than the {limit} that {why}")]
    LimitExceeded {
        /// What was counted.
        what: &'static str,
        /// Value found.
        value: u64,
        /// Limit.
        limit: u64,
        /// Where the limit comes from.
        why: &'static str,
    },
    /// §2.2/§5.4: the index bytes do not match the hash in the footer.
    #[error(
        "index hash mismatch ({algo}): the footer records {expected}, the index hashes to {actual}"
    )]
    IndexHashMismatch {
        /// `"blake3"` or `"sha256"`.
        algo: &'static str,
        /// Recorded hash, hex.
        expected: String,
        /// Computed hash, hex.
        actual: String,
    },
    /// §3: a region does not start where the previous one (padded) ends.
    #[error("region {region} '{name}' starts at {offset}, expected {expected}: regions must be packed in index order ({})", if *offset < *expected { "overlap" } else { "hole" })]
    RegionPlacement {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// Its offset.
        offset: u64,
        /// Where it must start.
        expected: u64,
    },
    /// §3: a region reaches past the data area.
    #[error(
        "region {region} '{name}' at {offset}+{len} lies outside the data area ending at {end}"
    )]
    RegionOutOfFile {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// Offset.
        offset: u64,
        /// Length.
        len: u64,
        /// End of the data area.
        end: u64,
    },
    /// §4: a dtype code not in the table.
    #[error("region {region}: unknown dtype code {code:#x}")]
    UnknownDtype {
        /// Region number.
        region: u32,
        /// Code found.
        code: u32,
    },
    /// §4: shape, dtype and length disagree, or rank is over 8.
    #[error("region {region} '{name}': {detail}")]
    BadShape {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// §5.3: a string reference outside the string table.
    #[error("region {region}: {field} string at {offset}+{len} lies outside the {table_len}-byte string table")]
    StringOutOfBounds {
        /// Region number.
        region: u32,
        /// Which field.
        field: &'static str,
        /// Offset in the table.
        offset: u32,
        /// Length.
        len: u32,
        /// Table length.
        table_len: u64,
    },
    /// §5.3: a string that is not UTF-8.
    #[error("region {region}: {field} is not valid UTF-8 (error at byte {valid_up_to})")]
    BadUtf8 {
        /// Region number.
        region: u32,
        /// Which field.
        field: &'static str,
        /// Length of the valid prefix.
        valid_up_to: usize,
    },
    /// §5.1: a region name that is empty or contains NUL (too long: `StringOutOfBounds`).
    #[error("region {region}: bad name: {detail}")]
    BadName {
        /// Region number.
        region: u32,
        /// What is wrong.
        detail: &'static str,
    },
    /// §5.3: the string table is not in canonical form (each distinct string once, in order of
    /// first reference, nothing else).
    #[error("region {region}: {field} string at {offset}+{len}: {detail}")]
    NonCanonicalStrings {
        /// Region number (or the region count, for trailing bytes).
        region: u32,
        /// Which field.
        field: &'static str,
        /// Offset in the table.
        offset: u32,
        /// Length.
        len: u32,
        /// What is wrong.
        detail: String,
    },
    /// §5.1: two regions with one name.
    #[error("duplicate region name '{name}' (regions {first} and {second})")]
    DuplicateName {
        /// The name.
        name: String,
        /// First region with it.
        first: u32,
        /// Second region with it.
        second: u32,
    },
    /// §5.1: a region's layer, expert or role fields are inconsistent.
    #[error("region {region} '{name}': {detail}")]
    BadRegionRole {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// §5.1: provenance fields are inconsistent.
    #[error("region {region} '{name}': bad provenance: {detail}")]
    BadProvenance {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// §5.2: the expert table does not match the layer × expert grid or its regions.
    #[error("expert record {record} (layer {layer}, expert {expert}): {detail}")]
    BadExpert {
        /// Record number.
        record: u32,
        /// Layer in the record.
        layer: u32,
        /// Expert in the record.
        expert: u32,
        /// What is wrong.
        detail: String,
    },
    /// §5.2: an expert digest does not match its regions' hashes.
    #[error(
        "layer {layer} expert {expert}: {algo} expert digest does not match its regions' hashes"
    )]
    ExpertDigestMismatch {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
        /// `"blake3"` or `"sha256"`.
        algo: &'static str,
    },
    /// §5.4 (data): a region's bytes do not match its recorded hash.
    #[error("region {region} '{name}' ({location}) at file offset {offset}: {algo} mismatch, expected {expected}, got {actual}")]
    RegionHashMismatch {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// Layer/expert/role, readable.
        location: String,
        /// Region offset in the file.
        offset: u64,
        /// `"blake3"` or `"sha256"`.
        algo: &'static str,
        /// Recorded, hex.
        expected: String,
        /// Computed, hex.
        actual: String,
    },
    /// §3 (data): a padding byte is not zero.
    #[error("non-zero padding byte {value:#04x} at file offset {offset} ({after})")]
    NonZeroPadding {
        /// Absolute offset.
        offset: u64,
        /// The byte.
        value: u8,
        /// What the padding follows.
        after: String,
    },
}

/// Errors of the format crate: a rule broken, or the operating system failing us.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes break a JNF v1 rule.
    #[error("{}: {violation}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// The rule broken.
        violation: Violation,
    },
    /// An I/O call failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What we were doing.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The writer was used against its contract (wrong order, bad arguments).
    #[error("{}: writer: {message}", path.display())]
    Usage {
        /// What was wrong.
        message: String,
        /// The file being written.
        path: PathBuf,
    },
    /// A manifest is malformed or inconsistent.
    #[error("{}: manifest: {fault}", path.display())]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        fault: crate::manifest::ManifestFault,
    },
    /// A file to read is not a regular file, or is over its size limit, or cannot be opened.
    #[error(transparent)]
    File(#[from] crate::fsio::FsError),
}

impl Error {
    /// The rule broken, if this is a format error.
    pub fn violation(&self) -> Option<&Violation> {
        match self {
            Error::Format { violation, .. } => Some(violation),
            _ => None,
        }
    }

    pub(crate) fn usage(message: String, path: &std::path::Path) -> Error {
        Error::Usage {
            message,
            path: path.to_path_buf(),
        }
    }

    pub(crate) fn io(path: &std::path::Path, op: &'static str, source: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }
}

/// Result alias of the format crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
