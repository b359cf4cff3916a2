//! `tarfa`: the command-line front of the tarfa crates. Argument parsing, output and exit codes
//! live here; everything else is a library call.
//!
//! Exit codes: 0 success; 1 the input is invalid or inconsistent (a JNF or GGUF rule broken, a model
//! directory that disagrees with its manifest or has none, a path that is not what the command
//! reads); 2 tarfa could not run (bad arguments or environment values, a URL where a local path
//! is wanted, I/O errors).

#![forbid(unsafe_code)]

mod bench_decode_cmd;
mod bench_io_cmd;
mod chat_cmd;
mod cli;
mod convert_cmd;
mod diagnose;
mod docs_cmd;
mod env_check;
mod fetch_cmd;
mod inspect;
mod inspect_gguf;
mod json;
mod peer;
mod run_cmd;
mod serve_cmd;
mod verify_cmd;

use std::process::ExitCode;

use clap::FromArgMatches as _;

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let mut args = match cli::Cli::from_arg_matches(&cli::command().get_matches()) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    args.settle_renamed();
    // Bad TARFA_* values first: exit 2 whatever the command.
    let checked = env_check::check(std::env::vars_os()).map(|warnings| {
        for w in warnings {
            eprintln!("{w}");
        }
    });
    let result = checked.and_then(|()| match &args.command {
        cli::Command::Inspect(a) => inspect::run(a),
        cli::Command::Convert(a) => convert_cmd::run(a),
        cli::Command::Verify(a) => verify_cmd::run(a),
        cli::Command::Fetch(a) => fetch_cmd::run(a),
        cli::Command::BenchIo(a) => bench_io_cmd::run(a),
        cli::Command::Run(a) => run_cmd::run(a),
        cli::Command::Serve(a) => serve_cmd::run(a),
        cli::Command::Chat(a) => chat_cmd::run(a),
        cli::Command::BenchDecode(a) => bench_decode_cmd::run(a),
        cli::Command::Completions(a) => docs_cmd::completions(a),
        cli::Command::Man(a) => docs_cmd::man(a),
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) if is_broken_pipe(&e) => ExitCode::from(CLOSED_PIPE_EXIT),
        Err(e) => {
            eprintln!("error: {}", error_text(&e));
            let (code, hint) = match e.downcast_ref::<diagnose::Refused>() {
                Some(r) => (r.code, Some(r.hint.clone())),
                None => classify(&e),
            };
            if let Some(h) = hint {
                eprintln!("hint: {h}");
            }
            ExitCode::from(code)
        }
    }
}

/// `e` and its causes, joined by `: ` as `{e:#}` joins them, leaving out a cause whose text the
/// message already holds: an error that prints its source in its own text (`path: open: No such
/// file or directory (os error 2)`) and also returns it from `source()` would show it twice.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

/// The exit status of a process ended by SIGPIPE, as a shell reports it (128 + 13).
const CLOSED_PIPE_EXIT: u8 = 141;

/// Like other Unix tools, end quietly when stdout is a closed pipe (`tarfa inspect … | head`).
/// Rust ignores SIGPIPE, so a write to the closed pipe fails with `BrokenPipe`: `println!`
/// panics with it (caught here) and `write!` returns it (caught in `main`). Both end the process
/// with no message and the status a shell shows for SIGPIPE, without resetting the signal
/// (which needs `unsafe`).
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(CLOSED_PIPE_EXIT.into());
        }
        default(info)
    }));
}

/// Whether `e` is a write to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Exit code and hint for a library's error: 1 when the input is invalid (a file breaks its format's
/// rules, a source checkpoint is incomplete or damaged), 2 when tarfa could not run.
fn classify(e: &anyhow::Error) -> (u8, Option<String>) {
    // A part of a model is not a damaged one: the hint names the conversions that complete it.
    if let Some(tarfa_decode::DecodeError::Incomplete { dir, missing, .. }) = e.downcast_ref() {
        return (1, Some(incomplete_hint(dir, missing)));
    }
    let (code, hint) = classify_static(e);
    (code, hint.map(str::to_string))
}

