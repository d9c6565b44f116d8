//! Session control messages: what a principal sends over its SA to open,
//! change, close, list and show sessions, and the node's replies. They
//! travel in ANEP `CONTROL` (0xA004) payloads, beside the module load
//! request (op 1); these ops start at 0x10, so one dispatch byte tells them
//! apart.
//!
//! ```text
//!  0      1      2             4
//! +------+------+-------------+------------------
//! |  op  | ver  | body length | body ...
//! +------+------+-------------+------------------
//! ```
//!
//! All integers are big-endian. Bodies:
//!
//! | op | message | body |
//! |---|---|---|
//! | 0x10 | open | credential length (2), credential, reservation |
//! | 0x11 | reserve | session (8), reservation |
//! | 0x12 | close | session (8) |
//! | 0x13 | list | (empty) |
//! | 0x14 | show | session (8) |
//! | 0x90 | granted | session (8), n (1), n × VP handle (8) |
//! | 0x92 | closed | session (8), reason (1), account |
//! | 0x93 | sessions | n (1), n × session summary |
//! | 0x9D | bad VP | slice (8), period (8) (not the extra flag), min period (8), max period (8), min slice (8) |
//! | 0x9E | refused | resource (1), limit (1), asked (8), left (8), allowed (8) |
//! | 0x9F | error | code (1), detail (8) |
//!
//! - reservation: present flags (1: bit 0 heap, bit 1 tx, bit 2 rx), then
//!   heap bytes (8), tx bytes/s (8), rx bytes/s (8) for each flag set, then
//!   n (1, at most [`MAX_OPS`]) VP operations: kind (1: 1 add, 2 change,
//!   3 remove), the VP handle (8) for change and remove, VP parameters for
//!   add and change.
//! - VP parameters: slice ns (8), period ns (8), flags (1: bit 0 extra).
//! - account: the eight [`ResourceKind`] counters in code order (8 each).
//! - session summary: session (8), share ppm (8), heap (8), tx (8), rx (8),
//!   account, n (1), n × (VP handle (8), VP parameters).
//!
//! Handles are the 64-bit raw form (generation << 32 | index); they name,
//! they do not authorise (see [`crate::rcane`]).
//!
//! # No-panic contract
//! After [`Message::new_checked`] succeeds no accessor panics; parsing
//! never panics, allocates at most what the message's own length bounds,
//! and rejects unknown ops, versions, flags and codes and trailing bytes.

use crate::account::{Account, CloseReason, ResourceKind};
use crate::admission::{AdmissionError, Limit, ReserveRequest, Resource, VpOp};
use crate::handle::{SessionId, VpId};
use crate::rcane::{ClosedSession, Granted, HandleError, RcaneError, SessionInfo};
use crate::scheduler::{SchedError, VpParams};

/// The only version this crate speaks.
pub const VERSION: u8 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 4;
/// Most VP operations in one reservation.
pub const MAX_OPS: usize = 32;
/// Largest body (the length field is 16 bits).
pub const MAX_BODY: usize = u16::MAX as usize;

/// Message ops.
pub mod op {
    /// Open a session.
    pub const OPEN: u8 = 0x10;
    /// Change a session's reservations.
    pub const RESERVE: u8 = 0x11;
    /// Close a session.
    pub const CLOSE: u8 = 0x12;
    /// List the principal's sessions.
    pub const LIST: u8 = 0x13;
    /// Show one session.
    pub const SHOW: u8 = 0x14;
    /// Reply: request granted.
    pub const GRANTED: u8 = 0x90;
    /// Reply: session closed.
    pub const CLOSED: u8 = 0x92;
    /// Reply: session summaries.
    pub const SESSIONS: u8 = 0x93;
    /// Reply: VP parameters outside the node's bounds.
    pub const BAD_VP: u8 = 0x9D;
    /// Reply: refused by admission control.
    pub const REFUSED: u8 = 0x9E;
    /// Reply: another error.
    pub const ERROR: u8 = 0x9F;

    /// Whether `op` is a request.
    pub const fn is_request(op: u8) -> bool {
        matches!(op, OPEN | RESERVE | CLOSE | LIST | SHOW)
    }
    /// Whether `op` is a reply.
    pub const fn is_reply(op: u8) -> bool {
        matches!(op, GRANTED | CLOSED | SESSIONS | BAD_VP | REFUSED | ERROR)
    }
}

const ACCOUNT_LEN: usize = 8 * ResourceKind::ALL.len();
const PARAMS_LEN: usize = 17;

mod field {
    use core::ops::Range;
    pub const OP: usize = 0;
    pub const VERSION: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
}

