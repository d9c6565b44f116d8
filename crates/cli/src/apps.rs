//! Applications over a running node's local API: ping, traceroute, send,
//! recv, multicast.
//!
//! Each tool talks to the local node through [`anode_daemon::client::Client`]
//! (the node's `<run_dir>/app.sock`) and builds its SNAP program from the
//! assembler text under `examples/snap/`: the tool replaces the program's
//! `.stack` line with its own stack and sets the header fields (source,
//! destination, resource bound, port) in code.

use anode_daemon as daemon;
use anode_daemon::client::{self, Client, ClientError};
use anode_node::config::NodeConfig;
use anode_snap::asm;
use anyhow::{Context, Result, anyhow, bail};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const PING: &str = include_str!("../../../examples/snap/ping.s");
const PING_COMPILED: &str = include_str!("../../../examples/snap/ping_compiled.s");
const TRACEROUTE: &str = include_str!("../../../examples/snap/traceroute.s");
const UDP: &str = include_str!("../../../examples/snap/udp.s");
const MCAST: &str = include_str!("../../../examples/snap/mcast_chain.s");
const TREE: &str = include_str!("../../../examples/snap/multicast.s");

/// Bytes of a ping payload before its padding: sequence number (4) and send
/// time (8).
pub const PING_HEADER: usize = 12;

/// Which local node to talk to.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NodeSel {
    /// Run directory of the local node (where its `app.sock` is).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["config", "node"])]
    pub run_dir: Option<PathBuf>,
    /// The local node's configuration file (its `run_dir`, or
    /// /tmp/anode-ADDRESS).
    #[arg(long, value_name = "FILE", conflicts_with = "node")]
    pub config: Option<PathBuf>,
    /// The local node's address: its run directory is /tmp/anode-ADDR.
    #[arg(long, value_name = "ADDR")]
    pub node: Option<Ipv4Addr>,
}

/// Arguments of `anode ping`.
#[derive(Debug, clap::Args)]
pub struct PingArgs {
    /// Node to ping.
    pub addr: Ipv4Addr,
    /// Number of pings to send.
    #[arg(short = 'c', long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,
    /// Seconds between pings.
    #[arg(short = 'i', long, default_value_t = 1.0)]
    pub interval: f64,
    /// Payload bytes: sequence number (4), send time (8), then padding.
    #[arg(short = 's', long = "size", default_value_t = 56)]
    pub size: usize,
    /// Seconds to wait for replies after the last ping.
    #[arg(short = 'W', long, default_value_t = 2.0)]
    pub timeout: f64,
    /// Resource bound of each ping (hops there and back, plus one).
    #[arg(long, default_value_t = 16)]
    pub rb: u16,
    /// Use the PLAN-compiled ping (SNAP Fig. 2) instead of Fig. 1's.
    #[arg(long)]
    pub compiled: bool,
    /// Active ping as a capsule (SANE's `saneping`): the ping module's code
    /// travels with the packet and every hop checks its credential, loads it
    /// and calls its `ping` entry. Needs switchlets on the nodes
    /// (`[modules]`).
    #[arg(long)]
    pub capsule: bool,
    /// With --capsule: carry only the code's hash; a node that lacks the code
    /// fetches it from the previous hop once, verifies and caches it.
    #[arg(long, requires = "capsule")]
    pub by_hash: bool,
    /// With --capsule: the ping module (built by scripts/setup).
    #[arg(long, default_value = "modules/out/ping.wasm")]
    pub module: PathBuf,
    /// With --capsule: the module credential (Biscuit bytes).
    #[arg(long)]
    pub credential: Option<PathBuf>,
    /// With --capsule and no --credential: issue a 10-minute credential for
    /// this module (route, net, time) with the administrator's key file.
    #[arg(long)]
    pub admin_key: Option<PathBuf>,
    #[command(flatten)]
    pub sel: NodeSel,
}

/// Arguments of `anode traceroute`.
#[derive(Debug, clap::Args)]
pub struct TracerouteArgs {
    /// Destination.
    pub addr: Ipv4Addr,
    /// Resource bound of the probe. Reaching hop h costs 1 + h + h(h+1)/2
    /// (every report gets one unit per hop home), so 64 reaches 9 hops.
    #[arg(long, default_value_t = 64)]
    pub rb: u16,
    /// Seconds to wait for the destination's report.
    #[arg(short = 'W', long, default_value_t = 3.0)]
    pub timeout: f64,
    #[command(flatten)]
    pub sel: NodeSel,
}

