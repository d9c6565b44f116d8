//! The layers of a node's start, and the names of the components in them.
//!
//! AEGIS (SANE §4.1.1) verifies level *i + 1* before control passes to it;
//! anode's levels, above the operating system, are:
//!
//! | order | layer | what | essential |
//! |---|---|---|---|
//! | 1 | `binary` | the `anode` executable's own bytes | yes |
//! | 2 | `config` | the node configuration and its topology file | yes |
//! | 3 | `keys` | the node's key file, credentials and certificates | yes |
//! | 4 | `switchlets` | modules loaded at start (`[modules] load`) | no |
//! | 5 | `monitor` | monitoring and pod modules loaded at start | no |
//!
//! An *essential* layer cannot be skipped: a node without its binary,
//! configuration or keys cannot run at all. A degraded start (the operator's
//! policy) may go on without a component of a non-essential layer.
//!
//! A component is named in the TUF targets metadata as
//! `<node>/<layer>/<file>`, where `<file>` is its path relative to the node's
//! base directory (the directory of its configuration file). Node names and
//! path components use `[A-Za-z0-9._-]`, never `.` or `..`.

use core::fmt;

/// Longest node name.
pub const MAX_NODE_NAME: usize = 32;
/// Longest component target name (`node/layer/file`).
pub const MAX_TARGET_NAME: usize = 240;

/// A layer of the boot chain, in verification order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    /// The node binary.
    Binary,
    /// Configuration and topology.
    Config,
    /// Keys, credentials and certificates.
    Keys,
    /// Switchlets loaded at start.
    Switchlets,
    /// Monitoring and pod modules loaded at start.
    Monitor,
}

impl Layer {
    /// Every layer, in verification order.
    pub const ALL: [Layer; 5] = [Layer::Binary, Layer::Config, Layer::Keys, Layer::Switchlets, Layer::Monitor];

    /// The layer's name in target names.
    pub fn name(self) -> &'static str {
        match self {
            Layer::Binary => "binary",
            Layer::Config => "config",
            Layer::Keys => "keys",
            Layer::Switchlets => "switchlets",
            Layer::Monitor => "monitor",
        }
    }

    /// Parses a layer name.
    pub fn from_name(s: &str) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| l.name() == s)
    }

    /// Whether a node can run without a component of this layer.
    pub fn essential(self) -> bool {
        matches!(self, Layer::Binary | Layer::Config | Layer::Keys)
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a component name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// Not `node/layer/file`.
    #[error("target name {0:?} is not <node>/<layer>/<file>")]
    Shape(String),
    /// The layer part is not a layer.
    #[error("target name {0:?}: unknown layer")]
    UnknownLayer(String),
    /// A node name or path component outside `[A-Za-z0-9._-]`, empty, `.`, `..`, or too long.
    #[error("target name {0:?}: bad node name or path component")]
    BadComponent(String),
}

/// Whether `s` is a valid path component: 1..=64 bytes of `[A-Za-z0-9._-]`,
/// not `.` or `..`.
pub fn valid_component(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `s` is a valid node name.
pub fn valid_node(s: &str) -> bool {
    s.len() <= MAX_NODE_NAME && valid_component(s)
}

/// A component's name: which node, which layer, which file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ComponentName {
    /// The node it belongs to.
    pub node: String,
    /// Its layer.
    pub layer: Layer,
    /// Its path relative to the node's base directory (`/`-separated).
    pub file: String,
}

impl ComponentName {
    /// A checked name.
    pub fn new(node: &str, layer: Layer, file: &str) -> Result<ComponentName, NameError> {
        let n = ComponentName { node: node.to_string(), layer, file: file.to_string() };
        ComponentName::parse(&n.target())?;
        Ok(n)
    }

    /// Parses `node/layer/file`.
    pub fn parse(s: &str) -> Result<ComponentName, NameError> {
        if s.len() > MAX_TARGET_NAME {
            return Err(NameError::Shape(short(s)));
        }
        let mut it = s.splitn(3, '/');
        let (Some(node), Some(layer), Some(file)) = (it.next(), it.next(), it.next()) else {
            return Err(NameError::Shape(short(s)));
        };
        let layer = Layer::from_name(layer).ok_or_else(|| NameError::UnknownLayer(short(s)))?;
        if !valid_node(node) || !file.split('/').all(valid_component) {
            return Err(NameError::BadComponent(short(s)));
        }
        Ok(ComponentName { node: node.to_string(), layer, file: file.to_string() })
    }

    /// The TUF target name.
    pub fn target(&self) -> String {
        format!("{}/{}/{}", self.node, self.layer.name(), self.file)
    }
}

impl fmt::Display for ComponentName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.node, self.layer.name(), self.file)
    }
}

pub(crate) fn short(s: &str) -> String {
    if s.len() <= 80 {
        return s.to_string();
    }
    let mut end = 80;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Whether `bytes` are a secret file: a node's secret key or a domain
/// secret. Secrets are verified like any component but never copied to a
/// repository, served, or fetched.
pub fn is_secret_file(bytes: &[u8]) -> bool {
    [anode_sec::identity::SECRET_TAG, anode_sec::domain::SECRET_TAG].iter().any(|t| bytes.starts_with(t.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_refuse_traversal() {
        let n = ComponentName::parse("b/config/node.toml").expect("valid");
        assert_eq!(n.layer, Layer::Config);
        assert_eq!(n.target(), "b/config/node.toml");
        assert!(ComponentName::parse("b/switchlets/mods/counter.wasm").is_ok());
        for bad in ["b/config/../x", "b/config/./x", "b/config//x", "b/config/", "../config/x", "b/config/a b"] {
            assert!(matches!(ComponentName::parse(bad), Err(NameError::BadComponent(_))), "{bad}");
        }
        assert!(matches!(ComponentName::parse("b/kernel/x"), Err(NameError::UnknownLayer(_))));
        assert!(matches!(ComponentName::parse("b/config"), Err(NameError::Shape(_))));
        assert!(matches!(ComponentName::parse(&"a/".repeat(200)), Err(NameError::Shape(_))));
        assert!(ComponentName::new("b", Layer::Keys, "/etc/passwd").is_err());
    }

    #[test]
    fn layer_order_is_the_chain_order() {
        let mut v = Layer::ALL.to_vec();
        v.sort();
        assert_eq!(v, Layer::ALL.to_vec());
        assert!(Layer::Keys.essential() && !Layer::Switchlets.essential());
    }
}
