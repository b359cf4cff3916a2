//! `tarfa fetch` as a user runs it, where a mistake would cost data: `-o` naming the source.

#[path = "../fetch/tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::write_glm;

fn tarfa(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(args)
        .env_remove("HF_TOKEN")
        .output()
        .expect("run tarfa");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn fetch_with_the_source_as_output_exits_2_and_leaves_every_part_untouched() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let before: Vec<Vec<u8>> = model
        .parts
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    for out in [&model.parts[0], &model.parts[2]] {
        let (code, err) = tarfa(&[
            "fetch".as_ref(),
            model.parts[0].as_os_str(),
            "--mtp".as_ref(),
            "-q".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("never writes over its input"), "{err}");
    }
    for (p, b) in model.parts.iter().zip(&before) {
        assert!(
            std::fs::read(p).expect("read") == *b,
            "{} changed",
            p.display()
        );
    }
    let names: Vec<String> = std::fs::read_dir(root.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tarfa-"))
        .collect();
    assert!(names.is_empty(), "left behind: {names:?}");
}