/// Arguments of `anode send`.
#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// Destination node.
    pub addr: Ipv4Addr,
    /// Application port there.
    pub port: u16,
    /// File to send (default: standard input).
    pub file: Option<PathBuf>,
    /// Resource bound of each packet (at least the hop count plus one).
    #[arg(long, default_value_t = 16)]
    pub rb: u16,
    #[command(flatten)]
    pub sel: NodeSel,
}

/// Arguments of `anode recv`.
#[derive(Debug, clap::Args)]
pub struct RecvArgs {
    /// Application port to receive on.
    pub port: u16,
    /// Stop after this many packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds without a packet.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Write to this file instead of standard output.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    #[command(flatten)]
    pub sel: NodeSel,
}

/// Arguments of `anode multicast`.
#[derive(Debug, clap::Args)]
pub struct MulticastArgs {
    /// Hosts to deliver to, visited in this order (comma separated). Every
    /// host but the last needs two interfaces (SNAP §IV-A.1).
    #[arg(long, value_delimiter = ',', required_unless_present = "tree", conflicts_with = "tree")]
    pub to: Vec<Ipv4Addr>,
    /// Flood the whole tree instead (examples/snap/multicast.s): every node
    /// but this one delivers once; the resource bound, split evenly among
    /// the children at each node, limits the depth reached.
    #[arg(long)]
    pub tree: bool,
    /// Application port at each host.
    #[arg(long, default_value_t = 7000)]
    pub port: u16,
    /// Resource bound: 1 per arrival at a node plus 1 per delivered copy but
    /// the last (default 16 + 4 per host).
    #[arg(long)]
    pub rb: Option<u16>,
    /// The message.
    pub message: String,
    #[command(flatten)]
    pub sel: NodeSel,
}

/// `println!` that ends the tool with an error instead of panicking when
/// standard output is gone (`anode ping ... | head -2`), and flushes, so
/// each line shows as it happens.
macro_rules! out {
    ($($t:tt)*) => {{
        let mut o = std::io::stdout().lock();
        writeln!(o, $($t)*).and_then(|()| o.flush()).context("writing to standard output")?;
    }};
}

// ---------------------------------------------------------------------------
// Finding and talking to the local node.

/// The run directory of the node `sel` names.
fn run_dir(sel: &NodeSel) -> Result<PathBuf> {
    if let Some(d) = &sel.run_dir {
        return Ok(d.clone());
    }
    if let Some(f) = &sel.config {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let cfg = NodeConfig::from_toml(&text).map_err(|e| anyhow!("{}: {e}", f.display()))?;
        return Ok(daemon::run_dir_of(&cfg));
    }
    if let Some(a) = sel.node {
        return Ok(daemon::default_run_dir(a));
    }
    // Nothing said: use the only node running here, if there is just one.
    let mut found = Vec::new();
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            let p = e.path();
            let is_node = p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("anode-"));
            if is_node && client::socket_path(&p).exists() {
                found.push(p);
            }
        }
    }
    match found.len() {
        1 => Ok(found.swap_remove(0)),
        0 => bail!(
            "no local node found ({}/anode-*/app.sock): is `anode node` running? (or give --run-dir, --config or \
             --node)",
            std::env::temp_dir().display()
        ),
        _ => {
            found.sort();
            let names: Vec<_> = found.iter().map(|p| p.display().to_string()).collect();
            bail!("several local nodes ({}): say which with --run-dir, --config or --node", names.join(", "))
        }
    }
}

/// Connects to the local node: the client, its address and MTU.
pub(crate) fn connect(sel: &NodeSel) -> Result<(Client, Ipv4Addr, usize)> {
    let dir = run_dir(sel)?;
    let mut c = Client::connect(&dir)?;
    let (here, mtu) = c.hello()?;
    Ok((c, here, usize::from(mtu)))
}

