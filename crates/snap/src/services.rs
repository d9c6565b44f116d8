//! Node-resident services reached with `calls "name"` (SNAP §III-B).
//!
//! The table is extensible at run time: [`ServiceTable::register`] adds a
//! service under a name, [`ServiceTable::unregister`] removes it. A service
//! declares how many stack values it consumes ([`Service::arity`]) and returns
//! exactly one value, so `calls` keeps the one-word-per-instruction stack rule.
//!
//! Services see resolved argument values ([`Arg`]), never heap offsets, and
//! return scalars ([`Ret`]), so they cannot reach into a packet's memory.
//! The built-ins are SNAP-safe (§IV-B): constant time and constant space.
//! - `clock.ms`, `clock.s`: the node clock (milliseconds / seconds modulo 2^24).
//! - `ifcount`: the node's interface count.
//! - `state.put key value ttl_s`, `state.get key`, `state.del key`: a bounded
//!   per-node soft-state store with expiry ([`SoftState`]).
//! - `print v`: appends a line to the packet's log output.
//! - `abort msg`: ends the packet with a fault carrying the message.

use crate::value::Tag;
use core::net::Ipv4Addr;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex};

/// Longest service name, in bytes. Longer names are never found.
pub const MAX_NAME: usize = 32;
/// Longest byte-string argument passed by value to a service.
pub const MAX_BYTES_ARG: usize = 32;

/// A short byte string passed to a service (blob or string argument).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SmallBytes {
    buf: [u8; MAX_BYTES_ARG],
    len: u8,
}

impl SmallBytes {
    /// Copies `b` if it is at most [`MAX_BYTES_ARG`] bytes long.
    pub fn new(b: &[u8]) -> Option<SmallBytes> {
        if b.len() > MAX_BYTES_ARG {
            return None;
        }
        let mut buf = [0; MAX_BYTES_ARG];
        buf[..b.len()].copy_from_slice(b);
        Some(SmallBytes { buf, len: b.len() as u8 })
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }
}

impl core::fmt::Debug for SmallBytes {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// A service argument, resolved from the packet's stack and heap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// An integer.
    Int(i32),
    /// A boolean.
    Bool(bool),
    /// Unit.
    Unit,
    /// An address.
    Addr(Ipv4Addr),
    /// A float.
    Float(f32),
    /// A blob or string of at most [`MAX_BYTES_ARG`] bytes.
    Bytes(Tag, SmallBytes),
    /// A value that is not passed by value (tuple, long blob, unknown tag).
    Opaque(u8),
}

/// A service result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ret {
    /// An integer (truncated to 25 bits when pushed).
    Int(i32),
    /// A boolean.
    Bool(bool),
    /// Unit.
    Unit,
    /// An address (allocated in the packet's heap).
    Addr(Ipv4Addr),
    /// A float (allocated in the packet's heap).
    Float(f32),
}

/// Why a service refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// Argument `index` (0 is the deepest) has the wrong type.
    #[error("argument {index} has the wrong type, expected {expected}")]
    BadArgument {
        /// Argument position, 0 for the first (deepest).
        index: u8,
        /// What was expected.
        expected: &'static str,
    },
    /// The service is out of a bounded resource.
    #[error("service resource exhausted: {0}")]
    Exhausted(&'static str),
    /// The packet ended itself with `abort` (PLAN's run-time errors, such as
    /// a list longer than its fold bound); the message, if it was a short
    /// string or blob.
    #[error("the program aborted: {0:?}")]
    Aborted(SmallBytes),
}

/// What a service may know about the node and the call.
#[derive(Debug)]
pub struct ServiceCx<'a> {
    /// Monotonic node time in milliseconds.
    pub now_ms: u64,
    /// This node's address.
    pub here: Ipv4Addr,
    /// Interface count.
    pub interfaces: u8,
    /// Output for `print`; the VM bounds its length.
    pub log: &'a mut String,
}

