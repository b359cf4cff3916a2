//! One JNF file, every byte, read once from the disk (`O_DIRECT` where allowed, so a page in the
//! cache cannot hide a media error): each region hashed and compared with the source bytes its
//! provenance names, padding checked zero, the index and header re-hashed from the disk's bytes,
//! expert digests recomputed. Reading the next chunk overlaps checking the current one.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use tarfa_format::aligned::AlignedBuf;
use tarfa_format::hash::{expert_digest, root_digest, DualHash, DualHasher};
use tarfa_format::layout::RegionRecord;
use tarfa_format::layout::{align_up, Role, FOOTER_LEN, NONE};
use tarfa_format::reader::{ExpertRecords, RegionRecords, ScannedIndex};
use tarfa_format::validate::describe_location;

use crate::report::{Fault, FaultKind};

const CHUNK: usize = 8 << 20;

/// What scanning one file found and read.
#[derive(Debug, Default)]
pub struct FileScan {
    /// Faults.
    pub faults: Vec<Fault>,
    /// Bytes read from the file.
    pub bytes_read: u64,
    /// Regions hashed.
    pub regions: u64,
    /// Experts whose digests were recomputed.
    pub experts: u64,
    /// Bytes compared with the source.
    pub source_bytes: u64,
    /// Root digest recomputed from the header and footer as read from the disk.
    pub root: Option<DualHash>,
    /// Whether `O_DIRECT` was used.
    pub direct: bool,
}

/// What a span of the file is.
#[derive(Clone, Copy, Debug)]
enum Span {
    Header,
    Region(usize),
    Padding(usize),
    Index,
    IndexPadding,
    Footer,
}

/// Open source files, by provenance name.
#[derive(Debug)]
pub struct Sources<'a> {
    dir: Option<&'a Path>,
    open: HashMap<String, Result<File, String>>,
}

impl<'a> Sources<'a> {
    /// Sources under `dir`, or none.
    pub fn new(dir: Option<&'a Path>) -> Sources<'a> {
        Sources {
            dir,
            open: HashMap::new(),
        }
    }

    /// The open source file `name`, or why it cannot be read; `None` without a source.
    fn file(&mut self, name: &str) -> Option<Result<&File, &str>> {
        let dir = self.dir?;
        let f = self.open.entry(name.to_string()).or_insert_with(|| {
            tarfa_format::fsio::open_regular(&dir.join(name))
                .map(|f| f.file)
                .map_err(|e| e.to_string())
        });
        Some(f.as_ref().map_err(String::as_str))
    }
}

fn open_direct(path: &Path, direct: bool) -> Result<(File, bool), tarfa_format::fsio::FsError> {
    use tarfa_format::fsio::{open_regular, open_regular_with};
    if direct {
        if let Ok(f) = open_regular_with(path, libc::O_DIRECT) {
            return Ok((f.file, true));
        }
    }
    Ok((open_regular(path)?.file, false))
}

/// Per-region state while scanning.
struct RegionState {
    hasher: DualHasher,
    /// First differing byte found so far (offset within the region), or a source read failure.
    source_diff: Option<u64>,
    source_error: Option<String>,
}

impl RegionState {
    fn new() -> RegionState {
        RegionState {
            hasher: DualHasher::new(),
            source_diff: None,
            source_error: None,
        }
    }
}

/// Regions finished in file order (a region of no bytes has no span: it is finished when a later
/// one starts): each one's hashes and source comparison checked, and each expert's digest
/// recomputed when its last region is done. The records are read again from the index as they
/// come (none is held but the current one). Faults are kept apart, regions' then experts', to be
/// reported in that order after the padding faults the scan found.
struct Finished<'a> {
    strings: &'a [u8],
    label: &'a str,
    records: RegionRecords,
    expert_records: std::iter::Peekable<ExpertRecords>,
    /// Region `next`, being read, with its state.
    cur: Option<(RegionRecord, RegionState)>,
    /// Regions below this are finished.
    next: usize,
    /// Role, length and hashes of regions `pending_from..` that an unfinished expert needs.
    pending: Vec<(u32, u64, DualHash)>,
    pending_from: usize,
    /// Why the records could not be read again, if they could not.
    read_error: Option<String>,
    region_faults: Vec<Fault>,
    expert_faults: Vec<Fault>,
    regions: u64,
    experts: u64,
}

