//! The transcoder all-in-one (Expert §5's baseline, issue 17): the same
//! codecs, watermark and AES as the path-based modules (`tc-rx`, `tc-path`,
//! `tc-cache`, `tc-aes`), in one module, with no pods and no per-stream
//! scheduling: one invocation per source frame serves every client in turn.
//!
//! - `client`: a [`tc_common::Setup`]; adds a client (at most 64); the keys
//!   are kept in this module's memory. Result: clients so far, or -1/-3.
//! - `frame`: a source packet (`[seq u32 BE][MP3 frame]`): decode once,
//!   encode bronze once, then per client: gold seals the original frame,
//!   silver watermarks the PCM for the client and encodes it with the
//!   client's own encoder, then seals; bronze sends the bronze frame.
//!   Result: packets sent, or -1 bad packet, -2 undecodable frame.
//! - `listen`: `[port u16 BE]` opens a channel for source packets to `frame`.
//!
//! On a node, `anode_init` opens the channels: source packets on
//! [`tc_common::SOURCE_PORT`] to `frame`, set-ups on
//! [`tc_common::CLIENT_PORT`] to `client` (both on the session's first VP).

use std::cell::RefCell;

use anode_sdk::{Event, entries_init};
use ctr::cipher::{KeyIvInit, StreamCipher};
use nanomp3_core::{Channels, Decoder, MAX_SAMPLES_PER_FRAME};
use rusty_mp3::Mp3Encode;
use rusty_mp3::header::FrameHeader;
use tc_common::{FRAME_SAMPLES, HalfBand, MAX_FRAME, Setup, SourceFrame, Tier, client_packet, i16_to_pcm, pcm_to_i16};

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

entries_init! { init = init; "client" => client, "frame" => frame, "listen" => listen }

/// Opens the source and set-up channels; refusals are ignored (`listen`
/// can open the source channel later).
fn init() {
    let _ = anode_sdk::net::open_channel_spec(&tc_common::channel_spec(tc_common::SOURCE_PORT), "frame", 0);
    let _ = anode_sdk::net::open_channel_spec(&tc_common::channel_spec(tc_common::CLIENT_PORT), "client", 0);
}

const MAX_CLIENTS: usize = 64;

struct Client {
    setup: Setup,
    enc: Option<Mp3Encode>,
}

struct All {
    clients: Vec<Client>,
    dec: Box<Decoder>,
    pcm: Vec<f32>,
    half: HalfBand,
    mono: Vec<f32>,
    bronze: Mp3Encode,
    bronze_hdr: Option<FrameHeader>,
    silver_hdr: Option<FrameHeader>,
    bytes: Vec<u8>,
    l: Box<[f32; FRAME_SAMPLES]>,
    r: Box<[f32; FRAME_SAMPLES]>,
    packet: Vec<u8>,
}

thread_local! {
    static ALL: RefCell<All> = RefCell::new(All {
        clients: Vec::new(),
        dec: Box::new(Decoder::new()),
        pcm: vec![0.0; MAX_SAMPLES_PER_FRAME],
        half: HalfBand::new(),
        mono: Vec::with_capacity(FRAME_SAMPLES / 2),
        bronze: Mp3Encode::new(),
        bronze_hdr: rusty_mp3::encoder_header(22_050, 1, 32).ok(),
        silver_hdr: rusty_mp3::encoder_header(44_100, 2, 128).ok(),
        bytes: Vec::with_capacity(tc_common::PCM_BYTES),
        l: Box::new([0.0; FRAME_SAMPLES]),
        r: Box::new([0.0; FRAME_SAMPLES]),
        packet: Vec::with_capacity(tc_common::PCM_BYTES),
    });
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

fn client(ev: Event) -> i32 {
    let mut buf = [0u8; 32];
    if ev.len > buf.len() {
        return -1;
    }
    let Some(setup) = Setup::parse(ev.input(&mut buf)) else { return -1 };
    ALL.with(|a| {
        let mut a = a.borrow_mut();
        if a.clients.len() >= MAX_CLIENTS {
            return -3;
        }
        let enc = (setup.tier == Tier::Silver).then(Mp3Encode::new);
        a.clients.push(Client { setup, enc });
        a.clients.len() as i32
    })
}

fn frame(ev: Event) -> i32 {
    let mut buf = [0u8; 4 + MAX_FRAME];
    if ev.len > buf.len() {
        return -1;
    }
    let Some(src) = SourceFrame::parse(ev.input(&mut buf)) else { return -1 };
    ALL.with(|a| a.borrow_mut().run(src))
}

fn seal(key: &[u8; 16], seq: u32, text: &mut [u8]) {
    let mut iv = [0u8; 16];
    iv[..4].copy_from_slice(&seq.to_be_bytes());
    Aes128Ctr::new(&(*key).into(), &iv.into()).apply_keystream(text);
}

impl All {
    fn run(&mut self, src: SourceFrame<'_>) -> i32 {
        let (_, r) = self.dec.decode(src.frame, &mut self.pcm);
        match r {
            Ok(i)
                if i.samples_produced == FRAME_SAMPLES && i.channels == Channels::Stereo && i.sample_rate == 44_100 => {
            }
            _ => return -2,
        }
        let stereo = &self.pcm[..2 * FRAME_SAMPLES];
        // Silver sees the same 16-bit PCM as the path-based variant's cache holds.
        pcm_to_i16(stereo, &mut self.bytes);
        self.half.process(stereo, &mut self.mono);
        for s in &mut self.mono {
            if !s.is_finite() {
                *s = 0.0;
            }
        }
        let bronze = match &self.bronze_hdr {
            Some(h) => self.bronze.encode_frame(h, &[&self.mono[..]], None).ok(),
            None => None,
        };
        let mut sent = 0;
        for c in &mut self.clients {
            let s = c.setup;
            let mut body = match (s.tier, c.enc.as_mut(), self.silver_hdr.as_ref()) {
                (Tier::Gold, _, _) => src.frame.to_vec(),
                (Tier::Silver, Some(enc), Some(h)) => {
                    if i16_to_pcm(&self.bytes, &mut self.l, &mut self.r).is_none() {
                        continue;
                    }
                    tc_common::watermark(tc_common::seed_of(s.addr, s.port), &mut self.l[..], &mut self.r[..]);
                    match enc.encode_frame(h, &[&self.l[..], &self.r[..]], None) {
                        Ok(f) => f,
                        Err(_) => continue,
                    }
                }
                (Tier::Bronze, _, _) => match &bronze {
                    Some(b) => b.clone(),
                    None => continue,
                },
                _ => continue,
            };
            if let Some(key) = &s.key {
                seal(key, src.seq, &mut body);
            }
            client_packet(src.seq, s.tier, &body, &mut self.packet);
            if anode_sdk::net::send(s.addr, s.port, &self.packet).is_ok() {
                sent += 1;
            }
        }
        sent
    }
}
