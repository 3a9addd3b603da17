//! Crash consistency of nvfs: two clients run random workloads of creates, writes, renames,
//! truncates, unlinks, directory changes and fsyncs (through the channel and on the socket)
//! while `monetad` is killed at a random instant, many times over one image. After every kill
//! the image must check clean, and after every restart every fsync'd file must hold exactly
//! its fsync'd contents.
//!
//! Two kinds of crash: a `SIGKILL` of the daemon alone (at the `device` level, which promises
//! that much), and a crash of the machine (at the `host` level): the daemon runs with
//! `--durable-shadow`, which keeps a copy of every range it flushed, and after the kill each
//! page of the image that differs from that copy is kept or lost at random, as the kernel may
//! or may not have written it back.
//!
//! `MONETA_CRASH_SEED` replays a run (the seed is printed); `MONETA_CRASH_KILLS` sets the
//! number of kills (200 by default for each kind).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::*;
use libmoneta::{Channel, ClientError};
use moneta_abi::fsproto::FsRequest;
use moneta_device::MappedArray;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

enum Event {
    /// Created, written, fsync'd and closed: must survive with exactly these bytes.
    Durable(Vec<u8>, Vec<u8>),
    /// An unlink of a durable file was sent: after a kill it may or may not have happened.
    Unlinking(Vec<u8>),
    /// The unlink returned.
    Unlinked(Vec<u8>),
}

fn gone(e: &ClientError) -> bool {
    !matches!(e, ClientError::Refused { .. })
}

/// The workload: runs until the daemon dies. Refusals of scratch operations (a missing name,
/// a non-empty directory) are part of the game; any other error means the daemon is gone.
/// `ready` hears once the workload has its channel (dropped unsent if it gets none).
fn workload(
    socket: std::path::PathBuf,
    seed: u64,
    durable: Vec<Vec<u8>>,
    tx: mpsc::Sender<Event>,
    ready: mpsc::Sender<()>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let Ok(ch) = Channel::open(&socket) else {
        return;
    };
    let _ = ready.send(());
    let c = ch.control();
    let mut durable = durable;
    let mut made = 0u32;
    loop {
        let r: Result<(), ClientError> = (|| match rng.gen_range(0..12) {
            0..=3 => {
                let name = format!("/s{}", rng.gen_range(0..12));
                let (h, _, _) = c.fs_open(
                    name.as_bytes(),
                    libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC,
                    0o644,
                )?;
                let len = rng.gen_range(0..96 << 10);
                let off = rng.gen_range(0..64 << 10);
                file_write(&ch, h, off, &pattern(rng.gen(), off, len))?;
                if rng.gen_bool(0.3) {
                    c.fs(FsRequest::Truncate {
                        target: moneta_abi::fsproto::Target::Handle(h),
                        size: rng.gen_range(0..128 << 10),
                    })?;
                }
                c.fs_close(h)
            }
            4 => c
                .fs(FsRequest::Rename {
                    flags: 0,
                    from: format!("/s{}", rng.gen_range(0..12)).into_bytes(),
                    to: format!("/s{}", rng.gen_range(0..12)).into_bytes(),
                })
                .map(drop),
            5 => c
                .fs(FsRequest::Unlink {
                    path: format!("/s{}", rng.gen_range(0..12)).into_bytes(),
                })
                .map(drop),
            6 => {
                let d = format!("/d{}", rng.gen_range(0..4));
                let _ = c.fs(FsRequest::Mkdir {
                    mode: 0o755,
                    path: d.clone().into_bytes(),
                });
                let f = format!("{d}/f{}", rng.gen_range(0..3));
                let (h, _, _) = c.fs_open(f.as_bytes(), libc::O_CREAT | libc::O_RDWR, 0o644)?;
                file_write(&ch, h, 0, &pattern(1, 0, rng.gen_range(1..20_000)))?;
                c.fs_close(h)?;
                c.fs(FsRequest::Rename {
                    flags: 0,
                    from: d.into_bytes(),
                    to: format!("/d{}", rng.gen_range(0..4)).into_bytes(),
                })
                .map(drop)
            }
            7 => {
                let d = format!("/d{}", rng.gen_range(0..4));
                for i in 0..3 {
                    let _ = c.fs(FsRequest::Unlink {
                        path: format!("{d}/f{i}").into_bytes(),
                    });
                }
                c.fs(FsRequest::Rmdir {
                    path: d.into_bytes(),
                })
                .map(drop)
            }
            8..=9 => {
                made += 1;
                let name = format!("/k{seed}-{made}").into_bytes();
                let len = rng.gen_range(1..80 << 10);
                let data = pattern(rng.gen(), 0, len);
                let (h, _, _) =
                    c.fs_open(&name, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600)?;
                let cut = rng.gen_range(0..len);
                file_write(&ch, h, 0, &data[..cut])?;
                file_write(&ch, h, cut as u64, &data[cut..])?;
                // Through the channel (at the `host` level a worker of the device makes the
                // flush) or on the socket: both are durability points.
                if rng.gen_bool(0.5) {
                    ch.fs(FsRequest::Fsync { handle: h })?;
                } else {
                    c.fs(FsRequest::Fsync { handle: h })?;
                }
                c.fs_close(h)?;
                durable.push(name.clone());
                let _ = tx.send(Event::Durable(name, data));
                Ok(())
            }
            _ => {
                if durable.len() > 8 {
                    let name = durable.swap_remove(rng.gen_range(0..durable.len()));
                    let _ = tx.send(Event::Unlinking(name.clone()));
                    c.fs(FsRequest::Unlink { path: name.clone() })?;
                    let _ = tx.send(Event::Unlinked(name));
                }
                Ok(())
            }
        })();
        if let Err(e) = r {
            if gone(&e) {
                return;
            }
        }
    }
}

