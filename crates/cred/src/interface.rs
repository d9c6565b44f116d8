//! The Core's host interfaces, each a separately grantable right.

use core::fmt;

/// One host interface of the Core. A module's wasm import module name is the
/// interface name (`log`, `route`, ...): importing `net.send` needs `net`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Interface {
    /// `log`: rate-limited messages to the node's log.
    Log,
    /// `route`: this host's address and next hops.
    Route,
    /// `net`: send packets and capsules, open demultiplexed channels.
    Net,
    /// `time`: the node's clock and alarms.
    Time,
    /// `state`: bounded per-principal soft state.
    State,
    /// `marshal`: safe encoding of lists of byte strings.
    Marshal,
    /// `pod`: bind to and call pods (Expert's protected modules); a pod's
    /// own credential needs it to be loaded as a pod (`docs/pods.md`).
    Pod,
}

impl Interface {
    /// Every interface, in bit order.
    pub const ALL: [Interface; 7] = [
        Interface::Log,
        Interface::Route,
        Interface::Net,
        Interface::Time,
        Interface::State,
        Interface::Marshal,
        Interface::Pod,
    ];

    /// The interface's name: its wasm import module and its credential fact.
    pub const fn name(self) -> &'static str {
        match self {
            Interface::Log => "log",
            Interface::Route => "route",
            Interface::Net => "net",
            Interface::Time => "time",
            Interface::State => "state",
            Interface::Marshal => "marshal",
            Interface::Pod => "pod",
        }
    }

    /// The interface named `s`, if any.
    pub fn from_name(s: &str) -> Option<Interface> {
        Interface::ALL.into_iter().find(|i| i.name() == s)
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of interfaces.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InterfaceSet(u8);

impl InterfaceSet {
    /// No interface.
    pub const EMPTY: InterfaceSet = InterfaceSet(0);
    /// Every interface.
    pub const ALL: InterfaceSet = InterfaceSet(0b111_1111);

    /// The set of the given interfaces.
    pub fn of(list: &[Interface]) -> InterfaceSet {
        let mut s = InterfaceSet::EMPTY;
        for &i in list {
            s.insert(i);
        }
        s
    }
    /// Adds `i`.
    pub fn insert(&mut self, i: Interface) {
        self.0 |= i.bit();
    }
    /// Whether `i` is in the set.
    pub fn contains(self, i: Interface) -> bool {
        self.0 & i.bit() != 0
    }
    /// Whether every interface of `self` is in `other`.
    pub fn is_subset(self, other: InterfaceSet) -> bool {
        self.0 & !other.0 == 0
    }
    /// The members, in bit order.
    pub fn iter(self) -> impl Iterator<Item = Interface> {
        Interface::ALL.into_iter().filter(move |i| self.contains(*i))
    }
}

impl fmt::Debug for InterfaceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(Interface::name)).finish()
    }
}

impl fmt::Display for InterfaceSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Interface::name).collect();
        write!(f, "[{}]", names.join(", "))
    }
}
