//! A link to one member: an NBD connection that the device's poller drives itself. The poller
//! issues every forwarded request on the connection as it comes (several in flight), looks at
//! the socket in its own passes while requests are out, and completes each request in the pass
//! that reads its answer: no other thread is on a request's way, so a forwarded command costs
//! the network and the member, not wake-ups of threads between them.
//!
//! Making a connection is the one slow part (name lookup, TCP, the TLS handshake), so a thread
//! of the link's own, the *connector*, makes it and hands the ready connection to the poller.
//! It then watches the socket for a hang-up while the poller holds it (so a link whose member
//! went away is seen down even when nothing is forwarded), and connects again after the poller
//! gave a broken connection up.
//!
//! Failure has a bounded cost. A request the member leaves unanswered for the member's timeout
//! fails, and so does every other request in flight on the link: the connection is closed
//! (nothing more is sent on it) and made again later. Requests that come while a connection is
//! being made wait for it, at most the same timeout, and fail if it is not made; between
//! attempts they fail at once. Either way the command completes with `MEDIA_ERROR`, and the
//! local array and the other links keep serving.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};

use super::nbd::Conn;
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

/// An answer to a forwarded request: its token and whether it succeeded.
pub type Answer = (u64, bool);

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

/// What the connector tells the poller.
enum Event {
    /// An attempt began; requests wait for it until the instant given.
    Connecting(Instant),
    /// The connection is made: the poller's from now on.
    Up(Conn),
    /// The attempt failed; requests fail at once until the next one.
    Down,
}

/// A request at the member.
struct Out {
    cookie: u64,
    token: u64,
    /// Bytes it moves when it succeeds (none for a hint).
    moved: usize,
    deadline: Instant,
    write: bool,
}

/// How long a link that failed waits before it connects again.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// The poller's end of a link: the connection while it is up, and the requests on it.
pub struct Link {
    /// The member it reaches.
    pub config: MemberConfig,
    /// Its counters.
    pub stats: Arc<LinkStats>,
    conn: Option<Conn>,
    /// While there is no connection: until when the attempt under way is waited for (`None`
    /// between attempts, when requests fail at once).
    connect_by: Option<Instant>,
    /// Requests that came while the connection was being made.
    queued: Vec<Job>,
    out: Vec<Out>,
    events: mpsc::Receiver<Event>,
    /// Told when the poller gave a connection up (dropped: the link is going away).
    lost: Option<mpsc::Sender<()>>,
    /// The connector's bell, written after `lost` is.
    bell: OwnedFd,
    /// Set by the connector when it sent an event or saw the socket hang up.
    attention: Arc<AtomicBool>,
}

// SAFETY: the jobs' buffers point into channel mappings that stay until the request is answered
// (a channel is removed only when nothing of it is in flight); the poller owns the link.
unsafe impl Send for Link {}

impl Link {
    /// Starts the link's connector, which writes `waker` (the poller's) whenever the poller
    /// should look at the link while it may be asleep.
    pub fn spawn(config: MemberConfig, waker: OwnedFd) -> std::io::Result<Link> {
        let (events_tx, events) = mpsc::channel();
        let (lost, lost_rx) = mpsc::channel();
        let bell = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        let stats = Arc::new(LinkStats::default());
        let attention = Arc::new(AtomicBool::new(false));
        let connector = Connector {
            config: config.clone(),
            stats: stats.clone(),
            events: events_tx,
            lost: lost_rx,
            bell: bell.try_clone()?,
            waker,
            attention: attention.clone(),
        };
        std::thread::Builder::new()
            .name("moneta-link".into())
            .spawn(move || {
                let _stop = crate::failstop::FailStop::new("link to a member");
                connector.run()
            })?;
        Ok(Link {
            connect_by: Some(Instant::now() + config.timeout),
            config,
            stats,
            conn: None,
            queued: Vec::new(),
            out: Vec::new(),
            events,
            lost: Some(lost),
            bell,
            attention,
        })
    }

    /// Whether the link has something for the poller to drive: requests out or waiting, or
    /// news from the connector.
    pub fn busy(&self) -> bool {
        !self.out.is_empty() || !self.queued.is_empty() || self.attention.load(Ordering::Acquire)
    }

    /// What a poller with nothing else to do sleeps on for this link: the socket, and whether
    /// libnbd waits to read or to write it. `None` while no request is out.
    pub fn wait_on(&self) -> Option<(BorrowedFd<'_>, PollFlags)> {
        self.conn
            .as_ref()
            .filter(|_| !self.out.is_empty())?
            .waits_on()
    }

