//! Every instruction-set path of the canonical kernels gives the scalar reference's bits, for
//! every length (tails included) and for inputs where the summation order shows in the result.

use tarfa_decode::canon;
use tarfa_decode::weights::{MatrixRef, WeightSlice};
use tarfa_decode::Isa;

const LENGTHS: &[usize] = &[
    0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 200, 2047, 2048, 2049, 4099,
];

/// Values spanning many binades with cancellations, so any change of order changes bits.
fn hostile(rng: &mut fastrand::Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let mag = 10f32.powi(rng.i32(-8..=8));
            let v = (rng.f32() - 0.5) * mag;
            if i % 13 == 5 {
                -v * 1e4
            } else {
                v
            }
        })
        .collect()
}

fn bf16_of(v: &[f32]) -> Vec<u16> {
    v.iter().map(|x| (x.to_bits() >> 16) as u16).collect()
}

#[test]
fn every_isa_dot_matches_the_scalar_reference_bit_for_bit() {
    let mut rng = fastrand::Rng::with_seed(7);
    let isas = Isa::available_all();
    eprintln!("paths tested here: {isas:?}");
    for &n in LENGTHS {
        for _ in 0..20 {
            let x = hostile(&mut rng, n);
            let wf = hostile(&mut rng, n);
            let wb = bf16_of(&hostile(&mut rng, n));
            let want_b = canon::dot_bf16(&wb, &x).to_bits();
            let want_f = canon::dot_f32(&wf, &x).to_bits();
            for &isa in &isas {
                assert_eq!(isa.dot_bf16(&wb, &x).to_bits(), want_b, "{isa} bf16 n={n}");
                assert_eq!(isa.dot_f32(&wf, &x).to_bits(), want_f, "{isa} f32 n={n}");
            }
        }
    }
}

#[test]
fn the_order_is_observable_so_the_equality_above_is_not_vacuous() {
    // A plain left-to-right sum and the canonical order differ on these inputs: the test above
    // would catch a path that summed in another order.
    let mut rng = fastrand::Rng::with_seed(11);
    let mut differ = 0;
    for _ in 0..100 {
        let x: Vec<f32> = (0..100).map(|_| rng.f32() - 0.5).collect();
        let w: Vec<f32> = (0..100).map(|_| rng.f32() - 0.5).collect();
        let seq = w.iter().zip(&x).fold(0.0f32, |a, (p, q)| p.mul_add(*q, a));
        if seq.to_bits() != canon::dot_f32(&w, &x).to_bits() {
            differ += 1;
        }
    }
    assert!(differ > 30, "only {differ} of 100 differ");
}

#[test]
fn matmul_bits_do_not_depend_on_threads_or_batch() {
    let mut rng = fastrand::Rng::with_seed(3);
    let (rows, cols) = (67, 301);
    let w = bf16_of(&hostile(&mut rng, rows * cols));
    let m = MatrixRef {
        name: "w",
        rows,
        cols,
        data: WeightSlice::Bf16(&w),
    };
    let xs: Vec<Vec<f32>> = (0..5).map(|_| hostile(&mut rng, cols)).collect();
    let want: Vec<Vec<u32>> = xs
        .iter()
        .map(|x| {
            (0..rows)
                .map(|r| canon::dot_bf16(m.bf16_row(r), x).to_bits())
                .collect()
        })
        .collect();
    for &isa in &Isa::available_all() {
        for threads in [1, 2, 3, 8] {
            let team = tarfa_decode::team::Team::new(threads, "test").expect("team");
            // The whole batch at once, and each token alone.
            let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
            let mut out = vec![vec![0.0f32; rows]; xs.len()];
            tarfa_decode::team::install(&team, || isa.matmul(m, &refs, &mut out));
            let got: Vec<Vec<u32>> = out
                .iter()
                .map(|r| r.iter().map(|v| v.to_bits()).collect())
                .collect();
            assert_eq!(got, want, "{isa}, {threads} threads, batch");
            for (x, w) in xs.iter().zip(&want) {
                let mut one = vec![vec![0.0f32; rows]];
                tarfa_decode::team::install(&team, || isa.matmul(m, &[x.as_slice()], &mut one));
                let got: Vec<u32> = one[0].iter().map(|v| v.to_bits()).collect();
                assert_eq!(&got, w, "{isa}, {threads} threads, one token");
            }
        }
    }
}

