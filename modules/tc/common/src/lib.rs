//! The tiered transcoder's shared parts (Expert §4, issue 17), linked into
//! its modules (`tc-rx`, `tc-path`, `tc-all`; the pods `tc-cache` and
//! `tc-aes` are `no_std` and stand alone).
//!
//! - [`Binding`]: a client's side of the node's `pod` interface
//!   (docs/pods.md): bind, the bind request, calls through the buffer;
//! - the packet formats ([`SourceFrame`], [`client_packet`], [`Setup`]);
//! - [`HalfBand`]: bronze's 2:1 decimator (44.1 kHz stereo to 22.05 kHz
//!   mono), a 31-tap windowed-sinc low-pass;
//! - [`pcm_to_i16`] / [`i16_to_pcm`]: the silver cache's PCM format;
//! - [`watermark`]: silver's per-client customisation before its encode.
//!
//! Everything checks its input and returns `None`/an error code: a module
//! never traps on what a packet or a pod gives it.

/// Samples per channel in one MPEG-1 Layer III frame (26.12 ms at 44.1 kHz).
pub const FRAME_SAMPLES: usize = 1152;
/// The silver cache's entry: one frame of 16-bit stereo PCM, interleaved, LE.
pub const PCM_BYTES: usize = FRAME_SAMPLES * 2 * 2;
/// The largest compressed frame a tier carries (320 kbit/s at 32 kHz is 1,441 B).
pub const MAX_FRAME: usize = 1_500;

/// On a node, the port of the source's packets: `tc-rx` (and `tc-all`)
/// open a channel for it in `anode_init`, on the session's first VP.
pub const SOURCE_PORT: u16 = 7000;
/// On a node, the port of `tc-all`'s set-up channel (a [`Setup`] per packet).
pub const CLIENT_PORT: u16 = 7001;
/// On a node, the control port of `tc-path` instance `n` (in load order)
/// is `PATH_PORT + n`, processed on the session's VP `n + 1`.
pub const PATH_PORT: u16 = 7100;

/// A channel spec (docs/channels.md, version 1): `port`, from the source
/// the module's credential grants for it (flag 0x02: the operator, who
/// issues the credential, says who may send set-ups and frames; a
/// credential without channel grants grants any source), no payload
/// prefix, no keys, the default FIFO.
pub fn channel_spec(port: u16) -> [u8; 10] {
    let p = port.to_be_bytes();
    [1, 2, p[0], p[1], 0, 0, 0, 0, 0, 0]
}

/// The three tiers; the byte is their wire value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The source's frame unchanged, encrypted per client.
    Gold = 0,
    /// 44.1 kHz stereo 128 kbit/s, encoded per client, encrypted per client.
    Silver = 1,
    /// 22.05 kHz mono 32 kbit/s, encoded once, free.
    Bronze = 2,
}

impl Tier {
    /// The tier of a wire byte.
    pub fn from_byte(b: u8) -> Option<Tier> {
        match b {
            0 => Some(Tier::Gold),
            1 => Some(Tier::Silver),
            2 => Some(Tier::Bronze),
            _ => None,
        }
    }
    /// The cache pod's name for this tier.
    pub fn cache(self) -> &'static str {
        match self {
            Tier::Gold => "gold",
            Tier::Silver => "silver",
            Tier::Bronze => "bronze",
        }
    }
}

/// A source packet: `[seq u32 BE][one MP3 frame]`.
#[derive(Debug, Clone, Copy)]
pub struct SourceFrame<'a> {
    /// The frame's sequence number.
    pub seq: u32,
    /// The MP3 frame.
    pub frame: &'a [u8],
}

