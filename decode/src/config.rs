//! Typed views of the architecture config (`config.json` kept verbatim in the manifest), parsed
//! once. Defaults are transformers 5.17's (`research/model-families.md` §1.2, §2.1): a key absent
//! from the file means the class default, never a guess.

use serde_json::Value;

use crate::error::{DecodeError, Result};

/// Reads keys of one config object, naming the key in every error.
#[derive(Clone, Copy, Debug)]
pub struct ConfigReader<'a> {
    v: &'a Value,
}

impl<'a> ConfigReader<'a> {
    /// Over a config object.
    pub fn new(v: &'a Value) -> Result<ConfigReader<'a>> {
        if !v.is_object() {
            return Err(bad(
                "(root)",
                "the architecture config is not a JSON object",
            ));
        }
        Ok(ConfigReader { v })
    }

    /// The raw value of `key` (absent or `null` is `None`).
    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    /// A string key.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| bad(key, "not a string")),
        }
    }

    /// A non-negative integer key, bounded by `max`.
    pub fn usize(&self, key: &str, max: usize) -> Result<Option<usize>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => {
                let n = v
                    .as_u64()
                    .ok_or_else(|| bad(key, &format!("{v} is not a non-negative integer")))?;
                if n as u128 > max as u128 {
                    return Err(bad(key, &format!("{n} is over the limit {max}")));
                }
                Ok(Some(n as usize))
            }
        }
    }

    /// A required non-negative integer key, at least 1.
    pub fn positive(&self, key: &str, max: usize) -> Result<usize> {
        match self.usize(key, max)? {
            Some(0) => Err(bad(key, "must be at least 1")),
            Some(n) => Ok(n),
            None => Err(bad(key, "missing")),
        }
    }

    /// A number key.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| bad(key, &format!("{v} is not a number"))),
        }
    }

    /// A boolean key.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| bad(key, &format!("{v} is not a boolean"))),
        }
    }

    /// A list of non-negative integers.
    pub fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| bad(key, &format!("element {v} is not an integer")))
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(bad(key, &format!("{v} is not a list"))),
        }
    }

    /// A nested object.
    pub fn object(&self, key: &str) -> Result<Option<ConfigReader<'a>>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) if v.is_object() => Ok(Some(ConfigReader { v })),
            Some(v) => Err(bad(key, &format!("{v} is not an object"))),
        }
    }
}

pub(crate) fn bad(key: &str, detail: &str) -> DecodeError {
    DecodeError::Config {
        key: key.into(),
        detail: detail.into(),
    }
}

/// The RoPE parameters: `rope_parameters` first, then the legacy top-level keys, then the class
/// default (`research/model-families.md` §1.2).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// `rope_theta` as written (rounded to `f32` where torch rounds it).
    pub theta: f64,
    /// Rotary dimensions per head (`R`): `head_dim · partial_rotary_factor`.
    pub rotary_dim: usize,
}

impl RopeConfig {
    /// Read the rope keys of `c` for a head of `head_dim`; `default_theta` and
    /// `default_partial` are the family's class defaults.
    pub fn read(
        c: &ConfigReader<'_>,
        head_dim: usize,
        default_theta: f64,
        default_partial: f64,
    ) -> Result<RopeConfig> {
        let params = match c.object("rope_parameters")? {
            Some(p) => Some(p),
            None => c.object("rope_scaling")?,
        };
        let pick_f64 = |key: &str| -> Result<Option<f64>> {
            if let Some(p) = &params {
                if let Some(v) = p.f64(key)? {
                    return Ok(Some(v));
                }
            }
            c.f64(key)
        };
        let rope_type = match &params {
            Some(p) => match p.str("rope_type")? {
                Some(t) => Some(t),
                None => p.str("type")?,
            },
            None => None,
        };
        if let Some(t) = rope_type {
            if t != "default" {
                return Err(bad(
                    "rope_parameters.rope_type",
                    &format!("{t:?} is not decoded by this build (only \"default\")"),
                ));
            }
        }
        let theta = pick_f64("rope_theta")?.unwrap_or(default_theta);
        // torch meets the base as an f32: it must stay finite there.
        if !(theta.is_finite() && (theta as f32).is_finite() && theta > 1.0) {
            return Err(bad(
                "rope_theta",
                &format!("{theta} is not a finite base > 1"),
            ));
        }
        let partial = pick_f64("partial_rotary_factor")?.unwrap_or(default_partial);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(bad(
                "partial_rotary_factor",
                &format!("{partial} is not in (0, 1]"),
            ));
        }
        // transformers: int(head_dim * partial_rotary_factor).
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(bad(
                "partial_rotary_factor",
                &format!("gives {rotary_dim} rotary dimensions of a {head_dim}-wide head; it must be even and non-zero"),
            ));
        }
        Ok(RopeConfig { theta, rotary_dim })
    }
}

/// `hidden_size`, `num_attention_heads`, `num_key_value_heads` (default: the heads; must divide
/// them) and `head_dim` (default `hidden_size / heads`), as every family reads them.
pub fn attention_dims(c: &ConfigReader<'_>) -> Result<(usize, usize, usize, usize)> {
    use limits::*;
    let hidden_size = c.positive("hidden_size", MAX_DIM)?;
    let heads = c.positive("num_attention_heads", MAX_HEADS)?;
    let kv_heads = c.usize("num_key_value_heads", MAX_HEADS)?.unwrap_or(heads);
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(bad(
            "num_key_value_heads",
            &format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    let head_dim = c.usize("head_dim", MAX_DIM)?.unwrap_or(hidden_size / heads);
    if head_dim == 0 {
        return Err(bad("head_dim", "must be at least 1"));
    }
    Ok((hidden_size, heads, kv_heads, head_dim))
}

/// `rms_norm_eps`, a finite non-negative number (`default` when absent).
pub fn rms_eps(c: &ConfigReader<'_>, default: f64) -> Result<f32> {
    let eps = c.f64("rms_norm_eps")?.unwrap_or(default);
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(bad(
            "rms_norm_eps",
            &format!("{eps} is not a finite non-negative number"),
        ));
    }
    Ok(eps as f32)
}

/// Limits on config values, so that a hostile config cannot make the decoder allocate without
/// bound before a single weight is checked against it.
pub mod limits {
    /// Hidden size, heads × head dim, intermediate sizes.
    pub const MAX_DIM: usize = 1 << 20;
    /// Layers.
    pub const MAX_LAYERS: usize = 1 << 12;
    /// Heads.
    pub const MAX_HEADS: usize = 1 << 12;
    /// Experts per layer (JNF's own limit is far above real models).
    pub const MAX_EXPERTS: usize = 1 << 16;
    /// Vocabulary.
    pub const MAX_VOCAB: usize = 1 << 24;
}
