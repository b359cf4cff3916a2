//! Matrix-vector rate of the canonical kernels against this machine's memory read rate:
//! `cargo run --release -p tarfa-decode --example matvec_rate [ROWS COLS THREADS]`.
use std::time::Instant;

use tarfa_decode::weights::{MatrixRef, WeightSlice};
use tarfa_decode::Isa;

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    let (rows, cols, threads) = (
        *a.first().unwrap_or(&32768),
        *a.get(1).unwrap_or(&2048),
        *a.get(2).unwrap_or(&2),
    );
    let w: Vec<u16> = (0..rows * cols).map(|i| (i as u16) & 0x3f7f).collect();
    let x: Vec<f32> = (0..cols).map(|i| i as f32 * 1e-3).collect();
    let m = MatrixRef {
        name: "w",
        rows,
        cols,
        data: WeightSlice::Bf16(&w),
    };
    let team = tarfa_decode::team::Team::new(threads, "test").expect("team");
    for isa in Isa::available_all() {
        let mut out = vec![vec![0.0f32; rows]];
        let mut best = f64::MAX;
        for _ in 0..10 {
            let t = Instant::now();
            tarfa_decode::team::install(&team, || isa.matmul(m, &[&x], &mut out));
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "{isa:>7}: {:.2} GB/s ({rows}x{cols} BF16, {threads} threads, best of 10)",
            (rows * cols * 2) as f64 / best / 1e9
        );
    }
}
