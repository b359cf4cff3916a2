//! Cross-checks with gguf-py, the format's own Python library: our reader sees exactly what
//! gguf-py's GGUFReader sees in files gguf-py's GGUFWriter made (fixtures/gguf/*.json, written by
//! fixtures/gguf/make_fixtures.py), our writer reproduces those files byte for byte, and gguf-py
//! reads files from our writer back identically.

mod common;

use std::io::Read;
use std::process::Command;

use common::{dump, fixtures};
use tarfa_gguf::{
    expert_range, Array, Dtype, ExpertSliceFault, GgufFile, GgufModel, GgufWriter, Value, Violation,
};

const FIXTURES: &[&str] = &[
    "metadata",
    "quants",
    "moe",
    "split-00001-of-00003",
    "split-00002-of-00003",
    "split-00003-of-00003",
];

#[test]
fn our_reader_agrees_with_gguf_py_on_every_key_value_and_tensor_byte() {
    for name in FIXTURES {
        let path = fixtures().join(format!("{name}.gguf"));
        let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e}"));
        let want: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixtures().join(format!("{name}.json"))).expect("dump"),
        )
        .expect("json");
        let got = dump(f.header(), &f);
        assert_eq!(got["kv"], want["kv"], "{name}: key/values");
        assert_eq!(got["tensors"], want["tensors"], "{name}: tensors");
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn fixtures_cover_every_value_type_and_many_ggml_types() {
    let f = GgufFile::open(&fixtures().join("metadata.gguf")).expect("open");
    let mut types: Vec<&str> = f
        .header()
        .metadata
        .iter()
        .map(|(_, v)| v.value_type().name())
        .collect();
    types.sort_unstable();
    types.dedup();
    assert_eq!(types.len(), 13, "{types:?}");
    let Some(Value::Array(Array::Array(nested))) = f.header().get("test.nested2") else {
        panic!("nested arrays");
    };
    assert!(matches!(&nested[0], Array::Array(_)));
    let q = GgufFile::open(&fixtures().join("quants.gguf")).expect("open");
    for t in ["Q4_0", "Q8_0", "MXFP4", "Q4_K", "Q6_K", "IQ1_M", "TQ2_0"] {
        let d = Dtype::from_name(t).expect("in table");
        assert!(q.header().tensors.iter().any(|x| x.dtype == d), "{t}");
    }
}

#[test]
fn our_writer_reproduces_gguf_py_files_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tmp");
    for name in FIXTURES {
        let path = fixtures().join(format!("{name}.gguf"));
        let f = GgufFile::open(&path).expect("open");
        let h = f.header();
        let mut w = GgufWriter::new(h.alignment);
        for (k, v) in &h.metadata {
            w.add_kv(k.clone(), v.clone());
        }
        for t in &h.tensors {
            w.add_tensor(t.name.clone(), t.dtype, t.ne.clone());
        }
        let out = dir.path().join(format!("{name}.gguf"));
        let readers: Vec<Box<dyn Read + '_>> = h
            .tensors
            .iter()
            .map(|t| Box::new(f.range_reader(t.data_range())) as Box<dyn Read>)
            .collect();
        let written = w.write_file(&out, readers).expect("write");
        assert_eq!(&written, h, "{name}: header written");
        assert_eq!(
            std::fs::read(&out).expect("read"),
            std::fs::read(&path).expect("read"),
            "{name}: bytes differ from gguf-py's"
        );
    }
}

#[test]
fn split_set_opens_from_any_part_with_every_tensor() {
    for k in 1..=3 {
        let p = fixtures().join(format!("split-0000{k}-of-00003.gguf"));
        let m = GgufModel::open(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.parts().len(), 3);
        let s = m.split().expect("split keys");
        assert_eq!((s.count, s.tensors_count), (3, 5));
        let names: Vec<String> = m.tensors().map(|t| t.info.name.clone()).collect();
        assert_eq!(names.len(), 5);
        let parts: Vec<usize> = m.tensors().map(|t| t.part).collect();
        assert_eq!(parts, [0, 0, 1, 1, 2]);
        let t3 = m.tensor("blk.0.t3.weight").expect("t3");
        assert_eq!(t3.part, 1);
        assert_eq!(m.tensor_bytes(t3).expect("bytes").len(), 3 * 35 * 4);
        assert!(m.metadata().iter().any(|(k, _)| k == "general.name"));
    }
}

