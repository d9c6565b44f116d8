//! `anode testbed up|down|status`: one `anode node` per node of a topology
//! file, on loopback UDP or in network namespaces.
//!
//! `up` writes everything into one directory (default `/tmp/anode-testbed`):
//!
//! ```text
//! DIR/topology.toml     copy of the topology; every node's routes.topology
//! DIR/<name>/node.toml  the node's NodeConfig (run_dir = DIR/<name>)
//! DIR/<name>/node.log   its stdout and stderr
//! DIR/<name>/pid        its process id, while it runs
//! DIR/<name>/app.sock   its local API socket (made by the node)
//! DIR/netns.sh          with --netns: the commands that built the namespaces
//! DIR/namespaces        with --netns: the namespaces `down` deletes
//! ```
//!
//! Loopback mode gives each interface (one per link, named after the
//! neighbour) its own UDP port on 127.0.0.1. With `--netns` (Linux, root)
//! each node gets a network namespace `anode-<name>`, each link a veth pair
//! with a /30 from 172.31.0.0/16, the node's overlay address on `lo`, IP
//! forwarding on, and kernel routes along the topology's shortest paths
//! ([`Topology::next_hops`], the same routes the anode nodes use): ordinary
//! `ping` through kernel routers and SNAP ping through anode nodes then run
//! between the same hosts and addresses. Nothing leaves the namespaces: they
//! have no link to the host and no default route.
//!
//! The plan (ports, addresses, configs, namespace commands) is computed by
//! pure functions; only [`run`] touches files and processes.

mod domains;

use anode_node::config::{InterfaceConfig, ModulesConfig, NeighborConfig, NodeConfig, SecurityConfig, Topology};
use anyhow::{Context, Result, anyhow, bail};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Where a testbed lives unless `--dir` says otherwise.
const DEFAULT_DIR: &str = "/tmp/anode-testbed";
/// UDP port of every interface in `--netns` mode unless `--base-port` is given
/// (each interface has its own address there).
const NETNS_PORT: u16 = 7000;
/// Prefix of the namespaces `--netns` creates.
const NETNS_PREFIX: &str = "anode-";
/// Longest node name: it names a directory, an interface and a namespace.
const MAX_NAME: usize = 32;
/// How long `down` waits after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);

/// Appends a line to an output buffer (printed at the end with [`emit`], so
/// a closed pipe, as in `anode testbed up ... | head`, is not an error).
macro_rules! outln {
    ($o:expr) => {
        $o.push('\n')
    };
    ($o:expr, $($t:tt)*) => {{
        let _ = writeln!($o, $($t)*);
    }};
}
/// Appends text to an output buffer.
macro_rules! out {
    ($o:expr, $($t:tt)*) => {{
        let _ = write!($o, $($t)*);
    }};
}

/// Prints an output buffer; a closed stdout is ignored.
fn emit(o: &str) {
    use std::io::Write as _;
    let mut so = std::io::stdout().lock();
    let _ = so.write_all(o.as_bytes());
    let _ = so.flush();
}

/// `anode testbed` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TestbedCmd {
    /// Start one `anode node` per node of a topology file and wait until each
    /// answers on its local API socket.
    Up(Box<UpArgs>),
    /// Stop the nodes of a testbed (SIGTERM, then SIGKILL after 5 s) and, for
    /// --netns, delete its network namespaces.
    Down {
        /// The testbed's directory.
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
    /// List a testbed's nodes and whether each is running (exit status 0 if
    /// all are, 3 otherwise).
    Status {
        /// The testbed's directory.
        #[arg(long, default_value = DEFAULT_DIR)]
        dir: PathBuf,
    },
}

/// Arguments of `anode testbed up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Topology file: `node = [{ name, address }]`, `link = [{ a, b }]`
    /// (see examples/topologies/).
    pub topology: PathBuf,
    /// Directory for configs, logs, pid files and sockets.
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
    /// First UDP port; interface k listens on base-port + k. Without it, free
    /// ports are picked. With --netns: the one port every interface uses
    /// (default 7000).
    #[arg(long)]
    pub base_port: Option<u16>,
    /// One network namespace per node, one veth pair per link, kernel routes
    /// along the topology's shortest paths (Linux, needs root).
    #[arg(long)]
    pub netns: bool,
    /// Only write the configs (and with --netns the namespace commands, to
    /// DIR/netns.sh); start nothing.
    #[arg(long)]
    pub configs_only: bool,
    /// Seconds to wait for every node to answer on its socket.
    #[arg(long, default_value_t = 10)]
    pub timeout: u64,
    /// Link protection: "encrypt" (default), "authenticate", or "off" (no
    /// keys, no handshakes: the unauthenticated baseline). Each node gets a
    /// key pair in DIR/keys/ (kept across runs).
    #[arg(long, default_value = "encrypt", value_parser = ["encrypt", "authenticate", "off"])]
    pub security: String,
    /// Do not run switchlets and capsules. By default every node gets a
    /// `[modules]` section rooted in an administrator key, DIR/keys/admin.key
    /// (`anode ping --capsule --admin-key DIR/keys/admin.key`).
    #[arg(long)]
    pub no_modules: bool,
    /// A user's public key (.pub or .key file) every node accepts over
    /// Noise XX (for `anode module load`); may be repeated.
    #[arg(long)]
    pub user: Vec<PathBuf>,
    /// Each node appends its virtual processors' scheduling periods to
    /// NODE_DIR/periods.csv (`anode node --period-log`; Fig. 11).
    #[arg(long)]
    pub period_log: bool,
    /// Every node's link MTU, bytes (`[node] link_mtu`): longer datagrams
    /// go as fragments. Off by default (loopback carries 64 KiB datagrams).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u16).range(576..))]
    pub link_mtu: Option<u16>,
    /// Every node's SA lifetime, seconds (`[security] reject_after_secs`;
    /// nodes rekey at half of it). Short lifetimes are for tests.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(2..))]
    pub sa_lifetime: Option<u64>,
    /// How long every node keeps a principal's session after its last SA,
    /// seconds (`[modules] session_grace_secs`, default 60).
    #[arg(long, value_name = "SECS")]
    pub session_grace: Option<u64>,
    /// Every interface's rate, bits/s (`rate_bps`): each node schedules and
    /// paces its transmissions per link at this rate (docs/rcane.md,
    /// "Transmit scheduling per link"). Off by default.
    #[arg(long, value_name = "BITS_PER_SEC", value_parser = clap::value_parser!(u64).range(1000..))]
    pub link_rate: Option<u64>,
    /// Every principal's best-effort transmit allowance, bytes/s
    /// (`[modules] tx_bytes_per_sec`, default 1250000).
    #[arg(long, value_name = "BYTES_PER_SEC")]
    pub tx_allowance: Option<u64>,
    /// Every node's guaranteed dispatches of module work look for waiting
    /// network input every US µs and end for it, so that EDF sees the VPs
    /// the input wakes (`[modules] input_preempts_us`; Fig. 13). Off by
    /// default.
    #[arg(long, value_name = "US")]
    pub input_preempts: Option<u64>,
    /// Every node sends without UDP GSO (`[io] gso = false`): one skb per
    /// datagram, so that a qdisc (tc) sees and classifies each one.
    #[arg(long)]
    pub no_gso: bool,
    /// `NODE=FILE`: turn on the FLAME tap of node NODE with the `[monitor]`
    /// section in FILE (its keys without the header, docs/node.md; relative
    /// paths in it are relative to FILE). May be repeated, one per node.
    #[arg(long, value_name = "NODE=FILE")]
    pub monitor: Vec<String>,
    /// Administrative domains (SANE §4.7) from a domain map, e.g.
    /// examples/topologies/domains-map.toml: each member gets a `[domain]`
    /// section; operator keys and domain secrets go to DIR/keys.
    #[arg(long, value_name = "MAP")]
    pub domains: Option<PathBuf>,
}

