//! The data plane: SNAP packets in the VM, plain forwarding, local
//! injections, and deliveries to local applications or module channels.
//! Everything here is done for Best-Effort.

use super::classify::Frame;
use super::{Data, Delivery, MAX_LOOPBACK, Node, Outbox, Owner, Run, Transmit, recv_buffer_len};
use crate::counters::Drop;
use anode_snap::vm::{Action, End, Loc, SendKind};
use anode_snap::wire::Checked;
use anode_wire::{anep, plain};
use core::net::Ipv4Addr;

impl Node {
    /// Executes a SNAP packet injected by a local application, as if it had
    /// arrived here (this is its first hop: its resource bound is
    /// decremented here).
    pub fn inject_snap(&mut self, packet: &[u8], now_ms: u64, out: &mut Outbox) {
        self.set_now(now_ms);
        self.counters.injected += 1;
        let mut buf = std::mem::take(&mut self.scratch);
        buf.clear();
        buf.resize(recv_buffer_len(self.mtu).max(anep::HEADER_LEN + packet.len() * 5), 0);
        anep::write_header(&mut buf, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, packet.len());
        buf[anep::HEADER_LEN..anep::HEADER_LEN + packet.len()].copy_from_slice(packet);
        let mark = (out.transmits.len(), out.deliveries.len());
        self.run_snap(&mut buf, anep::HEADER_LEN, anep::HEADER_LEN + packet.len(), out);
        // Transmissions that point into `buf` must move to the arena.
        detach(&buf, out, mark);
        self.scratch = buf;
        self.drain_loopback(now_ms, out);
        self.protect(&mut [], out, mark.0, now_ms);
    }

    /// Sends a plain packet from a local application.
    pub fn inject_plain(&mut self, dst: Ipv4Addr, port: u16, ttl: u8, payload: &[u8], now_ms: u64, out: &mut Outbox) {
        self.set_now(now_ms);
        self.counters.injected += 1;
        let mark = out.transmits.len();
        self.send_plain(dst, port, ttl, payload, Owner::BestEffort, out);
        self.protect(&mut [], out, mark, now_ms);
    }

    /// Builds a plain packet from this node for `owner` and routes it (or
    /// delivers it here). The caller protects the transmission.
    pub(super) fn send_plain(
        &mut self,
        dst: Ipv4Addr,
        port: u16,
        ttl: u8,
        payload: &[u8],
        owner: Owner,
        out: &mut Outbox,
    ) {
        let here = self.env.here;
        if dst == here {
            match owner {
                Owner::Principal(_) => self.deliver_to_app(port, payload, owner, out),
                _ => {
                    self.deliver_here(port, here, payload, owner, out);
                    self.channel_deliveries(out);
                }
            }
            return;
        }
        let Some((iface, to)) = self.env.route(dst) else {
            self.counters.drop(Drop::NoRoute);
            return;
        };
        let mut hdr = [0u8; plain::HEADER_LEN];
        // A 12-byte buffer always holds the header.
        let _ = plain::Repr { dst, src: here, ttl, port }.emit(&mut hdr);
        let data = out.push_frame(anep::TYPE_PLAIN, &[&hdr, payload]);
        out.transmits.push(Transmit { iface, to, data, owner, unsealed: false, flow: None });
    }

    /// A payload for `port` at this node, from `src`, that is not in the
    /// receive buffer: see [`Node::demux`].
    pub(super) fn deliver_here(&mut self, port: u16, src: Ipv4Addr, payload: &[u8], owner: Owner, out: &mut Outbox) {
        if self.demux(port, src, payload) {
            let data = out.push_arena(&[payload]);
            out.deliveries.push(Delivery { port, data, owner });
        }
    }

    /// Where a payload for `port` at this node goes. Module channels whose
    /// demultiplexing specification matches take it first (RCANE's early
    /// demultiplexing: into each channel's FIFO, or dropped against that
    /// channel, before any per-session work); otherwise a local
    /// application that registered the port does (true: the caller adds
    /// the delivery); otherwise it is dropped (`no_listener`).
    fn demux(&mut self, port: u16, src: Ipv4Addr, payload: &[u8]) -> bool {
        if early_demux(self, port, src, payload).is_some() {
            return false;
        }
        if !self.ports.contains(&port) {
            self.counters.drop(Drop::NoListener);
            return false;
        }
        self.counters.delivered += 1;
        true
    }

