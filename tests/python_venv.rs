//! `scripts/python-venv.sh` (sourced by `scripts/test.sh`; issue 26, finding 17) installs the
//! tests' Python packages into a venv it makes, never into the system's Python, which Debian 12
//! and Ubuntu 23.04 on refuse (PEP 668), and puts the venv's `python3` first on `PATH`.
//!
//! The `python3` on `PATH` here is a stand-in for such a system Python: it makes a venv when asked
//! (whose `python3` is another stand-in, logging what it is asked) and refuses `-m pip` with
//! PEP 668's error, as Debian's does. No package is downloaded.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn script(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn the_tests_python_packages_go_into_a_venv_first_on_path_never_the_system_python() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let stubs = tmp.path().join("bin");
    std::fs::create_dir(&stubs).expect("mkdir");
    let log = tmp.path().join("log");
    let venv_python = tmp.path().join("venv-python3");
    script(
        &venv_python,
        "#!/usr/bin/env bash\necho \"venv $*\" >> \"$STUB_LOG\"\nhere=$(dirname \"$0\")/..\ncase \"$1 $2\" in\n  '-m pip') touch \"$here/installed\";;\n  '-c import gguf, numpy, blake3, openai, selenium') [ -e \"$here/installed\" ];;\n  *) exit 1;;\nesac\n",
    );
    script(
        &stubs.join("python3"),
        &format!(
            "#!/usr/bin/env bash\necho \"system $*\" >> \"$STUB_LOG\"\ncase \"$1 $2\" in\n  '-c import venv, ensurepip') exit 0;;\n  '-m venv') mkdir -p \"$3/bin\" && cp '{}' \"$3/bin/python3\";;\n  '-m pip') echo 'error: externally-managed-environment' >&2; exit 1;;\n  *) exit 1;;\nesac\n",
            venv_python.display()
        ),
    );
    let venv = tmp.path().join("venv");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .args([
            "-c",
            "set -euo pipefail; source scripts/python-venv.sh; command -v python3",
        ])
        .current_dir(root)
        .env("PATH", format!("{}:/usr/bin:/bin", stubs.display()))
        .env("TARFA_VENV", &venv)
        .env("STUB_LOG", &log)
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(out.status.success(), "{stdout}\n{stderr}\ncalls:\n{calls}");
    assert_eq!(
        stdout.lines().last(),
        Some(venv.join("bin/python3").to_str().expect("utf-8")),
        "the venv's python3 is not first on PATH:\n{stdout}\ncalls:\n{calls}"
    );
    assert!(
        !calls.lines().any(|l| l.starts_with("system -m pip")),
        "pip ran on the system's python3:\n{calls}"
    );
    assert!(
        calls
            .lines()
            .any(|l| l.starts_with("venv -m pip install") && l.contains("gguf numpy blake3")),
        "the packages were not installed into the venv:\n{calls}"
    );
}