/// A malformed control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than its header or than a field it declares.
    #[error("truncated session control message")]
    Truncated,
    /// The version is not [`VERSION`].
    #[error("unknown session control version {0}")]
    BadVersion(u8),
    /// An op this node does not know (or a reply where a request was
    /// expected, and the reverse).
    #[error("unknown session control op {0:#04x}")]
    UnknownOp(u8),
    /// The buffer is not exactly header plus declared body.
    #[error("body length {declared} but {actual} bytes follow the header")]
    LengthMismatch {
        /// Declared body length.
        declared: usize,
        /// Bytes after the header.
        actual: usize,
    },
    /// Bytes left over after the last field of the body.
    #[error("{0} trailing bytes in the body")]
    TrailingBytes(usize),
    /// A flags byte has unknown bits set.
    #[error("unknown flag bits {0:#04x}")]
    UnknownFlags(u8),
    /// More VP operations than [`MAX_OPS`].
    #[error("{0} VP operations, at most {MAX_OPS}")]
    TooManyOps(usize),
    /// An unknown VP operation kind.
    #[error("unknown VP operation {0}")]
    UnknownVpOp(u8),
    /// An unknown error code, resource, limit or close reason.
    #[error("unknown code {0}")]
    UnknownCode(u8),
    /// The message would not fit a 16-bit body length, or a list more
    /// than 255 entries (emit only).
    #[error("message too long: {0} bytes")]
    TooLong(usize),
    /// The output buffer is too small (emit only).
    #[error("output buffer of {have} bytes, need {need}")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
}

/// A read-only view of a control message over a byte buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Message<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Message<T> {
        Message { buffer }
    }

    /// Wraps a buffer after [`check`](Self::check) succeeds.
    ///
    /// # Errors
    /// See [`check`](Self::check).
    pub fn new_checked(buffer: T) -> Result<Message<T>, WireError> {
        let m = Message::new_unchecked(buffer);
        m.check()?;
        Ok(m)
    }

    /// The header is present, the version known, the op known, and the
    /// buffer holds exactly the header and the declared body.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::BadVersion`],
    /// [`WireError::UnknownOp`], [`WireError::LengthMismatch`].
    pub fn check(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[field::VERSION] != VERSION {
            return Err(WireError::BadVersion(b[field::VERSION]));
        }
        let op = b[field::OP];
        if !op::is_request(op) && !op::is_reply(op) {
            return Err(WireError::UnknownOp(op));
        }
        let declared = self.body_len();
        let actual = b.len() - HEADER_LEN;
        if declared != actual {
            return Err(WireError::LengthMismatch { declared, actual });
        }
        Ok(())
    }

    /// The op.
    pub fn op(&self) -> u8 {
        self.buffer.as_ref()[field::OP]
    }

    /// The version.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    /// The declared body length.
    pub fn body_len(&self) -> usize {
        let b = self.buffer.as_ref();
        usize::from(u16::from_be_bytes([b[field::LENGTH.start], b[field::LENGTH.start + 1]]))
    }

    /// The body.
    pub fn body(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.body_len()]
    }

    /// The length of the first message in a buffer that may hold more
    /// (header plus declared body), if the header is there.
    pub fn frame_len(b: &[u8]) -> Option<usize> {
        let l = b.get(field::LENGTH)?;
        Some(HEADER_LEN + usize::from(u16::from_be_bytes([l[0], l[1]])))
    }
}

/// Reads fields off a body; every read is checked.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let (head, rest) = self.b.split_at_checked(n).ok_or(WireError::Truncated)?;
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        let (h, rest) = self.b.split_first_chunk::<2>().ok_or(WireError::Truncated)?;
        self.b = rest;
        Ok(u16::from_be_bytes(*h))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        let (h, rest) = self.b.split_first_chunk::<8>().ok_or(WireError::Truncated)?;
        self.b = rest;
        Ok(u64::from_be_bytes(*h))
    }
    fn finish(self) -> Result<(), WireError> {
        if self.b.is_empty() { Ok(()) } else { Err(WireError::TrailingBytes(self.b.len())) }
    }
    fn params(&mut self) -> Result<VpParams, WireError> {
        let slice_ns = self.u64()?;
        let period_ns = self.u64()?;
        let flags = self.u8()?;
        if flags & !1 != 0 {
            return Err(WireError::UnknownFlags(flags));
        }
        Ok(VpParams { slice_ns, period_ns, extra: flags & 1 != 0 })
    }
    fn account(&mut self) -> Result<Account, WireError> {
        let mut v = [0u64; ResourceKind::ALL.len()];
        for x in &mut v {
            *x = self.u64()?;
        }
        let [g, s, tp, tb, rp, rb, ml, heap] = v;
        Ok(Account {
            cpu_guaranteed_ns: g,
            cpu_slack_ns: s,
            tx_packets: tp,
            tx_bytes: tb,
            rx_packets: rp,
            rx_bytes: rb,
            module_loads: ml,
            heap_byte_ns: u128::from(heap) * 1_000_000_000,
        })
    }
    fn reservation(&mut self) -> Result<ReserveRequest, WireError> {
        let flags = self.u8()?;
        if flags & !7 != 0 {
            return Err(WireError::UnknownFlags(flags));
        }
        let mut opt = |bit: u8| -> Result<Option<u64>, WireError> {
            if flags & bit != 0 { Ok(Some(self.u64()?)) } else { Ok(None) }
        };
        let heap_bytes = opt(1)?;
        let tx_bytes_per_sec = opt(2)?;
        let rx_bytes_per_sec = opt(4)?;
        let n = usize::from(self.u8()?);
        if n > MAX_OPS {
            return Err(WireError::TooManyOps(n));
        }
        let mut vps = Vec::with_capacity(n);
        for _ in 0..n {
            vps.push(match self.u8()? {
                1 => VpOp::Add(self.params()?),
                2 => VpOp::Change(VpId::from_raw(self.u64()?), self.params()?),
                3 => VpOp::Remove(VpId::from_raw(self.u64()?)),
                k => return Err(WireError::UnknownVpOp(k)),
            });
        }
        Ok(ReserveRequest { vps, heap_bytes, tx_bytes_per_sec, rx_bytes_per_sec })
    }
}

