//! The recovery protocol (AEGIS's `Recover`, SANE §4.1.1): fetching a good
//! copy of a component or of the metadata from a trusted repository, which
//! may be a peer node. Sans-I/O: messages and `now` in, messages out.
//!
//! The requester pulls a resource in chunks, one request at a time, so a
//! source can never push more than was asked for. Every message travels
//! inside an authenticated channel (the node's security association with
//! the peer: an ANEP `CONTROL` message, `docs/boot.md`); integrity does not
//! depend on the channel, because every copy is verified against the signed
//! metadata before it is used or stored.
//!
//! # Wire format
//!
//! ```text
//!  0      1       2               4                  8
//! +------+-------+---------------+------------------+
//! | kind | flags | reserved (0)  | request id (BE)  |   header, 8 bytes
//! +------+-------+---------------+------------------+
//! kind 1 FETCH: offset (4) | max (2, 1..=1024) | name length (1) | name
//! kind 2 DATA:  offset (4) | total length (4) | data length (2) | data (≤ 1024)
//! kind 3 ERROR: code (1): 1 not found, 2 refused, 3 bad request, 4 busy
//! ```
//!
//! All integers big-endian; flags and reserved bytes zero; no trailing
//! bytes. A name is a component target (`node/layer/file`) or
//! `metadata/<file>` (`timestamp.json`, `snapshot.json`, `targets.json`,
//! `N.root.json`). After [`Message::new_checked`] succeeds no accessor
//! panics.
//!
//! # Bounds (TUF §1.5.2)
//!
//! - *Endless data*: the requester knows the exact signed length of a
//!   component (or a fixed upper bound for metadata); a `DATA` whose total
//!   or offset disagrees, or that holds more than asked for, ends the attempt.
//! - *Slow retrieval*: each request has a timeout and each attempt a
//!   deadline; a late reply carries an old request id and is ignored.
//! - Attempts are limited; when they run out the fetch gives up and the
//!   operator's policy decides what the node does.

use crate::layer::{ComponentName, valid_component};

/// Header length.
pub const HEADER_LEN: usize = 8;
/// Most data bytes in one `DATA` message (keeps it inside one link MTU).
pub const MAX_CHUNK: u16 = 1024;
/// Longest resource name.
pub const MAX_NAME: usize = 240;
/// Longest message.
pub const MAX_MESSAGE: usize = HEADER_LEN + 10 + MAX_CHUNK as usize;

mod field {
    pub const KIND: usize = 0;
    pub const FLAGS: usize = 1;
    pub const RESERVED: core::ops::Range<usize> = 2..4;
    pub const ID: core::ops::Range<usize> = 4..8;
    pub const OFFSET: core::ops::Range<usize> = 8..12;
    // FETCH
    pub const MAX: core::ops::Range<usize> = 12..14;
    pub const NAME_LEN: usize = 14;
    pub const NAME: usize = 15;
    // DATA
    pub const TOTAL: core::ops::Range<usize> = 12..16;
    pub const DATA_LEN: core::ops::Range<usize> = 16..18;
    pub const DATA: usize = 18;
    // ERROR
    pub const CODE: usize = 8;
}

/// Message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Ask for a chunk of a resource.
    Fetch = 1,
    /// A chunk.
    Data = 2,
    /// A refusal.
    Error = 3,
}

/// Why a source refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ErrorCode {
    /// It has no such resource.
    NotFound = 1,
    /// It will not serve it (a secret, or not a name it serves).
    Refused = 2,
    /// The request was malformed.
    BadRequest = 3,
    /// Try later.
    Busy = 4,
}

impl ErrorCode {
    fn from_u8(b: u8) -> Option<ErrorCode> {
        Some(match b {
            1 => ErrorCode::NotFound,
            2 => ErrorCode::Refused,
            3 => ErrorCode::BadRequest,
            4 => ErrorCode::Busy,
            _ => return None,
        })
    }
}

