//! `tarfa convert`: progress bars (or plain lines when stderr is not a terminal) around
//! [`tarfa_converter::convert()`], and the summary.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use tarfa_converter::{convert, parse_layer_range, Options, Outcome, Progress};

use crate::cli::ConvertArgs;
use crate::diagnose::{is_jnf_file, is_safetensors_file, is_url, Refused};

/// Draws one bar by bytes with ETA, labelled with the current file; or, on a pipe, one line per
/// file; or nothing with `--quiet`.
struct Bars {
    bar: Option<ProgressBar>,
    plain: bool,
    file_started: Mutex<Instant>,
}

impl Progress for Bars {
    fn start(&self, bytes: u64, files: usize) {
        if let Some(b) = &self.bar {
            b.set_length(bytes);
        } else if self.plain {
            eprintln!("converting up to {} in {files} files", HumanBytes(bytes));
        }
    }
    fn file_start(&self, label: &str, _bytes: u64) {
        if let Ok(mut t) = self.file_started.lock() {
            *t = Instant::now();
        }
        if let Some(b) = &self.bar {
            b.set_message(label.to_string());
        }
    }
    fn advance(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }
    fn file_done(&self, label: &str, outcome: &Outcome) {
        let secs = self
            .file_started
            .lock()
            .map(|t| t.elapsed().as_secs_f64())
            .unwrap_or(0.0);
        let line = match outcome {
            Outcome::Written { bytes, replaced } => format!(
                "{label}: {}, {} in {secs:.2} s ({:.2} GB/s)",
                if *replaced {
                    "repaired (the file there did not check against this source: damaged, or the source changed), rewritten"
                } else {
                    "written"
                },
                HumanBytes(*bytes),
                *bytes as f64 / secs.max(1e-9) / 1e9
            ),
            Outcome::Skipped => format!(
                "{label}: already present, its hashes and the source bytes checked; skipped"
            ),
        };
        if let Some(b) = &self.bar {
            b.println(line);
        } else if self.plain {
            eprintln!("{line}");
        }
    }
}

/// The common mistakes in naming the source, refused with the hint that fits: a URL, a
/// `.safetensors` file instead of its directory, a directory holding only a GGUF, tarfa's own
/// output (a JNF file or model directory), a file that is neither a GGUF nor a checkpoint.
fn check_source(src: &Path) -> Result<(), Refused> {
    let s = src.display();
    if is_url(&src.to_string_lossy()) {
        let (fetch, file) = fetch_source(&src.to_string_lossy());
        return Err(Refused {
            code: 2,
            message: format!("{s}: convert reads a local checkpoint, not a URL"),
            hint: format!(
                "download it first: a GGUF with tarfa fetch {fetch} --tensors '*' -o {file}, then tarfa convert {file} -o OUT (fetch takes one file: hf://owner/repo[@revision]/path/in/repo, or its URL); a safetensors checkpoint with its config.json into a directory (e.g. huggingface-cli download owner/repo --local-dir DIR), then tarfa convert DIR -o OUT"
            ),
        });
    }
    if is_safetensors_file(src) && src.is_file() {
        let dir = src.parent().map_or(".".into(), |d| d.display().to_string());
        return Err(Refused {
            code: 1,
            message: format!("{s}: a file of a safetensors checkpoint; convert reads the checkpoint's directory (config.json beside the shards)"),
            hint: format!("give its directory: tarfa convert {dir} -o OUT"),
        });
    }
    const READS: &str = "convert reads a Hugging Face checkpoint directory (config.json beside model.safetensors or the shards of model.safetensors.index.json) or a GGUF file (for a split set, any part)";
    if src.is_file() && is_jnf_file(src) {
        return Err(Refused {
            code: 1,
            message: format!("{s}: a JNF file (tarfa's output), not a checkpoint"),
            hint: format!("{READS}; inspect this file as it is (tarfa inspect {s})"),
        });
    }
    if src.is_file() && !crate::inspect_gguf::is_gguf(src) {
        return Err(Refused {
            code: 1,
            message: format!("{s}: neither a GGUF file nor a checkpoint directory"),
            hint: READS.into(),
        });
    }
    let manifest = tarfa_format::manifest::MANIFEST_NAME;
    if src.is_dir() && src.join(manifest).symlink_metadata().is_ok() {
        return Err(Refused {
            code: 1,
            message: format!(
                "{s}: a JNF model directory (it holds {manifest}), already converted; not a checkpoint"
            ),
            hint: format!(
                "use it as it is (tarfa inspect {s}, tarfa verify {s}, tarfa run {s}); to convert again, give the checkpoint it was made from"
            ),
        });
    }
    if src.is_dir() {
        let names: Vec<String> = std::fs::read_dir(src)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        let safetensors = names.iter().any(|n| is_safetensors_file(Path::new(n)));
        let mut ggufs: Vec<&String> = names.iter().filter(|n| n.ends_with(".gguf")).collect();
        ggufs.sort();
        if let (false, Some(g)) = (safetensors, ggufs.first()) {
            return Err(Refused {
                code: 1,
                message: format!("{s}: no safetensors checkpoint here, but a GGUF file ({g})"),
                hint: format!(
                    "give the GGUF file itself (for a split set, any part): tarfa convert {} -o OUT",
                    src.join(g).display()
                ),
            });
        }
    }
    Ok(())
}

