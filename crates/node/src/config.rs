//! Node configuration and topology files (TOML), documented in
//! `docs/node.md` with an example in `examples/node/`.
//!
//! Parsing is separate from I/O: [`NodeConfig::from_toml`] and
//! [`Topology::from_toml`] take text; the daemon reads the files.

use core::net::{Ipv4Addr, SocketAddr};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// A configuration problem, with enough context to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The TOML does not parse or does not match the schema.
    #[error("{0}")]
    Syntax(String),
    /// The node has no interfaces.
    #[error("no [[interface]] sections: a node needs at least one interface")]
    NoInterfaces,
    /// Two interfaces share a name or a listen address.
    #[error("interface {0:?} is defined twice (names and listen addresses must be unique)")]
    DuplicateInterface(String),
    /// A neighbour address appears twice.
    #[error("neighbour {0} is listed twice")]
    DuplicateNeighbor(Ipv4Addr),
    /// A neighbour uses the node's own address.
    #[error("neighbour {0} has this node's own address")]
    SelfNeighbor(Ipv4Addr),
    /// A static route goes via an address that is not a neighbour.
    #[error("route to {dest} goes via {via}, which is not a neighbour of this node")]
    ViaNotNeighbor {
        /// Route destination.
        dest: Ipv4Addr,
        /// The bad next hop.
        via: Ipv4Addr,
    },
    /// The MTU is outside the supported range.
    #[error("mtu {0} outside 128..=8192")]
    BadMtu(usize),
    /// A topology names a node that does not exist.
    #[error("topology link names unknown node {0:?}")]
    UnknownNode(String),
    /// A topology defines a node twice.
    #[error("topology defines node {0:?} twice")]
    DuplicateNode(String),
    /// This node's address is not in the topology.
    #[error("this node's address {0} is not in the topology")]
    NotInTopology(Ipv4Addr),
}

fn default_mtu() -> usize {
    anode_snap::vm::DEFAULT_MTU
}

/// One neighbour on an interface.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NeighborConfig {
    /// The neighbour's overlay address.
    pub address: Ipv4Addr,
    /// Its UDP endpoint.
    pub endpoint: SocketAddr,
}

/// One interface: a UDP socket and the neighbours reached through it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceConfig {
    /// Interface name, for counters and logs.
    pub name: String,
    /// Local UDP address to bind.
    pub listen: SocketAddr,
    /// Neighbours reached through this interface.
    #[serde(default)]
    pub neighbors: Vec<NeighborConfig>,
}

/// A static route.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticRoute {
    /// Destination overlay address.
    pub dest: Ipv4Addr,
    /// Next hop: a neighbour's address.
    pub via: Ipv4Addr,
}

/// Routing configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutesConfig {
    /// Static routes (take precedence over the topology).
    #[serde(default, rename = "static")]
    pub static_routes: Vec<StaticRoute>,
    /// A topology file shared by all nodes; routes are its shortest paths.
    /// Relative paths are relative to the config file.
    pub topology: Option<PathBuf>,
    /// Next hop for destinations without a route, and for ANEP packets of
    /// unknown type whose flags say "pass on".
    pub default_via: Option<Ipv4Addr>,
}

/// A node's configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// The node's overlay address.
    pub address: Ipv4Addr,
    /// Largest SNAP packet, in bytes.
    #[serde(default = "default_mtu")]
    pub mtu: usize,
    /// Directory for the control and application sockets.
    pub run_dir: Option<PathBuf>,
    /// Prometheus metrics listen address (off when absent).
    pub metrics: Option<SocketAddr>,
    /// Interfaces.
    #[serde(default, rename = "interface")]
    pub interfaces: Vec<InterfaceConfig>,
    /// Routes.
    #[serde(default)]
    pub routes: RoutesConfig,
}

impl NodeConfig {
    /// Parses and validates a configuration.
    pub fn from_toml(text: &str) -> Result<NodeConfig, ConfigError> {
        let c: NodeConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Checks the rules that the schema alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(128..=8192).contains(&self.mtu) {
            return Err(ConfigError::BadMtu(self.mtu));
        }
        if self.interfaces.is_empty() {
            return Err(ConfigError::NoInterfaces);
        }
        let mut names = BTreeSet::new();
        let mut listens = BTreeSet::new();
        let mut nbrs = BTreeSet::new();
        for i in &self.interfaces {
            if !names.insert(i.name.clone()) || !listens.insert(i.listen) {
                return Err(ConfigError::DuplicateInterface(i.name.clone()));
            }
            for n in &i.neighbors {
                if n.address == self.address {
                    return Err(ConfigError::SelfNeighbor(n.address));
                }
                if !nbrs.insert(n.address) {
                    return Err(ConfigError::DuplicateNeighbor(n.address));
                }
            }
        }
        for r in &self.routes.static_routes {
            if !nbrs.contains(&r.via) {
                return Err(ConfigError::ViaNotNeighbor { dest: r.dest, via: r.via });
            }
        }
        if let Some(via) = self.routes.default_via
            && !nbrs.contains(&via)
        {
            return Err(ConfigError::ViaNotNeighbor { dest: Ipv4Addr::UNSPECIFIED, via });
        }
        Ok(())
    }

