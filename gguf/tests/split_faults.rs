//! A split set whose names or `split.*` keys disagree is refused with the [`SplitFault`] that
//! names the disagreement (issue 13, finding 18: one variant per violation, not a `String`).

use std::io::Read;
use std::path::{Path, PathBuf};

use tarfa_gguf::{Dtype, GgufFile, GgufModel, GgufWriter, SplitFault, Value, Violation};

/// `split.no`, `split.count`, `split.tensors.count`.
type Keys = (u16, u16, i32);

/// Write `dir/file`: `tensors` F32 tensors of 4 elements, named `t{first}`, `t{first+1}`, …,
/// with `keys` as its `split.*` keys.
fn part(dir: &Path, file: &str, keys: Option<Keys>, first: usize, tensors: usize) -> PathBuf {
    let mut w = GgufWriter::new(32);
    w.add_kv("general.architecture", Value::String("test".into()));
    if let Some((no, count, total)) = keys {
        w.add_kv("split.no", Value::U16(no))
            .add_kv("split.count", Value::U16(count))
            .add_kv("split.tensors.count", Value::I32(total));
    }
    let mut data: Vec<Box<dyn Read>> = Vec::new();
    for t in first..first + tensors {
        w.add_tensor(format!("t{t}"), Dtype::F32, vec![4]);
        data.push(Box::new(std::io::Cursor::new(vec![0u8; 16])));
    }
    let p = dir.join(file);
    w.write_file(&p, data).expect("write part");
    p
}

/// A set `s-0000k-of-00002.gguf` of two parts, one tensor each, with the keys given.
fn pair(dir: &Path, first: Option<Keys>, second: Option<Keys>) -> PathBuf {
    let p = part(dir, "s-00001-of-00002.gguf", first, 0, 1);
    part(dir, "s-00002-of-00002.gguf", second, 1, 1);
    p
}

/// The [`SplitFault`] opening `path` as a model gives.
fn fault(path: &Path) -> (SplitFault, String) {
    let e = GgufModel::open(path).expect_err("a disagreeing split set must be refused");
    match e.violation() {
        Some(Violation::SplitMismatch(f)) => (f.clone(), e.to_string()),
        _ => panic!("expected a split-set fault, got: {e}"),
    }
}

#[test]
fn a_split_no_not_below_split_count_is_part_out_of_range() {
    let dir = tempfile::tempdir().expect("tmp");
    for (no, count) in [(2, 2), (0, 0)] {
        let p = part(dir.path(), "one.gguf", Some((no, count, 1)), 0, 1);
        let (f, msg) = fault(&p);
        assert_eq!(f, SplitFault::PartOutOfRange { no, count });
        assert!(
            msg.contains(&format!("split.no {no} is not below split.count {count}")),
            "{msg}"
        );
    }
}

#[test]
fn a_part_name_without_split_keys_is_name_without_keys() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = part(dir.path(), "s-00001-of-00002.gguf", None, 0, 1);
    let (f, msg) = fault(&p);
    assert_eq!(f, SplitFault::NameWithoutKeys { count: 2 });
    assert!(msg.contains("s-00001-of-00002.gguf"), "{msg}");
}

#[test]
fn split_keys_of_several_parts_under_a_plain_name_is_keys_without_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = part(dir.path(), "model.gguf", Some((0, 2, 2)), 0, 1);
    let (f, msg) = fault(&p);
    assert_eq!(f, SplitFault::KeysWithoutName { count: 2 });
    assert!(msg.contains("NAME-0000k-of-0000N.gguf"), "{msg}");
}

#[test]
fn a_name_and_keys_numbering_the_part_differently_is_name_disagrees() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = part(dir.path(), "s-00001-of-00002.gguf", Some((1, 2, 2)), 0, 1);
    let (f, msg) = fault(&p);
    assert_eq!(
        f,
        SplitFault::NameDisagrees {
            name_part: 1,
            name_count: 2,
            key_part: 2,
            key_count: 2
        }
    );
    assert!(
        msg.contains("the file name says part 1 of 2, its split.* keys say part 2 of 2"),
        "{msg}"
    );
}

#[test]
fn an_absent_part_is_missing_part() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = part(dir.path(), "s-00001-of-00002.gguf", Some((0, 2, 2)), 0, 1);
    let (f, msg) = fault(&p);
    assert_eq!(f, SplitFault::MissingPart { part: 2, count: 2 });
    assert!(
        msg.contains("s-00002-of-00002.gguf") && msg.contains("part 2 of 2 is missing"),
        "{msg}"
    );
}

#[test]
fn a_sibling_part_without_split_keys_is_part_without_keys() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = pair(dir.path(), Some((0, 2, 2)), None);
    let (f, msg) = fault(&p);
    assert_eq!(f, SplitFault::PartWithoutKeys { part: 2, count: 2 });
    assert!(msg.contains("s-00002-of-00002.gguf"), "{msg}");
}

#[test]
fn a_sibling_part_with_another_split_no_is_part_index() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = pair(dir.path(), Some((0, 2, 2)), Some((0, 2, 2)));
    let (f, msg) = fault(&p);
    assert_eq!(
        f,
        SplitFault::PartIndex {
            part: 2,
            count: 2,
            no: 0,
            expected: 1
        }
    );
    assert!(
        msg.contains("part 2 of 2 has split.no 0, expected 1"),
        "{msg}"
    );
}

#[test]
fn a_sibling_part_with_another_split_count_is_part_count() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = pair(dir.path(), Some((0, 2, 2)), Some((1, 3, 2)));
    let (f, _) = fault(&p);
    assert_eq!(
        f,
        SplitFault::PartCount {
            part: 2,
            count: 2,
            found: 3
        }
    );
}

#[test]
fn parts_declaring_different_tensor_totals_is_tensors_count_differs() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = pair(dir.path(), Some((0, 2, 2)), Some((1, 2, 3)));
    let (f, _) = fault(&p);
    assert_eq!(
        f,
        SplitFault::TensorsCountDiffers {
            part: 2,
            count: 2,
            found: 3,
            expected: 2
        }
    );
}

#[test]
fn a_tensor_total_the_parts_do_not_hold_is_tensor_count_sum() {
    let dir = tempfile::tempdir().expect("tmp");
    let p = pair(dir.path(), Some((0, 2, 3)), Some((1, 2, 3)));
    let (f, msg) = fault(&p);
    assert_eq!(
        f,
        SplitFault::TensorCountSum {
            declared: 3,
            held: 2
        }
    );
    assert!(
        msg.contains("split.tensors.count is 3 but the parts hold 2 tensors"),
        "{msg}"
    );
}

#[test]
fn parts_opened_by_the_caller_are_held_to_the_first_parts_keys() {
    let dir = tempfile::tempdir().expect("tmp");
    let first = pair(dir.path(), Some((0, 2, 2)), Some((1, 2, 2)));
    let open = |p: &Path| GgufFile::open(p).expect("open part");
    let second = dir.path().join("s-00002-of-00002.gguf");
    let m = GgufModel::from_parts(vec![open(&first), open(&second)], None).expect("a whole set");
    assert_eq!(m.tensors().count(), 2);
    // The parts in the wrong order: the first one given sets the keys, the second is off.
    let e = GgufModel::from_parts(vec![open(&second), open(&first)], None).expect_err("order");
    assert_eq!(
        e.violation(),
        Some(&Violation::SplitMismatch(SplitFault::PartIndex {
            part: 1,
            count: 2,
            no: 1,
            expected: 0
        }))
    );
}
