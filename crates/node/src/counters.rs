//! Node counters: per interface, per packet type, per drop reason, and VM
//! faults by kind. Rendered for `anode status` (JSON) and Prometheus.

use anode_snap::vm::FAULT_KINDS;
use core::fmt::Write;

macro_rules! drops {
    ($($v:ident $name:literal $doc:literal;)*) => {
        /// Why the node dropped a datagram.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Drop { $(#[doc = $doc] $v,)* }
        /// Drop reason names, indexed by `Drop as usize`.
        pub const DROP_NAMES: &[&str] = &[$($name,)*];
        impl Drop {
            /// Snake-case name.
            pub fn name(self) -> &'static str { DROP_NAMES[self as usize] }
        }
    };
}

drops! {
    AnepTruncated   "anep_truncated"    "Shorter than an ANEP header.";
    AnepBadVersion  "anep_bad_version"  "Unknown ANEP version.";
    AnepBadLength   "anep_bad_length"   "ANEP header or packet length does not match the datagram.";
    AnepBadOption   "anep_bad_option"   "Malformed ANEP option, or unknown option with the discard bit.";
    UnknownType     "unknown_type"      "ANEP type id this node does not handle, discard flag set (or no default route to pass it on).";
    NoRoute         "no_route"          "No route toward the packet's destination.";
    VmFault         "vm_fault"          "The SNAP VM ended the packet with a fault (see vm_faults).";
    PlainMalformed  "plain_malformed"   "A plain packet with a malformed header.";
    TtlExceeded     "ttl_exceeded"      "A plain packet whose ttl ran out.";
    NoListener      "no_listener"       "Delivery to a port no local application registered.";
    AppQueueFull    "app_queue_full"    "Delivery to a local application whose queue was full (it stopped reading).";
    TxFailed        "tx_failed"         "The socket refused a transmission.";
    LoopbackLimit   "loopback_limit"    "Too many packets sent to this node itself within one arrival.";
    NonNeighbor     "non_neighbor"      "Security on: a datagram without authentication, or a handshake from a key that is not a configured neighbour or user (topology freeze).";
    AuthTagMismatch "auth_tag_mismatch" "Security on: the authentication tag did not verify (tampered, or wrong key).";
    AuthUnknownSpi  "auth_unknown_spi"  "Security on: no SA has the packet's SPI (e.g. the peer restarted, or a forgery).";
    AuthReplay      "auth_replay"       "Security on: the packet's counter was seen before.";
    AuthBeyondWindow "auth_beyond_window" "Security on: the packet's counter is behind the replay window.";
    AuthExpiredSa   "auth_expired_sa"   "Security on: the packet's SA is past its lifetime (or its grace period).";
    AuthModeTooWeak "auth_mode_too_weak" "Security on: an authenticate-only packet on a link whose policy requires encryption.";
    AuthTruncated   "auth_truncated"    "Security on: a protected datagram shorter than its header and tag.";
    NoSa            "no_sa"             "Security on: no SA with the next hop yet (a handshake is under way); the packet was not sent.";
    HandshakeMalformed "handshake_malformed" "A handshake message with bad framing.";
    HandshakeRateLimited "handshake_rate_limited" "A handshake first message over the per-source or global rate.";
    HandshakeReplay "handshake_replay"  "A handshake whose timestamp is not newer than the last from that key (a replay).";
    HandshakeStale  "handshake_stale"   "A handshake whose timestamp is too far from this node's clock.";
    HandshakeFailed "handshake_failed"  "A handshake that failed to decrypt or verify (tampering, or a wrong key in a config).";
    HandshakeUnexpected "handshake_unexpected" "A handshake response for no handshake in progress.";
    HandshakeBadCookie "handshake_bad_cookie" "An XX first message whose anti-reflection cookie was wrong or stale.";
    PoolFull        "pool_full"         "A module job (alarm, channel packet) refused because its session's event pool was full.";
    CapsuleRefused  "capsule_refused"   "A capsule (or code request/reply) the sandbox refused: see `modules.capsule_refused` for the reason.";
    StagingRefused  "staging_refused"   "A code chunk (a module too large for one control datagram, staged ahead of its load) or a load of staged code refused: out of order, too large, no room, missing or incomplete; the reason goes back to the sender.";
    TxLimit         "tx_limit"          "A packet a module asked to send, over its principal's transmit limit (best-effort allowance plus its session's tx reservation).";
    TxQueueFull     "tx_queue_full"     "A packet for a paced link (`rate_bps`) dropped because its sender's queue on that link was full.";
    TxNoClient      "tx_no_client"      "A packet for a paced link dropped because the link's scheduler holds as many senders as it may.";
    DomainOff       "domain_off"        "A domain datagram (0xA008) at a node without `[domain]`.";
    DomainMalformed "domain_malformed"  "A domain envelope, ticket packet, ticket or attachment that does not parse.";
    DomainWrongDomain "domain_wrong_domain" "A ticket or attachment of another administrative domain.";
    DomainEpoch     "domain_epoch"      "A ticket or attachment sealed under a revoked or unknown key epoch.";
    DomainForgedTicket "domain_forged_ticket" "A ticket that does not open under the domain's key (forged or altered).";
    DomainBadPacket "domain_bad_packet" "A ticket packet that fails authentication under its ticket's session key.";
    DomainBadAttachment "domain_bad_attachment" "A perimeter attachment that fails verification (forged, altered, moved).";
    DomainNoAttachment "domain_no_attachment" "A packet from outside the domain that did not pass a border (no attachment, or from a neighbour outside `[domain] members`).";
    DomainExpired   "domain_expired"    "A ticket or attachment past its expiry (or not yet valid).";
    DomainReplay    "domain_replay"     "A replayed ticket packet or attachment.";
    DomainRevoked   "domain_revoked"    "A revoked ticket or user.";
    DomainUnknownTicket "domain_unknown_ticket" "A ticket packet without its ticket, for a ticket this node does not hold.";
    DomainNotForMe  "domain_not_for_me" "A ticket packet for another node (at a node that is not a border), or an attached packet for another node from outside.";
    DomainCredential "domain_credential" "A domain packet asking for more than its attached credential allows (or with unreadable code).";
    DomainInner     "domain_inner"      "An accepted domain packet carrying something other than a SNAP packet or a module load.";
    ChannelFull     "channel_full"      "A packet for module channels whose FIFOs (or whose sessions' heaps) were all full: counted against each channel too (`modules.channels`).";
    ChannelRate     "channel_rate"      "A packet for module channels whose sessions were all over their receive reservation (`rx_bytes_per_sec`): counted against each channel too.";
    ChannelMalformed "channel_malformed" "A packet for module channels, too short for their sub-flow keys: counted against each channel too.";
}

