//! The command line shared by the cold-cache benchmarks (`convert`, `verify`):
//! `--runs N [--dir DIR] [--csv PATH] [--keep]`.

use std::path::PathBuf;

use crate::BenchResult;

/// The parsed command line.
#[derive(Debug)]
pub struct BenchArgs {
    /// Timed runs (at least 1; default 3).
    pub runs: usize,
    /// Where the generated input and the outputs go (the benchmark has a default).
    pub dir: Option<PathBuf>,
    /// A CSV file the result rows are appended to.
    pub csv: Option<PathBuf>,
    /// Keep the generated input (and, where the benchmark says so, its outputs).
    pub keep: bool,
}

impl BenchArgs {
    /// Parse this process's arguments; `--help` prints the usage line of the benchmark `name`
    /// and exits 0.
    pub fn parse(name: &str) -> BenchResult<BenchArgs> {
        let mut a = BenchArgs {
            runs: 3,
            dir: None,
            csv: None,
            keep: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
            match arg.as_str() {
                "--runs" => a.runs = value()?.parse()?,
                "--dir" => a.dir = Some(value()?.into()),
                "--csv" => a.csv = Some(value()?.into()),
                "--keep" => a.keep = true,
                // `cargo bench` passes --bench to every harness = false target.
                "--bench" => {}
                "-h" | "--help" => {
                    println!("{name} [--runs N] [--dir DIR] [--csv PATH] [--keep]");
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument {other:?}; try --help").into()),
            }
        }
        if a.runs == 0 {
            return Err("--runs must be at least 1".into());
        }
        Ok(a)
    }
}
