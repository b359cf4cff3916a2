//! Command-line types: every flag of `tarfa`, in one place.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// tarfa: run huge Mixture-of-Experts checkpoints exactly. JNF v1 files, their converter,
/// verifier and runtime.
#[derive(Debug, Parser)]
#[command(name = "tarfa", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Summarise a JNF file or a model directory: layers, experts, dtypes, sizes, hashes,
    /// provenance. Opening a file checks its whole structure (not its data; see `verify`).
    Inspect(InspectArgs),
}

/// `tarfa inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// A `.jnf` file, or a model directory holding `manifest.json`.
    pub path: PathBuf,
    /// Print JSON on stdout instead of the readable summary.
    #[arg(long)]
    pub json: bool,
    /// List every region of each file (the default for a single file, not for a directory).
    #[arg(long)]
    pub regions: bool,
}
