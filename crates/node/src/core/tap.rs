//! The FLAME tap (issue 16): the node's own verified traffic, handed to the
//! monitor (`anode-monitor`) as the administrator's `[monitor]` section
//! grants it. Off unless enabled; when off it costs one `if let` per
//! datagram and schedules nothing.
//!
//! ```text
//! classify: verified inner datagram ─► tap_packet: interface filter, copy into the
//!           bounded pending queue (full: counted, not monitored) ─► dispatch as before
//! Node::run_tap (the daemon, after each receive batch; charged to System):
//!           pending ─► Monitor::handle_udp(ts, iface, peer, local, datagram)
//!           a posted tick ─► Monitor::periodic
//!           ─► Output (records, samples, unloads) ─► bounded output queue ─► drain_tap
//! poll_at / handle_timeout: every tick_ms a tick is posted (only when the tap is on)
//!           with RCANE on: the tick marks the tap's own VP busy; EDF dispatches it
//!           (run_dispatch ─► tap_dispatch ─► Monitor::periodic), charged to its session
//! ```
//!
//! The periodic part runs in a VP of its own when RCANE is on (FLAME's
//! kernel/user split; issue 16: "in its own VP once RCANE I has landed"):
//! [`enable_tap`](Node::enable_tap) opens a session for the administrator
//! (whose grant the tap is) with one VP of [`TAP_VP`], admitted like any
//! session; a posted tick marks that VP busy, the scheduler dispatches it
//! when its deadline comes (a long period: lower priority than the
//! forwarding and the sessions with tighter deadlines), and the daemon
//! charges the dispatch to that session as any other. Without RCANE the
//! tick runs in [`run_tap`](Node::run_tap).
//!
//! The tap never changes what the data path does with a datagram: it reads
//! the bytes before `dispatch` rewrites them (TTL, SNAP stack) and copies
//! them; the monitor runs later, outside the receive loop, so a slow or
//! hostile module delays neither forwarding nor the datagrams behind it. A
//! module sees the datagram as an IP/UDP packet from the neighbour's
//! endpoint to this interface's endpoint whose payload is the verified
//! inner ANEP datagram (header included), through its credential's view.
//! Control requests (to the node itself), keepalives and handshakes are not
//! tapped; the node's own transmissions are not either (the next node's
//! tap sees them).

use super::Node;
use anode_monitor::{Monitor, Output};
use anode_sched::{Ceilings, ReserveRequest, SessionId, VpId, VpOp, VpParams};
use core::net::SocketAddr;
use std::collections::VecDeque;

/// How the tap is set up (from `[monitor]` and the bound sockets).
#[derive(Debug, Clone)]
pub struct TapConfig {
    /// Which interfaces are tapped, by index (`true`: tapped).
    pub interfaces: Vec<bool>,
    /// Each interface's local endpoint (the packets' destination as the
    /// monitor sees them).
    pub local: Vec<SocketAddr>,
    /// Interval of the modules' periodic part, ms.
    pub tick_ms: u64,
    /// Datagrams that may wait for the monitor.
    pub queue: usize,
    /// Outputs that may wait for the daemon.
    pub outputs: usize,
    /// Wall-clock ms when `now_ms` was 0 (timestamps are ns since the epoch).
    pub unix_ms_at_zero: u64,
    /// Whose grant the tap is (the administrator's public key): the owner
    /// of the periodic part's session when RCANE is on.
    pub owner: [u8; 32],
}

/// The periodic part's VP when RCANE is on: 2 ms every 100 ms guaranteed
/// (2 % of a CPU), and slack beyond it.
pub const TAP_VP: VpParams = VpParams { slice_ns: 2_000_000, period_ns: 100_000_000, extra: true };

/// Most outputs waiting for the daemon by default.
pub const TAP_OUTPUTS: usize = 65_536;

/// The tap's counters (the monitor's own are in [`Node::tap_monitor`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TapCounters {
    /// Verified datagrams on tapped interfaces, queued for the monitor.
    pub queued: u64,
    /// Datagrams on interfaces the tap does not cover.
    pub other_interface: u64,
    /// Datagrams not monitored because the pending queue was full.
    pub queue_full: u64,
    /// Datagrams handed to the monitor.
    pub monitored: u64,
    /// Periodic runs.
    pub ticks: u64,
    /// Outputs (records, samples, unloads) queued for the daemon.
    pub outputs: u64,
    /// Outputs lost because the daemon's queue was full.
    pub outputs_dropped: u64,
}

struct Pending {
    ts_ns: u64,
    iface: usize,
    peer: SocketAddr,
    data: Vec<u8>,
}

