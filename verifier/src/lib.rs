//! # tarfa-verifier
//!
//! The proof that a model directory *is* its checkpoint (`tarfa verify DIR [--source SRC]`,
//! `tarfa convert … --verify`): every byte of every JNF file is read from the disk once
//! (`O_DIRECT` where allowed), every region's SHA-256 and BLAKE3, every expert digest, the index
//! hash and each file's root digest are recomputed, padding is checked zero, every region is
//! compared byte for byte with the source file its provenance names, and the manifest is held to
//! the directory (every listed file present with its size and hash, nothing extra). Each fault
//! names the file, tensor, layer, expert, projection, the first faulty byte and the two hashes.
//!
//! The model is also held to be whole: every layer of its config and the trunk present, and with
//! a source every byte of every source tensor in some region (`coverage`); a model that is a part
//! is reported incomplete, naming what is missing.
//!
//! - [`scan`]: one file, every byte;
//! - [`report`]: faults and totals.

#![forbid(unsafe_code)]

mod coverage;
pub mod report;
pub mod scan;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rayon::prelude::*;
use tarfa_format::manifest::{FileKind, Manifest, CONVERT_LOCK_NAME, MANIFEST_NAME};

pub use report::{Fault, FaultKind, Report};

/// What to check.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The source checkpoint directory to compare every region with.
    pub source: Option<PathBuf>,
    /// Read only these layers' files (inclusive range); structure and manifest are still checked
    /// for every file.
    pub layers: Option<(u32, u32)>,
    /// Read only the `n`-th of `N` groups of files (`(n, N)`, 1-based), as restic's
    /// `--read-data-subset n/N`: N runs with n = 1..N read every file once.
    pub sample: Option<(u32, u32)>,
    /// Read with `O_DIRECT` where the filesystem allows.
    pub direct_io: bool,
    /// The model is expected to be a part (`tarfa convert --layers A-B --verify` checks the
    /// piece it wrote): layers missing from it, and source tensors of those layers, are not
    /// faults. A missing trunk still is.
    pub partial: bool,
}

/// Progress callbacks, by bytes.
pub trait Progress: Sync {
    /// About `bytes` will be read.
    fn start(&self, _bytes: u64) {}
    /// `n` more bytes were read.
    fn advance(&self, _n: u64) {}
    /// One file is done.
    fn file_done(&self, _file: &str, _faults: usize) {}
}

/// No progress output.
#[derive(Debug)]
pub struct Quiet;
impl Progress for Quiet {}

/// Why verification could not run at all (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The model directory is not a directory.
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// The source directory is not a directory.
    #[error("{}: source is not a directory", .0.display())]
    NoSource(PathBuf),
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
}

/// Parse `n/N` (1 ≤ n ≤ N).
pub fn parse_sample(s: &str) -> Result<(u32, u32), VerifyError> {
    let bad = || {
        VerifyError::Usage(format!(
            "--sample {s:?}: expected n/N with 1 <= n <= N, e.g. 1/10"
        ))
    };
    let (n, total) = s.split_once('/').ok_or_else(bad)?;
    let (n, total): (u32, u32) = (
        n.trim().parse().map_err(|_| bad())?,
        total.trim().parse().map_err(|_| bad())?,
    );
    if n == 0 || n > total {
        return Err(bad());
    }
    Ok((n, total))
}

/// The hashes of the regular file `path`, read up to one byte past `limit` (its size in the
/// manifest): a longer file is a size fault already, and a link to `/dev/zero` is no file.
fn hash_file(path: &Path, limit: u64) -> std::io::Result<tarfa_format::DualHash> {
    use std::io::Read;
    let mut f = tarfa_format::fsio::open_regular(path)?
        .file
        .take(limit.saturating_add(1));
    let mut h = tarfa_format::hash::DualHasher::new();
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finish());
        }
        h.update(&buf[..n]);
    }
}

/// The SHA-256 of a safetensors file's header (8-byte length + JSON), as the converter records it.
fn safetensors_header_sha256(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    use std::os::unix::fs::FileExt;
    let tarfa_format::fsio::RegularFile { file: f, len } = tarfa_format::fsio::open_regular(path)?;
    let mut n8 = [0u8; 8];
    f.read_exact_at(&mut n8, 0)?;
    // The one parser's rule (and limit) for the length, so that convert and verify hash the same
    // header.
    let n = tarfa_format::safetensors::safetensors_header_len(&n8, len)
        .map_err(|fault| std::io::Error::new(std::io::ErrorKind::InvalidData, fault))?;
    let mut header = vec![0u8; n as usize];
    f.read_exact_at(&mut header, 8)?;
    let mut h = sha2::Sha256::new();
    h.update(n8);
    h.update(&header);
    Ok(hex::encode(h.finalize()))
}

