//! Quick mode, for the device's poller answering file calls from a channel: whatever would
//! wait is refused with `NOT_QUICK` before anything changes, and a file held past its last
//! name lives on as an orphan that a crash leaves for the next mount to free.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use moneta_fs::fs::NOT_QUICK;
use moneta_fs::{Cred, Fs};

const CREAT: i32 = libc::O_CREAT | libc::O_RDWR;

fn root() -> Cred {
    Cred::root()
}

#[test]
fn a_quick_call_that_would_wait_changes_nothing() {
    let a = formatted(16 << 20);
    // Mounted as an existing image: its free space must be zeroed before use.
    let mut fs = mount(&a);
    let revoked = Arc::new(Mutex::new(0u32));
    let r = revoked.clone();
    fs.set_revoker(Box::new(move |_| {
        *r.lock().unwrap() += 1;
        Ok(())
    }));
    let f = fs.open(&root(), b"/f", CREAT, 0o644).unwrap();
    let before = (
        fs.statfs().chunks_free,
        fs.journal_seq(),
        fs.stat_ino(f.ino),
    );
    fs.set_quick(true);
    assert!(fs.quick_ready());
    // More than the clean space there is: zeroing would be needed.
    let e = fs.extend(f.ino, 0, 8 << 20, 16).unwrap_err();
    assert_eq!(e.errno, NOT_QUICK, "{e:?}");
    assert_eq!(
        (
            fs.statfs().chunks_free,
            fs.journal_seq(),
            fs.stat_ino(f.ino)
        ),
        before,
        "a refused call changed something"
    );
    fs.set_quick(false);
    // Outside quick mode the same call zeroes what it needs and succeeds.
    fs.extend(f.ino, 0, 8 << 20, 16).unwrap();
    assert_eq!(fs.stat_ino(f.ino).size, 8 << 20);
    assert_eq!(*revoked.lock().unwrap(), 0);
    // On an array formatted just now all free space is clean: a quick extend goes through.
    let b = formatted(16 << 20);
    let mut fs = Fs::mount_with(
        b.clone() as Arc<dyn moneta_device::Media>,
        moneta_fs::MountOptions {
            fresh: true,
            ..Default::default()
        },
    )
    .unwrap();
    let g = fs.open(&root(), b"/g", CREAT, 0o644).unwrap();
    fs.set_quick(true);
    fs.extend(g.ino, 0, CHUNK, 4).unwrap();
    fs.set_quick(false);
    assert_eq!(fs.stat_ino(g.ino).size, CHUNK);
}

#[test]
fn a_held_file_outlives_its_last_name_and_a_crash_frees_it() {
    let a = formatted(16 << 20);
    let free0 = {
        let mut fs = mount(&a);
        fs.set_revoker(Box::new(|_| Ok(())));
        let free0 = fs.statfs().chunks_free;
        let f = fs.open(&root(), b"/held", CREAT, 0o644).unwrap();
        fs.extend(f.ino, 0, 3 * CHUNK, 4).unwrap();
        fs.close(f.ino).unwrap();
        let used = fs.statfs().chunks_free;
        assert!(used < free0);
        // What a quick unlink does: hold, then unlink; the space stays taken, with no name.
        fs.set_quick(true);
        fs.hold(f.ino).unwrap();
        fs.unlink(&root(), b"/held").unwrap();
        fs.set_quick(false);
        assert_eq!((fs.nlink(f.ino), fs.open_count(f.ino)), (0, 1));
        assert_eq!(fs.statfs().chunks_free, used);
        assert!(fs.stat(&root(), b"/held", true).is_err());
        // The daemon dies before the releaser closes the hold: nothing more is stored.
        free0
    };
    // The next mount frees the orphan, and the image checks clean.
    let fs = mount(&a);
    assert_eq!(fs.statfs().chunks_free, free0);
    let report = fs.check();
    assert_eq!(report.errors(), 0, "{report:?}");
}

#[test]
fn a_hold_closed_later_frees_the_file_with_revocation() {
    let a = formatted(16 << 20);
    let mut fs = mount(&a);
    let revoked = Arc::new(Mutex::new(Vec::new()));
    let r = revoked.clone();
    fs.set_revoker(Box::new(move |ranges| {
        r.lock().unwrap().extend_from_slice(ranges);
        Ok(())
    }));
    let free0 = fs.statfs().chunks_free;
    let f = fs.open(&root(), b"/x", CREAT, 0o644).unwrap();
    fs.extend(f.ino, 0, 2 * CHUNK, 4).unwrap();
    fs.close(f.ino).unwrap();
    fs.hold(f.ino).unwrap();
    fs.unlink(&root(), b"/x").unwrap();
    assert!(
        revoked.lock().unwrap().is_empty(),
        "nothing revoked while held"
    );
    // The releaser's close: revocation first, then the space is free.
    fs.close(f.ino).unwrap();
    let got: u64 = revoked.lock().unwrap().iter().map(|r| r.1).sum();
    assert_eq!(got, 2 * CHUNK);
    assert_eq!(fs.statfs().chunks_free, free0);
    // A hold of an inode not in use is refused.
    assert_eq!(fs.hold(f.ino).unwrap_err().errno, libc::ENOENT);
}

#[test]
fn zeroing_ahead_gives_quick_calls_clean_space_while_it_is_short() {
    let a = formatted(16 << 20);
    // Mounted as an existing image: all its free space is dirty, none clean.
    let mut fs = mount(&a);
    let f = fs.open(&root(), b"/f", CREAT, 0o644).unwrap();
    assert!(
        fs.wants_zeroing(),
        "no clean space, and dirty space to zero"
    );
    fs.set_quick(true);
    let e = fs.extend(f.ino, 0, 1 << 20, 16).unwrap_err();
    assert_eq!(e.errno, NOT_QUICK, "{e:?}");
    fs.set_quick(false);
    let free = fs.statfs().chunks_free;
    let mut batches = 0;
    while fs.zero_ahead().unwrap() {
        batches += 1;
        assert!(batches < 64, "zeroing ahead never ends");
    }
    assert!(!fs.wants_zeroing());
    assert!(
        batches >= 1,
        "one batch of 1 MiB cannot reach an eighth of 16 MiB"
    );
    // Zeroing frees nothing and takes nothing: only what may be handed out at once changes.
    assert_eq!(fs.statfs().chunks_free, free);
    fs.set_quick(true);
    let (size, _) = fs.extend(f.ino, 0, 1 << 20, 16).unwrap();
    fs.set_quick(false);
    assert_eq!(size, 1 << 20);
}
