//! Handshake message framing (the body of an ANEP `HANDSHAKE` datagram).
//!
//! ```text
//!  0      1       2               4                8                12
//! +------+-------+---------------+----------------+----------------+----------------+
//! | kind | flags | reserved (0)  | sender index   | receiver index | Noise message… |
//! +------+-------+---------------+----------------+----------------+----------------+
//! ```
//!
//! The sender index is the SPI the sender chose for packets *to* it; the
//! receiver index echoes the peer's (0 in a first message). Both are also
//! inside the Noise payload, where they are authenticated; the copies here
//! only route the message to its handshake state.
//!
//! | kind | message | pattern | Noise payload |
//! |---|---|---|---|
//! | 1 | IK first  | `-> e, es, s, ss` | timestamp µs (8) ‖ sender index (4) |
//! | 2 | IK second | `<- e, ee, se`    | sender index (4) ‖ receiver index (4) |
//! | 3 | XX first  | `-> e`            | empty |
//! | 4 | XX second | `<- e, ee, s, es` | identity (96) ‖ sender index (4) ‖ receiver index (4) |
//! | 5 | XX third  | `-> s, se`        | identity (96) ‖ timestamp µs (8) |
//! | 6 | cookie reply | (not Noise)    | cookie (16): see [`crate::cookie`] |
//!
//! An XX first message is the ephemeral key alone (32 bytes) or, sent again
//! after a cookie reply, the ephemeral key followed by the cookie (48). A
//! cookie reply has sender index 0 and echoes the first message's sender
//! index as its receiver index.
//! Noise protocol names: `Noise_IK_25519_AESGCM_SHA256` and
//! `Noise_XX_25519_AESGCM_SHA256`, prologue `anode/sane/v1`.

/// Handshake header length.
pub const HEADER_LEN: usize = 12;
/// Largest handshake message accepted (all are far smaller).
pub const MAX_LEN: usize = 512;
/// Noise prologue: binds the handshake to this protocol.
pub const PROLOGUE: &[u8] = b"anode/sane/v1";
/// Noise IK protocol name.
pub const IK: &str = "Noise_IK_25519_AESGCM_SHA256";
/// Noise XX protocol name.
pub const XX: &str = "Noise_XX_25519_AESGCM_SHA256";

/// Message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// IK first message (initiator → responder).
    IkInit = 1,
    /// IK second message.
    IkResp = 2,
    /// XX first message.
    Xx1 = 3,
    /// XX second message.
    Xx2 = 4,
    /// XX third message.
    Xx3 = 5,
    /// Cookie reply to an XX first message that carried no (valid) cookie.
    Cookie = 6,
}

/// A checked handshake header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind.
    pub kind: Kind,
    /// Sender's index (its SPI).
    pub sender: u32,
    /// Receiver's index (0 in first messages).
    pub receiver: u32,
}

/// Why a handshake message was refused before any cryptography.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// Shorter than the header, or than the Noise message must be.
    #[error("truncated handshake message ({0} bytes)")]
    Truncated(usize),
    /// Longer than any valid message.
    #[error("oversized handshake message ({0} bytes)")]
    Oversized(usize),
    /// Unknown kind byte.
    #[error("unknown handshake kind {0}")]
    BadKind(u8),
    /// Flags or reserved bytes not zero, or a zero sender index.
    #[error("malformed handshake header")]
    BadHeader,
}

/// Minimum Noise message length per kind (ephemeral keys, encrypted
/// statics and tags included).
fn min_noise_len(k: Kind) -> usize {
    match k {
        Kind::IkInit => 32 + 48 + 12 + 16,
        Kind::IkResp => 32 + 8 + 16,
        Kind::Xx1 => 32,
        Kind::Xx2 => 32 + 48 + 104 + 16,
        Kind::Xx3 => 48 + 104 + 16,
        Kind::Cookie => crate::cookie::COOKIE_LEN,
    }
}