#[test]
fn weighted_rows_and_sum_follow_the_lane_rule() {
    // weighted_rows(a, rows)[d] must equal the canonical dot of a with column d.
    let mut rng = fastrand::Rng::with_seed(5);
    for t in [1usize, 5, 31, 32, 33, 70] {
        let a = hostile(&mut rng, t);
        let rows: Vec<Vec<f32>> = (0..t).map(|_| hostile(&mut rng, 9)).collect();
        let mut out = vec![0.0f32; 9];
        canon::weighted_rows(&a, |i| &rows[i], &mut out);
        for d in 0..9 {
            let col: Vec<f32> = rows.iter().map(|r| r[d]).collect();
            assert_eq!(
                out[d].to_bits(),
                canon::dot_f32(&a, &col).to_bits(),
                "t={t} d={d}"
            );
        }
        let ones = vec![1.0f32; t];
        assert_eq!(
            canon::sum(&a).to_bits(),
            canon::dot_f32(&a, &ones).to_bits(),
            "sum t={t}"
        );
    }
}

/// A row meets several tokens at once (four on AVX-512, two on AVX2, each part of the row loaded
/// once for all of them): every output is still that token's canonical dot — and, for a
/// gate/up pair, `silu(gate·x)·(up·x)` of those dots — bit for bit the scalar reference's, for
/// batches of 1 to 9 tokens, BF16 and `f32` rows, lengths with and without a tail.
#[test]
fn a_row_meeting_several_tokens_at_once_gives_each_its_own_dot() {
    use tarfa_decode::kernels::MatJob;
    let mut rng = fastrand::Rng::with_seed(11);
    let rows = 13;
    for cols in [32, 64, 301, 1000] {
        let (gate_f, up_f) = (
            hostile(&mut rng, rows * cols),
            hostile(&mut rng, rows * cols),
        );
        let (gate_b, up_b) = (bf16_of(&gate_f), bf16_of(&up_f));
        for batch in 1..=9 {
            let xs: Vec<Vec<f32>> = (0..batch).map(|_| hostile(&mut rng, cols)).collect();
            let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
            for bf16 in [true, false] {
                let (gate, g) = matrix("gate", bf16, cols, &gate_b, &gate_f, &xs);
                let (up, u) = matrix("up", bf16, cols, &up_b, &up_f, &xs);
                let want = bits(&g);
                let want_g: Vec<Vec<u32>> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| {
                        g.iter()
                            .zip(u)
                            .map(|(&g, &u)| Isa::Scalar.silu_mul_one(g, u).to_bits())
                            .collect()
                    })
                    .collect();
                for &isa in &Isa::available_all() {
                    let what = format!("{isa}, cols {cols}, batch {batch}, bf16 {bf16}");
                    let mut out = vec![vec![0.0f32; rows]; batch];
                    isa.matmul(gate, &refs, &mut out);
                    assert_eq!(bits(&out), want, "{what}");
                    let mut out = vec![vec![0.0f32; rows]; batch];
                    isa.matmul_many(&mut [MatJob::swiglu_gate(gate, up, &refs, &mut out)]);
                    assert_eq!(bits(&out), want_g, "{what}, gate/up pair");
                }
            }
        }
    }
}

/// 13 rows of `b` (BF16) or `f` as a matrix, and each token's canonical dots with its rows.
fn matrix<'a>(
    name: &'static str,
    bf16: bool,
    cols: usize,
    b: &'a [u16],
    f: &'a [f32],
    xs: &[Vec<f32>],
) -> (MatrixRef<'a>, Vec<Vec<f32>>) {
    let rows = 13;
    let dots = xs
        .iter()
        .map(|x| {
            (0..rows)
                .map(|r| {
                    let span = r * cols..(r + 1) * cols;
                    if bf16 {
                        canon::dot_bf16(&b[span], x)
                    } else {
                        canon::dot_f32(&f[span], x)
                    }
                })
                .collect()
        })
        .collect();
    let data = if bf16 {
        WeightSlice::Bf16(b)
    } else {
        WeightSlice::F32(f)
    };
    (
        MatrixRef {
            name,
            rows,
            cols,
            data,
        },
        dots,
    )
}

fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|v| v.to_bits()).collect())
        .collect()
}
