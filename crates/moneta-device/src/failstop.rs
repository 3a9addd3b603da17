//! Fail-stop for the device's own threads.
//!
//! The poller serves every channel, the flusher every durability point, a member's link every
//! request forwarded to it, and the daemon has threads of the same kind (the control server,
//! the releaser of freed files). Should one of them panic (a defect), the rest of the process
//! would live on without it: the daemon would still answer on its socket, so its clients would
//! take it for alive and wait for what never comes. A thread that carries a [`FailStop`] takes
//! the whole process down instead, as a kill would: clients see the daemon gone and fail their
//! calls with a clear error, and what the array held stays as a kill leaves it (the file
//! system is crash-consistent). Threads that serve one client alone (a connection's) do not
//! carry one: their panic ends that connection only.

/// Aborts the process when dropped while its thread unwinds from a panic.
pub struct FailStop {
    what: &'static str,
}

impl FailStop {
    /// A guard for the thread that does `what` (named in the message it leaves).
    pub fn new(what: &'static str) -> FailStop {
        FailStop { what }
    }
}

impl Drop for FailStop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The panic's own message went to standard error (the daemon's log) before the
            // unwinding reached here.
            tracing::error!(
                "the {} stopped on a defect: stopping the process",
                self.what
            );
            eprintln!(
                "moneta: the {} stopped on a defect: stopping the process",
                self.what
            );
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;
    use std::process::Command;

    /// Set in the copy of this test binary that the tests below start.
    const CHILD: &str = "MONETA_FAILSTOP_CHILD";

    /// In the child: a thread panics, with or without a guard, and the main thread exits 0
    /// if it outlives it.
    fn child(guarded: bool) {
        let t = std::thread::spawn(move || {
            let _stop = guarded.then(|| FailStop::new("test worker"));
            panic!("a defect in the test worker");
        });
        let _ = t.join();
        std::process::exit(0);
    }

    /// Runs test `name` of this binary in a child process with [`CHILD`] set.
    fn run_child(name: &str) -> std::process::Output {
        Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .expect("start the test binary")
    }

    #[test]
    fn a_panicking_thread_with_the_guard_stops_the_process() {
        if std::env::var_os(CHILD).is_some() {
            child(true);
        }
        let out = run_child("failstop::tests::a_panicking_thread_with_the_guard_stops_the_process");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{err}");
        assert!(err.contains("a defect in the test worker"), "{err}");
        assert!(err.contains("the test worker stopped on a defect"), "{err}");
    }

    #[test]
    fn without_the_guard_the_process_outlives_the_thread() {
        if std::env::var_os(CHILD).is_some() {
            child(false);
        }
        let out = run_child("failstop::tests::without_the_guard_the_process_outlives_the_thread");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(err.contains("a defect in the test worker"), "{err}");
    }
}