/// A port for replies, in the dynamic range, chosen per process. The local
/// API gives a port to whoever registered it last, so a clash cannot be
/// detected; the per-process choice makes one unlikely.
fn ephemeral_port() -> u16 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    let mix = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
    49_152 + (mix % 16_384) as u16
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| anyhow!("{what} must be a non-negative number of seconds, not {s}"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------
// Programs.

/// Header fields a tool sets on its program.
#[derive(Debug, Clone, Copy)]
struct Header {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    rb: u16,
    port: u16,
}

/// Assembles `src` (an example program) with its `.stack` line replaced by
/// `stack` (assembler values, top first) and the header set from `h`.
fn build(name: &str, src: &str, stack: &str, h: Header) -> Result<Vec<u8>> {
    let mut text: String =
        src.lines().filter(|l| !l.trim_start().starts_with(".stack")).flat_map(|l| [l, "\n"]).collect();
    text.push_str(".stack ");
    text.push_str(stack);
    text.push('\n');
    let mut r = asm::assemble(&text).map_err(|e| anyhow!("{name}: {e}"))?;
    r.src = h.src;
    r.dst = h.dst;
    r.resource_bound = h.rb;
    r.port = h.port;
    Ok(r.to_bytes()?)
}

/// `bytes` as an assembler blob literal.
fn blob(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "blob \"\"".into();
    }
    let mut s = String::with_capacity(7 + 2 * bytes.len());
    s.push_str("blob 0x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A ping payload of `size` bytes (at least [`PING_HEADER`]).
fn ping_payload(seq: u32, sent_ns: u64, size: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(size.max(PING_HEADER));
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&sent_ns.to_be_bytes());
    // Padding like ping's: a recognisable byte pattern.
    p.extend((0..size.saturating_sub(PING_HEADER)).map(|i| (i % 256) as u8));
    p
}

/// The sequence number and send time of a ping payload.
fn parse_ping_payload(p: &[u8]) -> Option<(u32, u64)> {
    let (s, rest) = p.split_first_chunk::<4>()?;
    let (t, _) = rest.split_first_chunk::<8>()?;
    Some((u32::from_be_bytes(*s), u64::from_be_bytes(*t)))
}

/// The ping packet: Fig. 1's program with stack [0 :: port :: payload], or
/// Fig. 2's with [p :: port :: payload].
fn ping_packet(compiled: bool, h: Header, payload: &[u8]) -> Result<Vec<u8>> {
    let port = h.port;
    if compiled {
        build("ping_compiled.s", PING_COMPILED, &format!("p, {port}, {}", blob(payload)), h)
    } else {
        build("ping.s", PING, &format!("0, {port}, {}", blob(payload)), h)
    }
}

/// The traceroute probe: stack [0 :: port].
fn traceroute_packet(h: Header) -> Result<Vec<u8>> {
    build("traceroute.s", TRACEROUTE, &format!("0, {}", h.port), h)
}

/// A SNAP UDP packet (`forw; demux`) carrying `chunk` to `h.port` at `h.dst`.
fn udp_packet(h: Header, chunk: &[u8]) -> Result<Vec<u8>> {
    build("udp.s", UDP, &format!("{}, {}", h.port, blob(chunk)), h)
}

/// The largest chunk of data a SNAP UDP packet can carry under `mtu`: the
/// MTU less the program's overhead, rounded down to whole words.
fn udp_chunk(mtu: usize) -> Result<usize> {
    let h = Header { src: Ipv4Addr::UNSPECIFIED, dst: Ipv4Addr::UNSPECIFIED, rb: 1, port: 0 };
    let overhead = udp_packet(h, &[])?.len();
    let room = mtu.saturating_sub(overhead) & !3;
    if room == 0 {
        bail!("MTU {mtu} leaves no room for data after the {overhead}-byte program");
    }
    Ok(room)
}

/// The multicast packet: stack [port :: message :: host1 :: ... :: hostn]
/// (see `examples/snap/mcast_chain.s` for how it works and what its
/// resource bound allows).
fn mcast_packet(src: Ipv4Addr, hosts: &[Ipv4Addr], rb: u16, port: u16, msg: &[u8]) -> Result<Vec<u8>> {
    let Some(first) = hosts.first() else { bail!("multicast needs at least one host") };
    let mut seen = BTreeSet::new();
    if let Some(d) = hosts.iter().find(|a| !seen.insert(**a)) {
        bail!("{d} is listed twice");
    }
    let mut stack = format!("{port}, {}", blob(msg));
    for a in hosts {
        stack.push_str(&format!(", {a}"));
    }
    build("mcast_chain.s", MCAST, &stack, Header { src, dst: *first, rb, port })
}

/// Decodes a delivered tuple (docs/snap.md §2.5): per element a tag byte, a
/// 2-byte big-endian length and that many bytes.
fn decode_tuple(mut b: &[u8]) -> Option<Vec<(u8, &[u8])>> {
    let mut v = Vec::new();
    while let Some((&tag, rest)) = b.split_first() {
        let (len, rest) = rest.split_first_chunk::<2>()?;
        let len = usize::from(u16::from_be_bytes(*len));
        if rest.len() < len {
            return None;
        }
        let (data, rest) = rest.split_at(len);
        v.push((tag, data));
        b = rest;
    }
    Some(v)
}

/// A traceroute report: the tuple (address, hop count).
fn decode_report(b: &[u8]) -> Option<(Ipv4Addr, i32)> {
    const TAG_INT: u8 = 0;
    const TAG_ADDR: u8 = 3;
    match decode_tuple(b)?.as_slice() {
        [(TAG_ADDR, a), (TAG_INT, k)] => {
            let a: [u8; 4] = (*a).try_into().ok()?;
            let k: [u8; 4] = (*k).try_into().ok()?;
            Some((Ipv4Addr::from(a), i32::from_be_bytes(k)))
        }
        _ => None,
    }
}

fn check_mtu(len: usize, mtu: usize, what: &str) -> Result<()> {
    if len > mtu {
        bail!("the {what} packet would be {len} bytes, over the node's MTU of {mtu}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// ping

/// Round-trip statistics.
#[derive(Debug, Default)]
struct Stats {
    sent: u32,
    rtts: Vec<f64>,
}

impl Stats {
    fn loss_pct(&self) -> f64 {
        if self.sent == 0 { 0.0 } else { 100.0 * f64::from(self.sent - self.received()) / f64::from(self.sent) }
    }
    fn received(&self) -> u32 {
        u32::try_from(self.rtts.len()).unwrap_or(u32::MAX)
    }
    fn summary(&self, dst: Ipv4Addr) -> String {
        let loss = self.loss_pct();
        let loss = if loss.fract() == 0.0 { format!("{loss:.0}") } else { format!("{loss:.1}") };
        let mut s = format!(
            "--- {dst} snap ping statistics ---\n{} packets transmitted, {} received, {loss}% packet loss\n",
            self.sent,
            self.received()
        );
        if !self.rtts.is_empty() {
            let n = self.rtts.len() as f64;
            let min = self.rtts.iter().copied().fold(f64::INFINITY, f64::min);
            let max = self.rtts.iter().copied().fold(0.0, f64::max);
            let avg = self.rtts.iter().sum::<f64>() / n;
            let sq = self.rtts.iter().map(|r| r * r).sum::<f64>() / n;
            let mdev = (sq - avg * avg).max(0.0).sqrt();
            s.push_str(&format!("rtt min/avg/max/mdev = {min:.3}/{avg:.3}/{max:.3}/{mdev:.3} ms\n"));
        }
        s
    }
}

/// `anode ping`.
pub fn ping(a: PingArgs) -> Result<ExitCode> {
    if a.capsule {
        return capsule_ping(a);
    }
    if a.size < PING_HEADER {
        bail!("-s {}: a ping payload holds at least {PING_HEADER} bytes (sequence number and send time)", a.size);
    }
    let interval = secs(a.interval, "-i")?;
    let wait = secs(a.timeout, "-W")?;
    let (mut c, here, mtu) = connect(&a.sel)?;
    let port = ephemeral_port();
    let h = Header { src: here, dst: a.addr, rb: a.rb, port };
    let len = ping_packet(a.compiled, h, &ping_payload(0, 0, a.size))?.len();
    check_mtu(len, mtu, "ping")?;
    c.register(port)?;
    let fig = if a.compiled { "Fig. 2 compiled" } else { "Fig. 1" };
    out!("PING {} from {here}: {} data bytes, {len}-byte SNAP packets ({fig}, rb {})", a.addr, a.size, a.rb);

    let base = Instant::now();
    let mut stats = Stats::default();
    let mut seen = BTreeSet::new();
    for seq in 1..=a.count {
        let sent_ns = u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let pkt = ping_packet(a.compiled, h, &ping_payload(seq, sent_ns, a.size))?;
        stats.sent += 1;
        match c.inject(&pkt) {
            Ok(()) => {}
            // Dropped at the first hop (no route, say): lost, like an ICMP error.
            Err(ClientError::Refused { reason, .. }) => out!("From {here}: seq={seq}: {reason}"),
            Err(e) => return Err(e.into()),
        }
        let last = seq == a.count;
        let deadline = Instant::now() + if last { wait } else { interval };
        loop {
            if last && seen.len() == a.count as usize {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((p, payload)) = c.recv(left)? else { break };
            if p != port {
                continue;
            }
            let Some((rseq, sent)) = parse_ping_payload(&payload) else {
                out!("{} bytes from {}: malformed reply", payload.len(), a.addr);
                continue;
            };
            let rtt = ms(base.elapsed().saturating_sub(Duration::from_nanos(sent)));
            if rseq == 0 || rseq > seq {
                out!("{} bytes from {}: reply with unknown seq={rseq}", payload.len(), a.addr);
            } else if !seen.insert(rseq) {
                out!("{len} bytes from {}: seq={rseq} time={rtt:.3} ms (DUP!)", a.addr);
            } else {
                out!("{len} bytes from {}: seq={rseq} time={rtt:.3} ms", a.addr);
                stats.rtts.push(rtt);
            }
        }
    }
    let _ = c.unregister(port);
    out!("\n{}", stats.summary(a.addr).trim_end());
    Ok(if stats.rtts.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// A credential for the ping module: from --credential, or issued with
/// --admin-key.
fn ping_credential(a: &PingArgs, code: &[u8]) -> Result<Vec<u8>> {
    use anode_cred::{GrantSpec, Interface, InterfaceSet, Issuer, Limits, ModuleGrant, ModuleHash, PrincipalId};
    if let Some(c) = &a.credential {
        return std::fs::read(c).with_context(|| format!("reading {}", c.display()));
    }
    let Some(k) = &a.admin_key else {
        bail!("--capsule needs a credential for the module: --credential FILE or --admin-key FILE");
    };
    let admin = anode_sec::Identity::load(k)?;
    let issuer = Issuer::from_secret(&admin.secret_seed()).map_err(|e| anyhow!("{e}"))?;
    let me = PrincipalId::of(&anode_cred::SigningKey::from_bytes(&admin.secret_seed()));
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(code))],
        interfaces: InterfaceSet::of(&[Interface::Route, Interface::Net, Interface::Time]),
        limits: Limits { memory: 4 << 20, cpu: 1_000_000, state: 4096 },
        expires: Some(std::time::SystemTime::now() + Duration::from_secs(600)),
    };
    Ok(issuer.issue(me, &spec).map_err(|e| anyhow!("{e}"))?.to_bytes().to_vec())
}

/// `anode ping --capsule`: one capsule per ping; the reply is the module's
/// `pong` delivery at the origin. The RTT is measured here.
fn capsule_ping(a: PingArgs) -> Result<ExitCode> {
    let interval = secs(a.interval, "-i")?;
    let wait = secs(a.timeout, "-W")?;
    let code = std::fs::read(&a.module)
        .with_context(|| format!("reading the ping module {} (build it with scripts/setup)", a.module.display()))?;
    let cred = ping_credential(&a, &code)?;
    let (mut c, here, _mtu) = connect(&a.sel)?;
    let port = ephemeral_port();
    c.register(port)?;
    let mut first = Vec::new();
    anode_sandbox::ping::capsule(&code, &cred, here, a.addr, 0, port, !a.by_hash, &mut first)
        .map_err(|e| anyhow!("{e}"))?;
    let how = if a.by_hash { "code by hash" } else { "code carried" };
    out!("CAPSULE PING {} from {here}: {}-byte module ({how}), {}-byte first capsule", a.addr, code.len(), first.len());
    let mut stats = Stats::default();
    for seq in 1..=a.count {
        let mut caps = Vec::new();
        anode_sandbox::ping::capsule(&code, &cred, here, a.addr, u64::from(seq), port, !a.by_hash, &mut caps)
            .map_err(|e| anyhow!("{e}"))?;
        stats.sent += 1;
        let t = Instant::now();
        match c.capsule(&caps) {
            Ok(()) => {}
            Err(ClientError::Refused { reason, .. }) => out!("From {here}: seq={seq}: {reason}"),
            Err(e) => return Err(e.into()),
        }
        let deadline = t + if seq == a.count { wait } else { interval.max(wait) };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some((p, payload)) = c.recv(left)? else {
                out!("seq={seq}: no reply");
                break;
            };
            if p != port {
                continue;
            }
            let rtt = ms(t.elapsed());
            match anode_sandbox::ping::parse_reply(&payload) {
                Some((target, _)) => {
                    out!("pong from {target}: seq={seq} time={rtt:.3} ms");
                    stats.rtts.push(rtt);
                }
                None => out!("{} bytes: malformed reply", payload.len()),
            }
            break;
        }
        if seq < a.count {
            std::thread::sleep(interval.saturating_sub(t.elapsed()));
        }
    }
    let _ = c.unregister(port);
    out!("\n{}", stats.summary(a.addr).trim_end());
    Ok(if stats.rtts.is_empty() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

// ---------------------------------------------------------------------------
// traceroute

/// `anode traceroute`.
pub fn traceroute(a: TracerouteArgs) -> Result<ExitCode> {
    let wait = secs(a.timeout, "-W")?;
    let (mut c, here, mtu) = connect(&a.sel)?;
    if a.addr == here {
        out!("traceroute to {}: that is this node (0 hops)", a.addr);
        return Ok(ExitCode::SUCCESS);
    }
    let port = ephemeral_port();
    let pkt = traceroute_packet(Header { src: here, dst: a.addr, rb: a.rb, port })?;
    check_mtu(pkt.len(), mtu, "traceroute")?;
    c.register(port)?;
    out!("traceroute to {} from {here} (SNAP, rb {}, reports to port {port})", a.addr, a.rb);
    let start = Instant::now();
    c.inject(&pkt)?;
    let deadline = start + wait;
    let mut reached = false;
    let mut hops = BTreeSet::new();
    while !reached {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some((p, payload)) = c.recv(left)? else { break };
        if p != port {
            continue;
        }
        let rtt = ms(start.elapsed());
        match decode_report(&payload) {
            Some((addr, k)) => {
                out!("{k:2}  {addr:<15}  {rtt:.3} ms");
                hops.insert(k);
                reached = addr == a.addr;
            }
            None => out!(" ?  malformed report ({} bytes)", payload.len()),
        }
    }
    let _ = c.unregister(port);
    if reached {
        return Ok(ExitCode::SUCCESS);
    }
    let got: Vec<String> = hops.iter().map(|k| k.to_string()).collect();
    eprintln!(
        "anode traceroute: no report from {} within {:.1} s (hops heard: {}); the probe may have run out of its \
         resource bound (--rb), met a node with no route, or a node with one interface (reporting and moving on \
         takes two network operations)",
        a.addr,
        wait.as_secs_f64(),
        if got.is_empty() { "none".into() } else { got.join(", ") }
    );
    Ok(ExitCode::from(1))
}

// ---------------------------------------------------------------------------
// send / recv

/// Reads up to `buf.len()` bytes, fewer only at the end of input.
fn fill(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// `anode send`.
pub fn send(a: SendArgs) -> Result<ExitCode> {
    let mut input: Box<dyn Read> = match &a.file {
        Some(f) => Box::new(std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?),
        None => Box::new(std::io::stdin().lock()),
    };
    let (mut c, here, mtu) = connect(&a.sel)?;
    let chunk = udp_chunk(mtu)?;
    let h = Header { src: here, dst: a.addr, rb: a.rb, port: a.port };
    let mut buf = vec![0; chunk];
    let (mut packets, mut bytes) = (0u64, 0u64);
    loop {
        let n = fill(&mut input, &mut buf).context("reading input")?;
        if n == 0 {
            break;
        }
        c.inject(&udp_packet(h, &buf[..n])?)?;
        packets += 1;
        bytes += n as u64;
        if n < chunk {
            break;
        }
    }
    eprintln!("anode send: {bytes} bytes in {packets} packets (up to {chunk} bytes each) to {}:{}", a.addr, a.port);
    Ok(ExitCode::SUCCESS)
}

/// `anode recv`.
pub fn recv(a: RecvArgs) -> Result<ExitCode> {
    let idle = a.timeout.map(|t| secs(t, "--timeout")).transpose()?;
    let mut out: Box<dyn Write> = match &a.output {
        Some(f) => Box::new(std::fs::File::create(f).with_context(|| format!("creating {}", f.display()))?),
        None => Box::new(std::io::stdout().lock()),
    };
    let (mut c, here, _) = connect(&a.sel)?;
    c.register(a.port)?;
    eprintln!("anode recv: listening on {here} port {}", a.port);
    let (mut packets, mut bytes) = (0u64, 0u64);
    // Without --timeout, wait in long slices forever.
    let slice = idle.unwrap_or(Duration::from_secs(3600));
    while a.count.is_none_or(|n| packets < n) {
        match c.recv(slice)? {
            Some((p, payload)) if p == a.port => {
                out.write_all(&payload).context("writing output")?;
                out.flush().context("writing output")?;
                packets += 1;
                bytes += payload.len() as u64;
            }
            Some(_) => {}
            None if idle.is_some() => break,
            None => {}
        }
    }
    let _ = c.unregister(a.port);
    eprintln!("anode recv: {bytes} bytes in {packets} packets");
    if a.count.is_some_and(|n| packets < n) {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

// ---------------------------------------------------------------------------
// multicast

/// `anode multicast`.
pub fn multicast(a: MulticastArgs) -> Result<ExitCode> {
    if a.tree {
        let rb = a.rb.unwrap_or(64);
        let (mut c, here, mtu) = connect(&a.sel)?;
        let pkt =
            build("multicast.s", TREE, &blob(a.message.as_bytes()), Header { src: here, dst: here, rb, port: a.port })?;
        check_mtu(pkt.len(), mtu, "multicast")?;
        c.inject(&pkt)?;
        eprintln!(
            "anode multicast: {} bytes to port {} on every node of the tree from {here} ({}-byte packet, rb {rb})",
            a.message.len(),
            a.port,
            pkt.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let hosts = a.to.len();
    let rb = match a.rb {
        Some(rb) => rb,
        None => u16::try_from(16 + 4 * hosts).unwrap_or(u16::MAX),
    };
    let (mut c, here, mtu) = connect(&a.sel)?;
    let pkt = mcast_packet(here, &a.to, rb, a.port, a.message.as_bytes())?;
    check_mtu(pkt.len(), mtu, "multicast")?;
    match c.inject(&pkt) {
        Ok(()) => {}
        Err(ClientError::Refused { reason, .. }) if reason.contains("too_many_sends") => bail!(
            "{here} refused the packet: {reason} (every listed host but the last must keep a copy and move on, two \
             network operations, so it needs two interfaces)"
        ),
        Err(e) => return Err(e.into()),
    }
    let list: Vec<String> = a.to.iter().map(|h| h.to_string()).collect();
    eprintln!(
        "anode multicast: {} bytes to port {} at {} ({}-byte packet, rb {rb})",
        a.message.len(),
        a.port,
        list.join(", "),
        pkt.len()
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anode_snap::sim::{Network, Report};
    use anode_snap::vm::{End, VmConfig};

    fn ad(i: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 0, 0, i)
    }

    fn hdr(src: u8, dst: u8, rb: u16, port: u16) -> Header {
        Header { src: ad(src), dst: ad(dst), rb, port }
    }

    fn deliveries(r: &Report) -> Vec<(Ipv4Addr, u16, Vec<u8>)> {
        r.deliveries.iter().map(|d| (d.node, d.port, d.payload.clone())).collect()
    }

    fn faults(r: &Report) -> usize {
        r.hops.iter().filter(|h| matches!(h.end, End::Fault { .. })).count()
    }

    #[test]
    fn ping_payload_roundtrip() {
        let p = ping_payload(7, 123_456_789, 56);
        assert_eq!(p.len(), 56);
        assert_eq!(parse_ping_payload(&p), Some((7, 123_456_789)));
        assert_eq!(ping_payload(1, 2, 12).len(), 12);
        assert_eq!(parse_ping_payload(&p[..11]), None);
    }

    #[test]
    fn ping_packets_round_trip_on_a_line() {
        for compiled in [false, true] {
            let payload = ping_payload(3, 99, 56);
            let pkt = ping_packet(compiled, hdr(1, 3, 16, 50_000), &payload).expect("build");
            if !compiled {
                // Fig. 1: 68 bytes of program overhead (SNAP §VII-A).
                assert_eq!(pkt.len(), 68 + 56);
            }
            let mut net = Network::line(3, VmConfig::default());
            let r = net.inject(ad(1), &pkt, false);
            assert_eq!(deliveries(&r), vec![(ad(1), 50_000, payload.clone())], "compiled={compiled}");
            assert_eq!(faults(&r), 0);
        }
    }

    #[test]
    fn stack_replacement_and_header() {
        let pkt = udp_packet(hdr(1, 3, 9, 4242), b"abc").expect("build");
        let r = anode_snap::wire::Repr::parse_bytes(&pkt).expect("parse");
        assert_eq!((r.src, r.dst, r.resource_bound, r.port), (ad(1), ad(3), 9, 4242));
        assert_eq!(r.code.len(), 2);
        assert_eq!(r.stack.len(), 2, "only the tool's stack, not the example's");
        // Overhead 44 bytes as in the paper, plus the padded data.
        assert_eq!(udp_packet(hdr(1, 3, 9, 1), &[]).expect("build").len(), 44);
        assert_eq!(pkt.len(), 48);
        assert_eq!(udp_chunk(1400).expect("chunk"), 1356);
        assert!(udp_chunk(44).is_err());
    }

    #[test]
    fn udp_moves_chunks_two_hops() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let chunk = udp_chunk(1400).expect("chunk");
        let mut net = Network::line(3, VmConfig::default());
        let mut got = Vec::new();
        for c in data.chunks(chunk) {
            let pkt = udp_packet(hdr(1, 3, 16, 9000), c).expect("build");
            assert!(pkt.len() <= 1400);
            let r = net.inject(ad(1), &pkt, false);
            for (node, port, p) in deliveries(&r) {
                assert_eq!((node, port), (ad(3), 9000));
                got.extend(p);
            }
        }
        assert_eq!(got, data);
    }

    #[test]
    fn report_decoding() {
        let mut b = vec![3, 0, 4, 10, 0, 0, 2, 0, 0, 4];
        b.extend(2i32.to_be_bytes());
        assert_eq!(decode_report(&b), Some((ad(2), 2)));
        assert_eq!(decode_report(&b[..b.len() - 1]), None);
        assert_eq!(decode_report(&[0, 0, 4, 0, 0, 0, 1]), None, "wrong shape");
        assert_eq!(decode_tuple(&[]), Some(vec![]));
        assert_eq!(decode_tuple(&[5, 0]), None);
    }

    #[test]
    fn traceroute_reports_every_hop() {
        let mut net = Network::line(4, VmConfig::default());
        let pkt = traceroute_packet(hdr(1, 4, 64, 40_000)).expect("build");
        let r = net.inject(ad(1), &pkt, false);
        let mut reports: Vec<_> = deliveries(&r)
            .into_iter()
            .map(|(node, port, p)| {
                assert_eq!((node, port), (ad(1), 40_000));
                decode_report(&p).expect("report")
            })
            .collect();
        reports.sort_by_key(|r| r.1);
        assert_eq!(reports, vec![(ad(2), 1), (ad(3), 2), (ad(4), 3)]);
    }

    #[test]
    fn multicast_visits_each_host_once() {
        let mut net = Network::line(4, VmConfig::default());
        let pkt = mcast_packet(ad(1), &[ad(2), ad(3), ad(4)], 16, 7000, b"hello all").expect("build");
        let r = net.inject(ad(1), &pkt, false);
        let mut d = deliveries(&r);
        d.sort();
        let want: Vec<_> = [2, 3, 4].map(|i| (ad(i), 7000, b"hello all".to_vec())).into();
        assert_eq!(d, want);
        assert_eq!(faults(&r), 0);
        // Hosts out of line order: the packet goes back and forth.
        let pkt = mcast_packet(ad(1), &[ad(3), ad(2), ad(4)], 16, 7000, b"x").expect("build");
        let mut d: Vec<_> = deliveries(&net.inject(ad(1), &pkt, false)).into_iter().map(|d| d.0).collect();
        d.sort();
        assert_eq!(d, vec![ad(2), ad(3), ad(4)]);
    }

    #[test]
    fn multicast_is_limited_by_its_resource_bound() {
        // To 2, 3, 4 from 1: arrivals at 1, 2, 3, 4 (4) plus 2 copies = 6.
        let hosts = [ad(2), ad(3), ad(4)];
        let mut net = Network::line(4, VmConfig::default());
        let r = net.inject(ad(1), &mcast_packet(ad(1), &hosts, 6, 1, b"m").expect("build"), false);
        assert_eq!(r.deliveries.len(), 3);
        let r = net.inject(ad(1), &mcast_packet(ad(1), &hosts, 5, 1, b"m").expect("build"), false);
        // At 10.0.0.3 the copy takes the last unit and `forwto` faults, which
        // undoes the copy too (a faulting packet has no effect): only 10.0.0.2.
        let got: Vec<_> = r.deliveries.iter().map(|d| d.node).collect();
        assert_eq!(got, vec![ad(2)]);
        assert!(r.transmissions <= 5);
    }

    #[test]
    fn multicast_needs_two_interfaces_where_it_goes_on() {
        // 10.0.0.1 is a line end with one interface: it cannot both keep a
        // copy and move on, so the packet faults there (too_many_sends).
        let mut net = Network::line(3, VmConfig::default());
        let r = net.inject(ad(1), &mcast_packet(ad(1), &[ad(1), ad(3)], 16, 1, b"m").expect("build"), false);
        assert!(r.deliveries.is_empty());
        assert_eq!(faults(&r), 1);
    }

    #[test]
    fn multicast_rejects_bad_lists() {
        assert!(mcast_packet(ad(1), &[], 16, 1, b"m").is_err());
        assert!(mcast_packet(ad(1), &[ad(2), ad(3), ad(2)], 16, 1, b"m").is_err());
    }

    #[test]
    fn summary_format() {
        let s = Stats { sent: 3, rtts: vec![1.0, 2.0, 3.0] };
        assert_eq!(
            s.summary(ad(3)),
            "--- 10.0.0.3 snap ping statistics ---\n3 packets transmitted, 3 received, 0% packet loss\n\
             rtt min/avg/max/mdev = 1.000/2.000/3.000/0.816 ms\n"
        );
        let s = Stats { sent: 3, rtts: vec![] };
        assert_eq!(
            s.summary(ad(3)),
            "--- 10.0.0.3 snap ping statistics ---\n3 packets transmitted, 0 received, 100% packet loss\n"
        );
        assert!(Stats { sent: 3, rtts: vec![1.0] }.summary(ad(3)).contains("66.7% packet loss"));
    }

    #[test]
    fn run_dir_selection() {
        let sel = NodeSel { node: Some(ad(3)), ..NodeSel::default() };
        assert_eq!(run_dir(&sel).expect("dir"), std::env::temp_dir().join("anode-10.0.0.3"));
        let sel = NodeSel { run_dir: Some("/x".into()), ..NodeSel::default() };
        assert_eq!(run_dir(&sel).expect("dir"), PathBuf::from("/x"));
    }
}
