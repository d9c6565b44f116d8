//! The transcoder's common receive path (Expert Fig. 3, issue 17).
//!
//! Entry `frame` takes a source packet (`[seq u32 BE][MP3 frame]`, 192
//! kbit/s MPEG-1 stereo at 44.1 kHz), decodes it once (nanomp3-core), and
//! puts under `seq`:
//! - into pod `gold`: the original frame;
//! - into pod `silver`: the decoded PCM (16-bit stereo), which each silver
//!   path watermarks and encodes for its own client;
//! - into pod `bronze`: one 22.05 kHz mono 32 kbit/s MPEG-2 frame
//!   (rusty_mp3, frame-level, no reservoir), encoded once for every free client.
//!
//! Entry `listen` (`[port u16 BE]`) opens a channel for source packets to
//! that port, delivered to `frame`. On a node, `anode_init` opens one for
//! [`tc_common::SOURCE_PORT`] (on the session's first VP). Results: 0 done; -1 bad packet; -2 the
//! frame does not decode to 1,152 stereo samples at 44.1 kHz; -3 a cache
//! pod refused or is missing (the other tiers were still served).
//! The module never traps on its input (a test feeds it garbage).

use std::cell::RefCell;

use anode_sdk::{Event, entries_init};
use nanomp3_core::{Channels, Decoder, MAX_SAMPLES_PER_FRAME};
use rusty_mp3::Mp3Encode;
use rusty_mp3::header::FrameHeader;
use tc_common::{Binding, FRAME_SAMPLES, HalfBand, MAX_FRAME, SourceFrame, Tier, pcm_to_i16};

entries_init! { init = init; "frame" => frame, "listen" => listen }

/// Opens the source channel; a refusal (no `net`, or the port taken) is
/// left for `listen` to retry.
fn init() {
    let _ = anode_sdk::net::open_channel_spec(&tc_common::channel_spec(tc_common::SOURCE_PORT), "frame", 0);
}

struct Rx {
    dec: Box<Decoder>,
    pcm: Vec<f32>,
    half: HalfBand,
    mono: Vec<f32>,
    bronze: Mp3Encode,
    bronze_hdr: Option<FrameHeader>,
    bytes: Vec<u8>,
    puts: [Option<Binding>; 3],
}

thread_local! {
    static RX: RefCell<Option<Rx>> = const { RefCell::new(None) };
}

fn listen(ev: Event) -> i32 {
    let mut b = [0u8; 2];
    if ev.input(&mut b).len() != 2 {
        return -1;
    }
    match anode_sdk::net::open_channel_spec(&tc_common::channel_spec(u16::from_be_bytes(b)), "frame", 0) {
        Ok(c) => c.0,
        Err(_) => -4,
    }
}

fn frame(ev: Event) -> i32 {
    let mut buf = [0u8; 4 + MAX_FRAME];
    if ev.len > buf.len() {
        return -1;
    }
    let input = ev.input(&mut buf);
    let Some(src) = SourceFrame::parse(input) else { return -1 };
    RX.with(|rx| {
        let mut rx = rx.borrow_mut();
        let rx = rx.get_or_insert_with(|| Rx {
            dec: Box::new(Decoder::new()),
            pcm: vec![0.0; MAX_SAMPLES_PER_FRAME],
            half: HalfBand::new(),
            mono: Vec::with_capacity(FRAME_SAMPLES / 2),
            bronze: Mp3Encode::new(),
            bronze_hdr: rusty_mp3::encoder_header(22_050, 1, 32).ok(),
            bytes: Vec::with_capacity(tc_common::PCM_BYTES),
            puts: [None, None, None],
        });
        rx.run(src)
    })
}

impl Rx {
    fn run(&mut self, src: SourceFrame<'_>) -> i32 {
        let (_, r) = self.dec.decode(src.frame, &mut self.pcm);
        match r {
            Ok(i)
                if i.samples_produced == FRAME_SAMPLES && i.channels == Channels::Stereo && i.sample_rate == 44_100 => {
            }
            _ => return -2,
        }
        let mut ok = self.put(Tier::Gold, src.seq, src.frame);
        let stereo = &self.pcm[..2 * FRAME_SAMPLES];
        let mut bytes = std::mem::take(&mut self.bytes);
        pcm_to_i16(stereo, &mut bytes);
        self.half.process(stereo, &mut self.mono);
        ok &= self.put(Tier::Silver, src.seq, &bytes);
        self.bytes = bytes;
        for s in &mut self.mono {
            if !s.is_finite() {
                *s = 0.0;
            }
        }
        let bronze = match &self.bronze_hdr {
            Some(h) => self.bronze.encode_frame(h, &[&self.mono[..]], None).ok(),
            None => None,
        };
        ok &= bronze.is_some_and(|b| self.put(Tier::Bronze, src.seq, &b));
        if ok { 0 } else { -3 }
    }

    /// Puts `entry` under `seq` into the tier's cache pod, binding (again)
    /// if needed.
    fn put(&mut self, tier: Tier, seq: u32, entry: &[u8]) -> bool {
        let slot = &mut self.puts[tier as usize];
        if slot.is_none() {
            let offer = format!("{}.put", tier.cache());
            *slot = Binding::open(&offer, 4 + tc_common::PCM_BYTES).ok();
        }
        let Some(b) = slot.as_mut() else { return false };
        match b.call(&[&seq.to_le_bytes(), entry]) {
            Ok(_) => true,
            Err(e) => {
                if e == tc_common::E_GONE || e == -10 {
                    *slot = None;
                }
                false
            }
        }
    }
}