impl<'a> SourceFrame<'a> {
    /// Parses a source packet; `None` if it is shorter than 5 bytes or
    /// its frame is longer than [`MAX_FRAME`].
    pub fn parse(b: &'a [u8]) -> Option<SourceFrame<'a>> {
        let (seq, frame) = b.split_first_chunk::<4>()?;
        (!frame.is_empty() && frame.len() <= MAX_FRAME).then_some(SourceFrame { seq: u32::from_be_bytes(*seq), frame })
    }
}

/// The packet a client receives: `[seq u32 BE][tier][body]` (the body is
/// AES-128-CTR ciphertext for gold and silver, the MP3 frame for bronze).
pub fn client_packet(seq: u32, tier: Tier, body: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&seq.to_be_bytes());
    out.push(tier as u8);
    out.extend_from_slice(body);
}

/// A stream's set-up: `[tier][client IPv4 BE][client port BE]` then, for
/// gold and silver, the client's 16-byte AES key.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    /// The stream's tier.
    pub tier: Tier,
    /// The client's address.
    pub addr: u32,
    /// The client's UDP port.
    pub port: u16,
    /// The client's key (gold and silver).
    pub key: Option<[u8; 16]>,
}

impl Setup {
    /// Parses a set-up; `None` on a bad tier or length.
    pub fn parse(b: &[u8]) -> Option<Setup> {
        let (&t, rest) = b.split_first()?;
        let tier = Tier::from_byte(t)?;
        let (addr, rest) = rest.split_first_chunk::<4>()?;
        let (port, rest) = rest.split_first_chunk::<2>()?;
        let key = match tier {
            Tier::Bronze if rest.is_empty() => None,
            Tier::Gold | Tier::Silver => Some(*<&[u8; 16]>::try_from(rest).ok()?),
            Tier::Bronze => return None,
        };
        Some(Setup { tier, addr: u32::from_be_bytes(*addr), port: u16::from_be_bytes(*port), key })
    }
}

/// The node's `pod` interface (docs/pods.md).
pub mod sys {
    #[link(wasm_import_module = "pod")]
    unsafe extern "C" {
        pub fn bind(name: *const u8, len: i32, region: *mut u8, region_len: i32) -> i32;
        pub fn call(binding: i32, in_len: i32) -> i32;
        pub fn unbind(binding: i32) -> i32;
    }
}

/// A full binding to a pod offer, with its argument region (a boxed slice:
/// its address stays put while the binding lives; dropping the binding
/// unbinds before the region is freed).
pub struct Binding {
    id: i32,
    region: Box<[u8]>,
}

impl Binding {
    /// Binds to `offer` (`"pod.entry"`) with an argument region of `len`
    /// bytes and completes the bind request. The pod's status code on failure.
    pub fn open(offer: &str, len: usize) -> Result<Binding, i32> {
        let mut region = vec![0u8; len].into_boxed_slice();
        let id = unsafe { sys::bind(offer.as_ptr(), offer.len() as i32, region.as_mut_ptr(), region.len() as i32) };
        if id <= 0 {
            return Err(if id == 0 { -1 } else { id });
        }
        let b = Binding { id, region };
        match unsafe { sys::call(b.id, 0) } {
            0 => Ok(b),
            e => Err(e),
        }
    }

    /// Calls the offer with `parts` concatenated as its argument; the bytes
    /// it returned, or its status code (-1 when the argument does not fit).
    pub fn call(&mut self, parts: &[&[u8]]) -> Result<&[u8], i32> {
        let mut n = 0;
        for p in parts {
            let dst = self.region.get_mut(n..n + p.len()).ok_or(-1)?;
            dst.copy_from_slice(p);
            n += p.len();
        }
        let r = unsafe { sys::call(self.id, n as i32) };
        let len = usize::try_from(r).map_err(|_| r)?;
        self.region.get(..len).ok_or(-1)
    }
}

impl Drop for Binding {
    fn drop(&mut self) {
        let _ = unsafe { sys::unbind(self.id) };
    }
}

/// `E_GONE` of the `pod` interface: the pod was restored or unloaded; bind again.
pub const E_GONE: i32 = -17;

