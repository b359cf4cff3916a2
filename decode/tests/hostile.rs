//! The decoder's parsers of outside bytes never panic: architecture configs with keys removed,
//! retyped, negative, huge or absurd, and `.npy` bytes truncated or flipped. (The same property
//! as the `decode_inputs` fuzz target, on generated inputs, in every test run.)

use serde_json::{json, Value};
use tarfa_decode::error::{ConfigFault as F, NpyFault};
use tarfa_decode::family::deepseek_v3::DeepseekV3Config;
use tarfa_decode::family::glm4_moe::Glm4MoeConfig;
use tarfa_decode::family::glm5_next::Glm5NextConfig;
use tarfa_decode::family::mimo_v2_flash::MimoV2FlashConfig;
use tarfa_decode::family::mixtral::MixtralConfig;
use tarfa_decode::family::plan::MixerPlan;
use tarfa_decode::family::qwen3_5_moe::{LayerType, Qwen3_5MoeConfig};
use tarfa_decode::family::qwen3_moe::Qwen3MoeConfig;
use tarfa_decode::DecodeError;

fn base() -> Value {
    fixture_config("qwen3_moe_b")
}

fn fixture_config(name: &str) -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/hf")
        .join(name)
        .join("config.json");
    serde_json::from_slice(&std::fs::read(p).expect("config")).expect("json")
}

/// `v` with 1–3 of its keys removed or given nasty values (and sometimes rope_parameters).
fn mutate(v: &Value, rng: &mut fastrand::Rng) -> Value {
    let mut v = v.clone();
    let keys: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
    let o = v.as_object_mut().expect("object");
    for _ in 0..rng.usize(1..4) {
        let k = &keys[rng.usize(..keys.len())];
        if rng.bool() {
            o.remove(k);
        } else {
            o.insert(k.clone(), nasty(rng));
        }
    }
    if rng.u8(0..8) == 0 {
        o.insert("rope_parameters".into(), nasty(rng));
    }
    v
}

#[test]
fn mutated_configs_of_the_other_families_parse_consistently_or_fail_with_an_error() {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut parsed = [0usize; 7];
    let glm5 = fixture_config("glm5_next")["text_config"].clone();
    let (mixtral, glm, qwen35, deepseek, next, mimo) = (
        fixture_config("mixtral"),
        fixture_config("glm4_moe_b"),
        fixture_config("qwen3_5_moe_text"),
        fixture_config("deepseek_v3"),
        fixture_config("qwen3_next"),
        fixture_config("mimo_v2_flash"),
    );
    for _ in 0..5_000 {
        if let Ok(c) = MixtralConfig::parse(&mutate(&mixtral, &mut rng)) {
            parsed[0] += 1;
            assert!(c.top_k >= 1 && c.top_k <= c.num_experts);
            assert!(c.heads % c.kv_heads == 0 && c.window != Some(0));
        }
        if let Ok(c) = Glm4MoeConfig::parse(&mutate(&glm, &mut rng)) {
            parsed[1] += 1;
            assert!(c.top_k >= 1 && c.top_k <= c.num_experts);
            assert!(c.num_experts % c.n_group == 0);
            assert!(c.n_group == 1 || c.num_experts / c.n_group >= 2);
            assert!(c.topk_group >= 1 && c.topk_group <= c.n_group);
            assert!(c.rope.rotary_dim >= 2 && c.rope.rotary_dim <= c.head_dim);
        }
        if let Ok(c) = Qwen3_5MoeConfig::parse(&mutate(&qwen35, &mut rng)) {
            parsed[2] += 1;
            assert_eq!(c.layer_types.len(), c.num_layers);
            assert!(c.lin_v_heads % c.lin_k_heads == 0);
            assert!(c.conv_kernel >= 1 && c.top_k >= 1 && c.top_k <= c.num_experts);
        }
        if let Ok(c) = DeepseekV3Config::parse(&mutate(&deepseek, &mut rng)) {
            parsed[3] += 1;
            let m = c.mla;
            assert!(c.top_k >= 1 && c.top_k <= c.num_experts);
            assert!(c.num_experts % c.n_group == 0 && c.topk_group <= c.n_group);
            assert!(m.v <= m.qk() && m.rope % 2 == 0 && m.kv_lora_rank > 0);
            assert!(m.q_lora_rank != Some(0) && c.rope.rotary_dim == m.rope);
        }
        if let Ok(c) = Qwen3_5MoeConfig::parse_next(&mutate(&next, &mut rng)) {
            parsed[4] += 1;
            let n = c.next.as_ref().expect("Qwen3-Next's keys");
            assert_eq!(
                (c.layer_types.len(), n.dense.len()),
                (c.num_layers, c.num_layers)
            );
            assert!(c.lin_v_heads % c.lin_k_heads == 0 && n.intermediate_size > 0);
            assert!(c.top_k >= 1 && c.top_k <= c.num_experts);
        }
        if let Ok(c) = MimoV2FlashConfig::parse(&mutate(&mimo, &mut rng)) {
            parsed[5] += 1;
            let (f, s) = (c.full.shape, c.sliding.shape);
            assert!(f.heads % f.kv_heads == 0 && s.heads % s.kv_heads == 0);
            assert!(c.full.v_dim() <= f.head_dim && s.window.is_some_and(|w| w > 0));
            assert_eq!(
                (c.sliding_layers.len(), c.sparse.len()),
                (c.num_layers, c.num_layers)
            );
            assert!(c.top_k >= 1 && c.top_k <= c.num_experts);
        }
        if let Ok(c) = Glm5NextConfig::parse(&mutate(&glm5, &mut rng)) {
            parsed[6] += 1;
            let (m, d) = (c.mla, c.dsa);
            assert!(c.top_k >= 1 && c.top_k <= c.num_experts);
            assert!(m.rope == 0 && m.v <= m.nope && m.q_lora_rank == Some(d.q_rank));
            assert!(d.topk > 0 && d.pool > 0 && d.topk % d.pool == 0);
            assert!(c.kda.kernel >= 1 && c.hyper.streams >= 1 && c.swiglu_limit > 0.0);
            assert_eq!(
                (c.mixers.len(), c.sparse.len()),
                (c.num_layers, c.num_layers)
            );
            // A shared indexer comes directly after a layer with its own.
            for (l, w) in c.mixers.windows(2).enumerate() {
                if w[1] == (MixerPlan::MlaSparse { own: false }) {
                    assert_eq!(w[0], MixerPlan::MlaSparse { own: true }, "layer {}", l + 1);
                }
            }
        }
    }
    assert!(parsed.iter().all(|&n| n > 100), "{parsed:?}");
}

