//! `--breakdown`: where a request's time goes (Moneta-D's Figure 3).
//!
//! On the `moneta` path the stages come from counters inside the code: libmoneta's stage
//! timing ([`libmoneta::trace`]) on the client side, and the daemon's (`monetad --trace`,
//! which the bench's private daemon runs with in this mode) on the device side. On the kernel
//! paths nothing inside the kernel is instrumented: the system call's cost is a null system
//! call timed in the same run, the copy is a `memcpy` of the same size timed in user space,
//! and the rest of the mean latency is the file system, page cache or block layer. Where the
//! two estimates come to more than the mean (a small region's pages stay in the cache, where
//! the `memcpy` is timed from memory), they are cut to it, the copy first.

use std::sync::Mutex;
use std::time::Instant;

use libmoneta::trace::Breakdown;
use moneta_abi::control::StatusReport;
use serde::Serialize;

/// One stage of a request and its mean time.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Component {
    /// Stage name.
    pub name: &'static str,
    /// Mean nanoseconds per request.
    pub ns: f64,
    /// How it was obtained: `counted` inside the code, `estimated` by a separate timing, or
    /// `remainder` of the mean latency.
    pub how: &'static str,
}

/// What a traced run gathered on the moneta path.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Trace {
    pub client: Breakdown,
    /// The daemon's counters over the run: traced requests, queue, check, move, media ns.
    pub device: [u64; 5],
}

/// Client sums the bench threads of the current run hand in when they end.
static CLIENT: Mutex<Breakdown> = Mutex::new(Breakdown {
    ops: 0,
    lookup_ns: 0,
    submit_ns: 0,
    copy_ns: 0,
    wait_ns: 0,
    device_ns: 0,
    finish_ns: 0,
});

/// Called by a bench thread at its end: adds its stage sums to the run's.
pub(super) fn hand_in() {
    if libmoneta::trace::enabled() {
        let b = libmoneta::trace::take();
        CLIENT.lock().unwrap_or_else(|e| e.into_inner()).add(&b);
    }
}

/// Starts a traced run: clears the sums, turns libmoneta's timing on.
pub(super) fn begin() {
    libmoneta::trace::enable(true);
    let _ = libmoneta::trace::take();
    *CLIENT.lock().unwrap_or_else(|e| e.into_inner()) = Breakdown::default();
}

/// Ends a traced run: turns the timing off and returns what the threads handed in, with the
/// daemon's counters between `before` and `after`.
pub(super) fn end(before: &StatusReport, after: &StatusReport) -> Trace {
    libmoneta::trace::enable(false);
    let client = std::mem::take(&mut *CLIENT.lock().unwrap_or_else(|e| e.into_inner()));
    let d = |a: u64, b: u64| b.saturating_sub(a);
    Trace {
        client,
        device: [
            d(before.traced, after.traced),
            d(before.trace_queue_ns, after.trace_queue_ns),
            d(before.trace_check_ns, after.trace_check_ns),
            d(before.trace_move_ns, after.trace_move_ns),
            d(before.trace_media_ns, after.trace_media_ns),
        ],
    }
}

/// The moneta path's stages, per request.
pub(super) fn moneta_components(t: &Trace) -> Vec<Component> {
    let c = &t.client;
    if c.ops == 0 {
        return Vec::new();
    }
    let per = |ns: u64| ns as f64 / c.ops as f64;
    let dev_ops = t.device[0].max(1) as f64;
    let dev = |i: usize| t.device[i] as f64 / dev_ops;
    let (queue, check, mv, media) = if t.device[0] > 0 {
        (dev(1), dev(2), dev(3), dev(4))
    } else {
        (0.0, 0.0, 0.0, 0.0)
    };
    let wait = per(c.wait_ns);
    // The rest of the wait: the poller noticing the doorbell after the client rang it, and
    // the client noticing the completion after the device published it.
    let notify = (wait - queue - check - mv - media).max(0.0);
    let counted = |name, ns| Component {
        name,
        ns,
        how: "counted",
    };
    let mut v = vec![
        counted("extent lookup", per(c.lookup_ns)),
        counted("submission", per(c.submit_ns)),
    ];
    if t.device[0] > 0 {
        v.extend([
            counted("device queue", queue),
            counted("permission check", check),
            counted("data movement (array)", mv),
            counted("media model and scheduling", media),
            Component {
                name: "doorbell and completion",
                ns: notify,
                how: "remainder",
            },
        ]);
    } else {
        v.push(counted("device and completion", wait));
    }
    v.extend([
        counted("copy (DMA buffer)", per(c.copy_ns)),
        counted("release and return", per(c.finish_ns)),
    ]);
    v
}