/// Bronze's 2:1 decimator: downmix to mono, low-pass at about 10 kHz
/// (31 taps, Hann-windowed sinc), keep every second sample. Its history
/// spans frames, so consecutive frames join without a click.
pub struct HalfBand {
    taps: [f32; HalfBand::TAPS],
    hist: Vec<f32>,
}

impl Default for HalfBand {
    fn default() -> Self {
        Self::new()
    }
}

impl HalfBand {
    const TAPS: usize = 31;

    /// A decimator with an empty history.
    pub fn new() -> HalfBand {
        let mut taps = [0f32; HalfBand::TAPS];
        let m = (HalfBand::TAPS - 1) as f32 / 2.0;
        let fc = 0.23f32; // cut-off, in cycles per input sample (10.1 kHz at 44.1 kHz)
        let mut sum = 0.0;
        for (i, t) in taps.iter_mut().enumerate() {
            let x = i as f32 - m;
            let sinc = if x == 0.0 {
                2.0 * fc
            } else {
                (2.0 * std::f32::consts::PI * fc * x).sin() / (std::f32::consts::PI * x)
            };
            let w = 0.5 - 0.5 * (2.0 * std::f32::consts::PI * i as f32 / (HalfBand::TAPS - 1) as f32).cos();
            *t = sinc * w;
            sum += *t;
        }
        for t in &mut taps {
            *t /= sum;
        }
        HalfBand { taps, hist: vec![0.0; HalfBand::TAPS - 1] }
    }

    /// Decimates one frame of interleaved stereo (`2 * n` samples) into
    /// `out` (`n / 2` mono samples).
    pub fn process(&mut self, stereo: &[f32], out: &mut Vec<f32>) {
        out.clear();
        let keep = self.hist.len();
        self.hist.extend(stereo.chunks_exact(2).map(|c| 0.5 * (c[0] + c[1])));
        let mut i = 0;
        while i + HalfBand::TAPS <= self.hist.len() {
            let acc: f32 = self.hist[i..i + HalfBand::TAPS].iter().zip(&self.taps).map(|(x, t)| x * t).sum();
            out.push(acc);
            i += 2;
        }
        let drop = self.hist.len() - keep;
        self.hist.drain(..drop);
    }
}

/// Quantises interleaved PCM to the silver cache's 16-bit LE format
/// (non-finite samples become 0).
pub fn pcm_to_i16(pcm: &[f32], out: &mut Vec<u8>) {
    out.clear();
    for &s in pcm {
        let v = if s.is_finite() { (s * 32767.0).clamp(-32768.0, 32767.0) as i16 } else { 0 };
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The silver cache's format back to per-channel PCM; `None` unless it
/// holds exactly one stereo frame.
pub fn i16_to_pcm(b: &[u8], l: &mut [f32; FRAME_SAMPLES], r: &mut [f32; FRAME_SAMPLES]) -> Option<()> {
    if b.len() != PCM_BYTES {
        return None;
    }
    for (i, c) in b.chunks_exact(4).enumerate() {
        l[i] = f32::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0;
        r[i] = f32::from(i16::from_le_bytes([c[2], c[3]])) / 32768.0;
    }
    Some(())
}

/// Silver's per-client customisation (Expert §4.1 lets each stream be
/// processed for its client): a pseudo-random ±1/4096 signature seeded by
/// the client, added to both channels before the client's own encode, so
/// each silver stream is a distinct encode whose cost grows with the number
/// of silver streams, as each ENC instance of Expert Fig. 3 does.
pub fn watermark(seed: u32, l: &mut [f32], r: &mut [f32]) {
    let mut x = seed | 1;
    for (a, b) in l.iter_mut().zip(r.iter_mut()) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let w = if x & 1 == 0 { 1.0 / 4096.0 } else { -1.0 / 4096.0 };
        *a += w;
        *b += w;
    }
}

/// A client's watermark seed: its address and port.
pub fn seed_of(addr: u32, port: u16) -> u32 {
    addr.rotate_left(16) ^ u32::from(port).wrapping_mul(0x9E37_79B9)
}
