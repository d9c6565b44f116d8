//! `anode plan`: compile PLAN programs to SNAP and run them on a node or on
//! the in-process simulator.

use crate::apps::{self, NodeSel};
use anode_node::config::Topology;
use anode_plan::{Compiled, Options};
use anode_snap::sim::Network;
use anode_snap::vm::VmConfig;
use anyhow::{Context, Result, anyhow, bail};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// `anode plan` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum PlanCmd {
    /// Compile a PLAN program into a SNAP packet (or assembler text with -S).
    Compile {
        /// PLAN source file (`-` for stdin).
        file: PathBuf,
        /// Output file (default: the source name with `.snap`, or `.s` with -S).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Write assembler text that `anode snap asm` accepts instead of the packet.
        #[arg(short = 'S')]
        asm: bool,
        #[command(flatten)]
        hdr: HeaderArgs,
    },
    /// Parse and type-check a PLAN program.
    Check {
        /// PLAN source file.
        file: PathBuf,
    },
    /// Compile a PLAN program and inject it into a running node, or into the
    /// in-process simulator with --sim.
    Run {
        /// PLAN source file.
        file: PathBuf,
        #[command(flatten)]
        hdr: HeaderArgs,
        /// Run on the in-process simulator instead of a running node.
        #[arg(long)]
        sim: bool,
        /// Simulator: a topology file (default: a line of --nodes nodes 10.0.0.1, 10.0.0.2, ...).
        #[arg(long, requires = "sim")]
        topology: Option<PathBuf>,
        /// Simulator: number of nodes of the line.
        #[arg(long, default_value_t = 3, requires = "sim")]
        nodes: u8,
        /// Simulator: print the per-instruction trace of every hop.
        #[arg(long, requires = "sim")]
        trace: bool,
        /// Node: seconds to wait for deliveries on --port.
        #[arg(short = 'W', long, default_value_t = 2.0)]
        timeout: f64,
        /// Node: stop after this many deliveries on --port.
        #[arg(long)]
        count: Option<u64>,
        #[command(flatten)]
        sel: NodeSel,
    },
}

/// Header fields and limits of the built packet.
#[derive(Debug, Clone, clap::Args)]
pub struct HeaderArgs {
    /// Source address (default 10.0.0.1; `run` uses the node's own address).
    #[arg(long)]
    pub src: Option<Ipv4Addr>,
    /// Replace the invocation's destination.
    #[arg(long)]
    pub dst: Option<Ipv4Addr>,
    /// Replace the invocation's resource bound.
    #[arg(long)]
    pub rb: Option<u16>,
    /// The header's application port (`getPort()`); `run` also listens on it.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Packet size limit in bytes.
    #[arg(long, default_value_t = anode_snap::vm::DEFAULT_MTU)]
    pub mtu: usize,
    /// Do not optimise (shows the plain translation).
    #[arg(long)]
    pub no_opt: bool,
}

impl HeaderArgs {
    fn options(&self, src: Option<Ipv4Addr>) -> Options {
        Options {
            mtu: self.mtu,
            src: src.or(self.src).unwrap_or(Ipv4Addr::new(10, 0, 0, 1)),
            dst: self.dst,
            rb: self.rb,
            port: self.port,
            optimize: !self.no_opt,
        }
    }
}

fn compile(file: &Path, opts: &Options) -> Result<Compiled> {
    let src = crate::read_source(file)?;
    anode_plan::compile(&file.display().to_string(), &src, opts).map_err(|e| anyhow!("{e}"))
}

