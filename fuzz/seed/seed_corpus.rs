//! Seed the corpora from the golden vectors: `cargo run --release --bin seed_corpus -- corpus`.
//! Every `.jnf` goes to `jnf_reader/`, every `manifest.json` to `manifest/`, and each `.jnf`'s
//! header fields and index bytes, re-encoded, to `jnf_index/`.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tarfa_format::layout::ALIGN;
use tarfa_format::JnfReader;
use tarfa_format_fuzz::{IndexInput, Scratch};

fn main() {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus".into()));
    let golden = std::env::temp_dir().join(format!("tarfa-golden-{}", std::process::id()));
    let files = tarfa_format::golden::write_all(&golden).expect("write golden vectors");
    for t in ["jnf_reader", "jnf_index", "manifest"] {
        std::fs::create_dir_all(out.join(t)).expect("mkdir corpus");
    }
    let seed_name = |rel: &Path| rel.to_string_lossy().replace('/', "__");
    for rel in &files {
        let src = golden.join(rel);
        let name = seed_name(rel);
        if rel.extension().is_some_and(|e| e == "jnf") {
            std::fs::copy(&src, out.join("jnf_reader").join(&name)).expect("copy seed");
            let r = JnfReader::open(&src).expect("golden vector opens");
            let (h, f) = (r.header(), r.footer());
            let mut index = vec![0u8; f.index_len as usize];
            std::fs::File::open(&src)
                .and_then(|file| file.read_exact_at(&mut index, f.index_offset))
                .expect("read index");
            let input = IndexInput {
                layer_first: h.layer_first,
                layer_count: h.layer_count,
                experts_per_layer: h.experts_per_layer,
                region_count: f.region_count,
                expert_count: f.expert_count,
                index_page: u32::try_from(f.index_offset / ALIGN).expect("small"),
                index: &index,
            };
            // The seed must rebuild into a file that opens, or jnf_index starts outside check_index_from.
            let rebuilt = Scratch::new("seed");
            input.write_file(rebuilt.reset());
            if let Err(e) = JnfReader::open(rebuilt.path()) {
                panic!("jnf_index seed {name} does not rebuild into a valid file: {e}");
            }
            std::fs::write(out.join("jnf_index").join(&name), input.encode()).expect("write seed");
        } else if rel.file_name().is_some_and(|n| n == "manifest.json") {
            std::fs::copy(&src, out.join("manifest").join(&name)).expect("copy seed");
        }
    }
    std::fs::remove_dir_all(&golden).expect("remove golden temp dir");
    for t in ["jnf_reader", "jnf_index", "manifest"] {
        let n = std::fs::read_dir(out.join(t)).map_or(0, |d| d.count());
        println!("{t}: {n} seeds");
    }
}
