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
