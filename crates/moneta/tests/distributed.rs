//! Devices joined over the network (docs/distributed.md): a device whose address space holds a
//! range of another member forwards the commands on it, checked against its own permission
//! table, over an NBD link authenticated by a pre-shared key (TLS-PSK) to the member's export
//! (`moneta export --range` of a raw daemon, which is an ordinary NBD server), and completes them
//! through the same channel.
//!
//! Each test makes two hosts on this machine: two network namespaces joined by a veth pair with
//! addresses of the test's own, a daemon in each, the member's nbdkit listening on its host's
//! address. That needs root (CI runs it so); without root the hosts share the loopback network,
//! and under `CI=true` that is a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::{Duration, Instant};

use common::hosts::{export_on, key_file, kill_and_wait, Net};
use common::{built, pattern, text};
use libmoneta::{Channel, ClientError, Tag};
use moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};
use moneta_abi::{Command, Completion, Opcode, Status};

const MIB: u64 = 1 << 20;
/// The member's range in the forwarding device's address space: past its 64 MiB array.
const REMOTE: u64 = 64 * MIB;

struct Cluster {
    net: Net,
    dir: PathBuf,
    /// The device the clients use, which forwards.
    a: PathBuf,
    /// The member holding the remote range.
    b: PathBuf,
    port: u16,
    export_pid: Option<i32>,
    /// What B exports: its whole address space, or its array's part of one both share.
    b_range: &'static str,
    /// A's export, when B joins A too.
    a_export_pid: Option<i32>,
}

fn moneta(args: &[&str]) -> std::process::Output {
    Process::new(env!("CARGO_BIN_EXE_moneta"))
        .args(args)
        .output()
        .unwrap()
}

fn start(net: &Net, host: usize, socket: &Path, extra: &[&str]) {
    let mut args = vec![
        "start",
        "--volatile",
        "--size",
        "64M",
        "--socket",
        socket.to_str().unwrap(),
        "--",
        "--raw",
    ];
    args.extend_from_slice(extra);
    let o = net.moneta(host, &args);
    assert!(o.status.success(), "moneta start: {}", text(&o));
}

impl Cluster {
    /// Member B and its export on a loopback port with TLS-PSK; device A joined to it with the
    /// key in `a_key` (the right one unless a test says otherwise).
    fn new(tag: &str, n: u8, a_key_seed: u8) -> Cluster {
        Cluster::build(tag, n, a_key_seed, false)
    }

    /// Two hosts that see one address space: A's array at `[0, 64M)`, B's at `[64M, 128M)`,
    /// each joined to the other's export of its array.
    fn shared(tag: &str, n: u8) -> Cluster {
        Cluster::build(tag, n, 7, true)
    }

