//! The permission table under arbitrary sequences of installs and revocations, against a model
//! of per-byte rights over a small address space, with a table small enough to evict.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moneta_abi::Status;
use moneta_device::PermissionTable;

const SPACE: u64 = 256;
const CHANNELS: u32 = 3;

fuzz_target!(|data: &[u8]| {
    let Some((&cap, ops)) = data.split_first() else {
        return;
    };
    let capacity = 2 + (cap as usize % 40);
    let mut t = PermissionTable::new(capacity, CHANNELS as usize, cap & 0x80 != 0);
    // Model: rights per channel per byte, None when not covered. Evictions make the table a
    // subset of the model, never a superset.
    let mut model = vec![vec![None::<u8>; SPACE as usize]; CHANNELS as usize];
    for op in ops.chunks_exact(4) {
        let c = u32::from(op[0] % CHANNELS as u8);
        let start = u64::from(op[1]) % SPACE;
        let len = (u64::from(op[2]) % 32 + 1).min(SPACE - start);
        let rights = op[3] % 4;
        match op[0] / CHANNELS as u8 % 4 {
            0 | 1 if rights != 0 => {
                let before = t.counters().evictions;
                t.insert(c, start, len, rights, u64::from(op[3] >> 4)).unwrap();
                for b in start..start + len {
                    model[c as usize][b as usize] = Some(rights);
                }
                assert!(t.check(c, start, len, 0).is_ok() || t.counters().evictions > before);
            }
            2 => {
                t.remove_range(c, start, len).unwrap();
                for b in start..start + len {
                    model[c as usize][b as usize] = None;
                }
            }
            _ => {
                t.remove_channel(c).unwrap();
                model[c as usize].iter_mut().for_each(|b| *b = None);
            }
        }
        t.validate();
    }
    for c in 0..CHANNELS {
        for b in 0..SPACE {
            for need in [1u8, 2] {
                if t.check(c, b, 1, need).is_ok() {
                    // Whatever the table allows, the model allows.
                    let m = model[c as usize][b as usize];
                    assert!(m.is_some_and(|r| r & need == need), "c{c} b{b} need {need}");
                } else {
                    assert!(matches!(
                        t.check(c, b, 1, need),
                        Err(Status::PermissionMiss | Status::PermissionDenied)
                    ));
                }
            }
        }
    }
});