/// A node-resident service.
pub trait Service: Send + Sync {
    /// Number of stack values consumed.
    fn arity(&self) -> usize;
    /// Runs the service. `args[0]` is the deepest argument.
    fn call(&self, cx: &mut ServiceCx<'_>, args: &[Arg]) -> Result<Ret, ServiceError>;
}

/// Most arguments a service may take.
pub const MAX_ARITY: usize = 4;

/// The extensible table of services.
#[derive(Clone, Default)]
pub struct ServiceTable {
    map: HashMap<Box<[u8]>, Arc<dyn Service>>,
}

impl core::fmt::Debug for ServiceTable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mut names: Vec<_> = self.names();
        names.sort();
        f.debug_struct("ServiceTable").field("names", &names).finish()
    }
}

/// A service could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The name is empty or longer than [`MAX_NAME`].
    #[error("service name must be 1..={MAX_NAME} bytes")]
    BadName,
    /// The arity exceeds [`MAX_ARITY`].
    #[error("service arity {0} exceeds {MAX_ARITY}")]
    BadArity(usize),
}

impl ServiceTable {
    /// An empty table.
    pub fn new() -> ServiceTable {
        ServiceTable::default()
    }

    /// A table with the built-in SNAP-safe services.
    pub fn with_builtins() -> ServiceTable {
        let mut t = ServiceTable::new();
        let state = Arc::new(SoftState::new(1024));
        let reg: [(&str, Arc<dyn Service>); 8] = [
            ("clock.ms", Arc::new(Clock { div: 1 })),
            ("clock.s", Arc::new(Clock { div: 1000 })),
            ("ifcount", Arc::new(IfCount)),
            ("state.put", Arc::new(StatePut(state.clone()))),
            ("state.get", Arc::new(StateGet(state.clone()))),
            ("state.del", Arc::new(StateDel(state))),
            ("print", Arc::new(Print)),
            ("abort", Arc::new(Abort)),
        ];
        for (n, s) in reg {
            // Names and arities above are valid by construction.
            let _ = t.register(n, s);
        }
        t
    }

    /// Adds or replaces a service.
    pub fn register(&mut self, name: &str, s: Arc<dyn Service>) -> Result<(), RegisterError> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(RegisterError::BadName);
        }
        if s.arity() > MAX_ARITY {
            return Err(RegisterError::BadArity(s.arity()));
        }
        self.map.insert(name.as_bytes().into(), s);
        Ok(())
    }

    /// Removes a service; returns whether it existed.
    pub fn unregister(&mut self, name: &str) -> bool {
        self.map.remove(name.as_bytes()).is_some()
    }

    /// Looks a service up by name.
    pub fn get(&self, name: &[u8]) -> Option<&Arc<dyn Service>> {
        if name.len() > MAX_NAME {
            return None;
        }
        self.map.get(name)
    }

    /// Registered names.
    pub fn names(&self) -> Vec<String> {
        self.map.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect()
    }
}

struct Clock {
    div: u64,
}
impl Service for Clock {
    fn arity(&self) -> usize {
        0
    }
    fn call(&self, cx: &mut ServiceCx<'_>, _: &[Arg]) -> Result<Ret, ServiceError> {
        Ok(Ret::Int(((cx.now_ms / self.div) % (1 << 24)) as i32))
    }
}

struct IfCount;
impl Service for IfCount {
    fn arity(&self) -> usize {
        0
    }
    fn call(&self, cx: &mut ServiceCx<'_>, _: &[Arg]) -> Result<Ret, ServiceError> {
        Ok(Ret::Int(cx.interfaces as i32))
    }
}

/// Most bytes `print` adds to a packet's log.
pub const MAX_LOG: usize = 256;

struct Print;
impl Service for Print {
    fn arity(&self) -> usize {
        1
    }
    fn call(&self, cx: &mut ServiceCx<'_>, args: &[Arg]) -> Result<Ret, ServiceError> {
        use core::fmt::Write;
        let mut line = String::new();
        let _ = match args.first() {
            Some(Arg::Int(i)) => write!(line, "{i}"),
            Some(Arg::Bool(b)) => write!(line, "{b}"),
            Some(Arg::Unit) => write!(line, "()"),
            Some(Arg::Addr(a)) => write!(line, "{a}"),
            Some(Arg::Float(x)) => write!(line, "{x}"),
            Some(Arg::Bytes(_, b)) => write!(line, "{}", String::from_utf8_lossy(b.as_bytes())),
            Some(Arg::Opaque(t)) => write!(line, "<tag {t}>"),
            None => Ok(()),
        };
        let room = MAX_LOG.saturating_sub(cx.log.len());
        if room > 1 {
            let mut end = line.len().min(room - 1);
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            cx.log.push_str(&line[..end]);
            cx.log.push('\n');
        }
        Ok(Ret::Unit)
    }
}