/// The SHA-256 of a GGUF part's header: its bytes `0..data_start` (header and padding), as the
/// converter records it. The header is parsed with the hardened reader first.
fn gguf_header_sha256(path: &Path) -> std::io::Result<String> {
    use sha2::Digest;
    use tarfa_gguf::ByteSource;
    let src = tarfa_gguf::FileSource::open(path)?;
    let h = tarfa_gguf::read_header(&src).map_err(std::io::Error::other)?;
    let n = usize::try_from(h.data_start).map_err(std::io::Error::other)?;
    let mut head = vec![0u8; n];
    src.read_at(0, &mut head)?;
    Ok(hex::encode(sha2::Sha256::digest(&head)))
}

/// The header hash of a source file in the form `source_format` names.
fn source_header_sha256(source_format: &str, path: &Path) -> std::io::Result<String> {
    match source_format {
        "gguf" => gguf_header_sha256(path),
        _ => safetensors_header_sha256(path),
    }
}

/// Files whose manifest entry records another identity of a source file than the conversion's
/// (`conversion.sources[]`, or, where it records none, the first file's): one fault per such
/// file, naming its layer and the layers that agree with the conversion (spec §8.2). A converter
/// re-checks every kept layer whose source changed and records one identity, so a manifest of
/// two is a directory of two generations of a source, or one edited by hand.
fn mixed_sources(m: &Manifest) -> Vec<Fault> {
    use tarfa_format::manifest::SourceIdentity;
    let mut faults = Vec::new();
    for src in &m.conversion.sources {
        let reads: Vec<(&tarfa_format::manifest::FileEntry, SourceIdentity)> = m
            .files
            .iter()
            .filter_map(|f| {
                let r = f.sources.as_ref()?.iter().find(|r| r.path == src.path)?;
                Some((f, r.identity()))
            })
            .collect();
        let recorded = src.identity();
        let reference = if recorded.mtime_ns.is_some() || recorded.ctime_ns.is_some() {
            recorded
        } else {
            match reads.first() {
                Some((_, id)) => *id,
                None => continue,
            }
        };
        let agree: Vec<u32> = reads
            .iter()
            .filter(|(_, id)| *id == reference)
            .filter_map(|(f, _)| f.layer)
            .collect();
        for (f, id) in reads.iter().filter(|(_, id)| *id != reference) {
            let what = match f.layer {
                Some(l) => format!("layer {l}"),
                None => "the trunk".to_string(),
            };
            let mut x = Fault::new(
                FaultKind::MixedSources,
                &f.path,
                format!(
                    "{what} was checked against another version of source {} than the conversion records{}: the model mixes layers made from two versions of that file; reconvert the layers that differ (tarfa convert --layers), or verify against the source (--source) to see whose bytes it holds",
                    src.path,
                    if agree.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " (layers {} agree with it)",
                            tarfa_format::manifest::layer_ranges(&agree)
                        )
                    }
                ),
            );
            x.layer = f.layer;
            x.expected = Some(reference.to_string());
            x.actual = Some(id.to_string());
            faults.push(x);
        }
    }
    faults
}

