//! The outside tools tarfa's tests need, and the one rule for a test whose tool is missing here.
//!
//! A test that needs something outside the Rust build — nginx, python3 with gguf-py, a tmpfs it
//! can mount, the kernel's io_uring, fio, Chromium — asks this crate instead of deciding for
//! itself:
//!
//! - where tools are *required* ([`ENV_REQUIRE_TOOLS`]`=1`, which `.ci/run` exports; or `CI` set
//!   to anything but empty, `0` or `false`, as CI services set it; or the tool's own variable,
//!   `TARFA_REQUIRE_IO_URING`), a missing tool fails the test, naming the tool, why it is missing,
//!   the variable that required it and how to install it;
//! - elsewhere the test prints one `SKIPPED` line saying the same and returns. libtest hides a
//!   passing test's output, so the line is also appended to the file [`ENV_SKIP_LOG`] names, and
//!   `scripts/test.sh` lists those lines after the tests.
//!
//! A crate of its own (dev-only, never published) because the tests of five crates and the binary
//! need it, `tarfa-gguf` among them, which the converter (home of the other test kit) depends on;
//! and test code stays out of the shipped libraries (review finding 20). It has no dependencies.
//!
//! A GPU ([`Tool::Gpu`]) is hardware CI does not have, not a tool to install: only its own
//! variable, `TARFA_REQUIRE_GPU` (set on the GPU machine), requires it, never
//! [`ENV_REQUIRE_TOOLS`] or `CI`; its skip line starts [`SKIPPED_HARDWARE`], which
//! `scripts/test.sh` lists but does not count as a tool left missing. (decode/tests/gpu.rs keeps
//! its own check of the same variable.) Nor is the NVRTC test inside the runtime here (a unit
//! test, which `scripts/test.sh` runs with `TARFA_REQUIRE_NVRTC=1`).

#![forbid(unsafe_code)]

mod tmpfs;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub use tmpfs::Tmpfs;

/// Set to `1` (CI's `.ci/run` does), a missing tool fails the test instead of skipping it.
pub const ENV_REQUIRE_TOOLS: &str = "TARFA_REQUIRE_TOOLS";
/// Set by CI services (GitHub Actions, GitLab, ...): read as [`ENV_REQUIRE_TOOLS`] is.
pub const ENV_CI: &str = "CI";
/// A file to append every `SKIPPED` line to (`scripts/test.sh` sets it and lists the lines).
pub const ENV_SKIP_LOG: &str = "TARFA_SKIP_LOG";
/// What every skip line starts with; `scripts/test.sh` looks for it.
pub const SKIPPED: &str = "SKIPPED";
/// What the skip line of missing hardware ([`Tool::Gpu`]) starts with: a skip that
/// `TARFA_REQUIRE_TOOLS=1` does not turn into a failure, so `scripts/test.sh` lists it without
/// failing on it.
pub const SKIPPED_HARDWARE: &str = "SKIPPED (hardware)";

/// Something a test needs from outside the Rust build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// nginx, serving files over HTTP on loopback (fetch's range-request tests).
    Nginx,
    /// python3 with the `gguf` and `numpy` packages: gguf-py, the format's own reader.
    PythonGguf,
    /// python3 with the `blake3` package: the second JNF reader, `tests/jnf_reader.py`.
    PythonBlake3,
    /// python3 with the `openai` package: the client `tarfa serve` is tested with.
    PythonOpenai,
    /// Debian's Chromium and its chromedriver, driven by python3's `selenium` package: the
    /// browser `tarfa serve`'s chat page is tested in.
    Chromium,
    /// A tmpfs the test mounts itself (a small, fillable filesystem): needs root.
    Tmpfs,
    /// io_uring in this kernel and allowed by this process's seccomp filter.
    IoUring,
    /// fio, the baseline of `tarfa bench-io`.
    Fio,
    /// A usable CUDA GPU: hardware, required only by `TARFA_REQUIRE_GPU`.
    Gpu,
}

