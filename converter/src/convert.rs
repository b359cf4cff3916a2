//! The conversion itself: plan, then for each selected layer either skip it (its file is present,
//! made from this source, and every hash checks) or write it, then publish the manifest last.
//! Files are published atomically and independently, so a run killed at any moment resumes where
//! it stopped, and `--layers 0-11` then `--layers 12-47` gives the same bytes as `--layers 0-47`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tarfa_format::hash::DualHasher;
use tarfa_format::layout::{align_up, Footer, Header, RegionRecord, FOOTER_LEN};
use tarfa_format::manifest::{
    self, layer_file_name, Architecture, Conversion, FileEntry, FileKind, Manifest, SourceFile,
    SourceIdentity, SourceRead, TRUNK_NAME,
};
use tarfa_format::reader::{scan_index, ScannedIndex};
use tarfa_format::writer::WriterOptions;
use tarfa_format::{FileLayout, JnfWriter, Provenance, RegionSpec};

use crate::error::{ConvertError, OutputFault, SourceFault};
use crate::gguf_source;
use crate::output_dir;
use crate::plan::{plan, Item, LayerPlan, Plan};
use crate::source::Checkpoint;

/// The aux files that make up the tokenizer, in the order the manifest lists them.
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
];
/// The other files copied verbatim from the source directory when present.
pub const CONFIG_FILES: &[&str] = &["config.json", "generation_config.json"];

/// Every aux file name: configs, then the tokenizer.
pub(crate) fn aux_files() -> impl Iterator<Item = &'static str> {
    CONFIG_FILES.iter().chain(TOKENIZER_FILES).copied()
}
/// Largest aux file copied (a tokenizer.json of a big vocabulary is tens of MB).
pub(crate) const MAX_AUX_LEN: u64 = 256 << 20;
/// Space kept free beyond what a file needs.
const SPACE_MARGIN: u64 = 16 << 20;

/// What to convert and how.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Inclusive layer range; `None` for every layer.
    pub layers: Option<(u32, u32)>,
    /// Write with `O_DIRECT` where the filesystem allows.
    pub direct_io: bool,
    /// Files converted at once (0: half the cores, 1 to 4). Each file is written by one thread
    /// front to back; more at once keep the disk and the hashing cores busy together. The bytes
    /// of every file are the same for any value.
    pub jobs: usize,
}

impl Options {
    /// The number of files converted at once.
    pub fn effective_jobs(&self) -> usize {
        if self.jobs > 0 {
            return self.jobs;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).clamp(1, 4)
    }
}

/// Progress callbacks (by bytes); the binary draws bars, tests count.
pub trait Progress: Sync {
    /// The conversion will write up to `bytes` of region data in `files` files.
    fn start(&self, _bytes: u64, _files: usize) {}
    /// A file begins.
    fn file_start(&self, _label: &str, _bytes: u64) {}
    /// `n` more source bytes were copied.
    fn advance(&self, _n: u64) {}
    /// A file was written or skipped.
    fn file_done(&self, _label: &str, _outcome: &Outcome) {}
}

/// No progress output.
#[derive(Debug)]
pub struct Quiet;
impl Progress for Quiet {}

/// What happened to one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Written now.
    Written {
        /// Region bytes.
        bytes: u64,
        /// A file of that name was there and did not check against this source (damaged, or the
        /// source changed since): it was replaced.
        replaced: bool,
    },
    /// Already present from this source, every hash checked.
    Skipped,
}

/// The result of a conversion.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Summary {
    /// Layers written by this run.
    pub layers_written: Vec<u32>,
    /// Layers in range already present, their hashes and source bytes checked.
    pub layers_skipped: Vec<u32>,
    /// Layers written by this run over a file of theirs that did not check against this source
    /// (damaged, or the source changed since): repaired.
    pub layers_replaced: Vec<u32>,
    /// Whether this run wrote the trunk.
    pub trunk_written: bool,
    /// Whether the trunk written replaced one that did not check.
    pub trunk_replaced: bool,
    /// Layers present in the output after this run.
    pub layers_present: Vec<u32>,
    /// Layers of the whole model.
    pub num_layers: u32,
    /// Experts in the layers written.
    pub experts_written: u64,
    /// Region bytes written.
    pub bytes_written: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Expert layout per written layer: `"per-expert"`, `"fused"` or dense (empty).
    pub expert_layouts: Vec<(u32, String)>,
    /// Trunk tensors with names tarfa does not recognise (kept).
    pub unrecognised: Vec<String>,
    /// Tensors under `experts.E.` that are no known projection (kept as plain tensors).
    pub loose_expert_tensors: Vec<String>,
    /// Whether every file this run wrote was written with `O_DIRECT` (false when it was not
    /// asked for, or the filesystem refused it for some file and the writer fell back to the page
    /// cache); with nothing written, whether it was asked for.
    pub direct_io: bool,
}

