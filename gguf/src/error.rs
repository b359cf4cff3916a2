//! Typed errors. Every rule the reader enforces is one [`Violation`] variant that names what broke
//! and where (byte offset, key, tensor); [`Error`] adds the file and separates broken input from
//! failed I/O.

use std::io;

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why tarfa-gguf stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes break a GGUF rule: the input is invalid, not the machine.
    #[error("{file}: {violation}")]
    Invalid {
        /// Path or URL of the GGUF file.
        file: String,
        /// The rule broken.
        violation: Violation,
    },
    /// Reading the source failed.
    #[error("{file}: reading {len} bytes at offset {offset}: {source}")]
    Io {
        /// Path or URL.
        file: String,
        /// Where the read started.
        offset: u64,
        /// How many bytes were asked for.
        len: u64,
        /// The I/O error.
        source: io::Error,
    },
    /// A file to read is not a regular file, or could not be opened.
    #[error(transparent)]
    File(#[from] tarfa_format::fsio::FsError),
    /// Writing or publishing the output failed.
    #[error(transparent)]
    Publish(#[from] tarfa_format::Error),
    /// Writing tensor data failed.
    #[error("{file}: writing: {source}")]
    Write {
        /// Destination.
        file: String,
        /// The I/O error.
        source: io::Error,
    },
}

impl Error {
    /// The rule broken, when the input (not I/O) is at fault.
    pub fn violation(&self) -> Option<&Violation> {
        match self {
            Error::Invalid { violation, .. } => Some(violation),
            _ => None,
        }
    }

    pub(crate) fn invalid(file: impl Into<String>, violation: Violation) -> Error {
        Error::Invalid {
            file: file.into(),
            violation,
        }
    }
}

/// A broken GGUF rule. Offsets are absolute byte offsets in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The file is a Git LFS pointer, not the weights it points to.
    #[error("this is a Git LFS pointer file, not a GGUF: fetch the real file (git lfs pull) or download it from the hub")]
    LfsPointer,
    /// The file is an HTML page (an error or login page saved in place of the model).
    #[error("this is an HTML page, not a GGUF: the download saved a web page (wrong URL, login or error page)")]
    HtmlPage,
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found}: not a GGUF file")]
    BadMagic {
        /// The first bytes, in hex.
        found: String,
    },
    /// A version this reader does not read (it reads 2 and 3; 2 has the same layout).
    #[error("GGUF version {version} is not supported (this reader reads versions 2 and 3)")]
    UnsupportedVersion {
        /// Version found.
        version: u32,
    },
    /// The version's low 16 bits are zero: a big-endian file read little-endian.
    #[error("GGUF version field {version:#010x} looks byte-swapped: a big-endian GGUF, which is not supported")]
    BigEndian {
        /// Version field as read little-endian.
        version: u32,
    },
    /// The file ends inside a field.
    #[error("truncated: {what} at offset {offset} needs {need} bytes, the file has {file_len}")]
    Truncated {
        /// What was being read.
        what: String,
        /// Where it starts.
        offset: u64,
        /// Bytes needed from `offset`.
        need: u64,
        /// File length.
        file_len: u64,
    },
    /// A count (tensors, key/values, array elements) larger than the bytes left could hold.
    #[error("{what} at offset {offset} is {count}, but {bytes_left} bytes are left and each needs at least {min_each}")]
    CountTooLarge {
        /// What is counted.
        what: String,
        /// Offset of the count.
        offset: u64,
        /// The count.
        count: u64,
        /// Smallest encoding of one item.
        min_each: u64,
        /// Bytes left in the file after the count.
        bytes_left: u64,
    },
    /// A string length larger than the bytes left.
    #[error("{what}: string length {len} at offset {offset} exceeds the {bytes_left} bytes left")]
    StringTooLong {
        /// Whose string.
        what: String,
        /// Offset of the length field.
        offset: u64,
        /// Declared length.
        len: u64,
        /// Bytes left after the length field.
        bytes_left: u64,
    },
    /// The header, or one string in it, is longer than this reader's limit
    /// ([`crate::MAX_HEADER_LEN`], [`crate::MAX_STRING_LEN`]): a bound on memory, since the
    /// file length a source claims (a sparse file, a server's Content-Range) proves nothing.
    #[error("{what} is {len} bytes, more than this reader's limit of {limit}")]
    LimitExceeded {
        /// What is too long, and where.
        what: String,
        /// Its length in bytes (for the header: the end of the field that crossed the limit).
        len: u64,
        /// The limit.
        limit: u64,
    },
    /// A string that is not UTF-8.
    #[error("{what}: string at offset {offset} is not valid UTF-8")]
    BadUtf8 {
        /// Whose string.
        what: String,
        /// Offset of its first byte.
        offset: u64,
    },
    /// A metadata value type id outside 0..=12.
    #[error("key '{key}': unknown value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// Offset of the type id.
        offset: u64,
        /// The id.
        type_id: u32,
    },
    /// A bool byte other than 0 or 1.
    #[error("key '{key}': bool at offset {offset} is {value}, must be 0 or 1")]
    InvalidBool {
        /// The key.
        key: String,
        /// Offset.
        offset: u64,
        /// The byte.
        value: u8,
    },
    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    #[error("key '{key}': arrays nested deeper than {max} at offset {offset}")]
    ArrayTooDeep {
        /// The key.
        key: String,
        /// Offset of the innermost array header.
        offset: u64,
        /// The limit.
        max: u32,
    },
    /// The same key twice.
    #[error("duplicate key '{key}' at offset {offset}")]
    DuplicateKey {
        /// The key.
        key: String,
        /// Offset of the second occurrence.
        offset: u64,
    },
    /// `general.alignment` stored with a type other than u32.
    #[error("general.alignment has type {found}, must be u32")]
    AlignmentType {
        /// The type found.
        found: String,
    },
    /// `general.alignment` zero or not a power of two.
    #[error("general.alignment {alignment} is not a power of two")]
    BadAlignment {
        /// The value.
        alignment: u64,
    },
    /// A tensor name of 64 bytes or more (ggml's `GGML_MAX_NAME` is 64 including the NUL).
    #[error("tensor name at offset {offset} is {len} bytes, at most 63 allowed: '{tensor}'")]
    TensorNameTooLong {
        /// The name (lossy).
        tensor: String,
        /// Offset of the name's length field.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// The same tensor name twice (within a file, or across the parts of a split set).
    #[error("duplicate tensor '{tensor}' at offset {offset}")]
    DuplicateTensor {
        /// The name.
        tensor: String,
        /// Offset of the second tensor info.
        offset: u64,
    },
    /// More than four dimensions.
    #[error("tensor '{tensor}': {n_dims} dimensions at offset {offset}, at most 4 allowed")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// Offset of n_dims.
        offset: u64,
        /// The count.
        n_dims: u32,
    },
    /// A dimension above `i64::MAX` (ggml reads them as int64).
    #[error("tensor '{tensor}': ne[{dim}] = {value} does not fit in int64")]
    DimTooLarge {
        /// The tensor.
        tensor: String,
        /// Which dimension (ggml order, ne[0] innermost).
        dim: usize,
        /// Its value.
        value: u64,
    },
    /// The element count overflows int64.
    #[error("tensor '{tensor}': element count of ne {ne:?} overflows int64")]
    ElementCountOverflow {
        /// The tensor.
        tensor: String,
        /// Its dimensions, ggml order.
        ne: Vec<u64>,
    },
    /// A ggml type id not in the table (retired, or newer than this reader).
    #[error("tensor '{tensor}': unknown ggml type {type_id} at offset {offset}")]
    UnknownGgmlType {
        /// The tensor.
        tensor: String,
        /// Offset of the type id.
        offset: u64,
        /// The id.
        type_id: u32,
    },
    /// ne[0] is not a whole number of quant blocks.
    #[error(
        "tensor '{tensor}': ne[0] = {ne0} is not a multiple of the {dtype} block size {block}"
    )]
    RowNotWholeBlocks {
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: String,
        /// ne[0].
        ne0: u64,
        /// Elements per block.
        block: u64,
    },
    /// A size or offset sum overflows u64.
    #[error("{what} overflows u64")]
    SizeOverflow {
        /// What was being computed.
        what: String,
    },
    /// A tensor's offset differs from the running padded sum ggml requires (a gap, overlap,
    /// reordering, misalignment or a size lie).
    #[error("tensor '{tensor}' has offset {offset}, expected {expected} (the padded sum of the tensors before it)")]
    TensorOffset {
        /// The tensor.
        tensor: String,
        /// Offset declared (relative to the data section).
        offset: u64,
        /// Offset required.
        expected: u64,
    },
    /// A tensor's bytes run past the end of the file.
    #[error("tensor '{tensor}' ends at byte {end}, past the end of the {file_len}-byte file")]
    TensorPastEnd {
        /// The tensor.
        tensor: String,
        /// Absolute end offset.
        end: u64,
        /// File length.
        file_len: u64,
    },
    /// A `split.*` key with the wrong type.
    #[error("key '{key}' has type {found}, must be {expected}")]
    SplitKeyType {
        /// The key.
        key: String,
        /// Type required.
        expected: String,
        /// Type found.
        found: String,
    },
    /// A split set whose file names or `split.*` keys disagree.
    #[error("split set: {0}")]
    SplitMismatch(SplitFault),
    /// A per-expert slice asked of a tensor that is not `[n_expert, rows, cols]`, or past its
    /// last expert.
    #[error("tensor '{tensor}': {fault}")]
    ExpertSlice {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        fault: ExpertSliceFault,
    },
    /// A writer was given tensor data of the wrong length.
    #[error("tensor '{tensor}': its data has {got} bytes, its shape and type need {expected}")]
    TensorDataLength {
        /// The tensor.
        tensor: String,
        /// Bytes needed.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
}

