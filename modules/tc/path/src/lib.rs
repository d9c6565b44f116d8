//! The transcoder's per-stream path (Expert Fig. 3, issue 17). One module
//! instance per gold or silver stream (each on its own VP with its own
//! guarantee), one for all bronze clients (on slack time).
//!
//! Entry `setup` takes a [`tc_common::Setup`]:
//! - gold or silver: binds the tier's cache pod (`gold.get` / `silver.get`)
//!   and the AES pod (`aes.seal`), hands the client's key to the AES pod
//!   as the binding's first argument, and forgets it (the key lives only
//!   in the pod); a second set-up is refused (-3);
//! - bronze: binds `bronze.get` once and adds the client (at most 64).
//!
//! Entry `frame` takes `[seq u32 BE]` and serves that frame:
//! - gold: the original frame from the cache, sealed, sent;
//! - silver: the PCM from the cache, watermarked for this client
//!   ([`tc_common::watermark`]), encoded by this path's own encoder at
//!   44.1 kHz stereo 128 kbit/s, sealed, sent;
//! - bronze: the bronze frame from the cache, sent to every client.
//!
//! Entry `poll` (no input) serves every frame the cache holds that this
//! path has not served yet (from the cache's `latest` offer; at most the
//! cache's 16; the first poll serves only the latest), so a path can be
//! woken by an alarm or any packet rather than per frame. Result: frames
//! served, or the error of the `latest` call.
//!
//! On a node (where only channels, alarms and capsules call entries),
//! `anode_init` takes its instance index `n` (a `ticket` of pod `gold`,
//! which hands out 0, 1, 2, ...; 0 without the pod) and opens a
//! control channel on [`tc_common::PATH_PORT`]` + n`, processed on the
//! session's VP `n + 1` (in a session of several VPs each stream runs and
//! is charged on its own; a session without that VP runs it on its first,
//! as `anode experiment transcoder`'s one-VP sessions, one per path, do).
//! Its entry `ctl` takes `[b'S'][set-up]`
//! (as `setup`), `[b'T']` (a tick: as `poll`), or `[b'A'][ms]`: from then
//! on the path wakes itself, polling every `ms` milliseconds (1-255) from
//! an alarm it re-arms each time (entry `alarm`) for the next multiple of
//! `ms` on the node's clock, so that no packet per frame is needed and all
//! paths wake together; a second `A` only changes the period.
//!
//! Each client gets `[seq u32 BE][tier][body]` on its UDP port. Results:
//! clients served (>= 0); -1 bad input; -2 not set up; -4 the frame is not
//! in the cache; -5 a pod call failed (after `E_GONE` the cache is bound
//! again on the next frame; the AES binding, which held the key, is not:
//! the stream needs a new set-up); -6 the send failed.

use std::cell::RefCell;

use anode_sdk::{Event, entries_init};
use rusty_mp3::Mp3Encode;
use rusty_mp3::header::FrameHeader;
use tc_common::{
    Binding, E_GONE, FRAME_SAMPLES, PCM_BYTES, Setup, Tier, client_packet, i16_to_pcm, seed_of, watermark,
};

entries_init! { init = init; "setup" => setup, "frame" => frame, "poll" => poll, "ctl" => ctl, "alarm" => alarm }

/// Takes this instance's index (a ticket of pod `gold`; 0 without it)
/// and opens its control channel.
fn init() {
    let n = Binding::open("gold.ticket", 8)
        .ok()
        .and_then(|mut b| b.call(&[]).ok().and_then(|t| <[u8; 4]>::try_from(t).ok()).map(u32::from_le_bytes))
        .unwrap_or(0);
    let n = u16::try_from(n).unwrap_or(u16::MAX);
    let spec = tc_common::channel_spec(tc_common::PATH_PORT.saturating_add(n));
    let vp = u8::try_from(n.saturating_add(1)).unwrap_or(u8::MAX);
    let _ = anode_sdk::net::open_channel_spec(&spec, "ctl", vp);
}

