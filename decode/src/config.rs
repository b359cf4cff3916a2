//! Typed views of the architecture config (`config.json` kept verbatim in the manifest), parsed
//! once. Defaults are transformers 5.17's (`research/model-families.md` §1.2, §2.1): a key absent
//! from the file means the class default, never a guess.

use serde_json::Value;

use crate::error::{ConfigFault as F, DecodeError, Result};

/// Reads keys of one config object, naming the key in every error.
#[derive(Clone, Copy, Debug)]
pub struct ConfigReader<'a> {
    v: &'a Value,
}

impl<'a> ConfigReader<'a> {
    /// Over a config object.
    pub fn new(v: &'a Value) -> Result<ConfigReader<'a>> {
        if !v.is_object() {
            return Err(bad("(root)", F::NotAnObject));
        }
        Ok(ConfigReader { v })
    }

    /// The raw value of `key` (absent or `null` is `None`).
    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.v.get(key).filter(|v| !v.is_null())
    }

    /// Whether `key` is present with the value `null` (which [`ConfigReader::raw`] does not tell
    /// from absent): where a family's `None` means something of its own.
    pub fn is_null(&self, key: &str) -> bool {
        self.v.get(key).is_some_and(Value::is_null)
    }

    /// A string key.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| bad(key, F::NotAString)),
        }
    }

    /// A non-negative integer key, bounded by `max`.
    pub fn usize(&self, key: &str, max: usize) -> Result<Option<usize>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| {
                    bad(
                        key,
                        F::NotUnsigned {
                            value: v.to_string(),
                        },
                    )
                })?;
                if n as u128 > max as u128 {
                    return Err(bad(
                        key,
                        F::OverLimit {
                            value: n,
                            limit: max,
                        },
                    ));
                }
                Ok(Some(n as usize))
            }
        }
    }

    /// A required non-negative integer key, at least 1.
    pub fn positive(&self, key: &str, max: usize) -> Result<usize> {
        match self.usize(key, max)? {
            Some(0) => Err(bad(key, F::Zero)),
            Some(n) => Ok(n),
            None => Err(bad(key, F::Missing)),
        }
    }

    /// An optional non-negative integer key, at least 1 when given (`default` when absent).
    pub fn positive_or(&self, key: &str, max: usize, default: usize) -> Result<usize> {
        match self.usize(key, max)? {
            Some(0) => Err(bad(key, F::Zero)),
            Some(n) => Ok(n),
            None => Ok(default),
        }
    }

    /// A number key.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                bad(
                    key,
                    F::NotANumber {
                        value: v.to_string(),
                    },
                )
            }),
        }
    }

    /// A boolean key.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                bad(
                    key,
                    F::NotABool {
                        value: v.to_string(),
                    },
                )
            }),
        }
    }

    /// A list of non-negative integers.
    pub fn usize_list(&self, key: &str) -> Result<Option<Vec<usize>>> {
        match self.raw(key) {
            None => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64().map(|n| n as usize).ok_or_else(|| {
                        bad(
                            key,
                            F::ElementNotInteger {
                                value: v.to_string(),
                            },
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(bad(
                key,
                F::NotAList {
                    value: v.to_string(),
                },
            )),
        }
    }

    /// A nested object.
    pub fn object(&self, key: &str) -> Result<Option<ConfigReader<'a>>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) if v.is_object() => Ok(Some(ConfigReader { v })),
            Some(v) => Err(bad(
                key,
                F::NotAnObjectValue {
                    value: v.to_string(),
                },
            )),
        }
    }
}

