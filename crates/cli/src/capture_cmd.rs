//! `anode capture`: the operator asks the running node, over its control
//! socket, for the plaintext datagrams it receives and sends (after
//! verification and decryption on the way in, before protection on the
//! way out; `anode_wire::capture`), and writes them as pcap.
//!
//! Each record is `LINKTYPE_LINUX_SLL2` (276): the cooked header carries
//! the node's interface index and the direction (packet type 0 "to us" for
//! received, 4 "outgoing" for sent), then a synthesized IPv4 header and UDP
//! header with the real neighbour and local endpoints, then the plaintext
//! ANEP datagram as the UDP payload. Wireshark shows the real endpoints and
//! the direction, and `tools/wireshark/anode.lua` dissects the payload.

use anode_daemon as daemon;
use anode_monitor::{LinkType, PcapSink};
use anode_wire::capture::{self as wire, Direction, Frame};
use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Arguments of `anode capture`.
#[derive(Debug, clap::Args)]
pub struct CaptureArgs {
    /// The node's run directory (holds control.sock).
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// The node's configuration file, to find its run directory.
    #[arg(long, short = 'C', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Capture only this interface (its name in the node's configuration).
    #[arg(short = 'i', long = "iface", value_name = "IFACE")]
    iface: Option<String>,
    /// Stop after this many datagrams.
    #[arg(short = 'c', long = "count", value_name = "COUNT")]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Datagrams the node may hold for this capture while the client is
    /// behind (1..=65536; the node's default is 4096); beyond it they are
    /// counted as capture drops, never delayed.
    #[arg(long, value_name = "N")]
    queue: Option<u32>,
    /// The pcap file to write (`-` for standard output, e.g. into
    /// `wireshark -k -i -`).
    #[arg(short = 'w', value_name = "FILE.pcap")]
    write: PathBuf,
}

/// `LINKTYPE_LINUX_SLL2` packet type of a received datagram (`PACKET_HOST`).
const SLL_HOST: u8 = 0;
/// `LINKTYPE_LINUX_SLL2` packet type of a sent datagram (`PACKET_OUTGOING`).
const SLL_OUTGOING: u8 = 4;
/// ARPHRD_NONE: no link-layer header below.
const ARPHRD_NONE: u16 = 0xfffe;
/// Bytes of the SLL2, IPv4 and UDP headers before the datagram.
pub const ENCAP_LEN: usize = 20 + 20 + 8;

