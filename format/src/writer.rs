//! The streaming writer. It never holds a region in memory: bytes flow from a [`Read`] through
//! SHA-256 and BLAKE3 (on two cores) into the file in fixed-size chunks. A typestate fixes the call
//! order — plain tensors and whole experts in any interleaving, an expert's projections only
//! between [`JnfWriter::begin_expert`] and [`JnfWriter::end_expert`], nothing after
//! [`JnfWriter::finish`] — and `finish` checks the index it built with the reader's own
//! validation before publishing it atomically.

use std::io::{Read, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use sha2::Digest;

use crate::aligned::AlignedBuf;
use crate::dtype::Dtype;
use crate::error::{Error, Result, UsageFault};
use crate::hash::{expert_digest, DualHash, DualHasher};
use crate::layout::{
    align_up, ExpertRecord, Footer, Header, RegionRecord, Role, StrRef, ALIGN, FOOTER_LEN, MAJOR,
    MAX_RANK, MINOR, NONE,
};
use crate::publish::PendingFile;
use crate::strindex::StrIndex;
use crate::validate::IndexSource as _;
use crate::validate::{self, MAX_EXPERT_REGIONS, MAX_STRING_LEN};

/// Which layers and experts a file holds (§5.2: the expert table is this grid, complete).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileLayout {
    /// First layer.
    pub layer_first: u32,
    /// Number of layers (0 for a file of plain tensors only).
    pub layer_count: u32,
    /// Experts per layer (0 for a file without experts).
    pub experts_per_layer: u32,
}

impl FileLayout {
    /// A file of plain tensors only (no layer range, no experts).
    pub fn trunk() -> FileLayout {
        FileLayout {
            layer_first: 0,
            layer_count: 0,
            experts_per_layer: 0,
        }
    }

    /// One layer with `experts` experts.
    pub fn layer(layer: u32, experts: u32) -> FileLayout {
        FileLayout {
            layer_first: layer,
            layer_count: 1,
            experts_per_layer: experts,
        }
    }
}

/// Where a region's bytes came from (§5.1 provenance).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provenance {
    /// Source file, relative to the source checkpoint's directory.
    pub file: String,
    /// Tensor name in the source file.
    pub tensor: String,
    /// Byte offset of the region's first byte in the source file.
    pub begin: u64,
    /// Row-major shape of the whole source tensor.
    pub shape: Vec<u64>,
}

/// What to write for one region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSpec {
    /// Unique name within the file.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Row-major shape.
    pub shape: Vec<u64>,
    /// The layer a plain tensor belongs to (`None` for trunk tensors). For an expert projection
    /// it must be `None` or the open expert's layer.
    pub layer: Option<u32>,
    /// Where the bytes came from, if from a file.
    pub source: Option<Provenance>,
}

impl RegionSpec {
    /// Exact byte length implied by dtype and shape, if valid.
    pub fn byte_len(&self) -> Option<u64> {
        self.dtype.byte_len(&self.shape)
    }
}

/// How to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterOptions {
    /// Bypass the page cache with `O_DIRECT` where the filesystem allows (every write is a whole
    /// number of pages from a page-aligned buffer); falls back to buffered writes otherwise.
    pub direct_io: bool,
}

/// Typestate: regions and experts may be added; `finish` may be called.
#[derive(Debug)]
pub enum Open {}
/// Typestate: an expert is open; only its projections may be added.
#[derive(Debug)]
pub enum InExpert {}

/// A JNF file being written. See the module docs for the call order.
#[derive(Debug)]
pub struct JnfWriter<S> {
    core: Box<Core>,
    _state: PhantomData<S>,
}