pub(crate) fn bad(key: &str, fault: F) -> DecodeError {
    DecodeError::Config {
        key: key.into(),
        fault,
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
    /// YaRN's parameters (`rope_type` `yarn`), or `None`: the default RoPE.
    pub yarn: Option<Yarn>,
}

/// YaRN (`rope_type` `yarn`) as transformers 5.17's `_compute_yarn_parameters` reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Yarn {
    /// `factor` (absent: `max_position_embeddings / original_max_position_embeddings`).
    pub factor: f64,
    /// `original_max_position_embeddings`.
    pub original_max: f64,
    /// `beta_fast` (default 32).
    pub beta_fast: f64,
    /// `beta_slow` (default 1).
    pub beta_slow: f64,
    /// `truncate` (default true): the correction range rounded out to whole dims.
    pub truncate: bool,
    /// The factor cos and sin are multiplied by: `attention_factor`, else from `factor`,
    /// `mscale` and `mscale_all_dim`.
    pub attention_factor: f64,
    /// `mscale_all_dim` (0 when absent): DeepSeek's attention also scales its scores by
    /// `yarn_get_mscale(factor, mscale_all_dim)²`.
    pub mscale_all_dim: f64,
}

impl Yarn {
    /// transformers' `get_mscale`/`yarn_get_mscale`: `0.1 · mscale · ln(scale) + 1` above
    /// a scale of 1, else 1.
    pub fn mscale(scale: f64, mscale: f64) -> f64 {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * mscale * crate::canon::ln_f64(scale) + 1.0
        }
    }
}

impl RopeConfig {
    /// Read the rope keys of `c` for a head of `head_dim`; `default_theta` and
    /// `default_partial` are the family's class defaults. Only the default RoPE.
    pub fn read(
        c: &ConfigReader<'_>,
        head_dim: usize,
        default_theta: f64,
        default_partial: f64,
    ) -> Result<RopeConfig> {
        Self::read_types(c, head_dim, default_theta, default_partial, false)
    }

    /// [`RopeConfig::read`], taking YaRN as well (a family whose model reads it).
    pub fn read_with_yarn(
        c: &ConfigReader<'_>,
        head_dim: usize,
        default_theta: f64,
        default_partial: f64,
    ) -> Result<RopeConfig> {
        Self::read_types(c, head_dim, default_theta, default_partial, true)
    }

    fn read_types(
        c: &ConfigReader<'_>,
        head_dim: usize,
        default_theta: f64,
        default_partial: f64,
        yarn: bool,
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
        let is_yarn = match rope_type {
            None | Some("default") => false,
            Some("yarn") if yarn => true,
            Some(t) => {
                return Err(bad(
                    "rope_parameters.rope_type",
                    F::Unsupported {
                        value: t.to_string(),
                        supported: if yarn { "default, yarn" } else { "default" },
                    },
                ))
            }
        };
        let theta = pick_f64("rope_theta")?.unwrap_or(default_theta);
        // torch meets the base as an f32: it must stay finite there.
        if !(theta.is_finite() && (theta as f32).is_finite() && theta > 1.0) {
            return Err(bad("rope_theta", F::RopeTheta { theta }));
        }
        let partial = pick_f64("partial_rotary_factor")?.unwrap_or(default_partial);
        if !(partial > 0.0 && partial <= 1.0) {
            return Err(bad(
                "partial_rotary_factor",
                F::RotaryFactor { factor: partial },
            ));
        }
        // transformers: int(head_dim * partial_rotary_factor).
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
            return Err(bad(
                "partial_rotary_factor",
                F::RotaryDims {
                    rotary_dim,
                    head_dim,
                },
            ));
        }
        let yarn = match (is_yarn, &params) {
            (true, Some(p)) => Some(Yarn::read(c, p)?),
            _ => None,
        };
        Ok(RopeConfig {
            theta,
            rotary_dim,
            yarn,
        })
    }
}