/// One pcap record (SLL2 + IPv4 + UDP + the datagram) for `p` into `out`;
/// `id` numbers the IPv4 headers. A datagram too long for IPv4 is cut
/// (the record's original length says how long it was).
pub fn encapsulate(p: &wire::Packet<'_>, id: u16, out: &mut Vec<u8>) -> u32 {
    let (src, dst) = match p.dir {
        Direction::In => (p.peer, p.local),
        Direction::Out => (p.local, p.peer),
    };
    let data = p.datagram.get(..65_535 - 28).unwrap_or(p.datagram);
    out.clear();
    // SLL2: protocol, reserved, interface index, ARPHRD, packet type, address length, address.
    out.extend_from_slice(&0x0800u16.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&u32::from(p.iface).to_be_bytes());
    out.extend_from_slice(&ARPHRD_NONE.to_be_bytes());
    out.push(if p.dir == Direction::In { SLL_HOST } else { SLL_OUTGOING });
    out.push(0);
    out.extend_from_slice(&[0; 8]);
    // IPv4, no options, don't fragment, TTL 64, UDP.
    let total = (20 + 8 + data.len()) as u16;
    let ip_start = out.len();
    out.extend_from_slice(&[0x45, 0]);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&[0x40, 0, 64, 17, 0, 0]);
    out.extend_from_slice(&src.ip().octets());
    out.extend_from_slice(&dst.ip().octets());
    let sum = ipv4_checksum(&out[ip_start..]);
    out[ip_start + 10..ip_start + 12].copy_from_slice(&sum.to_be_bytes());
    // UDP with no checksum (allowed over IPv4).
    out.extend_from_slice(&src.port().to_be_bytes());
    out.extend_from_slice(&dst.port().to_be_bytes());
    out.extend_from_slice(&(8 + data.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(data);
    (ENCAP_LEN + p.datagram.len()) as u32
}

/// The Internet checksum (RFC 1071) of an IPv4 header whose checksum field is 0.
fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut s: u32 = h.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// Reads frames off the control connection.
struct Frames {
    s: UnixStream,
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out.
    used: usize,
}

impl Frames {
    /// The next whole frame's bytes, or `None` if the node closed, or
    /// `Some(empty)` if nothing arrived before the socket's read timeout.
    fn next(&mut self) -> Result<Option<&[u8]>> {
        if self.used > 0 {
            self.buf.drain(..self.used);
            self.used = 0;
        }
        loop {
            if let Some(n) = wire::frame_len(&self.buf).context("the node sent a malformed capture frame")?
                && self.buf.len() >= n
            {
                self.used = n;
                return Ok(Some(&self.buf[..n]));
            }
            let mut chunk = [0u8; 65_536];
            match self.s.read(&mut chunk) {
                Ok(0) => return Ok(None),
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Ok(Some(&[]));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading the capture stream"),
            }
        }
    }
}

/// `anode capture`.
pub fn run(a: CaptureArgs) -> Result<ExitCode> {
    let run_dir = match (&a.run_dir, &a.config) {
        (Some(d), _) => d.clone(),
        (None, Some(c)) => daemon::run_dir_of(&daemon::load_config(c)?.config),
        (None, None) => bail!("say which node: --run-dir DIR or --config FILE"),
    };
    let req = wire::Request { iface: a.iface.as_deref(), queue: a.queue };
    let line = req.to_line();
    wire::Request::parse(&line).with_context(|| format!("bad capture request {line:?}"))?;
    let sock = run_dir.join(daemon::CONTROL_SOCKET);
    let mut s = UnixStream::connect(&sock)
        .with_context(|| format!("no node answers on {} (is it running, and may you use it?)", sock.display()))?;
    s.write_all(format!("{line}\n").as_bytes())?;
    s.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut frames = Frames { s, buf: Vec::new(), used: 0 };
    let deadline = Instant::now() + Duration::from_secs(10);
    let ifaces: Vec<(u8, String, String)> = loop {
        match frames.next()? {
            None => bail!("the node closed the connection without answering (an older node without capture?)"),
            Some([]) if Instant::now() < deadline => continue,
            Some([]) => bail!("the node did not answer the capture request within 10 s"),
            Some(f) => match Frame::parse(f).context("the node's first capture frame")? {
                Frame::Start(i) => {
                    break i.iter().map(|i| (i.index, i.name.to_string(), i.local.to_string())).collect();
                }
                Frame::Refused(code, why) => {
                    eprintln!("anode capture: refused ({}): {why}", code.name());
                    return Ok(ExitCode::from(2));
                }
                other => bail!("the node began the capture stream with {other:?}"),
            },
        }
    };
    let out: Box<dyn Write> = if a.write.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&a.write).with_context(|| format!("cannot create {}", a.write.display()))?)
    };
    let file = Shared(std::rc::Rc::new(std::cell::RefCell::new(std::io::BufWriter::new(out))));
    let mut sink =
        PcapSink::new(file.clone(), LinkType::LinuxSll2).map_err(|e| anyhow::anyhow!("{}: {e}", a.write.display()))?;
    for (i, name, local) in &ifaces {
        eprintln!("anode capture: interface {i} = {name} ({local})");
    }
    eprintln!("anode capture: plaintext datagrams of {} into {}", run_dir.display(), a.write.display());
    let end = a.duration.map(|d| Instant::now() + Duration::from_secs_f64(d.max(0.0)));
    let (mut n, mut drops, mut id) = (0u64, 0u64, 0u16);
    let mut rec = Vec::new();
    let why = loop {
        if a.count.is_some_and(|c| n >= c) {
            break "count reached";
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            break "duration reached";
        }
        let Some(f) = frames.next()? else { break "the node closed the stream" };
        if f.is_empty() {
            file.flush_all()?;
            continue;
        }
        match Frame::parse(f).context("a capture frame")? {
            Frame::Packet(p) => {
                let orig = encapsulate(&p, id, &mut rec);
                id = id.wrapping_add(1);
                sink.write(p.ts_ns, orig, &rec).map_err(|e| anyhow::anyhow!("{}: {e}", a.write.display()))?;
                n += 1;
            }
            Frame::Drops(d) => drops = d,
            other => bail!("unexpected capture frame {other:?}"),
        }
    };
    file.flush_all()?;
    eprintln!("anode capture: {n} datagrams written ({why}); {drops} dropped by the node (its queue was full)");
    Ok(ExitCode::SUCCESS)
}

