//! `fixtures/gguf/README.md` says which GGUF fixtures are runnable models (issue 26, finding 21):
//! every `.gguf` there is listed, and a row that says "yes" converts and runs, one that says "no"
//! does not (convert or run refuses it, exit non-zero).

mod common;

use std::path::{Path, PathBuf};

use common::{path, tarfa};

fn gguf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf")
}

/// Each listed file (relative to fixtures/gguf, `hostile/*.gguf` as one pattern) and whether it runs.
fn table() -> Vec<(String, bool)> {
    let text = std::fs::read_to_string(gguf_dir().join("README.md")).expect("read README.md");
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let runs = match cells.last().copied() {
            Some("yes") => true,
            Some("no") => false,
            other => panic!("{line}: runs is {other:?}, not yes or no"),
        };
        for name in cells[0].split(", ") {
            rows.push((name.trim_matches('`').to_string(), runs));
        }
    }
    rows
}

/// Does `tarfa convert` then `tarfa run` of `gguf` succeed?
fn runs(gguf: &Path, tmp: &Path) -> bool {
    let out = tmp.join(gguf.file_name().expect("name"));
    let (c, _, _) = tarfa(&["convert", path(gguf), "-o", path(&out), "--quiet"]);
    if c != 0 {
        return false;
    }
    let (c, _, _) = tarfa(&["run", path(&out), "--tokens", "1,2", "-n", "2"]);
    c == 0
}

#[test]
fn every_gguf_fixture_is_listed_and_runs_as_the_readme_says() {
    let rows = table();
    let listed = |rel: &str| {
        rows.iter()
            .any(|(n, _)| n == rel || (n == "hostile/*.gguf" && rel.starts_with("hostile/")))
    };
    let mut files = Vec::new();
    for sub in ["", "from_hf", "hostile"] {
        for e in std::fs::read_dir(gguf_dir().join(sub)).expect("read dir") {
            let name = e.expect("entry").file_name().into_string().expect("utf-8");
            if name.ends_with(".gguf") {
                files.push(if sub.is_empty() {
                    name
                } else {
                    format!("{sub}/{name}")
                });
            }
        }
    }
    for f in &files {
        assert!(listed(f), "fixtures/gguf/README.md does not list {f}");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut yes = 0;
    for (name, says) in rows.iter().filter(|(n, _)| !n.contains('*')) {
        let file = gguf_dir().join(name);
        assert!(file.is_file(), "README lists {name}, which is not there");
        assert_eq!(
            runs(&file, tmp.path()),
            *says,
            "{name}: README says runs = {says}"
        );
        yes += usize::from(*says);
    }
    assert!(yes >= 1, "no runnable GGUF fixture listed");
}