impl Yarn {
    /// YaRN's keys in `p` (`rope_parameters` or `rope_scaling`); `c` for
    /// `max_position_embeddings`.
    fn read(c: &ConfigReader<'_>, p: &ConfigReader<'_>) -> Result<Yarn> {
        let finite_positive = |key: &str, v: f64| -> Result<f64> {
            match v.is_finite() && v > 0.0 {
                true => Ok(v),
                false => Err(bad(key, F::NotPositive { value: v })),
            }
        };
        // transformers' `standardize_rope_params`: absent, it is `max_position_embeddings`.
        let original_max = match p.f64("original_max_position_embeddings")? {
            Some(v) => finite_positive("rope_parameters.original_max_position_embeddings", v)?,
            None => match c.f64("max_position_embeddings")? {
                Some(m) => finite_positive("max_position_embeddings", m)?,
                None => {
                    return Err(bad(
                        "rope_parameters.original_max_position_embeddings",
                        F::Missing,
                    ))
                }
            },
        };
        let factor = match p.f64("factor")? {
            Some(v) => finite_positive("rope_parameters.factor", v)?,
            None => match c.f64("max_position_embeddings")? {
                Some(m) => finite_positive("max_position_embeddings", m / original_max)?,
                None => return Err(bad("rope_parameters.factor", F::Missing)),
            },
        };
        // transformers: `beta_fast or 32`, `beta_slow or 1` (0 also takes the default).
        let beta = |key: &str, default: f64| -> Result<f64> {
            match p.f64(key)? {
                None => Ok(default),
                Some(0.0) => Ok(default),
                Some(v) => finite_positive(&format!("rope_parameters.{key}"), v),
            }
        };
        let mscale = p.f64("mscale")?.unwrap_or(0.0);
        let mscale_all_dim = p.f64("mscale_all_dim")?.unwrap_or(0.0);
        for (key, v) in [("mscale", mscale), ("mscale_all_dim", mscale_all_dim)] {
            if !v.is_finite() {
                return Err(bad(
                    &format!("rope_parameters.{key}"),
                    F::NotFinite { value: v },
                ));
            }
        }
        let attention_factor = match p.f64("attention_factor")? {
            Some(v) => finite_positive("rope_parameters.attention_factor", v)?,
            None if mscale != 0.0 && mscale_all_dim != 0.0 => {
                Yarn::mscale(factor, mscale) / Yarn::mscale(factor, mscale_all_dim)
            }
            None => Yarn::mscale(factor, 1.0),
        };
        Ok(Yarn {
            factor,
            original_max,
            beta_fast: beta("beta_fast", 32.0)?,
            beta_slow: beta("beta_slow", 1.0)?,
            truncate: p.bool("truncate")?.unwrap_or(true),
            attention_factor,
            mscale_all_dim,
        })
    }
}

/// A per-layer list of kinds `key` (`layer_types`, `mlp_layer_types`): `n` strings, each mapped
/// by `kind` (`None`: refused as `refuse` says), or `default(layer)` for each layer when absent.
pub fn layer_kinds<T>(
    c: &ConfigReader<'_>,
    key: &str,
    n: usize,
    default: impl Fn(usize) -> T,
    kind: impl Fn(&str) -> Option<T>,
    refuse: impl Fn(String) -> F,
) -> Result<Vec<T>> {
    match c.raw(key) {
        None => Ok((0..n).map(default).collect()),
        Some(Value::Array(a)) => {
            if a.len() != n {
                return Err(bad(
                    key,
                    F::LayerTypesCount {
                        entries: a.len(),
                        layers: n,
                    },
                ));
            }
            a.iter()
                .map(|t| {
                    t.as_str()
                        .and_then(&kind)
                        .ok_or_else(|| bad(key, refuse(t.to_string())))
                })
                .collect()
        }
        Some(other) => Err(bad(
            key,
            F::NotAList {
                value: other.to_string(),
            },
        )),
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
            F::NotADivisor {
                value: kv_heads,
                of_key: "num_attention_heads",
                of: heads,
            },
        ));
    }
    let head_dim = c.usize("head_dim", MAX_DIM)?.unwrap_or(hidden_size / heads);
    if head_dim == 0 {
        return Err(bad("head_dim", F::Zero));
    }
    Ok((hidden_size, heads, kv_heads, head_dim))
}

