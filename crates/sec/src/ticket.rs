//! Wire formats of administrative domains (SANE §4.7): tickets, the
//! ticket-authenticated packet, the perimeter attachment, and the ticket
//! request and reply a user exchanges with a domain's key distribution
//! service inside its security association.
//!
//! Each format is a checked view over bytes (after `new_checked` succeeds no
//! accessor panics) and a `Repr` with `parse` and `emit`, as
//! `crates/snap/src/wire.rs` does. All integers are big-endian; flags and
//! reserved bits must be zero; nothing may follow the last field. The
//! cryptography (sealing, tags) is in [`crate::domain`]; here only framing.
//!
//! # Ticket (sealed by the domain's ticket key; opaque to the user)
//!
//! ```text
//!  0     1      2            4                  20         24             32          44
//! +-----+------+------------+------------------+----------+--------------+-----------+------------------+
//! | ver | rsvd | sealed len | domain (16)      | epoch    | ticket id    | nonce (12)| sealed body, tag |
//! +-----+------+------------+------------------+----------+--------------+-----------+------------------+
//! sealed body (AES-256-GCM, associated data = bytes 0..44):
//!   user key (32) | not before (8, Unix s) | expires (8) | session key (32) | credential (rest)
//! ```
//!
//! # Ticket-authenticated packet
//!
//! ```text
//!  0     1       2             4              8               16             24
//! +-----+-------+-------------+--------------+---------------+--------------+--------------+------------------+-----+
//! | ver | flags | ticket len  | destination  | counter       | ticket id    | ticket (opt) | payload (sealed) | tag |
//! +-----+-------+-------------+--------------+---------------+--------------+--------------+------------------+-----+
//! flags: bit 0 = the ticket is included (first packets to a node); otherwise ticket len is 0
//!   and the node must already hold the ticket. AES-256-GCM under the ticket's session key,
//!   nonce = 0 (4) ‖ counter, associated data = header ‖ ticket.
//! ```
//!
//! # Perimeter attachment (made by a border node, checked by interior nodes)
//!
//! ```text
//!  0     1      2           4           20       24            40       48          80         88
//! +-----+------+-----------+-----------+--------+-------------+--------+-----------+----------+------------+----------+
//! | ver | rsvd | cred len  | domain    | epoch  | border (16) | seq    | user (32) | expires  | credential | tag (32) |
//! +-----+------+-----------+-----------+--------+-------------+--------+-----------+----------+------------+----------+
//! tag = HMAC-SHA256 under the domain's perimeter key over every byte before it ‖ SHA-256(inner packet)
//! ```
//!
//! # Ticket request and reply (inside the user's SA with the service)
//!
//! ```text
//! request: kind 1 | rsvd (1) | lifetime s (2) | credential (rest)
//! reply:   kind 2 | rsvd (1) | ticket len (2) | expires (8) | session key (32) | ticket
//! refusal: kind 3 | code (1): 1 rate limited, 2 credential refused, 3 malformed, 4 not a service
//! ```
//!
//! # Domain envelope (the payload of ANEP type `0xA008` on a node)
//!
//! ```text
//! ticket:   kind 1 | ticket-authenticated packet (rest)
//! attached: kind 2 | rsvd (1) | attachment len (2) | destination (4) | attachment | inner packet (rest)
//!           attachment len 0: no attachment (a packet that did not pass a border)
//! ```
//!
//! # Revocation update (the domain operator to a node, inside the operator's SA)
//!
//! ```text
//! update:  kind 1 | rsvd (1) | n tickets (2) | n users (2) | rsvd (2) | min epoch (4)
//!          | ticket ids (8 each) | users (32 each)     min epoch 0: the floor is left as it is
//! ack:     kind 2 | rsvd (1) | min epoch (4) | tickets revoked (4) | users revoked (4)
//! refusal: kind 3 | code (1): 1 not the operator, 2 malformed, 3 no domain, 4 revocation lists full
//! ```
//! Each list holds at most [`MAX_REVOKE_ITEMS`] entries per message.

/// Format version of every message here.
pub const VERSION: u8 = 1;
/// Largest credential carried (as `anode_cred::credential::MAX_CREDENTIAL`).
pub const MAX_CREDENTIAL: usize = 4096;
/// Ticket header length (before the sealed body).
pub const TICKET_HEADER: usize = 44;
/// Fixed part of the sealed body.
pub const BODY_FIXED: usize = 32 + 8 + 8 + 32;
/// AEAD tag length.
pub const TAG_LEN: usize = 16;
/// Largest ticket.
pub const MAX_TICKET: usize = TICKET_HEADER + BODY_FIXED + MAX_CREDENTIAL + TAG_LEN;
/// Ticket-authenticated packet header length.
pub const PACKET_HEADER: usize = 24;
/// Perimeter attachment header length (before the credential).
pub const ATTACH_HEADER: usize = 88;
/// Perimeter attachment tag length.
pub const ATTACH_TAG: usize = 32;

