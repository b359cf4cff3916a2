//! The index (§3–§5): region records, expert records, the string table.

use sha2::Digest;

use super::{Index, MAX_EXPERT_REGIONS, MAX_STRING_LEN};
use crate::dtype::Dtype;
use crate::error::{
    Aligned, ExpertRecordFault as EF, NameFault, ProvenanceFault as PF, RoleFault, ShapeFault,
    StringFault, Violation,
};
use crate::hash::{expert_digest, DualHash};
use crate::layout::{
    align_up, ExpertRecord, Footer, Header, RegionRecord, Role, StrRef, ALIGN, EXPERT_RECORD_LEN,
    MAX_RANK, NONE, REGION_RECORD_LEN,
};
use crate::strindex::StrIndex;

/// The string a reference names, checked (§5.3).
fn get_str<'a>(
    table: &'a [u8],
    r: StrRef,
    region: u32,
    field: &'static str,
) -> Result<&'a str, Violation> {
    let end = u64::from(r.offset) + u64::from(r.len);
    if end > table.len() as u64 || r.len > MAX_STRING_LEN {
        return Err(Violation::StringOutOfBounds {
            region,
            field,
            offset: r.offset,
            len: r.len,
            table_len: table.len() as u64,
        });
    }
    let bytes = &table[r.offset as usize..end as usize];
    std::str::from_utf8(bytes).map_err(|e| Violation::BadUtf8 {
        region,
        field,
        valid_up_to: e.valid_up_to(),
    })
}

/// Reads string references in record order and holds the string table to its canonical form
/// (§5.3): each distinct non-empty string stored once, at the point of its first reference, in
/// order; every later reference reuses it; empty strings are `(0, 0)`; no other bytes.
struct StringTable<'a> {
    table: &'a [u8],
    cursor: u64,
    seen: StrIndex,
}

impl<'a> StringTable<'a> {
    fn take(&mut self, r: StrRef, region: u32, field: &'static str) -> Result<&'a str, Violation> {
        let s = get_str(self.table, r, region, field)?;
        let bad = |fault: StringFault| Violation::NonCanonicalStrings {
            region,
            field,
            offset: r.offset,
            len: r.len,
            fault,
        };
        if r.len == 0 {
            return if r.offset == 0 {
                Ok(s)
            } else {
                Err(bad(StringFault::EmptyNotAtZero))
            };
        }
        if let Some(first) = self.seen.get(self.table, s) {
            return if first == r {
                Ok(s)
            } else {
                Err(bad(StringFault::RepeatNotShared {
                    first: first.offset,
                }))
            };
        }
        if u64::from(r.offset) != self.cursor {
            return Err(bad(StringFault::OutOfOrder {
                expected: self.cursor,
            }));
        }
        self.cursor += u64::from(r.len);
        self.seen.insert(s, r);
        Ok(s)
    }

    fn finish(self, regions: u32) -> Result<(), Violation> {
        let len = self.table.len() as u64;
        if self.cursor != len {
            return Err(Violation::NonCanonicalStrings {
                region: regions,
                field: "string table",
                offset: self.cursor as u32,
                len: (len - self.cursor) as u32,
                fault: StringFault::Unreferenced,
            });
        }
        Ok(())
    }
}

/// Where the index check reads the index's bytes: the whole index in memory, or a file (the
/// reader's, the writer's spill file) read a chunk at a time, so that an index of a million
/// records is never held whole beside its decoded records.
pub(crate) trait IndexSource {
    /// Fill `buf` with the index's bytes from index offset `at` (within the footer's `index_len`).
    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// An index read from a file at a base offset.
pub(crate) struct FileSource<'f> {
    /// The file.
    pub(crate) file: &'f std::fs::File,
    /// File offset of the index's first byte.
    pub(crate) base: u64,
}

impl IndexSource for FileSource<'_> {
    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.file.read_exact_at(buf, self.base + at)
    }
}