/// What [`JnfWriter::finish`] published.
#[derive(Clone, Debug)]
pub struct WrittenFile {
    /// Final path.
    pub path: PathBuf,
    /// File length.
    pub file_len: u64,
    /// The file's root digests (§5.4): hashes of header fields and footer.
    pub root: DualHash,
    /// Number of regions.
    pub regions: u32,
    /// Number of experts.
    pub experts: u32,
    /// Bytes of region data (padding excluded).
    pub data_bytes: u64,
    /// Whether the whole file was written with `O_DIRECT`.
    pub direct_io: bool,
}

#[derive(Debug)]
struct OpenExpert {
    layer: u32,
    expert: u32,
    first_region: u32,
    last_role: u32,
}

#[derive(Debug)]
struct Core {
    pending: PendingFile,
    header: Header,
    header_page: Vec<u8>,
    pos: u64,
    /// Region records written so far, encoded, in an unnamed file beside the output: the index of
    /// a file of millions of regions is never held in memory.
    regions: Spill,
    /// Records of the open expert's regions.
    open_regions: Vec<RegionRecord>,
    /// Expert records, encoded, likewise.
    experts: Spill,
    strings: Vec<u8>,
    string_ids: StrIndex,
    /// A bit per table offset: set where a region's name starts (the table is canonical: one
    /// offset a string).
    names: Vec<u64>,
    buf: AlignedBuf,
    spare: AlignedBuf,
    next_expert: u64,
    open: Option<OpenExpert>,
    data_bytes: u64,
}

/// Bytes moved per read/hash/write step.
const CHUNK: usize = 4 << 20;

impl JnfWriter<Open> {
    /// Start a file that will be published as `path`, with buffered writes.
    pub fn create(path: impl AsRef<Path>, layout: FileLayout) -> Result<JnfWriter<Open>> {
        Self::create_with(path, layout, WriterOptions::default())
    }

    /// Start a file that will be published as `path`.
    pub fn create_with(
        path: impl AsRef<Path>,
        layout: FileLayout,
        options: WriterOptions,
    ) -> Result<JnfWriter<Open>> {
        let path = path.as_ref();
        let header = Header {
            major: MAJOR,
            minor: MINOR,
            required_flags: 0,
            optional_flags: 0,
            layer_first: layout.layer_first,
            layer_count: layout.layer_count,
            experts_per_layer: layout.experts_per_layer,
            header_blake3: [0; 32],
        };
        let header_page = header.encode_page();
        // The writer refuses what the reader would refuse, through the same checks.
        let header =
            validate::check_header(&header_page, ALIGN).map_err(|violation| Error::Format {
                path: path.to_path_buf(),
                violation,
            })?;
        let pending = PendingFile::create_with(path, options.direct_io)?;
        let mut core = Core {
            pending,
            header,
            header_page,
            pos: 0,
            regions: Spill::new(path, true)?,
            open_regions: Vec::new(),
            experts: Spill::new(path, false)?,
            strings: Vec::new(),
            string_ids: StrIndex::default(),
            names: Vec::new(),
            buf: AlignedBuf::new(CHUNK),
            spare: AlignedBuf::new(CHUNK),
            next_expert: 0,
            open: None,
            data_bytes: 0,
        };
        let page = core.header_page.clone();
        core.write_through_buf(&page)?;
        Ok(JnfWriter {
            core: Box::new(core),
            _state: PhantomData,
        })
    }

    /// Write a plain (non-expert) tensor, streaming exactly `spec.byte_len()` bytes from `data`.
    pub fn tensor(&mut self, spec: &RegionSpec, data: &mut dyn Read) -> Result<DualHash> {
        self.core
            .region(spec, Role::Tensor, spec.layer.unwrap_or(NONE), NONE, data)
    }

