//! Requests a thread waiting for a tag may move along: the channel's asynchronous requests
//! (`crate::aio`) that nobody is working on at the moment, found through the tags they hold.
//!
//! An asynchronous read keeps its tag until its bytes are copied out of the DMA slice, which
//! its owner does when it polls or waits. So that requests the application has not reaped yet
//! never starve other threads, a thread that finds no free tag reaps them itself. It looks only
//! at the requests that hold a completed command: each tag names the request whose command it
//! carries (its *owner*), and the tag's status entry says whether that command completed. The
//! work is bounded by the 64 tags, whatever the number of requests: a scan of every request
//! took tens of microseconds with 64 threads keeping 8 requests each, and a quarter of the
//! process's CPU.
//!
//! A request whose commands found no free tag queues for tags. A thread that needs a tag and
//! got one by reaping hands the other tags it freed (those no thread is queued for) to the
//! queued requests, oldest first, and issues their commands itself: such a request gets to the
//! device without its owner's help (the owner may be waiting for an older request). Tags freed
//! otherwise (by an owner reaping its own request, by synchronous calls) go to whoever takes
//! them next, a new submission included.
//!
//! The channel knows a request only as a pointer and two functions its owner registered: one
//! claims the request (takes its busy flag, under the registry's lock, so the request cannot be
//! freed meanwhile: its owner leaves the registry before it frees it) and one moves it along
//! and lets go of it, returning whether a tag came back.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard};

use moneta_abi::TAGS_PER_CHANNEL;

use super::{Channel, Tag};

/// Claims a registered request for the caller; false when someone else is working on it.
///
/// # Safety
///
/// Called with the registry's lock held, on a pointer that is registered.
pub(crate) type Claim = unsafe fn(NonNull<()>) -> bool;

/// Moves a claimed request along and lets go of it; returns whether it gave back a tag. The
/// flag says whether the request was taken off the queue of requests wanting tags (it joins
/// it again if it still wants some). Moving a request along may end it, and a request that met
/// a permission miss ends through the synchronous path (a lookup, commands of its own).
///
/// # Safety
///
/// Called on a pointer the caller claimed, once.
pub(crate) type Advance = unsafe fn(NonNull<()>, bool) -> bool;

/// A registered request.
#[derive(Clone, Copy)]
pub(crate) struct Reaper {
    pub(crate) state: NonNull<()>,
    pub(crate) claim: Claim,
    pub(crate) advance: Advance,
}

// SAFETY: the request behind `state` is touched only by whoever holds it (its busy flag), which
// `claim` decides.
unsafe impl Send for Reaper {}

/// The number a request is registered under (1 and up; 0 names no request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ticket(pub(crate) u32);

#[derive(Default)]
struct Slots {
    /// Registered requests, by ticket, with the serial number of their registration.
    entries: Vec<Option<(Reaper, u32)>>,
    free: Vec<u32>,
    serial: u32,
    live: usize,
    /// Requests with commands that found no tag, in the order they asked: tickets with the
    /// serial number of the registration that asked (a ticket is reused once its request is
    /// gone, and a place the gone request left must not serve the new one).
    wanting: VecDeque<(u32, u32)>,
}

impl Slots {
    fn live_entry(&self, t: u32, serial: u32) -> Option<Reaper> {
        match self.entries.get(t as usize - 1)? {
            Some((r, s)) if *s == serial => Some(*r),
            _ => None,
        }
    }
}

/// The channel's registered requests and which of them each tag's command belongs to.
pub(crate) struct Reapers {
    slots: Mutex<Slots>,
    /// Requests that have commands waiting for a tag now (see [`Reapers::backlog`]).
    pub(super) backlog: AtomicU32,
    owners: [AtomicU32; TAGS_PER_CHANNEL],
}

