//! Entry points for the cargo-fuzz targets under `fuzz/` (and their seed
//! replay tests): the handshake parser and state machine, and the
//! authentication header parser and opener, fed arbitrary bytes.

use crate::identity::Identity;
use crate::links::{Links, LinksConfig, PeerConfig};
use crate::sa::Mode;
use core::net::SocketAddr;

/// Two fixed identities and a security layer for the first with the
/// second as its neighbour, as the fuzz targets use.
pub fn pair() -> (Links, Identity) {
    let a = Identity::from_seed(&[0xA1; 32]);
    let b = Identity::from_seed(&[0xB2; 32]);
    let cfg = LinksConfig {
        peers: vec![PeerConfig { key: b.public(), endpoint: endpoint(), mode: Mode::Authenticate }],
        users: vec![Identity::from_seed(&[0xC3; 32]).public()],
        ..LinksConfig::default()
    };
    match Links::new(a, cfg, 0) {
        Ok(l) => (l, b),
        Err(e) => unreachable!("fixed fuzzing config is valid: {e}"),
    }
}

fn endpoint() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7000))
}

/// Feeds `data` to the handshake handler, and then to the packet opener
/// (both modes). Must never panic.
pub fn handshake_and_packet(data: &[u8]) {
    let (mut l, _) = pair();
    let mut out = Vec::new();
    let _ = l.handle_handshake(endpoint(), data, 1, &mut out);
    let hdr = 8.min(data.len());
    let mut buf = data.to_vec();
    let _ = l.open(&mut buf, hdr, true, 1);
    let mut buf = data.to_vec();
    let _ = l.open(&mut buf, hdr, false, 1);
    let _ = crate::handshake::Header::parse(data);
}