/// Why bytes are not a domain message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than the format requires.
    #[error("truncated domain message")]
    Truncated,
    /// Bytes after the last field, or longer than the format allows.
    #[error("domain message has trailing bytes or is oversized")]
    Trailing,
    /// A version other than [`VERSION`].
    #[error("unknown domain message version {0}")]
    Version(u8),
    /// Flags or reserved bits not zero (or inconsistent with a length).
    #[error("domain message flags or reserved bytes are invalid")]
    Reserved,
    /// An unknown kind or code.
    #[error("unknown domain message kind or code {0}")]
    Kind(u8),
}

fn get<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        out.copy_from_slice(s);
    }
    out
}
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(get(b, at))
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(get(b, at))
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(get(b, at))
}

// ------------------------------------------------------------------ ticket

/// A checked view over a ticket.
#[derive(Debug, Clone, Copy)]
pub struct Ticket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ticket<T> {
    /// Wraps and checks framing: version, reserved byte, and a sealed part
    /// of exactly the stated length, at least a body and tag long.
    pub fn new_checked(buffer: T) -> Result<Ticket<T>, WireError> {
        let b = buffer.as_ref();
        if b.len() > MAX_TICKET {
            return Err(WireError::Trailing);
        }
        if b.len() < TICKET_HEADER {
            return Err(WireError::Truncated);
        }
        if b[0] != VERSION {
            return Err(WireError::Version(b[0]));
        }
        if b[1] != 0 {
            return Err(WireError::Reserved);
        }
        let sealed = be16(b, 2) as usize;
        if sealed < BODY_FIXED + TAG_LEN {
            return Err(WireError::Truncated);
        }
        match b.len().cmp(&(TICKET_HEADER + sealed)) {
            core::cmp::Ordering::Less => Err(WireError::Truncated),
            core::cmp::Ordering::Greater => Err(WireError::Trailing),
            core::cmp::Ordering::Equal => Ok(Ticket { buffer }),
        }
    }
    /// The issuing domain's fingerprint.
    pub fn domain(&self) -> [u8; 16] {
        get(self.buffer.as_ref(), 4)
    }
    /// The key epoch it was sealed under.
    pub fn epoch(&self) -> u32 {
        be32(self.buffer.as_ref(), 20)
    }
    /// The ticket's id.
    pub fn id(&self) -> u64 {
        be64(self.buffer.as_ref(), 24)
    }
    /// The AEAD nonce.
    pub fn nonce(&self) -> [u8; 12] {
        get(self.buffer.as_ref(), 32)
    }
    /// The associated data (the header).
    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..TICKET_HEADER]
    }
    /// The sealed body and tag.
    pub fn sealed(&self) -> &[u8] {
        &self.buffer.as_ref()[TICKET_HEADER..]
    }
}

/// A ticket's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketRepr<'a> {
    /// Domain fingerprint.
    pub domain: [u8; 16],
    /// Key epoch.
    pub epoch: u32,
    /// Ticket id.
    pub id: u64,
    /// Nonce.
    pub nonce: [u8; 12],
    /// Sealed body and tag.
    pub sealed: &'a [u8],
}

impl<'a> TicketRepr<'a> {
    /// Parses a ticket.
    pub fn parse(bytes: &'a [u8]) -> Result<TicketRepr<'a>, WireError> {
        let t = Ticket::new_checked(bytes)?;
        Ok(TicketRepr {
            domain: t.domain(),
            epoch: t.epoch(),
            id: t.id(),
            nonce: t.nonce(),
            sealed: &bytes[TICKET_HEADER..],
        })
    }
    /// Writes the header for a sealed part of `sealed_len` bytes into
    /// `buf[..TICKET_HEADER]`.
    pub fn emit_header(domain: [u8; 16], epoch: u32, id: u64, nonce: [u8; 12], sealed_len: usize, buf: &mut [u8]) {
        buf[0] = VERSION;
        buf[1] = 0;
        buf[2..4].copy_from_slice(&(sealed_len as u16).to_be_bytes());
        buf[4..20].copy_from_slice(&domain);
        buf[20..24].copy_from_slice(&epoch.to_be_bytes());
        buf[24..32].copy_from_slice(&id.to_be_bytes());
        buf[32..44].copy_from_slice(&nonce);
    }
}

/// The opened body of a ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketBody<'a> {
    /// The user it was issued to.
    pub user: [u8; 32],
    /// Not valid before (Unix seconds).
    pub not_before: u64,
    /// Not valid from (Unix seconds).
    pub expires: u64,
    /// The key the user authenticates packets with.
    pub session_key: [u8; 32],
    /// The attenuated credential (Biscuit bytes).
    pub credential: &'a [u8],
}

