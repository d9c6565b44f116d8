//! `anode capture` (issue 19): the operator's request on the node's local
//! control socket (`control.sock`), and the framed stream the node answers
//! with, from which the client writes pcap.
//!
//! ```text
//! request (one text line)  capture [iface=NAME] [queue=N]
//!
//! answer (binary frames, until either side closes):
//! frame      kind (1) | body length (4) | body
//! 1 start    version (1) = 1 | count (1) | count × { index (1) | IPv4 (4) | port (2) | name_len (1) | name }
//! 2 packet   direction (1: 0 in, 1 out) | iface (1) | ts_ns (8)
//!            | peer IPv4 (4) | peer port (2) | local IPv4 (4) | local port (2) | datagram
//! 3 refused  code (1) | reason (UTF-8)
//! 4 drops    datagrams this capture lost so far (8)
//! ```
//!
//! Integers are big-endian. The first frame is `start` (the capture runs)
//! or `refused` (it does not, and the node closes). A `packet` frame's
//! datagram is the plaintext inner ANEP datagram: after verification and
//! decryption on the way in, before protection on the way out. A frame
//! must be exactly as long as its fields; a body longer than
//! [`MAX_BODY`] is refused without being read.

use core::net::{Ipv4Addr, SocketAddrV4};

/// Frame kind: the capture runs; the node's interfaces.
pub const KIND_START: u8 = 1;
/// Frame kind: one captured datagram.
pub const KIND_PACKET: u8 = 2;
/// Frame kind: the request was refused.
pub const KIND_REFUSED: u8 = 3;
/// Frame kind: the capture's drop count changed.
pub const KIND_DROPS: u8 = 4;
/// Stream version in a `start` frame.
pub const VERSION: u8 = 1;
/// Bytes of a frame's kind and length.
pub const FRAME_HEADER: usize = 5;
/// Bytes of a `packet` body before the datagram.
pub const PACKET_HEADER: usize = 22;
/// Largest datagram a `packet` frame carries (UDP's limit).
pub const MAX_DATAGRAM: usize = 65_536;
/// Largest frame body.
pub const MAX_BODY: usize = PACKET_HEADER + MAX_DATAGRAM;
/// Longest interface name.
pub const MAX_IFACE_NAME: usize = 64;
/// Longest request line, bytes.
pub const MAX_REQUEST_LINE: usize = 256;
/// Largest queue a request may ask for, datagrams.
pub const MAX_QUEUE: u32 = 65_536;

/// A malformed request line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The line does not start with `capture`.
    #[error("not a capture request")]
    NotCapture,
    /// Longer than [`MAX_REQUEST_LINE`].
    #[error("request longer than {MAX_REQUEST_LINE} bytes")]
    TooLong,
    /// A word that is not `key=value` with a known key.
    #[error("unknown argument (expected iface=NAME or queue=N)")]
    UnknownArgument,
    /// A key given twice.
    #[error("{0}= given twice")]
    Duplicate(&'static str),
    /// An interface name that is empty, too long or not `[A-Za-z0-9._-]`.
    #[error("iface= must be 1-{MAX_IFACE_NAME} of A-Z a-z 0-9 . _ -")]
    BadIface,
    /// A queue size that is not a number in 1..=[`MAX_QUEUE`].
    #[error("queue= must be a number from 1 to {MAX_QUEUE}")]
    BadQueue,
}

/// A capture request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Request<'a> {
    /// Only this interface (by name); all when `None`.
    pub iface: Option<&'a str>,
    /// Datagrams the node may hold for the client; the node's default when
    /// `None`.
    pub queue: Option<u32>,
}