    fn build(tag: &str, n: u8, a_key_seed: u8, shared: bool) -> Cluster {
        let net = Net::new(n);
        let port = 10930 + u16::from(n);
        let _ = built("libmoneta_nbd.so");
        let dir = std::env::temp_dir().join(format!("moneta-dist-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        key_file(&dir.join("b.psk"), 7);
        key_file(&dir.join("a.psk"), a_key_seed);
        let b = dir.join("b.sock");
        let a_member = format!(
            "0:64M=nbds://member@{}:{}/?tls-psk-file={}",
            net.a_addr,
            port + 20,
            dir.join("b.psk").display()
        );
        if shared {
            // B's array is modelled with a DRAM buffer, which hints from A fill.
            start(
                &net,
                1,
                &b,
                &[
                    "--local-at",
                    "64M",
                    "--member",
                    &a_member,
                    "--model",
                    "pcm",
                    "--model-set",
                    "buffer=4M",
                ],
            );
        } else {
            start(&net, 1, &b, &[]);
        }
        let mut c = Cluster {
            net,
            a: dir.join("a.sock"),
            b,
            dir,
            port,
            export_pid: None,
            b_range: if shared { "64M:64M" } else { "0:0" },
            a_export_pid: None,
        };
        c.export();
        let member = format!(
            "64M:64M=nbds://member@{}:{port}/?tls-psk-file={}",
            c.net.b_addr,
            c.dir.join("a.psk").display()
        );
        start(
            &c.net,
            0,
            &c.a,
            &["--member", &member, "--member-timeout-ms", "1000"],
        );
        if shared {
            c.a_export_pid = Some(export_on(
                &c.net,
                0,
                &c.a,
                "0:64M",
                &c.net.a_addr,
                port + 20,
                &c.dir.join("b.psk"),
            ));
        }
        c
    }

    /// Waits until member 0's link is up (`up`), or has failed to come up (the wrong key).
    fn settled(self, up: bool) -> Cluster {
        let t = Instant::now();
        while if up {
            self.member("state") != "up"
        } else {
            self.member("last_error").is_empty()
        } {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the link never settled: {}",
                self.member("last_error")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self
    }

    /// Starts B's export (of its whole address space, or of its array's part of a shared one).
    fn export(&mut self) {
        self.export_pid = Some(export_on(
            &self.net,
            1,
            &self.b,
            self.b_range,
            &self.net.b_addr,
            self.port,
            &self.dir.join("b.psk"),
        ));
    }

    fn stop_export(&mut self) {
        if let Some(p) = self.export_pid.take() {
            kill_and_wait(p);
        }
    }

    /// A channel on `socket` granted reads and writes of `[0, len)`.
    fn channel(socket: &Path, len: u64) -> Channel {
        let ch = Channel::open(socket).unwrap();
        ch.control()
            .grant(Grant {
                channel: ch.id(),
                rights: RIGHT_READ | RIGHT_WRITE,
                start: 0,
                len,
                file: 0,
            })
            .unwrap();
        ch
    }

    fn member(&self, key: &str) -> String {
        member_of(&self.a, key)
    }
}

/// Key `key` of member 0 of the daemon at `socket`.
fn member_of(socket: &Path, key: &str) -> String {
    let m = libmoneta::control::Control::connect(socket)
        .unwrap()
        .model()
        .unwrap();
    m.get(&format!("members.0.{key}")).unwrap_or("").to_string()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_export();
        if let Some(p) = self.a_export_pid.take() {
            kill_and_wait(p);
        }
        for s in [&self.a, &self.b] {
            let _ = moneta(&["stop", "--socket", s.to_str().unwrap()]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads the member's first bytes through `a` until the link is back and a read succeeds.
fn read_once_back(a: &Channel, buf: &mut [u8], when: &str) {
    let t = Instant::now();
    while status_of(a.read(REMOTE, buf, Completion::Dma)) != Status::Ok {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the link never came back {when}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the writers of the failure test put in slot `i`.
fn slot(i: u64) -> Vec<u8> {
    let mut v = pattern(i as u8, 4096);
    v[..8].copy_from_slice(&i.to_le_bytes());
    v
}

fn cmd(op: Opcode, addr: u64, len: u64) -> Command {
    Command::new(op, Completion::Dma, addr, len, 0)
}

fn status_of(r: Result<(), ClientError>) -> Status {
    match r {
        Ok(()) => Status::Ok,
        Err(ClientError::Status(s)) => s,
        Err(e) => panic!("{e}"),
    }
}

/// Bytes written through the forwarding device land at the member's address, the member's own
/// writes are read through the device, many commands are in flight at once, a flush reaches
/// the member, and the permission table decides before anything is forwarded.
#[test]
fn a_members_range_is_read_and_written_through_the_local_channel() {
    let c = Cluster::new("rw", 1, 7).settled(true);
    let a = Cluster::channel(&c.a, 128 * MIB);
    let b = Cluster::channel(&c.b, 64 * MIB);
    assert_eq!(a.info().array_size, 128 * MIB);

    // A's write at REMOTE + 4 KiB is B's at 4 KiB; A's local 4 KiB is another place.
    let one = pattern(1, 8192);
    a.write(REMOTE + 4096, &one, Completion::Dma).unwrap();
    let mut back = vec![0u8; 8192];
    b.read(4096, &mut back, Completion::Dma).unwrap();
    assert_eq!(
        back, one,
        "the member holds the bytes at the range's offset"
    );
    a.read(REMOTE + 4096, &mut back, Completion::Sleep).unwrap();
    assert_eq!(back, one);
    a.read(4096, &mut back, Completion::Dma).unwrap();
    assert_eq!(back, vec![0u8; 8192], "the local array is untouched");
    // The other way round.
    let two = pattern(2, 4096);
    b.write(MIB, &two, Completion::Dma).unwrap();
    let mut got = vec![0u8; 4096];
    a.read(REMOTE + MIB, &mut got, Completion::Forward).unwrap();
    assert_eq!(got, two);

    // 32 commands at once on 32 tags, each its own piece of the range.
    let slice = a.slice_size() as u64;
    let tags: Vec<Tag> = (0..32).map(|_| a.tag()).collect();
    for (i, &t) in tags.iter().enumerate() {
        a.write_dma(t, 0, &pattern(10 + i as u8, slice as usize));
        a.prepare(
            t,
            &cmd(Opcode::Write, REMOTE + 8 * MIB + i as u64 * slice, slice),
        );
    }
    a.ring(tags.iter().fold(0, |m, t| m | 1u64 << t.0));
    for &t in &tags {
        assert_eq!(a.wait(t, Completion::Dma).unwrap().status, Status::Ok);
        a.release(t);
    }
    let mut all = vec![0u8; 32 * slice as usize];
    b.read(8 * MIB, &mut all, Completion::Dma).unwrap();
    for (i, piece) in all.chunks(slice as usize).enumerate() {
        assert_eq!(piece, pattern(10 + i as u8, slice as usize), "piece {i}");
    }
    assert!(a.flush(REMOTE, MIB, Completion::Dma).is_ok());

    // Refused here, never forwarded: no record, a record that does not allow it, a range
    // across the array's end and the member's range, and past the address space.
    let forwarded: u64 = c.member("requests").parse().unwrap();
    let c2 = Channel::open(&c.a).unwrap();
    c2.control()
        .grant(Grant {
            channel: c2.id(),
            rights: RIGHT_READ,
            start: REMOTE,
            len: MIB,
            file: 0,
        })
        .unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        status_of(c2.read(REMOTE + 2 * MIB, &mut buf, Completion::Dma)),
        Status::PermissionMiss
    );
    assert_eq!(
        status_of(c2.write(REMOTE, &buf, Completion::Dma)),
        Status::PermissionDenied
    );
    assert_eq!(
        status_of(a.read(REMOTE - 2048, &mut buf, Completion::Dma)),
        Status::OutOfRange
    );
    assert_eq!(
        status_of(a.read(128 * MIB, &mut buf, Completion::Dma)),
        Status::OutOfRange
    );
    assert_eq!(c.member("requests").parse::<u64>().unwrap(), forwarded);
    // What c2 may read it reads.
    c2.read(REMOTE + 4096, &mut buf, Completion::Dma).unwrap();
    assert_eq!(buf, one[..4096]);

    assert_eq!(c.member("state"), "up");
    assert_eq!(c.member("failures"), "0");
    let o = moneta(&["status", "--socket", c.a.to_str().unwrap()]);
    assert!(
        text(&o).contains(&format!(
            "member 0: [0x4000000, 0x8000000) at nbds://member@{}:{}/",
            c.net.b_addr, c.port
        )),
        "{}",
        text(&o)
    );
}

/// With the local array placed after the member's range on one host, two hosts see one address
/// space: a byte written at an address through either host is read at that address through the
/// other, whichever host's array holds it, and each host's status says where its array lies.
#[test]
fn two_hosts_see_one_address_space() {
    let c = Cluster::shared("one", 5).settled(true);
    let t = Instant::now();
    while member_of(&c.b, "state") != "up" {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "B's link to A never came up: {}",
            member_of(&c.b, "last_error")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let a = Cluster::channel(&c.a, 128 * MIB);
    let b = Cluster::channel(&c.b, 128 * MIB);
    assert_eq!(a.info().array_size, 128 * MIB);
    assert_eq!(b.info().array_size, 128 * MIB);
    // Writes through each host, into each host's array, read back through the other at the
    // same addresses.
    let places = [
        (&a, 4096u64, 1u8),
        (&a, REMOTE + 8192, 2),
        (&b, MIB, 3),
        (&b, REMOTE + MIB, 4),
    ];
    for &(w, addr, seed) in &places {
        w.write(addr, &pattern(seed, 8192), Completion::Dma)
            .unwrap();
    }
    for &(w, addr, seed) in &places {
        let r = if std::ptr::eq(w, &a) { &b } else { &a };
        let mut back = vec![0u8; 8192];
        r.read(addr, &mut back, Completion::Dma).unwrap();
        assert_eq!(back, pattern(seed, 8192), "address {addr:#x}");
    }
    // Each array holds its own part: B's array starts at REMOTE, so what A wrote at REMOTE +
    // 8 KiB is at 8 KiB of B's export, which A reads through its member's range.
    let mut back = vec![0u8; 8192];
    a.read(REMOTE + 8192, &mut back, Completion::Sleep).unwrap();
    assert_eq!(back, pattern(2, 8192));
    // Nothing straddles the edge between the two arrays, on either host.
    for ch in [&a, &b] {
        assert_eq!(
            status_of(ch.read(REMOTE - 2048, &mut back[..4096], Completion::Dma)),
            Status::OutOfRange
        );
    }
    assert!(b.flush(0, MIB, Completion::Dma).is_ok());
    assert!(b.flush(REMOTE, MIB, Completion::Dma).is_ok());
    // A hint through A on B's part completes at once and reaches B's DRAM buffer.
    let hinted = || {
        libmoneta::control::Control::connect(&c.b)
            .unwrap()
            .model()
            .unwrap()
            .get("buffer.hinted_lines")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(hinted(), 0);
    a.will_need(REMOTE + 4 * MIB, MIB, Completion::Dma).unwrap();
    let t = Instant::now();
    while hinted() == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the hint never reached B's buffer"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = moneta(&["status", "--socket", c.b.to_str().unwrap()]);
    let out = text(&o);
    assert!(out.contains("local array: [0x4000000, 0x8000000)"), "{out}");
    assert!(out.contains("member 0: [0x0, 0x4000000)"), "{out}");
    let o = moneta(&["status", "--socket", c.a.to_str().unwrap()]);
    assert!(
        text(&o).contains("local array: [0x0, 0x4000000)"),
        "{}",
        text(&o)
    );
    assert_eq!(member_of(&c.a, "failures"), "0");
    assert_eq!(member_of(&c.b, "failures"), "0");
}

/// A host without the key reaches nothing: the export refuses a client without TLS, and a
/// device configured with the wrong key keeps its link down, failing the range's commands at
/// once with a media error while its own array serves.
#[test]
fn a_host_without_the_key_cannot_reach_the_member() {
    let c = Cluster::new("key", 2, 99).settled(false);
    let o = c.net.run(
        0,
        "nbdinfo",
        &[&format!("nbd://{}:{}", c.net.b_addr, c.port)],
    );
    assert!(!o.status.success(), "nbdinfo without the key: {}", text(&o));
    let a = Cluster::channel(&c.a, 128 * MIB);
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    assert_eq!(
        status_of(a.read(REMOTE, &mut buf, Completion::Dma)),
        Status::MediaError
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_ne!(c.member("state"), "up");
    assert!(c.member("last_error").contains("cannot reach member"));
    assert_eq!(c.member("connects"), "0");
    a.write(0, &pattern(3, 4096), Completion::Dma).unwrap();
    a.read(0, &mut buf, Completion::Dma).unwrap();
    assert_eq!(buf, pattern(3, 4096));
}

/// A member that stops answering fails the commands waiting for it within the configured
/// timeout (1 s here), one that goes away fails them at once, the local array keeps serving
/// meanwhile, and when the member is back the link is made again.
#[test]
fn a_failed_member_fails_its_commands_in_bounded_time_and_comes_back() {
    let mut c = Cluster::new("fail", 3, 7).settled(true);
    let a = Cluster::channel(&c.a, 128 * MIB);
    let data = pattern(4, 4096);
    a.write(REMOTE, &data, Completion::Dma).unwrap();

    // Stopped (SIGSTOP): the connection stays open, no answer comes.
    let pid = c.export_pid.unwrap();
    // SAFETY: signalling the export this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    // Meanwhile 63 tags of another channel wait for the member, more than the device's
    // physical tags: local reads go on at their pace all the same, through another channel
    // and through that one's last tag (the poller, which sleeps while its channels wait only
    // for members, wakes for them).
    let stalled = Channel::open(&c.a).unwrap();
    for start in [REMOTE, 0] {
        stalled
            .control()
            .grant(Grant {
                channel: stalled.id(),
                rights: RIGHT_READ,
                start,
                len: MIB,
                file: 0,
            })
            .unwrap();
    }
    let tags: Vec<Tag> = (0..63).map(|_| stalled.tag()).collect();
    for &tag in &tags {
        stalled.prepare(
            tag,
            &cmd(Opcode::Read, REMOTE + u64::from(tag.0) * 4096, 4096),
        );
    }
    stalled.ring(u64::MAX);
    let mut buf = vec![0u8; 4096];
    let sleeps = || {
        libmoneta::control::Control::connect(&c.a)
            .unwrap()
            .status()
            .unwrap()
            .poller_sleeps
    };
    let slept = sleeps();
    let t = Instant::now();
    let mut local_reads = 0;
    while t.elapsed() < Duration::from_millis(500) {
        if local_reads % 8 == 0 {
            // Long enough for the poller, with only the member's commands in flight, to park
            // the channels and sleep: the next read must wake it.
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = Instant::now();
        let through = if local_reads % 2 == 0 { &a } else { &stalled };
        through
            .read(4096 * (local_reads % 64), &mut buf, Completion::Dma)
            .unwrap();
        assert!(
            r.elapsed() < Duration::from_millis(500),
            "a local read waited {:?} behind the stalled member",
            r.elapsed()
        );
        local_reads += 1;
    }
    assert!(local_reads > 20, "{local_reads} local reads in 0.5 s");
    assert!(
        sleeps() > slept,
        "the poller never slept while the channels waited for the member"
    );
    assert_eq!(
        status_of(a.read(REMOTE, &mut buf, Completion::Dma)),
        Status::MediaError
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "failed after {took:?}"
    );
    for &tag in &tags {
        assert_eq!(
            stalled.wait(tag, Completion::Dma).unwrap().status,
            Status::MediaError
        );
        stalled.release(tag);
    }
    assert!(c.member("last_error").contains("no answer within"));
    a.write(4096, &data, Completion::Dma).unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };

    // Killed while writes are in flight: each write fails or is acknowledged, none hangs, and
    // every acknowledged one is at the member when it is back. Slot i of 4 KiB holds
    // pattern(i) once written.
    read_once_back(&a, &mut buf, "after SIGCONT");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let acked = std::thread::scope(|s| {
        let writers: Vec<_> = (0..4u64)
            .map(|w| {
                let (a, stop) = (&a, &stop);
                s.spawn(move || {
                    let mut acked = Vec::new();
                    let mut failed = 0;
                    let mut i = w;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 4000 {
                        let t = Instant::now();
                        let at = REMOTE + 16 * MIB + i * 4096;
                        match status_of(a.write(at, &slot(i), Completion::Dma)) {
                            Status::Ok => acked.push(i),
                            Status::MediaError => failed += 1,
                            other => panic!("write {i}: {other:?}"),
                        }
                        assert!(t.elapsed() < Duration::from_secs(5), "a write hung");
                        i += 4;
                    }
                    (acked, failed)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(200));
        c.stop_export();
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let r: Vec<(Vec<u64>, u32)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        assert!(
            r.iter().map(|x| x.1).sum::<u32>() > 0,
            "no write saw the member fail"
        );
        r.into_iter().flat_map(|x| x.0).collect::<Vec<u64>>()
    });
    assert!(!acked.is_empty());
    // Gone: refused at once, until it is back on its port.
    let t = Instant::now();
    assert_eq!(
        status_of(a.read(REMOTE, &mut buf, Completion::Dma)),
        Status::MediaError
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    c.export();
    read_once_back(&a, &mut buf, "after the export restarted");
    assert_eq!(
        buf, data,
        "the member kept what was written before it failed"
    );
    let b = Cluster::channel(&c.b, 64 * MIB);
    for i in acked {
        b.read(16 * MIB + i * 4096, &mut buf, Completion::Dma)
            .unwrap();
        assert_eq!(buf, slot(i), "acknowledged write {i} lost");
    }
    assert_eq!(c.member("state"), "up");
    let connects: u64 = c.member("connects").parse().unwrap();
    assert!(connects >= 2);

    // Gone and back with nothing forwarded meanwhile: the link sees the hang-up, goes down,
    // and connects again by itself, without a command to find out.
    c.stop_export();
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let t = Instant::now();
        while !done() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    until("the link never saw the idle member go", &|| {
        c.member("state") != "up"
    });
    c.export();
    until("the link never came back by itself", &|| {
        c.member("state") == "up" && c.member("connects").parse::<u64>().unwrap() > connects
    });
    read_once_back(&a, &mut buf, "after an idle restart");
}

/// Any NBD server can stand in for a member: here nbdkit's `file` plugin serving a plain file
/// on a Unix socket, with no Moneta behind it. The device's writes are in the file at the
/// range's offset, and bytes put in the file are read through the device.
#[test]
fn any_nbd_server_stands_in_for_a_member() {
    let dir = std::env::temp_dir().join(format!("moneta-dist-plain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("member.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    let sock = dir.join("nbd.sock");
    let pid = dir.join("nbdkit.pid");
    let o = Process::new("nbdkit")
        .arg("--unix")
        .arg(&sock)
        .arg("--pidfile")
        .arg(&pid)
        .arg("file")
        .arg(&image)
        .output()
        .expect("nbdkit (scripts/test.sh installs it)");
    assert!(o.status.success(), "nbdkit: {}", text(&o));
    let t = Instant::now();
    while !pid.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "nbdkit never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let net = Net {
        spaces: None,
        a_addr: String::new(),
        b_addr: String::new(),
    };
    let a = dir.join("a.sock");
    let member = format!("64M:64M=nbd+unix:///?socket={}", sock.display());
    start(&net, 0, &a, &["--member", &member]);
    let ch = Cluster::channel(&a, 128 * MIB);
    let data = pattern(9, 8192);
    // The first write may come while the link still connects: it waits for the connection.
    ch.write(REMOTE + 3 * MIB, &data, Completion::Dma).unwrap();
    let file = std::fs::read(&image).unwrap();
    assert_eq!(&file[3 << 20..(3 << 20) + 8192], &data[..]);
    use std::os::unix::fs::FileExt;
    let other = pattern(10, 4096);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap()
        .write_all_at(&other, 5 << 20)
        .unwrap();
    let mut back = vec![0u8; 4096];
    ch.read(REMOTE + 5 * MIB, &mut back, Completion::Dma)
        .unwrap();
    assert_eq!(back, other);
    let _ = moneta(&["stop", "--socket", a.to_str().unwrap()]);
    if let Some(p) = std::fs::read_to_string(&pid)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
    {
        // SAFETY: signalling the server this test started.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    let _ = std::fs::remove_dir_all(&dir);
}
