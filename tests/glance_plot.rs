//! BENCHMARKS.md's figure is its "At a glance" table drawn (`bench/plot_glance.py`): the
//! committed `docs/glance.svg` is what the script draws from the committed table, so a row edited
//! without redrawing fails here; and a table the script cannot read is an error, not a figure.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn draw(src: &Path, dst: &Path) -> std::process::Output {
    Command::new("python3")
        .arg(root().join("bench/plot_glance.py"))
        .arg(src)
        .arg(dst)
        .output()
        .expect("run python3")
}

#[test]
fn the_committed_figure_is_the_committed_table_drawn() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("glance.svg");
    let r = draw(&root().join("BENCHMARKS.md"), &out);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let drawn = std::fs::read(&out).expect("the drawn figure");
    let committed = std::fs::read(root().join("docs/glance.svg")).expect("docs/glance.svg");
    assert!(
        drawn == committed,
        "docs/glance.svg is not BENCHMARKS.md's table drawn: run python3 bench/plot_glance.py"
    );
}

#[test]
fn a_table_without_a_readable_ratio_is_an_error_and_writes_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("B.md");
    std::fs::write(
        &src,
        "## At a glance\n\n| workload | model | tarfa | peer | ratio | section |\n| --- | --- | --- | --- | --- | --- |\n| x | y | 1 | 2 | n/a | z |\n\n## Next\n",
    )
    .expect("write");
    let out = tmp.path().join("g.svg");
    let r = draw(&src, &out);
    assert_eq!(r.status.code(), Some(1), "{r:?}");
    assert!(String::from_utf8_lossy(&r.stderr).contains("no bold ratio"));
    assert!(!out.exists());
}
