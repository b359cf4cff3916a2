//! Mutation test of the verifier: a clean conversion reports no fault, and every corruption —
//! single bits flipped at many positions of every kind of byte (region data, padding, index,
//! header, footer, manifest), truncation, appended bytes, two experts swapped, a file swapped,
//! missing or extra, a source shard changed — is found and located exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options as ConvertOptions, Quiet as ConvertQuiet};
use tarfa_format::layout::{align_up, FOOTER_LEN};
use tarfa_format::JnfReader;
use tarfa_verifier::{verify, Fault, FaultKind, Options, Quiet, Report};

struct Fixture {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    out: PathBuf,
}

/// A two-shard per-expert checkpoint and its clean conversion.
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let src = tmp.path().join("src");
    let out = tmp.path().join("out");
    let spec = SynthSpec {
        shards: 2,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    convert(&src, &out, &ConvertOptions::default(), &ConvertQuiet).expect("convert");
    Fixture {
        _tmp: tmp,
        src,
        out,
    }
}

fn run(f: &Fixture) -> Report {
    let opts = Options {
        source: Some(f.src.clone()),
        direct_io: true,
        ..Options::default()
    };
    verify(&f.out, &opts, &Quiet).expect("verification runs")
}

fn flip(path: &Path, at: u64, bit: u8) {
    let mut b = std::fs::read(path).expect("read");
    b[at as usize] ^= 1 << bit;
    std::fs::write(path, b).expect("write");
}

fn kinds(r: &Report) -> Vec<FaultKind> {
    r.faults.iter().map(|f| f.kind).collect()
}

/// What a byte of a JNF file is, so the expected fault can be named.
#[derive(Debug, Clone)]
enum ByteKind {
    Header,
    Region {
        name: String,
        offset: u64,
        src_begin: u64,
    },
    Padding,
    Index,
    Footer,
}

fn byte_map(path: &Path) -> (u64, Vec<(u64, u64, ByteKind)>) {
    let r = JnfReader::open(path).expect("open");
    let f = r.footer().clone();
    let mut spans = vec![(0, 4096, ByteKind::Header)];
    for (i, rec) in r.regions().iter().enumerate() {
        let kind = ByteKind::Region {
            name: r.name(i as u32).to_string(),
            offset: rec.offset,
            src_begin: rec.src_begin,
        };
        spans.push((rec.offset, rec.end(), kind));
        spans.push((
            rec.end(),
            align_up(rec.end()).expect("align"),
            ByteKind::Padding,
        ));
    }
    let index_end = f.index_offset + f.index_len;
    spans.push((f.index_offset, index_end, ByteKind::Index));
    spans.push((index_end, f.file_len - FOOTER_LEN as u64, ByteKind::Padding));
    spans.push((f.file_len - FOOTER_LEN as u64, f.file_len, ByteKind::Footer));
    spans.retain(|s| s.0 < s.1);
    (f.file_len, spans)
}

/// Positions to flip: the first, middle and last byte of every span, plus a seeded spread.
fn positions(len: u64, spans: &[(u64, u64, ByteKind)]) -> Vec<u64> {
    let mut p: Vec<u64> = spans
        .iter()
        .flat_map(|(a, b, _)| [*a, (a + b) / 2, b - 1])
        .collect();
    let mut s = 0x243F_6A88_85A3_08D3u64;
    for _ in 0..40 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        p.push((s >> 11) % len);
    }
    p.sort_unstable();
    p.dedup();
    p
}

fn expect_located(r: &Report, file: &str, at: u64, kind: &ByteKind) -> Result<(), String> {
    let has = |pred: &dyn Fn(&Fault) -> bool| r.faults.iter().any(|f| f.file == file && pred(f));
    let ok = match kind {
        ByteKind::Region {
            name,
            offset,
            src_begin,
        } => {
            has(&|f| f.kind == FaultKind::RegionHash && f.tensor.as_deref() == Some(name))
                && has(&|f| {
                    f.kind == FaultKind::SourceMismatch
                        && f.tensor.as_deref() == Some(name)
                        && f.offset == Some(at)
                        && f.source_offset == Some(src_begin + (at - offset))
                })
        }
        ByteKind::Padding => has(&|f| f.kind == FaultKind::Padding && f.offset == Some(at)),
        ByteKind::Header | ByteKind::Index | ByteKind::Footer => {
            has(&|f| f.kind == FaultKind::Structure)
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{file} byte {at} ({kind:?}): faults {:#?}",
            r.faults
        ))
    }
}

#[test]
fn a_clean_conversion_reports_no_fault_and_reads_every_byte() {
    let f = fixture();
    let r = run(&f);
    assert!(r.faults.is_empty(), "{:#?}", r.faults);
    let on_disk: u64 = [
        "trunk.jnf",
        "layer-00000.jnf",
        "layer-00001.jnf",
        "layer-00002.jnf",
    ]
    .iter()
    .map(|n| std::fs::metadata(f.out.join(n)).expect("stat").len())
    .sum();
    assert_eq!(r.bytes_read, on_disk, "every byte of every JNF file read");
    assert_eq!(r.files_read, 4);
    assert!(r.source_bytes_compared > 0);
}

