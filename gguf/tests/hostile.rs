//! The hostile-GGUF corpus: one small file per known class of GGUF parser bug
//! (`../shared/research/reliability-and-users.md` A1), each refused with its own [`Violation`],
//! without a panic and without a large allocation (a per-thread counting allocator,
//! `allocation-counter`, measures the peak).
//!
//! The files in `fixtures/gguf/hostile/` are generated here; `hostile_corpus_files_are_fresh`
//! fails when they are stale. Regenerate with
//! `TARFA_REGEN_HOSTILE=1 cargo test -p tarfa-gguf --test hostile`.

mod common;

use tarfa_gguf::header::read_header_from;
use tarfa_gguf::{parse_header, GgufFile, HeaderParse, MemSource, Violation, MAX_HEADER_LEN};

/// Peak bytes allocated on this thread while `f` runs, above what was live before
/// (`allocation-counter` counts per thread, so tests running in parallel do not disturb each
/// other).
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let mut out = None;
    let info = allocation_counter::measure(|| out = Some(f()));
    (out.expect("ran"), info.bytes_max as usize)
}

// ---- building GGUF bytes by hand.

#[derive(Default)]
struct B(Vec<u8>);

impl B {
    fn gguf(version: u32, n_tensors: u64, n_kv: u64) -> B {
        let mut b = B(b"GGUF".to_vec());
        b.u32(version).u64(n_tensors).u64(n_kv);
        b
    }
    fn u8(&mut self, v: u8) -> &mut B {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut B {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut B {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn raw(&mut self, v: &[u8]) -> &mut B {
        self.0.extend_from_slice(v);
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut B {
        self.u64(s.len() as u64).raw(s)
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut B {
        self.str(k.as_bytes()).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut B {
        self.str(name.as_bytes()).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pad to 32 and append `n` data bytes.
    fn data(&mut self, n: usize) -> &mut B {
        while self.0.len() % 32 != 0 {
            self.0.push(0);
        }
        self.0.resize(self.0.len() + n, 0xAB);
        self
    }
    fn done(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.0)
    }
}

type Check = fn(&Violation) -> bool;

/// (file name, bytes, the violation expected).
fn corpus() -> Vec<(&'static str, Vec<u8>, Check)> {
    use Violation as V;
    let mut c: Vec<(&'static str, Vec<u8>, Check)> = Vec::new();
    c.push((
        "huge-string-length",
        B::gguf(3, 0, 1)
            .u64(1 << 63)
            .raw(b"general.architecture")
            .done(),
        |v| matches!(v, V::StringTooLong { len, .. } if *len == 1 << 63),
    ));
    c.push((
        "huge-value-string",
        B::gguf(3, 0, 1).str(b"k").u32(8).u64(u64::MAX).done(),
        |v| matches!(v, V::StringTooLong { .. }),
    ));
    c.push((
        "huge-array-count",
        B::gguf(3, 0, 1)
            .str(b"a")
            .u32(9)
            .u32(4)
            .u64(1 << 62)
            .raw(&[0; 16])
            .done(),
        |v| matches!(v, V::CountTooLarge { count, .. } if *count == 1 << 62),
    ));
    c.push((
        "huge-string-array-count",
        B::gguf(3, 0, 1)
            .str(b"tokenizer.ggml.tokens")
            .u32(9)
            .u32(8)
            .u64(u64::MAX / 8)
            .done(),
        |v| matches!(v, V::CountTooLarge { .. }),
    ));
    c.push((
        "huge-kv-count",
        B::gguf(3, 0, 1 << 60).kv_u32("a", 1).done(),
        |v| matches!(v, V::CountTooLarge { what, .. } if what.contains("key/value")),
    ));
    c.push((
        "huge-tensor-count",
        B::gguf(3, u64::MAX, 0).tensor("t", &[1], 0, 0).done(),
        |v| matches!(v, V::CountTooLarge { what, .. } if what.contains("tensor")),
    ));
    c.push((
        "n-dims-5",
        B::gguf(3, 1, 0)
            .tensor("t", &[1, 1, 1, 1, 1], 0, 0)
            .data(4)
            .done(),
        |v| matches!(v, V::TooManyDims { n_dims: 5, .. }),
    ));
    c.push((
        "n-dims-huge",
        B::gguf(3, 1, 0)
            .str(b"t")
            .u32(u32::MAX)
            .raw(&[1; 40])
            .done(),
        |v| {
            matches!(
                v,
                V::TooManyDims {
                    n_dims: u32::MAX,
                    ..
                }
            )
        },
    ));
    c.push((
        "dims-overflow",
        B::gguf(3, 1, 0)
            .tensor("t", &[1 << 32, 1 << 32, 1 << 32], 0, 0)
            .data(32)
            .done(),
        |v| matches!(v, V::ElementCountOverflow { .. }),
    ));
    c.push((
        "dim-over-int64",
        B::gguf(3, 1, 0)
            .tensor("t", &[1 << 63], 0, 0)
            .data(32)
            .done(),
        |v| matches!(v, V::DimTooLarge { dim: 0, .. }),
    ));
    // The element count fits int64 but the byte count does not fit u64 (ggml_nbytes overflow).
    c.push((
        "bytes-overflow",
        B::gguf(3, 1, 0)
            .tensor("t", &[1 << 31, 1 << 31], 0, 0)
            .data(32)
            .done(),
        |v| matches!(v, V::SizeOverflow { .. }),
    ));
    // A dim patched to 2^42+1 so that size * stride wraps (llama.cpp PR #18674): caught by the
    // strict running-offset rule on the next tensor.
    c.push((
        "dim-lie-wraps-size",
        B::gguf(3, 2, 0)
            .tensor("a", &[8, (1 << 42) + 1], 0, 0)
            .tensor("b", &[8], 0, 32)
            .data(64)
            .done(),
        |v| matches!(v, V::TensorOffset { tensor, .. } if tensor == "b"),
    ));
    c.push((
        "misaligned-offset",
        B::gguf(3, 2, 0)
            .tensor("a", &[8], 0, 0)
            .tensor("b", &[8], 0, 36)
            .data(96)
            .done(),
        |v| {
            matches!(
                v,
                V::TensorOffset {
                    offset: 36,
                    expected: 32,
                    ..
                }
            )
        },
    ));
    c.push((
        "overlapping-offsets",
        B::gguf(3, 2, 0)
            .tensor("a", &[16], 0, 0)
            .tensor("b", &[8], 0, 0)
            .data(96)
            .done(),
        |v| {
            matches!(
                v,
                V::TensorOffset {
                    offset: 0,
                    expected: 64,
                    ..
                }
            )
        },
    ));
    c.push((
        "offset-past-eof",
        B::gguf(3, 1, 0).tensor("a", &[1024], 0, 0).data(100).done(),
        |v| matches!(v, V::TensorPastEnd { .. }),
    ));
    c.push((
        "offset-huge",
        B::gguf(3, 1, 0)
            .tensor("a", &[8], 0, u64::MAX - 7)
            .data(32)
            .done(),
        |v| matches!(v, V::TensorOffset { .. }),
    ));
    c.push((
        "alignment-not-power-of-two",
        B::gguf(3, 0, 1).kv_u32("general.alignment", 48).done(),
        |v| matches!(v, V::BadAlignment { alignment: 48 }),
    ));
    c.push((
        "alignment-zero",
        B::gguf(3, 0, 1).kv_u32("general.alignment", 0).done(),
        |v| matches!(v, V::BadAlignment { alignment: 0 }),
    ));
    c.push((
        "alignment-wrong-type",
        B::gguf(3, 0, 1)
            .str(b"general.alignment")
            .u32(10)
            .u64(32)
            .done(),
        |v| matches!(v, V::AlignmentType { found } if found == "UINT64"),
    ));
    c.push((
        "duplicate-tensor-name",
        B::gguf(3, 2, 0)
            .tensor("a", &[8], 0, 0)
            .tensor("a", &[8], 0, 32)
            .data(64)
            .done(),
        |v| matches!(v, V::DuplicateTensor { tensor, .. } if tensor == "a"),
    ));
    c.push((
        "duplicate-key",
        B::gguf(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).done(),
        |v| matches!(v, V::DuplicateKey { key, .. } if key == "k"),
    ));
    c.push((
        "bad-utf8-key",
        B::gguf(3, 0, 1).str(b"k\xff\xfe").u32(4).u32(1).done(),
        |v| matches!(v, V::BadUtf8 { what, offset: 32 } if what == "key"),
    ));
    c.push((
        "bad-utf8-value",
        B::gguf(3, 0, 1).str(b"k").u32(8).str(b"\xc3\x28").done(),
        |v| matches!(v, V::BadUtf8 { what, .. } if what.contains("'k'")),
    ));
    c.push((
        "bad-utf8-tensor-name",
        B::gguf(3, 1, 0)
            .str(b"\xff")
            .u32(1)
            .u64(8)
            .u32(0)
            .u64(0)
            .data(32)
            .done(),
        |v| matches!(v, V::BadUtf8 { what, offset: 32 } if what == "tensor name"),
    ));
    c.push((
        "tensor-name-64-bytes",
        B::gguf(3, 1, 0)
            .tensor(&"x".repeat(64), &[8], 0, 0)
            .data(32)
            .done(),
        |v| matches!(v, V::TensorNameTooLong { len: 64, .. }),
    ));
    c.push((
        "unknown-ggml-type",
        B::gguf(3, 1, 0).tensor("t", &[8], 42, 0).data(32).done(),
        |v| matches!(v, V::UnknownGgmlType { type_id: 42, .. }),
    ));
    c.push((
        "retired-ggml-type",
        B::gguf(3, 1, 0).tensor("t", &[32], 4, 0).data(32).done(),
        |v| matches!(v, V::UnknownGgmlType { type_id: 4, .. }),
    ));
    c.push((
        "row-not-whole-blocks",
        B::gguf(3, 1, 0)
            .tensor("t", &[100, 2], 12, 0)
            .data(512)
            .done(),
        |v| {
            matches!(
                v,
                V::RowNotWholeBlocks {
                    ne0: 100,
                    block: 256,
                    ..
                }
            )
        },
    ));
    c.push((
        "unknown-value-type",
        B::gguf(3, 0, 1).str(b"k").u32(13).u32(0).done(),
        |v| matches!(v, V::UnknownValueType { type_id: 13, .. }),
    ));
    c.push((
        "invalid-bool",
        B::gguf(3, 0, 1).str(b"k").u32(7).u8(2).done(),
        |v| matches!(v, V::InvalidBool { value: 2, .. }),
    ));
    let mut deep = B::gguf(3, 0, 1);
    deep.str(b"deep").u32(9);
    for _ in 0..100 {
        deep.u32(9).u64(1);
    }
    deep.u32(0).u64(0);
    c.push(("deeply-nested-arrays", deep.done(), |v| {
        matches!(v, V::ArrayTooDeep { .. })
    }));
    c.push((
        "truncated-header",
        {
            let mut b = B::gguf(3, 1, 2)
                .kv_u32("general.alignment", 32)
                .str(b"general.name")
                .u32(8)
                .done();
            b.truncate(b.len() - 2); // inside the value type of general.name
            b
        },
        |v| matches!(v, V::Truncated { .. }),
    ));
    c.push(("empty-file", Vec::new(), |v| {
        matches!(v, V::Truncated { .. })
    }));
    c.push(("lfs-pointer", b"version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n".to_vec(), |v| {
        matches!(v, V::LfsPointer)
    }));
    c.push(("html-page", b"\n  <!DOCTYPE html>\n<html><head><title>404</title></head><body>Not found</body></html>\n".to_vec(), |v| {
        matches!(v, V::HtmlPage)
    }));
    c.push((
        "html-page-no-doctype",
        b"<HTML><body>Sign in to continue</body></HTML>".to_vec(),
        |v| matches!(v, V::HtmlPage),
    ));
    c.push((
        "wrong-magic",
        b"GGML\x03\x00\x00\x00 not a gguf file at all, just text".to_vec(),
        |v| matches!(v, V::BadMagic { found } if found == "47474d4c"),
    ));
    c.push(("version-1", B::gguf(1, 0, 0).done(), |v| {
        matches!(v, V::UnsupportedVersion { version: 1 })
    }));
    c.push(("version-4", B::gguf(4, 0, 0).done(), |v| {
        matches!(v, V::UnsupportedVersion { version: 4 })
    }));
    c.push((
        "version-big-endian",
        B::gguf(3u32.swap_bytes(), 0, 0).done(),
        |v| matches!(v, V::BigEndian { .. }),
    ));
    c
}

fn hostile_dir() -> std::path::PathBuf {
    common::fixtures().join("hostile")
}

#[test]
fn hostile_corpus_files_are_fresh() {
    let regen = std::env::var("TARFA_REGEN_HOSTILE").is_ok();
    if regen {
        std::fs::create_dir_all(hostile_dir()).expect("mkdir");
    }
    let mut stale = Vec::new();
    for (name, bytes, _) in corpus() {
        let p = hostile_dir().join(format!("{name}.gguf"));
        if regen {
            std::fs::write(&p, &bytes).expect("write");
        } else if std::fs::read(&p).ok().as_ref() != Some(&bytes) {
            stale.push(name);
        }
    }
    assert!(
        stale.is_empty(),
        "stale hostile files {stale:?}: rerun with TARFA_REGEN_HOSTILE=1"
    );
    let on_disk = std::fs::read_dir(hostile_dir()).expect("ls").count();
    assert_eq!(
        on_disk,
        corpus().len(),
        "files in fixtures/gguf/hostile not made by corpus()"
    );
}

#[test]
fn every_hostile_file_gives_its_own_error_without_panic_or_large_allocation() {
    let (_, probe) = peak_during(|| vec![0u8; 100_000]);
    assert!(probe >= 100_000, "the counting allocator counts ({probe})");
    let mut seen = std::collections::HashSet::new();
    for (name, bytes, check) in corpus() {
        let len = bytes.len();
        // Through the incremental reader, from a tiny window, so window growth is exercised too.
        let (r, peak) = peak_during(|| {
            let src = MemSource::new(name, bytes.clone());
            read_header_from(&src, 8)
        });
        let e = r.expect_err(name);
        let v = e
            .violation()
            .unwrap_or_else(|| panic!("{name}: not a violation: {e}"));
        assert!(check(v), "{name}: wrong error: {v:?}");
        assert!(
            peak < 64 * 1024 + 8 * len,
            "{name}: {peak} bytes allocated for a {len}-byte file"
        );
        // And from the committed file, through the local-file source.
        let on_disk = GgufFile::open(&hostile_dir().join(format!("{name}.gguf"))).expect_err(name);
        assert_eq!(on_disk.violation(), Some(v), "{name}");
        assert!(
            e.to_string().contains(name),
            "the message names the file: {e}"
        );
        seen.insert(std::mem::discriminant(v));
    }
    assert!(seen.len() >= 24, "{} distinct violations", seen.len());
}

/// A sparse file: `head`, then zeros (holes, nothing on disk) up to `len` bytes.
fn sparse_file(dir: &std::path::Path, head: &[u8], len: u64) -> std::path::PathBuf {
    let p = dir.join("sparse.gguf");
    std::fs::write(&p, head).expect("write");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .expect("open");
    f.set_len(len).expect("set_len");
    p
}

#[test]
fn a_sparse_file_claiming_a_one_gib_key_is_refused_without_allocating_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key_len: u64 = 1 << 30;
    let head = B::gguf(3, 0, 1).u64(key_len).done();
    let p = sparse_file(dir.path(), &head, head.len() as u64 + key_len + 4096);
    let (r, peak) = peak_during(|| GgufFile::open(&p));
    let e = r.expect_err("a 1 GiB key of NULs");
    assert!(
        matches!(e.violation(), Some(Violation::LimitExceeded { len, .. }) if *len == key_len),
        "{e}"
    );
    assert!(peak < 1 << 20, "{peak} bytes allocated for 4 KiB of data");
}

#[test]
fn a_header_longer_than_max_header_len_is_refused_before_the_window_grows() {
    // A u8 array that fits in the (claimed) file but ends past the header limit: each element is
    // valid, so only the limit stops the reader from reading 1 GiB of holes.
    let dir = tempfile::tempdir().expect("tempdir");
    let head = B::gguf(3, 0, 1)
        .str(b"a")
        .u32(9)
        .u32(0)
        .u64(MAX_HEADER_LEN)
        .done();
    let p = sparse_file(dir.path(), &head, 2 * MAX_HEADER_LEN + 4096);
    let (r, peak) = peak_during(|| GgufFile::open(&p));
    let e = r.expect_err("a header past MAX_HEADER_LEN");
    assert!(
        matches!(e.violation(), Some(Violation::LimitExceeded { limit, .. }) if *limit == MAX_HEADER_LEN),
        "{e}"
    );
    assert!(peak < 1 << 20, "{peak} bytes allocated for 4 KiB of data");
    // The whole-buffer parser gives the same answer from any window: it never asks for more.
    let r = parse_header(&head, 2 * MAX_HEADER_LEN + 4096);
    assert!(
        matches!(
            &r,
            Err(HeaderParse::Invalid(Violation::LimitExceeded { .. }))
        ),
        "{r:?}"
    );
}

#[test]
fn version_2_is_read_with_the_same_layout_as_3() {
    let bytes = B::gguf(2, 1, 1)
        .kv_u32("a", 5)
        .tensor("t", &[8], 0, 0)
        .data(32)
        .done();
    let h = match parse_header(&bytes, bytes.len() as u64) {
        Ok(h) => h,
        Err(e) => panic!("{e:?}"),
    };
    assert_eq!((h.version, h.tensors.len(), h.metadata.len()), (2, 1, 1));
}

#[test]
fn every_prefix_of_a_valid_header_asks_for_more_bytes_never_errs() {
    for name in ["metadata", "moe", "split-00002-of-00003"] {
        let bytes = std::fs::read(common::fixtures().join(format!("{name}.gguf"))).expect("read");
        let len = bytes.len() as u64;
        let full = match parse_header(&bytes, len) {
            Ok(h) => h,
            Err(e) => panic!("{name}: {e:?}"),
        };
        for cut in 0..full.header_len as usize {
            match parse_header(&bytes[..cut], len) {
                Err(HeaderParse::NeedMore { at_least }) => {
                    assert!(
                        at_least > cut as u64 && at_least <= len,
                        "{name} cut {cut}: {at_least}"
                    )
                }
                other => panic!("{name}: prefix {cut} gave {other:?}"),
            }
        }
        for initial in [1, 7, 100, 4096] {
            let src = MemSource::new(name, bytes.clone());
            assert_eq!(read_header_from(&src, initial).expect("read"), full);
        }
    }
}

#[test]
fn the_writer_refuses_what_the_reader_refuses() {
    use tarfa_gguf::{Array, Dtype, GgufWriter, Value};
    let check = |w: &GgufWriter, want: fn(&Violation) -> bool| {
        let e = w.header().expect_err("writer must refuse");
        assert!(want(&e), "{e:?}");
    };
    let mut w = GgufWriter::new(32);
    w.add_kv("k", Value::U8(1)).add_kv("k", Value::U8(2));
    check(&w, |v| matches!(v, Violation::DuplicateKey { .. }));
    let mut w = GgufWriter::new(48);
    w.add_kv("k", Value::U8(1));
    check(&w, |v| {
        matches!(v, Violation::BadAlignment { alignment: 48 })
    });
    let mut w = GgufWriter::new(32);
    w.add_tensor("t", Dtype::F32, vec![1, 1, 1, 1, 1]);
    check(&w, |v| matches!(v, Violation::TooManyDims { .. }));
    let mut w = GgufWriter::new(32);
    w.add_tensor("t", Dtype::F32, vec![8])
        .add_tensor("t", Dtype::F32, vec![8]);
    check(&w, |v| matches!(v, Violation::DuplicateTensor { .. }));
    let mut w = GgufWriter::new(32);
    w.add_tensor("x".repeat(64), Dtype::F32, vec![8]);
    check(&w, |v| matches!(v, Violation::TensorNameTooLong { .. }));
    let mut w = GgufWriter::new(32);
    w.add_tensor("t", Dtype::U8, vec![8]);
    check(&w, |v| matches!(v, Violation::UnknownGgmlType { .. }));
    let mut w = GgufWriter::new(32);
    w.add_tensor("t", Dtype::from_name("Q4_K").expect("q4k"), vec![100]);
    check(&w, |v| matches!(v, Violation::RowNotWholeBlocks { .. }));
    let mut w = GgufWriter::new(32);
    w.add_kv("general.alignment", Value::U64(32));
    check(&w, |v| matches!(v, Violation::AlignmentType { .. }));
    let mut deep = Array::U8(vec![1]);
    for _ in 0..tarfa_gguf::MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    let mut w = GgufWriter::new(32);
    w.add_kv("deep", Value::Array(deep));
    check(&w, |v| matches!(v, Violation::ArrayTooDeep { .. }));
}
