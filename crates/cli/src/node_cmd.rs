//! `anode node` (the daemon) and `anode status`.
use anyhow::{Result, bail};
use std::process::ExitCode;

/// Arguments of `anode node`.
#[derive(Debug, clap::Args)]
pub struct NodeArgs {}

/// Arguments of `anode status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {}

/// Runs the daemon.
pub fn run(_a: NodeArgs) -> Result<ExitCode> {
    bail!("anode node: not implemented yet")
}

/// Prints a running node's counters.
pub fn status(_a: StatusArgs) -> Result<ExitCode> {
    bail!("anode status: not implemented yet")
}