/// The kernel paths' stages, from the mean latency of the run.
pub(super) fn kernel_components(mean_ns: f64, size: u64, odirect: bool) -> Vec<Component> {
    // The estimates are measured apart from the run (the copy from memory out of the cache,
    // where a small region's pages may sit in the cache during the run): where they come to
    // more than the run's mean, they are cut to it, the copy first, so the parts never add up
    // to more than the whole.
    let syscall = null_syscall_ns().min(mean_ns.max(0.0));
    // O_DIRECT moves data by DMA (here: the loop driver's copy, inside the block layer).
    let copy = if odirect {
        0.0
    } else {
        memcpy_ns(size as usize).min((mean_ns - syscall).max(0.0))
    };
    let mut v = vec![Component {
        name: "system call",
        ns: syscall,
        how: "estimated",
    }];
    if !odirect {
        v.push(Component {
            name: "copy (page cache)",
            ns: copy,
            how: "estimated",
        });
    }
    v.push(Component {
        name: if odirect {
            "file system and block layer"
        } else {
            "file system and page cache"
        },
        ns: (mean_ns - syscall - copy).max(0.0),
        how: "remainder",
    });
    v
}

/// Best mean of a null system call (`getppid`) over a few rounds.
pub fn null_syscall_ns() -> f64 {
    best_of(|| {
        std::hint::black_box(rustix::process::getppid());
    })
}

/// Best mean of a `memcpy` of `size` bytes between two buffers larger than the cache, at
/// random offsets (the page cache's pages are rarely in the cache either).
pub fn memcpy_ns(size: usize) -> f64 {
    let span = 64 << 20;
    let src = vec![0xa5u8; span];
    let mut dst = vec![0u8; size];
    let slots = (span / size.max(1)).max(1);
    let mut i = 0usize;
    best_of(|| {
        i = (i.wrapping_mul(2654435761).wrapping_add(12345)) % slots;
        let at = i * size;
        dst.copy_from_slice(&src[at..at + size]);
        std::hint::black_box(&mut dst);
    })
}

fn best_of(mut f: impl FnMut()) -> f64 {
    let n = 20_000;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run faster than the estimates measured apart from it (a small region's pages in the
    /// cache): the parts are cut to the whole, never more.
    #[test]
    fn kernel_components_never_add_up_to_more_than_the_mean() {
        for (mean, odirect) in [(1.0, false), (1.0, true), (0.0, false), (1e9, false)] {
            let v = kernel_components(mean, 4096, odirect);
            let sum: f64 = v.iter().map(|c| c.ns).sum();
            assert!(v.iter().all(|c| c.ns >= 0.0), "{v:?}");
            assert!(
                (sum - mean).abs() <= 1e-6 * mean.max(1.0),
                "{sum} vs {mean}: {v:?}"
            );
        }
    }

    #[test]
    fn moneta_components_sum_to_the_traced_time() {
        let t = Trace {
            client: Breakdown {
                ops: 10,
                lookup_ns: 100,
                submit_ns: 200,
                copy_ns: 300,
                wait_ns: 4000,
                device_ns: 2500,
                finish_ns: 50,
            },
            device: [10, 500, 300, 1000, 0],
        };
        let c = moneta_components(&t);
        let sum: f64 = c.iter().map(|c| c.ns).sum();
        assert!((sum - (100.0 + 200.0 + 300.0 + 4000.0 + 50.0) / 10.0).abs() < 1e-9);
        let get = |n: &str| c.iter().find(|c| c.name == n).unwrap().ns;
        assert_eq!(get("permission check"), 30.0);
        assert_eq!(get("doorbell and completion"), 400.0 - 180.0);
    }

    #[test]
    fn kernel_components_sum_to_the_mean() {
        let c = kernel_components(5000.0, 4096, false);
        let sum: f64 = c.iter().map(|c| c.ns).sum();
        assert!((sum - 5000.0).abs() < 1e-6, "{c:?}");
        assert!(c[0].ns > 0.0 && c[1].ns > 0.0);
        let d = kernel_components(20000.0, 4096, true);
        assert_eq!(d.len(), 2);
    }
}
