//! Headers that pass every safetensors check but claim absurd expert counts (a fused stack of
//! 10^12 zero-size experts, an expert index of 999,999,999) are refused by name before the planner
//! allocates anything for them.

use tarfa_converter::{convert, ConvertError, ExpertFault, Options, Quiet};

fn write_st(dir: &std::path::Path, json: &str, data: &[u8]) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    b.extend_from_slice(data);
    std::fs::write(dir.join("model.safetensors"), b).expect("write");
}

fn refused(json: &str, data: &[u8]) -> ConvertError {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    write_st(&src, json, data);
    let r = convert(&src, &t.path().join("out"), &Options::default(), &Quiet);
    let e = r.expect_err("refused");
    assert!(!t.path().join("out/manifest.json").exists());
    e
}

#[test]
fn a_fused_stack_of_a_trillion_zero_size_experts_is_refused_without_allocating() {
    let e = refused(
        r#"{"model.layers.0.mlp.experts.gate_up_proj":{"dtype":"BF16","shape":[1000000000000,0,8],"data_offsets":[0,0]}}"#,
        &[],
    );
    assert!(
        matches!(
            &e,
            ConvertError::BadExperts {
                layer: 0,
                fault: ExpertFault::TooMany {
                    count: 1_000_000_000_000,
                    ..
                }
            }
        ),
        "{e}"
    );
}

#[test]
fn an_expert_index_of_a_billion_is_refused_without_allocating() {
    let e = refused(
        r#"{"model.layers.0.mlp.experts.999999999.gate_proj.weight":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#,
        &[0, 0],
    );
    assert!(
        matches!(
            &e,
            ConvertError::BadExperts {
                layer: 0,
                fault: ExpertFault::TooMany {
                    count: 1_000_000_000,
                    ..
                }
            }
        ),
        "{e}"
    );
}