#[test]
fn inconsistent_family_configs_are_refused_naming_the_key() {
    // The fault of key `key`, its text naming the key.
    let refused = |r: Result<(), DecodeError>, key: &str| -> F {
        let e = r.expect_err(key);
        assert!(e.to_string().contains(key), "{e}");
        match e {
            DecodeError::Config { key: k, fault } if k == key => fault,
            e => panic!("expected a config fault of {key}, got {e}"),
        }
    };
    let with = |name: &str, k: &str, v: Value| {
        let mut c = fixture_config(name);
        c[k] = v;
        c
    };
    let glm = |k: &str, v: Value| Glm4MoeConfig::parse(&with("glm4_moe_b", k, v)).map(|_| ());
    // 8 experts in 3 groups
    assert_eq!(
        refused(glm("n_group", json!(3)), "n_group"),
        F::NotADivisor {
            value: 3,
            of_key: "n_routed_experts",
            of: 8
        }
    );
    // groups of one expert
    assert_eq!(
        refused(glm("n_group", json!(8)), "n_group"),
        F::GroupTooSmall { size: 1 }
    );
    // more than the 4 groups
    assert_eq!(
        refused(glm("topk_group", json!(5)), "topk_group"),
        F::OutOfRange { value: 5, max: 4 }
    );
    assert_eq!(
        refused(
            glm("routed_scaling_factor", json!(1e300)),
            "routed_scaling_factor",
        ),
        F::NotFinite { value: 1e300 }
    );
    let q =
        |k: &str, v: Value| Qwen3_5MoeConfig::parse(&with("qwen3_5_moe_text", k, v)).map(|_| ());
    assert!(matches!(
        refused(q("layer_types", json!(["full_attention"])), "layer_types"),
        F::LayerTypesCount { entries: 1, .. }
    ));
    // transformers' legacy names ("mamba", "attention") are read; anything else is refused.
    assert_eq!(
        refused(
            q(
                "layer_types",
                json!(["linear_attention", "mamba", "x", "attention"]),
            ),
            "layer_types",
        ),
        F::LayerType {
            value: "\"x\"".into()
        }
    );
    let legacy = Qwen3_5MoeConfig::parse(&with(
        "qwen3_5_moe_text",
        "layer_types",
        json!(["mamba", "conv", "linear_attention", "attention"]),
    ))
    .expect("legacy names");
    assert_eq!(
        legacy.layer_types,
        [
            LayerType::Linear,
            LayerType::Linear,
            LayerType::Linear,
            LayerType::Full
        ]
    );
    assert!(matches!(
        refused(
            q("linear_num_value_heads", json!(3)),
            "linear_num_value_heads",
        ),
        F::NotAMultiple {
            value: 3,
            of_key: "linear_num_key_heads",
            ..
        }
    ));
    assert_eq!(
        refused(q("hidden_act", json!("gelu")), "hidden_act"),
        F::Unsupported {
            value: "gelu".into(),
            supported: "silu (or its alias swish)"
        }
    );
    let m = |k: &str, v: Value| MixtralConfig::parse(&with("mixtral", k, v)).map(|_| ());
    assert_eq!(
        refused(m("sliding_window", json!(0)), "sliding_window"),
        F::Zero
    );
    assert!(matches!(
        refused(m("num_experts_per_tok", json!(5)), "num_experts_per_tok"),
        F::OutOfRange { value: 5, .. }
    ));
}