    /// When the link must be looked at even if nothing happens: the first deadline of a
    /// request out, or the end of the attempt that queued requests wait for.
    pub fn next_deadline(&self) -> Option<Instant> {
        let out = self.out.iter().map(|o| o.deadline).min();
        let queued = self.connect_by.filter(|_| !self.queued.is_empty());
        match (out, queued) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Forwards a request: issued at once when the link is up, kept while it connects, failed
    /// when it is down. Its answer goes to `answers`, now or from a later [`Link::drive`].
    pub fn send(&mut self, job: Job, answers: &mut Vec<Answer>) {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        if self.attention.load(Ordering::Acquire) {
            self.take_events(answers);
        }
        if self.conn.is_some() {
            self.issue(job, answers);
        } else if self.connect_by.is_some() {
            // Connecting: it waits for the connection, at most the timeout.
            self.queued.push(job);
        } else {
            // Down: refused at once.
            self.answer(job.token, false, answers);
        }
    }

    /// One look at the link from the poller's pass: what the connector said, the socket (read
    /// and written as far as it goes without waiting), the answers it holds, and the deadlines.
    pub fn drive(&mut self, answers: &mut Vec<Answer>) {
        if self.attention.load(Ordering::Acquire) && self.take_events(answers) {
            // It looked at the socket already.
            return;
        }
        let now = Instant::now();
        if self.conn.is_none() {
            if self.connect_by.is_some_and(|by| now >= by) {
                // The connector gives this attempt up at the same instant and says so.
                self.connect_by = None;
                for job in std::mem::take(&mut self.queued) {
                    self.answer(job.token, false, answers);
                }
            }
            return;
        }
        self.pump();
        self.collect(now, answers);
    }

    /// Applies what the connector sent (it set `attention` when it did, or when it saw the
    /// socket hang up); `true` when it then looked at the connection's socket and answers.
    fn take_events(&mut self, answers: &mut Vec<Answer>) -> bool {
        // A read-modify-write: it reads the connector's latest store, so an event sent before
        // that store is seen below, and one sent after it leaves the flag set.
        self.attention.swap(false, Ordering::AcqRel);
        while let Ok(ev) = self.events.try_recv() {
            match ev {
                Event::Connecting(by) => self.connect_by = Some(by),
                Event::Up(conn) => {
                    self.conn = Some(conn);
                    self.connect_by = None;
                    for job in std::mem::take(&mut self.queued) {
                        self.issue(job, answers);
                    }
                }
                Event::Down => {
                    self.connect_by = None;
                    for job in std::mem::take(&mut self.queued) {
                        self.answer(job.token, false, answers);
                    }
                }
            }
        }
        if self.conn.is_none() {
            return false;
        }
        // The connector may have seen the socket hang up (then with an event or without): a
        // look at the socket finds it closed, and the link breaks in `collect`.
        self.pump();
        self.collect(Instant::now(), answers);
        true
    }

    fn issue(&mut self, job: Job, answers: &mut Vec<Answer>) {
        let Some(c) = self.conn.as_ref() else {
            self.answer(job.token, false, answers);
            return;
        };
        if job.op == Op::Write && c.read_only() {
            self.answer(job.token, false, answers);
            return;
        }
        if job.op == Op::Cache && !c.can_cache() {
            // A hint the member cannot take is done.
            self.answer(job.token, true, answers);
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
                self.out.push(Out {
                    cookie,
                    token: job.token,
                    moved: if job.op == Op::Cache { 0 } else { job.len },
                    deadline: Instant::now() + self.config.timeout,
                    write: job.op == Op::Write,
                });
                self.stats
                    .in_flight
                    .store(self.out.len() as u64, Ordering::Relaxed);
            }
            Err(e) if job.op == Op::Cache => {
                // A hint libnbd would not send says nothing of the connection.
                self.answer(job.token, false, answers);
                self.stats
                    .record(format!("member {}: a hint failed: {e}", self.config.uri));
            }
            Err(e) => {
                self.answer(job.token, false, answers);
                self.break_link(format!("member {}: {e}", self.config.uri), answers);
            }
        }
    }