/// Writes fields; the caller sized the buffer with `buffer_len`.
struct Writer {
    v: Vec<u8>,
}

impl Writer {
    fn u8(&mut self, x: u8) {
        self.v.push(x);
    }
    fn u64(&mut self, x: u64) {
        self.v.extend_from_slice(&x.to_be_bytes());
    }
    fn params(&mut self, p: &VpParams) {
        self.u64(p.slice_ns);
        self.u64(p.period_ns);
        self.u8(u8::from(p.extra));
    }
    fn account(&mut self, a: &Account) {
        for k in ResourceKind::ALL {
            self.u64(a.get(k));
        }
    }
    fn reservation(&mut self, r: &ReserveRequest) -> Result<(), WireError> {
        let flags = u8::from(r.heap_bytes.is_some())
            | (u8::from(r.tx_bytes_per_sec.is_some()) << 1)
            | (u8::from(r.rx_bytes_per_sec.is_some()) << 2);
        self.u8(flags);
        for x in [r.heap_bytes, r.tx_bytes_per_sec, r.rx_bytes_per_sec].into_iter().flatten() {
            self.u64(x);
        }
        if r.vps.len() > MAX_OPS {
            return Err(WireError::TooManyOps(r.vps.len()));
        }
        self.u8(r.vps.len() as u8);
        for op in &r.vps {
            match op {
                VpOp::Add(p) => {
                    self.u8(1);
                    self.params(p);
                }
                VpOp::Change(vp, p) => {
                    self.u8(2);
                    self.u64(vp.to_raw());
                    self.params(p);
                }
                VpOp::Remove(vp) => {
                    self.u8(3);
                    self.u64(vp.to_raw());
                }
            }
        }
        Ok(())
    }
}

fn reservation_len(r: &ReserveRequest) -> usize {
    let opts = [r.heap_bytes, r.tx_bytes_per_sec, r.rx_bytes_per_sec].iter().flatten().count();
    let ops: usize = r
        .vps
        .iter()
        .map(|op| match op {
            VpOp::Add(_) => 1 + PARAMS_LEN,
            VpOp::Change(..) => 1 + 8 + PARAMS_LEN,
            VpOp::Remove(_) => 1 + 8,
        })
        .sum();
    1 + 8 * opts + 1 + ops
}

/// Frames a body: header, then body, checking the length and the buffer.
fn frame(op: u8, body: Vec<u8>, buf: &mut [u8]) -> Result<usize, WireError> {
    if body.len() > MAX_BODY {
        return Err(WireError::TooLong(body.len()));
    }
    let need = HEADER_LEN + body.len();
    let out = buf.get_mut(..need).ok_or(WireError::BufferTooSmall { need, have: 0 })?;
    out[0] = op;
    out[1] = VERSION;
    out[2..4].copy_from_slice(&(body.len() as u16).to_be_bytes());
    out[HEADER_LEN..].copy_from_slice(&body);
    Ok(need)
}

fn to_vec(buffer_len: usize, emit: impl FnOnce(&mut [u8]) -> Result<usize, WireError>) -> Result<Vec<u8>, WireError> {
    let mut v = vec![0; buffer_len];
    let n = emit(&mut v)?;
    v.truncate(n);
    Ok(v)
}

/// A request from a principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Open a session with a credential (Biscuit bytes; the node verifies
    /// it and derives the ceilings) and an initial reservation.
    Open {
        /// The credential.
        credential: Vec<u8>,
        /// What to reserve at once.
        reservation: ReserveRequest,
    },
    /// Change one of the principal's sessions.
    Reserve {
        /// The session.
        session: SessionId,
        /// The change.
        reservation: ReserveRequest,
    },
    /// Close one of the principal's sessions.
    Close {
        /// The session.
        session: SessionId,
    },
    /// List the principal's sessions.
    List,
    /// Show one of the principal's sessions.
    Show {
        /// The session.
        session: SessionId,
    },
}