/// Issue 26, finding 6: a config key that changes the function is honoured or refused by name,
/// in every family — `hidden_act` other than SiLU (the only activation the kernels have) was
/// ignored by qwen3_moe, glm4_moe and mixtral, running "gelu" as SiLU.
#[test]
fn every_family_refuses_an_activation_it_does_not_compute() {
    type Parse = fn(&Value) -> Result<(), DecodeError>;
    let families: [(&str, Parse); 5] = [
        ("qwen3_moe_b", |v| Qwen3MoeConfig::parse(v).map(|_| ())),
        ("glm4_moe_b", |v| Glm4MoeConfig::parse(v).map(|_| ())),
        ("mixtral", |v| MixtralConfig::parse(v).map(|_| ())),
        ("qwen3_5_moe_text", |v| {
            Qwen3_5MoeConfig::parse(v).map(|_| ())
        }),
        ("deepseek_v3", |v| DeepseekV3Config::parse(v).map(|_| ())),
    ];
    for (name, parse) in families {
        let mut c = fixture_config(name);
        parse(&c).unwrap_or_else(|e| panic!("{name}: {e}"));
        for act in ["silu", "swish"] {
            c["hidden_act"] = json!(act);
            parse(&c).unwrap_or_else(|e| panic!("{name} {act}: {e}"));
        }
        for act in [
            json!("gelu"),
            json!("relu"),
            json!("gelu_pytorch_tanh"),
            json!(7),
        ] {
            c["hidden_act"] = act.clone();
            let e = parse(&c).expect_err(name);
            assert!(
                matches!(&e, DecodeError::Config { key, .. } if key == "hidden_act"),
                "{name} {act}: {e}"
            );
            assert!(e.to_string().contains("hidden_act"), "{e}");
        }
    }
}

fn nasty(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(0..12) {
        0 => Value::Null,
        1 => json!(-1),
        2 => json!(0),
        3 => json!(u64::MAX),
        4 => json!(1e300),
        5 => json!(-0.0),
        6 => json!("16"),
        7 => json!([1, 2, 3]),
        8 => json!({"rope_type": "yarn", "factor": 4}),
        9 => json!(true),
        10 => json!(rng.u64(0..70_000)),
        _ => json!(rng.f64() * 2.0),
    }
}

#[test]
fn mutated_configs_parse_or_fail_with_an_error_never_a_panic() {
    let mut rng = fastrand::Rng::with_seed(99);
    let mut parsed = 0;
    for _ in 0..10_000 {
        let v = mutate(&base(), &mut rng);
        if let Ok(c) = Qwen3MoeConfig::parse(&v) {
            parsed += 1;
            // With no experts every layer is dense and top-k is never used.
            if c.num_experts > 0 {
                assert!(c.top_k >= 1 && c.top_k <= c.num_experts);
            }
            assert!(c.rope.rotary_dim >= 2 && c.rope.rotary_dim % 2 == 0);
            assert!(c.heads % c.kv_heads == 0);
        }
    }
    assert!(
        parsed > 100,
        "the mutations should leave some configs valid ({parsed})"
    );
}

#[test]
fn damaged_npy_bytes_are_refused_without_a_panic() {
    let good = tarfa_decode::npy::encode_f32(&[vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.0]]);
    assert!(tarfa_decode::npy::decode(&good).is_ok());
    let mut rng = fastrand::Rng::with_seed(5);
    for n in 0..good.len() {
        let e = tarfa_decode::npy::decode(&good[..n]).expect_err("truncated");
        // Too short for the magic, the header cut, or the data cut.
        assert!(
            matches!(
                e,
                NpyFault::NotNpy | NpyFault::HeaderPastEnd | NpyFault::DataLength { .. }
            ),
            "truncated to {n}: {e}"
        );
    }
    for _ in 0..10_000 {
        let mut b = good.clone();
        for _ in 0..rng.usize(1..6) {
            let i = rng.usize(..b.len());
            b[i] = rng.u8(..);
        }
        let _ = tarfa_decode::npy::decode(&b);
    }
}

