//! The device through real processes: a `monetad` per test, clients in this process and in
//! child processes.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use libmoneta::{Channel, ClientError, Tag};
use moneta_abi::control::{errno, Grant, RIGHT_READ};
use moneta_abi::{Command, Completion, Opcode, Status};

const MODES: [Completion; 3] = [Completion::Dma, Completion::Forward, Completion::Sleep];

/// Entry point of child processes started with `spawn_role`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    let code = match role.as_str() {
        "hostile" => hostile_client(&args),
        "dies-mid-request" => dies_mid_request(&args),
        "other-user" => other_user(&args),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

#[test]
fn reads_and_writes_any_size_and_alignment_in_every_mode() {
    let d = Daemon::start(&[]);
    let ch = d.channel();
    let ctl = d.control();
    grant(&ctl, ch.id(), 0, 8 << 20, true, 1);
    let cases: [(u64, usize); 7] = [
        (0, 1),
        (1, 511),
        (4095, 2),
        (12345, 4096),
        (100_000, 16 << 10),
        (777, (16 << 10) + 1),
        (3 << 20, 200_000),
    ];
    for (i, mode) in MODES.into_iter().enumerate() {
        for &(addr, len) in &cases {
            let data = pattern(i as u8 + 1, addr, len);
            ch.write(addr, &data, mode).unwrap();
            let mut back = vec![0u8; len];
            ch.read(addr, &mut back, mode).unwrap();
            assert_eq!(back, data, "mode {mode:?} addr {addr} len {len}");
        }
        assert_eq!(ch.nop(mode).unwrap().status, Status::Ok);
        ch.flush(0, 8 << 20, mode).unwrap();
        ch.flush(0, 0, mode).unwrap();
    }
    let s = ctl.status().unwrap();
    assert!(s.bytes_written > 0 && s.bytes_read == s.bytes_written);
    assert_eq!(s.command_errors, 0);
    assert_eq!(s.channels_open, 1);
}

#[test]
fn a_flush_that_writes_back_says_it_waits_on_a_thread_of_the_daemon() {
    let d = Daemon::start(&[]);
    let ch = d.channel();
    grant(&d.control(), ch.id(), 0, 1 << 20, true, 1);
    ch.write(0, &pattern(3, 0, 4096), Completion::Dma).unwrap();
    let tag = ch.tag();
    ch.submit(
        tag,
        &Command::new(Opcode::Flush, Completion::Dma, 0, 1 << 20, 0),
    );
    let seq = (ch.slot(tag).command.words[0].load(Ordering::Relaxed) >> 32) as u32;
    assert_eq!(ch.wait(tag, Completion::Dma).unwrap().status, Status::Ok);
    // The flusher thread's write-back has no completion time: a waiter should sleep.
    let st = &ch.slot(tag).status;
    assert_eq!(st.eta_seq.load(Ordering::Acquire), seq);
    assert_eq!(st.eta_ns.load(Ordering::Relaxed), moneta_abi::ETA_AWAY);
    ch.release(tag);
    // A NOP has nothing to wait for and says nothing (the mark left on the tag is the
    // flush's: it names the flush's sequence number).
    let tag = ch.tag();
    ch.submit(tag, &Command::new(Opcode::Nop, Completion::Dma, 0, 0, 0));
    let nop = (ch.slot(tag).command.words[0].load(Ordering::Relaxed) >> 32) as u32;
    assert_eq!(ch.wait(tag, Completion::Dma).unwrap().status, Status::Ok);
    assert_ne!(ch.slot(tag).status.eta_seq.load(Ordering::Acquire), nop);
    ch.release(tag);
}

#[test]
fn a_command_may_span_consecutive_slices() {
    let d = Daemon::start(&[]);
    let ch = d.channel();
    grant(&d.control(), ch.id(), 0, 1 << 20, true, 1);
    // Tag 62 with 32 KiB runs into tag 63's slice: allowed, up to the end of the buffer.
    let tag = Tag(62);
    let data = pattern(9, 0, 32 << 10);
    ch.write_dma(tag, 0, &data);
    let cmd = Command {
        opcode: Opcode::Write,
        completion: Completion::Dma,
        addr: 4096,
        len: data.len() as u64,
        cookie: 5,
        seq: 0,
        file: 0,
        barrier: false,
        epoch: 0,
    };
    assert_eq!(ch.run(tag, &cmd).unwrap().status, Status::Ok);
    let mut back = vec![0u8; data.len()];
    ch.read(4096, &mut back, Completion::Dma).unwrap();
    assert_eq!(back, data);
    // One byte more leaves the buffer.
    let too_long = Command {
        len: (32 << 10) + 1,
        ..cmd
    };
    assert_eq!(ch.run(tag, &too_long).unwrap().status, Status::BadDma);
}

#[test]
fn the_permission_table_decides_every_request() {
    let d = Daemon::start(&[]);
    let ch = d.channel();
    let ctl = d.control();
    let mut buf = [0u8; 100];
    // A new channel has no permissions.
    for mode in MODES {
        match ch.read(0, &mut buf, mode) {
            Err(ClientError::Status(Status::PermissionMiss)) => {}
            other => panic!("expected a permission miss, got {other:?}"),
        }
    }
    grant(&ctl, ch.id(), 4096, 4096, false, 7);
    ch.read(4096, &mut buf, Completion::Dma).unwrap();
    assert!(matches!(
        ch.write(4096, &buf, Completion::Dma),
        Err(ClientError::Status(Status::PermissionDenied))
    ));
    // A range running past the record is a miss, not a partial success.
    assert!(matches!(
        ch.read(8192 - 50, &mut buf, Completion::Dma),
        Err(ClientError::Status(Status::PermissionMiss))
    ));
    // Upgrading rights over part of the range splits the record.
    grant(&ctl, ch.id(), 4096, 100, true, 7);
    ch.write(4096, &buf, Completion::Dma).unwrap();
    assert!(ch.write(4096 + 100, &buf[..1], Completion::Dma).is_err());
    ctl.revoke(ch.id(), 4096, 4096).unwrap();
    assert!(matches!(
        ch.read(4096, &mut buf, Completion::Dma),
        Err(ClientError::Status(Status::PermissionMiss))
    ));
    grant(&ctl, ch.id(), 0, 4096, true, 3);
    ctl.revoke_file(ch.id(), 3).unwrap();
    assert!(ch.read(0, &mut buf, Completion::Dma).is_err());
    // Grants outside the array or to channels that do not exist are refused with errnos.
    let refused = |g: Grant| match ctl.grant(g) {
        Err(ClientError::Refused { errno, .. }) => errno,
        other => panic!("expected refusal, got {other:?}"),
    };
    let g = Grant {
        channel: ch.id(),
        rights: RIGHT_READ,
        start: (64 << 20) - 10,
        len: 11,
        file: 0,
    };
    assert_eq!(refused(g), errno::ERANGE);
    assert_eq!(
        refused(Grant {
            channel: 999,
            start: 0,
            len: 1,
            ..g
        }),
        errno::ENOENT
    );
    // Addresses at the very top of the address space are refused, not wrapped.
    let mut big = vec![0u8; 40_000];
    assert!(matches!(
        ch.read(u64::MAX - 20_000, &mut big, Completion::Dma),
        Err(ClientError::Status(Status::OutOfRange))
    ));
    let s = ctl.status().unwrap();
    assert!(s.permission_misses >= 5 && s.permission_denials >= 1);
}