impl Reapers {
    pub(super) fn new() -> Reapers {
        Reapers {
            slots: Mutex::new(Slots::default()),
            backlog: AtomicU32::new(0),
            owners: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a request; until [`Reapers::unregister`], threads waiting for a tag may claim
    /// it.
    pub(crate) fn register(&self, r: Reaper) -> Ticket {
        let mut s = self.slots();
        s.serial = s.serial.wrapping_add(1);
        let e = Some((r, s.serial));
        s.live += 1;
        let i = match s.free.pop() {
            Some(i) => {
                s.entries[i as usize] = e;
                i
            }
            None => {
                s.entries.push(e);
                (s.entries.len() - 1) as u32
            }
        };
        Ticket(i + 1)
    }

    /// Takes a request out of the registry: once this returns, no thread claims it again
    /// (one that claimed it before still holds it until it lets go).
    ///
    /// Its place in the queue of requests wanting tags, if it has one, stays until it comes up
    /// or the queue is compacted ([`Reapers::want`]), and serves no other request.
    pub(crate) fn unregister(&self, t: Ticket) {
        let mut s = self.slots();
        let i = t.0 - 1;
        s.entries[i as usize] = None;
        s.free.push(i);
        s.live -= 1;
    }

    /// Counts a request that now has commands waiting for a tag (`true`), or no longer has.
    pub(crate) fn backlog(&self, waiting: bool) {
        if waiting {
            self.backlog.fetch_add(1, Ordering::Relaxed);
        } else {
            self.backlog.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether more requests wait for tags than the channel has tags: the process keeps the
    /// device busy for a good while whichever completes first.
    pub(crate) fn backlogged(&self) -> bool {
        self.backlog.load(Ordering::Relaxed) > TAGS_PER_CHANNEL as u32
    }

    /// Queues the request registered as `t` for tags: [`Channel::dispatch_free`] issues its
    /// commands on free tags, oldest request first. The request says it once, until it is
    /// taken off (its [`Advance`] is then called with `true`); a place whose request has gone
    /// or no longer wants tags is dropped when it comes up.
    ///
    /// `again`: the request was just taken off the queue and still wants tags: it keeps its
    /// place at the front, so that among queued requests an older one's commands all go out
    /// before a younger one's.
    ///
    /// Places of requests that are gone are dropped whenever they outnumber the requests
    /// registered, so the queue stays within twice their number (plus a little) even when
    /// nothing takes places off it.
    pub(crate) fn want(&self, t: Ticket, again: bool) {
        let mut s = self.slots();
        let serial = match s.entries.get(t.0 as usize - 1) {
            Some(Some((_, serial))) => *serial,
            _ => return,
        };
        if again {
            s.wanting.push_front((t.0, serial));
        } else {
            s.wanting.push_back((t.0, serial));
        }
        if s.wanting.len() > 2 * s.live + TAGS_PER_CHANNEL {
            let mut q = std::mem::take(&mut s.wanting);
            q.retain(|&(t, serial)| s.live_entry(t, serial).is_some());
            s.wanting = q;
        }
    }

    /// Records that `tag` carries a command of the request registered as `t`.
    pub(crate) fn own(&self, tag: Tag, t: Ticket) {
        self.owners[tag.0 as usize].store(t.0, Ordering::Release);
    }

    /// Records that `tag` carries no registered request's command any more.
    pub(crate) fn disown(&self, tag: Tag) {
        self.owners[tag.0 as usize].store(0, Ordering::Release);
    }

    /// Claims the request registered as `t`, if it still is and nobody holds it.
    fn claim(&self, t: u32) -> Option<Reaper> {
        let s = self.slots();
        let (r, _) = (*s.entries.get(t as usize - 1)?)?;
        // SAFETY: registered (checked under the lock we hold).
        unsafe { (r.claim)(r.state) }.then_some(r)
    }

    /// Takes the oldest request wanting tags off the queue and claims it. One that someone
    /// else holds goes back to the end of the queue (its holder is moving it along itself),
    /// and is tried again once the others have been; `None` when no request can be claimed.
    fn claim_wanting(&self, tried: &mut usize) -> Option<Reaper> {
        let mut s = self.slots();
        while *tried < s.wanting.len() {
            let (t, serial) = s.wanting.pop_front().expect("not empty");
            let Some(r) = s.live_entry(t, serial) else {
                continue;
            };
            // SAFETY: registered (checked under the lock we hold).
            if unsafe { (r.claim)(r.state) } {
                return Some(r);
            }
            s.wanting.push_back((t, serial));
            *tried += 1;
        }
        None
    }
}

impl Channel {
    /// Moves along the registered requests that hold a completed command and that nobody is
    /// working on, each once: their completed commands are reaped (a read's bytes copied out)
    /// and their tags come back. Returns whether any tag did.
    pub(crate) fn reap_others(&self) -> bool {
        // Forwarding publishes completions in the tag status register first.
        self.harvest();
        let mut found = [0u32; TAGS_PER_CHANNEL];
        let mut n = 0;
        for t in 0..TAGS_PER_CHANNEL {
            let owner = self.reapers.owners[t].load(Ordering::Acquire);
            if owner == 0 || found[..n].contains(&owner) {
                continue;
            }
            let want = self.seqs[t].load(Ordering::Relaxed);
            if self.slot(Tag(t as u8)).status.state.load(Ordering::Acquire) == want {
                found[n] = owner;
                n += 1;
            }
        }
        let mut freed = false;
        for &owner in &found[..n] {
            // A stale owner (its request reaped, even a new one registered under the same
            // ticket since) costs a look at a request with nothing completed; never harm.
            if let Some(r) = self.reapers.claim(owner) {
                // SAFETY: claimed just now.
                freed |= unsafe { (r.advance)(r.state, false) };
            }
        }
        freed
    }

    /// Hands the free tags nobody is queued for to the requests that want tags, oldest first,
    /// issuing their commands, so that the device stays busy while their owners wait on older
    /// requests. At most one round of the channel's tags per call, however busy the tags are
    /// meanwhile.
    pub(crate) fn dispatch_free(&self) {
        let mut tried = 0;
        let mut rounds = 0;
        while rounds < TAGS_PER_CHANNEL && self.tags.free_mask() != 0 && !self.tags.waiting() {
            rounds += 1;
            let Some(r) = self.reapers.claim_wanting(&mut tried) else {
                break;
            };
            // SAFETY: claimed just now.
            unsafe { (r.advance)(r.state, true) };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// A stand-in request: only its busy flag matters to the queue.
    struct Fake {
        busy: AtomicBool,
    }

    unsafe fn claim_fake(p: NonNull<()>) -> bool {
        // SAFETY: the tests keep every registered fake alive.
        let f = unsafe { p.cast::<Fake>().as_ref() };
        !f.busy.swap(true, Ordering::AcqRel)
    }

    unsafe fn advance_fake(p: NonNull<()>, _dequeued: bool) -> bool {
        // SAFETY: as above.
        unsafe { p.cast::<Fake>().as_ref() }
            .busy
            .store(false, Ordering::Release);
        false
    }

    fn register(r: &Reapers, f: &Fake) -> Ticket {
        r.register(Reaper {
            state: NonNull::from(f).cast(),
            claim: claim_fake,
            advance: advance_fake,
        })
    }

    fn next(r: &Reapers, fakes: &[Fake]) -> Option<usize> {
        let got = r.claim_wanting(&mut 0)?;
        Some(
            fakes
                .iter()
                .position(|f| NonNull::from(f).cast() == got.state)
                .expect("a registered fake"),
        )
    }

    fn fakes(n: usize) -> Vec<Fake> {
        (0..n)
            .map(|_| Fake {
                busy: AtomicBool::new(false),
            })
            .collect()
    }

    #[test]
    fn requests_get_tags_in_the_order_they_asked_and_an_unfinished_one_keeps_its_place() {
        let r = Reapers::new();
        let f = fakes(3);
        let t: Vec<Ticket> = f.iter().map(|x| register(&r, x)).collect();
        for &x in &t {
            r.want(x, false);
        }
        assert_eq!(next(&r, &f), Some(0));
        // The first got some of its tags and wants more: it is served again before the rest.
        f[0].busy.store(false, Ordering::Release);
        r.want(t[0], true);
        assert_eq!(next(&r, &f), Some(0));
        // Still held by whoever claimed it: passed over, and tried again after the others.
        r.want(t[0], true);
        assert_eq!(next(&r, &f), Some(1));
        assert_eq!(next(&r, &f), Some(2));
        assert_eq!(next(&r, &f), None, "the only request left is held");
        f[0].busy.store(false, Ordering::Release);
        assert_eq!(next(&r, &f), Some(0));
        assert_eq!(next(&r, &f), None, "the queue is empty");
    }

    #[test]
    fn a_request_that_left_loses_its_place_and_its_tags_name_nobody() {
        let r = Reapers::new();
        let f = fakes(2);
        let a = register(&r, &f[0]);
        let b = register(&r, &f[1]);
        r.want(a, false);
        r.want(b, false);
        r.own(Tag(5), a);
        r.unregister(a);
        assert!(
            r.claim(a.0).is_none(),
            "an unregistered request cannot be claimed"
        );
        assert_eq!(next(&r, &f), Some(1));
        assert_eq!(next(&r, &f), None);
        r.disown(Tag(5));
        assert_eq!(r.owners[5].load(Ordering::Relaxed), 0);
        // Its ticket goes to the next request registered, which the gone one's place (left
        // behind when it had one) does not serve.
        r.want(b, false);
        r.unregister(b);
        let c = register(&r, &f[0]);
        assert_eq!(c, b);
        assert_eq!(
            next(&r, &f),
            None,
            "a place left by a gone request serves no other"
        );
        r.want(c, false);
        assert_eq!(next(&r, &f), Some(0));
    }

    #[test]
    fn places_left_by_gone_requests_do_not_pile_up() {
        let r = Reapers::new();
        let f = fakes(1);
        for _ in 0..10_000 {
            let t = register(&r, &f[0]);
            r.want(t, false);
            r.unregister(t);
        }
        let len = r.slots().wanting.len();
        assert!(len <= 2 + TAGS_PER_CHANNEL, "{len} places kept");
    }

    #[test]
    fn the_backlog_counts_requests_waiting_for_tags_beyond_the_channels_tags() {
        let r = Reapers::new();
        for _ in 0..TAGS_PER_CHANNEL {
            r.backlog(true);
        }
        assert!(!r.backlogged());
        r.backlog(true);
        assert!(r.backlogged());
        r.backlog(false);
        assert!(!r.backlogged());
    }
}
