//! A rerun into an existing output checks skipped layers against the source as it is now: a
//! source whose data changed under the same headers (a fine-tune, a re-download) gets its layers
//! rewritten, so the directory equals a clean conversion of the new source.

mod common;

use std::os::unix::fs::FileExt;

use common::{run, snapshot};
use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_format::JnfReader;

#[test]
fn a_source_changed_under_the_same_headers_is_reconverted_not_skipped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, out, clean) = (
        dir.path().join("src"),
        dir.path().join("out"),
        dir.path().join("clean"),
    );
    let spec = SynthSpec {
        layers: 2,
        shards: 1,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    run(&src, &out, None).expect("first run");
    // Change one byte of layer 1's expert 2 down projection in the source, in place.
    let r = JnfReader::open(out.join("layer-00001.jnf")).expect("open");
    let i = r.projection(1, 2, tarfa_format::Role::Down).expect("down");
    let at = r.regions()[i as usize].src_begin + 5;
    drop(r);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(src.join("model.safetensors"))
        .expect("open source");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x10], at).expect("write");
    drop(f);

    let again = run(&src, &out, None).expect("rerun");
    assert_eq!(
        again.layers_written,
        vec![1],
        "only the changed layer is rewritten"
    );
    assert_eq!(again.layers_skipped, vec![0]);
    run(&src, &clean, None).expect("clean run");
    assert_eq!(
        snapshot(&out),
        snapshot(&clean),
        "the rerun equals a clean conversion of the new source"
    );
}

/// Flip one bit of the source bytes of `tensor` (a source tensor name) in place: same size, same
/// header, so the shard's `header_sha256` is unchanged.
fn flip_source_byte(src: &std::path::Path, shard: &str, out_layer: &std::path::Path, tensor: &str) {
    let r = JnfReader::open(out_layer).expect("open");
    let idx = r.index();
    let rec = r
        .regions()
        .iter()
        .find(|rec| idx.str(rec.src_tensor) == tensor)
        .expect("a region of that tensor");
    let at = rec.src_begin + 3;
    drop(r);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(src.join(shard))
        .expect("open source");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x01], at).expect("write");
}

