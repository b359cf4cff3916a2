//! The strict reader. [`JnfReader::open`] reads the header page and the index with `pread`,
//! bounded by the file's real size, and checks every structural rule before returning;
//! [`JnfReader::verify_data`] reads every data byte and checks hashes and padding. Region bytes are
//! served by `pread` ([`JnfReader::read_region`]) or by a memory map ([`JnfReader::map`]).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, PaddingAfter, Result, Violation};
use crate::hash::{DualHash, DualHasher};
use crate::layout::{
    align_up, ExpertRecord, Footer, Header, RegionRecord, Role, ALIGN, FOOTER_LEN,
};
use crate::validate::{self, Index};

/// An open, structurally validated JNF file.
#[derive(Debug)]
pub struct JnfReader {
    path: PathBuf,
    file: File,
    index: Index,
    /// Built on the first lookup by name (the converter and the verifier never look up).
    by_name: std::sync::OnceLock<HashMap<String, u32>>,
    root: DualHash,
}

/// Chunk size for streaming reads during verification.
const VERIFY_CHUNK: usize = 8 << 20;

impl JnfReader {
    /// Open and validate `path` (§2–§6). Nothing is allocated beyond what the file's real size
    /// and the format's limits allow.
    pub fn open(path: impl AsRef<Path>) -> Result<JnfReader> {
        let (path, file, index, root) = open_checked(path.as_ref(), true, &mut |_, _, _| {})?;
        Ok(JnfReader {
            path,
            file,
            index,
            by_name: std::sync::OnceLock::new(),
            root,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's root digests (§5.4), as recorded in a model manifest.
    pub fn root(&self) -> &DualHash {
        &self.root
    }

    /// The validated index.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.index.header
    }

    /// The footer.
    pub fn footer(&self) -> &Footer {
        &self.index.footer
    }

    /// Region records, in file order.
    pub fn regions(&self) -> &[RegionRecord] {
        &self.index.regions
    }

    /// Expert records, in grid order.
    pub fn experts(&self) -> &[ExpertRecord] {
        &self.index.experts
    }

    /// A region's name.
    pub fn name(&self, region: u32) -> &str {
        self.index.name(region)
    }

    /// The region with this name.
    pub fn region_by_name(&self, name: &str) -> Option<u32> {
        self.by_name
            .get_or_init(|| {
                (0..self.index.regions.len() as u32)
                    .map(|i| (self.index.name(i).to_string(), i))
                    .collect()
            })
            .get(name)
            .copied()
    }

    /// The record of `(layer, expert)`, found in O(1) from the grid position.
    pub fn expert(&self, layer: u32, expert: u32) -> Option<&ExpertRecord> {
        let h = &self.index.header;
        if layer < h.layer_first || expert >= h.experts_per_layer {
            return None;
        }
        let row = u64::from(layer - h.layer_first);
        if row >= u64::from(h.layer_count) {
            return None;
        }
        let k = row * u64::from(h.experts_per_layer) + u64::from(expert);
        self.index.experts.get(usize::try_from(k).ok()?)
    }

    /// The region of one projection of one expert: `(layer, expert, role)` to a region, O(1).
    pub fn projection(&self, layer: u32, expert: u32, role: Role) -> Option<u32> {
        let e = self.expert(layer, expert)?;
        (e.first_region..e.first_region + e.region_count)
            .find(|&i| self.index.regions[i as usize].role == role.code())
    }

    /// Read a region's exact bytes with `pread` (not hash-checked; see [`Self::read_region_verified`]).
    pub fn read_region(&self, region: u32) -> Result<Vec<u8>> {
        let r = &self.index.regions[region as usize];
        // The index check bounded offset + length by the file size.
        let mut buf = vec![0u8; r.length as usize];
        self.file
            .read_exact_at(&mut buf, r.offset)
            .map_err(|e| Error::io(&self.path, "read region", e))?;
        Ok(buf)
    }

    /// Read a region's bytes and check both recorded hashes.
    pub fn read_region_verified(&self, region: u32) -> Result<Vec<u8>> {
        let buf = self.read_region(region)?;
        validate::check_region_bytes(&self.index, region, &buf).map_err(|v| self.fail(v))?;
        Ok(buf)
    }

    /// The open file, for a caller that maps it (the runtime's `mmap` backend: a map of a file
    /// that another process truncates is SIGBUS, not an error, so mapping is the caller's
    /// `unsafe`, not this crate's).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// A region's bytes within a map of this file (or any buffer holding its bytes from 0).
    pub fn region_in<'m>(&self, map: &'m [u8], region: u32) -> &'m [u8] {
        let r = &self.index.regions[region as usize];
        &map[r.offset as usize..r.end() as usize]
    }

