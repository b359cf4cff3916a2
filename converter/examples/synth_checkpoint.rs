//! Write a generated Qwen3-MoE-shaped HF checkpoint of about N GiB, for measuring the converter,
//! verifier and runtime on another machine with the release binaries alone:
//!
//! ```sh
//! cargo build --release -p tarfa-converter --example synth_checkpoint
//! target/release/examples/synth_checkpoint DIR GIB [SHARDS]
//! ```
//! Layers are hidden 2048, 128 experts of intermediate 768 (about 1.2 GB each, BF16).

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(gib)) = (args.get(1), args.get(2).and_then(|g| g.parse::<f64>().ok()))
    else {
        eprintln!("usage: synth_checkpoint DIR GIB [SHARDS]");
        std::process::exit(2);
    };
    let shards = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(4);
    let mut spec = SynthSpec {
        layers: 1,
        experts: 128,
        hidden: 2048,
        inter: 768,
        vocab: 32768,
        fused: false,
        shards,
        mtp: false,
    };
    let per_layer = spec.data_bytes() as f64;
    spec.layers = ((gib * (1u64 << 30) as f64) / per_layer).ceil().max(1.0) as u32;
    let t = std::time::Instant::now();
    if let Err(e) = write_checkpoint(std::path::Path::new(dir), &spec) {
        eprintln!("error: {dir}: {e}");
        std::process::exit(1);
    }
    println!(
        "{dir}: {} layers x {} experts, {} bytes in {} shards, written in {:.1} s",
        spec.layers,
        spec.experts,
        spec.data_bytes(),
        spec.shards,
        t.elapsed().as_secs_f64()
    );
}