/// Parse `A-B` or `A` into an inclusive range.
pub fn parse_layer_range(s: &str) -> Result<(u32, u32), ConvertError> {
    let bad = || ConvertError::Usage(format!("--layers {s:?}: expected A-B or A (e.g. 0-47)"));
    let (a, b) = match s.split_once('-') {
        Some((a, b)) => (a.trim(), b.trim()),
        None => (s.trim(), s.trim()),
    };
    let (a, b): (u32, u32) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
    if a > b {
        return Err(ConvertError::Usage(format!(
            "--layers {s}: the range is empty ({a} > {b})"
        )));
    }
    Ok((a, b))
}

fn free_space(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

fn file_size_estimate(unit: Unit<'_>, experts: usize) -> u64 {
    let (mut data, mut strings, mut count) = (0u64, 0u64, 0u64);
    for i in unit.items() {
        data += i.slice.len().div_ceil(4096) * 4096;
        strings += (i.name.len() + i.slice.tensor.len() + 64) as u64;
        count += 1;
    }
    let index = 288 * count + 96 * experts as u64 + strings;
    4096 + data + index.div_ceil(4096) * 4096 + 4096
}

/// The items of one file, in write order, made afresh on each pass: an expert of a fused stack
/// is made when its turn comes, so no pass holds a layer's million items.
#[derive(Clone, Copy)]
enum Unit<'p> {
    /// The trunk's tensors.
    Trunk(&'p [Item]),
    /// One layer's.
    Layer(&'p LayerPlan),
}

impl<'p> Unit<'p> {
    fn items(self) -> Box<dyn Iterator<Item = Cow<'p, Item>> + 'p> {
        match self {
            Unit::Trunk(items) => Box::new(items.iter().map(Cow::Borrowed)),
            Unit::Layer(lp) => Box::new(lp.items()),
        }
    }
}

/// Space promised to files being written at once, so that two of them cannot both count on the
/// same free bytes.
#[derive(Debug, Default)]
struct Reservations(std::sync::Mutex<u64>);

/// Space held for one file until it is published (then it shows in the free space itself).
struct Reserved<'a> {
    pool: &'a Reservations,
    bytes: u64,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        *self.pool.0.lock().unwrap_or_else(|e| e.into_inner()) -= self.bytes;
    }
}

impl Reservations {
    /// Reserve `needed` bytes in `out` for `what`, or say there is not enough space.
    fn reserve(&self, out: &Path, what: &str, needed: u64) -> Result<Reserved<'_>, ConvertError> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(available) = free_space(out) {
            let want = needed + SPACE_MARGIN + *held;
            if available < want {
                return Err(ConvertError::NoSpace {
                    dir: out.to_path_buf(),
                    what: what.to_string(),
                    needed: want,
                    file: needed,
                    held: *held,
                    margin: SPACE_MARGIN,
                    available,
                });
            }
        }
        *held += needed;
        Ok(Reserved {
            pool: self,
            bytes: needed,
        })
    }
}

/// A `Read` that reports the bytes it passes on.
struct Counted<'a, R> {
    inner: R,
    progress: &'a dyn Progress,
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.advance(n as u64);
        Ok(n)
    }
}

struct Ctx<'a> {
    ck: &'a Checkpoint,
    out: &'a Path,
    progress: &'a dyn Progress,
    writer_options: WriterOptions,
    space: Reservations,
    /// Cleared when a file was written through the page cache (see [`Summary::direct_io`]).
    all_direct: AtomicBool,
}

