//! The whole device engine under a hostile channel: fuzzed command words, doorbell flips and
//! register scribbles go through the real poller, while a second channel checks after every
//! input that no array byte outside the hostile channel's writable record changed, and the
//! hostile DMA buffer is scanned for bytes it had no right to read.
#![no_main]

use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use moneta_abi::{tag_slot_offset, ChannelHeader, Command, Completion, Opcode, TagSlot, DMA_OFFSET};
use moneta_device::{Device, DeviceConfig, DmaGeometry, MappedArray, MonotonicClock, TableOp};

const ARRAY: u64 = 1 << 20;
const DMA: usize = 256 << 10;
/// The hostile channel may write here...
const RW: (u64, u64) = (512 << 10, 768 << 10);
/// ...and read here too.
const RO: (u64, u64) = (768 << 10, 772 << 10);
/// Array word at address `a` (8-aligned) outside RW: P_MAGIC ^ a.
const P_MAGIC: u64 = 0x5eed_0000_0000_0000;
/// The filler the hostile channel's writes carry.
const FILL: u8 = 0xee;

struct Map {
    base: *mut u8,
    id: u32,
    kick: OwnedFd,
    _memfd: OwnedFd,
}

// SAFETY: shared memory accessed through atomics and raw copies only.
unsafe impl Send for Map {}

impl Map {
    fn new(dev: &Device) -> Map {
        let o = dev.open_channel().expect("channel");
        let size = o.info.channel_size as usize;
        // SAFETY: a fresh shared mapping of the whole sealed memfd.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                &o.memfd,
                0,
            )
            .expect("mmap")
        };
        Map { base: base.cast(), id: o.id, kick: o.kick, _memfd: o.memfd }
    }
    fn header(&self) -> &ChannelHeader {
        // SAFETY: page-aligned mapping; atomics only.
        unsafe { &*self.base.cast::<ChannelHeader>() }
    }
    fn slot(&self, t: usize) -> &TagSlot {
        // SAFETY: t < 64 by construction; atomics only.
        unsafe { &*self.base.add(tag_slot_offset(t)).cast::<TagSlot>() }
    }
    fn dma(&self) -> *mut u8 {
        // SAFETY: the DMA buffer starts at DMA_OFFSET inside the mapping.
        unsafe { self.base.add(DMA_OFFSET) }
    }
    fn ring(&self, bits: u64) {
        let h = self.header();
        h.doorbell.fetch_xor(bits, Ordering::SeqCst);
        if h.parked.load(Ordering::SeqCst) == moneta_abi::PARKED {
            let _ = rustix::io::write(&self.kick, &1u64.to_ne_bytes());
        }
    }
    /// One command on tag 0 with DMA completion, waited for.
    fn run(&self, seq: &mut u32, op: Opcode, addr: u64, len: u64) {
        *seq = seq.wrapping_add(1);
        let w = Command { opcode: op, completion: Completion::Dma, addr, len, cookie: 0, seq: *seq, file: 0, barrier: false, epoch: 0 }
            .to_words();
        for (a, v) in self.slot(0).command.words.iter().zip(w) {
            a.store(v, Ordering::Relaxed);
        }
        self.ring(1);
        while self.slot(0).status.state.load(Ordering::Acquire) != *seq {
            std::hint::spin_loop();
        }
        assert_eq!(self.slot(0).status.result.load(Ordering::Relaxed), 0, "checker command failed");
    }
}

struct Rig {
    dev: Device,
    checker: Map,
    hostile: Map,
    seq: u32,
}

fn pattern(a: u64) -> u64 {
    P_MAGIC ^ a
}

fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| {
        let config = DeviceConfig {
            phys_tags: 4,
            table_entries: 64,
            geometry: DmaGeometry { dma_size: DMA, slice_size: DMA / 64 },
            ..Default::default()
        };
        let dev = Device::start(config, MappedArray::volatile(ARRAY).unwrap(), MonotonicClock::new())
            .unwrap();
        let checker = Map::new(&dev);
        let hostile = Map::new(&dev);
        let mut seq = 0;
        // Fill the whole array with the pattern through the checker, then leave it read rights
        // only; the hostile channel gets RW and RO.
        let ins = |c, (s, e): (u64, u64), rights, file| TableOp::Insert {
            channel: c, start: s, len: e - s, rights, file,
        };
        dev.update(vec![ins(checker.id, (0, ARRAY), 3, 1)]).unwrap();
        for chunk in (0..ARRAY).step_by(DMA) {
            for i in (0..DMA).step_by(8) {
                let a = chunk + i as u64;
                // SAFETY: i + 8 <= DMA.
                unsafe { checker.dma().add(i).cast::<u64>().write_unaligned(pattern(a)) };
            }
            checker.run(&mut seq, Opcode::Write, chunk, DMA as u64);
        }
        dev.update(vec![
            ins(checker.id, (0, ARRAY), 1, 1),
            ins(hostile.id, RW, 3, 2),
            ins(hostile.id, RO, 1, 3),
        ])
        .unwrap();
        Mutex::new(Rig { dev, checker, hostile, seq })
    })
}

