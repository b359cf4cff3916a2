//! Property: whatever the writer emits, the reader accepts, and returns byte-identical regions with
//! the hashes the writer reported; every region and expert lands on a 4096-byte boundary.

use proptest::prelude::*;
use sha2::Digest;
use tarfa_format::{Dtype, FileLayout, JnfReader, JnfWriter, Provenance, RegionSpec, Role};

#[derive(Clone, Debug)]
struct Tensor {
    dtype: Dtype,
    shape: Vec<u64>,
    seed: u8,
    with_source: bool,
}

fn tensor() -> impl Strategy<Value = Tensor> {
    let dtypes = prop::sample::select(vec!["BF16", "F32", "U8", "Q8_0", "Q4_K", "F4", "F6_E2M3"]);
    (
        dtypes,
        prop::collection::vec(0u64..5, 0..4),
        1u64..40,
        any::<u8>(),
        any::<bool>(),
    )
        .prop_map(|(d, mut outer, row, seed, with_source)| {
            let dtype = Dtype::from_name(d).expect("known dtype");
            // The innermost dimension is a whole number of blocks: sometimes tiny, sometimes
            // spanning several pages.
            outer.push(row * dtype.geometry().block_elems);
            Tensor {
                dtype,
                shape: outer,
                seed,
                with_source,
            }
        })
}

#[derive(Clone, Debug)]
struct Plan {
    layers: u32,
    experts: u32,
    trunk: Vec<Tensor>,
    fused: bool,
    expert_tensors: Vec<Tensor>,
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        0u32..3,
        0u32..4,
        prop::collection::vec(tensor(), 0..5),
        any::<bool>(),
        prop::collection::vec(tensor(), 3),
    )
        .prop_map(|(layers, experts, trunk, fused, expert_tensors)| Plan {
            layers,
            experts: if layers == 0 { 0 } else { experts },
            trunk,
            fused,
            expert_tensors,
        })
}

fn bytes_for(t: &Tensor, salt: u32) -> Vec<u8> {
    let n = t.dtype.byte_len(&t.shape).expect("valid shape") as usize;
    (0..n)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(salt)
                .to_le_bytes()[1]
                ^ t.seed
        })
        .collect()
}