/// Why an index check stopped: a rule broken, or the index could not be read.
#[derive(Debug)]
pub(crate) enum CheckFault {
    /// A rule of the spec is broken.
    Bad(Violation),
    /// Reading the index failed.
    Io(std::io::Error),
}

impl From<Violation> for CheckFault {
    fn from(v: Violation) -> CheckFault {
        CheckFault::Bad(v)
    }
}

impl From<std::io::Error> for CheckFault {
    fn from(e: std::io::Error) -> CheckFault {
        CheckFault::Io(e)
    }
}

/// `marks` bit: the region is an expert projection.
const PROJECTION: u8 = 1;
/// `marks` bit: an expert record has claimed the region.
const OWNED: u8 = 2;

/// Bytes of index read at a time.
const CHUNK: usize = 4 << 20;

/// Decode and check the index (§3, §4, §5), read from `src` a chunk at a time, given the checked
/// header and footer: its hashes, then each region record, the
/// string table, each expert record. With `keep`, the decoded region records are returned in the
/// [`Index`]; without (the writer's check before publishing), `regions` is empty and nothing is
/// held per region but a name reference and two bits. Every rule and its order are the same either
/// way (without `keep`, `experts` is empty too). Without `hash`, the footer's index hashes are taken as the caller's own hashes of these
/// very bytes (the writer's, computed as it spilled them) and not computed again. `visit` sees each
/// region record, with the string table, once it has passed its own checks (the index as a whole
/// may still fail later ones).
pub(crate) fn check_index_from(
    header: Header,
    footer: Footer,
    src: &mut dyn IndexSource,
    keep: bool,
    hash: bool,
    visit: &mut dyn FnMut(u32, &RegionRecord, &[u8]),
) -> Result<Index, CheckFault> {
    let len = footer.index_len;
    let mut chunk = vec![0u8; CHUNK.min(len as usize)];
    let mut b3 = blake3::Hasher::new();
    let mut sha = sha2::Sha256::new();
    let mut at = 0u64;
    while hash && at < len {
        let n = CHUNK.min((len - at) as usize);
        src.read_at(at, &mut chunk[..n])?;
        b3.update(&chunk[..n]);
        sha.update(&chunk[..n]);
        at += n as u64;
    }
    let (b3, sha): ([u8; 32], [u8; 32]) = if hash {
        (*b3.finalize().as_bytes(), sha.finalize().into())
    } else {
        (footer.index_blake3, footer.index_sha256)
    };
    if b3 != footer.index_blake3 {
        return Err(Violation::IndexHashMismatch {
            algo: "blake3",
            expected: hex::encode(footer.index_blake3),
            actual: hex::encode(b3),
        }
        .into());
    }
    if sha != footer.index_sha256 {
        return Err(Violation::IndexHashMismatch {
            algo: "sha256",
            expected: hex::encode(footer.index_sha256),
            actual: hex::encode(sha),
        }
        .into());
    }
    let nr = footer.region_count as usize;
    let ne = footer.expert_count as usize;
    let experts_at = nr * REGION_RECORD_LEN;
    let strings_at = experts_at + ne * EXPERT_RECORD_LEN;
    let mut table = vec![0u8; (len - strings_at as u64) as usize];
    src.read_at(strings_at as u64, &mut table)?;

    let mut regions = Vec::with_capacity(if keep { nr } else { 0 });
    // Per region: whether it is a projection, whether an expert record has claimed it.
    let mut marks = vec![0u8; nr];
    {
        // The table is canonical (checked as each reference is taken), so two regions of one
        // name share its reference: a bit per table offset marks the names taken.
        let mut names = vec![0u64; table.len().div_ceil(64)];
        let mut strings = StringTable {
            table: &table,
            cursor: 0,
            seen: StrIndex::default(),
        };
        let mut expected_offset = ALIGN;
        let per_chunk = CHUNK / REGION_RECORD_LEN;
        for c in (0..nr).step_by(per_chunk.max(1)) {
            let count = per_chunk.min(nr - c);
            let buf = &mut chunk[..count * REGION_RECORD_LEN];
            src.read_at((c * REGION_RECORD_LEN) as u64, buf)?;
            for (j, rec) in buf.chunks_exact(REGION_RECORD_LEN).enumerate() {
                let i = c + j;
                let (r, reserved, tail) = RegionRecord::decode(rec);
                let ri = i as u32;
                let rec_at = i * REGION_RECORD_LEN;
                let abs = |o: usize| footer.index_offset + (rec_at + o) as u64;
                if reserved != 0 {
                    let k = reserved
                        .to_le_bytes()
                        .iter()
                        .position(|&x| x != 0)
                        .unwrap_or(0);
                    return Err(Violation::NonZeroReserved {
                        offset: abs(132 + k),
                        value: reserved.to_le_bytes()[k],
                    }
                    .into());
                }
                if let Some(k) = tail.iter().position(|&x| x != 0) {
                    return Err(Violation::NonZeroReserved {
                        offset: abs(280 + k),
                        value: tail[k],
                    }
                    .into());
                }
                let name = strings.take(r.name, ri, "name")?;
                if name.is_empty() {
                    return Err(Violation::BadName {
                        region: ri,
                        fault: NameFault::Empty,
                    }
                    .into());
                }
                if name.contains('\0') {
                    return Err(Violation::BadName {
                        region: ri,
                        fault: NameFault::ContainsNul,
                    }
                    .into());
                }
                let (word, bit) = (r.name.offset as usize / 64, r.name.offset % 64);
                if names[word] >> bit & 1 == 1 {
                    let first = if keep {
                        regions.iter().position(|x: &RegionRecord| x.name == r.name)
                    } else {
                        first_named(src, r.name, i)?
                    };
                    return Err(Violation::DuplicateName {
                        name: name.to_string(),
                        first: first.unwrap_or(0) as u32,
                        second: ri,
                    }
                    .into());
                }
                names[word] |= 1 << bit;
                check_region_placement(&r, ri, name, expected_offset, footer.index_offset)?;
                expected_offset = align_up(r.end()).unwrap_or(u64::MAX);
                check_region_type(&r, ri, name)?;
                check_region_role(&r, ri, name, &header)?;
                let src_file = strings.take(r.src_file, ri, "source file")?;
                let src_tensor = strings.take(r.src_tensor, ri, "source tensor")?;
                check_provenance(&r, ri, name, src_file, src_tensor)?;
                if r.role != Role::Tensor.code() {
                    marks[i] = PROJECTION;
                }
                visit(ri, &r, &table);
                if keep {
                    regions.push(r);
                }
            }
        }
        if expected_offset != footer.index_offset {
            return Err(Violation::IndexPlacement {
                offset: footer.index_offset,
                len: footer.index_len,
                expected: expected_offset,
                file_len: footer.file_len,
            }
            .into());
        }
        strings.finish(nr as u32)?;
    }

    // The regions of each expert, from `regions` or read again from `src` (experts come in
    // order of their first region, so the window only moves forward).
    let mut window: Vec<RegionRecord> = Vec::new();
    let mut window_at = 0usize;
    let mut experts: Vec<ExpertRecord> = Vec::with_capacity(if keep { ne } else { 0 });
    let mut ebuf = vec![0u8; EXPERT_RECORD_LEN];
    let mut last_first: Option<u32> = None;
    let epl = header.experts_per_layer.max(1);
    for k in 0..ne {
        let at = experts_at + k * EXPERT_RECORD_LEN;
        src.read_at(at as u64, &mut ebuf)?;
        let e = ExpertRecord::decode(&ebuf);
        let (first, end) = check_expert_place(&e, k as u32, epl, &header, nr)?;
        let regs: &[RegionRecord] = if keep {
            &regions[first..end]
        } else {
            if first < window_at || end > window_at + window.len() {
                let count = (CHUNK / REGION_RECORD_LEN).max(end - first).min(nr - first);
                let buf = &mut chunk[..count * REGION_RECORD_LEN];
                src.read_at((first * REGION_RECORD_LEN) as u64, buf)?;
                window.clear();
                window.extend(
                    buf.chunks_exact(REGION_RECORD_LEN)
                        .map(|b| RegionRecord::decode(b).0),
                );
                window_at = first;
            }
            &window[first - window_at..end - window_at]
        };
        check_expert(&e, k as u32, first, regs, &mut marks)?;
        if last_first.is_some_and(|p| e.first_region <= p) {
            return Err(Violation::BadExpert {
                record: k as u32,
                layer: e.layer,
                expert: e.expert,
                fault: EF::ExtentsOutOfOrder,
            }
            .into());
        }
        last_first = Some(e.first_region);
        if keep {
            experts.push(e);
        }
    }
    if let Some(i) = (0..nr).find(|&i| marks[i] == PROJECTION) {
        let mut rec = vec![0u8; REGION_RECORD_LEN];
        src.read_at((i * REGION_RECORD_LEN) as u64, &mut rec)?;
        let name = RegionRecord::decode(&rec).0.name;
        let name =
            std::str::from_utf8(&table[name.offset as usize..][..name.len as usize]).unwrap_or("");
        return Err(Violation::BadRegionRole {
            region: i as u32,
            name: name.to_string(),
            fault: RoleFault::Unlisted,
        }
        .into());
    }
    Ok(Index {
        header,
        footer,
        regions,
        experts,
        strings: table,
    })
}