    pub(super) fn drain_loopback(&mut self, now_ms: u64, out: &mut Outbox) {
        let mut n = 0;
        while let Some(p) = self.loopback.pop() {
            n += 1;
            if n > MAX_LOOPBACK {
                self.counters.drop(Drop::LoopbackLimit);
                continue;
            }
            self.counters.rx_snap += 1;
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.resize(recv_buffer_len(self.mtu).max(p.len() * 5), 0);
            buf[..p.len()].copy_from_slice(&p);
            self.set_now(now_ms);
            let mark = (out.transmits.len(), out.deliveries.len());
            self.run_snap(&mut buf, anep::HEADER_LEN, p.len(), out);
            detach(&buf, out, mark);
            self.scratch = buf;
        }
    }

    /// Runs the SNAP packet at `buf[ps..len]` (the ANEP header is in
    /// `buf[..ps]`) and turns its actions into transmissions and deliveries.
    /// Its header is checked here, once; the VM executes the checked header.
    pub(super) fn run_snap(&mut self, buf: &mut [u8], ps: usize, len: usize, out: &mut Outbox) {
        let mut hdr = match Checked::decode(buf.get(ps..len).unwrap_or(&[])) {
            Ok(h) => h,
            Err(e) => {
                let f = anode_snap::vm::Fault::Wire(e);
                self.counters.vm_faults[f.kind_index()] += 1;
                self.counters.drop(Drop::VmFault);
                return;
            }
        };
        // Like IP's TTL cap: no packet brings more resource bound into this
        // node than it allows.
        if hdr.resource_bound() > self.max_rb {
            if let Some(rb) = buf.get_mut(ps + 4..ps + 6) {
                rb.copy_from_slice(&self.max_rb.to_be_bytes());
            }
            hdr = hdr.with_resource_bound(self.max_rb);
            self.counters.rb_clamped += 1;
        }
        let res = self.vm.execute_checked(&mut buf[ps..], &hdr, &self.env);
        self.counters.vm_instructions += res.executed as u64;
        out.runs.push(Run::Snap { instructions: res.executed });
        if let End::Fault { fault, .. } = res.end {
            self.counters.vm_faults[fault.kind_index()] += 1;
            self.counters.drop(Drop::VmFault);
            return;
        }
        out.log.push_str(&res.log);
        let has_channels = self.modules.as_ref().is_some_and(|m| m.sb.has_channels());
        let mut in_place = None;
        for act in res.actions() {
            match act {
                Action::Send { dest, kind, packet } => {
                    match kind {
                        SendKind::Forward => self.counters.snap_forwarded += 1,
                        SendKind::Child => self.counters.snap_children += 1,
                    }
                    let bytes = res.bytes(packet, &buf[ps..]);
                    if *dest == self.env.here {
                        // SNAP `send` to this node: run it here again.
                        let mut v = vec![0; anep::HEADER_LEN + bytes.len()];
                        anep::write_header(&mut v, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, bytes.len());
                        v[anep::HEADER_LEN..].copy_from_slice(bytes);
                        self.loopback.push(v);
                        continue;
                    }
                    let Some((iface, to)) = self.env.route(*dest) else {
                        self.counters.drop(Drop::NoRoute);
                        continue;
                    };
                    let data = match packet {
                        Loc::Input(r) if r.start == 0 => {
                            // Forwarded in place: the ANEP header just before
                            // the packet is rewritten below; send from the buffer.
                            in_place = Some(r.end);
                            Data::Input(ps - anep::HEADER_LEN..ps + r.end)
                        }
                        _ => out.push_frame(anep::TYPE_SNAP, &[bytes]),
                    };
                    out.transmits.push(Transmit {
                        iface,
                        to,
                        data,
                        owner: Owner::BestEffort,
                        unsealed: false,
                        flow: None,
                    });
                }
                Action::Deliver { port, payload } => {
                    let bytes = res.bytes(payload, &buf[ps..]);
                    // Inlined `demux`: the VM's outcome borrows the VM.
                    if has_channels
                        && let Some(m) = self.modules.as_ref()
                        && let Some(o) = channel_demux(
                            &m.sb,
                            self.sched.as_deref_mut(),
                            self.now_ms,
                            &mut self.to_channels,
                            *port,
                            hdr.src(),
                            bytes,
                        )
                    {
                        count_demux(&mut self.counters, o);
                        continue;
                    }
                    if !self.ports.contains(port) {
                        self.counters.drop(Drop::NoListener);
                        continue;
                    }
                    self.counters.delivered += 1;
                    let data = match payload {
                        Loc::Input(r) => Data::Input(ps + r.start..ps + r.end),
                        Loc::Arena(_) => out.push_arena(&[bytes]),
                    };
                    out.deliveries.push(Delivery { port: *port, data, owner: Owner::BestEffort });
                }
            }
        }
        if let Some(n) = in_place {
            anep::write_header(&mut buf[ps - anep::HEADER_LEN..], anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, n);
        }
        self.channel_deliveries(out);
    }

