//! A deterministic in-memory network of SNAP nodes, for tests, tools and the
//! demonstration. Nodes are [`SimpleNode`]s joined by links; routes are
//! shortest paths. Packets move hop by hop through a FIFO queue; each hop
//! runs the VM exactly as a daemon would, so multi-node behaviour is testable
//! in one process.

use crate::vm::{Action, End, SendKind, SimpleNode, Tracer, Vm, VmConfig};
use core::net::Ipv4Addr;
use std::collections::{BTreeMap, VecDeque};

/// One packet execution at one node.
#[derive(Debug, Clone)]
pub struct Hop {
    /// The node that executed the packet.
    pub node: Ipv4Addr,
    /// How it ended.
    pub end: End,
    /// Instructions executed.
    pub executed: u32,
    /// Resource bound on arrival.
    pub rb_in: u16,
    /// Where its sends went: (destination, next hop, kind, bytes).
    pub sends: Vec<(Ipv4Addr, Ipv4Addr, SendKind, usize)>,
    /// Lines of per-instruction trace, when tracing.
    pub trace: Vec<String>,
}

/// A payload delivered to an application port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The node it was delivered at.
    pub node: Ipv4Addr,
    /// The port.
    pub port: u16,
    /// The bytes.
    pub payload: Vec<u8>,
}

/// What happened to an injected packet and all its descendants.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every execution, in order.
    pub hops: Vec<Hop>,
    /// Every delivery, in order.
    pub deliveries: Vec<Delivery>,
    /// Packets dropped for lack of a route: (node, destination).
    pub unroutable: Vec<(Ipv4Addr, Ipv4Addr)>,
    /// Link transmissions.
    pub transmissions: u32,
}

/// The network.
#[derive(Debug, Clone)]
pub struct Network {
    nodes: BTreeMap<Ipv4Addr, SimpleNode>,
    links: Vec<(Ipv4Addr, Ipv4Addr)>,
    vm: Vm,
    /// Safety net for the simulator itself; never reached when resource
    /// bounds hold.
    pub max_steps: usize,
}

/// A tracer that renders one line per executed instruction: index,
/// instruction, and the stack afterwards (top first).
#[derive(Debug, Default, Clone)]
pub struct TextTracer {
    /// The rendered lines.
    pub lines: Vec<String>,
}

impl Tracer for TextTracer {
    const ENABLED: bool = true;
    fn step(&mut self, pc: usize, insn: Result<crate::ops::Insn, u32>, view: &crate::vm::TraceView<'_>) {
        let text = match insn {
            Ok(i) => i.to_string(),
            Err(w) => format!(".word {w:#010x}"),
        };
        let stack: Vec<String> = view.stack().iter().rev().map(|v| view.render(*v)).collect();
        let fault = view.fault.map(|f| format!("  FAULT {f}")).unwrap_or_default();
        self.lines.push(format!("{pc:4}  {text:<14} [{}]{fault}", stack.join(" :: ")));
    }
}

impl Network {
    /// A network of the given nodes (each with `interfaces` interfaces) joined
    /// by undirected links.
    pub fn new(addrs: &[Ipv4Addr], links: &[(Ipv4Addr, Ipv4Addr)], cfg: VmConfig) -> Network {
        let mut nodes = BTreeMap::new();
        for &a in addrs {
            let degree = links.iter().filter(|(x, y)| *x == a || *y == a).count();
            nodes.insert(a, SimpleNode::new(a, degree.clamp(1, u8::MAX as usize) as u8));
        }
        let mut net = Network { nodes, links: links.to_vec(), vm: Vm::new(cfg), max_steps: 100_000 };
        net.compute_routes();
        net
    }

    /// A line a - b - c - ... of `n` nodes 10.0.0.1, 10.0.0.2, ...
    pub fn line(n: u8, cfg: VmConfig) -> Network {
        let addrs: Vec<_> = (1..=n).map(|i| Ipv4Addr::new(10, 0, 0, i)).collect();
        let links: Vec<_> = addrs.windows(2).map(|w| (w[0], w[1])).collect();
        Network::new(&addrs, &links, cfg)
    }

