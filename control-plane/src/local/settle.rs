//! When a changed file has settled: a file is read only once its writer is done, so that
//! a write that pauses mid-file never serves half a file.
//!
//! The rule, decided by [`Settling`] (sans-I/O, fed with what the kernel reports and the
//! clock):
//! - **With inotify** (Linux, the normal case): a file that was created or written and has
//!   not been closed since by a writer is *being written* and keeps its last good content.
//!   It is read once a writer closes it (`IN_CLOSE_WRITE`) or is renamed into place
//!   (`IN_MOVED_TO`, how editors and `kubectl cp`-style tools replace files). A file
//!   changed without write events (a mounted ConfigMap's `..data` symlink swap) is read at
//!   once. A writer that keeps its file open longer than [`MAX_SETTLE`] (a process that
//!   never closes it) does not freeze the file: it is then read as it is, with a warning.
//!   Where a read overlaps a write (the file changed while it was being read), the read is
//!   dropped and tried again on the next scan.
//! - **Without inotify** (its instance or watch limit reached, or the watch lost with the
//!   folder): a changed file is read once its fingerprint (inode, size, times) has
//!   stayed the same for [`QUIET`]. This cannot see a writer that pauses longer than that.
//! - **Right after events were lost** (the queue overflowed, or the watch was re-armed
//!   after the folder was swapped, [`Settling::resume`]): for [`MAX_SETTLE`], a changed
//!   file whose writer was not seen closing it since is read under the [`QUIET`] rule (a
//!   writer that started while nothing was watched is not trusted to be done); then
//!   events decide again.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest a file can be held open by a writer before it is read as it is.
pub const MAX_SETTLE: Duration = Duration::from_secs(10);
/// Without inotify: how long a changed file's fingerprint must stay the same before it is
/// read.
pub const QUIET: Duration = Duration::from_millis(500);

/// What the kernel reported about one file of the folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Created or written (`IN_CREATE`, `IN_MODIFY`): a writer is at work.
    Written(PathBuf),
    /// Closed by a writer, or renamed into the folder (`IN_CLOSE_WRITE`, `IN_MOVED_TO`):
    /// the write is over.
    Done(PathBuf),
    /// Deleted, renamed away or its attributes changed (`IN_DELETE`, `IN_MOVED_FROM`,
    /// `IN_ATTRIB`): nothing about writers, but the entry is to be looked at again.
    Touched(PathBuf),
    /// Events were lost (`IN_Q_OVERFLOW`): the watch still works, but what writers did
    /// meanwhile is unknown.
    Overflow,
    /// The watch is gone or watches the wrong folder (`IN_IGNORED`, `IN_DELETE_SELF`,
    /// `IN_MOVE_SELF`: the folder was deleted, moved or swapped; or its queue cannot be
    /// read): nothing is known about writers until it is re-armed.
    Lost,
}

/// Whether a changed file can be read now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its writer is done (or there is none): read it.
    Settled,
    /// Still being written: keep its last good content, ask again on the next scan.
    Writing,
    /// Held open by a writer for longer than [`MAX_SETTLE`]: read it as it is.
    Overdue,
}

/// The settling state of the folder's files.
#[derive(Debug)]
pub struct Settling {
    /// Whether write events are known (inotify works and has not overflowed).
    events: bool,
    /// Files written and not closed since: when the writing started.
    writing: HashMap<PathBuf, Instant>,
    /// Write events seen per file, so that a read that overlapped a write is noticed.
    writes: HashMap<PathBuf, u64>,
    /// Without events: each changed file's fingerprint and since when it is unchanged.
    quiet: HashMap<PathBuf, (u64, Instant)>,
    /// When events were last lost and resumed ([`Self::resume`]), and the files whose
    /// writer was seen closing them since.
    resumed: Option<(Instant, std::collections::HashSet<PathBuf>)>,
    /// How many times events were lost: a read that overlapped a loss is not trusted.
    losses: u64,
}

/// What [`Settling::before_read`] hands out and [`Settling::unchanged_since`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadToken {
    writes: u64,
    losses: u64,
}

impl Settling {
    /// `events`: whether write events will be observed (see [`Self::observe`]).
    pub fn new(events: bool) -> Self {
        Self {
            events,
            writing: HashMap::new(),
            writes: HashMap::new(),
            quiet: HashMap::new(),
            resumed: None,
            losses: 0,
        }
    }

    /// Events are observed again from `now` (the queue overflowed and was drained, or the
    /// watch was re-armed): for [`MAX_SETTLE`], a file whose writer was not seen closing it
    /// since is read only under the [`QUIET`] rule.
    pub fn resume(&mut self, now: Instant) {
        self.events = true;
        self.writing.clear();
        self.resumed = Some((now, std::collections::HashSet::new()));
    }

