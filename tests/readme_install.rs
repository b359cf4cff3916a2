//! README.md's Install section, held to what works when pasted into a fresh machine's shell
//! (issue 26, finding 18): every `cargo install` takes the lock file CI tests (`--locked`), every
//! file a line writes with `>` has its directory made first (`mkdir -p` on an earlier line: a
//! fresh account has no `~/.local/share/bash-completion/completions`), and the GPU build
//! (`--features cuda`, which `--device cuda` needs) is there.

use std::path::Path;

/// The shell lines of the ```sh blocks of README.md's `## Install` section, comments removed.
fn install_lines() -> Vec<String> {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Install\n"))
        .expect("README.md has an Install section");
    let mut lines = Vec::new();
    let mut in_sh = false;
    for line in section.lines() {
        match line.trim() {
            "```sh" => in_sh = true,
            "```" => in_sh = false,
            l if in_sh => {
                let code = l.split(" #").next().unwrap_or("").trim();
                if !code.is_empty() && !code.starts_with('#') {
                    lines.push(code.to_string());
                }
            }
            _ => {}
        }
    }
    lines
}

/// The directory of the file a line writes with `>` (not `2>`, `>&`), if any.
fn redirect_dir(line: &str) -> Option<String> {
    let (_, target) = line.split_once(" > ")?;
    let file = target.split_whitespace().next()?;
    Some(file.rsplit_once('/')?.0.to_string())
}

#[test]
fn readme_install_lines_work_on_a_fresh_machine() {
    let lines = install_lines();
    assert!(!lines.is_empty(), "no sh lines in README's Install section");
    let installs: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("cargo install"))
        .collect();
    assert!(!installs.is_empty(), "no cargo install in README's Install");
    for l in &installs {
        assert!(l.contains("--locked"), "without --locked: {l}");
    }
    assert!(
        installs.iter().any(|l| l.contains("--features cuda")),
        "README's Install has no --features cuda build for --device cuda: {installs:?}"
    );
    for (i, l) in lines.iter().enumerate() {
        let Some(dir) = redirect_dir(l) else {
            continue;
        };
        assert!(
            lines[..i]
                .iter()
                .any(|m| m.starts_with("mkdir -p") && m.split_whitespace().any(|w| w == dir)),
            "{l}: writes into {dir}, which no earlier line makes (mkdir -p {dir})"
        );
    }
}

#[test]
fn a_redirect_s_directory_is_found() {
    assert_eq!(
        redirect_dir("tarfa completions bash > ~/.x/y/tarfa").as_deref(),
        Some("~/.x/y")
    );
    assert_eq!(redirect_dir("tarfa man | man -l -"), None);
}
