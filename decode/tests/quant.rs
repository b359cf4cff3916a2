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
//! A missing python3 or gguf package skips these tests, saying so, or fails them where tools are
//! required (`tarfa_testtools`: `TARFA_REQUIRE_TOOLS=1`, as `.ci/run` sets, or `CI`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value as Json;
use tarfa_decode::error::{ExpertFault, TensorFault};
use tarfa_decode::quant::{self, QuantType};
use tarfa_decode::weights::{MatrixRef, Tensor, WeightSlice};
use tarfa_decode::{DecodeError, Isa};
use tarfa_format::Dtype;

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
    if !tarfa_testtools::python_gguf() {
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
    // case's outputs hold many distinct values (MXFP4: several scales' worth) of both signs, and
    // each random case of a block type holds all-zero blocks (zero scale or zero quant bits)
    // beside non-zero blocks whose values are all tiny (|v| < 2^-10: subnormal F16 scales, small
    // E8M0 exponents).
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let (_dir, cases) = vectors();
    for c in &cases {
        let mut bits: Vec<u32> = c.want.iter().map(|v| v.to_bits()).collect();
        bits.sort_unstable();
        bits.dedup();
        let neg = c.want.iter().filter(|v| **v < 0.0).count();
        let pos = c.want.iter().filter(|v| **v > 0.0).count();
        if c.name.ends_with(".random") && c.ty.block_elems() > 1 {
            let be = c.ty.block_elems();
            let blocks: Vec<&[f32]> = c.want.chunks_exact(be).collect();
            let zero = blocks
                .iter()
                .filter(|b| b.iter().all(|v| *v == 0.0))
                .count();
            let tiny = blocks
                .iter()
                .filter(|b| b.iter().any(|v| *v != 0.0) && b.iter().all(|v| v.abs() < 1.0 / 1024.0))
                .count();
            assert!(
                zero > 0 && tiny > 0,
                "{}: {zero} zero, {tiny} tiny blocks",
                c.name
            );
        }
        // MXFP4 holds 15 values per power-of-two scale: more than 15 means several scales.
        let floor = if c.ty == QuantType::MXFP4 { 15 } else { 50 };
        assert!(
            bits.len() > floor,
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
    if !tarfa_testtools::python_gguf() {
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
        // Five tokens: a group of four (AVX-512) or two pairs (AVX2) and one alone.
        let xs: Vec<Vec<f32>> = (0..5)
            .map(|_| (0..c.cols).map(|_| rng.f32() * 2.0 - 1.0).collect())
            .collect();
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        let mut want = vec![vec![0.0f32; c.rows]; xs.len()];
        Isa::Scalar.matmul(f, &refs, &mut want);
        for &isa in &isas {
            for threads in [1, 3] {
                let team = tarfa_decode::team::Team::new(threads, "test").expect("team");
                let mut got = vec![vec![0.0f32; c.rows]; xs.len()];
                tarfa_decode::team::install(&team, || isa.matmul(q, &refs, &mut got));
                let mut got_f = vec![vec![0.0f32; c.rows]; xs.len()];
                tarfa_decode::team::install(&team, || isa.matmul(f, &refs, &mut got_f));
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
                tarfa_decode::team::install(&team, || {
                    isa.matmul_many(&mut [tarfa_decode::kernels::MatJob::swiglu_gate(
                        q, q, &refs, &mut got,
                    )])
                });
                tarfa_decode::team::install(&team, || {
                    isa.matmul_many(&mut [tarfa_decode::kernels::MatJob::swiglu_gate(
                        f,
                        f,
                        &refs,
                        &mut want_g,
                    )])
                });
                assert_eq!(got, want_g, "{} {isa} swiglu", c.name);
            }
            // One quantised row through `Isa::dot` (the slow path, outside a product).
            for r in [0, c.rows - 1] {
                assert_eq!(
                    isa.dot(q.row(r), refs[0]).to_bits(),
                    want[0][r].to_bits(),
                    "{} {isa} dot of row {r}",
                    c.name
                );
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
    for name in ["IQ2_XXS", "IQ3_S", "IQ1_M", "Q8_K", "Q8_1", "NVFP4", "I32"] {
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
        let e = Tensor::from_bytes("blk.0.attn_q.weight", dtype, &shape, &bytes).expect_err(name);
        assert!(
            matches!(
                &e,
                DecodeError::BadTensor { name: t, fault: TensorFault::Unsupported { dtype: d } }
                    if t == "blk.0.attn_q.weight" && *d == dtype
            ),
            "{name}: {e}"
        );
        let e = e.to_string();
        assert!(
            e.contains(name) && e.contains("blk.0.attn_q.weight"),
            "{name}: {e}"
        );
    }
}

#[test]
fn quantised_trunk_tensors_load_and_read_as_gguf_py_dequantises_them() {
    if !tarfa_testtools::python_gguf() {
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
        let e = Tensor::from_bytes(&c.name, c.ty.dtype(), &shape, short).expect_err(&c.name);
        assert!(
            matches!(
                &e,
                DecodeError::BadTensor { fault: TensorFault::ByteLength { bytes, want, .. }, .. }
                    if *bytes == short.len() && *want == c.bytes.len() as u64
            ),
            "{}: {e}",
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

/// Tensors by name: (type name, row-major shape, values).
type PyTensors = std::collections::HashMap<String, (String, Vec<usize>, Vec<f32>)>;

/// gguf-py's dequantisation of every tensor of a GGUF file.
fn gguf_py_tensors(gguf: &Path) -> (tempfile::TempDir, PyTensors) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/quant_vectors.py");
    let out = Command::new("python3")
        .arg("-B")
        .arg(&script)
        .arg("--dequantize-gguf")
        .arg(gguf)
        .arg(dir.path())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "quant_vectors.py --dequantize-gguf: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest: Json =
        serde_json::from_slice(&std::fs::read(dir.path().join("manifest.json")).expect("read"))
            .expect("JSON");
    let mut map = std::collections::HashMap::new();
    for t in manifest["tensors"].as_array().expect("tensors") {
        let file = dir.path().join(t["file"].as_str().expect("file"));
        let values = std::fs::read(&file)
            .expect("read")
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let shape = t["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("dim") as usize)
            .collect();
        map.insert(
            t["name"].as_str().expect("name").to_string(),
            (t["type"].as_str().expect("type").to_string(), shape, values),
        );
    }
    (dir, map)
}

/// `src` (a GGUF file) converted to JNF by tarfa's converter.
fn convert_gguf(src: &Path) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("model");
    tarfa_converter::convert(
        src,
        &out,
        &tarfa_converter::Options {
            layers: None,
            direct_io: false,
            jobs: 1,
        },
        &tarfa_converter::Quiet,
    )
    .unwrap_or_else(|e| panic!("convert {}: {e}", src.display()));
    (tmp, out)
}

fn expert_store(dir: &Path) -> tarfa_decode::Result<tarfa_decode::experts::ExpertStore> {
    let model = tarfa_runtime::ModelExperts::open(dir)?;
    let opts = tarfa_runtime::SourceOptions {
        backend: tarfa_runtime::BackendChoice::Only(tarfa_runtime::BackendKind::Pread),
        lock_memory: false,
        fixed_buffers: false,
        direct_io: false,
        ..Default::default()
    };
    let source = tarfa_runtime::ExpertSource::with_model(model, &opts)?;
    tarfa_decode::experts::ExpertStore::new(
        source,
        &tarfa_decode::ExpertOptions {
            mode: tarfa_decode::ExpertMode::Stream,
            cache_bytes: 0,
        },
    )
}

/// Every element of `w` as `f32`, row by row as the kernels take it.
fn row_values(m: MatrixRef<'_>) -> Vec<f32> {
    let mut v = Vec::with_capacity(m.rows * m.cols);
    for r in 0..m.rows {
        let row = m.row(r);
        v.extend((0..m.cols).map(|i| row.get(i)));
    }
    v
}

/// Bits equal, element by element, NaNs included (the fixture's random-byte K-quant blocks have
/// infinite and NaN scales, and even the NaNs' payloads agree with numpy's on x86-64). Returns
/// how many NaNs were compared.
fn assert_same(what: &str, got: &[f32], want: &[f32]) -> usize {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{what}: element {i}: tarfa {g:e}, gguf-py {w:e}"
        );
    }
    want.iter().filter(|w| w.is_nan()).count()
}

#[test]
fn a_converted_quantised_gguf_reads_as_gguf_py_dequantises_it() {
    // fixtures/gguf/moe-model.gguf (Q4_K, Q5_K, Q8_0, Q6_K expert stacks; Q8_0, F16, F32 trunk
    // tensors) through tarfa's converter: every expert region, viewed by the decoder as a
    // [rows, cols] matrix (GGUF's ne reversed: cols = ne[0]), and every resident tensor hold
    // gguf-py's values element for element.
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf/moe-model.gguf");
    let (_py, want) = gguf_py_tensors(&src);
    let (_tmp, dir) = convert_gguf(&src);
    let model = tarfa_runtime::ModelExperts::open(&dir).expect("open layer files");
    let manifest = tarfa_format::manifest::Manifest::load(&dir).expect("manifest");
    let store = tarfa_decode::TensorStore::load(&dir, &manifest, &model).expect("tensors");
    let mut nans = 0;
    let mut resident = 0;
    for (name, (ty, shape, values)) in &want {
        let Some(t) = store.find(name) else { continue };
        assert_eq!(t.shape(), &shape[..], "{name} ({ty}): shape");
        let m = match shape[..] {
            [r, c] => t.matrix(r, c).expect("matrix"),
            [n] => MatrixRef {
                name,
                rows: 1,
                cols: n,
                data: t.vector(n).expect("vector"),
            },
            _ => panic!("{name}: shape {shape:?}"),
        };
        nans += assert_same(&format!("{name} ({ty})"), &row_values(m), values);
        resident += 1;
    }
    let mut experts = expert_store(&dir).expect("expert store");
    let mut parts = std::collections::BTreeMap::<String, usize>::new();
    for (layer, e) in model.all() {
        experts
            .with_experts(layer, &[e], |views| {
                for v in views {
                    for role in v.roles() {
                        let m = v.part(role).expect("part");
                        // Region `NAME[e]`: expert e of the GGUF stack NAME.
                        let stack = m.name.strip_suffix(&format!("[{e}]")).unwrap_or(m.name);
                        let (ty, shape, values) = want
                            .get(stack)
                            .unwrap_or_else(|| panic!("{}: not in the GGUF", m.name));
                        // The stack's [experts, rows, cols] (or [experts, n] for a bias).
                        let per = values.len() / shape[0];
                        assert_eq!(m.rows * m.cols, per, "{}", m.name);
                        assert_eq!(m.cols, *shape.last().expect("dims"), "{}: cols", m.name);
                        let what = format!("{} ({ty}) expert {e}", m.name);
                        let slice = &values[e as usize * per..(e as usize + 1) * per];
                        nans += assert_same(&what, &row_values(m), slice);
                        *parts.entry(format!("{stack} {ty}")).or_default() += 1;
                    }
                }
                Ok(())
            })
            .expect("experts");
    }
    eprintln!("{resident} resident tensors; expert regions per stack {parts:?}; {nans} NaNs among the values, bits equal too");
    assert!(resident >= 10, "{resident} resident tensors compared");
    for ty in ["Q4_K", "Q5_K", "Q6_K", "Q8_0"] {
        assert!(
            parts.keys().any(|k| k.ends_with(ty)),
            "no {ty} expert region compared"
        );
    }
}

#[test]
fn unsupported_types_in_a_model_are_refused_by_name_before_the_first_token() {
    // A GGUF whose output matrix is IQ3_S and whose gate/up experts are IQ2_XXS: loading the
    // resident tensors names the IQ3_S tensor; building the expert store (before any expert is
    // selected) names the IQ2_XXS region.
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("unsupported.gguf");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/quant_vectors.py");
    let out = Command::new("python3")
        .arg("-B")
        .arg(&script)
        .arg("--unsupported-gguf")
        .arg(&src)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (_tmp, dir) = convert_gguf(&src);
    let model = tarfa_runtime::ModelExperts::open(&dir).expect("open layer files");
    let manifest = tarfa_format::manifest::Manifest::load(&dir).expect("manifest");
    let e = tarfa_decode::TensorStore::load(&dir, &manifest, &model).expect_err("IQ3_S refused");
    assert!(
        matches!(
            &e,
            DecodeError::BadTensor { name, fault: TensorFault::Unsupported { dtype } }
                if name == "output.weight" && dtype.name() == "IQ3_S"
        ),
        "{e}"
    );
    let e = expert_store(&dir).expect_err("IQ2_XXS refused");
    assert!(
        matches!(
            &e,
            DecodeError::BadExpert { fault: ExpertFault::Unsupported { region, dtype }, .. }
                if region.contains("ffn_") && dtype.name() == "IQ2_XXS"
        ),
        "{e}"
    );
    eprintln!("refused: {e}");
}