impl Request {
    /// Parses a checked message as a request.
    ///
    /// # Errors
    /// Any [`WireError`]; a reply op is [`WireError::UnknownOp`].
    pub fn parse<T: AsRef<[u8]>>(m: &Message<T>) -> Result<Request, WireError> {
        m.check()?;
        let mut r = Reader { b: m.body() };
        let req = match m.op() {
            op::OPEN => {
                let n = usize::from(r.u16()?);
                let credential = r.take(n)?.to_vec();
                Request::Open { credential, reservation: r.reservation()? }
            }
            op::RESERVE => Request::Reserve { session: SessionId::from_raw(r.u64()?), reservation: r.reservation()? },
            op::CLOSE => Request::Close { session: SessionId::from_raw(r.u64()?) },
            op::LIST => Request::List,
            op::SHOW => Request::Show { session: SessionId::from_raw(r.u64()?) },
            o => return Err(WireError::UnknownOp(o)),
        };
        r.finish()?;
        Ok(req)
    }

    /// Parses bytes holding exactly one request.
    ///
    /// # Errors
    /// Any [`WireError`].
    pub fn parse_bytes(b: &[u8]) -> Result<Request, WireError> {
        Request::parse(&Message::new_unchecked(b))
    }

    fn body(&self) -> Result<(u8, Vec<u8>), WireError> {
        let mut w = Writer { v: Vec::with_capacity(self.buffer_len()) };
        let op = match self {
            Request::Open { credential, reservation } => {
                let n = u16::try_from(credential.len()).map_err(|_| WireError::TooLong(credential.len()))?;
                w.v.extend_from_slice(&n.to_be_bytes());
                w.v.extend_from_slice(credential);
                w.reservation(reservation)?;
                op::OPEN
            }
            Request::Reserve { session, reservation } => {
                w.u64(session.to_raw());
                w.reservation(reservation)?;
                op::RESERVE
            }
            Request::Close { session } => {
                w.u64(session.to_raw());
                op::CLOSE
            }
            Request::List => op::LIST,
            Request::Show { session } => {
                w.u64(session.to_raw());
                op::SHOW
            }
        };
        Ok((op, w.v))
    }

    /// Length of the emitted message.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Request::Open { credential, reservation } => 2 + credential.len() + reservation_len(reservation),
                Request::Reserve { reservation, .. } => 8 + reservation_len(reservation),
                Request::Close { .. } | Request::Show { .. } => 8,
                Request::List => 0,
            }
    }

    /// Writes the message to the front of `buf`; returns its length.
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`], [`WireError::TooLong`],
    /// [`WireError::TooManyOps`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let need = self.buffer_len();
        if buf.len() < need {
            return Err(WireError::BufferTooSmall { need, have: buf.len() });
        }
        let (op, body) = self.body()?;
        frame(op, body, buf)
    }

    /// Emits into a new vector.
    ///
    /// # Errors
    /// As [`emit`](Self::emit).
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        to_vec(self.buffer_len(), |b| self.emit(b))
    }
}

/// An error code in an [`Reply::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The session handle is unknown (detail: the handle).
    SessionUnknown = 1,
    /// The session handle is stale (detail: the handle).
    SessionStale = 2,
    /// The session is not the principal's (detail: the handle).
    SessionNotYours = 3,
    /// The VP handle is unknown (detail: the handle).
    VpUnknown = 4,
    /// The VP handle is stale (detail: the handle).
    VpStale = 5,
    /// The VP is not the session's (detail: the handle).
    VpNotYours = 6,
    /// The pool handle is unknown (detail: the handle).
    PoolUnknown = 7,
    /// The pool handle is stale (detail: the handle).
    PoolStale = 8,
    /// The pool is not the session's (detail: the handle).
    PoolNotYours = 9,
    /// The node has as many sessions as it allows (detail: the limit).
    TooManySessions = 10,
    /// The principal has as many sessions as allowed (detail: the limit).
    TooManySessionsForPrincipal = 11,
    /// Too many VP operations (detail: the limit).
    TooManyOps = 12,
    /// A VP named twice (detail: its handle).
    DuplicateVp = 13,
    /// The credential has expired.
    CredentialExpired = 14,
    /// Pool bounds of zero.
    BadPool = 15,
    /// System and Best-Effort cannot be changed.
    Builtin = 16,
    /// The credential was refused (forged, wrong root, wrong rights).
    CredentialRefused = 17,
    /// The request was malformed (detail: nothing).
    Malformed = 18,
    /// Too many requests; try later (detail: ms to wait).
    RateLimited = 19,
    /// The node could not carry out the request.
    Internal = 20,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 20] = [
        ErrorCode::SessionUnknown,
        ErrorCode::SessionStale,
        ErrorCode::SessionNotYours,
        ErrorCode::VpUnknown,
        ErrorCode::VpStale,
        ErrorCode::VpNotYours,
        ErrorCode::PoolUnknown,
        ErrorCode::PoolStale,
        ErrorCode::PoolNotYours,
        ErrorCode::TooManySessions,
        ErrorCode::TooManySessionsForPrincipal,
        ErrorCode::TooManyOps,
        ErrorCode::DuplicateVp,
        ErrorCode::CredentialExpired,
        ErrorCode::BadPool,
        ErrorCode::Builtin,
        ErrorCode::CredentialRefused,
        ErrorCode::Malformed,
        ErrorCode::RateLimited,
        ErrorCode::Internal,
    ];

    /// The code with this number.
    pub fn from_code(c: u8) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|e| *e as u8 == c)
    }
}

