//! The GPU path: without CUDA (no `cuda` feature, no driver, no device) the runtime says CUDA is
//! absent, never panics; with a GPU, every landed expert reaches VRAM byte-identical, and a slot
//! stays out of the ring while its copy may run. Where there is no GPU (CI never builds the
//! feature) the GPU tests skip through `tarfa_testtools` (`Tool::Gpu`: a `SKIPPED (hardware)` line,
//! logged for `scripts/test.sh`), and fail instead under `TARFA_REQUIRE_GPU=1` (the GPU machine's
//! runs set it), as decode/tests/gpu.rs does.

mod common;

use common::{backends, options, pread_reference, write_model};
use tarfa_runtime::bench::stream_sets_to_gpu;
use tarfa_runtime::{CudaError, DeviceSink, ExpertSource, Gpu, CUDA_BUILT};
use tarfa_testtools::{available, Tool};

/// The GPU, or `None` after checking that its absence is said clearly (and skipping, or failing
/// under `TARFA_REQUIRE_GPU=1`).
#[track_caller]
fn gpu_or_skip() -> Option<Gpu> {
    let probe = Gpu::open(0).map_err(|e| {
        let msg = e.to_string();
        assert!(matches!(e, CudaError::Absent(_)), "not 'absent': {msg}");
        assert!(msg.starts_with("CUDA is absent: "), "{msg}");
        if !CUDA_BUILT {
            assert!(msg.contains("built without CUDA"), "{msg}");
        }
        msg
    });
    available(Tool::Gpu, probe)
}

#[test]
fn without_a_gpu_cuda_is_said_absent() {
    if let Some(g) = gpu_or_skip() {
        eprintln!("GPU present: {} (device {})", g.name(), g.ordinal());
    }
}

#[test]
fn landed_experts_reach_vram_byte_identical_and_slots_wait_for_their_copy() {
    let Some(gpu) = gpu_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    let want = pread_reference(dir.path());
    for kind in backends() {
        for qd in [1, 32] {
            let mut src = ExpertSource::open(dir.path(), &options(kind, qd, 0)).expect("open");
            let slots = src.slots() as usize;
            let ring = std::sync::Arc::clone(src.ring());
            let mut sink = DeviceSink::new(&gpu, &ring, 4).expect("sink");
            assert!(ring.cuda_registered());
            let all: Vec<_> = src.model().all().into_iter().collect();
            for &(l, e) in &all {
                let x = src.read_expert(l, e).expect("read");
                let (slot, len) = (x.slot(), x.bytes().len());
                sink.copy_expert(x).expect("copy");
                // The slot is held by the copy until its completion is observed.
                assert_eq!(sink.in_flight(), 1);
                assert_eq!(ring.free_count(), slots - 1);
                let got = sink.read_back(slot, len).expect("read back");
                assert_eq!(sink.in_flight(), 0);
                assert_eq!(ring.free_count(), slots);
                assert!(
                    got == want[&(l, e)],
                    "{kind} qd {qd}: ({l}, {e}) differs on the GPU"
                );
            }
            // Streamed: every set lands, is copied, and every slot comes back.
            let sets = vec![all.clone(), all];
            let f = stream_sets_to_gpu(&mut src, &sets, &mut sink).expect("stream");
            assert_eq!(f.experts as usize, want.len() * 2);
            assert_eq!(ring.free_count(), slots);
            let h2d = sink.bench_h2d(2).expect("h2d");
            assert!(h2d.gb_per_s() > 0.0);
            assert_eq!(ring.free_count(), slots);
        }
    }
}