/// What to run to make a model with `missing` layers whole: a `--layers` conversion per range,
/// into the same directory.
fn incomplete_hint(dir: &std::path::Path, missing: &[u32]) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &l in missing {
        match ranges.last_mut() {
            Some((_, b)) if b.checked_add(1) == Some(l) => *b = l,
            _ => ranges.push((l, l)),
        }
    }
    let runs: Vec<String> = ranges
        .iter()
        .map(|&(a, b)| {
            let layers = if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            };
            format!("tarfa convert SRC -o {} --layers {layers}", dir.display())
        })
        .collect();
    format!(
        "the model was converted for part of its depth: convert the missing layers into it from the same source ({}); the layers already there are checked and kept (a source that holds no tensors of a layer cannot supply it: tarfa convert says so)",
        runs.join("; ")
    )
}

/// [`classify`] of the errors whose hint is fixed text.
fn classify_static(e: &anyhow::Error) -> (u8, Option<&'static str>) {
    use tarfa_converter::{ConvertError as C, SourceFault};
    if let Some(f) = file_error(e) {
        // A FIFO, a device or an over-long file where a file of the model should be: invalid
        // input. A failed open or read is the machine's: exit 2.
        if !matches!(f, tarfa_format::fsio::FsError::Io { .. }) {
            return (1, None);
        }
    }
    const JNF: &str = "the file breaks a rule of spec/JNF_V1.md: it was not written by a conforming writer, or was damaged since (tarfa verify names every fault)";
    const SOURCE: &str =
        "the source checkpoint is incomplete or damaged; nothing of the failing file was published";
    const NAMES: &str = "a JNF file holds names of 1 to 4096 bytes without NUL, and source paths without ':' components (spec/JNF_V1.md §5.1); rename it in the source";
    const GGUF: &str =
        "the GGUF file breaks a rule of the format; it is damaged, truncated or not a GGUF file";
    const SOURCE_READ: &str = "the source file named could not be read to the end (a media error, or it shrank or was replaced while converting): check or re-download it, then rerun the same tarfa convert; nothing of the failing JNF file was published";
    const EMPTY: &str = "give the checkpoint's directory with its weights (model.safetensors, or the shards model.safetensors.index.json lists), or a GGUF file of the whole model";
    // A JNF file or manifest that breaks the spec: invalid input. A manifest an older tarfa
    // wrote says itself what to do (convert again), so it gets no "damaged" hint.
    let jnf_hint = |f: &tarfa_format::Error| match f {
        tarfa_format::Error::Manifest {
            fault: tarfa_format::manifest::ManifestFault::PreJcsDigest { .. },
            ..
        } => Some((1, None)),
        tarfa_format::Error::Format { .. } | tarfa_format::Error::Manifest { .. } => {
            Some((1, Some(JNF)))
        }
        _ => None,
    };
    if let Some(r) = e.downcast_ref::<tarfa_format::Error>().and_then(jnf_hint) {
        return r;
    }
    if let Some(c) = e.downcast_ref::<C>() {
        match c {
            C::LfsPointer { .. }
            | C::SourceChanged { .. }
            | C::LayerCount { .. }
            | C::NotAnMtpBlock { .. } => return (1, None),
            C::SourceRead { .. } => return (2, Some(SOURCE_READ)),
            C::BadSource {
                fault: SourceFault::NoTensors | SourceFault::NoLayers,
                ..
            } => return (1, Some(EMPTY)),
            C::BadSource {
                fault:
                    SourceFault::NameTooLong { .. }
                    | SourceFault::BadName { .. }
                    | SourceFault::UnrecordableFileName { .. },
                ..
            } => return (1, Some(NAMES)),
            C::MissingShard { .. }
            | C::BadShard { .. }
            | C::BadSource { .. }
            | C::BadExperts { .. }
            | C::IndexTooLarge { .. } => return (1, Some(SOURCE)),
            C::Gguf(g) if g.violation().is_some() => return (1, Some(GGUF)),
            C::Format(tarfa_format::Error::Format { .. }) => return (1, Some(JNF)),
            _ => {}
        }
    }
    if let Some(d) = e.downcast_ref::<tarfa_decode::DecodeError>() {
        use tarfa_decode::DecodeError as D;
        // A layer file opened by the runtime carries the format's error as the trunk's does.
        if let Some(r) = match d {
            D::Format(f) | D::Stream(tarfa_runtime::StreamError::Format(f)) => jnf_hint(f),
            _ => None,
        } {
            return r;
        }
        match d {
            D::NotInManifest { .. } => return (1, Some(JNF)),
            D::Stream(tarfa_runtime::StreamError::Corrupt { .. }) => {
                return (1, Some("an expert's bytes on disk are not the ones converted; nothing was computed from them (tarfa verify names every fault)"))
            }
            D::Config { .. }
            | D::LayerCount { .. }
            | D::ConfigFileDiffers { .. }
            | D::Gguf { .. }
            | D::UnsupportedFamily { .. }
            | D::MissingTensor { .. }
            | D::BadTensor { .. }
            | D::BadExpert { .. } => return (1, None),
            _ => {}
        }
    }
    if e.downcast_ref::<tarfa_gguf::Error>()
        .is_some_and(|g| g.violation().is_some())
    {
        return (1, Some(GGUF));
    }
    (2, None)
}

