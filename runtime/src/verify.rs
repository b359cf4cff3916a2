//! The check of each expert as it lands: BLAKE3 of each region's exact bytes (padding
//! excluded), combined by the format's expert digest, equal to the recorded one.

use rayon::prelude::*;
use tarfa_format::hash::expert_digest;
use tarfa_format::{DualHash, JnfReader};

use crate::error::StreamError;
use crate::model::ExpertExtent;

/// Check `bytes` (the extent as read) against `x`'s recorded BLAKE3 expert digest. The regions
/// are hashed in parallel; a mismatch names the expert, its file and offset, and the first
/// region whose own hash differs.
///
/// `file` is the expert's layer file, for the names in the error.
pub fn check_expert(x: &ExpertExtent, bytes: &[u8], file: &JnfReader) -> Result<(), StreamError> {
    let hashes: Vec<[u8; 32]> = x
        .regions
        .par_iter()
        .map(|r| {
            bytes
                .get(r.start..r.start + r.len)
                .map(|b| *blake3::hash(b).as_bytes())
                .unwrap_or([0; 32])
        })
        .collect();
    // expert_digest computes both flavours from the region pairs; the BLAKE3 flavour depends
    // only on the BLAKE3 halves, so the SHA-256 halves (not computed here) are left zero.
    let pairs: Vec<DualHash> = hashes
        .iter()
        .map(|h| DualHash {
            sha256: [0; 32],
            blake3: *h,
        })
        .collect();
    let digest = expert_digest(
        x.regions
            .iter()
            .zip(&pairs)
            .map(|(r, h)| (r.role, r.len as u64, h)),
    )
    .blake3;
    if digest == x.blake3 && bytes.len() >= x.len {
        return Ok(());
    }
    let region = x
        .regions
        .iter()
        .zip(&hashes)
        .find(|(r, h)| **h != r.blake3)
        .map(|(r, _)| {
            format!(
                "{} '{}' at file offset {} (+{} bytes)",
                r.region,
                file.name(r.region),
                x.offset + r.start as u64,
                r.len
            )
        });
    Err(StreamError::Corrupt {
        layer: x.layer,
        expert: x.expert,
        path: file.path().to_path_buf(),
        offset: x.offset,
        len: x.len,
        expected: hex::encode(x.blake3),
        found: hex::encode(digest),
        region,
    })
}
