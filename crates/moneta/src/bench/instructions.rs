//! `--count-instructions`: instructions a bench thread retires, from the processor's counters
//! (perf_event_open on the thread itself, user and kernel where allowed).
//!
//! Virtual machines often do not expose the counters; the count then fails with the reason,
//! which the record carries instead of a number.

use perf_event::Builder;

/// Instructions counted, and what they cover.
#[derive(Clone, Copy, Debug)]
pub struct Count {
    /// Instructions retired.
    pub instructions: u64,
    /// `"user and kernel"` or `"user"` (where the kernel refuses to count its own).
    pub scope: &'static str,
}

impl Count {
    /// Both counts together (a run's threads); the narrower scope wins.
    pub fn add(self, o: Count) -> Count {
        Count {
            instructions: self.instructions + o.instructions,
            scope: if self.scope == o.scope {
                self.scope
            } else {
                "user"
            },
        }
    }
}

/// A counter of the calling thread's instructions, running.
pub struct Counter(Result<(perf_event::Counter, &'static str), String>);

impl Counter {
    /// Opens and starts the calling thread's counter (user and kernel, else user only).
    pub fn start() -> Counter {
        let open = |user_only: bool| {
            let mut b = Builder::new().observe_self();
            b.exclude_kernel(user_only).exclude_hv(true);
            b.build()
        };
        let c = match open(false) {
            Ok(c) => Ok((c, "user and kernel")),
            Err(_) => open(true).map(|c| (c, "user")),
        };
        Counter(
            c.map_err(|e| {
                format!("this machine's processor counters cannot count instructions ({e})")
            })
            .and_then(|(mut c, scope)| {
                c.enable()
                    .map_err(|e| format!("cannot start the instruction counter: {e}"))?;
                Ok((c, scope))
            }),
        )
    }

    /// Stops the counter; its count.
    pub fn finish(self) -> Result<Count, String> {
        let (mut c, scope) = self.0?;
        c.disable()
            .map_err(|e| format!("cannot stop the instruction counter: {e}"))?;
        let n = c
            .read()
            .map_err(|e| format!("cannot read the instruction counter: {e}"))?;
        Ok(Count {
            instructions: n,
            scope,
        })
    }
}
