//! The code cache: compiled modules by hash, bounded in bytes, least recently
//! used evicted first. Later capsules naming a cached hash skip both the
//! transfer and the compilation.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anode_cred::{CodeInfo, Interface, InterfaceSet, ModuleHash};
use wasmtime::{InstancePre, Module};

use crate::host::TenantState;

/// One import of a module and the interface it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    /// Import module name.
    pub module: String,
    /// Field name.
    pub name: String,
    /// The interface (`None` for the core `anode` module).
    pub interface: Option<Interface>,
}

/// A compiled module and what the loader learnt about it.
pub(crate) struct Entry {
    pub code: Arc<[u8]>,
    pub module: Module,
    pub info: CodeInfo,
    pub imports: Vec<Import>,
    pub interfaces: InterfaceSet,
    pub pres: Vec<(InterfaceSet, InstancePre<TenantState>)>,
    pub cost: usize,
    tick: u64,
}

/// Cache statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups that found the module.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Modules inserted (compiled).
    pub inserts: u64,
    /// Modules evicted to stay within the byte bound.
    pub evictions: u64,
    /// Modules in the cache.
    pub entries: usize,
    /// Bytes charged (code plus compiled image).
    pub bytes: usize,
}

pub(crate) struct CodeCache {
    map: HashMap<ModuleHash, Entry>,
    lru: BTreeMap<u64, ModuleHash>,
    tick: u64,
    bytes: usize,
    cap: usize,
    pub stats: CacheStats,
}

impl CodeCache {
    pub fn new(cap: usize) -> CodeCache {
        CodeCache { map: HashMap::new(), lru: BTreeMap::new(), tick: 0, bytes: 0, cap, stats: CacheStats::default() }
    }

    /// Looks up and marks as recently used.
    pub fn get(&mut self, h: &ModuleHash) -> Option<&mut Entry> {
        match self.map.get_mut(h) {
            Some(e) => {
                self.stats.hits += 1;
                self.lru.remove(&e.tick);
                self.tick += 1;
                e.tick = self.tick;
                self.lru.insert(self.tick, *h);
                Some(e)
            }
            None => {
                self.stats.misses += 1;
                None
            }
        }
    }

    /// Looks up without touching the statistics or the order.
    pub fn peek(&self, h: &ModuleHash) -> Option<&Entry> {
        self.map.get(h)
    }

    pub fn contains(&self, h: &ModuleHash) -> bool {
        self.map.contains_key(h)
    }

    /// Inserts, evicting least recently used entries to stay within the bound.
    /// A module larger than the whole cache is not cached.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        code: Arc<[u8]>,
        module: Module,
        info: CodeInfo,
        imports: Vec<Import>,
        interfaces: InterfaceSet,
    ) -> Option<&mut Entry> {
        let r = module.image_range();
        let image = (r.end as usize).saturating_sub(r.start as usize);
        let cost = code.len() + image;
        if cost > self.cap {
            return None;
        }
        let h = info.hash;
        if let Some(old) = self.map.remove(&h) {
            self.lru.remove(&old.tick);
            self.bytes -= old.cost;
        }
        while self.bytes + cost > self.cap {
            let Some((_, victim)) = self.lru.pop_first() else { break };
            if let Some(v) = self.map.remove(&victim) {
                self.bytes -= v.cost;
                self.stats.evictions += 1;
            }
        }
        self.tick += 1;
        self.bytes += cost;
        self.stats.inserts += 1;
        self.lru.insert(self.tick, h);
        self.map.insert(h, Entry { code, module, info, imports, interfaces, pres: Vec::new(), cost, tick: self.tick });
        self.map.get_mut(&h)
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats { entries: self.map.len(), bytes: self.bytes, ..self.stats }
    }
}