    /// The node at `a`, to adjust its settings.
    pub fn node_mut(&mut self, a: Ipv4Addr) -> Option<&mut SimpleNode> {
        self.nodes.get_mut(&a)
    }

    fn neighbors_of(&self, a: Ipv4Addr) -> Vec<Ipv4Addr> {
        let mut v: Vec<_> = self
            .links
            .iter()
            .filter_map(|&(x, y)| {
                if x == a {
                    Some(y)
                } else if y == a {
                    Some(x)
                } else {
                    None
                }
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }

    fn compute_routes(&mut self) {
        let addrs: Vec<_> = self.nodes.keys().copied().collect();
        for &src in &addrs {
            let first = first_hops(src, |a| self.neighbors_of(a));
            let nbrs = self.neighbors_of(src);
            if let Some(node) = self.nodes.get_mut(&src) {
                node.routes = first.into_iter().collect();
                node.neighbors = nbrs;
            }
        }
    }

    /// Injects `packet` at node `at` and runs until no packet is in flight.
    pub fn inject(&mut self, at: Ipv4Addr, packet: &[u8], trace: bool) -> Report {
        let mut report = Report::default();
        let mut queue: VecDeque<(Ipv4Addr, Vec<u8>)> = VecDeque::new();
        queue.push_back((at, packet.to_vec()));
        let mut steps = 0;
        while let Some((here, bytes)) = queue.pop_front() {
            steps += 1;
            if steps > self.max_steps {
                break;
            }
            let Some(node) = self.nodes.get(&here) else { continue };
            let len = bytes.len();
            let mut buf = bytes;
            buf.resize(len + 4 * len + 64, 0);
            let mut tracer = TextTracer::default();
            let out = if trace {
                self.vm.execute_traced(&mut buf, len, node, &mut tracer)
            } else {
                self.vm.execute(&mut buf, len, node)
            };
            let mut hop = Hop {
                node: here,
                end: out.end,
                executed: out.executed,
                rb_in: out.rb_in,
                sends: Vec::new(),
                trace: tracer.lines,
            };
            for a in out.actions() {
                match a {
                    Action::Send { dest, kind, packet } => {
                        let bytes = out.bytes(packet, &buf).to_vec();
                        let next = if node.addrs.contains(dest) { Some(here) } else { node.next_hop_of(*dest) };
                        match next {
                            Some(n) => {
                                if n != here {
                                    report.transmissions += 1;
                                }
                                hop.sends.push((*dest, n, *kind, bytes.len()));
                                queue.push_back((n, bytes));
                            }
                            None => report.unroutable.push((here, *dest)),
                        }
                    }
                    Action::Deliver { port, payload } => report.deliveries.push(Delivery {
                        node: here,
                        port: *port,
                        payload: out.bytes(payload, &buf).to_vec(),
                    }),
                }
            }
            report.hops.push(hop);
        }
        report
    }
}

/// Shortest-path routing by breadth-first search: the first hop from `from`
/// toward every node reachable through `neighbors`. Ties go to the neighbour
/// listed first, so with sorted neighbour lists every node computes
/// consistent routes. Used by this simulator and by the node's topology
/// routes.
pub fn first_hops(from: Ipv4Addr, neighbors: impl Fn(Ipv4Addr) -> Vec<Ipv4Addr>) -> BTreeMap<Ipv4Addr, Ipv4Addr> {
    let mut first = BTreeMap::new();
    let mut q = VecDeque::new();
    for n in neighbors(from) {
        if n != from && !first.contains_key(&n) {
            first.insert(n, n);
            q.push_back(n);
        }
    }
    while let Some(u) = q.pop_front() {
        let hop = first[&u];
        for v in neighbors(u) {
            if v != from && !first.contains_key(&v) {
                first.insert(v, hop);
                q.push_back(v);
            }
        }
    }
    first
}

impl SimpleNode {
    fn next_hop_of(&self, dest: Ipv4Addr) -> Option<Ipv4Addr> {
        use crate::vm::NodeContext;
        self.next_hop(dest)
    }
}
