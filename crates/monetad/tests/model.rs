//! The array's timing model under a real daemon: requests complete when the model says and not
//! before, barriers order a channel's requests, the scheduling policies serve large and small
//! requests as Moneta §IV describes, and the model's figures reach `status`.

mod common;

use std::time::Duration;

use common::*;
use libmoneta::{Channel, Tag};
use moneta_abi::{Command, Completion, Opcode, Status};

fn cmd(op: Opcode, addr: u64, len: u64) -> Command {
    Command::new(op, Completion::Dma, addr, len, 0)
}

fn barrier() -> Command {
    let mut c = cmd(Opcode::Nop, 0, 0);
    c.barrier = true;
    c
}

#[test]
fn requests_complete_when_the_model_says_and_not_before() {
    // Slow memory makes the model's time stand out from the host's: 100 µs to open a row,
    // 200 µs to write one back.
    let d = Daemon::start(&[
        "--model",
        "pcm",
        "--model-set",
        "read_ns=100000",
        "--model-set",
        "write_ns=200000",
    ]);
    let ctl = d.control();
    let ch = d.channel();
    grant(&ctl, ch.id(), 0, 1 << 20, true, 0);
    let data = pattern(3, 8192, 4096);
    ch.write_dma(Tag(0), 0, &data);
    let w = ch.run(Tag(0), &cmd(Opcode::Write, 8192, 4096)).unwrap();
    assert_eq!(w.status, Status::Ok);
    // A partial row is read in (100 µs), written (200 µs): never less than 300 µs.
    assert!(
        w.device_ns >= 300_000,
        "write completed after {} ns",
        w.device_ns
    );
    let r = ch.run(Tag(1), &cmd(Opcode::Read, 8192, 4096)).unwrap();
    assert_eq!(r.status, Status::Ok);
    assert!(
        r.device_ns >= 100_000,
        "read completed after {} ns",
        r.device_ns
    );
    let mut back = vec![0u8; 4096];
    ch.read_dma(Tag(1), 0, &mut back);
    assert_eq!(back, data);
    // The model's figures reach the control socket.
    let m = ctl.model().unwrap();
    assert_eq!(m.get("model"), Some("pcm"));
    assert_eq!(m.get("parameters.read_ns"), Some("100000"));
    assert_eq!(m.get("reads"), Some("1"));
    assert_eq!(m.get("writes"), Some("1"));
    assert_eq!(m.get("bytes_written"), Some("4096"));
    let total: f64 = m.get("energy.total_j").unwrap().parse().unwrap();
    let parts: f64 = [
        "scheduler_j",
        "buffers_j",
        "ring_j",
        "link_j",
        "controllers_j",
        "array_j",
        "background_j",
    ]
    .iter()
    .map(|k| {
        m.get(&format!("energy.{k}"))
            .unwrap()
            .parse::<f64>()
            .unwrap()
    })
    .sum();
    assert!(
        total > 0.0 && (total - parts).abs() <= total * 1e-5,
        "{total} vs {parts}"
    );
    // The device published both at the model's times (and counts how late it was).
    assert_eq!(m.get("emulation.completions"), Some("2"));
    assert!(m.get("emulation.max_late_ns").is_some());
    // Address 8192 is the second stripe: controller 1 did the work.
    assert_eq!(m.get("controllers.1.transfers"), Some("2"));
    assert_eq!(m.get("controllers.0.transfers"), Some("0"));
}

#[test]
fn without_a_model_the_report_says_so() {
    let d = Daemon::start(&[]);
    let m = d.control().model().unwrap();
    assert_eq!(m.pairs, vec![("model".to_string(), "none".to_string())]);
}