/// `abort msg`: always fails, ending the packet with a `service_failed`
/// fault that carries the message (so it has no network effect). PLAN
/// programs compiled by `anode-plan` use it for run-time errors.
struct Abort;
impl Service for Abort {
    fn arity(&self) -> usize {
        1
    }
    fn call(&self, _: &mut ServiceCx<'_>, args: &[Arg]) -> Result<Ret, ServiceError> {
        let msg = match args.first() {
            Some(Arg::Bytes(_, b)) => *b,
            _ => SmallBytes::new(b"").unwrap_or(SmallBytes { buf: [0; MAX_BYTES_ARG], len: 0 }),
        };
        Err(ServiceError::Aborted(msg))
    }
}

/// Longest time-to-live accepted by `state.put`, in seconds.
pub const MAX_TTL_S: i32 = 3600;
const WAYS: usize = 4;

#[derive(Clone, Copy)]
struct Slot {
    key: Option<Key>,
    value: Ret,
    expires_ms: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Key {
    Int(i32),
    Bool(bool),
    Addr(Ipv4Addr),
    Bytes(SmallBytes),
}

impl Key {
    fn from_arg(a: &Arg) -> Option<Key> {
        match *a {
            Arg::Int(i) => Some(Key::Int(i)),
            Arg::Bool(b) => Some(Key::Bool(b)),
            Arg::Addr(a) => Some(Key::Addr(a)),
            Arg::Bytes(_, b) => Some(Key::Bytes(b)),
            _ => None,
        }
    }
}

/// A bounded soft-state store: a set-associative table of `sets × 4` slots.
///
/// Every operation touches one set of four slots, so it runs in constant time
/// and the store never grows (SNAP-safe). A full set evicts the slot that
/// expires first. Keys are hashed with a per-store random key, so packets
/// cannot aim collisions at one set.
pub struct SoftState {
    sets: Mutex<Vec<[Slot; WAYS]>>,
    hasher: std::collections::hash_map::RandomState,
}

impl SoftState {
    /// A store with `sets` sets (rounded up to a power of two) of four slots.
    pub fn new(sets: usize) -> SoftState {
        let n = sets.max(1).next_power_of_two();
        let empty = Slot { key: None, value: Ret::Unit, expires_ms: 0 };
        SoftState { sets: Mutex::new(vec![[empty; WAYS]; n]), hasher: Default::default() }
    }

    fn index(&self, k: &Key, n: usize) -> usize {
        (self.hasher.hash_one(k) as usize) & (n - 1)
    }

    fn put(&self, k: Key, v: Ret, now: u64, ttl_ms: u64) {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let n = sets.len();
        let i = self.index(&k, n);
        let set = &mut sets[i];
        let pos = set
            .iter()
            .position(|s| s.key == Some(k))
            .or_else(|| set.iter().position(|s| s.key.is_none() || s.expires_ms <= now))
            .unwrap_or_else(|| {
                let mut best = 0;
                for (j, s) in set.iter().enumerate() {
                    if s.expires_ms < set[best].expires_ms {
                        best = j;
                    }
                }
                best
            });
        set[pos] = Slot { key: Some(k), value: v, expires_ms: now.saturating_add(ttl_ms) };
    }

    fn get(&self, k: &Key, now: u64) -> Ret {
        let sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let i = self.index(k, sets.len());
        sets[i].iter().find(|s| s.key.as_ref() == Some(k) && s.expires_ms > now).map_or(Ret::Unit, |s| s.value)
    }