    /// Moves the connection's bytes as far as the socket allows without waiting: a look at
    /// the socket (one `poll` with no timeout), then libnbd reads or writes what is ready.
    fn pump(&self) {
        let Some(c) = &self.conn else { return };
        let Some((sock, flags)) = c.waits_on().filter(|(_, f)| !f.is_empty()) else {
            return;
        };
        let mut fds = [PollFd::from_borrowed_fd(sock, flags)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if matches!(poll(&mut fds, Some(&zero)), Ok(n) if n > 0) {
            c.notify(fds[0].revents());
        }
    }

    /// Answers the requests the member has answered; fails the link when one is overdue or
    /// the connection broke.
    fn collect(&mut self, now: Instant, answers: &mut Vec<Answer>) {
        let Some(c) = self.conn.as_ref() else { return };
        // Looked at before the answers are taken: when the connection breaks, libnbd completes
        // every command on it with ENOTCONN, and a write among them may have left already.
        let broken = c.broken();
        let mut ended = false;
        let mut any = false;
        while let Some((cookie, r)) = c.next_completed() {
            let Some(i) = self.out.iter().position(|o| o.cookie == cookie) else {
                continue;
            };
            let o = self.out.swap_remove(i);
            any = true;
            if let Err((e, errno)) = &r {
                // Recorded, not logged: a client may ask for requests the member refuses as
                // often as it likes.
                self.stats
                    .record(format!("member {}: a request failed: {e}", self.config.uri));
                // NBD_ESHUTDOWN: the server will serve nothing more on this connection (a
                // shared file system's manager cut it off): connect again.
                ended |= *errno == libc::ESHUTDOWN;
                if o.write && (broken || *errno == libc::ENOTCONN) {
                    // Given up with its connection, not refused by the member.
                    self.stats.uncertain_writes.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats
                    .bytes
                    .fetch_add(o.moved as u64, Ordering::Relaxed);
            }
            answers.push((o.token, r.is_ok()));
        }
        if any {
            self.stats
                .in_flight
                .store(self.out.len() as u64, Ordering::Relaxed);
        }
        let why = if ended {
            "the member ended the connection (ESHUTDOWN)".to_string()
        } else if c.broken() {
            "the connection broke".to_string()
        } else if self.out.iter().any(|o| o.deadline <= now) {
            format!("no answer within {:?}", self.config.timeout)
        } else {
            return;
        };
        self.break_link(format!("member {}: {why}", self.config.uri), answers);
    }

    /// Closes the connection, fails everything in flight on it, and has the connector make a
    /// new one.
    fn break_link(&mut self, why: String, answers: &mut Vec<Answer>) {
        // Closed first: libnbd touches no buffer after this.
        self.conn = None;
        self.connect_by = None;
        self.stats.set(LinkState::Down);
        self.stats.failed(why);
        for o in std::mem::take(&mut self.out) {
            if o.write {
                self.stats.uncertain_writes.fetch_add(1, Ordering::Relaxed);
            }
            self.answer(o.token, false, answers);
        }
        self.stats.in_flight.store(0, Ordering::Relaxed);
        if let Some(lost) = &self.lost {
            let _ = lost.send(());
            let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
        }
    }

    fn answer(&self, token: u64, ok: bool, answers: &mut Vec<Answer>) {
        if !ok {
            self.stats.failures.fetch_add(1, Ordering::Relaxed);
        }
        answers.push((token, ok));
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // The connector ends when it finds the sender gone.
        self.lost = None;
        let _ = rustix::io::write(&self.bell, &1u64.to_ne_bytes());
    }
}

/// The link's own thread: makes connections and hands them to the poller.
struct Connector {
    config: MemberConfig,
    stats: Arc<LinkStats>,
    events: mpsc::Sender<Event>,
    lost: mpsc::Receiver<()>,
    bell: OwnedFd,
    waker: OwnedFd,
    attention: Arc<AtomicBool>,
}

/// What the poller said, as the connector finds it.
enum Word {
    Nothing,
    Lost,
    Stop,
}

impl Connector {
    fn run(self) {
        loop {
            let by = Instant::now() + self.config.timeout;
            self.stats.set(LinkState::Connecting);
            if !self.tell(Event::Connecting(by)) {
                return;
            }
            match self.connect(by) {
                Ok(Some(conn)) => {
                    let watch = conn_socket(&conn);
                    self.stats.connects.fetch_add(1, Ordering::Relaxed);
                    self.stats.set(LinkState::Up);
                    tracing::info!(uri = %self.config.uri, "link to member up");
                    if !self.tell(Event::Up(conn)) || !self.watch(watch) {
                        return;
                    }
                }
                Ok(None) => return,
                Err(why) => {
                    self.stats.set(LinkState::Down);
                    self.stats
                        .failed(format!("cannot reach member {}: {why}", self.config.uri));
                    if !self.tell(Event::Down) {
                        return;
                    }
                }
            }
            if !self.pause(RECONNECT_AFTER) {
                return;
            }
        }
    }

    /// Sends an event and wakes the poller; `false` when the link has gone.
    fn tell(&self, ev: Event) -> bool {
        if self.events.send(ev).is_err() {
            return false;
        }
        self.nudge();
        true
    }

    /// Has the poller look at the link.
    fn nudge(&self) {
        self.attention.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.waker, &1u64.to_ne_bytes());
    }

    fn word(&self) -> Word {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.bell, &mut b);
        match self.lost.try_recv() {
            Ok(()) => Word::Lost,
            Err(mpsc::TryRecvError::Empty) => Word::Nothing,
            Err(mpsc::TryRecvError::Disconnected) => Word::Stop,
        }
    }

