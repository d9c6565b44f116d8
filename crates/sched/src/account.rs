//! Accounting: what each session used, charged to its principal
//! (RCANE §IV-A: "accurately account resource consumption to the client
//! that causes such consumption to occur, in order that the client may
//! later be billed").
//!
//! Every session, System and Best-Effort included, has an [`Account`] of
//! cumulative counters, so the parts add up to what the node used. The
//! ledger takes *deltas* of these counters ([`Charge`]s, one per session and
//! resource kind with a non-zero change) at each flush.

use crate::handle::SessionId;
use core::fmt;

/// A principal: the SHA-256 fingerprint (or raw Ed25519 key) of the remote
/// party that the session's security association authenticated.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrincipalId(pub [u8; 32]);

impl fmt::Display for PrincipalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PrincipalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrincipalId({self})")
    }
}

/// Who a session belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// The System session: housekeeping, handshakes, loads, session requests.
    System,
    /// The Best-Effort session: SNAP forwarding and every principal without
    /// a reservation.
    BestEffort,
    /// A remote principal's session.
    Principal(PrincipalId),
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Owner::System => f.write_str("system"),
            Owner::BestEffort => f.write_str("best-effort"),
            Owner::Principal(p) => write!(f, "{p}"),
        }
    }
}

macro_rules! resource_kinds {
    ($($(#[$m:meta])* $v:ident = $code:literal, $name:literal;)*) => {
        /// A kind of resource charged to a session.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum ResourceKind {
            $($(#[$m])* $v = $code,)*
        }

        impl ResourceKind {
            /// Every kind, in code order.
            pub const ALL: [ResourceKind; [$($code),*].len()] = [$(ResourceKind::$v),*];

            /// Stable name (the ledger's `kind` column, CSV/JSON keys).
            pub const fn name(self) -> &'static str {
                match self {
                    $(ResourceKind::$v => $name,)*
                }
            }

            /// The kind with this stable name.
            pub fn from_name(name: &str) -> Option<ResourceKind> {
                match name {
                    $($name => Some(ResourceKind::$v),)*
                    _ => None,
                }
            }
        }
    };
}

resource_kinds! {
    /// CPU received on guaranteed time, including overruns (paid for out of
    /// later periods), in ns of thread CPU time.
    CpuGuaranteedNs = 0, "cpu_guaranteed_ns";
    /// CPU received on slack time, in ns.
    CpuSlackNs = 1, "cpu_slack_ns";
    /// Packets sent.
    TxPackets = 2, "tx_packets";
    /// Bytes sent.
    TxBytes = 3, "tx_bytes";
    /// Packets received.
    RxPackets = 4, "rx_packets";
    /// Bytes received.
    RxBytes = 5, "rx_bytes";
    /// Module loads.
    ModuleLoads = 6, "module_loads";
    /// Heap reservation integrated over time, in byte-seconds (RCANE §IV-E:
    /// charged on the reserved size, not on live memory).
    HeapByteSeconds = 7, "heap_byte_seconds";
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Number of resource kinds.
pub const KINDS: usize = ResourceKind::ALL.len();

/// Cumulative usage of one session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Account {
    /// CPU on guaranteed time (with overruns), ns.
    pub cpu_guaranteed_ns: u64,
    /// CPU on slack time, ns.
    pub cpu_slack_ns: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Module loads.
    pub module_loads: u64,
    /// Heap reservation × time, in byte-nanoseconds.
    pub heap_byte_ns: u128,
}

impl Account {
    /// The cumulative value of one kind (heap in whole byte-seconds).
    pub fn get(&self, kind: ResourceKind) -> u64 {
        match kind {
            ResourceKind::CpuGuaranteedNs => self.cpu_guaranteed_ns,
            ResourceKind::CpuSlackNs => self.cpu_slack_ns,
            ResourceKind::TxPackets => self.tx_packets,
            ResourceKind::TxBytes => self.tx_bytes,
            ResourceKind::RxPackets => self.rx_packets,
            ResourceKind::RxBytes => self.rx_bytes,
            ResourceKind::ModuleLoads => self.module_loads,
            ResourceKind::HeapByteSeconds => u64::try_from(self.heap_byte_ns / 1_000_000_000).unwrap_or(u64::MAX),
        }
    }

    /// Total CPU, ns.
    pub fn cpu_ns(&self) -> u64 {
        self.cpu_guaranteed_ns.saturating_add(self.cpu_slack_ns)
    }

    /// Adds another account (for totals).
    pub fn add(&mut self, o: &Account) {
        self.cpu_guaranteed_ns = self.cpu_guaranteed_ns.saturating_add(o.cpu_guaranteed_ns);
        self.cpu_slack_ns = self.cpu_slack_ns.saturating_add(o.cpu_slack_ns);
        self.tx_packets = self.tx_packets.saturating_add(o.tx_packets);
        self.tx_bytes = self.tx_bytes.saturating_add(o.tx_bytes);
        self.rx_packets = self.rx_packets.saturating_add(o.rx_packets);
        self.rx_bytes = self.rx_bytes.saturating_add(o.rx_bytes);
        self.module_loads = self.module_loads.saturating_add(o.module_loads);
        self.heap_byte_ns = self.heap_byte_ns.saturating_add(o.heap_byte_ns);
    }
}

/// What one session used of one resource kind in one interval: the unit the
/// ledger stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// The session's owner (who pays).
    pub owner: Owner,
    /// The session.
    pub session: SessionId,
    /// What was used.
    pub kind: ResourceKind,
    /// How much (in the kind's unit).
    pub amount: u64,
}

/// Why a session ended (recorded in the ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CloseReason {
    /// Its principal closed it.
    ByPrincipal = 1,
    /// Its credential expired.
    CredentialExpired = 2,
    /// Its principal's security association was gone past the grace period.
    PrincipalGone = 3,
    /// The operator closed it.
    ByOperator = 4,
    /// The node shut down.
    NodeShutdown = 5,
}