/// Writes `old` at `addr`, then rings at once a write of `new` there on tag 1, (with
/// `with_barrier`) a barrier on tag 2, and a read of `addr` on tag 0, prepared last: returns
/// what the read saw. The device takes the three bits in one pass, tag 0 first.
fn read_after_write(ch: &Channel, addr: u64, with_barrier: bool) -> (Vec<u8>, Vec<u8>) {
    let old = pattern(1, addr, 4096);
    let new = pattern(2, addr, 4096);
    ch.write_dma(Tag(1), 0, &old);
    assert_eq!(
        ch.run(Tag(1), &cmd(Opcode::Write, addr, 4096))
            .unwrap()
            .status,
        Status::Ok
    );
    ch.write_dma(Tag(1), 0, &new);
    ch.prepare(Tag(1), &cmd(Opcode::Write, addr, 4096));
    let mut bits = 1 << 1;
    if with_barrier {
        ch.prepare(Tag(2), &barrier());
        bits |= 1 << 2;
    }
    ch.prepare(Tag(0), &cmd(Opcode::Read, addr, 4096));
    ch.ring(bits | 1);
    for t in [0u8, 1, 2] {
        if t == 2 && !with_barrier {
            continue;
        }
        assert_eq!(ch.wait(Tag(t), Completion::Dma).unwrap().status, Status::Ok);
    }
    let mut seen = vec![0u8; 4096];
    ch.read_dma(Tag(0), 0, &mut seen);
    (seen, if with_barrier { new } else { old })
}

#[test]
fn a_barrier_makes_later_requests_wait_for_earlier_ones() {
    for args in [
        &["--write-latency-ns", "200000"][..],
        &["--model", "pcm", "--model-set", "write_ns=200000"][..],
        &["--model", "pcm", "--model-set", "policy=fifo"][..],
    ] {
        let d = Daemon::start(args);
        let ch = d.channel();
        grant(&d.control(), ch.id(), 0, 1 << 20, true, 0);
        // Without a barrier the read, taken first, sees the old bytes; with one it waits for
        // the write before it and sees the new ones.
        let (seen, want) = read_after_write(&ch, 65536, false);
        assert_eq!(seen, want, "{args:?}: no barrier");
        let (seen, want) = read_after_write(&ch, 65536, true);
        assert_eq!(seen, want, "{args:?}: barrier");
        // The library's blocking barrier, twice in a row, and requests after it.
        ch.barrier(Completion::Dma).unwrap();
        ch.barrier(Completion::Sleep).unwrap();
        let (seen, want) = read_after_write(&ch, 0, true);
        assert_eq!(seen, want, "{args:?}: after the library's barriers");
    }
}

#[test]
fn commands_of_a_later_epoch_wait_and_a_closing_channel_drops_them() {
    let d = Daemon::start(&[]);
    let ctl = d.control();
    let ch = d.channel();
    grant(&ctl, ch.id(), 0, 1 << 20, true, 0);
    // A command two epochs ahead of a channel with no barrier in flight waits for ever; the
    // channel's other commands go on, and an idle daemon with it parks and sleeps.
    let words = {
        let mut w = cmd(Opcode::Read, 0, 512).to_words();
        w[0] |= 2 << (16 + moneta_abi::FLAG_EPOCH_SHIFT) | 77 << 32;
        w
    };
    ch.submit_words(Tag(5), &words);
    std::thread::sleep(Duration::from_millis(20));
    assert!(ch.poll(Tag(5), Completion::Dma).is_none());
    assert_eq!(ch.nop(Completion::Dma).unwrap().status, Status::Ok);
    let before = d.cpu_ticks();
    std::thread::sleep(Duration::from_millis(500));
    let used = d.cpu_ticks() - before;
    assert!(
        used <= 10,
        "an idle daemon with a held command used {used} ticks in 0.5 s"
    );
    // Its channel closes cleanly.
    drop(ch);
    let s = ctl.status().unwrap();
    assert_eq!(s.phys_tags_in_use, 0);
}

