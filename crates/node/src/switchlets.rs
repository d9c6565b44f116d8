//! The node's side of switchlets (issue 7): building the sandbox from the
//! `[modules]` section, and its status. How the node uses it is in
//! `core::modules`.

use crate::config::{ConfigError, ModulesConfig};
use anode_sandbox::{Action, Now, Sandbox, SandboxConfig, StaticRoutes};
use core::net::Ipv4Addr;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The sandbox and its scratch space.
pub(crate) struct Switch {
    pub sb: Sandbox,
    pub actions: Vec<Action>,
    pub invocations: Vec<anode_sandbox::Invocation>,
    pub unix_ms_at_zero: u64,
}

impl core::fmt::Debug for Switch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Switch").field("modules", &self.sb.modules().len()).finish_non_exhaustive()
    }
}

impl Switch {
    pub fn now(&self, now_ms: u64) -> Now {
        Now { ms: now_ms, wall: SystemTime::UNIX_EPOCH + Duration::from_millis(self.unix_ms_at_zero + now_ms) }
    }
}

/// Builds the sandbox of a node from its `[modules]` section and routes.
pub fn sandbox(
    cfg: &ModulesConfig,
    here: Ipv4Addr,
    table: HashMap<Ipv4Addr, Ipv4Addr>,
) -> Result<Sandbox, ConfigError> {
    let key = crate::config::parse_key(crate::config::KeyField::AdminKey, &cfg.admin_key)?;
    let root = anode_cred::root_key_from_ed25519(key.as_bytes()).map_err(ConfigError::AdminRoot)?;
    let routes = Arc::new(StaticRoutes { this: here, table });
    let mut sc = SandboxConfig::default();
    sc.verifier.require_channel_grants = cfg.require_channel_grants;
    sc.verifier.node_limits.cpu = cfg.max_cpu;
    sc.host.sends_per_invocation = cfg.max_sends;
    sc.code_reply_bytes_per_sec = cfg.code_reply_bytes_per_sec;
    Ok(Sandbox::new(root, sc, routes)?)
}

/// The status section for modules.
pub fn to_json(sb: &Sandbox) -> serde_json::Value {
    use serde_json::json;
    let c = sb.counters();
    let cache = sb.cache_stats();
    let modules: Vec<_> = sb
        .modules()
        .into_iter()
        .filter_map(|id| sb.module(id).map(|m| (id, m)))
        .map(|(id, m)| json!({"id": id.to_string(), "info": format!("{m:?}")}))
        .collect();
    json!({
        "modules": modules,
        "loads": c.loads,
        "load_refused": c.load_refused,
        "invocations": c.invocations,
        "invoke_failed": c.invoke_failed,
        "capsules_run": c.capsules_run,
        "capsule_refused": c.capsule_refused,
        "code_requests_sent": c.code_requests_sent,
        "code_served": c.code_served,
        "code_fetched": c.code_fetched,
        "fetch_timeouts": c.fetch_timeouts,
        "alarms_fired": c.alarms_fired,
        "channel_deliveries": c.channel_deliveries,
        "channel_refused": c.channel_refused,
        "channels": channels_json(sb),
        "reloads": c.reloads,
        "credential_unloads": c.credential_unloads,
        "cache": format!("{cache:?}"),
    })
}

/// Every open channel: its filter, VP index, FIFO and counters (RCANE
/// §IV-D; docs/channels.md).
fn channels_json(sb: &Sandbox) -> serde_json::Value {
    use serde_json::json;
    let v: Vec<serde_json::Value> = sb
        .channel_infos()
        .into_iter()
        .map(|i| {
            json!({
                "module": format!("m{}", i.module),
                "handle": i.handle,
                "port": i.port,
                "source": i.source,
                "prefix_len": i.prefix_len,
                "keys": i.keys,
                "vp": i.vp,
                "buffer": i.buffer,
                "queued_bytes": i.queued_bytes,
                "queued_packets": i.queued_packets,
                "delivered": i.delivered,
                "bytes": i.bytes,
                "dropped_full": i.dropped_full,
                "dropped_share": i.dropped_share,
                "active_subflows": i.active_subflows,
                "dropped_rate": i.dropped_rate,
                "dropped_malformed": i.dropped_malformed,
            })
        })
        .collect();
    serde_json::Value::Array(v)
}
