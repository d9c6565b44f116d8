//! The node's side of switchlets (issue 7): the sandbox from
//! `anode-sandbox` embedded in the node, capsules as their own ANEP type,
//! and the sandbox's actions turned into transmissions and deliveries.
//!
//! ```text
//! CAPSULE (0xA003) from neighbour N ──► Sandbox::handle_capsule(now, N) ──► actions
//! actions: SendCapsule{to} ──► CAPSULE datagram to that neighbour (sealed hop by hop when security is on)
//!          SendPacket{dst,port} ──► a plain packet, routed
//!          DeliverLocal{port} ──► the local application
//!          Log ──► the node's log
//! ```

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
    let key = anode_sec::PublicKey::parse(&cfg.admin_key)
        .map_err(|e| ConfigError::BadKey { what: "[modules] admin_key".into(), error: e.to_string() })?;
    let root = anode_cred::root_key_from_ed25519(key.as_bytes())
        .map_err(|e| ConfigError::BadKey { what: "[modules] admin_key".into(), error: e.to_string() })?;
    let routes = Arc::new(StaticRoutes { this: here, table });
    Sandbox::new(root, SandboxConfig::default(), routes)
        .map_err(|e| ConfigError::BadKey { what: "[modules]".into(), error: e.to_string() })
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
        "reloads": c.reloads,
        "credential_unloads": c.credential_unloads,
        "cache": format!("{cache:?}"),
    })
}

/// A module load request carried in an authenticated control message
/// (ANEP `CONTROL`, 0xA004, inside an SA): `1` (load), name length (1),
/// name, credential length (4, BE), credential, then the module's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadRequest<'a> {
    /// The loader's name for the module, if any.
    pub name: Option<&'a str>,
    /// The credential (Biscuit bytes).
    pub credential: &'a [u8],
    /// The module's code.
    pub code: &'a [u8],
}

/// A malformed control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Not a request this node knows.
    #[error("unknown control request")]
    Unknown,
    /// Shorter than its fields say.
    #[error("truncated control message")]
    Truncated,
    /// The name is not UTF-8.
    #[error("module name is not UTF-8")]
    BadName,
}

impl<'a> LoadRequest<'a> {
    /// Parses a load request.
    pub fn parse(b: &'a [u8]) -> Result<LoadRequest<'a>, ControlError> {
        let (&op, rest) = b.split_first().ok_or(ControlError::Truncated)?;
        if op != 1 {
            return Err(ControlError::Unknown);
        }
        let (&nl, rest) = rest.split_first().ok_or(ControlError::Truncated)?;
        let (name, rest) = rest.split_at_checked(nl as usize).ok_or(ControlError::Truncated)?;
        let (cl, rest) = rest.split_first_chunk::<4>().ok_or(ControlError::Truncated)?;
        let (credential, code) =
            rest.split_at_checked(u32::from_be_bytes(*cl) as usize).ok_or(ControlError::Truncated)?;
        let name =
            if name.is_empty() { None } else { Some(core::str::from_utf8(name).map_err(|_| ControlError::BadName)?) };
        Ok(LoadRequest { name, credential, code })
    }

    /// Encodes a load request.
    pub fn encode(&self) -> Vec<u8> {
        let name = self.name.unwrap_or("").as_bytes();
        let name = &name[..name.len().min(255)];
        let mut v = vec![1, name.len() as u8];
        v.extend_from_slice(name);
        v.extend_from_slice(&(self.credential.len() as u32).to_be_bytes());
        v.extend_from_slice(self.credential);
        v.extend_from_slice(self.code);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_request_round_trip_and_rejections() {
        let r = LoadRequest { name: Some("counter"), credential: b"cred", code: b"\0asm" };
        assert_eq!(LoadRequest::parse(&r.encode()), Ok(r));
        let anon = LoadRequest { name: None, credential: b"", code: b"x" };
        assert_eq!(LoadRequest::parse(&anon.encode()), Ok(anon));
        assert_eq!(LoadRequest::parse(&[]), Err(ControlError::Truncated));
        assert_eq!(LoadRequest::parse(&[2]), Err(ControlError::Unknown));
        assert_eq!(LoadRequest::parse(&[1, 5, b'a']), Err(ControlError::Truncated));
        assert_eq!(LoadRequest::parse(&[1, 0, 0, 0, 0, 9, 1]), Err(ControlError::Truncated));
        assert_eq!(LoadRequest::parse(&[1, 1, 0xff, 0, 0, 0, 0]), Err(ControlError::BadName));
    }
}
