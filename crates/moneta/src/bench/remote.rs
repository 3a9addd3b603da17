//! `moneta bench --path remote`: the three Rs article's Figure 3b on this machine. A remote
//! access through distributed Moneta (a channel command on a range another member holds,
//! forwarded by the device over its NBD link, docs/distributed.md) against the same access
//! through a conventional software block transport (a user-space NBD client, libnbd, talking
//! to the member's export over the same network) and against a local access (the device's own
//! array), at queue depth 1 for each request size: latency, and the bandwidth one requester gets.
//!
//! The bench starts its own member (a raw daemon and its export over TCP on loopback, keyed with
//! TLS-PSK as a member across a network would be) and its own forwarding daemon, and stops them
//! at the end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use libmoneta::{Channel, Tag};
use moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};
use moneta_abi::{Command, Completion, Opcode};
use moneta_device::remote::nbd::Conn;
use serde::Serialize;

use super::*;

/// How a request reaches the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// The device's own array, through a channel.
    Local,
    /// A member's range, through a channel: the device forwards the command.
    Forwarded,
    /// The member's export, straight from this process with libnbd.
    NbdClient,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Local => "local (channel)",
            Transport::Forwarded => "remote: Moneta forwarding",
            Transport::NbdClient => "remote: NBD client (libnbd)",
        }
    }
}

/// One transport and request size.
#[derive(Serialize, Clone, Debug)]
pub struct RemotePoint {
    /// Always `remote`.
    pub path: &'static str,
    /// How the requests went.
    pub transport: Transport,
    /// `read` or `write`.
    pub op: &'static str,
    /// Request bytes.
    pub size: u64,
    /// Requests timed.
    pub ops: u64,
    /// Mean latency (ns).
    pub mean_ns: u64,
    /// Median latency (ns).
    pub p50_ns: u64,
    /// 99th percentile (ns).
    pub p99_ns: u64,
    /// Bytes per second one requester at queue depth 1 gets, in MiB/s.
    pub mib_s: f64,
    /// Mean latency over the local access's of the same size (ns; 0 for the local access).
    pub added_ns: u64,
}

/// The member, its export and the forwarding device; stopped on drop.
struct Members {
    dir: PathBuf,
    a: PathBuf,
    b: PathBuf,
    export_pid: Option<i32>,
    uri: String,
}

