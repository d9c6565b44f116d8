//! Control messages: what an authenticated user asks of a node, and the
//! node's typed answers. They travel as the payload of an ANEP
//! [`TYPE_CONTROL`](crate::anep::TYPE_CONTROL) datagram, only inside a
//! security association (the SA names the principal).
//!
//! ```text
//! load request   0x01 | name_len (1) | name | cred_len (4) | credential | code
//! pod load       0x02 | name_len (1) | name (1..) | on_fault (1: 0 reset, 1 retire, 2 rollback)
//!                     | min_fuel (8) | n_clients (1: 0 anyone, 1..=64) | clients (32 each)
//!                     | cred_len (4) | credential | code
//! code chunk     0x03 | total (4) | offset (4) | data (1..)
//! load reply     0x81 | 0x00 loaded         | module id (4)
//!                     | 0x01 already loaded | module id (4)
//!                     | 0x02 refused        | refusal kind (1) | reason (UTF-8)
//!                     | 0x03 staged         | bytes received (4)
//! ```
//!
//! **Code larger than one datagram** (a UDP datagram carries 64 KiB; modules
//! may be larger) goes ahead of its load in chunks: the principal sends
//! `code chunk`s of the code in order, from offset 0 (a chunk at offset 0
//! starts over), each answered `staged` with the bytes received so far, then
//! a load (or pod load) request whose code is **empty**, which loads the
//! staged code once it is complete and ends the staging either way. The node
//! keeps one staging per principal, bounded by its module size limit, in
//! total, and in time (docs/modules.md "Modules larger than one datagram").
//!
//! Integers are big-endian. A message must be exactly as long as its
//! fields; trailing bytes are refused (the code of a load request runs to
//! the end, so it has none). Until issue 13 the reply was free text
//! (`loaded m3`, `refused: ...`); the kinds and ids are now typed and the
//! text is only the human-readable reason.

/// Op byte of a load request.
pub const OP_LOAD: u8 = 0x01;
/// Op byte of a pod load request (Expert's pods, docs/pods.md); answered
/// with a load reply whose id is the pod's (`pN`).
pub const OP_POD_LOAD: u8 = 0x02;
/// Op byte of a chunk of code staged ahead of its load request.
pub const OP_CODE_CHUNK: u8 = 0x03;
/// Op byte of a load reply.
pub const OP_LOAD_REPLY: u8 = 0x81;
/// Longest module name.
pub const MAX_NAME: usize = 255;
/// Most principals a pod load may name as the only ones allowed to bind.
pub const MAX_POD_CLIENTS: usize = 64;
/// Longest reason text in a reply (longer ones are cut at a char boundary).
pub const MAX_REASON: usize = 1024;

/// A malformed control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Empty, or an op this node does not know.
    #[error("unknown control request {0:#04x}")]
    Unknown(u8),
    /// Shorter than its fields say.
    #[error("truncated control message")]
    Truncated,
    /// Longer than its fields say.
    #[error("control message has {0} trailing bytes")]
    Trailing(usize),
    /// The name is not UTF-8.
    #[error("module name is not UTF-8")]
    BadName,
    /// The reason text is not UTF-8.
    #[error("reason is not UTF-8")]
    BadText,
    /// An unknown reply status or refusal kind.
    #[error("unknown reply code {0:#04x}")]
    BadCode(u8),
    /// A field too long for its length prefix.
    #[error("{0} too long for its length field")]
    TooLong(&'static str),
    /// A pod load names more than [`MAX_POD_CLIENTS`] clients.
    #[error("a pod load names {0} clients (at most {MAX_POD_CLIENTS})")]
    TooManyClients(usize),
    /// A pod load's client list to emit is empty or not whole 32-byte keys.
    #[error("a pod load's client list must be one or more 32-byte keys")]
    BadClients,
}

/// A module load request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadRequest<'a> {
    /// The loader's name for the module, if any.
    pub name: Option<&'a str>,
    /// The credential (Biscuit bytes).
    pub credential: &'a [u8],
    /// The module's code.
    pub code: &'a [u8],
}

/// A piece of code staged ahead of its load request (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeChunk<'a> {
    /// The whole code's length, bytes (the same in every chunk).
    pub total: u32,
    /// Where `data` starts in the code.
    pub offset: u32,
    /// The bytes (at least one).
    pub data: &'a [u8],
}

