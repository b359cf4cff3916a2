//! Quantised GGUF weights, held to gguf-py (the format's own library):
//!
//! - every element of every block of every supported type dequantises to the bits of gguf-py's
//!   `gguf.quants.dequantize` (random blocks with edge scales, and quantised real tensors);
//! - a matrix given as quantised bytes multiplies to the same bits as the gguf-py-dequantised
//!   `f32` matrix, on every instruction-set path and thread count;
//! - element access (`WeightSlice::get`, `MatrixRef::row`/`rows`) agrees with gguf-py too;
//! - types this build does not dequantise are refused by name.
//!
//! The vectors come from `decode/tests/quant_vectors.py`, run here into a temporary directory.
//! Under CI (`CI` set) a missing python3 or gguf package fails these tests; elsewhere they skip,
//! saying why.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;
use tarfa_decode::quant::{self, QuantType};
use tarfa_decode::weights::{MatrixRef, Tensor, WeightSlice};
use tarfa_decode::Isa;
use tarfa_format::Dtype;

/// Whether python3 with gguf can run; under CI its absence fails the test.
fn gguf_py(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: python3 with the gguf package is required under CI (python3 -m pip install gguf numpy)"
        );
        eprintln!("{test}: SKIPPED: python3 with the gguf package is not installed (python3 -m pip install gguf numpy)");
    }
    ok
}

/// One case of the vectors: quantised bytes and gguf-py's output.
struct Case {
    name: String,
    ty: QuantType,
    rows: usize,
    cols: usize,
    blocks: usize,
    bytes: Vec<u8>,
    want: Vec<f32>,
}

/// Run the generator into a temporary directory and read every case.
fn vectors() -> (tempfile::TempDir, Vec<Case>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/quant_vectors.py");
    let out = Command::new("python3")
        .arg("-B")
        .arg(&script)
        .arg(dir.path())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "quant_vectors.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read = |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let manifest: Json =
        serde_json::from_slice(&read(dir.path().join("manifest.json"))).expect("manifest JSON");
    eprintln!(
        "vectors from gguf {} (numpy {})",
        manifest["gguf"], manifest["numpy"]
    );
    let cases = manifest["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let name = c["case"].as_str().expect("case").to_string();
            let ty_name = c["type"].as_str().expect("type");
            let dtype = Dtype::from_name(ty_name).expect("a JNF dtype");
            let ty = QuantType::from_dtype(dtype).expect("a supported type");
            let n = |k: &str| c[k].as_u64().expect(k) as usize;
            let bytes = read(dir.path().join(format!("{name}.bin")));
            let want: Vec<f32> = read(dir.path().join(format!("{name}.f32")))
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Case {
                name,
                ty,
                rows: n("rows"),
                cols: n("cols"),
                blocks: n("blocks"),
                bytes,
                want,
            }
        })
        .collect();
    (dir, cases)
}

/// The first element whose bits differ, named by type, block and element.
fn first_mismatch(c: &Case, got: &[f32]) -> Option<String> {
    let be = c.ty.block_elems();
    got.iter().zip(&c.want).enumerate().find_map(|(i, (g, w))| {
        (g.to_bits() != w.to_bits()).then(|| {
            format!(
                "{} ({}): block {} element {}: tarfa {:#010x} ({g:e}), gguf-py {:#010x} ({w:e})",
                c.name,
                c.ty,
                i / be,
                i % be,
                g.to_bits(),
                w.to_bits()
            )
        })
    })
}