/// Number of drop reasons.
pub const N_DROPS: usize = DROP_NAMES.len();

/// Per-interface counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IfaceCounters {
    /// Interface name.
    pub name: String,
    /// Datagrams received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Datagrams transmitted.
    pub tx_packets: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
}

/// All node counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters {
    /// Per interface, in configuration order.
    pub ifaces: Vec<IfaceCounters>,
    /// Drops by reason, indexed by [`Drop`].
    pub drops: [u64; N_DROPS],
    /// SNAP packets executed here: received from the network, or sent by a
    /// packet to this node itself (`send` to its own address).
    pub rx_snap: u64,
    /// Plain packets received from the network.
    pub rx_plain: u64,
    /// Packets of unknown ANEP type received.
    pub rx_unknown: u64,
    /// Unknown-type packets passed on toward the default next hop.
    pub passed_on: u64,
    /// Packets injected by local applications.
    pub injected: u64,
    /// SNAP packets forwarded (`forw`/`forwto`).
    pub snap_forwarded: u64,
    /// SNAP child packets sent (`send`).
    pub snap_children: u64,
    /// Plain packets forwarded.
    pub plain_forwarded: u64,
    /// Payloads delivered to local applications.
    pub delivered: u64,
    /// SNAP instructions executed.
    pub vm_instructions: u64,
    /// Protected datagrams verified (security on).
    pub rx_authenticated: u64,
    /// Handshake messages accepted.
    pub handshakes_rx: u64,
    /// SAs established (first and rekeys).
    pub sa_established: u64,
    /// Keepalives sent (to confirm a new SA).
    pub keepalives_tx: u64,
    /// Keepalives received.
    pub keepalives_rx: u64,
    /// Capsule-protocol datagrams received (capsules, code requests, code replies).
    pub rx_capsule: u64,
    /// SNAP packets whose resource bound exceeded `max_resource_bound` and
    /// was lowered to it (injected or arriving).
    pub rb_clamped: u64,
    /// VM faults by kind, indexed like [`FAULT_KINDS`].
    pub vm_faults: Vec<u64>,
}

impl Counters {
    /// Zeroed counters for the named interfaces.
    pub fn new(iface_names: &[String]) -> Counters {
        Counters {
            ifaces: iface_names.iter().map(|n| IfaceCounters { name: n.clone(), ..Default::default() }).collect(),
            drops: [0; N_DROPS],
            rx_snap: 0,
            rx_plain: 0,
            rx_unknown: 0,
            passed_on: 0,
            injected: 0,
            snap_forwarded: 0,
            snap_children: 0,
            plain_forwarded: 0,
            delivered: 0,
            vm_instructions: 0,
            rx_authenticated: 0,
            handshakes_rx: 0,
            sa_established: 0,
            keepalives_tx: 0,
            keepalives_rx: 0,
            rx_capsule: 0,
            rb_clamped: 0,
            vm_faults: vec![0; FAULT_KINDS.len()],
        }
    }

