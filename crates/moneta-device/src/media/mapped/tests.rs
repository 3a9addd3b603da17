//! Tests of the mapped array: shown ranges, flush lanes, streamed writes, zeroing.

use super::*;
use crate::media::copy::STREAM_MIN;
use crate::media::FlushAs;

#[test]
fn shown_runs_merge_when_shown_and_split_when_detached() {
    let a = MappedArray::volatile(1 << 20).unwrap();
    let runs = |a: &MappedArray| {
        a.shown
            .lock()
            .unwrap()
            .clone()
            .into_iter()
            .collect::<Vec<_>>()
    };
    a.mark_shown(0, 4096, true);
    a.mark_shown(8192, 4096, true);
    assert_eq!(runs(&a), [(0, 4096), (8192, 12288)]);
    a.mark_shown(4096, 4096, true);
    assert_eq!(runs(&a), [(0, 12288)]);
    a.mark_shown(4096, 4096, false);
    assert_eq!(runs(&a), [(0, 4096), (8192, 12288)]);
    a.mark_shown(0, 65536, false);
    assert!(runs(&a).is_empty());
}

#[test]
fn file_array_persists_and_checks_size() {
    let dir = std::env::temp_dir().join(format!("moneta-media-{}", std::process::id()));
    let path = dir.join("a.img");
    let _ = std::fs::remove_file(&path);
    assert!(matches!(
        MappedArray::open_file(&path, None),
        Err(MediaError::NoSize(_))
    ));
    {
        let a = MappedArray::open_file(&path, Some(1 << 20)).unwrap();
        assert!(matches!(
            MappedArray::open_file(&path, None),
            Err(MediaError::Busy(_))
        ));
        let data = b"persistent bytes";
        // SAFETY: `data` is valid for its length and the range is inside the array.
        unsafe { a.write(4000, data.as_ptr(), data.len()) };
        a.flush(4000, data.len() as u64).unwrap();
    }
    let a = MappedArray::open_file(&path, None).unwrap();
    assert_eq!(a.size(), 1 << 20);
    let mut buf = [0u8; 16];
    // SAFETY: `buf` is valid for 16 bytes and the range is inside the array.
    unsafe { a.read(4000, buf.as_mut_ptr(), 16) };
    assert_eq!(&buf, b"persistent bytes");
    drop(a);
    assert!(matches!(
        MappedArray::open_file(&path, Some(2 << 20)),
        Err(MediaError::SizeMismatch { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Dirty KiB of the mapping that starts at `start`, from `/proc/self/smaps`.
fn dirty_kib(start: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{start:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    assert!(lines.next().is_some(), "no mapping at {start:x}");
    lines
        // The mapping's fields, up to the next mapping's first line (`start-end perms …`).
        .take_while(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|w| w.ends_with(':'))
        })
        .filter(|l| l.starts_with("Shared_Dirty:") || l.starts_with("Private_Dirty:"))
        .map(|l| l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap())
        .sum()
}

#[test]
fn each_flush_lane_writes_back_what_the_array_s_mapping_dirtied() {
    let dir = std::env::temp_dir().join(format!("moneta-lanes-{}", std::process::id()));
    let path = dir.join("a.img");
    let _ = std::fs::remove_file(&path);
    let a = MappedArray::open_file(&path, Some(1 << 20)).unwrap();
    assert_eq!(a.flush_lanes(), FLUSH_LANES);
    let start = a.map.as_ptr() as usize;
    for lane in 0..FLUSH_LANES {
        let at = 8192 * (lane as u64 + 1);
        let data = [lane as u8 + 1; 100];
        // SAFETY: `data` is valid for its length and the range is inside the array.
        unsafe { a.write(at, data.as_ptr(), data.len()) };
        assert!(dirty_kib(start) >= 4, "the store dirtied a page");
        a.flush_ranges_in(lane, &[(at, data.len() as u64)]).unwrap();
        assert_eq!(dirty_kib(start), 0, "lane {lane} wrote the page back");
        // A lane is an open file description of its own, not the array's.
        let lane_fd = a.lanes[lane].file.as_raw_fd();
        assert_ne!(lane_fd, a.file.as_raw_fd());
        let off = rustix::fs::seek(&a.lanes[lane].file, rustix::fs::SeekFrom::Start(77));
        assert_eq!(off.unwrap(), 77);
        assert_eq!(
            rustix::fs::seek(&a.file, rustix::fs::SeekFrom::Current(0)).unwrap(),
            0
        );
    }
    // Past the lanes there are, the array's own descriptor flushes.
    let data = [9u8; 10];
    // SAFETY: as above.
    unsafe { a.write(0, data.as_ptr(), data.len()) };
    a.flush_ranges_in(FLUSH_LANES, &[(0, 10)]).unwrap();
    assert_eq!(dirty_kib(start), 0);
    drop(a);
    // A memfd's array flushes nothing and has one lane.
    let v = MappedArray::volatile(1 << 20).unwrap();
    assert_eq!(v.flush_lanes(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An array in memory that records which lane each flush went through (`None`: its
/// own descriptor).
struct Lanes(MappedArray, std::sync::Mutex<Vec<Option<usize>>>);

impl Media for Lanes {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn persistent(&self) -> bool {
        true
    }
    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.read(addr, dst, len) }
    }
    unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.write(addr, src, len) }
    }
    fn flush(&self, _addr: u64, _len: u64) -> io::Result<()> {
        self.1.lock().unwrap().push(None);
        Ok(())
    }
    fn flush_ranges(&self, _ranges: &[(u64, u64)]) -> io::Result<()> {
        self.1.lock().unwrap().push(None);
        Ok(())
    }
    fn flush_lanes(&self) -> usize {
        3
    }
    fn flush_ranges_in(&self, lane: usize, _ranges: &[(u64, u64)]) -> io::Result<()> {
        self.1.lock().unwrap().push(Some(lane));
        Ok(())
    }
}

#[test]
fn an_array_in_a_lane_flushes_only_through_that_lane() {
    let inner = std::sync::Arc::new(Lanes(
        MappedArray::volatile(1 << 20).unwrap(),
        Default::default(),
    ));
    let a = FlushAs::lane(inner.clone(), 2);
    assert_eq!(a.flush_lanes(), 1);
    a.flush(4096, 100).unwrap();
    a.flush(0, 0).unwrap();
    a.flush_ranges(&[(0, 10), (8192, 10)]).unwrap();
    a.flush_ranges_in(0, &[(0, 10)]).unwrap();
    // What it does not flush passes through.
    let data = [5u8; 8];
    // SAFETY: `data` is valid for its length and the range is inside the array.
    unsafe { a.write(100, data.as_ptr(), data.len()) };
    let mut back = [0u8; 8];
    // SAFETY: as above.
    unsafe { a.read(100, back.as_mut_ptr(), back.len()) };
    assert_eq!(back, data);
    assert_eq!(a.size(), 1 << 20);
    assert_eq!(*inner.1.lock().unwrap(), vec![Some(2); 3]);
}

#[test]
fn zeroing_and_flushing_ranges_of_a_backing_file() {
    let dir = std::env::temp_dir().join(format!("moneta-zero-{}", std::process::id()));
    let path = dir.join("a.img");
    let _ = std::fs::remove_file(&path);
    let a = MappedArray::open_file(&path, Some(1 << 20)).unwrap();
    let ones = vec![1u8; 1 << 20];
    // SAFETY: `ones` covers the whole array.
    unsafe { a.write(0, ones.as_ptr(), ones.len()) };
    // Short and long ranges, aligned and not.
    for (addr, len) in [(100u64, 50u64), (8192, 4096), (70_000, 200_000), (4095, 2)] {
        a.zero(addr, len).unwrap();
        let mut back = vec![9u8; len as usize + 2];
        // SAFETY: `back` holds the range and a byte on each side, inside the array.
        unsafe { a.read(addr - 1, back.as_mut_ptr(), back.len()) };
        assert_eq!(back[0], 1, "before {addr}");
        assert!(
            back[1..=len as usize].iter().all(|b| *b == 0),
            "{addr}+{len}"
        );
        assert_eq!(back[len as usize + 1], 1, "after {addr}+{len}");
    }
    a.flush_ranges(&[(0, 4096), (300_000, 10_000), (1 << 19, 1)])
        .unwrap();
    a.flush_ranges(&[]).unwrap();
    // The file keeps its blocks: zeroing never leaves a hole a store could fault in.
    let allocated = std::fs::metadata(&path).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.blocks() * 512
    });
    assert!(allocated.unwrap() >= 1 << 20);
    drop(a);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_device_flush_flushes_nothing_and_passes_the_rest_on() {
    let a = FlushAs::device(MappedArray::volatile(8192).unwrap());
    let data = [7u8; 16];
    // SAFETY: `data` is valid for 16 bytes; the range is inside the array.
    unsafe { a.write(100, data.as_ptr(), 16) };
    a.flush(0, 8192).unwrap();
    a.zero(104, 4).unwrap();
    let mut back = [0u8; 16];
    // SAFETY: `back` is valid for 16 bytes; the range is inside the array.
    unsafe { a.read(100, back.as_mut_ptr(), 16) };
    assert_eq!(back[..4], [7; 4]);
    assert_eq!(back[4..8], [0; 4]);
    assert_eq!(a.size(), 8192);
}

#[test]
fn streamed_writes_land_whole_at_any_alignment() {
    let a = MappedArray::volatile(64 << 10).unwrap();
    let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    // Lengths below, at and above the streaming threshold, array addresses and source
    // offsets on and off cache-line boundaries.
    for (addr, from, len) in [
        (0u64, 0usize, 4096usize),
        (3, 1, 4096),
        (64, 5, STREAM_MIN - 1),
        (127, 0, STREAM_MIN),
        (4095, 17, 8193),
        (40_000, 63, 20_000 - 63),
        (1, 2, 65),
    ] {
        // Fill around the target so a store outside the range would show.
        let fill = vec![0xa5u8; len + 256];
        let base = addr.saturating_sub(128);
        // SAFETY: `fill` is valid for the length written, clipped to the array's end.
        unsafe {
            a.write(
                base,
                fill.as_ptr(),
                fill.len().min((a.size() - base) as usize),
            )
        };
        // SAFETY: `src[from..from+len]` is in bounds; the range is inside the array.
        unsafe { a.write(addr, src[from..].as_ptr(), len) };
        let mut back = vec![0u8; len];
        // SAFETY: `back` holds `len` bytes; the range is inside the array.
        unsafe { a.read(addr, back.as_mut_ptr(), len) };
        assert_eq!(back, &src[from..from + len], "addr {addr} len {len}");
        let mut edge = [0u8; 1];
        if addr > 0 {
            // SAFETY: one byte inside the array.
            unsafe { a.read(addr - 1, edge.as_mut_ptr(), 1) };
            assert_eq!(edge[0], 0xa5, "byte before addr {addr}");
        }
        if addr + (len as u64) < a.size() {
            // SAFETY: one byte inside the array.
            unsafe { a.read(addr + len as u64, edge.as_mut_ptr(), 1) };
            assert_eq!(edge[0], 0xa5, "byte after addr {addr} len {len}");
        }
    }
}

#[test]
fn pieces_shown_one_by_one_and_detached_together() {
    use std::io::Write;
    let a = MappedArray::volatile(1 << 20).unwrap();
    let own = [1u8; 8192];
    // SAFETY: `own` is valid for its length, inside the array.
    unsafe { a.write(8192, own.as_ptr(), own.len()) };
    let fd = rustix::fs::memfd_create("piece", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    let mut seg = File::from(fd);
    seg.write_all(&[2u8; 8192]).unwrap();
    a.overlay(8192, 4096, seg.as_fd(), 0).unwrap();
    a.overlay(12288, 4096, seg.as_fd(), 4096).unwrap();
    let mut got = [0u8; 8192];
    // SAFETY: `got` is valid for its length.
    unsafe { a.read(8192, got.as_mut_ptr(), got.len()) };
    assert!(got.iter().all(|&b| b == 2), "the segment's pages are shown");
    // A store through the array is a store to the segment.
    // SAFETY: as above.
    unsafe { a.write(9000, [9u8].as_ptr(), 1) };
    let mut one = [0u8; 1];
    std::os::unix::fs::FileExt::read_exact_at(&seg, &mut one, 808).unwrap();
    assert_eq!(one, [9]);
    assert_eq!(a.overlaid.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(
        a.shown
            .lock()
            .unwrap()
            .clone()
            .into_iter()
            .collect::<Vec<_>>(),
        [(8192, 16384)]
    );
    a.detach(8192, 8192).unwrap();
    assert_eq!(a.overlaid.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(a.shown.lock().unwrap().is_empty());
    // The array's own pages again (a volatile array's were given back: zeros).
    // SAFETY: as above.
    unsafe { a.read(8192, got.as_mut_ptr(), got.len()) };
    assert!(got.iter().all(|&b| b == 0));
}

#[test]
fn volatile_array_rejects_bad_sizes() {
    assert!(MappedArray::volatile(0).is_err());
    assert!(MappedArray::volatile(5000).is_err());
    let a = MappedArray::volatile(8192).unwrap();
    assert!(!a.persistent());
    let mut b = [1u8; 8];
    // SAFETY: `b` is valid for 8 bytes and the range is inside the array.
    unsafe { a.read(8184, b.as_mut_ptr(), 8) };
    assert_eq!(b, [0; 8]);
}

#[test]
#[should_panic(expected = "out of range")]
fn out_of_range_access_panics() {
    let a = MappedArray::volatile(4096).unwrap();
    let mut b = [0u8; 8];
    // SAFETY: `b` is valid for 8 bytes; the range is deliberately outside the array and
    // the bounds assertion must fire before any copy.
    unsafe { a.read(4092, b.as_mut_ptr(), 8) };
}
