//! Byte layout of the header page and the index records (`spec/JNF_V1.md` §2 and §5).
//! Encoding and decoding only; the rules live in [`crate::validate`].

use crate::dtype::Dtype;

/// Every region, the index and the file length are multiples of this.
pub const ALIGN: u64 = 4096;
/// `\x89JNF\r\n\x1a\n`: a high byte, the name, and the CR-LF / EOF / LF trap of PNG, so text-mode
/// transfers and truncation to 7 bits are caught by the first read.
pub const MAGIC: [u8; 8] = [0x89, b'J', b'N', b'F', 0x0D, 0x0A, 0x1A, 0x0A];
/// The major version this crate reads and writes.
pub const MAJOR: u16 = 1;
/// The minor version this crate writes.
pub const MINOR: u16 = 0;
/// Bytes of the header covered by `header_blake3`.
pub const HEADER_HASHED_LEN: usize = 48;
/// Bytes of header fields, hash included; the rest of the page is reserved and zero.
pub const HEADER_LEN: usize = 80;
/// `\x89JNFEND\n`: the footer's magic.
pub const FOOTER_MAGIC: [u8; 8] = [0x89, b'J', b'N', b'F', b'E', b'N', b'D', 0x0A];
/// The footer occupies the last this-many bytes of the file.
pub const FOOTER_LEN: usize = 160;
/// Bytes of the footer covered (with the whole header page) by `footer_blake3`.
pub const FOOTER_HASHED_LEN: usize = 128;
/// Size of one region record in the index.
pub const REGION_RECORD_LEN: usize = 288;
/// Size of one expert record in the index.
pub const EXPERT_RECORD_LEN: usize = 96;
/// Largest rank a region may have.
pub const MAX_RANK: usize = 8;
/// `layer` / `expert` value meaning "none".
pub const NONE: u32 = u32::MAX;

/// Must-understand flags defined by this version (none in 1.0).
pub const KNOWN_REQUIRED_FLAGS: u64 = 0;

/// Round `v` up to the next multiple of [`ALIGN`]; `None` on overflow.
pub fn align_up(v: u64) -> Option<u64> {
    v.checked_add(ALIGN - 1).map(|x| x & !(ALIGN - 1))
}

/// What a region is within its expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Not part of an expert: a trunk or layer tensor (attention, norms, router, shared expert).
    Tensor,
    /// Fused gate and up projection.
    GateUp,
    /// Gate projection (Mixtral `w1`).
    Gate,
    /// Up projection (Mixtral `w3`).
    Up,
    /// Down projection (Mixtral `w2`).
    Down,
    /// Bias of the fused gate/up projection.
    GateUpBias,
    /// Bias of the gate projection.
    GateBias,
    /// Bias of the up projection.
    UpBias,
    /// Bias of the down projection.
    DownBias,
}

impl Role {
    const ALL: [(Role, u32, &'static str); 9] = [
        (Role::Tensor, 0, "tensor"),
        (Role::GateUp, 1, "gate_up"),
        (Role::Gate, 2, "gate"),
        (Role::Up, 3, "up"),
        (Role::Down, 4, "down"),
        (Role::GateUpBias, 5, "gate_up_bias"),
        (Role::GateBias, 6, "gate_bias"),
        (Role::UpBias, 7, "up_bias"),
        (Role::DownBias, 8, "down_bias"),
    ];

    /// The role with this on-disk code.
    pub fn from_code(code: u32) -> Option<Role> {
        Role::ALL.iter().find(|e| e.1 == code).map(|e| e.0)
    }

    /// The role with this name.
    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.iter().find(|e| e.2 == name).map(|e| e.0)
    }

    /// On-disk code; within an expert, codes strictly increase in file order.
    pub fn code(self) -> u32 {
        Role::ALL.iter().find(|e| e.0 == self).map_or(0, |e| e.1)
    }

    /// Name used in reports and JSON.
    pub fn name(self) -> &'static str {
        Role::ALL
            .iter()
            .find(|e| e.0 == self)
            .map_or("tensor", |e| e.2)
    }
}

/// The decoded header page (§2): what a writer knows before the first byte of data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Major version.
    pub major: u16,
    /// Minor version.
    pub minor: u16,
    /// Must-understand flags.
    pub required_flags: u64,
    /// Flags a reader may ignore.
    pub optional_flags: u64,
    /// First layer this file holds experts for.
    pub layer_first: u32,
    /// Number of layers this file holds.
    pub layer_count: u32,
    /// Experts in each of those layers.
    pub experts_per_layer: u32,
    /// BLAKE3 of header bytes `0..48`.
    pub header_blake3: [u8; 32],
}