    /// Open the next expert. Experts come in grid order: every expert of `layer_first`, then
    /// of the next layer, and so on.
    pub fn begin_expert(mut self, layer: u32, expert: u32) -> Result<JnfWriter<InExpert>> {
        let c = &mut self.core;
        let epl = u64::from(c.header.experts_per_layer);
        let total = epl * u64::from(c.header.layer_count);
        let want = (c.next_expert < total).then(|| {
            (
                c.header.layer_first + (c.next_expert / epl) as u32,
                (c.next_expert % epl) as u32,
            )
        });
        if want != Some((layer, expert)) {
            let fault = match want {
                Some((next_layer, next_expert)) => UsageFault::ExpertOutOfOrder {
                    layer,
                    expert,
                    next_layer,
                    next_expert,
                },
                None => UsageFault::ExpertOutsideGrid { layer, expert },
            };
            return Err(c.usage(fault));
        }
        c.open = Some(OpenExpert {
            layer,
            expert,
            first_region: c.regions.count as u32,
            last_role: 0,
        });
        c.open_regions.clear();
        Ok(JnfWriter {
            core: self.core,
            _state: PhantomData,
        })
    }

    /// Write the index and footer, check the whole index with the reader's rules, fsync and
    /// publish atomically. Every expert of the grid must have been written.
    pub fn finish(mut self) -> Result<WrittenFile> {
        let c = &mut self.core;
        let total = u64::from(c.header.experts_per_layer) * u64::from(c.header.layer_count);
        if c.next_expert != total {
            let fault = UsageFault::IncompleteGrid {
                written: c.next_expert,
                total,
            };
            return Err(c.usage(fault));
        }
        let index_offset = c.pos;
        // Only the string table is in memory; the records are read back from their spill files.
        c.string_ids = StrIndex::default();
        c.names = Vec::new();
        let (nr, ne) = (c.regions.count, c.experts.count);
        let strings = std::mem::take(&mut c.strings);
        let path = c.path();
        let spill_err = |e: std::io::Error| Error::io(&path, "read back the index", e);
        let (regions, experts) = (
            c.regions.file().map_err(spill_err)?,
            c.experts.file().map_err(spill_err)?,
        );
        let mut src = SpilledIndex {
            regions: &regions,
            experts: &experts,
            regions_len: nr * crate::layout::REGION_RECORD_LEN as u64,
            experts_len: ne * crate::layout::EXPERT_RECORD_LEN as u64,
            strings: &strings,
        };
        let index_len = src.len();
        let (index_blake3, index_sha256) = src.hashes(c.regions.hash.take()).map_err(spill_err)?;
        let file_len = align_up(index_offset + index_len + FOOTER_LEN as u64)
            .ok_or_else(|| c.usage(UsageFault::FileLenOverflow))?;
        let footer = Footer {
            file_len,
            index_offset,
            index_len,
            region_count: nr as u32,
            expert_count: ne as u32,
            index_blake3,
            index_sha256,
            footer_blake3: [0; 32],
        };
        let footer_bytes = footer.encode(&c.header_page);
        let footer = validate::check_footer(&c.header, &c.header_page, &footer_bytes, file_len)
            .map_err(|violation| c.usage(UsageFault::FooterInvalid { violation }))?;
        validate::check_index_from(
            c.header.clone(),
            footer,
            &mut src,
            false,
            false,
            &mut |_, _, _| {},
        )
        .map_err(|f| match f {
            validate::CheckFault::Bad(violation) => c.usage(UsageFault::IndexInvalid { violation }),
            validate::CheckFault::Io(e) => spill_err(e),
        })?;
        // The index, zeros to the footer's page, the footer: whole pages, a chunk at a time.
        let tail_len = file_len - c.pos;
        let mut at = 0u64;
        while at < tail_len {
            let n = (CHUNK as u64).min(tail_len - at) as usize;
            let buf = &mut c.buf[..n];
            buf.fill(0);
            if at < index_len {
                let k = (index_len - at).min(n as u64) as usize;
                src.read_at(at, &mut buf[..k]).map_err(spill_err)?;
            }
            let footer_at = tail_len - FOOTER_LEN as u64;
            if at + n as u64 > footer_at {
                let from = (footer_at - at) as usize;
                buf[from..].copy_from_slice(&footer_bytes);
            }
            c.write_buf(Buf::Main, n)?;
            at += n as u64;
        }
        let root = crate::hash::root_digest(&c.header_page, &footer_bytes);
        let written = WrittenFile {
            path: c.pending.dest().to_path_buf(),
            file_len,
            root,
            regions: nr as u32,
            experts: ne as u32,
            data_bytes: c.data_bytes,
            direct_io: c.pending.is_direct(),
        };
        let core = *self.core;
        core.pending.publish()?;
        Ok(written)
    }
}