impl Tool {
    /// What is needed, as a person would say it.
    pub fn what(self) -> &'static str {
        match self {
            Tool::Nginx => "nginx",
            Tool::PythonGguf => "python3 with the gguf and numpy packages",
            Tool::PythonBlake3 => "python3 with the blake3 package",
            Tool::PythonOpenai => "python3 with the openai package",
            Tool::Chromium => {
                "chromium and chromedriver (/usr/bin/chromium, /usr/bin/chromedriver) with \
                 python3's selenium package"
            }
            Tool::Tmpfs => "mounting a tmpfs",
            Tool::IoUring => "io_uring",
            Tool::Fio => "fio",
            Tool::Gpu => "a usable CUDA GPU",
        }
    }

    /// How to get it (what `scripts/test.sh` does, where it can).
    pub fn install(self) -> &'static str {
        match self {
            Tool::Nginx => "apt-get install nginx (scripts/test.sh does, as root)",
            Tool::PythonGguf => {
                "python3 -m pip install gguf numpy, in a venv first on PATH (scripts/test.sh \
                 makes one: ~/.cache/tarfa/venv)"
            }
            Tool::PythonBlake3 => {
                "python3 -m pip install blake3, in a venv first on PATH (scripts/test.sh makes \
                 one: ~/.cache/tarfa/venv)"
            }
            Tool::PythonOpenai => {
                "python3 -m pip install openai, in a venv first on PATH (scripts/test.sh makes \
                 one: ~/.cache/tarfa/venv)"
            }
            Tool::Chromium => {
                "apt-get install chromium chromium-driver (scripts/test.sh does, as root), and \
                 python3 -m pip install selenium, in a venv first on PATH (scripts/test.sh makes \
                 one: ~/.cache/tarfa/venv)"
            }
            Tool::Tmpfs => "run the tests as root (mount needs CAP_SYS_ADMIN)",
            Tool::IoUring => {
                "a Linux kernel with io_uring (5.6 or later), not blocked by a seccomp filter \
                 (docker: --security-opt seccomp=unconfined) or kernel.io_uring_disabled"
            }
            Tool::Fio => "apt-get install fio (scripts/test.sh does, as root)",
            Tool::Gpu => {
                "a machine with an NVIDIA GPU and its driver, and the test built with \
                 --features cuda (CI has none: there this skip is expected)"
            }
        }
    }

    /// The tool's own variable that requires it, besides the general ones.
    fn own_variable(self) -> Option<&'static str> {
        match self {
            // The runtime's own switch (tarfa_runtime::ENV_REQUIRE_IO_URING): it already makes a
            // fallback from io_uring an error in the library; the tests agree with it.
            Tool::IoUring => Some("TARFA_REQUIRE_IO_URING"),
            Tool::Gpu => Some("TARFA_REQUIRE_GPU"),
            _ => None,
        }
    }

    /// Hardware, not a tool to install: required only by its own variable.
    fn is_hardware(self) -> bool {
        self == Tool::Gpu
    }
}

/// Whether a variable's value turns a requirement on: anything but empty, `0`, `false`, `no`,
/// `off` (any case, blanks around ignored).
fn turns_on(value: &OsString) -> bool {
    let v = value.to_string_lossy();
    let v = v.trim();
    !v.is_empty()
        && !["0", "false", "no", "off"]
            .iter()
            .any(|f| v.eq_ignore_ascii_case(f))
}

/// The `NAME=value` setting that makes `tool` required, if any, with the environment read
/// through `var`: the tool's own variable, then [`ENV_REQUIRE_TOOLS`], then [`ENV_CI`].
pub fn required_by(tool: Tool, var: impl Fn(&str) -> Option<OsString>) -> Option<String> {
    let general: &[&str] = if tool.is_hardware() {
        &[]
    } else {
        &[ENV_REQUIRE_TOOLS, ENV_CI]
    };
    tool.own_variable()
        .into_iter()
        .chain(general.iter().copied())
        .find_map(|name| {
            let value = var(name)?;
            turns_on(&value).then(|| format!("{name}={}", value.to_string_lossy()))
        })
}

/// The one decision: `probe` says whether `tool` is here (its value) or why not. Missing and
/// required, the test fails (a panic naming the tool, why, the variable and how to install it);
/// missing otherwise, a `SKIPPED` line is printed (and logged, see [`ENV_SKIP_LOG`]) and the
/// caller gets `None` and returns. A failure is reported at the caller's line.
#[track_caller]
pub fn available<T>(tool: Tool, probe: Result<T, String>) -> Option<T> {
    let why = match probe {
        Ok(v) => return Some(v),
        Err(why) => why,
    };
    let test = std::thread::current()
        .name()
        .map_or_else(|| "this test".to_string(), str::to_string);
    match missing(tool, &why, &test, |name| std::env::var_os(name)) {
        Missing::Fail(message) => panic!("{message}"),
        Missing::Skip(line) => {
            eprintln!("{line}");
            log_skip(&test, &line);
            None
        }
    }
}

/// What a missing tool comes to.
#[derive(Debug, PartialEq, Eq)]
enum Missing {
    /// The test fails with this message.
    Fail(String),
    /// The test is skipped; this line says so.
    Skip(String),
}

