//! Admission control (RCANE §IV-B.2: "requests for resource reservations
//! are processed by the System session and, if accepted, are communicated to
//! the Runtime's schedulers").
//!
//! A request is refused if it would take the node's guaranteed totals past
//! its configured [`Capacity`] (System and Best-Effort included), or a
//! session past its credential's [`Ceilings`]. A refusal says which
//! resource, what was asked, what is left on the node and what the
//! credential allows. A request is all or nothing: nothing is half-granted.
//! A request that does not increase a resource is never refused for that
//! resource's node capacity (so a session can always shrink).

use crate::handle::VpId;
use crate::scheduler::VpParams;
use core::fmt;

/// What the node can guarantee in total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// CPU guarantees, in ppm of one CPU (e.g. 950 000: 95 %).
    pub cpu_ppm: u64,
    /// Heap reservations, bytes.
    pub heap_bytes: u64,
    /// Transmit reservations, bytes per second.
    pub tx_bytes_per_sec: u64,
    /// Receive reservations, bytes per second.
    pub rx_bytes_per_sec: u64,
}

/// The most a credential lets its principal reserve, per session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ceilings {
    /// Largest share of one VP, ppm.
    pub max_vp_share_ppm: u64,
    /// Largest sum of the session's VP shares, ppm.
    pub max_total_share_ppm: u64,
    /// Most VPs.
    pub max_vps: u32,
    /// Whether VPs may use slack (`extra`).
    pub extra: bool,
    /// Largest heap reservation, bytes.
    pub max_heap_bytes: u64,
    /// Largest transmit reservation, bytes per second.
    pub max_tx_bytes_per_sec: u64,
    /// Largest receive reservation, bytes per second.
    pub max_rx_bytes_per_sec: u64,
    /// Most pools.
    pub max_pools: u32,
    /// Most events queued over all the session's pools (sum of `max_queued`).
    pub max_queued_events: u32,
}

impl Ceilings {
    /// Ceilings that allow nothing (a principal with a session but no
    /// reservation rights).
    pub const NONE: Ceilings = Ceilings {
        max_vp_share_ppm: 0,
        max_total_share_ppm: 0,
        max_vps: 0,
        extra: false,
        max_heap_bytes: 0,
        max_tx_bytes_per_sec: 0,
        max_rx_bytes_per_sec: 0,
        max_pools: 0,
        max_queued_events: 0,
    };
}

/// A resource that admission control counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Resource {
    /// The session's total CPU share, ppm.
    Cpu = 1,
    /// One VP's CPU share, ppm.
    VpShare = 2,
    /// Number of VPs.
    Vps = 3,
    /// Slack for a VP (asked 1 = yes).
    Extra = 4,
    /// Heap reservation, bytes.
    Heap = 5,
    /// Transmit reservation, bytes per second.
    Tx = 6,
    /// Receive reservation, bytes per second.
    Rx = 7,
    /// Number of pools.
    Pools = 8,
    /// Events queued over all pools.
    QueuedEvents = 9,
}

impl Resource {
    /// Every resource.
    pub const ALL: [Resource; 9] = [
        Resource::Cpu,
        Resource::VpShare,
        Resource::Vps,
        Resource::Extra,
        Resource::Heap,
        Resource::Tx,
        Resource::Rx,
        Resource::Pools,
        Resource::QueuedEvents,
    ];

    /// The resource with this wire code.
    pub fn from_code(c: u8) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| *r as u8 == c)
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Resource::Cpu => "CPU share (ppm)",
            Resource::VpShare => "VP CPU share (ppm)",
            Resource::Vps => "VPs",
            Resource::Extra => "slack (extra time)",
            Resource::Heap => "heap (bytes)",
            Resource::Tx => "transmit (bytes/s)",
            Resource::Rx => "receive (bytes/s)",
            Resource::Pools => "pools",
            Resource::QueuedEvents => "queued events",
        })
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Limit {
    /// The node's capacity.
    Node = 1,
    /// The session's credential.
    Credential = 2,
}