/// The control channel: `[b'S'][set-up]` or `[b'T']`.
fn ctl(ev: Event) -> i32 {
    let mut buf = [0u8; 33];
    if ev.len > buf.len() {
        return -1;
    }
    match ev.input(&mut buf).split_first() {
        Some((b'S', s)) => setup_from(s),
        Some((b'T', [])) => poll_now(),
        Some((b'A', [ms])) if *ms > 0 => {
            let armed = PERIOD_MS.with(|p| p.replace(u64::from(*ms))) > 0;
            if armed || arm(u64::from(*ms)) {
                0
            } else {
                -6
            }
        }
        _ => -1,
    }
}

thread_local! {
    /// The self-wake period set by `[b'A'][ms]` (0: woken by ticks only).
    static PERIOD_MS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Arms the self-wake alarm for the next multiple of `ms` on the node's
/// clock: every path with the same period then wakes in the same
/// millisecond, and the node serves them in one wake-up rather than one
/// each.
fn arm(ms: u64) -> bool {
    let delay = ms - anode_sdk::time::now_ms() % ms;
    anode_sdk::time::set_alarm(delay, "alarm").is_ok()
}

/// The self-wake alarm: re-arms itself, then serves what the cache holds.
fn alarm(_ev: Event) -> i32 {
    let ms = PERIOD_MS.with(std::cell::Cell::get);
    if ms > 0 && !arm(ms) {
        PERIOD_MS.with(|p| p.set(0));
    }
    poll_now()
}

/// Entries a cache pod keeps (`tc-cache`'s `SLOTS`).
const CACHE_SLOTS: u32 = 16;

const MAX_CLIENTS: usize = 64;

struct Path {
    tier: Tier,
    clients: Vec<(u32, u16)>,
    get: Option<Binding>,
    latest: Option<Binding>,
    next: Option<u32>,
    seal: Option<Binding>,
    enc: Mp3Encode,
    hdr: Option<FrameHeader>,
    l: Box<[f32; FRAME_SAMPLES]>,
    r: Box<[f32; FRAME_SAMPLES]>,
    entry: Vec<u8>,
    packet: Vec<u8>,
}

thread_local! {
    static PATH: RefCell<Option<Path>> = const { RefCell::new(None) };
}

fn setup(ev: Event) -> i32 {
    let mut buf = [0u8; 32];
    if ev.len > buf.len() {
        return -1;
    }
    setup_from(ev.input(&mut buf))
}

fn setup_from(input: &[u8]) -> i32 {
    let Some(s) = Setup::parse(input) else { return -1 };
    PATH.with(|p| {
        let mut p = p.borrow_mut();
        match (p.as_mut(), s.tier) {
            (Some(path), Tier::Bronze) if path.tier == Tier::Bronze => {
                if path.clients.len() >= MAX_CLIENTS {
                    return -3;
                }
                path.clients.push((s.addr, s.port));
                path.clients.len() as i32
            }
            (Some(_), _) => -3,
            (None, tier) => {
                let seal = match s.key {
                    Some(key) => {
                        let mut b = match Binding::open("aes.seal", 4 + PCM_BYTES) {
                            Ok(b) => b,
                            Err(_) => return -5,
                        };
                        if b.call(&[&key]).is_err() {
                            return -5;
                        }
                        Some(b)
                    }
                    None => None,
                };
                *p = Some(Path {
                    tier,
                    clients: vec![(s.addr, s.port)],
                    get: None,
                    latest: None,
                    next: None,
                    seal,
                    enc: Mp3Encode::new(),
                    hdr: rusty_mp3::encoder_header(44_100, 2, 128).ok(),
                    l: Box::new([0.0; FRAME_SAMPLES]),
                    r: Box::new([0.0; FRAME_SAMPLES]),
                    entry: Vec::with_capacity(PCM_BYTES),
                    packet: Vec::with_capacity(PCM_BYTES),
                });
                1
            }
        }
    })
}

fn frame(ev: Event) -> i32 {
    let mut b = [0u8; 4];
    if ev.len != 4 || ev.input(&mut b).len() != 4 {
        return -1;
    }
    let seq = u32::from_be_bytes(b);
    PATH.with(|p| match p.borrow_mut().as_mut() {
        Some(path) => path.run(seq),
        None => -2,
    })
}

fn poll(ev: Event) -> i32 {
    if ev.len != 0 {
        return -1;
    }
    poll_now()
}

fn poll_now() -> i32 {
    PATH.with(|p| match p.borrow_mut().as_mut() {
        Some(path) => path.poll(),
        None => -2,
    })
}

impl Path {
    fn poll(&mut self) -> i32 {
        if self.latest.is_none() {
            self.latest = Binding::open(&format!("{}.latest", self.tier.cache()), 64).ok();
        }
        let Some(b) = self.latest.as_mut() else { return -5 };
        let latest = match b.call(&[]) {
            Ok([]) => return 0,
            Ok(l) => match <[u8; 4]>::try_from(l) {
                Ok(l) => u32::from_le_bytes(l),
                Err(_) => return -5,
            },
            Err(e) => {
                if e == E_GONE {
                    self.latest = None;
                }
                return -5;
            }
        };
        let from = match self.next {
            None => latest,
            Some(n) if n > latest => return 0,
            Some(n) => n.max(latest.saturating_sub(CACHE_SLOTS - 1)),
        };
        let mut served = 0;
        for seq in from..=latest {
            if self.run(seq) >= 0 {
                served += 1;
            }
        }
        self.next = latest.checked_add(1);
        served
    }

    fn run(&mut self, seq: u32) -> i32 {
        if self.get.is_none() {
            self.get = Binding::open(&format!("{}.get", self.tier.cache()), 4 + PCM_BYTES).ok();
        }
        let Some(get) = self.get.as_mut() else { return -5 };
        match get.call(&[&seq.to_le_bytes()]) {
            Ok([]) => return -4,
            Ok(e) => {
                self.entry.clear();
                self.entry.extend_from_slice(e);
            }
            Err(e) => {
                if e == E_GONE {
                    self.get = None;
                }
                return -5;
            }
        }
        let body = match self.tier {
            Tier::Bronze => {
                let mut sent = 0;
                for &(addr, port) in &self.clients {
                    client_packet(seq, Tier::Bronze, &self.entry, &mut self.packet);
                    if anode_sdk::net::send(addr, port, &self.packet).is_ok() {
                        sent += 1;
                    }
                }
                return sent;
            }
            Tier::Gold => std::mem::take(&mut self.entry),
            Tier::Silver => {
                if i16_to_pcm(&self.entry, &mut self.l, &mut self.r).is_none() {
                    return -4;
                }
                let Some(&(addr, port)) = self.clients.first() else { return -2 };
                watermark(seed_of(addr, port), &mut self.l[..], &mut self.r[..]);
                let Some(h) = self.hdr.as_ref() else { return -5 };
                match self.enc.encode_frame(h, &[&self.l[..], &self.r[..]], None) {
                    Ok(f) => f,
                    Err(_) => return -5,
                }
            }
        };
        let Some(seal) = self.seal.as_mut() else { return -2 };
        let sealed = match seal.call(&[&seq.to_le_bytes(), &body]) {
            Ok(c) => c,
            Err(_) => return -5,
        };
        client_packet(seq, self.tier, sealed, &mut self.packet);
        if self.tier == Tier::Gold {
            self.entry = body;
        }
        let Some(&(addr, port)) = self.clients.first() else { return -2 };
        match anode_sdk::net::send(addr, port, &self.packet) {
            Ok(()) => 1,
            Err(_) => -6,
        }
    }
}
