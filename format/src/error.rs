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
    /// §2.1: a file of no layers has a non-zero `layer_first` or `experts_per_layer`.
    #[error("header fields layer_first/experts_per_layer: a file of no layers has layer_first 0 and experts_per_layer 0 (found {layer_first} and {experts_per_layer})")]
    EmptyFileLayerFields {
        /// `layer_first` found.
        layer_first: u32,
        /// `experts_per_layer` found.
        experts_per_layer: u32,
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
        /// What is misaligned: the index offset or a region's offset.
        what: Aligned,
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
    #[error("region {region} '{name}': {fault}")]
    BadShape {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// The rule broken.
        fault: ShapeFault,
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
    #[error("region {region}: bad name: {fault}")]
    BadName {
        /// Region number.
        region: u32,
        /// The rule broken.
        fault: NameFault,
    },
    /// §5.3: the string table is not in canonical form (each distinct string once, in order of
    /// first reference, nothing else).
    #[error("region {region}: {field} string at {offset}+{len}: {fault}")]
    NonCanonicalStrings {
        /// Region number (or the region count, for trailing bytes).
        region: u32,
        /// Which field.
        field: &'static str,
        /// Offset in the table.
        offset: u32,
        /// Length.
        len: u32,
        /// The rule broken.
        fault: StringFault,
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
    #[error("region {region} '{name}': {fault}")]
    BadRegionRole {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// The rule broken.
        fault: RoleFault,
    },
    /// §5.1: provenance fields are inconsistent.
    #[error("region {region} '{name}': bad provenance: {fault}")]
    BadProvenance {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
        /// The rule broken.
        fault: ProvenanceFault,
    },
    /// §5.2: the expert table does not match the layer × expert grid or its regions.
    #[error("expert record {} (layer {layer}, expert {}): {fault}", Opt(*record), Opt(*expert))]
    BadExpert {
        /// Record number (`NONE` for the footer's expert count).
        record: u32,
        /// Layer in the record.
        layer: u32,
        /// Expert in the record.
        expert: u32,
        /// The rule broken.
        fault: ExpertRecordFault,
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
        after: PaddingAfter,
    },
}

/// A `u32` that may be `NONE`, printed as `none` then.
struct Opt(u32);

impl std::fmt::Display for Opt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0 == crate::layout::NONE {
            f.write_str("none")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// What a padding span follows (§3).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PaddingAfter {
    /// A region's bytes.
    #[error("region {region} '{name}'")]
    Region {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
    },
    /// The index.
    #[error("the index")]
    Index,
}

/// What a [`Violation::Misaligned`] names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Aligned {
    /// The footer's `index_offset` (§2.2).
    #[error("index offset")]
    IndexOffset,
    /// A region's `offset` (§3).
    #[error("region {region} '{name}' offset")]
    RegionOffset {
        /// Region number.
        region: u32,
        /// Region name.
        name: String,
    },
}

/// Why a region name was refused (§5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameFault {
    /// The name is empty.
    #[error("empty")]
    Empty,
    /// The name contains a NUL character.
    #[error("contains NUL")]
    ContainsNul,
}

/// Which rule of §4 a region's shape, dtype and length break.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeFault {
    /// `ndim` over `MAX_RANK`.
    #[error("rank {rank} is over the limit of {}", crate::layout::MAX_RANK)]
    RankOverLimit {
        /// `ndim` found.
        rank: u32,
    },
    /// A shape entry at or past `ndim` is not zero.
    #[error("shape entries past the rank are not zero")]
    DimsPastRank,
    /// The last dimension is not a whole number of the dtype's blocks.
    #[error("{dtype} {shape:?}: row is not a whole number of {block_elems}-element blocks")]
    PartialBlock {
        /// The dtype.
        dtype: crate::Dtype,
        /// The shape.
        shape: Vec<u64>,
        /// Elements per block of the dtype.
        block_elems: u64,
    },
    /// The byte length the shape gives overflows 64 bits.
    #[error("{dtype} {shape:?}: the byte length overflows 64 bits")]
    LengthOverflow {
        /// The dtype.
        dtype: crate::Dtype,
        /// The shape.
        shape: Vec<u64>,
    },
    /// The shape gives another byte length than the region's `length`.
    #[error("{dtype} {shape:?} is {bytes} bytes but the region is {length}")]
    LengthMismatch {
        /// The dtype.
        dtype: crate::Dtype,
        /// The shape.
        shape: Vec<u64>,
        /// Bytes the shape gives.
        bytes: u64,
        /// The region's `length`.
        length: u64,
    },
}