impl Limit {
    /// The limit with this wire code.
    pub fn from_code(c: u8) -> Option<Limit> {
        match c {
            1 => Some(Limit::Node),
            2 => Some(Limit::Credential),
            _ => None,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::Node => "the node's capacity",
            Limit::Credential => "the credential",
        })
    }
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// A limit would be exceeded.
    #[error("{resource} refused by {by}: asked {asked}, {left} left on the node, the credential allows {allowed}")]
    Refused {
        /// Which resource.
        resource: Resource,
        /// Which limit.
        by: Limit,
        /// What the session would hold (or the one VP's share, for
        /// [`Resource::VpShare`]).
        asked: u64,
        /// What the node has left for this session (capacity less every
        /// other reservation), or `u64::MAX` where the node sets no limit.
        left: u64,
        /// What the credential allows.
        allowed: u64,
    },
    /// A VP's period is outside the node's bounds, or its slice is zero,
    /// shorter than the node's minimum or longer than the period.
    #[error(
        "VP of {} ns every {} ns refused: period must be {min_period_ns}..={max_period_ns} ns, slice {min_slice_ns} ns..=period",
        .params.slice_ns, .params.period_ns
    )]
    BadVp {
        /// The VP asked for.
        params: VpParams,
        /// Shortest period the node accepts.
        min_period_ns: u64,
        /// Longest period the node accepts.
        max_period_ns: u64,
        /// Shortest slice the node accepts.
        min_slice_ns: u64,
    },
}

/// A change to one VP in a [`ReserveRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VpOp {
    /// A new VP.
    Add(VpParams),
    /// New parameters for one of the session's VPs.
    Change(VpId, VpParams),
    /// Remove one of the session's VPs (and its pools).
    Remove(VpId),
}

/// A reservation request: all of it is granted, or none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReserveRequest {
    /// VP changes, applied in order.
    pub vps: Vec<VpOp>,
    /// New heap reservation, bytes (unchanged if `None`).
    pub heap_bytes: Option<u64>,
    /// New transmit reservation, bytes per second.
    pub tx_bytes_per_sec: Option<u64>,
    /// New receive reservation, bytes per second.
    pub rx_bytes_per_sec: Option<u64>,
}

/// Checks one resource's new total for a session against the credential and
/// the node. `others` is what every other session holds.
pub(crate) fn check(
    resource: Resource,
    current: u64,
    new: u64,
    others: u64,
    capacity: u64,
    allowed: u64,
) -> Result<(), AdmissionError> {
    let left = capacity.saturating_sub(others);
    if new > allowed && new > current {
        return Err(AdmissionError::Refused { resource, by: Limit::Credential, asked: new, left, allowed });
    }
    if new > left && new > current {
        return Err(AdmissionError::Refused { resource, by: Limit::Node, asked: new, left, allowed });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn credential_first_then_node_and_shrinking_always_passes() {
        let e = check(Resource::Cpu, 0, 300, 600, 950, 200).unwrap_err();
        assert_eq!(
            e,
            AdmissionError::Refused {
                resource: Resource::Cpu,
                by: Limit::Credential,
                asked: 300,
                left: 350,
                allowed: 200
            }
        );
        let e = check(Resource::Cpu, 0, 400, 600, 950, 500).unwrap_err();
        assert_eq!(
            e,
            AdmissionError::Refused { resource: Resource::Cpu, by: Limit::Node, asked: 400, left: 350, allowed: 500 }
        );
        assert_eq!(check(Resource::Cpu, 0, 350, 600, 950, 500), Ok(()));
        // Over capacity already (the operator lowered it): shrinking passes.
        assert_eq!(check(Resource::Cpu, 500, 400, 600, 950, 500), Ok(()));
        assert!(e.to_string().contains("asked 400, 350 left on the node, the credential allows 500"));
    }
}
