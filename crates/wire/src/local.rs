//! The local application API: how programs on the same host use a node.
//!
//! The node listens on a Unix `SOCK_SEQPACKET` socket, `<run_dir>/app.sock`.
//! Each client has its own connection; each packet on it is one message: a
//! 1-byte opcode then its fields, integers big-endian. Any language with
//! Unix sockets can speak it (see `docs/node.md`). Messages are decoded
//! once into the borrowed [`Request`] / [`Reply`] forms, their Reprs.
//!
//! | op | direction | fields | meaning |
//! |---|---|---|---|
//! | `0x01` HELLO | client → node | — | asks for the node's address and MTU |
//! | `0x02` REGISTER | client → node | port u16 | deliver payloads for `port` to this client |
//! | `0x03` UNREGISTER | client → node | port u16 | stop |
//! | `0x04` INJECT | client → node | SNAP packet | execute the packet at this node (its first hop) |
//! | `0x05` PLAIN | client → node | dst [4], port u16, ttl u8, payload | send a plain (no VM) packet |
//! | `0x06` CAPSULE | client → node | capsule message | run a capsule here (its first hop) |
//! | `0x80` OK | node → client | — | request done |
//! | `0x81` INFO | node → client | address [4], mtu u16 | answer to HELLO |
//! | `0x82` DELIVER | node → client | port u16, payload | a payload delivered to a registered port |
//! | `0xFF` ERROR | node → client | UTF-8 text | request refused, with the reason |
//!
//! A port belongs to the client that registered it until that client
//! unregisters it or disconnects. The node drops deliveries to ports nobody
//! registered (`no_listener`).

use core::net::Ipv4Addr;

/// Largest message, in bytes.
pub const MAX_MESSAGE: usize = 65_000;

/// A message from a client to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// Ask for the node's address and MTU.
    Hello,
    /// Register a port.
    Register(u16),
    /// Unregister a port.
    Unregister(u16),
    /// Execute a SNAP packet here.
    Inject(&'a [u8]),
    /// Run a capsule here (its first hop).
    Capsule(&'a [u8]),
    /// Send a plain packet.
    Plain {
        /// Destination.
        dst: Ipv4Addr,
        /// Destination port.
        port: u16,
        /// Hop limit.
        ttl: u8,
        /// Payload.
        payload: &'a [u8],
    },
}

/// A message from the node to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// Request done.
    Ok,
    /// Node information.
    Info {
        /// The node's address.
        address: Ipv4Addr,
        /// Its SNAP MTU.
        mtu: u16,
    },
    /// A delivered payload.
    Deliver {
        /// The port.
        port: u16,
        /// The payload.
        payload: &'a [u8],
    },
    /// Refusal with a reason.
    Error(&'a str),
}

/// A malformed local-API message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocalError {
    /// Empty datagram.
    #[error("empty message")]
    Empty,
    /// Unknown opcode.
    #[error("unknown opcode {0:#04x}")]
    UnknownOp(u8),
    /// Fields missing or extra bytes.
    #[error("bad length for opcode {0:#04x}")]
    BadLength(u8),
    /// Error text is not UTF-8.
    #[error("error text is not UTF-8")]
    BadText,
}

fn port(b: &[u8], op: u8) -> Result<u16, LocalError> {
    match b {
        [h, l] => Ok(u16::from_be_bytes([*h, *l])),
        _ => Err(LocalError::BadLength(op)),
    }
}