/// The decoded footer (§2.2): where the index is and what it hashes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footer {
    /// Total file length.
    pub file_len: u64,
    /// Offset of the index.
    pub index_offset: u64,
    /// Exact length of the index.
    pub index_len: u64,
    /// Number of region records.
    pub region_count: u32,
    /// Number of expert records.
    pub expert_count: u32,
    /// BLAKE3 of the index bytes.
    pub index_blake3: [u8; 32],
    /// SHA-256 of the index bytes.
    pub index_sha256: [u8; 32],
    /// BLAKE3 of the whole header page (`0..4096`) followed by footer bytes `0..128`.
    pub footer_blake3: [u8; 32],
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[o..o + 4]);
    u32::from_le_bytes(a)
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(a)
}
fn arr32_at(b: &[u8], o: usize) -> [u8; 32] {
    let mut a = [0u8; 32];
    a.copy_from_slice(&b[o..o + 32]);
    a
}

impl Header {
    /// Decode the fixed fields from the first [`HEADER_LEN`] bytes (magic not checked here).
    pub(crate) fn decode(b: &[u8]) -> Header {
        Header {
            major: u16_at(b, 8),
            minor: u16_at(b, 10),
            required_flags: u64_at(b, 16),
            optional_flags: u64_at(b, 24),
            layer_first: u32_at(b, 32),
            layer_count: u32_at(b, 36),
            experts_per_layer: u32_at(b, 40),
            header_blake3: arr32_at(b, 48),
        }
    }

    /// Encode into a full 4096-byte header page, computing `header_blake3`.
    pub fn encode_page(&self) -> Vec<u8> {
        let mut p = vec![0u8; ALIGN as usize];
        p[0..8].copy_from_slice(&MAGIC);
        p[8..10].copy_from_slice(&self.major.to_le_bytes());
        p[10..12].copy_from_slice(&self.minor.to_le_bytes());
        p[16..24].copy_from_slice(&self.required_flags.to_le_bytes());
        p[24..32].copy_from_slice(&self.optional_flags.to_le_bytes());
        p[32..36].copy_from_slice(&self.layer_first.to_le_bytes());
        p[36..40].copy_from_slice(&self.layer_count.to_le_bytes());
        p[40..44].copy_from_slice(&self.experts_per_layer.to_le_bytes());
        let h = blake3::hash(&p[..HEADER_HASHED_LEN]);
        p[48..80].copy_from_slice(h.as_bytes());
        p
    }
}

impl Footer {
    /// Decode from the last [`FOOTER_LEN`] bytes of a file (magic not checked here).
    pub fn decode(b: &[u8]) -> Footer {
        Footer {
            file_len: u64_at(b, 8),
            index_offset: u64_at(b, 16),
            index_len: u64_at(b, 24),
            region_count: u32_at(b, 32),
            expert_count: u32_at(b, 36),
            index_blake3: arr32_at(b, 40),
            index_sha256: arr32_at(b, 72),
            footer_blake3: arr32_at(b, 128),
        }
    }

    /// `footer_blake3` for these footer bytes and this header page.
    pub fn hash_with(header_page: &[u8], footer: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(&header_page[..ALIGN as usize]);
        h.update(&footer[..FOOTER_HASHED_LEN]);
        *h.finalize().as_bytes()
    }

    /// Encode, computing `footer_blake3` over `header_page`'s fields and the footer.
    pub fn encode(&self, header_page: &[u8]) -> [u8; FOOTER_LEN] {
        let mut f = [0u8; FOOTER_LEN];
        f[0..8].copy_from_slice(&FOOTER_MAGIC);
        f[8..16].copy_from_slice(&self.file_len.to_le_bytes());
        f[16..24].copy_from_slice(&self.index_offset.to_le_bytes());
        f[24..32].copy_from_slice(&self.index_len.to_le_bytes());
        f[32..36].copy_from_slice(&self.region_count.to_le_bytes());
        f[36..40].copy_from_slice(&self.expert_count.to_le_bytes());
        f[40..72].copy_from_slice(&self.index_blake3);
        f[72..104].copy_from_slice(&self.index_sha256);
        let h = Footer::hash_with(header_page, &f);
        f[128..160].copy_from_slice(&h);
        f
    }
}

/// A string reference into the index's string table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StrRef {
    /// Offset in the string table.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
}

impl StrRef {
    /// The string this reference names in `table` (empty if it is out of bounds or not UTF-8,
    /// which a checked index never has).
    pub fn get(self, table: &[u8]) -> &str {
        let s = self.offset as usize;
        table
            .get(s..s + self.len as usize)
            .and_then(|b| std::str::from_utf8(b).ok())
            .unwrap_or("")
    }
}

/// One region record, as stored (§5.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionRecord {
    /// Absolute file offset.
    pub offset: u64,
    /// Exact byte length, padding excluded.
    pub length: u64,
    /// Dtype code.
    pub dtype: u32,
    /// Rank.
    pub ndim: u32,
    /// Row-major shape; entries past `ndim` are zero.
    pub shape: [u64; MAX_RANK],
    /// Layer, or [`NONE`].
    pub layer: u32,
    /// Expert, or [`NONE`].
    pub expert: u32,
    /// Role code.
    pub role: u32,
    /// Region name.
    pub name: StrRef,
    /// Source file, relative name; empty when the region has no source.
    pub src_file: StrRef,
    /// Source tensor name.
    pub src_tensor: StrRef,
    /// Source dtype code (equals `dtype` in v1: bytes are never converted).
    pub src_dtype: u32,
    /// Rank of the source tensor.
    pub src_ndim: u32,
    /// Byte range in the source file, start.
    pub src_begin: u64,
    /// Byte range in the source file, end (exclusive).
    pub src_end: u64,
    /// Row-major shape of the whole source tensor.
    pub src_shape: [u64; MAX_RANK],
    /// SHA-256 of the region bytes.
    pub sha256: [u8; 32],
    /// BLAKE3 of the region bytes.
    pub blake3: [u8; 32],
}