#[test]
fn every_block_of_every_type_dequantises_to_gguf_py_bits() {
    if !gguf_py("every_block_of_every_type_dequantises_to_gguf_py_bits") {
        return;
    }
    let (_dir, cases) = vectors();
    let mut per_type: Vec<(QuantType, usize, usize)> = Vec::new();
    for c in &cases {
        assert_eq!(c.want.len(), c.rows * c.cols, "{}", c.name);
        assert_eq!(c.blocks * c.ty.block_elems(), c.want.len(), "{}", c.name);
        assert_eq!(c.bytes.len(), c.blocks * c.ty.block_bytes(), "{}", c.name);
        // The whole tensor at once.
        let mut got = vec![f32::NAN; c.want.len()];
        quant::dequantize_blocks(c.ty.dtype(), &c.bytes, &mut got).expect("dequantise");
        if let Some(m) = first_mismatch(c, &got) {
            panic!("{m}");
        }
        // Block by block, each alone.
        let (be, bb) = (c.ty.block_elems(), c.ty.block_bytes());
        let mut one = vec![f32::NAN; be];
        for (b, block) in c.bytes.chunks_exact(bb).enumerate() {
            c.ty.dequantize(block, &mut one).expect("one block");
            for (e, (g, w)) in one.iter().zip(&c.want[b * be..]).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{} ({}): block {b} element {e}, dequantised alone",
                    c.name,
                    c.ty
                );
            }
        }
        match per_type.iter_mut().find(|t| t.0 == c.ty) {
            Some(t) => {
                t.1 += c.blocks;
                t.2 += c.want.len();
            }
            None => per_type.push((c.ty, c.blocks, c.want.len())),
        }
    }
    for (t, blocks, elems) in &per_type {
        eprintln!("{t}: {blocks} blocks, {elems} elements: every bit equal to gguf-py");
    }
    // Every supported type was covered.
    for t in QuantType::ALL {
        assert!(per_type.iter().any(|p| p.0 == t), "{t}: no vectors");
    }
}

#[test]
fn the_vectors_are_not_trivial() {
    // The comparison above would be vacuous if the outputs were all zero or all alike: each
    // type's outputs must hold many distinct values of both signs (the K-quants' and Q4_1-style
    // minima included), and each random case some subnormal or zero scale blocks.
    if !gguf_py("the_vectors_are_not_trivial") {
        return;
    }
    let (_dir, cases) = vectors();
    for c in &cases {
        let mut bits: Vec<u32> = c.want.iter().map(|v| v.to_bits()).collect();
        bits.sort_unstable();
        bits.dedup();
        let neg = c.want.iter().filter(|v| **v < 0.0).count();
        let pos = c.want.iter().filter(|v| **v > 0.0).count();
        assert!(
            bits.len() > 100,
            "{}: {} distinct values",
            c.name,
            bits.len()
        );
        assert!(
            neg > 0 && pos > 0,
            "{}: {neg} negative, {pos} positive",
            c.name
        );
    }
}

#[test]
fn quantised_matrices_multiply_to_the_bits_of_their_dequantised_f32_matrix_on_every_isa() {
    if !gguf_py("quantised_matrices_multiply_to_the_bits_of_their_dequantised_f32_matrix") {
        return;
    }
    let (_dir, cases) = vectors();
    let mut rng = fastrand::Rng::with_seed(17);
    let isas = Isa::available_all();
    eprintln!("paths tested here: {isas:?}");
    let mut checked = 0;
    for c in cases.iter().filter(|c| !c.name.ends_with(".random")) {
        let q = MatrixRef {
            name: &c.name,
            rows: c.rows,
            cols: c.cols,
            data: WeightSlice::from_bytes(c.ty.dtype(), &c.bytes).expect("a quantised view"),
        };
        let f = MatrixRef {
            name: &c.name,
            rows: c.rows,
            cols: c.cols,
            data: WeightSlice::F32(&c.want),
        };
        // Rows and elements read through the view agree with gguf-py.
        for r in [0, c.rows / 2, c.rows - 1] {
            let row = q.row(r);
            assert_eq!(row.len(), c.cols);
            for i in (0..c.cols).step_by(7) {
                assert_eq!(
                    row.get(i).to_bits(),
                    c.want[r * c.cols + i].to_bits(),
                    "{} row {r} element {i}",
                    c.name
                );
            }
        }
        let xs: Vec<Vec<f32>> = (0..3)
            .map(|_| (0..c.cols).map(|_| rng.f32() * 2.0 - 1.0).collect())
            .collect();
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        let mut want = vec![vec![0.0f32; c.rows]; xs.len()];
        Isa::Scalar.matmul(f, &refs, &mut want);
        for &isa in &isas {
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("pool");
                let mut got = vec![vec![0.0f32; c.rows]; xs.len()];
                pool.install(|| isa.matmul(q, &refs, &mut got));
                let mut got_f = vec![vec![0.0f32; c.rows]; xs.len()];
                pool.install(|| isa.matmul(f, &refs, &mut got_f));
                for (t, ((g, w), gf)) in got.iter().zip(&want).zip(&got_f).enumerate() {
                    for r in 0..c.rows {
                        assert_eq!(
                            g[r].to_bits(),
                            w[r].to_bits(),
                            "{} {isa} {threads} threads: token {t} row {r}",
                            c.name
                        );
                        assert_eq!(gf[r].to_bits(), w[r].to_bits(), "{} f32 {isa}", c.name);
                    }
                }
                // The fused SwiGLU gate over a quantised pair, too.
                let mut got = vec![vec![0.0f32; c.rows]; xs.len()];
                let mut want_g = vec![vec![0.0f32; c.rows]; xs.len()];
                pool.install(|| {
                    isa.matmul_many(&mut [tarfa_decode::kernels::MatJob::swiglu_gate(
                        q, q, &refs, &mut got,
                    )])
                });
                pool.install(|| {
                    isa.matmul_many(&mut [tarfa_decode::kernels::MatJob::swiglu_gate(
                        f,
                        f,
                        &refs,
                        &mut want_g,
                    )])
                });
                assert_eq!(got, want_g, "{} {isa} swiglu", c.name);
            }
            // A band of rows, as the thread split takes them.
            let (a, b) = (c.rows / 3, c.rows / 3 + 5);
            let mut got = vec![vec![0.0f32; b - a]; 1];
            isa.matmul(q.rows(a, b), &refs[..1], &mut got);
            for (r, g) in got[0].iter().enumerate() {
                assert_eq!(g.to_bits(), want[0][a + r].to_bits(), "{} rows", c.name);
            }
        }
        checked += 1;
    }
    assert!(checked >= 2 * QuantType::ALL.len(), "{checked} matrices");
}

