//! # tarfa-benchkit
//!
//! One copy of what tarfa's benchmark programs (`*/benches/*.rs`, `harness = false`) share:
//! dropping the page cache, timing a child process or a closure, CPU time and peak RSS of this
//! process, load average, free space, removing a previous output, medians, the machine line and
//! Markdown tables; and, for the cold-cache `convert` and `verify` benchmarks, their command line
//! ([`args`]), their generated input checkpoint ([`checkpoint`]) and their result table and CSV
//! rows ([`steps`]). The binary's own benchmarks (`tarfa bench-io`, `tarfa bench-decode`) take
//! their fio baseline ([`fio`]) and cache dropping from here too. Internal: a dev-dependency of
//! the benchmark programs and a dependency of the binary only.
//!
//! Every helper works on Linux (`/proc`, `getrusage`, coreutils, util-linux's `findmnt`); none is
//! timed itself except where it says so.

#![forbid(unsafe_code)]

pub mod args;
pub mod checkpoint;
pub mod fio;
pub mod steps;

pub use args::BenchArgs;
pub use checkpoint::{files, marker_text, GeneratedCheckpoint};
pub use steps::{print_warm_cache_warning, Ratio, StepRow, StepTable};

use std::error::Error;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The result type of the benchmark programs: any error, printed and turned into exit code 1.
pub type BenchResult<T> = Result<T, Box<dyn Error>>;

// ---------------------------------------------------------------------------------------------
// Caches and files.

/// `sync; echo 3 > /proc/sys/vm/drop_caches`. Returns false (after a loud warning on stderr) when
/// the kernel refuses (not root): the figures that follow are then warm-cache. A failed `sync`
/// before a successful drop is warned about but still counts as dropped.
pub fn drop_caches() -> bool {
    match drop_page_cache() {
        Ok(true) => true,
        Ok(false) => {
            eprintln!("WARNING: sync failed before dropping caches");
            true
        }
        Err(e) => {
            eprintln!(
                "!!!!!!!! WARNING: cannot drop caches ({e}); figures are WARM-CACHE !!!!!!!!"
            );
            false
        }
    }
}

/// [`drop_caches`], saying nothing, for a caller with its own words for a warm cache: whether
/// `sync` succeeded, or the kernel's refusal (not root).
pub fn drop_page_cache() -> std::io::Result<bool> {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    std::fs::write("/proc/sys/vm/drop_caches", "3")?;
    Ok(synced)
}

/// `sync -f DIR`: flush every dirty page of the filesystem holding `dir` (between steps, not
/// timed), so that no step pays for an earlier step's writeback.
pub fn syncfs(dir: &Path) -> BenchResult<()> {
    let status = Command::new("sync").arg("-f").arg(dir).status()?;
    if !status.success() {
        return Err(format!("sync -f {} failed", dir.display()).into());
    }
    Ok(())
}