impl Ctx<'_> {
    fn spec(&self, item: &Item, layer: Option<u32>) -> RegionSpec {
        RegionSpec {
            name: item.name.clone(),
            dtype: item.slice.dtype,
            shape: item.slice.shape.clone(),
            layer,
            source: Some(Provenance {
                file: self.ck.shards[item.slice.shard].rel.clone(),
                tensor: item.slice.tensor.clone(),
                begin: item.slice.begin,
                shape: item.slice.src_shape.clone(),
            }),
        }
    }

    fn reader(&self, item: &Item) -> Counted<'_, crate::source::RangeReader<'_>> {
        Counted {
            inner: self
                .ck
                .reader(item.slice.shard, item.slice.begin, item.slice.end),
            progress: self.progress,
        }
    }

    /// The writer's error while it wrote `item`, named as the source's fault when reading the
    /// source failed (the writer names the JNF file it writes; the fault is the source file's).
    fn source_fault(&self, item: &Item, e: tarfa_format::Error) -> ConvertError {
        let source = match e {
            tarfa_format::Error::Io {
                op: tarfa_format::writer::READ_SOURCE_OP,
                source,
                ..
            } => source,
            tarfa_format::Error::Usage {
                fault: fault @ tarfa_format::error::UsageFault::SourceShort { .. },
                ..
            } => std::io::Error::new(std::io::ErrorKind::UnexpectedEof, fault.to_string()),
            e => return e.into(),
        };
        ConvertError::SourceRead {
            path: self.ck.shards[item.slice.shard].path.clone(),
            tensor: item.slice.tensor.clone(),
            source,
        }
    }

    /// Does the region record `rec` (its strings in `table`) hold `item`, from this source?
    fn region_matches(
        &self,
        item: &Item,
        rec: &RegionRecord,
        table: &[u8],
        layer: Option<u32>,
    ) -> bool {
        let spec = self.spec(item, layer);
        let src = spec.source.as_ref();
        rec.name.get(table) == item.name
            && rec.role == item.role.code()
            && rec.dtype() == Some(item.slice.dtype)
            && rec.shape() == item.slice.shape.as_slice()
            && rec.src_begin == item.slice.begin
            && rec.src_end == item.slice.end
            && rec.src_shape() == item.slice.src_shape.as_slice()
            && src.is_some_and(|s| {
                rec.src_file.get(table) == s.file && rec.src_tensor.get(table) == s.tensor
            })
    }

    /// Check the JNF file at `path` as the reader does, a region at a time (no region record is
    /// kept: a layer of millions of regions costs its string table): whether its regions are
    /// exactly `unit`'s items from this source, its header, footer and root, and its
    /// `tensors_blake3` per source file.
    fn scan(
        &self,
        path: &Path,
        unit: Unit<'_>,
        layer: Option<u32>,
    ) -> Result<Scanned, ConvertError> {
        let mut items = unit.items();
        let mut same = true;
        let mut digests = manifest::TensorsBlake3::default();
        let index = tarfa_format::reader::scan_index(path, &mut |_, rec, table| {
            digests.add(rec.src_file.get(table), &rec.blake3);
            same = same
                && items
                    .next()
                    .is_some_and(|item| self.region_matches(&item, rec, table, layer));
        })?;
        let same = same && items.next().is_none();
        Ok(Scanned {
            same,
            index,
            reads: digests.finish(),
        })
    }

    /// Is `path` already this file, with every byte checked? One [`scan_index`] pass checks the
    /// file's structure as the reader does and, record by record as they come (none is kept: a
    /// layer of millions of regions costs its string table), that each region is the plan's item
    /// from this source, that its bytes hash to its recorded SHA-256 and BLAKE3 with zero padding
    /// after them, and that its source range still hashes to its BLAKE3 (a source changed since,
    /// such as a fine-tune or re-download with the same headers, is caught and its file
    /// rewritten); then that no record is missing, the header's layout, and the padding after the
    /// index. The first check that fails stops the reading (the scan itself runs to its end).
    /// It reads the file and the source but writes nothing.
    fn present_and_verified(
        &self,
        path: &Path,
        layout: FileLayout,
        unit: Unit<'_>,
        layer: Option<u32>,
    ) -> bool {
        let Ok(tarfa_format::fsio::RegularFile { file, .. }) =
            tarfa_format::fsio::open_regular(path)
        else {
            return false;
        };
        let mut items = unit.items();
        let mut buf = vec![0u8; 4 << 20];
        let mut ok = true;
        let scanned = scan_index(path, &mut |_, rec, table| {
            ok = ok
                && items.next().is_some_and(|item| {
                    self.region_matches(&item, rec, table, layer)
                        && region_bytes_check(&file, rec, &mut buf)
                        && self.source_hashes_to(&item, &rec.blake3, &mut buf)
                });
        });
        match scanned {
            Ok(ix) => {
                ok && items.next().is_none()
                    && layout_matches(&ix.header, layout)
                    && index_padding_zero(&file, &ix.footer)
            }
            Err(_) => false,
        }
    }

    /// Does `item`'s source range still hash to `want` (its region's recorded BLAKE3)? A read
    /// error counts as no. `buf`: scratch.
    fn source_hashes_to(&self, item: &Item, want: &[u8; 32], buf: &mut [u8]) -> bool {
        let mut h = blake3::Hasher::new();
        let mut src = self
            .ck
            .reader(item.slice.shard, item.slice.begin, item.slice.end);
        loop {
            match src.read(buf) {
                Ok(0) => break h.finalize().as_bytes() == want,
                Ok(n) => {
                    h.update(&buf[..n]);
                }
                Err(_) => break false,
            }
        }
    }

    /// For each shard in `shards`, the first item of it whose source range no longer hashes to
    /// its region's recorded BLAKE3 (a read error counts as a mismatch), from one
    /// [`scan_index`] pass over `path` (a file [`Self::scan`] found to hold exactly `unit`'s
    /// items); a shard found once is not read further.
    fn first_source_mismatches(
        &self,
        path: &Path,
        unit: Unit<'_>,
        shards: &BTreeSet<usize>,
    ) -> Result<BTreeMap<usize, Item>, ConvertError> {
        let mut buf = vec![0u8; 4 << 20];
        let mut items = unit.items();
        let mut found = BTreeMap::new();
        scan_index(path, &mut |_, rec, _| {
            let Some(item) = items.next() else { return };
            let s = item.slice.shard;
            if shards.contains(&s)
                && !found.contains_key(&s)
                && !self.source_hashes_to(&item, &rec.blake3, &mut buf)
            {
                found.insert(s, item.into_owned());
            }
        })?;
        Ok(found)
    }

    /// Hold the layer files of earlier runs that this run keeps (present, not `selected`) to the
    /// source as it is now (spec §8.2). For each source file a layer read, the identity the
    /// manifest recorded for that layer (when it lists this very file) is compared with the
    /// source's identity now: equal, the layer stands; different or unrecorded (a touched,
    /// copied or rewritten source; a file a killed run left unlisted; an older tarfa's manifest),
    /// its source ranges are hashed again and compared with its regions' BLAKE3s. A layer made
    /// from other bytes refuses the run, naming the source file, the earliest such layer and
    /// tensor, and every such layer; the layers that pass take this run's identity in the
    /// manifest. Reads only.
    fn check_kept_layers(
        &self,
        plan: &Plan,
        selected: &[u32],
        old: Option<&Manifest>,
        ids: &[SourceIdentity],
    ) -> Result<(), ConvertError> {
        let mut stale: Vec<(u32, usize, String)> = Vec::new();
        for (&layer, lp) in &plan.layers {
            let path = self.out.join(layer_file_name(layer));
            if selected.contains(&layer) || !path.exists() {
                continue;
            }
            let unit = Unit::Layer(lp);
            let layout = FileLayout::layer(layer, lp.experts.len() as u32);
            let scanned = self.scan(&path, unit, Some(layer))?;
            if !(scanned.same && layout_matches(&scanned.index.header, layout)) {
                return Err(not_ours(&path));
            }
            let root = &scanned.index.root;
            let entry = old.and_then(|m| m.layer_file(layer)).filter(|e| {
                e.sha256 == hex::encode(root.sha256) && e.blake3 == hex::encode(root.blake3)
            });
            // The shards whose recorded identity is not theirs now: their ranges are hashed
            // again, in one more pass over the index.
            let shards: BTreeSet<usize> = unit
                .items()
                .map(|i| i.slice.shard)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter(|&s| {
                    let recorded = entry
                        .and_then(|e| e.sources.as_ref())
                        .and_then(|v| v.iter().find(|x| x.path == self.ck.shards[s].rel))
                        .map(|x| x.identity());
                    recorded != Some(ids[s])
                })
                .collect();
            if shards.is_empty() {
                continue;
            }
            // The first shard (in order) with a mismatch, as when each was hashed in turn.
            let found = self.first_source_mismatches(&path, unit, &shards)?;
            if let Some((s, item)) = found.into_iter().next() {
                stale.push((layer, s, item.slice.tensor));
            }
        }
        match stale.first() {
            None => Ok(()),
            Some((layer, s, tensor)) => {
                let layers: Vec<u32> = stale.iter().map(|(l, _, _)| *l).collect();
                Err(ConvertError::SourceChanged {
                    shard: self.ck.shards[*s].path.clone(),
                    layer: *layer,
                    file: layer_file_name(*layer),
                    tensor: tensor.clone(),
                    layers: manifest::layer_ranges(&layers),
                })
            }
        }
    }

    fn write_trunk(&self, plan: &Plan) -> Result<Outcome, ConvertError> {
        let path = self.out.join(TRUNK_NAME);
        let unit = Unit::Trunk(&plan.trunk);
        let bytes: u64 = plan.trunk.iter().map(|i| i.slice.len()).sum();
        self.progress.file_start(TRUNK_NAME, bytes);
        let replaced = path.symlink_metadata().is_ok();
        if self.present_and_verified(&path, FileLayout::trunk(), unit, None) {
            self.progress.file_done(TRUNK_NAME, &Outcome::Skipped);
            return Ok(Outcome::Skipped);
        }
        let _space = self
            .space
            .reserve(self.out, TRUNK_NAME, file_size_estimate(unit, 0))?;
        let mut w = JnfWriter::create_with(&path, FileLayout::trunk(), self.writer_options)?;
        for item in &plan.trunk {
            w.tensor(&self.spec(item, None), &mut self.reader(item))
                .map_err(|e| self.source_fault(item, e))?;
        }
        let written = w.finish()?;
        if !written.direct_io {
            self.all_direct.store(false, Ordering::Relaxed);
        }
        let outcome = Outcome::Written { bytes, replaced };
        self.progress.file_done(TRUNK_NAME, &outcome);
        Ok(outcome)
    }

    fn write_layer(&self, layer: u32, lp: &LayerPlan) -> Result<Outcome, ConvertError> {
        let name = layer_file_name(layer);
        let path = self.out.join(&name);
        let layout = FileLayout::layer(layer, lp.experts.len() as u32);
        let unit = Unit::Layer(lp);
        let bytes = lp.data_bytes();
        self.progress.file_start(&name, bytes);
        let replaced = path.symlink_metadata().is_ok();
        if self.present_and_verified(&path, layout, unit, Some(layer)) {
            self.progress.file_done(&name, &Outcome::Skipped);
            return Ok(Outcome::Skipped);
        }
        let _space =
            self.space
                .reserve(self.out, &name, file_size_estimate(unit, lp.experts.len()))?;
        let mut w = JnfWriter::create_with(&path, layout, self.writer_options)?;
        for item in &lp.plain {
            w.tensor(&self.spec(item, Some(layer)), &mut self.reader(item))
                .map_err(|e| self.source_fault(item, e))?;
        }
        for e in 0..lp.experts.len() {
            let mut x = w.begin_expert(layer, e as u32)?;
            for item in lp.experts.expert(e) {
                x.projection(
                    item.role,
                    &self.spec(&item, Some(layer)),
                    &mut self.reader(&item),
                )
                .map_err(|e| self.source_fault(&item, e))?;
            }
            w = x.end_expert()?;
        }
        let written = w.finish()?;
        if !written.direct_io {
            self.all_direct.store(false, Ordering::Relaxed);
        }
        let outcome = Outcome::Written { bytes, replaced };
        self.progress.file_done(&name, &outcome);
        Ok(outcome)
    }
}

