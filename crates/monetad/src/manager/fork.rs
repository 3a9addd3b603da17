//! Open files across `fork`: a bundle of the parent's handles that the child claims on its own
//! connection (`OP_FS_FORK`, `OP_FS_INHERIT`), held until claimed or until its pipe hangs up,
//! which the reaper thread waits for.

use super::*;

/// Handles copied by a `fork` for the child to claim.
pub(super) struct Bundle {
    pub(super) secret: [u64; 2],
    pub(super) uid: u32,
    pub(super) handles: Vec<(u64, Handle)>,
    /// The read end of the pipe whose write ends the forking process and its child hold.
    pub(super) pipe: OwnedFd,
}

#[derive(Default)]
pub(super) struct Bundles {
    pub(super) map: HashMap<u64, Bundle>,
    pub(super) per_uid: HashMap<u32, usize>,
    pub(super) next: u64,
}

impl Bundles {
    pub(super) fn take(&mut self, id: u64) -> Option<Bundle> {
        let b = self.map.remove(&id)?;
        if let Some(n) = self.per_uid.get_mut(&b.uid) {
            *n -= 1;
            if *n == 0 {
                self.per_uid.remove(&b.uid);
            }
        }
        Some(b)
    }
}

impl Manager {
    pub(super) fn reap(&self) {
        let mut space = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 64];
        loop {
            let ids: Vec<u64> = match epoll::wait(&self.hangups, &mut space, None) {
                Ok((events, _)) => events.iter().map(|ev| ev.data.u64()).collect(),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!("the fork-bundle reaper stops: {e}");
                    return;
                }
            };
            for id in ids {
                let taken = self.bundles_lock().take(id);
                if let Some(b) = taken {
                    tracing::debug!(bundle = id, "fork bundle released unclaimed");
                    self.release_bundle(b);
                }
            }
        }
    }

    pub(super) fn bundles_lock(&self) -> MutexGuard<'_, Bundles> {
        self.bundles.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops watching a bundle's pipe and closes the handles it still holds.
    pub(super) fn release_bundle(&self, b: Bundle) {
        let _ = epoll::delete(&self.hangups, &b.pipe);
        {
            let mut locks = self.locks();
            for (_, h) in &b.handles {
                locks.close_ofd(h.ofd);
            }
        }
        let mut fs = self.fs();
        for (_, h) in b.handles {
            if let Err(e) = fs.close(h.ino) {
                tracing::warn!(ino = h.ino, "closing a handle of a fork bundle: {e}");
            }
        }
    }

    /// `OP_FS_FORK`: copies every handle of `s` into a new bundle; returns the reply and the
    /// pipe's write end for the client.
    pub fn fork(&self, s: &Session) -> Result<(FsReply, OwnedFd), Failure> {
        let uid = s.cred.uid;
        {
            let b = self.bundles_lock();
            if b.map.len() >= MAX_BUNDLES
                || b.per_uid.get(&uid).copied().unwrap_or(0) >= MAX_BUNDLES_PER_UID
            {
                return Err(fail(
                    errno::EAGAIN,
                    "too many fork bundles wait to be claimed; try again later",
                ));
            }
        }
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| fail(errno::EMFILE, &format!("cannot make a pipe: {e}")))?;
        let mut secret = [0u64; 2];
        let mut raw = [0u8; 16];
        rustix::rand::getrandom(&mut raw, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| fail(errno::EIO, &format!("getrandom: {e}")))?;
        secret[0] = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
        secret[1] = u64::from_le_bytes(raw[8..].try_into().expect("8 bytes"));
        let handles: Vec<(u64, Handle)> = s.handles.iter().map(|(&k, &h)| (k, h)).collect();
        {
            let mut fs = self.fs();
            for (i, (_, h)) in handles.iter().enumerate() {
                if let Err(e) = fs.reopen(h.ino) {
                    for (_, done) in &handles[..i] {
                        let _ = fs.close(done.ino);
                    }
                    return Err(failure(e));
                }
            }
        }
        // The child shares the handles: the leases of the parent's files come back first.
        // (The files are open twice now, so none can be granted again meanwhile.)
        self.recall_session(s.id);
        self.recall_sole_session(s.id);
        {
            // The copies share their open file descriptions with the originals.
            let mut locks = self.locks();
            for (_, h) in &handles {
                *locks.ofds.entry(h.ofd).or_default() += 1;
            }
        }
        let count = handles.len() as u32;
        let mut b = self.bundles_lock();
        b.next += 1;
        let id = b.next;
        if let Err(e) = epoll::add(
            &self.hangups,
            &read,
            epoll::EventData::new_u64(id),
            epoll::EventFlags::empty(),
        ) {
            drop(b);
            self.release_bundle(Bundle {
                secret,
                uid,
                handles,
                pipe: read,
            });
            return Err(fail(errno::ENOMEM, &format!("cannot watch the pipe: {e}")));
        }
        b.map.insert(
            id,
            Bundle {
                secret,
                uid,
                handles,
                pipe: read,
            },
        );
        *b.per_uid.entry(uid).or_default() += 1;
        Ok((
            FsReply::Forked {
                bundle: id,
                secret,
                handles: count,
            },
            write,
        ))
    }

    /// `OP_FS_INHERIT`: moves a bundle's handles to `s` (first page) or reads on.
    pub(super) fn inherit(
        &self,
        s: &mut Session,
        bundle: u64,
        secret: [u64; 2],
        from: u32,
    ) -> Result<FsReply, Failure> {
        let page = |pairs: &[(u64, u64)]| {
            let from = (from as usize).min(pairs.len());
            let end = (from + MAX_INHERITED).min(pairs.len());
            FsReply::Inherited {
                total: pairs.len() as u32,
                pairs: pairs[from..end].to_vec(),
            }
        };
        let bad = || fail(errno::EBADF, "no such fork bundle, or the wrong secret");
        if from > 0 {
            return match &s.claimed {
                Some((id, sec, pairs)) if *id == bundle && *sec == secret => Ok(page(pairs)),
                _ => Err(bad()),
            };
        }
        let b = {
            let mut all = self.bundles_lock();
            match all.map.get(&bundle) {
                Some(b) if b.secret == secret => {}
                _ => return Err(bad()),
            }
            all.take(bundle).expect("present")
        };
        let _ = epoll::delete(&self.hangups, &b.pipe);
        if s.handles.len() + b.handles.len() > MAX_HANDLES {
            self.release_bundle(b);
            return Err(fail(
                errno::EMFILE,
                "too many open files on this connection to inherit the bundle",
            ));
        }
        let mut pairs = Vec::with_capacity(b.handles.len());
        for (old, h) in b.handles {
            let new = s.next;
            s.next += 1;
            s.add(new, h);
            pairs.push((old, new));
        }
        pairs.sort_unstable();
        let reply = page(&pairs);
        s.claimed = Some((bundle, secret, pairs));
        Ok(reply)
    }
}