impl<'a> TicketBody<'a> {
    /// Parses a decrypted body (without the tag).
    pub fn parse(b: &'a [u8]) -> Result<TicketBody<'a>, WireError> {
        if b.len() < BODY_FIXED {
            return Err(WireError::Truncated);
        }
        if b.len() > BODY_FIXED + MAX_CREDENTIAL {
            return Err(WireError::Trailing);
        }
        Ok(TicketBody {
            user: get(b, 0),
            not_before: be64(b, 32),
            expires: be64(b, 40),
            session_key: get(b, 48),
            credential: &b[BODY_FIXED..],
        })
    }
    /// Bytes [`TicketBody::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        BODY_FIXED + self.credential.len()
    }
    /// Appends the body to `out`.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.user);
        out.extend_from_slice(&self.not_before.to_be_bytes());
        out.extend_from_slice(&self.expires.to_be_bytes());
        out.extend_from_slice(&self.session_key);
        out.extend_from_slice(self.credential);
    }
}

// ------------------------------------------------- ticket-authenticated packet

/// Flag: the ticket is included.
pub const FLAG_TICKET: u8 = 1;

/// A checked view over a ticket-authenticated packet.
#[derive(Debug, Clone, Copy)]
pub struct TicketPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TicketPacket<T> {
    /// Wraps and checks: version, flags, a ticket length consistent with the
    /// flag, and room for the ticket and the tag.
    pub fn new_checked(buffer: T) -> Result<TicketPacket<T>, WireError> {
        let b = buffer.as_ref();
        if b.len() < PACKET_HEADER + TAG_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] != VERSION {
            return Err(WireError::Version(b[0]));
        }
        let (flags, tl) = (b[1], be16(b, 2) as usize);
        if flags & !FLAG_TICKET != 0 || ((flags & FLAG_TICKET != 0) != (tl > 0)) || tl > MAX_TICKET {
            return Err(WireError::Reserved);
        }
        if b.len() < PACKET_HEADER + tl + TAG_LEN {
            return Err(WireError::Truncated);
        }
        Ok(TicketPacket { buffer })
    }
    /// The node the packet is for (its overlay address).
    pub fn destination(&self) -> u32 {
        be32(self.buffer.as_ref(), 4)
    }
    /// The packet counter.
    pub fn counter(&self) -> u64 {
        be64(self.buffer.as_ref(), 8)
    }
    /// The ticket id.
    pub fn ticket_id(&self) -> u64 {
        be64(self.buffer.as_ref(), 16)
    }
    fn ticket_len(&self) -> usize {
        be16(self.buffer.as_ref(), 2) as usize
    }
    /// The included ticket, if any.
    pub fn ticket(&self) -> Option<&[u8]> {
        let n = self.ticket_len();
        (n > 0).then(|| &self.buffer.as_ref()[PACKET_HEADER..PACKET_HEADER + n])
    }
    /// The associated data: header and ticket.
    pub fn aad(&self) -> &[u8] {
        &self.buffer.as_ref()[..PACKET_HEADER + self.ticket_len()]
    }
    /// The sealed payload and tag.
    pub fn sealed(&self) -> &[u8] {
        &self.buffer.as_ref()[PACKET_HEADER + self.ticket_len()..]
    }
}

/// A ticket-authenticated packet's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketPacketRepr<'a> {
    /// Destination node.
    pub destination: u32,
    /// Counter.
    pub counter: u64,
    /// Ticket id.
    pub ticket_id: u64,
    /// The ticket, when included.
    pub ticket: Option<&'a [u8]>,
    /// Sealed payload and tag.
    pub sealed: &'a [u8],
}

impl<'a> TicketPacketRepr<'a> {
    /// Parses a packet.
    pub fn parse(bytes: &'a [u8]) -> Result<TicketPacketRepr<'a>, WireError> {
        let p = TicketPacket::new_checked(bytes)?;
        let tl = p.ticket_len();
        Ok(TicketPacketRepr {
            destination: p.destination(),
            counter: p.counter(),
            ticket_id: p.ticket_id(),
            ticket: (tl > 0).then(|| &bytes[PACKET_HEADER..PACKET_HEADER + tl]),
            sealed: &bytes[PACKET_HEADER + tl..],
        })
    }
    /// Appends the header and ticket (the associated data) to `out`.
    pub fn emit_aad(destination: u32, counter: u64, ticket_id: u64, ticket: Option<&[u8]>, out: &mut Vec<u8>) {
        let tl = ticket.map_or(0, <[u8]>::len);
        out.push(VERSION);
        out.push(if tl > 0 { FLAG_TICKET } else { 0 });
        out.extend_from_slice(&(tl as u16).to_be_bytes());
        out.extend_from_slice(&destination.to_be_bytes());
        out.extend_from_slice(&counter.to_be_bytes());
        out.extend_from_slice(&ticket_id.to_be_bytes());
        if let Some(t) = ticket {
            out.extend_from_slice(t);
        }
    }
}

// ------------------------------------------------------- perimeter attachment

/// A checked view over a perimeter attachment.
#[derive(Debug, Clone, Copy)]
pub struct Attachment<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Attachment<T> {
    /// Wraps and checks framing.
    pub fn new_checked(buffer: T) -> Result<Attachment<T>, WireError> {
        let b = buffer.as_ref();
        if b.len() < ATTACH_HEADER + ATTACH_TAG {
            return Err(WireError::Truncated);
        }
        if b[0] != VERSION {
            return Err(WireError::Version(b[0]));
        }
        if b[1] != 0 {
            return Err(WireError::Reserved);
        }
        let cl = be16(b, 2) as usize;
        if cl > MAX_CREDENTIAL {
            return Err(WireError::Trailing);
        }
        match b.len().cmp(&(ATTACH_HEADER + cl + ATTACH_TAG)) {
            core::cmp::Ordering::Less => Err(WireError::Truncated),
            core::cmp::Ordering::Greater => Err(WireError::Trailing),
            core::cmp::Ordering::Equal => Ok(Attachment { buffer }),
        }
    }
    /// Bytes covered by the tag (all before it).
    pub fn signed_part(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - ATTACH_TAG]
    }
    /// The tag.
    pub fn tag(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[b.len() - ATTACH_TAG..]
    }
}