impl JnfWriter<InExpert> {
    /// Write one projection of the open expert. Roles must strictly increase (gate_up or
    /// gate, up; then down; biases after), as §5.2 requires.
    pub fn projection(
        &mut self,
        role: Role,
        spec: &RegionSpec,
        data: &mut dyn Read,
    ) -> Result<DualHash> {
        let c = &mut self.core;
        let Some(open) = c.open.as_ref() else {
            return Err(c.usage(UsageFault::NoOpenExpert));
        };
        let (layer, expert, last_role) = (open.layer, open.expert, open.last_role);
        if role == Role::Tensor {
            return Err(c.usage(UsageFault::TensorRoleInExpert));
        }
        if let Some(spec_layer) = spec.layer.filter(|&l| l != layer) {
            return Err(c.usage(UsageFault::ProjectionLayer {
                name: spec.name.clone(),
                spec_layer,
                layer,
            }));
        }
        if role.code() <= last_role {
            return Err(c.usage(UsageFault::RoleOrder { role, last_role }));
        }
        let n = c.open_regions.len() as u32;
        if n >= MAX_EXPERT_REGIONS {
            return Err(c.usage(UsageFault::TooManyExpertRegions));
        }
        let fused_clash = {
            let roles: Vec<u32> = c.open_regions.iter().map(|r| r.role).collect();
            let has = |r: Role| roles.contains(&r.code()) || role == r;
            has(Role::GateUp) && (has(Role::Gate) || has(Role::Up))
        };
        if fused_clash {
            return Err(c.usage(UsageFault::FusedBesideSplit));
        }
        let h = c.region(spec, role, layer, expert, data)?;
        if let Some(o) = c.open.as_mut() {
            o.last_role = role.code();
        }
        Ok(h)
    }

    /// Close the expert: record its extent and digests.
    pub fn end_expert(mut self) -> Result<JnfWriter<Open>> {
        let c = &mut self.core;
        let Some(open) = c.open.take() else {
            return Err(c.usage(UsageFault::NoOpenExpert));
        };
        let regs = &c.open_regions;
        if regs.is_empty() {
            return Err(c.usage(UsageFault::NoProjections {
                layer: open.layer,
                expert: open.expert,
            }));
        }
        let hashes: Vec<DualHash> = regs
            .iter()
            .map(|r| DualHash {
                sha256: r.sha256,
                blake3: r.blake3,
            })
            .collect();
        let d = expert_digest(regs.iter().zip(&hashes).map(|(r, h)| (r.role, r.length, h)));
        let extent_offset = regs[0].offset;
        let rec = ExpertRecord {
            layer: open.layer,
            expert: open.expert,
            first_region: open.first_region,
            region_count: regs.len() as u32,
            extent_offset,
            extent_len: c.pos - extent_offset,
            sha256: d.sha256,
            blake3: d.blake3,
        };
        let mut bytes = Vec::with_capacity(crate::layout::EXPERT_RECORD_LEN);
        rec.encode(&mut bytes);
        c.experts
            .push(&bytes)
            .map_err(|e| Error::io(&c.path(), "spill the index", e))?;
        c.open_regions.clear();
        c.next_expert += 1;
        Ok(JnfWriter {
            core: self.core,
            _state: PhantomData,
        })
    }
}

impl Core {
    fn path(&self) -> PathBuf {
        self.pending.dest().to_path_buf()
    }