/// Does the JNF file hold the source tensors its manifest entry's `sources` record (the same
/// source files, each with the same `tensors_blake3`)? Entries without `sources` (older
/// writers) are not checked.
fn source_record_fault(
    digests: &[(String, [u8; 32])],
    e: &tarfa_format::manifest::FileEntry,
) -> Option<Fault> {
    let reads = e.sources.as_ref()?;
    let held: Vec<(String, String)> = digests
        .iter()
        .map(|(p, d)| (p.clone(), hex::encode(d)))
        .collect();
    let mut recorded: Vec<(String, String)> = reads
        .iter()
        .map(|x| (x.path.clone(), x.tensors_blake3.clone()))
        .collect();
    let mut actual = held.clone();
    recorded.sort();
    actual.sort();
    if recorded == actual {
        return None;
    }
    let show = |v: &[(String, String)]| {
        v.iter()
            .map(|(p, d)| format!("{p}:{d}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut x = Fault::new(
        FaultKind::FileHash,
        &e.path,
        "the source tensors the manifest records for this file (files[].sources: source files and tensors_blake3) are not the ones its regions hold",
    );
    x.layer = e.layer;
    x.expected = Some(show(&recorded));
    x.actual = Some(show(&actual));
    Some(x)
}

/// Verify the model directory `dir`. A `source` that is a file (a GGUF, or one part of a split
/// set) stands for its directory, where the manifest's source paths are.
pub fn verify(dir: &Path, opts: &Options, progress: &dyn Progress) -> Result<Report, VerifyError> {
    let t0 = Instant::now();
    let opts = &Options {
        source: opts.source.as_ref().map(|s| match s.parent() {
            Some(p) if s.is_file() => {
                if p.as_os_str().is_empty() {
                    PathBuf::from(".")
                } else {
                    p.to_path_buf()
                }
            }
            _ => s.clone(),
        }),
        ..opts.clone()
    };
    if !dir.is_dir() {
        return Err(VerifyError::NotADirectory(dir.to_path_buf()));
    }
    if let Some(s) = &opts.source {
        if !s.is_dir() {
            return Err(VerifyError::NoSource(s.clone()));
        }
    }
    let mut report = Report {
        dir: dir.display().to_string(),
        source: opts.source.as_ref().map(|s| s.display().to_string()),
        sample: opts.sample.map(|(n, t)| format!("{n}/{t}")),
        ..Report::default()
    };
    let mut faults = Vec::new();

    // Which JNF files to check, with the layer each should hold and its manifest entry.
    let mut jnf: Vec<(
        String,
        Option<u32>,
        Option<tarfa_format::manifest::FileEntry>,
    )> = Vec::new();
    let mut listed = BTreeSet::new();
    let manifest = Manifest::load(dir);
    match &manifest {
        Ok(m) => {
            // The decoder layers missing (MTP layers after them may be left out).
            let required = m.architecture.required_layers();
            report.missing_layers = m
                .missing_layers()
                .into_iter()
                .filter(|&l| l < required)
                .collect();
            faults.extend(coverage::model_faults(m, opts.partial));
            faults.extend(coverage::config_file_faults(m, dir));
            faults.extend(mixed_sources(m));
            for f in &m.files {
                listed.insert(f.path.clone());
                let path = dir.join(&f.path);
                let Ok(meta) = std::fs::metadata(&path) else {
                    let mut x = Fault::new(
                        FaultKind::MissingFile,
                        &f.path,
                        "listed in the manifest, not in the directory",
                    );
                    x.layer = f.layer;
                    faults.push(x);
                    continue;
                };
                if meta.len() != f.size {
                    let mut x =
                        Fault::new(FaultKind::Size, &f.path, "size differs from the manifest");
                    x.expected = Some(f.size.to_string());
                    x.actual = Some(meta.len().to_string());
                    faults.push(x);
                }
                if f.kind == FileKind::Aux {
                    match hash_file(&path, f.size) {
                        Ok(h)
                            if hex::encode(h.sha256) == f.sha256
                                && hex::encode(h.blake3) == f.blake3 => {}
                        Ok(h) => {
                            let mut x = Fault::new(
                                FaultKind::FileHash,
                                &f.path,
                                "aux file differs from the manifest's hash",
                            );
                            x.expected = Some(f.sha256.clone());
                            x.actual = Some(hex::encode(h.sha256));
                            faults.push(x);
                        }
                        Err(e) => {
                            faults.push(Fault::new(FaultKind::ReadError, &f.path, e.to_string()))
                        }
                    }
                } else {
                    jnf.push((f.path.clone(), f.layer, Some(f.clone())));
                }
            }
            if let Some(src) = &opts.source {
                for s in &m.conversion.sources {
                    let p = src.join(&s.path);
                    match std::fs::metadata(&p) {
                        Err(_) => faults.push(Fault::new(
                            FaultKind::Source,
                            &s.path,
                            "source file the conversion read is missing",
                        )),
                        Ok(meta) if meta.len() != s.size => {
                            let mut x = Fault::new(
                                FaultKind::Source,
                                &s.path,
                                "source file size differs from the one converted",
                            );
                            x.expected = Some(s.size.to_string());
                            x.actual = Some(meta.len().to_string());
                            faults.push(x);
                        }
                        Ok(_) => {
                            if let Some(want) = &s.header_sha256 {
                                let got = source_header_sha256(&m.architecture.source_format, &p)
                                    .unwrap_or_else(|e| format!("unreadable: {e}"));
                                if &got != want {
                                    let mut x = Fault::new(
                                        FaultKind::Source,
                                        &s.path,
                                        "source header differs from the one converted",
                                    );
                                    x.expected = Some(want.clone());
                                    x.actual = Some(got);
                                    faults.push(x);
                                }
                            }
                        }
                    }
                }
            }
        }
        Err(e) => {
            // The fault names the file and its kind already: a manifest fault's own words only
            // (other errors, I/O ones, keep their path).
            let detail = match e {
                tarfa_format::Error::Manifest { fault, .. } => fault.to_string(),
                other => other.to_string(),
            };
            faults.push(Fault::new(FaultKind::Manifest, MANIFEST_NAME, detail));
            // Without a manifest, still check every JNF file on its own.
            if let Ok(rd) = std::fs::read_dir(dir) {
                let mut names: Vec<String> = rd
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".jnf") && !n.starts_with('.'))
                    .collect();
                names.sort();
                for n in names {
                    listed.insert(n.clone());
                    jnf.push((n, None, None));
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        // Hidden files too (a conversion's leftover temporaries among them): only the lock of a
        // conversion may be there unlisted.
        let mut extra: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != CONVERT_LOCK_NAME && n != MANIFEST_NAME && !listed.contains(n))
            .collect();
        extra.sort();
        for n in extra {
            faults.push(Fault::new(
                FaultKind::ExtraFile,
                n,
                "in the directory but not in the manifest",
            ));
        }
    }

    // Open every JNF file (structure); choose which to read in full.
    let mut to_read = Vec::new();
    let mut k = 0u32;
    let mut held = coverage::Provenances::default();
    for (name, layer, entry) in jnf {
        // One pass over the index, keeping no region record: a file of millions of regions costs
        // its string table here, and its records are read again, in order, by its scan.
        let path = dir.join(&name);
        let mut mine = coverage::Provenances::default();
        let mut digests = tarfa_format::manifest::TensorsBlake3::default();
        let r = match tarfa_format::reader::scan_index(&path, &mut |_, rec, table| {
            mine.add_record(rec, table);
            digests.add(rec.src_file.get(table), &rec.blake3);
        }) {
            Ok(r) => r,
            Err(tarfa_format::Error::Format { violation, .. }) => {
                let mut x = Fault::new(FaultKind::Structure, &name, violation.to_string());
                x.layer = layer;
                faults.push(x);
                continue;
            }
            Err(e) => {
                faults.push(Fault::new(FaultKind::ReadError, &name, e.to_string()));
                continue;
            }
        };
        held.merge(mine);
        let digests = digests.finish();
        if let Some(x) = entry
            .as_ref()
            .and_then(|e| source_record_fault(&digests, e))
        {
            faults.push(x);
        }
        let h = &r.header;
        let (want_first, want_count) = match layer {
            Some(l) => (l, 1),
            None if entry.is_some() => (0, 0),
            None => (h.layer_first, h.layer_count),
        };
        if (h.layer_first, h.layer_count) != (want_first, want_count) {
            let mut x = Fault::new(
                FaultKind::WrongLayer,
                &name,
                "the file's header holds other layers than its name and the manifest say",
            );
            x.expected = Some(format!("layers {want_first}+{want_count}"));
            x.actual = Some(format!("layers {}+{}", h.layer_first, h.layer_count));
            faults.push(x);
        }
        let in_layers = match (opts.layers, layer) {
            (None, _) => true,
            (Some((a, b)), Some(l)) => (a..=b).contains(&l),
            (Some(_), None) => false,
        };
        let in_sample = opts.sample.is_none_or(|(n, total)| {
            let g = k % total + 1;
            g == n
        });
        if in_layers {
            k += 1;
        }
        if in_layers && in_sample {
            to_read.push((name, entry, path, r));
        } else {
            // Not read in full this run, but still held to the manifest: the root digest that
            // opening it computed (header, footer, index hashes) must be the recorded one.
            report.files_structure_only += 1;
            if let Some(e) = &entry {
                let root = &r.root;
                if hex::encode(root.sha256) != e.sha256 || hex::encode(root.blake3) != e.blake3 {
                    let mut x = Fault::new(
                        FaultKind::FileHash,
                        name.as_str(),
                        "root digest differs from the manifest (file not read in full this run)",
                    );
                    x.layer = layer;
                    x.expected = Some(e.sha256.clone());
                    x.actual = Some(hex::encode(root.sha256));
                    faults.push(x);
                }
            }
        }
    }

    if let Ok(m) = &manifest {
        // A selection that reads nothing proves nothing: a mistake, not a pass.
        if to_read.is_empty() && (opts.layers.is_some() || opts.sample.is_some()) {
            let what = match (opts.layers, opts.sample) {
                (Some((a, b)), None) => format!("--layers {a}-{b}"),
                (None, Some((n, t))) => format!("--sample {n}/{t}"),
                (Some((a, b)), Some((n, t))) => format!("--layers {a}-{b} --sample {n}/{t}"),
                (None, None) => String::new(),
            };
            return Err(VerifyError::Usage(format!(
                "{what} selects no file to read: the model has {} file(s) and layers [{}]",
                report.files_structure_only,
                tarfa_format::manifest::layer_ranges(&m.layers)
            )));
        }
        if let (Some(src), false) = (&opts.source, opts.partial) {
            faults.extend(coverage::source_faults(m, src, &held));
        }
    }

    let total: u64 = to_read.iter().map(|(_, _, _, r)| r.footer.file_len).sum();
    progress.start(total);
    let on_bytes = |n: u64| progress.advance(n);
    // Each file's scan is returned, not pushed into shared state: there is no lock to poison and
    // no way to lose a file's faults. A check that panics is that file's fault (fail closed).
    let scanned = check_each(
        &to_read,
        |(name, entry, path, r)| {
            let mut sources = scan::Sources::new(opts.source.as_deref());
            let s = scan::scan_file(path, r, name, &mut sources, opts.direct_io, &on_bytes);
            let mut fs = s.faults.clone();
            if let (Some(e), Some(root)) = (entry, s.root) {
                if hex::encode(root.sha256) != e.sha256 || hex::encode(root.blake3) != e.blake3 {
                    let mut x = Fault::new(
                        FaultKind::FileHash,
                        name.as_str(),
                        "root digest of the bytes read differs from the manifest",
                    );
                    x.expected = Some(e.sha256.clone());
                    x.actual = Some(hex::encode(root.sha256));
                    fs.push(x);
                }
            }
            progress.file_done(name, fs.len());
            (Some(s), fs)
        },
        |(name, ..), panic| {
            let detail = format!(
                "the check of this file stopped on an internal error ({panic}): it is not verified"
            );
            (
                None,
                vec![Fault::new(FaultKind::Unchecked, name.as_str(), detail)],
            )
        },
    );
    // Every file read in full must have bypassed the page cache for the report to say so.
    report.direct_io = opts.direct_io;
    for (s, fs) in scanned {
        faults.extend(fs);
        let Some(s) = s else { continue };
        report.files_read += 1;
        report.bytes_read += s.bytes_read;
        report.regions_checked += s.regions;
        report.experts_checked += s.experts;
        report.source_bytes_compared += s.source_bytes;
        report.direct_io &= s.direct;
    }
    faults
        .sort_by(|a, b| (&a.file, a.offset, a.kind as u8).cmp(&(&b.file, b.offset, b.kind as u8)));
    report.faults = faults;
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// `check` of every item, in parallel, one result per item in `items` order — fail closed: a
/// check that panics (a bug; input never should) gives `on_panic(item, message)` for its item,
/// so neither the run nor the item's result is lost, and no other item's result is touched.
fn check_each<I: Sync, T: Send>(
    items: &[I],
    check: impl Fn(&I) -> T + Sync,
    on_panic: impl Fn(&I, String) -> T + Sync,
) -> Vec<T> {
    items
        .par_iter()
        .map(|item| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(item))).unwrap_or_else(
                |payload| {
                    let message = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".to_string());
                    on_panic(item, message)
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::check_each;

    /// Review finding 11: the per-file collector keeps every file's result, and a check that
    /// panics is a result of its own (a fault), never a file silently left out of the report.
    #[test]
    fn a_check_that_panics_is_its_items_failure_and_every_other_result_is_kept() {
        let items: Vec<u32> = (0..64).collect();
        let results = check_each(
            &items,
            |&i| {
                assert!(i % 7 != 3, "injected failure checking item {i}");
                Ok(i * 10)
            },
            |&i, message| Err((i, message)),
        );
        assert_eq!(results.len(), items.len(), "a result was lost");
        for (&i, r) in items.iter().zip(&results) {
            match r {
                Ok(v) => assert_eq!(*v, i * 10),
                Err((j, message)) => {
                    assert_eq!((i % 7, *j), (3, i));
                    assert!(message.contains(&format!("checking item {i}")), "{message}");
                }
            }
        }
        assert_eq!(results.iter().filter(|r| r.is_err()).count(), 9);
    }
}