fn word(data: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    for (k, x) in b.iter_mut().enumerate() {
        *x = *data.get(i + k).unwrap_or(&0);
    }
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    let mut rig = rig().lock().unwrap_or_else(|e| e.into_inner());
    let h = &rig.hostile;
    // The hostile DMA buffer holds only the filler before the input acts.
    // SAFETY: the buffer is DMA bytes long.
    unsafe { std::ptr::write_bytes(h.dma(), FILL, DMA) };
    for op in data.chunks_exact(20).take(64) {
        let t = (op[0] % 64) as usize;
        match op[0] >> 6 {
            0 | 1 => {
                // A command: opcode and flags from the input, address and length shaped to
                // land near the interesting boundaries half of the time.
                let mut w = [0u64; 8];
                if op[10] & 8 == 0 {
                    // Shaped: a known opcode and completion mode, an address within 32 KiB of
                    // an interesting boundary, a length up to 64 KiB.
                    let opcode = u64::from(op[1] % 5);
                    let flags = u64::from(op[2] % 4);
                    let seq = u64::from(u16::from_le_bytes([op[3], op[4]]));
                    w[0] = opcode | (flags << 16) | (seq << 32);
                    let base = [0, RW.0, RW.1, RO.0, RO.1, ARRAY][op[9] as usize % 6];
                    let delta = i64::from(i16::from_le_bytes([op[11], op[12]]));
                    w[1] = base.wrapping_add_signed(delta);
                    w[2] = u64::from(u16::from_le_bytes([op[15], op[16]])) + 1;
                } else {
                    w[0] = word(op, 1);
                    w[1] = word(op, 9);
                    w[2] = word(op, 11);
                }
                w[3] = u64::from(op[19]);
                if op[10] & 4 != 0 {
                    w[4] = 1;
                }
                for (a, v) in h.slot(t).command.words.iter().zip(w) {
                    a.store(v, Ordering::Relaxed);
                }
                if op[0] >> 6 == 0 {
                    h.ring(1 << t);
                }
            }
            2 => h.ring(word(op, 1)),
            _ => {
                let hd = h.header();
                hd.err_tail.store(word(op, 1) as u32, Ordering::Relaxed);
                hd.parked.store(word(op, 5) as u32, Ordering::Relaxed);
                h.slot(t).status.waiter.store(word(op, 9) as u32, Ordering::Relaxed);
            }
        }
    }
    // Two round trips through the poller's control queue: everything rung before has been
    // taken and, with no modeled latency, completed.
    let _ = rig.dev.report();
    let _ = rig.dev.report();
    // No pattern word from outside the hostile channel's readable ranges reached its buffer.
    for i in (0..DMA).step_by(8) {
        // SAFETY: i + 8 <= DMA.
        let w = unsafe { h.dma().add(i).cast::<u64>().read_unaligned() };
        let a = w ^ P_MAGIC;
        if a < ARRAY && a % 8 == 0 {
            let readable = (RW.0..RW.1).contains(&a) || (RO.0..RO.1).contains(&a);
            assert!(readable, "array word at {a:#x} leaked into the hostile DMA buffer");
        }
    }
    // No array byte outside the writable record changed.
    let rig = &mut *rig;
    for chunk in (0..ARRAY).step_by(DMA) {
        rig.checker.run(&mut rig.seq, Opcode::Read, chunk, DMA as u64);
        for i in (0..DMA).step_by(8) {
            let a = chunk + i as u64;
            if (RW.0..RW.1).contains(&a) {
                continue;
            }
            // SAFETY: i + 8 <= DMA.
            let w = unsafe { rig.checker.dma().add(i).cast::<u64>().read_unaligned() };
            assert_eq!(w, pattern(a), "array word at {a:#x} changed");
        }
    }
});