/// The tap: the monitor, its pending datagrams, a posted tick, outputs.
pub(crate) struct Tap {
    monitor: Monitor,
    cfg: TapConfig,
    pending: VecDeque<Pending>,
    /// Buffers of datagrams already monitored, reused.
    free: Vec<Vec<u8>>,
    next_tick_ms: u64,
    /// A periodic run is posted for this time (ns since the epoch).
    tick: Option<u64>,
    /// The periodic part's session and VP, when RCANE is on.
    vp: Option<(SessionId, VpId)>,
    scratch: Vec<Output>,
    outputs: VecDeque<Output>,
    counters: TapCounters,
}

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap").field("counters", &self.counters).finish_non_exhaustive()
    }
}

impl Tap {
    fn ts_ns(&self, now_ms: u64) -> u64 {
        self.cfg.unix_ms_at_zero.saturating_add(now_ms).saturating_mul(1_000_000)
    }

    fn push(&mut self, iface: usize, peer: Option<SocketAddr>, datagram: &[u8], now_ms: u64) {
        if !self.cfg.interfaces.get(iface).copied().unwrap_or(false) {
            self.counters.other_interface += 1;
            return;
        }
        if self.pending.len() >= self.cfg.queue {
            self.counters.queue_full += 1;
            return;
        }
        self.counters.queued += 1;
        let mut data = self.free.pop().unwrap_or_default();
        data.clear();
        data.extend_from_slice(datagram);
        let peer = peer.unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        let ts_ns = self.ts_ns(now_ms);
        self.pending.push_back(Pending { ts_ns, iface, peer, data });
    }

    fn keep(&mut self) {
        for o in self.scratch.drain(..) {
            if self.outputs.len() >= self.cfg.outputs {
                self.counters.outputs_dropped += 1;
            } else {
                self.counters.outputs += 1;
                self.outputs.push_back(o);
            }
        }
    }
}

/// Why a monitoring module was not loaded into the running tap.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TapLoadError {
    /// The tap is off: the administrator turns it on in the node's
    /// configuration (`[monitor] enabled = true`).
    #[error(
        "this node's tap is off: its administrator turns it on with `[monitor] enabled = true` in its configuration"
    )]
    Off,
    /// The monitor refused the module or its credential.
    #[error(transparent)]
    Load(#[from] anode_monitor::MonitorLoadError),
}

impl Node {
    /// Turns the tap on with a monitor whose modules are loaded (the daemon
    /// builds it from `[monitor]`). `now_ms` starts the periodic timer.
    /// With RCANE on (enable it first), the periodic part gets a session of
    /// its own with one [`TAP_VP`], admitted as any session's.
    ///
    /// # Errors
    /// The scheduler's refusal of that session (capacity, limits); the tap
    /// stays off.
    pub fn enable_tap(&mut self, monitor: Monitor, cfg: TapConfig, now_ms: u64) -> Result<(), anode_sched::RcaneError> {
        let next_tick_ms = now_ms.saturating_add(cfg.tick_ms.max(1));
        let vp = match self.sched.as_mut() {
            Some(s) => {
                let share = TAP_VP.share_ppm();
                let ceil = Ceilings {
                    max_vp_share_ppm: share,
                    max_total_share_ppm: share,
                    max_vps: 1,
                    extra: true,
                    ..Ceilings::NONE
                };
                let req = ReserveRequest { vps: vec![VpOp::Add(TAP_VP)], ..ReserveRequest::default() };
                let now_ns = s.ns(now_ms);
                let g = s.rcane.open_session(anode_sched::PrincipalId(cfg.owner), ceil, None, &req, now_ns)?;
                g.added.first().map(|v| (g.session, *v))
            }
            None => None,
        };
        self.tap = Some(Box::new(Tap {
            vp,
            monitor,
            pending: VecDeque::with_capacity(cfg.queue.min(4096)),
            free: Vec::new(),
            next_tick_ms,
            tick: None,
            scratch: Vec::new(),
            outputs: VecDeque::new(),
            counters: TapCounters::default(),
            cfg,
        }));
        Ok(())
    }

    /// Whether the tap is on.
    pub fn tap_on(&self) -> bool {
        self.tap.is_some()
    }

