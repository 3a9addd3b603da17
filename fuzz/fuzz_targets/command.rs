//! Command decoding and validation on arbitrary slot words: never panics, and whatever it
//! accepts stays inside the DMA buffer and the array.
#![no_main]

use libfuzzer_sys::fuzz_target;
use moneta_abi::{Opcode, Status};
use moneta_device::command::validate;
use moneta_device::DmaGeometry;

fuzz_target!(|data: &[u8]| {
    if data.len() < 66 {
        return;
    }
    let mut words = [0u64; 8];
    for (i, w) in words.iter_mut().enumerate() {
        *w = u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().unwrap());
    }
    let tag = (data[64] % 64) as usize;
    let geometry = DmaGeometry {
        dma_size: 1 << 20,
        slice_size: 16 << 10,
    };
    let array_size = (u64::from(data[65]) + 1) << 20;
    match validate(&words, tag, geometry, array_size) {
        Ok(cmd) => {
            assert!(!matches!(cmd.opcode, Opcode::Unsupported(_)));
            if matches!(cmd.opcode, Opcode::Read | Opcode::Write | Opcode::Flush) {
                assert!(cmd.addr.checked_add(cmd.len).unwrap() <= array_size);
            }
            if matches!(cmd.opcode, Opcode::Read | Opcode::Write) {
                assert!(cmd.len > 0);
                assert!((tag * geometry.slice_size) as u64 + cmd.len <= geometry.dma_size as u64);
            }
            assert_eq!(words[5..], [0; 3]);
            assert_eq!(cmd.file, words[4]);
            if cmd.opcode == Opcode::Nop {
                assert_eq!(cmd.file, 0);
            }
        }
        Err(r) => assert_ne!(r.status, Status::Ok),
    }
});