    /// Counts a drop.
    pub fn drop(&mut self, d: Drop) {
        self.drops[d as usize] += 1;
    }

    /// Drops of one reason.
    pub fn dropped(&self, d: Drop) -> u64 {
        self.drops[d as usize]
    }

    /// Total drops.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    fn types(&self) -> [(&'static str, u64); 17] {
        [
            ("rx_snap", self.rx_snap),
            ("rx_plain", self.rx_plain),
            ("rx_unknown", self.rx_unknown),
            ("passed_on", self.passed_on),
            ("injected", self.injected),
            ("snap_forwarded", self.snap_forwarded),
            ("snap_children", self.snap_children),
            ("plain_forwarded", self.plain_forwarded),
            ("delivered", self.delivered),
            ("vm_instructions", self.vm_instructions),
            ("rx_authenticated", self.rx_authenticated),
            ("handshakes_rx", self.handshakes_rx),
            ("sa_established", self.sa_established),
            ("keepalives_tx", self.keepalives_tx),
            ("keepalives_rx", self.keepalives_rx),
            ("rx_capsule", self.rx_capsule),
            ("rb_clamped", self.rb_clamped),
        ]
    }

    /// JSON for `anode status`.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::{Map, Value, json};
        let ifaces: Vec<Value> = self
            .ifaces
            .iter()
            .map(|i| {
                json!({"name": i.name, "rx_packets": i.rx_packets, "rx_bytes": i.rx_bytes,
                       "tx_packets": i.tx_packets, "tx_bytes": i.tx_bytes})
            })
            .collect();
        let drops: Map<String, Value> =
            DROP_NAMES.iter().zip(self.drops.iter()).map(|(n, v)| (n.to_string(), json!(v))).collect();
        let faults: Map<String, Value> =
            FAULT_KINDS.iter().zip(self.vm_faults.iter()).map(|(n, v)| (n.to_string(), json!(v))).collect();
        let packets: Map<String, Value> = self.types().iter().map(|(n, v)| (n.to_string(), json!(v))).collect();
        json!({"interfaces": ifaces, "packets": packets, "drops": drops, "vm_faults": faults})
    }

    /// Prometheus text exposition format.
    pub fn to_prometheus(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# HELP anode_interface_packets_total Datagrams per interface and direction.");
        let _ = writeln!(s, "# TYPE anode_interface_packets_total counter");
        for i in &self.ifaces {
            let _ =
                writeln!(s, "anode_interface_packets_total{{interface=\"{}\",dir=\"rx\"}} {}", i.name, i.rx_packets);
            let _ =
                writeln!(s, "anode_interface_packets_total{{interface=\"{}\",dir=\"tx\"}} {}", i.name, i.tx_packets);
        }
        let _ = writeln!(s, "# HELP anode_interface_bytes_total Bytes per interface and direction.");
        let _ = writeln!(s, "# TYPE anode_interface_bytes_total counter");
        for i in &self.ifaces {
            let _ = writeln!(s, "anode_interface_bytes_total{{interface=\"{}\",dir=\"rx\"}} {}", i.name, i.rx_bytes);
            let _ = writeln!(s, "anode_interface_bytes_total{{interface=\"{}\",dir=\"tx\"}} {}", i.name, i.tx_bytes);
        }
        let _ = writeln!(s, "# HELP anode_packets_total Packets by kind of handling.");
        let _ = writeln!(s, "# TYPE anode_packets_total counter");
        for (n, v) in self.types() {
            let _ = writeln!(s, "anode_packets_total{{kind=\"{n}\"}} {v}");
        }
        let _ = writeln!(s, "# HELP anode_drops_total Dropped datagrams by reason.");
        let _ = writeln!(s, "# TYPE anode_drops_total counter");
        for (n, v) in DROP_NAMES.iter().zip(self.drops.iter()) {
            let _ = writeln!(s, "anode_drops_total{{reason=\"{n}\"}} {v}");
        }
        let _ = writeln!(s, "# HELP anode_vm_faults_total SNAP packets ended by a VM fault, by kind.");
        let _ = writeln!(s, "# TYPE anode_vm_faults_total counter");
        for (n, v) in FAULT_KINDS.iter().zip(self.vm_faults.iter()) {
            let _ = writeln!(s, "anode_vm_faults_total{{kind=\"{n}\"}} {v}");
        }
        s
    }
}