/// What [`Ctx::scan`] found.
struct Scanned {
    /// The regions are the plan's items, from this source.
    same: bool,
    /// Header, footer, root.
    index: ScannedIndex,
    /// `tensors_blake3` per source file.
    reads: Vec<(String, [u8; 32])>,
}

fn layout_matches(h: &Header, layout: FileLayout) -> bool {
    (h.layer_first, h.layer_count, h.experts_per_layer)
        == (
            layout.layer_first,
            layout.layer_count,
            layout.experts_per_layer,
        )
}

/// Do the bytes of the region `rec` (checked by [`scan_index`]: within the file's data) hash to its
/// recorded SHA-256 and BLAKE3, and is the padding after it zero? As
/// [`tarfa_format::JnfReader::verify_data`] checks each region. `buf`: scratch.
fn region_bytes_check(file: &std::fs::File, rec: &RegionRecord, buf: &mut [u8]) -> bool {
    let mut h = DualHasher::new();
    let mut at = rec.offset;
    while at < rec.end() {
        let n = buf.len().min((rec.end() - at) as usize);
        if file.read_exact_at(&mut buf[..n], at).is_err() {
            return false;
        }
        h.update(&buf[..n]);
        at += n as u64;
    }
    let d = h.finish();
    if (d.sha256, d.blake3) != (rec.sha256, rec.blake3) {
        return false;
    }
    let pad = (align_up(rec.end()).unwrap_or(rec.end()) - rec.end()) as usize;
    file.read_exact_at(&mut buf[..pad], rec.end()).is_ok() && buf[..pad].iter().all(|&b| b == 0)
}

