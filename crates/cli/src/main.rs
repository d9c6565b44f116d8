//! `anode`: the command-line front end of the anode active network node.
//!
//! This binary owns files, clocks and output; the libraries it calls are
//! sans-I/O.

use anode_snap::asm;
use anode_snap::bound::bounds;
use anode_snap::disasm;
use anode_snap::sim::{Report, TextTracer};
use anode_snap::vm::{Action, End, SimpleNode, Vm, VmConfig};
use anode_snap::wire::{Packet, Repr};
use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

mod account_cmd;
mod apps;
mod boot_cmd;
mod boot_peer;
mod capture_cmd;
mod cred_cmd;
mod demo;
mod domain_cmd;
mod experiment;
mod keys_cmd;
mod module_cmd;
mod monitor_cmd;
mod node_cmd;
mod plan_cmd;
mod sa_client;
mod session_cmd;
mod testbed;

/// anode: a secure, resource-controlled programmable network node.
#[derive(Debug, Parser)]
#[command(name = "anode", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// SNAP active-packet tools: assemble, disassemble, run one hop, bounds.
    #[command(subcommand)]
    Snap(SnapCmd),
    /// Run an active node: the daemon.
    Node(node_cmd::NodeArgs),
    /// Show a running node's counters.
    Status(node_cmd::StatusArgs),
    /// Write what a running node sends and receives, in plaintext (after
    /// decryption in, before encryption out), as pcap: the operator only.
    Capture(capture_cmd::CaptureArgs),
    /// SNAP ping through a running node (SNAP paper, Fig. 1).
    Ping(apps::PingArgs),
    /// SNAP traceroute: every hop reports back with `send`.
    Traceroute(apps::TracerouteArgs),
    /// Send stdin or a file to an application port on a remote node.
    Send(apps::SendArgs),
    /// Receive what is sent to a local application port.
    Recv(apps::RecvArgs),
    /// Multicast a message to a list of hosts in one SNAP packet, limited by its resource bound.
    Multicast(apps::MulticastArgs),
    /// Load a module into a running node over an authenticated control message.
    #[command(subcommand)]
    Module(module_cmd::ModuleCmd),
    /// A principal's RCANE sessions on a node: open, list, show, reserve, close.
    #[command(subcommand)]
    Session(session_cmd::SessionCmd),
    /// FLAME: untrusted monitoring modules on captures and live interfaces, under policy.
    #[command(subcommand)]
    Monitor(monitor_cmd::MonitorCmd),
    /// Credentials (module, session, monitoring): issue, show, attenuate.
    #[command(subcommand)]
    Cred(cred_cmd::CredCmd),
    /// Node and user identities: generate and show Ed25519 keys.
    #[command(subcommand)]
    Keys(keys_cmd::KeysCmd),
    /// PLAN programs: compile to SNAP, check, run on a node or the simulator.
    #[command(subcommand)]
    Plan(plan_cmd::PlanCmd),
    /// The verified boot chain: make the signed metadata (keygen, sign) and
    /// verify a node's chain layer by layer (verify).
    #[command(subcommand)]
    Boot(boot_cmd::BootCmd),
    /// Administrative domains: make a domain secret; get a ticket from a
    /// node's key distribution service; send ticket packets to its nodes.
    #[command(subcommand)]
    Domain(domain_cmd::DomainCmd),
    /// Start or stop a testbed of nodes from a topology file.
    #[command(subcommand)]
    Testbed(testbed::TestbedCmd),
    /// Read the accounting ledger: what each principal used.
    Account(account_cmd::AccountArgs),
    /// Reproduce the papers' experiments (RCANE Fig. 11 baselines and plot).
    #[command(subcommand)]
    Experiment(experiment::ExperimentCmd),
    /// Run the local demonstration: SNAP ping, traceroute and hostile packets
    /// on a simulated line of nodes, with per-instruction traces.
    Demo {
        /// Number of nodes in the line (2..=8).
        #[arg(long, default_value_t = 3)]
        nodes: u8,
        /// Print only the summary lines, not the per-instruction traces.
        #[arg(long)]
        quiet: bool,
    },
}