fn spec(name: String, t: &Tensor, layer: Option<u32>) -> RegionSpec {
    RegionSpec {
        name: name.clone(),
        dtype: t.dtype,
        shape: t.shape.clone(),
        layer,
        source: t.with_source.then(|| Provenance {
            file: "src.safetensors".into(),
            tensor: name,
            begin: 77,
            shape: t.shape.clone(),
        }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn reader_returns_exactly_what_the_writer_wrote(p in plan()) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("p.jnf");
        let layout = if p.layers == 0 {
            FileLayout::trunk()
        } else {
            FileLayout { layer_first: 2, layer_count: p.layers, experts_per_layer: p.experts }
        };
        let mut w = JnfWriter::create(&path, layout).expect("create");
        let mut expected: Vec<(String, Vec<u8>, tarfa_format::DualHash)> = Vec::new();
        for (i, t) in p.trunk.iter().enumerate() {
            let s = spec(format!("trunk.{i}"), t, None);
            let data = bytes_for(t, i as u32);
            let h = w.tensor(&s, &mut &data[..]).expect("tensor");
            expected.push((s.name, data, h));
        }
        let roles: &[Role] = if p.fused { &[Role::GateUp, Role::Down] } else { &[Role::Gate, Role::Up, Role::Down] };
        for l in 2..2 + p.layers {
            for e in 0..p.experts {
                let mut x = w.begin_expert(l, e).expect("begin");
                for (k, role) in roles.iter().enumerate() {
                    let t = &p.expert_tensors[k];
                    let s = spec(format!("l{l}.e{e}.{}", role.name()), t, None);
                    let data = bytes_for(t, l * 1000 + e * 10 + k as u32);
                    let h = x.projection(*role, &s, &mut &data[..]).expect("projection");
                    expected.push((s.name, data, h));
                }
                w = x.end_expert().expect("end");
            }
        }
        let written = w.finish().expect("finish");

        let r = JnfReader::open(&path).expect("reader accepts the writer's output");
        r.verify_data().expect("every hash and padding byte checks");
        prop_assert_eq!(r.root(), &written.root);
        prop_assert_eq!(r.regions().len(), expected.len());
        prop_assert_eq!(std::fs::metadata(&path).expect("stat").len(), written.file_len);
        prop_assert_eq!(written.file_len % 4096, 0);
        for (name, data, h) in &expected {
            let i = r.region_by_name(name).expect("region by name");
            let rec = &r.regions()[i as usize];
            prop_assert_eq!(rec.offset % 4096, 0);
            prop_assert_eq!(&r.read_region(i).expect("read"), data);
            prop_assert_eq!(rec.sha256, <[u8; 32]>::from(sha2::Sha256::digest(data)));
            prop_assert_eq!(rec.blake3, *blake3::hash(data).as_bytes());
            prop_assert_eq!((rec.sha256, rec.blake3), (h.sha256, h.blake3));
        }
        for l in 2..2 + p.layers {
            for e in 0..p.experts {
                let x = r.expert(l, e).expect("expert lookup");
                prop_assert_eq!((x.layer, x.expert), (l, e));
                prop_assert_eq!(x.extent_offset % 4096, 0);
                prop_assert_eq!(x.extent_len % 4096, 0);
                for role in roles {
                    let i = r.projection(l, e, *role).expect("projection lookup");
                    prop_assert_eq!(r.name(i), format!("l{l}.e{e}.{}", role.name()));
                }
            }
        }
    }
}

/// O_DIRECT and buffered writes produce the same bytes (written on the build's own disk, where
/// O_DIRECT is usually allowed; where it is not, the writer falls back and says so).
#[test]
fn direct_and_buffered_writes_give_identical_files() {
    use tarfa_format::writer::WriterOptions;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let mut files = Vec::new();
    let mut direct_used = Vec::new();
    for direct_io in [false, true] {
        let path = dir.path().join(format!("d{direct_io}.jnf"));
        let mut w =
            JnfWriter::create_with(&path, FileLayout::layer(0, 2), WriterOptions { direct_io })
                .expect("create");
        let big: Vec<u8> = (0..(9 << 20) + 5).map(|i: u32| (i % 251) as u8).collect();
        let t = Tensor {
            dtype: Dtype::U8,
            shape: vec![big.len() as u64],
            seed: 0,
            with_source: false,
        };
        w.tensor(&spec("big".into(), &t, Some(0)), &mut &big[..])
            .expect("big");
        for e in 0..2 {
            let mut x = w.begin_expert(0, e).expect("begin");
            let t = Tensor {
                dtype: Dtype::BF16,
                shape: vec![3, 1000],
                seed: e as u8,
                with_source: false,
            };
            x.projection(
                Role::Down,
                &spec(format!("e{e}"), &t, None),
                &mut &bytes_for(&t, e)[..],
            )
            .expect("p");
            w = x.end_expert().expect("end");
        }
        let written = w.finish().expect("finish");
        direct_used.push(written.direct_io);
        let r = JnfReader::open(&path).expect("open");
        r.verify_data().expect("verify");
        files.push(std::fs::read(&path).expect("read"));
    }
    assert!(!direct_used[0], "buffered when not asked for O_DIRECT");
    // Where this filesystem takes O_DIRECT, the writer must have used it when asked.
    let fs_allows = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.path().join("probe"))
            .is_ok()
    };
    if fs_allows {
        assert!(
            direct_used[1],
            "O_DIRECT asked for and allowed, but not used"
        );
    } else {
        eprintln!(
            "note: {} refuses O_DIRECT: the fallback was tested",
            dir.path().display()
        );
    }
    assert!(files[0] == files[1], "same bytes either way");
}
