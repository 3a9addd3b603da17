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
    use std::collections::HashMap;

    #[test]
    fn dense_inode_numbers_spread_over_the_table() {
        // The low bits a table indexes by differ for consecutive numbers.
        let mut low = std::collections::HashSet::new();
        for ino in 1..=1024u64 {
            let mut h = IdHasher::default();
            h.write_u64(ino);
            low.insert(h.finish() >> 54);
        }
        assert!(low.len() > 600, "{} of 1024 distinct top bits", low.len());
        let mut m: HashMap<u64, u64, IdHash> = HashMap::default();
        for ino in 1..=100_000u64 {
            m.insert(ino, ino * 2);
        }
        assert!((1..=100_000u64).all(|i| m[&i] == i * 2));
    }
}