/// A perimeter attachment's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachmentRepr<'a> {
    /// Domain fingerprint.
    pub domain: [u8; 16],
    /// Key epoch.
    pub epoch: u32,
    /// The border node's fingerprint.
    pub border: [u8; 16],
    /// The border's sequence number (replay protection in the interior).
    pub seq: u64,
    /// The user the packet is from.
    pub user: [u8; 32],
    /// Not valid from (Unix seconds).
    pub expires: u64,
    /// What the packet may do in the interior (an attenuated credential).
    pub credential: &'a [u8],
    /// HMAC-SHA256 tag.
    pub tag: &'a [u8],
}

impl<'a> AttachmentRepr<'a> {
    /// Parses an attachment.
    pub fn parse(bytes: &'a [u8]) -> Result<AttachmentRepr<'a>, WireError> {
        Attachment::new_checked(bytes)?;
        let cl = be16(bytes, 2) as usize;
        Ok(AttachmentRepr {
            domain: get(bytes, 4),
            epoch: be32(bytes, 20),
            border: get(bytes, 24),
            seq: be64(bytes, 40),
            user: get(bytes, 48),
            expires: be64(bytes, 80),
            credential: &bytes[ATTACH_HEADER..ATTACH_HEADER + cl],
            tag: &bytes[bytes.len() - ATTACH_TAG..],
        })
    }
    /// Appends everything but the tag to `out`.
    pub fn emit_unsigned(&self, out: &mut Vec<u8>) {
        out.push(VERSION);
        out.push(0);
        out.extend_from_slice(&(self.credential.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.domain);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.border);
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.user);
        out.extend_from_slice(&self.expires.to_be_bytes());
        out.extend_from_slice(self.credential);
    }
}

// ------------------------------------------------- ticket request and reply

/// Why a ticket was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RefusalCode {
    /// Over the issuance rate.
    RateLimited = 1,
    /// The credential did not verify.
    CredentialRefused = 2,
    /// The request was malformed.
    Malformed = 3,
    /// This node is not a key distribution service.
    NotAService = 4,
}

/// A message between a user and a key distribution service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdcMessage<'a> {
    /// Ask for a ticket.
    Request {
        /// Lifetime wanted, seconds (the service may shorten it).
        lifetime_s: u16,
        /// The user's credential.
        credential: &'a [u8],
    },
    /// A ticket.
    Reply {
        /// Its expiry (Unix seconds).
        expires: u64,
        /// The session key (protected by the SA this travels in).
        session_key: [u8; 32],
        /// The ticket.
        ticket: &'a [u8],
    },
    /// A refusal.
    Refusal(RefusalCode),
}

