//! Unmodified programs under the shim (`moneta run`) on ext4 and XFS made on the array
//! (`monetad --kernel-fs`): `dd`, `fio` with CRC32C verification, a shell sharing a
//! descriptor's position between duplicates, and a Python program that forks, maps the file
//! into memory and sends it to a child program; their data goes through the channel (the
//! daemon's counters say so), the kernel reads back exactly what they wrote, and `e2fsck -fn`
//! or `xfs_repair -n` is clean afterwards. Needs root (a loop device and a mount); CI runs it
//! as root.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use common::{bin_dir, built, pattern, text};

/// Whether the test can run; without root it says why (and fails under CI, which must run it).
fn root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "the kernel file system tests need root, and CI must run them"
    );
    eprintln!("SKIPPED: --kernel-fs needs root (a loop device and a mount)");
    false
}

/// A daemon serving `kind` on a persistent array of its own; stopped at the end.
struct Kfs {
    dir: PathBuf,
    socket: PathBuf,
    mount: PathBuf,
    image: PathBuf,
    kind: &'static str,
    stopped: bool,
}

impl Kfs {
    /// `tag` names the test's directory.
    fn start(kind: &'static str, tag: &str) -> Kfs {
        let _ = built("libmoneta.so");
        let dir = std::env::temp_dir().join(format!(
            "moneta-kfs-shim-{tag}-{kind}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("monetad.sock");
        let mount = dir.join("mnt");
        let image = dir.join("array.img");
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("start")
            .arg("--socket")
            .arg(&socket)
            .arg("--device")
            .arg(&image)
            .args([
                "--size",
                "320M",
                "--",
                "--kernel-fs",
                kind,
                "--kernel-fs-mount",
            ])
            .arg(&mount)
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta start: {}", text(&o));
        Kfs {
            dir,
            socket,
            mount,
            image,
            kind,
            stopped: false,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    /// `moneta run -- args...` against this daemon (the prefix is the daemon's mount, which
    /// `moneta run` asks it for).
    fn run(&self, args: &[&str]) -> Output {
        let child = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("run")
            .arg("--socket")
            .arg(&self.socket)
            .args(["--no-start", "--report", "--"])
            .args(args)
            .env_remove("MONETA_MOUNT")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.wait_with_output().unwrap()
    }

    fn run_ok(&self, args: &[&str]) -> Output {
        let o = self.run(args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        o
    }

    /// Bytes the daemon read and wrote through channels so far.
    fn moved(&self) -> (u64, u64) {
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("status")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--json")
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta status: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (
            v["bytes_read"].as_u64().unwrap(),
            v["bytes_written"].as_u64().unwrap(),
        )
    }

    /// Stops the daemon (which unmounts) and checks the file system on the image.
    fn stop_and_check(mut self) {
        let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
            .arg("stop")
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .unwrap();
        assert!(o.status.success(), "moneta stop: {}", text(&o));
        self.stopped = true;
        let o = match self.kind {
            "ext4" => Command::new("e2fsck").arg("-fn").arg(&self.image).output(),
            _ => Command::new("xfs_repair")
                .args(["-n", "-f"])
                .arg(&self.image)
                .output(),
        }
        .expect("run the checker");
        assert!(o.status.success(), "{} check: {}", self.kind, text(&o));
    }
}

impl Drop for Kfs {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = Command::new(env!("CARGO_BIN_EXE_moneta"))
                .arg("stop")
                .arg("--socket")
                .arg(&self.socket)
                .output();
        }
        let mounted = std::fs::read_to_string("/proc/self/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(1) == self.mount.to_str());
        if mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn programs_go_through_the_channel(kind: &'static str) {
    let k = Kfs::start(kind, "programs");
    // `moneta status` says what the daemon serves and where.
    let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .arg("status")
        .arg("--socket")
        .arg(&k.socket)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kernel_fs"]["kind"], kind, "{v}");
    assert_eq!(
        v["kernel_fs"]["mount"],
        std::fs::canonicalize(&k.mount).unwrap().to_str().unwrap(),
        "{v}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .arg("status")
        .arg("--socket")
        .arg(&k.socket)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("serves {kind} on ")),
        "{}",
        text(&o)
    );
    let src = k.dir.join("src");
    let data = pattern(7, 3 << 20);
    std::fs::write(&src, &data).unwrap();

    // dd writes the file through the channel (growing it: the daemon allocates).
    let a = k.path("a");
    let (_, w0) = k.moved();
    let o = k.run_ok(&[
        "dd",
        &format!("if={}", s(&src)),
        &format!("of={}", s(&a)),
        "bs=64k",
    ]);
    let report = String::from_utf8_lossy(&o.stderr);
    assert!(report.contains("1 opens"), "{report}");
    let (r1, w1) = k.moved();
    assert!(
        w1 - w0 >= data.len() as u64,
        "dd's writes did not go through the channel ({} bytes)",
        w1 - w0
    );
    assert!(
        std::fs::read(&a).unwrap() == data,
        "the kernel reads other bytes"
    );

    // Written in place at an odd offset, after the modification time was put in the past:
    // the channel's writes move it forward.
    let past = SystemTime::now() - Duration::from_secs(10_000);
    std::fs::File::options()
        .write(true)
        .open(&a)
        .unwrap()
        .set_modified(past)
        .unwrap();
    let patch = k.dir.join("patch");
    let patch_data = pattern(99, 70_001);
    std::fs::write(&patch, &patch_data).unwrap();
    k.run_ok(&[
        "dd",
        &format!("if={}", s(&patch)),
        &format!("of={}", s(&a)),
        "bs=1",
        "seek=4099",
        "conv=notrunc",
        "iflag=count_bytes",
        &format!("count={}", patch_data.len()),
        "obs=65536",
    ]);
    let mut expect = data.clone();
    expect[4099..4099 + patch_data.len()].copy_from_slice(&patch_data);
    assert!(std::fs::read(&a).unwrap() == expect, "the patch is wrong");
    let mtime = std::fs::metadata(&a).unwrap().modified().unwrap();
    assert!(
        mtime > past + Duration::from_secs(5_000),
        "writes through the channel left the modification time behind"
    );

    // dd reads it back through the channel.
    let out = k.dir.join("out");
    k.run_ok(&[
        "dd",
        &format!("if={}", s(&a)),
        &format!("of={}", s(&out)),
        "bs=64k",
    ]);
    let (r2, _) = k.moved();
    assert!(
        r2 - r1 >= expect.len() as u64,
        "dd's reads did not go through the channel"
    );
    assert!(
        std::fs::read(&out).unwrap() == expect,
        "dd read other bytes"
    );

    // fio, random reads and writes with CRC32C verification.
    let f = k.path("fio.dat");
    let (_, w2) = k.moved();
    let o = k.run_ok(&[
        "fio",
        "--name=verify",
        &format!("--filename={}", s(&f)),
        "--size=8M",
        "--bs=4k",
        "--rw=randrw",
        "--ioengine=psync",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("err= 0"), "fio: {}", text(&o));
    let (_, w3) = k.moved();
    assert!(
        w3 - w2 >= 4 << 20,
        "fio's writes did not go through the channel"
    );

    // A shell: duplicates of one descriptor share its position (`exec 4>`, then `>&4` on a
    // builtin dups it onto standard output in the shell itself); a child program inherits a
    // descriptor (given back to the kernel at the fork) and reads from its position.
    let b = k.path("b");
    let script = format!(
        "exec 4>{b}; echo one >&4; echo two >&4; printf three >&4; exec 4>&-; \
         exec 3<{a}; dd bs=1000 count=1 <&3 >/dev/null 2>&1; head -c 10 <&3",
        b = s(&b),
        a = s(&a)
    );
    let o = k.run_ok(&["sh", "-c", &script]);
    assert_eq!(std::fs::read(&b).unwrap(), b"one\ntwo\nthree");
    assert_eq!(
        o.stdout,
        expect[1000..1010],
        "the inherited position is wrong"
    );

    k.stop_and_check();
}

#[test]
fn programs_on_ext4_go_through_the_channel() {
    if root() {
        programs_go_through_the_channel("ext4");
    }
}

#[test]
fn programs_on_xfs_go_through_the_channel() {
    if root() {
        programs_go_through_the_channel("xfs");
    }
}

/// A process that forks shares the position with its child; a mapping and a file lock give
/// the file back to the kernel, and what the channel wrote before is what they see.
#[test]
fn fork_mmap_and_locks_keep_posix_semantics() {
    if !root() {
        return;
    }
    let k = Kfs::start("ext4", "fork");
    let c = k.path("c");
    let script = r#"
import fcntl, mmap, os, sys
p = sys.argv[1]
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"parent1;")
pid = os.fork()
if pid == 0:
    os.write(fd, b"child;")
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"parent2;")
os.ftruncate(fd, 4096)
os.pwrite(fd, b"by the channel", 100)
m = mmap.mmap(fd, 4096)
assert m[100:114] == b"by the channel", m[100:114]
m[200:211] = b"by the page"
m.flush()
m.close()
fcntl.lockf(fd, fcntl.LOCK_EX)
assert os.pread(fd, 11, 200) == b"by the page"
os.lseek(fd, 0, os.SEEK_SET)
print(os.read(fd, 22).decode())
os.close(fd)
"#;
    let o = k.run_ok(&["python3", "-c", script, s(&c)]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        "parent1;child;parent2;"
    );
    let got = std::fs::read(&c).unwrap();
    assert_eq!(got.len(), 4096);
    assert_eq!(&got[..22], b"parent1;child;parent2;");
    assert_eq!(&got[100..114], b"by the channel");
    assert_eq!(&got[200..211], b"by the page");
    k.stop_and_check();
}

/// The C interface (`moneta_kernel_*` in `include/moneta.h`): a C program asks the daemon
/// what it serves, opens a file of the mount, writes and reads it through the channel.
#[test]
fn the_c_interface_reads_and_writes_kernel_files() {
    if !root() {
        return;
    }
    let k = Kfs::start("xfs", "c");
    let src = k.dir.join("use.c");
    std::fs::write(
        &src,
        r#"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include "moneta.h"

int main(int argc, char **argv) {
    (void)argc;
    struct moneta_conn *m = moneta_connect(argv[1]);
    if (!m) { perror("connect"); return 1; }
    char mount[4096];
    int kind = moneta_kernel_fs(m, mount, sizeof mount);
    if (kind != 2) { fprintf(stderr, "kind %d\n", kind); return 1; }
    char path[4200];
    snprintf(path, sizeof path, "%s/cfile", mount);
    struct moneta_kernel_file *f = moneta_kernel_open(m, path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (!f) { perror("open"); return 1; }
    if (moneta_kernel_open(m, path, O_RDWR | O_APPEND, 0) != NULL) return 1;
    static unsigned char buf[300000], back[300000];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 7 + i / 300);
    if (moneta_kernel_pwrite(f, buf, sizeof buf, 5000) != (long)sizeof buf) { perror("pwrite"); return 1; }
    if (moneta_kernel_size(f) != 305000) return 1;
    if (moneta_kernel_pread(f, back, sizeof back, 5000) != (long)sizeof back) { perror("pread"); return 1; }
    if (memcmp(buf, back, sizeof buf) != 0) { fprintf(stderr, "differs\n"); return 1; }
    if (moneta_kernel_fsync(f) != 0) return 1;
    if (moneta_kernel_close(f) != 0) return 1;
    moneta_disconnect(m);
    printf("%s\n", path);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = k.dir.join("use");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include");
    let o = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(bin_dir())
        .arg("-lmoneta")
        .arg(format!("-Wl,-rpath,{}", bin_dir().display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "cc: {}", text(&o));
    let (r0, w0) = k.moved();
    let o = Command::new(&exe).arg(&k.socket).output().unwrap();
    assert!(o.status.success(), "the C program: {}", text(&o));
    let (r1, w1) = k.moved();
    assert!(
        r1 - r0 >= 300_000 && w1 - w0 >= 300_000,
        "not through the channel"
    );
    let got = std::fs::read(k.path("cfile")).unwrap();
    assert_eq!(got.len(), 305_000);
    assert!(got[..5000].iter().all(|&b| b == 0));
    let want: Vec<u8> = (0..300_000usize).map(|i| (i * 7 + i / 300) as u8).collect();
    assert!(got[5000..] == want[..], "the kernel reads other bytes");
    k.stop_and_check();
}

/// `moneta export` of a file of the daemon's ext4: NBD clients read and write it through the
/// channel, and the kernel sees what they wrote.
#[test]
fn a_kernel_file_as_an_nbd_export() {
    if !root() {
        return;
    }
    let k = Kfs::start("ext4", "export");
    let disk = k.path("disk.img");
    let data = pattern(11, 4 << 20);
    std::fs::write(&disk, &data).unwrap();
    let sock = k.dir.join("nbd.sock");
    let pid = k.dir.join("nbd.pid");
    let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .arg("export")
        .arg("--socket")
        .arg(&k.socket)
        .arg("--unix")
        .arg(&sock)
        .arg("--pidfile")
        .arg(&pid)
        .arg(&disk)
        .output()
        .unwrap();
    assert!(o.status.success(), "moneta export: {}", text(&o));
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let (r0, _) = k.moved();
    let out = k.dir.join("out.img");
    let o = Command::new("nbdcopy")
        .arg(&uri)
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "nbdcopy: {}", text(&o));
    assert!(
        std::fs::read(&out).unwrap() == data,
        "nbdcopy read other bytes"
    );
    let (r1, w1) = k.moved();
    assert!(
        r1 - r0 >= data.len() as u64,
        "the export did not read through the channel"
    );
    let more = pattern(12, 4 << 20);
    let input = k.dir.join("in.img");
    std::fs::write(&input, &more).unwrap();
    let o = Command::new("nbdcopy")
        .arg(&input)
        .arg(&uri)
        .output()
        .unwrap();
    assert!(o.status.success(), "nbdcopy: {}", text(&o));
    let (_, w2) = k.moved();
    assert!(
        w2 - w1 >= more.len() as u64,
        "the export did not write through the channel"
    );
    let p: i32 = std::fs::read_to_string(&pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: a plain system call.
    unsafe { libc::kill(p, libc::SIGTERM) };
    for _ in 0..500 {
        // SAFETY: a plain system call (is it gone?).
        if unsafe { libc::kill(p, 0) } != 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        std::fs::read(&disk).unwrap() == more,
        "the kernel reads other bytes"
    );
    k.stop_and_check();
}
