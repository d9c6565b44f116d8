//! The plain forwarding header: the baseline "IP router".
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
//!
//! # No-panic contract
//! After [`Packet::new_checked`] succeeds, no accessor of [`Packet`] panics.

use core::net::Ipv4Addr;

/// Length of the plain header.
pub const HEADER_LEN: usize = 12;

mod field {
    use core::ops::Range;
    pub const DST: Range<usize> = 0..4;
    pub const SRC: Range<usize> = 4..8;
    pub const TTL: usize = 8;
    pub const RESERVED: usize = 9;
    pub const PORT: Range<usize> = 10..12;
}

/// A malformed plain packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Shorter than the header.
    #[error("truncated plain header: {0} bytes")]
    Truncated(usize),
    /// The reserved byte is not zero.
    #[error("reserved byte is {0}, must be 0")]
    Reserved(u8),
}

fn addr(b: &[u8], r: core::ops::Range<usize>) -> Ipv4Addr {
    match b.get(r) {
        Some(&[a, b, c, d]) => Ipv4Addr::new(a, b, c, d),
        _ => Ipv4Addr::UNSPECIFIED,
    }
}

/// A view of a plain packet (header and payload, after the ANEP header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`check`](Self::check) succeeds.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, Error> {
        let p = Packet::new_unchecked(buffer);
        p.check()?;
        Ok(p)
    }

    /// The header is present and its reserved byte is zero.
    pub fn check(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated(b.len()));
        }
        if b[field::RESERVED] != 0 {
            return Err(Error::Reserved(b[field::RESERVED]));
        }
        Ok(())
    }

    /// Destination.
    pub fn dst(&self) -> Ipv4Addr {
        addr(self.buffer.as_ref(), field::DST)
    }
    /// Source.
    pub fn src(&self) -> Ipv4Addr {
        addr(self.buffer.as_ref(), field::SRC)
    }
    /// Hops left.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref().get(field::TTL).copied().unwrap_or(0)
    }
    /// Destination port.
    pub fn port(&self) -> u16 {
        match self.buffer.as_ref().get(field::PORT) {
            Some(&[h, l]) => u16::from_be_bytes([h, l]),
            _ => 0,
        }
    }
    /// The payload.
    pub fn payload(&self) -> &[u8] {
        self.buffer.as_ref().get(HEADER_LEN..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the hop count (forwarding decrements it in place).
    pub fn set_ttl(&mut self, ttl: u8) {
        if let Some(t) = self.buffer.as_mut().get_mut(field::TTL) {
            *t = ttl;
        }
    }
}

/// A parsed plain header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    /// Destination.
    pub dst: Ipv4Addr,
    /// Source.
    pub src: Ipv4Addr,
    /// Hops left.
    pub ttl: u8,
    /// Destination port.
    pub port: u16,
}

impl Repr {
    /// The header of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Repr {
        Repr { dst: p.dst(), src: p.src(), ttl: p.ttl(), port: p.port() }
    }

    /// Bytes of the header.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into `b[..12]`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if `b` is shorter than the header.
    pub fn emit(&self, b: &mut [u8]) -> Result<(), Error> {
        let Some(h) = b.first_chunk_mut::<HEADER_LEN>() else { return Err(Error::Truncated(b.len())) };
        h[field::DST].copy_from_slice(&self.dst.octets());
        h[field::SRC].copy_from_slice(&self.src.octets());
        h[field::TTL] = self.ttl;
        h[field::RESERVED] = 0;
        h[field::PORT].copy_from_slice(&self.port.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10.0.0.1 → 10.0.0.3, ttl 64, port 9, payload "hi".
    static PACKET: [u8; 14] = [10, 0, 0, 3, 10, 0, 0, 1, 64, 0, 0, 9, b'h', b'i'];

    #[test]
    fn deconstruct_construct_and_rejections() {
        let p = Packet::new_checked(&PACKET[..]).expect("valid");
        let r = Repr::parse(&p);
        assert_eq!(r, Repr { dst: Ipv4Addr::new(10, 0, 0, 3), src: Ipv4Addr::new(10, 0, 0, 1), ttl: 64, port: 9 });
        assert_eq!(p.payload(), b"hi");
        let mut b = [0u8; 14];
        r.emit(&mut b).expect("fits");
        b[12..].copy_from_slice(b"hi");
        assert_eq!(b, PACKET);
        let mut m = Packet::new_checked(&mut b[..]).expect("valid");
        m.set_ttl(63);
        assert_eq!(b[8], 63);
        assert_eq!(Packet::new_checked(&PACKET[..11]), Err(Error::Truncated(11)));
        let mut bad = PACKET;
        bad[9] = 1;
        assert_eq!(Packet::new_checked(&bad[..]), Err(Error::Reserved(1)));
        assert_eq!(r.emit(&mut [0u8; 11]), Err(Error::Truncated(11)));
    }
}