/// Settings the testbed writes into every node's config.
#[derive(Debug, Clone, Copy, Default)]
struct Tuning {
    sa_lifetime: Option<u64>,
    session_grace: Option<u64>,
    link_mtu: usize,
    link_rate: Option<u64>,
    tx_allowance: Option<u64>,
    no_gso: bool,
    input_preempts: Option<u64>,
}

/// Security settings for a plan: the mode, and every node's public key and
/// secret key file.
#[derive(Debug, Clone)]
struct PlanSecurity {
    mode: String,
    users: Vec<anode_sec::PublicKey>,
    keys: BTreeMap<String, (anode_sec::PublicKey, PathBuf)>,
}

/// Runs a testbed subcommand.
pub fn run(c: TestbedCmd) -> Result<ExitCode> {
    match c {
        TestbedCmd::Up(a) => up(*a),
        TestbedCmd::Down { dir } => down(&dir),
        TestbedCmd::Status { dir } => status(&dir),
    }
}

// ---------------------------------------------------------------- the plan

/// One node of a planned testbed.
#[derive(Debug, Clone)]
struct PlannedNode {
    name: String,
    address: Ipv4Addr,
    /// Namespace, in --netns mode.
    namespace: Option<String>,
    /// (interface name = neighbour name, listen address), in link order.
    listens: Vec<(String, SocketAddr)>,
    /// The NodeConfig text.
    config: String,
}

/// Everything `up` will create, computed without I/O.
#[derive(Debug, Clone)]
struct Plan {
    nodes: Vec<PlannedNode>,
    /// `ip` commands that build the namespaces (empty on loopback).
    netns_setup: Vec<Vec<String>>,
}

/// Where the interfaces' UDP endpoints come from.
#[derive(Debug, Clone)]
enum Endpoints {
    /// 127.0.0.1, ports in the order given (one per interface, nodes in
    /// topology order, each node's links in file order).
    Loopback(Vec<u16>),
    /// Veth addresses, every interface on this port.
    Netns(u16),
}

/// A node's links in file order: (link index, neighbour name).
fn links_of<'a>(t: &'a Topology, name: &str) -> Vec<(usize, &'a str)> {
    t.links
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            if l.a == name {
                Some((i, l.b.as_str()))
            } else if l.b == name {
                Some((i, l.a.as_str()))
            } else {
                None
            }
        })
        .collect()
}

/// Interfaces the testbed needs: one per link end.
fn interface_count(t: &Topology) -> usize {
    2 * t.links.len()
}

/// Checks what a testbed needs beyond [`Topology::validate`] (which it also
/// runs): names usable as directories and namespaces, no node without links.
fn check_topology(t: &Topology) -> Result<()> {
    if t.nodes.is_empty() {
        bail!("the topology has no nodes");
    }
    for n in &t.nodes {
        let ok = !n.name.is_empty()
            && n.name.len() <= MAX_NAME
            && n.name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && n.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !ok {
            bail!(
                "node name {:?} is not usable: names are 1 to {MAX_NAME} letters, digits, '-' or '_', starting with \
                 a letter or digit (they name directories, interfaces and namespaces)",
                n.name
            );
        }
    }
    // Names, addresses and links: the node's own check.
    t.validate().map_err(|e| anyhow!("{e}"))?;
    for n in &t.nodes {
        if links_of(t, &n.name).is_empty() {
            bail!(
                "node {:?} has no links: every node needs at least one (a node without interfaces cannot run)",
                n.name
            );
        }
    }
    Ok(())
}

/// Addresses of link `i` in netns mode: (a side, b side) of a /30 in
/// 172.31.0.0/16.
fn link_addrs(i: usize) -> Result<(Ipv4Addr, Ipv4Addr)> {
    let base = u32::try_from(i)
        .ok()
        .filter(|i| *i < (1 << 14))
        .ok_or_else(|| anyhow!("--netns supports at most {} links", 1 << 14))?;
    let net = u32::from(Ipv4Addr::new(172, 31, 0, 0)) + 4 * base;
    Ok((Ipv4Addr::from(net + 1), Ipv4Addr::from(net + 2)))
}

/// The veth name, inside `name`'s namespace, of its link `i` to `peer`.
fn veth_name(peer: &str, i: usize) -> String {
    // Linux interface names have at most 15 bytes.
    if peer.len() <= 12 { format!("to-{peer}") } else { format!("link{i}") }
}

/// The namespace of node `name`.
fn namespace_of(name: &str) -> String {
    format!("{NETNS_PREFIX}{name}")
}

fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// Plans a testbed: each node's config and, in netns mode, the namespace
/// commands. `dir` must be absolute.
fn plan(
    t: &Topology,
    dir: &Path,
    endpoints: &Endpoints,
    sec: Option<&PlanSecurity>,
    admin: Option<&anode_sec::PublicKey>,
    tuning: Tuning,
) -> Result<Plan> {
    check_topology(t)?;
    let addr = |name: &str| t.address_of(name).ok_or_else(|| anyhow!("unknown node {name:?}"));
    // The endpoint of each link end: (link index, node name) -> socket address.
    let mut ends: BTreeMap<(usize, &str), SocketAddr> = BTreeMap::new();
    match endpoints {
        Endpoints::Loopback(ports) => {
            if ports.len() < interface_count(t) {
                bail!("internal: {} ports for {} interfaces", ports.len(), interface_count(t));
            }
            let mut k = 0;
            for n in &t.nodes {
                for (i, _) in links_of(t, &n.name) {
                    ends.insert((i, n.name.as_str()), SocketAddr::from((Ipv4Addr::LOCALHOST, ports[k])));
                    k += 1;
                }
            }
        }
        Endpoints::Netns(port) => {
            for (i, l) in t.links.iter().enumerate() {
                let (x, y) = link_addrs(i)?;
                ends.insert((i, l.a.as_str()), SocketAddr::from((x, *port)));
                ends.insert((i, l.b.as_str()), SocketAddr::from((y, *port)));
            }
        }
    }
    let end = |i: usize, name: &str| ends.get(&(i, name)).copied().ok_or_else(|| anyhow!("internal: no endpoint"));
    let topo_path = dir.join("topology.toml");
    let mut nodes = Vec::new();
    for n in &t.nodes {
        let mut cfg = NodeConfig::new(n.address);
        cfg.run_dir = Some(dir.join(&n.name));
        cfg.link_mtu = tuning.link_mtu;
        if tuning.no_gso {
            cfg.io.gso = false;
        }
        let mut listens = Vec::new();
        for (i, peer) in links_of(t, &n.name) {
            let listen = end(i, &n.name)?;
            cfg.interfaces.push(InterfaceConfig {
                name: peer.to_owned(),
                listen,
                neighbors: vec![NeighborConfig {
                    address: addr(peer)?,
                    endpoint: end(i, peer)?,
                    key: sec.and_then(|s| s.keys.get(peer)).map(|(k, _)| k.to_string()),
                    mode: None,
                }],
                rate_bps: tuning.link_rate,
                tx_period_us: None,
                tx_queue_bytes: None,
            });
            listens.push((peer.to_owned(), listen));
        }
        cfg.routes.topology = Some(topo_path.clone());
        cfg.modules = admin.map(|k| ModulesConfig::new(k.to_string()));
        if let (Some(m), Some(g)) = (cfg.modules.as_mut(), tuning.session_grace) {
            m.session_grace_secs = g;
        }
        if let (Some(m), Some(t)) = (cfg.modules.as_mut(), tuning.tx_allowance) {
            m.tx_bytes_per_sec = t;
        }
        if let (Some(m), Some(us)) = (cfg.modules.as_mut(), tuning.input_preempts) {
            m.input_preempts_us = us;
        }
        if let Some(s) = sec {
            let (_, file) = s.keys.get(&n.name).ok_or_else(|| anyhow!("internal: no key for {:?}", n.name))?;
            let mut sc = SecurityConfig {
                key: Some(file.clone()),
                mode: Some(s.mode.clone()),
                users: s.users.iter().map(|k| k.to_string()).collect(),
                ..SecurityConfig::default()
            };
            if let Some(l) = tuning.sa_lifetime {
                sc.reject_after_secs = l;
                sc.rekey_after_secs = l / 2;
            }
            cfg.security = Some(sc);
        }
        let text = cfg.to_toml().map_err(|e| anyhow!("internal: config of {:?}: {e}", n.name))?;
        let cfg =
            format!("# Node {:?} of the testbed in {} (written by `anode testbed up`).\n{text}", n.name, dir.display());
        NodeConfig::from_toml(&cfg)
            .map_err(|e| anyhow!("internal: generated config of {:?} is invalid: {e}", n.name))?;
        nodes.push(PlannedNode {
            name: n.name.clone(),
            address: n.address,
            namespace: matches!(endpoints, Endpoints::Netns(_)).then(|| namespace_of(&n.name)),
            listens,
            config: cfg,
        });
    }
    let netns_setup = match endpoints {
        Endpoints::Netns(_) => netns_commands(t)?,
        Endpoints::Loopback(_) => Vec::new(),
    };
    Ok(Plan { nodes, netns_setup })
}

/// The `ip` commands that build the namespaces, veths, addresses and kernel
/// routes of a topology.
fn netns_commands(t: &Topology) -> Result<Vec<Vec<String>>> {
    let mut cmds = Vec::new();
    for n in &t.nodes {
        let ns = namespace_of(&n.name);
        cmds.push(argv(&["ip", "netns", "add", &ns]));
        cmds.push(argv(&["ip", "-n", &ns, "link", "set", "lo", "up"]));
        cmds.push(argv(&["ip", "-n", &ns, "addr", "add", &format!("{}/32", n.address), "dev", "lo"]));
        // Forwarding on; reverse-path filtering off, so no route asymmetry
        // can drop a packet (set before the veths exist: "default" applies
        // to interfaces created later).
        cmds.push(argv(&[
            "ip",
            "netns",
            "exec",
            &ns,
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.default.rp_filter=0",
        ]));
    }
    for (i, l) in t.links.iter().enumerate() {
        let (x, y) = link_addrs(i)?;
        let (nsa, nsb) = (namespace_of(&l.a), namespace_of(&l.b));
        let (va, vb) = (veth_name(&l.b, i), veth_name(&l.a, i));
        cmds.push(argv(&["ip", "-n", &nsa, "link", "add", &va, "type", "veth", "peer", "name", &vb, "netns", &nsb]));
        cmds.push(argv(&["ip", "-n", &nsa, "addr", "add", &format!("{x}/30"), "dev", &va]));
        cmds.push(argv(&["ip", "-n", &nsb, "addr", "add", &format!("{y}/30"), "dev", &vb]));
        cmds.push(argv(&["ip", "-n", &nsa, "link", "set", &va, "up"]));
        cmds.push(argv(&["ip", "-n", &nsb, "link", "set", &vb, "up"]));
    }
    // Kernel routes: to every other node's overlay address, via the
    // neighbour's end of the link the topology's shortest path takes, with
    // this node's overlay address as source (so replies are routed too).
    for n in &t.nodes {
        let ns = namespace_of(&n.name);
        let hops = t.next_hops(n.address).map_err(|e| anyhow!("routes of {}: {e}", n.name))?;
        for (dest, via) in hops {
            let Some((i, peer)) = links_of(t, &n.name).into_iter().find(|(_, p)| t.address_of(p) == Some(via)) else {
                bail!("internal: {} has no link to next hop {via}", n.name);
            };
            let (x, y) = link_addrs(i)?;
            let gw = if t.links[i].a == n.name { y } else { x };
            cmds.push(argv(&[
                "ip",
                "-n",
                &ns,
                "route",
                "add",
                &format!("{dest}/32"),
                "via",
                &gw.to_string(),
                "dev",
                &veth_name(peer, i),
                "src",
                &n.address.to_string(),
            ]));
        }
    }
    Ok(cmds)
}