impl Header {
    /// Parses and checks the header of `msg`. Returns it and the Noise
    /// message that follows.
    pub fn parse(msg: &[u8]) -> Result<(Header, &[u8]), ParseError> {
        if msg.len() > MAX_LEN {
            return Err(ParseError::Oversized(msg.len()));
        }
        let Some(h) = msg.first_chunk::<HEADER_LEN>() else { return Err(ParseError::Truncated(msg.len())) };
        let kind = match h[0] {
            1 => Kind::IkInit,
            2 => Kind::IkResp,
            3 => Kind::Xx1,
            4 => Kind::Xx2,
            5 => Kind::Xx3,
            6 => Kind::Cookie,
            k => return Err(ParseError::BadKind(k)),
        };
        let sender = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let receiver = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let first = matches!(kind, Kind::IkInit | Kind::Xx1);
        if h[1..4] != [0, 0, 0] || (sender == 0) != (kind == Kind::Cookie) || (first != (receiver == 0)) {
            return Err(ParseError::BadHeader);
        }
        let body = &msg[HEADER_LEN..];
        if body.len() < min_noise_len(kind) {
            return Err(ParseError::Truncated(msg.len()));
        }
        let most = match kind {
            Kind::Xx1 => Some(32 + crate::cookie::COOKIE_LEN),
            Kind::Cookie => Some(crate::cookie::COOKIE_LEN),
            _ => None,
        };
        if most.is_some_and(|m| body.len() > m) {
            return Err(ParseError::Oversized(msg.len()));
        }
        Ok((Header { kind, sender, receiver }, body))
    }

    /// Writes the header into `buf[..HEADER_LEN]`.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0] = self.kind as u8;
        buf[1..4].fill(0);
        buf[4..8].copy_from_slice(&self.sender.to_be_bytes());
        buf[8..12].copy_from_slice(&self.receiver.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_rejections() {
        let mut m = vec![0u8; HEADER_LEN + 200];
        Header { kind: Kind::IkInit, sender: 7, receiver: 0 }.emit(&mut m);
        assert!(Header::parse(&m).is_ok());
        assert_eq!(Header::parse(&m[..5]), Err(ParseError::Truncated(5)));
        assert_eq!(Header::parse(&m[..HEADER_LEN + 10]), Err(ParseError::Truncated(HEADER_LEN + 10)));
        assert_eq!(Header::parse(&vec![1u8; 600]), Err(ParseError::Oversized(600)));
        let mut b = m.clone();
        b[0] = 9;
        assert_eq!(Header::parse(&b), Err(ParseError::BadKind(9)));
        let mut b = m.clone();
        b[2] = 1;
        assert_eq!(Header::parse(&b), Err(ParseError::BadHeader));
        let mut b = m.clone();
        b[11] = 1; // a first message naming a receiver
        assert_eq!(Header::parse(&b), Err(ParseError::BadHeader));
        let mut b = m.clone();
        b[4..8].fill(0); // zero sender
        assert_eq!(Header::parse(&b), Err(ParseError::BadHeader));
        Header { kind: Kind::IkResp, sender: 7, receiver: 0 }.emit(&mut b);
        assert_eq!(Header::parse(&b), Err(ParseError::BadHeader));
    }

    #[test]
    fn cookie_and_first_message_lengths() {
        let cookie = |sender: u32, receiver: u32, body: usize| {
            let mut m = vec![0u8; HEADER_LEN + body];
            Header { kind: Kind::Cookie, sender, receiver }.emit(&mut m);
            Header::parse(&m).map(|(h, b)| (h, b.len()))
        };
        let ok = Header { kind: Kind::Cookie, sender: 0, receiver: 9 };
        assert_eq!(cookie(0, 9, 16), Ok((ok, 16)));
        assert_eq!(cookie(1, 9, 16), Err(ParseError::BadHeader), "a cookie names no sender index");
        assert_eq!(cookie(0, 0, 16), Err(ParseError::BadHeader), "a cookie answers someone");
        assert_eq!(cookie(0, 9, 15), Err(ParseError::Truncated(HEADER_LEN + 15)));
        assert_eq!(cookie(0, 9, 17), Err(ParseError::Oversized(HEADER_LEN + 17)));
        let xx1 = |body: usize| {
            let mut m = vec![0u8; HEADER_LEN + body];
            Header { kind: Kind::Xx1, sender: 3, receiver: 0 }.emit(&mut m);
            Header::parse(&m).map(|(_, b)| b.len())
        };
        assert_eq!(xx1(32), Ok(32));
        assert_eq!(xx1(48), Ok(48), "with a cookie");
        assert_eq!(xx1(49), Err(ParseError::Oversized(HEADER_LEN + 49)));
    }
}