/// The sigmoid group router's keys (GLM-4.5, DeepSeek-V3): `n_group` (a divisor of the
/// `num_experts` experts, each group at least two when there are several), `topk_group` (1..=
/// `n_group`) and `routed_scaling_factor` (finite, as the `f32` torch multiplies by), each with
/// the family's default when absent.
pub fn group_router(
    c: &ConfigReader<'_>,
    num_experts: usize,
    default_groups: usize,
    default_kept: usize,
    default_scale: f64,
) -> Result<(usize, usize, f32)> {
    use limits::*;
    let n_group = c.usize("n_group", MAX_EXPERTS)?.unwrap_or(default_groups);
    if n_group == 0 || !num_experts.is_multiple_of(n_group) {
        return Err(bad(
            "n_group",
            F::NotADivisor {
                value: n_group,
                of_key: "n_routed_experts",
                of: num_experts,
            },
        ));
    }
    // Each group is scored by its two best experts (transformers' `.topk(2)`).
    if n_group > 1 && num_experts / n_group < 2 {
        return Err(bad(
            "n_group",
            F::GroupTooSmall {
                size: num_experts / n_group,
            },
        ));
    }
    let topk_group = c.usize("topk_group", MAX_EXPERTS)?.unwrap_or(default_kept);
    if topk_group == 0 || topk_group > n_group {
        return Err(bad(
            "topk_group",
            F::OutOfRange {
                value: topk_group,
                max: n_group,
            },
        ));
    }
    let scale = c.f64("routed_scaling_factor")?.unwrap_or(default_scale);
    if !(scale.is_finite() && (scale as f32).is_finite()) {
        return Err(bad("routed_scaling_factor", F::NotFinite { value: scale }));
    }
    Ok((n_group, topk_group, scale as f32))
}

/// The routed experts' count (`n_routed_experts`, or its alias `num_local_experts`; at least 1)
/// and the experts per token (`num_experts_per_tok`, 1..=experts), each with the family's default
/// (DeepSeek-V3 and GLM-5.3-Flash).
pub fn routed_experts(
    c: &ConfigReader<'_>,
    default_experts: usize,
    default_top_k: usize,
) -> Result<(usize, usize)> {
    use limits::*;
    let num_experts = match c.usize("n_routed_experts", MAX_EXPERTS)? {
        Some(n) => n,
        None => c
            .usize("num_local_experts", MAX_EXPERTS)?
            .unwrap_or(default_experts),
    };
    if num_experts == 0 {
        return Err(bad("n_routed_experts", F::Zero));
    }
    let top_k = c
        .usize("num_experts_per_tok", MAX_EXPERTS)?
        .unwrap_or(default_top_k);
    if top_k == 0 || top_k > num_experts {
        return Err(bad(
            "num_experts_per_tok",
            F::OutOfRange {
                value: top_k,
                max: num_experts,
            },
        ));
    }
    Ok((num_experts, top_k))
}

/// `hidden_act`: the experts' and MLPs' activation, which every family computes as SiLU —
/// transformers' `"silu"` or its alias `"swish"` (absent: the classes' default, `"silu"`). Any
/// other is refused by name rather than run as SiLU.
pub fn silu_activation(c: &ConfigReader<'_>) -> Result<()> {
    match c.str("hidden_act")? {
        None | Some("silu" | "swish") => Ok(()),
        Some(other) => Err(bad(
            "hidden_act",
            F::Unsupported {
                value: other.to_string(),
                supported: "silu (or its alias swish)",
            },
        )),
    }
}

/// `rms_norm_eps`, a finite non-negative number (`default` when absent).
pub fn rms_eps(c: &ConfigReader<'_>, default: f64) -> Result<f32> {
    let eps = c.f64("rms_norm_eps")?.unwrap_or(default);
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(bad("rms_norm_eps", F::Epsilon { value: eps }));
    }
    Ok(eps as f32)
}