#[test]
fn unsupported_types_are_refused_by_name() {
    for name in ["IQ2_XXS", "IQ4_XS", "Q8_K", "TQ2_0", "I32"] {
        let dtype = Dtype::from_name(name).expect("in the dtype table");
        assert!(!quant::is_supported(dtype), "{name}");
        let g = dtype.geometry();
        let bytes = vec![0u8; g.block_bytes as usize * 4];
        let mut out = vec![0.0f32; g.block_elems as usize * 4];
        let e = quant::dequantize_blocks(dtype, &bytes, &mut out).expect_err(name);
        assert!(e.to_string().contains(name), "{name}: {e}");
        assert!(WeightSlice::from_bytes(dtype, &bytes).is_none(), "{name}");
        // A trunk tensor of that type is refused at load, naming tensor and type.
        let shape = [4u64, g.block_elems];
        let e = Tensor::from_bytes("blk.0.attn_q.weight", dtype, &shape, &bytes)
            .expect_err(name)
            .to_string();
        assert!(
            e.contains(name) && e.contains("blk.0.attn_q.weight"),
            "{name}: {e}"
        );
    }
}

#[test]
fn quantised_trunk_tensors_load_and_read_as_gguf_py_dequantises_them() {
    if !gguf_py("quantised_trunk_tensors_load_and_read_as_gguf_py_dequantises_them") {
        return;
    }
    let (_dir, cases) = vectors();
    for c in cases.iter().filter(|c| c.name.ends_with(".real_gauss")) {
        let shape = [c.rows as u64, c.cols as u64];
        let t = Tensor::from_bytes(&c.name, c.ty.dtype(), &shape, &c.bytes).expect("load");
        let m = t.matrix(c.rows, c.cols).expect("matrix");
        let r = c.rows - 1;
        let row = m.row(r);
        for i in 0..c.cols {
            assert_eq!(
                row.get(i).to_bits(),
                c.want[r * c.cols + i].to_bits(),
                "{} element {i}",
                c.name
            );
        }
        // A wrong byte length (one block short) is refused, not read past.
        let short = &c.bytes[..c.bytes.len() - c.ty.block_bytes()];
        assert!(
            Tensor::from_bytes(&c.name, c.ty.dtype(), &shape, short).is_err(),
            "{}",
            c.name
        );
        // A vector (one row) too.
        let v = Tensor::from_bytes(
            &c.name,
            c.ty.dtype(),
            &[c.cols as u64],
            &c.bytes[..c.bytes.len() / c.rows],
        )
        .expect("vector");
        let v = v.vector(c.cols).expect("vector");
        for i in 0..c.cols {
            assert_eq!(v.get(i).to_bits(), c.want[i].to_bits(), "{} vector", c.name);
        }
    }
}
