//! Channel grants: which traffic a module credential lets its modules open
//! receive channels for (RCANE §IV-D: "the credential authorises the
//! demultiplexing specification").
//!
//! A credential grants channels with authority facts
//! `channel("<ports>", "<source>")`:
//!
//! - `<ports>`: one port `5000` or an inclusive range `5000-5099`;
//! - `<source>`: `*` (any source) or an IPv4 prefix `10.0.1.0/24` (no host
//!   bits).
//!
//! A channel's filter is authorised when one grant covers it: its port is
//! in the grant's range and, if the grant names a source prefix, the
//! filter's own source prefix lies within it (a filter without a source
//! prefix matches every source, so only a `*` grant covers it). An
//! administrative credential covers everything. A credential with no
//! `channel` fact at all grants what it granted before this existed
//! (any channel; [`ChannelAuthority::Unrestricted`]), so credentials issued
//! before keep working, unless the node requires grants
//! (`VerifierConfig::require_channel_grants`, `[modules]
//! require_channel_grants`): then it grants no channel.
//!
//! Facts of attenuation blocks are not trusted (as for every other grant),
//! so a holder cannot add a grant; it can only add checks.

use core::net::Ipv4Addr;

use crate::credential::{Credential, GrantSpec, Issuer, build_err};
use crate::naming::PrincipalId;

/// Most `channel` facts read from one credential (the rest are ignored).
pub const MAX_CHANNEL_GRANTS: usize = 64;

/// Why a `channel` fact was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelGrantError {
    /// The ports are not `N` or `N-M` with `N <= M` (each a u16).
    #[error("bad channel ports {0:?}")]
    Ports(String),
    /// The source is not `*` or `a.b.c.d/n`.
    #[error("bad channel source {0:?}")]
    Source(String),
    /// The source prefix has bits set past its length.
    #[error("channel source {0:?} has host bits set")]
    HostBits(String),
}

/// One `channel` fact, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChannelGrant {
    /// Lowest port.
    pub port_lo: u16,
    /// Highest port (inclusive).
    pub port_hi: u16,
    /// The sources granted: `None` for any, else `(addr, len)`.
    pub source: Option<(Ipv4Addr, u8)>,
}

fn mask(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) }
}

impl ChannelGrant {
    /// Parses a fact's two strings.
    pub fn parse(ports: &str, source: &str) -> Result<ChannelGrant, ChannelGrantError> {
        let bad_ports = || ChannelGrantError::Ports(ports.chars().take(32).collect());
        let (lo, hi) = match ports.split_once('-') {
            Some((a, b)) => (a, b),
            None => (ports, ports),
        };
        let num = |s: &str| -> Option<u16> {
            if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let (port_lo, port_hi) = (num(lo).ok_or_else(bad_ports)?, num(hi).ok_or_else(bad_ports)?);
        if port_lo > port_hi {
            return Err(bad_ports());
        }
        let source = if source == "*" {
            None
        } else {
            let bad = || ChannelGrantError::Source(source.chars().take(32).collect());
            let (a, l) = source.split_once('/').ok_or_else(bad)?;
            let addr: Ipv4Addr = a.parse().map_err(|_| bad())?;
            if l.is_empty() || l.len() > 2 || !l.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let len: u8 = l.parse().map_err(|_| bad())?;
            if len > 32 {
                return Err(bad());
            }
            if u32::from(addr) & !mask(len) != 0 {
                return Err(ChannelGrantError::HostBits(source.chars().take(32).collect()));
            }
            Some((addr, len))
        };
        Ok(ChannelGrant { port_lo, port_hi, source })
    }

    /// The fact's two strings ([`ChannelGrant::parse`] reads them back).
    pub fn to_strings(&self) -> (String, String) {
        let ports = if self.port_lo == self.port_hi {
            self.port_lo.to_string()
        } else {
            format!("{}-{}", self.port_lo, self.port_hi)
        };
        let source = self.source.map_or_else(|| "*".to_string(), |(a, l)| format!("{a}/{l}"));
        (ports, source)
    }

    /// Whether a filter on `port` from `source` (`None`: any source; else
    /// `(addr, len)`) only matches traffic this grant covers.
    pub fn covers(&self, port: u16, source: Option<(Ipv4Addr, u8)>) -> bool {
        if !(self.port_lo..=self.port_hi).contains(&port) {
            return false;
        }
        match (self.source, source) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some((ga, gl)), Some((fa, fl))) => fl >= gl && u32::from(fa) & mask(gl) == u32::from(ga),
        }
    }
}

/// What a module's credential lets it open channels for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ChannelAuthority {
    /// An administrative credential, or one with no `channel` fact.
    #[default]
    Unrestricted,
    /// Only filters one of these covers.
    Granted(Vec<ChannelGrant>),
}

impl ChannelAuthority {
    /// Whether a filter on `port` from `source` is authorised.
    pub fn allows(&self, port: u16, source: Option<(Ipv4Addr, u8)>) -> bool {
        match self {
            ChannelAuthority::Unrestricted => true,
            ChannelAuthority::Granted(g) => g.iter().any(|g| g.covers(port, source)),
        }
    }