#[test]
fn malformed_commands_get_distinct_statuses_and_error_entries() {
    let d = Daemon::start(&[]);
    let ch = d.channel();
    grant(&d.control(), ch.id(), 0, 1 << 20, true, 1);
    let t = Tag(3);
    let good = Command {
        opcode: Opcode::Read,
        completion: Completion::Forward,
        addr: 0,
        len: 512,
        cookie: 0xc0ffee,
        seq: 0,
        file: 0,
        barrier: false,
        epoch: 0,
    }
    .to_words();
    let cases: Vec<([u64; 8], Status)> = vec![
        (
            {
                let mut w = good;
                w[0] = (w[0] & !0xffff) | 77;
                w
            },
            Status::Malformed,
        ),
        (
            {
                let mut w = good;
                // Flag bit 3 is not one the device knows.
                w[0] |= 1 << 19;
                w
            },
            Status::Malformed,
        ),
        (
            {
                let mut w = good;
                w[6] = 1;
                w
            },
            Status::Malformed,
        ),
        (
            {
                let mut w = good;
                w[2] = 0;
                w
            },
            Status::Malformed,
        ),
        (
            {
                let mut w = good;
                w[2] = 2 << 20;
                w
            },
            Status::BadDma,
        ),
        (
            {
                let mut w = good;
                w[1] = 64 << 20;
                w
            },
            Status::OutOfRange,
        ),
        (
            {
                let mut w = good;
                w[1] = u64::MAX - 10;
                w
            },
            Status::OutOfRange,
        ),
        (
            {
                let mut w = good;
                w[1] = 2 << 20;
                w
            },
            Status::PermissionMiss,
        ),
    ];
    for (i, (words, want)) in cases.iter().enumerate() {
        // Each command carries its own sequence number, so its completion is told apart.
        let mut words = *words;
        words[0] = (words[0] & 0xffff_ffff) | ((i as u64 + 1) << 32);
        ch.submit_words(t, &words);
        let c = ch.wait(t, Completion::Forward).unwrap();
        assert_eq!(c.status, *want, "{words:x?}");
        let e = ch.pop_error().expect("forwarded errors are queued");
        assert_eq!((e.status, e.tag, e.channel), (*want as u32, 3, ch.id()));
        assert_eq!(e.cookie, 0xc0ffee);
    }
    // Completion mode 3 does not exist: malformed, answered as a DMA completion.
    let mut w = good;
    w[0] |= (3 << 16) | (100 << 32);
    ch.submit_words(t, &w);
    assert_eq!(
        ch.wait(t, Completion::Dma).unwrap().status,
        Status::Malformed
    );
    assert!(
        ch.pop_error().is_none(),
        "DMA completions report in the status entry only"
    );
}