fn check_region_placement(
    r: &RegionRecord,
    ri: u32,
    name: &str,
    expected: u64,
    data_end: u64,
) -> Result<(), Violation> {
    if r.offset % ALIGN != 0 {
        return Err(Violation::Misaligned {
            what: Aligned::RegionOffset {
                region: ri,
                name: name.to_string(),
            },
            value: r.offset,
        });
    }
    let end = r.offset.checked_add(r.length).and_then(align_up);
    if r.offset > data_end || end.is_none_or(|e| e > data_end) {
        return Err(Violation::RegionOutOfFile {
            region: ri,
            name: name.to_string(),
            offset: r.offset,
            len: r.length,
            end: data_end,
        });
    }
    if r.offset != expected {
        return Err(Violation::RegionPlacement {
            region: ri,
            name: name.to_string(),
            offset: r.offset,
            expected,
        });
    }
    Ok(())
}

pub(crate) fn check_region_type(r: &RegionRecord, ri: u32, name: &str) -> Result<(), Violation> {
    let Some(dtype) = Dtype::from_code(r.dtype) else {
        return Err(Violation::UnknownDtype {
            region: ri,
            code: r.dtype,
        });
    };
    let bad = |fault: ShapeFault| Violation::BadShape {
        region: ri,
        name: name.to_string(),
        fault,
    };
    if r.ndim as usize > MAX_RANK {
        return Err(bad(ShapeFault::RankOverLimit { rank: r.ndim }));
    }
    if r.shape[r.ndim as usize..].iter().any(|&d| d != 0) {
        return Err(bad(ShapeFault::DimsPastRank));
    }
    let shape = r.shape().to_vec();
    match dtype.byte_len(r.shape()) {
        Some(n) if n == r.length => Ok(()),
        Some(bytes) => Err(bad(ShapeFault::LengthMismatch {
            dtype,
            shape,
            bytes,
            length: r.length,
        })),
        None => {
            let block_elems = dtype.geometry().block_elems;
            if shape.last().copied().unwrap_or(1) % block_elems != 0 {
                Err(bad(ShapeFault::PartialBlock {
                    dtype,
                    shape,
                    block_elems,
                }))
            } else {
                Err(bad(ShapeFault::LengthOverflow { dtype, shape }))
            }
        }
    }
}