/// Why a message does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Shorter than its kind requires.
    #[error("truncated recovery message")]
    Truncated,
    /// Longer than its fields say, or than [`MAX_MESSAGE`].
    #[error("recovery message has trailing bytes or is oversized")]
    Trailing,
    /// Unknown kind.
    #[error("unknown recovery message kind {0}")]
    BadKind(u8),
    /// Flags or reserved bytes not zero.
    #[error("recovery message flags or reserved bytes are not zero")]
    Reserved,
    /// `max` of zero or above [`MAX_CHUNK`], or more data than [`MAX_CHUNK`].
    #[error("recovery chunk size out of range")]
    ChunkSize,
    /// A name that is neither a component target nor `metadata/<file>`.
    #[error("bad resource name")]
    BadName,
    /// A data chunk beyond the total length.
    #[error("data beyond the resource's total length")]
    BeyondTotal,
    /// Unknown error code.
    #[error("unknown recovery error code {0}")]
    BadCode(u8),
}

/// A checked view over a recovery message.
#[derive(Debug, Clone, Copy)]
pub struct Message<T: AsRef<[u8]>> {
    buffer: T,
}

fn be16(b: &[u8], r: core::ops::Range<usize>) -> u16 {
    b.get(r).and_then(|s| <[u8; 2]>::try_from(s).ok()).map(u16::from_be_bytes).unwrap_or(0)
}
fn be32(b: &[u8], r: core::ops::Range<usize>) -> u32 {
    b.get(r).and_then(|s| <[u8; 4]>::try_from(s).ok()).map(u32::from_be_bytes).unwrap_or(0)
}

impl<T: AsRef<[u8]>> Message<T> {
    /// Wraps without checking.
    pub fn new_unchecked(buffer: T) -> Message<T> {
        Message { buffer }
    }

    /// Wraps and checks lengths and framing ([`Message::check_len`]).
    pub fn new_checked(buffer: T) -> Result<Message<T>, WireError> {
        let m = Message::new_unchecked(buffer);
        m.check_len()?;
        Ok(m)
    }

    /// Checks that every field the kind has is present and nothing follows.
    pub fn check_len(&self) -> Result<(), WireError> {
        let b = self.buffer.as_ref();
        if b.len() > MAX_MESSAGE {
            return Err(WireError::Trailing);
        }
        let Some(&kind) = b.get(field::KIND) else { return Err(WireError::Truncated) };
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let want = match kind {
            1 => {
                let Some(&n) = b.get(field::NAME_LEN) else { return Err(WireError::Truncated) };
                field::NAME + n as usize
            }
            2 => {
                if b.len() < field::DATA {
                    return Err(WireError::Truncated);
                }
                field::DATA + be16(b, field::DATA_LEN) as usize
            }
            3 => field::CODE + 1,
            k => return Err(WireError::BadKind(k)),
        };
        match b.len().cmp(&want) {
            core::cmp::Ordering::Less => Err(WireError::Truncated),
            core::cmp::Ordering::Greater => Err(WireError::Trailing),
            core::cmp::Ordering::Equal => Ok(()),
        }
    }

    /// The kind byte.
    pub fn kind(&self) -> u8 {
        self.buffer.as_ref()[field::KIND]
    }
    /// Flags and reserved bytes are all zero.
    pub fn reserved_zero(&self) -> bool {
        let b = self.buffer.as_ref();
        b[field::FLAGS] == 0 && b[field::RESERVED].iter().all(|&x| x == 0)
    }
    /// The request id.
    pub fn id(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ID)
    }
    /// The offset (FETCH, DATA).
    pub fn offset(&self) -> u32 {
        be32(self.buffer.as_ref(), field::OFFSET)
    }
    /// Most bytes wanted (FETCH).
    pub fn max(&self) -> u16 {
        be16(self.buffer.as_ref(), field::MAX)
    }
    /// The name bytes (FETCH).
    pub fn name(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let n = b[field::NAME_LEN] as usize;
        &b[field::NAME..field::NAME + n]
    }
    /// The resource's total length (DATA).
    pub fn total(&self) -> u32 {
        be32(self.buffer.as_ref(), field::TOTAL)
    }
    /// The data (DATA).
    pub fn data(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[field::DATA..]
    }
    /// The error code byte (ERROR).
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Message<T> {
    fn header(&mut self, kind: Kind, id: u32) {
        let b = self.buffer.as_mut();
        b[field::KIND] = kind as u8;
        b[field::FLAGS] = 0;
        b[field::RESERVED].fill(0);
        b[field::ID].copy_from_slice(&id.to_be_bytes());
    }
}