/// What restores a pod that traps or is cut off (docs/pods.md "Faults").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum FaultPolicy {
    /// Instantiate it again from its code; bindings are dropped.
    #[default]
    Reset = 0,
    /// Unload it.
    Retire = 1,
    /// Put back its memory and globals from before the call (checked);
    /// bindings stay.
    Rollback = 2,
}

/// A pod load request: a protected module offering `<name>.<entry>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodLoadRequest<'a> {
    /// The pod's name (its offers are `<name>.<entry>`; not empty).
    pub name: &'a str,
    /// What restores the pod when it traps or is cut off.
    pub on_fault: FaultPolicy,
    /// Fuel a caller must have left for a call to enter the pod.
    pub min_fuel: u64,
    /// The only principals whose modules may bind to it: their 32-byte
    /// public keys, one after the other (at most [`MAX_POD_CLIENTS`]);
    /// `None`: any principal whose module's credential grants `pod`.
    pub clients: Option<&'a [u8]>,
    /// The credential (Biscuit bytes); it must grant `pod`.
    pub credential: &'a [u8],
    /// The pod's code.
    pub code: &'a [u8],
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Refusal {
    /// The request did not parse.
    BadRequest = 1,
    /// The node runs no modules.
    NoModules = 2,
    /// The SA names no principal the node knows.
    UnknownPrincipal = 3,
    /// The credential does not allow it (expired, wrong issuer, a right or
    /// a limit missing, ...).
    Denied = 4,
    /// The module itself was refused (malformed, forbidden import, too
    /// large, init failed, ...).
    Module = 5,
    /// A limit of the node or the principal was reached.
    Limit = 6,
}

impl Refusal {
    fn from_u8(b: u8) -> Result<Refusal, Error> {
        Ok(match b {
            1 => Refusal::BadRequest,
            2 => Refusal::NoModules,
            3 => Refusal::UnknownPrincipal,
            4 => Refusal::Denied,
            5 => Refusal::Module,
            6 => Refusal::Limit,
            b => return Err(Error::BadCode(b)),
        })
    }
}

/// The node's answer to a load request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadReply<'a> {
    /// Loaded as module `mN`.
    Loaded(u32),
    /// The same principal had loaded the same code under the same name:
    /// module `mN`, not loaded again.
    AlreadyLoaded(u32),
    /// Refused, with the kind and the human-readable reason.
    Refused(Refusal, &'a str),
    /// A code chunk was staged: the bytes of the code received so far.
    Staged(u32),
}

impl core::fmt::Display for LoadReply<'_> {
    /// The line users see (unchanged from the text replies of before).
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LoadReply::Loaded(id) => write!(f, "loaded m{id}"),
            LoadReply::AlreadyLoaded(id) => write!(f, "already loaded m{id}"),
            LoadReply::Refused(_, why) => write!(f, "refused: {why}"),
            LoadReply::Staged(n) => write!(f, "staged {n} bytes"),
        }
    }
}

/// A control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// User → node: load a module.
    Load(LoadRequest<'a>),
    /// User → node: load a pod.
    PodLoad(PodLoadRequest<'a>),
    /// User → node: a chunk of code for the next load request.
    CodeChunk(CodeChunk<'a>),
    /// Node → user: the answer.
    LoadReply(LoadReply<'a>),
}

/// A little reader in the style of rustls' codec: every `take` checks.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let (h, t) = self.0.split_at_checked(n).ok_or(Error::Truncated)?;
        self.0 = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, Error> {
        self.take(1).map(|b| b[0])
    }
    fn u64(&mut self) -> Result<u64, Error> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn u32(&mut self) -> Result<u32, Error> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.0)
    }
    fn end(&self) -> Result<(), Error> {
        if self.0.is_empty() { Ok(()) } else { Err(Error::Trailing(self.0.len())) }
    }
}

