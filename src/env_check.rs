//! The `TARFA_*` variables, checked once when the binary starts: a switch set to a value its
//! reader would not understand is a bad argument (exit 2) naming the variable and the values it
//! takes — never quietly read as its default (`TARFA_CUDA_PDL=false` used to leave programmatic
//! launch on). A `TARFA_*` name that nothing reads is a warning (a misspelt switch does
//! nothing). The variables whose readers parse them themselves (`TARFA_IO_BACKEND`,
//! `TARFA_CUDA_TILE`) are checked there, with the same exit code. A value that is not UTF-8 text
//! is an error for every variable tarfa reads (its readers would take it for unset).

/// A switch: its name, the values it takes, what it does.
struct Switch {
    name: &'static str,
    values: &'static [&'static str],
    what: &'static str,
}

/// Every switch the binary or its libraries read, with the values their readers understand.
const SWITCHES: &[Switch] = &[
    Switch {
        name: "TARFA_PROFILE",
        values: &["0", "1"],
        what: "1: `tarfa run` prints where the time went",
    },
    Switch {
        name: "TARFA_SPLIT",
        values: &["static"],
        what: "static: every CPU product in equal shares per thread (for measuring)",
    },
    Switch {
        name: "TARFA_CUDA_PDL",
        values: &["0", "1"],
        what: "0: no programmatic dependent launch on the GPU (for measuring)",
    },
    Switch {
        name: "TARFA_CUDA_NORM_FUSE",
        values: &["0", "1"],
        what: "0: no RMSNorm taken into a GPU product (for measuring)",
    },
    Switch {
        name: "TARFA_CUDA_PROMPT",
        values: &["0", "1"],
        what: "0: a prompt's tokens stepped one by one on the GPU, not as matrices (for measuring)",
    },
    Switch {
        name: "TARFA_CUDA_ATTN_QUADS",
        values: &["0", "1"],
        what: "0: a GPU prompt pass's attention a block per query head, not four (for measuring)",
    },
    Switch {
        name: "TARFA_REQUIRE_IO_URING",
        values: &["0", "1", "true", "false", "yes", "no"],
        what: "1: a fallback from io_uring is an error",
    },
    Switch {
        name: "TARFA_ISA",
        values: &["auto", "scalar", "avx2", "avx512"],
        what: "the CPU kernels' instruction set, as --isa",
    },
    Switch {
        name: "TARFA_TOKEN_OVER_HTTP",
        values: &["0", "1"],
        what: "1: `tarfa fetch` sends HF_TOKEN to a plain-http HF_ENDPOINT",
    },
];

/// Read by their own parsers (a bad value is an error there).
const PARSED: &[&str] = &["TARFA_IO_BACKEND", "TARFA_CUDA_TILE", "TARFA_API_KEY"];

/// Read by the test harness and the scripts around the binary, not by it.
const HARNESS: &[&str] = &[
    "TARFA_REQUIRE_TOOLS",
    "TARFA_REQUIRE_GPU",
    "TARFA_REQUIRE_NVRTC",
    "TARFA_SKIP_LOG",
    "TARFA_NVRTC_DIR",
    "TARFA_FUZZ_SECONDS",
    "TARFA_BLESS",
    "TARFA_SCREENSHOT",
    "TARFA_REGEN_HOSTILE",
    "TARFA_MANY_EXPERTS_DIR",
    "TARFA_MANY_EXPERTS_CASE",
    "TARFA_HOSTILE_INDEX_CASE",
    "TARFA_EMU_GUARD_CHILD",
    "TARFA_MAPPED_CHILD",
];

/// Check `vars` (the process's environment): the first switch with a value it does not take is
/// the error; each unknown `TARFA_*` name a warning line.
pub fn check(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> anyhow::Result<Vec<String>> {
    let mut warnings = Vec::new();
    for (name, value) in vars {
        let Some(name) = name.to_str().filter(|n| n.starts_with("TARFA_")) else {
            continue;
        };
        let known = SWITCHES.iter().any(|s| s.name == name) || PARSED.contains(&name);
        if known && value.to_str().is_none() {
            anyhow::bail!(
                "{name}={:?} is not UTF-8 text (its reader would take it for unset; unset it for the default)",
                value.to_string_lossy()
            );
        }
        if let Some(s) = SWITCHES.iter().find(|s| s.name == name) {
            let v = value.to_string_lossy();
            if !s.values.contains(&v.trim()) {
                anyhow::bail!(
                    "{name}={v:?} is not {} ({}; unset for the default)",
                    s.values.join(" or "),
                    s.what
                );
            }
        } else if !PARSED.contains(&name) && !HARNESS.contains(&name) {
            warnings.push(format!(
                "warning: {name} is not a variable tarfa reads (ignored; it reads {})",
                SWITCHES
                    .iter()
                    .map(|s| s.name)
                    .chain(PARSED.iter().copied())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
        pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn switches_take_only_their_values() {
        assert!(check(env(&[("TARFA_CUDA_PDL", "0"), ("PATH", "/bin")])).is_ok());
        let e = check(env(&[("TARFA_CUDA_PDL", "false")])).expect_err("false");
        assert!(
            e.to_string()
                .starts_with("TARFA_CUDA_PDL=\"false\" is not 0 or 1"),
            "{e}"
        );
        let e = check(env(&[("TARFA_SPLIT", "dynamic")])).expect_err("dynamic");
        assert!(e.to_string().contains("is not static"), "{e}");
        assert!(check(env(&[("TARFA_REQUIRE_IO_URING", "yes")])).is_ok());
    }

    #[test]
    fn an_unknown_name_is_a_warning_and_the_harness_s_are_not() {
        let w = check(env(&[("TARFA_CUDA_NORM_FUSED", "0")])).expect("a warning only");
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("TARFA_CUDA_NORM_FUSED is not a variable"),
            "{w:?}"
        );
        let w = check(env(&[("TARFA_REQUIRE_TOOLS", "1"), ("TARFA_ISA", "avx2")]));
        assert!(w.expect("known").is_empty());
    }

    /// `TARFA_ISA` is named in its error (issue 26, finding 13), and a value that is not UTF-8
    /// is an error for every variable tarfa reads, not its default taken quietly.
    #[test]
    fn a_bad_isa_names_the_variable_and_non_utf8_is_refused() {
        let e = check(env(&[("TARFA_ISA", "foo")])).expect_err("foo");
        assert!(
            e.to_string()
                .starts_with("TARFA_ISA=\"foo\" is not auto or scalar or avx2 or avx512"),
            "{e}"
        );
        use std::os::unix::ffi::OsStringExt;
        for name in ["TARFA_IO_BACKEND", "TARFA_PROFILE", "TARFA_ISA"] {
            let bad = vec![(name.into(), std::ffi::OsString::from_vec(vec![0xff, b'1']))];
            let e = check(bad).expect_err("not UTF-8");
            assert!(e.to_string().contains("is not UTF-8 text"), "{name}: {e}");
        }
        let unknown = vec![(
            "TARFA_NOTHING".into(),
            std::ffi::OsString::from_vec(vec![0xff]),
        )];
        assert_eq!(check(unknown).expect("a warning only").len(), 1);
    }
}
