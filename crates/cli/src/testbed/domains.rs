//! `anode testbed up --domains MAP`: administrative domains (SANE §4.7) in a
//! testbed. MAP (e.g. `examples/topologies/domains-map.toml`) lists each
//! domain's members, borders and key distribution services; per domain the
//! testbed makes (once, kept across runs):
//!
//! ```text
//! DIR/keys/operator-<domain>.key / .pub   the operator's key: names the domain, roots its credentials
//! DIR/keys/domain-<domain>.secret         the domain secret (mode 0600)
//! ```
//!
//! and gives every member a `[domain]` section (operator, secret, border,
//! kdc, lifetimes, the members' node keys) and a `[modules] admin_key` of
//! its domain's operator, so credentials issued with
//! `anode cred issue --admin-key DIR/keys/operator-<domain>.key` load there.

use super::{Plan, PlanSecurity};
use anode_node::config::{DomainConfig, NodeConfig};
use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The domain map file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainMap {
    domain: Vec<DomainSpec>,
}

/// One domain of the map.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DomainSpec {
    name: String,
    members: Vec<String>,
    #[serde(default)]
    borders: Vec<String>,
    #[serde(default)]
    kdc: Vec<String>,
    max_ticket_lifetime_secs: Option<u64>,
    tickets_per_user_per_sec: Option<u32>,
}

