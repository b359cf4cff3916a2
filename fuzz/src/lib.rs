//! Shared pieces of the fuzz targets: where a target's input file lives, what "use every API of
//! an opened reader" means, and the `jnf_index` input encoding (also used by the seed tool).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use sha2::Digest;
use tarfa_format::layout::{align_up, Footer, Header, ALIGN, FOOTER_LEN, MAJOR};
use tarfa_format::{JnfReader, Role};

/// The file a target hands to the reader, whose only entry point takes a path: one per process,
/// on tmpfs when there is one, unlinked at once and reached through `/proc/self/fd`, so runs
/// leave nothing behind however they end.
#[derive(Debug)]
pub struct Scratch {
    file: File,
    path: PathBuf,
}

impl Scratch {
    pub fn new(target: &str) -> Scratch {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let named = dir.join(format!("tarfa-fuzz-{target}-{}.jnf", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&named)
            .expect("create scratch file");
        std::fs::remove_file(&named).expect("unlink scratch file");
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        Scratch { file, path }
    }

    /// Empty the file and return it for writing.
    pub fn reset(&self) -> &File {
        self.file.set_len(0).expect("truncate scratch file");
        &self.file
    }

    /// The path that opens the file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Every read API of an opened reader, on every record and on a few lookups just off the grid.
/// Errors are fine; a panic is the bug.
pub fn exercise(r: &JnfReader) {
    let _ = r.verify_data();
    let h = r.header().clone();
    let mut probes: Vec<(u32, u32)> = r.experts().iter().map(|e| (e.layer, e.expert)).collect();
    probes.extend([
        (0, 0),
        (h.layer_first, 0),
        (h.layer_first, h.experts_per_layer),
        (h.layer_first.wrapping_add(h.layer_count), 0),
        (h.layer_first.wrapping_sub(1), 0),
        (u32::MAX, u32::MAX),
    ]);
    let roles = [
        Role::Tensor,
        Role::GateUp,
        Role::Gate,
        Role::Up,
        Role::Down,
        Role::GateUpBias,
        Role::GateBias,
        Role::UpBias,
        Role::DownBias,
    ];
    for (layer, expert) in probes {
        let _ = r.expert(layer, expert);
        for role in roles {
            if let Some(i) = r.projection(layer, expert, role) {
                let _ = r.read_region(i);
            }
        }
    }
    let map = std::fs::read(r.path()).ok();
    for i in 0..r.regions().len() as u32 {
        let _ = r.read_region(i);
        let _ = r.read_region_verified(i);
        let name = r.name(i).to_string();
        assert_eq!(r.region_by_name(&name), Some(i), "names are unique");
        if let Some(m) = &map {
            let _ = r.region_in(m, i);
        }
    }
    let _ = r.root();
}

/// Bytes of the fixed fields in front of the index bytes in a `jnf_index` input.
pub const INDEX_INPUT_FIELDS: usize = 24;
/// Largest data area a `jnf_index` input may ask for, in pages; keeps each run cheap.
pub const MAX_DATA_PAGES: u32 = 1024;

/// A `jnf_index` input: header fields, footer counts, where the index starts, and its bytes.
/// Encoding, little-endian: `layer_first, layer_count, experts_per_layer, region_count,
/// expert_count, index_offset / 4096` as `u32`s, then the index bytes.
#[derive(Debug)]
pub struct IndexInput<'a> {
    pub layer_first: u32,
    pub layer_count: u32,
    pub experts_per_layer: u32,
    pub region_count: u32,
    pub expert_count: u32,
    pub index_page: u32,
    pub index: &'a [u8],
}

impl<'a> IndexInput<'a> {
    pub fn decode(data: &'a [u8]) -> Option<IndexInput<'a>> {
        if data.len() < INDEX_INPUT_FIELDS {
            return None;
        }
        let u = |k: usize| u32::from_le_bytes(data[4 * k..4 * k + 4].try_into().expect("4 bytes"));
        let input = IndexInput {
            layer_first: u(0),
            layer_count: u(1),
            experts_per_layer: u(2),
            region_count: u(3),
            expert_count: u(4),
            index_page: u(5),
            index: &data[INDEX_INPUT_FIELDS..],
        };
        (1..=MAX_DATA_PAGES)
            .contains(&input.index_page)
            .then_some(input)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(INDEX_INPUT_FIELDS + self.index.len());
        for v in [
            self.layer_first,
            self.layer_count,
            self.experts_per_layer,
            self.region_count,
            self.expert_count,
            self.index_page,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(self.index);
        out
    }

    /// Write a JNF file with this index whose header and footer hashes are all correct, so the
    /// reader gets past them into `check_index_from`. The data area is a hole (zeros).
    pub fn write_file(&self, file: &File) {
        let header = Header {
            major: MAJOR,
            minor: 0,
            required_flags: 0,
            optional_flags: 0,
            layer_first: self.layer_first,
            layer_count: self.layer_count,
            experts_per_layer: self.experts_per_layer,
            header_blake3: [0; 32],
        };
        let page = header.encode_page();
        let index_offset = u64::from(self.index_page) * ALIGN;
        let index_len = self.index.len() as u64;
        let file_len = align_up(index_offset + index_len + FOOTER_LEN as u64).expect("small");
        let footer = Footer {
            file_len,
            index_offset,
            index_len,
            region_count: self.region_count,
            expert_count: self.expert_count,
            index_blake3: *blake3::hash(self.index).as_bytes(),
            index_sha256: sha2::Sha256::digest(self.index).into(),
            footer_blake3: [0; 32],
        };
        let footer_bytes = footer.encode(&page);
        file.write_all_at(&page, 0).expect("write header");
        file.set_len(file_len).expect("set_len");
        file.write_all_at(self.index, index_offset)
            .expect("write index");
        file.write_all_at(&footer_bytes, file_len - FOOTER_LEN as u64)
            .expect("write footer");
    }
}