/// Four hog channels keep two 512 KiB reads each in flight on a slow link (210 ms of it); a
/// fifth channel then reads and writes 4 KiB: returns the small read's and the small write's
/// device times.
fn small_beside_large(policy: &str) -> (u64, u64) {
    let d = Daemon::start(&[
        "--model",
        "pcm",
        "--model-set",
        &format!("policy={policy}"),
        "--model-set",
        "link_rate=0.005",
    ]);
    let ctl = d.control();
    let hogs = [d.channel(), d.channel(), d.channel(), d.channel()];
    let small = d.channel();
    for h in &hogs {
        grant(&ctl, h.id(), 0, 16 << 20, false, 0);
    }
    grant(&ctl, small.id(), 0, 16 << 20, true, 0);
    let big = 512 << 10;
    for (i, h) in hogs.iter().enumerate() {
        for (j, t) in [0u8, 32].into_iter().enumerate() {
            let addr = ((i * 2 + j) as u64) * big;
            h.prepare(Tag(t), &cmd(Opcode::Read, addr, big));
        }
        h.ring(1 | 1 << 32);
    }
    // Let the large reads reach the array's scheduler: their data has moved (the host's
    // part) once the device has read all 4 MiB.
    let t = std::time::Instant::now();
    while ctl.status().unwrap().bytes_read < 8 * big {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the large reads never moved"
        );
        std::thread::sleep(Duration::from_micros(100));
    }
    small.prepare(Tag(0), &cmd(Opcode::Read, 8 << 20, 4096));
    small.prepare(Tag(1), &cmd(Opcode::Write, 9 << 20, 4096));
    small.ring(0b11);
    let r = small.wait(Tag(0), Completion::Dma).unwrap();
    let w = small.wait(Tag(1), Completion::Dma).unwrap();
    assert_eq!((r.status, w.status), (Status::Ok, Status::Ok));
    for h in &hogs {
        for t in [0u8, 32] {
            assert_eq!(h.wait(Tag(t), Completion::Dma).unwrap().status, Status::Ok);
        }
    }
    (r.device_ns, w.device_ns)
}

#[test]
fn the_scheduling_policies_of_moneta_serve_small_requests_beside_large_ones() {
    // 8 x 512 KiB of reads at 0.005 GB/s hold the link for about 840 ms, far longer than the
    // host takes to move their data, even a host so busy that the test waits for the CPU.
    let (fifo_read, fifo_write) = small_beside_large("fifo");
    let (twoq_read, twoq_write) = small_beside_large("2q");
    let (rr_read, rr_write) = small_beside_large("rr");
    eprintln!(
        "small read/write beside large reads: fifo {fifo_read}/{fifo_write} ns, \
         2q {twoq_read}/{twoq_write} ns, rr {rr_read}/{rr_write} ns"
    );
    // FIFO: both wait behind the large reads in the one queue.
    assert!(fifo_read > 50_000_000 && fifo_write > 50_000_000);
    // Two queues: the write has a queue (and the link's other direction) of its own; the read
    // still waits.
    assert!(twoq_read > 50_000_000);
    assert!(twoq_write * 4 < fifo_write);
    // Round-robin: the small read takes its turn between the large reads' transfers.
    assert!(rr_read * 4 < fifo_read && rr_read * 4 < twoq_read);
    assert!(rr_write * 4 < fifo_write);
}

