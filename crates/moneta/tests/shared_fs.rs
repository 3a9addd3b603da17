//! One nvfs shared by two hosts (docs/distributed.md, "One file system on every host"): host
//! A holds the file system and its permission manager (`monetad --share-listen`) and exports
//! its array; host B's daemon (`--share-from`, `--member`) asks A's manager for its clients'
//! file-system calls over an authenticated link and reads and writes the files' bytes in A's
//! array through its own device and the NBD link. A's revocations reach B's records before any
//! space is reused.
//!
//! Each test makes the two hosts on this machine in network namespaces joined by a veth pair
//! (root, as CI runs it; without root both hosts share the loopback network, and under
//! `CI=true` that is a failure).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::hosts::{export_on, key_file, kill_and_wait, Net};
use common::{built, pattern, text};
use libmoneta::moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};
use libmoneta::{File, Moneta, OpenOptions};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Two hosts sharing A's file system.
struct Shared {
    net: Net,
    dir: PathBuf,
    /// A's socket: the manager's host.
    a: PathBuf,
    /// B's socket: the member host.
    b: PathBuf,
    /// A's manager link; the export listens on the next port.
    port: u16,
    export_pid: Option<i32>,
    /// A's backing file, when the test restarts A.
    image: Option<PathBuf>,
    /// Where members reach A's manager, when not at A's address.
    share_from: Option<String>,
    /// Where members reach A's export (HOST:PORT), when not at A's address.
    nbd_via: Option<String>,
}

fn moneta(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(args)
        .output()
        .unwrap()
}