/// The pcap file, shared with the sink so it can be flushed between
/// reads: a capture stopped with Ctrl-C leaves whole records.
#[derive(Clone)]
struct Shared(std::rc::Rc<std::cell::RefCell<std::io::BufWriter<Box<dyn Write>>>>);

impl Write for Shared {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

impl Shared {
    fn flush_all(&self) -> Result<()> {
        self.0.borrow_mut().flush().context("writing the pcap file")
    }
}

/// The capture lines of `anode status` (nothing if no capture was ever
/// asked for).
pub fn render_status(v: &serde_json::Value) -> String {
    let c = &v["capture"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    if n("started") == 0 && n("refused") == 0 {
        return String::new();
    }
    let mut s = format!(
        "\ncapture: {}  started {}  refused {}  ended by client {}  stopped stalled {}\n  captured in {} out {}  \
         streamed {}  drops (queue full) {}\n",
        if c["running"].as_bool() == Some(true) { "running" } else { "off" },
        n("started"),
        n("refused"),
        n("stopped_client"),
        n("stopped_stalled"),
        n("queued_in"),
        n("queued_out"),
        n("drained"),
        n("drops"),
    );
    if let Some(k) = c.get("client") {
        s.push_str(&format!(
            "  client uid {} pid {}, {} bytes waiting for it\n",
            k["uid"], k["pid"], k["pending_bytes"]
        ));
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use core::net::{Ipv4Addr, SocketAddrV4};

    #[test]
    fn a_received_datagram_is_sll2_ipv4_udp_from_the_neighbour() {
        let p = wire::Packet {
            dir: Direction::In,
            iface: 2,
            ts_ns: 0,
            peer: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 5000),
            local: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 6000),
            datagram: &[1, 0x80, 0xa0, 0x01, 0, 2, 0, 8],
        };
        let mut v = Vec::new();
        assert_eq!(encapsulate(&p, 7, &mut v), 56);
        assert_eq!(v.len(), 56);
        assert_eq!(&v[..2], &[8, 0], "IPv4");
        assert_eq!(&v[4..8], &[0, 0, 0, 2], "interface index");
        assert_eq!(v[10], SLL_HOST, "received");
        let ip = &v[20..40];
        assert_eq!(ip[0], 0x45);
        assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 36, "IPv4 total length");
        assert_eq!(&ip[12..16], &[127, 0, 0, 1], "source: the neighbour");
        assert_eq!(&ip[16..20], &[127, 0, 0, 2], "destination: this node");
        assert_eq!(ipv4_checksum(ip), 0, "the header checksum verifies");
        let udp = &v[40..48];
        assert_eq!(u16::from_be_bytes([udp[0], udp[1]]), 5000);
        assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 6000);
        assert_eq!(u16::from_be_bytes([udp[4], udp[5]]), 16);
        let mut out = Vec::new();
        encapsulate(&wire::Packet { dir: Direction::Out, ..p }, 7, &mut out);
        assert_eq!(out[10], SLL_OUTGOING, "sent");
        assert_eq!(&out[32..36], &[127, 0, 0, 2], "source: this node");
    }

    #[test]
    fn status_lines_only_once_a_capture_was_asked_for() {
        assert_eq!(render_status(&serde_json::json!({"capture": {"started": 0, "refused": 0}})), "");
        let s = render_status(&serde_json::json!({"capture": {
            "started": 2, "refused": 1, "running": true, "drops": 7, "queued_in": 3,
            "client": {"uid": 0, "pid": 42, "pending_bytes": 10}}}));
        assert!(s.contains("capture: running  started 2  refused 1") && s.contains("drops (queue full) 7"), "{s}");
        assert!(s.contains("client uid 0 pid 42"), "{s}");
    }
}