    fn usage(&self, fault: UsageFault) -> Error {
        Error::usage(fault, &self.path())
    }

    /// Write `buf[..n]` of `which` buffer (a whole number of pages) at the current offset.
    fn write_buf(&mut self, which: Buf, n: usize) -> Result<()> {
        debug_assert!(n % ALIGN as usize == 0 && self.pos % ALIGN == 0);
        let bytes = match which {
            Buf::Main => &self.buf[..n],
            Buf::Spare => &self.spare[..n],
        };
        write_pages(&mut self.pending, bytes, self.pos)?;
        self.pos += n as u64;
        Ok(())
    }

    /// Copy `bytes` (a whole number of pages) through the aligned buffer into the file.
    fn write_through_buf(&mut self, bytes: &[u8]) -> Result<()> {
        for chunk in bytes.chunks(CHUNK) {
            self.buf[..chunk.len()].copy_from_slice(chunk);
            self.write_buf(Buf::Main, chunk.len())?;
        }
        Ok(())
    }

    /// Whether a region is named by the string at `r`.
    fn is_name(&self, r: StrRef) -> bool {
        let (word, bit) = (r.offset as usize / 64, r.offset % 64);
        self.names.get(word).is_some_and(|w| w >> bit & 1 == 1)
    }

    fn intern(&mut self, s: &str) -> Result<StrRef> {
        if let Some(r) = self.string_ids.get(&self.strings, s) {
            return Ok(r);
        }
        if s.len() > MAX_STRING_LEN as usize {
            return Err(self.usage(UsageFault::StringTooLong { len: s.len() }));
        }
        let r = StrRef {
            offset: u32::try_from(self.strings.len())
                .map_err(|_| self.usage(UsageFault::StringTableFull))?,
            len: s.len() as u32,
        };
        self.strings.extend_from_slice(s.as_bytes());
        self.string_ids.insert(s, r);
        Ok(r)
    }