#[test]
fn every_flipped_bit_in_a_jnf_file_is_found_and_located() {
    let f = fixture();
    let mut failures = Vec::new();
    let mut checked = 0;
    for file in ["trunk.jnf", "layer-00001.jnf"] {
        let path = f.out.join(file);
        let clean = std::fs::read(&path).expect("read");
        let (len, spans) = byte_map(&path);
        for (n, at) in positions(len, &spans).into_iter().enumerate() {
            let kind = spans
                .iter()
                .find(|s| s.0 <= at && at < s.1)
                .map(|s| s.2.clone())
                .expect("every byte is in a span");
            flip(&path, at, (n % 8) as u8);
            let r = run(&f);
            if let Err(e) = expect_located(&r, file, at, &kind) {
                failures.push(e);
            }
            std::fs::write(&path, &clean).expect("restore");
            checked += 1;
        }
    }
    assert!(checked > 100, "flipped {checked} positions");
    assert!(
        failures.is_empty(),
        "{} of {checked} flips not located:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_flipped_byte_of_the_manifest_is_found() {
    let f = fixture();
    let path = f.out.join("manifest.json");
    let clean = std::fs::read(&path).expect("read");
    let step = (clean.len() / 60).max(1);
    for at in (0..clean.len()).step_by(step).chain([clean.len() - 1]) {
        let mut b = clean.clone();
        b[at] ^= 0x04;
        std::fs::write(&path, &b).expect("write");
        let r = run(&f);
        assert!(
            kinds(&r).contains(&FaultKind::Manifest),
            "manifest byte {at} flipped: {:?}",
            r.faults
        );
        // The fault names the file and its kind once; its detail does not repeat them.
        for x in r.faults.iter().filter(|x| x.kind == FaultKind::Manifest) {
            assert!(
                !x.detail.contains("manifest.json: manifest:"),
                "manifest byte {at}: {}",
                x.detail
            );
        }
    }
}

#[test]
fn truncation_and_appended_bytes_are_found() {
    let f = fixture();
    let path = f.out.join("layer-00002.jnf");
    let clean = std::fs::read(&path).expect("read");
    std::fs::write(&path, &clean[..clean.len() - 4096]).expect("truncate");
    let r = run(&f);
    assert!(
        r.faults.iter().any(|x| x.file == "layer-00002.jnf"
            && x.kind == FaultKind::Structure
            && x.detail.contains("truncated")),
        "{:?}",
        r.faults
    );
    assert!(r
        .faults
        .iter()
        .any(|x| x.file == "layer-00002.jnf" && x.kind == FaultKind::Size));
    let mut longer = clean.clone();
    longer.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&path, &longer).expect("append");
    let r = run(&f);
    assert!(
        r.faults
            .iter()
            .any(|x| x.file == "layer-00002.jnf" && x.kind == FaultKind::Structure),
        "{:?}",
        r.faults
    );
}

#[test]
fn two_experts_swapped_on_disk_are_both_found_at_their_first_differing_byte() {
    let f = fixture();
    let path = f.out.join("layer-00001.jnf");
    let r = JnfReader::open(&path).expect("open");
    let (a, b) = (
        r.expert(1, 0).expect("e0").clone(),
        r.expert(1, 3).expect("e3").clone(),
    );
    let regions: BTreeMap<u32, (u64, u64)> = [0u32, 3]
        .iter()
        .map(|&e| {
            let g = r.projection(1, e, tarfa_format::Role::Gate).expect("gate");
            let rec = &r.regions()[g as usize];
            (e, (rec.offset, rec.src_begin))
        })
        .collect();
    let source = std::fs::read(f.src.join(r.index().str(
        r.regions()[r.projection(1, 0, tarfa_format::Role::Gate).expect("g") as usize].src_file,
    )))
    .expect("source");
    drop(r);
    let mut bytes = std::fs::read(&path).expect("read");
    assert_eq!(a.extent_len, b.extent_len);
    let ea = bytes[a.extent_offset as usize..(a.extent_offset + a.extent_len) as usize].to_vec();
    let eb = bytes[b.extent_offset as usize..(b.extent_offset + b.extent_len) as usize].to_vec();
    bytes[a.extent_offset as usize..(a.extent_offset + a.extent_len) as usize].copy_from_slice(&eb);
    bytes[b.extent_offset as usize..(b.extent_offset + b.extent_len) as usize].copy_from_slice(&ea);
    std::fs::write(&path, &bytes).expect("write");
    let rep = run(&f);
    for e in [0u32, 3] {
        let (off, src_begin) = regions[&e];
        // The first byte where the swapped-in expert's gate differs from this expert's source.
        let k = (0..)
            .find(|&k: &u64| bytes[(off + k) as usize] != source[(src_begin + k) as usize])
            .expect("experts differ");
        assert!(
            rep.faults
                .iter()
                .any(|x| x.kind == FaultKind::SourceMismatch
                    && x.expert == Some(e)
                    && x.projection.as_deref() == Some("gate")
                    && x.offset == Some(off + k)),
            "expert {e}: {:#?}",
            rep.faults
        );
        assert!(rep
            .faults
            .iter()
            .any(|x| x.kind == FaultKind::RegionHash && x.expert == Some(e)));
    }
}