impl<'a> Finished<'a> {
    fn new(
        strings: &'a [u8],
        label: &'a str,
        records: RegionRecords,
        experts: ExpertRecords,
    ) -> Finished<'a> {
        Finished {
            strings,
            label,
            records,
            expert_records: experts.peekable(),
            cur: None,
            next: 0,
            pending: Vec::new(),
            pending_from: 0,
            read_error: None,
            region_faults: Vec::new(),
            expert_faults: Vec::new(),
            regions: 0,
            experts: 0,
        }
    }

    /// The name of region `i`, if it is the one being read.
    fn name_of(&self, i: usize) -> Option<&'a str> {
        let strings = self.strings;
        self.cur
            .as_ref()
            .filter(|_| self.next == i)
            .map(|(r, _)| r.name.get(strings))
    }

    /// The next record, or `None` (the error kept) if it cannot be read.
    fn read(&mut self) -> Option<RegionRecord> {
        match self.records.next()? {
            Ok(r) => Some(r),
            Err(e) => {
                self.read_error.get_or_insert(e.to_string());
                None
            }
        }
    }

    /// The record and state of region `i`, whose bytes are being read; the regions before it are
    /// finished.
    fn state(&mut self, i: usize) -> Option<(&RegionRecord, &mut RegionState)> {
        self.finish_through(i);
        if self.cur.is_none() && self.next == i {
            let rec = self.read()?;
            self.cur = Some((rec, RegionState::new()));
        }
        self.cur.as_mut().map(|(r, s)| (&*r, s))
    }

    /// Finish every region below `end`.
    fn finish_through(&mut self, end: usize) {
        while self.next < end {
            let (rec, st) = match self.cur.take() {
                Some(x) => x,
                None => match self.read() {
                    Some(rec) => (rec, RegionState::new()),
                    None => return,
                },
            };
            self.finish(self.next, &rec, st);
            self.next += 1;
        }
    }

    fn finish(&mut self, i: usize, rec: &RegionRecord, st: RegionState) {
        let (strings, label) = (self.strings, self.label);
        let h = st.hasher.finish();
        self.regions += 1;
        let locate = |kind: FaultKind, detail: String| {
            let mut x = Fault::new(kind, label, detail);
            x.tensor = Some(rec.name.get(strings).to_string());
            x.layer = (rec.layer != NONE).then_some(rec.layer);
            x.expert = (rec.expert != NONE).then_some(rec.expert);
            x.projection = (rec.expert != NONE).then(|| {
                Role::from_code(rec.role)
                    .map_or("?", Role::name)
                    .to_string()
            });
            x.offset = Some(rec.offset);
            x
        };
        for (algo, want, got) in [
            ("blake3", rec.blake3, h.blake3),
            ("sha256", rec.sha256, h.sha256),
        ] {
            if want != got {
                let mut x = locate(
                    FaultKind::RegionHash,
                    format!(
                        "{algo} of the region's bytes differs from the index ({})",
                        describe_location(rec)
                    ),
                );
                x.expected = Some(hex::encode(want));
                x.actual = Some(hex::encode(got));
                self.region_faults.push(x);
                break;
            }
        }
        if let Some(k) = st.source_diff {
            let mut x = locate(
                FaultKind::SourceMismatch,
                format!(
                    "differs from {} '{}' ({})",
                    rec.src_file.get(strings),
                    rec.src_tensor.get(strings),
                    describe_location(rec)
                ),
            );
            x.offset = Some(rec.offset + k);
            x.source_offset = Some(rec.src_begin + k);
            self.region_faults.push(x);
        }
        if let Some(e) = st.source_error {
            let mut x = locate(FaultKind::Source, format!("source bytes unreadable: {e}"));
            x.file = rec.src_file.get(strings).to_string();
            self.region_faults.push(x);
        }
        if i >= self.pending_from {
            self.pending.push((rec.role, rec.length, h));
        }
        // Experts: digests from the hashes just computed.
        loop {
            let e = match self.expert_records.peek() {
                None => break,
                Some(Err(_)) => {
                    if let Some(Err(e)) = self.expert_records.next() {
                        self.read_error.get_or_insert(e.to_string());
                    }
                    break;
                }
                Some(Ok(e)) => e.clone(),
            };
            let range = e.first_region as usize..(e.first_region + e.region_count) as usize;
            if range.end > i + 1 {
                break;
            }
            self.expert_records.next();
            self.experts += 1;
            let d = expert_digest(
                self.pending[range.start - self.pending_from..range.end - self.pending_from]
                    .iter()
                    .map(|(role, len, h)| (*role, *len, h)),
            );
            if d.blake3 != e.blake3 || d.sha256 != e.sha256 {
                let mut x = Fault::new(
                    FaultKind::ExpertDigest,
                    label,
                    "expert digest of the bytes read differs from the index",
                );
                x.layer = Some(e.layer);
                x.expert = Some(e.expert);
                x.offset = Some(e.extent_offset);
                x.expected = Some(hex::encode(e.blake3));
                x.actual = Some(hex::encode(d.blake3));
                self.expert_faults.push(x);
            }
        }
        // Keep only the hashes the next expert needs.
        let keep_from = match self.expert_records.peek() {
            Some(Ok(e)) => e.first_region as usize,
            _ => i + 1,
        }
        .max(self.pending_from);
        let drop = (keep_from - self.pending_from).min(self.pending.len());
        self.pending.drain(..drop);
        self.pending_from = keep_from;
    }
}