fn name_ok(n: &str) -> bool {
    (1..=MAX_IFACE_NAME).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl<'a> Request<'a> {
    /// Parses a request line (without its newline).
    ///
    /// # Errors
    /// A [`RequestError`] naming what is wrong.
    pub fn parse(line: &'a str) -> Result<Request<'a>, RequestError> {
        if line.len() > MAX_REQUEST_LINE {
            return Err(RequestError::TooLong);
        }
        let mut words = line.split_ascii_whitespace();
        if words.next() != Some("capture") {
            return Err(RequestError::NotCapture);
        }
        let mut r = Request::default();
        for w in words {
            match w.split_once('=') {
                Some(("iface", v)) => {
                    if r.iface.is_some() {
                        return Err(RequestError::Duplicate("iface"));
                    }
                    if !name_ok(v) {
                        return Err(RequestError::BadIface);
                    }
                    r.iface = Some(v);
                }
                Some(("queue", v)) => {
                    if r.queue.is_some() {
                        return Err(RequestError::Duplicate("queue"));
                    }
                    match v.parse::<u32>() {
                        Ok(n) if (1..=MAX_QUEUE).contains(&n) && !v.starts_with('+') => r.queue = Some(n),
                        _ => return Err(RequestError::BadQueue),
                    }
                }
                _ => return Err(RequestError::UnknownArgument),
            }
        }
        Ok(r)
    }

    /// The request line, without a newline.
    pub fn to_line(&self) -> String {
        let mut s = String::from("capture");
        if let Some(i) = self.iface {
            s.push_str(" iface=");
            s.push_str(i);
        }
        if let Some(q) = self.queue {
            s.push_str(&format!(" queue={q}"));
        }
        s
    }
}

/// A malformed frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Shorter than its fields say.
    #[error("truncated capture frame")]
    Truncated,
    /// Longer than its fields say.
    #[error("capture frame has {0} trailing bytes")]
    Trailing(usize),
    /// A body longer than [`MAX_BODY`].
    #[error("capture frame body of {0} bytes is longer than {MAX_BODY}")]
    TooLong(usize),
    /// An unknown frame kind.
    #[error("unknown capture frame kind {0}")]
    UnknownKind(u8),
    /// A `start` frame of another version.
    #[error("unknown capture stream version {0}")]
    BadVersion(u8),
    /// A direction other than 0 (in) or 1 (out).
    #[error("unknown direction {0}")]
    BadDirection(u8),
    /// An interface name or reason that is not UTF-8, or a name longer
    /// than 255 bytes (when emitting).
    #[error("an interface name or reason is not valid text")]
    BadText,
    /// An unknown refusal code.
    #[error("unknown refusal code {0}")]
    BadCode(u8),
}

/// Which way a captured datagram went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Direction {
    /// Received by the node (after verification and decryption).
    In = 0,
    /// Sent by the node (before protection).
    Out = 1,
}

/// Why a capture request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Refusal {
    /// The request line did not parse.
    BadRequest = 1,
    /// The client is not the node's operator (its user id is neither the
    /// node's nor root's).
    NotOperator = 2,
    /// No interface has the requested name.
    UnknownInterface = 3,
    /// Another capture is running.
    Busy = 4,
}

impl Refusal {
    fn from_u8(b: u8) -> Result<Refusal, Error> {
        Ok(match b {
            1 => Refusal::BadRequest,
            2 => Refusal::NotOperator,
            3 => Refusal::UnknownInterface,
            4 => Refusal::Busy,
            b => return Err(Error::BadCode(b)),
        })
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::BadRequest => "bad request",
            Refusal::NotOperator => "not the operator",
            Refusal::UnknownInterface => "unknown interface",
            Refusal::Busy => "busy",
        }
    }
}

/// One of the node's interfaces, in a `start` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iface<'a> {
    /// Its index (the `iface` of `packet` frames).
    pub index: u8,
    /// Its local endpoint.
    pub local: SocketAddrV4,
    /// Its name in the node's configuration (any UTF-8 up to 255 bytes;
    /// a request can name only those of `[A-Za-z0-9._-]{1,64}`).
    pub name: &'a str,
}

/// A captured datagram, in a `packet` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Received or sent.
    pub dir: Direction,
    /// The interface index.
    pub iface: u8,
    /// When, in ns since the Unix epoch.
    pub ts_ns: u64,
    /// The neighbour's endpoint.
    pub peer: SocketAddrV4,
    /// The interface's endpoint.
    pub local: SocketAddrV4,
    /// The plaintext ANEP datagram.
    pub datagram: &'a [u8],
}