/// One session in a [`Reply::Sessions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session.
    pub session: SessionId,
    /// Sum of its VP shares, ppm.
    pub share_ppm: u64,
    /// Heap reservation, bytes.
    pub heap_bytes: u64,
    /// Transmit reservation, bytes per second.
    pub tx_bytes_per_sec: u64,
    /// Receive reservation, bytes per second.
    pub rx_bytes_per_sec: u64,
    /// What it used (heap in whole byte-seconds).
    pub account: Account,
    /// Its VPs.
    pub vps: Vec<(VpId, VpParams)>,
}

impl From<&SessionInfo> for SessionSummary {
    fn from(i: &SessionInfo) -> SessionSummary {
        let mut account = i.account;
        // The wire carries whole byte-seconds.
        account.heap_byte_ns = account.heap_byte_ns / 1_000_000_000 * 1_000_000_000;
        SessionSummary {
            session: i.session,
            share_ppm: i.share_ppm,
            heap_bytes: i.heap_bytes,
            tx_bytes_per_sec: i.tx_bytes_per_sec,
            rx_bytes_per_sec: i.rx_bytes_per_sec,
            account,
            vps: i.vps.clone(),
        }
    }
}

/// The node's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// An open or reserve was granted.
    Granted {
        /// The session.
        session: SessionId,
        /// The VPs added, in request order.
        added: Vec<VpId>,
    },
    /// A session was closed.
    Closed {
        /// The session.
        session: SessionId,
        /// Why.
        reason: CloseReason,
        /// What it used (heap in whole byte-seconds).
        account: Account,
    },
    /// The principal's sessions (one for show).
    Sessions(Vec<SessionSummary>),
    /// A VP's parameters are outside the node's bounds.
    BadVp {
        /// The VP asked for: its slice and period (`extra` is not carried,
        /// and is always `false`).
        params: VpParams,
        /// Shortest period accepted.
        min_period_ns: u64,
        /// Longest period accepted.
        max_period_ns: u64,
        /// Shortest slice accepted.
        min_slice_ns: u64,
    },
    /// Refused by admission control.
    Refused {
        /// Which resource.
        resource: Resource,
        /// Which limit.
        by: Limit,
        /// What was asked.
        asked: u64,
        /// What is left on the node.
        left: u64,
        /// What the credential allows.
        allowed: u64,
    },
    /// Another error.
    Error {
        /// What went wrong.
        code: ErrorCode,
        /// A handle or limit, per code.
        detail: u64,
    },
}

impl Reply {
    /// The reply for a granted request.
    pub fn granted(g: &Granted) -> Reply {
        Reply::Granted { session: g.session, added: g.added.clone() }
    }

    /// The reply for a closed session.
    pub fn closed(c: &ClosedSession) -> Reply {
        let mut account = c.account;
        account.heap_byte_ns = account.heap_byte_ns / 1_000_000_000 * 1_000_000_000;
        Reply::Closed { session: c.session, reason: c.reason, account }
    }

    /// The reply for an error.
    pub fn error(e: &RcaneError) -> Reply {
        let handle = |kind: [ErrorCode; 3], h: HandleError, raw: u64| {
            let code = match h {
                HandleError::Unknown => kind[0],
                HandleError::Stale => kind[1],
                HandleError::NotYours => kind[2],
            };
            Reply::Error { code, detail: raw }
        };
        use ErrorCode as C;
        match *e {
            RcaneError::Session(s, h) => {
                handle([C::SessionUnknown, C::SessionStale, C::SessionNotYours], h, s.to_raw())
            }
            RcaneError::Vp(v, h) => handle([C::VpUnknown, C::VpStale, C::VpNotYours], h, v.to_raw()),
            RcaneError::Pool(p, h) => handle([C::PoolUnknown, C::PoolStale, C::PoolNotYours], h, p.to_raw()),
            RcaneError::Admission(AdmissionError::Refused { resource, by, asked, left, allowed }) => {
                Reply::Refused { resource, by, asked, left, allowed }
            }
            RcaneError::Admission(AdmissionError::BadVp { params, min_period_ns, max_period_ns, min_slice_ns }) => {
                // The reply carries the slice and the period, which the
                // bounds are about, not the extra flag: a reply made here
                // is the one its bytes parse to (found by `sched_control`).
                let params = VpParams { extra: false, ..params };
                Reply::BadVp { params, min_period_ns, max_period_ns, min_slice_ns }
            }
            RcaneError::TooManySessions { limit } => Reply::Error { code: C::TooManySessions, detail: limit.into() },
            RcaneError::TooManySessionsForPrincipal { limit } => {
                Reply::Error { code: C::TooManySessionsForPrincipal, detail: limit.into() }
            }
            RcaneError::TooManyOps { max, .. } => Reply::Error { code: C::TooManyOps, detail: max as u64 },
            RcaneError::DuplicateVp(v) => Reply::Error { code: C::DuplicateVp, detail: v.to_raw() },
            RcaneError::CredentialExpired => Reply::Error { code: C::CredentialExpired, detail: 0 },
            RcaneError::BadPool => Reply::Error { code: C::BadPool, detail: 0 },
            RcaneError::Builtin => Reply::Error { code: C::Builtin, detail: 0 },
            RcaneError::NotHoldingCpu { .. } | RcaneError::Sched(_) => Reply::Error { code: C::Internal, detail: 0 },
        }
    }

