//! Hosts on one machine for the tests of devices joined over a network: network namespaces
//! joined by a veth pair (root), or the loopback network; key files; exports; kills.

use std::path::Path;
use std::process::Command as Process;
use std::time::{Duration, Instant};

use super::{pattern, text};

/// Two hosts' networks: a namespace each, joined by a veth pair (root), or both on loopback.
pub struct Net {
    /// The namespaces of hosts A and B, when made.
    pub spaces: Option<[String; 2]>,
    /// A's address, where B reaches A's export (when B joins A too).
    pub a_addr: String,
    /// B's address, where A reaches its export.
    pub b_addr: String,
}

fn ip(args: &[&str]) {
    let o = Process::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2)");
    assert!(o.status.success(), "ip {args:?}: {}", text(&o));
}

impl Net {
    pub fn new(n: u8) -> Net {
        if !rustix::process::geteuid().is_root() {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "the network namespaces of the distributed tests need root, and CI must run them"
            );
            eprintln!("not root: both hosts on the loopback network");
            return Net {
                spaces: None,
                a_addr: "127.0.0.1".into(),
                b_addr: "127.0.0.1".into(),
            };
        }
        let pid = std::process::id();
        let spaces = [format!("moneta-a{n}-{pid}"), format!("moneta-b{n}-{pid}")];
        let veth = [
            format!("mva{n}-{}", pid % 100_000),
            format!("mvb{n}-{}", pid % 100_000),
        ];
        for s in &spaces {
            ip(&["netns", "add", s]);
        }
        ip(&[
            "link", "add", &veth[0], "netns", &spaces[0], "type", "veth", "peer", "name", &veth[1],
            "netns", &spaces[1],
        ]);
        for (i, (s, v)) in spaces.iter().zip(&veth).enumerate() {
            let addr = format!("10.213.{n}.{}/24", i + 1);
            ip(&["-n", s, "addr", "add", &addr, "dev", v]);
            ip(&["-n", s, "link", "set", v, "up"]);
            ip(&["-n", s, "link", "set", "lo", "up"]);
        }
        Net {
            a_addr: format!("10.213.{n}.1"),
            b_addr: format!("10.213.{n}.2"),
            spaces: Some(spaces),
        }
    }

    /// `moneta ARGS` on host `h` (0: A, 1: B).
    pub fn moneta(&self, h: usize, args: &[&str]) -> std::process::Output {
        self.run(h, env!("CARGO_BIN_EXE_moneta"), args)
    }

    /// `program` to run on host `h`.
    fn command(&self, h: usize, program: &str) -> Process {
        match &self.spaces {
            Some(s) => {
                let mut c = Process::new("ip");
                c.args(["netns", "exec", &s[h], program]);
                c
            }
            None => Process::new(program),
        }
    }

    /// A program on host `h`, started and left running (`ip netns exec` execs it, so the
    /// child's process id is the program's).
    pub fn spawn(&self, h: usize, program: &str, args: &[&str]) -> std::process::Child {
        self.command(h, program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// A program on host `h`.
    pub fn run(&self, h: usize, program: &str, args: &[&str]) -> std::process::Output {
        self.command(h, program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} (scripts/test.sh installs it): {e}"))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if let Some(spaces) = &self.spaces {
            for s in spaces {
                let _ = Process::new("ip").args(["netns", "del", s]).output();
            }
        }
    }
}

/// A key file as nbdkit and libnbd read it: `user:hex`.
pub fn key_file(path: &Path, seed: u8) {
    let hex: String = pattern(seed, 32)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(path, format!("member:{hex}\n")).unwrap();
}

/// Starts an export of `range` of the daemon at `socket` on host `h`, listening at
/// `addr:port` and requiring TLS with the key in `psk`; returns its process id.
pub fn export_on(
    net: &Net,
    h: usize,
    socket: &Path,
    range: &str,
    addr: &str,
    port: u16,
    psk: &Path,
) -> i32 {
    let pid = socket.with_extension("export.pid");
    let _ = std::fs::remove_file(&pid);
    let psk = format!("--tls-psk={}", psk.display());
    let o = net.moneta(
        h,
        &[
            "export",
            "--socket",
            socket.to_str().unwrap(),
            "--range",
            range,
            "--ip",
            addr,
            "--port",
            &port.to_string(),
            "--pidfile",
            pid.to_str().unwrap(),
            "--",
            "--tls=require",
            &psk,
        ],
    );
    assert!(o.status.success(), "moneta export: {}", text(&o));
    std::fs::read_to_string(&pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Kills a process this test started and waits until it is gone.
pub fn kill_and_wait(p: i32) {
    // SAFETY: signalling a process this test started.
    unsafe { libc::kill(p, libc::SIGKILL) };
    let t = Instant::now();
    // SAFETY: as above; signal 0 only checks for the process.
    while unsafe { libc::kill(p, 0) } == 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
}