/// The SOURCE and output file of the `tarfa fetch` that downloads the GGUF `url` names: the URL
/// itself when fetch takes it, else (`hf://owner/repo[@revision]`, a repository with no file)
/// the repository's file as `MODEL.gguf`, for the user to name.
fn fetch_source(url: &str) -> (String, String) {
    let takes = |u: &str| tarfa_fetch::Location::parse(u, tarfa_fetch::DEFAULT_HF_ENDPOINT).is_ok();
    let named = |u: &str| {
        let last = u.rsplit('/').next().unwrap_or("");
        if last.to_ascii_lowercase().ends_with(".gguf") {
            last.to_string()
        } else {
            "MODEL.gguf".to_string()
        }
    };
    if takes(url) {
        return (url.to_string(), named(url));
    }
    let with_file = format!("{}/MODEL.gguf", url.trim_end_matches('/'));
    if takes(&with_file) {
        return (with_file, "MODEL.gguf".into());
    }
    ("hf://owner/repo/MODEL.gguf".into(), "MODEL.gguf".into())
}

/// A conversion that failed on the machine's side while writing `out` (I/O, no space) resumes:
/// say so.
fn with_resume_hint(e: tarfa_converter::ConvertError, out: &Path) -> anyhow::Error {
    use tarfa_converter::ConvertError as C;
    use tarfa_format::fsio::FsError;
    let resumable = match &e {
        C::NoSpace { .. } => true,
        C::Io { path, .. } | C::File(FsError::Io { path, .. }) => path.starts_with(out),
        _ => false,
    };
    if !resumable {
        return e.into();
    }
    Refused {
        code: 2,
        message: e.to_string(),
        hint: "rerun the same tarfa convert to resume: every file already published is checked and kept, the failed one is written again".into(),
    }
    .into()
}