fn cut(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl<'a> Message<'a> {
    /// Parses a control message (the payload of a CONTROL datagram).
    pub fn parse(b: &'a [u8]) -> Result<Message<'a>, Error> {
        let mut r = Reader(b);
        let op = r.u8().map_err(|_| Error::Unknown(0))?;
        match op {
            OP_LOAD => {
                let nl = r.u8()? as usize;
                let name = r.take(nl)?;
                let cl = r.u32()? as usize;
                let credential = r.take(cl)?;
                let code = r.rest();
                let name =
                    if name.is_empty() { None } else { Some(core::str::from_utf8(name).map_err(|_| Error::BadName)?) };
                Ok(Message::Load(LoadRequest { name, credential, code }))
            }
            OP_POD_LOAD => {
                let nl = r.u8()? as usize;
                let name = r.take(nl)?;
                let on_fault = match r.u8()? {
                    0 => FaultPolicy::Reset,
                    1 => FaultPolicy::Retire,
                    2 => FaultPolicy::Rollback,
                    c => return Err(Error::BadCode(c)),
                };
                let min_fuel = r.u64()?;
                let clients = match r.u8()? as usize {
                    0 => None,
                    n if n > MAX_POD_CLIENTS => return Err(Error::TooManyClients(n)),
                    n => Some(r.take(32 * n)?),
                };
                let cl = r.u32()? as usize;
                let credential = r.take(cl)?;
                let code = r.rest();
                if name.is_empty() {
                    return Err(Error::BadName);
                }
                let name = core::str::from_utf8(name).map_err(|_| Error::BadName)?;
                Ok(Message::PodLoad(PodLoadRequest { name, on_fault, min_fuel, clients, credential, code }))
            }
            OP_CODE_CHUNK => {
                let total = r.u32()?;
                let offset = r.u32()?;
                let data = r.rest();
                if data.is_empty() {
                    return Err(Error::Truncated);
                }
                Ok(Message::CodeChunk(CodeChunk { total, offset, data }))
            }
            OP_LOAD_REPLY => {
                let reply = match r.u8()? {
                    0 => LoadReply::Loaded(r.u32()?),
                    1 => LoadReply::AlreadyLoaded(r.u32()?),
                    2 => {
                        let kind = Refusal::from_u8(r.u8()?)?;
                        let rest = r.rest();
                        if rest.len() > MAX_REASON {
                            return Err(Error::TooLong("reason"));
                        }
                        let text = core::str::from_utf8(rest).map_err(|_| Error::BadText)?;
                        LoadReply::Refused(kind, text)
                    }
                    3 => LoadReply::Staged(r.u32()?),
                    c => return Err(Error::BadCode(c)),
                };
                r.end()?;
                Ok(Message::LoadReply(reply))
            }
            op => Err(Error::Unknown(op)),
        }
    }

    /// Bytes [`emit`](Self::emit) writes.
    pub fn buffer_len(&self) -> usize {
        match self {
            Message::Load(l) => 1 + 1 + l.name.map_or(0, str::len) + 4 + l.credential.len() + l.code.len(),
            Message::PodLoad(l) => {
                1 + 1
                    + l.name.len()
                    + 1
                    + 8
                    + 1
                    + l.clients.map_or(0, <[u8]>::len)
                    + 4
                    + l.credential.len()
                    + l.code.len()
            }
            Message::CodeChunk(c) => 1 + 4 + 4 + c.data.len(),
            Message::LoadReply(LoadReply::Loaded(_) | LoadReply::AlreadyLoaded(_) | LoadReply::Staged(_)) => 6,
            Message::LoadReply(LoadReply::Refused(_, why)) => 3 + cut(why, MAX_REASON).len(),
        }
    }

    /// Appends the message to `out`.
    ///
    /// # Errors
    /// [`Error::TooLong`] for a name over 255 bytes or a credential over
    /// 4 GiB, [`Error::Truncated`] for a chunk without data (nothing is
    /// appended then).
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        match self {
            Message::Load(l) => {
                let name = l.name.unwrap_or("").as_bytes();
                let nl = u8::try_from(name.len()).map_err(|_| Error::TooLong("module name"))?;
                let cl = u32::try_from(l.credential.len()).map_err(|_| Error::TooLong("credential"))?;
                out.extend_from_slice(&[OP_LOAD, nl]);
                out.extend_from_slice(name);
                out.extend_from_slice(&cl.to_be_bytes());
                out.extend_from_slice(l.credential);
                out.extend_from_slice(l.code);
            }
            Message::PodLoad(l) => {
                let nl = u8::try_from(l.name.len()).map_err(|_| Error::TooLong("pod name"))?;
                let cl = u32::try_from(l.credential.len()).map_err(|_| Error::TooLong("credential"))?;
                if nl == 0 {
                    return Err(Error::BadName);
                }
                let clients = l.clients.unwrap_or_default();
                let n = clients.len() / 32;
                if clients.len() % 32 != 0 || l.clients.is_some_and(<[u8]>::is_empty) {
                    return Err(Error::BadClients);
                }
                if n > MAX_POD_CLIENTS {
                    return Err(Error::TooManyClients(n));
                }
                out.extend_from_slice(&[OP_POD_LOAD, nl]);
                out.extend_from_slice(l.name.as_bytes());
                out.push(l.on_fault as u8);
                out.extend_from_slice(&l.min_fuel.to_be_bytes());
                out.push(n as u8);
                out.extend_from_slice(clients);
                out.extend_from_slice(&cl.to_be_bytes());
                out.extend_from_slice(l.credential);
                out.extend_from_slice(l.code);
            }
            Message::CodeChunk(c) => {
                if c.data.is_empty() {
                    return Err(Error::Truncated);
                }
                out.push(OP_CODE_CHUNK);
                out.extend_from_slice(&c.total.to_be_bytes());
                out.extend_from_slice(&c.offset.to_be_bytes());
                out.extend_from_slice(c.data);
            }
            Message::LoadReply(r) => {
                out.push(OP_LOAD_REPLY);
                match r {
                    LoadReply::Loaded(id) => {
                        out.push(0);
                        out.extend_from_slice(&id.to_be_bytes());
                    }
                    LoadReply::AlreadyLoaded(id) => {
                        out.push(1);
                        out.extend_from_slice(&id.to_be_bytes());
                    }
                    LoadReply::Refused(kind, why) => {
                        out.extend_from_slice(&[2, *kind as u8]);
                        out.extend_from_slice(cut(why, MAX_REASON).as_bytes());
                    }
                    LoadReply::Staged(n) => {
                        out.push(3);
                        out.extend_from_slice(&n.to_be_bytes());
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: Message<'_>) {
        let mut v = Vec::new();
        m.emit(&mut v).expect("emit");
        assert_eq!(v.len(), m.buffer_len());
        assert_eq!(Message::parse(&v), Ok(m));
    }

    #[test]
    fn messages_round_trip() {
        round_trip(Message::Load(LoadRequest { name: Some("counter"), credential: b"cred", code: b"\0asm" }));
        round_trip(Message::Load(LoadRequest { name: None, credential: b"", code: b"x" }));
        round_trip(Message::Load(LoadRequest { name: Some("big"), credential: b"cred", code: b"" }));
        round_trip(Message::CodeChunk(CodeChunk { total: 200_000, offset: 65_536, data: b"\0asm" }));
        round_trip(Message::LoadReply(LoadReply::Staged(131_072)));
        round_trip(Message::PodLoad(PodLoadRequest {
            name: "aes",
            on_fault: FaultPolicy::Retire,
            min_fuel: 100_000,
            clients: None,
            credential: b"cred",
            code: b"\0asm",
        }));
        round_trip(Message::PodLoad(PodLoadRequest {
            name: "cache",
            on_fault: FaultPolicy::Rollback,
            min_fuel: 0,
            clients: Some(&[7u8; 64]),
            credential: b"c",
            code: b"",
        }));
        round_trip(Message::LoadReply(LoadReply::Loaded(3)));
        round_trip(Message::LoadReply(LoadReply::AlreadyLoaded(u32::MAX)));
        round_trip(Message::LoadReply(LoadReply::Refused(Refusal::Denied, "credential expired: block 0")));
        assert_eq!(LoadReply::Loaded(3).to_string(), "loaded m3");
        assert_eq!(LoadReply::Refused(Refusal::Module, "why").to_string(), "refused: why");
    }

    /// The load request bytes are those of issue 7's format.
    #[test]
    fn load_request_bytes() {
        let mut v = Vec::new();
        Message::Load(LoadRequest { name: Some("ab"), credential: b"c", code: b"z" }).emit(&mut v).expect("emit");
        assert_eq!(v, [1, 2, b'a', b'b', 0, 0, 0, 1, b'c', b'z']);
    }

    #[test]
    fn rejections() {
        let p = Message::parse;
        assert_eq!(p(&[]), Err(Error::Unknown(0)));
        assert_eq!(p(&[4]), Err(Error::Unknown(4)));
        assert_eq!(p(&[3]), Err(Error::Truncated));
        // Pod loads: no name, a bad fault policy, short fields.
        assert_eq!(p(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(Error::BadName));
        assert_eq!(p(&[2, 1, b'a', 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(Error::BadCode(7)));
        assert_eq!(p(&[2, 1, b'a', 0, 0, 0]), Err(Error::Truncated));
        assert_eq!(p(&[2, 1, b'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]), Err(Error::Truncated));
        assert_eq!(p(&[2, 1, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(Error::BadName));
        let empty = Message::PodLoad(PodLoadRequest {
            name: "",
            on_fault: FaultPolicy::Reset,
            min_fuel: 0,
            clients: None,
            credential: b"",
            code: b"",
        });
        assert_eq!(empty.emit(&mut Vec::new()), Err(Error::BadName));
        // Client lists: too many, truncated, and ones that cannot be emitted.
        let mut v = vec![2, 1, b'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 65];
        v.extend_from_slice(&[0; 65 * 32 + 4]);
        assert_eq!(p(&v), Err(Error::TooManyClients(65)));
        assert_eq!(p(&[2, 1, b'a', 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 9, 9]), Err(Error::Truncated));
        let with = |c: &'static [u8]| {
            Message::PodLoad(PodLoadRequest {
                name: "a",
                on_fault: FaultPolicy::Reset,
                min_fuel: 0,
                clients: Some(c),
                credential: b"",
                code: b"",
            })
            .emit(&mut Vec::new())
        };
        assert_eq!(with(b""), Err(Error::BadClients));
        assert_eq!(with(&[1; 33]), Err(Error::BadClients));
        assert_eq!(with(&[1; 65 * 32]), Err(Error::TooManyClients(65)));
        assert_eq!(p(&[1, 5, b'a']), Err(Error::Truncated));
        assert_eq!(p(&[1, 0, 0, 0, 0, 9, 1]), Err(Error::Truncated));
        assert_eq!(p(&[1, 1, 0xff, 0, 0, 0, 0]), Err(Error::BadName));
        assert_eq!(p(&[0x81, 0, 0, 0, 0]), Err(Error::Truncated));
        // A code chunk: its header whole, and at least one byte of data.
        assert_eq!(p(&[3, 0, 0, 0, 9, 0, 0, 0]), Err(Error::Truncated));
        assert_eq!(p(&[3, 0, 0, 0, 9, 0, 0, 0, 0]), Err(Error::Truncated));
        assert!(matches!(
            p(&[3, 0, 0, 0, 9, 0, 0, 0, 0, 7]),
            Ok(Message::CodeChunk(CodeChunk { total: 9, offset: 0, .. }))
        ));
        assert_eq!(p(&[0x81, 3, 0, 0, 1]), Err(Error::Truncated));
        assert_eq!(p(&[0x81, 3, 0, 0, 0, 1, 0]), Err(Error::Trailing(1)));
        assert_eq!(p(&[0x81, 0, 0, 0, 0, 1, 9]), Err(Error::Trailing(1)));
        assert_eq!(p(&[0x81, 7]), Err(Error::BadCode(7)));
        assert_eq!(p(&[0x81, 2, 99, b'x']), Err(Error::BadCode(99)));
        assert_eq!(p(&[0x81, 2, 4, 0xff]), Err(Error::BadText));
        let long = "é".repeat(MAX_REASON);
        let m = Message::LoadReply(LoadReply::Refused(Refusal::Denied, &long));
        let mut v = Vec::new();
        m.emit(&mut v).expect("emit");
        assert!(v.len() <= 3 + MAX_REASON && core::str::from_utf8(&v[3..]).is_ok(), "cut at a char boundary");
        let big = "n".repeat(300);
        let m = Message::Load(LoadRequest { name: Some(&big), credential: b"", code: b"" });
        assert_eq!(m.emit(&mut Vec::new()), Err(Error::TooLong("module name")));
    }
}