#[test]
fn a_missing_split_part_is_named() {
    let dir = tempfile::tempdir().expect("tmp");
    for k in [1, 3] {
        let n = format!("split-0000{k}-of-00003.gguf");
        std::fs::copy(fixtures().join(&n), dir.path().join(&n)).expect("copy");
    }
    let e = GgufModel::open(&dir.path().join("split-00001-of-00003.gguf")).expect_err("missing");
    assert_eq!(
        e.violation(),
        Some(&Violation::SplitMismatch(
            tarfa_gguf::SplitFault::MissingPart { part: 2, count: 3 }
        ))
    );
    let msg = e.to_string();
    assert!(
        msg.contains("split-00002-of-00003.gguf") && msg.contains("part 2 of 3 is missing"),
        "{msg}"
    );
}

#[test]
fn expert_slices_tile_the_stacked_tensor_exactly() {
    let f = GgufFile::open(&fixtures().join("moe.gguf")).expect("open");
    assert_eq!(f.header().alignment, 64);
    for name in [
        "blk.0.ffn_gate_exps.weight",
        "blk.0.ffn_up_exps.weight",
        "blk.0.ffn_down_exps.weight",
    ] {
        let t = f.header().tensor(name).expect(name);
        let whole = f.tensor_bytes(t).expect("bytes");
        let [n_expert, rows, cols] = t.shape()[..] else {
            panic!("3-D")
        };
        let nb = t.dtype.byte_len(&[rows, cols]).expect("nb");
        let mut joined = Vec::new();
        for e in 0..n_expert {
            let r = expert_range(t, e).expect("range");
            assert_eq!(r.start, t.data_offset + e * nb);
            assert_eq!(r.end - r.start, nb);
            joined.extend(f.read_range(r).expect("read"));
        }
        assert_eq!(joined, whole, "{name}");
        assert_eq!(
            expert_range(t, n_expert),
            Err(Violation::ExpertSlice {
                tensor: name.into(),
                fault: ExpertSliceFault::NoSuchExpert {
                    expert: n_expert,
                    n_expert
                },
            }),
            "past the last expert"
        );
    }
    let flat = f.header().tensor("blk.0.attn_norm.weight").expect("norm");
    let e = expert_range(flat, 0).expect_err("1-D tensor has no experts");
    assert!(
        matches!(
            &e,
            Violation::ExpertSlice { fault: ExpertSliceFault::NotStacked { shape }, .. }
                if *shape == flat.shape()
        ),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains("expected 3 dimensions [n_expert, rows, cols], found ["),
        "{e}"
    );
}

/// A tensor info as a caller may build it (the reader's header check would refuse these).
fn stack(ne: Vec<u64>, data_offset: u64) -> tarfa_gguf::TensorInfo {
    tarfa_gguf::TensorInfo {
        name: "blk.0.ffn_up_exps.weight".into(),
        dtype: Dtype::F32,
        ne,
        offset: 0,
        data_offset,
        byte_len: 0,
        info_offset: 0,
    }
}

#[test]
fn an_expert_slice_whose_size_or_offset_overflows_is_refused_naming_which() {
    let huge = stack(vec![1 << 40, 1 << 40, 2], 0);
    assert_eq!(
        expert_range(&huge, 0).map_err(|v| v.to_string()),
        Err("tensor 'blk.0.ffn_up_exps.weight': the byte size of one expert (1099511627776 rows of 1099511627776) overflows u64".into())
    );
    assert!(matches!(
        expert_range(&huge, 1),
        Err(Violation::ExpertSlice {
            fault: ExpertSliceFault::SizeOverflow {
                rows: 1_099_511_627_776,
                cols: 1_099_511_627_776
            },
            ..
        })
    ));
    // 16 bytes an expert: expert 0 ends 4 bytes before u64::MAX, expert 1's end overflows.
    let late = stack(vec![4, 1, 2], u64::MAX - 20);
    assert_eq!(expert_range(&late, 0), Ok(u64::MAX - 20..u64::MAX - 4));
    assert!(matches!(
        expert_range(&late, 1),
        Err(Violation::ExpertSlice {
            fault: ExpertSliceFault::OffsetOverflow { expert: 1 },
            ..
        })
    ));
}

