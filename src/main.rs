//! `tarfa`: the command-line front of the tarfa crates. Argument parsing, output and exit codes
//! live here; everything else is a library call.
//!
//! Exit codes: 0 success; 1 the input is invalid or inconsistent (a JNF or GGUF rule broken, a model
//! directory that disagrees with its manifest); 2 tarfa could not run (bad arguments, I/O errors).

mod cli;
mod convert_cmd;
mod inspect;
mod inspect_gguf;
mod verify_cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when stdout is a closed pipe (`tarfa inspect … | head`)
    // instead of panicking in println!.
    // SAFETY: resetting a signal disposition to its default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = cli::Cli::parse();
    let result = match &args.command {
        cli::Command::Inspect(a) => inspect::run(a),
        cli::Command::Convert(a) => convert_cmd::run(a),
        cli::Command::Verify(a) => verify_cmd::run(a),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            let invalid = e.downcast_ref::<tarfa_format::Error>().is_some_and(|e| {
                matches!(
                    e,
                    tarfa_format::Error::Format { .. } | tarfa_format::Error::Manifest { .. }
                )
            });
            let invalid = invalid
                || e.downcast_ref::<tarfa_converter::ConvertError>()
                    .is_some_and(|e| {
                        use tarfa_converter::ConvertError as C;
                        matches!(
                            e,
                            C::MissingShard { .. }
                                | C::LfsPointer { .. }
                                | C::BadShard { .. }
                                | C::BadTensor { .. }
                                | C::BadSource { .. }
                                | C::BadExperts { .. }
                        ) || matches!(e, C::Gguf(g) if g.violation().is_some())
                    });
            if invalid {
                eprintln!("hint: the file breaks a rule of spec/JNF_V1.md; it was not written by a conforming writer or was damaged since");
            }
            let invalid_gguf = e
                .downcast_ref::<tarfa_gguf::Error>()
                .is_some_and(|e| e.violation().is_some());
            ExitCode::from(if invalid || invalid_gguf { 1 } else { 2 })
        }
    }
}
