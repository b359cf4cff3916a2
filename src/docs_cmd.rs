//! `tarfa completions SHELL` and `tarfa man`: generated from the parser itself, so they list
//! exactly the flags it accepts.

use std::io::Write as _;

use anyhow::Context;

use crate::cli::{CompletionsArgs, ManArgs};

/// Print the completion script for `a.shell`.
pub fn completions(a: &CompletionsArgs) -> anyhow::Result<bool> {
    let mut out = std::io::stdout().lock();
    clap_complete::generate(a.shell, &mut crate::cli::command(), "tarfa", &mut out);
    out.flush()?;
    Ok(true)
}

/// Print tarfa(1), or tarfa-COMMAND(1).
pub fn man(a: &ManArgs) -> anyhow::Result<bool> {
    let cmd = crate::cli::command();
    let page = match &a.command {
        None => cmd,
        Some(name) => {
            let names: Vec<String> = cmd
                .get_subcommands()
                .map(|c| c.get_name().to_string())
                .collect();
            let sub = cmd.find_subcommand(name).with_context(|| {
                format!("no command {name:?}; the commands: {}", names.join(", "))
            })?;
            sub.clone()
                .display_name(format!("tarfa-{name}"))
                .bin_name(format!("tarfa {name}"))
        }
    };
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(page).render(&mut out)?;
    out.flush()?;
    Ok(true)
}