/// A frame of the capture stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<'a> {
    /// The capture runs.
    Start(Vec<Iface<'a>>),
    /// A captured datagram.
    Packet(Packet<'a>),
    /// The request was refused.
    Refused(Refusal, &'a str),
    /// Datagrams this capture lost so far (queue full at the node).
    Drops(u64),
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.0.len() < n {
            return Err(Error::Truncated);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }
    fn u16(&mut self) -> Result<u16, Error> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u64(&mut self) -> Result<u64, Error> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(a))
    }
    fn v4(&mut self) -> Result<SocketAddrV4, Error> {
        let b = self.take(4)?;
        let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
        Ok(SocketAddrV4::new(ip, self.u16()?))
    }
    fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.0)
    }
}

/// The whole length (header included) of the frame at the start of `buf`,
/// once its header is in; `Ok(None)` while fewer than [`FRAME_HEADER`]
/// bytes are.
///
/// # Errors
/// [`Error::TooLong`] for a body longer than [`MAX_BODY`].
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, Error> {
    let Some(h) = buf.get(..FRAME_HEADER) else { return Ok(None) };
    let body = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    if body > MAX_BODY {
        return Err(Error::TooLong(body));
    }
    Ok(Some(FRAME_HEADER + body))
}

impl<'a> Frame<'a> {
    /// Parses exactly one frame.
    ///
    /// # Errors
    /// An [`Error`] naming what is wrong.
    pub fn parse(b: &'a [u8]) -> Result<Frame<'a>, Error> {
        let total = frame_len(b)?.ok_or(Error::Truncated)?;
        if b.len() < total {
            return Err(Error::Truncated);
        }
        if b.len() > total {
            return Err(Error::Trailing(b.len() - total));
        }
        let kind = b.first().copied().unwrap_or(0);
        let mut r = Reader(b.get(FRAME_HEADER..).unwrap_or(&[]));
        let f = match kind {
            KIND_START => {
                let v = r.u8()?;
                if v != VERSION {
                    return Err(Error::BadVersion(v));
                }
                let n = r.u8()?;
                let mut ifaces = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let index = r.u8()?;
                    let local = r.v4()?;
                    let len = r.u8()? as usize;
                    let name = core::str::from_utf8(r.take(len)?).map_err(|_| Error::BadText)?;
                    ifaces.push(Iface { index, local, name });
                }
                Frame::Start(ifaces)
            }
            KIND_PACKET => {
                let dir = match r.u8()? {
                    0 => Direction::In,
                    1 => Direction::Out,
                    d => return Err(Error::BadDirection(d)),
                };
                let iface = r.u8()?;
                let ts_ns = r.u64()?;
                let peer = r.v4()?;
                let local = r.v4()?;
                Frame::Packet(Packet { dir, iface, ts_ns, peer, local, datagram: r.rest() })
            }
            KIND_REFUSED => {
                let code = Refusal::from_u8(r.u8()?)?;
                let text = core::str::from_utf8(r.rest()).map_err(|_| Error::BadText)?;
                Frame::Refused(code, text)
            }
            KIND_DROPS => Frame::Drops(r.u64()?),
            k => return Err(Error::UnknownKind(k)),
        };
        if !r.0.is_empty() {
            return Err(Error::Trailing(r.0.len()));
        }
        Ok(f)
    }

    /// Appends the frame to `out`.
    ///
    /// # Errors
    /// [`Error::TooLong`] for a datagram longer than [`MAX_DATAGRAM`] or a
    /// body longer than [`MAX_BODY`]; [`Error::BadText`] for more than 255
    /// interfaces or a name longer than 255 bytes. `out` is unchanged then.
    pub fn emit(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let start = out.len();
        out.extend_from_slice(&[self.kind(), 0, 0, 0, 0]);
        let r = self.emit_body(out);
        let body = out.len() - start - FRAME_HEADER;
        if let Err(e) = r {
            out.truncate(start);
            return Err(e);
        }
        if body > MAX_BODY {
            out.truncate(start);
            return Err(Error::TooLong(body));
        }
        out[start + 1..start + FRAME_HEADER].copy_from_slice(&(body as u32).to_be_bytes());
        Ok(())
    }

