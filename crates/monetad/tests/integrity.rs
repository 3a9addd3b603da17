//! Data checksums through a real daemon: on an image made with them, a byte flipped in a
//! file's data on the array reaches its reader as `EIO`, never as data; writes keep the
//! checksums (whole blocks replace a damaged one, a partial write into it is refused); and
//! `fsck --data` names the file and the offset.

mod common;

use std::sync::Arc;

use common::*;
use libmoneta::{ClientError, Moneta, OpenOptions};
use moneta_device::{MappedArray, Media, MediaError};

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

fn errno_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> i32 {
    match r {
        Err(e) => e.errno(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// The array address of byte `off` of the file named `name` in the root of the image.
fn address_of(img: &std::path::Path, name: &[u8], off: u64) -> u64 {
    let a = open_ro(img);
    let t = moneta_fs::tables::load(&a).unwrap();
    let g = t.sb.geometry;
    let ino = t.dirents.values().find(|d| d.name == name).unwrap().ino;
    let cs = g.chunk_size;
    let e = t
        .extents
        .values()
        .find(|e| {
            e.ino == ino && (e.file_chunk..e.file_chunk + e.count as u64).contains(&(off / cs))
        })
        .unwrap();
    g.chunk_addr(e.dev_chunk) + off - e.file_chunk * cs
}

/// Opens the image, waiting out a lock held for an instant by a child process another test
/// of this binary is starting: between its fork and its exec it holds copies of every
/// descriptor, this one's locked image among them.
fn retry_busy(open: impl Fn() -> Result<MappedArray, MediaError>) -> MappedArray {
    let t = std::time::Instant::now();
    loop {
        match open() {
            Err(MediaError::Busy(_)) if t.elapsed() < std::time::Duration::from_secs(5) => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            r => return r.unwrap(),
        }
    }
}

fn open_ro(img: &std::path::Path) -> MappedArray {
    retry_busy(|| MappedArray::open_read_only(img))
}

fn flip(img: &std::path::Path, addr: u64) {
    let a = retry_busy(|| MappedArray::open_file(img, None));
    let mut b = [0u8];
    // SAFETY: one byte inside the array, read then written back changed.
    unsafe {
        a.read(addr, b.as_mut_ptr(), 1);
        b[0] ^= 0x20;
        a.write(addr, b.as_ptr(), 1);
    }
    a.flush(addr, 1).unwrap();
}

#[test]
fn a_flipped_byte_in_a_file_is_an_error_not_data() {
    let dir = TempDir::new("integrity");
    let img = dir.0.join("device.img");
    let p = img.display().to_string();
    let mut d = Daemon::start_raw(
        &[
            "--device",
            &p,
            "--size",
            "64M",
            "--chunk-size",
            "64K",
            "--data-checksums",
        ],
        dir,
    );
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13 + i / 4093) as u8).collect();
    {
        let m = Moneta::connect(&d.socket).unwrap();
        let f = m.open("/f", &rw()).unwrap();
        assert_eq!(f.write_at(&data, 0).unwrap(), data.len());
        // A partial-block overwrite keeps the block's checksum true.
        f.write_at(b"patched", 5000).unwrap();
        f.sync_all().unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(f.read_at(&mut back, 0).unwrap(), data.len());
        assert_eq!(&back[5000..5007], b"patched");
    }
    let mut want = data.clone();
    want[5000..5007].copy_from_slice(b"patched");
    d.kill9();
    let a = Arc::new(open_ro(&img));
    assert_eq!(
        moneta_fs::check_data(&*a).unwrap(),
        Some(vec![]),
        "sound after the writes"
    );
    drop(a);
    // One flipped byte in the file's third 4 KiB block, and one in its fifth 64 KiB chunk.
    flip(&img, address_of(&img, b"f", 2 * 4096 + 123));
    flip(&img, address_of(&img, b"f", 4 * 65536 + 7));
    let a = Arc::new(open_ro(&img));
    let bad = moneta_fs::check_data(&*a).unwrap().unwrap();
    let found: Vec<(Option<&str>, u64)> =
        bad.iter().map(|b| (b.path.as_deref(), b.offset)).collect();
    assert_eq!(found, vec![(Some("/f"), 8192), (Some("/f"), 4 * 65536)]);
    drop(a);
    d.spawn();
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/f", &rw()).unwrap();
    let mut buf = vec![0u8; 4096];
    // Blocks before and between the damaged ones read as written.
    assert_eq!(f.read_at(&mut buf, 4096).unwrap(), 4096);
    assert_eq!(&buf[..], &want[4096..8192]);
    assert_eq!(f.read_at(&mut buf, 12288).unwrap(), 4096);
    assert_eq!(&buf[..], &want[12288..16384]);
    // Any read touching a damaged block fails, small, large (moved in pieces) or whole.
    assert_eq!(errno_of(f.read_at(&mut buf[..10], 8192 + 100)), libc::EIO);
    let mut all = vec![0u8; want.len()];
    assert_eq!(errno_of(f.read_at(&mut all, 0)), libc::EIO);
    assert_eq!(errno_of(f.read_at(&mut all[..200_000], 65536)), libc::EIO);
    // A partial write into a damaged block is refused; a whole-block write replaces it.
    assert_eq!(errno_of(f.write_at(b"x", 8192 + 5)), libc::EIO);
    f.write_at(&want[8192..12288], 8192).unwrap();
    assert_eq!(f.read_at(&mut buf, 8192).unwrap(), 4096);
    assert_eq!(&buf[..], &want[8192..12288]);
    // Truncating past the damage and growing again gives zeros the checksums agree with.
    f.set_len(4 * 65536 + 1).unwrap();
    f.set_len(6 * 65536).unwrap();
    assert_eq!(
        errno_of(f.read_at(&mut buf, 4 * 65536)),
        libc::EIO,
        "the kept byte's block"
    );
    let mut tail = vec![1u8; 65536];
    assert_eq!(f.read_at(&mut tail, 5 * 65536).unwrap(), 65536);
    assert!(tail.iter().all(|b| *b == 0));
    // Rewriting the damaged block whole clears the last damage.
    f.write_at(&want[4 * 65536..4 * 65536 + 4096], 4 * 65536)
        .unwrap();
    f.set_len(want.len() as u64).unwrap();
    f.write_at(&want[4 * 65536..], 4 * 65536).unwrap();
    assert_eq!(f.read_at(&mut all, 0).unwrap(), want.len());
    assert_eq!(all, want);
    drop(f);
    drop(m);
    d.kill9();
    let a = Arc::new(open_ro(&img));
    assert_eq!(moneta_fs::check_data(&*a).unwrap(), Some(vec![]));
}

#[test]
fn without_checksums_the_same_flip_is_read_as_data() {
    let dir = TempDir::new("integrity-off");
    let img = dir.0.join("device.img");
    let p = img.display().to_string();
    let mut d = Daemon::start_raw(
        &["--device", &p, "--size", "64M", "--chunk-size", "64K"],
        dir,
    );
    {
        let m = Moneta::connect(&d.socket).unwrap();
        let f = m.open("/f", &rw()).unwrap();
        f.write_at(&[7u8; 8192], 0).unwrap();
        f.sync_all().unwrap();
    }
    d.kill9();
    flip(&img, address_of(&img, b"f", 100));
    let a = Arc::new(open_ro(&img));
    assert_eq!(moneta_fs::check_data(&*a).unwrap(), None);
    drop(a);
    d.spawn();
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/f", OpenOptions::new().read(true)).unwrap();
    let mut buf = [0u8; 8192];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 8192);
    assert_eq!(buf[100], 7 ^ 0x20, "silently wrong: what checksums are for");
}
