//! Short-lived request/response connections served from the event loop:
//! the control socket (`status`, `metrics`, one line each) and the optional
//! Prometheus HTTP endpoint (`GET /metrics`).
//!
//! Every connection is non-blocking: it reads until a whole request is in,
//! the daemon answers, it writes the answer as the socket allows, then it
//! closes. A connection that has not finished by its deadline (the
//! daemon's `[local] request_timeout_ms` after it was accepted, for the
//! whole request and answer, however the bytes trickle) is closed, so a
//! stalled client cannot hold a slot.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

/// Largest request accepted, in bytes.
pub const MAX_REQUEST: usize = 8192;

/// A connected stream.
#[derive(Debug)]
pub(crate) enum Stream {
    /// The control socket.
    Unix(UnixStream),
    /// The metrics endpoint.
    Tcp(TcpStream),
}

impl Stream {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(b),
            Stream::Tcp(s) => s.write(b),
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
    }
}

/// What a connection asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// Control `status`: counters JSON.
    Status,
    /// Control `metrics` or HTTP `GET /metrics`: Prometheus text.
    Metrics,
    /// An unknown control request (its first line).
    UnknownControl(String),
    /// Any other HTTP request: 404.
    HttpNotFound,
}

/// The state of a connection after some I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Waiting for more.
    Pending,
    /// A whole request arrived.
    Request(Request),
    /// Finished or broken: close it.
    Close,
}

/// One control or metrics connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) stream: Stream,
    input: Vec<u8>,
    output: Vec<u8>,
    sent: usize,
    /// Whether the answer is being written (then only writability matters).
    pub(crate) responding: bool,
    pub(crate) deadline: Instant,
}

impl Conn {
    pub(crate) fn new(stream: Stream, deadline: Instant) -> Conn {
        Conn { stream, input: Vec::new(), output: Vec::new(), sent: 0, responding: false, deadline }
    }

    fn is_http(&self) -> bool {
        matches!(self.stream, Stream::Tcp(_))
    }

    /// Reads what is available and says whether a request is complete.
    pub(crate) fn on_readable(&mut self) -> Progress {
        if self.responding {
            return Progress::Pending;
        }
        let mut chunk = [0u8; 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => {
                    // End of input: a control client may omit the newline.
                    if !self.is_http() && !self.input.is_empty() {
                        return Progress::Request(parse_control(&self.input));
                    }
                    return Progress::Close;
                }
                Ok(n) => {
                    self.input.extend_from_slice(&chunk[..n]);
                    if let Some(r) = self.complete() {
                        return Progress::Request(r);
                    }
                    if self.input.len() > MAX_REQUEST {
                        return Progress::Close;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Progress::Close,
            }
        }
    }

    fn complete(&self) -> Option<Request> {
        if self.is_http() {
            let end = find(&self.input, b"\r\n\r\n").or_else(|| find(&self.input, b"\n\n"))?;
            Some(parse_http(&self.input[..end]))
        } else {
            find(&self.input, b"\n").map(|end| parse_control(&self.input[..end]))
        }
    }

    /// Queues the answer and writes as much as the socket takes.
    pub(crate) fn respond(&mut self, answer: Vec<u8>) -> Progress {
        self.output = answer;
        self.sent = 0;
        self.responding = true;
        self.on_writable()
    }

    /// Writes more of the answer; `Close` when all of it is out.
    pub(crate) fn on_writable(&mut self) -> Progress {
        while self.sent < self.output.len() {
            match self.stream.write(&self.output[self.sent..]) {
                Ok(0) => return Progress::Close,
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Progress::Pending,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Progress::Close,
            }
        }
        Progress::Close
    }
}

fn find(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// Parses a control request: one line, `status` or `metrics`.
pub(crate) fn parse_control(b: &[u8]) -> Request {
    let line = String::from_utf8_lossy(b);
    let line = line.lines().next().unwrap_or("").trim();
    match line {
        "status" => Request::Status,
        "metrics" => Request::Metrics,
        other => Request::UnknownControl(other.chars().take(64).collect()),
    }
}

/// Parses an HTTP request head: only `GET /metrics` is served.
pub(crate) fn parse_http(b: &[u8]) -> Request {
    let head = String::from_utf8_lossy(b);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    match (first.next(), first.next()) {
        (Some("GET"), Some(path)) if path == "/metrics" || path.starts_with("/metrics?") => Request::Metrics,
        _ => Request::HttpNotFound,
    }
}

/// An HTTP/1.1 response that closes the connection.
pub(crate) fn http_response(status: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut v = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(body);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_requests() {
        assert_eq!(parse_control(b"status"), Request::Status);
        assert_eq!(parse_control(b" metrics \r"), Request::Metrics);
        assert_eq!(parse_control(b"reboot\nstatus"), Request::UnknownControl("reboot".into()));
        assert_eq!(parse_control(b"\xff\xfe"), Request::UnknownControl("\u{fffd}\u{fffd}".into()));
    }

    #[test]
    fn http_requests() {
        assert_eq!(parse_http(b"GET /metrics HTTP/1.1\r\nHost: x"), Request::Metrics);
        assert_eq!(parse_http(b"GET /metrics?x=1 HTTP/1.0"), Request::Metrics);
        assert_eq!(parse_http(b"GET / HTTP/1.1"), Request::HttpNotFound);
        assert_eq!(parse_http(b"POST /metrics HTTP/1.1"), Request::HttpNotFound);
        assert_eq!(parse_http(b""), Request::HttpNotFound);
        let r = http_response("404 Not Found", "text/plain", b"no");
        assert!(r.starts_with(b"HTTP/1.1 404 Not Found\r\n"));
        assert!(r.ends_with(b"Content-Length: 2\r\nConnection: close\r\n\r\nno"));
    }
}