/// Whether `name` may be requested: a component target, or
/// `metadata/<file>` with a plain file name.
pub fn valid_name(name: &str) -> bool {
    if name.len() > MAX_NAME {
        return false;
    }
    match name.strip_prefix("metadata/") {
        Some(f) => valid_component(f),
        None => ComponentName::parse(name).is_ok(),
    }
}

/// A parsed recovery message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr<'a> {
    /// Ask for up to `max` bytes of `name` from `offset`.
    Fetch {
        /// Request id (echoed in the reply).
        id: u32,
        /// First byte wanted.
        offset: u32,
        /// Most bytes wanted.
        max: u16,
        /// The resource.
        name: &'a str,
    },
    /// A chunk of a resource.
    Data {
        /// The request's id.
        id: u32,
        /// Where the chunk starts.
        offset: u32,
        /// The resource's whole length.
        total: u32,
        /// The bytes.
        data: &'a [u8],
    },
    /// A refusal.
    Error {
        /// The request's id.
        id: u32,
        /// Why.
        code: ErrorCode,
    },
}

impl<'a> Repr<'a> {
    /// Parses a checked message, applying the semantic rules.
    pub fn parse(m: &Message<&'a [u8]>) -> Result<Repr<'a>, WireError> {
        m.check_len()?;
        if !m.reserved_zero() {
            return Err(WireError::Reserved);
        }
        let id = m.id();
        let b: &'a [u8] = m.buffer;
        match m.kind() {
            1 => {
                let max = m.max();
                if max == 0 || max > MAX_CHUNK {
                    return Err(WireError::ChunkSize);
                }
                let n = b[field::NAME_LEN] as usize;
                let name = core::str::from_utf8(&b[field::NAME..field::NAME + n]).map_err(|_| WireError::BadName)?;
                if !valid_name(name) {
                    return Err(WireError::BadName);
                }
                Ok(Repr::Fetch { id, offset: m.offset(), max, name })
            }
            2 => {
                let data = &b[field::DATA..];
                if data.len() > MAX_CHUNK as usize {
                    return Err(WireError::ChunkSize);
                }
                let (offset, total) = (m.offset(), m.total());
                if u64::from(offset) + data.len() as u64 > u64::from(total) {
                    return Err(WireError::BeyondTotal);
                }
                Ok(Repr::Data { id, offset, total, data })
            }
            3 => {
                let c = m.code();
                Ok(Repr::Error { id, code: ErrorCode::from_u8(c).ok_or(WireError::BadCode(c))? })
            }
            k => Err(WireError::BadKind(k)),
        }
    }

    /// Bytes [`Repr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Repr::Fetch { name, .. } => field::NAME + name.len(),
            Repr::Data { data, .. } => field::DATA + data.len(),
            Repr::Error { .. } => field::CODE + 1,
        }
    }

    /// Writes the message into `m` (at least [`Repr::buffer_len`] bytes).
    ///
    /// # Panics
    /// If the buffer is shorter than [`Repr::buffer_len`], or a name is
    /// longer than 255 bytes or data longer than 65535 (callers build
    /// `Repr`s from valid names and chunks).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, m: &mut Message<T>) {
        match *self {
            Repr::Fetch { id, offset, max, name } => {
                m.header(Kind::Fetch, id);
                let b = m.buffer.as_mut();
                b[field::OFFSET].copy_from_slice(&offset.to_be_bytes());
                b[field::MAX].copy_from_slice(&max.to_be_bytes());
                b[field::NAME_LEN] = name.len() as u8;
                b[field::NAME..field::NAME + name.len()].copy_from_slice(name.as_bytes());
            }
            Repr::Data { id, offset, total, data } => {
                m.header(Kind::Data, id);
                let b = m.buffer.as_mut();
                b[field::OFFSET].copy_from_slice(&offset.to_be_bytes());
                b[field::TOTAL].copy_from_slice(&total.to_be_bytes());
                b[field::DATA_LEN].copy_from_slice(&(data.len() as u16).to_be_bytes());
                b[field::DATA..field::DATA + data.len()].copy_from_slice(data);
            }
            Repr::Error { id, code } => {
                m.header(Kind::Error, id);
                m.buffer.as_mut()[field::CODE] = code as u8;
            }
        }
    }

    /// The message as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut Message::new_unchecked(&mut v[..]));
        v
    }
}

