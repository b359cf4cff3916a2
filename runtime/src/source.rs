//! [`ExpertSource`]: a model's experts, a pinned ring sized to the largest one, and the backend
//! chosen at start-up (probe, forced choice, or the CI rule that forbids a silent fallback).

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use crate::backend::{BackendKind, MmapCopy, PreadPool, ReadBackend, UnknownBackendName};
use crate::error::StreamError;
use crate::model::{io_err, ModelExperts};
use crate::pinned::{PinState, PinnedRing};
use crate::prefetch::{LandedExpert, Prefetch};

/// Environment variable that forces a backend: `io_uring`, `pread`, `mmap` or `auto`.
pub const ENV_BACKEND: &str = "TARFA_IO_BACKEND";
/// Environment variable that, when `1` (or `true`, `yes`), makes a fallback from io_uring an
/// error: for CI, so that a runner without io_uring cannot pass on the pread path unnoticed.
pub const ENV_REQUIRE_IO_URING: &str = "TARFA_REQUIRE_IO_URING";

/// Default reads in flight.
pub const DEFAULT_QUEUE_DEPTH: u32 = 64;

/// Which backend to run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// io_uring where it works, else pread (said in the report).
    #[default]
    Auto,
    /// This one or an error.
    Only(BackendKind),
}

impl std::str::FromStr for BackendChoice {
    type Err = UnknownBackendName;
    fn from_str(s: &str) -> Result<Self, UnknownBackendName> {
        if s == "auto" {
            return Ok(BackendChoice::Auto);
        }
        s.parse()
            .map(BackendChoice::Only)
            .map_err(|e: UnknownBackendName| UnknownBackendName {
                auto_allowed: true,
                ..e
            })
    }
}

/// How to open an [`ExpertSource`].
#[derive(Clone, Debug)]
pub struct SourceOptions {
    /// Backend.
    pub backend: BackendChoice,
    /// Fail instead of falling back from io_uring to pread.
    pub require_io_uring: bool,
    /// Reads in flight at most.
    pub queue_depth: u32,
    /// Ring slots; 0 = `queue_depth` + 16 (reads in flight plus experts being checked or held).
    pub slots: u32,
    /// Check each expert's BLAKE3 as it lands.
    pub verify: bool,
    /// `mlock` the ring (a refusal is a warning in the report).
    pub lock_memory: bool,
    /// Register the slots with io_uring as fixed buffers.
    pub fixed_buffers: bool,
    /// Read with `O_DIRECT` (io_uring and pread).
    pub direct_io: bool,
    /// Pretend io_uring cannot be set up (tests of the fallback and of the CI rule).
    #[doc(hidden)]
    pub simulate_no_io_uring: bool,
}

impl Default for SourceOptions {
    fn default() -> Self {
        SourceOptions {
            backend: BackendChoice::Auto,
            require_io_uring: false,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            slots: 0,
            verify: true,
            lock_memory: true,
            fixed_buffers: true,
            direct_io: true,
            simulate_no_io_uring: false,
        }
    }
}

impl SourceOptions {
    /// Defaults, with [`ENV_BACKEND`] and [`ENV_REQUIRE_IO_URING`] applied.
    pub fn from_env() -> Result<SourceOptions, StreamError> {
        let mut o = SourceOptions::default();
        if let Ok(v) = std::env::var(ENV_BACKEND) {
            o.backend = env_backend(v)?;
        }
        o.require_io_uring = require_io_uring_from_env();
        Ok(o)
    }

    fn slot_count(&self) -> u32 {
        if self.slots == 0 {
            self.queue_depth.max(1).saturating_add(16)
        } else {
            self.slots
        }
    }
}

/// The backend [`ENV_BACKEND`]'s value `v` names.
fn env_backend(v: String) -> Result<BackendChoice, StreamError> {
    v.parse().map_err(|_| StreamError::UnknownBackend {
        var: ENV_BACKEND,
        value: v,
    })
}

/// Whether [`ENV_REQUIRE_IO_URING`] is set to a true value.
pub fn require_io_uring_from_env() -> bool {
    std::env::var(ENV_REQUIRE_IO_URING)
        .map(|v| matches!(v.trim(), "1" | "true" | "yes"))
        .unwrap_or(false)
}

/// Can this process set up an io_uring that reads files (`READ`, `READ_FIXED`)? `Ok` with a
/// short description, or the reason it cannot.
pub fn probe_io_uring() -> Result<String, String> {
    #[cfg(target_os = "linux")]
    {
        use io_uring::{opcode, IoUring, Probe};
        let ring = IoUring::new(8).map_err(|e| format!("io_uring_setup failed: {e}"))?;
        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|e| format!("IORING_REGISTER_PROBE failed: {e}"))?;
        for (code, name) in [
            (opcode::ReadFixed::CODE, "READ_FIXED"),
            (opcode::Read::CODE, "READ"),
        ] {
            if !probe.is_supported(code) {
                return Err(format!("the kernel's io_uring lacks IORING_OP_{name}"));
            }
        }
        Ok("io_uring available (READ, READ_FIXED)".into())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err("io_uring is Linux-only".into())
    }
}

