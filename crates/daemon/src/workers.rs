//! Data path workers (`[io] workers`, issue 19): forwarding and SNAP
//! execution on N threads.
//!
//! ```text
//! interface i ──► N sockets bound to one port with SO_REUSEPORT
//!                 (the kernel hashes each sender's 4-tuple to one of them)
//! worker w:  epoll on its socket of each interface
//!            recvmmsg            (no lock)
//!            lock node ─► fragments, the core, for a batch ─► unlock
//!            GSO / sendmmsg      (no lock; not the paced links' datagrams)
//!            lock node ─► paced links' datagrams queued on their links,
//!                         tx counters, RCANE charges, deliveries queued ─► unlock
//!            kick the event loop when the batch left it work
//! event loop: holds the node except while it waits; control, timers,
//!            application clients, RCANE dispatches, the FLAME tap,
//!            the paced links' releases
//! ```
//!
//! # Invariants
//!
//! - **One node, one lock.** The core ([`Node`]) is one sans-I/O state
//!   machine behind one lock. Every security association, replay window,
//!   counter, session and the RCANE scheduler stay in it, so they are
//!   exactly as correct with N workers as with one: a replay window is
//!   never split, and two workers' datagrams of one SA, however they are
//!   reordered, pass through the same window one at a time. What runs in
//!   parallel is what costs most: the system calls, the kernel's UDP paths
//!   and the copies.
//! - **The lock is held for one batch's core work** (at most [`BATCH`]
//!   datagrams) by a worker, and by the event loop for everything except
//!   its waits. A slack RCANE dispatch stops at its next preemption point
//!   when a worker waits for the lock (as it stops for waiting input with
//!   one thread); a guaranteed dispatch runs its budget out, so forwarding
//!   waits at most one slice, as before.
//! - **Per worker:** receive buffers and outboxes, send headers, GSO/GRO
//!   state and counters, and reassembly (a sender's fragments all hash to
//!   one socket, hence one worker).
//! - **Paced links** (`rate_bps`): one link scheduler per link, shared.
//!   A worker queues its batch's datagrams for a paced link on it, with the
//!   node locked, then the pacer (always in that order); only the event
//!   loop releases them (and seals them then), so a link's order, its
//!   guarantees and its SA sequence numbers are those of one scheduler. A
//!   worker whose datagrams make the link due before the event loop's timer
//!   kicks the event loop.
//! - **Deliveries to local applications** go through a bounded queue to
//!   the event loop, which owns the application clients; a full queue drops
//!   and counts (`app_queue_full`).
//! - With `workers = 1` there are no worker threads: the event loop's
//!   thread runs the data path itself, exactly as before.

use crate::BATCH;
use crate::droplog::DropLog;
use crate::frag::Frag;
use crate::offload::{IoCounters, Offload};
use crate::pacer::Pacer;
use crate::udp::{Rx, Tx, TxTally, charge_batch, enqueue_paced, run_core, send_transmits};
use anode_node::config::IoConfig;
use anode_node::core::{Node, Outbox};
use anode_node::counters::Drop;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::EventFd;
use nix::sys::socket::{MultiHeaders, SockaddrStorage};
use parking_lot::lock_api::ArcMutexGuard;
use parking_lot::{Mutex, RawMutex};
use std::collections::VecDeque;
use std::net::UdpSocket;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// Deliveries a worker may queue for the event loop.
pub(crate) const DELIVERY_QUEUE: usize = 4096;

/// The node as the event loop holds it: locked, except while it waits.
pub(crate) enum NodeCell {
    /// The event loop holds the lock.
    Held(ArcMutexGuard<RawMutex, Node>),
    /// The event loop waits; workers may take the lock.
    Free(Arc<Mutex<Node>>),
    /// Only between the two, inside `release` and `acquire`.
    Moving,
}

impl NodeCell {
    /// The node, held.
    pub(crate) fn new(node: Node) -> NodeCell {
        NodeCell::Held(Arc::new(Mutex::new(node)).lock_arc())
    }

