//! Free loopback UDP ports for daemons started by a testbed, a test or a
//! benchmark: held by sockets until the caller lets them go, just before
//! the daemons bind them.
//!
//! The ports are picked at random below the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`). A port the kernel picks (binding port
//! 0) lies inside that range, where any process's next unbound socket may
//! take it between the moment it is let go and the moment the daemon binds
//! it; the daemon then fails with "address in use". Below the range a port
//! is taken only by someone who asks for that port by number.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};

/// Lowest port picked.
pub const PICK_FLOOR: u16 = 10_000;
/// Random tries per port before giving up on the range.
const TRIES: usize = 400;

/// Lowest port of the kernel's ephemeral range, 32768 if it cannot be read.
pub fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse().ok()))
        .unwrap_or(32768)
}

/// `n` distinct free UDP ports on 127.0.0.1, each held by its socket: below
/// the ephemeral range where there is room (at least 1024 ports), else
/// picked by the kernel.
///
/// # Errors
/// A socket could not be bound at all.
pub fn reserve_loopback(n: usize) -> std::io::Result<Vec<UdpSocket>> {
    let span = ephemeral_floor().checked_sub(PICK_FLOOR).filter(|s| *s >= 1024).map(u64::from);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let mut seed = ((u64::from(std::process::id()) << 32) ^ nanos) | 1;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let picked = span.and_then(|span| {
            (0..TRIES).find_map(|_| {
                // xorshift64: spreads concurrent callers over the range; not secret.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let port = PICK_FLOOR + (seed % span) as u16;
                UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).ok()
            })
        });
        match picked {
            Some(s) => held.push(s),
            None => held.push(UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))?),
        }
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_ports_are_distinct_held_and_below_the_ephemeral_range() {
        let socks = reserve_loopback(64).expect("reserve");
        let ports: std::collections::BTreeSet<u16> =
            socks.iter().map(|s| s.local_addr().expect("addr").port()).collect();
        assert_eq!(ports.len(), 64);
        if ephemeral_floor() >= PICK_FLOOR + 1024 {
            assert!(ports.iter().all(|p| (PICK_FLOOR..ephemeral_floor()).contains(p)), "{ports:?}");
        }
        // Held: nobody else can bind them while the sockets live.
        let p = *ports.iter().next().expect("one");
        assert!(UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, p)).is_err());
    }
}