/// Parses bytes as a recovery message.
pub fn parse(bytes: &[u8]) -> Result<Repr<'_>, WireError> {
    Repr::parse(&Message::new_checked(bytes)?)
}

/// What a repository has under a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup<'a> {
    /// These bytes.
    Found(&'a [u8]),
    /// Nothing.
    NotFound,
    /// Something it will not serve (a secret).
    Refused,
}

/// The responder: answers one request from what `lookup` finds. Stateless;
/// the caller rate-limits and authenticates. Returns `None` for bytes that
/// are not a request (nothing is sent back to garbage).
pub fn serve<'s>(request: &[u8], lookup: impl FnOnce(&str) -> Lookup<'s>) -> Option<Vec<u8>> {
    let r = match parse(request) {
        Ok(r) => r,
        Err(WireError::BadName | WireError::ChunkSize | WireError::Reserved) => {
            let m = Message::new_checked(request).ok()?;
            return Some(Repr::Error { id: m.id(), code: ErrorCode::BadRequest }.to_vec());
        }
        Err(_) => return None,
    };
    let Repr::Fetch { id, offset, max, name } = r else { return None };
    let reply = match lookup(name) {
        Lookup::Found(bytes) => match u32::try_from(bytes.len()) {
            Ok(total) if offset <= total => {
                let start = offset as usize;
                let end = bytes.len().min(start + usize::from(max.min(MAX_CHUNK)));
                Repr::Data { id, offset, total, data: bytes.get(start..end).unwrap_or(&[]) }.to_vec()
            }
            _ => Repr::Error { id, code: ErrorCode::BadRequest }.to_vec(),
        },
        Lookup::NotFound => Repr::Error { id, code: ErrorCode::NotFound }.to_vec(),
        Lookup::Refused => Repr::Error { id, code: ErrorCode::Refused }.to_vec(),
    };
    Some(reply)
}

/// How much a fetch may receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Exactly this many bytes (a component: its signed length).
    Exact(u64),
    /// At most this many (metadata whose length is not known yet).
    AtMost(u64),
}

impl Bound {
    fn admits(self, total: u64) -> bool {
        match self {
            Bound::Exact(n) => total == n,
            Bound::AtMost(n) => total <= n,
        }
    }
}

/// Timeouts and attempt limits of a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimits {
    /// Bytes asked for per request (1..=[`MAX_CHUNK`]).
    pub chunk: u16,
    /// A request unanswered this long ends the attempt (slow retrieval).
    pub request_timeout_ms: u64,
    /// An attempt not complete this long after it started ends (slow retrieval).
    pub attempt_deadline_ms: u64,
    /// Attempts in all, over all sources in turn; then the fetch gives up.
    pub max_attempts: u32,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits { chunk: MAX_CHUNK, request_timeout_ms: 2_000, attempt_deadline_ms: 30_000, max_attempts: 3 }
    }
}

/// Why an attempt (or the whole fetch) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The source did not answer a request in time.
    #[error("source {from} did not answer within {ms} ms (slow retrieval)")]
    Timeout {
        /// The source.
        from: usize,
        /// The timeout.
        ms: u64,
    },
    /// The attempt's deadline passed.
    #[error("source {from} did not complete within {ms} ms (slow retrieval)")]
    Deadline {
        /// The source.
        from: usize,
        /// The deadline.
        ms: u64,
    },
    /// The source refused.
    #[error("source {from} refused: {code:?}")]
    Refused {
        /// The source.
        from: usize,
        /// Its code.
        code: ErrorCode,
    },
    /// The source announced a size the bound does not admit (endless data).
    #[error("source {from} announced {total} bytes, outside the bound {bound:?} (endless data)")]
    Size {
        /// The source.
        from: usize,
        /// Announced total.
        total: u64,
        /// The bound.
        bound: Bound,
    },
    /// A reply that does not fit the request (offset, size, total changed).
    #[error("source {from} sent a reply that does not fit the request")]
    BadReply {
        /// The source.
        from: usize,
    },
    /// The copy did not verify against the signed metadata.
    #[error("source {from} served a copy that failed verification: {reason}")]
    BadCopy {
        /// The source.
        from: usize,
        /// Why.
        reason: String,
    },
    /// Every attempt failed; the last failure is given.
    #[error("gave up after {attempts} attempt(s); last: {last}")]
    GaveUp {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: Box<FetchError>,
    },
    /// No source is configured.
    #[error("no recovery source is configured")]
    NoSource,
    /// The component is a secret: never fetched from a repository.
    #[error("a secret (the node's key) is never fetched from a repository")]
    Secret,
}