fn pid_of(socket: &Path) -> i32 {
    std::fs::read_to_string(socket.with_extension("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Key `share.KEY` of the daemon at `socket` ("" when it has none or is gone).
fn share(socket: &Path, key: &str) -> String {
    libmoneta::Control::connect(socket)
        .and_then(|c| c.model())
        .ok()
        .and_then(|m| m.get(&format!("share.{key}")).map(str::to_string))
        .unwrap_or_default()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t.elapsed()
}

fn write_all(f: &File, data: &[u8], at: u64) {
    let mut done = 0;
    while done < data.len() {
        done += f.write_at(&data[done..], at + done as u64).unwrap();
    }
}

/// A relay process, stopped or not, killed when the test ends however it ends.
struct Relay(std::process::Child);

impl Relay {
    /// Stops B and starts `script` on B's host, relaying 127.0.0.1:(A's port + 100) to A's
    /// `to_port`, with `extra` arguments after the three every relay takes; the address B is
    /// to use instead of A's.
    fn instead_of_b(s: &Shared, script: &str, to_port: u16, extra: &[&str]) -> (Relay, String) {
        let _ = moneta(&["stop", "--socket", s.b.to_str().unwrap()]);
        let listen = s.port + 100;
        let (to, listen_s) = (to_port.to_string(), listen.to_string());
        let mut args = vec!["-c", script, &s.net.a_addr, &to, &listen_s];
        args.extend(extra);
        let relay = Relay(s.net.spawn(1, "python3", &args));
        std::thread::sleep(Duration::from_millis(500));
        (relay, format!("127.0.0.1:{listen}"))
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling a process this test started.
        unsafe { libc::kill(self.0.id() as i32, sig) };
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read_all(f: &File, len: usize) -> Vec<u8> {
    try_read_all(f, len).unwrap()
}

fn try_read_all(f: &File, len: usize) -> Result<Vec<u8>, libmoneta::ClientError> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = f.read_at(&mut buf[done..], done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    buf.truncate(done);
    Ok(buf)
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    o
}

/// File `/v` of `len` bytes of 0x11, and the array filled (`/filler`, bytes 0x22) but for half
/// of that: a file made after v is truncated takes most of its space from what v freed.
fn nearly_full_but_v(a: &Moneta, len: usize) {
    let v = make(a, "/v");
    write_all(&v, &vec![0x11; len], 0);
    drop(v);
    let st = a.statfs().unwrap();
    let free = (st.chunks_free * st.chunk_size) as usize;
    let filler = make(a, "/filler");
    write_all(&filler, &vec![0x22; free - len / 2], 0);
}

/// A new (or emptied) file, open for reading and writing.
fn make(m: &Moneta, path: &str) -> File {
    m.open(path, rw().create(true).truncate(true)).unwrap()
}

fn ro() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true);
    o
}

impl Shared {
    /// A (volatile, or on a backing file if `persistent`) sharing its file system and
    /// exporting its array; B joined to both.
    fn new(tag: &str, n: u8, persistent: bool) -> Shared {
        let net = Net::new(n);
        let _ = built("libmoneta_nbd.so");
        let dir = std::env::temp_dir().join(format!("moneta-share-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        key_file(&dir.join("psk"), 7);
        key_file(&dir.join("other.psk"), 99);
        let mut s = Shared {
            net,
            a: dir.join("a.sock"),
            b: dir.join("b.sock"),
            image: persistent.then(|| dir.join("a.img")),
            dir,
            port: 11000 + 2 * u16::from(n),
            export_pid: None,
            share_from: None,
            nbd_via: None,
        };
        s.start_a();
        let b = s.b.clone();
        s.start_member(&b, "psk");
        s.wait_joined(&b);
        s
    }

    fn start_a(&mut self) {
        let listen = format!("{}:{}", self.net.a_addr, self.port);
        let key = self.dir.join("psk");
        let a = self.a.to_str().unwrap().to_string();
        let mut args = vec!["start"];
        let image = self.image.as_ref().map(|p| p.to_str().unwrap().to_string());
        match &image {
            Some(p) => args.extend(["--device", p.as_str()]),
            None => args.push("--volatile"),
        }
        args.extend([
            "--size",
            "64M",
            "--socket",
            &a,
            "--",
            "--share-listen",
            &listen,
            "--share-key",
            key.to_str().unwrap(),
            "--socket-mode",
            "666",
            // Files take what they write and no more, so a test can fill the array exactly.
            "--append-reserve",
            "0",
        ]);
        let o = self.net.moneta(0, &args);
        assert!(o.status.success(), "moneta start (A): {}", text(&o));
        self.export_pid = Some(export_on(
            &self.net,
            0,
            &self.a,
            "0:64M",
            &self.net.a_addr,
            self.port + 1,
            &self.dir.join("psk"),
        ));
    }

    /// A member daemon at `socket` on host B whose manager link uses the key file `key` (the
    /// NBD link always the right one).
    fn start_member(&self, socket: &Path, key: &str) {
        self.start_member_with(socket, key, "64M");
    }

    /// A member whose range of the manager's array is `len` long.
    fn start_member_with(&self, socket: &Path, key: &str, len: &str) {
        let nbd = self
            .nbd_via
            .clone()
            .unwrap_or_else(|| format!("{}:{}", self.net.a_addr, self.port + 1));
        let member = format!(
            "0:{len}=nbds://member@{nbd}/?tls-psk-file={}",
            self.dir.join("psk").display()
        );
        let from = self
            .share_from
            .clone()
            .unwrap_or_else(|| format!("{}:{}", self.net.a_addr, self.port));
        let o = self.net.moneta(
            1,
            &[
                "start",
                "--volatile",
                "--size",
                "16M",
                "--socket",
                socket.to_str().unwrap(),
                "--",
                "--local-at",
                "64M",
                "--member",
                &member,
                "--member-timeout-ms",
                "1000",
                "--share-from",
                &from,
                "--share-key",
                self.dir.join(key).to_str().unwrap(),
                "--socket-mode",
                "666",
            ],
        );
        assert!(o.status.success(), "moneta start (B): {}", text(&o));
    }

    /// Waits until the member at `socket` has joined A's file system and reaches A's array.
    /// B started again with the key, as the test set its links up, and joined.
    fn restart_b(&self) {
        self.start_member(&self.b, "psk");
        self.wait_joined(&self.b);
    }

    fn wait_joined(&self, socket: &Path) {
        wait_for("the member joins", Duration::from_secs(15), || {
            share(socket, "state") == "up"
                && libmoneta::Control::connect(socket)
                    .and_then(|c| c.model())
                    .is_ok_and(|m| m.get("members.0.state") == Some("up"))
        });
    }

    fn stop_export(&mut self) {
        if let Some(p) = self.export_pid.take() {
            kill_and_wait(p);
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop_export();
        for s in [&self.b, &self.a] {
            let _ = moneta(&["stop", "--socket", s.to_str().unwrap()]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Files written on one host are read on the other, byte for byte and at once; names,
/// directories and sizes agree; the bytes go over the link to A's array, the calls to A's
/// manager, with the caller's credentials.
#[test]
fn a_file_written_on_one_host_is_read_on_the_other() {
    let s = Shared::new("files", 11, false);
    let a = Moneta::connect(&s.a).unwrap();
    let b = Moneta::connect(&s.b).unwrap();

    // Written on A, read on B.
    let one = pattern(1, 3 * MIB + 123);
    let f = make(&a, "/one");
    write_all(&f, &one, 0);
    drop(f);
    let g = b.open("/one", &rw()).unwrap();
    assert_eq!(g.stat().unwrap().size, one.len() as u64);
    assert_eq!(read_all(&g, one.len() + 10), one, "B reads what A wrote");

    // Written on B (a new directory and file), read on A.
    b.mkdir("/d", 0o755).unwrap();
    let two = pattern(2, 2 * MIB + 7);
    let h = make(&b, "/d/two");
    write_all(&h, &two, 0);
    h.sync_all().unwrap();
    drop(h);
    let h = a.open("/d/two", &ro()).unwrap();
    assert_eq!(read_all(&h, two.len() + 1), two, "A reads what B wrote");
    drop(h);

    // Bytes A writes into a file B holds open are read on B as soon as the write completed,
    // and the other way round: nothing is cached on either side.
    let fa = a.open("/one", &rw()).unwrap();
    for round in 0..20u8 {
        let mine = pattern(100 + round, 4 * KIB);
        write_all(&fa, &mine, 8 * KIB as u64);
        let mut back = vec![0u8; 4 * KIB];
        assert_eq!(g.read_at(&mut back, 8 * KIB as u64).unwrap(), back.len());
        assert_eq!(back, mine, "round {round}: B reads A's completed write");
        let theirs = pattern(150 + round, 4 * KIB);
        write_all(&g, &theirs, 64 * KIB as u64);
        fa.read_at(&mut back, 64 * KIB as u64).unwrap();
        assert_eq!(back, theirs, "round {round}: A reads B's completed write");
    }
    // A grows the file; B sees the new size and bytes.
    write_all(&fa, &pattern(9, 5000), one.len() as u64);
    assert_eq!(g.stat().unwrap().size, one.len() as u64 + 5000);
    drop((fa, g));

    // Names change on B, and A sees it.
    b.rename("/d/two", "/d/three", false).unwrap();
    assert_eq!(a.stat("/d/two").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(a.stat("/d/three").unwrap().size, two.len() as u64);
    let names: Vec<_> = a
        .read_dir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n != b"." && n != b"..")
        .collect();
    assert_eq!(names, vec![b"three".to_vec()]);
    b.unlink("/d/three").unwrap();
    assert_eq!(a.stat("/d/three").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(b.stat("/d/three").unwrap_err().errno(), libc::ENOENT);

    // The data went over B's link to A's array; the calls to A's manager.
    let forwarded: u64 = libmoneta::Control::connect(&s.b)
        .unwrap()
        .model()
        .unwrap()
        .get("members.0.bytes")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        forwarded >= (one.len() + two.len()) as u64,
        "B's bytes went through its link: {forwarded}"
    );
    assert!(share(&s.a, "calls").parse::<u64>().unwrap() > 10);
    assert_eq!(share(&s.a, "members"), "1");
    let o = moneta(&["status", "--socket", s.b.to_str().unwrap()]);
    assert!(
        text(&o).contains(&format!(
            "shared file system: member of {}:{}: up",
            s.net.a_addr, s.port
        )),
        "{}",
        text(&o)
    );

    // A's manager checks a member host's client with that client's credentials: another
    // user on B reads a file all may read, and is refused one only its owner may.
    let open = make(&b, "/public");
    write_all(&open, b"for everyone\n", 0);
    drop(open);
    let secret = b
        .open(
            "/secret",
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600),
        )
        .unwrap();
    write_all(&secret, b"for root\n", 0);
    drop(secret);
    let as_user = |path: &str| {
        s.net.run(
            1,
            "setpriv",
            &[
                "--reuid=1001",
                "--regid=1001",
                "--clear-groups",
                "env",
                &format!("MONETA_SOCKET={}", s.b.display()),
                env!("CARGO_BIN_EXE_moneta"),
                "run",
                "--",
                "cat",
                path,
            ],
        )
    };
    let o = as_user("/moneta/public");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(o.stdout, b"for everyone\n");
    let o = as_user("/moneta/secret");
    assert!(!o.status.success(), "another user read a 0600 file of root");
    assert!(text(&o).contains("Permission denied"), "{}", text(&o));

    // Not even B's administrator grants records over A's array past A's manager; B's own
    // array it still may.
    let ch = libmoneta::Channel::open(&s.b).unwrap();
    let grant = |start: u64| {
        ch.control().grant(Grant {
            channel: ch.id(),
            rights: RIGHT_READ | RIGHT_WRITE,
            start,
            len: 4096,
            file: 0,
        })
    };
    let e = grant(4096).unwrap_err();
    assert_eq!(e.errno(), libc::EPERM, "{e}");
    grant(64 << 20).unwrap();
}

/// A truncate on A racing a writer and a reader on B: the space A frees and gives to another
/// file never takes B's stale writes, and B never reads that other file's bytes.
#[test]
fn a_truncate_on_one_host_leaves_no_stale_bytes_on_the_other() {
    let s = Shared::new("race", 12, false);
    let a = Moneta::connect(&s.a).unwrap();
    const LEN: usize = 256 * KIB;
    const PIECE: usize = 16 * KIB;
    nearly_full_but_v(&a, LEN);

    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(AtomicU64::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let b_socket = s.b.clone();
    let member = {
        let (stop, wrong, writes) = (stop.clone(), wrong.clone(), writes.clone());
        std::thread::spawn(move || {
            let b = Moneta::connect(&b_socket).unwrap();
            let f = b.open("/v", &rw()).unwrap();
            let mine = vec![0xB1; PIECE];
            let mut buf = vec![0u8; PIECE];
            while !stop.load(Ordering::Relaxed) {
                for off in (0..LEN).step_by(PIECE) {
                    if f.write_at(&mine, off as u64).is_ok() {
                        writes.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Ok(n) = f.read_at(&mut buf, off as u64) {
                        // v's own bytes, B's, or the zeros of space v got again: never
                        // another file's.
                        if buf[..n].iter().any(|&x| ![0x11, 0xB1, 0].contains(&x)) {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        })
    };
    wait_for("B writes", Duration::from_secs(10), || {
        writes.load(Ordering::Relaxed) > 10
    });
    let revoked = share(&s.b, "revocations").parse::<u64>().unwrap();
    const ROUNDS: usize = 24;
    let mut done = 0;
    for round in 0..ROUNDS {
        // v loses its space, which the next file takes at once, unless the member's writer
        // grew v into it first: then the round has no room and is left out.
        a.truncate("/v", 0).unwrap();
        let name = format!("/w{round}");
        let w = make(&a, &name);
        let filled = (0..LEN / PIECE)
            .try_for_each(|i| w.write_at(&[0xA7; PIECE], (i * PIECE) as u64).map(|_| ()));
        if let Err(e) = filled {
            assert_eq!(e.errno(), libc::ENOSPC, "{e}");
            drop(w);
            a.unlink(&name).unwrap();
            continue;
        }
        done += 1;
        // B's writer goes on meanwhile; a stale write of it would land in w.
        std::thread::sleep(Duration::from_millis(20));
        let back = read_all(&w, LEN);
        assert!(
            back.iter().all(|&x| x == 0xA7),
            "round {round}: {} bytes of w were overwritten through B's old records",
            back.iter().filter(|&&x| x != 0xA7).count()
        );
        drop(w);
        a.unlink(&name).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    member.join().unwrap();
    assert!(
        done >= ROUNDS / 2,
        "only {done} of {ROUNDS} rounds had room"
    );
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "B read another file's bytes"
    );
    let now = share(&s.b, "revocations").parse::<u64>().unwrap();
    assert!(
        now >= revoked + ROUNDS as u64,
        "every truncate revoked on B: {revoked} then {now}"
    );
}

/// A host without the key gets no link to A's manager, so no file of it; A counts the refusal;
/// a connection that speaks anything else is refused too.
#[test]
fn a_host_without_the_key_is_refused() {
    let s = Shared::new("key", 13, false);
    let c = s.dir.join("c.sock");
    s.start_member(&c, "other.psk");
    wait_for(
        "the unkeyed member gives up",
        Duration::from_secs(15),
        || share(&c, "last_error").contains("key"),
    );
    assert_eq!(share(&c, "state"), "down");
    let m = Moneta::connect(&c).unwrap();
    let e = m.stat("/").unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e}");
    assert!(e.to_string().contains("unreachable"), "{e}");
    let refused: u64 = share(&s.a, "refused").parse().unwrap();
    assert!(refused >= 1, "A counted the refusal");
    // Something that is not a member at all.
    let o = s.net.run(
        1,
        "bash",
        &[
            "-c",
            &format!(
                "exec 3<>/dev/tcp/{}/{}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3",
                s.net.a_addr, s.port
            ),
        ],
    );
    assert!(o.stdout.is_empty(), "A answered a stranger: {}", text(&o));
    wait_for("A counts the stranger", Duration::from_secs(10), || {
        share(&s.a, "refused").parse::<u64>().unwrap() > refused
    });
    // A member whose ranges do not hold the manager's array where the manager puts it.
    let d = s.dir.join("d.sock");
    s.start_member_with(&d, "psk", "32M");
    wait_for(
        "the misplaced member gives up",
        Duration::from_secs(15),
        || share(&d, "last_error").contains("do not hold"),
    );
    assert_eq!(share(&d, "state"), "down");
    let _ = moneta(&["stop", "--socket", d.to_str().unwrap()]);
    // The keyed member is untouched.
    let b = Moneta::connect(&s.b).unwrap();
    assert!(b.stat("/").is_ok());
    assert_eq!(share(&s.a, "members"), "1");
    drop(m);
    let _ = moneta(&["stop", "--socket", c.to_str().unwrap()]);
}

/// A member killed while its clients hold files: A notices, keeps serving, and frees space
/// within a bounded time. The manager's host killed: B's calls fail with EIO within a lease,
/// nothing hangs, and once A is back what B had made durable is there.
#[test]
fn a_member_or_the_manager_killed_fails_in_bounded_time_and_loses_nothing_durable() {
    let mut s = Shared::new("kill", 14, true);
    let a = Moneta::connect(&s.a).unwrap();
    let kept = pattern(5, MIB + 17);
    let cuts = || share(&s.a, "cuts").parse::<u64>().unwrap();
    let cuts_before = cuts();
    {
        let b = Moneta::connect(&s.b).unwrap();
        let f = make(&b, "/kept");
        write_all(&f, &kept, 0);
        f.sync_all().unwrap();
        drop(f);
        // B holds a file open, with records over its space, when it dies.
        let held = make(&b, "/held");
        write_all(&held, &pattern(6, 512 * KIB), 0);
        let _ = read_all(&held, 4096);
        kill_and_wait(pid_of(&s.b));
        std::mem::forget(held);
        std::mem::forget(b);
    }
    let gone = wait_for("A sees the member gone", Duration::from_secs(10), || {
        share(&s.a, "members") == "0"
    });
    eprintln!("member gone after {gone:?}");
    // The export connections are cut off as A counts B gone.
    wait_for(
        "A cuts the export connections off",
        Duration::from_secs(5),
        || cuts() > cuts_before,
    );
    assert_eq!(cuts(), cuts_before + 1);
    // A serves its own clients meanwhile, and frees the dead member's file's space once the
    // member is surely fenced, not never.
    let t = Instant::now();
    a.truncate("/held", 0).unwrap();
    let took = t.elapsed();
    eprintln!("the truncate took {took:?}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    // And again before the space was reused, B being surely fenced by then.
    assert_eq!(cuts(), cuts_before + 2);
    let f = make(&a, "/after");
    write_all(&f, b"still serving", 0);
    drop(f);
    let _ = moneta(&["stop", "--socket", s.b.to_str().unwrap()]);

    // B again.
    s.restart_b();
    let b = Moneta::connect(&s.b).unwrap();
    let f = b.open("/kept", &ro()).unwrap();
    assert_eq!(read_all(&f, kept.len()), kept);

    // The manager's host dies.
    kill_and_wait(pid_of(&s.a));
    s.stop_export();
    let t = Instant::now();
    let e = loop {
        match b.stat("/kept") {
            Err(e) => break e,
            Ok(_) => {
                assert!(t.elapsed() < Duration::from_secs(10), "B never noticed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    eprintln!("B failed a call {:?} after the kill: {e}", t.elapsed());
    assert_eq!(e.errno(), libc::EIO, "{e}");
    wait_for("B fences itself", Duration::from_secs(10), || {
        share(&s.b, "state") == "down"
    });
    assert!(share(&s.b, "fences").parse::<u64>().unwrap() >= 1);
    // Reads through the open handle fail, not hang, and not with stale bytes.
    let mut buf = vec![0u8; 4096];
    let t = Instant::now();
    let r = f.read_at(&mut buf, 0);
    assert!(r.is_err(), "a read after the fence must fail");
    assert!(t.elapsed() < Duration::from_secs(10));
    drop(f);
    drop(b);

    // A comes back on its image; B rejoins by itself; what B made durable is there.
    let _ = std::fs::remove_file(s.a.with_extension("pid"));
    s.start_a();
    s.wait_joined(&s.b);
    let b = Moneta::connect(&s.b).unwrap();
    let f = b.open("/kept", &ro()).unwrap();
    assert_eq!(
        read_all(&f, kept.len()),
        kept,
        "B's durable file after A's kill"
    );
    let f = b.open("/after", &ro()).unwrap();
    assert_eq!(read_all(&f, 100), b"still serving");
}

/// Unmodified SQLite on both hosts at once, through `moneta run`, writing one database: the
/// locks are A's manager's for every host's clients, so every insert lands once and the
/// database checks whole.
#[test]
fn sqlite_writers_on_both_hosts_keep_every_row() {
    let s = Shared::new("sqlite", 15, false);
    let _ = built("libmoneta.so");
    let sqlite = |h: usize, sql: &str| {
        let socket = if h == 0 { &s.a } else { &s.b };
        s.net.run(
            h,
            "env",
            &[
                &format!("MONETA_SOCKET={}", socket.display()),
                env!("CARGO_BIN_EXE_moneta"),
                "run",
                "--",
                "sqlite3",
                "-cmd",
                ".timeout 30000",
                "/moneta/t.db",
                sql,
            ],
        )
    };
    let o = sqlite(
        0,
        "create table t(a integer primary key, host text, n integer)",
    );
    assert!(o.status.success(), "{}", text(&o));
    const ROWS: usize = 150;
    std::thread::scope(|scope| {
        let writers: Vec<_> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(h, name)| {
                let sql: String = (0..ROWS)
                    .map(|i| format!("insert into t(host, n) values('{name}', {i});"))
                    .collect();
                let sqlite = &sqlite;
                scope.spawn(move || sqlite(h, &sql))
            })
            .collect();
        for w in writers {
            let o = w.join().unwrap();
            assert!(o.status.success(), "{}", text(&o));
        }
    });
    for h in [0, 1] {
        let o = sqlite(
            h,
            "select count(*), count(distinct host || n), sum(host = 'a'), sum(host = 'b') \
             from t; pragma integrity_check;",
        );
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("{}|{}|{ROWS}|{ROWS}\nok\n", 2 * ROWS, 2 * ROWS),
            "host {h}"
        );
    }
}

/// A process on a member host forks with a file of the shared file system open: the child
/// inherits it (reads what the parent wrote, writes at the shared offset), the parent goes on
/// after it, and the manager's host lets the bundle go once no process holds its pipe.
#[test]
fn a_child_forked_on_a_member_host_inherits_its_parents_files() {
    let s = Shared::new("fork", 16, false);
    let _ = built("libmoneta.so");
    let script = "import os\n\
        fd = os.open('/moneta/forked', os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)\n\
        os.write(fd, b'parent;')\n\
        pid = os.fork()\n\
        if pid == 0:\n\
        \x20   os.write(fd, b'child;')\n\
        \x20   os._exit(0 if os.pread(fd, 100, 0) == b'parent;child;' else 1)\n\
        _, status = os.waitpid(pid, 0)\n\
        assert status == 0, status\n\
        os.write(fd, b'parent again;')\n\
        print(os.pread(fd, 100, 0).decode())\n";
    let o = s.net.run(
        1,
        "env",
        &[
            &format!("MONETA_SOCKET={}", s.b.display()),
            env!("CARGO_BIN_EXE_moneta"),
            "run",
            "--",
            "python3",
            "-c",
            script,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(o.stdout, b"parent;child;parent again;\n");
    assert!(
        !text(&o).contains("will not inherit"),
        "the child inherited nothing: {}",
        text(&o)
    );
    let a = Moneta::connect(&s.a).unwrap();
    let f = a.open("/forked", &ro()).unwrap();
    assert_eq!(read_all(&f, 100), b"parent;child;parent again;");
    wait_for("A lets the bundle go", Duration::from_secs(10), || {
        share(&s.a, "bundles") == "0"
    });
    assert!(share(&s.a, "sessions_served").parse::<u64>().unwrap() >= 2);
}

/// A relay of TCP connections on host `h`, from `listen_port` of that host's loopback to
/// `host:port`, as a process of its own: stopping it (`SIGSTOP`) cuts what goes through it
/// without closing anything, as a network that stops carrying packets does.
const RELAY: &str = "
import socket, sys, threading
host, port, listen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', listen))
l.listen(16)
def pipe(a, b):
    while True:
        d = a.recv(65536)
        if not d:
            break
        b.sendall(d)
    b.shutdown(socket.SHUT_WR)
while True:
    c, _ = l.accept()
    u = socket.create_connection((host, port))
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c), daemon=True).start()
";

/// A member daemon stopped (`SIGSTOP`) past its lease while the manager link is cut and its
/// client keeps writing: the manager's host counts it gone, frees the file's space once it is
/// surely fenced and gives it to another file; when the member runs again (the link still
/// cut), the write its client left waiting is refused, its lease having run out, not forwarded
/// into the other file.
#[test]
fn a_member_stopped_past_its_lease_forwards_nothing_when_it_runs_again() {
    let mut s = Shared::new("frozen", 17, false);
    if s.net.spaces.is_none() {
        // On one loopback network the relay could not stand between the hosts (and under
        // CI=true `Net::new` has already failed without root).
        eprintln!("not root: this test needs the hosts' own networks");
        return;
    }
    // B joins again through a relay on its own host, which the test can stop.
    let (relay, via) = Relay::instead_of_b(&s, RELAY, s.port, &[]);
    s.share_from = Some(via);
    s.restart_b();

    let a = Moneta::connect(&s.a).unwrap();
    const LEN: usize = 256 * KIB;
    nearly_full_but_v(&a, LEN);

    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, writes, b_socket) = (stop.clone(), writes.clone(), s.b.clone());
        std::thread::spawn(move || {
            let b = Moneta::connect(&b_socket).unwrap();
            let f = b.open("/v", &rw()).unwrap();
            let mine = vec![0xB1; 16 * KIB];
            while !stop.load(Ordering::Relaxed) {
                for off in (0..LEN).step_by(mine.len()) {
                    if f.write_at(&mine, off as u64).is_ok() {
                        writes.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    wait_for("B writes", Duration::from_secs(10), || {
        writes.load(Ordering::Relaxed) > 10
    });
    // The manager link stops carrying anything; the member stops at once after, well within
    // its lease, its client's next write waiting in the channel.
    let b_pid = pid_of(&s.b);
    // SAFETY: signalling processes this test started.
    relay.signal(libc::SIGSTOP);
    // SAFETY: as above.
    unsafe { libc::kill(b_pid, libc::SIGSTOP) };
    wait_for("A counts the member gone", Duration::from_secs(10), || {
        share(&s.a, "members") == "0"
    });
    // Waits until the member is surely fenced, then frees v's space, which w takes.
    a.truncate("/v", 0).unwrap();
    let w = make(&a, "/w");
    write_all(&w, &vec![0xA7; LEN], 0);
    // SAFETY: as above.
    unsafe { libc::kill(b_pid, libc::SIGCONT) };
    wait_for("B fences itself", Duration::from_secs(10), || {
        share(&s.b, "fences").parse::<u64>().unwrap_or(0) >= 1
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let back = read_all(&w, LEN);
    assert!(
        back.iter().all(|&x| x == 0xA7),
        "{} bytes of w were written by the member after its lease ran out",
        back.iter().filter(|&&x| x != 0xA7).count()
    );
    // The link carries again: B joins by itself and reads w whole.
    relay.signal(libc::SIGCONT);
    s.wait_joined(&s.b);
    assert_eq!(read_through(&s.b, "/w", LEN), back);
    let _ = moneta(&["stop", "--socket", s.b.to_str().unwrap()]);
}

/// `path` read whole through the daemon at `socket`, asked again for up to 10 s while the
/// member's links come back (a cut ends its export connections).
fn read_through(socket: &Path, path: &str, len: usize) -> Vec<u8> {
    let m = Moneta::connect(socket).unwrap();
    let t = Instant::now();
    loop {
        match m.open(path, &ro()).and_then(|f| try_read_all(&f, len)) {
            Ok(g) => return g,
            Err(_) if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{path} cannot be read through {}: {e}", socket.display()),
        }
    }
}

/// Key `KEY` of the device report of the daemon at `socket`.
fn model(socket: &Path, key: &str) -> String {
    libmoneta::Control::connect(socket)
        .and_then(|c| c.model())
        .ok()
        .and_then(|m| m.get(key).map(str::to_string))
        .unwrap_or_default()
}

/// A relay like [`RELAY`] that holds what its clients send, and their ends, while the file
/// `argv[4]` exists, and passes it all on once the file is gone: a network that delays a
/// request past its sender's timeout and delivers it later. While the file `argv[4].reset`
/// exists too, a client whose bytes it holds has its connection reset (the client sees its
/// link break at once) and the bytes still go on later: a request on a broken connection
/// that the server receives all the same.
const HOLDING_RELAY: &str = "
import os, socket, struct, sys, threading, time
host, port, listen, flag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', listen))
l.listen(16)
def held():
    return os.path.exists(flag)
def pipe(a, b, holds):
    kept = []
    a.settimeout(0.02)
    ended = False
    while not ended or kept:
        if holds and kept and not ended and held() and os.path.exists(flag + '.reset'):
            a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
            a.close()
            ended = True
            continue
        if not ended:
            try:
                d = a.recv(65536)
                if d:
                    kept.append(d)
                else:
                    ended = True
            except socket.timeout:
                pass
            except OSError:
                ended = True
        elif holds and held():
            time.sleep(0.02)
            continue
        if kept and not (holds and held()):
            try:
                b.sendall(b''.join(kept))
            except OSError:
                return
            kept = []
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
while True:
    c, _ = l.accept()
    u = socket.create_connection((host, port))
    threading.Thread(target=pipe, args=(c, u, True), daemon=True).start()
    threading.Thread(target=pipe, args=(u, c, False), daemon=True).start()
";

/// A write the member's link gave up on (the member's timeout, its NBD request held up in the
/// network) reaches the manager's export only after the manager freed its space and gave it to
/// another file: the member said so when it answered the revocation, the manager cut the
/// export connections off, and the late write is refused there.
#[test]
fn a_write_the_member_gave_up_on_never_lands_in_reused_space() {
    given_up_write_never_lands("cut", 19, false);
}

/// The same with the member's connection reset under a write the network holds: the write
/// fails at once, with the connection, and may still reach the export; it counts as given up
/// all the same.
#[test]
fn a_write_on_a_connection_that_broke_never_lands_in_reused_space() {
    given_up_write_never_lands("reset", 20, true);
}

/// B's write held up in the network until B gives it up (`reset`: B's connection is reset
/// under it; otherwise B's timeout runs out), while A frees its space and gives it to another
/// file; then the network lets the write go.
fn given_up_write_never_lands(name: &str, net: u8, reset: bool) {
    let mut s = Shared::new(name, net, false);
    if s.net.spaces.is_none() {
        eprintln!("not root: this test needs the hosts' own networks");
        return;
    }
    // B again, its NBD link through a relay on its own host.
    let hold = s.dir.join("hold");
    let reset_flag = s.dir.join("hold.reset");
    let (_relay, via) =
        Relay::instead_of_b(&s, HOLDING_RELAY, s.port + 1, &[hold.to_str().unwrap()]);
    s.nbd_via = Some(via);
    s.restart_b();

    let a = Moneta::connect(&s.a).unwrap();
    const LEN: usize = 256 * KIB;
    let v = make(&a, "/v");
    write_all(&v, &vec![0x11; LEN], 0);
    drop(v);
    let st = a.statfs().unwrap();
    let free = (st.chunks_free * st.chunk_size) as usize;
    let filler = make(&a, "/filler");
    write_all(&filler, &vec![0x22; free - LEN / 2], 0);
    drop(filler);
    // A file past v's space, to free without reusing v's.
    let x = make(&a, "/x");
    write_all(&x, &[0x33; 16 * KIB], 0);
    drop(x);
    let b = Moneta::connect(&s.b).unwrap();
    let f = b.open("/v", &rw()).unwrap();
    let mine = vec![0xB1; 16 * KIB];
    write_all(&f, &mine, 0);
    let uncertain = || {
        model(&s.b, "members.0.uncertain_writes")
            .parse::<u64>()
            .unwrap()
    };

    // The first B, stopped at the start, is counted fenced at the first revocation after its
    // fence, which cuts the connections off: that comes first here.
    let scratch = make(&a, "/scratch");
    write_all(&scratch, &[0x44; 4 * KIB], 0);
    drop(scratch);
    a.truncate("/scratch", 0).unwrap();
    assert_eq!(share(&s.a, "fenced"), "1");

    // A read held up and given up on changes nothing at the array: freeing space after it
    // cuts nothing off.
    std::fs::write(&hold, b"").unwrap();
    let mut page = vec![0u8; 4 * KIB];
    assert!(
        f.read_at(&mut page, 0).is_err(),
        "a read got through a held network"
    );
    assert!(model(&s.b, "members.0.failures").parse::<u64>().unwrap() > 0);
    assert_eq!(uncertain(), 0, "a read counted as a write given up");
    let cuts: u64 = share(&s.a, "cuts").parse().unwrap();
    a.truncate("/x", 0).unwrap();
    assert_eq!(
        share(&s.a, "cuts").parse::<u64>().unwrap(),
        cuts,
        "a revocation answered after a failed read cut the export connections off"
    );
    std::fs::remove_file(&hold).unwrap();
    wait_for("B's link carries again", Duration::from_secs(10), || {
        f.read_at(&mut page, 0).is_ok()
    });

    // B writes v until a write of it is held up and given up on.
    std::fs::write(&hold, b"").unwrap();
    if reset {
        std::fs::write(&reset_flag, b"").unwrap();
    }
    let t = Instant::now();
    let given_up = (0..LEN)
        .step_by(mine.len())
        .find(|&off| f.write_at(&mine, off as u64).is_err());
    assert!(
        given_up.is_some(),
        "no write of B failed while the network held them"
    );
    if reset {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "B's write failed only after {:?}, not with its connection",
            t.elapsed()
        );
        // Its link's next connections are held, not reset.
        std::fs::remove_file(&reset_flag).unwrap();
    }
    drop((f, b));
    assert!(uncertain() > 0, "B counts the write it gave up on");

    // v's space goes to w; the member's answer to the revocation says a write was given up.
    a.truncate("/v", 0).unwrap();
    assert!(
        share(&s.a, "cuts").parse::<u64>().unwrap() > cuts,
        "the member's failed write cut the export connections off"
    );
    let w = make(&a, "/w");
    write_all(&w, &vec![0xA7; LEN], 0);

    // What the network held now reaches the export.
    std::fs::remove_file(&hold).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let back = read_all(&w, LEN);
    assert!(
        back.iter().all(|&x| x == 0xA7),
        "{} bytes of w were written by a request the member had given up on",
        back.iter().filter(|&&x| x != 0xA7).count()
    );
    // The member's link connects again and it reads w whole.
    assert_eq!(read_through(&s.b, "/w", LEN), back);
    let _ = moneta(&["stop", "--socket", s.b.to_str().unwrap()]);
}
