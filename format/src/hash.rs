//! The two hashes of JNF (§5.4): SHA-256 for interchange, BLAKE3 for the runtime's fast check,
//! and the expert digest built from the region hashes.

use sha2::Digest;

/// Domain tag that starts every expert digest's input.
pub const EXPERT_DIGEST_TAG: &[u8; 12] = b"JNF1-expert\0";

/// SHA-256 and BLAKE3 of one byte stream, computed side by side.
#[derive(Clone, Default, Debug)]
pub struct DualHasher {
    sha: sha2::Sha256,
    b3: blake3::Hasher,
}

/// The pair of hashes of one byte stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DualHash {
    /// SHA-256.
    pub sha256: [u8; 32],
    /// BLAKE3.
    pub blake3: [u8; 32],
}

/// Chunks smaller than this are hashed on the calling thread; larger ones on two threads.
const PARALLEL_MIN: usize = 256 * 1024;

impl DualHasher {
    /// A fresh hasher.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed bytes. Large chunks hash SHA-256 and BLAKE3 on two cores at once.
    pub fn update(&mut self, data: &[u8]) {
        if data.len() >= PARALLEL_MIN {
            let (sha, b3) = (&mut self.sha, &mut self.b3);
            rayon::join(|| sha.update(data), || b3.update(data));
        } else {
            self.sha.update(data);
            self.b3.update(data);
        }
    }

    /// The two hashes.
    pub fn finish(self) -> DualHash {
        DualHash {
            sha256: self.sha.finalize().into(),
            blake3: *self.b3.finalize().as_bytes(),
        }
    }
}

/// Both hashes of a byte slice.
pub fn dual_hash(data: &[u8]) -> DualHash {
    let mut h = DualHasher::new();
    h.update(data);
    h.finish()
}

/// The expert digest (§5.4): `H(tag || for each region in order: role u32 LE || length u64 LE ||
/// H(region bytes))`, where `H` is SHA-256 or BLAKE3 and the inner hashes are the region's own.
pub fn expert_digest<'a>(regions: impl IntoIterator<Item = (u32, u64, &'a DualHash)>) -> DualHash {
    let mut sha = sha2::Sha256::new();
    let mut b3 = blake3::Hasher::new();
    sha.update(EXPERT_DIGEST_TAG);
    b3.update(EXPERT_DIGEST_TAG);
    for (role, len, h) in regions {
        let mut head = [0u8; 12];
        head[..4].copy_from_slice(&role.to_le_bytes());
        head[4..].copy_from_slice(&len.to_le_bytes());
        sha.update(head);
        sha.update(h.sha256);
        b3.update(&head);
        b3.update(&h.blake3);
    }
    DualHash {
        sha256: sha.finalize().into(),
        blake3: *b3.finalize().as_bytes(),
    }
}

/// A file's root digests (§5.4): `H(header page 0..4096 || footer bytes 0..128)`. The footer holds
/// the index hashes, the index holds every region hash, and padding must be zero, so the root
/// names every byte of the file; its BLAKE3 flavour is the footer's own `footer_blake3`.
pub fn root_digest(header_page: &[u8], footer: &[u8]) -> DualHash {
    use crate::layout::{ALIGN, FOOTER_HASHED_LEN};
    let mut sha = sha2::Sha256::new();
    sha.update(&header_page[..ALIGN as usize]);
    sha.update(&footer[..FOOTER_HASHED_LEN]);
    DualHash {
        sha256: sha.finalize().into(),
        blake3: crate::layout::Footer::hash_with(header_page, footer),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dual_hasher_matches_one_shot_hashes_across_chunkings() {
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut h = DualHasher::new();
        for c in data.chunks(300_001) {
            h.update(c);
        }
        let got = h.finish();
        assert_eq!(got.sha256, <[u8; 32]>::from(sha2::Sha256::digest(&data)));
        assert_eq!(got.blake3, *blake3::hash(&data).as_bytes());
    }

    #[test]
    fn known_answer_sha256_and_blake3_of_abc() {
        let h = dual_hash(b"abc");
        assert_eq!(
            hex::encode(h.sha256),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex::encode(h.blake3),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
    }
}
