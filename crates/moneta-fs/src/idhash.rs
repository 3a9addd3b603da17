//! A hasher for keys the daemon chooses: inode numbers, channel ids, change-board slots.
//!
//! The standard hasher (SipHash with random keys) is there for keys a client can pick, such as
//! names, where a chosen set of keys could otherwise land in one bucket. Numbers the file
//! system hands out (inodes are taken lowest-free from a bounded table) give a client no such
//! choice, and a path walk looks one up per component: for them a rotation and a
//! multiplication per word do.

use std::hash::{BuildHasherDefault, Hasher};

/// The hasher itself.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u16(&mut self, x: u16) {
        self.write_u64(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        // The rotation brings the well-mixed high bits of what came before to the low ones.
        self.0 = (self.0.rotate_left(32) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Maps and sets keyed by the daemon's own numbers.
pub type IdHash = BuildHasherDefault<IdHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    #[test]
    fn dense_inode_numbers_spread_over_the_table() {
        // A table picks a bucket by the hash's low bits and tags entries with its top seven:
        // consecutive numbers land in distinct buckets (one key a word: a multiplication by
        // an odd constant, a bijection of the low bits) and carry varied tags.
        let hash = |ino: u64| {
            let mut h = IdHasher::default();
            h.write_u64(ino);
            h.finish()
        };
        let low: HashSet<u64> = (0..1024u64).map(|i| hash(i) & 1023).collect();
        assert_eq!(low.len(), 1024);
        let tags: HashSet<u64> = (0..1024u64).map(|i| hash(i) >> 57).collect();
        assert!(tags.len() > 100, "{} of 128 tags", tags.len());
        let mut m: HashMap<u64, u64, IdHash> = HashMap::default();
        for ino in 1..=100_000u64 {
            m.insert(ino, ino * 2);
        }
        assert!((1..=100_000u64).all(|i| m[&i] == i * 2));
    }
}
