//! The plain forwarding path: the baseline "IP router".
//!
//! A plain packet is forwarded by destination address only; no VM runs. It
//! is the baseline SNAP is measured against, as the paper compares SNAP with
//! IP on the same machines (§VII). After the ANEP header:
//!
//! ```text
//!  0                 4                 8      9      10        12
//! +-----------------+-----------------+------+------+---------+----------
//! | destination     | source          | ttl  | 0    | port    | payload
//! +-----------------+-----------------+------+------+---------+----------
//! ```
//!
//! At the destination the payload is delivered to `port`; elsewhere `ttl` is
//! decremented (a packet with ttl 0 is dropped) and the packet is forwarded
//! in place.

use core::net::Ipv4Addr;

/// Length of the plain header.
pub const HEADER_LEN: usize = 12;

/// A parsed plain header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plain {
    /// Destination.
    pub dst: Ipv4Addr,
    /// Source.
    pub src: Ipv4Addr,
    /// Hops left.
    pub ttl: u8,
    /// Destination port.
    pub port: u16,
}

/// A malformed plain packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlainError {
    /// Shorter than the header.
    #[error("truncated plain header: {0} bytes")]
    Truncated(usize),
    /// The reserved byte is not zero.
    #[error("reserved byte is {0}, must be 0")]
    Reserved(u8),
}

impl Plain {
    /// Parses the header at the front of `b`.
    pub fn parse(b: &[u8]) -> Result<Plain, PlainError> {
        let Some(h) = b.first_chunk::<HEADER_LEN>() else { return Err(PlainError::Truncated(b.len())) };
        if h[9] != 0 {
            return Err(PlainError::Reserved(h[9]));
        }
        Ok(Plain {
            dst: Ipv4Addr::new(h[0], h[1], h[2], h[3]),
            src: Ipv4Addr::new(h[4], h[5], h[6], h[7]),
            ttl: h[8],
            port: u16::from_be_bytes([h[10], h[11]]),
        })
    }

    /// Writes the header into `b[..12]`.
    ///
    /// # Panics
    /// If `b` is shorter than [`HEADER_LEN`].
    pub fn emit(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&self.dst.octets());
        b[4..8].copy_from_slice(&self.src.octets());
        b[8] = self.ttl;
        b[9] = 0;
        b[10..12].copy_from_slice(&self.port.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_rejections() {
        let p = Plain { dst: Ipv4Addr::new(10, 0, 0, 3), src: Ipv4Addr::new(10, 0, 0, 1), ttl: 64, port: 9 };
        let mut b = [0u8; 14];
        p.emit(&mut b);
        assert_eq!(Plain::parse(&b), Ok(p));
        assert_eq!(Plain::parse(&b[..11]), Err(PlainError::Truncated(11)));
        b[9] = 1;
        assert_eq!(Plain::parse(&b), Err(PlainError::Reserved(1)));
    }
}