impl<'a> KdcMessage<'a> {
    /// Parses a message.
    pub fn parse(b: &'a [u8]) -> Result<KdcMessage<'a>, WireError> {
        let Some(&kind) = b.first() else { return Err(WireError::Truncated) };
        match kind {
            1 => {
                if b.len() < 4 {
                    return Err(WireError::Truncated);
                }
                if b[1] != 0 {
                    return Err(WireError::Reserved);
                }
                if b.len() > 4 + MAX_CREDENTIAL {
                    return Err(WireError::Trailing);
                }
                Ok(KdcMessage::Request { lifetime_s: be16(b, 2), credential: &b[4..] })
            }
            2 => {
                if b.len() < 44 {
                    return Err(WireError::Truncated);
                }
                if b[1] != 0 {
                    return Err(WireError::Reserved);
                }
                let tl = be16(b, 2) as usize;
                match b.len().cmp(&(44 + tl)) {
                    core::cmp::Ordering::Less => return Err(WireError::Truncated),
                    core::cmp::Ordering::Greater => return Err(WireError::Trailing),
                    core::cmp::Ordering::Equal => {}
                }
                Ticket::new_checked(&b[44..])?;
                Ok(KdcMessage::Reply { expires: be64(b, 4), session_key: get(b, 12), ticket: &b[44..] })
            }
            3 => {
                if b.len() != 2 {
                    return Err(if b.len() < 2 { WireError::Truncated } else { WireError::Trailing });
                }
                let code = match b[1] {
                    1 => RefusalCode::RateLimited,
                    2 => RefusalCode::CredentialRefused,
                    3 => RefusalCode::Malformed,
                    4 => RefusalCode::NotAService,
                    c => return Err(WireError::Kind(c)),
                };
                Ok(KdcMessage::Refusal(code))
            }
            k => Err(WireError::Kind(k)),
        }
    }

    /// The message's bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match *self {
            KdcMessage::Request { lifetime_s, credential } => {
                v.extend_from_slice(&[1, 0]);
                v.extend_from_slice(&lifetime_s.to_be_bytes());
                v.extend_from_slice(credential);
            }
            KdcMessage::Reply { expires, session_key, ticket } => {
                v.extend_from_slice(&[2, 0]);
                v.extend_from_slice(&(ticket.len() as u16).to_be_bytes());
                v.extend_from_slice(&expires.to_be_bytes());
                v.extend_from_slice(&session_key);
                v.extend_from_slice(ticket);
            }
            KdcMessage::Refusal(c) => v.extend_from_slice(&[3, c as u8]),
        }
        v
    }
}

// --------------------------------------------------------- domain envelope

/// Largest perimeter attachment.
pub const MAX_ATTACHMENT: usize = ATTACH_HEADER + MAX_CREDENTIAL + ATTACH_TAG;

/// What a node's domain datagram carries: a user's ticket-authenticated
/// packet, or a packet a border admitted, with its perimeter attachment,
/// on its way through the domain to `destination`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Envelope<'a> {
    /// A ticket-authenticated packet (kind 1), as [`TicketPacketRepr`] frames it.
    Ticket(&'a [u8]),
    /// A packet admitted at a border (kind 2).
    Attached {
        /// The overlay address of the node it is for.
        destination: u32,
        /// The perimeter attachment (`None`: the packet came without one).
        attachment: Option<&'a [u8]>,
        /// The inner packet the attachment is bound to.
        inner: &'a [u8],
    },
}

impl<'a> Envelope<'a> {
    /// Parses an envelope. The ticket packet and attachment inside are
    /// framed, not checked: [`crate::DomainNode`] parses them.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Reserved`],
    /// [`WireError::Trailing`] (an attachment over [`MAX_ATTACHMENT`]),
    /// [`WireError::Kind`].
    pub fn parse(b: &'a [u8]) -> Result<Envelope<'a>, WireError> {
        match b.first() {
            None => Err(WireError::Truncated),
            Some(1) => Ok(Envelope::Ticket(&b[1..])),
            Some(2) => {
                if b.len() < 8 {
                    return Err(WireError::Truncated);
                }
                if b[1] != 0 {
                    return Err(WireError::Reserved);
                }
                let al = be16(b, 2) as usize;
                if al > MAX_ATTACHMENT {
                    return Err(WireError::Trailing);
                }
                let rest = b.get(8..).unwrap_or(&[]);
                if rest.len() < al {
                    return Err(WireError::Truncated);
                }
                let (att, inner) = rest.split_at(al);
                Ok(Envelope::Attached { destination: be32(b, 4), attachment: (al > 0).then_some(att), inner })
            }
            Some(&k) => Err(WireError::Kind(k)),
        }
    }

    /// Bytes [`Envelope::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Envelope::Ticket(p) => 1 + p.len(),
            Envelope::Attached { attachment, inner, .. } => 8 + attachment.map_or(0, <[u8]>::len) + inner.len(),
        }
    }

    /// Appends the envelope to `out`.
    ///
    /// # Errors
    /// [`WireError::Trailing`] for an attachment over [`MAX_ATTACHMENT`].
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        match *self {
            Envelope::Ticket(p) => {
                out.push(1);
                out.extend_from_slice(p);
            }
            Envelope::Attached { destination, attachment, inner } => {
                let att = attachment.unwrap_or(&[]);
                if att.len() > MAX_ATTACHMENT {
                    return Err(WireError::Trailing);
                }
                out.extend_from_slice(&[2, 0]);
                out.extend_from_slice(&(att.len() as u16).to_be_bytes());
                out.extend_from_slice(&destination.to_be_bytes());
                out.extend_from_slice(att);
                out.extend_from_slice(inner);
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------- revocation update

/// Most ticket ids, and most users, one revocation update carries.
pub const MAX_REVOKE_ITEMS: usize = 64;
/// Revocation update header length.
pub const REVOKE_HEADER: usize = 12;

/// Why a revocation update was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RevokeRefusal {
    /// The SA's principal is not the domain's operator.
    NotOperator = 1,
    /// The update was malformed.
    Malformed = 2,
    /// This node is in no domain.
    NoDomain = 3,
    /// Applying it would overflow the node's revocation lists.
    Full = 4,
}

impl RevokeRefusal {
    /// A short stable label for counters and logs.
    pub fn label(self) -> &'static str {
        match self {
            RevokeRefusal::NotOperator => "not_operator",
            RevokeRefusal::Malformed => "malformed",
            RevokeRefusal::NoDomain => "no_domain",
            RevokeRefusal::Full => "full",
        }
    }
}