    /// The lock, for workers.
    pub(crate) fn shared(&self) -> Option<Arc<Mutex<Node>>> {
        match self {
            NodeCell::Held(g) => Some(ArcMutexGuard::mutex(g).clone()),
            NodeCell::Free(m) => Some(m.clone()),
            NodeCell::Moving => None,
        }
    }

    /// Lets workers take the node (fairly: a waiting worker gets it next).
    pub(crate) fn release(&mut self) {
        *self = match std::mem::replace(self, NodeCell::Moving) {
            NodeCell::Held(g) => {
                let m = ArcMutexGuard::mutex(&g).clone();
                ArcMutexGuard::unlock_fair(g);
                NodeCell::Free(m)
            }
            other => other,
        };
    }

    /// Takes the node back.
    pub(crate) fn acquire(&mut self) {
        *self = match std::mem::replace(self, NodeCell::Moving) {
            NodeCell::Free(m) => NodeCell::Held(m.lock_arc()),
            other => other,
        };
    }
}

impl Deref for NodeCell {
    type Target = Node;
    fn deref(&self) -> &Node {
        match self {
            NodeCell::Held(g) => g,
            // The event loop releases the node only around its waits, which
            // touch no node state.
            _ => unreachable!("the event loop used the node while it was released"),
        }
    }
}

impl DerefMut for NodeCell {
    fn deref_mut(&mut self) -> &mut Node {
        match self {
            NodeCell::Held(g) => g,
            _ => unreachable!("the event loop used the node while it was released"),
        }
    }
}

/// A payload for a local application, queued by a worker.
#[derive(Debug)]
pub(crate) struct Delivered {
    pub(crate) port: u16,
    pub(crate) bytes: Vec<u8>,
}

/// What the workers and the event loop share besides the node.
#[derive(Debug)]
pub(crate) struct Shared {
    /// Set to stop; `stop_fd` wakes the workers.
    pub(crate) stop: AtomicBool,
    pub(crate) stop_fd: EventFd,
    /// Written by a worker whose batch left the event loop work.
    pub(crate) kick: EventFd,
    /// Workers waiting for the node's lock.
    pub(crate) waiting: AtomicUsize,
    /// When the event loop's timer is armed for, ns since the daemon
    /// started (`u64::MAX`: not armed). A worker whose batch gave the node
    /// an earlier deadline (a job queued, a handshake timer) kicks it.
    pub(crate) armed_ns: std::sync::atomic::AtomicU64,
    /// Something was charged (the ledger flush is due).
    pub(crate) charged: AtomicBool,
    /// Deliveries for the event loop's application clients.
    pub(crate) deliveries: Mutex<VecDeque<Delivered>>,
    /// Each worker's I/O counters, copied after each batch.
    pub(crate) counters: Mutex<Vec<IoCounters>>,
    /// Each worker's fragmentation counters, copied after each batch.
    pub(crate) frags: Mutex<Vec<crate::frag::FragTotals>>,
    /// The last send error a worker met, for the drop log.
    pub(crate) tx_error: Mutex<Option<String>>,
}

impl Shared {
    /// Takes the node's lock for a worker, counted in `waiting` while it
    /// waits (a slack dispatch of the event loop yields to it).
    fn lock_node<'a>(&self, node: &'a Mutex<Node>) -> parking_lot::MutexGuard<'a, Node> {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let g = node.lock();
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        g
    }

    pub(crate) fn new(workers: usize) -> Result<Shared, Errno> {
        use nix::sys::eventfd::EfdFlags;
        let flags = EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC;
        Ok(Shared {
            stop: AtomicBool::new(false),
            stop_fd: EventFd::from_flags(flags)?,
            kick: EventFd::from_flags(flags)?,
            waiting: AtomicUsize::new(0),
            armed_ns: std::sync::atomic::AtomicU64::new(u64::MAX),
            charged: AtomicBool::new(false),
            deliveries: Mutex::new(VecDeque::with_capacity(64)),
            counters: Mutex::new(vec![IoCounters::default(); workers]),
            frags: Mutex::new(vec![crate::frag::FragTotals::default(); workers]),
            tx_error: Mutex::new(None),
        })
    }
}