/// A reply that was not taken (counted by the caller; the fetch goes on).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Ignored {
    /// Does not parse.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// From another source than the one asked, or for an old request.
    #[error("reply from source {from} for request {id} was not expected")]
    Unexpected {
        /// The source.
        from: usize,
        /// The id it carried.
        id: u32,
    },
    /// The fetch is not waiting for anything.
    #[error("no request in flight")]
    Idle,
}

/// What the caller must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send `msg` to source `source`.
    Send {
        /// The source.
        source: usize,
        /// The request.
        msg: Vec<u8>,
    },
    /// The whole resource arrived from `source`: verify it, then call
    /// [`Fetch::accept`] or [`Fetch::reject`].
    Complete {
        /// The source.
        source: usize,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// Every attempt failed.
    GaveUp(FetchError),
}

/// One step of a fetch, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FetchEvent {
    /// An attempt started at a source.
    Attempt {
        /// The attempt number (1-based).
        attempt: u32,
        /// The source.
        source: usize,
    },
    /// An attempt failed.
    AttemptFailed(FetchError),
    /// A complete copy arrived.
    Received {
        /// The source.
        source: usize,
        /// Bytes.
        len: usize,
    },
    /// The copy was accepted.
    Accepted {
        /// The source.
        source: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing in flight: the next poll sends.
    Ready,
    /// A request is in flight since the time given.
    Waiting(u64),
    /// A complete copy is with the caller for verification.
    Verifying,
    /// Finished (accepted or given up).
    Done,
}

/// Fetching one resource from a list of sources: the requester's side.
#[derive(Debug, Clone)]
pub struct Fetch {
    name: String,
    bound: Bound,
    limits: FetchLimits,
    sources: usize,
    source: usize,
    attempts: u32,
    id: u32,
    started: u64,
    total: Option<u64>,
    buf: Vec<u8>,
    phase: Phase,
    events: Vec<FetchEvent>,
}

impl Fetch {
    /// A fetch of `name` (a component target or `metadata/<file>`) from
    /// sources `0..sources`, starting with request id `first_id`.
    ///
    /// # Errors
    /// [`FetchError::NoSource`] if `sources` is zero.
    pub fn new(
        name: &str,
        bound: Bound,
        sources: usize,
        limits: FetchLimits,
        first_id: u32,
        now_ms: u64,
    ) -> Result<Fetch, FetchError> {
        if sources == 0 {
            return Err(FetchError::NoSource);
        }
        let limits =
            FetchLimits { chunk: limits.chunk.clamp(1, MAX_CHUNK), max_attempts: limits.max_attempts.max(1), ..limits };
        let mut f = Fetch {
            name: name.to_string(),
            bound,
            limits,
            sources,
            source: 0,
            attempts: 1,
            id: first_id,
            started: now_ms,
            total: None,
            buf: Vec::new(),
            phase: Phase::Ready,
            events: Vec::new(),
        };
        f.events.push(FetchEvent::Attempt { attempt: 1, source: 0 });
        Ok(f)
    }

    /// The resource's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Attempts started so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Takes the events since the last call.
    pub fn events(&mut self) -> Vec<FetchEvent> {
        core::mem::take(&mut self.events)
    }

    /// When the caller should poll again at the latest (`None`: only on a reply).
    pub fn next_timer(&self) -> Option<u64> {
        match self.phase {
            Phase::Ready => Some(self.started),
            Phase::Waiting(at) => {
                Some((at + self.limits.request_timeout_ms).min(self.started + self.limits.attempt_deadline_ms))
            }
            Phase::Verifying | Phase::Done => None,
        }
    }