    /// Loads a monitoring module into the running tap under its
    /// credential (the local operator's request, `anode monitor run
    /// --source node`): decided and compiled as the modules of `[monitor]`
    /// are at start.
    ///
    /// # Errors
    /// [`TapLoadError::Off`] when the administrator has not turned the tap
    /// on; the monitor's refusal otherwise (nothing is loaded).
    pub fn tap_load(
        &mut self,
        now: std::time::SystemTime,
        name: &str,
        code: &[u8],
        credential: &[u8],
    ) -> Result<anode_monitor::ModuleId, TapLoadError> {
        let t = self.tap.as_mut().ok_or(TapLoadError::Off)?;
        Ok(t.monitor.load(now, name, code, credential)?)
    }

    /// Unloads the tap's live module named `name`; its id, or `None` if no
    /// live module has that name (or the tap is off).
    pub fn tap_unload(&mut self, name: &str, reason: &str) -> Option<anode_monitor::ModuleId> {
        let t = self.tap.as_mut()?;
        let id = t.monitor.modules().into_iter().find(|m| &*m.name == name && m.unloaded.is_none())?.id;
        t.monitor.unload(id, reason).then_some(id)
    }

    /// A verified datagram (`datagram`: the inner ANEP datagram, before it
    /// is handled) from `peer` on `iface`: queued for the monitor when the
    /// tap is on and covers `iface`.
    #[inline]
    pub(super) fn tap_packet(&mut self, iface: usize, peer: Option<SocketAddr>, datagram: &[u8], now_ms: u64) {
        if let Some(t) = self.tap.as_mut() {
            t.push(iface, peer, datagram, now_ms);
        }
    }

    /// When the tap's next periodic run is due (ms), if the tap is on.
    pub(super) fn tap_poll_at(&self) -> Option<u64> {
        self.tap.as_ref().map(|t| t.next_tick_ms)
    }

    /// Posts the periodic run if it is due (from `handle_timeout`): it runs
    /// in the tap's VP when RCANE is on, else in [`run_tap`](Self::run_tap).
    pub(super) fn tap_timeout(&mut self, now_ms: u64) {
        let Some(t) = self.tap.as_mut() else { return };
        if now_ms < t.next_tick_ms {
            return;
        }
        t.tick = Some(t.ts_ns(now_ms));
        t.next_tick_ms = now_ms.saturating_add(t.cfg.tick_ms.max(1));
        if let (Some((_, vp)), Some(s)) = (t.vp, self.sched.as_mut()) {
            let now_ns = s.ns(now_ms);
            if s.rcane.set_busy(vp, true, now_ns).is_err() {
                // The session was closed: the tick runs in run_tap from now on.
                t.vp = None;
            }
        }
    }

    /// Whether [`run_tap`](Self::run_tap) has work: datagrams pending, or a
    /// periodic run posted that no VP of its own runs.
    pub fn tap_has_work(&self) -> bool {
        self.tap.as_ref().is_some_and(|t| !t.pending.is_empty() || (t.tick.is_some() && t.vp.is_none()))
    }

    /// Runs the periodic part if `d` dispatches the tap's VP (from
    /// `run_dispatch`); false if `d` is another VP's.
    pub(super) fn tap_dispatch(&mut self, d: &anode_sched::Dispatch) -> bool {
        let Some(t) = self.tap.as_mut().filter(|t| t.vp.is_some_and(|(_, v)| v == d.vp)) else { return false };
        if let Some(now_ns) = t.tick.take() {
            t.counters.ticks += 1;
            t.monitor.periodic(now_ns, &mut t.scratch);
            t.keep();
        }
        if let Some(s) = self.sched.as_mut() {
            let now_ns = s.rcane.sched().now();
            let _ = s.rcane.set_busy(d.vp, false, now_ns);
        }
        true
    }

    /// The periodic part's RCANE session, when it has one.
    pub fn tap_session(&self) -> Option<SessionId> {
        self.tap.as_ref().and_then(|t| t.vp).map(|(s, _)| s)
    }

    /// Runs the monitor over the pending datagrams, then the posted
    /// periodic run; returns the datagrams monitored. The daemon calls it
    /// outside the receive loop and charges its CPU time to System (the
    /// administrator's grant; docs/monitor.md).
    pub fn run_tap(&mut self) -> usize {
        let Some(t) = self.tap.as_mut() else { return 0 };
        let mut n = 0;
        while let Some(p) = t.pending.pop_front() {
            let local = t.cfg.local.get(p.iface).copied().unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
            let iface = u16::try_from(p.iface).unwrap_or(u16::MAX);
            t.monitor.handle_udp(p.ts_ns, iface, p.peer, local, &p.data, &mut t.scratch);
            t.counters.monitored += 1;
            n += 1;
            t.free.push(p.data);
            t.keep();
        }
        if t.vp.is_none()
            && let Some(now_ns) = t.tick.take()
        {
            t.counters.ticks += 1;
            t.monitor.periodic(now_ns, &mut t.scratch);
            t.keep();
        }
        n
    }