fn missing(tool: Tool, why: &str, test: &str, var: impl Fn(&str) -> Option<OsString>) -> Missing {
    match required_by(tool, var) {
        Some(setting) => Missing::Fail(format!(
            "{test}: needs {} ({setting} requires {}), which is unavailable: {why}; install: {}",
            tool.what(),
            if tool.is_hardware() {
                "it"
            } else {
                "every outside tool"
            },
            tool.install()
        )),
        None if tool.is_hardware() => Missing::Skip(format!(
            "{SKIPPED_HARDWARE} {test}: needs {}, unavailable: {why}; needs: {} (or set {} to \
             make this a failure)",
            tool.what(),
            tool.install(),
            tool.own_variable()
                .map_or(String::new(), |v| format!("{v}=1"))
        )),
        None => Missing::Skip(format!(
            "{SKIPPED} {test}: needs {}, unavailable: {why}; install: {} (or set \
             {ENV_REQUIRE_TOOLS}=1 to make this a failure)",
            tool.what(),
            tool.install()
        )),
    }
}

/// Append `line` to the file [`ENV_SKIP_LOG`] names, if any.
fn log_skip(test: &str, line: &str) {
    let Some(log) = std::env::var_os(ENV_SKIP_LOG).filter(|p| !p.is_empty()) else {
        return;
    };
    // One short O_APPEND write per line, so concurrent test processes do not interleave.
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = appended {
        eprintln!("{test}: could not append to {ENV_SKIP_LOG}: {e}");
    }
}

/// Run `program args`: `Ok` when it exits 0, else why not (its stderr's last line).
fn runs(program: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(match stderr.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(last) => format!("{program} {}: {}", args.join(" "), last.trim()),
        None => format!("{program} {}: {}", args.join(" "), out.status),
    })
}

/// python3 with gguf-py (and numpy), or the skip/fail of [`available`].
#[track_caller]
pub fn python_gguf() -> bool {
    available(
        Tool::PythonGguf,
        runs("python3", &["-c", "import gguf, numpy"]),
    )
    .is_some()
}

/// python3 with the `openai` package, or the skip/fail of [`available`].
#[track_caller]
pub fn python_openai() -> bool {
    available(
        Tool::PythonOpenai,
        runs("python3", &["-c", "import openai"]),
    )
    .is_some()
}

/// Where Debian's `chromium` and `chromium-driver` packages put the browser and its driver.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// See [`CHROMIUM`].
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Chromium, chromedriver and python3's `selenium`, or the skip/fail of [`available`].
#[track_caller]
pub fn chromium() -> bool {
    let probe = runs(CHROMIUM, &["--version"])
        .and_then(|()| runs(CHROMEDRIVER, &["--version"]))
        .and_then(|()| runs("python3", &["-c", "import selenium"]));
    available(Tool::Chromium, probe).is_some()
}

/// python3 with the `blake3` package, or the skip/fail of [`available`].
#[track_caller]
pub fn python_blake3() -> bool {
    available(
        Tool::PythonBlake3,
        runs("python3", &["-c", "import blake3"]),
    )
    .is_some()
}

/// fio on `PATH`, or the skip/fail of [`available`].
#[track_caller]
pub fn fio() -> bool {
    available(Tool::Fio, runs("fio", &["--version"])).is_some()
}