    fn kind(&self) -> u8 {
        match self {
            Frame::Start(_) => KIND_START,
            Frame::Packet(_) => KIND_PACKET,
            Frame::Refused(..) => KIND_REFUSED,
            Frame::Drops(_) => KIND_DROPS,
        }
    }

    fn emit_body(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let v4 = |out: &mut Vec<u8>, a: &SocketAddrV4| {
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        };
        match self {
            Frame::Start(ifaces) => {
                let n = u8::try_from(ifaces.len()).map_err(|_| Error::BadText)?;
                out.extend_from_slice(&[VERSION, n]);
                for i in ifaces {
                    let len = u8::try_from(i.name.len()).map_err(|_| Error::BadText)?;
                    out.push(i.index);
                    v4(out, &i.local);
                    out.push(len);
                    out.extend_from_slice(i.name.as_bytes());
                }
            }
            Frame::Packet(p) => {
                if p.datagram.len() > MAX_DATAGRAM {
                    return Err(Error::TooLong(PACKET_HEADER + p.datagram.len()));
                }
                out.extend_from_slice(&[p.dir as u8, p.iface]);
                out.extend_from_slice(&p.ts_ns.to_be_bytes());
                v4(out, &p.peer);
                v4(out, &p.local);
                out.extend_from_slice(p.datagram);
            }
            Frame::Refused(code, text) => {
                out.push(*code as u8);
                let mut end = text.len().min(1024);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&text.as_bytes()[..end]);
            }
            Frame::Drops(n) => out.extend_from_slice(&n.to_be_bytes()),
        }
        Ok(())
    }
}

