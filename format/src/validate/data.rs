//! Region bytes and padding (§3, §5.4), checked by full verification.

use super::Index;
use crate::error::Violation;
use crate::hash::DualHash;
use crate::layout::{RegionRecord, Role, NONE};

/// A region's human location: `layer 3 expert 7 gate` or `trunk tensor`.
pub fn describe_location(r: &RegionRecord) -> String {
    let role = Role::from_code(r.role).map_or("?", Role::name);
    match (r.layer, r.expert) {
        (NONE, _) => "trunk tensor".to_string(),
        (l, NONE) => format!("layer {l} tensor"),
        (l, e) => format!("layer {l} expert {e} {role}"),
    }
}

/// Check one region's bytes against its recorded hashes (§5.4).
pub(crate) fn check_region_bytes(
    index: &Index,
    region: u32,
    bytes: &[u8],
) -> Result<(), Violation> {
    let h = crate::hash::dual_hash(bytes);
    check_region_hash(index, region, &h)
}

/// Compare computed hashes of a region with the recorded ones.
pub(crate) fn check_region_hash(index: &Index, region: u32, h: &DualHash) -> Result<(), Violation> {
    let r = &index.regions[region as usize];
    for (algo, want, got) in [
        ("blake3", r.blake3, h.blake3),
        ("sha256", r.sha256, h.sha256),
    ] {
        if want != got {
            return Err(Violation::RegionHashMismatch {
                region,
                name: index.name(region).to_string(),
                location: describe_location(r),
                offset: r.offset,
                algo,
                expected: hex::encode(want),
                actual: hex::encode(got),
            });
        }
    }
    Ok(())
}

/// The first non-zero byte of a padding span, as a violation.
pub(crate) fn check_zero(
    bytes: &[u8],
    file_offset: u64,
    after: impl FnOnce() -> crate::error::PaddingAfter,
) -> Result<(), Violation> {
    match bytes.iter().position(|&b| b != 0) {
        None => Ok(()),
        Some(k) => Err(Violation::NonZeroPadding {
            offset: file_offset + k as u64,
            value: bytes[k],
            after: after(),
        }),
    }
}