impl CloseReason {
    /// Every reason.
    pub const ALL: [CloseReason; 5] = [
        CloseReason::ByPrincipal,
        CloseReason::CredentialExpired,
        CloseReason::PrincipalGone,
        CloseReason::ByOperator,
        CloseReason::NodeShutdown,
    ];

    /// Stable name.
    pub const fn name(self) -> &'static str {
        match self {
            CloseReason::ByPrincipal => "closed-by-principal",
            CloseReason::CredentialExpired => "credential-expired",
            CloseReason::PrincipalGone => "principal-gone",
            CloseReason::ByOperator => "closed-by-operator",
            CloseReason::NodeShutdown => "node-shutdown",
        }
    }

    /// The reason with this stable name.
    pub fn from_name(name: &str) -> Option<CloseReason> {
        CloseReason::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The reason with this code.
    pub fn from_code(code: u8) -> Option<CloseReason> {
        CloseReason::ALL.into_iter().find(|r| *r as u8 == code)
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A session's life event, for the ledger's `sessions` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEvent {
    /// A session was opened.
    Opened {
        /// The session.
        session: SessionId,
        /// Its owner.
        owner: Owner,
        /// When (caller's clock, ns).
        at_ns: u64,
    },
    /// A session ended.
    Closed {
        /// The session.
        session: SessionId,
        /// Its owner.
        owner: Owner,
        /// Why.
        reason: CloseReason,
        /// When (caller's clock, ns).
        at_ns: u64,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in ResourceKind::ALL {
            assert_eq!(ResourceKind::from_name(k.name()), Some(k));
        }
        assert_eq!(ResourceKind::from_name("cpu"), None);
        for r in CloseReason::ALL {
            assert_eq!(CloseReason::from_name(r.name()), Some(r));
            assert_eq!(CloseReason::from_code(r as u8), Some(r));
        }
        assert_eq!(CloseReason::from_code(0), None);
    }

    #[test]
    fn heap_in_whole_byte_seconds() {
        let a = Account { heap_byte_ns: 2_999_999_999, ..Account::default() };
        assert_eq!(a.get(ResourceKind::HeapByteSeconds), 2);
    }
}