impl Drop for Members {
    fn drop(&mut self) {
        if let Some(p) = self.export_pid {
            // SAFETY: signalling the export this bench started.
            unsafe { libc::kill(p, libc::SIGTERM) };
        }
        for s in [&self.a, &self.b] {
            let _ = crate::daemon::stop(s);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn set_up(region: u64) -> Result<Members, String> {
    let dir = std::env::temp_dir().join(format!("moneta-bench-remote-{}", std::process::id()));
    monetad::private_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut m = Members {
        a: dir.join("a.sock"),
        b: dir.join("b.sock"),
        dir,
        export_pid: None,
        uri: String::new(),
    };
    let key = m.dir.join("psk");
    let mut secret = [0u8; 32];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut secret))
        .map_err(|e| format!("cannot make a key: {e}"))?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&key, format!("bench:{hex}\n")).map_err(|e| e.to_string())?;
    let size = region.to_string();
    let raw = |extra: &[String]| {
        let mut v: Vec<String> = ["--raw", "--volatile", "--size", &size]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend_from_slice(extra);
        v
    };
    crate::daemon::start(&m.b, &raw(&[]), &m.dir.join("b.log"))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let pid_file = m.dir.join("export.pid");
    let o = std::process::Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .arg("export")
        .arg("--socket")
        .arg(&m.b)
        .args(["--range", "0:0", "--port", &port.to_string(), "--pidfile"])
        .arg(&pid_file)
        .arg("--")
        .arg("--tls=require")
        .arg(format!("--tls-psk={}", key.display()))
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "the member's export did not start: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    m.export_pid = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    m.uri = format!(
        "nbds://bench@127.0.0.1:{port}/?tls-psk-file={}",
        key.display()
    );
    let member = format!("{region}:{region}={}", m.uri);
    crate::daemon::start(
        &m.a,
        &raw(&["--member".into(), member]),
        &m.dir.join("a.log"),
    )?;
    let c = libmoneta::Control::connect(&m.a).map_err(|e| e.to_string())?;
    let t = Instant::now();
    loop {
        let r = c.model().map_err(|e| e.to_string())?;
        match r.get("members.0.state") {
            Some("up") => break,
            _ if t.elapsed() > Duration::from_secs(10) => {
                return Err(format!(
                    "the link to the bench's member never came up: {}",
                    r.get("members.0.last_error").unwrap_or("")
                ))
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    Ok(m)
}

/// Runs every size over the three transports.
pub fn run_remote(a: &BenchArgs) -> Result<Vec<RemotePoint>, String> {
    if a.socket.is_some() {
        return Err("--path remote starts daemons of its own: leave out --socket".into());
    }
    let (op, opname) = match a.op {
        Op::Read => (Opcode::Read, "read"),
        Op::Write => (Opcode::Write, "write"),
        _ => return Err("--path remote measures --op read or write".into()),
    };
    let sizes = if a.size.is_empty() {
        vec![512, 4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
    } else {
        a.size.clone()
    };
    let m = set_up(a.region)?;
    let ch = Channel::open(&m.a).map_err(|e| e.to_string())?;
    ch.control()
        .grant(Grant {
            channel: ch.id(),
            rights: RIGHT_READ | RIGHT_WRITE,
            start: 0,
            len: 2 * a.region,
            file: 0,
        })
        .map_err(|e| format!("cannot grant the bench the address space: {e}"))?;
    let dma = ch.info().dma_size;
    let conn = Conn::start(&m.uri).and_then(|c| c.wait(None).map(|()| c))?;
    let mut out = Vec::new();
    for &size in &sizes {
        if size == 0 || size > dma || size > a.region {
            return Err(format!(
                "--path remote: a request is 1 byte to the channel's DMA buffer ({dma} bytes) \
                 and the region"
            ));
        }
        let mut local_mean = 0;
        for t in [Transport::Local, Transport::Forwarded, Transport::NbdClient] {
            let mut p = measure(a, &ch, &conn, t, op, size)?;
            p.op = opname;
            if t == Transport::Local {
                local_mean = p.mean_ns;
            } else {
                p.added_ns = p.mean_ns.saturating_sub(local_mean);
            }
            if a.json && !a.quiet {
                println!("{}", serde_json::to_string(&p).expect("serialize"));
            }
            out.push(p);
        }
    }
    if !a.json && !a.quiet {
        print_remote(&out);
    }
    Ok(out)
}

fn measure(
    a: &BenchArgs,
    ch: &Channel,
    conn: &Conn,
    t: Transport,
    op: Opcode,
    size: u64,
) -> Result<RemotePoint, String> {
    let base = match t {
        Transport::Forwarded => a.region,
        _ => 0,
    };
    let slots = a.region / size;
    let mut x = a.seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % slots) * size
    };
    let mut buf = vec![0x5au8; size as usize];
    if op == Opcode::Write {
        ch.write_dma(Tag(0), 0, &buf);
    }
    let mut one = |off: u64| -> Result<(), String> {
        match t {
            Transport::Local | Transport::Forwarded => {
                let c = ch
                    .run(
                        Tag(0),
                        &Command::new(op, Completion::Dma, base + off, size, 0),
                    )
                    .map_err(|e| e.to_string())?;
                if c.status != moneta_abi::Status::Ok {
                    return Err(format!("{:?} at {}: {:?}", op, base + off, c.status));
                }
                Ok(())
            }
            Transport::NbdClient => {
                // SAFETY: `buf` outlives the command, which is waited for here.
                let cookie = unsafe {
                    match op {
                        Opcode::Read => conn.read(buf.as_mut_ptr(), size as usize, off),
                        _ => conn.write(buf.as_ptr(), size as usize, off),
                    }
                }?;
                conn.wait(Some(cookie))
            }
        }
    };
    let warm = Instant::now();
    while warm.elapsed().as_secs_f64() < a.warmup {
        one(next())?;
    }
    let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut total = 0u64;
    let mut n = 0u64;
    let began = Instant::now();
    while match a.ops {
        Some(ops) => n < ops,
        None => began.elapsed().as_secs_f64() < a.duration,
    } {
        let off = next();
        let s = Instant::now();
        one(off)?;
        let ns = s.elapsed().as_nanos() as u64;
        total += ns;
        n += 1;
        hist.record(ns.max(1)).map_err(|e| e.to_string())?;
    }
    let mean = total / n.max(1);
    Ok(RemotePoint {
        path: "remote",
        transport: t,
        op: "",
        size,
        ops: n,
        mean_ns: mean,
        p50_ns: hist.value_at_quantile(0.5),
        p99_ns: hist.value_at_quantile(0.99),
        mib_s: size as f64 / mean.max(1) as f64 * 1e9 / (1 << 20) as f64,
        added_ns: 0,
    })
}

fn print_remote(points: &[RemotePoint]) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "op",
        "size",
        "transport",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "MiB/s (QD 1)",
        "added over local µs",
    ]);
    for p in points {
        t.add_row([
            p.op.to_string(),
            p.size.to_string(),
            p.transport.name().to_string(),
            format!("{:.1}", p.mean_ns as f64 / 1e3),
            format!("{:.1}", p.p50_ns as f64 / 1e3),
            format!("{:.1}", p.p99_ns as f64 / 1e3),
            format!("{:.1}", p.mib_s),
            if p.transport == Transport::Local {
                String::new()
            } else {
                format!("{:.1}", p.added_ns as f64 / 1e3)
            },
        ]);
    }
    println!("{t}");
    if let Some(p) = points
        .iter()
        .find(|p| p.size == 4096 && p.transport == Transport::Forwarded)
    {
        println!(
            "a remote 4 KiB {} through Moneta adds {:.1} µs to a local one here (the three Rs \
             article: iSCSI adds 284 µs, Fibre Channel 86 µs)",
            p.op,
            p.added_ns as f64 / 1e3
        );
    }
}
