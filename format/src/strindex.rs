//! A map from strings to their place in a string table, that stores no string of its own: the
//! key is a 64-bit hash of the string, checked byte for byte against the table on every hit; a
//! string whose hash is taken by another string goes to an exact (owning) overflow map. The
//! writer's interning and the index check's canonical-table rule use it: with millions of
//! region names, a `HashMap<String, _>` doubled the table in memory (about 100 bytes a name).

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::layout::StrRef;

/// Hashes a `u64` key to itself (the key is already a keyed hash, so no input can pick it).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// A `HashMap` whose keys are hashes already.
type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Strings of one table, by content, to their references.
#[derive(Debug, Default)]
pub(crate) struct StrIndex {
    hasher: std::collections::hash_map::RandomState,
    by_hash: IdMap<u64, StrRef>,
    /// Strings whose hash another string of the table has: exact keys.
    overflow: HashMap<Box<str>, StrRef>,
}

fn at(table: &[u8], r: StrRef) -> &[u8] {
    &table[r.offset as usize..r.offset as usize + r.len as usize]
}

impl StrIndex {
    /// The reference of `s`, if `s` was inserted; `table` is the table the references point into.
    pub(crate) fn get(&self, table: &[u8], s: &str) -> Option<StrRef> {
        let h = self.hasher.hash_one(s);
        match self.by_hash.get(&h) {
            Some(r) if at(table, *r) == s.as_bytes() => Some(*r),
            Some(_) => self.overflow.get(s).copied(),
            None => None,
        }
    }

    /// Record that `s` (not yet present) is at `r` of `table`.
    pub(crate) fn insert(&mut self, s: &str, r: StrRef) {
        let h = self.hasher.hash_one(s);
        if let std::collections::hash_map::Entry::Vacant(v) = self.by_hash.entry(h) {
            v.insert(r);
        } else {
            self.overflow.insert(s.into(), r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_collision_falls_back_to_exact_keys() {
        let table = b"abcdef";
        let mut ix = StrIndex::default();
        let r = |offset, len| StrRef { offset, len };
        ix.insert("abc", r(0, 3));
        // Force a collision: "def" under the hash of "abc".
        let h = ix.hasher.hash_one("def");
        let abc = ix.by_hash.remove(&ix.hasher.hash_one("abc")).expect("abc");
        ix.by_hash.insert(h, abc);
        assert_eq!(
            ix.get(table, "def"),
            None,
            "the slot's string differs: no false hit"
        );
        ix.insert("def", r(3, 3));
        assert_eq!(ix.get(table, "def"), Some(r(3, 3)));
        assert_eq!(ix.get(table, "abd"), None);
    }
}