    fn del(&self, k: &Key) -> bool {
        let mut sets = self.sets.lock().unwrap_or_else(|p| p.into_inner());
        let n = sets.len();
        let i = self.index(k, n);
        match sets[i].iter_mut().find(|s| s.key.as_ref() == Some(k)) {
            Some(s) => {
                s.key = None;
                true
            }
            None => false,
        }
    }
}

fn key_arg(args: &[Arg], i: usize) -> Result<Key, ServiceError> {
    args.get(i)
        .and_then(Key::from_arg)
        .ok_or(ServiceError::BadArgument { index: i as u8, expected: "int, bool, addr or short blob" })
}

struct StatePut(Arc<SoftState>);
impl Service for StatePut {
    fn arity(&self) -> usize {
        3
    }
    fn call(&self, cx: &mut ServiceCx<'_>, args: &[Arg]) -> Result<Ret, ServiceError> {
        let k = key_arg(args, 0)?;
        let v = match args.get(1) {
            Some(Arg::Int(i)) => Ret::Int(*i),
            Some(Arg::Bool(b)) => Ret::Bool(*b),
            Some(Arg::Unit) => Ret::Unit,
            Some(Arg::Addr(a)) => Ret::Addr(*a),
            Some(Arg::Float(f)) => Ret::Float(*f),
            _ => return Err(ServiceError::BadArgument { index: 1, expected: "scalar" }),
        };
        let ttl = match args.get(2) {
            Some(Arg::Int(t)) if (1..=MAX_TTL_S).contains(t) => *t as u64,
            _ => return Err(ServiceError::BadArgument { index: 2, expected: "ttl 1..=3600 s" }),
        };
        self.0.put(k, v, cx.now_ms, ttl * 1000);
        Ok(Ret::Unit)
    }
}

struct StateGet(Arc<SoftState>);
impl Service for StateGet {
    fn arity(&self) -> usize {
        1
    }
    fn call(&self, cx: &mut ServiceCx<'_>, args: &[Arg]) -> Result<Ret, ServiceError> {
        Ok(self.0.get(&key_arg(args, 0)?, cx.now_ms))
    }
}

struct StateDel(Arc<SoftState>);
impl Service for StateDel {
    fn arity(&self) -> usize {
        1
    }
    fn call(&self, _: &mut ServiceCx<'_>, args: &[Arg]) -> Result<Ret, ServiceError> {
        Ok(Ret::Bool(self.0.del(&key_arg(args, 0)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(now: u64, log: &mut String) -> ServiceCx<'_> {
        ServiceCx { now_ms: now, here: Ipv4Addr::new(10, 0, 0, 1), interfaces: 3, log }
    }

    #[test]
    fn soft_state_put_get_expire() {
        let t = ServiceTable::with_builtins();
        let mut log = String::new();
        let put = t.get(b"state.put").expect("put");
        let get = t.get(b"state.get").expect("get");
        put.call(&mut cx(0, &mut log), &[Arg::Int(5), Arg::Int(42), Arg::Int(2)]).expect("put ok");
        assert_eq!(get.call(&mut cx(1999, &mut log), &[Arg::Int(5)]), Ok(Ret::Int(42)));
        assert_eq!(get.call(&mut cx(2000, &mut log), &[Arg::Int(5)]), Ok(Ret::Unit));
        assert!(put.call(&mut cx(0, &mut log), &[Arg::Int(5), Arg::Int(1), Arg::Int(0)]).is_err());
        assert!(put.call(&mut cx(0, &mut log), &[Arg::Opaque(6), Arg::Int(1), Arg::Int(1)]).is_err());
    }

    #[test]
    fn soft_state_is_bounded() {
        let s = SoftState::new(4);
        for i in 0..10_000 {
            s.put(Key::Int(i), Ret::Int(i), 0, 1000);
        }
        let live = (0..10_000).filter(|i| s.get(&Key::Int(*i), 1) != Ret::Unit).count();
        assert!(live <= 16, "{live} live entries in a 16-slot store");
        assert!(live > 0);
    }

    #[test]
    fn registry_is_extensible() {
        let mut t = ServiceTable::new();
        assert!(t.get(b"clock.ms").is_none());
        t.register("clock.ms", Arc::new(Clock { div: 1 })).expect("register");
        assert!(t.get(b"clock.ms").is_some());
        assert_eq!(t.register("", Arc::new(IfCount)), Err(RegisterError::BadName));
        assert!(t.unregister("clock.ms"));
        assert!(t.get(b"clock.ms").is_none());
    }

    #[test]
    fn print_is_bounded() {
        let mut log = String::new();
        let b = SmallBytes::new(&[b'x'; 32]).expect("small");
        for _ in 0..100 {
            Print.call(&mut cx(0, &mut log), &[Arg::Bytes(Tag::Str, b)]).expect("print");
        }
        assert!(log.len() <= MAX_LOG);
    }
}
