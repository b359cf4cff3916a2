//! The rules of `spec/JNF_V1.md`, as code. The reader runs them on every file it opens and the
//! writer runs the same functions on the header and index it is about to publish, so the writer is
//! never laxer than the reader.
//!
//! - [`file`]: the header page and the footer (§2);
//! - [`index`]: region records, expert records and the string table (§3–§5);
//! - [`data`]: region bytes and padding, read by full verification (§3, §5.4).

mod data;
mod file;
mod index;

use crate::layout::{ExpertRecord, Footer, Header, RegionRecord, StrRef};

// The checks themselves run inside the reader and the writer only; outside the crate, a file is
// checked by opening it with `JnfReader`.
pub use data::describe_location;
pub(crate) use data::{check_region_bytes, check_region_hash, check_zero};
pub(crate) use file::{check_footer, check_header};
pub(crate) use index::{check_index_from, CheckFault, FileSource, IndexSource};
pub(crate) use index::{check_provenance, check_region_role, check_region_type};

/// Largest index a reader accepts (§6).
pub const MAX_INDEX_LEN: u64 = 1 << 30;
/// Most regions one file may hold (§6).
pub const MAX_REGIONS: u64 = 1 << 22;
/// Longest name or provenance string (§6).
pub const MAX_STRING_LEN: u32 = 4096;
/// Most regions one expert may have (§5.2).
pub const MAX_EXPERT_REGIONS: u32 = 8;

/// A fully validated index: header, records and string table.
#[derive(Clone, Debug)]
pub struct Index {
    /// The header.
    pub header: Header,
    /// The footer.
    pub footer: Footer,
    /// Region records in file order.
    pub regions: Vec<RegionRecord>,
    /// Expert records in (layer, expert) grid order.
    pub experts: Vec<ExpertRecord>,
    /// The string table.
    pub strings: Vec<u8>,
}

impl Index {
    /// The string a reference points to. Valid for every reference of a validated index.
    pub fn str(&self, r: StrRef) -> &str {
        r.get(&self.strings)
    }

    /// Region name.
    pub fn name(&self, region: u32) -> &str {
        self.str(self.regions[region as usize].name)
    }

    /// End of the data area: where the index starts.
    pub fn data_end(&self) -> u64 {
        self.footer.index_offset
    }
}