/// Which canonical-form rule of the string table (§5.3) a reference breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StringFault {
    /// An empty string not stored as `(0, 0)`.
    #[error("an empty string is stored as offset 0, length 0")]
    EmptyNotAtZero,
    /// A repeat of a stored string that does not reference the stored copy.
    #[error("repeats the string stored at {first}; a repeat must reference it")]
    RepeatNotShared {
        /// Where the string is stored.
        first: u32,
    },
    /// A new string that does not start right after the previous new one.
    #[error("a new string must start at {expected}, right after the previous new string")]
    OutOfOrder {
        /// Where it must start.
        expected: u64,
    },
    /// Bytes after the last new string that no record references.
    #[error("bytes that no record references")]
    Unreferenced,
}

/// Which rule of a region's layer, expert and role fields (§5.1) is broken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleFault {
    /// A role code not in the table.
    #[error("unknown role code {code}")]
    UnknownRole {
        /// The code.
        code: u32,
    },
    /// A layer outside the file's layers.
    #[error("layer {layer} is outside this file's layers {first}..{end}")]
    LayerOutsideFile {
        /// The region's layer.
        layer: u32,
        /// `layer_first`.
        first: u32,
        /// `layer_first + layer_count`.
        end: u64,
    },
    /// A plain tensor that names an expert.
    #[error("a plain tensor must not name an expert (names expert {expert})")]
    TensorNamesExpert {
        /// The expert named.
        expert: u32,
    },
    /// An expert projection without a layer, or with an expert past `experts_per_layer`.
    #[error("expert projection needs a layer and an expert below {experts_per_layer} (has layer {}, expert {})", Opt(*layer), Opt(*expert))]
    ProjectionOutsideGrid {
        /// The region's layer.
        layer: u32,
        /// The region's expert.
        expert: u32,
        /// `experts_per_layer`.
        experts_per_layer: u32,
    },
    /// An expert projection that no expert record lists.
    #[error("an expert projection that no expert record lists")]
    Unlisted,
}

/// Which provenance rule (§5.1) a region breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProvenanceFault {
    /// `src_dtype` is not `dtype`.
    #[error("source dtype {src_dtype:#x} differs from the stored dtype {dtype:#x}; v1 stores bytes unconverted")]
    DtypeDiffers {
        /// `src_dtype`.
        src_dtype: u32,
        /// `dtype`.
        dtype: u32,
    },
    /// `src_ndim` over `MAX_RANK`.
    #[error(
        "source rank {src_ndim} is over the limit of {}",
        crate::layout::MAX_RANK
    )]
    SourceRankOverLimit {
        /// `src_ndim`.
        src_ndim: u32,
    },
    /// A `src_shape` entry at or past `src_ndim` is not zero.
    #[error("source shape entries past the source rank {src_ndim} are not zero")]
    SourceDimsPastRank {
        /// `src_ndim`.
        src_ndim: u32,
    },
    /// No source file, yet a source tensor, range or shape.
    #[error("no source file, yet other source fields are set")]
    FieldsWithoutFile,
    /// A source file that breaks the source-path rule ([`crate::source_path`]).
    #[error("source file {src_file:?} is not a plain relative path: {fault}")]
    NotRelativePath {
        /// The path recorded.
        src_file: String,
        /// The clause it breaks.
        fault: crate::source_path::SourcePathFault,
    },
    /// A source file without a source tensor name.
    #[error("source tensor name is empty")]
    EmptyTensorName,
    /// `src_end - src_begin` is not the region's length.
    #[error("source range {begin}..{end} is not {length} bytes long")]
    RangeLength {
        /// `src_begin`.
        begin: u64,
        /// `src_end`.
        end: u64,
        /// The region's `length`.
        length: u64,
    },
    /// The source shape holds fewer bytes than the region.
    #[error("source tensor shape {shape:?} cannot hold {length} bytes")]
    ShapeTooSmall {
        /// `src_shape`.
        shape: Vec<u64>,
        /// The region's `length`.
        length: u64,
    },
}