impl RegionRecord {
    /// Decode from exactly [`REGION_RECORD_LEN`] bytes. Reserved bytes are returned for checking.
    pub(crate) fn decode(b: &[u8]) -> (RegionRecord, u32, [u8; 8]) {
        let shape_at = |o: usize| {
            let mut s = [0u64; MAX_RANK];
            for (i, v) in s.iter_mut().enumerate() {
                *v = u64_at(b, o + 8 * i);
            }
            s
        };
        let r = RegionRecord {
            offset: u64_at(b, 0),
            length: u64_at(b, 8),
            dtype: u32_at(b, 16),
            ndim: u32_at(b, 20),
            shape: shape_at(24),
            layer: u32_at(b, 88),
            expert: u32_at(b, 92),
            role: u32_at(b, 96),
            name: StrRef {
                offset: u32_at(b, 100),
                len: u32_at(b, 104),
            },
            src_file: StrRef {
                offset: u32_at(b, 108),
                len: u32_at(b, 112),
            },
            src_tensor: StrRef {
                offset: u32_at(b, 116),
                len: u32_at(b, 120),
            },
            src_dtype: u32_at(b, 124),
            src_ndim: u32_at(b, 128),
            src_begin: u64_at(b, 136),
            src_end: u64_at(b, 144),
            src_shape: shape_at(152),
            sha256: arr32_at(b, 216),
            blake3: arr32_at(b, 248),
        };
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&b[280..288]);
        (r, u32_at(b, 132), tail)
    }

    /// Append the encoded record to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.length.to_le_bytes());
        out.extend_from_slice(&self.dtype.to_le_bytes());
        out.extend_from_slice(&self.ndim.to_le_bytes());
        self.shape
            .iter()
            .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        for v in [
            self.layer,
            self.expert,
            self.role,
            self.name.offset,
            self.name.len,
            self.src_file.offset,
            self.src_file.len,
            self.src_tensor.offset,
            self.src_tensor.len,
            self.src_dtype,
            self.src_ndim,
            0,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.src_begin.to_le_bytes());
        out.extend_from_slice(&self.src_end.to_le_bytes());
        self.src_shape
            .iter()
            .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
        out.extend_from_slice(&self.sha256);
        out.extend_from_slice(&self.blake3);
        out.extend_from_slice(&[0u8; 8]);
        debug_assert_eq!(out.len() - start, REGION_RECORD_LEN);
    }

    /// The dtype, if its code is known.
    pub fn dtype(&self) -> Option<Dtype> {
        Dtype::from_code(self.dtype)
    }

    /// The shape as a slice (valid once `ndim <= 8` has been checked).
    pub fn shape(&self) -> &[u64] {
        &self.shape[..(self.ndim as usize).min(MAX_RANK)]
    }

    /// The source tensor's shape.
    pub fn src_shape(&self) -> &[u64] {
        &self.src_shape[..(self.src_ndim as usize).min(MAX_RANK)]
    }

    /// End of the region's bytes (exclusive), padding excluded.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.length)
    }
}

/// One expert record, as stored (§5.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertRecord {
    /// Layer.
    pub layer: u32,
    /// Expert number within the layer.
    pub expert: u32,
    /// Index of its first region.
    pub first_region: u32,
    /// Number of its regions (consecutive).
    pub region_count: u32,
    /// File offset of the extent (= first region's offset).
    pub extent_offset: u64,
    /// Extent length: to the padded end of the last region.
    pub extent_len: u64,
    /// Expert digest, SHA-256 flavour.
    pub sha256: [u8; 32],
    /// Expert digest, BLAKE3 flavour.
    pub blake3: [u8; 32],
}

impl ExpertRecord {
    /// Decode from exactly [`EXPERT_RECORD_LEN`] bytes.
    pub(crate) fn decode(b: &[u8]) -> ExpertRecord {
        ExpertRecord {
            layer: u32_at(b, 0),
            expert: u32_at(b, 4),
            first_region: u32_at(b, 8),
            region_count: u32_at(b, 12),
            extent_offset: u64_at(b, 16),
            extent_len: u64_at(b, 24),
            sha256: arr32_at(b, 32),
            blake3: arr32_at(b, 64),
        }
    }

    /// Append the encoded record to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.layer,
            self.expert,
            self.first_region,
            self.region_count,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.extent_offset.to_le_bytes());
        out.extend_from_slice(&self.extent_len.to_le_bytes());
        out.extend_from_slice(&self.sha256);
        out.extend_from_slice(&self.blake3);
    }
}
