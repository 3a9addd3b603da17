//! A link to one member: a thread that owns the NBD connection, issues every forwarded request
//! as it comes (several in flight), and hands each answer back to the poller.
//!
//! Failure has a bounded cost. A request the member leaves unanswered for the member's timeout
//! fails, and so does every other request in flight on the link: the connection is closed
//! (nothing more is sent on it) and opened again later. Connecting is asynchronous too, and
//! bounded by the same timeout: requests that come meanwhile wait for the connection and fail
//! if it is not made. While the link is down, forwarded requests fail at once. Either way the command completes with `MEDIA_ERROR`, and the local
//! array and the other links keep serving.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};

use super::nbd::{Conn, DIRECTION_READ, DIRECTION_WRITE};
use super::MemberConfig;

/// What a forwarded request does at the member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `NBD_CMD_READ` into the buffer.
    Read,
    /// `NBD_CMD_WRITE` from the buffer.
    Write,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_CACHE`: a hint that the range will be read (nothing when the member does not
    /// take it).
    Cache,
}

/// One forwarded request.
pub struct Job {
    /// The poller's name for it, given back with the answer.
    pub token: u64,
    /// What it does.
    pub op: Op,
    /// The bytes in the channel's DMA buffer (the daemon's mapping of it).
    pub buf: *mut u8,
    /// Bytes it moves.
    pub len: usize,
    /// The address at the member.
    pub offset: u64,
}

// SAFETY: `buf` points into a channel mapping that stays until the request is answered (a
// channel is removed only when nothing of it is in flight).
unsafe impl Send for Job {}

/// The state of a link, as `status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    /// Not yet connected, or connecting again after a failure.
    Connecting = 0,
    /// Connected: requests go to the member.
    Up = 1,
    /// The last attempt failed; requests fail at once until the next succeeds.
    Down = 2,
}

impl LinkState {
    /// The state's name in `status`.
    pub fn name(self) -> &'static str {
        match self {
            LinkState::Connecting => "connecting",
            LinkState::Up => "up",
            LinkState::Down => "down",
        }
    }
}

/// Counters of a link, shared with `status`.
#[derive(Default)]
pub struct LinkStats {
    state: AtomicU8,
    /// Requests forwarded.
    pub requests: AtomicU64,
    /// Bytes moved by the requests that succeeded.
    pub bytes: AtomicU64,
    /// Requests that failed (the member's error, a broken link, or the link down).
    pub failures: AtomicU64,
    /// Of those, writes given up while they may have been on their way to the member: in
    /// flight on a connection that broke or left one unanswered past the timeout. Such a write
    /// may still land there (NBD cannot take a request back). Counted before it is answered.
    pub uncertain_writes: AtomicU64,
    /// Connections made.
    pub connects: AtomicU64,
    /// Requests at the member now.
    pub in_flight: AtomicU64,
    /// The member's export size, once connected.
    pub remote_size: AtomicU64,
    last_error: Mutex<String>,
}

impl LinkStats {
    /// Where the link stands.
    pub fn state(&self) -> LinkState {
        match self.state.load(Ordering::Relaxed) {
            1 => LinkState::Up,
            2 => LinkState::Down,
            _ => LinkState::Connecting,
        }
    }

    fn set(&self, s: LinkState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// Why the link last failed (empty if it never did).
    pub fn last_error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A failure of the link itself: logged and recorded.
    fn failed(&self, why: String) {
        tracing::warn!("{why}");
        self.record(why);
    }

    /// A failure to show in `status`.
    fn record(&self, why: String) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }
}

/// The poller's end of a link.
pub struct Link {
    /// The member it reaches.
    pub config: MemberConfig,
    /// Its counters.
    pub stats: Arc<LinkStats>,
    jobs: mpsc::Sender<Job>,
    bell: OwnedFd,
}

/// How long a link that failed waits before it connects again.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

impl Link {
    /// Starts the link's thread. Answers go to `done` as (token, success), each followed by a
    /// write to `waker` (the poller's).
    pub fn spawn(
        config: MemberConfig,
        done: mpsc::Sender<(u64, bool)>,
        waker: OwnedFd,
    ) -> std::io::Result<Link> {
        let (jobs, rx) = mpsc::channel();
        let bell = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        let stats = Arc::new(LinkStats::default());
        let thread = Thread {
            config: config.clone(),
            stats: stats.clone(),
            rx,
            bell: bell.try_clone()?,
            done,
            waker,
            conn: None,
            ready: false,
            queued: Vec::new(),
            connect_by: Instant::now(),
            in_flight: Vec::new(),
            next_attempt: Instant::now(),
        };
        std::thread::Builder::new()
            .name("moneta-link".into())
            .spawn(move || {
                let _stop = crate::failstop::FailStop::new("link to a member");
                thread.run()
            })?;
        Ok(Link {
            config,
            stats,
            jobs,
            bell,
        })
    }