    fn region(
        &mut self,
        spec: &RegionSpec,
        role: Role,
        layer: u32,
        expert: u32,
        data: &mut dyn Read,
    ) -> Result<DualHash> {
        if spec.shape.len() > MAX_RANK {
            return Err(self.usage(UsageFault::RankOverLimit {
                name: spec.name.clone(),
                rank: spec.shape.len(),
            }));
        }
        if self.regions.count >= validate::MAX_REGIONS {
            return Err(self.usage(UsageFault::TooManyRegions));
        }
        let named = self.string_ids.get(&self.strings, &spec.name);
        if named.is_some_and(|r| self.is_name(r)) {
            return Err(self.usage(UsageFault::DuplicateName {
                name: spec.name.clone(),
            }));
        }
        let length = spec.byte_len().ok_or_else(|| {
            self.usage(UsageFault::NoByteLength {
                name: spec.name.clone(),
                dtype: spec.dtype,
                shape: spec.shape.clone(),
            })
        })?;
        let mut shape = [0u64; MAX_RANK];
        shape[..spec.shape.len()].copy_from_slice(&spec.shape);
        let mut rec = RegionRecord {
            offset: self.pos,
            length,
            dtype: spec.dtype.code(),
            ndim: spec.shape.len() as u32,
            shape,
            layer,
            expert,
            role: role.code(),
            name: self.intern(&spec.name)?,
            src_file: StrRef::default(),
            src_tensor: StrRef::default(),
            src_dtype: spec.dtype.code(),
            src_ndim: 0,
            src_begin: 0,
            src_end: 0,
            src_shape: [0; MAX_RANK],
            sha256: [0; 32],
            blake3: [0; 32],
        };
        let (mut src_file, mut src_tensor) = ("", "");
        if let Some(p) = &spec.source {
            if p.shape.len() > MAX_RANK {
                return Err(self.usage(UsageFault::SourceRankOverLimit {
                    name: spec.name.clone(),
                    rank: p.shape.len(),
                }));
            }
            rec.src_file = self.intern(&p.file)?;
            rec.src_tensor = self.intern(&p.tensor)?;
            rec.src_ndim = p.shape.len() as u32;
            rec.src_shape[..p.shape.len()].copy_from_slice(&p.shape);
            rec.src_begin = p.begin;
            rec.src_end = p.begin.saturating_add(length);
            (src_file, src_tensor) = (p.file.as_str(), p.tensor.as_str());
        }
        let ri = self.regions.count as u32;
        // The reader's own per-region rules, before a byte is written.
        let bad = |violation: crate::error::Violation| Error::Format {
            path: self.path(),
            violation,
        };
        let checks = validate::check_region_type(&rec, ri, &spec.name)
            .and_then(|()| validate::check_region_role(&rec, ri, &spec.name, &self.header))
            .and_then(|()| validate::check_provenance(&rec, ri, &spec.name, src_file, src_tensor));
        checks.map_err(bad)?;
        if spec.name.is_empty() {
            return Err(self.usage(UsageFault::EmptyName));
        }
        if spec.name.contains('\0') {
            return Err(self.usage(UsageFault::NameWithNul {
                name: spec.name.clone(),
            }));
        }

        // Each chunk is read into an aligned buffer, zero-padded to a page if it is the region's
        // last, and hashed while the previous chunk (in the other buffer) is written: every write
        // is whole pages, as O_DIRECT needs, and writing overlaps hashing.
        let mut hasher = DualHasher::new();
        let mut left = length;
        let mut unwritten: Option<usize> = None; // padded bytes waiting in `spare`
        while left > 0 {
            let want = (left.min(CHUNK as u64)) as usize;
            let got = read_full(data, &mut self.buf[..want])
                .map_err(|e| Error::io(&self.path(), READ_SOURCE_OP, e))?;
            if got < want {
                return Err(self.usage(UsageFault::SourceShort {
                    name: spec.name.clone(),
                    got: length - left + got as u64,
                    length,
                }));
            }
            let padded = want.div_ceil(ALIGN as usize) * ALIGN as usize;
            self.buf[want..padded].fill(0);
            let (cur, spare, pos) = (&self.buf[..want], &self.spare, self.pos);
            let pending = &mut self.pending;
            let (written, ()) = rayon::join(
                || match unwritten {
                    Some(n) => write_pages(pending, &spare[..n], pos).map(|()| n as u64),
                    None => Ok(0),
                },
                || hasher.update(cur),
            );
            self.pos += written?;
            std::mem::swap(&mut self.buf, &mut self.spare);
            unwritten = Some(padded);
            left -= want as u64;
        }
        if let Some(n) = unwritten {
            self.write_buf(Buf::Spare, n)?;
        }
        let h = hasher.finish();
        rec.sha256 = h.sha256;
        rec.blake3 = h.blake3;
        let (word, bit) = (rec.name.offset as usize / 64, rec.name.offset % 64);
        if self.names.len() <= word {
            self.names.resize(word + 1, 0);
        }
        self.names[word] |= 1 << bit;
        let mut bytes = Vec::with_capacity(crate::layout::REGION_RECORD_LEN);
        rec.encode(&mut bytes);
        self.regions
            .push(&bytes)
            .map_err(|e| Error::io(&self.path(), "spill the index", e))?;
        if self.open.is_some() {
            self.open_regions.push(rec);
        }
        self.data_bytes += length;
        Ok(h)
    }
}

/// Which of the two aligned buffers.
#[derive(Clone, Copy, Debug)]
enum Buf {
    Main,
    Spare,
}

/// Write whole pages at `pos`. If the filesystem took `O_DIRECT` at open but refuses it on
/// write (`EINVAL`), switch the file to buffered writes and retry once.
fn write_pages(pending: &mut PendingFile, bytes: &[u8], pos: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut res = pending.file().write_all_at(bytes, pos);
    if pending.is_direct()
        && res
            .as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL))
    {
        pending.drop_direct()?;
        res = pending.file().write_all_at(bytes, pos);
    }
    res.map_err(|e| Error::io(pending.dest(), "write", e))
}

