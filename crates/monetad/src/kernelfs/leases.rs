//! Lease breaks: how the daemon learns, before the kernel changes a file, that it is about to.
//!
//! The daemon holds a write lease on its own open file description of every file whose
//! records it has installed. The kernel grants one only while no other description of the
//! file exists, and breaks it before any other open, and before a truncate by path: the
//! opener waits (up to `/proc/sys/fs/lease-break-time` seconds) while the kernel tells the
//! holder with a signal. Truncating, punching, moving (defragmenting), reflinking into or
//! writing a file all need a description of it, so nothing can change a leased file's blocks
//! without that signal. The watcher answers it by revoking every channel's records of the
//! file (waiting until no request that used them is in flight) and only then giving the lease
//! back. The signal is a real-time one, blocked in every thread and read from a signalfd;
//! as a signal can be lost (a full real-time queue falls back to `SIGIO`), the watcher also
//! asks every lease's state ten times a second.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use super::Files;

/// The break signal is `SIGRTMIN` plus this (the C library keeps the first ones).
pub const BREAK_SIGNAL_OFFSET: libc::c_int = 3;

/// How often every lease's state is asked, whatever the signals say.
const SWEEP: Duration = Duration::from_millis(100);

fn signal_set(signal: libc::c_int) -> libc::sigset_t {
    // SAFETY: a sigset_t is plain data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, signal);
        set
    }
}

/// Blocks the break signal in the calling thread, and so in every thread it starts from now
/// on; call before the daemon starts any. Returns the signal.
pub fn block_break_signal() -> libc::c_int {
    let signal = libc::SIGRTMIN() + BREAK_SIGNAL_OFFSET;
    let set = signal_set(signal);
    // SAFETY: changes this thread's signal mask; `set` is initialised.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    signal
}

/// Starts the thread that answers lease breaks of `files`' leases.
pub fn start_watcher(files: Arc<Files>, signal: libc::c_int) -> std::io::Result<()> {
    let set = signal_set(signal);
    // SAFETY: creates a new descriptor for a blocked signal; `set` is initialised.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    std::thread::Builder::new()
        .name("moneta-leases".into())
        .spawn(move || {
            let _stop =
                moneta_device::failstop::FailStop::new("kernel file system's lease watcher");
            watch(&files, &fd)
        })?;
    Ok(())
}

fn watch(files: &Files, fd: &OwnedFd) {
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    while !files.stopped() {
        let mut pfd = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: SWEEP.as_nanos() as _,
        };
        let _ = rustix::event::poll(&mut pfd, Some(&timeout));
        loop {
            match rustix::io::read(fd.as_fd(), &mut info) {
                Ok(n) if n == info.len() => {
                    // ssi_fd: after ssi_signo, ssi_errno, ssi_code, ssi_pid and ssi_uid.
                    let raw = i32::from_ne_bytes(info[20..24].try_into().expect("4 bytes"));
                    files.lease_broken(raw);
                }
                _ => break,
            }
        }
        files.sweep();
    }
}