/// Remove a file; a file that is not there is not an error.
pub fn remove_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Remove a directory and everything under it; a directory that is not there is not an error.
pub fn remove_dir_if_present(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Free bytes for unprivileged users on the filesystem holding `dir` (`df -B1 --output=avail`).
pub fn free_bytes(dir: &Path) -> BenchResult<u64> {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(dir)
        .output()?;
    let s = String::from_utf8_lossy(&out.stdout);
    let v = s
        .lines()
        .nth(1)
        .ok_or("df printed no value")?
        .trim()
        .parse()?;
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Timing.

/// Run a tool to completion with stdin from `/dev/null` and stderr inherited; its wall time.
/// Its stdout goes where `cmd` says (inherited unless set). A failure to start or a non-zero exit
/// is an error.
pub fn tool(cmd: &mut Command) -> BenchResult<Duration> {
    let t = Instant::now();
    let status = cmd.stdin(Stdio::null()).stderr(Stdio::inherit()).status()?;
    let d = t.elapsed();
    if !status.success() {
        return Err(format!("{cmd:?} failed: {status}").into());
    }
    Ok(d)
}

/// [`tool`], capturing stdout: its wall time and stdout (lossy UTF-8).
pub fn tool_output(cmd: &mut Command) -> BenchResult<(Duration, String)> {
    let t = Instant::now();
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::inherit()).output()?;
    let d = t.elapsed();
    if !out.status.success() {
        return Err(format!("{cmd:?} failed: {}", out.status).into());
    }
    Ok((d, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// The wall time of `f`; its error is passed on.
pub fn time(f: impl FnOnce() -> BenchResult<()>) -> BenchResult<Duration> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed())
}

/// Whether a tool runs at all (`NAME ARG`, output discarded; its exit status is not looked at).
pub fn has_tool(name: &str, arg: &str) -> bool {
    Command::new(name)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

// ---------------------------------------------------------------------------------------------
// This process and the machine.

/// User + system CPU time of this process, all threads (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
        + Duration::from_nanos(u64::try_from(t.tv_nsec).unwrap_or(0))
}

/// Reset this process's peak RSS (`VmHWM`) to its current RSS: `echo 5 > /proc/self/clear_refs`.
/// Returns false if the kernel refused (then `VmHWM` covers the whole process so far).
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A `kB` field of `/proc/self/status`, e.g. `status_kib("VmHWM")` (peak RSS) in KiB.
pub fn status_kib(field: &str) -> BenchResult<u64> {
    let s = std::fs::read_to_string("/proc/self/status")?;
    let line = s
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .ok_or_else(|| format!("{field} not in /proc/self/status"))?;
    let v = line[field.len() + 1..]
        .split_whitespace()
        .next()
        .ok_or_else(|| format!("{field}: no value"))?;
    Ok(v.parse()?)
}

/// The 1-, 5- and 15-minute load averages from `/proc/loadavg`, space-separated (`"unknown"` if
/// unreadable).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// What the benchmark ran on, probed once; every field is `"unknown"` (or 0) when unreadable.
#[derive(Debug)]
pub struct Machine {
    /// `std::thread::available_parallelism`.
    pub cores: usize,
    /// The first `model name` of `/proc/cpuinfo`.
    pub cpu: String,
    /// `findmnt -n -o FSTYPE,SOURCE --target DIR`, as printed.
    pub fs: String,
    /// `findmnt -n -o FSTYPE,SOURCE,OPTIONS --target DIR`, as printed: [`Machine::fs`] with the
    /// mount options.
    pub fs_options: String,
    /// `MemTotal` of `/proc/meminfo`, as printed there (`"24563500 kB"`).
    pub mem: String,
}

impl Machine {
    /// Probe this machine; `dir` is where the benchmark reads and writes.
    pub fn probe(dir: &Path) -> Machine {
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let field = |file: &str, key: &str| {
            std::fs::read_to_string(file).ok().and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with(key))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
        };
        let findmnt = |columns: &str| {
            Command::new("findmnt")
                .args(["-n", "-o", columns, "--target"])
                .arg(dir)
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "unknown".into())
        };
        Machine {
            cores,
            cpu: field("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into()),
            fs: findmnt("FSTYPE,SOURCE"),
            fs_options: findmnt("FSTYPE,SOURCE,OPTIONS"),
            mem: field("/proc/meminfo", "MemTotal").unwrap_or_else(|| "unknown".into()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Results.

/// The median of `values` (the mean of the two middle ones for an even count); `None` if empty.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// A column's alignment in a Markdown table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// `---`
    Left,
    /// `---:`
    Right,
}

/// A Markdown table printed to stdout: a header line, the alignment line, then one line per row,
/// each `| cell | cell |`. Cells are printed as given (an empty cell prints as `|  |`).
#[derive(Debug)]
pub struct Table {
    header: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles and alignments.
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            header: columns.iter().map(|(h, _)| (*h).to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Add a row (any number of cells).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines of text, without a trailing newline on the last.
    pub fn render(&self) -> String {
        let line = |cells: &[String]| format!("| {} |", cells.join(" | "));
        let align: Vec<String> = self
            .align
            .iter()
            .map(|a| match a {
                Align::Left => "---".to_string(),
                Align::Right => "---:".to_string(),
            })
            .collect();
        let mut lines = vec![line(&self.header), line(&align)];
        lines.extend(self.rows.iter().map(|r| line(r)));
        lines.join("\n")
    }

    /// Print [`Table::render`] to stdout.
    pub fn print(&self) {
        println!("{}", self.render());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(std::iter::empty()), None);
    }

    #[test]
    fn table_renders_markdown() {
        let mut t = Table::new(&[("step", Align::Left), ("seconds", Align::Right)]);
        t.row(vec!["cat".into(), "1.000".into()]);
        t.row(vec!["x".into(), String::new()]);
        assert_eq!(
            t.render(),
            "| step | seconds |\n| --- | ---: |\n| cat | 1.000 |\n| x |  |"
        );
    }
}
