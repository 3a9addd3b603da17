//! The manager link's transport: TCP, authenticated with the members' shared key.
//!
//! Both ends prove they hold the key before anything else is said, and every frame after
//! that carries a tag that only a holder of the key could have made for that place in that
//! connection:
//!
//! 1. the member sends [`MAGIC`] and a fresh 32-byte nonce `nc`;
//! 2. the manager's host answers a fresh nonce `ns` and `HMAC(key, "S" | nc | ns)`;
//! 3. the member checks it and answers `HMAC(key, "C" | nc | ns)`, which the manager checks;
//! 4. both derive the connection's key `HMAC(key, "K" | nc | ns)`.
//!
//! A frame is its length (u32, little-endian), its bytes, and the first 16 bytes of
//! `HMAC(connection key, direction | number | bytes)`, where the number counts the frames sent
//! in that direction: a frame changed, dropped, replayed or moved to another connection fails
//! its check, and the connection is closed. The frames are not encrypted (the file data goes
//! over the NBD link, whose TLS encrypts it; what this link carries is file names and
//! attributes).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

type Tag = Hmac<Sha256>;

/// What a member says first: the protocol and its version.
pub const MAGIC: &[u8; 16] = b"moneta-share\0\0\0\x01";
/// The largest frame either end accepts.
pub const MAX_FRAME: usize = 1 << 20;
/// Bytes of a frame's tag.
const TAG: usize = 16;
/// How long the handshake may take, in all; and the rest of a frame once it began.
pub const HANDSHAKE: Duration = Duration::from_secs(5);
/// How long a send may wait for room in the connection before the link counts as failed.
pub const WRITE_WAIT: Duration = Duration::from_secs(2);