/// What a revocation update asks for: every field is added to what the
/// node already revokes (nothing is ever un-revoked by an update).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevokeUpdate {
    /// Raise the epoch floor to this (0: leave it).
    pub min_epoch: u32,
    /// Ticket ids to revoke.
    pub tickets: Vec<u64>,
    /// Users (Ed25519 public keys) to revoke.
    pub users: Vec<[u8; 32]>,
}

/// A message of the revocation exchange between a domain operator and a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeMessage {
    /// An update (operator to node).
    Update(RevokeUpdate),
    /// Applied: the node's revocation state after it.
    Ack {
        /// The epoch floor.
        min_epoch: u32,
        /// Ticket ids revoked in all.
        tickets: u32,
        /// Users revoked in all.
        users: u32,
    },
    /// Refused; nothing was applied.
    Refusal(RevokeRefusal),
}

impl RevokeMessage {
    /// Parses a message.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::Trailing`] (bytes after the
    /// lists, or a list over [`MAX_REVOKE_ITEMS`]), [`WireError::Reserved`],
    /// [`WireError::Kind`].
    ///
    /// `DoS`: the lists are bounded before anything is allocated.
    pub fn parse(b: &[u8]) -> Result<RevokeMessage, WireError> {
        let Some(&kind) = b.first() else { return Err(WireError::Truncated) };
        let exact = |n: usize| match b.len().cmp(&n) {
            core::cmp::Ordering::Less => Err(WireError::Truncated),
            core::cmp::Ordering::Greater => Err(WireError::Trailing),
            core::cmp::Ordering::Equal => Ok(()),
        };
        match kind {
            1 => {
                if b.len() < REVOKE_HEADER {
                    return Err(WireError::Truncated);
                }
                if b[1] != 0 || be16(b, 6) != 0 {
                    return Err(WireError::Reserved);
                }
                let (nt, nu) = (be16(b, 2) as usize, be16(b, 4) as usize);
                if nt > MAX_REVOKE_ITEMS || nu > MAX_REVOKE_ITEMS {
                    return Err(WireError::Trailing);
                }
                exact(REVOKE_HEADER + nt * 8 + nu * 32)?;
                let tickets = (0..nt).map(|i| be64(b, REVOKE_HEADER + i * 8)).collect();
                let users = (0..nu).map(|i| get(b, REVOKE_HEADER + nt * 8 + i * 32)).collect();
                Ok(RevokeMessage::Update(RevokeUpdate { min_epoch: be32(b, 8), tickets, users }))
            }
            2 => {
                exact(14)?;
                if b[1] != 0 {
                    return Err(WireError::Reserved);
                }
                Ok(RevokeMessage::Ack { min_epoch: be32(b, 2), tickets: be32(b, 6), users: be32(b, 10) })
            }
            3 => {
                exact(2)?;
                Ok(RevokeMessage::Refusal(match b[1] {
                    1 => RevokeRefusal::NotOperator,
                    2 => RevokeRefusal::Malformed,
                    3 => RevokeRefusal::NoDomain,
                    4 => RevokeRefusal::Full,
                    c => return Err(WireError::Kind(c)),
                }))
            }
            k => Err(WireError::Kind(k)),
        }
    }