    /// Whether write events are used (rather than the [`QUIET`] rule).
    pub fn uses_events(&self) -> bool {
        self.events
    }

    /// Takes one reported event, seen at `now`.
    pub fn observe(&mut self, event: Event, now: Instant) {
        match event {
            Event::Written(path) => {
                *self.writes.entry(path.clone()).or_default() += 1;
                self.writing.entry(path).or_insert(now);
            }
            Event::Done(path) => {
                *self.writes.entry(path.clone()).or_default() += 1;
                self.writing.remove(&path);
                if let Some((_, closed)) = &mut self.resumed {
                    closed.insert(path);
                }
            }
            Event::Touched(_) => {}
            Event::Overflow => {
                self.losses += 1;
                self.resume(now);
            }
            Event::Lost => {
                self.losses += 1;
                self.events = false;
                self.writing.clear();
                self.resumed = None;
            }
        }
    }

    /// Whether the file at `path`, whose fingerprint changed to one hashing to
    /// `fingerprint`, can be read at `now`.
    pub fn verdict(&mut self, path: &Path, fingerprint: u64, now: Instant) -> Verdict {
        if self.events {
            let unsure = match &self.resumed {
                Some((at, closed)) if now.saturating_duration_since(*at) < MAX_SETTLE => {
                    !closed.contains(path)
                }
                _ => false,
            };
            return match self.writing.get(path) {
                None if unsure => self.quiet_verdict(path, fingerprint, now),
                None => Verdict::Settled,
                Some(since) if now.saturating_duration_since(*since) >= MAX_SETTLE => {
                    Verdict::Overdue
                }
                Some(_) => Verdict::Writing,
            };
        }
        self.quiet_verdict(path, fingerprint, now)
    }

    /// The [`QUIET`] rule: settled once the fingerprint stayed the same that long.
    fn quiet_verdict(&mut self, path: &Path, fingerprint: u64, now: Instant) -> Verdict {
        match self.quiet.get(path) {
            Some((fp, since)) if *fp == fingerprint => {
                if now.saturating_duration_since(*since) >= QUIET {
                    Verdict::Settled
                } else {
                    Verdict::Writing
                }
            }
            _ => {
                self.quiet.insert(path.to_path_buf(), (fingerprint, now));
                Verdict::Writing
            }
        }
    }

    /// A token to pass to [`Self::unchanged_since`] after reading `path`.
    pub fn before_read(&self, path: &Path) -> ReadToken {
        ReadToken {
            writes: self.writes.get(path).copied().unwrap_or_default(),
            losses: self.losses,
        }
    }

    /// Whether no write event arrived for `path`, and no event was lost, since `token` was
    /// taken (the events that arrived during the read must have been observed first).
    pub fn unchanged_since(&self, path: &Path, token: ReadToken) -> bool {
        self.before_read(path) == token
    }

    /// The file was read (or is gone): forget what was kept for it.
    pub fn forget(&mut self, path: &Path) {
        self.quiet.remove(path);
        if !self.writing.contains_key(path) {
            self.writes.remove(path);
        }
    }

    /// The file is gone: forget everything about it.
    pub fn remove(&mut self, path: &Path) {
        self.writing.remove(path);
        self.writes.remove(path);
        self.quiet.remove(path);
    }

    /// Forgets every file but those in `present` (the folder's current entries).
    pub fn retain(&mut self, present: impl Fn(&Path) -> bool) {
        self.writing.retain(|p, _| present(p));
        self.writes.retain(|p, _| present(p));
        self.quiet.retain(|p, _| present(p));
    }
}

/// The folder's inotify watch, read without blocking on every scan.
#[derive(Debug)]
pub struct Watch {
    inotify: inotify::Inotify,
    dir: PathBuf,
    /// The watched folder's identity when the watch was set up ([`folder_identity`]).
    identity: Option<(u64, u64)>,
    buffer: Vec<u8>,
}

/// The identity (device, inode) of the folder at `dir` now (symlinks followed), or `None`
/// when it cannot be stat'ed: a watch whose folder's identity changed watches a folder
/// that was swapped away.
pub fn folder_identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

