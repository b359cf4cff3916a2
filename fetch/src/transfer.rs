//! Moving a [`Plan`]'s bytes: chunked, parallel, journalled, published atomically.
//!
//! The output is laid out in full before any data moves (header at 0, padding as zeros of a
//! sparse file), so each chunk has one fixed place: `pwrite` there, then a journal line
//! `done CHUNK BLAKE3`. The journal's first lines name the plan (a BLAKE3 over the header bytes,
//! the chunk list and the sources) and each source's validator. A rerun with the same plan and
//! validators re-hashes the chunks the journal lists, keeps those that still match and fetches
//! only the rest; a different plan or a changed source starts over, and so does a remote source
//! without a validator (no strong ETag, no Last-Modified), which cannot be shown unchanged.
//! Before publishing, every chunk is read back and compared with its journalled hash and the
//! output's header is re-parsed; then fsync, rename onto the destination, fsync the directory.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::error::{FetchError, Result};
use crate::http::Validator;
use crate::plan::{OutputFormat, Plan};

const JOURNAL_MAGIC: &str = "tarfa-fetch journal 1";
/// The longest `done CHUNK BLAKE3` line: 20 digits of a chunk number, 64 hex digits.
const JOURNAL_LINE_MAX: usize = "done  \n".len() + 20 + 64;

/// What one transfer worker did: the chunks it landed with their hashes, and its error if any.
type WorkerOutcome = (Vec<(usize, String)>, Option<FetchError>);

/// How a plan's bytes are moved.
#[derive(Clone, Copy, Debug)]
pub struct TransferOptions {
    /// Parallel range requests.
    pub jobs: usize,
    /// Largest chunk (one range request, one journal line).
    pub chunk_size: u64,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions {
            jobs: 4,
            chunk_size: 8 << 20,
        }
    }
}

/// Told how the transfer goes (the binary draws a progress bar with it).
pub trait Progress: Sync {
    /// Data bytes to move in all, and how many were already there from a killed run.
    fn start(&self, _total: u64, _resumed: u64) {}
    /// `n` more bytes landed.
    fn advance(&self, _n: u64) {}
    /// A remark for the user (a restart, a discarded chunk).
    fn note(&self, _msg: &str) {}
}

/// A [`Progress`] that says nothing.
#[derive(Debug, Default)]
pub struct Silent;
impl Progress for Silent {}

/// What a finished transfer did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransferReport {
    /// Chunks in the plan.
    pub chunks: usize,
    /// Chunks kept from a killed run (journal and hash agreed).
    pub chunks_resumed: usize,
    /// Tensor bytes kept from a killed run.
    pub bytes_resumed: u64,
    /// Tensor bytes fetched by this run.
    pub bytes_fetched: u64,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    source: usize,
    src: u64,
    dst: u64,
    len: u64,
}

fn chunks_of(plan: &Plan, chunk_size: u64) -> Vec<Chunk> {
    let size = chunk_size.max(1);
    let mut out = Vec::new();
    for t in &plan.tensors {
        let mut at = 0u64;
        let len = t.src.end - t.src.start;
        while at < len {
            let n = size.min(len - at);
            out.push(Chunk {
                source: t.source,
                src: t.src.start + at,
                dst: t.dst + at,
                len: n,
            });
            at += n;
        }
    }
    out
}

fn plan_id(plan: &Plan, chunks: &[Chunk]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(JOURNAL_MAGIC.as_bytes());
    h.update(&plan.total_len.to_le_bytes());
    h.update(&(plan.header.len() as u64).to_le_bytes());
    h.update(&plan.header);
    for s in &plan.sources {
        let name = s.source.name();
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&s.source.len().to_le_bytes());
    }
    for c in chunks {
        for v in [c.source as u64, c.src, c.dst, c.len] {
            h.update(&v.to_le_bytes());
        }
    }
    h.finalize().to_hex().to_string()
}

/// The partial file and the journal kept beside `out` while it is fetched.
pub fn partial_paths(out: &Path) -> (PathBuf, PathBuf) {
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (
        out.with_file_name(format!("{name}.tarfa-partial")),
        out.with_file_name(format!("{name}.tarfa-journal")),
    )
}

/// Journal lines are `key value…` with values free of newlines.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