/// Scan the file at `path`, whose index [`tarfa_format::reader::scan_index`] checked as `ix`.
/// `label` names it in faults.
pub fn scan_file(
    path: &Path,
    ix: &ScannedIndex,
    label: &str,
    sources: &mut Sources<'_>,
    direct: bool,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> FileScan {
    let mut out = FileScan::default();
    let f = &ix.footer;
    let (file, used_direct) = match open_direct(path, direct) {
        Ok(x) => x,
        Err(e) => {
            out.faults
                .push(Fault::new(FaultKind::ReadError, label, e.to_string()));
            return out;
        }
    };
    out.direct = used_direct;

    // The region and expert records, read again from the index as the scan needs them: by the
    // spans, and by the regions' and experts' checks.
    let streams = RegionRecords::open(path, f).and_then(|a| {
        let b = RegionRecords::open(path, f)?;
        Ok((a, b, ExpertRecords::open(path, f)?))
    });
    let (span_records, records, experts) = match streams {
        Ok(x) => x,
        Err(e) => {
            out.faults
                .push(Fault::new(FaultKind::ReadError, label, e.to_string()));
            return out;
        }
    };
    let span_error: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    // The file's spans in order; each byte belongs to exactly one. Made as the scan reaches
    // them, not listed up front (a file may have millions of regions).
    let index_end = f.index_offset + f.index_len;
    let region_count = f.region_count as usize;
    let mut spans = std::iter::once((0, 4096, Span::Header))
        .chain(
            span_records
                .map_while(|r| {
                    r.map_err(|e| {
                        *span_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string())
                    })
                    .ok()
                })
                .enumerate()
                .flat_map(|(i, rec)| {
                    let pad_end = align_up(rec.end()).unwrap_or(rec.end());
                    [
                        (rec.offset, rec.end(), Span::Region(i)),
                        (rec.end(), pad_end, Span::Padding(i)),
                    ]
                }),
        )
        .chain([
            (f.index_offset, index_end, Span::Index),
            (
                index_end,
                f.file_len - FOOTER_LEN as u64,
                Span::IndexPadding,
            ),
            (f.file_len - FOOTER_LEN as u64, f.file_len, Span::Footer),
        ])
        .filter(|s| s.0 < s.1)
        .peekable();

    // One region is hashed at a time; each is finished (checked, its expert's digest computed
    // once the expert's last region is done) as the scan passes it.
    let mut done = Finished::new(&ix.strings, label, records, experts);
    let mut header = Vec::with_capacity(4096);
    let mut footer = Vec::with_capacity(FOOTER_LEN);
    let mut index_hasher = DualHasher::new();
    let mut padding_fault_in: Vec<bool> = vec![false; region_count + 1];
    let mut src_buf = Vec::new();

    let mut cur = AlignedBuf::new(CHUNK);
    let mut next = AlignedBuf::new(CHUNK);
    let read = |buf: &mut AlignedBuf, at: u64| -> std::io::Result<usize> {
        let n = (CHUNK as u64).min(f.file_len - at) as usize;
        file.read_exact_at(&mut buf[..n], at).map(|()| n)
    };
    let mut at = 0u64;
    let mut n = match read(&mut cur, 0) {
        Ok(n) => n,
        Err(e) => {
            let mut x = Fault::new(FaultKind::ReadError, label, format!("read: {e}"));
            x.offset = Some(0);
            out.faults.push(x);
            return out;
        }
    };
    loop {
        let next_at = at + n as u64;
        let more = next_at < f.file_len;
        // Read the next chunk while this one is checked.
        let (next_read, ()) = rayon::join(
            || more.then(|| read(&mut next, next_at)),
            || {
                let chunk = &cur[..n];
                // Dispatch the chunk's bytes to the spans they belong to.
                while let Some(&(s0, s1, kind)) = spans.peek().filter(|s| s.0 < next_at) {
                    let lo = s0.max(at);
                    let hi = s1.min(next_at);
                    let bytes = &chunk[(lo - at) as usize..(hi - at) as usize];
                    match kind {
                        Span::Header => header.extend_from_slice(bytes),
                        Span::Footer => footer.extend_from_slice(bytes),
                        Span::Index => index_hasher.update(bytes),
                        Span::Padding(_) | Span::IndexPadding => {
                            let slot = match kind {
                                Span::Padding(i) => i,
                                _ => region_count,
                            };
                            if let Some(k) = bytes.iter().position(|&b| b != 0) {
                                if !padding_fault_in[slot] {
                                    padding_fault_in[slot] = true;
                                    let mut x = Fault::new(
                                        FaultKind::Padding,
                                        label,
                                        match kind {
                                            Span::Padding(i) => {
                                                format!("non-zero padding after region {i}")
                                            }
                                            _ => "non-zero padding after the index".to_string(),
                                        },
                                    );
                                    x.offset = Some(lo + k as u64);
                                    x.actual = Some(format!("{:#04x}", bytes[k]));
                                    x.expected = Some("0x00".into());
                                    if let Span::Padding(i) = kind {
                                        x.tensor = done.name_of(i).map(str::to_string);
                                    }
                                    out.faults.push(x);
                                }
                            }
                        }
                        Span::Region(i) => {
                            if let Some((rec, st)) = done.state(i) {
                                st.hasher.update(bytes);
                                let within = lo - rec.offset;
                                let src_file = rec.src_file.get(&ix.strings);
                                if !src_file.is_empty()
                                    && st.source_diff.is_none()
                                    && st.source_error.is_none()
                                {
                                    if let Some(Ok(sf)) = sources.file(src_file) {
                                        src_buf.resize(bytes.len(), 0);
                                        match sf.read_exact_at(&mut src_buf, rec.src_begin + within)
                                        {
                                            Ok(()) => {
                                                out.source_bytes += bytes.len() as u64;
                                                if let Some(k) = bytes
                                                    .iter()
                                                    .zip(&src_buf)
                                                    .position(|(a, b)| a != b)
                                                {
                                                    st.source_diff = Some(within + k as u64);
                                                }
                                            }
                                            Err(e) => st.source_error = Some(e.to_string()),
                                        }
                                    } else if let Some(Err(e)) = sources.file(src_file) {
                                        st.source_error = Some(format!(
                                            "cannot open source file {src_file}: {e}"
                                        ));
                                    }
                                }
                            }
                        }
                    }
                    if s1 <= next_at {
                        spans.next();
                    } else {
                        break;
                    }
                }
            },
        );
        out.bytes_read += n as u64;
        on_bytes(n as u64);
        if !more {
            break;
        }
        match next_read {
            Some(Ok(m)) => {
                std::mem::swap(&mut cur, &mut next);
                at = next_at;
                n = m;
            }
            Some(Err(e)) => {
                let mut x = Fault::new(FaultKind::ReadError, label, format!("read: {e}"));
                x.offset = Some(next_at);
                out.faults.push(x);
                return out;
            }
            None => break,
        }
    }

    done.finish_through(region_count);
    let read_error = span_error
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .or(done.read_error.take());
    if let Some(e) = read_error {
        out.faults.push(Fault::new(
            FaultKind::ReadError,
            label,
            format!("read the index records again: {e}"),
        ));
    }
    out.regions = done.regions;
    out.experts = done.experts;
    out.faults.append(&mut done.region_faults);
    out.faults.append(&mut done.expert_faults);
    let ih = index_hasher.finish();
    if ih.blake3 != f.index_blake3 || ih.sha256 != f.index_sha256 {
        let mut x = Fault::new(
            FaultKind::IndexHash,
            label,
            "the index bytes on disk differ from the footer's hashes",
        );
        x.offset = Some(f.index_offset);
        x.expected = Some(hex::encode(f.index_blake3));
        x.actual = Some(hex::encode(ih.blake3));
        out.faults.push(x);
    }
    if header.len() == 4096 && footer.len() == FOOTER_LEN {
        out.root = Some(root_digest(&header, &footer));
    }
    out
}