/// The IPv4 endpoint of `a`; `0.0.0.0:port` for an IPv6 one (the node's
/// interfaces are IPv4).
pub fn v4_of(a: core::net::SocketAddr) -> SocketAddrV4 {
    match a {
        core::net::SocketAddr::V4(v) => v,
        core::net::SocketAddr::V6(v) => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, v.port()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ep(a: [u8; 4], p: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(a), p)
    }

    static PACKET_BYTES: [u8; 31] = [
        2, 0, 0, 0, 26, // kind, body length
        1, 0, // out, iface 0
        0, 0, 0, 0, 0, 0, 0, 9, // ts_ns
        127, 0, 0, 1, 0x13, 0x88, // peer 127.0.0.1:5000
        127, 0, 0, 1, 0x13, 0x89, // local 127.0.0.1:5001
        0xde, 0xad, 0xbe, 0xef, // datagram
    ];

    #[test]
    fn packet_deconstruct_and_construct() {
        let f = Frame::parse(&PACKET_BYTES).unwrap();
        let want = Frame::Packet(Packet {
            dir: Direction::Out,
            iface: 0,
            ts_ns: 9,
            peer: ep([127, 0, 0, 1], 5000),
            local: ep([127, 0, 0, 1], 5001),
            datagram: &[0xde, 0xad, 0xbe, 0xef],
        });
        assert_eq!(f, want);
        let mut v = Vec::new();
        want.emit(&mut v).unwrap();
        assert_eq!(v, PACKET_BYTES);
        assert_eq!(frame_len(&PACKET_BYTES[..5]), Ok(Some(31)));
        assert_eq!(frame_len(&PACKET_BYTES[..4]), Ok(None));
    }

    #[test]
    fn other_frames_round_trip() {
        for f in [
            Frame::Start(vec![
                Iface { index: 0, local: ep([10, 1, 2, 3], 7000), name: "west" },
                Iface { index: 1, local: ep([10, 1, 2, 4], 7001), name: "east 1/é" },
            ]),
            Frame::Start(vec![]),
            Frame::Refused(Refusal::NotOperator, "uid 65534 is not the operator"),
            Frame::Drops(u64::MAX),
        ] {
            let mut v = Vec::new();
            f.emit(&mut v).unwrap();
            assert_eq!(Frame::parse(&v).unwrap(), f);
        }
    }

    #[test]
    fn each_frame_rejection() {
        let mut v = PACKET_BYTES.to_vec();
        assert_eq!(Frame::parse(&v[..30]), Err(Error::Truncated), "short of its length");
        v.push(0);
        assert_eq!(Frame::parse(&v), Err(Error::Trailing(1)), "longer than its length");
        let mut v = PACKET_BYTES.to_vec();
        v[5] = 2;
        assert_eq!(Frame::parse(&v), Err(Error::BadDirection(2)));
        let mut v = PACKET_BYTES.to_vec();
        v[0] = 9;
        assert_eq!(Frame::parse(&v), Err(Error::UnknownKind(9)));
        assert_eq!(Frame::parse(&[2, 0, 0, 0, 3, 1, 0, 0]), Err(Error::Truncated), "a packet header cut short");
        assert_eq!(frame_len(&[2, 0, 0x10, 0, 0]), Err(Error::TooLong(0x10_0000)));
        assert_eq!(Frame::parse(&[1, 0, 0, 0, 2, 2, 0]), Err(Error::BadVersion(2)));
        assert_eq!(Frame::parse(&[1, 0, 0, 0, 9, 1, 1, 0, 1, 2, 3, 4, 0, 5]), Err(Error::Truncated), "a name cut");
        assert_eq!(
            Frame::parse(&[1, 0, 0, 0, 11, 1, 1, 0, 1, 2, 3, 4, 0, 5, 1, 0xff]),
            Err(Error::BadText),
            "not UTF-8"
        );
        let long = "x".repeat(256);
        let start = Frame::Start(vec![Iface { index: 0, local: ep([0; 4], 0), name: &long }]);
        assert_eq!(start.emit(&mut Vec::new()), Err(Error::BadText), "a name longer than 255 bytes");
        assert_eq!(Frame::parse(&[3, 0, 0, 0, 1, 9]), Err(Error::BadCode(9)));
        assert_eq!(Frame::parse(&[3, 0, 0, 0, 2, 1, 0xff]), Err(Error::BadText));
        assert_eq!(Frame::parse(&[4, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]), Err(Error::Truncated));
        assert_eq!(Frame::parse(&[4, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0]), Err(Error::Trailing(1)));
        let big = vec![0u8; MAX_DATAGRAM + 1];
        let p = Packet {
            dir: Direction::In,
            iface: 0,
            ts_ns: 0,
            peer: ep([0; 4], 0),
            local: ep([0; 4], 0),
            datagram: &big,
        };
        let mut v = vec![7];
        assert!(Frame::Packet(p).emit(&mut v).is_err());
        assert_eq!(v, [7], "a refused emit leaves the buffer as it was");
    }

    #[test]
    fn requests_and_each_rejection() {
        assert_eq!(Request::parse("capture"), Ok(Request::default()));
        let r = Request::parse("capture  iface=east.1 queue=64 ").unwrap();
        assert_eq!(r, Request { iface: Some("east.1"), queue: Some(64) });
        assert_eq!(Request::parse(&r.to_line()), Ok(r));
        assert_eq!(Request::parse("status"), Err(RequestError::NotCapture));
        assert_eq!(Request::parse(""), Err(RequestError::NotCapture));
        assert_eq!(Request::parse("capture all"), Err(RequestError::UnknownArgument));
        assert_eq!(Request::parse("capture snaplen=9"), Err(RequestError::UnknownArgument));
        assert_eq!(Request::parse("capture iface=a iface=b"), Err(RequestError::Duplicate("iface")));
        assert_eq!(Request::parse("capture queue=1 queue=2"), Err(RequestError::Duplicate("queue")));
        assert_eq!(Request::parse("capture iface="), Err(RequestError::BadIface));
        assert_eq!(Request::parse("capture iface=a/b"), Err(RequestError::BadIface));
        assert_eq!(Request::parse("capture queue=0"), Err(RequestError::BadQueue));
        assert_eq!(Request::parse("capture queue=65537"), Err(RequestError::BadQueue));
        assert_eq!(Request::parse("capture queue=-1"), Err(RequestError::BadQueue));
        assert_eq!(Request::parse("capture queue=+5"), Err(RequestError::BadQueue));
        let long = format!("capture iface={}", "x".repeat(300));
        assert_eq!(Request::parse(&long), Err(RequestError::TooLong));
    }
}
