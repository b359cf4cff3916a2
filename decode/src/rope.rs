//! Rotary position embedding exactly as transformers computes it (`research/model-families.md`
//! §1.5), with tarfa's own `pow` and `sin`/`cos` so that no libm decides a bit:
//!
//! - `e_j = f32(f32(2j) / f32(R))`, `inv_j = f32(1 / f32(θ_f32 ^ e_j))` with the power computed
//!   in `f64` (own `exp`/`ln`) and rounded once to `f32`;
//! - the angle of position `p` is the `f32` product `f32(p) · inv_j` (never `f64`: that alone
//!   moves cos by 4e-5 at p = 1000);
//! - `cos`, `sin` of that `f32` angle computed in `f64` (own polynomials) and rounded to `f32`;
//! - NeoX `rotate_half` on the first `R` dims: `y_j = x_j·c − x_{j+R/2}·s`,
//!   `y_{j+R/2} = x_{j+R/2}·c + x_j·s`, each product and the sum rounded separately (no FMA).
//!
//! YaRN (`rope_type` `yarn`, [`crate::config::Yarn`]) as transformers 5.17's
//! `_compute_yarn_parameters`: each frequency a blend, in `f32` operations as torch does them, of
//! `1 / θ^e_j` (extrapolated) and `1 / (factor · θ^e_j)` (interpolated) by a linear ramp over the
//! correction range (computed in `f64` as Python's floats are, with tarfa's own `ln`), and `cos`,
//! `sin` multiplied by the `f32` attention factor.
//!
//! The tables are computed on the host once per position; a GPU backend receives them as data.

use crate::canon::{exp_f64, ln_f64, sincos_f64};
use crate::config::{RopeConfig, Yarn};

/// `θ^e_j` of each of the `rotary_dim / 2` frequencies (`f32`, as torch's `base ** (arange / dim)`).
fn powers(theta: f64, rotary_dim: usize) -> Vec<f32> {
    let base = theta as f32 as f64; // torch: a Python float base meets an f32 tensor
    let ln_base = ln_f64(base);
    (0..rotary_dim / 2)
        .map(|j| {
            let e = (2 * j) as f32 / rotary_dim as f32;
            exp_f64(e as f64 * ln_base) as f32
        })
        .collect()
}

/// The inverse frequencies of a head with `rotary_dim` rotated dims and base `theta`.
pub fn inv_freq(theta: f64, rotary_dim: usize) -> Vec<f32> {
    powers(theta, rotary_dim)
        .into_iter()
        .map(|pow| 1.0f32 / pow)
        .collect()
}

/// YaRN's inverse frequencies (`_compute_yarn_parameters`, operation for operation).
pub fn yarn_inv_freq(theta: f64, rotary_dim: usize, y: &Yarn) -> Vec<f32> {
    let dim = rotary_dim as f64;
    // find_correction_dim: (dim · ln(L / (r · 2 · π))) / (2 · ln θ), Python floats.
    let correction = |rot: f64| {
        (dim * ln_f64(y.original_max / (rot * 2.0 * std::f64::consts::PI))) / (2.0 * ln_f64(theta))
    };
    let (mut low, mut high) = (correction(y.beta_fast), correction(y.beta_slow));
    if y.truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001; // transformers: "prevent singularity"
    }
    let (low32, span32) = (low as f32, (high - low) as f32);
    let factor = y.factor as f32;
    powers(theta, rotary_dim)
        .into_iter()
        .enumerate()
        .map(|(j, pow)| {
            let extrapolated = 1.0f32 / pow;
            let interpolated = 1.0f32 / (factor * pow);
            let ramp = ((j as f32 - low32) / span32).clamp(0.0, 1.0);
            let keep = 1.0f32 - ramp;
            interpolated * (1.0f32 - keep) + extrapolated * keep
        })
        .collect()
}

/// The inverse frequencies `cfg` gives (default RoPE or YaRN).
pub fn inv_freq_of(cfg: &RopeConfig) -> Vec<f32> {
    match &cfg.yarn {
        None => inv_freq(cfg.theta, cfg.rotary_dim),
        Some(y) => yarn_inv_freq(cfg.theta, cfg.rotary_dim, y),
    }
}

/// Per-position cos/sin tables, grown as positions are asked for.
#[derive(Clone, Debug)]
pub struct Rope {
    inv: Vec<f32>,
    /// The `f32` factor on `cos` and `sin` (YaRN's attention factor), `None` for 1.
    scale: Option<f32>,
    /// `cos[p][j]`, `sin[p][j]` for `j < R/2`, flattened.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    /// For base `theta` and `rotary_dim` rotated dims.
    pub fn new(theta: f64, rotary_dim: usize) -> Rope {
        Rope {
            inv: inv_freq(theta, rotary_dim),
            scale: None,
            cos: Vec::new(),
            sin: Vec::new(),
        }
    }

    /// For the RoPE `cfg` describes (default or YaRN).
    pub fn of(cfg: &RopeConfig) -> Rope {
        Rope {
            inv: inv_freq_of(cfg),
            scale: cfg
                .yarn
                .as_ref()
                .map(|y| y.attention_factor as f32)
                .filter(|&s| s != 1.0),
            cos: Vec::new(),
            sin: Vec::new(),
        }
    }

    /// The inverse frequencies.
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv
    }

    /// Rotated dims.
    pub fn rotary_dim(&self) -> usize {
        self.inv.len() * 2
    }

    /// The `cos` and `sin` tables of the positions made so far (`rotary_dim / 2` per position).
    pub fn tables(&self) -> (&[f32], &[f32]) {
        (&self.cos, &self.sin)
    }

    /// Make sure positions `0..n` have tables.
    pub fn ensure(&mut self, n: usize) {
        let half = self.inv.len();
        let have = self.cos.len().checked_div(half).unwrap_or(0);
        for p in have..n {
            let pf = p as f32; // exact below 2^24
            for &inv in &self.inv {
                let angle = pf * inv;
                let (s, c) = sincos_f64(angle as f64);
                let (s, c) = (s as f32, c as f32);
                match self.scale {
                    None => {
                        self.cos.push(c);
                        self.sin.push(s);
                    }
                    Some(f) => {
                        self.cos.push(c * f);
                        self.sin.push(s * f);
                    }
                }
            }
        }
    }

    /// Rotate one head `x` (its first `R` dims) for position `p` (tables must exist: [`Self::ensure`]).
    pub fn apply(&self, x: &mut [f32], p: usize) {
        let half = self.inv.len();
        let c = &self.cos[p * half..(p + 1) * half];
        let s = &self.sin[p * half..(p + 1) * half];
        for j in 0..half {
            let a = x[j];
            let b = x[j + half];
            x[j] = a * c[j] + (-b) * s[j];
            x[j + half] = b * c[j] + a * s[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inv_freq_is_the_correctly_rounded_torch_recipe_on_exact_cases() {
        // θ = 1e4, R = 8: e = 0, 1/4, 1/2, 3/4 → 1, 1/10, 1/100, 1/1000 (each f32(1/x)).
        assert_eq!(inv_freq(1e4, 8), vec![1.0, 0.1, 0.01, 0.001]);
    }

    #[test]
    fn rotation_at_position_zero_is_the_identity() {
        let mut r = Rope::new(1e6, 8);
        r.ensure(3);
        let mut x = [1.0, -2.0, 3.0, 0.5, 7.0, 1e-3, -4.0, 2.5];
        let before = x;
        r.apply(&mut x, 0);
        assert_eq!(x, before);
    }
}