/// Run the conversion; `Ok(true)` on success.
pub fn run(args: &ConvertArgs) -> anyhow::Result<bool> {
    check_source(&args.source)?;
    let layers = args.layers.as_deref().map(parse_layer_range).transpose()?;
    let tty = std::io::stderr().is_terminal();
    let bar = (!args.quiet && tty).then(|| {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template(
                "{msg:18} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        b
    });
    let progress = Bars {
        bar,
        plain: !args.quiet && !tty,
        file_started: Mutex::new(Instant::now()),
    };
    let opts = Options {
        layers,
        direct_io: !args.buffered,
        jobs: args.jobs,
    };
    let s = convert(&args.source, &args.output, &opts, &progress)
        .map_err(|e| with_resume_hint(e, &args.output))?;
    if let Some(b) = &progress.bar {
        b.finish_and_clear();
    }
    let verify = || -> anyhow::Result<Option<tarfa_verifier::Report>> {
        if !args.verify {
            return Ok(None);
        }
        let vopts = tarfa_verifier::Options {
            source: Some(args.source.clone()),
            layers,
            sample: None,
            direct_io: !args.buffered,
            // `--layers` converts a piece: the layers not asked for are expected to be missing.
            partial: layers.is_some(),
        };
        Ok(Some(crate::verify_cmd::check(
            &args.output,
            &vopts,
            args.quiet,
        )?))
    };
    let passed =
        |r: &Option<tarfa_verifier::Report>| r.as_ref().is_none_or(|r| r.faults.is_empty());
    // Layers of the range converted (all, without --layers) that are still not there: the source
    // holds none of their tensors, though its config declares them. No `--layers` run can add
    // them, so the model will never run: said after the summary, exit 1.
    let (from, to) = layers.unwrap_or((0, u32::MAX));
    // The decoder layers: MTP layers after them may be left out of a model.
    let required = tarfa_format::manifest::Manifest::load(&args.output)
        .map_or(s.num_layers, |m| m.architecture.required_layers());
    let absent: Vec<u32> = (from..required.min(to.saturating_add(1)))
        .filter(|l| !s.layers_present.contains(l))
        .collect();
    let lacking = |out: &Path| -> anyhow::Result<bool> {
        if absent.is_empty() {
            return Ok(true);
        }
        let list: Vec<String> = absent.iter().map(u32::to_string).collect();
        Err(Refused {
            code: 1,
            message: format!(
                "{}: holds no tensors of layer{} {}, which its config declares ({} layers): {} is not a whole model and will not run",
                args.source.display(),
                if absent.len() == 1 { "" } else { "s" },
                list.join(", "),
                s.num_layers,
                out.display()
            ),
            hint: "a source that lacks layers cannot supply them (--layers cannot add them): convert a checkpoint or GGUF of the whole model (fixtures/gguf/README.md says which fixtures are)".into(),
        }
        .into())
    };
    if args.json {
        let verified = verify()?;
        // One document: the conversion, and the verification inside it (`null` without --verify).
        let mut doc = crate::json::document("tarfa.convert/1", &s)?;
        doc["seconds"] = crate::json::float(s.seconds);
        doc["verify"] = match &verified {
            Some(r) => crate::verify_cmd::json_doc(r)?,
            None => serde_json::Value::Null,
        };
        crate::json::print(&doc)?;
        return Ok(lacking(&args.output)? && passed(&verified));
    }
    println!(
        "{}: {} layers written, {} skipped (already present and checked){}; {} of {} layers present",
        args.output.display(),
        s.layers_written.len(),
        s.layers_skipped.len(),
        if s.trunk_written { ", trunk written" } else { "" },
        s.layers_present.len(),
        s.num_layers
    );
    println!(
        "{} experts, {} in {:.2} s ({:.2} GB/s){}",
        s.experts_written,
        HumanBytes(s.bytes_written),
        s.seconds,
        s.bytes_written as f64 / s.seconds.max(1e-9) / 1e9,
        if s.direct_io {
            ", O_DIRECT where the filesystem allowed"
        } else {
            ", buffered"
        }
    );
    if !s.layers_replaced.is_empty() || s.trunk_replaced {
        let mut what: Vec<String> = s
            .layers_replaced
            .iter()
            .map(|l| format!("layer {l}"))
            .collect();
        if s.trunk_replaced {
            what.insert(0, "the trunk".into());
        }
        println!(
            "repaired: {} (the file there did not check against this source: damaged, or the source changed; rewritten)",
            what.join(", ")
        );
    }
    if !s.unrecognised.is_empty() {
        println!(
            "kept as trunk tensors, names not recognised: {}",
            s.unrecognised.join(", ")
        );
    }
    if !s.loose_expert_tensors.is_empty() {
        println!(
            "kept as plain layer tensors, not a known expert projection: {}",
            s.loose_expert_tensors.join(", ")
        );
    }
    let verified = verify()?;
    if let Some(r) = &verified {
        crate::verify_cmd::print_text(r);
    }
    Ok(lacking(&args.output)? && passed(&verified))
}

#[cfg(test)]
mod tests {
    use clap::FromArgMatches as _;

    use super::*;

    /// The `tarfa fetch …` command line of `hint`, as the shell would split it.
    fn fetch_line(hint: &str) -> Vec<String> {
        let start = hint
            .find("tarfa fetch ")
            .expect("a fetch command in the hint");
        let line = hint[start..].split(", then").next().expect("a command");
        line.split_whitespace()
            .map(|w| w.trim_matches('\'').to_string())
            .collect()
    }

    #[test]
    fn convert_of_a_url_hints_a_fetch_that_fetch_accepts() {
        for url in [
            "hf://owner/repo",
            "hf://owner/repo/",
            "hf://owner/repo@v1.0",
            "hf://owner/repo/sub/model-Q4_K.gguf",
            "hf://owner",
            "https://example.com/m.gguf",
            "HF://owner/repo",
        ] {
            let hint = check_source(Path::new(url)).expect_err("a URL").hint;
            let line = fetch_line(&hint);
            let parsed = crate::cli::command()
                .try_get_matches_from(&line)
                .map_err(|e| e.to_string())
                .and_then(|m| crate::cli::Cli::from_arg_matches(&m).map_err(|e| e.to_string()));
            let cli = parsed.unwrap_or_else(|e| panic!("{url}: {line:?} is refused: {e}"));
            let crate::cli::Command::Fetch(f) = cli.command else {
                panic!("{url}: {line:?} is not a fetch");
            };
            tarfa_fetch::Location::parse(&f.source, tarfa_fetch::DEFAULT_HF_ENDPOINT)
                .unwrap_or_else(|e| panic!("{url}: fetch refuses {}: {e}", f.source));
        }
    }
}