    /// Neighbour addresses, in interface order.
    pub fn neighbor_addrs(&self) -> Vec<Ipv4Addr> {
        self.interfaces.iter().flat_map(|i| i.neighbors.iter().map(|n| n.address)).collect()
    }
}

/// A topology node.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopoNode {
    /// Short name.
    pub name: String,
    /// Overlay address.
    pub address: Ipv4Addr,
}

/// A topology link between two nodes, by name.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopoLink {
    /// One end.
    pub a: String,
    /// The other end.
    pub b: String,
}

/// A topology file shared by all nodes of a network.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// Nodes.
    #[serde(rename = "node")]
    pub nodes: Vec<TopoNode>,
    /// Links.
    #[serde(default, rename = "link")]
    pub links: Vec<TopoLink>,
}

impl Topology {
    /// Parses and validates a topology.
    pub fn from_toml(text: &str) -> Result<Topology, ConfigError> {
        let t: Topology = toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let mut names = BTreeSet::new();
        let mut addrs = BTreeSet::new();
        for n in &t.nodes {
            if !names.insert(n.name.as_str()) || !addrs.insert(n.address) {
                return Err(ConfigError::DuplicateNode(n.name.clone()));
            }
        }
        for l in &t.links {
            for end in [&l.a, &l.b] {
                if !names.contains(end.as_str()) {
                    return Err(ConfigError::UnknownNode(end.clone()));
                }
            }
        }
        Ok(t)
    }

    /// The address of the node called `name`.
    pub fn address_of(&self, name: &str) -> Option<Ipv4Addr> {
        self.nodes.iter().find(|n| n.name == name).map(|n| n.address)
    }

    /// Neighbours of `a`, sorted.
    pub fn neighbors(&self, a: Ipv4Addr) -> Vec<Ipv4Addr> {
        let mut v = BTreeSet::new();
        for l in &self.links {
            let (x, y) = (self.address_of(&l.a), self.address_of(&l.b));
            if x == Some(a)
                && let Some(y) = y
            {
                v.insert(y);
            }
            if y == Some(a)
                && let Some(x) = x
            {
                v.insert(x);
            }
        }
        v.remove(&a);
        v.into_iter().collect()
    }

    /// Shortest-path next hops from `from` to every reachable node
    /// (breadth first; ties go to the lowest neighbour address, so every
    /// node computes consistent routes).
    pub fn next_hops(&self, from: Ipv4Addr) -> Result<BTreeMap<Ipv4Addr, Ipv4Addr>, ConfigError> {
        if !self.nodes.iter().any(|n| n.address == from) {
            return Err(ConfigError::NotInTopology(from));
        }
        let first = anode_snap::sim::first_hops(from, |a| self.neighbors(a));
        Ok(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fuzzing::NODE;

    #[test]
    fn parses_and_validates() {
        let c = NodeConfig::from_toml(NODE).expect("valid");
        assert_eq!(c.mtu, 1400);
        assert_eq!(c.neighbor_addrs(), vec![Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 3)]);
    }

    #[test]
    fn config_errors_are_clear() {
        let e = |t: &str| NodeConfig::from_toml(t).expect_err("invalid").to_string();
        assert!(e("address = \"10.0.0.1\"").contains("no [[interface]]"));
        assert!(e("address = \"10.0.0.300\"").contains("invalid"));
        assert!(
            e(&NODE.replace(
                "static = [{ dest = \"10.0.0.4\", via = \"10.0.0.3\" }]",
                "static = [{ dest = \"10.0.0.4\", via = \"10.0.0.9\" }]"
            ))
            .contains("not a neighbour")
        );
        assert!(e(&NODE.replace("name = \"east\"", "name = \"west\"")).contains("defined twice"));
        assert!(e(&NODE.replace("address = \"10.0.0.3\"", "address = \"10.0.0.2\"")).contains("own address"));
        assert!(e(&format!("mtu = 10\n{NODE}")).contains("mtu 10"));
        assert!(e(&format!("bogus = 1\n{NODE}")).contains("unknown field"));
    }

    #[test]
    fn shortest_paths() {
        let t = Topology::from_toml(
            r#"
node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" },
        { name = "c", address = "10.0.0.3" }, { name = "d", address = "10.0.0.4" }]
link = [{ a = "a", b = "b" }, { a = "b", b = "c" }, { a = "c", b = "d" }, { a = "d", b = "a" }]
"#,
        )
        .expect("topology");
        let a = |n| Ipv4Addr::new(10, 0, 0, n);
        let h = t.next_hops(a(1)).expect("routes");
        assert_eq!(h[&a(2)], a(2));
        assert_eq!(h[&a(4)], a(4));
        assert_eq!(h[&a(3)], a(2), "tie broken toward the lower neighbour");
        assert!(
            Topology::from_toml("node = [{ name = \"a\", address = \"10.0.0.1\" }]\nlink = [{ a = \"a\", b = \"z\" }]")
                .is_err()
        );
        assert_eq!(t.next_hops(a(9)), Err(ConfigError::NotInTopology(a(9))));
    }
}
