//! One request over a user's security association with a node (SANE §4.8):
//! a Noise XX handshake binds the user's Ed25519 identity to an SA, the
//! request travels as an encrypted control message, and the node's answer
//! comes back over the same SA. Used by `anode module` and `anode session`.

use anode_sec::sa::{AH_LEN, OVERHEAD};
use anode_sec::{Identity, Links, LinksConfig, Mode, Output, PublicKey};
use anode_wire::anep;
use anyhow::{Context, Result, anyhow, bail};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where and as whom to ask.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The node's UDP endpoint (one of its interfaces' listen addresses).
    #[arg(long)]
    pub node: SocketAddr,
    /// The node's public key (hex, or a .pub/.key file): the handshake
    /// fails unless the node proves it.
    #[arg(long)]
    pub node_key: Option<String>,
    /// The user's secret key file.
    #[arg(long)]
    pub key: PathBuf,
    /// Seconds to wait for the handshake and the answer.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
}

/// The largest UDP payload over IPv4.
const MAX_DATAGRAM: usize = 65_507;

fn now_ms(t0: Instant) -> u64 {
    t0.elapsed().as_millis() as u64
}

/// Sends `body` as a control message over an encrypted SA with the node
/// and returns the payload of the node's control answer.
pub fn request(t: &Target, body: &[u8], what: &str) -> Result<Vec<u8>> {
    let mut r = requests(t, body, 1, what)?;
    r.pop().ok_or_else(|| anyhow!("no answer from {}", t.node))
}

/// The longest control message one request carries (a UDP datagram less
/// the ANEP headers, AH and tag around it).
pub const MAX_BODY: usize = MAX_DATAGRAM - (anep::HEADER_LEN + OVERHEAD + anep::HEADER_LEN);

/// Sends `body` `count` times over one SA (a burst, for tests of the node's
/// rate limits) and returns the answers that came back before the timeout.
pub fn requests(t: &Target, body: &[u8], count: usize, what: &str) -> Result<Vec<Vec<u8>>> {
    exchange(t, &vec![body; count], None, what)
}

/// Sends `bodies` over one SA, each after the answer to the one before (a
/// module staged in chunks, then its load), and returns the answers; it
/// stops early at an answer `go_on` refuses. The timeout runs from the
/// last answer.
pub fn request_sequence(t: &Target, bodies: &[&[u8]], go_on: GoOn<'_>, what: &str) -> Result<Vec<Vec<u8>>> {
    exchange(t, bodies, Some(go_on), what)
}

/// Whether a sequence goes on after this answer.
type GoOn<'a> = &'a dyn Fn(&[u8]) -> bool;

/// [`requests`] (`go_on` `None`: all at once) and [`request_sequence`].
fn exchange(t: &Target, bodies: &[&[u8]], go_on: Option<GoOn<'_>>, what: &str) -> Result<Vec<Vec<u8>>> {
    let node = t.node;
    if let Some(body) = bodies.iter().find(|b| b.len() > MAX_BODY) {
        bail!(
            "the request ({what}) is {} bytes; one control request carries at most {MAX_BODY} (a UDP datagram)",
            body.len()
        );
    }
    let count = bodies.len();
    let mut answers = Vec::new();
    let me = Identity::load(&t.key)?;
    let expect = match &t.node_key {
        None => None,
        Some(k) if Path::new(k).exists() => Some(crate::keys_cmd::public_of(Path::new(k))?),
        Some(k) => Some(PublicKey::parse(k)?),
    };
    let t0 = Instant::now();
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64)?;
    let mut links = Links::new(me, LinksConfig { unix_offset_ms: unix, ..LinksConfig::default() }, 0)
        .map_err(|e| anyhow!("{e}"))?;
    let peer = links.connect(node, expect, Mode::Encrypt, 0);
    let sock = UdpSocket::bind("0.0.0.0:0").context("binding a UDP socket")?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    if count > 1 {
        // Room for a burst of answers (each costs ~1 KiB of buffer).
        let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBuf, &(count.min(10_000) * 2048));
    }
    let wait = Duration::from_secs_f64(t.timeout.max(0.1));
    let mut deadline = t0 + wait;
    let mut buf = vec![0u8; 65_536];
    let mut sent = 0;
    let mut last_error = None;
    while Instant::now() < deadline {
        let mut out = Vec::new();
        links.poll(now_ms(t0), &mut out);
        if let Ok((n, from)) = sock.recv_from(&mut buf) {
            let Ok(a) = anep::Packet::new_checked(&buf[..n]) else { continue };
            let (type_id, ps) = (a.type_id(), a.payload_start());
            match type_id {
                anep::TYPE_HANDSHAKE => {
                    // A busy node may answer a retransmitted message twice:
                    // a late duplicate is not a failure; keep waiting.
                    if let Err(e) = links.handle_handshake(from, &buf[ps..n], now_ms(t0), &mut out) {
                        last_error = Some(e.to_string());
                    }
                }
                anep::TYPE_AUTH | anep::TYPE_ESP => {
                    let enc = type_id == anep::TYPE_ESP;
                    if let Ok(o) = links.open(&mut buf[..n], ps, enc, now_ms(t0))
                        && let Ok(ia) = anep::Packet::new_checked(&buf[o.inner.clone()])
                        && ia.type_id() == anep::TYPE_CONTROL
                    {
                        answers.push(ia.payload().to_vec());
                        if answers.len() >= count || go_on.is_some_and(|f| !f(ia.payload())) {
                            return Ok(answers);
                        }
                        deadline = Instant::now() + wait;
                    }
                }
                _ => {}
            }
        }
        for o in out {
            if let Output::Handshake { to, msg, .. } = o {
                sock.send_to(&anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_HANDSHAKE, &msg), to)?;
            }
        }
        // All at once (a burst), or the next when the one before is answered.
        let due = if go_on.is_none() { count } else { (answers.len() + 1).min(count) };
        if links.is_up(peer) && sent < due {
            for body in &bodies[sent..due] {
                let inner = anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_CONTROL, body);
                let mut d = vec![0u8; anep::HEADER_LEN + OVERHEAD + inner.len()];
                d[anep::HEADER_LEN + AH_LEN..anep::HEADER_LEN + AH_LEN + inner.len()].copy_from_slice(&inner);
                anep::write_header(&mut d, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_ESP, AH_LEN + inner.len() + 16);
                let len =
                    links.seal(peer, &mut d, anep::HEADER_LEN, inner.len(), now_ms(t0)).map_err(|e| anyhow!("{e}"))?;
                sock.send_to(&d[..len], node)?;
            }
            if sent == 0
                && let Some(k) = links.key_of(peer)
            {
                eprintln!("SA up with {node} (node {}); {what} sent", k.fingerprint());
            }
            sent = due;
        }
    }
    if sent > 0 {
        if !answers.is_empty() {
            return Ok(answers);
        }
        bail!("no answer from {node}")
    }
    match last_error {
        Some(e) => bail!("handshake with {node} failed: {e}"),
        None => bail!("no handshake with {node}: is it running, and is this key in its [security] users?"),
    }
}
