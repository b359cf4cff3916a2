//! The tester: every backend × queue depth {1, 32, 256} × ring size streams every expert of a
//! model byte-identical to the pread reference, which itself equals `JnfReader::read_region`
//! region by region.

mod common;

use std::collections::BTreeSet;

use common::{backends, options, pread_reference, write_model, MODEL};
use tarfa_format::Role;
use tarfa_runtime::{BackendKind, ExpertSource};

#[test]
fn pread_reference_equals_read_region_bytes_and_the_generator() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    let reference = pread_reference(dir.path());
    let src = ExpertSource::open(dir.path(), &options(BackendKind::Pread, 1, 1)).expect("open");
    let model = src.model();
    assert_eq!(reference.len(), (MODEL.layers * MODEL.experts) as usize);
    for ((l, e), bytes) in &reference {
        let x = model.get(*l, *e).expect("expert");
        assert_eq!(bytes.len(), x.len);
        assert_eq!(x.len % 4096, 0);
        let reader = model.reader(x.file);
        for (r, role) in x.regions.iter().zip([Role::Gate, Role::Up, Role::Down]) {
            let region = reader.read_region(r.region).expect("read_region");
            assert_eq!(
                &bytes[r.start..r.start + r.len],
                &region[..],
                "({l}, {e}) region {}",
                r.region
            );
            assert_eq!(region, MODEL.projection_bytes(*l, *e, role));
        }
        // Padding after each region is zero (the reader's rule; read as part of the extent).
        let mut covered = vec![false; x.len];
        for r in &x.regions {
            covered[r.start..r.start + r.len]
                .iter_mut()
                .for_each(|c| *c = true);
        }
        assert!(bytes.iter().zip(&covered).all(|(b, c)| *c || *b == 0));
    }
}

#[test]
fn every_backend_queue_depth_and_ring_size_gives_the_pread_reference_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    let reference = pread_reference(dir.path());
    // Ask in a scrambled order, so completion order and request order both differ from the
    // file order.
    let mut wanted: Vec<(u32, u32)> = reference.keys().copied().collect();
    wanted.sort_by_key(|&(l, e)| (e * 7919 + l * 104729) % 97);
    for kind in backends() {
        for qd in [1u32, 32, 256] {
            for slots in [1u32, 7, 300] {
                for verify in [true, false] {
                    let mut o = options(kind, qd, slots);
                    o.verify = verify;
                    let mut src = ExpertSource::open(dir.path(), &o).expect("open");
                    assert_eq!(src.report().backend, kind);
                    let mut seen = BTreeSet::new();
                    for x in src.prefetch(&wanted).expect("prefetch") {
                        let x = x.unwrap_or_else(|e| panic!("{kind} qd {qd} slots {slots}: {e}"));
                        let key = (x.layer(), x.expert());
                        assert!(seen.insert(key), "{key:?} delivered twice");
                        assert!(
                            reference[&key] == x.bytes(),
                            "{kind} qd {qd} slots {slots} verify {verify}: {key:?} differs from pread"
                        );
                    }
                    assert_eq!(seen.len(), reference.len(), "{kind} qd {qd} slots {slots}");
                    assert_eq!(src.reads_in_flight(), 0);
                    assert_eq!(src.free_slots(), slots as usize);
                }
            }
        }
    }
}

#[test]
fn duplicates_in_a_request_are_read_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    for kind in backends() {
        let mut src = ExpertSource::open(dir.path(), &options(kind, 32, 8)).expect("open");
        let got: Vec<_> = src
            .prefetch(&[(0, 1), (2, 3), (0, 1), (2, 3), (1, 0)])
            .expect("prefetch")
            .map(|x| x.map(|x| (x.layer(), x.expert())).expect("expert"))
            .collect();
        let set: BTreeSet<_> = got.iter().copied().collect();
        assert_eq!(got.len(), 3, "{kind}");
        assert_eq!(set, [(0, 1), (1, 0), (2, 3)].into_iter().collect());
    }
}

#[test]
fn io_uring_runs_with_o_direct_and_fixed_buffers_where_the_kernel_has_them() {
    if !backends().contains(&BackendKind::IoUring) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    let src =
        ExpertSource::open(dir.path(), &tarfa_runtime::SourceOptions::default()).expect("open");
    let r = src.report();
    assert_eq!(r.backend, BackendKind::IoUring, "{r}");
    assert!(r.fixed_buffers, "{r}");
    assert!(r.direct_io, "{r}");
    assert!(r.fallback_reason.is_none());
    assert_eq!(r.slot_len % 4096, 0);
    assert!(
        r.to_string()
            .starts_with("io_uring (O_DIRECT, fixed buffers, QD 64)"),
        "{r}"
    );
}
