//! Cookies against reflection (WireGuard's cookie reply and QUIC's Retry,
//! for Noise XX).
//!
//! Any source may send an XX first message: it carries nothing the node can
//! check, and a forged source address makes the node reflect its answer
//! (220 bytes for 52, and the answer carries the node's identity) onto a
//! victim. So a first message without a cookie gets only a cookie reply,
//! smaller than what it answers and naming nothing; the initiator sends its
//! first message again with the cookie appended, which proves it receives at
//! its address, and only then does the node do any Noise work or send
//! anything larger.
//!
//! A cookie is the first [`COOKIE_LEN`] bytes of HMAC-SHA256 (ring) over
//! the source address, the sender index and the initiator's ephemeral key,
//! keyed with a random secret that is replaced every [`ROTATE_MS`]; a
//! cookie made with the current or the previous secret is accepted, so a
//! cookie lives between one and two rotation periods. Nothing is stored per
//! source: the check is stateless. Comparison is constant-time (`subtle`).

use core::net::SocketAddr;
use ring::hmac;
use subtle::ConstantTimeEq;

/// Cookie length in bytes.
pub const COOKIE_LEN: usize = 16;
/// How often the cookie secret is replaced (ms).
pub const ROTATE_MS: u64 = 120_000;

/// The node's cookie secrets.
pub(crate) struct Cookies {
    current: hmac::Key,
    previous: hmac::Key,
    since_ms: u64,
}

fn fresh_key() -> hmac::Key {
    let mut secret = zeroize::Zeroizing::new([0u8; 32]);
    // An OS without randomness cannot run the node at all (snow needs it
    // too); a zero secret would still only weaken reflection protection.
    let _ = getrandom::fill(&mut secret[..]);
    hmac::Key::new(hmac::HMAC_SHA256, &secret[..])
}

fn mac(key: &hmac::Key, from: SocketAddr, sender: u32, ephemeral: &[u8]) -> hmac::Tag {
    let mut ctx = hmac::Context::with_key(key);
    match from {
        SocketAddr::V4(a) => {
            ctx.update(&[4]);
            ctx.update(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            ctx.update(&[6]);
            ctx.update(&a.ip().octets());
        }
    }
    ctx.update(&from.port().to_be_bytes());
    ctx.update(&sender.to_be_bytes());
    ctx.update(ephemeral);
    ctx.sign()
}

impl Cookies {
    pub(crate) fn new(now_ms: u64) -> Cookies {
        Cookies { current: fresh_key(), previous: fresh_key(), since_ms: now_ms }
    }

    /// Replaces the secrets once per period that has passed (after two
    /// periods neither old secret is left).
    fn rotate(&mut self, now_ms: u64) {
        let mut turns = 0;
        while now_ms.saturating_sub(self.since_ms) >= ROTATE_MS && turns < 2 {
            self.previous = core::mem::replace(&mut self.current, fresh_key());
            self.since_ms += ROTATE_MS;
            turns += 1;
        }
        if now_ms.saturating_sub(self.since_ms) >= ROTATE_MS {
            self.since_ms = now_ms;
        }
    }

    /// The cookie for a first message from `from` with this sender index
    /// and ephemeral key.
    pub(crate) fn make(&mut self, now_ms: u64, from: SocketAddr, sender: u32, ephemeral: &[u8]) -> [u8; COOKIE_LEN] {
        self.rotate(now_ms);
        let t = mac(&self.current, from, sender, ephemeral);
        let mut c = [0u8; COOKIE_LEN];
        c.copy_from_slice(&t.as_ref()[..COOKIE_LEN]);
        c
    }

    /// Whether `cookie` was made by [`make`](Self::make) for these inputs
    /// within the last one or two rotation periods.
    pub(crate) fn check(
        &mut self,
        now_ms: u64,
        from: SocketAddr,
        sender: u32,
        ephemeral: &[u8],
        cookie: &[u8],
    ) -> bool {
        self.rotate(now_ms);
        let mut ok = subtle::Choice::from(0);
        for k in [&self.current, &self.previous] {
            let t = mac(k, from, sender, ephemeral);
            ok |= t.as_ref()[..COOKIE_LEN].ct_eq(cookie);
        }
        bool::from(ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_bind_source_index_and_key_and_expire() {
        let a: SocketAddr = "192.0.2.1:4000".parse().expect("addr");
        let b: SocketAddr = "192.0.2.1:4001".parse().expect("addr");
        let e = [7u8; 32];
        let mut c = Cookies::new(0);
        let k = c.make(0, a, 9, &e);
        assert!(c.check(10, a, 9, &e, &k));
        assert!(!c.check(10, b, 9, &e, &k), "another port");
        assert!(!c.check(10, a, 8, &e, &k), "another sender index");
        assert!(!c.check(10, a, 9, &[8u8; 32], &k), "another ephemeral key");
        assert!(!c.check(10, a, 9, &e, &k[..8]), "truncated");
        assert!(c.check(ROTATE_MS + 1, a, 9, &e, &k), "previous secret still accepted");
        assert!(!c.check(2 * ROTATE_MS + 2, a, 9, &e, &k), "gone after two rotations");
        // Two periods at once retire both old secrets too.
        let mut c = Cookies::new(0);
        let k = c.make(0, a, 9, &e);
        assert!(!c.check(2 * ROTATE_MS, a, 9, &e, &k));
    }
}
