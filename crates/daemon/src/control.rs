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

use crate::daemon::Daemon;
use crate::{CONTROL_SOCKET, TOKEN_CONN, TOKEN_METRICS_CONN, interest};
use nix::sys::epoll::{EpollEvent, EpollFlags};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::debug;

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
    pub(crate) fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(b),
            Stream::Tcp(s) => s.read(b),
        }
    }
    pub(crate) fn write(&mut self, b: &[u8]) -> io::Result<usize> {
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
    /// Control `modules`: the loaded modules, for whom, until when (JSON).
    Modules,
    /// Control `unload ID`: the operator unloads a module.
    Unload(u32),
    /// Control `unload pN`: the operator unloads a pod (its bindings fail
    /// with `E_GONE` at their next call).
    UnloadPod(u32),
    /// Control `monitor-load NAME MODULE CREDENTIAL`: the local operator
    /// loads a monitoring module (files on this host) into the tap.
    MonitorLoad {
        /// The module's name.
        name: String,
        /// The wasm file.
        module: std::path::PathBuf,
        /// The monitoring credential file.
        credential: std::path::PathBuf,
    },
    /// Control `monitor-unload NAME`.
    MonitorUnload(String),
    /// A `monitor-*` request that does not parse: why.
    BadMonitor(&'static str),
    /// Control `capture [iface=NAME] [queue=N]` (the operator's capture,
    /// `crate::capture`): the interface and queue asked for, or why the
    /// line does not parse.
    Capture(Result<(Option<String>, Option<u32>), anode_wire::capture::RequestError>),
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
    /// Set when the connection streams a capture (`crate::capture`).
    pub(crate) capture: Option<Box<crate::capture::CaptureConn>>,
}

impl Conn {
    pub(crate) fn new(stream: Stream, deadline: Instant) -> Conn {
        Conn { stream, input: Vec::new(), output: Vec::new(), sent: 0, responding: false, deadline, capture: None }
    }

    pub(crate) fn stream_mut(&mut self) -> &mut Stream {
        &mut self.stream
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
        "modules" => Request::Modules,
        other if other.starts_with("monitor-") => parse_monitor(other),
        other if other.split_ascii_whitespace().next() == Some("capture") => {
            Request::Capture(anode_wire::capture::Request::parse(other).map(|r| (r.iface.map(str::to_string), r.queue)))
        }
        other => match other.strip_prefix("unload ").map(str::trim) {
            Some(id) if id.starts_with('p') => match id[1..].parse::<u32>() {
                Ok(n) => Request::UnloadPod(n),
                Err(_) => Request::UnknownControl(other.chars().take(64).collect()),
            },
            Some(id) => match id.trim_start_matches('m').parse::<u32>() {
                Ok(n) => Request::Unload(n),
                Err(_) => Request::UnknownControl(other.chars().take(64).collect()),
            },
            None => Request::UnknownControl(other.chars().take(64).collect()),
        },
    }
}

/// A module name for the tap: 1-64 of `[A-Za-z0-9._-]`.
fn module_name_ok(n: &str) -> bool {
    (1..=64).contains(&n.len()) && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `monitor-load NAME MODULE CREDENTIAL` (absolute paths without spaces) or
/// `monitor-unload NAME`.
fn parse_monitor(line: &str) -> Request {
    let mut w = line.split_ascii_whitespace();
    match (w.next(), w.next(), w.next(), w.next(), w.next()) {
        (Some("monitor-load"), Some(name), Some(module), Some(credential), None) => {
            let (module, credential) = (std::path::PathBuf::from(module), std::path::PathBuf::from(credential));
            if !module_name_ok(name) {
                Request::BadMonitor("the name must be 1-64 of A-Z a-z 0-9 . _ -")
            } else if !module.is_absolute() || !credential.is_absolute() {
                Request::BadMonitor("the module and credential paths must be absolute")
            } else {
                Request::MonitorLoad { name: name.to_string(), module, credential }
            }
        }
        (Some("monitor-unload"), Some(name), None, ..) if module_name_ok(name) => {
            Request::MonitorUnload(name.to_string())
        }
        _ => Request::BadMonitor("expected `monitor-load NAME MODULE CREDENTIAL` or `monitor-unload NAME`"),
    }
}

/// The `rcane` section of the status as Prometheus metrics: per session
/// (labels `session`, `owner`) its charges and guaranteed share, per VP its
/// guarantee and the share of its slice received over recent periods.
fn sessions_prometheus(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let counters: [(&str, &str, &str); 6] = [
        (
            "cpu_guaranteed_ns",
            "anode_session_cpu_guaranteed_nanoseconds_total",
            "CPU charged on guaranteed time (thread CPU clock).",
        ),
        ("cpu_slack_ns", "anode_session_cpu_slack_nanoseconds_total", "CPU charged on slack time."),
        ("tx_packets", "anode_session_tx_packets_total", "Packets sent for the session."),
        ("tx_bytes", "anode_session_tx_bytes_total", "Bytes sent for the session."),
        ("rx_packets", "anode_session_rx_packets_total", "Packets received for the session."),
        ("module_loads", "anode_session_module_loads_total", "Module loads charged to the session."),
    ];
    let sessions = v["sessions"].as_array().cloned().unwrap_or_default();
    for (key, name, help) in counters {
        let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter");
        for x in &sessions {
            let _ = writeln!(
                s,
                "{name}{{session=\"{}\",owner=\"{}\"}} {}",
                x["session"].as_str().unwrap_or("?"),
                x["owner"].as_str().unwrap_or("?"),
                x["charges"][key].as_u64().unwrap_or(0)
            );
        }
    }
    let _ = writeln!(
        s,
        "# HELP anode_session_share_ratio Guaranteed CPU share of the session (sum of its VPs).\n# TYPE anode_session_share_ratio gauge"
    );
    for x in &sessions {
        let _ = writeln!(
            s,
            "anode_session_share_ratio{{session=\"{}\",owner=\"{}\"}} {}",
            x["session"].as_str().unwrap_or("?"),
            x["owner"].as_str().unwrap_or("?"),
            x["share_ppm"].as_u64().unwrap_or(0) as f64 / 1e6
        );
    }
    let _ = writeln!(
        s,
        "# HELP anode_vp_slice_received_ratio CPU received over the VP's recent periods, as a fraction of its slices.\n# TYPE anode_vp_slice_received_ratio gauge"
    );
    for x in &sessions {
        for vp in x["vps"].as_array().cloned().unwrap_or_default() {
            let _ = writeln!(
                s,
                "anode_vp_slice_received_ratio{{session=\"{}\",vp=\"{}\",slice_ns=\"{}\",period_ns=\"{}\"}} {}",
                x["session"].as_str().unwrap_or("?"),
                vp["vp"].as_str().unwrap_or("?"),
                vp["slice_ns"],
                vp["period_ns"],
                vp["received_share_of_slice"].as_f64().unwrap_or(0.0)
            );
        }
    }
    let c = &v["counters"];
    for (key, help) in [
        ("jobs_posted", "Module jobs queued on session pools."),
        ("jobs_refused_full", "Module jobs refused: their pool was full."),
        ("dispatches", "Scheduler dispatches run."),
        ("preemptions", "Invocations stopped at a preemption point."),
        ("session_requests", "Session control requests received."),
        ("session_refused", "Session control requests refused."),
        ("session_rate_limited", "Session control requests refused by the rate limit."),
    ] {
        prom_counter(&mut s, &format!("anode_sched_{key}_total"), help, c[key].as_u64().unwrap_or(0));
    }
    s
}

/// Appends one Prometheus counter without labels: its HELP and TYPE lines
/// and its sample.
pub(crate) fn prom_counter(s: &mut String, name: &str, help: &str, v: u64) {
    use std::fmt::Write as _;
    let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
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

/// Which listener a short-lived connection came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    /// The control socket.
    Control,
    /// The metrics endpoint.
    Metrics,
}

/// Sends one control request (`status` or `metrics`) to the daemon whose
/// run directory is `run_dir` and returns its answer.
pub fn query(run_dir: &Path, request: &str, timeout: Duration) -> io::Result<String> {
    let mut s = UnixStream::connect(run_dir.join(CONTROL_SOCKET))?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(request.as_bytes())?;
    s.write_all(b"\n")?;
    let _ = s.shutdown(Shutdown::Write);
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

impl Daemon {
    fn conns_mut(&mut self, l: Listener) -> &mut Vec<Option<Conn>> {
        match l {
            Listener::Control => &mut self.control_conns,
            Listener::Metrics => &mut self.metrics_conns,
        }
    }

    fn conn_token(l: Listener, slot: usize) -> u64 {
        match l {
            Listener::Control => TOKEN_CONN + slot as u64,
            Listener::Metrics => TOKEN_METRICS_CONN + slot as u64,
        }
    }

    /// Accepts waiting control or metrics connections, each listener in its
    /// own slots; when they are full the oldest connection makes room.
    pub(crate) fn accept_conns(&mut self, l: Listener) {
        loop {
            let stream = match l {
                Listener::Control => match self.control.accept() {
                    Ok((s, _)) => s.set_nonblocking(true).map(|()| Stream::Unix(s)),
                    Err(e) => Err(e),
                },
                Listener::Metrics => match self.metrics.as_ref().map(TcpListener::accept) {
                    Some(Ok((s, _))) => s.set_nonblocking(true).map(|()| Stream::Tcp(s)),
                    Some(Err(e)) => Err(e),
                    None => return,
                },
            };
            match stream {
                Ok(s) => self.add_conn(l, s),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    fn add_conn(&mut self, l: Listener, s: Stream) {
        let slot = match self.conns_mut(l).iter().position(Option::is_none) {
            Some(slot) => slot,
            None => {
                // A capture is never evicted: it ends when its client goes.
                let oldest = self
                    .conns_mut(l)
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| c.as_ref().filter(|c| c.capture.is_none()).map(|c| (c.deadline, i)))
                    .min()
                    .map(|(_, i)| i);
                let Some(slot) = oldest else { return };
                self.close_conn(l, slot);
                self.stats.conns_evicted += 1;
                debug!(listener = ?l, "connections full; closed the oldest for a new one");
                slot
            }
        };
        if interest(&s, &self.epoll, EpollFlags::EPOLLIN, Self::conn_token(l, slot)).is_err() {
            return;
        }
        let deadline = Instant::now() + self.request_timeout;
        self.conns_mut(l)[slot] = Some(Conn::new(s, deadline));
    }

    pub(crate) fn close_conn(&mut self, l: Listener, slot: usize) {
        if let Some(c) = self.conns_mut(l).get_mut(slot).and_then(Option::take) {
            let _ = self.epoll.delete(&c.stream);
            if c.capture.is_some() && self.node.capture_on() {
                self.node.capture_stop(anode_node::core::CaptureStop::ClientGone);
                tracing::info!("capture ended: its client closed the connection");
            }
        }
    }

    pub(crate) fn conn_ready(&mut self, l: Listener, slot: usize, ev: EpollFlags) {
        let Some(mut c) = self.conns_mut(l).get_mut(slot).and_then(Option::take) else { return };
        let progress = if c.capture.is_some() {
            self.capture_ready(&mut c, ev, Self::conn_token(l, slot))
        } else if c.responding {
            c.on_writable()
        } else {
            match c.on_readable() {
                Progress::Request(Request::Capture(req)) if l == Listener::Control => {
                    self.stats.control_requests += 1;
                    self.capture_begin(&mut c, &req, Self::conn_token(l, slot))
                }
                Progress::Request(r) => {
                    self.stats.control_requests += 1;
                    let answer = self.answer(&r, l == Listener::Metrics);
                    let p = c.respond(answer);
                    if p == Progress::Pending {
                        let mut e = EpollEvent::new(EpollFlags::EPOLLOUT, Self::conn_token(l, slot));
                        let _ = self.epoll.modify(&c.stream, &mut e);
                    }
                    p
                }
                Progress::Pending if ev.contains(EpollFlags::EPOLLERR) => Progress::Close,
                p => p,
            }
        };
        self.conns_mut(l)[slot] = Some(c);
        if progress == Progress::Close {
            self.close_conn(l, slot);
        }
    }

    /// Closes connections past their deadline: a whole request and its
    /// answer must fit in `[local] request_timeout_ms`, however the bytes
    /// trickle.
    pub(crate) fn expire_conns(&mut self, now: Instant) {
        for l in [Listener::Control, Listener::Metrics] {
            for slot in 0..self.conns_mut(l).len() {
                if self.conns_mut(l)[slot].as_ref().is_some_and(|c| now >= c.deadline) {
                    debug!(listener = ?l, slot, "connection timed out");
                    if self.conns_mut(l)[slot].as_ref().is_some_and(|c| c.capture.is_some()) {
                        self.node.capture_stop(anode_node::core::CaptureStop::Stalled);
                        tracing::warn!("capture stopped: its client read nothing for [local] stall_timeout_ms");
                    }
                    self.close_conn(l, slot);
                    self.stats.conns_expired += 1;
                }
            }
        }
    }

    fn answer(&mut self, r: &Request, http: bool) -> Vec<u8> {
        use Request as R;
        match (r, http) {
            (R::Status, _) => {
                let mut v = serde_json::to_vec_pretty(&self.status_json()).unwrap_or_default();
                v.push(b'\n');
                v
            }
            (R::Metrics, false) => self.metrics_text().into_bytes(),
            (R::Metrics, true) => {
                http_response("200 OK", "text/plain; version=0.0.4; charset=utf-8", self.metrics_text().as_bytes())
            }
            (R::Modules, _) => {
                let mut v = serde_json::to_vec_pretty(&self.node.modules_list_json()).unwrap_or_default();
                v.push(b'\n');
                v
            }
            (R::Unload(id), _) => match self.node.unload_module(*id) {
                Some(p) => {
                    tracing::info!(module = id, principal = %p, "module unloaded by the operator");
                    format!("unloaded m{id} (principal {p})\n").into_bytes()
                }
                None => format!("error: no module m{id} is loaded\n").into_bytes(),
            },
            (R::UnloadPod(id), _) => {
                if self.node.unload_pod(*id) {
                    tracing::info!(pod = id, "pod unloaded by the operator");
                    format!("unloaded p{id}\n").into_bytes()
                } else {
                    format!("error: no pod p{id} is loaded\n").into_bytes()
                }
            }
            (R::MonitorLoad { name, module, credential }, _) => self.monitor_load(name, module, credential),
            (R::MonitorUnload(name), _) => match self.node.tap_unload(name, "unloaded by the operator") {
                Some(id) => {
                    tracing::info!(module = %id, name = %name, "monitoring module unloaded by the operator");
                    format!("unloaded {name} ({id})\n").into_bytes()
                }
                None => format!("error: no monitoring module {name:?} is loaded on this node's tap\n").into_bytes(),
            },
            (R::BadMonitor(why), _) => format!("error: {why}\n").into_bytes(),
            // Served by `capture_begin` (a control connection only).
            (R::Capture(_), _) => b"error: capture is a control-socket request\n".to_vec(),
            (R::UnknownControl(l), _) => {
                format!("error: unknown request {l:?} (try \"status\", \"metrics\", \"modules\", \"unload ID\", \"monitor-load NAME MODULE CREDENTIAL\", \"monitor-unload NAME\" or \"capture [iface=NAME] [queue=N]\")\n")
                    .into_bytes()
            }
            (R::HttpNotFound, _) => http_response("404 Not Found", "text/plain", b"not found; try /metrics\n"),
        }
    }

    fn metrics_text(&mut self) -> String {
        let mut s = self.node.counters.to_prometheus();
        s.push_str("# HELP anode_uptime_seconds Seconds since the node started.\n# TYPE anode_uptime_seconds gauge\n");
        s.push_str(&format!("anode_uptime_seconds {:.3}\n", self.started.elapsed().as_secs_f64()));
        let st = &self.stats;
        for (name, help, v) in [
            ("clients_accepted", "Application clients connected since start.", st.clients_accepted),
            ("clients_refused", "Application clients refused (max_clients connected).", st.clients_refused),
            ("clients_gone", "Application clients that closed their connection.", st.clients_gone),
            ("clients_stalled", "Application clients disconnected for leaving messages unread.", st.clients_stalled),
            ("queue_dropped", "Messages dropped because a client's queue was full.", st.queue_dropped),
            ("requests", "Requests received on the application socket.", st.requests),
            ("refused", "Application requests refused.", st.refused),
            ("conns_expired", "Control and metrics connections closed at their deadline.", st.conns_expired),
            ("conns_evicted", "Control and metrics connections closed for a new one.", st.conns_evicted),
        ] {
            prom_counter(&mut s, &format!("anode_local_{name}_total"), help, v);
        }
        s.push_str("# HELP anode_local_clients Application clients connected now.\n# TYPE anode_local_clients gauge\n");
        s.push_str(&format!("anode_local_clients {}\n", self.clients.connected()));
        let now_ns = self.now_ns();
        if let Some(v) = self.node.sessions_json(now_ns) {
            s.push_str(&sessions_prometheus(&v));
        }
        s.push_str(&self.tap_prometheus());
        s.push_str(&self.capture_prometheus());
        s
    }

    /// The `status` answer: the node counters plus address, uptime,
    /// interfaces with their listen addresses, routes and local clients.
    pub fn status_json(&mut self) -> serde_json::Value {
        use serde_json::json;
        let mut v = self.node.counters.to_json();
        if let Some(ifaces) = v.get_mut("interfaces").and_then(|x| x.as_array_mut()) {
            for (i, ((j, l), cfg)) in ifaces.iter_mut().zip(&self.listen).zip(&self.cfg.interfaces).enumerate() {
                if let Some(o) = j.as_object_mut() {
                    o.insert("listen".into(), json!(l.to_string()));
                    o.insert("neighbors".into(), json!(cfg.neighbors.len()));
                    if let Some(tx) = self.pacer.lock().status(i) {
                        o.insert("tx".into(), tx);
                    }
                }
            }
        }
        if let Some(o) = v.as_object_mut() {
            if let Some(sec) = self.node.security_json() {
                o.insert("security".into(), sec);
            }
            if let Some(m) = self.node.modules_json() {
                o.insert("modules".into(), m);
            }
            let now_ns = self.now_ns();
            if let Some(s) = self.node.sessions_json(now_ns) {
                o.insert("rcane".into(), s);
            }
            o.insert("monitor".into(), self.tap_json());
            o.insert("capture".into(), self.capture_json());
            if let Some(b) = &self.boot {
                o.insert("boot".into(), b.clone());
            }
            if let Some(r) = self.node.recovery_json() {
                o.insert("recovery".into(), r);
            }
            if let Some(d) = self.node.kdc_json() {
                o.insert("domain".into(), d);
            }
            o.insert("address".into(), json!(self.node.address().to_string()));
            o.insert("uptime_s".into(), json!(self.started.elapsed().as_secs_f64()));
            o.insert("mtu".into(), json!(self.cfg.mtu));
            let frags = self.shared.as_ref().map(|w| w.frags.lock().clone()).unwrap_or_default();
            o.insert("fragments".into(), self.frag.status(&frags));
            let theirs = self.shared.as_ref().map(|w| w.counters.lock().clone()).unwrap_or_default();
            o.insert("io".into(), self.offload.status(&theirs));
            o.insert("pid".into(), json!(std::process::id()));
            o.insert("run_dir".into(), json!(self.run_dir.display().to_string()));
            o.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
            let t = self.timers;
            o.insert(
                "timers".into(),
                json!({
                    "fired": t.fired,
                    "late_us_mean": t.late_us_sum.checked_div(t.fired).unwrap_or(0),
                    "late_us_max": t.late_us_max,
                    "late_over_1ms": t.late_over_1ms,
                    "next_in_ms": self.armed.map(|a| a.saturating_duration_since(std::time::Instant::now()).as_millis() as u64),
                }),
            );
            o.insert("metrics".into(), json!(self.metrics_addr().map(|a| a.to_string())));
            let routes: serde_json::Map<String, serde_json::Value> =
                self.node.routes().iter().map(|(d, v)| (d.to_string(), json!(v.to_string()))).collect();
            o.insert("routes".into(), serde_json::Value::Object(routes));
            let ports: Vec<u16> = self.clients.ports.keys().copied().collect();
            let clients: Vec<serde_json::Value> = self
                .clients
                .slots
                .iter()
                .flatten()
                .map(|c| {
                    json!({"pid": c.pid, "uid": c.uid, "ports": c.ports, "queued": c.wants_write(),
                           "dropped": c.dropped})
                })
                .collect();
            let st = &self.stats;
            o.insert(
                "local".into(),
                json!({
                    "ports": ports,
                    "clients": clients,
                    "requests": st.requests,
                    "refused": st.refused,
                    "clients_accepted": st.clients_accepted,
                    "clients_refused": st.clients_refused,
                    "clients_gone": st.clients_gone,
                    "clients_stalled": st.clients_stalled,
                    "queued": st.queued,
                    "queue_dropped": st.queue_dropped,
                    "control_requests": st.control_requests,
                    "conns_expired": st.conns_expired,
                    "conns_evicted": st.conns_evicted,
                }),
            );
        }
        v
    }
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
        assert_eq!(parse_control(b"unload m4"), Request::Unload(4));
        assert_eq!(parse_control(b"unload 5"), Request::Unload(5));
        assert_eq!(parse_control(b"unload p3"), Request::UnloadPod(3));
        assert_eq!(parse_control(b"unload px"), Request::UnknownControl("unload px".into()));
        assert_eq!(parse_control(b"unload p"), Request::UnknownControl("unload p".into()));
    }

    #[test]
    fn monitor_requests_and_each_rejection() {
        assert_eq!(
            parse_control(b"monitor-load alice.count-1 /m/count.wasm /m/c.cred"),
            Request::MonitorLoad {
                name: "alice.count-1".into(),
                module: "/m/count.wasm".into(),
                credential: "/m/c.cred".into()
            }
        );
        assert_eq!(parse_control(b"monitor-unload alice"), Request::MonitorUnload("alice".into()));
        let bad = |l: &[u8]| matches!(parse_control(l), Request::BadMonitor(_));
        assert!(bad(b"monitor-load a/b /m /c"), "a name with a slash");
        assert!(bad(b"monitor-load a m.wasm /c"), "a relative path");
        assert!(bad(b"monitor-load a /m"), "a missing credential");
        assert!(bad(b"monitor-load a /m /c /d"), "one token too many");
        assert!(bad(&[b"monitor-load ".as_slice(), &[b'x'; 65], b" /m /c"].concat()), "a name too long");
        assert!(bad(b"monitor-unload"), "no name");
        assert!(bad(b"monitor-reboot x"), "an unknown monitor request");
    }

    #[test]
    fn capture_requests_and_typed_rejections() {
        use anode_wire::capture::RequestError as E;
        assert_eq!(parse_control(b"capture"), Request::Capture(Ok((None, None))));
        assert_eq!(
            parse_control(b"capture iface=east queue=9\r"),
            Request::Capture(Ok((Some("east".into()), Some(9))))
        );
        assert_eq!(parse_control(b"capture iface=a/b"), Request::Capture(Err(E::BadIface)));
        assert_eq!(parse_control(b"capture queue=0"), Request::Capture(Err(E::BadQueue)));
        assert_eq!(parse_control(b"capture everything"), Request::Capture(Err(E::UnknownArgument)));
        assert_eq!(parse_control(b"capture iface=a iface=b"), Request::Capture(Err(E::Duplicate("iface"))));
        assert_eq!(parse_control(b"captures"), Request::UnknownControl("captures".into()));
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