// ------------------------------------------------------------ processes

/// Reads a topology file, with the file named in every error.
fn read_topology(path: &Path) -> Result<(String, Topology)> {
    let text = fs::read_to_string(path).with_context(|| format!("reading topology file {}", path.display()))?;
    let t = Topology::from_toml(&text).map_err(|e| anyhow!("{} is not a valid topology: {e}", path.display()))?;
    check_topology(&t).with_context(|| format!("{} is not usable as a testbed", path.display()))?;
    Ok((text, t))
}

/// Whether process `pid` exists and has not exited (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    let proc_dir = Path::new("/proc");
    if proc_dir.join("self").exists() {
        match fs::read_to_string(proc_dir.join(pid.to_string()).join("stat")) {
            // "pid (comm) S ...": the state follows the last ')'.
            Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) != Some('Z'),
            Err(_) => false,
        }
    } else {
        Command::new("kill").args(["-0", &pid.to_string()]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
    }
}

/// Whether `pid` is the node started with config `config` (guards against a
/// recycled pid). Without /proc, trusts the pid file.
fn is_our_node(pid: u32, config: &Path) -> bool {
    match fs::read(format!("/proc/{pid}/cmdline")) {
        Ok(cmd) => {
            let want = config.as_os_str().as_encoded_bytes();
            cmd.split(|b| *b == 0).any(|arg| arg == want)
        }
        Err(_) => !Path::new("/proc/self").exists() && alive(pid),
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).stderr(Stdio::null()).status();
}

/// A node directory's pid, if the file exists and parses.
fn read_pid(node_dir: &Path) -> Option<u32> {
    fs::read_to_string(node_dir.join("pid")).ok()?.trim().parse().ok()
}

/// Nodes of the testbed in `dir` that have a pid file: (name, node dir, pid).
fn pid_files(dir: &Path) -> Vec<(String, PathBuf, u32)> {
    let mut v = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else { return v };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir()
            && let Some(pid) = read_pid(&p)
        {
            v.push((e.file_name().to_string_lossy().into_owned(), p, pid));
        }
    }
    v.sort();
    v
}

/// Nodes of the testbed in `dir` that are running.
fn running(dir: &Path) -> Vec<(String, PathBuf, u32)> {
    pid_files(dir).into_iter().filter(|(_, p, pid)| alive(*pid) && is_our_node(*pid, &p.join("node.toml"))).collect()
}

/// The last lines of a log, for error messages.
fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(8)..];
    if tail.is_empty() { "  (the log is empty)".into() } else { tail.iter().map(|l| format!("  | {l}\n")).collect() }
}

/// Creates `d` (or takes it over) readable by this user only: it holds the
/// node's local API and control sockets.
/// Writes `data` to `p` with exactly `mode`, whatever the umask (and
/// whatever mode an existing file had).
fn write_file(p: &Path, data: impl AsRef<[u8]>, mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(p)
        .with_context(|| format!("writing {}", p.display()))?;
    f.set_permissions(fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", p.display()))?;
    f.write_all(data.as_ref()).with_context(|| format!("writing {}", p.display()))
}

fn private_dir(d: &Path) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    fs::DirBuilder::new().recursive(true).mode(0o700).create(d).with_context(|| format!("creating {}", d.display()))?;
    fs::set_permissions(d, fs::Permissions::from_mode(0o700)).with_context(|| format!("securing {}", d.display()))
}

/// The user id of this process.
fn my_uid() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").ok().map(|m| m.uid())
}

fn is_root() -> bool {
    my_uid() == Some(0)
}

/// Runs one command, failing with its stderr.
fn run_cmd(cmd: &[String]) -> Result<()> {
    let (prog, args) = cmd.split_first().ok_or_else(|| anyhow!("internal: empty command"))?;
    let out = Command::new(prog).args(args).stdin(Stdio::null()).output().with_context(|| format!("running {prog}"))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The namespaces listed in `DIR/namespaces`.
fn recorded_namespaces(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("namespaces"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(NETNS_PREFIX))
        .map(str::to_owned)
        .collect()
}

fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

/// Deletes namespaces (which deletes their veths and routes).
fn delete_namespaces(namespaces: &[String]) -> Vec<String> {
    let mut errors = Vec::new();
    for ns in namespaces {
        if netns_exists(ns)
            && let Err(e) = run_cmd(&argv(&["ip", "netns", "del", ns]))
        {
            errors.push(format!("{e:#}"));
        }
    }
    errors
}

/// Ports for `n` interfaces: from `base`, checked free, or picked below the
/// kernel's ephemeral range (`anode_daemon::ports`). The sockets are held
/// until the caller drops them.
fn reserve_ports(n: usize, base: Option<u16>) -> Result<(Vec<u16>, Vec<UdpSocket>)> {
    let Some(b) = base else {
        let held = anode_daemon::ports::reserve_loopback(n).context("reserving loopback UDP ports")?;
        let ports = held.iter().map(|s| s.local_addr().map(|a| a.port())).collect::<std::io::Result<Vec<u16>>>()?;
        return Ok((ports, held));
    };
    let mut ports = Vec::with_capacity(n);
    let mut held = Vec::with_capacity(n);
    for k in 0..n {
        let p = usize::from(b) + k;
        let port = u16::try_from(p)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| anyhow!("--base-port {b} leaves no room for {n} ports (the last would be {p})"))?;
        let s = UdpSocket::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).with_context(|| {
            format!(
                "UDP port {port} on 127.0.0.1 is not free (choose another --base-port, or omit it to pick free ports)"
            )
        })?;
        ports.push(port);
        held.push(s);
    }
    Ok((ports, held))
}

