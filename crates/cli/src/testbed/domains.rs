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