impl Watch {
    /// Watches `dir` for writes, closes and renames of its entries, and for the folder
    /// itself being deleted or moved.
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        use inotify::WatchMask;
        let identity = folder_identity(dir);
        let inotify = inotify::Inotify::init()?;
        inotify.watches().add(
            dir,
            WatchMask::CREATE
                | WatchMask::MODIFY
                | WatchMask::CLOSE_WRITE
                | WatchMask::MOVED_TO
                | WatchMask::DELETE
                | WatchMask::MOVED_FROM
                | WatchMask::ATTRIB
                | WatchMask::DELETE_SELF
                | WatchMask::MOVE_SELF,
        )?;
        Ok(Self {
            inotify,
            dir: dir.to_path_buf(),
            identity,
            buffer: vec![0; 16 * 1024],
        })
    }

    /// Whether the watch still watches what is at its path now (the folder was not
    /// swapped for another one since it was set up).
    pub fn watches_the_folder(&self) -> bool {
        self.identity.is_some() && folder_identity(&self.dir) == self.identity
    }

    /// A second handle on the inotify queue that tokio can wait on: readable when events
    /// are queued (the scan that follows drains them). Needs a tokio runtime.
    pub fn readiness(&self) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
        use std::os::fd::AsFd as _;
        let fd = self.inotify.as_fd().try_clone_to_owned()?;
        // `new` is deprecated because a borrowed raw fd could be closed and reused behind
        // tokio's back; this one is an `OwnedFd` (a dup) that the AsyncFd owns alone until
        // it deregisters and closes it, which is what the replacement (`unsafe
        // register`, not allowed here) would require the caller to guarantee.
        #[allow(deprecated)]
        tokio::io::unix::AsyncFd::new(fd)
    }

    /// The events queued since the last call (never blocks). An error reading the queue
    /// is reported as [`Event::Overflow`]: what writers do is no longer known.
    pub fn drain(&mut self) -> Vec<Event> {
        use inotify::EventMask;
        let mut out = Vec::new();
        loop {
            let events = match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return out,
                Err(e) => {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read the config folder's inotify events; the watch is set up again");
                    out.push(Event::Lost);
                    return out;
                }
            };
            for event in events {
                let path = |name: Option<&OsStr>| name.map(|n| self.dir.join(n));
                if event.mask.intersects(EventMask::Q_OVERFLOW) {
                    out.push(Event::Overflow);
                } else if event
                    .mask
                    .intersects(EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF)
                {
                    // The watch is gone, or follows the folder to where it was moved.
                    out.push(Event::Lost);
                } else if event
                    .mask
                    .intersects(EventMask::CLOSE_WRITE | EventMask::MOVED_TO)
                {
                    out.extend(path(event.name).map(Event::Done));
                } else if event.mask.intersects(EventMask::CREATE | EventMask::MODIFY) {
                    out.extend(path(event.name).map(Event::Written));
                } else if event
                    .mask
                    .intersects(EventMask::DELETE | EventMask::MOVED_FROM | EventMask::ATTRIB)
                {
                    out.extend(path(event.name).map(Event::Touched));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn with_events_a_file_is_read_once_its_writer_closes_it() {
        let t0 = Instant::now();
        let f = Path::new("/config/a.yaml");
        let mut s = Settling::new(true);
        assert_eq!(s.verdict(f, 1, t0), Verdict::Settled, "no writer seen");
        s.observe(Event::Written(f.into()), t0);
        // A writer that pauses for seconds mid-file: still being written.
        assert_eq!(s.verdict(f, 2, at(t0, 3_000)), Verdict::Writing);
        assert_eq!(
            s.verdict(Path::new("/config/b.yaml"), 2, at(t0, 3_000)),
            Verdict::Settled,
            "another file"
        );
        s.observe(Event::Done(f.into()), at(t0, 3_100));
        assert_eq!(s.verdict(f, 3, at(t0, 3_100)), Verdict::Settled);
    }

    #[test]
    fn a_writer_that_never_closes_does_not_freeze_the_file() {
        let t0 = Instant::now();
        let f = Path::new("/config/a.yaml");
        let mut s = Settling::new(true);
        s.observe(Event::Written(f.into()), t0);
        // Later writes do not move the start of the writing.
        s.observe(Event::Written(f.into()), at(t0, 9_000));
        assert_eq!(s.verdict(f, 1, at(t0, 9_999)), Verdict::Writing);
        assert_eq!(s.verdict(f, 1, t0 + MAX_SETTLE), Verdict::Overdue);
    }

    #[test]
    fn a_read_that_overlapped_a_write_is_noticed() {
        let t0 = Instant::now();
        let f = Path::new("/config/a.yaml");
        let mut s = Settling::new(true);
        let token = s.before_read(f);
        assert!(s.unchanged_since(f, token));
        s.observe(Event::Written(f.into()), t0);
        s.observe(Event::Done(f.into()), t0);
        assert!(!s.unchanged_since(f, token));
        let token = s.before_read(f);
        assert!(s.unchanged_since(f, token));
    }

    #[test]
    fn without_events_a_file_is_read_once_unchanged_for_the_quiet_time() {
        let t0 = Instant::now();
        let f = Path::new("/config/a.yaml");
        let mut s = Settling::new(false);
        assert_eq!(s.verdict(f, 1, t0), Verdict::Writing, "just changed");
        assert_eq!(s.verdict(f, 1, at(t0, 499)), Verdict::Writing);
        // Changed again: the quiet time starts over.
        assert_eq!(s.verdict(f, 2, at(t0, 450)), Verdict::Writing);
        assert_eq!(s.verdict(f, 2, at(t0, 900)), Verdict::Writing);
        assert_eq!(s.verdict(f, 2, at(t0, 950)), Verdict::Settled);
    }

    #[test]
    fn a_lost_watch_falls_back_to_the_quiet_rule() {
        let t0 = Instant::now();
        let f = Path::new("/config/a.yaml");
        let mut s = Settling::new(true);
        s.observe(Event::Written(f.into()), t0);
        s.observe(Event::Lost, t0);
        assert!(!s.uses_events());
        assert_eq!(s.verdict(f, 1, t0), Verdict::Writing);
        assert_eq!(s.verdict(f, 1, t0 + QUIET), Verdict::Settled);
    }

    #[test]
    fn after_lost_events_a_file_is_trusted_only_once_seen_closed_or_quiet() {
        let t0 = Instant::now();
        let (a, b) = (Path::new("/config/a.yaml"), Path::new("/config/b.yaml"));
        for lost in [Event::Overflow, Event::Lost] {
            let mut s = Settling::new(true);
            // A writer started on `a` while events were being lost: its close is unknown.
            s.observe(lost.clone(), t0);
            if lost == Event::Lost {
                assert!(!s.uses_events());
                s.resume(t0);
            }
            assert!(s.uses_events(), "{lost:?}: events decide again");
            assert_eq!(s.verdict(a, 1, t0), Verdict::Writing, "{lost:?}: half file");
            assert_eq!(s.verdict(a, 1, at(t0, 499)), Verdict::Writing, "{lost:?}");
            assert_eq!(s.verdict(a, 1, t0 + QUIET), Verdict::Settled, "{lost:?}");
            // A writer seen after the loss is trusted as usual.
            s.observe(Event::Written(b.into()), at(t0, 10));
            assert_eq!(s.verdict(b, 2, at(t0, 20)), Verdict::Writing, "{lost:?}");
            s.observe(Event::Done(b.into()), at(t0, 30));
            assert_eq!(s.verdict(b, 2, at(t0, 30)), Verdict::Settled, "{lost:?}");
            // Past MAX_SETTLE any writer of before the loss is overdue: events alone.
            let c = Path::new("/config/c.yaml");
            assert_eq!(
                s.verdict(c, 3, t0 + MAX_SETTLE),
                Verdict::Settled,
                "{lost:?}"
            );
        }
    }

    #[test]
    fn a_read_that_overlapped_lost_events_is_not_trusted() {
        let f = Path::new("/config/a.yaml");
        let mut s = Settling::new(true);
        let token = s.before_read(f);
        s.observe(Event::Overflow, Instant::now());
        assert!(!s.unchanged_since(f, token));
    }

    #[test]
    fn the_watch_reports_the_folder_moved_or_deleted_and_its_identity() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("config");
        std::fs::create_dir(&dir).unwrap();
        let mut watch = Watch::new(&dir).unwrap();
        assert!(watch.watches_the_folder());
        std::fs::rename(&dir, parent.path().join("config.old")).unwrap();
        assert_eq!(watch.drain(), vec![Event::Lost], "moved");
        assert!(!watch.watches_the_folder(), "nothing at its path");
        std::fs::create_dir(&dir).unwrap();
        assert!(!watch.watches_the_folder(), "another folder at its path");
        let mut watch = Watch::new(&dir).unwrap();
        std::fs::remove_dir(&dir).unwrap();
        assert!(watch.drain().contains(&Event::Lost), "deleted");
    }

    #[test]
    fn the_watch_reports_writes_closes_renames_and_deletions() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = Watch::new(dir.path()).unwrap();
        let a = dir.path().join("a.yaml");
        let mut file = std::fs::File::create(&a).unwrap();
        std::io::Write::write_all(&mut file, b"kind: Secret\n").unwrap();
        let events = watch.drain();
        assert!(events.contains(&Event::Written(a.clone())), "{events:?}");
        assert!(!events.contains(&Event::Done(a.clone())), "{events:?}");
        drop(file);
        assert_eq!(watch.drain(), vec![Event::Done(a.clone())]);
        let tmp = dir.path().join(".b.yaml.tmp");
        std::fs::write(&tmp, "x").unwrap();
        watch.drain();
        let b = dir.path().join("b.yaml");
        std::fs::rename(&tmp, &b).unwrap();
        assert_eq!(
            watch.drain(),
            vec![Event::Touched(tmp), Event::Done(b.clone())]
        );
        assert!(watch.drain().is_empty());
        std::fs::remove_file(&b).unwrap();
        assert_eq!(watch.drain(), vec![Event::Touched(b)], "a deletion");
    }
}