/// One worker before it starts: its sockets (one per interface).
pub(crate) struct WorkerSetup {
    pub(crate) id: usize,
    pub(crate) socks: Vec<UdpSocket>,
    pub(crate) names: Vec<String>,
    pub(crate) io: IoConfig,
    pub(crate) link_mtu: usize,
    pub(crate) blen: usize,
    pub(crate) started: Instant,
}

/// Runs one worker until `shared.stop`.
pub(crate) fn run_worker(w: WorkerSetup, node: Arc<Mutex<Node>>, shared: Arc<Shared>, pacer: Arc<Mutex<Pacer>>) {
    let epoll = match Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC) {
        Ok(e) => e,
        Err(e) => {
            warn!(worker = w.id, error = %e, "epoll_create failed; this worker does not run");
            return;
        }
    };
    let stop_token = w.socks.len() as u64;
    for (i, s) in w.socks.iter().enumerate() {
        if let Err(e) = epoll.add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64)) {
            warn!(worker = w.id, error = %e, "epoll_ctl failed; this worker does not run");
            return;
        }
    }
    if let Err(e) = epoll.add(shared.stop_fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, stop_token)) {
        warn!(worker = w.id, error = %e, "epoll_ctl failed; this worker does not run");
        return;
    }
    let paced = pacer.lock().mask();
    let mut st = Worker {
        rx: Rx::new(w.blen),
        hdrs: MultiHeaders::preallocate(BATCH, None),
        frag: Frag::new(w.link_mtu),
        off: Offload::setup(&w.socks, &w.names, &w.io),
        tally: TxTally::default(),
        droplog: DropLog::new(),
        rcane: node.lock().rcane_on(),
        paced,
        pacer,
        w,
    };
    let spin = Duration::from_micros(st.w.io.spin_us);
    let mut events = [EpollEvent::empty(); 16];
    let mut spin_until: Option<Instant> = None;
    debug!(worker = st.w.id, "data path worker started");
    while !shared.stop.load(Ordering::Relaxed) {
        let mut n = 0;
        if let Some(until) = spin_until {
            n = crate::offload::spin_wait(&epoll, &mut events, until, &mut st.off.counters);
        }
        if n == 0 {
            n = match epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    warn!(worker = st.w.id, error = %e, "epoll_wait failed; worker stops");
                    return;
                }
            };
        }
        let mut traffic = false;
        for ev in &events[..n] {
            let t = ev.data();
            if t < stop_token {
                traffic = true;
                st.ready(t as usize, &node, &shared);
            }
        }
        spin_until = (traffic && !spin.is_zero()).then(|| Instant::now() + spin);
        if let Some(c) = shared.counters.lock().get_mut(st.w.id) {
            *c = st.off.counters;
        }
        if let Some(f) = shared.frags.lock().get_mut(st.w.id) {
            *f = st.frag.totals();
        }
        if let Some(e) = st.droplog.tx_error.take() {
            *shared.tx_error.lock() = Some(e);
        }
    }
    debug!(worker = st.w.id, "data path worker stopped");
}

/// A running worker's own state.
struct Worker {
    w: WorkerSetup,
    rx: Rx,
    hdrs: MultiHeaders<SockaddrStorage>,
    frag: Frag,
    off: Offload,
    tally: TxTally,
    droplog: DropLog,
    rcane: bool,
    /// The paced links (shared with the event loop) and which they are.
    pacer: Arc<Mutex<Pacer>>,
    paced: Arc<[bool]>,
}

impl Worker {
    fn now_ms(&self) -> u64 {
        self.w.started.elapsed().as_millis() as u64
    }