#[test]
fn ringing_a_busy_tag_is_reported_in_the_error_queue() {
    // The read stays in flight for 500 ms: long enough that the second ring, 5 ms after the
    // first, finds it busy even on a loaded machine.
    let d = Daemon::start(&["--read-latency-ns", "500000000"]);
    let ch = d.channel();
    grant(&d.control(), ch.id(), 0, 1 << 20, true, 1);
    let cmd = Command {
        opcode: Opcode::Read,
        completion: Completion::Dma,
        addr: 0,
        len: 64,
        cookie: 1,
        seq: 0,
        file: 0,
        barrier: false,
        epoch: 0,
    };
    ch.submit(Tag(0), &cmd);
    // Wait until the device has taken the command: a second flip of the doorbell before it
    // looks would cancel the first (a flip register), on a loaded machine too.
    let ctl = d.control();
    let t = std::time::Instant::now();
    // (The read holds its physical tag until it completes, 500 ms later.)
    while ctl.status().unwrap().phys_tags_in_use == 0 {
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "the device did not take the command in time"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Rewrite the command and ring again while the first is in flight.
    let evil = Command {
        addr: 32 << 20,
        cookie: 2,
        seq: 99,
        ..cmd
    };
    for (a, w) in ch.slot(Tag(0)).command.words.iter().zip(evil.to_words()) {
        a.store(w, Ordering::Relaxed);
    }
    ch.ring(1);
    let c = ch.wait(Tag(0), Completion::Dma).unwrap();
    assert_eq!((c.status, c.bytes), (Status::Ok, 64));
    let e = ch.pop_error().expect("tag-busy entry");
    assert_eq!((e.status, e.cookie), (Status::TagBusy as u32, 2));
}

#[test]
fn the_retag_unit_makes_requests_wait_for_physical_tags() {
    let d = Daemon::start(&["--phys-tags", "2", "--read-latency-ns", "2000000"]);
    let ch = d.channel();
    let ctl = d.control();
    grant(&ctl, ch.id(), 0, 1 << 20, true, 1);
    let data = pattern(4, 0, 64 * 512);
    ch.write(0, &data, Completion::Dma).unwrap();
    for t in 0..64u8 {
        let cmd = Command {
            opcode: Opcode::Read,
            completion: Completion::Sleep,
            addr: u64::from(t) * 512,
            len: 512,
            cookie: u64::from(t),
            seq: 0,
            file: 0,
            barrier: false,
            epoch: 0,
        };
        ch.prepare(Tag(t), &cmd);
    }
    ch.ring(u64::MAX); // all 64 at once
    let mut back = vec![0u8; 512];
    for t in 0..64u8 {
        let c = ch.wait(Tag(t), Completion::Sleep).unwrap();
        assert_eq!(c.status, Status::Ok);
        ch.read_dma(Tag(t), 0, &mut back);
        assert_eq!(back, data[t as usize * 512..][..512]);
    }
    let s = ctl.status().unwrap();
    assert!(s.retag_stalls >= 60, "stalls {}", s.retag_stalls);
    assert_eq!(s.phys_tags, 2);
    assert_eq!(s.phys_tags_in_use, 0);
}

#[test]
fn a_full_table_evicts_and_the_owner_sees_a_permission_miss() {
    let d = Daemon::start(&["--table-entries", "4"]);
    let ch = d.channel();
    let ctl = d.control();
    for i in 0..5u64 {
        grant(&ctl, ch.id(), i * 8192, 4096, true, i);
    }
    let mut buf = [0u8; 16];
    let misses: Vec<u64> = (0..5u64)
        .filter(|i| {
            matches!(
                ch.read(i * 8192, &mut buf, Completion::Dma),
                Err(ClientError::Status(Status::PermissionMiss))
            )
        })
        .collect();
    assert_eq!(misses.len(), 1, "exactly one record was evicted");
    assert_eq!(ch.header().evictions.load(Ordering::Relaxed), 1);
    let s = ctl.status().unwrap();
    assert_eq!((s.table_used, s.table_evictions), (4, 1));
    // The hard miss is repaired by asking again.
    grant(&ctl, ch.id(), misses[0] * 8192, 4096, true, misses[0]);
    ch.read(misses[0] * 8192, &mut buf, Completion::Dma)
        .unwrap();
}

#[test]
fn adjacent_grants_merge_unless_disabled() {
    for (flags, want) in [(&[][..], 1u64), (&["--no-merge"][..], 3)] {
        let d = Daemon::start(flags);
        let ch = d.channel();
        let ctl = d.control();
        for i in 0..3u64 {
            grant(&ctl, ch.id(), i * 4096, 4096, true, 1);
        }
        assert_eq!(ctl.status().unwrap().table_used, want);
        let mut buf = vec![0u8; 3 * 4096];
        ch.read(0, &mut buf, Completion::Dma).unwrap();
    }
}

#[test]
fn revocation_waits_for_requests_in_flight() {
    let d = Daemon::start(&["--read-latency-ns", "200000000"]);
    let ch = d.channel();
    let ctl = d.control();
    grant(&ctl, ch.id(), 0, 1 << 20, true, 1);
    let cmd = Command {
        opcode: Opcode::Read,
        completion: Completion::Sleep,
        addr: 0,
        len: 4096,
        cookie: 0,
        seq: 0,
        file: 0,
        barrier: false,
        epoch: 0,
    };
    let start = Instant::now();
    ch.submit(Tag(5), &cmd);
    std::thread::sleep(Duration::from_millis(20));
    ctl.revoke(ch.id(), 0, 1 << 20).unwrap();
    let revoked_after = start.elapsed();
    // The revocation answered only once the read (200 ms of media time) had completed.
    assert!(ch.poll(Tag(5), Completion::Sleep).is_some());
    assert!(
        revoked_after >= Duration::from_millis(150),
        "{revoked_after:?}"
    );
    assert_eq!(
        ch.wait(Tag(5), Completion::Sleep).unwrap().status,
        Status::Ok
    );
    let mut b = [0u8; 1];
    assert!(ch.read(0, &mut b, Completion::Dma).is_err());
}

#[test]
fn channels_are_limited_and_the_extra_one_is_refused_clearly() {
    raise_nofile();
    let d = Daemon::start(&["--dma-size", "256K", "--slice-size", "4K"]);
    let mut chans = Vec::new();
    for _ in 0..1024 {
        chans.push(d.channel());
    }
    match Channel::open(&d.socket) {
        Err(ClientError::Refused { errno, message }) => {
            assert_eq!(errno, errno::EMFILE);
            assert!(message.contains("1024 channels"), "{message}");
        }
        other => panic!("the 1025th channel must be refused, got {:?}", other.err()),
    }
    // One more connection without a channel still gets answers.
    assert_eq!(d.control().status().unwrap().channels_open, 1024);
    // Closing one frees a slot.
    chans.pop();
    let t = Instant::now();
    loop {
        match Channel::open(&d.socket) {
            Ok(c) => {
                chans.push(c);
                break;
            }
            Err(_) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("slot not freed: {e}"),
        }
    }
    // Every channel works.
    let ctl = d.control();
    for c in chans.iter().step_by(97) {
        grant(&ctl, c.id(), u64::from(c.id()) * 4096, 4096, true, 0);
        c.write(
            u64::from(c.id()) * 4096,
            &[c.id() as u8; 4096],
            Completion::Dma,
        )
        .unwrap();
    }
}

#[test]
fn a_connection_holds_one_channel() {
    let d = Daemon::start(&["--max-channels", "4"]);
    let ch = d.channel();
    match ch.control().open_channel_raw() {
        Err(ClientError::Refused { errno, .. }) => assert_eq!(errno, errno::EEXIST),
        other => panic!("second channel on one connection: {:?}", other.err()),
    }
}

#[test]
fn malformed_control_messages_get_eproto_and_the_daemon_goes_on() {
    let d = Daemon::start(&[]);
    let ctl = d.control();
    let bad: Vec<Vec<u8>> = vec![
        vec![],
        vec![1, 2, 3],
        b"MNCP\x01\x00\x05\x00\x01\x00\x00\x00\xff\x00\x00\x00".to_vec(),
        b"XXXX\x01\x00\x07\x00\x01\x00\x00\x00\x00\x00\x00\x00".to_vec(),
        b"MNCP\x09\x00\x07\x00\x01\x00\x00\x00\x00\x00\x00\x00".to_vec(),
        vec![0x55; 5000],
    ];
    for msg in &bad {
        if msg.is_empty() {
            continue; // a zero-length packet reads as end-of-file on SOCK_SEQPACKET
        }
        ctl.send_raw(msg).unwrap();
        let (reply, _) = ctl.recv_raw().unwrap();
        let result = i32::from_le_bytes(reply[16..20].try_into().unwrap());
        assert_eq!(result, -errno::EPROTO, "{msg:x?}");
    }
    ctl.ping().unwrap();
    // A connection that keeps sending garbage is dropped; others are unaffected.
    let noisy = d.control();
    let mut dropped = false;
    for _ in 0..200 {
        if noisy.send_raw(b"garbage").is_err() || noisy.recv_raw().is_err() {
            dropped = true;
            break;
        }
    }
    assert!(dropped);
    ctl.ping().unwrap();
}

#[test]
fn non_owners_cannot_administer() {
    if !can_setuid("non_owners_cannot_administer") {
        return;
    }
    // A daemon that serves other users: its socket open to all, in a directory they can search.
    let d = Daemon::start(&["--socket-mode", "666"]);
    std::fs::set_permissions(
        &d.dir.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut child = spawn_role_as(65534, "other-user", &[d.socket.display().to_string()]);
    assert!(child.wait().unwrap().success());
    d.control().ping().unwrap();
}

fn other_user(args: &[String]) -> i32 {
    let socket = std::path::Path::new(&args[0]);
    let ch = Channel::open(socket).expect("anyone may open a channel");
    let g = Grant {
        channel: ch.id(),
        rights: RIGHT_READ,
        start: 0,
        len: 4096,
        file: 0,
    };
    match ch.control().grant(g) {
        Err(ClientError::Refused { errno, .. }) if errno == errno::EPERM => {}
        other => {
            eprintln!("grant by another user: {other:?}");
            return 1;
        }
    }
    for r in [
        ch.control().revoke(0, 0, 1),
        ch.control().revoke_file(0, 0),
        ch.control().shutdown(),
    ] {
        if !matches!(r, Err(ClientError::Refused { errno, .. }) if errno == errno::EPERM) {
            eprintln!("administration by another user: {r:?}");
            return 1;
        }
    }
    let mut b = [0u8; 8];
    if !matches!(
        ch.read(0, &mut b, Completion::Dma),
        Err(ClientError::Status(Status::PermissionMiss))
    ) {
        return 1;
    }
    ch.control().status().expect("anyone may read the counters");
    0
}

#[test]
fn a_killed_client_loses_its_channel_and_nothing_else_is_disturbed() {
    let d = Daemon::start(&["--read-latency-ns", "1000000"]);
    let ctl = d.control();
    let keeper = d.channel();
    grant(&ctl, keeper.id(), 0, 1 << 20, true, 1);
    let data = pattern(7, 0, 1 << 20);
    keeper.write(0, &data, Completion::Dma).unwrap();
    let before = ctl.status().unwrap();
    let mut child = spawn_role("dies-mid-request", &[d.socket.display().to_string()]);
    // The child prints its channel id once it is busy, then we kill it mid-request.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    loop {
        let s = ctl.status().unwrap();
        // Its physical tags come back as its requests in flight end, which may be just after
        // the channel is counted as reclaimed.
        if s.channels_reclaimed > before.channels_reclaimed && s.phys_tags_in_use == 0 {
            assert_eq!(s.channels_open, before.channels_open);
            assert_eq!(s.table_used, before.table_used);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "channel not reclaimed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut back = vec![0u8; 1 << 20];
    keeper.read(0, &mut back, Completion::Dma).unwrap();
    assert_eq!(back, data);
}

fn dies_mid_request(args: &[String]) -> i32 {
    let ch = Channel::open(std::path::Path::new(&args[0])).unwrap();
    grant(ch.control(), ch.id(), 2 << 20, 1 << 20, true, 2);
    // Keep many slow requests in flight until killed.
    loop {
        for t in 0..64u8 {
            let cmd = Command {
                opcode: Opcode::Read,
                completion: Completion::Sleep,
                addr: (2 << 20) + u64::from(t) * 4096,
                len: 4096,
                cookie: 0,
                seq: 0,
                file: 0,
                barrier: false,
                epoch: 0,
            };
            ch.submit(Tag(t), &cmd);
        }
        for t in 0..64u8 {
            let _ = ch.wait(Tag(t), Completion::Sleep);
        }
    }
}

#[test]
fn a_hostile_client_gets_errors_and_nothing_else() {
    let d = Daemon::start(&[]);
    let ctl = d.control();
    let victim = d.channel();
    // The victim owns [0, 4 MiB); the hostile client is granted [8 MiB, 9 MiB) only.
    grant(&ctl, victim.id(), 0, 4 << 20, true, 1);
    let secret = pattern(0xA5, 0, 4 << 20);
    victim.write(0, &secret, Completion::Dma).unwrap();
    let mut hostile = spawn_role("hostile", &[d.socket.display().to_string()]);
    // Serve the victim correctly the whole time.
    let mut rounds = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    while hostile.try_wait().unwrap().is_none() {
        let off = (rounds * 4099) % ((4 << 20) - (64 << 10));
        victim
            .read(off, &mut buf, MODES[rounds as usize % 3])
            .unwrap();
        assert_eq!(buf, secret[off as usize..][..buf.len()]);
        rounds += 1;
    }
    let status = hostile.wait().unwrap();
    assert!(
        status.success(),
        "hostile client reported a breach: {status}"
    );
    assert!(rounds > 10);
    let mut all = vec![0u8; 4 << 20];
    victim.read(0, &mut all, Completion::Dma).unwrap();
    assert!(all == secret, "the victim's data changed");
    ctl.ping().unwrap();
    let s = ctl.status().unwrap();
    // The hostile client rings 3000 commands without waiting (and storms of flips that cancel
    // out): how many the poller sees depends on scheduling, but hundreds must have reached it.
    assert!(
        s.command_errors > 300,
        "command errors: {}",
        s.command_errors
    );
    assert_eq!(s.channels_open, 1, "the hostile channel was reclaimed");
}

fn hostile_client(args: &[String]) -> i32 {
    use rand::{Rng, SeedableRng};
    let socket = std::path::Path::new(&args[0]);
    let ch = Channel::open(socket).unwrap();
    let ctl = ch.control();
    grant(ctl, ch.id(), 8 << 20, 1 << 20, true, 9);
    // MONETA_TEST_SEED=N reproduces a run.
    let seed: u64 = std::env::var("MONETA_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("hostile client seed {seed} (set MONETA_TEST_SEED to repeat)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let secret_probe = pattern(0xA5, 0, 64);
    let leaked = |ch: &Channel| {
        let mut dma = vec![0u8; ch.info().dma_size as usize];
        ch.read_dma(Tag(0), 0, &mut dma);
        dma.windows(64).any(|w| w == secret_probe.as_slice())
    };
    // 1. The memfd cannot be resized.
    if rustix::fs::ftruncate(ch.memfd(), 4096).is_ok()
        || rustix::fs::ftruncate(ch.memfd(), 1 << 30).is_ok()
    {
        eprintln!("channel memfd could be resized");
        return 2;
    }
    // 1b. Its kick descriptor is its own: making it blocking and reading it gets nothing from
    // the device's end (and so cannot block the poller).
    rustix::fs::fcntl_setfl(ch.kick_fd(), rustix::fs::OFlags::empty()).unwrap();
    let mut b8 = [0u8; 8];
    if rustix::io::read(ch.kick_fd(), &mut b8).is_ok() {
        eprintln!("the kick descriptor is readable by the client");
        return 10;
    }
    for _ in 0..1000 {
        ch.kick();
    }
    // 2. Reads and writes of the victim's range fail with a permission miss.
    for mode in MODES {
        let mut b = vec![0u8; 4096];
        match ch.read(0, &mut b, mode) {
            Err(ClientError::Status(Status::PermissionMiss)) => {}
            other => {
                eprintln!("read of victim range: {other:?}");
                return 3;
            }
        }
        if b.iter().any(|&x| x != 0) || leaked(&ch) {
            return 4;
        }
        if ch.write(100, &[0xEE; 512], mode).is_ok() {
            return 5;
        }
    }
    // 3. Random and forged commands on random tags, with storms of doorbell rings.
    let interesting = [
        0u64,
        1,
        4095,
        4 << 20,
        (8 << 20) - 1,
        8 << 20,
        (9 << 20) - 1,
        9 << 20,
        64 << 20,
        u64::MAX,
        u64::MAX - 4095,
        1 << 63,
    ];
    for round in 0..3000u32 {
        let tag = rng.gen_range(0..64u8);
        let mut w = [0u64; 8];
        let op: u64 = if rng.gen_bool(0.8) {
            rng.gen_range(0..5)
        } else {
            rng.gen()
        };
        let flags: u64 = if rng.gen_bool(0.9) {
            rng.gen_range(0..3)
        } else {
            rng.gen_range(0..0xffff)
        };
        w[0] = (op & 0xffff) | (flags << 16);
        if rng.gen_bool(0.05) {
            w[0] |= rng.gen::<u64>() << 32;
        }
        w[1] = if rng.gen_bool(0.7) {
            interesting[rng.gen_range(0..interesting.len())].wrapping_add(rng.gen_range(0..8192))
        } else {
            rng.gen()
        };
        w[2] = match rng.gen_range(0..4) {
            0 => rng.gen_range(1..512),
            1 => rng.gen_range(1..(2 << 20)),
            2 => interesting[rng.gen_range(0..interesting.len())],
            _ => rng.gen(),
        };
        w[3] = u64::from(round);
        if rng.gen_bool(0.05) {
            w[4 + rng.gen_range(0..4)] = rng.gen();
        }
        ch.submit_words(Tag(tag), &w);
        if rng.gen_bool(0.3) {
            // Rewrite the command after ringing, towards the victim's range.
            let slot = ch.slot(Tag(tag));
            slot.command.words[1].store(rng.gen_range(0..4 << 20), Ordering::Relaxed);
            slot.command.words[0].store(u64::from(moneta_abi::OP_READ), Ordering::Relaxed);
        }
        if rng.gen_bool(0.1) {
            // A storm: ring random bits, many times.
            for _ in 0..rng.gen_range(1..200) {
                ch.ring(rng.gen());
            }
        }
        if rng.gen_bool(0.02) {
            ch.kick();
        }
        // Scribble over registers the device writes.
        if rng.gen_bool(0.05) {
            let h = ch.header();
            h.err_tail.store(rng.gen(), Ordering::Relaxed);
            h.parked.store(rng.gen(), Ordering::Relaxed);
            ch.slot(Tag(tag))
                .status
                .waiter
                .store(rng.gen(), Ordering::Relaxed);
        }
        // Give the device a moment now and then, and look for leaked bytes.
        if round % 100 == 0 {
            std::thread::sleep(Duration::from_millis(2));
            if leaked(&ch) {
                eprintln!("victim bytes appeared in the hostile DMA buffer");
                return 6;
            }
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    if leaked(&ch) {
        return 7;
    }
    // 4. The daemon still serves this client's own range correctly.
    ch.header().err_tail.store(
        ch.header().err_head.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    // Tags may still be in flight from the storm: wait until the device is quiet.
    std::thread::sleep(Duration::from_millis(100));
    let mine = pattern(3, 8 << 20, 100_000);
    if ch.write(8 << 20, &mine, Completion::Dma).is_err() {
        eprintln!("own write failed");
        return 8;
    }
    let mut back = vec![0u8; mine.len()];
    ch.read(8 << 20, &mut back, Completion::Sleep).unwrap();
    if back != mine {
        return 9;
    }
    // 5. Close the socket with requests in flight.
    for t in 0..64u8 {
        ch.submit(
            Tag(t),
            &Command {
                opcode: Opcode::Read,
                completion: Completion::Sleep,
                addr: 8 << 20,
                len: 16 << 10,
                cookie: 0,
                seq: 0,
                file: 0,
                barrier: false,
                epoch: 0,
            },
        );
    }
    drop(ch);
    0
}

#[test]
fn an_idle_daemon_sleeps() {
    let d = Daemon::start(&["--park-after-us", "1000"]);
    let ch = d.channel();
    let ctl = d.control();
    grant(&ctl, ch.id(), 0, 4096, true, 1);
    ch.write(0, &[1; 64], Completion::Dma).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let s1 = ctl.status().unwrap();
    let t1 = d.cpu_ticks();
    std::thread::sleep(Duration::from_millis(1500));
    let t2 = d.cpu_ticks();
    let s2 = ctl.status().unwrap();
    assert!(s1.parks >= 1, "the channel was parked");
    assert!(s1.poller_sleeps >= 1);
    // A sleeping poller wakes only for our two status calls: a handful of wake-ups, and (in
    // clock ticks of 10 ms) next to no CPU.
    assert!(s2.poller_wakeups - s1.poller_wakeups <= 10);
    assert!(t2 - t1 <= 2, "idle daemon used {} ticks in 1.5 s", t2 - t1);
    // A parked channel is woken by its kick.
    assert_eq!(
        ch.header().parked.load(Ordering::Relaxed),
        moneta_abi::PARKED
    );
    let mut b = [0u8; 64];
    ch.read(0, &mut b, Completion::Dma).unwrap();
    assert_eq!(b, [1; 64]);
}

/// Channels are served in turn: a request of one channel waits for at most a request or two
/// of another channel that has all 64 tags queued, not for all of them (Moneta §IV's
/// round-robin, between channels). One physical tag and a modelled read latency of 50 µs make
/// the queue visible in each command's `device_ns`.
#[test]
fn channels_take_turns_for_physical_tags() {
    let d = Daemon::start(&["--phys-tags", "1", "--read-latency-ns", "50000"]);
    let ctl = d.control();
    let (hog, small) = (d.channel(), d.channel());
    grant(&ctl, hog.id(), 0, 4 << 20, false, 1);
    grant(&ctl, small.id(), 0, 4 << 20, false, 1);
    let read = |addr: u64| Command {
        opcode: Opcode::Read,
        completion: Completion::Dma,
        addr,
        len: 16 << 10,
        cookie: 0,
        seq: 0,
        file: 0,
        barrier: false,
        epoch: 0,
    };
    // The hog queues 64 commands, then the other channel one.
    let mut bits = 0u64;
    for t in 0..64u8 {
        hog.prepare(Tag(t), &read(u64::from(t) * (16 << 10)));
        bits |= 1 << t;
    }
    hog.ring(bits);
    std::thread::sleep(Duration::from_millis(1));
    let c = small.run(Tag(0), &read(0)).unwrap();
    assert_eq!(c.status, Status::Ok);
    let hog_times: Vec<u64> = (0..64u8)
        .map(|t| hog.wait(Tag(t), Completion::Dma).unwrap().device_ns)
        .collect();
    let last = *hog_times.iter().max().unwrap();
    // In arrival order the small read would wait for the hog's 64 (3.2 ms of latency); in
    // turn, for what is in flight and one more.
    assert!(last > 3_000_000, "the hog's last read took {last} ns");
    assert!(
        c.device_ns < 500_000,
        "the other channel's read waited {} ns behind the hog",
        c.device_ns
    );
}

/// Threads waiting for a tag get the tags released while they sleep, each one, none lost:
/// every tag taken, eight threads waiting, and the tags given back one at a time.
#[test]
fn tags_released_while_threads_wait_reach_every_waiter() {
    let d = Daemon::start(&[]);
    let ch = d.channel();
    let held: Vec<Tag> = (0..64).map(|_| ch.try_tag().expect("a free tag")).collect();
    assert!(ch.try_tag().is_none());
    let got = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let t = ch.tag();
                got.lock().unwrap().push(t);
            });
        }
        // Let them go to sleep, then release one tag at a time.
        std::thread::sleep(Duration::from_millis(50));
        for (i, t) in held.iter().take(8).enumerate() {
            ch.release(*t);
            let deadline = Instant::now() + Duration::from_secs(5);
            while got.lock().unwrap().len() <= i {
                assert!(
                    Instant::now() < deadline,
                    "a released tag reached no waiter"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let mut got = got.into_inner().unwrap();
    got.sort_by_key(|t| t.0);
    let mut want: Vec<Tag> = held[..8].to_vec();
    want.sort_by_key(|t| t.0);
    assert_eq!(got, want);
    // Nothing is stranded: with no waiter left, released tags are free again.
    for t in got.into_iter().chain(held[8..].iter().copied()) {
        ch.release(t);
    }
    let again: Vec<Tag> = std::iter::from_fn(|| ch.try_tag()).collect();
    assert_eq!(again.len(), 64);
    for t in again {
        ch.release(t);
    }
}

/// A client that closes its end of the kick pipe cannot keep the daemon awake (a pipe without
/// writers reports a hang-up on every wait); its parked channel is still served when the
/// device wakes for something else.
#[test]
fn a_closed_kick_pipe_does_not_keep_the_daemon_awake() {
    let d = Daemon::start(&["--park-after-us", "1000"]);
    let ch = d.channel();
    let ctl = d.control();
    grant(&ctl, ch.id(), 0, 4096, true, 1);
    ch.write(0, &[7; 64], Completion::Dma).unwrap();
    // Closes the pipe's only write end (the number now names /dev/null).
    {
        use std::os::fd::AsRawFd;
        let null = std::fs::File::open("/dev/null").unwrap();
        // SAFETY: replaces a descriptor the channel owns with another open file.
        assert!(unsafe { libc::dup2(null.as_raw_fd(), ch.kick_fd().as_raw_fd()) } >= 0);
    }
    std::thread::sleep(Duration::from_millis(200));
    let t1 = d.cpu_ticks();
    std::thread::sleep(Duration::from_millis(1500));
    let t2 = d.cpu_ticks();
    // 1.5 s is 150 ticks of 10 ms; a spinning poller takes nearly all of them.
    assert!(t2 - t1 <= 15, "the daemon used {} ticks in 1.5 s", t2 - t1);
    assert_eq!(
        ch.header().parked.load(Ordering::Relaxed),
        moneta_abi::PARKED
    );
    // A command rung now cannot kick the poller awake; the next control request does, and
    // the channel is looked at then.
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut b = [0u8; 64];
            ch.read(0, &mut b, Completion::Dma).map(|()| b)
        });
        std::thread::sleep(Duration::from_millis(100));
        grant(&ctl, ch.id(), 4096, 4096, true, 1);
        assert_eq!(reader.join().unwrap().unwrap(), [7; 64]);
    });
}

#[test]
fn a_killed_daemon_restarts_with_every_completed_write() {
    let dir = TempDir::new("persist");
    let img = dir.0.join("array.img");
    let img_s = img.display().to_string();
    let mut d = Daemon::start_raw(&["--device", &img_s, "--size", "32M", "--raw"], dir);
    let data = pattern(0x3c, 0, 3 << 20);
    {
        let ch = d.channel();
        grant(&d.control(), ch.id(), 0, 32 << 20, true, 1);
        for (i, chunk) in data.chunks(100_003).enumerate() {
            ch.write((i * 100_003) as u64, chunk, MODES[i % 3]).unwrap();
        }
        d.kill9();
    }
    // The size may be omitted for an existing file; a different size is refused.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--device", &img_s, "--size", "64M", "--raw", "--socket"])
        .arg(d.dir.0.join("other.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds 33554432 bytes"));
    d.args = vec!["--device".into(), img_s.clone(), "--raw".into()];
    d.spawn();
    let ch = d.channel();
    grant(&d.control(), ch.id(), 0, 32 << 20, true, 1);
    let mut back = vec![0u8; data.len()];
    ch.read(0, &mut back, Completion::Dma).unwrap();
    assert!(back == data, "completed writes survive kill -9");
}

#[test]
fn once_a_wait_finds_the_daemon_dead_later_calls_fail_at_once() {
    let mut d = Daemon::start(&[]);
    let ch = d.channel();
    grant(&d.control(), ch.id(), 0, 4096, true, 1);
    ch.write(0, &[1; 4096], Completion::Dma).unwrap();
    d.kill9();
    let mut b = [0u8; 64];
    // The first wait learns it, within the liveness interval (200 ms)...
    assert!(matches!(
        ch.read(0, &mut b, Completion::Dma),
        Err(ClientError::DeviceGone)
    ));
    // ...and no later one waits for it again: commands in every completion mode, and a file
    // call through the channel (which used to wait, then try the socket). Each of these took
    // a liveness interval before.
    let t = Instant::now();
    for i in 0..30 {
        assert!(matches!(
            ch.read(0, &mut b, MODES[i % 3]),
            Err(ClientError::DeviceGone)
        ));
    }
    // A file call is not even sent: the library's connection makes a new one and asks again.
    assert!(matches!(
        ch.fs(moneta_abi::fsproto::FsRequest::Statfs),
        Err(ClientError::Disconnected)
    ));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn clean_shutdown_finishes_and_removes_the_socket() {
    let mut d = Daemon::start(&[]);
    let ch = d.channel();
    grant(&d.control(), ch.id(), 0, 4096, true, 1);
    ch.write(0, &[9; 4096], Completion::Sleep).unwrap();
    // A second daemon on the same socket is refused while the first runs.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--volatile", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("already serving"));
    d.control().shutdown().unwrap();
    let status = d.wait_exit(Duration::from_secs(10)).expect("daemon exits");
    assert!(status.success());
    assert!(!d.socket.exists());
    // The client learns the device is gone instead of hanging.
    let mut b = [0u8; 8];
    assert!(matches!(
        ch.read(0, &mut b, Completion::Sleep),
        Err(ClientError::DeviceGone)
    ));
}

#[test]
fn sigterm_is_a_clean_shutdown() {
    let mut d = Daemon::start(&[]);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(d.pid() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(d.wait_exit(Duration::from_secs(10)).unwrap().success());
    assert!(!d.socket.exists());
}

#[test]
fn many_threads_share_one_channel() {
    let d = Daemon::start(&[]);
    let ch = std::sync::Arc::new(d.channel());
    grant(&d.control(), ch.id(), 0, 16 << 20, true, 1);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let ch = ch.clone();
            std::thread::spawn(move || {
                let base = t << 20;
                for i in 0..200u64 {
                    let addr = base + (i * 4099) % ((1 << 20) - 8192);
                    let data = pattern(t as u8, addr, 1 + (i as usize * 37) % 8000);
                    let mode = MODES[(i % 3) as usize];
                    ch.write(addr, &data, mode).unwrap();
                    let mut back = vec![0u8; data.len()];
                    ch.read(addr, &mut back, mode).unwrap();
                    assert_eq!(back, data);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_socket_directory_others_can_write_is_refused() {
    let dir = TempDir::new("opendir");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--volatile", "--size", "4M", "--socket"])
        .arg(dir.0.join("s.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("writable by others"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The poller's CPUs, once the daemon answers (its socket exists a little before its device
/// runs).
fn poller_cpus(d: &Daemon) -> String {
    d.control().status().expect("the daemon answers");
    thread_cpus(d.pid(), "moneta-poller").expect("the poller thread")
}

#[test]
fn the_poller_runs_on_the_cpu_it_is_given() {
    let allowed = moneta_device::allowed_cpus();
    let all = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string())
        })
        .expect("this process's CPUs");
    // By default the scheduler places it; `auto` takes the last CPU when there are two or
    // more, and none on a single CPU.
    let d = Daemon::start(&[]);
    assert_eq!(poller_cpus(&d), all);
    drop(d);
    let d = Daemon::start(&["--poller-cpu", "auto"]);
    let cpus = poller_cpus(&d);
    match allowed.as_slice() {
        [_, .., last] => assert_eq!(cpus, last.to_string()),
        _ => assert_eq!(cpus, all),
    }
    // The daemon's other threads leave the poller its CPU, and every channel names it.
    let others: Vec<usize> = match allowed.as_slice() {
        [rest @ .., _] if !rest.is_empty() => rest.to_vec(),
        _ => allowed.clone(),
    };
    assert_eq!(
        thread_cpus(d.pid(), "monetad").as_deref(),
        Some(moneta_device::cpu_list(&others).as_str())
    );
    let ch = Channel::open(&d.socket).unwrap();
    assert_eq!(
        ch.device_cpu(),
        (allowed.len() >= 2).then(|| allowed[allowed.len() - 1])
    );
    drop(ch);
    drop(d);
    // Named explicitly, and left to the scheduler with `none`, also in the configuration file.
    let first = allowed[0];
    let d = Daemon::start(&["--poller-cpu", &first.to_string()]);
    assert_eq!(poller_cpus(&d), first.to_string());
    drop(d);
    let d = Daemon::start(&["--poller-cpu", "none"]);
    assert_eq!(poller_cpus(&d), all);
    assert_eq!(
        thread_cpus(d.pid(), "monetad").as_deref(),
        Some(all.as_str())
    );
    let ch = Channel::open(&d.socket).unwrap();
    assert_eq!(ch.device_cpu(), None);
    drop(ch);
    drop(d);
    let dir = TempDir::new("cpu");
    let toml = dir.0.join("c.toml");
    std::fs::write(&toml, format!("poller_cpu = {first}\n")).unwrap();
    let d = Daemon::start(&["--config", toml.to_str().unwrap()]);
    assert_eq!(poller_cpus(&d), first.to_string());
    drop(d);
    // A CPU the daemon may not use is refused with the ones it may.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--volatile", "--raw", "--poller-cpu", "100000", "--socket"])
        .arg(dir.0.join("d.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("poller CPU 100000 is not one this process may run on (allowed: "),
        "{err}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--volatile", "--raw", "--poller-cpu", "fast", "--socket"])
        .arg(dir.0.join("d.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a CPU number, `auto` or `none`"));
}

/// The C sketch of `docs/abi.md` §12, taken from the document as it is, compiled with a small
/// `main` that grants itself a range with the GRANT message laid out as §2.4 says, reads it
/// with the sketch's `chan_read`, and reads an ungranted range: the document is precise enough
/// for a client written from it alone.
#[test]
fn the_abi_documents_c_sketch_is_a_working_client() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/abi.md")).unwrap();
    let section = doc
        .split("## 12. A C sketch")
        .nth(1)
        .expect("section 12 of the ABI document");
    let sketch = section
        .split("```c\n")
        .nth(1)
        .and_then(|s| s.split("\n```").next())
        .expect("the C block of section 12");
    let main = r#"
#include <stdio.h>
#include <stdlib.h>

/* GRANT (op 2) of READ over [start, start + len) to the caller's own channel: the result. */
static int grant(struct chan *c, uint64_t start, uint64_t len)
{
    uint8_t req[48] = { 'M','N','C','P', 3,0, 2,0, 7,0,0,0, 32,0,0,0 };
    uint32_t rights = 1;
    uint64_t file = 9;
    memcpy(req + 16, &c->id, 4);
    memcpy(req + 20, &rights, 4);
    memcpy(req + 24, &start, 8);
    memcpy(req + 32, &len, 8);
    memcpy(req + 40, &file, 8);
    if (send(c->sock, req, sizeof req, MSG_NOSIGNAL) != (ssize_t)sizeof req)
        return -errno;
    uint8_t rep[256];
    ssize_t n = recv(c->sock, rep, sizeof rep, 0);
    if (n < 24 || ld16(rep + 6) != (0x8000 | 2) || ld32(rep + 8) != 7)
        return -EPROTO;
    return (int32_t)ld32(rep + 16);
}

int main(int argc, char **argv)
{
    if (argc != 4)
        return 10;
    struct chan c;
    int r = chan_open(&c, argv[1]);
    if (r != 0) {
        fprintf(stderr, "chan_open: %d\n", r);
        return 11;
    }
    uint64_t addr = strtoull(argv[2], NULL, 0), len = strtoull(argv[3], NULL, 0);
    static uint8_t buf[1 << 14];
    if (len > sizeof buf)
        return 12;
    /* Before the grant: a permission miss (status 4). */
    r = chan_read(&c, 3, addr, len, buf);
    if (r != 4) {
        fprintf(stderr, "ungranted read: status %d\n", r);
        return 13;
    }
    r = grant(&c, addr, len);
    if (r != 0) {
        fprintf(stderr, "grant: %d\n", r);
        return 14;
    }
    /* The same tag again, then another: sequence numbers and slices as §6 says. */
    static const unsigned tags[3] = { 3, 3, 5 };
    for (int i = 0; i < 3; i++) {
        memset(buf, 0, len);
        r = chan_read(&c, tags[i], addr, len, buf);
        if (r != 0) {
            fprintf(stderr, "read on tag %u: status %d\n", tags[i], r);
            return 15;
        }
    }
    fwrite(buf, 1, len, stdout);
    return 0;
}
"#;
    let tmp = TempDir::new("csketch");
    let src = tmp.0.join("sketch.c");
    std::fs::write(&src, format!("{sketch}\n{main}")).unwrap();
    let exe = tmp.0.join("sketch");
    let out = std::process::Command::new("cc")
        .args([
            "-std=c11",
            "-D_GNU_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
        ])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "the sketch does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A raw daemon (the sketch's client is its own administrator: same uid), with a pattern
    // written at the address through a channel of this process.
    let d = Daemon::start(&[]);
    let ch = d.channel();
    let (addr, len) = (1u64 << 20, 3000usize);
    grant(&d.control(), ch.id(), addr, len as u64, true, 1);
    let data = pattern(7, addr, len);
    ch.write(addr, &data, Completion::Dma).unwrap();
    let run = std::process::Command::new(&exe)
        .arg(&d.socket)
        .arg(addr.to_string())
        .arg(len.to_string())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{:?}: {}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.stdout == data, "the sketch read other bytes");
}