fn journal_preamble(id: &str, plan: &Plan) -> String {
    let mut s = format!("{JOURNAL_MAGIC}\nplan {id}\n");
    for (i, src) in plan.sources.iter().enumerate() {
        s.push_str(&format!("source {i} {}\n", one_line(&src.validator)));
    }
    s
}

/// The chunks a journal lists as done, if its preamble is `preamble`; `Err(reason)` otherwise.
fn read_journal(
    text: &str,
    preamble: &str,
    n_chunks: usize,
) -> std::result::Result<HashMap<usize, String>, String> {
    let Some(rest) = text.strip_prefix(preamble) else {
        let old_plan = text.lines().nth(1).unwrap_or("");
        let new_plan = preamble.lines().nth(1).unwrap_or("");
        return Err(if old_plan != new_plan {
            "the partial file was for another selection or another version of the source".into()
        } else {
            "a source changed since the partial fetch began (its ETag / Last-Modified differs)"
                .into()
        });
    };
    let mut done = HashMap::new();
    // A line cut by a kill has no newline: `lines()` would still yield it, so split by '\n' and
    // drop the unterminated tail.
    let complete = rest.rsplit_once('\n').map_or("", |(head, _)| head);
    for line in complete.split('\n') {
        let mut it = line.split(' ');
        if let (Some("done"), Some(i), Some(hash), None) =
            (it.next(), it.next(), it.next(), it.next())
        {
            if let Ok(i) = i.parse::<usize>() {
                if i < n_chunks && hash.len() == 64 {
                    done.insert(i, hash.to_string());
                }
            }
        }
    }
    Ok(done)
}

fn lock(file: &File, path: &Path) -> Result<()> {
    use rustix::fs::{flock, FlockOperation};
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(FetchError::Locked {
            path: path.to_path_buf(),
        }),
        Err(e) => Err(FetchError::io(path, "lock")(e.into())),
    }
}

fn hash_at(file: &File, path: &Path, c: &Chunk, buf: &mut Vec<u8>) -> Result<String> {
    buf.resize(c.len as usize, 0);
    file.read_exact_at(buf, c.dst)
        .map_err(FetchError::io(path, "read back"))?;
    Ok(blake3::hash(buf).to_hex().to_string())
}

/// Device and inode of what `p` names, links followed; `None` when nothing is there.
fn file_id(p: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Refuse to write where a source file is: `out`, the partial file and the journal beside it
/// must not be, or link to, any of the plan's local inputs (compared by device and inode, so a
/// symlink, a hard link or another spelling of the path is caught too).
pub fn refuse_inputs(plan: &Plan, out: &Path) -> Result<()> {
    let (partial, journal) = partial_paths(out);
    let journal_new = journal.with_extension("tarfa-journal-new");
    let inputs: Vec<((u64, u64), &PathBuf)> = plan
        .inputs
        .iter()
        .filter_map(|p| file_id(p).map(|id| (id, p)))
        .collect();
    for path in [out.to_path_buf(), partial, journal, journal_new] {
        let Some(id) = file_id(&path) else { continue };
        if let Some((_, input)) = inputs.iter().find(|(i, _)| *i == id) {
            return Err(FetchError::OutputIsInput {
                path,
                input: input.to_path_buf(),
            });
        }
    }
    Ok(())
}

/// Space kept free beyond the output's bytes.
const SPACE_MARGIN: u64 = 16 << 20;

/// Refuse, before anything is fetched or written, an `out` that is a directory (or ends with
/// `/`: the published file would replace nothing but fail to rename, after the whole download)
/// and a filesystem without room for the bytes still to write.
pub fn refuse_unwritable(plan: &Plan, out: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    if out.is_dir() || out.as_os_str().as_bytes().ends_with(b"/") {
        return Err(FetchError::OutputIsDirectory {
            path: out.to_path_buf(),
        });
    }
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let (partial, _) = partial_paths(out);
    let have = std::fs::symlink_metadata(&partial)
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len().min(plan.total_len));
    let left = plan.total_len - have;
    if let Ok(st) = rustix::fs::statvfs(dir) {
        let available = st.f_bavail.saturating_mul(st.f_frsize);
        let needed = left.saturating_add(SPACE_MARGIN);
        if available < needed {
            return Err(FetchError::NoSpace {
                dir: dir.to_path_buf(),
                needed,
                total: plan.total_len,
                left,
                margin: SPACE_MARGIN,
                available,
            });
        }
    }
    Ok(())
}