#[test]
fn a_bad_model_is_refused_with_the_reason() {
    for (args, want) in [
        (&["--model", "tape"][..], "no model preset `tape`"),
        (
            &["--model", "pcm", "--model-set", "controllers=32"][..],
            "controllers must be 1 to 16",
        ),
        (&["--model-set", "controllers=2"][..], "needs a model"),
        (
            &[
                "--model",
                "pcm",
                "--model-set",
                "link_rate=5000",
                "--model-set",
                "ring_rate=10000",
                "--model-set",
                "ctrl_rate=10000",
            ][..],
            "more than this host copies",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_monetad"))
            .args([
                "--volatile",
                "--size",
                "16M",
                "--socket",
                "/nonexistent/x.sock",
            ])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn wear_lasts_as_long_as_the_array_through_kills_and_restarts() {
    let dir = TempDir::new("wear");
    let img = dir.0.join("array.img");
    let img_s = img.display().to_string();
    let args = [
        "--device", &img_s, "--size", "32M", "--raw", "--model", "pcm",
    ];
    let mut d = Daemon::start_raw(&args, dir);
    let writes = |d: &Daemon, n: u64| {
        let ch = d.channel();
        grant(&d.control(), ch.id(), 0, 32 << 20, true, 0);
        let data = vec![0x5a; 8192];
        for i in 0..n {
            ch.write((i * 40_503 % 4096) * 8192, &data, Completion::Dma)
                .unwrap();
        }
    };
    // Row writes counted: the writes, and the row each gap move writes.
    let wear = |d: &Daemon| {
        let m = d.control().model().unwrap();
        let total: u64 = m.get("wear.total").unwrap().parse().unwrap();
        (total, m.get("wear.file").map(String::from))
    };
    let moves = |d: &Daemon| -> u64 {
        let m = d.control().model().unwrap();
        (0..4)
            .map(|i| {
                m.get(&format!("controllers.{i}.gap_moves"))
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum()
    };
    writes(&d, 300);
    let (first, file) = wear(&d);
    let file = file.expect("a persistent array keeps its wear in a file");
    assert!(file.starts_with(&format!("{img_s}.wear-")), "{file}");
    // 300 row writes, and a gap move (a row written) every 100 of a controller.
    assert_eq!(first, 300 + moves(&d));
    // Killed: nothing counted is lost.
    d.kill9();
    d.spawn();
    assert_eq!(wear(&d), (first, Some(file.clone())));
    writes(&d, 200);
    let (second, _) = wear(&d);
    assert_eq!(second, first + 200 + moves(&d));
    // A clean stop and a start with another geometry: a file of its own, counting anew; and
    // back with the first geometry, the first file again.
    let ctl = d.control();
    ctl.shutdown().unwrap();
    d.wait_exit(Duration::from_secs(10)).expect("stops");
    d.args
        .extend(["--model-set".to_string(), "controllers=2".to_string()]);
    d.spawn();
    let (other, other_file) = wear(&d);
    assert_eq!(other, 0);
    assert_ne!(other_file.unwrap(), file);
    d.kill9();
    d.args.truncate(d.args.len() - 2);
    d.spawn();
    assert_eq!(wear(&d), (second, Some(file)));
}

#[test]
fn hints_fill_the_dram_buffer_only_with_what_the_channel_may_read() {
    use moneta_abi::control::{Grant, RIGHT_WRITE};
    // Slow memory (1 µs to open a row) behind a DRAM buffer of 1 MiB, without read-ahead, so
    // that only hints fill it ahead of use.
    let d = Daemon::start(&[
        "--model",
        "slow-nvm",
        "--model-set",
        "buffer=1M",
        "--model-set",
        "readahead=0",
    ]);
    let ctl = d.control();
    let ch = d.channel();
    grant(&ctl, ch.id(), 0, 1 << 20, false, 0);
    ctl.grant(Grant {
        channel: ch.id(),
        rights: RIGHT_WRITE,
        start: 1 << 20,
        len: 1 << 20,
        file: 0,
    })
    .unwrap();
    let run = |op, addr, len| ch.run(Tag(0), &cmd(op, addr, len)).unwrap().status;
    // A hint over space the channel may read: taken, 16 lines of 4 KiB to fill.
    assert_eq!(run(Opcode::WillNeed, 0, 64 << 10), Status::Ok);
    // Space it may only write, space it has no record for, a range running out of its
    // records, beyond the array, and no range at all: refused as reads would be.
    assert_eq!(
        run(Opcode::WillNeed, 1 << 20, 4096),
        Status::PermissionDenied
    );
    assert_eq!(run(Opcode::WillNeed, 4 << 20, 4096), Status::PermissionMiss);
    assert_eq!(
        run(Opcode::WillNeed, (1 << 20) - 4096, 8192),
        Status::PermissionDenied
    );
    assert_eq!(run(Opcode::WillNeed, u64::MAX - 10, 20), Status::OutOfRange);
    assert_eq!(run(Opcode::WillNeed, 0, 0), Status::Malformed);
    let m = ctl.model().unwrap();
    assert_eq!(m.get("buffer.hinted_lines"), Some("16"));
    assert_eq!(m.get("parameters.buffer"), Some("1048576"));
    // A read of hinted bytes is served by the buffer; one of others goes to the array.
    assert_eq!(run(Opcode::Read, 8192, 4096), Status::Ok);
    assert_eq!(run(Opcode::Read, 512 << 10, 4096), Status::Ok);
    let m = ctl.model().unwrap();
    assert_eq!(m.get("buffer.hits"), Some("1"));
    assert_eq!(m.get("buffer.misses"), Some("1"));
    assert_eq!(m.get("buffer.used_ahead"), Some("1"));
    assert_eq!(ctl.status().unwrap().hints, 1);
}

#[test]
fn read_ahead_fills_the_buffer_within_the_channels_records_only() {
    // Read-ahead of 64 KiB; the channel may read 16 KiB of the array.
    let d = Daemon::start(&[
        "--model",
        "slow-nvm",
        "--model-set",
        "buffer=1M",
        "--model-set",
        "readahead=64K",
    ]);
    let ctl = d.control();
    let ch = d.channel();
    grant(&ctl, ch.id(), 0, 16 << 10, false, 0);
    for i in 0..4u64 {
        let r = ch.run(Tag(0), &cmd(Opcode::Read, i * 4096, 4096)).unwrap();
        assert_eq!(r.status, Status::Ok);
    }
    let m = ctl.model().unwrap();
    // The first read misses and reads the three other lines of the record ahead; nothing past
    // the record is read.
    assert_eq!(m.get("buffer.misses"), Some("1"));
    assert_eq!(m.get("buffer.hits"), Some("3"));
    assert_eq!(m.get("buffer.ahead_lines"), Some("3"));
    assert_eq!(m.get("buffer.lines"), Some("4"));
}

#[test]
fn a_file_hints_what_it_will_read_and_only_if_open_for_reading() {
    use libmoneta::{Moneta, OpenOptions};
    let d = Daemon::start_fs(
        "64M",
        &[
            "--model",
            "slow-nvm",
            "--model-set",
            "buffer=4M",
            "--model-set",
            "readahead=0",
        ],
    );
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m
        .open(
            "/hinted",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap();
    f.write_at(&vec![7u8; 1 << 20], 0).unwrap();
    let hinted = || -> u64 {
        d.control()
            .model()
            .unwrap()
            .get("buffer.hinted_lines")
            .unwrap()
            .parse()
            .unwrap()
    };
    // To the end of the file (length 0): its 256 lines of 4 KiB; past the end, nothing.
    f.will_need(0, 0).unwrap();
    assert_eq!(hinted(), 256);
    f.will_need(4 << 20, 4096).unwrap();
    assert_eq!(hinted(), 256);
    // Several ranges at once, through a read-only open of the file: two new lines (the
    // rest is in the buffer already and fills nothing).
    let r = m.open("/hinted", OpenOptions::new().read(true)).unwrap();
    let g = m
        .open(
            "/other",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap();
    g.write_at(&vec![1u8; 64 << 10], 0).unwrap();
    let g2 = m.open("/other", OpenOptions::new().read(true)).unwrap();
    g2.will_need_ranges(&[(0, 4096), (32 << 10, 4096)]).unwrap();
    r.will_need_ranges(&[(0, 8192), (1 << 19, 1)]).unwrap();
    assert_eq!(hinted(), 258);
    // A write-only open cannot hint; nor can a directory.
    let w = m.open("/hinted", OpenOptions::new().write(true)).unwrap();
    assert_eq!(w.will_need(0, 4096).unwrap_err().errno(), libc::EBADF);
    let dir = m.open("/", OpenOptions::new().read(true)).unwrap();
    assert_eq!(dir.will_need(0, 4096).unwrap_err().errno(), libc::EISDIR);
    // The hinted bytes read back as written, from the buffer.
    let mut back = vec![0u8; 4096];
    r.read_at(&mut back, 8192).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    assert!(d.control().status().unwrap().hints >= 3);
}

#[test]
fn a_persistent_array_without_a_model_takes_hints_too() {
    use libmoneta::{Moneta, OpenOptions};
    let dir = TempDir::new("hint");
    let img = dir.0.join("device.img").display().to_string();
    let d = Daemon::start_raw(&["--device", img.as_str(), "--size", "64M"], dir);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m
        .open(
            "/big",
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap();
    f.write_at(&vec![3u8; 3 << 20], 5).unwrap();
    // The host is asked to read the pages in (unaligned, to the end, and a range larger
    // than the file); the file reads back unchanged.
    f.will_need(1, 0).unwrap();
    f.will_need(4097, 1 << 30).unwrap();
    let mut back = vec![0u8; 3 << 20];
    assert_eq!(f.read_at(&mut back, 5).unwrap(), 3 << 20);
    assert!(back.iter().all(|&b| b == 3));
    assert!(d.control().status().unwrap().hints >= 2);
    assert_eq!(d.control().model().unwrap().get("model"), Some("none"));
}
