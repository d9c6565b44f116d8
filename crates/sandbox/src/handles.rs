//! Unforgeable handles: per-store tables whose indices carry a generation.
//!
//! A handle given to a module is `generation << 16 | slot` (always positive).
//! Tables live in one principal's store and each entry records the module
//! that owns it, so a module can name only its own live objects: an integer
//! made up by a module, copied from another store, or kept after the object
//! was closed fails the lookup. This is the `Marshal` lesson of SANE §V-E.3:
//! nothing a module can construct from bytes becomes a capability.

/// A table of at most `cap` live objects, each owned by one module.
#[derive(Debug)]
pub struct HandleTable<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u16>,
    live: usize,
    cap: usize,
}

#[derive(Debug)]
struct Slot<T> {
    generation: u16,
    item: Option<(u32, T)>,
}

impl<T> HandleTable<T> {
    /// An empty table of at most `cap` (≤ 32768) live objects.
    pub fn new(cap: usize) -> HandleTable<T> {
        HandleTable { slots: Vec::new(), free: Vec::new(), live: 0, cap: cap.min(1 << 15) }
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no object is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Stores `item` owned by `owner`; `None` when full.
    pub fn insert(&mut self, owner: u32, item: T) -> Option<i32> {
        if self.live >= self.cap {
            return None;
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 1, item: None });
                (self.slots.len() - 1) as u16
            }
        };
        let slot = &mut self.slots[idx as usize];
        slot.item = Some((owner, item));
        self.live += 1;
        Some(((slot.generation as i32 & 0x7fff) << 16) | idx as i32)
    }

    fn slot(&self, h: i32) -> Option<usize> {
        if h <= 0 {
            return None;
        }
        let idx = (h & 0xffff) as usize;
        let generation = ((h >> 16) & 0x7fff) as u16;
        let s = self.slots.get(idx)?;
        (s.generation & 0x7fff == generation && s.item.is_some()).then_some(idx)
    }

    /// The object behind `h` if `owner` owns it.
    pub fn get(&self, owner: u32, h: i32) -> Option<&T> {
        let idx = self.slot(h)?;
        match &self.slots[idx].item {
            Some((o, t)) if *o == owner => Some(t),
            _ => None,
        }
    }

    /// The same as [`HandleTable::get`], mutable.
    pub fn get_mut(&mut self, owner: u32, h: i32) -> Option<&mut T> {
        let idx = self.slot(h)?;
        match self.slots.get_mut(idx).and_then(|s| s.item.as_mut()) {
            Some((o, t)) if *o == owner => Some(t),
            _ => None,
        }
    }

    /// The object behind `h` regardless of owner (for the host's own bookkeeping).
    pub fn get_any(&self, h: i32) -> Option<(u32, &T)> {
        let idx = self.slot(h)?;
        self.slots[idx].item.as_ref().map(|(o, t)| (*o, t))
    }

    /// Removes the object behind `h` if `owner` owns it.
    pub fn remove(&mut self, owner: u32, h: i32) -> Option<T> {
        let idx = self.slot(h)?;
        if !matches!(&self.slots[idx].item, Some((o, _)) if *o == owner) {
            return None;
        }
        self.take(idx)
    }

    fn take(&mut self, idx: usize) -> Option<T> {
        let slot = &mut self.slots[idx];
        let (_, t) = slot.item.take()?;
        slot.generation = if slot.generation >= 0x7fff { 1 } else { slot.generation + 1 };
        self.free.push(idx as u16);
        self.live -= 1;
        Some(t)
    }

    /// Every live object: handle, owner, object.
    pub fn iter(&self) -> impl Iterator<Item = (i32, u32, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.item.as_ref().map(|(o, t)| ((((s.generation as i32) & 0x7fff) << 16) | i as i32, *o, t))
        })
    }

    /// Removes every object owned by `owner`, returning them with their handles.
    pub fn remove_owner(&mut self, owner: u32) -> Vec<(i32, T)> {
        let mut out = Vec::new();
        for idx in 0..self.slots.len() {
            if matches!(&self.slots[idx].item, Some((o, _)) if *o == owner) {
                let g = self.slots[idx].generation;
                if let Some(t) = self.take(idx) {
                    out.push((((g as i32 & 0x7fff) << 16) | idx as i32, t));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn handles_are_owner_and_generation_checked() {
        let mut t = HandleTable::new(4);
        let a = t.insert(1, "a").unwrap();
        let b = t.insert(2, "b").unwrap();
        assert!(a > 0 && b > 0);
        assert_eq!(t.get(1, a), Some(&"a"));
        assert_eq!(t.get(2, a), None, "another module cannot use the handle");
        assert_eq!(t.get(1, a + 1), None);
        assert_eq!(t.get(1, 0), None);
        assert_eq!(t.get(1, -1), None);
        assert_eq!(t.remove(1, a), Some("a"));
        assert_eq!(t.get(1, a), None, "stale handle");
        let c = t.insert(1, "c").unwrap();
        assert_ne!(c, a, "a reused slot gets a new generation");
        assert_eq!(t.get(1, a), None);
        assert_eq!(t.remove_owner(2).len(), 1);
        assert!(t.get(2, b).is_none());
    }

    #[test]
    fn capacity_is_enforced() {
        let mut t = HandleTable::new(2);
        assert!(t.insert(1, ()).is_some());
        assert!(t.insert(1, ()).is_some());
        assert!(t.insert(1, ()).is_none());
        assert_eq!(t.len(), 2);
    }
}