/// Where nginx is installed (Debian's and a source build's places), or the skip/fail of
/// [`available`].
#[track_caller]
pub fn nginx() -> Option<PathBuf> {
    const PLACES: [&str; 3] = ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"];
    let found = PLACES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| format!("no nginx at {}", PLACES.join(", ")));
    available(Tool::Nginx, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, OsString)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        }
    }

    #[test]
    fn nothing_set_requires_nothing() {
        for tool in [Tool::Nginx, Tool::PythonGguf, Tool::Tmpfs, Tool::IoUring] {
            assert_eq!(required_by(tool, env(&[])), None);
        }
    }

    #[test]
    fn require_tools_one_requires_every_tool_and_names_itself() {
        for tool in [
            Tool::Nginx,
            Tool::PythonGguf,
            Tool::PythonBlake3,
            Tool::PythonOpenai,
            Tool::Chromium,
            Tool::Tmpfs,
            Tool::IoUring,
            Tool::Fio,
        ] {
            assert_eq!(
                required_by(tool, env(&[("TARFA_REQUIRE_TOOLS", "1")])).as_deref(),
                Some("TARFA_REQUIRE_TOOLS=1")
            );
        }
    }

    #[test]
    fn ci_requires_unless_empty_zero_or_false() {
        for on in ["true", "1", "yes", "TRUE", "woodpecker"] {
            assert_eq!(
                required_by(Tool::Nginx, env(&[("CI", on)])),
                Some(format!("CI={on}")),
                "CI={on}"
            );
        }
        for off in ["", "0", "false", "False", " false ", "no", "off"] {
            assert_eq!(
                required_by(Tool::Nginx, env(&[("CI", off)])),
                None,
                "CI={off:?}"
            );
        }
    }

    #[test]
    fn require_tools_zero_or_false_does_not_require() {
        for off in ["0", "false", ""] {
            assert_eq!(
                required_by(Tool::Tmpfs, env(&[("TARFA_REQUIRE_TOOLS", off)])),
                None
            );
        }
    }

    #[test]
    fn the_io_uring_variable_requires_io_uring_only() {
        let e = env(&[("TARFA_REQUIRE_IO_URING", "1")]);
        assert_eq!(
            required_by(Tool::IoUring, &e).as_deref(),
            Some("TARFA_REQUIRE_IO_URING=1")
        );
        assert_eq!(required_by(Tool::Nginx, &e), None);
    }

    #[test]
    fn the_tools_own_variable_is_named_first_then_require_tools_then_ci() {
        let all = env(&[
            ("CI", "true"),
            ("TARFA_REQUIRE_TOOLS", "1"),
            ("TARFA_REQUIRE_IO_URING", "yes"),
        ]);
        assert_eq!(
            required_by(Tool::IoUring, &all).as_deref(),
            Some("TARFA_REQUIRE_IO_URING=yes")
        );
        assert_eq!(
            required_by(Tool::Nginx, &all).as_deref(),
            Some("TARFA_REQUIRE_TOOLS=1")
        );
        let ci_only = env(&[("CI", "true"), ("TARFA_REQUIRE_TOOLS", "0")]);
        assert_eq!(
            required_by(Tool::Nginx, &ci_only).as_deref(),
            Some("CI=true")
        );
    }

    #[test]
    fn a_missing_required_tool_fails_naming_tool_reason_variable_and_install() {
        let got = missing(
            Tool::Nginx,
            "no nginx at /usr/sbin/nginx",
            "fetch_test",
            env(&[("TARFA_REQUIRE_TOOLS", "1")]),
        );
        let Missing::Fail(message) = got else {
            panic!("required, yet {got:?}");
        };
        for part in [
            "fetch_test",
            "nginx",
            "no nginx at /usr/sbin/nginx",
            "TARFA_REQUIRE_TOOLS=1",
            "apt-get install nginx",
        ] {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }
        assert!(!message.contains(SKIPPED), "{message}");
    }

    #[test]
    fn a_missing_optional_tool_is_one_skipped_line_saying_how_to_require_it() {
        let got = missing(
            Tool::PythonGguf,
            "No module named 'gguf'",
            "t",
            env(&[("CI", "false")]),
        );
        let Missing::Skip(line) = got else {
            panic!("not required, yet {got:?}");
        };
        assert!(
            line.starts_with("SKIPPED t: needs python3 with the gguf"),
            "{line}"
        );
        assert!(line.contains("No module named 'gguf'"), "{line}");
        assert!(line.contains("pip install gguf numpy"), "{line}");
        assert!(line.contains("TARFA_REQUIRE_TOOLS=1"), "{line}");
        assert!(!line.contains('\n'), "{line:?}");
    }

    #[test]
    fn a_missing_gpu_fails_under_require_gpu_and_is_a_hardware_skip_otherwise() {
        let got = missing(
            Tool::Gpu,
            "CUDA is absent: no driver",
            "t",
            env(&[("TARFA_REQUIRE_GPU", "1")]),
        );
        let Missing::Fail(message) = got else {
            panic!("TARFA_REQUIRE_GPU=1, yet {got:?}");
        };
        assert!(message.contains("TARFA_REQUIRE_GPU=1"), "{message}");
        assert!(message.contains("CUDA is absent"), "{message}");
        // The tools' switches do not make CI (no GPU) fail for want of hardware.
        for setting in [("TARFA_REQUIRE_TOOLS", "1"), ("CI", "true")] {
            let got = missing(Tool::Gpu, "CUDA is absent", "t", env(&[setting]));
            let Missing::Skip(line) = got else {
                panic!("{setting:?} requires a GPU: {got:?}");
            };
            assert!(
                line.starts_with("SKIPPED (hardware) t: needs a usable CUDA GPU"),
                "{line}"
            );
            assert!(line.contains("TARFA_REQUIRE_GPU=1"), "{line}");
        }
    }

    #[test]
    fn a_present_tool_gives_its_value() {
        assert_eq!(available(Tool::Nginx, Ok::<_, String>(7)), Some(7));
    }

    #[test]
    fn every_tool_says_how_to_install_it() {
        for tool in [
            Tool::Nginx,
            Tool::PythonGguf,
            Tool::PythonBlake3,
            Tool::PythonOpenai,
            Tool::Chromium,
            Tool::Tmpfs,
            Tool::IoUring,
            Tool::Fio,
            Tool::Gpu,
        ] {
            assert!(
                !tool.what().is_empty() && !tool.install().is_empty(),
                "{tool:?}"
            );
        }
    }
}