/// What runs, said once at start-up.
#[derive(Clone, Debug)]
pub struct SourceReport {
    /// The backend in use.
    pub backend: BackendKind,
    /// Why io_uring is not in use when it was the default choice.
    pub fallback_reason: Option<String>,
    /// Whether reads bypass the page cache.
    pub direct_io: bool,
    /// Whether io_uring reads use registered buffers.
    pub fixed_buffers: bool,
    /// Reads in flight at most.
    pub queue_depth: u32,
    /// io_uring submission queue entries.
    pub uring_entries: Option<u32>,
    /// Ring slots.
    pub slots: u32,
    /// Bytes per slot.
    pub slot_len: usize,
    /// Whether the ring is page-locked.
    pub pin: PinState,
    /// Whether experts are BLAKE3-checked as they land.
    pub verify: bool,
}

impl SourceReport {
    /// Things the user should hear about (a fallback, a refused mlock, buffered reads).
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if let Some(r) = &self.fallback_reason {
            w.push(format!(
                "io_uring unavailable ({r}); using the {} backend",
                self.backend
            ));
        }
        if let PinState::Unlocked { reason } = &self.pin {
            w.push(format!("expert ring is not page-locked: {reason}"));
        }
        if !self.direct_io && self.backend != BackendKind::Mmap {
            w.push("O_DIRECT refused by the filesystem; reading through the page cache".into());
        }
        w
    }
}

impl fmt::Display for SourceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.backend)?;
        let mut notes = Vec::new();
        if self.backend != BackendKind::Mmap {
            notes.push(
                if self.direct_io {
                    "O_DIRECT"
                } else {
                    "buffered"
                }
                .to_string(),
            );
        }
        if self.backend == BackendKind::IoUring {
            notes.push(
                if self.fixed_buffers {
                    "fixed buffers"
                } else {
                    "unregistered buffers"
                }
                .into(),
            );
        }
        notes.push(format!("QD {}", self.queue_depth));
        write!(f, " ({})", notes.join(", "))?;
        write!(
            f,
            "; ring {} × {:.1} MiB, {}; BLAKE3 check {}",
            self.slots,
            self.slot_len as f64 / (1 << 20) as f64,
            match self.pin {
                PinState::Locked => "mlock'd",
                PinState::Unlocked { .. } => "not locked",
                PinState::NotRequested => "pageable",
            },
            if self.verify { "on" } else { "off" }
        )
    }
}

/// A model's experts, readable into a pinned ring by the chosen backend.
#[derive(Debug)]
pub struct ExpertSource {
    // Drop order: the backend (which waits for its reads) before the files and the ring.
    pub(crate) backend: Box<dyn ReadBackend>,
    _files: Arc<Vec<File>>,
    pub(crate) ring: Arc<PinnedRing>,
    pub(crate) model: ModelExperts,
    pub(crate) queue_depth: usize,
    pub(crate) verify: bool,
    report: SourceReport,
}

impl ExpertSource {
    /// Open the model directory `dir` (manifest and layer files checked) and start a backend.
    pub fn open(dir: &Path, opts: &SourceOptions) -> Result<ExpertSource, StreamError> {
        Self::with_model(ModelExperts::open(dir)?, opts)
    }

