//! Faults: an expert corrupted on disk is an error that names it, never data; cancelling or
//! failing a prefetch leaves no slot in flight; a fallback from io_uring is reported, and is an
//! error when io_uring is required.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::{backends, options, write_model};
use tarfa_runtime::{
    BackendChoice, BackendKind, ExpertSource, SourceOptions, StreamError, UnknownBackendName,
};

/// Flip one byte inside the second region of expert (1, 5); returns the expert's extent offset.
fn corrupt(dir: &std::path::Path) -> u64 {
    let src = ExpertSource::open(dir, &options(BackendKind::Pread, 1, 1)).expect("open");
    let x = src.model().get(1, 5).expect("expert").clone();
    let path = src.model().path(x.file).to_path_buf();
    drop(src);
    let at = x.offset + x.regions[1].start as u64 + 17;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open rw");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    b[0] ^= 0x10;
    f.write_all_at(&b, at).expect("write");
    f.sync_all().expect("fsync");
    x.offset
}

#[test]
fn an_expert_corrupted_on_disk_is_an_error_naming_it_never_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    let offset = corrupt(dir.path());
    for kind in backends() {
        for qd in [1, 32, 256] {
            let mut src = ExpertSource::open(dir.path(), &options(kind, qd, 40)).expect("open");
            let all = src.model().all();
            let mut got_error = false;
            let mut delivered = 0;
            for x in src.prefetch(&all).expect("prefetch") {
                match x {
                    Ok(x) => {
                        assert_ne!(
                            (x.layer(), x.expert()),
                            (1, 5),
                            "{kind}: corrupt bytes handed out"
                        );
                        delivered += 1;
                    }
                    Err(e) => {
                        let msg = e.to_string();
                        match e {
                            StreamError::Corrupt {
                                layer,
                                expert,
                                path,
                                offset: o,
                                region,
                                ..
                            } => {
                                assert_eq!((layer, expert), (1, 5));
                                assert!(path.ends_with("layer-00001.jnf"), "{path:?}");
                                assert_eq!(o, offset);
                                let region = region.expect("the differing region is named");
                                assert!(region.contains("experts.5.up_proj"), "{region}");
                            }
                            other => panic!("{kind}: wrong error {other}"),
                        }
                        assert!(
                            msg.contains("layer 1, expert 5") && msg.contains("layer-00001.jnf"),
                            "{msg}"
                        );
                        assert!(msg.contains(&format!("offset {offset}")), "{msg}");
                        got_error = true;
                    }
                }
            }
            assert!(got_error, "{kind} qd {qd}: corruption not reported");
            assert!(delivered < all.len());
            assert_eq!(src.reads_in_flight(), 0, "{kind} qd {qd}");
            assert_eq!(src.free_slots(), 40, "{kind} qd {qd}");
            // Alone, too; and the clean experts still read.
            assert!(matches!(
                src.read_expert(1, 5),
                Err(StreamError::Corrupt { .. })
            ));
            assert!(src.read_expert(1, 4).is_ok());
        }
    }
}

#[test]
fn cancelling_a_prefetch_leaves_no_slot_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    for kind in backends() {
        for explicit in [false, true] {
            let mut src = ExpertSource::open(dir.path(), &options(kind, 32, 40)).expect("open");
            let all = src.model().all();
            let mut p = src.prefetch(&all).expect("prefetch");
            let held: Vec<_> = (&mut p).take(3).map(|x| x.expect("expert")).collect();
            assert!(p.remaining() > 0);
            if explicit {
                p.cancel();
            } else {
                drop(p);
            }
            assert_eq!(src.reads_in_flight(), 0, "{kind}");
            assert_eq!(
                src.free_slots(),
                40 - 3,
                "{kind}: only the held experts keep slots"
            );
            // Held experts stay readable after the cancel.
            assert!(held.iter().all(|x| x.bytes().len() == x.extent().len));
            drop(held);
            assert_eq!(src.free_slots(), 40);
            // The source is usable again.
            assert_eq!(src.prefetch(&all).expect("prefetch").count(), all.len());
        }
    }
}

#[test]
fn a_caller_holding_every_slot_gets_ring_exhausted_not_a_hang() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    for kind in backends() {
        let mut src = ExpertSource::open(dir.path(), &options(kind, 4, 2)).expect("open");
        let mut p = src.prefetch(&[(0, 0), (0, 1), (0, 2)]).expect("prefetch");
        let a = p.next().expect("first").expect("ok");
        let b = p.next().expect("second").expect("ok");
        assert!(matches!(
            p.next(),
            Some(Err(StreamError::RingExhausted { slots: 2 }))
        ));
        assert!(p.next().is_none());
        drop((a, b, p));
        assert_eq!(src.free_slots(), 2);
    }
}