    /// Handles what interface `iface`'s socket has waiting.
    fn ready(&mut self, iface: usize, node: &Mutex<Node>, shared: &Shared) {
        let Some(sock) = self.w.socks.get(iface) else { return };
        let Rx { mmsg, raw, got, .. } = &mut self.rx;
        let n = match mmsg.recv(sock.as_fd(), raw, got) {
            Ok(n) => n,
            Err(Errno::EAGAIN | Errno::EINTR) => return,
            Err(e) => {
                debug!(worker = self.w.id, iface, error = %e, "recvmmsg");
                return;
            }
        };
        let mut at = (0, 0);
        while at.0 < n {
            let k = self.rx.fill(n, &mut at, &mut self.off.counters);
            let now_ms = self.now_ms();
            let mut b = self.rx.batch(k);
            let cpu0 = if self.rcane { crate::daemon::thread_cpu_ns() } else { 0 };
            let mut posted;
            {
                let mut g = shared.lock_node(node);
                posted = g.jobs_posted();
                run_core(&mut g, &mut self.frag, &mut b, iface, k, now_ms, self.rcane);
                posted = g.jobs_posted().wrapping_sub(posted);
            }
            let outs = b.outs.get(..k).unwrap_or(&[]);
            let bufs = b.slots.get(..k).unwrap_or(&[]);
            let mut tx = Tx {
                udp: &self.w.socks,
                hdrs: &mut self.hdrs,
                tally: &mut self.tally,
                droplog: &mut self.droplog,
                frag: &mut self.frag,
                off: &mut self.off,
                // Paced links' datagrams are queued on their links below.
                skip: &self.paced,
            };
            send_transmits(&mut tx, outs, bufs);
            let any_paced = self.paced.iter().any(|p| *p);
            // Module jobs queued for the scheduler: the event loop
            // dispatches them.
            let mut kick = posted > 0 || outs.iter().any(needs_loop);
            {
                let mut g = shared.lock_node(node);
                if any_paced {
                    let now_ns = self.w.started.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
                    let mut p = self.pacer.lock();
                    enqueue_paced(&mut p, &mut g, &mut self.frag, &mut self.tally, &self.paced, outs, bufs, now_ns);
                    // The event loop releases: wake it if the link is due
                    // before its timer.
                    kick |= p.next_due_ns(now_ns).is_some_and(|d| d < shared.armed_ns.load(Ordering::Relaxed));
                }
                self.tally.apply(&mut g);
                queue_deliveries(&mut g, shared, outs, bufs);
                if self.rcane {
                    let used = crate::daemon::thread_cpu_ns().saturating_sub(cpu0);
                    charge_batch(&mut g, &mut b, k, used);
                    // The first charge since the ledger's last flush wakes
                    // the event loop, so that it schedules the next.
                    kick |= !shared.charged.swap(true, Ordering::Relaxed);
                }
                kick |= g.next_due_ns().is_some_and(|d| d < shared.armed_ns.load(Ordering::Relaxed));
                // A running capture is drained by the event loop.
                kick |= g.capture_on();
            }
            if kick {
                let _ = shared.kick.write(1);
            }
        }
    }
}

/// Whether handling a datagram left the event loop work: deliveries,
/// the node's own traffic (handshakes, control requests, which may arm
/// timers), work queued for a session, security events.
fn needs_loop(o: &Outbox) -> bool {
    !o.deliveries.is_empty() || o.system || o.rx_for.is_some() || !o.events.is_empty()
}

/// Copies the batch's deliveries to the event loop's queue (full: dropped
/// and counted).
fn queue_deliveries<B: AsRef<[u8]>>(node: &mut Node, shared: &Shared, outs: &[Outbox], bufs: &[B]) {
    if outs.iter().all(|o| o.deliveries.is_empty()) {
        return;
    }
    let mut q = shared.deliveries.lock();
    for (o, buf) in outs.iter().zip(bufs) {
        for d in &o.deliveries {
            if q.len() >= DELIVERY_QUEUE {
                node.counters.drop(Drop::AppQueueFull);
                continue;
            }
            q.push_back(Delivered { port: d.port, bytes: o.bytes(&d.data, buf.as_ref()).to_vec() });
        }
    }
}
