//! The result table of the cold-cache benchmarks (`convert`, `verify`): one row per step (median
//! seconds, GB/s over the same byte count, CPU seconds and peak RSS where measured in-process),
//! ratios between steps, and the same rows appended to a CSV file.

use std::io::Write;
use std::path::Path;

use crate::{Align, BenchResult, Machine};

/// One step's medians.
#[derive(Debug)]
pub struct StepRow {
    /// What was timed.
    pub step: &'static str,
    /// Median wall seconds.
    pub seconds: f64,
    /// Median CPU seconds of this process, for a step run in-process.
    pub cpu: Option<f64>,
    /// Median peak RSS in MiB, for a step run in-process.
    pub hwm_mib: Option<f64>,
}

/// A ratio between steps: its median over the runs and each run's value.
#[derive(Debug)]
pub struct Ratio {
    /// What is divided by what.
    pub name: &'static str,
    /// Median of the per-run ratios.
    pub median: f64,
    /// Per-run ratios.
    pub per_run: Vec<f64>,
}

/// The rows and ratios of one benchmark; GB/s is `bytes` / seconds / 1e9 on every row.
#[derive(Debug)]
pub struct StepTable {
    /// The steps.
    pub rows: Vec<StepRow>,
    /// The ratios.
    pub ratios: Vec<Ratio>,
    /// The byte count every row's GB/s is over.
    pub bytes: u64,
}

/// The loud banner printed above the table when dropping the page cache failed.
pub fn print_warm_cache_warning() {
    println!();
    println!("!!!!!!!! WARNING: dropping the page cache failed (not root?). !!!!!!!!");
    println!("!!!!!!!! EVERY FIGURE BELOW IS WARM-CACHE, NOT COLD.           !!!!!!!!");
}

impl StepTable {
    /// Print the steps as a Markdown table, after a blank line.
    pub fn print_steps(&self, runs: usize, cold: bool) {
        println!();
        let step = format!(
            "step (median of {runs}{})",
            if cold { "" } else { ", WARM CACHE" }
        );
        let mut table = crate::Table::new(&[
            (&step, Align::Left),
            ("seconds", Align::Right),
            ("GB/s", Align::Right),
            ("CPU s", Align::Right),
            ("peak RSS MiB", Align::Right),
        ]);
        for r in &self.rows {
            let opt = |v: Option<f64>, p: usize| v.map_or(String::new(), |v| format!("{v:.p$}"));
            table.row(vec![
                r.step.to_string(),
                format!("{:.3}", r.seconds),
                format!("{:.2}", self.bytes as f64 / r.seconds / 1e9),
                opt(r.cpu, 2),
                opt(r.hwm_mib, 1),
            ]);
        }
        table.print();
    }

    /// Print one line per ratio, after a blank line.
    pub fn print_ratios(&self) {
        println!();
        for r in &self.ratios {
            let per: Vec<String> = r.per_run.iter().map(|x| format!("{x:.3}")).collect();
            println!(
                "ratio {}: {:.3} (median; per run {})",
                r.name,
                r.median,
                per.join(", ")
            );
        }
    }

    /// Append the rows and ratios to the CSV file `path`, writing its header line first when the
    /// file is new.
    pub fn append_csv(
        &self,
        path: &Path,
        runs: usize,
        cold: bool,
        m: &Machine,
        load: &str,
    ) -> BenchResult<()> {
        let new = !path.exists();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if new {
            writeln!(
                f,
                "unix_time,step,bytes,runs,cache,median_s,gb_per_s,cpu_s,peak_rss_mib,cores,cpu,loadavg"
            )?;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let cache = if cold { "cold" } else { "WARM-drop-refused" };
        let cpu = m.cpu.replace(',', " ");
        let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
        for r in &self.rows {
            writeln!(
                f,
                "{now},{},{},{runs},{cache},{:.4},{:.3},{},{},{},{cpu},{load}",
                r.step.replace(',', " "),
                self.bytes,
                r.seconds,
                self.bytes as f64 / r.seconds / 1e9,
                opt(r.cpu),
                opt(r.hwm_mib),
                m.cores
            )?;
        }
        for r in &self.ratios {
            writeln!(
                f,
                "{now},ratio {},{},{runs},{cache},{:.4},,,,{},{cpu},{load}",
                r.name.replace(',', " "),
                self.bytes,
                r.median,
                m.cores
            )?;
        }
        Ok(())
    }
}
