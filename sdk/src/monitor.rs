//! Monitoring modules (FLAME): the `mon` interface and the entry points the
//! monitor calls.
//!
//! A monitoring module defines its per-packet and periodic parts with
//! [`monitor_module!`](crate::monitor_module), which generates the exports
//! the monitor calls (`mon_init`, `mon_packet`, `mon_batch`, `mon_tick`):
//!
//! ```ignore
//! fn packet(view: &[u8], index: u32, status: u32) { /* one policy view */ }
//! fn tick(now_ns: u64) { /* heavier work, under the periodic budget */ }
//! anode_sdk::monitor_module!(packet, tick);
//! ```
//!
//! `view` is one view record as the module's credential lets it see the
//! packet (decode it with `anode_monitor_apps::abi::View`); `index` names the
//! packet in the current call for [`sample`]; `status` is the number of
//! consecutive calls before this one that the monitor cut off for exceeding
//! the CPU budget (FLAME's "environment variable"): non-zero means state
//! from an interrupted call may be half-updated.
//!
//! Views are written by the monitor into a region of the module's own
//! memory that `mon_init` reserves by growing the memory; a module can read
//! nothing else of the packet.

/// Raw `mon` imports.
pub mod sys {
    #[link(wasm_import_module = "mon")]
    unsafe extern "C" {
        pub fn emit(ptr: *const u8, len: i32) -> i32;
        pub fn sample(index: i32) -> i32;
    }
}

/// Exports a record (built with `anode_monitor_apps::abi::RecordBuilder`).
/// `Err(Other(-6))` if the credential grants no `export("records")`.
pub fn emit(record: &[u8]) -> Result<(), crate::Error> {
    crate::check(unsafe { sys::emit(record.as_ptr(), record.len() as i32) }).map(|_| ())
}

/// Asks the monitor to export packet `index` of the current call as a
/// sanitized pcap frame. `Err(Other(-6))` without `export("packets")`.
pub fn sample(index: u32) -> Result<(), crate::Error> {
    crate::check(unsafe { sys::sample(index as i32) }).map(|_| ())
}

/// A global for module state. wasm32 modules are single-threaded and the
/// monitor never re-enters a module, so one `with` at a time is the rule:
/// do not call `with` on the same global from inside its closure.
pub struct Global<T>(core::cell::UnsafeCell<T>);

// Sound because a wasm32-unknown-unknown module has exactly one thread.
unsafe impl<T> Sync for Global<T> {}

impl<T> Global<T> {
    /// A global holding `v`.
    pub const fn new(v: T) -> Global<T> {
        Global(core::cell::UnsafeCell::new(v))
    }
    /// Runs `f` with the value.
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        // Single thread, no re-entry (see the type's docs): no other reference exists.
        f(unsafe { &mut *self.0.get() })
    }
}

/// The view region `mon_init` reserved: (address, length).
pub static REGION: Global<(usize, usize)> = Global::new((0, 0));

/// Reserves `bytes` at the end of linear memory for the views (grows the
/// memory); returns the address, or -1 if the memory cannot grow.
#[cfg(target_arch = "wasm32")]
pub fn init_region(bytes: i32) -> i32 {
    let bytes = bytes.max(0) as usize;
    let pages = bytes.div_ceil(65_536);
    let prev = core::arch::wasm32::memory_grow(0, pages);
    if prev == usize::MAX {
        return -1;
    }
    let at = prev * 65_536;
    REGION.with(|r| *r = (at, bytes));
    at as i32
}

/// The view region as a slice.
pub fn region() -> &'static [u8] {
    let (at, len) = REGION.with(|r| *r);
    if len == 0 {
        return &[];
    }
    // The monitor checked at load that [at, at+len) lies in this module's
    // memory, which never shrinks.
    unsafe { core::slice::from_raw_parts(at as *const u8, len) }
}

/// Calls `f(view, index)` for each of the `n` views of a batch in the region.
pub fn for_each_view(n: u32, mut f: impl FnMut(&[u8], u32)) {
    let r = region();
    let mut off = 0usize;
    for i in 0..n {
        let Some(head) = r.get(off..off + 4) else { return };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let Some(v) = r.get(off..off + len) else { return };
        f(v, i);
        off = (off + len + 7) & !7;
    }
}

/// Defines the exports of a monitoring module from a per-packet function
/// `fn(&[u8], u32, u32)` (view, index, status) and a periodic function `fn(u64)`.
#[macro_export]
macro_rules! monitor_module {
    ($packet:path, $tick:path) => {
        #[unsafe(no_mangle)]
        pub extern "C" fn mon_init(region: i32, _max_batch: i32) -> i32 {
            $crate::monitor::init_region(region)
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn mon_packet(status: i32) -> i32 {
            $crate::monitor::for_each_view(1, |v, i| $packet(v, i, status as u32));
            0
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn mon_batch(n: i32, status: i32) -> i32 {
            $crate::monitor::for_each_view(n.max(0) as u32, |v, i| $packet(v, i, status as u32));
            0
        }
        #[unsafe(no_mangle)]
        pub extern "C" fn mon_tick(now_ns: i64) -> i32 {
            $tick(now_ns as u64);
            0
        }
    };
}
