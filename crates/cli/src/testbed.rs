//! `anode testbed up|down|status`: many nodes on loopback (or in network
//! namespaces) from one topology file.
use anyhow::{Result, bail};
use std::process::ExitCode;

/// `anode testbed` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TestbedCmd {
    /// Start the nodes of a topology.
    Up {},
    /// Stop them.
    Down {},
}

/// Runs a testbed subcommand.
pub fn run(_c: TestbedCmd) -> Result<ExitCode> {
    bail!("anode testbed: not implemented yet")
}
