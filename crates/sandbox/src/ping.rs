//! The active ping capsule's data format (the example module
//! `modules/ping`), for the tool that sends it and reads the reply.
//!
//! Capsule data, 19 bytes: origin address (4), target address (4), send
//! time in the origin's ms (8, big-endian), reply port (2, big-endian),
//! carry flag (1: send the code on every hop; 0: only its hash). At the
//! origin the `pong` entry delivers `[target (4), rtt ms (8)]` to the local
//! application on the reply port.

use std::net::Ipv4Addr;

use anode_cred::ModuleHash;

use crate::capsule::{Capsule, WireError};

/// Length of the ping capsule's data.
pub const DATA_LEN: usize = 19;

/// A ping capsule from `origin` to `target`, sent at `t0_ms`, answering on
/// `reply_port`; `carry_code` puts the code in every hop's capsule, else only
/// the hash (the first capsule, from the origin to itself, always carries it
/// so the origin can serve it to the next hop).
#[allow(clippy::too_many_arguments)]
pub fn capsule(
    code: &[u8],
    credential: &[u8],
    origin: Ipv4Addr,
    target: Ipv4Addr,
    t0_ms: u64,
    reply_port: u16,
    carry_code: bool,
    out: &mut Vec<u8>,
) -> Result<(), WireError> {
    let mut data = [0u8; DATA_LEN];
    data[..4].copy_from_slice(&origin.octets());
    data[4..8].copy_from_slice(&target.octets());
    data[8..16].copy_from_slice(&t0_ms.to_be_bytes());
    data[16..18].copy_from_slice(&reply_port.to_be_bytes());
    data[18] = carry_code as u8;
    Capsule { entry: "ping", credential, data: &data, code: Some(code), hash: ModuleHash::of(code) }.encode(out)
}

/// Reads the reply delivered at the origin: the target and the round-trip time in ms.
pub fn parse_reply(payload: &[u8]) -> Option<(Ipv4Addr, u64)> {
    let b: &[u8; 12] = payload.try_into().ok()?;
    let target = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    let mut rtt = [0u8; 8];
    rtt.copy_from_slice(&b[4..]);
    Some((target, u64::from_be_bytes(rtt)))
}
