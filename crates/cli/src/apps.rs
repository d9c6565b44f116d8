//! Applications over a running node's local API: ping, traceroute, send,
//! recv, multicast.
use anyhow::{Result, bail};
use std::process::ExitCode;

/// Arguments of `anode ping`.
#[derive(Debug, clap::Args)]
pub struct PingArgs {}
/// Arguments of `anode traceroute`.
#[derive(Debug, clap::Args)]
pub struct TracerouteArgs {}
/// Arguments of `anode send`.
#[derive(Debug, clap::Args)]
pub struct SendArgs {}
/// Arguments of `anode recv`.
#[derive(Debug, clap::Args)]
pub struct RecvArgs {}
/// Arguments of `anode multicast`.
#[derive(Debug, clap::Args)]
pub struct MulticastArgs {}

/// `anode ping`.
pub fn ping(_a: PingArgs) -> Result<ExitCode> {
    bail!("anode ping: not implemented yet")
}
/// `anode traceroute`.
pub fn traceroute(_a: TracerouteArgs) -> Result<ExitCode> {
    bail!("anode traceroute: not implemented yet")
}
/// `anode send`.
pub fn send(_a: SendArgs) -> Result<ExitCode> {
    bail!("anode send: not implemented yet")
}
/// `anode recv`.
pub fn recv(_a: RecvArgs) -> Result<ExitCode> {
    bail!("anode recv: not implemented yet")
}
/// `anode multicast`.
pub fn multicast(_a: MulticastArgs) -> Result<ExitCode> {
    bail!("anode multicast: not implemented yet")
}
