//! The dtype table: every element type a JNF region may hold, with its block geometry.
//!
//! Codes `0..=0xFFFF` are ggml type ids, unchanged, so a GGUF tensor keeps its quant type by
//! number; codes from `0x1_0000` are the safetensors dtypes that ggml has no id for. A code not in
//! this table is refused (`spec/JNF_V1.md` §4), never guessed: ggml's enum is still growing and a
//! wrong block size would silently mis-slice every expert.

use std::fmt;

/// A JNF element type, identified on disk by its `u32` code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dtype(u32);

/// Block geometry: `block_elems` elements are stored in `block_bytes` bytes, and a row (the
/// innermost dimension) must hold a whole number of blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockGeometry {
    /// Elements per block.
    pub block_elems: u64,
    /// Bytes per block.
    pub block_bytes: u64,
}

/// `(code, name, block_elems, block_bytes)`; the one table that reader, writer and spec share.
const TABLE: &[(u32, &str, u64, u64)] = &[
    // ggml types (ids from ggml.h; sizes from ggml-common.h / gguf-py GGML_QUANT_SIZES).
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    // ggml block_q8_1 is 36 bytes (half2 d,s + 32 int8; static_assert in ggml-common.h);
    // gguf-py's GGML_QUANT_SIZES still says 40. ggml is the authority for what files hold.
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
    // safetensors dtypes without a ggml id.
    (0x1_0000, "BOOL", 1, 1),
    (0x1_0001, "U8", 1, 1),
    (0x1_0002, "U16", 1, 2),
    (0x1_0003, "U32", 1, 4),
    (0x1_0004, "U64", 1, 8),
    (0x1_0005, "F8_E4M3", 1, 1),
    (0x1_0006, "F8_E5M2", 1, 1),
    (0x1_0007, "F8_E8M0", 1, 1),
    (0x1_0008, "F8_E4M3FNUZ", 1, 1),
    (0x1_0009, "F8_E5M2FNUZ", 1, 1),
    (0x1_000A, "F4", 2, 1),
    (0x1_000B, "F6_E2M3", 4, 3),
    (0x1_000C, "F6_E3M2", 4, 3),
    (0x1_000D, "C64", 1, 8),
];

impl Dtype {
    /// IEEE binary32.
    pub const F32: Dtype = Dtype(0);
    /// IEEE binary16.
    pub const F16: Dtype = Dtype(1);
    /// bfloat16, the main case of HF checkpoints.
    pub const BF16: Dtype = Dtype(30);
    /// ggml Q8_0: blocks of 32 int8 with one f16 scale.
    pub const Q8_0: Dtype = Dtype(8);
    /// Unsigned bytes.
    pub const U8: Dtype = Dtype(0x1_0001);

    /// The dtype with this on-disk code, or `None` when the code is not in the table.
    pub fn from_code(code: u32) -> Option<Dtype> {
        TABLE.iter().any(|e| e.0 == code).then_some(Dtype(code))
    }

    /// The dtype with this name (`"BF16"`, `"Q4_K"`, safetensors' `"F8_E4M3"`, ...).
    pub fn from_name(name: &str) -> Option<Dtype> {
        TABLE.iter().find(|e| e.1 == name).map(|e| Dtype(e.0))
    }

    /// The dtype whose code is this ggml type id, if the id is known.
    pub fn from_ggml_id(id: u32) -> Option<Dtype> {
        if id > 0xFFFF {
            return None;
        }
        Dtype::from_code(id)
    }

    /// The on-disk code.
    pub fn code(self) -> u32 {
        self.0
    }

    /// The ggml type id, for dtypes that have one.
    pub fn ggml_id(self) -> Option<u32> {
        (self.0 <= 0xFFFF).then_some(self.0)
    }

    fn entry(self) -> &'static (u32, &'static str, u64, u64) {
        // Dtype values are only built from TABLE codes, so the entry exists.
        TABLE.iter().find(|e| e.0 == self.0).unwrap_or(&TABLE[0])
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Block geometry.
    pub fn geometry(self) -> BlockGeometry {
        let e = self.entry();
        BlockGeometry {
            block_elems: e.2,
            block_bytes: e.3,
        }
    }

    /// Exact byte length of a tensor of this dtype and row-major `shape`, or `None` when the
    /// innermost dimension is not a whole number of blocks or the size overflows `u64`.
    /// A rank-0 tensor holds one element.
    pub fn byte_len(self, shape: &[u64]) -> Option<u64> {
        let g = self.geometry();
        let row = shape.last().copied().unwrap_or(1);
        if row % g.block_elems != 0 {
            return None;
        }
        let mut elems: u64 = 1;
        for &d in shape {
            elems = elems.checked_mul(d)?;
        }
        (elems / g.block_elems).checked_mul(g.block_bytes)
    }

    /// Every dtype in the table, in code order.
    pub fn all() -> impl Iterator<Item = Dtype> {
        TABLE.iter().map(|e| Dtype(e.0))
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_are_unique() {
        let mut codes: Vec<u32> = TABLE.iter().map(|e| e.0).collect();
        let mut names: Vec<&str> = TABLE.iter().map(|e| e.1).collect();
        codes.sort_unstable();
        names.sort_unstable();
        let n = TABLE.len();
        codes.dedup();
        names.dedup();
        assert_eq!((codes.len(), names.len()), (n, n));
    }

    #[test]
    fn retired_and_future_ggml_ids_are_refused() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 42, 0xFFFF] {
            assert_eq!(Dtype::from_ggml_id(id), None, "ggml id {id}");
        }
        assert_eq!(Dtype::from_ggml_id(0x1_0000), None);
    }

    #[test]
    fn byte_len_follows_block_geometry() {
        let q4k = Dtype::from_name("Q4_K").expect("Q4_K in table");
        assert_eq!(q4k.byte_len(&[8, 512]), Some(8 * 2 * 144));
        assert_eq!(
            q4k.byte_len(&[8, 100]),
            None,
            "row not a whole number of blocks"
        );
        assert_eq!(Dtype::BF16.byte_len(&[3, 5]), Some(30));
        assert_eq!(Dtype::BF16.byte_len(&[]), Some(2), "rank 0 is one element");
        assert_eq!(Dtype::BF16.byte_len(&[0, 5]), Some(0));
        assert_eq!(Dtype::F32.byte_len(&[u64::MAX, 2]), None, "overflow");
        let f4 = Dtype::from_name("F4").expect("F4 in table");
        assert_eq!(f4.byte_len(&[3]), None, "half a byte");
        assert_eq!(f4.byte_len(&[4]), Some(2));
    }
}
