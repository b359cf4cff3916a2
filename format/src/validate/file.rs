//! The header page (§2.1) and the footer (§2.2).

use super::{MAX_INDEX_LEN, MAX_REGIONS};
use crate::error::{Aligned, ExpertRecordFault, Violation};
use crate::layout::{
    align_up, Footer, Header, ALIGN, EXPERT_RECORD_LEN, FOOTER_HASHED_LEN, FOOTER_LEN,
    FOOTER_MAGIC, HEADER_HASHED_LEN, HEADER_LEN, KNOWN_REQUIRED_FLAGS, MAGIC, MAJOR, NONE,
    REGION_RECORD_LEN,
};

/// Check the header page (§2.1). `actual_len` is the file's real length.
pub(crate) fn check_header(page: &[u8], actual_len: u64) -> Result<Header, Violation> {
    if actual_len < ALIGN || page.len() < ALIGN as usize {
        return Err(Violation::FileTooShort { len: actual_len });
    }
    if page[..8] != MAGIC {
        return Err(Violation::BadMagic {
            found: hex::encode(&page[..8]),
        });
    }
    let h = Header::decode(&page[..HEADER_LEN]);
    if h.major != MAJOR {
        return Err(Violation::UnsupportedMajor { major: h.major });
    }
    if *blake3::hash(&page[..HEADER_HASHED_LEN]).as_bytes() != h.header_blake3 {
        return Err(Violation::HeaderHashMismatch);
    }
    let unknown = h.required_flags & !KNOWN_REQUIRED_FLAGS;
    if unknown != 0 {
        return Err(Violation::UnknownRequiredFlags { flags: unknown });
    }
    // Reserved: 12..16 and 44..48 always; the rest of the page when minor is 0 (a later minor
    // may define fields there that a 1.0 reader can ignore).
    let tail_end = if h.minor == 0 { ALIGN as usize } else { 0 };
    let reserved = (12..16).chain(44..48).chain(HEADER_LEN..tail_end);
    first_nonzero(page, reserved, 0)?;
    if h.layer_count == 0 && (h.layer_first != 0 || h.experts_per_layer != 0) {
        return Err(Violation::EmptyFileLayerFields {
            layer_first: h.layer_first,
            experts_per_layer: h.experts_per_layer,
        });
    }
    let grid = u64::from(h.layer_count) * u64::from(h.experts_per_layer);
    if grid > MAX_REGIONS {
        return Err(Violation::LimitExceeded {
            what: "layer_count x experts_per_layer",
            value: grid,
            limit: MAX_REGIONS,
            why: "JNF v1 allows (§6)",
        });
    }
    if u64::from(h.layer_first) + u64::from(h.layer_count) >= u64::from(NONE) {
        return Err(Violation::LimitExceeded {
            what: "layer_first + layer_count",
            value: u64::from(h.layer_first) + u64::from(h.layer_count),
            limit: u64::from(NONE) - 1,
            why: "leaves room for the 'no layer' marker",
        });
    }
    Ok(h)
}

fn first_nonzero(
    bytes: &[u8],
    range: impl Iterator<Item = usize>,
    base: u64,
) -> Result<(), Violation> {
    for o in range {
        if bytes[o] != 0 {
            return Err(Violation::NonZeroReserved {
                offset: base + o as u64,
                value: bytes[o],
            });
        }
    }
    Ok(())
}

/// Check the footer (§2.2), the last [`FOOTER_LEN`] bytes of a file of `actual_len` bytes whose
/// checked header page is `page`.
pub(crate) fn check_footer(
    header: &Header,
    page: &[u8],
    footer_bytes: &[u8],
    actual_len: u64,
) -> Result<Footer, Violation> {
    if actual_len % ALIGN != 0 || footer_bytes[..8] != FOOTER_MAGIC {
        return Err(Violation::NoFooter { len: actual_len });
    }
    let f = Footer::decode(footer_bytes);
    if Footer::hash_with(page, footer_bytes) != f.footer_blake3 {
        return Err(Violation::FooterHashMismatch);
    }
    let footer_at = actual_len - FOOTER_LEN as u64;
    first_nonzero(footer_bytes, 104..FOOTER_HASHED_LEN, footer_at)?;
    if f.file_len != actual_len {
        return Err(Violation::FileLenMismatch {
            expected: f.file_len,
            actual: actual_len,
        });
    }
    if f.index_offset % ALIGN != 0 {
        return Err(Violation::Misaligned {
            what: Aligned::IndexOffset,
            value: f.index_offset,
        });
    }
    let index_end = f.index_offset.checked_add(f.index_len);
    let want_len = index_end
        .and_then(|e| e.checked_add(FOOTER_LEN as u64))
        .and_then(align_up);
    if f.index_offset < ALIGN || want_len != Some(actual_len) {
        return Err(Violation::IndexPlacement {
            offset: f.index_offset,
            len: f.index_len,
            expected: f.index_offset.max(ALIGN),
            file_len: actual_len,
        });
    }
    if f.index_len > MAX_INDEX_LEN {
        return Err(Violation::LimitExceeded {
            what: "index length",
            value: f.index_len,
            limit: MAX_INDEX_LEN,
            why: "JNF v1 allows (§6)",
        });
    }
    if u64::from(f.region_count) > MAX_REGIONS {
        return Err(Violation::LimitExceeded {
            what: "region count",
            value: f.region_count.into(),
            limit: MAX_REGIONS,
            why: "JNF v1 allows (§6)",
        });
    }
    let records = u64::from(f.region_count) * REGION_RECORD_LEN as u64
        + u64::from(f.expert_count) * EXPERT_RECORD_LEN as u64;
    if records > f.index_len {
        return Err(Violation::LimitExceeded {
            what: "bytes of index records",
            value: records,
            limit: f.index_len,
            why: "the index length in the footer holds",
        });
    }
    let grid = u64::from(header.layer_count) * u64::from(header.experts_per_layer);
    if grid != u64::from(f.expert_count) {
        return Err(Violation::BadExpert {
            record: NONE,
            layer: header.layer_first,
            expert: NONE,
            fault: ExpertRecordFault::CountNotGrid {
                expert_count: f.expert_count,
                layer_count: header.layer_count,
                experts_per_layer: header.experts_per_layer,
            },
        });
    }
    Ok(f)
}
