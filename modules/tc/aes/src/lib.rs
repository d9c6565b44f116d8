//! The transcoder's AES pod (Expert Fig. 3, issue 17): per-client
//! AES-128-CTR keys (RustCrypto `aes` + `ctr`) that never leave the pod.
//!
//! One offer, `seal`. A binding is one client stream:
//! - the bind request takes a free key slot (at most [`SLOTS`]; refused
//!   when full or when the client is another pod);
//! - the binding's **first call** must be exactly the client's 16-byte key
//!   (the node's bind request carries only the host's particulars, so the
//!   key follows as the binding's first argument); it returns nothing and
//!   the key is stored in the slot;
//! - every later call is `[seq u32 LE][plaintext, 1..=MAX bytes]` and
//!   returns the plaintext encrypted under the slot's key with the IV
//!   `seq (BE) ‖ 0^12` (so a (key, seq) pair is never reused by a stream).
//!
//! No offer returns a key, and a binding's slot is its own: a client can
//! encrypt only under the key it gave. `pod_unbind` zeroes the slot.
//! The pod imports nothing; its input is checked (-1 on a bad length).
#![no_std]

use ctr::cipher::{KeyIvInit, StreamCipher};

type Aes128Ctr = ctr::Ctr128BE<aes::Aes128>;

/// Client streams at once.
pub const SLOTS: usize = 64;
/// The largest plaintext.
pub const MAX: usize = 2048;
const BUF: usize = MAX + 4;
const KIND_AT: usize = 32;

#[derive(Clone, Copy)]
struct Slot {
    used: bool,
    keyed: bool,
    key: [u8; 16],
}

struct Pod {
    buf: [u8; BUF],
    slots: [Slot; SLOTS],
}

static mut POD: Pod = Pod { buf: [0; BUF], slots: [Slot { used: false, keyed: false, key: [0; 16] }; SLOTS] };

// `&mut STATIC` is refused in edition 2024; a raw pointer is the way.
#[allow(clippy::deref_addrof)]
fn pod() -> &'static mut Pod {
    // The pod is single-threaded and never re-entered (docs/pods.md).
    unsafe { &mut *(&raw mut POD) }
}

#[unsafe(no_mangle)]
pub extern "C" fn pod_buffer() -> i32 {
    pod().buf.as_ptr() as i32
}

#[unsafe(no_mangle)]
pub extern "C" fn pod_buffer_len() -> i32 {
    BUF as i32
}

/// The state is the client's slot.
#[unsafe(no_mangle)]
pub extern "C" fn pod_bind(_len: i32) -> i32 {
    let p = pod();
    if p.buf[KIND_AT] != 0 {
        return -1; // only modules (stream paths) hold keys here
    }
    match p.slots.iter().position(|s| !s.used) {
        Some(i) => {
            p.slots[i] = Slot { used: true, keyed: false, key: [0; 16] };
            i as i32
        }
        None => -1,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn pod_unbind(state: i32) {
    if let Some(s) = usize::try_from(state).ok().and_then(|i| pod().slots.get_mut(i)) {
        *s = Slot { used: false, keyed: false, key: [0; 16] };
    }
}

#[unsafe(export_name = "offer.seal")]
pub extern "C" fn seal(state: i32, len: i32) -> i32 {
    let p = pod();
    let Some(slot) = usize::try_from(state).ok().and_then(|i| p.slots.get_mut(i)).filter(|s| s.used) else {
        return -1;
    };
    let Some(arg) = usize::try_from(len).ok().and_then(|l| p.buf.get_mut(..l)) else { return -1 };
    if !slot.keyed {
        let Ok(key) = <[u8; 16]>::try_from(&*arg) else { return -1 };
        slot.key = key;
        slot.keyed = true;
        arg.fill(0);
        return 0;
    }
    let Some((seq, text)) = arg.split_first_chunk_mut::<4>() else { return -1 };
    if text.is_empty() || text.len() > MAX {
        return -1;
    }
    let mut iv = [0u8; 16];
    iv[..4].copy_from_slice(&u32::from_le_bytes(*seq).to_be_bytes());
    let mut c = Aes128Ctr::new(&slot.key.into(), &iv.into());
    c.apply_keystream(text);
    let n = text.len();
    p.buf.copy_within(4..4 + n, 0);
    n as i32
}

#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}