#[test]
fn sliding_window_and_rope_base_follow_transformers_or_are_refused() {
    let with = |k: &str, v: Value| {
        let mut c = base();
        c["use_sliding_window"] = json!(true);
        c[k] = v;
        c
    };
    // Absent: the class default; null: no window; 0: nothing to attend to, refused.
    let mut absent = base();
    absent["use_sliding_window"] = json!(true);
    absent
        .as_object_mut()
        .expect("object")
        .remove("sliding_window");
    assert_eq!(
        Qwen3MoeConfig::parse(&absent).expect("parses").window,
        Some(4096)
    );
    let null = with("sliding_window", Value::Null);
    assert_eq!(Qwen3MoeConfig::parse(&null).expect("parses").window, None);
    assert_eq!(
        Qwen3MoeConfig::parse(&with("sliding_window", json!(128)))
            .expect("parses")
            .window,
        Some(128)
    );
    assert!(matches!(
        Qwen3MoeConfig::parse(&with("sliding_window", json!(0))),
        Err(DecodeError::Config { fault: F::Zero, .. })
    ));
    // Without use_sliding_window no window applies, whatever sliding_window says.
    let mut off = base();
    off["sliding_window"] = json!(128);
    assert_eq!(Qwen3MoeConfig::parse(&off).expect("parses").window, None);
    // A base finite in f64 but not in f32 (torch's view of it) is refused.
    let mut huge = base();
    huge["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e39});
    assert!(matches!(
        Qwen3MoeConfig::parse(&huge),
        Err(DecodeError::Config { fault: F::RopeTheta { theta }, .. }) if theta == 1e39
    ));
}

/// deepseek_v3 refuses by name what it does not compute rather than run it otherwise: grouped
/// keys and values (MLA gives every head its own), values wider than keys, an odd rotated width,
/// a RoPE other than the default and YaRN, and a YaRN without what it needs.
#[test]
fn deepseek_v3_refuses_what_it_does_not_compute() {
    let parse = |c: &Value| DeepseekV3Config::parse(c).map(|_| ());
    let base = fixture_config("deepseek_v3");
    parse(&base).expect("the fixture parses");
    for (key, value) in [
        ("num_key_value_heads", json!(2)),
        ("v_head_dim", json!(13)),
        ("qk_rope_head_dim", json!(5)),
        ("qk_nope_head_dim", json!(0)),
        ("kv_lora_rank", json!(0)),
        ("q_lora_rank", json!(0)),
    ] {
        let mut c = base.clone();
        c[key] = value;
        let e = parse(&c).expect_err(key);
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    let mut c = base.clone();
    c["rope_parameters"] = json!({"rope_type": "longrope", "rope_theta": 10000.0});
    let e = parse(&c).expect_err("longrope");
    assert!(e.to_string().contains("longrope"), "{e}");
    // YaRN as the released DeepSeek-V3 declares it (legacy `rope_scaling`), and what it lacks.
    let yarn = json!({"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0});
    let mut c = base.clone();
    c.as_object_mut().expect("object").remove("rope_parameters");
    c["rope_scaling"] = yarn.clone();
    let y = DeepseekV3Config::parse(&c)
        .expect("yarn")
        .rope
        .yarn
        .expect("yarn read");
    assert_eq!(
        (y.factor, y.original_max, y.attention_factor),
        (40.0, 4096.0, 1.0)
    );
    for (key, value) in [
        ("original_max_position_embeddings", json!(0)),
        ("factor", json!(-2.0)),
        ("beta_fast", json!(-1.0)),
    ] {
        let mut c = c.clone();
        c["rope_scaling"][key] = value;
        let e = parse(&c).expect_err(key);
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    // Absent, `original_max_position_embeddings` is `max_position_embeddings` (transformers'
    // `standardize_rope_params`).
    let mut c = c.clone();
    c["rope_scaling"]
        .as_object_mut()
        .expect("object")
        .remove("original_max_position_embeddings");
    let y = DeepseekV3Config::parse(&c).expect("no original").rope.yarn;
    assert_eq!(y.expect("yarn").original_max, 256.0);
    // transformers rotates every rope dim: a partial rotary factor would be silently ignored.
    c["partial_rotary_factor"] = json!(0.5);
    let e = parse(&c).expect_err("partial");
    assert!(e.to_string().contains("partial_rotary_factor"), "{e}");
    // q_lora_rank null is `q_proj` (deepseek_v3_b), absent is the class default 1536.
    let mut c = base.clone();
    c["q_lora_rank"] = Value::Null;
    assert_eq!(
        DeepseekV3Config::parse(&c).expect("null").mla.q_lora_rank,
        None
    );
    c.as_object_mut().expect("object").remove("q_lora_rank");
    assert_eq!(
        DeepseekV3Config::parse(&c).expect("absent").mla.q_lora_rank,
        Some(1536)
    );
}