    /// Parses a checked message as a reply.
    ///
    /// # Errors
    /// Any [`WireError`]; a request op is [`WireError::UnknownOp`].
    pub fn parse<T: AsRef<[u8]>>(m: &Message<T>) -> Result<Reply, WireError> {
        m.check()?;
        let mut r = Reader { b: m.body() };
        let rep = match m.op() {
            op::GRANTED => {
                let session = SessionId::from_raw(r.u64()?);
                let n = usize::from(r.u8()?);
                let mut added = Vec::with_capacity(n.min(r.b.len() / 8));
                for _ in 0..n {
                    added.push(VpId::from_raw(r.u64()?));
                }
                Reply::Granted { session, added }
            }
            op::CLOSED => {
                let session = SessionId::from_raw(r.u64()?);
                let c = r.u8()?;
                let reason = CloseReason::from_code(c).ok_or(WireError::UnknownCode(c))?;
                Reply::Closed { session, reason, account: r.account()? }
            }
            op::SESSIONS => {
                let n = usize::from(r.u8()?);
                let mut v = Vec::with_capacity(n.min(r.b.len() / (41 + ACCOUNT_LEN)));
                for _ in 0..n {
                    let session = SessionId::from_raw(r.u64()?);
                    let (share_ppm, heap_bytes, tx, rx) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
                    let account = r.account()?;
                    let k = usize::from(r.u8()?);
                    let mut vps = Vec::with_capacity(k.min(r.b.len() / (8 + PARAMS_LEN)));
                    for _ in 0..k {
                        vps.push((VpId::from_raw(r.u64()?), r.params()?));
                    }
                    v.push(SessionSummary {
                        session,
                        share_ppm,
                        heap_bytes,
                        tx_bytes_per_sec: tx,
                        rx_bytes_per_sec: rx,
                        account,
                        vps,
                    });
                }
                Reply::Sessions(v)
            }
            op::BAD_VP => Reply::BadVp {
                params: VpParams { slice_ns: r.u64()?, period_ns: r.u64()?, extra: false },
                min_period_ns: r.u64()?,
                max_period_ns: r.u64()?,
                min_slice_ns: r.u64()?,
            },
            op::REFUSED => {
                let c = r.u8()?;
                let resource = Resource::from_code(c).ok_or(WireError::UnknownCode(c))?;
                let c = r.u8()?;
                let by = Limit::from_code(c).ok_or(WireError::UnknownCode(c))?;
                Reply::Refused { resource, by, asked: r.u64()?, left: r.u64()?, allowed: r.u64()? }
            }
            op::ERROR => {
                let c = r.u8()?;
                let code = ErrorCode::from_code(c).ok_or(WireError::UnknownCode(c))?;
                Reply::Error { code, detail: r.u64()? }
            }
            o => return Err(WireError::UnknownOp(o)),
        };
        r.finish()?;
        Ok(rep)
    }

    /// Parses bytes holding exactly one reply.
    ///
    /// # Errors
    /// Any [`WireError`].
    pub fn parse_bytes(b: &[u8]) -> Result<Reply, WireError> {
        Reply::parse(&Message::new_unchecked(b))
    }

    /// Length of the emitted message.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN
            + match self {
                Reply::Granted { added, .. } => 9 + 8 * added.len(),
                Reply::Closed { .. } => 9 + ACCOUNT_LEN,
                Reply::Sessions(v) => {
                    1 + v.iter().map(|s| 41 + ACCOUNT_LEN + (8 + PARAMS_LEN) * s.vps.len()).sum::<usize>()
                }
                Reply::BadVp { .. } => 40,
                Reply::Refused { .. } => 26,
                Reply::Error { .. } => 9,
            }
    }

    fn body(&self) -> Result<(u8, Vec<u8>), WireError> {
        let mut w = Writer { v: Vec::with_capacity(self.buffer_len()) };
        let count = |n: usize| u8::try_from(n).map_err(|_| WireError::TooLong(n));
        let op = match self {
            Reply::Granted { session, added } => {
                w.u64(session.to_raw());
                w.u8(count(added.len())?);
                for vp in added {
                    w.u64(vp.to_raw());
                }
                op::GRANTED
            }
            Reply::Closed { session, reason, account } => {
                w.u64(session.to_raw());
                w.u8(*reason as u8);
                w.account(account);
                op::CLOSED
            }
            Reply::Sessions(v) => {
                w.u8(count(v.len())?);
                for s in v {
                    w.u64(s.session.to_raw());
                    for x in [s.share_ppm, s.heap_bytes, s.tx_bytes_per_sec, s.rx_bytes_per_sec] {
                        w.u64(x);
                    }
                    w.account(&s.account);
                    w.u8(count(s.vps.len())?);
                    for (vp, p) in &s.vps {
                        w.u64(vp.to_raw());
                        w.params(p);
                    }
                }
                op::SESSIONS
            }
            Reply::BadVp { params, min_period_ns, max_period_ns, min_slice_ns } => {
                for x in [params.slice_ns, params.period_ns, *min_period_ns, *max_period_ns, *min_slice_ns] {
                    w.u64(x);
                }
                op::BAD_VP
            }
            Reply::Refused { resource, by, asked, left, allowed } => {
                w.u8(*resource as u8);
                w.u8(*by as u8);
                for x in [*asked, *left, *allowed] {
                    w.u64(x);
                }
                op::REFUSED
            }
            Reply::Error { code, detail } => {
                w.u8(*code as u8);
                w.u64(*detail);
                op::ERROR
            }
        };
        Ok((op, w.v))
    }

    /// Writes the message to the front of `buf`; returns its length.
    ///
    /// # Errors
    /// [`WireError::BufferTooSmall`] or [`WireError::TooLong`].
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let need = self.buffer_len();
        if buf.len() < need {
            return Err(WireError::BufferTooSmall { need, have: buf.len() });
        }
        let (op, body) = self.body()?;
        frame(op, body, buf)
    }

    /// Emits into a new vector.
    ///
    /// # Errors
    /// As [`emit`](Self::emit).
    pub fn to_bytes(&self) -> Result<Vec<u8>, WireError> {
        to_vec(self.buffer_len(), |b| self.emit(b))
    }
}

