//! Helpers shared by the integration tests that start real daemons.
#![allow(dead_code)]

use std::net::UdpSocket;

/// `n` distinct free UDP ports on 127.0.0.1: bound together so they differ,
/// then released for the daemons to take.
pub fn free_ports(n: usize) -> Vec<u16> {
    let socks: Vec<UdpSocket> = (0..n).map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind")).collect();
    socks.iter().map(|s| s.local_addr().expect("addr").port()).collect()
}

/// The `[[interface]]` sections of the line 10.0.0.1 – 10.0.0.2 – 10.0.0.3 on
/// loopback, one string per node, from four ports: node 1 east, node 2
/// west, node 2 east, node 3 west.
pub fn line3_interfaces(p: &[u16]) -> [String; 3] {
    let iface = |name: &str, listen: u16, nbr: u8, endpoint: u16| {
        format!(
            "[[interface]]\nname = \"{name}\"\nlisten = \"127.0.0.1:{listen}\"\n\
             neighbors = [{{ address = \"10.0.0.{nbr}\", endpoint = \"127.0.0.1:{endpoint}\" }}]\n"
        )
    };
    [
        iface("east", p[0], 2, p[1]),
        format!("{}{}", iface("west", p[1], 1, p[0]), iface("east", p[2], 3, p[3])),
        iface("west", p[3], 2, p[2]),
    ]
}