    /// Advances time: sends the next request, or ends an attempt that timed out.
    #[must_use]
    pub fn poll(&mut self, now_ms: u64) -> Option<Step> {
        match self.phase {
            Phase::Ready => {
                let remaining = match self.total {
                    Some(t) => t.saturating_sub(self.buf.len() as u64),
                    None => u64::from(self.limits.chunk),
                };
                let max = remaining.clamp(1, u64::from(self.limits.chunk)) as u16;
                let msg = Repr::Fetch { id: self.id, offset: self.buf.len() as u32, max, name: &self.name }.to_vec();
                self.phase = Phase::Waiting(now_ms);
                Some(Step::Send { source: self.source, msg })
            }
            Phase::Waiting(at) => {
                if now_ms.saturating_sub(self.started) >= self.limits.attempt_deadline_ms {
                    let e = FetchError::Deadline { from: self.source, ms: self.limits.attempt_deadline_ms };
                    return self.fail(e, now_ms);
                }
                if now_ms.saturating_sub(at) >= self.limits.request_timeout_ms {
                    let e = FetchError::Timeout { from: self.source, ms: self.limits.request_timeout_ms };
                    return self.fail(e, now_ms);
                }
                None
            }
            Phase::Verifying | Phase::Done => None,
        }
    }

    /// Takes a reply from `source`.
    ///
    /// # Errors
    /// [`Ignored`] for a reply that is malformed, unexpected or late; the
    /// fetch goes on as if it had not arrived.
    pub fn handle(&mut self, source: usize, msg: &[u8], now_ms: u64) -> Result<Option<Step>, Ignored> {
        let r = parse(msg)?;
        let Phase::Waiting(_) = self.phase else { return Err(Ignored::Idle) };
        let id = match r {
            Repr::Fetch { id, .. } | Repr::Data { id, .. } | Repr::Error { id, .. } => id,
        };
        if source != self.source || id != self.id {
            return Err(Ignored::Unexpected { from: source, id });
        }
        match r {
            Repr::Fetch { .. } => Ok(self.fail(FetchError::BadReply { from: source }, now_ms)),
            Repr::Error { code, .. } => Ok(self.fail(FetchError::Refused { from: source, code }, now_ms)),
            Repr::Data { offset, total, data, .. } => {
                let total = u64::from(total);
                if !self.bound.admits(total) {
                    return Ok(self.fail(FetchError::Size { from: source, total, bound: self.bound }, now_ms));
                }
                let asked = self.total.map_or(u64::from(self.limits.chunk), |t| {
                    t.saturating_sub(self.buf.len() as u64).min(u64::from(self.limits.chunk))
                });
                if self.total.is_some_and(|t| t != total)
                    || offset as usize != self.buf.len()
                    || data.len() as u64 > asked
                    || (data.is_empty() && (self.buf.len() as u64) < total)
                {
                    return Ok(self.fail(FetchError::BadReply { from: source }, now_ms));
                }
                self.total = Some(total);
                self.buf.extend_from_slice(data);
                if self.buf.len() as u64 == total {
                    self.phase = Phase::Verifying;
                    self.events.push(FetchEvent::Received { source, len: self.buf.len() });
                    return Ok(Some(Step::Complete { source, bytes: core::mem::take(&mut self.buf) }));
                }
                self.phase = Phase::Ready;
                self.id = self.id.wrapping_add(1);
                Ok(self.poll(now_ms))
            }
        }
    }

    /// The caller verified the copy: the fetch is done.
    pub fn accept(&mut self) {
        if self.phase == Phase::Verifying {
            self.events.push(FetchEvent::Accepted { source: self.source });
        }
        self.phase = Phase::Done;
    }

    /// The copy did not verify: try the next attempt (or give up).
    #[must_use]
    pub fn reject(&mut self, reason: &str, now_ms: u64) -> Option<Step> {
        if self.phase != Phase::Verifying {
            return None;
        }
        self.fail(FetchError::BadCopy { from: self.source, reason: reason.to_string() }, now_ms)
    }