    /// Hands a request to the link's thread. `false` when the thread has gone.
    pub fn send(&self, job: Job) -> bool {
        if self.jobs.send(job).is_err() {
            return false;
        }
        let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
        true
    }
}

struct Thread {
    config: MemberConfig,
    stats: Arc<LinkStats>,
    rx: mpsc::Receiver<Job>,
    bell: OwnedFd,
    done: mpsc::Sender<(u64, bool)>,
    waker: OwnedFd,
    conn: Option<Conn>,
    /// Whether `conn` has finished its handshake.
    ready: bool,
    /// Requests that came while `conn` was connecting.
    queued: Vec<Job>,
    /// When a connection under way is given up.
    connect_by: Instant,
    /// Requests at the member: (cookie, token, bytes, deadline, whether it writes).
    in_flight: Vec<(u64, u64, usize, Instant, bool)>,
    next_attempt: Instant,
}

impl Thread {
    fn run(mut self) {
        let mut open = true;
        while open || !self.in_flight.is_empty() || !self.queued.is_empty() {
            if self.conn.is_none() && Instant::now() >= self.next_attempt {
                self.connect();
            }
            loop {
                match self.rx.try_recv() {
                    Ok(job) => self.issue(job),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.wait();
            self.settle();
            self.collect();
        }
    }

    /// Starts connecting; [`Thread::settle`] sees it through.
    fn connect(&mut self) {
        self.stats.set(LinkState::Connecting);
        match Conn::start(&self.config.uri) {
            Ok(c) => {
                self.conn = Some(c);
                self.ready = false;
                self.connect_by = Instant::now() + self.config.timeout;
            }
            Err(e) => self.down(format!("cannot reach member {}: {e}", self.config.uri)),
        }
    }

    /// A connection under way: up once its handshake is done and the export is large enough;
    /// down when it failed or took longer than the timeout.
    fn settle(&mut self) {
        let Some(c) = &self.conn else { return };
        if self.ready {
            return;
        }
        let why = if c.ready() {
            match c.size() {
                Ok(size) if size >= self.config.len => {
                    self.stats.remote_size.store(size, Ordering::Relaxed);
                    self.stats.connects.fetch_add(1, Ordering::Relaxed);
                    self.stats.set(LinkState::Up);
                    tracing::info!(uri = %self.config.uri, size, "link to member up");
                    self.ready = true;
                    for job in std::mem::take(&mut self.queued) {
                        self.issue_again(job);
                    }
                    return;
                }
                Ok(size) => format!(
                    "the export holds {size} bytes, fewer than the member's range ({})",
                    self.config.len
                ),
                Err(e) => e,
            }
        } else if c.broken() {
            c.error()
        } else if Instant::now() >= self.connect_by {
            format!("no connection within {:?}", self.config.timeout)
        } else {
            return;
        };
        self.conn = None;
        self.down(format!("cannot reach member {}: {why}", self.config.uri));
    }

    /// Issues a request that waited for the connection (counted when it came).
    fn issue_again(&mut self, job: Job) {
        self.stats.requests.fetch_sub(1, Ordering::Relaxed);
        self.issue(job);
    }

    fn down(&mut self, why: String) {
        for job in std::mem::take(&mut self.queued) {
            self.answer(job.token, false);
        }
        self.stats.set(LinkState::Down);
        self.stats.failed(why);
        self.next_attempt = Instant::now() + RECONNECT_AFTER;
    }

    fn issue(&mut self, job: Job) {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let Some(c) = self.conn.as_ref() else {
            // Down: refused at once.
            self.answer(job.token, false);
            return;
        };
        if !self.ready {
            // Connecting: it waits for the connection, at most the timeout.
            self.queued.push(job);
            return;
        }
        if job.op == Op::Write && c.read_only() {
            self.answer(job.token, false);
            return;
        }
        if job.op == Op::Cache && !c.can_cache() {
            // A hint the member cannot take is done.
            self.answer(job.token, true);
            return;
        }
        // SAFETY: the buffer stays valid until the answer (see `Job`); on failure of the
        // connection it is closed before the answer is given.
        let r = unsafe {
            match job.op {
                Op::Read => c.read(job.buf, job.len, job.offset),
                Op::Write => c.write(job.buf, job.len, job.offset),
                Op::Flush => c.flush(),
                Op::Cache => c.cache(job.len as u64, job.offset),
            }
        };
        match r {
            Ok(cookie) => {
                // A hint moves no bytes.
                let moved = if job.op == Op::Cache { 0 } else { job.len };
                self.in_flight.push((
                    cookie,
                    job.token,
                    moved,
                    Instant::now() + self.config.timeout,
                    job.op == Op::Write,
                ));
                self.stats
                    .in_flight
                    .store(self.in_flight.len() as u64, Ordering::Relaxed);
            }
            Err(e) if job.op == Op::Cache => {
                // A hint libnbd would not send says nothing of the connection.
                self.answer(job.token, false);
                self.stats
                    .record(format!("member {}: a hint failed: {e}", self.config.uri));
            }
            Err(e) => {
                self.answer(job.token, false);
                self.break_link(format!("member {}: {e}", self.config.uri));
            }
        }
    }

    /// Sleeps until the connection or the bell has something, a deadline passes, or it is time
    /// to connect again.
    fn wait(&mut self) {
        let now = Instant::now();
        let mut until = now + Duration::from_secs(1);
        if let Some(d) = self.in_flight.iter().map(|f| f.3).min() {
            until = until.min(d);
        }
        match &self.conn {
            None => until = until.min(self.next_attempt),
            Some(_) if !self.ready => until = until.min(self.connect_by),
            Some(_) => {}
        }
        let timeout = until.saturating_duration_since(now);
        let ts = rustix::time::Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        let (fd, dir) = match &self.conn {
            Some(c) => c.poll_want(),
            None => (-1, 0),
        };
        let mut flags = PollFlags::empty();
        if dir & DIRECTION_READ != 0 {
            flags |= PollFlags::IN;
        }
        if dir & DIRECTION_WRITE != 0 {
            flags |= PollFlags::OUT;
        }
        // SAFETY: the connection's socket stays open while `conn` lives, for this call.
        let sock = (fd >= 0).then(|| unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) });
        let mut fds = vec![PollFd::new(&self.bell, PollFlags::IN)];
        if let Some(s) = &sock {
            fds.push(PollFd::from_borrowed_fd(s.as_fd(), flags));
        }
        if poll(&mut fds, Some(&ts)).is_err() {
            return;
        }
        let bell = !fds[0].revents().is_empty();
        let ready = fds.get(1).map(|f| f.revents());
        drop(fds);
        if bell {
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&self.bell, &mut b);
        }
        if let (Some(c), Some(r)) = (&self.conn, ready) {
            let readable = r.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR);
            c.notify(readable, r.contains(PollFlags::OUT));
        }
    }

    /// Answers the requests the member has answered; fails the link when one is overdue or
    /// the connection broke.
    fn collect(&mut self) {
        let Some(c) = self.conn.as_ref().filter(|_| self.ready) else {
            return;
        };
        let mut answers = Vec::new();
        let mut ended = false;
        while let Some((cookie, r)) = c.next_completed() {
            if let Some(i) = self.in_flight.iter().position(|f| f.0 == cookie) {
                let (_, token, len, _, _) = self.in_flight.swap_remove(i);
                if let Err((e, errno)) = &r {
                    // Recorded, not logged: a client may ask for requests the member refuses
                    // as often as it likes.
                    self.stats
                        .record(format!("member {}: a request failed: {e}", self.config.uri));
                    // NBD_ESHUTDOWN: the server will serve nothing more on this connection
                    // (a shared file system's manager cut it off): connect again.
                    ended |= *errno == libc::ESHUTDOWN;
                } else {
                    self.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
                }
                answers.push((token, r.is_ok()));
            }
        }
        let broken = c.broken();
        if ended {
            for (token, ok) in answers {
                self.answer(token, ok);
            }
            self.break_link(format!(
                "member {}: the member ended the connection (ESHUTDOWN)",
                self.config.uri
            ));
            return;
        }
        for (token, ok) in answers {
            self.answer(token, ok);
        }
        self.stats
            .in_flight
            .store(self.in_flight.len() as u64, Ordering::Relaxed);
        let now = Instant::now();
        if broken {
            self.break_link(format!("member {}: the connection broke", self.config.uri));
        } else if self.in_flight.iter().any(|f| f.3 <= now) {
            self.break_link(format!(
                "member {}: no answer within {:?}",
                self.config.uri, self.config.timeout
            ));
        }
    }

    /// Closes the connection and fails everything in flight on it.
    fn break_link(&mut self, why: String) {
        // Closed first: libnbd touches no buffer after this.
        self.conn = None;
        self.down(why);
        for (_, token, _, _, write) in std::mem::take(&mut self.in_flight) {
            if write {
                self.stats.uncertain_writes.fetch_add(1, Ordering::Relaxed);
            }
            self.answer(token, false);
        }
        self.stats.in_flight.store(0, Ordering::Relaxed);
    }

    fn answer(&self, token: u64, ok: bool) {
        if !ok {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
        }
        if self.done.send((token, ok)).is_ok() {
            let _ = rustix::io::write(&self.waker, &1u64.to_ne_bytes());
        }
    }
}