/// Runs an `anode plan` subcommand.
pub fn run(c: PlanCmd) -> Result<ExitCode> {
    match c {
        PlanCmd::Compile { file, output, asm, hdr } => {
            let c = compile(&file, &hdr.options(None))?;
            let out = output.unwrap_or_else(|| file.with_extension(if asm { "s" } else { "snap" }));
            let data: &[u8] = if asm { c.asm.as_bytes() } else { &c.bytes };
            if out.as_os_str() == "-" {
                std::io::stdout().write_all(data).context("writing to standard output")?;
            } else {
                std::fs::write(&out, data).with_context(|| format!("writing {}", out.display()))?;
            }
            eprintln!(
                "{}: {} bytes ({} code, {} heap, {} stack words)",
                out.display(),
                c.bytes.len(),
                c.packet.code.len(),
                c.packet.heap.len(),
                c.packet.stack.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        PlanCmd::Check { file } => {
            let src = crate::read_source(&file)?;
            anode_plan::check(&file.display().to_string(), &src).map_err(|e| anyhow!("{e}"))?;
            println!("{}: ok", file.display());
            Ok(ExitCode::SUCCESS)
        }
        PlanCmd::Run { file, hdr, sim: true, topology, nodes, trace, .. } => {
            let c = compile(&file, &hdr.options(None))?;
            let mut net = match topology {
                Some(t) => {
                    let text = std::fs::read_to_string(&t).with_context(|| format!("reading {}", t.display()))?;
                    let topo = Topology::from_toml(&text).map_err(|e| anyhow!("{}: {e}", t.display()))?;
                    sim_network(&topo)
                }
                None => {
                    if !(2..=64).contains(&nodes) {
                        bail!("--nodes must be 2..64");
                    }
                    Network::line(nodes, VmConfig::default())
                }
            };
            let at = c.packet.src;
            let report = net.inject(at, &c.bytes, trace);
            println!("{}: {} bytes, injected at {at}", file.display(), c.bytes.len());
            if trace {
                for h in &report.hops {
                    println!("-- {} (rb {})", h.node, h.rb_in);
                    for l in &h.trace {
                        println!("{l}");
                    }
                }
            }
            print!("{}", anode_plan::outcome_text(&report));
            let faulted = report.hops.iter().any(|h| matches!(h.end, anode_snap::vm::End::Fault { .. }));
            Ok(if faulted { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
        PlanCmd::Run { file, hdr, timeout, count, sel, .. } => {
            let wait = Duration::try_from_secs_f64(timeout).map_err(|_| anyhow!("-W must be a non-negative number"))?;
            let (mut client, here, mtu) = apps::connect(&sel)?;
            let mut opts = hdr.options(Some(here));
            opts.mtu = opts.mtu.min(mtu);
            let c = compile(&file, &opts)?;
            if hdr.port != 0 {
                client.register(hdr.port)?;
            }
            client.inject(&c.bytes)?;
            println!("{}: {} bytes injected at {here}", file.display(), c.bytes.len());
            let mut got = 0u64;
            if hdr.port != 0 {
                let deadline = Instant::now() + wait;
                while count.is_none_or(|n| got < n) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let Some((p, payload)) = client.recv(left)? else { break };
                    if p != hdr.port {
                        continue;
                    }
                    got += 1;
                    let text = if payload.iter().all(|b| (0x20..0x7f).contains(b)) {
                        format!("{:?}", String::from_utf8_lossy(&payload))
                    } else {
                        payload.iter().map(|b| format!("{b:02x}")).collect()
                    };
                    println!("delivered on port {p}: {text}");
                }
                let _ = client.unregister(hdr.port);
            }
            Ok(if count.is_some_and(|n| got < n) { ExitCode::from(1) } else { ExitCode::SUCCESS })
        }
    }
}

/// The simulator network of a topology: one interface per link.
pub fn sim_network(t: &Topology) -> Network {
    let addrs: Vec<Ipv4Addr> = t.nodes.iter().map(|n| n.address).collect();
    let by_name = |n: &str| t.nodes.iter().find(|x| x.name == n).map(|x| x.address);
    let links: Vec<(Ipv4Addr, Ipv4Addr)> =
        t.links.iter().filter_map(|l| Some((by_name(&l.a)?, by_name(&l.b)?))).collect();
    Network::new(&addrs, &links, VmConfig::default())
}