pub(crate) fn check_region_role(
    r: &RegionRecord,
    ri: u32,
    name: &str,
    h: &Header,
) -> Result<(), Violation> {
    let bad = |fault: RoleFault| Violation::BadRegionRole {
        region: ri,
        name: name.to_string(),
        fault,
    };
    let Some(role) = Role::from_code(r.role) else {
        return Err(bad(RoleFault::UnknownRole { code: r.role }));
    };
    let in_file = |l: u32| l >= h.layer_first && l - h.layer_first < h.layer_count;
    if r.layer != NONE && !in_file(r.layer) {
        return Err(bad(RoleFault::LayerOutsideFile {
            layer: r.layer,
            first: h.layer_first,
            end: u64::from(h.layer_first) + u64::from(h.layer_count),
        }));
    }
    if role == Role::Tensor {
        if r.expert != NONE {
            return Err(bad(RoleFault::TensorNamesExpert { expert: r.expert }));
        }
    } else if r.layer == NONE || r.expert >= h.experts_per_layer {
        return Err(bad(RoleFault::ProjectionOutsideGrid {
            layer: r.layer,
            expert: r.expert,
            experts_per_layer: h.experts_per_layer,
        }));
    }
    Ok(())
}

pub(crate) fn check_provenance(
    r: &RegionRecord,
    ri: u32,
    name: &str,
    src_file: &str,
    src_tensor: &str,
) -> Result<(), Violation> {
    let bad = |fault: PF| Violation::BadProvenance {
        region: ri,
        name: name.to_string(),
        fault,
    };
    if r.src_dtype != r.dtype {
        return Err(bad(PF::DtypeDiffers {
            src_dtype: r.src_dtype,
            dtype: r.dtype,
        }));
    }
    if r.src_ndim as usize > MAX_RANK {
        return Err(bad(PF::SourceRankOverLimit {
            src_ndim: r.src_ndim,
        }));
    }
    if r.src_shape[r.src_ndim as usize..].iter().any(|&d| d != 0) {
        return Err(bad(PF::SourceDimsPastRank {
            src_ndim: r.src_ndim,
        }));
    }
    if src_file.is_empty() {
        if !src_tensor.is_empty() || r.src_begin != 0 || r.src_end != 0 || r.src_ndim != 0 {
            return Err(bad(PF::FieldsWithoutFile));
        }
        return Ok(());
    }
    if let Err(fault) = crate::source_path::check_source_path(src_file) {
        return Err(bad(PF::NotRelativePath {
            src_file: src_file.to_string(),
            fault,
        }));
    }
    if src_tensor.is_empty() {
        return Err(bad(PF::EmptyTensorName));
    }
    if r.src_end.checked_sub(r.src_begin) != Some(r.length) {
        return Err(bad(PF::RangeLength {
            begin: r.src_begin,
            end: r.src_end,
            length: r.length,
        }));
    }
    let dtype = Dtype::from_code(r.dtype).unwrap_or(Dtype::F32);
    match dtype.byte_len(r.src_shape()) {
        Some(n) if n >= r.length => Ok(()),
        _ => Err(bad(PF::ShapeTooSmall {
            shape: r.src_shape().to_vec(),
            length: r.length,
        })),
    }
}