/// Reads exactly `buf.len()` bytes before `deadline`.
fn read_by(mut s: &TcpStream, buf: &mut [u8], deadline: std::time::Instant) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[done..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The network.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The other end does not hold the key, or a frame was changed.
    #[error("{0}")]
    Refused(&'static str),
    /// No frame began within the time given (nothing was read: the link stands).
    #[error("nothing came")]
    Quiet,
}

/// The members' shared key.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// Reads a key file as nbdkit and libnbd read theirs (`USER:HEXKEY` lines): the first
    /// line's key, at least 16 bytes. The same file can so key the NBD links and this one.
    pub fn load(path: &std::path::Path) -> Result<Key, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("key file {}: {e}", path.display()))?;
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .ok_or_else(|| format!("key file {}: no USER:HEXKEY line", path.display()))?;
        let hex = line.rsplit(':').next().unwrap_or(line);
        let bytes = decode_hex(hex)
            .ok_or_else(|| format!("key file {}: the key is not hexadecimal", path.display()))?;
        if bytes.len() < 16 {
            return Err(format!(
                "key file {}: a key of {} bytes is too short (at least 16)",
                path.display(),
                bytes.len()
            ));
        }
        Ok(Key(bytes))
    }

    /// A key of these bytes.
    pub fn from_bytes(b: &[u8]) -> Key {
        Key(b.to_vec())
    }

    fn mac(&self, parts: &[&[u8]]) -> Tag {
        let mut m = Tag::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        for p in parts {
            m.update(p);
        }
        m
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    let mut got = 0;
    while got < n.len() {
        got += rustix::rand::getrandom(&mut n[got..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(n)
}

/// One end's sending half: frames are numbered, so one sender at a time.
struct Sender {
    stream: TcpStream,
    sent: u64,
}

/// One end's receiving half.
struct Receiver {
    stream: TcpStream,
    received: u64,
}

/// An authenticated connection. Sending and receiving may go on in two threads at once.
pub struct Link {
    key: Key,
    /// `b'C'` for the member's end (what it sends is tagged `C`), `b'S'` for the manager's.
    me: u8,
    tx: Mutex<Sender>,
    rx: Mutex<Receiver>,
    /// For shutting the connection down from another thread.
    raw: TcpStream,
}

impl Link {
    /// The member's end: proves the key to the manager's host at `stream` and checks its
    /// proof.
    pub fn connect(stream: TcpStream, key: &Key) -> Result<Link, LinkError> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(WRITE_WAIT))?;
        let deadline = std::time::Instant::now() + HANDSHAKE;
        let nc = nonce()?;
        let mut s = &stream;
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&nc);
        s.write_all(&hello)?;
        let mut answer = [0u8; 64];
        read_by(&stream, &mut answer, deadline)?;
        let ns = &answer[..32];
        key.mac(&[b"S", &nc, ns])
            .verify_slice(&answer[32..])
            .map_err(|_| LinkError::Refused("the manager's host does not hold the key"))?;
        s.write_all(&key.mac(&[b"C", &nc, ns]).finalize().into_bytes())?;
        stream.set_read_timeout(None)?;
        Link::keyed(stream, key, &nc, ns, b'C')
    }

    /// The manager's end: checks a member's proof of the key and gives its own.
    pub fn accept(stream: TcpStream, key: &Key) -> Result<Link, LinkError> {
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(WRITE_WAIT))?;
        // One deadline for the whole handshake: a peer trickling bytes holds a thread no
        // longer than that.
        let deadline = std::time::Instant::now() + HANDSHAKE;
        let mut s = &stream;
        let mut hello = [0u8; 48];
        read_by(&stream, &mut hello, deadline)?;
        if &hello[..16] != MAGIC {
            return Err(LinkError::Refused(
                "not a Moneta member, or another version",
            ));
        }
        let nc = &hello[16..];
        let ns = nonce()?;
        let mut answer = ns.to_vec();
        answer.extend_from_slice(&key.mac(&[b"S", nc, &ns]).finalize().into_bytes());
        s.write_all(&answer)?;
        let mut proof = [0u8; 32];
        read_by(&stream, &mut proof, deadline)?;
        key.mac(&[b"C", nc, &ns])
            .verify_slice(&proof)
            .map_err(|_| LinkError::Refused("the member does not hold the key"))?;
        stream.set_read_timeout(None)?;
        Link::keyed(stream, key, nc, &ns, b'S')
    }

    fn keyed(
        stream: TcpStream,
        key: &Key,
        nc: &[u8],
        ns: &[u8],
        me: u8,
    ) -> Result<Link, LinkError> {
        let k = key.mac(&[b"K", nc, ns]).finalize().into_bytes();
        Ok(Link {
            key: Key::from_bytes(&k),
            me,
            tx: Mutex::new(Sender {
                stream: stream.try_clone()?,
                sent: 0,
            }),
            rx: Mutex::new(Receiver {
                stream: stream.try_clone()?,
                received: 0,
            }),
            raw: stream,
        })
    }

    /// Sends one frame.
    pub fn send(&self, bytes: &[u8]) -> Result<(), LinkError> {
        assert!(bytes.len() <= MAX_FRAME, "frames are bounded");
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let n = tx.sent;
        let tag = self
            .key
            .mac(&[&[self.me], &n.to_le_bytes(), bytes])
            .finalize()
            .into_bytes();
        let mut frame = Vec::with_capacity(4 + bytes.len() + TAG);
        frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        frame.extend_from_slice(bytes);
        frame.extend_from_slice(&tag[..TAG]);
        tx.stream.write_all(&frame)?;
        tx.sent += 1;
        Ok(())
    }

    /// Receives one frame, waiting at most `timeout` (forever for `None`) for its first byte
    /// ([`LinkError::Quiet`] if none came: nothing was read) and at most [`HANDSHAKE`] for the
    /// rest. A frame whose tag fails closes the link; any other error leaves it unusable.
    pub fn receive(&self, timeout: Option<Duration>) -> Result<Vec<u8>, LinkError> {
        let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = timeout {
            // Waits for the frame's first byte without reading: a frame is read whole or
            // the link fails, never left half read.
            let mut fds = [rustix::event::PollFd::new(
                &rx.stream,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec::try_from(t).unwrap_or(rustix::event::Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            });
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(0) => return Err(LinkError::Quiet),
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => return Err(LinkError::Quiet),
                Err(e) => return Err(LinkError::Io(e.into())),
            }
        }
        let mut len = [0u8; 4];
        if timeout.is_none() {
            // Forever for the first byte, then the frame's own bound.
            rx.stream.set_read_timeout(None)?;
            rx.stream.read_exact(&mut len[..1])?;
            read_by(
                &rx.stream,
                &mut len[1..],
                std::time::Instant::now() + HANDSHAKE,
            )?;
        } else {
            read_by(&rx.stream, &mut len, std::time::Instant::now() + HANDSHAKE)?;
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            self.shutdown();
            return Err(LinkError::Refused(
                "a frame longer than the protocol allows",
            ));
        }
        let mut buf = vec![0u8; len + TAG];
        read_by(&rx.stream, &mut buf, std::time::Instant::now() + HANDSHAKE)?;
        let n = rx.received;
        let other = if self.me == b'C' { b'S' } else { b'C' };
        let (bytes, tag) = buf.split_at(len);
        if self
            .key
            .mac(&[&[other], &n.to_le_bytes(), bytes])
            .verify_truncated_left(tag)
            .is_err()
        {
            self.shutdown();
            return Err(LinkError::Refused("a frame failed its check"));
        }
        rx.received += 1;
        buf.truncate(len);
        Ok(buf)
    }

    /// Ends the connection; both halves fail at once, in every thread.
    pub fn shutdown(&self) {
        let _ = self.raw.shutdown(std::net::Shutdown::Both);
    }

    /// The other end's address.
    pub fn peer(&self) -> String {
        self.raw
            .peer_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "?".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(member: &Key, manager: &Key) -> (Result<Link, LinkError>, Result<Link, LinkError>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let k = manager.clone();
        let t = std::thread::spawn(move || Link::accept(l.accept().unwrap().0, &k));
        let c = Link::connect(TcpStream::connect(addr).unwrap(), member);
        (c, t.join().unwrap())
    }

    #[test]
    fn frames_pass_between_holders_of_the_key_and_fail_without_it() {
        let key = Key::from_bytes(&[7; 32]);
        let (c, s) = pair(&key, &key);
        let (c, s) = (c.unwrap(), s.unwrap());
        c.send(b"hello").unwrap();
        c.send(b"").unwrap();
        assert_eq!(s.receive(None).unwrap(), b"hello");
        assert_eq!(s.receive(None).unwrap(), b"");
        s.send(&[1; 70_000]).unwrap();
        assert_eq!(c.receive(None).unwrap(), vec![1; 70_000]);

        // A member with another key is refused by the manager, and the other way round.
        let other = Key::from_bytes(&[8; 32]);
        let (c, s) = pair(&other, &key);
        assert!(
            c.is_err(),
            "the member must not accept a manager that lacks its key"
        );
        assert!(
            s.is_err(),
            "the manager must refuse a member without the key"
        );
    }

    #[test]
    fn a_frame_changed_on_the_way_fails_its_check() {
        let key = Key::from_bytes(&[9; 32]);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let k = key.clone();
        let t = std::thread::spawn(move || Link::accept(l.accept().unwrap().0, &k).unwrap());
        let raw = TcpStream::connect(addr).unwrap();
        let c = Link::connect(raw.try_clone().unwrap(), &key).unwrap();
        let s = t.join().unwrap();
        // A frame made by hand with a wrong tag, as a man in the middle would send it.
        let mut forged = 3u32.to_le_bytes().to_vec();
        forged.extend_from_slice(b"abc");
        forged.extend_from_slice(&[0; TAG]);
        (&raw).write_all(&forged).unwrap();
        assert!(matches!(s.receive(None), Err(LinkError::Refused(_))));
        drop(c);
    }

    #[test]
    fn key_files_are_read_as_nbdkit_reads_them() {
        let dir = std::env::temp_dir().join(format!("moneta-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("psk");
        std::fs::write(&p, "member:000102030405060708090a0b0c0d0e0f\n").unwrap();
        assert_eq!(Key::load(&p).unwrap().0, (0u8..16).collect::<Vec<_>>());
        std::fs::write(&p, "member:0001\n").unwrap();
        assert!(Key::load(&p).unwrap_err().contains("too short"));
        std::fs::write(&p, "member:zz\n").unwrap();
        assert!(Key::load(&p).unwrap_err().contains("hexadecimal"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
