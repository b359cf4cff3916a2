//! `tarfa verify` (and `tarfa convert --verify`): progress by bytes, the report for people or as
//! JSON, exit code 1 when any fault is found.

use std::io::IsTerminal;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};
use tarfa_verifier::{parse_sample, verify, Options, Progress, Report};

use crate::cli::VerifyArgs;

struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn start(&self, bytes: u64) {
        if let Some(b) = &self.0 {
            b.set_length(bytes);
        }
    }
    fn advance(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }
    fn file_done(&self, file: &str, faults: usize) {
        if let Some(b) = &self.0 {
            b.set_message(file.to_string());
            if faults > 0 {
                b.println(format!("{file}: {faults} fault(s)"));
            }
        }
    }
}

/// Verify `dir` (progress on stderr unless `quiet`); the report, not yet printed.
pub fn check(dir: &Path, opts: &Options, quiet: bool) -> anyhow::Result<Report> {
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "verify {msg:18} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b
    });
    let progress = Bar(bar);
    let report = verify(dir, opts, &progress)?;
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
    }
    Ok(report)
}

/// The report as its `--json` document (docs/json.md, `tarfa.verify/1`).
pub fn json_doc(report: &Report) -> anyhow::Result<serde_json::Value> {
    let mut doc = crate::json::document("tarfa.verify/1", report)?;
    doc["seconds"] = crate::json::float(report.seconds);
    Ok(doc)
}

/// Print the report for people on stdout.
pub fn print_text(report: &Report) {
    for f in &report.faults {
        println!("FAULT {}", f.line());
    }
    let src = if report.source_bytes_compared > 0 {
        format!(
            ", {} bytes compared with the source",
            report.source_bytes_compared
        )
    } else if report.source.is_some() {
        ", no region has a source to compare".to_string()
    } else {
        ", not compared with a source (give --source)".to_string()
    };
    println!(
        "{}: {} fault(s); read {} files in full ({} bytes{}, {} regions, {} experts){}{}, {} structure only; {:.2} s ({:.2} GB/s)",
        report.dir,
        report.faults.len(),
        report.files_read,
        report.bytes_read,
        if report.direct_io { ", O_DIRECT" } else { "" },
        report.regions_checked,
        report.experts_checked,
        src,
        report.sample.as_ref().map(|s| format!(", sample {s}")).unwrap_or_default(),
        report.files_structure_only,
        report.seconds,
        (report.bytes_read + report.source_bytes_compared) as f64 / report.seconds.max(1e-9) / 1e9
    );
}

/// `tarfa verify`; `Ok(false)` when faults were found.
pub fn run(args: &VerifyArgs) -> anyhow::Result<bool> {
    crate::diagnose::refuse_a_file(&args.dir, "verify")?;
    let opts = Options {
        source: args.source.clone(),
        layers: args
            .layers
            .as_deref()
            .map(tarfa_converter::parse_layer_range)
            .transpose()?,
        sample: args.sample.as_deref().map(parse_sample).transpose()?,
        direct_io: !args.buffered,
        partial: false,
    };
    let report = check(&args.dir, &opts, args.quiet)?;
    if args.json {
        crate::json::print(&json_doc(&report)?)?;
    } else {
        print_text(&report);
    }
    let no_manifest = args
        .dir
        .join(tarfa_format::manifest::MANIFEST_NAME)
        .symlink_metadata()
        .is_err();
    if no_manifest {
        let h = crate::diagnose::model_dir_hint(&args.dir)
            .unwrap_or_else(|| crate::diagnose::reads_a_model_dir("verify"));
        eprintln!("hint: {h}");
    }
    Ok(report.faults.is_empty())
}