    /// Start a backend over an opened model.
    pub fn with_model(
        model: ModelExperts,
        opts: &SourceOptions,
    ) -> Result<ExpertSource, StreamError> {
        if opts.queue_depth == 0 {
            return Err(StreamError::ZeroQueueDepth);
        }
        let slots = opts.slot_count();
        let ring = PinnedRing::new(slots, model.max_extent().max(1), opts.lock_memory)
            .map_err(|e| io_err(model.dir(), "allocate expert ring", e))?;
        let mut report = SourceReport {
            backend: BackendKind::Pread,
            fallback_reason: None,
            direct_io: false,
            fixed_buffers: false,
            queue_depth: opts.queue_depth,
            uring_entries: None,
            slots,
            slot_len: ring.slot_len(),
            pin: ring.pin_state().clone(),
            verify: opts.verify,
        };
        let want = match opts.backend {
            BackendChoice::Auto => BackendKind::IoUring,
            BackendChoice::Only(k) => k,
        };
        let (files, direct) = if want == BackendKind::Mmap {
            (Vec::new(), false)
        } else {
            model.open_files(opts.direct_io)?
        };
        let files = Arc::new(files);
        let backend: Box<dyn ReadBackend> = match want {
            BackendKind::IoUring => match start_uring(&model, &files, &ring, opts) {
                Ok(u) => {
                    report.backend = BackendKind::IoUring;
                    report.fixed_buffers = u.fixed_buffers();
                    report.uring_entries = Some(u.entries());
                    report.direct_io = direct;
                    Box::new(u)
                }
                Err(reason) => {
                    if opts.backend != BackendChoice::Auto || opts.require_io_uring {
                        let why = if opts.require_io_uring {
                            format!("{reason} (and {ENV_REQUIRE_IO_URING} forbids falling back)")
                        } else {
                            reason
                        };
                        return Err(StreamError::BackendUnavailable {
                            backend: "io_uring",
                            reason: why,
                        });
                    }
                    report.fallback_reason = Some(reason);
                    report.direct_io = direct;
                    Box::new(pread_pool(&model, &files, opts.queue_depth)?)
                }
            },
            BackendKind::Pread => {
                report.direct_io = direct;
                Box::new(pread_pool(&model, &files, opts.queue_depth)?)
            }
            BackendKind::Mmap => {
                let maps = (0..model.file_count() as u32)
                    .map(|f| {
                        let r = model.reader(f);
                        crate::mapped::FileMap::new(r.file(), r.path()).map_err(|source| {
                            StreamError::Io {
                                path: r.path().to_path_buf(),
                                op: "mmap",
                                source,
                            }
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Box::new(MmapCopy::new(maps))
            }
        };
        report.backend = backend.kind();
        Ok(ExpertSource {
            backend,
            _files: files,
            ring,
            model,
            queue_depth: opts.queue_depth as usize,
            verify: opts.verify,
            report,
        })
    }

    /// What runs.
    pub fn report(&self) -> &SourceReport {
        &self.report
    }

    /// The model's experts.
    pub fn model(&self) -> &ModelExperts {
        &self.model
    }

    /// The pinned ring the experts land in.
    pub fn ring(&self) -> &Arc<PinnedRing> {
        &self.ring
    }

    /// Ring slots in all.
    pub fn slots(&self) -> u32 {
        self.ring.slots()
    }

    /// Slots free: neither being read into nor held by the caller.
    pub fn free_slots(&self) -> usize {
        self.ring.free_count()
    }

    /// Reads the backend has started and not yet finished.
    pub fn reads_in_flight(&self) -> usize {
        self.backend.in_flight()
    }

    /// Ask for a set of experts (duplicates read once); the returned iterator yields each one
    /// as it lands and is checked, in completion order. Dropping it cancels what is left and
    /// waits for reads already started; an error ends it the same way.
    pub fn prefetch(&mut self, wanted: &[(u32, u32)]) -> Result<Prefetch<'_>, StreamError> {
        Prefetch::new(self, wanted)
    }

    /// Read one expert and wait for it.
    pub fn read_expert(&mut self, layer: u32, expert: u32) -> Result<LandedExpert, StreamError> {
        let mut p = self.prefetch(&[(layer, expert)])?;
        match p.next() {
            Some(r) => r,
            None => Err(StreamError::NoSuchExpert { layer, expert }),
        }
    }
}

fn pread_pool(
    model: &ModelExperts,
    files: &Arc<Vec<File>>,
    queue_depth: u32,
) -> Result<PreadPool, StreamError> {
    PreadPool::new(Arc::clone(files), queue_depth.min(256) as usize)
        .map_err(|e| io_err(model.dir(), "start pread threads", e))
}

fn start_uring(
    _model: &ModelExperts,
    files: &[File],
    ring: &Arc<PinnedRing>,
    opts: &SourceOptions,
) -> Result<crate::pinned::UringReads, String> {
    use std::os::fd::AsRawFd;
    if opts.simulate_no_io_uring {
        return Err("simulated: io_uring disabled for this test".into());
    }
    let fds: Vec<_> = files.iter().map(|f| f.as_raw_fd()).collect();
    crate::pinned::UringReads::new(opts.queue_depth, &fds, ring, opts.fixed_buffers)
        .map_err(|e| format!("io_uring setup failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_backend_in_the_environment_is_unknown_backend_naming_the_variable() {
        assert_eq!(
            env_backend("pread".into()).ok(),
            Some(BackendChoice::Only(BackendKind::Pread))
        );
        let e = env_backend("aio".into()).expect_err("aio is no backend");
        assert!(
            matches!(&e, StreamError::UnknownBackend { var: ENV_BACKEND, value } if value == "aio"),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "TARFA_IO_BACKEND=\"aio\" is not an I/O backend (expected auto, io_uring, pread or mmap)"
        );
    }
}