/// The `op` of the [`Error::Io`] of a region's source `Read` failing (its `path` is the JNF file
/// being written), so that a caller can name the source instead.
pub const READ_SOURCE_OP: &str = "read region source";

/// Read until `buf` is full or the source ends; returns bytes read.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Records appended to an unnamed temporary file in the output's directory (nothing is left
/// behind by a crash), through a buffer.
#[derive(Debug)]
struct Spill {
    out: std::io::BufWriter<std::fs::File>,
    /// Records pushed.
    count: u64,
    /// The index's hashes of the records pushed, for the spill that starts the index.
    hash: Option<Box<(blake3::Hasher, sha2::Sha256)>>,
}

impl Spill {
    fn new(dest: &Path, hashed: bool) -> Result<Spill> {
        let dir = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let file = tempfile::tempfile_in(dir)
            .map_err(|e| Error::io(dest, "create the index spill file", e))?;
        Ok(Spill {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            count: 0,
            hash: hashed.then(|| Box::new((blake3::Hasher::new(), sha2::Sha256::new()))),
        })
    }

    fn push(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.out.write_all(record)?;
        if let Some(h) = self.hash.as_mut() {
            h.0.update(record);
            h.1.update(record);
        }
        self.count += 1;
        Ok(())
    }

    /// The file, every record pushed written to it.
    fn file(&mut self) -> std::io::Result<std::fs::File> {
        self.out.flush()?;
        self.out.get_ref().try_clone()
    }
}

/// The index being finished: region records, expert records (both spilled), string table.
struct SpilledIndex<'a> {
    regions: &'a std::fs::File,
    experts: &'a std::fs::File,
    regions_len: u64,
    experts_len: u64,
    strings: &'a [u8],
}

impl SpilledIndex<'_> {
    fn len(&self) -> u64 {
        self.regions_len + self.experts_len + self.strings.len() as u64
    }

    /// BLAKE3 and SHA-256 of the whole index; `regions`, the hashes of the region records as they
    /// were spilled, if kept.
    fn hashes(
        &mut self,
        regions: Option<Box<(blake3::Hasher, sha2::Sha256)>>,
    ) -> std::io::Result<([u8; 32], [u8; 32])> {
        let (mut b3, mut sha, mut at) = match regions {
            Some(h) => (h.0, h.1, self.regions_len),
            None => (blake3::Hasher::new(), sha2::Sha256::new(), 0),
        };
        let len = self.len();
        let mut buf = vec![0u8; CHUNK.min(len as usize)];
        while at < len {
            let n = (CHUNK as u64).min(len - at) as usize;
            self.read_at(at, &mut buf[..n])?;
            b3.update(&buf[..n]);
            sha.update(&buf[..n]);
            at += n as u64;
        }
        Ok((*b3.finalize().as_bytes(), sha.finalize().into()))
    }
}

impl validate::IndexSource for SpilledIndex<'_> {
    fn read_at(&mut self, mut at: u64, mut buf: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        for part in 0..3 {
            let len = match part {
                0 => self.regions_len,
                1 => self.experts_len,
                _ => self.strings.len() as u64,
            };
            if buf.is_empty() {
                break;
            }
            if at >= len {
                at -= len;
                continue;
            }
            let n = ((len - at) as usize).min(buf.len());
            let (now, rest) = buf.split_at_mut(n);
            match part {
                0 => self.regions.read_exact_at(now, at)?,
                1 => self.experts.read_exact_at(now, at)?,
                _ => now.copy_from_slice(&self.strings[at as usize..at as usize + n]),
            }
            buf = rest;
            at = 0;
        }
        if buf.is_empty() {
            Ok(())
        } else {
            Err(std::io::ErrorKind::UnexpectedEof.into())
        }
    }
}