/// Limits on config values, so that a hostile config cannot make the decoder allocate without
/// bound before a single weight is checked against it.
pub mod limits {
    /// Hidden size, heads × head dim, intermediate sizes.
    pub const MAX_DIM: usize = 1 << 20;
    /// Layers.
    pub const MAX_LAYERS: usize = tarfa_format::manifest::MAX_LAYERS as usize;
    /// Heads.
    pub const MAX_HEADS: usize = 1 << 12;
    /// Experts per layer (JNF's own limit is far above real models).
    pub const MAX_EXPERTS: usize = 1 << 16;
    /// Vocabulary.
    pub const MAX_VOCAB: usize = 1 << 24;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The key and fault of a refusal.
    fn fault<T: std::fmt::Debug>(r: Result<T>) -> (String, F) {
        match r {
            Err(DecodeError::Config { key, fault }) => (key, fault),
            other => panic!("expected a config fault, got {other:?}"),
        }
    }

    #[test]
    fn each_config_fault_is_its_own_variant() {
        let k = |s: &str| s.to_string();
        assert_eq!(
            fault(ConfigReader::new(&json!([]))),
            (k("(root)"), F::NotAnObject)
        );
        let v = json!({
            "s": 1, "n": -1, "big": 9, "zero": 0, "f": "x", "b": 1, "l": 5, "le": [1, "a"],
            "o": 3,
        });
        let c = ConfigReader::new(&v).expect("object");
        assert_eq!(fault(c.str("s")), (k("s"), F::NotAString));
        assert_eq!(
            fault(c.usize("n", 10)),
            (k("n"), F::NotUnsigned { value: k("-1") })
        );
        assert_eq!(
            fault(c.usize("big", 8)),
            (k("big"), F::OverLimit { value: 9, limit: 8 })
        );
        assert_eq!(fault(c.positive("zero", 8)), (k("zero"), F::Zero));
        assert_eq!(fault(c.positive("absent", 8)), (k("absent"), F::Missing));
        assert_eq!(
            fault(c.f64("f")),
            (k("f"), F::NotANumber { value: k("\"x\"") })
        );
        assert_eq!(fault(c.bool("b")), (k("b"), F::NotABool { value: k("1") }));
        assert_eq!(
            fault(c.usize_list("l")),
            (k("l"), F::NotAList { value: k("5") })
        );
        assert_eq!(
            fault(c.usize_list("le")),
            (k("le"), F::ElementNotInteger { value: k("\"a\"") })
        );
        assert_eq!(
            fault(c.object("o").map(|o| o.is_some())),
            (k("o"), F::NotAnObjectValue { value: k("3") })
        );
    }

    #[test]
    fn each_rope_attention_and_norm_fault_is_its_own_variant() {
        let rope = |v: serde_json::Value, head_dim| {
            let c = ConfigReader::new(&v).expect("object");
            RopeConfig::read(&c, head_dim, 10000.0, 1.0).map(|r| r.rotary_dim)
        };
        assert_eq!(
            fault(rope(json!({"rope_parameters": {"rope_type": "yarn"}}), 8)),
            (
                "rope_parameters.rope_type".into(),
                F::Unsupported {
                    value: "yarn".into(),
                    supported: "default"
                }
            )
        );
        assert_eq!(
            fault(rope(json!({"rope_theta": 0.5}), 8)),
            ("rope_theta".into(), F::RopeTheta { theta: 0.5 })
        );
        assert_eq!(
            fault(rope(json!({"partial_rotary_factor": 1.5}), 8)),
            (
                "partial_rotary_factor".into(),
                F::RotaryFactor { factor: 1.5 }
            )
        );
        assert_eq!(
            fault(rope(json!({"partial_rotary_factor": 0.5}), 6)),
            (
                "partial_rotary_factor".into(),
                F::RotaryDims {
                    rotary_dim: 3,
                    head_dim: 6
                }
            )
        );
        let v = json!({"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3});
        assert_eq!(
            fault(attention_dims(&ConfigReader::new(&v).expect("object"))),
            (
                "num_key_value_heads".into(),
                F::NotADivisor {
                    value: 3,
                    of_key: "num_attention_heads",
                    of: 4
                }
            )
        );
        let v = json!({"rms_norm_eps": -1.0});
        assert_eq!(
            fault(rms_eps(&ConfigReader::new(&v).expect("object"), 1e-6)),
            ("rms_norm_eps".into(), F::Epsilon { value: -1.0 })
        );
    }
}