    /// Read every byte of the file once: check each region's SHA-256 and BLAKE3, and that all
    /// padding (after each region, after the index) is zero. Returns the first fault found.
    pub fn verify_data(&self) -> Result<()> {
        let mut buf = vec![0u8; VERIFY_CHUNK];
        let idx = &self.index;
        for (i, r) in idx.regions.iter().enumerate() {
            let mut h = DualHasher::new();
            let mut at = r.offset;
            while at < r.end() {
                let n = VERIFY_CHUNK.min((r.end() - at) as usize);
                self.pread(&mut buf[..n], at)?;
                h.update(&buf[..n]);
                at += n as u64;
            }
            validate::check_region_hash(idx, i as u32, &h.finish()).map_err(|v| self.fail(v))?;
            let pad_end = align_up(r.end()).unwrap_or(r.end());
            let pad = (pad_end - r.end()) as usize;
            self.pread(&mut buf[..pad], r.end())?;
            validate::check_zero(&buf[..pad], r.end(), || PaddingAfter::Region {
                region: i as u32,
                name: idx.name(i as u32).to_string(),
            })
            .map_err(|v| self.fail(v))?;
        }
        let index_end = idx.footer.index_offset + idx.footer.index_len;
        let pad = (idx.footer.file_len - FOOTER_LEN as u64 - index_end) as usize;
        self.pread(&mut buf[..pad], index_end)?;
        validate::check_zero(&buf[..pad], index_end, || PaddingAfter::Index)
            .map_err(|v| self.fail(v))
    }

    fn pread(&self, buf: &mut [u8], at: u64) -> Result<()> {
        self.file
            .read_exact_at(buf, at)
            .map_err(|e| Error::io(&self.path, "read", e))
    }

    fn fail(&self, violation: Violation) -> Error {
        Error::Format {
            path: self.path.clone(),
            violation,
        }
    }
}

/// A file's index checked by [`scan_index`]: everything [`JnfReader::open`] has but the region
/// records.
#[derive(Clone, Debug)]
pub struct ScannedIndex {
    /// The header.
    pub header: Header,
    /// The footer.
    pub footer: Footer,
    /// The file's root digests (§5.4).
    pub root: DualHash,
    /// The string table.
    pub strings: Vec<u8>,
}

/// Check `path` exactly as [`JnfReader::open`] does (§2–§6), but hand each region record, with the
/// string table its references point into, to `visit` as it is checked instead of keeping it:
/// one pass over a file of millions of regions in memory that does not grow with them (the
/// string table aside). `visit` may see records of a file that a later check refuses: what it
/// finds counts only if this returns `Ok`.
pub fn scan_index(
    path: impl AsRef<Path>,
    visit: &mut dyn FnMut(u32, &RegionRecord, &[u8]),
) -> Result<ScannedIndex> {
    let (_, _, index, root) = open_checked(path.as_ref(), false, visit)?;
    Ok(ScannedIndex {
        header: index.header,
        footer: index.footer,
        root,
        strings: index.strings,
    })
}

/// Records of one kind read from a file's index in order, a chunk at a time.
#[derive(Debug)]
struct Cursor {
    file: File,
    /// File offset of the next record not yet in `buf`.
    at: u64,
    /// File offset past the last record.
    end: u64,
    rec_len: usize,
    buf: Vec<u8>,
    pos: usize,
}

impl Cursor {
    fn open(path: &Path, at: u64, count: u64, rec_len: usize) -> Result<Cursor> {
        let crate::fsio::RegularFile { file, .. } = crate::fsio::open_regular(path)?;
        Ok(Cursor {
            file,
            at,
            end: at + count * rec_len as u64,
            rec_len,
            buf: Vec::new(),
            pos: 0,
        })
    }