    /// The message's bytes.
    ///
    /// # Errors
    /// [`WireError::Trailing`] for a list over [`MAX_REVOKE_ITEMS`].
    pub fn to_vec(&self) -> Result<Vec<u8>, WireError> {
        let mut v = Vec::new();
        match self {
            RevokeMessage::Update(u) => {
                if u.tickets.len() > MAX_REVOKE_ITEMS || u.users.len() > MAX_REVOKE_ITEMS {
                    return Err(WireError::Trailing);
                }
                v.extend_from_slice(&[1, 0]);
                v.extend_from_slice(&(u.tickets.len() as u16).to_be_bytes());
                v.extend_from_slice(&(u.users.len() as u16).to_be_bytes());
                v.extend_from_slice(&[0, 0]);
                v.extend_from_slice(&u.min_epoch.to_be_bytes());
                for t in &u.tickets {
                    v.extend_from_slice(&t.to_be_bytes());
                }
                for k in &u.users {
                    v.extend_from_slice(k);
                }
            }
            RevokeMessage::Ack { min_epoch, tickets, users } => {
                v.extend_from_slice(&[2, 0]);
                v.extend_from_slice(&min_epoch.to_be_bytes());
                v.extend_from_slice(&tickets.to_be_bytes());
                v.extend_from_slice(&users.to_be_bytes());
            }
            RevokeMessage::Refusal(c) => v.extend_from_slice(&[3, *c as u8]),
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ticket() -> Vec<u8> {
        let sealed = vec![0xAB; BODY_FIXED + 3 + TAG_LEN];
        let mut t = vec![0u8; TICKET_HEADER];
        TicketRepr::emit_header([7; 16], 2, 99, [5; 12], sealed.len(), &mut t);
        t.extend_from_slice(&sealed);
        t
    }

    #[test]
    fn envelope_construct_deconstruct_and_rejections() {
        let t = Envelope::Ticket(b"packet");
        let mut b = Vec::new();
        t.emit(&mut b).unwrap();
        assert_eq!((b.len(), Envelope::parse(&b)), (t.buffer_len(), Ok(t)));
        let a = Envelope::Attached { destination: 0x0a00_0002, attachment: Some(b"att"), inner: b"inner" };
        let mut b = Vec::new();
        a.emit(&mut b).unwrap();
        assert_eq!(b[..8], [2, 0, 0, 3, 10, 0, 0, 2]);
        assert_eq!((b.len(), Envelope::parse(&b)), (a.buffer_len(), Ok(a)));
        let none = Envelope::Attached { destination: 1, attachment: None, inner: b"x" };
        let mut n = Vec::new();
        none.emit(&mut n).unwrap();
        assert_eq!(Envelope::parse(&n), Ok(none));
        assert_eq!(Envelope::parse(&[]), Err(WireError::Truncated));
        assert_eq!(Envelope::parse(&b[..7]), Err(WireError::Truncated));
        assert_eq!(Envelope::parse(&b[..10]), Err(WireError::Truncated));
        assert_eq!(Envelope::parse(&[9]), Err(WireError::Kind(9)));
        let mut r = b.clone();
        r[1] = 1;
        assert_eq!(Envelope::parse(&r), Err(WireError::Reserved));
        let big = vec![0u8; MAX_ATTACHMENT + 1];
        let e = Envelope::Attached { destination: 1, attachment: Some(&big), inner: b"" };
        assert_eq!(e.emit(&mut Vec::new()), Err(WireError::Trailing));
        let mut over = vec![2, 0, 0xff, 0xff, 0, 0, 0, 1];
        over.extend_from_slice(&big);
        assert_eq!(Envelope::parse(&over), Err(WireError::Trailing));
    }

    #[test]
    fn ticket_construct_deconstruct_and_rejections() {
        let t = ticket();
        let r = TicketRepr::parse(&t).unwrap();
        assert_eq!((r.domain, r.epoch, r.id, r.nonce), ([7; 16], 2, 99, [5; 12]));
        assert_eq!(r.sealed.len(), BODY_FIXED + 3 + TAG_LEN);
        assert_eq!(TicketRepr::parse(&t[..20]), Err(WireError::Truncated));
        assert_eq!(TicketRepr::parse(&t[..t.len() - 1]), Err(WireError::Truncated));
        let mut long = t.clone();
        long.push(0);
        assert_eq!(TicketRepr::parse(&long), Err(WireError::Trailing));
        let mut v = t.clone();
        v[0] = 2;
        assert_eq!(TicketRepr::parse(&v), Err(WireError::Version(2)));
        let mut r = t.clone();
        r[1] = 1;
        assert_eq!(TicketRepr::parse(&r), Err(WireError::Reserved));
        let body = TicketBody { user: [1; 32], not_before: 5, expires: 9, session_key: [2; 32], credential: b"cred" };
        let mut b = Vec::new();
        body.emit(&mut b);
        assert_eq!(b.len(), body.buffer_len());
        assert_eq!(TicketBody::parse(&b).unwrap(), body);
        assert_eq!(TicketBody::parse(&b[..10]), Err(WireError::Truncated));
    }

    #[test]
    fn packet_construct_deconstruct_and_rejections() {
        let t = ticket();
        let mut p = Vec::new();
        TicketPacketRepr::emit_aad(0x0a000002, 7, 99, Some(&t), &mut p);
        p.extend_from_slice(&[0xCC; 5 + TAG_LEN]);
        let r = TicketPacketRepr::parse(&p).unwrap();
        assert_eq!((r.destination, r.counter, r.ticket_id, r.ticket), (0x0a000002, 7, 99, Some(&t[..])));
        assert_eq!(r.sealed.len(), 5 + TAG_LEN);
        let mut no = Vec::new();
        TicketPacketRepr::emit_aad(1, 2, 3, None, &mut no);
        no.extend_from_slice(&[0; TAG_LEN]);
        assert_eq!(TicketPacketRepr::parse(&no).unwrap().ticket, None);
        let mut bad = no.clone();
        bad[1] = FLAG_TICKET; // flag without a ticket
        assert_eq!(TicketPacketRepr::parse(&bad), Err(WireError::Reserved));
        let mut bad = no.clone();
        bad[1] = 0x80;
        assert_eq!(TicketPacketRepr::parse(&bad), Err(WireError::Reserved));
        assert_eq!(TicketPacketRepr::parse(&p[..PACKET_HEADER + 10]), Err(WireError::Truncated));
    }

    #[test]
    fn revoke_construct_deconstruct_and_rejections() {
        let u = RevokeUpdate { min_epoch: 3, tickets: vec![1, 0xDEAD_BEEF], users: vec![[7; 32]] };
        let b = RevokeMessage::Update(u.clone()).to_vec().unwrap();
        assert_eq!(b[..REVOKE_HEADER], [1, 0, 0, 2, 0, 1, 0, 0, 0, 0, 0, 3]);
        assert_eq!(b.len(), REVOKE_HEADER + 2 * 8 + 32);
        assert_eq!(RevokeMessage::parse(&b), Ok(RevokeMessage::Update(u)));
        for m in [
            RevokeMessage::Update(RevokeUpdate::default()),
            RevokeMessage::Ack { min_epoch: 2, tickets: 5, users: 1 },
            RevokeMessage::Refusal(RevokeRefusal::NotOperator),
            RevokeMessage::Refusal(RevokeRefusal::Full),
        ] {
            assert_eq!(RevokeMessage::parse(&m.to_vec().unwrap()), Ok(m));
        }
        assert_eq!(RevokeMessage::parse(&[]), Err(WireError::Truncated));
        assert_eq!(RevokeMessage::parse(&b[..REVOKE_HEADER - 1]), Err(WireError::Truncated));
        assert_eq!(RevokeMessage::parse(&b[..b.len() - 1]), Err(WireError::Truncated));
        let mut long = b.clone();
        long.push(0);
        assert_eq!(RevokeMessage::parse(&long), Err(WireError::Trailing));
        let mut r = b.clone();
        r[1] = 1;
        assert_eq!(RevokeMessage::parse(&r), Err(WireError::Reserved));
        let mut r = b.clone();
        r[7] = 1;
        assert_eq!(RevokeMessage::parse(&r), Err(WireError::Reserved));
        // A list over the bound is refused before its bytes are looked for.
        let mut over = b[..REVOKE_HEADER].to_vec();
        over[2..4].copy_from_slice(&(MAX_REVOKE_ITEMS as u16 + 1).to_be_bytes());
        assert_eq!(RevokeMessage::parse(&over), Err(WireError::Trailing));
        let big = RevokeUpdate { tickets: vec![0; MAX_REVOKE_ITEMS + 1], ..RevokeUpdate::default() };
        assert_eq!(RevokeMessage::Update(big).to_vec(), Err(WireError::Trailing));
        assert_eq!(RevokeMessage::parse(&[3, 9]), Err(WireError::Kind(9)));
        assert_eq!(RevokeMessage::parse(&[3, 1, 0]), Err(WireError::Trailing));
        assert_eq!(RevokeMessage::parse(&[9]), Err(WireError::Kind(9)));
        assert_eq!(RevokeMessage::parse(&[2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(WireError::Reserved));
    }

    #[test]
    fn attachment_and_kdc_messages() {
        let a = AttachmentRepr {
            domain: [1; 16],
            epoch: 3,
            border: [2; 16],
            seq: 4,
            user: [5; 32],
            expires: 6,
            credential: b"credential",
            tag: &[9; ATTACH_TAG],
        };
        let mut v = Vec::new();
        a.emit_unsigned(&mut v);
        v.extend_from_slice(a.tag);
        assert_eq!(AttachmentRepr::parse(&v).unwrap(), a);
        assert_eq!(AttachmentRepr::parse(&v[..v.len() - 1]), Err(WireError::Truncated));
        let mut long = v.clone();
        long.push(1);
        assert_eq!(AttachmentRepr::parse(&long), Err(WireError::Trailing));
        let t = ticket();
        for m in [
            KdcMessage::Request { lifetime_s: 60, credential: b"cred" },
            KdcMessage::Reply { expires: 77, session_key: [3; 32], ticket: &t },
            KdcMessage::Refusal(RefusalCode::RateLimited),
        ] {
            assert_eq!(KdcMessage::parse(&m.to_vec()), Ok(m));
        }
        assert_eq!(KdcMessage::parse(&[9]), Err(WireError::Kind(9)));
        assert_eq!(KdcMessage::parse(&[3, 9]), Err(WireError::Kind(9)));
        assert_eq!(KdcMessage::parse(&[]), Err(WireError::Truncated));
        assert_eq!(KdcMessage::parse(&[1, 1, 0, 0]), Err(WireError::Reserved));
    }
}