    /// A plain packet: delivered here, or forwarded in place with its ttl
    /// decremented.
    pub(super) fn plain(&mut self, buf: &mut [u8], f: Frame, out: &mut Outbox) {
        let Ok(p) = plain::Packet::new_checked(&buf[f.payload..f.end]) else {
            self.counters.drop(Drop::PlainMalformed);
            return;
        };
        let (dst, src, ttl, port) = (p.dst(), p.src(), p.ttl(), p.port());
        if dst == self.env.here {
            let body = f.payload + plain::HEADER_LEN..f.end;
            if self.demux(port, src, &buf[body.clone()]) {
                out.deliveries.push(Delivery { port, data: Data::Input(body), owner: Owner::BestEffort });
            }
            self.channel_deliveries(out);
            return;
        }
        if ttl == 0 {
            self.counters.drop(Drop::TtlExceeded);
            return;
        }
        let Some((iface, to)) = self.env.route(dst) else {
            self.counters.drop(Drop::NoRoute);
            return;
        };
        plain::Packet::new_unchecked(&mut buf[f.payload..f.end]).set_ttl(ttl - 1);
        self.counters.plain_forwarded += 1;
        out.transmits.push(Transmit {
            iface,
            to,
            data: Data::Input(f.base..f.end),
            owner: Owner::BestEffort,
            unsealed: false,
            flow: None,
        });
    }
}

/// Early demultiplexing of a payload for `port` from `src` into module
/// channels' FIFOs (jobs in `node.to_channels`); `None`: no channel's
/// filter matched it.
fn early_demux(node: &mut Node, port: u16, src: Ipv4Addr, payload: &[u8]) -> Option<()> {
    let m = node.modules.as_ref()?;
    let o = channel_demux(&m.sb, node.sched.as_deref_mut(), node.now_ms, &mut node.to_channels, port, src, payload)?;
    count_demux(&mut node.counters, o);
    Some(())
}

/// [`Sandbox::demux_into`](anode_sandbox::Sandbox::demux_into), `None` if
/// no channel matched (cheap when none is open).
/// With RCANE on, a session's channels are policed at its receive
/// reservation (if it has one).
fn channel_demux(
    sb: &anode_sandbox::Sandbox,
    sched: Option<&mut super::sessions::Sched>,
    now_ms: u64,
    jobs: &mut Vec<anode_sandbox::Job>,
    port: u16,
    src: Ipv4Addr,
    payload: &[u8],
) -> Option<anode_sandbox::demux::DemuxOutcome> {
    if !sb.has_channels() {
        return None;
    }
    let o = match sched {
        Some(s) => {
            let now_ns = s.ns(now_ms);
            sb.demux_policed(src, port, payload, jobs, &mut |p, n| s.rx_allow(p, n as u64, now_ns))
        }
        None => sb.demux_into(src, port, payload, jobs),
    };
    (o.matched > 0).then_some(o)
}

/// Counts a packet that matched channels: delivered if one took it, else
/// dropped (full or malformed; each channel counted its own).
fn count_demux(c: &mut crate::counters::Counters, o: anode_sandbox::demux::DemuxOutcome) {
    if o.queued > 0 {
        c.delivered += 1;
    } else if o.malformed > 0 && o.full == 0 && o.rate == 0 {
        c.drop(Drop::ChannelMalformed);
    } else if o.rate > 0 && o.full == 0 {
        c.drop(Drop::ChannelRate);
    } else {
        c.drop(Drop::ChannelFull);
    }
}

/// Moves the bytes of the transmissions and deliveries from index `mark`
/// on that point into `buf` to the arena. Earlier entries point into
/// other buffers (the caller's receive buffer) and are left alone.
fn detach(buf: &[u8], out: &mut Outbox, mark: (usize, usize)) {
    for i in mark.0..out.transmits.len() {
        if let Data::Input(r) = out.transmits[i].data.clone() {
            let d = out.push_arena(&[buf.get(r).unwrap_or(&[])]);
            out.transmits[i].data = d;
        }
    }
    for i in mark.1..out.deliveries.len() {
        if let Data::Input(r) = out.deliveries[i].data.clone() {
            let d = out.push_arena(&[buf.get(r).unwrap_or(&[])]);
            out.deliveries[i].data = d;
        }
    }
}
