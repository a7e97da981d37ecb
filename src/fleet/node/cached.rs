//! The node's caches of bucket objects: maps whose every change is counted,
//! so what a pass derives from a whole map is derived again only when it
//! changed.

use crate::store::Version;
use std::collections::HashMap;

/// A map by key whose every change is counted (`generation`): a
/// `HashMap` for reading (`Deref`); every way to change it goes through
/// a method here that counts. `get_mut` and `iter_mut` count whether or
/// not the caller then changes anything (a count too many costs one
/// look more, never a missed change).
///
/// Why: what a pass derives from a whole map (the claim counts per node
/// instance over every claim in the fleet; which owned sessions the
/// rules ask anything of; the HTTP status) need only be derived again
/// when something in it changed. A steady-state pass changes nothing,
/// and must not cost O(sessions) for it (issue #14). There is no
/// `DerefMut`, `retain` shows values read-only, and the fields are
/// private to this module: no change can slip past the count.
pub(super) struct Tracked<V> {
    map: HashMap<String, V>,
    generation: u64,
}

/// Objects read from the bucket, by key, with the version each was
/// read at.
pub(super) type Cached<T> = Tracked<(Version, T)>;

impl<V> Default for Tracked<V> {
    fn default() -> Self {
        Tracked {
            map: HashMap::new(),
            generation: 0,
        }
    }
}

impl<V> std::ops::Deref for Tracked<V> {
    type Target = HashMap<String, V>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<V> Tracked<V> {
    pub(super) fn insert(&mut self, key: String, value: V) -> Option<V> {
        self.generation += 1;
        self.map.insert(key, value)
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<V> {
        let out = self.map.remove(key);
        self.generation += u64::from(out.is_some());
        out
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&String, &V) -> bool) {
        let before = self.map.len();
        self.map.retain(|k, v| keep(k, v));
        self.generation += u64::from(self.map.len() != before);
    }

    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
        self.generation += 1;
        self.map.get_mut(key)
    }

    pub(super) fn iter_mut(&mut self) -> std::collections::hash_map::IterMut<'_, String, V> {
        self.generation += 1;
        self.map.iter_mut()
    }

    pub(super) fn clear(&mut self) {
        self.generation += 1;
        self.map.clear();
    }

    /// Changes so far: equal counts, equal contents.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }
}