/// Asks the node whose run directory is `node_dir` for its address
/// (local API HELLO).
fn hello(node_dir: &Path) -> Option<Ipv4Addr> {
    let mut c = anode_daemon::client::Client::connect(node_dir).ok()?;
    c.set_timeout(Duration::from_millis(200));
    c.hello().ok().map(|(a, _)| a)
}

/// A started node, until `up` returns.
struct Started {
    name: String,
    node_dir: PathBuf,
    child: Child,
}

/// Stops what a failed `up` started.
fn abort(started: &mut [Started], namespaces: &[String]) {
    for s in started.iter_mut() {
        let _ = s.child.kill();
        let _ = s.child.wait();
        let _ = fs::remove_file(s.node_dir.join("pid"));
    }
    delete_namespaces(namespaces);
}

/// Waits until every started node answers HELLO with its address.
fn wait_ready(started: &mut [Started], plan: &Plan, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    (|| {
        for (s, p) in started.iter_mut().zip(&plan.nodes) {
            let sock = s.node_dir.join("app.sock");
            let log = s.node_dir.join("node.log");
            loop {
                if let Some(status) = s.child.try_wait()? {
                    bail!(
                        "node {} exited ({status}) while starting; its log {}:\n{}",
                        s.name,
                        log.display(),
                        log_tail(&log)
                    );
                }
                if sock.exists() {
                    match hello(&s.node_dir) {
                        Some(a) if a == p.address => break,
                        Some(a) => bail!("node {} answers with address {a}, expected {}", s.name, p.address),
                        None => {}
                    }
                }
                if Instant::now() > deadline {
                    bail!(
                        "node {} did not answer on {} within {} s; its log {}:\n{}",
                        s.name,
                        sock.display(),
                        timeout.as_secs(),
                        log.display(),
                        log_tail(&log)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // With security on, also wait until every node has an SA with every
        // neighbour (link keys at boot), so the first packets are not
        // dropped for want of one.
        for s in started.iter() {
            loop {
                let st = anode_daemon::query(&s.node_dir, "status", Duration::from_secs(2))
                    .ok()
                    .and_then(|a| serde_json::from_str::<serde_json::Value>(&a).ok());
                let Some(sec) = st.as_ref().and_then(|v| v.get("security")) else { break };
                let peers = sec.get("peers").and_then(|p| p.as_array()).cloned().unwrap_or_default();
                let down: Vec<String> = peers
                    .iter()
                    .filter(|p| p.get("kind").and_then(|k| k.as_str()) == Some("neighbor"))
                    .filter(|p| p.get("up").and_then(|u| u.as_bool()) != Some(true))
                    .map(|p| p.get("address").and_then(|a| a.as_str()).unwrap_or("?").to_string())
                    .collect();
                if down.is_empty() {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "node {}: no security association with {} within {} s; its log {}:\n{}",
                        s.name,
                        down.join(", "),
                        timeout.as_secs(),
                        s.node_dir.join("node.log").display(),
                        log_tail(&s.node_dir.join("node.log"))
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    })()
}

fn up(a: UpArgs) -> Result<ExitCode> {
    let (text, topo) = read_topology(&a.topology)?;
    let dir = testbed_dir(&a)?;
    let (endpoints, held) = endpoints(&a, &topo)?;
    let sec = plan_security(&a, &topo, &dir)?;
    let admin = if a.no_modules {
        None
    } else {
        Some(
            crate::keys_cmd::load_or_create(&dir.join("keys"), "admin")
                .with_context(|| format!("administrator key in {}", dir.join("keys").display()))?
                .public(),
        )
    };
    let tuning = Tuning {
        sa_lifetime: a.sa_lifetime,
        session_grace: a.session_grace,
        link_mtu: a.link_mtu.map_or(0, usize::from),
        link_rate: a.link_rate,
        tx_allowance: a.tx_allowance,
        no_gso: a.no_gso,
        input_preempts: a.input_preempts,
    };
    let mut plan = plan(&topo, &dir, &endpoints, sec.as_ref(), admin.as_ref(), tuning)
        .with_context(|| format!("planning {}", a.topology.display()))?;
    apply_monitors(&mut plan, &a.monitor)?;
    if let Some(map) = &a.domains {
        domains::apply(&mut plan, &dir, map, sec.as_ref())?;
    }
    let namespaces: Vec<String> = plan.nodes.iter().filter_map(|n| n.namespace.clone()).collect();
    if a.netns && !a.configs_only {
        check_netns(&namespaces)?;
    }
    write_files(&dir, &text, &plan, a.netns)?;
    if a.configs_only {
        emit(&configs_summary(&dir, &plan, a.netns));
        return Ok(ExitCode::SUCCESS);
    }
    // Namespaces first, recorded before they exist so `down` can always
    // clean up.
    if a.netns {
        write_file(&dir.join("namespaces"), namespaces.join("\n") + "\n", 0o644)?;
        for c in &plan.netns_setup {
            if let Err(e) = run_cmd(c) {
                delete_namespaces(&namespaces);
                let _ = fs::remove_file(dir.join("namespaces"));
                return Err(e.context("building the network namespaces (all deleted again)"));
            }
        }
    }
    drop(held);
    let mut started = Vec::new();
    let result = start_nodes(&dir, &plan, a.period_log, &mut started)
        .and_then(|()| wait_ready(&mut started, &plan, Duration::from_secs(a.timeout)));
    if let Err(e) = result {
        abort(&mut started, &namespaces);
        let _ = fs::remove_file(dir.join("namespaces"));
        return Err(e.context("the testbed did not come up (every node started was stopped again)"));
    }
    emit(&up_summary(&a.topology, &dir, &topo, &plan, &started));
    Ok(ExitCode::SUCCESS)
}

/// Puts each `--monitor NODE=FILE` section into NODE's configuration.
fn apply_monitors(plan: &mut Plan, specs: &[String]) -> Result<()> {
    for spec in specs {
        let (name, file) = spec.split_once('=').ok_or_else(|| anyhow!("--monitor {spec:?}: expected NODE=FILE"))?;
        let file = Path::new(file);
        let text = fs::read_to_string(file).with_context(|| format!("--monitor {spec}: reading {}", file.display()))?;
        let mut m = anode_node::config::MonitorSection::from_toml(&text)
            .with_context(|| format!("--monitor {spec}: {}", file.display()))?;
        let base = file.parent().filter(|b| !b.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let base = fs::canonicalize(base).unwrap_or(base.to_path_buf());
        let abs = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        for l in &mut m.loads {
            abs(&mut l.file);
            abs(&mut l.credential);
        }
        for p in [&mut m.anon_key, &mut m.json, &mut m.ipfix, &mut m.pcap].into_iter().flatten() {
            abs(p);
        }
        let node = plan
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| anyhow!("--monitor {spec}: the topology has no node {name:?}"))?;
        let (header, body) = node.config.split_once('\n').unwrap_or(("", &node.config));
        let mut cfg = NodeConfig::from_toml(body).map_err(|e| anyhow!("internal: config of {name:?}: {e}"))?;
        cfg.monitor = Some(m);
        cfg.validate().with_context(|| format!("--monitor {spec}"))?;
        let text = cfg.to_toml().map_err(|e| anyhow!("--monitor {spec}: {e}"))?;
        node.config = format!("{header}\n{text}");
    }
    Ok(())
}

/// The testbed directory, created private if missing, and checked: ours,
/// not writable by others, no testbed running in it, no namespaces left.
fn testbed_dir(a: &UpArgs) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    if !a.dir.exists() {
        private_dir(&a.dir)?;
    }
    let dir = fs::canonicalize(&a.dir).with_context(|| format!("resolving {}", a.dir.display()))?;
    let shown = dir.display();
    let m = fs::metadata(&dir).with_context(|| format!("reading {shown}"))?;
    if my_uid().is_some_and(|me| me != m.uid()) {
        bail!("{shown} belongs to another user (uid {}): choose another --dir", m.uid());
    }
    if m.mode() & 0o022 != 0 {
        bail!(
            "{shown} is writable by other users (mode {:o}): they could replace the nodes' files; chmod go-w it, or \
             choose another --dir",
            m.mode() & 0o777
        );
    }
    let live = running(&dir);
    if !live.is_empty() {
        let names: Vec<&str> = live.iter().map(|(n, _, _)| n.as_str()).collect();
        bail!(
            "a testbed is already running in {shown} (nodes {}): stop it with `anode testbed down --dir {shown}`, or use \
             another --dir",
            names.join(", ")
        );
    }
    if !a.configs_only && !recorded_namespaces(&dir).is_empty() {
        bail!("{shown} still records network namespaces: run `anode testbed down --dir {shown}` first");
    }
    Ok(dir)
}

/// Where each interface listens, and the sockets that hold loopback ports
/// until the nodes take them.
fn endpoints(a: &UpArgs, topo: &Topology) -> Result<(Endpoints, Vec<UdpSocket>)> {
    if a.netns {
        return Ok((Endpoints::Netns(a.base_port.unwrap_or(NETNS_PORT)), Vec::new()));
    }
    if a.configs_only {
        // Nothing will bind: the ports only have to be distinct.
        let base = usize::from(a.base_port.unwrap_or(7000));
        let ports = (0..interface_count(topo))
            .map(|k| u16::try_from(base + k).map_err(|_| anyhow!("--base-port {base} leaves no room for the ports")))
            .collect::<Result<Vec<u16>>>()?;
        return Ok((Endpoints::Loopback(ports), Vec::new()));
    }
    let (ports, sockets) = reserve_ports(interface_count(topo), a.base_port)?;
    Ok((Endpoints::Loopback(ports), sockets))
}

/// Keys for every node (made once, kept in DIR/keys) and the users, unless
/// security is off.
fn plan_security(a: &UpArgs, topo: &Topology, dir: &Path) -> Result<Option<PlanSecurity>> {
    let mode = match a.security.as_str() {
        "off" => return Ok(None),
        mode => mode,
    };
    let kdir = dir.join("keys");
    let mut keys = BTreeMap::new();
    for n in &topo.nodes {
        let id = crate::keys_cmd::load_or_create(&kdir, &n.name)
            .with_context(|| format!("key of node {:?} in {}", n.name, kdir.display()))?;
        keys.insert(n.name.clone(), (id.public(), kdir.join(format!("{}.key", n.name))));
    }
    let mut users = Vec::new();
    for u in &a.user {
        users.push(crate::keys_cmd::public_of(u).with_context(|| format!("--user {}", u.display()))?);
    }
    Ok(Some(PlanSecurity { mode: mode.to_string(), users, keys }))
}

fn check_netns(namespaces: &[String]) -> Result<()> {
    if !is_root() {
        bail!("--netns needs root (it creates network namespaces); run it with sudo, or drop --netns for loopback");
    }
    if let Some(ns) = namespaces.iter().find(|ns| netns_exists(ns)) {
        bail!(
            "network namespace {ns} already exists (another testbed?): stop that testbed with `anode testbed down \
             --dir DIR`, or delete it with `ip netns del {ns}`"
        );
    }
    Ok(())
}

/// The topology copy, one config per node, the namespace script.
fn write_files(dir: &Path, topology: &str, plan: &Plan, netns: bool) -> Result<()> {
    write_file(&dir.join("topology.toml"), topology, 0o644)?;
    for n in &plan.nodes {
        let nd = dir.join(&n.name);
        private_dir(&nd)?;
        write_file(&nd.join("node.toml"), &n.config, 0o644)?;
        let _ = fs::remove_file(nd.join("pid"));
    }
    if netns {
        let mut script = String::from(
            "#!/bin/sh\n# Network namespaces of this testbed, as run by `anode testbed up --netns`.\n\
             # `anode testbed down` deletes them (ip netns del), which removes the veths and routes.\nset -e\n",
        );
        for c in &plan.netns_setup {
            script.push_str(&c.join(" "));
            script.push('\n');
        }
        write_file(&dir.join("netns.sh"), script, 0o700)?;
    } else {
        let _ = fs::remove_file(dir.join("netns.sh"));
    }
    Ok(())
}

fn configs_summary(dir: &Path, plan: &Plan, netns: bool) -> String {
    let shown = dir.display();
    let mut o = String::new();
    outln!(o, "wrote {} node configs to {shown} (nothing started)", plan.nodes.len());
    for n in &plan.nodes {
        outln!(o, "  {}/{}/node.toml", shown, n.name);
    }
    if netns {
        outln!(o, "  {shown}/netns.sh ({} commands)", plan.netns_setup.len());
    }
    o
}

/// Starts every node of the plan, in its namespace if it has one, its
/// output to DIR/<name>/node.log; what started is in `started`.
fn start_nodes(dir: &Path, plan: &Plan, period_log: bool, started: &mut Vec<Started>) -> Result<()> {
    let exe = std::env::current_exe().context("locating the anode executable")?;
    for n in &plan.nodes {
        let nd = dir.join(&n.name);
        let config = nd.join("node.toml");
        let log_path = nd.join("node.log");
        // A socket left by an earlier run would look ready.
        let _ = fs::remove_file(nd.join("app.sock"));
        write_file(&log_path, b"", 0o600)?;
        let log = fs::OpenOptions::new()
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut cmd = match &n.namespace {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.arg("node").arg("--config").arg(&config);
        if period_log {
            cmd.arg("--period-log").arg(nd.join("periods.csv"));
        }
        cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        // Own process group: Ctrl-C in the terminal that ran `up` (or a
        // script around it) does not reach the nodes.
        cmd.process_group(0);
        let child = cmd.spawn().with_context(|| format!("starting node {}: {}", n.name, exe.display()))?;
        started.push(Started { name: n.name.clone(), node_dir: nd.clone(), child });
        write_file(&nd.join("pid"), format!("{}\n", started.last().map_or(0, |s| s.child.id())), 0o644)?;
    }
    Ok(())
}

fn up_summary(topo_path: &Path, dir: &Path, topo: &Topology, plan: &Plan, started: &[Started]) -> String {
    let mut o = String::new();
    let netns = plan.nodes.first().is_some_and(|n| n.namespace.is_some());
    outln!(
        o,
        "testbed up: {} nodes of {} in {} ({})",
        plan.nodes.len(),
        topo_path.display(),
        dir.display(),
        if netns { "network namespaces anode-<name>, UDP on veth addresses" } else { "UDP on 127.0.0.1" }
    );
    let w = plan.nodes.iter().map(|n| n.name.len()).max().unwrap_or(4).max(4);
    outln!(
        o,
        "  {:<w$}  {:<15} {:>7}  {:<30} interfaces (neighbour = UDP listen)",
        "name",
        "address",
        "pid",
        "run dir"
    );
    for (n, s) in plan.nodes.iter().zip(started) {
        let ifs: Vec<String> = n.listens.iter().map(|(peer, l)| format!("{peer}={l}")).collect();
        outln!(
            o,
            "  {:<w$}  {:<15} {:>7}  {:<30} {}",
            n.name,
            n.address.to_string(),
            s.child.id(),
            dir.join(&n.name).display().to_string(),
            ifs.join(" ")
        );
    }
    let links: Vec<String> = topo.links.iter().map(|l| format!("{}-{}", l.a, l.b)).collect();
    outln!(o, "  links: {}", links.join(" "));
    // Example commands: from the first node to the node farthest from it.
    let Some(first) = plan.nodes.first() else { return o };
    let d = topo.hop_counts(first.address);
    let far = plan
        .nodes
        .iter()
        .max_by_key(|n| (d.get(&n.address).copied().unwrap_or(0), std::cmp::Reverse(n.address)))
        .unwrap_or(first);
    let second = plan.nodes.get(1).unwrap_or(first);
    let d0 = dir.join(&first.name);
    outln!(o, "\ntry:");
    outln!(o, "  anode ping {} --run-dir {}", far.address, d0.display());
    outln!(o, "  anode traceroute {} --run-dir {}", far.address, d0.display());
    if dir.join("keys").join("admin.key").exists() {
        outln!(
            o,
            "  anode ping {} --capsule --admin-key {} --run-dir {}   # active ping, code in the capsule",
            far.address,
            dir.join("keys").join("admin.key").display(),
            d0.display()
        );
    }
    outln!(o, "  anode status --run-dir {}", dir.join(&second.name).display());
    if let Some(ns) = &first.namespace {
        outln!(o, "  ip netns exec {ns} ping -c 3 {}      # the same path through kernel routers", far.address);
    }
    outln!(o, "  anode testbed status --dir {}", dir.display());
    outln!(o, "  anode testbed down --dir {}", dir.display());
    outln!(o, "logs: {}/<name>/node.log", dir.display());
    o
}

fn down(dir: &Path) -> Result<ExitCode> {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let files = pid_files(&dir);
    let namespaces = recorded_namespaces(&dir);
    let mut o = String::new();
    if files.is_empty() && namespaces.is_empty() {
        outln!(o, "no testbed running in {}", dir.display());
        emit(&o);
        return Ok(ExitCode::SUCCESS);
    }
    let ours: Vec<(String, PathBuf, u32)> =
        files.iter().filter(|(_, p, pid)| alive(*pid) && is_our_node(*pid, &p.join("node.toml"))).cloned().collect();
    for (_, _, pid) in &ours {
        signal(*pid, "-TERM");
    }
    let deadline = Instant::now() + TERM_GRACE;
    while ours.iter().any(|(_, _, pid)| alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut killed = Vec::new();
    for (name, _, pid) in &ours {
        if alive(*pid) {
            signal(*pid, "-KILL");
            killed.push(name.as_str());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while ours.iter().any(|(_, _, pid)| alive(*pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stuck: Vec<String> =
        ours.iter().filter(|(_, _, pid)| alive(*pid)).map(|(n, _, pid)| format!("{n} (pid {pid})")).collect();
    for (_, p, pid) in &files {
        if !alive(*pid) || !is_our_node(*pid, &p.join("node.toml")) {
            let _ = fs::remove_file(p.join("pid"));
        }
    }
    let ns_errors = delete_namespaces(&namespaces);
    if ns_errors.is_empty() {
        let _ = fs::remove_file(dir.join("namespaces"));
    }
    let names: Vec<&str> = ours.iter().map(|(n, _, _)| n.as_str()).collect();
    out!(o, "testbed down: stopped {} node(s) in {}", ours.len(), dir.display());
    if !names.is_empty() {
        out!(o, " ({})", names.join(", "));
    }
    if !namespaces.is_empty() {
        out!(o, "; deleted {} network namespace(s)", namespaces.len() - ns_errors.len());
    }
    outln!(o);
    if !killed.is_empty() {
        outln!(o, "  did not stop within {} s of SIGTERM, killed: {}", TERM_GRACE.as_secs(), killed.join(", "));
    }
    emit(&o);
    if !stuck.is_empty() || !ns_errors.is_empty() {
        bail!("could not stop everything: {}", stuck.into_iter().chain(ns_errors).collect::<Vec<_>>().join("; "));
    }
    Ok(ExitCode::SUCCESS)
}

fn status(dir: &Path) -> Result<ExitCode> {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let topo_path = dir.join("topology.toml");
    let mut o = String::new();
    if !topo_path.exists() {
        outln!(
            o,
            "no testbed in {} (start one with `anode testbed up TOPOLOGY --dir {}`)",
            dir.display(),
            dir.display()
        );
        emit(&o);
        return Ok(ExitCode::from(3));
    }
    let (_, topo) = read_topology(&topo_path)?;
    let mut up = 0;
    let mut rows = Vec::new();
    for n in &topo.nodes {
        let nd = dir.join(&n.name);
        let (pid, state) = match read_pid(&nd) {
            Some(pid) if alive(pid) && is_our_node(pid, &nd.join("node.toml")) => {
                up += 1;
                (pid.to_string(), "running")
            }
            Some(pid) => (pid.to_string(), "dead"),
            None => ("-".into(), "stopped"),
        };
        rows.push((n.name.clone(), n.address, pid, state, nd));
    }
    outln!(
        o,
        "testbed in {}: {} of {} nodes running ({})",
        dir.display(),
        up,
        topo.nodes.len(),
        if dir.join("netns.sh").exists() { "network namespaces" } else { "loopback" }
    );
    let w = topo.nodes.iter().map(|n| n.name.len()).max().unwrap_or(4).max(4);
    outln!(o, "  {:<w$}  {:<15} {:>7}  {:<8} run dir", "name", "address", "pid", "state");
    for (name, addr, pid, state, nd) in rows {
        outln!(o, "  {name:<w$}  {:<15} {pid:>7}  {state:<8} {}", addr.to_string(), nd.display());
    }
    emit(&o);
    Ok(if up == topo.nodes.len() { ExitCode::SUCCESS } else { ExitCode::from(3) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn topo(text: &str) -> Topology {
        Topology::from_toml(text).expect("topology")
    }

    const LINE3: &str = r#"
node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }, { name = "c", address = "10.0.0.3" }]
link = [{ a = "a", b = "b" }, { a = "b", b = "c" }]
"#;

    #[test]
    fn loopback_plan_is_symmetric() {
        let t = topo(LINE3);
        let p = plan(&t, Path::new("/tb"), &Endpoints::Loopback((7000..7004).collect()), None, None, Tuning::default())
            .expect("plan");
        let cfgs: Vec<NodeConfig> = p.nodes.iter().map(|n| NodeConfig::from_toml(&n.config).expect("valid")).collect();
        assert_eq!(cfgs[1].interfaces.len(), 2);
        assert_eq!(cfgs[1].run_dir.as_deref(), Some(Path::new("/tb/b")));
        assert_eq!(cfgs[1].routes.topology.as_deref(), Some(Path::new("/tb/topology.toml")));
        // a's interface "b" talks to b's interface "a", and back.
        let (ab, ba) = (&cfgs[0].interfaces[0], &cfgs[1].interfaces[0]);
        assert_eq!((ab.name.as_str(), ba.name.as_str()), ("b", "a"));
        assert_eq!(ab.neighbors[0].endpoint, ba.listen);
        assert_eq!(ba.neighbors[0].endpoint, ab.listen);
        let ports: BTreeSet<u16> = cfgs.iter().flat_map(|c| c.interfaces.iter().map(|i| i.listen.port())).collect();
        assert_eq!(ports.len(), 4, "every interface has its own port");
    }

    #[test]
    fn netns_plan_routes_along_shortest_paths() {
        let t = topo(LINE3);
        let p = plan(&t, Path::new("/tb"), &Endpoints::Netns(7000), None, None, Tuning::default()).expect("plan");
        let a = NodeConfig::from_toml(&p.nodes[0].config).expect("valid");
        assert_eq!(a.interfaces[0].listen, "172.31.0.1:7000".parse().expect("addr"));
        assert_eq!(a.interfaces[0].neighbors[0].endpoint, "172.31.0.2:7000".parse().expect("addr"));
        let lines: Vec<String> = p.netns_setup.iter().map(|c| c.join(" ")).collect();
        assert!(lines.contains(&"ip netns add anode-a".to_owned()));
        assert!(lines.contains(&"ip -n anode-a link add to-b type veth peer name to-a netns anode-b".to_owned()));
        assert!(lines.contains(&"ip -n anode-a route add 10.0.0.3/32 via 172.31.0.2 dev to-b src 10.0.0.1".to_owned()));
        assert!(lines.contains(&"ip -n anode-c route add 10.0.0.1/32 via 172.31.0.5 dev to-b src 10.0.0.3".to_owned()));
        let routes = lines.iter().filter(|l| l.contains(" route add ")).count();
        assert_eq!(routes, 6, "every node routes to every other");
    }

    #[test]
    fn bad_topologies_are_explained() {
        let e = |text: &str| check_topology(&topo(text)).expect_err("bad").to_string();
        let two = r#"node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }]"#;
        // Duplicate and self links fail the node's own topology check.
        let parse = |text: &str| Topology::from_toml(text).expect_err("bad").to_string();
        assert!(
            parse(&format!("{two}\nlink = [{{ a = \"a\", b = \"b\" }}, {{ a = \"b\", b = \"a\" }}]"))
                .contains("link a-b is listed twice")
        );
        assert!(
            parse(&format!("{two}\nlink = [{{ a = \"a\", b = \"a\" }}, {{ a = \"a\", b = \"b\" }}]"))
                .contains("joins node \"a\" to itself")
        );
        assert!(e(two).contains("no links"));
        assert!(e(r#"node = [{ name = "a/b", address = "10.0.0.1" }]"#).contains("not usable"));
        assert!(e("node = []").contains("no nodes"));
    }

    #[test]
    fn long_names_get_short_interfaces() {
        assert_eq!(veth_name("b", 3), "to-b");
        assert_eq!(veth_name("a-very-long-name", 3), "link3");
        assert_eq!(link_addrs(64).expect("addrs"), (Ipv4Addr::new(172, 31, 1, 1), Ipv4Addr::new(172, 31, 1, 2)));
        assert!(link_addrs(1 << 14).is_err());
    }
}