    /// The source filter a channel on `port` gets when its module asks for
    /// "the source my credential grants": `Some(None)` (any source) when
    /// unrestricted, else the source of the first grant (in the
    /// credential's order) whose ports include `port`; `None` when no grant
    /// does (the open is refused). The operator, who issues the
    /// credential, thus decides where the channel listens, and the module
    /// need not know addresses.
    pub fn granted_source(&self, port: u16) -> Option<Option<(Ipv4Addr, u8)>> {
        match self {
            ChannelAuthority::Unrestricted => Some(None),
            ChannelAuthority::Granted(g) => {
                g.iter().find(|g| (g.port_lo..=g.port_hi).contains(&port)).map(|g| g.source)
            }
        }
    }
}

/// The channel authority of the authority block's `channel` facts
/// (`facts`: the pairs the authorizer found); a malformed fact is an error,
/// so that an issuer's typo does not silently grant less (or more). An
/// ordinary credential without any `channel` fact grants every channel, or
/// none when the node `requires` grants.
pub fn authority_of(
    admin: bool,
    requires: bool,
    facts: &[(String, String)],
) -> Result<ChannelAuthority, ChannelGrantError> {
    if admin {
        return Ok(ChannelAuthority::Unrestricted);
    }
    if facts.is_empty() {
        return Ok(if requires { ChannelAuthority::Granted(Vec::new()) } else { ChannelAuthority::Unrestricted });
    }
    let mut v = Vec::new();
    for (p, s) in facts.iter().take(MAX_CHANNEL_GRANTS) {
        v.push(ChannelGrant::parse(p, s)?);
    }
    Ok(ChannelAuthority::Granted(v))
}

impl Issuer {
    /// An ordinary credential like [`Issuer::issue`] that also grants these
    /// channels (and only these).
    pub fn issue_channels(
        &self,
        principal: PrincipalId,
        spec: &GrantSpec,
        channels: &[ChannelGrant],
    ) -> Result<Credential, crate::CredError> {
        let mut b = self.grant_builder(principal, spec)?;
        for c in channels {
            let (p, s) = c.to_strings();
            let f = biscuit_auth::builder::fact(
                "channel",
                &[biscuit_auth::builder::Term::Str(p), biscuit_auth::builder::Term::Str(s)],
            );
            b = b.fact(f).map_err(build_err)?;
        }
        self.issue_builder(b)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_and_round_trips() {
        let g = ChannelGrant::parse("5000-5099", "10.0.1.0/24").unwrap();
        assert_eq!(g, ChannelGrant { port_lo: 5000, port_hi: 5099, source: Some((Ipv4Addr::new(10, 0, 1, 0), 24)) });
        let (p, s) = g.to_strings();
        assert_eq!(ChannelGrant::parse(&p, &s), Ok(g));
        let one = ChannelGrant::parse("7", "*").unwrap();
        assert_eq!(one.to_strings(), ("7".to_string(), "*".to_string()));
    }

    #[test]
    fn rejections() {
        for p in ["", "-", "1-", "-1", "65536", "5-4", "+5", "1 ", "000005", "a"] {
            assert!(matches!(ChannelGrant::parse(p, "*"), Err(ChannelGrantError::Ports(_))), "{p:?}");
        }
        for s in ["", "10.0.0.0", "10.0.0.0/", "10.0.0.0/33", "10.0.0/8", "10.0.0.0/+8", "any", "10.0.0.0/008"] {
            assert!(matches!(ChannelGrant::parse("1", s), Err(ChannelGrantError::Source(_))), "{s:?}");
        }
        assert!(matches!(ChannelGrant::parse("1", "10.0.0.1/24"), Err(ChannelGrantError::HostBits(_))));
    }

    #[test]
    fn covers_only_what_it_grants() {
        let g = ChannelGrant::parse("5000-5010", "10.0.1.0/24").unwrap();
        let inside = Some((Ipv4Addr::new(10, 0, 1, 128), 25));
        assert!(g.covers(5000, inside));
        assert!(g.covers(5010, Some((Ipv4Addr::new(10, 0, 1, 0), 24))));
        assert!(!g.covers(5011, inside), "port outside");
        assert!(!g.covers(5000, None), "any source is wider than the grant");
        assert!(!g.covers(5000, Some((Ipv4Addr::new(10, 0, 0, 0), 16))), "a wider prefix");
        assert!(!g.covers(5000, Some((Ipv4Addr::new(10, 0, 2, 0), 24))), "another prefix");
        let any = ChannelGrant::parse("5000", "*").unwrap();
        assert!(any.covers(5000, None));
        let a = authority_of(false, false, &[("5000".into(), "*".into())]).unwrap();
        assert!(a.allows(5000, None) && !a.allows(5001, None));
        assert_eq!(authority_of(true, false, &[("x".into(), "*".into())]), Ok(ChannelAuthority::Unrestricted));
        assert!(authority_of(false, false, &[("x".into(), "*".into())]).is_err());
        assert_eq!(authority_of(false, false, &[]), Ok(ChannelAuthority::Unrestricted));
        // A node that requires grants: no fact, no channel; admin and
        // granted credentials as before.
        let none = authority_of(false, true, &[]).unwrap();
        assert!(!none.allows(5000, None) && !none.allows(5000, Some((Ipv4Addr::new(10, 0, 0, 0), 24))));
        assert_eq!(authority_of(true, true, &[]), Ok(ChannelAuthority::Unrestricted));
        assert!(authority_of(false, true, &[("5000".into(), "*".into())]).unwrap().allows(5000, None));
    }
}