/// Fetch `plan` into `out`, resuming a killed run's partial file when there is one. An `out`
/// that is a file of the source is refused before anything is written ([`refuse_inputs`]), and
/// so is a directory or a filesystem without room ([`refuse_unwritable`]).
pub fn run(
    plan: &Plan,
    out: &Path,
    opts: &TransferOptions,
    progress: &dyn Progress,
) -> Result<TransferReport> {
    refuse_inputs(plan, out)?;
    refuse_unwritable(plan, out)?;
    let (partial, journal_path) = partial_paths(out);
    let chunks = chunks_of(plan, opts.chunk_size);
    let id = plan_id(plan, &chunks);
    let preamble = journal_preamble(&id, plan);

    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&partial)
        .map_err(FetchError::io(&partial, "create"))?;
    lock(&file, &partial)?;

    // Without a validator the journal can name a source only by its name and length: a remote
    // replaced by one of the same length would keep the old chunks and splice in new ones.
    let unprovable = plan.sources.iter().any(|s| {
        s.remote
            .as_ref()
            .is_some_and(|r| *r.validator() == Validator::None)
    });
    // A journal holds its preamble and at most one line per chunk: anything longer is not ours.
    let journal_limit = (preamble.len() + chunks.len() * JOURNAL_LINE_MAX) as u64;
    let mut done = match tarfa_format::fsio::read_regular(&journal_path, journal_limit) {
        Ok(_) if unprovable => {
            progress.note(
                "starting over: the server gives no ETag or Last-Modified: \
                 cannot prove the remote is unchanged, fetching again",
            );
            HashMap::new()
        }
        Ok(bytes) => {
            match read_journal(&String::from_utf8_lossy(&bytes), &preamble, chunks.len()) {
                Ok(d) => d,
                Err(reason) => {
                    progress.note(&format!("starting over: {reason}"));
                    HashMap::new()
                }
            }
        }
        Err(e) if e.is_not_found() => HashMap::new(),
        Err(tarfa_format::fsio::FsError::TooLarge { limit, .. }) => {
            progress.note(&format!(
                "starting over: the journal is longer than the {limit} bytes this plan's can be"
            ));
            HashMap::new()
        }
        Err(e) => return Err(e.into()),
    };
    let file_len = file
        .metadata()
        .map_err(FetchError::io(&partial, "stat"))?
        .len();
    if done.is_empty() || file_len != plan.total_len {
        done.clear();
        file.set_len(0)
            .map_err(FetchError::io(&partial, "truncate"))?;
    }
    file.set_len(plan.total_len)
        .map_err(FetchError::io(&partial, "size"))?;
    file.write_all_at(&plan.header, 0)
        .map_err(FetchError::io(&partial, "write header"))?;

    // Keep what a killed run left only where its bytes still hash to the journal's record.
    let mut buf = Vec::new();
    let mut kept = HashMap::new();
    for (i, h) in &done {
        if hash_at(&file, &partial, &chunks[*i], &mut buf)? == *h {
            kept.insert(*i, h.clone());
        }
    }
    if kept.len() < done.len() {
        progress.note(&format!(
            "{} chunk(s) listed in the journal no longer match their hash; fetching them again",
            done.len() - kept.len()
        ));
    }
    // Rewrite the journal with only what was kept, atomically.
    let mut text = preamble.clone();
    for (i, h) in &kept {
        text.push_str(&format!("done {i} {h}\n"));
    }
    let tmp = journal_path.with_extension("tarfa-journal-new");
    std::fs::write(&tmp, &text).map_err(FetchError::io(&tmp, "write"))?;
    std::fs::rename(&tmp, &journal_path).map_err(FetchError::io(&journal_path, "rename"))?;
    let journal = Mutex::new(
        OpenOptions::new()
            .append(true)
            .open(&journal_path)
            .map_err(FetchError::io(&journal_path, "open"))?,
    );

    let total: u64 = chunks.iter().map(|c| c.len).sum();
    let resumed: u64 = kept.keys().map(|i| chunks[*i].len).sum();
    progress.start(total, resumed);
    let todo: Vec<usize> = (0..chunks.len())
        .filter(|i| !kept.contains_key(i))
        .collect();
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let jobs = opts.jobs.clamp(1, 64).min(todo.len().max(1));
    // Each worker returns the hashes it journalled and its error: no shared map or error slot
    // behind a lock that a panic could poison and so lose. A worker's panic is raised again here.
    let outcomes: Vec<WorkerOutcome> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..jobs)
            .map(|_| {
                s.spawn(|| {
                    let mut buf = Vec::new();
                    let mut landed = Vec::new();
                    while !failed.load(Ordering::Relaxed) {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&i) = todo.get(k) else { break };
                        let c = chunks[i];
                        let r = (|| -> Result<String> {
                            buf.resize(c.len as usize, 0);
                            let src = &plan.sources[c.source];
                            src.source.read_at(c.src, &mut buf).map_err(|e| {
                                FetchError::from_io(e, Path::new(&src.source.name()), "read")
                            })?;
                            let h = blake3::hash(&buf).to_hex().to_string();
                            file.write_all_at(&buf, c.dst)
                                .map_err(FetchError::io(&partial, "write"))?;
                            let line = format!("done {i} {h}\n");
                            journal
                                .lock()
                                .map_err(|_| {
                                    FetchError::io(&journal_path, "append")(std::io::Error::other(
                                        "poisoned",
                                    ))
                                })?
                                .write_all(line.as_bytes())
                                .map_err(FetchError::io(&journal_path, "append"))?;
                            progress.advance(c.len);
                            Ok(h)
                        })();
                        match r {
                            Ok(h) => landed.push((i, h)),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                return (landed, Some(e));
                            }
                        }
                    }
                    (landed, None)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut hashes = kept.clone();
    let mut first_error = None;
    for (landed, e) in outcomes {
        hashes.extend(landed);
        first_error = first_error.or(e);
    }
    if let Some(e) = first_error {
        return Err(e);
    }

    // Read every chunk back before the name goes live.
    for (i, c) in chunks.iter().enumerate() {
        let got = hash_at(&file, &partial, c, &mut buf)?;
        if hashes.get(&i) != Some(&got) {
            return Err(FetchError::Corrupt {
                path: partial.clone(),
                start: c.dst,
                end: c.dst + c.len,
            });
        }
    }
    check_output(plan, &partial)?;
    // The one publishing step of every writer (fsync, rename, fsync the directory); the partial
    // file is ours, not a `PendingFile`, because it outlives a killed run.
    tarfa_format::publish::publish_file(&file, &partial, out).map_err(|e| match e {
        tarfa_format::Error::Io { path, op, source } => FetchError::Io { path, op, source },
        other => FetchError::Io {
            path: out.to_path_buf(),
            op: "publish",
            source: std::io::Error::other(other),
        },
    })?;
    let _ = std::fs::remove_file(&journal_path);
    Ok(TransferReport {
        chunks: chunks.len(),
        chunks_resumed: kept.len(),
        bytes_resumed: resumed,
        bytes_fetched: total - resumed,
    })
}

/// The written file parses, with the tensors of the plan where the plan put them.
fn check_output(plan: &Plan, path: &Path) -> Result<()> {
    let src = tarfa_gguf::FileSource::open(path)?;
    let placed: Vec<(String, u64, u64)> = match plan.format {
        OutputFormat::Gguf => tarfa_gguf::read_header(&src)?
            .tensors
            .into_iter()
            .map(|t| (t.name, t.data_offset, t.byte_len))
            .collect(),
        OutputFormat::Safetensors => {
            let mut h = crate::safetensors::read_header(&src)?.tensors;
            h.sort_by_key(|t| t.begin);
            h.into_iter()
                .map(|t| (t.name, t.begin, t.end - t.begin))
                .collect()
        }
    };
    let mut want: Vec<(String, u64, u64)> = plan
        .tensors
        .iter()
        .map(|t| (t.name.clone(), t.dst, t.src.end - t.src.start))
        .collect();
    want.sort_by_key(|t| t.1);
    if placed != want {
        return Err(FetchError::BadOutput {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}
