//! Shared by the runtime tests: a model directory, the backends that can run here, and the
//! pread reference bytes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use tarfa_format::golden::TinyModel;
use tarfa_format::Dtype;
use tarfa_runtime::{probe_io_uring, BackendChoice, BackendKind, ExpertSource, SourceOptions};

/// 3 layers × 24 experts; each projection 40 × 56 BF16 = 4480 bytes: two pages, the second
/// mostly padding, so extents are 6 pages and region ends are not page-aligned.
pub const MODEL: TinyModel = TinyModel {
    layers: 3,
    experts: 24,
    hidden: 40,
    inter: 56,
    vocab: 64,
    expert_dtype: Dtype::BF16,
};

pub fn write_model(dir: &Path) {
    MODEL.write(dir).expect("write test model");
}

/// The backends to test here. io_uring only where this process can use it; where it cannot, the
/// io_uring part is skipped, saying so, or fails where tools are required (`tarfa_testtools`:
/// `TARFA_REQUIRE_IO_URING`, `TARFA_REQUIRE_TOOLS` or `CI`).
pub fn backends() -> Vec<BackendKind> {
    let mut v = vec![BackendKind::Pread, BackendKind::Mmap];
    if tarfa_testtools::available(tarfa_testtools::Tool::IoUring, probe_io_uring()).is_some() {
        v.insert(0, BackendKind::IoUring);
    }
    v
}

pub fn options(kind: BackendKind, queue_depth: u32, slots: u32) -> SourceOptions {
    SourceOptions {
        backend: BackendChoice::Only(kind),
        queue_depth,
        slots,
        ..SourceOptions::default()
    }
}

/// Every expert's extent bytes, read one at a time by the pread backend (QD 1, one slot).
pub fn pread_reference(dir: &Path) -> BTreeMap<(u32, u32), Vec<u8>> {
    let mut src = ExpertSource::open(dir, &options(BackendKind::Pread, 1, 1)).expect("open");
    let mut out = BTreeMap::new();
    for (l, e) in src.model().all() {
        let x = src.read_expert(l, e).expect("reference read");
        out.insert((l, e), x.bytes().to_vec());
    }
    out
}