#[test]
fn missing_extra_and_swapped_files_are_found() {
    let f = fixture();
    std::fs::rename(f.out.join("layer-00000.jnf"), f.out.join("x")).expect("hide");
    std::fs::copy(f.out.join("layer-00001.jnf"), f.out.join("layer-00000.jnf")).expect("swap");
    let r = run(&f);
    let k = |file: &str, kind| r.faults.iter().any(|x| x.file == file && x.kind == kind);
    assert!(
        k("layer-00000.jnf", FaultKind::WrongLayer),
        "{:?}",
        r.faults
    );
    assert!(k("layer-00000.jnf", FaultKind::FileHash));
    assert!(k("x", FaultKind::ExtraFile));
    std::fs::remove_file(f.out.join("layer-00000.jnf")).expect("rm");
    let r = run(&f);
    assert!(r
        .faults
        .iter()
        .any(|x| x.file == "layer-00000.jnf" && x.kind == FaultKind::MissingFile));
}

#[test]
fn a_changed_source_shard_is_found_at_the_exact_byte() {
    let f = fixture();
    // Change one byte of an expert's data in the second shard: the source no longer matches.
    let r = JnfReader::open(f.out.join("layer-00002.jnf")).expect("open");
    let i = r.projection(2, 1, tarfa_format::Role::Down).expect("down");
    let rec = r.regions()[i as usize].clone();
    let shard = r.index().str(rec.src_file).to_string();
    let name = r.name(i).to_string();
    drop(r);
    let at = rec.src_begin + 7;
    flip(&f.src.join(&shard), at, 3);
    let rep = run(&f);
    assert!(
        rep.faults
            .iter()
            .any(|x| x.kind == FaultKind::SourceMismatch
                && x.tensor.as_deref() == Some(name.as_str())
                && x.source_offset == Some(at)
                && x.offset == Some(rec.offset + 7)),
        "{:#?}",
        rep.faults
    );
    assert!(
        !rep.faults.iter().any(|x| x.kind == FaultKind::RegionHash),
        "the JNF bytes are intact"
    );
    // Replace the shard's header: the verifier says the source is not the one converted.
    let mut b = std::fs::read(f.src.join(&shard)).expect("read");
    b[20] ^= 1;
    std::fs::write(f.src.join(&shard), b).expect("write");
    let rep = run(&f);
    assert!(
        rep.faults
            .iter()
            .any(|x| x.kind == FaultKind::Source && x.file == shard),
        "{:#?}",
        rep.faults
    );
}

#[test]
fn sampling_and_layer_ranges_read_only_their_share_and_n_runs_cover_all() {
    let f = fixture();
    let mut read = 0;
    for n in 1..=3 {
        let opts = Options {
            sample: Some((n, 3)),
            ..Options::default()
        };
        let r = verify(&f.out, &opts, &Quiet).expect("runs");
        assert!(r.faults.is_empty());
        read += r.files_read;
    }
    assert_eq!(read, 4, "the three samples together read every file once");
    let opts = Options {
        layers: Some((1, 1)),
        ..Options::default()
    };
    let r = verify(&f.out, &opts, &Quiet).expect("runs");
    assert_eq!((r.files_read, r.files_structure_only), (1, 3));
}

#[test]
fn a_file_left_out_by_layers_or_sample_is_still_held_to_the_manifest_root() {
    use tarfa_format::golden::TinyModel;
    let (model, other) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    let ours = TinyModel {
        layers: 2,
        experts: 4,
        hidden: 16,
        inter: 24,
        vocab: 32,
        expert_dtype: tarfa_format::Dtype::BF16,
    };
    ours.write(model.path()).expect("model");
    // Same names, shapes and size; other bytes (F16 experts): only the root digest tells.
    TinyModel {
        expert_dtype: tarfa_format::Dtype::F16,
        ..ours
    }
    .write(other.path())
    .expect("other");
    std::fs::copy(
        other.path().join("layer-00001.jnf"),
        model.path().join("layer-00001.jnf"),
    )
    .expect("swap");
    for opts in [
        Options::default(),
        Options {
            layers: Some((0, 0)),
            ..Options::default()
        },
        Options {
            sample: Some((1, 3)),
            ..Options::default()
        },
    ] {
        let r = verify(model.path(), &opts, &Quiet).expect("runs");
        assert!(
            r.faults
                .iter()
                .any(|f| f.file == "layer-00001.jnf" && f.kind == FaultKind::FileHash),
            "{opts:?}: {:#?}",
            r.faults
        );
    }
}