#[derive(Debug, Subcommand)]
enum SnapCmd {
    /// Assemble SNAP assembler text into a binary packet.
    Asm {
        /// Source file (`-` for stdin).
        file: PathBuf,
        /// Output file (default: the source name with `.snap`).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Disassemble a binary packet into assembler text that reassembles to
    /// the same bytes.
    Disasm {
        /// Packet file.
        file: PathBuf,
    },
    /// Execute one hop of a packet and print the outcome and a trace.
    Run {
        /// Packet file (a `.s` source is assembled first).
        file: PathBuf,
        /// Address of the node executing the packet.
        #[arg(long, default_value = "10.0.0.1")]
        here: Ipv4Addr,
        /// Interface count: the limit on network operations per packet.
        #[arg(long, default_value_t = 1)]
        interfaces: u8,
        /// Neighbours of this node (comma separated), for `nbr`/`nexthop`.
        #[arg(long, value_delimiter = ',')]
        neighbors: Vec<Ipv4Addr>,
        /// MTU: the largest packet accepted or produced, in bytes.
        #[arg(long, default_value_t = anode_snap::vm::DEFAULT_MTU)]
        mtu: usize,
        /// Node clock in milliseconds, for the clock services.
        #[arg(long, default_value_t = 0)]
        now_ms: u64,
        /// Do not print the per-instruction trace.
        #[arg(long)]
        no_trace: bool,
    },
    /// Print the resource bounds the design guarantees for a packet, computed
    /// before it runs.
    Bound {
        /// Packet file (a `.s` source is assembled first).
        file: PathBuf,
        /// Interface count of the node.
        #[arg(long, default_value_t = 1)]
        interfaces: u8,
        /// MTU in bytes.
        #[arg(long, default_value_t = anode_snap::vm::DEFAULT_MTU)]
        mtu: usize,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("anode: error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<std::process::ExitCode> {
    match cli.cmd {
        Cmd::Snap(c) => snap(c),
        Cmd::Demo { nodes, quiet } => demo::run(nodes, quiet),
        Cmd::Node(a) => node_cmd::run(a),
        Cmd::Status(a) => node_cmd::status(a),
        Cmd::Capture(a) => capture_cmd::run(a),
        Cmd::Ping(a) => apps::ping(a),
        Cmd::Traceroute(a) => apps::traceroute(a),
        Cmd::Send(a) => apps::send(a),
        Cmd::Recv(a) => apps::recv(a),
        Cmd::Multicast(a) => apps::multicast(a),
        Cmd::Testbed(c) => testbed::run(c),
        Cmd::Keys(c) => keys_cmd::run(c),
        Cmd::Cred(c) => cred_cmd::run(c),
        Cmd::Module(c) => module_cmd::run(c),
        Cmd::Session(c) => session_cmd::run(c),
        Cmd::Monitor(c) => monitor_cmd::run(c),
        Cmd::Plan(c) => plan_cmd::run(c),
        Cmd::Account(a) => account_cmd::run(a),
        Cmd::Experiment(c) => experiment::run(c),
        Cmd::Boot(c) => boot_cmd::run(c),
        Cmd::Domain(c) => domain_cmd::run(c),
    }
}

fn read_source(file: &Path) -> Result<String> {
    if file.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
    }
}

/// Assembles `src`, naming `file` in errors.
fn assemble(file: &Path, src: &str) -> Result<Repr> {
    asm::assemble(src).map_err(|e| anyhow::anyhow!("{}:{e}", file.display()))
}

/// Loads a packet: binary, or assembler source if the name ends in `.s`.
fn load_packet(file: &Path) -> Result<Vec<u8>> {
    if file.extension().is_some_and(|e| e == "s") {
        let r = assemble(file, &read_source(file)?)?;
        Ok(r.to_bytes()?)
    } else {
        let b = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        Packet::new_checked(&b[..]).with_context(|| format!("{} is not a SNAP packet", file.display()))?;
        Ok(b)
    }
}

fn snap(c: SnapCmd) -> Result<std::process::ExitCode> {
    match c {
        SnapCmd::Asm { file, output } => {
            let r = assemble(&file, &read_source(&file)?)?;
            let bytes = r.to_bytes()?;
            let out = output.unwrap_or_else(|| file.with_extension("snap"));
            std::fs::write(&out, &bytes).with_context(|| format!("writing {}", out.display()))?;
            eprintln!(
                "{}: {} bytes ({} code, {} heap, {} stack words)",
                out.display(),
                bytes.len(),
                r.code.len(),
                r.heap.len(),
                r.stack.len()
            );
        }
        SnapCmd::Disasm { file } => {
            let b = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            let r = Repr::parse_bytes(&b).with_context(|| format!("{} is not a SNAP packet", file.display()))?;
            print!("{}", disasm::disassemble(&r));
        }
        SnapCmd::Run { file, here, interfaces, neighbors, mtu, now_ms, no_trace } => {
            let bytes = load_packet(&file)?;
            if interfaces == 0 {
                bail!("--interfaces must be at least 1");
            }
            let mut node = SimpleNode::new(here, interfaces);
            node.now_ms = now_ms;
            for n in &neighbors {
                node.routes.push((*n, *n));
            }
            node.neighbors = neighbors;
            let mut vm = Vm::new(VmConfig { mtu });
            let len = bytes.len();
            let mut buf = bytes;
            buf.resize(Vm::buffer_need(len, len / 4), 0);
            let mut tracer = TextTracer::default();
            let out = vm.execute_traced(&mut buf, len, &node, &mut tracer);
            if !no_trace {
                println!("trace at {here}:");
                for l in &tracer.lines {
                    println!("  {l}");
                }
            }
            print!("{}", out.log);
            for a in out.actions() {
                match a {
                    Action::Send { dest, kind, packet } => {
                        let p = out.bytes(packet, &buf);
                        let rb = Packet::new_unchecked(p).resource_bound();
                        println!("send {kind:?} toward {dest}: {} bytes, resource bound {rb}", p.len());
                    }
                    Action::Deliver { port, payload } => {
                        let p = out.bytes(payload, &buf);
                        println!("deliver to port {port}: {} bytes {:?}", p.len(), String::from_utf8_lossy(p));
                    }
                }
            }
            println!(
                "end: {} after {} instructions (max stack {} words, {} heap words allocated, {} network ops)",
                describe_end(&out.end),
                out.executed,
                out.max_stack,
                out.heap_alloc,
                out.net_ops
            );
            if matches!(out.end, End::Fault { .. }) {
                return Ok(std::process::ExitCode::from(2));
            }
        }
        SnapCmd::Bound { file, interfaces, mtu } => {
            let bytes = load_packet(&file)?;
            let b = bounds(&bytes, interfaces, mtu)?;
            println!("{} ({} bytes, MTU {mtu}, {interfaces} interfaces)", file.display(), bytes.len());
            println!("{b}");
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// One-line description of how a packet ended.
pub(crate) fn describe_end(e: &End) -> String {
    match e {
        End::Exit => "exit".into(),
        End::Forwarded => "forwarded".into(),
        End::Delivered => "delivered".into(),
        End::Fault { fault, pc: Some(pc) } => format!("FAULT {fault} (kind {}) at instruction {pc}", fault.kind()),
        End::Fault { fault, pc: None } => format!("FAULT {fault} (kind {}) on arrival", fault.kind()),
    }
}

/// Prints a simulation report.
pub(crate) fn print_report(r: &Report, trace: bool) {
    for h in &r.hops {
        println!(
            "  at {:<10} rb {:>3}  {:<2} instr  {}",
            h.node.to_string(),
            h.rb_in,
            h.executed,
            describe_end(&h.end)
        );
        if trace {
            for l in &h.trace {
                println!("      {l}");
            }
        }
        for (dest, next, kind, bytes) in &h.sends {
            println!("      -> {kind:?} toward {dest} via {next} ({bytes} bytes)");
        }
    }
    for d in &r.deliveries {
        println!("  delivered at {} port {}: {}", d.node, d.port, show_payload(&d.payload));
    }
}

/// Renders a delivered payload: text if printable, else hex.
pub(crate) fn show_payload(p: &[u8]) -> String {
    if !p.is_empty() && p.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        format!("{:?}", String::from_utf8_lossy(p))
    } else {
        p.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join("")
    }
}