/// How the parts of a split set (`NAME-0000k-of-0000N.gguf`, keys `split.no`, `split.count`,
/// `split.tensors.count`) disagree with their names or with each other. Parts are numbered from
/// 1, as in their file names; `split.no` counts from 0.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitFault {
    /// `split.count` is zero, or `split.no` is not below it.
    #[error("split.no {no} is not below split.count {count}")]
    PartOutOfRange {
        /// `split.no`.
        no: u16,
        /// `split.count`.
        count: u16,
    },
    /// The file is named as a part of a set but has no `split.*` keys.
    #[error("the file name says part of {count}, but the file has no split.* keys")]
    NameWithoutKeys {
        /// Parts the name claims.
        count: u32,
    },
    /// The `split.*` keys say several parts, but the file name does not number the part.
    #[error("split.count is {count} but the file name is not NAME-0000k-of-0000N.gguf")]
    KeysWithoutName {
        /// `split.count`.
        count: u16,
    },
    /// The file name and the `split.*` keys number the part differently.
    #[error("the file name says part {name_part} of {name_count}, its split.* keys say part {key_part} of {key_count}")]
    NameDisagrees {
        /// Part number in the name (from 1).
        name_part: u32,
        /// Part count in the name.
        name_count: u32,
        /// `split.no` + 1.
        key_part: u32,
        /// `split.count`.
        key_count: u16,
    },
    /// A part of the set is not there.
    #[error("part {part} of {count} is missing")]
    MissingPart {
        /// The missing part (from 1).
        part: u32,
        /// Parts in the set.
        count: u32,
    },
    /// A part other than the one given has no `split.*` keys.
    #[error("part {part} of {count} has no split.* keys")]
    PartWithoutKeys {
        /// The part (from 1).
        part: u32,
        /// Parts in the set.
        count: u32,
    },
    /// A part's `split.no` is not its place in the set.
    #[error("part {part} of {count} has split.no {no}, expected {expected}")]
    PartIndex {
        /// The part (from 1), by its file name.
        part: u32,
        /// Parts in the set.
        count: u32,
        /// Its `split.no`.
        no: u16,
        /// The `split.no` its place requires (`part` - 1).
        expected: u32,
    },
    /// A part's `split.count` is not the number of parts in the set.
    #[error("part {part} of {count} has split.count {found}")]
    PartCount {
        /// The part (from 1).
        part: u32,
        /// Parts in the set.
        count: u32,
        /// Its `split.count`.
        found: u16,
    },
    /// Two parts declare different `split.tensors.count`s.
    #[error("part {part} of {count} has split.tensors.count {found}, the set's is {expected}")]
    TensorsCountDiffers {
        /// The part (from 1).
        part: u32,
        /// Parts in the set.
        count: u32,
        /// Its `split.tensors.count`.
        found: i32,
        /// The set's (the first part's, or the part given).
        expected: i32,
    },
    /// `split.tensors.count` is not the number of tensors the parts hold.
    #[error("split.tensors.count is {declared} but the parts hold {held} tensors")]
    TensorCountSum {
        /// `split.tensors.count`.
        declared: i32,
        /// Tensors across all parts.
        held: u64,
    },
}

/// Why expert `e` of a stacked `[n_expert, rows, cols]` tensor has no byte range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpertSliceFault {
    /// The tensor is not three-dimensional.
    #[error(
        "expected 3 dimensions [n_expert, rows, cols], found {}",
        shape_text(shape)
    )]
    NotStacked {
        /// Its row-major shape.
        shape: Vec<u64>,
    },
    /// The expert is past the last one.
    #[error("expert {expert} asked of a stack of {n_expert} experts (numbered from 0)")]
    NoSuchExpert {
        /// The expert asked for.
        expert: u64,
        /// Experts in the tensor.
        n_expert: u64,
    },
    /// One expert's byte size (`rows` × `cols` in the tensor's type) overflows u64.
    #[error("the byte size of one expert ({rows} rows of {cols}) overflows u64")]
    SizeOverflow {
        /// Rows of one expert.
        rows: u64,
        /// Columns of one expert.
        cols: u64,
    },
    /// The expert's byte offset in the file overflows u64.
    #[error("the file offset of expert {expert} overflows u64")]
    OffsetOverflow {
        /// The expert.
        expert: u64,
    },
}

/// A shape as `[a, b, c]` (`[]` for a scalar), for messages.
fn shape_text(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}