/// The [`tarfa_format::fsio::FsError`] inside `e`, whichever crate's error carries it.
fn file_error(e: &anyhow::Error) -> Option<&tarfa_format::fsio::FsError> {
    use tarfa_format::fsio::FsError;
    fn of_format(e: &tarfa_format::Error) -> Option<&FsError> {
        match e {
            tarfa_format::Error::File(f) => Some(f),
            _ => None,
        }
    }
    fn of_gguf(e: &tarfa_gguf::Error) -> Option<&FsError> {
        match e {
            tarfa_gguf::Error::File(f) => Some(f),
            tarfa_gguf::Error::Publish(p) => of_format(p),
            _ => None,
        }
    }
    if let Some(f) = e.downcast_ref::<FsError>() {
        return Some(f);
    }
    if let Some(f) = e.downcast_ref::<tarfa_format::Error>() {
        return of_format(f);
    }
    if let Some(g) = e.downcast_ref::<tarfa_gguf::Error>() {
        return of_gguf(g);
    }
    if let Some(c) = e.downcast_ref::<tarfa_converter::ConvertError>() {
        use tarfa_converter::ConvertError as C;
        return match c {
            C::File(f) => Some(f),
            C::Format(f) => of_format(f),
            C::Gguf(g) => of_gguf(g),
            _ => None,
        };
    }
    if let Some(d) = e.downcast_ref::<tarfa_decode::DecodeError>() {
        return match d {
            tarfa_decode::DecodeError::Format(f) => of_format(f),
            _ => None,
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_of_an_older_tarfa_gets_no_damaged_file_hint() {
        use tarfa_format::manifest::ManifestFault;
        let err = |fault: ManifestFault| {
            anyhow::Error::new(tarfa_format::Error::Manifest {
                path: "m/manifest.json".into(),
                fault,
            })
        };
        let old = err(ManifestFault::PreJcsDigest {
            recorded: "00".into(),
        });
        assert_eq!(classify(&old), (1, None));
        let changed = err(ManifestFault::DigestMismatch {
            recorded: "00".into(),
            actual: "11".into(),
        });
        assert_eq!(classify(&changed).0, 1);
        assert!(classify(&changed).1.is_some_and(|h| h.contains("damaged")));
    }

    #[test]
    fn an_incomplete_model_s_hint_names_one_conversion_per_missing_range() {
        let h = incomplete_hint(std::path::Path::new("m"), &[1, 2, 3, 7]);
        assert!(
            h.contains("(tarfa convert SRC -o m --layers 1-3; tarfa convert SRC -o m --layers 7)"),
            "{h}"
        );
        assert!(!h.contains("damaged"), "{h}");
    }

    /// An error that prints its source in its own text, as `Error::Io` does.
    #[derive(Debug)]
    struct Open {
        source: std::io::Error,
    }

    impl std::fmt::Display for Open {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "f.jnf: open: {}", self.source)
        }
    }

    impl std::error::Error for Open {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_printed_again() {
        let io = std::io::Error::from_raw_os_error(2);
        let e = anyhow::Error::new(Open { source: io });
        let text = error_text(&e);
        assert_eq!(text.matches("(os error 2)").count(), 1, "{text}");
        assert!(text.starts_with("f.jnf: open: "), "{text}");
        // A cause the message does not hold is still printed after it.
        let e = anyhow::Error::new(std::io::Error::from_raw_os_error(13)).context("writing out");
        let text = error_text(&e);
        assert!(
            text.starts_with("writing out: ") && text.contains("(os error 13)"),
            "{text}"
        );
    }
}