    fn next_bytes(&mut self) -> Option<std::io::Result<&[u8]>> {
        if self.pos == self.buf.len() {
            if self.at == self.end {
                return None;
            }
            let n = ((self.end - self.at) as usize).min((1 << 20) / self.rec_len * self.rec_len);
            self.buf.resize(n, 0);
            if let Err(e) = self.file.read_exact_at(&mut self.buf, self.at) {
                self.at = self.end;
                self.buf.clear();
                return Some(Err(e));
            }
            self.at += n as u64;
            self.pos = 0;
        }
        let b = &self.buf[self.pos..self.pos + self.rec_len];
        self.pos += self.rec_len;
        Some(Ok(b))
    }
}

/// The region records of a file [`scan_index`] checked, read again from it in index order a
/// chunk at a time (for a pass that must not hold millions of them). A file changed since it was
/// checked yields its new records: a caller that must know re-hashes the index bytes.
#[derive(Debug)]
pub struct RegionRecords(Cursor);

impl RegionRecords {
    /// The region records of `path`, whose checked footer is `footer`.
    pub fn open(path: impl AsRef<Path>, footer: &Footer) -> Result<RegionRecords> {
        Cursor::open(
            path.as_ref(),
            footer.index_offset,
            footer.region_count.into(),
            crate::layout::REGION_RECORD_LEN,
        )
        .map(RegionRecords)
    }
}

impl Iterator for RegionRecords {
    type Item = std::io::Result<RegionRecord>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0
            .next_bytes()
            .map(|r| r.map(|b| RegionRecord::decode(b).0))
    }
}

/// The expert records of a file [`scan_index`] checked, read again likewise.
#[derive(Debug)]
pub struct ExpertRecords(Cursor);

impl ExpertRecords {
    /// The expert records of `path`, whose checked footer is `footer`.
    pub fn open(path: impl AsRef<Path>, footer: &Footer) -> Result<ExpertRecords> {
        Cursor::open(
            path.as_ref(),
            footer.index_offset
                + u64::from(footer.region_count) * crate::layout::REGION_RECORD_LEN as u64,
            footer.expert_count.into(),
            crate::layout::EXPERT_RECORD_LEN,
        )
        .map(ExpertRecords)
    }
}

impl Iterator for ExpertRecords {
    type Item = std::io::Result<ExpertRecord>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next_bytes().map(|r| r.map(ExpertRecord::decode))
    }
}

/// Open `path` and check it; `keep`: keep the region records in the index.
fn open_checked(
    path: &Path,
    keep: bool,
    visit: &mut dyn FnMut(u32, &RegionRecord, &[u8]),
) -> Result<(PathBuf, File, Index, DualHash)> {
    let path = path.to_path_buf();
    let crate::fsio::RegularFile { file, len } = crate::fsio::open_regular(&path)?;
    let fail = |violation: Violation| Error::Format {
        path: path.clone(),
        violation,
    };
    let mut page = vec![0u8; ALIGN as usize];
    if len < ALIGN {
        return Err(fail(Violation::FileTooShort { len }));
    }
    file.read_exact_at(&mut page, 0)
        .map_err(|e| Error::io(&path, "read header", e))?;
    let header = validate::check_header(&page, len).map_err(fail)?;
    let mut footer_bytes = [0u8; FOOTER_LEN];
    file.read_exact_at(&mut footer_bytes, len - FOOTER_LEN as u64)
        .map_err(|e| Error::io(&path, "read footer", e))?;
    let footer = validate::check_footer(&header, &page, &footer_bytes, len).map_err(fail)?;
    // check_footer bounded index_len by the file length and MAX_INDEX_LEN. The index is read
    // a chunk at a time: its bytes are never held whole beside the records decoded from them.
    let base = footer.index_offset;
    let mut src = validate::FileSource { file: &file, base };
    let index = validate::check_index_from(header, footer, &mut src, keep, true, visit).map_err(
        |f| match f {
            validate::CheckFault::Bad(v) => fail(v),
            validate::CheckFault::Io(e) => Error::io(&path, "read index", e),
        },
    )?;
    let root = crate::hash::root_digest(&page, &footer_bytes);
    Ok((path, file, index, root))
}