#[test]
fn killed_daemons_leave_consistent_images_and_every_fsynced_file() {
    crash_rounds("killed daemons", false);
}

#[test]
fn crashes_of_the_machine_leave_consistent_images_and_every_fsynced_file() {
    crash_rounds("machine crashes", true);
}

/// Makes the image a crash of the machine leaves: each page of `img` that differs from the
/// copy of what was flushed is kept with probability `kept`. Both files then hold that image.
fn crash_the_machine(img: &std::path::Path, shadow: &std::path::Path, rng: &mut StdRng, kept: f64) {
    let now = std::fs::read(img).unwrap();
    let mut out = std::fs::read(shadow).unwrap();
    assert_eq!(now.len(), out.len());
    for (page, was) in now.chunks(4096).zip(out.chunks_mut(4096)) {
        if page != was && rng.gen_bool(kept) {
            was.copy_from_slice(page);
        }
    }
    std::fs::write(img, &out).unwrap();
    std::fs::write(shadow, &out).unwrap();
}

fn crash_rounds(kind: &str, machine: bool) {
    let seed: u64 = std::env::var("MONETA_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let kills: u32 = std::env::var("MONETA_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    println!("{kind}: seed {seed} (MONETA_CRASH_SEED={seed} replays it), {kills} kills");
    let dir = TempDir::new("crash");
    let img = dir.0.join("image");
    {
        let a = MappedArray::open_file(&img, Some(48 << 20)).unwrap();
        let o = moneta_fs::MkfsOptions {
            chunk_size: 16 << 10,
            inode_count: Some(2048),
            dirent_count: Some(4096),
            ..Default::default()
        };
        moneta_fs::mkfs(&a, &o).unwrap();
    }
    let shadow = dir.0.join("shadow");
    std::fs::copy(&img, &shadow).unwrap();
    let (img_s, shadow_s) = (img.display().to_string(), shadow.display().to_string());
    let args: Vec<&str> = if machine {
        vec![
            "--device",
            &img_s,
            "--durability",
            "host",
            "--durable-shadow",
            &shadow_s,
        ]
    } else {
        vec!["--device", &img_s, "--durability", "device"]
    };
    let mut d = Daemon::start_raw(&args, dir);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut expected: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut maybe_gone: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut verified = 0usize;
    for round in 0..kills {
        // After the restart: every fsync'd file has exactly its contents.
        {
            let ch = d.channel();
            let c = ch.control();
            let names: Vec<Vec<u8>> = expected.keys().cloned().collect();
            for name in names {
                match c.fs_open(&name, libc::O_RDONLY, 0) {
                    Err(ClientError::Refused { errno, .. })
                        if errno == libc::ENOENT && maybe_gone.contains(&name) =>
                    {
                        expected.remove(&name);
                    }
                    Err(e) => panic!(
                        "seed {seed} round {round}: fsync'd file {} is lost: {e}",
                        String::from_utf8_lossy(&name)
                    ),
                    Ok((h, _, _)) => {
                        let back = file_read(&ch, h).unwrap();
                        assert!(
                            back == expected[&name],
                            "seed {seed} round {round}: fsync'd file {} has other contents ({} bytes, {} expected)",
                            String::from_utf8_lossy(&name),
                            back.len(),
                            expected[&name].len()
                        );
                        c.fs_close(h).unwrap();
                        verified += 1;
                    }
                }
            }
            maybe_gone.clear();
        }
        // Two workloads at once, each with its own channel and its share of the durable
        // files to unlink: their fsyncs meet in the daemon's group commit, which runs two
        // flushes at a time at the `host` level.
        let (tx, rx) = mpsc::channel();
        let known: Vec<Vec<u8>> = expected.keys().cloned().collect();
        let (ready_tx, ready) = mpsc::channel();
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                let share: Vec<Vec<u8>> =
                    known.iter().skip(w as usize).step_by(2).cloned().collect();
                let wseed = seed ^ (round as u64 * 2 + w).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let (socket, tx, ready_tx) = (d.socket.clone(), tx.clone(), ready_tx.clone());
                std::thread::spawn(move || workload(socket, wseed, share, tx, ready_tx))
            })
            .collect();
        drop(ready_tx);
        // The random instant counts from when a workload runs, not from the restart: on a
        // loaded machine, connecting alone can take most of the window.
        let _ = ready.recv_timeout(Duration::from_secs(20));
        // At the host level a workload's fsyncs wait for the disk, and a mount's first
        // allocation zeroes free space it knows nothing of: a longer window.
        let window = if machine { 2_000..60_000 } else { 200..12_000 };
        std::thread::sleep(Duration::from_micros(rng.gen_range(window)));
        d.kill9();
        for w in workers {
            w.join().unwrap();
        }
        for ev in rx.try_iter() {
            match ev {
                Event::Durable(n, data) => {
                    expected.insert(n, data);
                }
                Event::Unlinking(n) => {
                    maybe_gone.insert(n);
                }
                Event::Unlinked(n) => {
                    maybe_gone.remove(&n);
                    expected.remove(&n);
                }
            }
        }
        if machine {
            let kept = [0.0, 0.4, 0.8][round as usize % 3];
            crash_the_machine(&img, &shadow, &mut rng, kept);
        }
        // The image as the crash left it checks clean (notes about open files are fine).
        let a = Arc::new(MappedArray::open_file(&img, None).unwrap());
        let out = moneta_fs::fsck(&*a, false).unwrap();
        assert_eq!(
            out.before.errors(),
            0,
            "seed {seed} round {round}: {:?}",
            out.before.problems
        );
        drop(a);
        d.spawn();
    }
    println!("{kind}: {verified} checks of fsync'd files after the restarts");
    assert!(
        verified > kills as usize / 2,
        "the workload made durable files ({verified} checks)"
    );
}