impl<'a> Request<'a> {
    /// Decodes a request.
    pub fn decode(b: &'a [u8]) -> Result<Request<'a>, LocalError> {
        let (&op, rest) = b.split_first().ok_or(LocalError::Empty)?;
        match op {
            0x01 if rest.is_empty() => Ok(Request::Hello),
            0x01 => Err(LocalError::BadLength(op)),
            0x02 => Ok(Request::Register(port(rest, op)?)),
            0x03 => Ok(Request::Unregister(port(rest, op)?)),
            0x04 => Ok(Request::Inject(rest)),
            0x06 => Ok(Request::Capsule(rest)),
            0x05 => {
                let Some((h, payload)) = rest.split_first_chunk::<7>() else {
                    return Err(LocalError::BadLength(op));
                };
                Ok(Request::Plain {
                    dst: Ipv4Addr::new(h[0], h[1], h[2], h[3]),
                    port: u16::from_be_bytes([h[4], h[5]]),
                    ttl: h[6],
                    payload,
                })
            }
            _ => Err(LocalError::UnknownOp(op)),
        }
    }

    /// Encodes a request.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::Hello => vec![0x01],
            Request::Register(p) => [&[0x02][..], &p.to_be_bytes()].concat(),
            Request::Unregister(p) => [&[0x03][..], &p.to_be_bytes()].concat(),
            Request::Inject(b) => [&[0x04][..], b].concat(),
            Request::Capsule(b) => [&[0x06][..], b].concat(),
            Request::Plain { dst, port, ttl, payload } => {
                [&[0x05][..], &dst.octets(), &port.to_be_bytes(), &[*ttl], payload].concat()
            }
        }
    }
}

impl<'a> Reply<'a> {
    /// Decodes a reply.
    pub fn decode(b: &'a [u8]) -> Result<Reply<'a>, LocalError> {
        let (&op, rest) = b.split_first().ok_or(LocalError::Empty)?;
        match op {
            0x80 if rest.is_empty() => Ok(Reply::Ok),
            0x81 => match rest {
                [a, b, c, d, m0, m1] => {
                    Ok(Reply::Info { address: Ipv4Addr::new(*a, *b, *c, *d), mtu: u16::from_be_bytes([*m0, *m1]) })
                }
                _ => Err(LocalError::BadLength(op)),
            },
            0x82 => {
                let Some((p, payload)) = rest.split_first_chunk::<2>() else {
                    return Err(LocalError::BadLength(op));
                };
                Ok(Reply::Deliver { port: u16::from_be_bytes(*p), payload })
            }
            0xFF => core::str::from_utf8(rest).map(Reply::Error).map_err(|_| LocalError::BadText),
            0x80 => Err(LocalError::BadLength(op)),
            _ => Err(LocalError::UnknownOp(op)),
        }
    }

    /// Encodes a reply.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Reply::Ok => vec![0x80],
            Reply::Info { address, mtu } => [&[0x81][..], &address.octets(), &mtu.to_be_bytes()].concat(),
            Reply::Deliver { port, payload } => [&[0x82][..], &port.to_be_bytes(), payload].concat(),
            Reply::Error(t) => [&[0xFF][..], t.as_bytes()].concat(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips() {
        let reqs = [
            Request::Hello,
            Request::Register(7),
            Request::Unregister(9),
            Request::Inject(b"\x01\x02"),
            Request::Plain { dst: Ipv4Addr::new(10, 0, 0, 3), port: 5, ttl: 64, payload: b"hi" },
        ];
        for r in reqs {
            assert_eq!(Request::decode(&r.encode()), Ok(r.clone()));
        }
        let reps = [
            Reply::Ok,
            Reply::Info { address: Ipv4Addr::new(10, 0, 0, 1), mtu: 1400 },
            Reply::Deliver { port: 7, payload: b"ping" },
            Reply::Error("no"),
        ];
        for r in reps {
            assert_eq!(Reply::decode(&r.encode()), Ok(r.clone()));
        }
    }

    #[test]
    fn rejections() {
        assert_eq!(Request::decode(&[]), Err(LocalError::Empty));
        assert_eq!(Request::decode(&[0x09]), Err(LocalError::UnknownOp(9)));
        assert_eq!(Request::decode(&[0x02, 1]), Err(LocalError::BadLength(2)));
        assert_eq!(Request::decode(&[0x01, 1]), Err(LocalError::BadLength(1)));
        assert_eq!(Request::decode(&[0x05, 1, 2, 3]), Err(LocalError::BadLength(5)));
        assert_eq!(Reply::decode(&[0x81, 1]), Err(LocalError::BadLength(0x81)));
        assert_eq!(Reply::decode(&[0xFF, 0xC3]), Err(LocalError::BadText));
        assert_eq!(Reply::decode(&[0x80, 0]), Err(LocalError::BadLength(0x80)));
    }
}