/// The first of the region records `0..before` (read again from `src`) named by `name`.
fn first_named(
    src: &mut dyn IndexSource,
    name: StrRef,
    before: usize,
) -> Result<Option<usize>, CheckFault> {
    let mut rec = vec![0u8; REGION_RECORD_LEN];
    for i in 0..before {
        src.read_at((i * REGION_RECORD_LEN) as u64, &mut rec)?;
        if RegionRecord::decode(&rec).0.name == name {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// An expert record's grid position, region count and region range (`first..end`), checked.
fn check_expert_place(
    e: &ExpertRecord,
    k: u32,
    epl: u32,
    h: &Header,
    nr: usize,
) -> Result<(usize, usize), Violation> {
    let bad = |fault: EF| Violation::BadExpert {
        record: k,
        layer: e.layer,
        expert: e.expert,
        fault,
    };
    let (want_layer, want_expert) = (h.layer_first + k / epl, k % epl);
    if (e.layer, e.expert) != (want_layer, want_expert) {
        return Err(bad(EF::GridOrder {
            layer: want_layer,
            expert: want_expert,
        }));
    }
    if e.region_count == 0 || e.region_count > MAX_EXPERT_REGIONS {
        return Err(bad(EF::RegionCount {
            count: e.region_count,
        }));
    }
    let first = e.first_region as usize;
    let end = first + e.region_count as usize;
    if end > nr {
        return Err(bad(EF::RegionsPastEnd {
            first: first as u64,
            end: end as u64,
            regions: nr as u64,
        }));
    }
    Ok((first, end))
}

/// An expert record against its regions `regs` (`first..`): each claimed once (`OWNED`),
/// its own projections in role order, its extent and its digests.
fn check_expert(
    e: &ExpertRecord,
    k: u32,
    first: usize,
    regs: &[RegionRecord],
    marks: &mut [u8],
) -> Result<(), Violation> {
    let bad = |fault: EF| Violation::BadExpert {
        record: k,
        layer: e.layer,
        expert: e.expert,
        fault,
    };
    let mut prev_role = 0u32;
    let mut has = [false; 9];
    for (i, r) in regs.iter().enumerate() {
        let ri = first + i;
        if marks[ri] & OWNED != 0 {
            return Err(bad(EF::RegionShared { region: ri as u64 }));
        }
        marks[ri] |= OWNED;
        if (r.layer, r.expert) != (e.layer, e.expert) || r.role == Role::Tensor.code() {
            return Err(bad(EF::NotItsProjection {
                region: ri as u64,
                layer: r.layer,
                expert: r.expert,
                role: r.role,
            }));
        }
        if r.role <= prev_role {
            return Err(bad(EF::RolesNotIncreasing {
                region: ri as u64,
                role: r.role,
                previous: prev_role,
            }));
        }
        prev_role = r.role;
        has[r.role as usize] = true;
    }
    let (gu, g, u) = (
        Role::GateUp.code() as usize,
        Role::Gate.code() as usize,
        Role::Up.code() as usize,
    );
    if has[gu] && (has[g] || has[u]) {
        return Err(bad(EF::FusedBesideSplit));
    }
    let (gub, gb, ub) = (
        Role::GateUpBias.code() as usize,
        Role::GateBias.code() as usize,
        Role::UpBias.code() as usize,
    );
    if has[gub] && (has[gb] || has[ub]) {
        return Err(bad(EF::FusedBiasBesideSplit));
    }
    if !(1..=Role::Down.code() as usize).any(|r| has[r]) {
        return Err(bad(EF::NoWeight));
    }
    let extent_end = align_up(regs[regs.len() - 1].end()).unwrap_or(u64::MAX);
    let want_off = regs[0].offset;
    if e.extent_offset != want_off || e.extent_len != extent_end - want_off {
        return Err(bad(EF::ExtentMismatch {
            offset: e.extent_offset,
            len: e.extent_len,
            expected_offset: want_off,
            expected_len: extent_end - want_off,
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
    if d.blake3 != e.blake3 {
        return Err(Violation::ExpertDigestMismatch {
            layer: e.layer,
            expert: e.expert,
            algo: "blake3",
        });
    }
    if d.sha256 != e.sha256 {
        return Err(Violation::ExpertDigestMismatch {
            layer: e.layer,
            expert: e.expert,
            algo: "sha256",
        });
    }
    Ok(())
}