fn rich_writer(alignment: u64) -> (GgufWriter, Vec<Vec<u8>>) {
    let mut w = GgufWriter::new(alignment);
    w.add_kv("general.architecture", Value::String("glm4moe".into()))
        .add_kv("a.u8", Value::U8(7))
        .add_kv("a.i8", Value::I8(-7))
        .add_kv("a.u16", Value::U16(700))
        .add_kv("a.i16", Value::I16(-700))
        .add_kv("a.u32", Value::U32(70000))
        .add_kv("a.i32", Value::I32(-70000))
        .add_kv("a.f32", Value::F32(f32::MIN_POSITIVE))
        .add_kv("a.bool", Value::Bool(true))
        .add_kv("a.str", Value::String(String::new()))
        .add_kv("a.u64", Value::U64(u64::MAX))
        .add_kv("a.i64", Value::I64(i64::MIN))
        .add_kv("a.f64", Value::F64(-0.0))
        .add_kv("a.empty", Value::Array(Array::F32(Vec::new())))
        .add_kv(
            "a.tokens",
            Value::Array(Array::String(
                (0..300).map(|i| format!("tok{i}·")).collect(),
            )),
        )
        .add_kv(
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::U16(vec![1, 2]),
                Array::U16(vec![]),
                Array::U16(vec![3]),
            ])),
        );
    let specs: [(&str, &str, Vec<u64>); 4] = [
        ("blk.0.ffn_gate_exps.weight", "Q4_K", vec![256, 4, 3]),
        ("blk.0.ffn_down_exps.weight", "Q8_0", vec![64, 16, 3]),
        ("output_norm.weight", "F32", vec![5]),
        ("token_embd.weight", "BF16", vec![8, 3]),
    ];
    let mut data = Vec::new();
    for (i, (name, ty, ne)) in specs.into_iter().enumerate() {
        let d = Dtype::from_name(ty).expect("type");
        let shape: Vec<u64> = ne.iter().rev().copied().collect();
        let n = d.byte_len(&shape).expect("len") as usize;
        data.push((0..n).map(|j| (j * 31 + i * 7) as u8).collect());
        w.add_tensor(name, d, ne);
    }
    (w, data)
}

#[test]
fn gguf_py_reads_files_from_our_writer_identically() {
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    for alignment in [32, 64, 4096] {
        let (w, data) = rich_writer(alignment);
        let out = dir.path().join(format!("ours-{alignment}.gguf"));
        w.write_file(
            &out,
            data.iter().map(|d| Box::new(d.as_slice()) as Box<dyn Read>),
        )
        .expect("write");
        let f = GgufFile::open(&out).expect("our reader");
        for (t, d) in f.header().tensors.iter().zip(&data) {
            assert_eq!(&f.tensor_bytes(t).expect("bytes"), d);
        }
        let expected = dir.path().join(format!("ours-{alignment}.json"));
        std::fs::write(&expected, dump(f.header(), &f).to_string()).expect("dump");
        let out_py = Command::new("python3")
            .arg(fixtures().join("check_roundtrip.py"))
            .arg(&out)
            .arg(&expected)
            .output()
            .expect("run python3");
        assert!(
            out_py.status.success(),
            "alignment {alignment}: gguf-py disagrees:\n{}{}",
            String::from_utf8_lossy(&out_py.stdout),
            String::from_utf8_lossy(&out_py.stderr)
        );
    }
}

#[test]
fn writer_refuses_data_of_the_wrong_length_and_leaves_no_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let (w, mut data) = rich_writer(32);
    data[1].pop();
    let out = dir.path().join("short.gguf");
    let e = w
        .write_file(
            &out,
            data.iter().map(|d| Box::new(d.as_slice()) as Box<dyn Read>),
        )
        .expect_err("short data");
    assert!(
        matches!(
            e.violation(),
            Some(tarfa_gguf::Violation::TensorDataLength { .. })
        ),
        "{e}"
    );
    assert!(!out.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("ls").count(),
        0,
        "temp file removed"
    );
}