/// Puts the `[domain]` sections of the map at `map` into the plan's
/// configs, making each domain's operator key and secret in `dir/keys`.
pub(super) fn apply(plan: &mut Plan, dir: &Path, map: &Path, sec: Option<&PlanSecurity>) -> Result<()> {
    let text = fs::read_to_string(map).with_context(|| format!("--domains: reading {}", map.display()))?;
    let m: DomainMap = toml::from_str(&text).with_context(|| format!("--domains {}", map.display()))?;
    let sec = sec.ok_or_else(|| anyhow!("--domains needs security on (domains answer over SAs)"))?;
    let kdir = dir.join("keys");
    let mut seen = BTreeSet::new();
    for d in &m.domain {
        if d.name.is_empty() || !d.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            bail!("--domains: domain name {:?} must be letters, digits, - or _", d.name);
        }
        for n in d.borders.iter().chain(&d.kdc) {
            if !d.members.contains(n) {
                bail!("--domains: {n:?} of domain {} is not one of its members", d.name);
            }
        }
        let op = crate::keys_cmd::load_or_create(&kdir, &format!("operator-{}", d.name))
            .with_context(|| format!("operator key of domain {}", d.name))?
            .public();
        let secret = kdir.join(format!("domain-{}.secret", d.name));
        if !secret.exists() {
            let s = anode_sec::DomainKey::generate_secret().map_err(|e| anyhow!("{e}"))?;
            super::write_file(&secret, anode_sec::DomainKey::secret_file_text(&s).as_bytes(), 0o600)?;
        }
        let members: Vec<String> = d
            .members
            .iter()
            .map(|n| sec.keys.get(n).map(|(k, _)| k.to_string()).ok_or_else(|| anyhow!("--domains: no node {n:?}")))
            .collect::<Result<_>>()?;
        for name in &d.members {
            if !seen.insert(name.clone()) {
                bail!("--domains: node {name:?} is in two domains");
            }
            let node = plan
                .nodes
                .iter_mut()
                .find(|n| &n.name == name)
                .ok_or_else(|| anyhow!("--domains: the topology has no node {name:?}"))?;
            let (header, body) = node.config.split_once('\n').unwrap_or(("", &node.config));
            let mut cfg = NodeConfig::from_toml(body).map_err(|e| anyhow!("internal: config of {name:?}: {e}"))?;
            let mut dc = DomainConfig::new(op.to_string(), secret.clone());
            dc.border = d.borders.contains(name);
            dc.kdc = d.kdc.contains(name);
            dc.members = members.clone();
            if let Some(l) = d.max_ticket_lifetime_secs {
                dc.max_ticket_secs = l;
            }
            if let Some(r) = d.tickets_per_user_per_sec {
                dc.tickets_per_user_per_sec = r;
            }
            cfg.domain = Some(dc);
            if let Some(mc) = cfg.modules.as_mut() {
                mc.admin_key = op.to_string();
            }
            cfg.validate().with_context(|| format!("--domains: node {name:?}"))?;
            let text = cfg.to_toml().map_err(|e| anyhow!("--domains: {e}"))?;
            node.config = format!("{header}\n{text}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Endpoints, Tuning, plan};
    use super::*;
    use anode_node::config::Topology;
    use std::collections::BTreeMap;

    const TOPO: &str = r#"
node = [{ name = "a", address = "10.0.0.1" }, { name = "b", address = "10.0.0.2" }, { name = "c", address = "10.0.0.3" }]
link = [{ a = "a", b = "b" }, { a = "b", b = "c" }]
"#;

    /// Applies `map` to a line of three with security and modules on, in a
    /// fresh directory: the configs, or the error.
    fn apply_map(tag: &str, map: &str, secure: bool) -> Result<Vec<NodeConfig>> {
        let dir = std::env::temp_dir().join(format!("anode-tbdomains-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("keys")).expect("dir");
        let t = Topology::from_toml(TOPO).expect("topology");
        let keys: BTreeMap<String, (anode_sec::PublicKey, std::path::PathBuf)> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let k = anode_sec::Identity::from_seed(&[i as u8 + 1; 32]).public();
                (n.to_string(), (k, dir.join(format!("keys/{n}.key"))))
            })
            .collect();
        let sec = PlanSecurity { mode: "encrypt".into(), users: Vec::new(), keys };
        let admin = anode_sec::Identity::from_seed(&[9; 32]).public();
        let ports = Endpoints::Loopback((7000..7004).collect());
        let mut p = plan(&t, &dir, &ports, Some(&sec), Some(&admin), Tuning::default()).expect("plan");
        fs::write(dir.join("map.toml"), map).expect("map");
        let r = apply(&mut p, &dir, &dir.join("map.toml"), secure.then_some(&sec));
        let out = r.map(|()| {
            p.nodes
                .iter()
                .map(|n| NodeConfig::from_toml(n.config.split_once('\n').map_or("", |x| x.1)).expect("valid"))
                .collect()
        });
        let _ = fs::remove_dir_all(&dir);
        out
    }

    #[test]
    fn members_get_their_domain_and_bad_maps_are_explained() {
        let good = "[[domain]]\nname = \"A\"\nmembers = [\"a\", \"b\"]\nborders = [\"b\"]\nkdc = [\"a\"]\n\
                    max_ticket_lifetime_secs = 60\n";
        let c = apply_map("good", good, true).expect("applies");
        let (a, b) = (c[0].domain.as_ref().expect("a"), c[1].domain.as_ref().expect("b"));
        assert_eq!((a.kdc, a.border, b.kdc, b.border), (true, false, false, true));
        assert_eq!((a.max_ticket_secs, a.members.len()), (60, 2));
        assert_eq!(a.operator, b.operator);
        assert_eq!(
            c[0].modules.as_ref().map(|m| m.admin_key.clone()),
            Some(a.operator.clone()),
            "rooted in the operator"
        );
        assert!(c[2].domain.is_none(), "c is in no domain");
        let bad = |tag: &str, map: &str, secure: bool, want: &str| {
            let e = apply_map(tag, map, secure).expect_err(tag);
            assert!(format!("{e:#}").contains(want), "{tag}: {e:#}");
        };
        bad(
            "two",
            "[[domain]]\nname = \"A\"\nmembers = [\"a\"]\n[[domain]]\nname = \"B\"\nmembers = [\"a\"]\n",
            true,
            "two domains",
        );
        bad(
            "border",
            "[[domain]]\nname = \"A\"\nmembers = [\"a\"]\nborders = [\"b\"]\n",
            true,
            "not one of its members",
        );
        bad("unknown", "[[domain]]\nname = \"A\"\nmembers = [\"z\"]\n", true, "no node \"z\"");
        bad("name", "[[domain]]\nname = \"A/B\"\nmembers = [\"a\"]\n", true, "domain name");
        bad("field", "[[domain]]\nname = \"A\"\nmembers = [\"a\"]\ncolour = 1\n", true, "colour");
        bad("insecure", good, false, "needs security");
    }
}
