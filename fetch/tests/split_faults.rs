//! A split GGUF whose names or `split.*` keys disagree is refused by fetch's planner (which
//! opens parts itself, local or remote) with the same [`SplitFault`] the local reader gives
//! (issue 13, finding 18).

use std::io::Read;
use std::path::{Path, PathBuf};

use tarfa_fetch::{FetchError, FetchOptions, Fetcher, Selection};
use tarfa_gguf::{Dtype, GgufWriter, SplitFault, Value, Violation};

/// `split.no`, `split.count`, `split.tensors.count`.
type Keys = (u16, u16, i32);

/// Write `dir/file`: one F32 tensor `t{index}` of 4 elements, with `keys` as its `split.*` keys.
fn part(dir: &Path, file: &str, keys: Option<Keys>, index: usize) -> PathBuf {
    let mut w = GgufWriter::new(32);
    w.add_kv("general.architecture", Value::String("test".into()));
    if let Some((no, count, total)) = keys {
        w.add_kv("split.no", Value::U16(no))
            .add_kv("split.count", Value::U16(count))
            .add_kv("split.tensors.count", Value::I32(total));
    }
    w.add_tensor(format!("t{index}"), Dtype::F32, vec![4]);
    let data: Vec<Box<dyn Read>> = vec![Box::new(std::io::Cursor::new(vec![0u8; 16]))];
    let p = dir.join(file);
    w.write_file(&p, data).expect("write part");
    p
}

/// The split-set fault planning a fetch of every tensor of `source` gives.
fn fault(source: &Path) -> SplitFault {
    let f = Fetcher::new(FetchOptions {
        selection: Selection {
            mtp: false,
            globs: vec!["*".into()],
        },
        ..FetchOptions::default()
    });
    match f.plan(&source.display().to_string()) {
        Err(FetchError::Gguf(e)) => match e.violation() {
            Some(Violation::SplitMismatch(fault)) => fault.clone(),
            _ => panic!("expected a split-set fault, got: {e}"),
        },
        Err(e) => panic!("expected a split-set fault, got: {e}"),
        Ok(_) => panic!("a disagreeing split set was planned"),
    }
}

/// The part given and its keys, the second part's keys when it is written, and the fault.
type Case = (&'static str, Option<Keys>, Option<Option<Keys>>, SplitFault);

#[test]
fn each_disagreement_of_a_split_set_is_its_own_fault() {
    const FIRST: &str = "s-00001-of-00002.gguf";
    const SECOND: &str = "s-00002-of-00002.gguf";
    let cases: Vec<Case> = vec![
        (
            "one.gguf",
            Some((2, 2, 1)),
            None,
            SplitFault::PartOutOfRange { no: 2, count: 2 },
        ),
        (FIRST, None, None, SplitFault::NameWithoutKeys { count: 2 }),
        (
            "one.gguf",
            Some((0, 2, 2)),
            None,
            SplitFault::KeysWithoutName { count: 2 },
        ),
        (
            FIRST,
            Some((1, 2, 2)),
            None,
            SplitFault::NameDisagrees {
                name_part: 1,
                name_count: 2,
                key_part: 2,
                key_count: 2,
            },
        ),
        (
            FIRST,
            Some((0, 2, 2)),
            Some(None),
            SplitFault::PartWithoutKeys { part: 2, count: 2 },
        ),
        (
            FIRST,
            Some((0, 2, 2)),
            Some(Some((0, 2, 2))),
            SplitFault::PartIndex {
                part: 2,
                count: 2,
                no: 0,
                expected: 1,
            },
        ),
        (
            FIRST,
            Some((0, 2, 2)),
            Some(Some((1, 3, 2))),
            SplitFault::PartCount {
                part: 2,
                count: 2,
                found: 3,
            },
        ),
        (
            FIRST,
            Some((0, 2, 2)),
            Some(Some((1, 2, 3))),
            SplitFault::TensorsCountDiffers {
                part: 2,
                count: 2,
                found: 3,
                expected: 2,
            },
        ),
        (
            FIRST,
            Some((0, 2, 3)),
            Some(Some((1, 2, 3))),
            SplitFault::TensorCountSum {
                declared: 3,
                held: 2,
            },
        ),
    ];
    for (given, keys, second, want) in cases {
        let dir = tempfile::tempdir().expect("tmp");
        let source = part(dir.path(), given, keys, 0);
        if let Some(keys) = second {
            part(dir.path(), SECOND, keys, 1);
        }
        assert_eq!(fault(&source), want, "{given} {keys:?} then {second:?}");
    }
}
