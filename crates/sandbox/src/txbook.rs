//! Transmit reservations of channels (RCANE §IV-D: "A channel may have a
//! guaranteed level of buffering and transmission bandwidth"), carved from
//! the session's.
//!
//! A principal's session holds one transmit reservation (bytes/s, decided
//! by the node's admission control). A module may give some of it to one of
//! its open channels (`net.channel_tx`); packets it sends on that channel
//! (`net.channel_send`) are then their own flow on every paced link, with
//! their own guarantee, and the session's other packets share what is left.
//! The book keeps the channels' reservations within the session's: a
//! request that would exceed it is refused, and when the session's
//! reservation is lowered the channels that asked last are released first
//! until the rest fits. One book per principal, shared by its stores and
//! read by the node when it schedules a link.

use std::collections::BTreeMap;

/// A channel as a transmit flow: its module and its handle there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow {
    /// The module that opened the channel ([`crate::ModuleId`]'s number).
    pub module: u32,
    /// The channel's handle in that module.
    pub handle: i32,
}

impl core::fmt::Display for Flow {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "m{}/ch{}", self.module, self.handle)
    }
}

/// Why a channel's transmit reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxBookError {
    /// The channels' reservations would exceed the session's.
    #[error("the channels would reserve {asked} bytes/s of the session's {session}")]
    OverSession {
        /// What all the principal's channels would then reserve.
        asked: u64,
        /// The session's transmit reservation.
        session: u64,
    },
}

/// One principal's channel reservations and its session's.
#[derive(Debug, Clone, Default)]
pub struct TxBook {
    session: u64,
    /// Each channel's bytes/s and the order it asked in (for releasing the
    /// last first).
    channels: BTreeMap<Flow, (u64, u64)>,
    next: u64,
    released: u64,
}

impl TxBook {
    /// The session's reservation, bytes/s (0: none).
    pub fn session(&self) -> u64 {
        self.session
    }

    /// What the channels reserve together, bytes/s.
    pub fn channels_total(&self) -> u64 {
        self.channels.values().fold(0u64, |s, (b, _)| s.saturating_add(*b))
    }

    /// What is left for the session's packets not sent on a reserved
    /// channel, bytes/s.
    pub fn rest(&self) -> u64 {
        self.session.saturating_sub(self.channels_total())
    }

    /// `flow`'s reservation, if it holds one.
    pub fn channel(&self, flow: Flow) -> Option<u64> {
        self.channels.get(&flow).map(|(b, _)| *b)
    }

    /// The channels holding a reservation, with it, in flow order.
    pub fn channels(&self) -> impl Iterator<Item = (Flow, u64)> + '_ {
        self.channels.iter().map(|(f, (b, _))| (*f, *b))
    }

    /// Reservations released because the session's was lowered.
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Sets `flow`'s reservation to `bytes_per_sec` (0 releases it).
    ///
    /// # Errors
    /// [`TxBookError::OverSession`] when the channels together would then
    /// reserve more than the session; the old reservation stays.
    pub fn set(&mut self, flow: Flow, bytes_per_sec: u64) -> Result<(), TxBookError> {
        if bytes_per_sec == 0 {
            self.remove(flow);
            return Ok(());
        }
        let others = self.channels_total().saturating_sub(self.channel(flow).unwrap_or(0));
        let asked = others.saturating_add(bytes_per_sec);
        if asked > self.session {
            return Err(TxBookError::OverSession { asked, session: self.session });
        }
        self.next += 1;
        self.channels.insert(flow, (bytes_per_sec, self.next));
        Ok(())
    }

    /// Releases `flow`'s reservation (its channel closed).
    pub fn remove(&mut self, flow: Flow) {
        self.channels.remove(&flow);
    }

    /// Releases the reservations of module `module`'s channels (unloaded).
    pub fn remove_module(&mut self, module: u32) {
        self.channels.retain(|f, _| f.module != module);
    }

    /// The session's reservation became `bytes_per_sec`: channels that
    /// asked last are released until the rest fit in it.
    pub fn set_session(&mut self, bytes_per_sec: u64) {
        self.session = bytes_per_sec;
        while self.channels_total() > self.session {
            let last = self.channels.iter().max_by_key(|(_, (_, order))| *order).map(|(f, _)| *f);
            match last {
                Some(f) => {
                    self.channels.remove(&f);
                    self.released += 1;
                }
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn f(module: u32, handle: i32) -> Flow {
        Flow { module, handle }
    }

    #[test]
    fn channels_reserve_within_the_session_and_the_rest_is_the_sessions() {
        let mut b = TxBook::default();
        assert_eq!(b.set(f(1, 0), 1), Err(TxBookError::OverSession { asked: 1, session: 0 }), "no session");
        b.set_session(1000);
        b.set(f(1, 0), 300).unwrap();
        b.set(f(2, 5), 500).unwrap();
        assert_eq!((b.channels_total(), b.rest()), (800, 200));
        assert_eq!(b.set(f(1, 1), 201), Err(TxBookError::OverSession { asked: 1001, session: 1000 }));
        assert_eq!(b.channel(f(1, 1)), None, "a refused request holds nothing");
        // A channel may change its own reservation within what the others leave.
        b.set(f(1, 0), 500).unwrap();
        assert_eq!(b.set(f(1, 0), 501), Err(TxBookError::OverSession { asked: 1001, session: 1000 }));
        assert_eq!(b.channel(f(1, 0)), Some(500), "the old one stays");
        assert_eq!(b.rest(), 0);
        b.set(f(1, 0), 0).unwrap();
        assert_eq!(b.channel(f(1, 0)), None);
        b.remove(f(2, 5));
        assert_eq!((b.channels_total(), b.rest()), (0, 1000));
    }

    #[test]
    fn a_lowered_session_releases_the_channels_that_asked_last() {
        let mut b = TxBook::default();
        b.set_session(1000);
        b.set(f(3, 0), 200).unwrap();
        b.set(f(1, 0), 300).unwrap();
        b.set(f(2, 0), 400).unwrap();
        // f(3,0) asks again: it is now the last to have asked.
        b.set(f(3, 0), 250).unwrap();
        b.set_session(700);
        assert_eq!(b.channels().collect::<Vec<_>>(), vec![(f(1, 0), 300), (f(2, 0), 400)]);
        assert_eq!(b.released(), 1);
        b.set_session(0);
        assert_eq!(b.channels().count(), 0);
        assert_eq!(b.released(), 3);
        b.set_session(500);
        b.set(f(4, 1), 100).unwrap();
        b.set(f(4, 2), 100).unwrap();
        b.set(f(5, 1), 100).unwrap();
        b.remove_module(4);
        assert_eq!(b.channels().collect::<Vec<_>>(), vec![(f(5, 1), 100)]);
    }
}
