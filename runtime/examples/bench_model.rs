//! Write a synthetic model directory shaped for `tarfa bench-io`: BF16 experts of Qwen3-30B-A3B
//! size by default (hidden 2048, expert intermediate 768: 9 MiB per expert).
//!
//! `cargo run --release -p tarfa-runtime --example bench_model -- DIR [LAYERS] [EXPERTS] [HIDDEN] [INTER]`

use tarfa_format::golden::TinyModel;
use tarfa_format::Dtype;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .ok_or("usage: bench_model DIR [LAYERS] [EXPERTS] [HIDDEN] [INTER]")?;
    let mut next = |default: u64| -> Result<u64, Box<dyn std::error::Error>> {
        Ok(args
            .next()
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(default))
    };
    let model = TinyModel {
        layers: next(16)? as u32,
        experts: next(32)? as u32,
        hidden: next(2048)?,
        inter: next(768)?,
        vocab: 256,
        expert_dtype: Dtype::BF16,
    };
    model.write(std::path::Path::new(&dir))?;
    eprintln!("wrote {dir}: {model:?}");
    Ok(())
}