#[test]
fn an_unknown_expert_is_refused_before_any_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    let mut src = ExpertSource::open(dir.path(), &options(BackendKind::Pread, 4, 4)).expect("open");
    let e = src.prefetch(&[(0, 0), (0, 24)]).expect_err("no expert 24");
    assert!(matches!(
        e,
        StreamError::NoSuchExpert {
            layer: 0,
            expert: 24
        }
    ));
    assert_eq!(src.reads_in_flight(), 0);
    assert_eq!(src.free_slots(), 4);
}

#[test]
fn a_fallback_from_io_uring_is_reported_and_is_an_error_when_io_uring_is_required() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    let no_uring = SourceOptions {
        simulate_no_io_uring: true,
        ..SourceOptions::default()
    };
    let src = ExpertSource::open(dir.path(), &no_uring).expect("auto falls back");
    let r = src.report();
    assert_eq!(r.backend, BackendKind::Pread);
    assert!(r
        .fallback_reason
        .as_deref()
        .is_some_and(|s| s.contains("simulated")));
    assert!(
        r.warnings()
            .iter()
            .any(|w| w.contains("io_uring unavailable")),
        "{:?}",
        r.warnings()
    );
    drop(src);
    let required = SourceOptions {
        require_io_uring: true,
        ..no_uring.clone()
    };
    let e = ExpertSource::open(dir.path(), &required).expect_err("required");
    assert!(
        matches!(
            e,
            StreamError::BackendUnavailable {
                backend: "io_uring",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("TARFA_REQUIRE_IO_URING"), "{e}");
    let forced = SourceOptions {
        backend: BackendChoice::Only(BackendKind::IoUring),
        ..no_uring
    };
    assert!(matches!(
        ExpertSource::open(dir.path(), &forced),
        Err(StreamError::BackendUnavailable {
            backend: "io_uring",
            ..
        })
    ));
    // Forcing another backend is not a fallback, required or not.
    let pread = SourceOptions {
        backend: BackendChoice::Only(BackendKind::Pread),
        require_io_uring: true,
        ..SourceOptions::default()
    };
    assert_eq!(
        ExpertSource::open(dir.path(), &pread)
            .expect("pread")
            .report()
            .backend,
        BackendKind::Pread
    );
}

#[test]
fn backend_names_parse_as_the_flag_and_env_var_take_them() {
    assert_eq!("auto".parse::<BackendChoice>(), Ok(BackendChoice::Auto));
    for k in BackendKind::ALL {
        assert_eq!(
            k.name().parse::<BackendChoice>(),
            Ok(BackendChoice::Only(k))
        );
    }
    assert_eq!(
        "aio".parse::<BackendChoice>(),
        Err(UnknownBackendName {
            name: "aio".into(),
            auto_allowed: true
        })
    );
    assert_eq!(
        "auto".parse::<BackendKind>(),
        Err(UnknownBackendName {
            name: "auto".into(),
            auto_allowed: false
        })
    );
    let e = "aio".parse::<BackendChoice>().expect_err("no such backend");
    assert_eq!(
        e.to_string(),
        "unknown I/O backend \"aio\" (expected auto, io_uring, pread or mmap)"
    );
}

#[test]
fn a_queue_depth_of_zero_is_zero_queue_depth_for_every_backend() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_model(dir.path());
    for kind in BackendKind::ALL {
        let e = ExpertSource::open(dir.path(), &options(kind, 0, 4)).expect_err("queue depth 0");
        assert!(matches!(e, StreamError::ZeroQueueDepth), "{kind}: {e}");
        assert!(e.to_string().contains("queue depth 0"), "{e}");
    }
}

/// Issue 26, finding 8: a layer file truncated while the mmap backend has it mapped is an error
/// naming the file (the size is checked before each copy), not a SIGBUS; the other backends see
/// the short read as an error too. (The race past the check — a truncation between the check
/// and the copy — is the SIGBUS handler's: runtime/src/mapped.rs's own test.)
#[test]
fn a_layer_file_truncated_during_the_run_is_an_error_naming_it_on_every_backend() {
    for kind in backends() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_model(dir.path());
        let mut src = ExpertSource::open(dir.path(), &options(kind, 4, 16)).expect("open");
        assert!(src.read_expert(1, 1).is_ok(), "{kind}");
        let x = src.model().get(1, 5).expect("expert").clone();
        let path = src.model().path(x.file).to_path_buf();
        OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open rw")
            .set_len(x.offset)
            .expect("truncate");
        let e = src.read_expert(1, 5).expect_err("truncated");
        let msg = e.to_string();
        assert!(msg.contains("layer-00001.jnf"), "{kind}: {msg}");
        if kind == BackendKind::Mmap {
            assert!(msg.contains("shrank to"), "{kind}: {msg}");
        }
    }
}
