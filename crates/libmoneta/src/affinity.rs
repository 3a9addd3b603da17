//! Keeping a client's threads off the CPU the device's poller has to itself.
//!
//! The device is a thread of the daemon. An administrator who gives it a CPU of its own
//! (`monetad --poller-cpu`) wants it to be the machine's storage device: a client thread the
//! scheduler puts on that CPU takes turns with the poller, and every request it and everybody
//! else makes then waits for a time slice instead of for the device (two fio jobs on two CPUs
//! fell to a third of one job's rate). The channel header names the poller's CPU
//! (`device_cpu`), and when it does, [`crate::Moneta::connect`] moves the process's threads off
//! it, as `isolcpus` keeps ordinary tasks off a polling core. A thread whose mask holds no
//! other CPU is left where it is (the application pinned it there); threads started later
//! inherit the mask of the thread that starts them. `MONETA_AFFINITY=any` leaves every mask
//! alone.

use rustix::fs::{Mode, OFlags, CWD};
use rustix::process::Pid;
use rustix::thread::CpuSet;

/// Environment variable choosing the [`Affinity`]: `avoid-device` (default) or `any`.
pub const ENV_AFFINITY: &str = "MONETA_AFFINITY";

/// Where a client's threads may run relative to a pinned poller.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Affinity {
    /// Off the poller's CPU, when it has one and a thread may run elsewhere.
    #[default]
    AvoidDevice,
    /// Wherever the application and the scheduler put them.
    Any,
}

impl Affinity {
    /// Parses the value of [`ENV_AFFINITY`].
    pub fn parse(s: &str) -> Option<Affinity> {
        match s.trim() {
            "avoid-device" => Some(Affinity::AvoidDevice),
            "any" => Some(Affinity::Any),
            _ => None,
        }
    }

    /// The setting [`ENV_AFFINITY`] asks for, or the default. An unparsable value is ignored
    /// with a message on standard error, once per process.
    pub fn from_env() -> Affinity {
        static WARNED: std::sync::Once = std::sync::Once::new();
        crate::env_setting(
            ENV_AFFINITY,
            Affinity::parse,
            "avoid-device or any",
            &WARNED,
        )
    }
}

/// Takes `cpu` out of thread `tid`'s mask (`None`: the calling thread) if the mask holds
/// another CPU too. Whether the mask changed.
pub fn keep_thread_off(tid: Option<Pid>, cpu: usize) -> rustix::io::Result<bool> {
    if cpu >= CpuSet::MAX_CPU {
        return Ok(false);
    }
    let mut set = rustix::thread::sched_getaffinity(tid)?;
    if !set.is_set(cpu) || set.count() < 2 {
        return Ok(false);
    }
    set.unset(cpu);
    rustix::thread::sched_setaffinity(tid, &set)?;
    Ok(true)
}

/// Whether the calling thread should poll for an answer from a thread of the daemon rather
/// than sleep until it comes. Polling pays when the waiter has a CPU to itself while the other
/// side works; it does not when the device has a CPU of its own (`device_cpu`) and the waiter
/// may run on only one other CPU, which the daemon's connection threads and the clients share:
/// a thread polling there takes turns with the very thread it waits for (SQLite's control
/// calls took a third longer that way). An unreadable mask counts as room to poll.
pub fn worth_polling(device_cpu: Option<usize>) -> bool {
    let Some(cpu) = device_cpu else { return true };
    let Ok(set) = rustix::thread::sched_getaffinity(None) else {
        return true;
    };
    let others = set.count() as usize - usize::from(cpu < CpuSet::MAX_CPU && set.is_set(cpu));
    others >= 2
}

/// Takes `cpu` out of the mask of every thread of this process that may run elsewhere (see
/// [`keep_thread_off`]). How many threads moved. Uses only system calls (no C library file
/// functions), so the preload shim may call it from inside a hook.
pub fn keep_threads_off(cpu: usize) -> rustix::io::Result<usize> {
    let fd = rustix::fs::openat(
        CWD,
        "/proc/self/task",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut moved = 0;
    for entry in rustix::fs::Dir::new(fd)? {
        let entry = entry?;
        let Some(tid) = std::str::from_utf8(entry.file_name().to_bytes())
            .ok()
            .and_then(|s| s.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        else {
            continue; // "." and ".."
        };
        // A thread may exit between the listing and the call.
        match keep_thread_off(Some(tid), cpu) {
            Ok(true) => moved += 1,
            Ok(false) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse() {
        assert_eq!(Affinity::parse("any"), Some(Affinity::Any));
        assert_eq!(
            Affinity::parse(" avoid-device "),
            Some(Affinity::AvoidDevice)
        );
        assert_eq!(Affinity::parse("avoid"), None);
        assert_eq!(Affinity::default(), Affinity::AvoidDevice);
    }

    #[test]
    fn a_thread_on_one_cpu_stays_there() {
        let allowed = rustix::thread::sched_getaffinity(None).unwrap();
        let Some(cpu) = (0..CpuSet::MAX_CPU).find(|&c| allowed.is_set(c)) else {
            return;
        };
        std::thread::spawn(move || {
            let mut one = CpuSet::new();
            one.set(cpu);
            rustix::thread::sched_setaffinity(None, &one).unwrap();
            assert!(!keep_thread_off(None, cpu).unwrap());
            assert!(rustix::thread::sched_getaffinity(None).unwrap().is_set(cpu));
            // A CPU outside the mask, or past the largest set, changes nothing either.
            assert!(!keep_thread_off(None, CpuSet::MAX_CPU).unwrap());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn polling_needs_two_cpus_beside_a_pinned_device() {
        assert!(worth_polling(None));
        let allowed = rustix::thread::sched_getaffinity(None).unwrap();
        let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
            .filter(|&c| allowed.is_set(c))
            .collect();
        let last = *cpus.last().unwrap();
        // With the whole mask: room to poll only if two CPUs are left beside the device's.
        assert_eq!(worth_polling(Some(last)), cpus.len() >= 3);
        // A device CPU outside the mask leaves every CPU of it.
        assert_eq!(worth_polling(Some(CpuSet::MAX_CPU)), cpus.len() >= 2);
        std::thread::spawn(move || {
            let mut one = CpuSet::new();
            one.set(last);
            rustix::thread::sched_setaffinity(None, &one).unwrap();
            // One CPU, the device's or another: nowhere to poll without taking turns.
            assert!(!worth_polling(Some(last)));
            assert!(!worth_polling(Some(CpuSet::MAX_CPU)));
            assert!(worth_polling(None));
        })
        .join()
        .unwrap();
    }
}