/// Bad parameters from the scheduler never reach the wire: the node checks
/// VP bounds first. This maps them to [`ErrorCode::Internal`].
impl From<SchedError> for Reply {
    fn from(_: SchedError) -> Reply {
        Reply::Error { code: ErrorCode::Internal, detail: 0 }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const MS: u64 = 1_000_000;

    /// Close session 2.1 (generation 1, index 2).
    static CLOSE_BYTES: [u8; 12] = [0x12, 0x01, 0x00, 0x08, 0, 0, 0, 1, 0, 0, 0, 2];

    /// Open with a 3-byte credential, a heap reservation of 4096 bytes and
    /// one VP of 400 µs every 4 ms without extra.
    static OPEN_BYTES: [u8; 37] = [
        0x10, 0x01, 0x00, 0x21, // op, version, body length 33
        0x00, 0x03, b'c', b'r', b'd', // credential
        0x01, 0, 0, 0, 0, 0, 0, 0x10, 0x00, // heap present: 4096
        0x01, // one op
        0x01, 0, 0, 0, 0, 0, 0x06, 0x1a, 0x80, 0, 0, 0, 0, 0, 0x3d, 0x09, 0x00, 0x00, // add 400 µs / 4 ms
    ];

    fn open() -> Request {
        Request::Open {
            credential: b"crd".to_vec(),
            reservation: ReserveRequest {
                vps: vec![VpOp::Add(VpParams { slice_ns: 400_000, period_ns: 4 * MS, extra: false })],
                heap_bytes: Some(4096),
                ..ReserveRequest::default()
            },
        }
    }

    #[test]
    fn deconstruct_and_construct() {
        assert_eq!(Request::parse_bytes(&CLOSE_BYTES), Ok(Request::Close { session: SessionId::new(2, 1) }));
        assert_eq!(Request::Close { session: SessionId::new(2, 1) }.to_bytes().unwrap(), CLOSE_BYTES);
        assert_eq!(Request::parse_bytes(&OPEN_BYTES), Ok(open()));
        assert_eq!(open().to_bytes().unwrap(), OPEN_BYTES);
        let m = Message::new_checked(&OPEN_BYTES[..]).unwrap();
        assert_eq!((m.op(), m.version(), m.body_len()), (op::OPEN, VERSION, 33));
    }

    #[test]
    fn every_message_round_trips() {
        let vp = VpId::new(5, 2);
        let p = VpParams { slice_ns: MS, period_ns: 10 * MS, extra: true };
        let reqs = [
            open(),
            Request::Reserve {
                session: SessionId::new(3, 9),
                reservation: ReserveRequest {
                    vps: vec![VpOp::Change(vp, p), VpOp::Remove(VpId::new(6, 1)), VpOp::Add(p)],
                    heap_bytes: None,
                    tx_bytes_per_sec: Some(1),
                    rx_bytes_per_sec: Some(2),
                },
            },
            Request::List,
            Request::Show { session: SessionId::new(0, 1) },
        ];
        for r in reqs {
            let b = r.to_bytes().unwrap();
            assert_eq!(b.len(), r.buffer_len());
            assert_eq!(Request::parse_bytes(&b), Ok(r));
            assert_eq!(Reply::parse_bytes(&b), Err(WireError::UnknownOp(b[0])));
        }
        let account = Account { cpu_guaranteed_ns: 7, tx_bytes: 9, heap_byte_ns: 3_000_000_000, ..Account::default() };
        let replies = [
            Reply::Granted { session: SessionId::new(2, 1), added: vec![vp, VpId::new(7, 1)] },
            Reply::Closed { session: SessionId::new(2, 1), reason: CloseReason::CredentialExpired, account },
            Reply::Sessions(vec![SessionSummary {
                session: SessionId::new(2, 1),
                share_ppm: 100_000,
                heap_bytes: 1,
                tx_bytes_per_sec: 2,
                rx_bytes_per_sec: 3,
                account,
                vps: vec![(vp, p)],
            }]),
            Reply::Sessions(vec![]),
            Reply::BadVp {
                params: VpParams { slice_ns: 1, period_ns: 2, extra: false },
                min_period_ns: 3,
                max_period_ns: 4,
                min_slice_ns: 5,
            },
            Reply::Refused { resource: Resource::Cpu, by: Limit::Node, asked: 1, left: 2, allowed: 3 },
            Reply::Error { code: ErrorCode::VpNotYours, detail: vp.to_raw() },
        ];
        for r in replies {
            let b = r.to_bytes().unwrap();
            assert_eq!(b.len(), r.buffer_len());
            assert_eq!(Reply::parse_bytes(&b), Ok(r));
            assert_eq!(Request::parse_bytes(&b), Err(WireError::UnknownOp(b[0])));
        }
    }

    #[test]
    fn each_rejection() {
        let ok = CLOSE_BYTES;
        assert_eq!(Request::parse_bytes(&ok[..3]), Err(WireError::Truncated));
        let mut b = ok;
        b[1] = 2;
        assert_eq!(Request::parse_bytes(&b), Err(WireError::BadVersion(2)));
        let mut b = ok;
        b[0] = 0x01;
        assert_eq!(Request::parse_bytes(&b), Err(WireError::UnknownOp(0x01)));
        assert_eq!(Request::parse_bytes(&ok[..11]), Err(WireError::LengthMismatch { declared: 8, actual: 7 }));
        let mut long = ok.to_vec();
        long.push(0);
        assert_eq!(Request::parse_bytes(&long), Err(WireError::LengthMismatch { declared: 8, actual: 9 }));
        long[3] = 9;
        assert_eq!(Request::parse_bytes(&long), Err(WireError::TrailingBytes(1)));
        let mut short = ok.to_vec();
        short.pop();
        short[3] = 7;
        assert_eq!(Request::parse_bytes(&short), Err(WireError::Truncated));
        // Reservation flags, op kinds, op counts, VP flags.
        let mut b = OPEN_BYTES;
        b[9] = 0x09;
        assert_eq!(Request::parse_bytes(&b), Err(WireError::UnknownFlags(0x09)));
        let mut b = OPEN_BYTES;
        b[19] = 4;
        assert_eq!(Request::parse_bytes(&b), Err(WireError::UnknownVpOp(4)));
        let mut b = OPEN_BYTES;
        b[18] = 33;
        assert_eq!(Request::parse_bytes(&b), Err(WireError::TooManyOps(33)));
        let mut b = OPEN_BYTES;
        b[36] = 2;
        assert_eq!(Request::parse_bytes(&b), Err(WireError::UnknownFlags(2)));
        // Unknown codes in replies.
        let e = Reply::Error { code: ErrorCode::Internal, detail: 0 }.to_bytes().unwrap();
        let mut b = e.clone();
        b[4] = 0;
        assert_eq!(Reply::parse_bytes(&b), Err(WireError::UnknownCode(0)));
        let r = Reply::Refused { resource: Resource::Heap, by: Limit::Credential, asked: 0, left: 0, allowed: 0 };
        let mut b = r.to_bytes().unwrap();
        b[5] = 3;
        assert_eq!(Reply::parse_bytes(&b), Err(WireError::UnknownCode(3)));
        // Emit limits.
        let many = ReserveRequest { vps: vec![VpOp::Remove(VpId::new(1, 1)); 33], ..ReserveRequest::default() };
        assert_eq!(
            Request::Reserve { session: SessionId::new(2, 1), reservation: many }.to_bytes(),
            Err(WireError::TooManyOps(33))
        );
        let big = Request::Open { credential: vec![0; 70_000], reservation: ReserveRequest::default() };
        assert_eq!(big.to_bytes(), Err(WireError::TooLong(70_000)));
        let mut small = [0u8; 5];
        assert_eq!(Request::List.emit(&mut small[..3]), Err(WireError::BufferTooSmall { need: 4, have: 3 }));
        assert_eq!(Request::List.emit(&mut small), Ok(4));
    }

    #[test]
    fn errors_map_to_replies() {
        let vp = VpId::new(4, 4);
        assert_eq!(
            Reply::error(&RcaneError::Vp(vp, HandleError::NotYours)),
            Reply::Error { code: ErrorCode::VpNotYours, detail: vp.to_raw() }
        );
        let refused =
            AdmissionError::Refused { resource: Resource::Cpu, by: Limit::Node, asked: 5, left: 4, allowed: 9 };
        assert_eq!(
            Reply::error(&refused.into()),
            Reply::Refused { resource: Resource::Cpu, by: Limit::Node, asked: 5, left: 4, allowed: 9 }
        );
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_code(c as u8), Some(c));
        }
    }
}