/// Which rule of the expert table (§5.2) a record breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpertRecordFault {
    /// The footer's `expert_count` is not `layer_count × experts_per_layer`.
    #[error("footer expert_count {expert_count} != layer_count {layer_count} x experts_per_layer {experts_per_layer}")]
    CountNotGrid {
        /// `expert_count`.
        expert_count: u32,
        /// `layer_count`.
        layer_count: u32,
        /// `experts_per_layer`.
        experts_per_layer: u32,
    },
    /// A record out of grid order.
    #[error("records must be in grid order: expected layer {layer}, expert {expert}")]
    GridOrder {
        /// The layer the record must have.
        layer: u32,
        /// The expert the record must have.
        expert: u32,
    },
    /// `region_count` is 0 or over `MAX_EXPERT_REGIONS`.
    #[error(
        "{count} regions; an expert has 1..={}",
        crate::validate::MAX_EXPERT_REGIONS
    )]
    RegionCount {
        /// `region_count`.
        count: u32,
    },
    /// The regions reach past the region records.
    #[error("regions {first}..{end} lie past the {regions} region records")]
    RegionsPastEnd {
        /// `first_region`.
        first: u64,
        /// `first_region + region_count`.
        end: u64,
        /// Number of region records.
        regions: u64,
    },
    /// A region listed by an earlier record too.
    #[error("region {region} already belongs to another expert")]
    RegionShared {
        /// The region.
        region: u64,
    },
    /// A listed region that is not a projection of this expert.
    #[error("region {region} is layer {} expert {} role {role}, not a projection of this expert", Opt(*layer), Opt(*expert))]
    NotItsProjection {
        /// The region.
        region: u64,
        /// Its layer.
        layer: u32,
        /// Its expert.
        expert: u32,
        /// Its role code.
        role: u32,
    },
    /// Roles that do not strictly increase.
    #[error("region {region}: roles must strictly increase within an expert (role {role} after {previous})")]
    RolesNotIncreasing {
        /// The region.
        region: u64,
        /// Its role code.
        role: u32,
        /// The previous region's role code.
        previous: u32,
    },
    /// A fused `gate_up` beside a separate gate or up.
    #[error("a fused gate_up projection beside a separate gate or up")]
    FusedBesideSplit,
    /// A fused `gate_up` bias beside a separate gate or up bias.
    #[error("a fused gate_up bias beside a separate gate or up bias")]
    FusedBiasBesideSplit,
    /// Only biases, no weight projection.
    #[error("an expert needs at least one weight projection, not only biases")]
    NoWeight,
    /// The extent fields do not span the expert's regions.
    #[error("extent {offset}+{len} does not match its regions, {expected_offset}+{expected_len}")]
    ExtentMismatch {
        /// `extent_offset`.
        offset: u64,
        /// `extent_len`.
        len: u64,
        /// The first region's offset.
        expected_offset: u64,
        /// The padded span of its regions.
        expected_len: u64,
    },
    /// The record's regions do not lie after the previous record's.
    #[error("extents must lie in the file in grid order")]
    ExtentsOutOfOrder,
}