    /// Runs every module's pending batch (at shutdown, before the last drain).
    pub fn flush_tap(&mut self) {
        let Some(t) = self.tap.as_mut() else { return };
        t.monitor.flush(&mut t.scratch);
        t.keep();
    }

    /// Moves the tap's outputs into `into`, oldest first.
    pub fn drain_tap(&mut self, into: &mut Vec<Output>) {
        if let Some(t) = self.tap.as_mut() {
            into.extend(t.outputs.drain(..));
        }
    }

    /// The monitor behind the tap, when it is on (its counters and modules).
    pub fn tap_monitor(&self) -> Option<&Monitor> {
        self.tap.as_ref().map(|t| &t.monitor)
    }

    /// The tap's counters, when it is on.
    pub fn tap_counters(&self) -> Option<TapCounters> {
        self.tap.as_ref().map(|t| t.counters)
    }

    /// The `monitor` section of `anode status`: `{"enabled": false}` when
    /// the tap is off; otherwise its settings, its counters, the monitor's
    /// and every module's.
    pub fn tap_json(&self) -> serde_json::Value {
        use serde_json::json;
        let Some(t) = self.tap.as_ref() else { return json!({"enabled": false}) };
        let c = t.monitor.counters();
        let modules: Vec<serde_json::Value> = t
            .monitor
            .modules()
            .iter()
            .map(|m| {
                let k = m.counters;
                json!({
                    "id": m.id.to_string(), "name": &*m.name, "sandboxed": m.sandboxed, "unloaded": m.unloaded,
                    "counters": {"packets": k.packets, "filtered": k.filtered, "calls": k.calls,
                        "overruns": k.overruns, "packets_lost": k.packets_lost, "traps": k.traps,
                        "memory": k.memory, "fuel": k.fuel, "records": k.records,
                        "records_denied": k.records_denied, "samples": k.samples,
                        "samples_denied": k.samples_denied, "malformed": k.malformed,
                        "limited": k.limited, "periodic": k.periodic},
                })
            })
            .collect();
        let ifaces: Vec<usize> = t.cfg.interfaces.iter().enumerate().filter(|(_, on)| **on).map(|(i, _)| i).collect();
        json!({
            "enabled": true,
            "periodic_session": t.vp.map(|(s, _)| s.to_string()),
            "interfaces": ifaces,
            "tick_ms": t.cfg.tick_ms,
            "pending": t.pending.len(),
            "tap": t.counters,
            "monitor": {"frames": c.frames, "packets": c.packets, "skipped": c.skipped, "loads": c.loads,
                        "load_refused": c.load_refused, "unloads": c.unloads},
            "modules": modules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;
    use crate::core::Outbox;
    use anode_monitor::{MonitorConfig, MonitorSpec};

    fn node() -> Node {
        let cfg = NodeConfig::from_toml(
            "address = \"10.0.0.2\"\n[[interface]]\nname = \"west\"\nlisten = \"127.0.0.1:7001\"\n\
             neighbors = [{ address = \"10.0.0.1\", endpoint = \"127.0.0.1:7000\" }]\n\
             [[interface]]\nname = \"east\"\nlisten = \"127.0.0.1:7002\"\n\
             neighbors = [{ address = \"10.0.0.3\", endpoint = \"127.0.0.1:7003\" }]\n",
        )
        .expect("config");
        Node::new(&cfg, None).expect("node")
    }

    /// A plain packet from 10.0.0.1 to 10.0.0.3 with `body`.
    fn plain(body: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; anode_wire::anep::HEADER_LEN + anode_wire::plain::HEADER_LEN + body.len()];
        let n = p.len() - anode_wire::anep::HEADER_LEN;
        anode_wire::anep::write_header(&mut p, 0, anode_wire::anep::TYPE_PLAIN, n);
        let r = anode_wire::plain::Repr { dst: [10, 0, 0, 3].into(), src: [10, 0, 0, 1].into(), ttl: 8, port: 9 };
        let _ = r.emit(&mut p[anode_wire::anep::HEADER_LEN..]);
        p[anode_wire::anep::HEADER_LEN + anode_wire::plain::HEADER_LEN..].copy_from_slice(body);
        p
    }

    fn monitor() -> Monitor {
        let issuer = anode_cred::Issuer::from_secret(&[7u8; 32]).expect("issuer");
        let mut m = Monitor::new(issuer.public_key(), MonitorConfig::default(), None).expect("monitor");
        let spec = MonitorSpec {
            read: vec![anode_monitor::apps::abi::Field::Ts, anode_monitor::apps::abi::Field::IpLen],
            payload: 16,
            export: anode_monitor::ExportRights { records: true, packets: true },
            ..MonitorSpec::default()
        };
        let user = anode_cred::PrincipalId([1; 32]);
        let cred = anode_monitor::policy::issue(&issuer, user, &spec).expect("cred").to_bytes().to_vec();
        // Every packet sampled: a record, a flow record the first time, and the packet.
        let app = Box::new(anode_monitor::apps::trajectory::Trajectory::new(1_000_000, 1));
        m.load_native(std::time::SystemTime::now(), "all", app, &cred).expect("load");
        m
    }

    #[test]
    fn the_tap_sees_what_is_forwarded_and_changes_nothing() {
        let mut off = node();
        let mut on = node();
        let cfg = TapConfig {
            interfaces: vec![true, false],
            local: vec![SocketAddr::from(([127, 0, 0, 1], 7001)), SocketAddr::from(([127, 0, 0, 1], 7002))],
            tick_ms: 100,
            queue: 2,
            outputs: TAP_OUTPUTS,
            unix_ms_at_zero: 1_700_000_000_000,
            owner: [3; 32],
        };
        on.enable_tap(monitor(), cfg, 0).expect("no RCANE: nothing to admit");
        assert_eq!(off.poll_at(), None, "off: nothing scheduled");
        assert_eq!(on.poll_at(), Some(100));
        let from = Some(SocketAddr::from(([127, 0, 0, 1], 7000)));
        for (iface, body) in [(0, &b"one"[..]), (0, b"two"), (0, b"three"), (1, b"four")] {
            let (mut a, mut b) = (plain(body), plain(body));
            let (mut oa, mut ob) = (Outbox::default(), Outbox::default());
            let len = a.len();
            off.handle_datagram_from(iface, from, &mut a, len, 5, &mut oa);
            on.handle_datagram_from(iface, from, &mut b, len, 5, &mut ob);
            assert_eq!((a, oa.transmits), (b, ob.transmits), "the tap changes nothing on the data path");
        }
        let c = on.tap_counters().expect("on");
        assert_eq!((c.queued, c.queue_full, c.other_interface), (2, 1, 1));
        assert!(on.tap_has_work());
        assert_eq!(on.run_tap(), 2);
        let mut out = Outbox::default();
        on.handle_timeout(100, &mut out);
        assert!(on.tap_has_work(), "the tick is posted");
        on.run_tap();
        assert_eq!(on.poll_at(), Some(200));
        let m = on.tap_monitor().expect("on");
        assert_eq!(m.counters().packets, 2);
        let mut outs = Vec::new();
        on.drain_tap(&mut outs);
        let samples = outs.iter().filter(|o| matches!(o, Output::Sample { .. })).count();
        assert_eq!(samples, 2, "{outs:?}");
        assert_eq!(on.tap_json()["tap"]["ticks"], 1);
        assert_eq!(off.tap_json(), serde_json::json!({"enabled": false}));
    }

    #[test]
    fn with_rcane_the_periodic_part_runs_in_a_vp_of_its_own() {
        let mut n = node();
        n.enable_rcane(anode_sched::RcaneConfig::default(), 0).expect("rcane");
        let cfg = TapConfig {
            interfaces: vec![true, true],
            local: Vec::new(),
            tick_ms: 100,
            queue: 16,
            outputs: TAP_OUTPUTS,
            unix_ms_at_zero: 0,
            owner: [3; 32],
        };
        n.enable_tap(monitor(), cfg, 0).expect("admitted");
        let sid = n.tap_session().expect("a session of its own");
        assert_eq!(n.pick(50_000_000), None, "nothing to run before the tick");
        let mut out = Outbox::default();
        n.handle_timeout(100, &mut out);
        assert!(!n.tap_has_work(), "the tick is the VP's, not run_tap's");
        let d = n.pick(100_000_000).expect("the tap's VP is runnable");
        assert_eq!(n.run_dispatch(&d, 100, &mut || true, &mut out), 0);
        n.charge(&d, 1_000, 100_000_000);
        assert_eq!(n.tap_counters().expect("on").ticks, 1);
        assert_eq!(n.pick(100_000_000), None, "idle again");
        let s = n.sessions_json(100_000_000).expect("rcane on");
        let mine =
            s["sessions"].as_array().expect("sessions").iter().find(|x| x["session"] == sid.to_string()).cloned();
        assert!(mine.is_some(), "{s}");
    }
}
