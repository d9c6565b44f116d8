//! Generational slots and the handles that name them.
//!
//! Every session, virtual processor and pool lives in a [`Slab`] slot and is
//! named by `(index, generation)`. Freeing a slot bumps its generation, so a
//! handle kept past a close (or copied from an old message) no longer matches
//! and is refused as [`Lookup::Stale`]. A slot whose generation would wrap is
//! retired for good rather than reused.
//!
//! A handle is only a *name*: it carries no authority. Authority comes from
//! the caller's authenticated principal and the session it owns, which the
//! [`crate::Rcane`] layer checks on every use (see `crate::rcane`, and the
//! Marshal test in `tests/marshal.rs`).

/// Outcome of looking a handle up in a [`Slab`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// No slot with this index was ever allocated.
    Unknown,
    /// The slot exists but holds another generation (closed or reused).
    Stale,
}

macro_rules! handle_type {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name {
            index: u32,
            generation: u32,
        }

        impl $name {
            /// The handle as one integer: generation in the high 32 bits,
            /// index in the low 32 (the wire form).
            pub const fn to_raw(self) -> u64 {
                ((self.generation as u64) << 32) | self.index as u64
            }
            /// A handle from its wire form. This grants nothing: every use is
            /// checked against the owning session and the slot's generation.
            pub const fn from_raw(raw: u64) -> Self {
                Self { index: raw as u32, generation: (raw >> 32) as u32 }
            }
            /// Slot index.
            pub const fn index(self) -> u32 {
                self.index
            }
            /// Slot generation.
            pub const fn generation(self) -> u32 {
                self.generation
            }
            pub(crate) const fn new(index: u32, generation: u32) -> Self {
                Self { index, generation }
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}.{}", self.index, self.generation)
            }
        }

        impl Key for $name {
            fn from_parts(index: u32, generation: u32) -> Self {
                Self::new(index, generation)
            }
            fn parts(self) -> (u32, u32) {
                (self.index, self.generation)
            }
        }
    };
}

handle_type!(
    /// Names a session. Sessions 0 (System) and 1 (Best-Effort) exist from
    /// the start and belong to no principal.
    SessionId
);
handle_type!(
    /// Names a virtual processor.
    VpId
);
handle_type!(
    /// Names a pool (an event queue bound to one VP).
    PoolId
);

/// A handle type stored in a [`Slab`].
pub trait Key: Copy {
    /// Builds the handle.
    fn from_parts(index: u32, generation: u32) -> Self;
    /// `(index, generation)`.
    fn parts(self) -> (u32, u32);
}

#[derive(Debug, Clone)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A vector of generational slots with a free list.
#[derive(Debug, Clone)]
pub struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab { slots: Vec::new(), free: Vec::new(), len: 0 }
    }
}

impl<T> Slab<T> {
    /// Number of occupied slots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot is occupied.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stores `value`, returning its handle, or gives the value back if all
    /// 2^32 indices are in use or retired.
    pub fn insert<K: Key>(&mut self, value: T) -> Result<K, T> {
        if let Some(index) = self.free.pop()
            && let Some(slot) = self.slots.get_mut(index as usize)
        {
            slot.value = Some(value);
            self.len += 1;
            return Ok(K::from_parts(index, slot.generation));
        }
        let Ok(index) = u32::try_from(self.slots.len()) else { return Err(value) };
        self.slots.push(Slot { generation: 1, value: Some(value) });
        self.len += 1;
        Ok(K::from_parts(index, 1))
    }

    /// The value a handle names, or why it names none.
    pub fn get<K: Key>(&self, key: K) -> Result<&T, Lookup> {
        let (index, generation) = key.parts();
        let slot = self.slots.get(index as usize).ok_or(Lookup::Unknown)?;
        match &slot.value {
            Some(v) if slot.generation == generation => Ok(v),
            _ => Err(Lookup::Stale),
        }
    }

    /// Mutable access to the value a handle names.
    pub fn get_mut<K: Key>(&mut self, key: K) -> Result<&mut T, Lookup> {
        let (index, generation) = key.parts();
        let slot = self.slots.get_mut(index as usize).ok_or(Lookup::Unknown)?;
        match &mut slot.value {
            Some(v) if slot.generation == generation => Ok(v),
            _ => Err(Lookup::Stale),
        }
    }

    /// Removes the value a handle names; the slot's generation moves on so
    /// the handle (and every copy of it) goes stale.
    pub fn remove<K: Key>(&mut self, key: K) -> Result<T, Lookup> {
        let (index, generation) = key.parts();
        let slot = self.slots.get_mut(index as usize).ok_or(Lookup::Unknown)?;
        if slot.generation != generation || slot.value.is_none() {
            return Err(Lookup::Stale);
        }
        let v = slot.value.take().ok_or(Lookup::Stale)?;
        self.len -= 1;
        if let Some(next) = slot.generation.checked_add(1) {
            slot.generation = next;
            self.free.push(index);
        }
        Ok(v)
    }

    /// The occupied slots with their handles, in index order.
    pub fn iter<K: Key>(&self) -> impl Iterator<Item = (K, &T)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let v = s.value.as_ref()?;
            Some((K::from_parts(i as u32, s.generation), v))
        })
    }

    /// The occupied slots with their handles, mutably.
    pub fn iter_mut<K: Key>(&mut self) -> impl Iterator<Item = (K, &mut T)> + '_ {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| {
            let generation = s.generation;
            let v = s.value.as_mut()?;
            Some((K::from_parts(i as u32, generation), v))
        })
    }

    /// Direct access by index, for internal tables keyed by index alone
    /// (the scheduler's ready sets). `None` if the slot is empty.
    pub(crate) fn by_index(&self, index: u32) -> Option<(u32, &T)> {
        let s = self.slots.get(index as usize)?;
        s.value.as_ref().map(|v| (s.generation, v))
    }

    /// Mutable access by index.
    pub(crate) fn by_index_mut(&mut self, index: u32) -> Option<&mut T> {
        self.slots.get_mut(index as usize)?.value.as_mut()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn stale_after_remove_and_reuse() {
        let mut s: Slab<&str> = Slab::default();
        let a: VpId = s.insert("a").unwrap();
        assert_eq!(s.get(a), Ok(&"a"));
        assert_eq!(s.remove(a), Ok("a"));
        assert_eq!(s.get(a), Err(Lookup::Stale));
        let b: VpId = s.insert("b").unwrap();
        assert_eq!(b.index(), a.index(), "the slot is reused");
        assert_ne!(b.generation(), a.generation());
        assert_eq!(s.get(a), Err(Lookup::Stale));
        assert_eq!(s.remove(a), Err(Lookup::Stale));
        assert_eq!(s.get(VpId::from_raw(99)), Err(Lookup::Unknown));
        assert_eq!(s.get(b), Ok(&"b"));
    }

    #[test]
    fn raw_round_trip() {
        let h = PoolId::new(7, 3);
        assert_eq!(PoolId::from_raw(h.to_raw()), h);
        assert_eq!(h.to_string(), "7.3");
    }

    #[test]
    fn wrapping_generation_retires_the_slot() {
        let mut s: Slab<u8> = Slab::default();
        let k: VpId = s.insert(1).unwrap();
        s.slots[0].generation = u32::MAX;
        let k = VpId::new(k.index(), u32::MAX);
        assert_eq!(s.remove(k), Ok(1));
        assert!(s.free.is_empty(), "a slot at the last generation is never reused");
        let k2: VpId = s.insert(2).unwrap();
        assert_eq!(k2.index(), 1);
    }
}