/// Is the padding between the index and the footer zero (read from `file`, checked by
/// [`scan_index`] as `footer`)? As [`tarfa_format::JnfReader::verify_data`] checks it.
fn index_padding_zero(file: &std::fs::File, footer: &Footer) -> bool {
    let index_end = footer.index_offset + footer.index_len;
    let mut pad = vec![0u8; (footer.file_len - FOOTER_LEN as u64 - index_end) as usize];
    file.read_exact_at(&mut pad, index_end).is_ok() && pad.iter().all(|&b| b == 0)
}

/// A layer file whose index is not what this checkpoint gives.
fn not_ours(path: &Path) -> ConvertError {
    ConvertError::BadOutput {
        path: path.to_path_buf(),
        fault: OutputFault::NotFromThisSource,
    }
}

/// Is `path` (which may not exist yet) strictly inside directory `dir`? Compared by canonical
/// paths: `path`'s nearest existing ancestor is resolved, the rest appended.
fn inside_dir(path: &Path, dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let absolute = match std::path::absolute(path) {
        Ok(p) => p,
        Err(_) => return false,
    };
    let mut rest = Vec::new();
    let mut base = absolute.as_path();
    let resolved = loop {
        match base.canonicalize() {
            Ok(b) => break b,
            Err(_) => match (base.parent(), base.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    base = parent;
                }
                _ => return false,
            },
        }
    };
    let full = rest.iter().rev().fold(resolved, |p, n| p.join(n));
    full != dir && full.starts_with(&dir)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