/// How the writer was used against its contract: one variant per rule it enforces.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsageFault {
    /// An expert begun out of grid order.
    #[error("expert (layer {layer}, expert {expert}) out of order: next is (layer {next_layer}, expert {next_expert})")]
    ExpertOutOfOrder {
        /// Layer asked.
        layer: u32,
        /// Expert asked.
        expert: u32,
        /// The layer of the next expert of the grid.
        next_layer: u32,
        /// The next expert of the grid.
        next_expert: u32,
    },
    /// An expert begun when the grid is complete, or outside it.
    #[error(
        "expert (layer {layer}, expert {expert}) is outside this file's grid or already written"
    )]
    ExpertOutsideGrid {
        /// Layer asked.
        layer: u32,
        /// Expert asked.
        expert: u32,
    },
    /// `finish` before every expert of the grid was written.
    #[error("finish with {written} of {total} experts written")]
    IncompleteGrid {
        /// Experts written.
        written: u64,
        /// Experts of the grid.
        total: u64,
    },
    /// The file's length would overflow 64 bits.
    #[error("file length overflows")]
    FileLenOverflow,
    /// The footer the writer built fails the reader's rules (a writer bug).
    #[error("internal: footer fails validation: {violation}")]
    FooterInvalid {
        /// The rule broken.
        violation: Violation,
    },
    /// The index the writer built fails the reader's rules.
    #[error("index fails validation: {violation}")]
    IndexInvalid {
        /// The rule broken.
        violation: Violation,
    },
    /// A projection or `end_expert` with no expert open.
    #[error("no open expert")]
    NoOpenExpert,
    /// A projection given the plain-tensor role.
    #[error("an expert projection needs a projection role")]
    TensorRoleInExpert,
    /// A projection whose spec names another layer than its expert's.
    #[error("projection '{name}' names layer {spec_layer} inside an expert of layer {layer}")]
    ProjectionLayer {
        /// The region name.
        name: String,
        /// The layer its spec names.
        spec_layer: u32,
        /// The expert's layer.
        layer: u32,
    },
    /// A projection role not above the previous one.
    #[error("role {} after role code {last_role}: roles must strictly increase within an expert", role.name())]
    RoleOrder {
        /// The role given.
        role: crate::Role,
        /// The previous projection's role code.
        last_role: u32,
    },
    /// More than `MAX_EXPERT_REGIONS` projections in one expert.
    #[error(
        "more than {} regions in one expert",
        crate::validate::MAX_EXPERT_REGIONS
    )]
    TooManyExpertRegions,
    /// A fused `gate_up` beside a separate gate or up.
    #[error("a fused gate_up projection beside a separate gate or up")]
    FusedBesideSplit,
    /// `end_expert` with no projection written.
    #[error("layer {layer} expert {expert} has no projections")]
    NoProjections {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
    },
    /// A string over `MAX_STRING_LEN` bytes.
    #[error(
        "string of {len} bytes is over the {}-byte limit",
        crate::validate::MAX_STRING_LEN
    )]
    StringTooLong {
        /// Its length.
        len: usize,
    },
    /// The string table would pass 4 GiB.
    #[error("string table over 4 GiB")]
    StringTableFull,
    /// A shape of rank over `MAX_RANK`.
    #[error("'{name}': rank {rank} over {}", crate::layout::MAX_RANK)]
    RankOverLimit {
        /// The region name.
        name: String,
        /// The rank given.
        rank: usize,
    },
    /// More than `MAX_REGIONS` regions.
    #[error("more than {} regions in one file", crate::validate::MAX_REGIONS)]
    TooManyRegions,
    /// A region name already written.
    #[error("duplicate region name '{name}'")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A shape with no byte length (not whole blocks, or overflowing).
    #[error("'{name}': {dtype} {shape:?} is not a whole number of blocks, or its size overflows")]
    NoByteLength {
        /// The region name.
        name: String,
        /// The dtype.
        dtype: crate::Dtype,
        /// The shape.
        shape: Vec<u64>,
    },
    /// A source shape of rank over `MAX_RANK`.
    #[error("'{name}': source rank {rank} over {}", crate::layout::MAX_RANK)]
    SourceRankOverLimit {
        /// The region name.
        name: String,
        /// The source rank given.
        rank: usize,
    },
    /// An empty region name.
    #[error("empty region name")]
    EmptyName,
    /// A region name holding NUL.
    #[error("region name {name:?} contains NUL")]
    NameWithNul {
        /// The name.
        name: String,
    },
    /// The region's source ended before its length.
    #[error("'{name}': source ended after {got} of {length} bytes")]
    SourceShort {
        /// The region name.
        name: String,
        /// Bytes read.
        got: u64,
        /// The region's length.
        length: u64,
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
    #[error("{}: writer: {fault}", path.display())]
    Usage {
        /// The contract broken.
        fault: UsageFault,
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
    /// An output path that must not be written or replaced ([`crate::publish::output_kind`]).
    #[error("{}: {fault}", path.display())]
    Output {
        /// The output path given.
        path: PathBuf,
        /// Why it is refused.
        fault: OutputFault,
    },
}

/// Why an output path is refused: publishing never replaces anything but a regular file, and
/// never writes over an input.
#[derive(Debug, thiserror::Error)]
pub enum OutputFault {
    /// A symbolic link (replacing it would cut the link; writing through it, surprise its owner).
    #[error("a symbolic link to {}; give that path itself", target.display())]
    Symlink {
        /// What it points to.
        target: PathBuf,
    },
    /// Something other than a regular file, character device or FIFO.
    #[error("{kind}, not a file that can be written")]
    NotWritable {
        /// What it is.
        kind: &'static str,
    },
    /// A character device or FIFO where only a file can be published (a model's files).
    #[error("{kind}: this output is published as a file (temporary name, rename), which would replace it")]
    NotRegular {
        /// What it is.
        kind: &'static str,
    },
    /// One of the command's own inputs (the same device and inode).
    #[error("an input of this command (the file {}); write the output elsewhere", input.display())]
    IsInput {
        /// The input it is.
        input: PathBuf,
    },
}

impl Error {
    /// The rule broken, if this is a format error.
    pub fn violation(&self) -> Option<&Violation> {
        match self {
            Error::Format { violation, .. } => Some(violation),
            _ => None,
        }
    }

    pub(crate) fn usage(fault: UsageFault, path: &std::path::Path) -> Error {
        Error::Usage {
            fault,
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