    fn fail(&mut self, e: FetchError, now_ms: u64) -> Option<Step> {
        self.events.push(FetchEvent::AttemptFailed(e.clone()));
        if self.attempts >= self.limits.max_attempts {
            self.phase = Phase::Done;
            return Some(Step::GaveUp(FetchError::GaveUp { attempts: self.attempts, last: Box::new(e) }));
        }
        self.attempts += 1;
        self.source = (self.source + 1) % self.sources;
        self.id = self.id.wrapping_add(1);
        self.started = now_ms;
        self.total = None;
        self.buf.clear();
        self.phase = Phase::Ready;
        self.events.push(FetchEvent::Attempt { attempt: self.attempts, source: self.source });
        self.poll(now_ms)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A FETCH of `b/config/node.toml` from offset 1024, up to 1024 bytes, id 7.
    static FETCH_BYTES: [u8; 33] = [
        1, 0, 0, 0, 0, 0, 0, 7, 0, 0, 4, 0, 4, 0, 18, b'b', b'/', b'c', b'o', b'n', b'f', b'i', b'g', b'/', b'n', b'o',
        b'd', b'e', b'.', b't', b'o', b'm', b'l',
    ];
    /// DATA for id 7: offset 2, total 5, "lo".
    static DATA_BYTES: [u8; 20] = [2, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 2, 0, 0, 0, 5, 0, 2, b'l', b'o'];
    /// ERROR for id 9: not found.
    static ERROR_BYTES: [u8; 9] = [3, 0, 0, 0, 0, 0, 0, 9, 1];

    #[test]
    fn deconstruct() {
        assert_eq!(parse(&FETCH_BYTES), Ok(Repr::Fetch { id: 7, offset: 1024, max: 1024, name: "b/config/node.toml" }));
        assert_eq!(parse(&DATA_BYTES), Ok(Repr::Data { id: 7, offset: 2, total: 5, data: b"lo" }));
        assert_eq!(parse(&ERROR_BYTES), Ok(Repr::Error { id: 9, code: ErrorCode::NotFound }));
    }

    #[test]
    fn construct() {
        assert_eq!(Repr::Fetch { id: 7, offset: 1024, max: 1024, name: "b/config/node.toml" }.to_vec(), FETCH_BYTES);
        assert_eq!(Repr::Data { id: 7, offset: 2, total: 5, data: b"lo" }.to_vec(), DATA_BYTES);
        assert_eq!(Repr::Error { id: 9, code: ErrorCode::NotFound }.to_vec(), ERROR_BYTES);
    }

    #[test]
    fn rejections() {
        assert_eq!(parse(&[]), Err(WireError::Truncated));
        assert_eq!(parse(&FETCH_BYTES[..20]), Err(WireError::Truncated));
        let mut long = FETCH_BYTES.to_vec();
        long.push(0);
        assert_eq!(parse(&long), Err(WireError::Trailing));
        let mut k = ERROR_BYTES;
        k[0] = 9;
        assert_eq!(parse(&k), Err(WireError::BadKind(9)));
        let mut r = ERROR_BYTES;
        r[1] = 1;
        assert_eq!(parse(&r), Err(WireError::Reserved));
        let mut c = ERROR_BYTES;
        c[8] = 77;
        assert_eq!(parse(&c), Err(WireError::BadCode(77)));
        let mut m = FETCH_BYTES;
        m[12..14].copy_from_slice(&0u16.to_be_bytes());
        assert_eq!(parse(&m), Err(WireError::ChunkSize));
        let mut n = FETCH_BYTES;
        n[17] = b'.';
        n[18] = b'.';
        n[19] = b'/';
        assert_eq!(parse(&n), Err(WireError::BadName), "b/..nfig: unknown layer");
        let bad = Repr::Fetch { id: 1, offset: 0, max: 1, name: "metadata/../x" }.to_vec();
        assert_eq!(parse(&bad), Err(WireError::BadName));
        let mut d = DATA_BYTES;
        d[15] = 3; // total 3 < offset 2 + 2
        assert_eq!(parse(&d), Err(WireError::BeyondTotal));
        let big = vec![0u8; MAX_MESSAGE + 1];
        assert_eq!(parse(&big), Err(WireError::Trailing));
    }

    #[test]
    fn serve_in_chunks() {
        let file = vec![7u8; 2500];
        let mut f = Fetch::new("b/config/node.toml", Bound::Exact(2500), 1, FetchLimits::default(), 1, 0).unwrap();
        let mut step = f.poll(0);
        let mut n = 0;
        loop {
            match step {
                Some(Step::Send { source, msg }) => {
                    n += 1;
                    let reply = serve(&msg, |name| {
                        assert_eq!(name, "b/config/node.toml");
                        Lookup::Found(&file)
                    })
                    .unwrap();
                    step = f.handle(source, &reply, 1).unwrap();
                }
                Some(Step::Complete { bytes, .. }) => {
                    assert_eq!(bytes, file);
                    f.accept();
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(n, 3, "1024 + 1024 + 452");
        assert!(f.events().contains(&FetchEvent::Accepted { source: 0 }));
    }
}