fn copy_aux(ck: &Checkpoint, out: &Path) -> Result<Vec<FileEntry>, ConvertError> {
    let mut entries = Vec::new();
    for name in aux_files() {
        let src = ck.dir.join(name);
        let dest = out.join(name);
        let Some(bytes) = tarfa_format::fsio::read_regular_if_exists(&src, MAX_AUX_LEN)? else {
            // A copy of an aux file the source no longer has (`output_dir::check` vetted it as
            // ours): the manifest will not list it, so it goes.
            if dest.exists() {
                std::fs::remove_file(&dest).map_err(|source| ConvertError::Io {
                    path: dest.clone(),
                    op: "remove",
                    source,
                })?;
            }
            continue;
        };
        let same = tarfa_format::fsio::read_regular(&dest, bytes.len() as u64)
            .is_ok_and(|here| here == bytes);
        if !same {
            tarfa_format::publish::write_atomic(&dest, &bytes)?;
        }
        let h = tarfa_format::hash::dual_hash(&bytes);
        entries.push(FileEntry {
            path: name.to_string(),
            kind: FileKind::Aux,
            layer: None,
            size: bytes.len() as u64,
            sha256: hex::encode(h.sha256),
            blake3: hex::encode(h.blake3),
            sources: None,
        });
    }
    Ok(entries)
}

/// The identity (`fstat` of the open file: of the bytes read through it) of every shard.
fn identities(ck: &Checkpoint) -> Result<Vec<SourceIdentity>, ConvertError> {
    ck.shards
        .iter()
        .map(|s| {
            s.file
                .metadata()
                .map(|m| SourceIdentity::of(&m))
                .map_err(|source| ConvertError::Io {
                    path: s.path.clone(),
                    op: "stat",
                    source,
                })
        })
        .collect()
}

fn sources(ck: &Checkpoint, ids: &[SourceIdentity]) -> Vec<SourceFile> {
    ck.shards
        .iter()
        .zip(ids)
        .map(|(s, id)| SourceFile {
            path: s.rel.clone(),
            size: s.len,
            sha256: None,
            header_sha256: Some(hex::encode(s.header_sha256)),
            mtime_ns: id.mtime_ns,
            ctime_ns: id.ctime_ns,
        })
        .collect()
}

/// The manifest entry of a JNF file every byte of which was checked against the sources as they
/// are now (`ids`, this run's identities): its `sources` record this run's identity of each.
fn jnf_entry(
    path: &Path,
    scanned: Scanned,
    kind: FileKind,
    layer: Option<u32>,
    ck: &Checkpoint,
    ids: &[SourceIdentity],
) -> Result<FileEntry, ConvertError> {
    let mut reads = Vec::new();
    for (file, digest) in scanned.reads {
        let Some(i) = ck.shards.iter().position(|s| s.rel == file) else {
            return Err(ConvertError::BadOutput {
                path: path.to_path_buf(),
                fault: OutputFault::TensorsOfOtherFile { file },
            });
        };
        reads.push((
            i,
            SourceRead {
                path: file,
                size: ids[i].size,
                mtime_ns: ids[i].mtime_ns,
                ctime_ns: ids[i].ctime_ns,
                tensors_blake3: hex::encode(digest),
            },
        ));
    }
    reads.sort_by_key(|(i, _)| *i);
    Ok(FileEntry {
        path: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        kind,
        layer,
        size: scanned.index.footer.file_len,
        sha256: hex::encode(scanned.index.root.sha256),
        blake3: hex::encode(scanned.index.root.blake3),
        sources: Some(reads.into_iter().map(|(_, r)| r).collect()),
    })
}