/// Issue 13, item 5: `--layers 0-0`, then the source's layer-0 bytes change under the same
/// header, then `--layers 1-1`: the run must not present layer 0 (old bytes) and layer 1 (new
/// bytes) as one model. It is refused, naming the source file, the layer and the tensor, and
/// nothing in the directory changes.
#[test]
fn a_layers_run_after_the_source_changed_under_kept_layers_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, out) = (dir.path().join("src"), dir.path().join("out"));
    let spec = SynthSpec {
        layers: 2,
        shards: 1,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    run(&src, &out, Some((0, 0))).expect("--layers 0-0");
    let tensor = "model.layers.0.mlp.experts.1.up_proj.weight";
    flip_source_byte(
        &src,
        "model.safetensors",
        &out.join("layer-00000.jnf"),
        tensor,
    );
    let before = snapshot(&out);

    let e = run(&src, &out, Some((1, 1))).expect_err("mixing two versions of the source");
    assert!(
        matches!(
            &e,
            tarfa_converter::ConvertError::SourceChanged { layer: 0, .. }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    for want in [
        "model.safetensors",
        "layer 0",
        "layer-00000.jnf",
        tensor,
        "nothing was written",
        "--layers",
    ] {
        assert!(msg.contains(want), "{want:?} not in: {msg}");
    }
    assert_eq!(
        snapshot(&out),
        before,
        "a refused run leaves every file (the manifest included) as it was"
    );

    // Converting both layers reconverts layer 0 from the new bytes: a clean conversion.
    let both = run(&src, &out, Some((0, 1))).expect("--layers 0-1");
    assert_eq!(both.layers_replaced, vec![0]);
    let clean = dir.path().join("clean");
    run(&src, &clean, None).expect("clean run");
    assert_eq!(snapshot(&out), snapshot(&clean));
}

/// A layer file a killed run left unlisted (no manifest records what it was checked against) is
/// re-checked against the source before a later run lists it; from changed bytes it is refused.
#[test]
fn an_unlisted_layer_file_of_changed_source_bytes_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, out) = (dir.path().join("src"), dir.path().join("out"));
    let spec = SynthSpec {
        layers: 2,
        shards: 1,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    run(&src, &out, Some((0, 0))).expect("--layers 0-0");
    // As if killed after publishing the layer, before the manifest.
    std::fs::remove_file(out.join("manifest.json")).expect("remove manifest");
    let tensor = "model.layers.0.self_attn.q_proj.weight";
    flip_source_byte(
        &src,
        "model.safetensors",
        &out.join("layer-00000.jnf"),
        tensor,
    );
    let e = run(&src, &out, Some((1, 1))).expect_err("refused");
    assert!(e.to_string().contains(tensor), "{e}");
    assert!(!out.join("manifest.json").exists());
}

/// A source touched (its mtime and ctime change) but not changed: the next `--layers` run sees
/// another identity, re-hashes the kept layer's source ranges, finds them equal and goes on; the
/// directory then equals one full conversion (made now, so with the identity the last run saw),
/// byte for byte, the manifest included.
#[test]
fn a_touched_source_is_rechecked_and_the_pieces_still_equal_one_full_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, out) = (dir.path().join("src"), dir.path().join("out"));
    let spec = SynthSpec {
        layers: 3,
        shards: 2,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    run(&src, &out, Some((0, 1))).expect("--layers 0-1");
    let first = tarfa_format::manifest::Manifest::load(&out).expect("manifest");
    for e in std::fs::read_dir(&src).expect("list") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .expect("open");
            f.set_modified(
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_007),
            )
            .expect("touch");
        }
    }
    let second = run(&src, &out, Some((2, 2))).expect("--layers 2-2 after a touch");
    assert_eq!(second.layers_written, vec![2]);
    assert_eq!(second.layers_present, vec![0, 1, 2]);
    let m = tarfa_format::manifest::Manifest::load(&out).expect("manifest");
    assert_ne!(
        m.conversion.sources, first.conversion.sources,
        "the identities of the last run are recorded"
    );
    for s in &m.conversion.sources {
        assert_eq!(s.mtime_ns, Some(1_000_000_007_000_000_000), "{}", s.path);
    }
    for f in m
        .files
        .iter()
        .filter(|f| f.kind != tarfa_format::manifest::FileKind::Aux)
    {
        for r in f.sources.as_ref().expect("sources recorded") {
            let c = m
                .conversion
                .sources
                .iter()
                .find(|s| s.path == r.path)
                .expect("listed");
            assert_eq!(r.identity(), c.identity(), "{} {}", f.path, r.path);
        }
    }
    let full = dir.path().join("full");
    run(&src, &full, None).expect("full run");
    assert_eq!(snapshot(&out), snapshot(&full));
}

/// Touches the source file as soon as the first file of the conversion is done: a source that
/// changes while it is being read.
struct TouchDuringRun {
    shard: std::path::PathBuf,
    done: std::sync::atomic::AtomicBool,
}

impl tarfa_converter::Progress for TouchDuringRun {
    fn file_done(&self, _label: &str, _outcome: &tarfa_converter::Outcome) {
        if !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&self.shard)
                .expect("open");
            f.set_modified(
                std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_234_567_890),
            )
            .expect("touch");
        }
    }
}

/// A source whose identity changes while the run reads it gets no manifest: the files written
/// may hold old and new bytes. The next run re-checks what it finds and completes.
#[test]
fn a_source_changed_during_the_run_gets_no_manifest_and_the_next_run_completes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (src, out) = (dir.path().join("src"), dir.path().join("out"));
    let spec = SynthSpec {
        layers: 2,
        shards: 1,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    let progress = TouchDuringRun {
        shard: src.join("model.safetensors"),
        done: false.into(),
    };
    let opts = tarfa_converter::Options {
        layers: Some((0, 0)),
        ..Default::default()
    };
    let e = tarfa_converter::convert(&src, &out, &opts, &progress).expect_err("refused");
    let msg = e.to_string();
    assert!(
        msg.contains("changed while it was being converted") && msg.contains("model.safetensors"),
        "{msg}"
    );
    assert!(!out.join("manifest.json").exists());
    run(&src, &out, Some((1, 1))).expect("next run");
    let clean = dir.path().join("clean");
    run(&src, &clean, None).expect("clean run");
    assert_eq!(snapshot(&out), snapshot(&clean));
}