    /// Makes a connection by `by`: `Ok(None)` when the link went away meanwhile.
    fn connect(&self, by: Instant) -> Result<Option<Conn>, String> {
        let c = Conn::start(&self.config.uri)?;
        loop {
            if c.ready() {
                return match c.size() {
                    Ok(size) if size >= self.config.len => {
                        self.stats.remote_size.store(size, Ordering::Relaxed);
                        Ok(Some(c))
                    }
                    Ok(size) => Err(format!(
                        "the export holds {size} bytes, fewer than the member's range ({})",
                        self.config.len
                    )),
                    Err(e) => Err(e),
                };
            }
            if c.broken() {
                return Err(c.error());
            }
            let now = Instant::now();
            if now >= by {
                return Err(format!("no connection within {:?}", self.config.timeout));
            }
            let mut fds = vec![PollFd::new(&self.bell, PollFlags::IN)];
            if let Some((sock, flags)) = c.waits_on() {
                fds.push(PollFd::from_borrowed_fd(sock, flags));
            }
            let wait = by.saturating_duration_since(now);
            let ts = rustix::time::Timespec {
                tv_sec: wait.as_secs() as i64,
                tv_nsec: i64::from(wait.subsec_nanos()),
            };
            if poll(&mut fds, Some(&ts)).is_err() {
                continue;
            }
            let bell = !fds[0].revents().is_empty();
            let ready = fds.get(1).map(|f| f.revents());
            drop(fds);
            if bell && matches!(self.word(), Word::Stop) {
                return Ok(None);
            }
            if let Some(r) = ready {
                c.notify(r);
            }
        }
    }

    /// While the poller holds the connection: waits for it to say it gave the connection up
    /// (`true`) or that the link went away (`false`), and wakes it if the socket hangs up
    /// meanwhile, so a member that went away is seen even when nothing is forwarded.
    fn watch(&self, sock: Option<OwnedFd>) -> bool {
        let mut sock = sock;
        loop {
            let mut fds = vec![PollFd::new(&self.bell, PollFlags::IN)];
            if let Some(s) = &sock {
                fds.push(PollFd::new(s, PollFlags::RDHUP));
            }
            if poll(&mut fds, None).is_err() {
                continue;
            }
            let bell = !fds[0].revents().is_empty();
            let hung_up = fds.get(1).is_some_and(|f| !f.revents().is_empty());
            drop(fds);
            if hung_up {
                // Once: the poller finds the socket closed and gives the connection up.
                sock = None;
                self.nudge();
            }
            if bell {
                match self.word() {
                    Word::Nothing => {}
                    Word::Lost => return true,
                    Word::Stop => return false,
                }
            }
        }
    }

    /// Waits `d`; `false` when the link went away meanwhile.
    fn pause(&self, d: Duration) -> bool {
        let until = Instant::now() + d;
        loop {
            let wait = until.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return true;
            }
            let ts = rustix::time::Timespec {
                tv_sec: wait.as_secs() as i64,
                tv_nsec: i64::from(wait.subsec_nanos()),
            };
            let mut fds = [PollFd::new(&self.bell, PollFlags::IN)];
            if matches!(poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
                && matches!(self.word(), Word::Stop)
            {
                return false;
            }
        }
    }
}

/// A second descriptor of the connection's socket, for the connector to watch for a hang-up
/// while the poller holds the connection. Dropped (closed) when the poller gives it up.
fn conn_socket(c: &Conn) -> Option<OwnedFd> {
    let (sock, _) = c.waits_on()?;
    rustix::io::fcntl_dupfd_cloexec(sock, 0).ok()
}
