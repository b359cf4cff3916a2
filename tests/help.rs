//! The command line's own documentation (review finding 24): `--help` with examples for every
//! command, shell completions and man pages generated from the parser.

mod common;

use common::tarfa;

const COMMANDS: [&str; 9] = [
    "inspect",
    "convert",
    "verify",
    "fetch",
    "bench-io",
    "bench-decode",
    "run",
    "completions",
    "man",
];

#[test]
fn every_command_help_shows_examples_of_itself() {
    for cmd in COMMANDS {
        let (code, out, err) = tarfa(&[cmd, "--help"]);
        assert_eq!(code, 0, "{cmd}: {err}");
        assert!(out.contains("Examples:"), "{cmd} --help:\n{out}");
        let example = format!("  tarfa {cmd} ");
        assert!(
            out.lines().any(|l| l.starts_with(&example)),
            "{cmd} --help has no example line:\n{out}"
        );
    }
}

#[test]
fn completions_are_printed_for_each_shell_and_know_every_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let (code, out, err) = tarfa(&["completions", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        for cmd in COMMANDS {
            assert!(out.contains(cmd), "{shell} completions lack {cmd}");
        }
    }
    let (code, _, _) = tarfa(&["completions", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is a bad argument");
}

#[test]
fn man_pages_are_roff_for_tarfa_and_each_command() {
    let (code, out, err) = tarfa(&["man"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(".TH tarfa 1"), "{out}");
    // roff writes a hyphen as `\-`.
    let text = out.replace("\\-", "-");
    for cmd in COMMANDS {
        assert!(text.contains(cmd), "tarfa(1) lacks {cmd}");
        let (code, out, err) = tarfa(&["man", "--command", cmd]);
        assert_eq!(code, 0, "{cmd}: {err}");
        assert!(out.contains(&format!(".TH tarfa-{cmd} 1")), "{cmd}: {out}");
    }
    let (code, _, err) = tarfa(&["man", "--command", "nope"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the commands: inspect, convert"), "{err}");
}