/// Convert `src` into the model directory `out`: an HF checkpoint directory, or a GGUF file (a
/// `.gguf` name or the GGUF magic; for a split set, any part).
pub fn convert(
    src: &Path,
    out: &Path,
    opts: &Options,
    progress: &dyn Progress,
) -> Result<Summary, ConvertError> {
    let t0 = Instant::now();
    if !src.exists() {
        return Err(ConvertError::Usage(format!(
            "{}: no such file or directory",
            src.display()
        )));
    }
    let gguf = gguf_source::is_gguf(src);
    let (ck, plan) = if gguf {
        let ck = gguf_source::open(src)?;
        let plan = crate::gguf_plan::plan(&ck)?;
        (ck, plan)
    } else {
        let ck = Checkpoint::open(src)?;
        let plan = plan(&ck)?;
        (ck, plan)
    };
    if let Some(s) = ck.shards.iter().find(|s| same_dir(&s.path, out)) {
        return Err(ConvertError::BadOutput {
            path: out.to_path_buf(),
            fault: OutputFault::IsSourceFile { rel: s.rel.clone() },
        });
    }
    if !gguf && same_dir(src, out) {
        return Err(ConvertError::BadOutput {
            path: out.to_path_buf(),
            fault: OutputFault::IsSourceDir,
        });
    }
    if !gguf && inside_dir(out, src) {
        return Err(ConvertError::BadOutput {
            path: out.to_path_buf(),
            fault: OutputFault::InsideSourceDir {
                src: src.to_path_buf(),
            },
        });
    }
    if out.symlink_metadata().is_ok() && !out.is_dir() {
        return Err(ConvertError::BadOutput {
            path: out.to_path_buf(),
            fault: OutputFault::NotADirectory,
        });
    }
    // A checkpoint without tensors, or without a layer, would convert to a model of nothing. (A
    // GGUF of trunk tensors alone is a test vector of types, fixtures/gguf/quants.gguf: kept.)
    let empty = if ck.tensors.is_empty() {
        Some(SourceFault::NoTensors)
    } else if plan.layers.is_empty() && !gguf {
        Some(SourceFault::NoLayers)
    } else {
        None
    };
    if let Some(fault) = empty {
        return Err(ConvertError::BadSource {
            path: src.to_path_buf(),
            fault,
        });
    }
    // A model directory holds only what its manifest lists (spec §8.3): the GGUF would be an
    // extra file that `tarfa verify` reports, so the model could never verify.
    if let Some(s) = ck.shards.first().filter(|_| gguf && same_dir(&ck.dir, out)) {
        return Err(ConvertError::BadOutput {
            path: out.to_path_buf(),
            fault: OutputFault::HoldsSource { rel: s.rel.clone() },
        });
    }
    // The sources' identities (size, mtime, ctime) as this run opened them: recorded in the
    // manifest, compared with earlier runs' to decide which kept layers to re-check, and again at
    // the end to catch a source changed while it was read (§8.2).
    let ids = identities(&ck)?;
    let srcs = sources(&ck, &ids);
    // Only into an empty directory or this source's own earlier output: every file there must
    // be one tarfa wrote. Checked before anything is created in it.
    output_dir::check(out, &ck, &|l| plan.layers.contains_key(&l), !gguf, &srcs)?;
    std::fs::create_dir_all(out).map_err(|source| ConvertError::Io {
        path: out.to_path_buf(),
        op: "create directory",
        source,
    })?;
    let _lock = output_dir::lock(out)?;
    output_dir::remove_leftovers(out, &ck)?;
    // The manifest of the last run (under the lock: no other run replaces it now).
    let old = Manifest::load(out).ok();
    let selected: Vec<u32> = match opts.layers {
        None => plan.layers.keys().copied().collect(),
        Some((a, b)) => {
            let s: Vec<u32> = plan.layers.range(a..=b).map(|(l, _)| *l).collect();
            if s.is_empty() {
                return Err(ConvertError::Usage(format!(
                    "--layers {a}-{b} selects no layer; the checkpoint has layers {:?}",
                    plan.layers.keys().collect::<Vec<_>>()
                )));
            }
            s
        }
    };
    let ctx = Ctx {
        ck: &ck,
        out,
        progress,
        writer_options: WriterOptions {
            direct_io: opts.direct_io,
        },
        space: Reservations::default(),
        all_direct: AtomicBool::new(true),
    };
    // Layers of earlier runs that this run keeps must be of the source as it is now, before
    // anything is written.
    ctx.check_kept_layers(&plan, &selected, old.as_ref(), &ids)?;
    let total: u64 = plan.trunk.iter().map(|i| i.slice.len()).sum::<u64>()
        + selected
            .iter()
            .map(|l| plan.layers[l].data_bytes())
            .sum::<u64>();
    progress.start(total, selected.len() + 1);

    let mut summary = Summary {
        num_layers: plan.num_layers,
        unrecognised: plan.unrecognised.clone(),
        loose_expert_tensors: plan.loose_expert_tensors.clone(),
        direct_io: opts.direct_io,
        ..Summary::default()
    };
    // A GGUF holds its tokenizer and config in its key/values: no aux files.
    let mut files = if gguf {
        Vec::new()
    } else {
        copy_aux(&ck, out)?
    };
    // The trunk and the selected layers, `jobs` files at once. Each file is published on its
    // own, so a failure or a kill leaves only complete files behind, whatever the interleaving.
    let units: Vec<Option<u32>> = std::iter::once(None)
        .chain(selected.iter().copied().map(Some))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    // Each worker returns its own results (no shared list behind a lock that a panic could
    // poison and so lose one); a worker's panic is raised again here by `join`.
    let mut results: Vec<(usize, Result<Outcome, ConvertError>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..opts.effective_jobs().min(units.len()))
            .map(|_| {
                scope.spawn(|| {
                    use std::sync::atomic::Ordering::Relaxed;
                    let mut mine = Vec::new();
                    while !failed.load(Relaxed) {
                        let i = next.fetch_add(1, Relaxed);
                        let Some(unit) = units.get(i) else { break };
                        let r = match unit {
                            None => ctx.write_trunk(&plan),
                            Some(l) => ctx.write_layer(*l, &plan.layers[l]),
                        };
                        failed.fetch_or(r.is_err(), Relaxed);
                        mine.push((i, r));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    if let Some(pos) = results.iter().position(|(_, r)| r.is_err()) {
        if let (_, Err(e)) = results.swap_remove(pos) {
            return Err(e);
        }
    }
    for (i, r) in results {
        let outcome = r?;
        let Some(layer) = units[i] else {
            if let Outcome::Written { bytes, replaced } = outcome {
                summary.trunk_written = true;
                summary.trunk_replaced = replaced;
                summary.bytes_written += bytes;
            }
            continue;
        };
        let lp = &plan.layers[&layer];
        match outcome {
            Outcome::Written { bytes, replaced } => {
                summary.layers_written.push(layer);
                if replaced {
                    summary.layers_replaced.push(layer);
                }
                summary.bytes_written += bytes;
                summary.experts_written += lp.experts.len() as u64;
                summary
                    .expert_layouts
                    .push((layer, lp.expert_layout.to_string()));
            }
            Outcome::Skipped => summary.layers_skipped.push(layer),
        }
    }

    summary.direct_io = opts.direct_io && ctx.all_direct.load(Ordering::Relaxed);

    // The manifest lists every layer file present that was made from this source: this run's and
    // earlier runs'. Files of other layers are checked against the plan by their index.
    // A source that changed while this run read it (an unfinished download, an edit) may have
    // given some files old bytes and others new: publish no manifest over them.
    let now = identities(&ck)?;
    if let Some(i) = (0..ids.len()).find(|&i| now[i] != ids[i]) {
        return Err(ConvertError::BadSource {
            path: ck.shards[i].path.clone(),
            fault: SourceFault::ChangedWhileConverting {
                was: ids[i].to_string(),
                now: now[i].to_string(),
            },
        });
    }
    let trunk = out.join(TRUNK_NAME);
    let scanned = ctx.scan(&trunk, Unit::Trunk(&plan.trunk), None)?;
    files.push(jnf_entry(
        &trunk,
        scanned,
        FileKind::Trunk,
        None,
        &ck,
        &ids,
    )?);
    let mut present = BTreeSet::new();
    for (&layer, lp) in &plan.layers {
        let path = out.join(layer_file_name(layer));
        if !path.exists() {
            continue;
        }
        // One pass over the index, keeping no region record, checks it against the plan and
        // digests its sources.
        let scanned = ctx.scan(&path, Unit::Layer(lp), Some(layer))?;
        let layout = FileLayout::layer(layer, lp.experts.len() as u32);
        if !(scanned.same && layout_matches(&scanned.index.header, layout)) {
            return Err(not_ours(&path));
        }
        files.push(jnf_entry(
            &path,
            scanned,
            FileKind::Layer,
            Some(layer),
            &ck,
            &ids,
        )?);
        present.insert(layer);
    }
    let tokenizer = TOKENIZER_FILES
        .iter()
        .filter(|t| files.iter().any(|f| f.path == **t))
        .map(|t| t.to_string())
        .collect();
    let m = Manifest {
        format: manifest::FORMAT_NAME.into(),
        format_version: [1, 0],
        architecture: Architecture {
            source_format: if gguf { "gguf" } else { "safetensors" }.into(),
            config: ck.config.clone(),
            num_layers: plan.num_layers,
        },
        tokenizer,
        layers: present.iter().copied().collect(),
        files,
        conversion: Conversion {
            tool: "tarfa".into(),
            tool_version: env!("CARGO_PKG_VERSION").into(),
            sources: srcs,
        },
    };
    m.publish(out)?;
    summary.layers_present = m.layers;
    summary.seconds = t0.elapsed().as_secs_f64();
    Ok(summary)
}
