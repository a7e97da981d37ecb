//! Laptop mode: a [`Store`] on a local directory with real compare-and-swap.
//!
//! object_store's `LocalFileSystem` refuses `PutMode::Update`, so this is our
//! own. Two threads, or two processes, on one directory contend exactly like
//! two nodes on S3:
//!
//! - every write takes an exclusive kernel advisory lock (`flock`) on a
//!   per-key lock file under `.leasehold/keylocks/`, re-reads the current version
//!   under the lock, and only then commits. A delete (or an If-Match, or a
//!   create, that leaves no object) unlinks the key's lock file while
//!   holding it, so keys written once and expired, like change hints, leave
//!   nothing behind; a writer holds a lock only once the path still names
//!   the file it locked. In a directory an older build wrote (which keeps
//!   its lock files under `locks/`), this build does as it does
//!   (`Inner::lock_scheme`);
//! - a commit writes a temporary file in the key's directory (owner-only),
//!   fsyncs it, renames it over the key atomically and fsyncs the directory,
//!   so a reader (which takes no lock) sees the old object or the new one,
//!   never a mix, and a crash leaves one of them;
//! - a delete removes the directories it empties, as an object store has
//!   none (`Inner::remove_empty_dirs`: the change feed's ten-second buckets
//!   come and go with their hints), and a listing from a cursor skips every
//!   directory wholly before it (`walk`), so a feed read costs the buckets
//!   since the cursor, not the retention;
//! - reads take no lock and share one blocking thread per burst (the first
//!   read to find none at work starts it; it serves every read queued until
//!   the queue is empty), since a small read costs less than a blocking
//!   task's hand-off; writes keep a blocking task each;
//! - each file starts with a header line carrying its ETag, length and
//!   checksum; a file whose header, length or checksum does not match is
//!   reported as corrupt, never as absent. The ETag is fresh on every write
//!   even when the bytes repeat;
//! - **a listing finds a version without opening the file** (issue #14): a
//!   write stamps its file's modification time with its ETag (the kernel's
//!   second of the write, and 30 random bits as the nanoseconds: ETag
//!   `<seconds>.<nanoseconds>`) and marks it so by its mode, owner read-only
//!   (`0o400`, [`STAMPED_MODE`]). A listing takes such a file's version from
//!   one `fstatat`; any other file (written before stamps, or on a
//!   filesystem that does not keep nanoseconds, checked once at open:
//!   ETag `<generation>-<random>`, mode `0o600`) is opened and its header
//!   read, as every file was before. A stamp changed by hand (`touch`) only
//!   makes the listing disagree with the header, which reads as a change:
//!   the reader reads the object, and every conditional write still
//!   compares against the header under the lock. So a wrong stamp costs
//!   reads, never a write. A key's stamps only increase while it exists
//!   (`next_stamp`: moved past the current one when the clock would not),
//!   so a change never lists as no change and no version comes back; a key
//!   deleted and created again differs by the second and 30 random bits.
//!
//! Paths are built only from keys that pass [`check_key`] plus a stricter
//! segment charset, every directory on the way is checked not to be a symlink,
//! files are opened with `O_NOFOLLOW` (a listing opens each object and
//! subdirectory relative to its parent's descriptor, `openat`, so it never
//! passes through a symlink and looks up one name per object), and the root
//! directory's identity (device and inode) is pinned at open: if the
//! directory is replaced under us, operations fail instead of writing
//! somewhere new.

use super::{
    Cond, Conditional, Entry, Object, Store, StoreError, Version, check_key, check_prefix,
};
use crate::clock::{Entropy, OsEntropy};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const MAGIC: &str = "leasehold-object/1";

/// How a local directory's [`Store::identity`] begins (then its device and
/// inode): how a caller that holds only a `dyn Store` knows it is one.
pub const LOCAL_IDENTITY_PREFIX: &str = "file-inode:";
/// Largest body accepted, matching the cloud adapter's read bound.
const MAX_BODY: usize = super::objstore::MAX_READ_BYTES as usize;
const META_DIR: &str = ".leasehold";

/// What `.leasehold/locks` holds when it is a file (see `Inner::lock_scheme`).
const LOCKS_NOTE: &str = "This store's lock files are under keylocks/. A leasehold build that \
locks under locks/ (before the change that made this file) cannot write here: it would not \
exclude this build's writers. To go back to such a build, stop every process using this \
directory and remove this file.\n";

/// How many times a writer locks afresh after finding its lock file
/// unlinked under it (`Inner::lock`).
const LOCK_TRIES: usize = 10_000;

/// How many times a writer makes a key's directories again after finding
/// one removed under it (`Inner::parent_dir`, `Inner::write`): each retry
/// follows a delete that emptied the directory in between.
const DIR_TRIES: usize = 1_000;

/// A key's write lock (`Inner::lock`): released when dropped (the file is
/// closed).
struct KeyLock {
    file: File,
    /// Where lock files are unlinked with their key (`Inner::lock_scheme`).
    path: Option<PathBuf>,
}

impl KeyLock {
    /// For a key that holds no object (deleted, found missing by an
    /// If-Match, or a create that failed): unlinks the lock file while still
    /// holding it, then releases it. A writer waiting on the old file finds
    /// the path changed and locks afresh (`Inner::lock`). Safe whatever the
    /// key holds (exclusion never rests on the file existing: the next
    /// writer creates one). Best effort: a lock file that could not be
    /// removed is still the one its path names (only a file left behind),
    /// so the operation's own answer stands.
    fn unlink(self) {
        if let Some(path) = &self.path
            && let Err(e) = fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "local store: a lock file not removed");
        }
        drop(self.file);
    }
}

/// Where a local directory's lock files are, for `leasehold doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockFiles {
    /// The directory they are in.
    pub dir: PathBuf,
    /// Whether a deleted key's lock file is removed with it (this build's
    /// scheme), or kept for every key ever written (an older build wrote
    /// this directory: see `Inner::lock_scheme`).
    pub removed_with_keys: bool,
    /// How many there are now.
    pub count: u64,
}

/// The lock files of the local store at `root`, as the next write would
/// use them (before any write: this build's scheme, none yet).
pub fn lock_files(root: &Path) -> Result<LockFiles, StoreError> {
    let meta = root.join(META_DIR);
    let legacy = meta.join("locks");
    let (dir, removed_with_keys) = match fs::symlink_metadata(&legacy) {
        Ok(md) if md.is_dir() => (legacy, false),
        Ok(_) => (meta.join("keylocks"), true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (meta.join("keylocks"), true),
        Err(e) => return Err(io_err("stat lock marker", e)),
    };
    let count = match fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
            .count() as u64,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io_err("list lock files", e)),
    };
    Ok(LockFiles {
        dir,
        removed_with_keys,
        count,
    })
}

/// Opens (creating, owner-only) a lock file for `flock`, never through a
/// symlink at its name. The store's key locks and the host lock
/// (`crate::hostlock`) both use it.
pub(crate) fn open_lock_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// A store on a local directory. Cheap to clone.
#[derive(Clone)]
pub struct LocalDirStore {
    inner: Arc<Inner>,
    reads: Arc<ReadQueue>,
}

/// Reads waiting for the blocking thread that serves them in turn (see
/// [`LocalDirStore::read_blocking`]), and whether one is at work.
#[derive(Default)]
struct ReadQueue {
    state: std::sync::Mutex<(Vec<ReadJob>, bool)>,
}

type ReadJob = Box<dyn FnOnce(&Inner) + Send>;

struct Inner {
    root: PathBuf,
    dev: u64,
    ino: u64,
    entropy: Arc<dyn Entropy>,
    /// Writes stamp their version in the file's modification time (see the
    /// module docs): the filesystem kept a nanosecond stamp when checked at
    /// open ([`stamps_kept`]).
    stamps: bool,
    /// Directory entries the listings' walks have read (names and
    /// subdirectories, before any is matched): what a listing costs the
    /// kernel, for tests and measurements ([`LocalDirStore::entries_walked`]).
    walked: std::sync::atomic::AtomicU64,
}

/// The mode of a file whose modification time is its version (see the
/// module docs). Owner-only, as every object file is; read-only, which is
/// all a reader needs (writes replace the file, never edit it).
pub const STAMPED_MODE: u32 = 0o400;
/// The mode of a file whose version is only in its header.
const PLAIN_MODE: u32 = 0o600;

impl fmt::Debug for LocalDirStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LocalDirStore({})", self.inner.root.display())
    }
}

impl fmt::Display for LocalDirStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "file://{}", self.inner.root.display())
    }
}

fn io_err(context: &str, e: std::io::Error) -> StoreError {
    // A name the filesystem cannot hold (a key's segment over 255 bytes) is
    // the caller's request, not the store being down: retrying cannot help.
    if e.raw_os_error() == Some(libc::ENAMETOOLONG) {
        return StoreError::Invalid {
            reason: format!("{context}: {e}"),
        };
    }
    StoreError::Unavailable {
        message: format!("{context}: {e}"),
    }
}

impl LocalDirStore {
    /// Opens (creating if needed, owner-only) the directory `root`.
    pub fn open(root: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_entropy(root, Arc::new(OsEntropy::new()))
    }

    pub fn open_with_entropy(
        root: impl AsRef<Path>,
        entropy: Arc<dyn Entropy>,
    ) -> Result<Self, StoreError> {
        let root = root.as_ref();
        if !root.is_absolute() {
            return Err(StoreError::Invalid {
                reason: format!("local store root {} must be absolute", root.display()),
            });
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| io_err(&format!("create {}", root.display()), e))?;
        let md = fs::metadata(root).map_err(|e| io_err("stat root", e))?;
        if !md.is_dir() {
            return Err(StoreError::Invalid {
                reason: format!("{} is not a directory", root.display()),
            });
        }
        // Named by its canonical path, so every spelling of it displays alike.
        let root = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let stamps = stamps_kept(&root, entropy.as_ref());
        Ok(LocalDirStore {
            inner: Arc::new(Inner {
                root,
                dev: md.dev(),
                ino: md.ino(),
                entropy,
                stamps,
                walked: 0.into(),
            }),
            reads: Arc::new(ReadQueue::default()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Do writes stamp their version in the file's modification time (see
    /// the module docs)? False on a filesystem that does not keep a
    /// nanosecond modification time: its listings read every header.
    pub fn stamps(&self) -> bool {
        self.inner.stamps
    }

    /// How many directory entries this handle's listings have read so far
    /// (every name of every directory walked, matched or not): a listing
    /// from a cursor reads the directories at and after it, not the ones
    /// wholly before it (see `walk`).
    #[doc(hidden)]
    pub fn entries_walked(&self) -> u64 {
        self.inner.walked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// This store with writes that do not stamp (as before stamps, or on a
    /// filesystem without nanoseconds): for tests of a directory that
    /// holds both kinds of file.
    #[doc(hidden)]
    pub fn without_stamps(self) -> Self {
        let i = &self.inner;
        LocalDirStore {
            inner: Arc::new(Inner {
                root: i.root.clone(),
                dev: i.dev,
                ino: i.ino,
                entropy: i.entropy.clone(),
                stamps: false,
                walked: 0.into(),
            }),
            reads: Arc::new(ReadQueue::default()),
        }
    }

    /// A listing in two steps (see [`Names`]): the names, sorted, on one
    /// blocking task; then their headers, [`LIST_CHUNK`] at a time, each
    /// chunk on a blocking task of its own as the stream is read.
    fn listing(
        &self,
        prefix: &str,
        after: Option<String>,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        let this = self.clone();
        let prefix = prefix.to_string();
        futures::stream::once(async move {
            let names = this
                .blocking(move |i| i.names(&prefix, after.as_deref()))
                .await;
            (this, names)
        })
        .flat_map(|(this, names)| match names {
            Ok(names) => futures::stream::unfold(Some(names), move |names| {
                let this = this.clone();
                async move {
                    let mut names = names?;
                    if names.is_done() {
                        return None;
                    }
                    match this
                        .blocking(move |i| {
                            let chunk = names.read(LIST_CHUNK);
                            // The headers were read through descriptors
                            // opened at the start: a root replaced since
                            // fails the listing, as it fails every other
                            // operation.
                            if names.is_done() {
                                i.check_root()?;
                            }
                            Ok((names, chunk))
                        })
                        .await
                    {
                        Ok((names, chunk)) => Some((
                            futures::stream::iter(chunk.into_iter().map(Ok)).boxed(),
                            Some(names),
                        )),
                        Err(e) => Some((futures::stream::once(async { Err(e) }).boxed(), None)),
                    }
                }
            })
            .flatten()
            .boxed(),
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .boxed()
    }

    /// Runs the read `f` on a blocking thread shared with the reads queued
    /// beside it: the first read to find no thread at work starts one, which
    /// serves every read queued until the queue is empty.
    ///
    /// Why: a read of a small object on a warm page cache takes a few
    /// microseconds of system calls, and a blocking-pool task of its own
    /// costs more than that in the hand-off (a futex wake of a pool thread,
    /// then of the waiting worker). A node reads most of what it reads in
    /// bursts (a pass's hinted claims and manifests, 16 at a time); placing
    /// 100,000 sessions on ten nodes, futex wakes and waits, mostly these
    /// hand-offs, were a sixth of the fleet's CPU (issue #14; placement
    /// 35-41 s → 26-27 s with this and the deadline floor). Writes keep a
    /// task each: they fsync, and a
    /// renewal must not wait behind another write's fsync.
    async fn read_blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: ReadJob = Box::new(move |inner| {
            let _ = tx.send(f(inner));
        });
        let start = {
            let mut st = self.reads.state.lock().unwrap_or_else(|p| p.into_inner());
            st.0.push(job);
            !std::mem::replace(&mut st.1, true)
        };
        if start {
            let (inner, reads) = (self.inner.clone(), self.reads.clone());
            // Dropped unrun if the runtime refuses or drops the task (it is
            // shutting down): the guard then empties the queue, so those
            // reads fail instead of waiting for a thread that never comes,
            // and clears the flag, so later reads start a thread of their
            // own (on a store that outlives this runtime).
            let guard = Unserved(Some(reads));
            // Not awaited: the thread outlives this read if others queue.
            drop(tokio::task::spawn_blocking(move || {
                let mut guard = guard;
                if let Some(reads) = guard.0.take() {
                    serve_reads(&inner, &reads);
                }
            }));
        }
        // A job that panicked dropped its sender.
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable {
                message: "local store read failed".into(),
            })
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| StoreError::Unavailable {
                message: format!("local store task failed: {e}"),
            })?
    }
}

/// The batch reader's queue, held by a reader thread not yet started: if
/// it is dropped instead (the runtime never ran the thread), the queued
/// reads are dropped, so their callers get an error, and the next read
/// starts a thread again.
struct Unserved(Option<Arc<ReadQueue>>);

impl Drop for Unserved {
    fn drop(&mut self) {
        let Some(reads) = self.0.take() else {
            return;
        };
        let jobs = {
            let mut st = reads.state.lock().unwrap_or_else(|p| p.into_inner());
            st.1 = false;
            std::mem::take(&mut st.0)
        };
        drop(jobs);
    }
}

/// The batch reader's loop (`LocalDirStore::read_blocking`): runs queued
/// reads until the queue is empty, then marks itself gone under the same
/// lock a reader queues under, so a read queued at any moment is either
/// taken by this loop or starts the next one. A read that panics fails
/// alone (its caller gets an error) and the loop goes on.
fn serve_reads(inner: &Inner, reads: &ReadQueue) {
    loop {
        let jobs = {
            let mut st = reads.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.0.is_empty() {
                st.1 = false;
                return;
            }
            std::mem::take(&mut st.0)
        };
        for job in jobs {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(inner)));
        }
    }
}

/// Segments of a local key: the shared key rules plus a charset that cannot
/// name our hidden files or escape the directory.
fn local_segments(key: &str) -> Result<Vec<&str>, StoreError> {
    check_key(key)?;
    let segs: Vec<&str> = key.split('/').collect();
    for s in &segs {
        if !segment_ok(s) {
            return Err(StoreError::Invalid {
                reason: format!(
                    "key {key:?}: the local store accepts segments of [A-Za-z0-9._-] not starting with '.'"
                ),
            });
        }
    }
    Ok(segs)
}

/// A segment the local store can address: [A-Za-z0-9._-], not starting
/// with '.' (which names our own hidden files), so never `.` or `..`.
fn segment_ok(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Opens for reading without following a symlink, and without waiting: a
/// FIFO planted in the directory would otherwise block `open` (and with it
/// every listing, read and write of the store) until some writer appeared.
/// Regular files ignore `O_NONBLOCK`; anything else is then refused as not a
/// regular file.
fn nofollow_read() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    o
}

impl Inner {
    /// Fails if the root was replaced since open.
    fn check_root(&self) -> Result<(), StoreError> {
        let md = fs::metadata(&self.root).map_err(|e| io_err("stat root", e))?;
        if md.dev() != self.dev || md.ino() != self.ino {
            return Err(StoreError::Invalid {
                reason: format!(
                    "root directory {} changed identity since it was opened; refusing to continue",
                    self.root.display()
                ),
            });
        }
        Ok(())
    }

    /// Walks the parent directories of `segs`, refusing symlinks; creates the
    /// missing ones (owner-only) when `create` is set. Returns the parent
    /// directory, or None when it does not exist and `create` is false.
    fn parent_dir(&self, segs: &[&str], create: bool) -> Result<Option<PathBuf>, StoreError> {
        self.check_root()?;
        // A delete removes the directories it empties (`remove`), so one
        // found or made here may be gone by the next step: then the walk
        // starts again from the root.
        'walk: for _ in 0..DIR_TRIES {
            let mut dir = self.root.clone();
            for s in &segs[..segs.len() - 1] {
                dir.push(s);
                match fs::symlink_metadata(&dir) {
                    Ok(md) if md.file_type().is_symlink() => {
                        return Err(StoreError::Invalid {
                            reason: format!("{} is a symlink; refusing it", dir.display()),
                        });
                    }
                    Ok(md) if md.is_dir() => {}
                    Ok(_) => {
                        return Err(StoreError::Corrupt {
                            reason: format!("{} is not a directory", dir.display()),
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        if !create {
                            return Ok(None);
                        }
                        match fs::DirBuilder::new().mode(0o700).create(&dir) {
                            // Durable before anything is written in it:
                            // directories now come and go (the feed's
                            // buckets), and an object acknowledged in one
                            // must not be lost with it in a crash.
                            Ok(()) => {
                                if let Some(parent) = dir.parent() {
                                    match File::open(parent).and_then(|d| d.sync_all()) {
                                        Ok(()) => {}
                                        // Emptied and removed since the
                                        // mkdir: ours went with it.
                                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                                            continue 'walk;
                                        }
                                        Err(e) => {
                                            return Err(io_err(
                                                &format!("fsync {}", parent.display()),
                                                e,
                                            ));
                                        }
                                    }
                                }
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue 'walk,
                            Err(e) => return Err(io_err(&format!("mkdir {}", dir.display()), e)),
                        }
                        match fs::symlink_metadata(&dir) {
                            Ok(md) if md.is_dir() && !md.file_type().is_symlink() => {}
                            Ok(_) => {
                                return Err(StoreError::Invalid {
                                    reason: format!("{} is not a directory", dir.display()),
                                });
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue 'walk,
                            Err(e) => return Err(io_err("stat", e)),
                        }
                    }
                    Err(e) => return Err(io_err(&format!("stat {}", dir.display()), e)),
                }
            }
            return Ok(Some(dir));
        }
        Err(StoreError::Unavailable {
            message: format!(
                "the directories of {:?} were removed under each of {DIR_TRIES} tries",
                segs.join("/")
            ),
        })
    }

    /// Makes a removal in the directory of the key `segs` durable: fsyncs
    /// that directory, or, where a delete of another key emptied and
    /// removed it meanwhile (`remove_empty_dirs`), the nearest directory
    /// above it that is still there: the removal that took the directory
    /// came after ours, and a journaling filesystem keeps the two in
    /// order. (One made again since under the same name is fsynced into
    /// its parent by its maker, `parent_dir`, but perhaps only after this
    /// delete is acknowledged: there too the order rests on a journaling
    /// filesystem, ext4 or XFS, committing metadata in order.)
    fn sync_dir_of(&self, segs: &[&str]) -> Result<(), StoreError> {
        for depth in (0..segs.len()).rev() {
            let mut dir = self.root.clone();
            dir.extend(&segs[..depth]);
            match File::open(&dir).and_then(|d| d.sync_all()) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && depth > 0 => {}
                Err(e) => return Err(io_err("fsync directory", e)),
            }
        }
        Ok(())
    }

    /// Removes the directories above the key `segs` that are empty, deepest
    /// first, down to the second level: an object store has no
    /// directories, and a key scheme that spreads keys over directories
    /// (the change feed's time buckets, `keys::HintForm::Bucketed`) would
    /// otherwise leave one behind for every ten seconds of hints, each read
    /// by every listing of the feed and every expiry.
    ///
    /// Why this is safe beside writers: `rmdir` removes only an empty
    /// directory, atomically. A writer holds a temporary file in the key's
    /// directory from before its rename until after it, so a directory
    /// with a write in flight is not empty; a writer that made or found
    /// the directory and had not yet created its temporary file finds it
    /// gone and makes it again (`parent_dir`, `write`).
    ///
    /// Why never a top-level directory (`sessions/`, `changes/`): builds
    /// before this one write only keys one level deep (besides the probe's
    /// own `_probe/<run>/`, which only that probe empties) and do not make
    /// a directory again, so removing one of theirs under them would fail
    /// their write or their delete's fsync. A second-level directory is
    /// never theirs, so this holds in either lock scheme, and a directory
    /// an older build wrote is kept free of empty buckets too.
    fn remove_empty_dirs(&self, segs: &[&str]) {
        for depth in (2..segs.len()).rev() {
            let mut dir = self.root.clone();
            dir.extend(&segs[..depth]);
            if fs::remove_dir(&dir).is_err() {
                // Not empty (the usual case), or gone, or not ours to remove.
                break;
            }
        }
    }

    /// Where this directory's lock files are, and whether a deleted key's
    /// is unlinked (see `lock`).
    ///
    /// Why two schemes: older builds lock `.leasehold/locks/<key>.lock`,
    /// never unlink it, and do not check the inode after `flock`. Beside
    /// one of them, a writer that unlinks a lock file breaks exclusion
    /// (that build, waiting on the unlinked file, holds it beside a writer
    /// that created a new one). So:
    /// - `.leasehold/locks` a directory (an older build wrote here): its
    ///   scheme, lock files kept, exactly as that build does;
    /// - missing: a regular file is put there (create-only), which makes an
    ///   older build's writes fail ("create lock directory": it is not a
    ///   directory) rather than run beside ours unexcluded (they would
    ///   lock other files);
    /// - a regular file: lock files under `.leasehold/keylocks/`, unlinked
    ///   with their key.
    ///
    /// Decided on every write (one `lstat`): a directory that turns up
    /// later (an older build racing the first write) is taken as found.
    fn lock_scheme(&self) -> Result<(PathBuf, bool), StoreError> {
        let meta = self.root.join(META_DIR);
        let legacy = meta.join("locks");
        loop {
            match rustix::fs::lstat(&legacy) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                    return Ok((legacy, false));
                }
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                    let keylocks = meta.join("keylocks");
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(&keylocks)
                        .map_err(|e| io_err("create lock directory", e))?;
                    return Ok((keylocks, true));
                }
                Ok(_) => {
                    return Err(StoreError::Invalid {
                        reason: format!(
                            "{} is neither a directory nor a file; refusing it",
                            legacy.display()
                        ),
                    });
                }
                Err(Errno::NOENT) => {
                    fs::DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(&meta)
                        .map_err(|e| io_err("create metadata directory", e))?;
                    match OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(0o400)
                        .custom_flags(libc::O_NOFOLLOW)
                        .open(&legacy)
                    {
                        Ok(mut f) => {
                            let _ = f.write_all(LOCKS_NOTE.as_bytes());
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(io_err("create lock marker", e)),
                    }
                }
                Err(e) => return Err(errno("stat lock marker", e)),
            }
        }
    }

    /// Takes `key`'s write lock: an exclusive `flock` on its lock file,
    /// held until the returned guard is dropped.
    ///
    /// Why the check after the `flock` (where lock files are unlinked, see
    /// `lock_scheme`): the holder that deletes a key unlinks its lock file
    /// (`KeyLock::unlink`), or every key ever written (each change hint is
    /// a key of its own) would leave a file behind for ever. A writer that
    /// opened the file before that unlink then gets the lock on an inode no
    /// path names any more, while a later writer creates a new file and
    /// locks that: two holders. So a writer holds the lock only once the
    /// path still names the very inode it locked; else it drops it and
    /// tries again. The path changes only while its inode's lock is held
    /// (the unlink) or while it names nothing (a create), so a check that
    /// passed stays true until its holder unlinks.
    fn lock(&self, key: &str) -> Result<KeyLock, StoreError> {
        // Before creating anything: never write into a replaced root.
        self.check_root()?;
        let (locks, unlinks) = self.lock_scheme()?;
        // '%' cannot appear in a local key segment, so this mapping is 1:1.
        let path = locks.join(format!("{}.lock", key.replace('/', "%")));
        for _ in 0..LOCK_TRIES {
            let f = open_lock_file(&path)
                .map_err(|e| io_err(&format!("open lock {}", path.display()), e))?;
            f.lock().map_err(|e| io_err("flock", e))?;
            if !unlinks {
                return Ok(KeyLock {
                    file: f,
                    path: None,
                });
            }
            let held = rustix::fs::fstat(&f).map_err(|e| errno("stat lock", e))?;
            match rustix::fs::lstat(&path) {
                Ok(now) if now.st_dev == held.st_dev && now.st_ino == held.st_ino => {
                    return Ok(KeyLock {
                        file: f,
                        path: Some(path),
                    });
                }
                // Unlinked (and perhaps created again) while we waited.
                Ok(_) | Err(Errno::NOENT) => continue,
                Err(e) => return Err(errno("stat lock", e)),
            }
        }
        // Each retry follows an unlink of this key's lock file after we
        // opened it: so many means a filesystem whose `fstat` and `lstat`
        // disagree on one file, or a key deleted without pause while we
        // wait. An error (retryable) rather than a spin.
        Err(StoreError::Unavailable {
            message: format!(
                "lock {}: the file changed under every one of {LOCK_TRIES} tries",
                path.display()
            ),
        })
    }

    fn read(&self, key: &str) -> Result<Option<Object>, StoreError> {
        let segs = local_segments(key)?;
        let Some(dir) = self.parent_dir(&segs, false)? else {
            return Ok(None);
        };
        let path = dir.join(segs[segs.len() - 1]);
        let mut f = match nofollow_read().open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(StoreError::Invalid {
                    reason: format!("{} is a symlink; refusing it", path.display()),
                });
            }
            Err(e) => return Err(io_err(&format!("open {}", path.display()), e)),
        };
        let md = f.metadata().map_err(|e| io_err("stat", e))?;
        if !md.is_file() {
            return Err(StoreError::Corrupt {
                reason: format!("{} is not a regular file", path.display()),
            });
        }
        let mut buf = Vec::new();
        (&mut f)
            .take(MAX_BODY as u64 + 512)
            .read_to_end(&mut buf)
            .map_err(|e| io_err("read", e))?;
        let (etag, body) = parse_file(&buf)?;
        Ok(Some(Object {
            bytes: Bytes::copy_from_slice(body),
            version: Version {
                etag: Some(etag),
                version: None,
            },
        }))
    }

    fn write(&self, key: &str, bytes: &[u8], cond: &Cond) -> Result<Version, StoreError> {
        if bytes.len() > MAX_BODY {
            return Err(StoreError::Invalid {
                reason: format!("object of {} bytes exceeds {MAX_BODY}", bytes.len()),
            });
        }
        let segs = local_segments(key)?;
        let lock = self.lock(key)?;
        // Under the lock, the current version cannot change (every writer
        // locks), so this check-then-rename is a compare-and-swap.
        let current = match self.read(key) {
            Ok(current) => current,
            Err(e) => {
                // Nothing written: no lock file left for the key (an
                // unlink under a held lock is safe whatever it holds).
                lock.unlink();
                return Err(e);
            }
        };
        let generation = match (cond, &current) {
            (Cond::Create, None) => 1,
            (Cond::Create, Some(_)) => return Err(StoreError::AlreadyExists),
            (Cond::Match(_) | Cond::MatchAs(..), None) => {
                // Nothing there, nothing written: no lock file left for it.
                lock.unlink();
                return Err(StoreError::Precondition);
            }
            (Cond::Match(want) | Cond::MatchAs(want, _), Some(cur)) => {
                if want.etag.is_none() || want.etag != cur.version.etag {
                    return Err(StoreError::Precondition);
                }
                generation_of(cur.version.etag.as_deref().unwrap_or("")) + 1
            }
        };
        // Made only for a write that will be tried: a refused condition
        // leaves no directory behind, and a create that fails here leaves
        // neither its lock file nor the directories it made.
        let mut dir = match self.parent_dir(&segs, true) {
            Ok(dir) => dir.expect("created parent directories"),
            Err(e) => {
                if current.is_none() {
                    lock.unlink();
                    self.remove_empty_dirs(&segs);
                }
                return Err(e);
            }
        };
        let mut tmp = dir.join(format!(".tmp-{}", self.entropy.hex_id()));
        let mut etag = String::new();
        let result = (|| {
            // The temporary file keeps the directory from being removed
            // (`remove_empty_dirs`) until after the rename; before it is
            // made, a delete that emptied the directory may remove it: then
            // it is made again.
            let mut tries = 0;
            let mut f = loop {
                match OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(if self.stamps {
                        STAMPED_MODE
                    } else {
                        PLAIN_MODE
                    })
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&tmp)
                {
                    Ok(f) => break f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < DIR_TRIES => {
                        tries += 1;
                        dir = self
                            .parent_dir(&segs, true)?
                            .expect("created parent directories");
                        tmp = dir.join(format!(".tmp-{}", self.entropy.hex_id()));
                    }
                    Err(e) => return Err(io_err("create temporary file", e)),
                }
            };
            let target = dir.join(segs[segs.len() - 1]);
            let stamp = if self.stamps {
                // The kernel's clock, as the file's creation stamped it (the
                // store reads no clock of its own), and random nanoseconds.
                // Past the current version's stamp, if it is one.
                let st = rustix::fs::fstat(&f).map_err(|e| errno("stat temporary file", e))?;
                let prev = current
                    .as_ref()
                    .and_then(|c| c.version.etag.as_deref())
                    .and_then(parse_stamp);
                let (sec, nsec) = next_stamp(st.st_mtime, self.entropy.next_u64(), prev);
                Some(rustix::fs::Timespec {
                    tv_sec: sec,
                    tv_nsec: nsec as _,
                })
            } else {
                None
            };
            etag = match &stamp {
                Some(t) => stamp_etag(t.tv_sec, t.tv_nsec),
                None => format!("{generation}-{}", self.entropy.hex_id()),
            };
            f.write_all(header(&etag, bytes).as_bytes())
                .and_then(|_| f.write_all(bytes))
                .map_err(|e| io_err("write temporary file", e))?;
            // After the last write (a write sets the time), before the
            // rename (which keeps it).
            if let Some(t) = stamp {
                set_mtime(&f, t).map_err(|e| errno("stamp temporary file", e))?;
            }
            f.sync_all()
                .map_err(|e| io_err("write temporary file", e))?;
            // Refuse to replace a symlink planted at the key.
            if let Ok(md) = fs::symlink_metadata(&target)
                && md.file_type().is_symlink()
            {
                return Err(StoreError::Invalid {
                    reason: format!("{} is a symlink; refusing it", target.display()),
                });
            }
            fs::rename(&tmp, &target).map_err(|e| io_err("rename", e))?;
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err("fsync directory", e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
            // A create that failed leaves no lock file for its key (an
            // unlink under a held lock is safe whatever the key holds),
            // nor a directory it made.
            if current.is_none() {
                lock.unlink();
                self.remove_empty_dirs(&segs);
            }
        }
        result?;
        Ok(Version {
            etag: Some(etag),
            version: None,
        })
    }

    fn remove(&self, key: &str) -> Result<(), StoreError> {
        let segs = local_segments(key)?;
        let lock = self.lock(key)?;
        let Some(dir) = self.parent_dir(&segs, false)? else {
            lock.unlink();
            return Ok(());
        };
        match fs::remove_file(dir.join(segs[segs.len() - 1])) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                lock.unlink();
                self.remove_empty_dirs(&segs);
                return Ok(());
            }
            Err(e) => return Err(io_err("remove", e)),
        }
        let synced = self.sync_dir_of(&segs);
        // The key is gone: so is its lock file (see `lock`), and any
        // directory it leaves empty.
        lock.unlink();
        self.remove_empty_dirs(&segs);
        synced
    }

    /// Every key under `prefix` above `after` (all of them for `None`), as
    /// names still to be read (see [`Names`]). `after` is applied to names
    /// before any file is opened: a directory holding many old hints is then
    /// read (one `getdents` pass) but none of their files, where the trait's
    /// default read every header to drop it.
    fn names(&self, prefix: &str, after: Option<&str>) -> Result<Names, StoreError> {
        check_prefix(prefix)?;
        self.check_root()?;
        let dir_part = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let mut start = self.root.clone();
        if !dir_part.is_empty() {
            for s in local_segments(dir_part)? {
                start.push(s);
                match fs::symlink_metadata(&start) {
                    Ok(md) if md.is_dir() && !md.file_type().is_symlink() => {}
                    Ok(_) => return Ok(Names::default()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Ok(Names::default());
                    }
                    Err(e) => return Err(io_err("stat", e)),
                }
            }
        }
        let base = if dir_part.is_empty() {
            String::new()
        } else {
            format!("{dir_part}/")
        };
        // Not through a symlink (the walk never follows one), and a
        // directory only: every directory on the way was checked, and the
        // last one replaced by a symlink since fails here instead of being
        // followed. Below it the walk opens each directory relative to its
        // parent's descriptor, never by path.
        let dfd = match rustix::fs::open(&start, DIR_OPEN, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(Names::default()),
            Err(e) => return Err(errno(&format!("list {}", start.display()), e)),
        };
        let mut names = Names::default();
        let mut pending = Vec::new();
        let mut walked = 0;
        let r = walk(
            dfd,
            &base,
            prefix,
            after,
            &mut pending,
            &mut names.dirs,
            &mut walked,
        );
        self.walked
            .fetch_add(walked, std::sync::atomic::Ordering::Relaxed);
        r?;
        pending.sort_unstable_by(|a, b| a.key().cmp(b.key()));
        names.pending = pending.into_iter();
        Ok(names)
    }
}

/// How the listing opens a directory: never through a symlink, and a
/// directory only (one replaced by a symlink fails instead of being
/// followed).
const DIR_OPEN: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn errno(what: &str, e: Errno) -> StoreError {
    io_err(what, std::io::Error::from(e))
}

/// How many object headers a listing reads per blocking task.
const LIST_CHUNK: usize = 1000;

/// How many directories a listing keeps open from its name pass to its
/// reads (besides the one per level the walk holds while it descends, as
/// it always did). Every prefix leasehold lists is one directory, which
/// the walk holds first; in a tree of more (an operator's stray folders),
/// the files of directories past this many are read in the name pass, as
/// every file was before, so a listing holds no more descriptors than
/// this however many directories there are.
const MAX_HELD_DIRS: usize = 16;

/// A listing between its two steps: every matching name, sorted, with the
/// directories they are in still open, and their headers read on demand
/// (`read`).
///
/// Why two steps: an object's version is in its header, so each listed
/// object is opened and read, and the listing must be sorted, which needs
/// every name first. Reading every header before sorting held the whole
/// listing as entries (key, ETag, size, time: about 180 bytes each) until
/// the caller had taken the last one; a name is about 70. At 100,000
/// sessions that was 20-30 MB of a node's peak during each full listing
/// (issue #14). Each header of a held directory is now read when its
/// chunk is reached, so an object rewritten meanwhile lists at its newer
/// version and one deleted meanwhile is left out, as a deletion during the
/// walk always was (a file of a directory past `MAX_HELD_DIRS` lists as
/// the name pass found it). Listings are not snapshots on any store.
#[derive(Default)]
struct Names {
    dirs: Vec<OwnedFd>,
    pending: std::vec::IntoIter<Pending>,
}

enum Pending {
    /// `key[at..]` is a file name in `dirs[dir]`.
    Named { dir: u32, at: u32, key: String },
    /// Read in the name pass (a directory past `MAX_HELD_DIRS`).
    Read(Box<Entry>),
}

impl Pending {
    fn key(&self) -> &str {
        match self {
            Pending::Named { key, .. } => key,
            Pending::Read(e) => &e.key,
        }
    }
}

impl Names {
    fn is_done(&self) -> bool {
        self.pending.len() == 0
    }

    /// The next entries, up to `n` of them read (fewer where a file went
    /// away since its name was read).
    fn read(&mut self, n: usize) -> Vec<Entry> {
        let mut out = Vec::with_capacity(n.min(self.pending.len()));
        for p in self.pending.by_ref().take(n) {
            match p {
                Pending::Named { dir, at, key } => {
                    if let Some(e) = read_entry(&self.dirs[dir as usize], key, at as usize) {
                        out.push(e);
                    }
                }
                Pending::Read(e) => out.push(*e),
            }
        }
        if self.is_done() {
            // The descriptors are not kept for the stream's lifetime.
            self.dirs.clear();
        }
        out
    }
}

/// One directory of a listing (`base` is its key prefix, `dir` it open):
/// the names of its matching objects go to `out`, then its subdirectories
/// are walked in turn. This directory takes its slot among the held ones
/// before any subdirectory does, so the directory a prefix names (the
/// one that holds a fleet's sessions) is held however many stray folders
/// sit in it. Every object and subdirectory is opened relative to `dir`
/// (`openat`), so each costs a lookup of one name, not of the whole path,
/// and nothing is ever reached through a symlink; a name at or below
/// `after`, or outside `prefix`, is dropped before anything is allocated
/// for it. A full listing of 200,000 objects does this for every one
/// (issue #14).
///
/// What changes under the walk is taken as it is found: a name gone by the
/// time it is opened was deleted during the listing and is left out; one
/// replaced by a symlink is skipped as symlinks are.
fn walk(
    dir: OwnedFd,
    base: &str,
    prefix: &str,
    after: Option<&str>,
    out: &mut Vec<Pending>,
    dirs: &mut Vec<OwnedFd>,
    walked: &mut u64,
) -> Result<(), StoreError> {
    let mut key = String::new();
    let mut here: Vec<String> = Vec::new();
    let mut subdirs: Vec<String> = Vec::new();
    // The directory's reader is dropped before any subdirectory is opened:
    // two descriptors per level at most, besides the held ones.
    for ent in rustix::fs::Dir::read_from(&dir).map_err(|e| errno("list", e))? {
        let ent = ent.map_err(|e| errno("list", e))?;
        *walked += 1;
        let cname = ent.file_name();
        let Ok(name) = cname.to_str() else { continue };
        if name.starts_with('.') {
            continue; // our metadata and temporary files, `.` and `..`
        }
        let key = crate::keys::key_in(&mut key, base, name);
        // A name `get` would refuse (another tool's file, a key too long):
        // listed, it would stop every caller that reads what it lists.
        // (Our hidden names are skipped above, silently.)
        if !segment_ok(name) || key.len() > 1024 {
            tracing::warn!(
                key,
                "local store: skipping a name it cannot address in listing"
            );
            continue;
        }
        let ft = match ent.file_type() {
            FileType::Unknown => match rustix::fs::statat(&dir, cname, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(errno("stat", e)),
            },
            ft => ft,
        };
        if ft == FileType::Symlink {
            tracing::warn!(key, "local store: skipping symlink in listing");
            continue;
        }
        if ft == FileType::Directory {
            // Descend only where keys under it can match the prefix, and
            // can sort after the cursor: every key under `sub` sorts
            // before a cursor that `sub` sorts before without being its
            // prefix (they differ at a byte of `sub`). So a listing of the
            // change feed from a cursor reads the time buckets from the
            // cursor's on, not every hint within the retention
            // (`keys::HintForm::Bucketed`, issue #14).
            let sub = format!("{key}/");
            if (sub.starts_with(prefix) || prefix.starts_with(&sub))
                && !after.is_some_and(|a| sub.as_str() < a && !a.starts_with(&sub))
            {
                subdirs.push(name.to_string());
            }
            continue;
        }
        if !key.starts_with(prefix) || after.is_some_and(|a| key <= a) {
            continue;
        }
        here.push(key.to_string());
    }
    let at = u32::try_from(base.len()).map_err(|_| StoreError::Invalid {
        reason: format!("key prefix {base:?} is too long"),
    })?;
    // This directory: held (its names read in chunks later) while there
    // are slots, else its files read now. Either way it stays open while
    // its subdirectories are walked, one level's descriptor as before.
    // Held: its index in `dirs`; else the descriptor itself.
    let slot: std::result::Result<usize, OwnedFd> =
        if !here.is_empty() && dirs.len() < MAX_HELD_DIRS {
            let idx = dirs.len();
            dirs.push(dir);
            out.extend(here.into_iter().map(|key| Pending::Named {
                dir: idx as u32,
                at,
                key,
            }));
            Ok(idx)
        } else {
            for key in here {
                if let Some(e) = read_entry(&dir, key, base.len()) {
                    out.push(Pending::Read(Box::new(e)));
                }
            }
            Err(dir)
        };
    for name in subdirs {
        let parent = match &slot {
            Ok(i) => &dirs[*i],
            Err(d) => d,
        };
        let sub = format!("{base}{name}/");
        match rustix::fs::openat(parent, name.as_str(), DIR_OPEN, Mode::empty()) {
            Ok(sub_fd) => walk(sub_fd, &sub, prefix, after, out, dirs, walked)?,
            Err(Errno::NOENT) => {}
            Err(Errno::LOOP | Errno::NOTDIR) => {
                tracing::warn!(key = %sub, "local store: skipping symlink in listing");
            }
            Err(e) => return Err(errno(&format!("list {sub}"), e)),
        }
    }
    Ok(())
}

/// The listing's entry for the object `key[at..]` in `dir` (its key `key`),
/// or None if it is gone or a symlink now. A stamped file's version is its
/// modification time (one `fstatat`; see the module docs); any other file's
/// is read from its header (the listing carries ETags without reading
/// whole objects). A foreign file lists with no version, or (stamped) with
/// its stamp; reading it reports the corruption. Opened as `nofollow_read`
/// does (no symlink, no waiting on a FIFO); the metadata from the open
/// file (fstat), not by name again.
fn read_entry(dir: &OwnedFd, key: String, at: usize) -> Option<Entry> {
    let name = &key[at..];
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => {
            if let Some((version, size, last_modified_ms)) = stamped_version(&st) {
                return Some(Entry {
                    key,
                    version,
                    size,
                    last_modified_ms,
                });
            }
        }
        Err(Errno::NOENT) => return None,
        Err(_) => {}
    }
    header_entry(dir, key, at)
}

/// A stamped regular file's version, body length and time from its
/// metadata alone; None for any other file (a symlink, a directory, an
/// unstamped file, or one too short to hold a header with this stamp).
fn stamped_version(st: &rustix::fs::Stat) -> Option<(Version, u64, Option<u64>)> {
    // The field's types differ between targets.
    #[allow(clippy::unnecessary_cast)]
    let (mode, sec, nsec) = (
        st.st_mode as u32,
        st.st_mtime as i64,
        st.st_mtime_nsec as i64,
    );
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || mode & 0o7777 != STAMPED_MODE
    {
        return None;
    }
    let etag = stamp_etag(sec, nsec);
    let size = body_len(&etag, u64::try_from(st.st_size).ok()?)?;
    // The stamp's nanoseconds are random: the second is the time.
    let last_modified_ms = u64::try_from(sec).ok()?.checked_mul(1000);
    Some((
        Version {
            etag: Some(etag),
            version: None,
        },
        size,
        last_modified_ms,
    ))
}

/// A stamped file's ETag.
fn stamp_etag(sec: i64, nsec: i64) -> String {
    format!("{sec}.{nsec:09}")
}

/// A stamp's (seconds, nanoseconds), if `etag` is one.
fn parse_stamp(etag: &str) -> Option<(i64, i64)> {
    let (sec, nsec) = etag.split_once('.')?;
    let nsec: i64 = nsec.parse().ok()?;
    ((0..1_000_000_000).contains(&nsec)).then_some((sec.parse().ok()?, nsec))
}

/// The stamp of a key's next version: the kernel's second `now` and
/// random nanoseconds, moved past the current version's stamp `prev` when
/// not later (a clock stepped back, or two writes in one second). So while
/// a key exists its stamps only increase, and no version comes back, as
/// with the generations of plain files: a conditional write on an old
/// version can never match a newer one. A key deleted and created again
/// starts afresh: its versions differ by the second and 30 random bits.
fn next_stamp(now: i64, random: u64, prev: Option<(i64, i64)>) -> (i64, i64) {
    let fresh = (now, (random % 1_000_000_000) as i64);
    match prev {
        Some((sec, nsec)) if fresh <= (sec, nsec) => {
            // Still random within a millisecond past it.
            let n = nsec + 1 + ((random >> 32) % 1_000_000) as i64;
            if n >= 1_000_000_000 {
                (sec.saturating_add(1), n - 1_000_000_000)
            } else {
                (sec, n)
            }
        }
        _ => fresh,
    }
}

/// The body length of a file of `total` bytes whose header carries `etag`:
/// the header is `MAGIC etag len checksum\n`, whose own length grows with
/// the digits of `len` (so one length fits). None if none does.
fn body_len(etag: &str, total: u64) -> Option<u64> {
    // MAGIC, etag, the length's digits, 16 hex digits, 3 spaces, newline.
    let fixed = (MAGIC.len() + etag.len() + 16 + 4) as u64;
    (1..=20u32).find_map(|digits| {
        let len = total.checked_sub(fixed + u64::from(digits))?;
        (len.checked_ilog10().unwrap_or(0) + 1 == digits).then_some(len)
    })
}

/// The listing's entry for a file whose version is in its header.
fn header_entry(dir: &OwnedFd, key: String, at: usize) -> Option<Entry> {
    let name = &key[at..];
    let mut head = [0u8; 256];
    let (n, st) = match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(f) => (
            rustix::io::read(&f, &mut head).unwrap_or(0),
            rustix::fs::fstat(&f).ok(),
        ),
        Err(Errno::NOENT) => return None,
        Err(Errno::LOOP) => {
            tracing::warn!(key, "local store: skipping symlink in listing");
            return None;
        }
        // Unreadable (permissions): listed without a version.
        Err(_) => (
            0,
            rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok(),
        ),
    };
    let (etag, size) = match parse_header(&head[..n]) {
        Some((etag, len, _, _)) => (Some(etag), len as u64),
        None => (None, st.as_ref().map_or(0, |m| m.st_size.max(0) as u64)),
    };
    let last_modified_ms = st.and_then(|m| {
        // The field's type differs between targets.
        #[allow(clippy::unnecessary_cast)]
        let nsec = m.st_mtime_nsec as u64;
        u64::try_from(m.st_mtime)
            .ok()?
            .checked_mul(1000)?
            .checked_add(nsec / 1_000_000)
    });
    Some(Entry {
        key,
        version: Version {
            etag,
            version: None,
        },
        size,
        last_modified_ms,
    })
}

fn header(etag: &str, body: &[u8]) -> String {
    format!("{MAGIC} {etag} {} {:016x}\n", body.len(), fnv1a64(body))
}

/// Parses the header line: (etag, body length, checksum, header length).
fn parse_header(buf: &[u8]) -> Option<(String, usize, u64, usize)> {
    let nl = buf.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&buf[..nl]).ok()?;
    let mut parts = line.split(' ');
    if parts.next()? != MAGIC {
        return None;
    }
    let etag = parts.next()?.to_string();
    let len: usize = parts.next()?.parse().ok()?;
    let sum = u64::from_str_radix(parts.next()?, 16).ok()?;
    if parts.next().is_some() || etag.is_empty() {
        return None;
    }
    Some((etag, len, sum, nl + 1))
}

fn parse_file(buf: &[u8]) -> Result<(String, &[u8]), StoreError> {
    let Some((etag, len, sum, hlen)) = parse_header(buf) else {
        return Err(StoreError::Corrupt {
            reason: "not a leasehold object file (missing or malformed header)".into(),
        });
    };
    let body = &buf[hlen..];
    if body.len() != len {
        return Err(StoreError::Corrupt {
            reason: format!(
                "truncated or extended: header says {len} bytes, file has {}",
                body.len()
            ),
        });
    }
    if fnv1a64(body) != sum {
        return Err(StoreError::Corrupt {
            reason: "checksum mismatch".into(),
        });
    }
    Ok((etag, body))
}

/// Does the filesystem under `root` keep a modification time to the
/// nanosecond (see the module docs)? Checked once at open on a file of our
/// own under `.leasehold/`: set, then read back through a fresh lookup.
/// Any failure answers no, and the store then writes plain files (its
/// listings read every header, as before stamps).
fn stamps_kept(root: &Path, entropy: &dyn Entropy) -> bool {
    let meta = root.join(META_DIR);
    if fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&meta)
        .is_err()
    {
        return false;
    }
    let path = meta.join(format!(".stamp-probe-{}", entropy.hex_id()));
    let want = rustix::fs::Timespec {
        tv_sec: 1_000_000_007,
        tv_nsec: 987_654_321,
    };
    let kept = (|| -> Option<bool> {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(PLAIN_MODE)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .ok()?;
        set_mtime(&f, want).ok()?;
        f.sync_all().ok()?;
        drop(f);
        let st = rustix::fs::stat(&path).ok()?;
        #[allow(clippy::unnecessary_cast)]
        Some(
            st.st_mtime as i64 == want.tv_sec as i64
                && st.st_mtime_nsec as i64 == want.tv_nsec as i64,
        )
    })();
    let _ = fs::remove_file(&path);
    kept.unwrap_or(false)
}

/// Sets the modification time of the open file `f` (its access time left
/// as it is): a stamp (see the module docs).
fn set_mtime(f: &File, t: rustix::fs::Timespec) -> rustix::io::Result<()> {
    let keep = rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_OMIT,
    };
    rustix::fs::futimens(
        f,
        &rustix::fs::Timestamps {
            last_access: keep,
            last_modification: t,
        },
    )
}

fn generation_of(etag: &str) -> u64 {
    etag.split('-')
        .next()
        .and_then(|g| g.parse().ok())
        .unwrap_or(0)
}

/// FNV-1a, 64 bit: a checksum against truncation and accidental edits, and
/// a stable short hash for file names. Not cryptographic.
pub fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[async_trait]
impl Store for LocalDirStore {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        let key = key.to_string();
        self.read_blocking(move |i| i.read(&key)).await
    }

    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        Ok(match self.get(key).await? {
            None => Conditional::Missing,
            Some(o) if known.etag.is_some() && o.version.etag == known.etag => {
                Conditional::NotModified
            }
            Some(o) => Conditional::Changed(o),
        })
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let key = key.to_string();
        self.blocking(move |i| i.write(&key, &bytes, &cond)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let key = key.to_string();
        self.blocking(move |i| i.remove(&key)).await
    }

    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.listing(prefix, None)
    }

    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.listing(prefix, Some(after.to_string()))
    }

    /// The root's device and inode: one directory reached by two paths
    /// (symlinks, bind mounts, `/x/store` and `/x//store/`) is one store.
    fn identity(&self) -> String {
        format!(
            "{LOCAL_IDENTITY_PREFIX}{}:{}",
            self.inner.dev, self.inner.ino
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key's stamps only increase, whatever the clock or the draw.
    #[test]
    fn a_keys_stamps_only_increase() {
        let mut prev = None;
        let mut x = 0x9e3779b97f4a7c15u64;
        for i in 0..10_000i64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // The clock jumps back and forth; most writes share a second.
            let now = 1_764_000_000 + (i / 1000) - (i % 7 == 0) as i64 * 5;
            let next = next_stamp(now, x, prev);
            assert!(prev.is_none_or(|p| next > p), "{next:?} after {prev:?}");
            assert!((0..1_000_000_000).contains(&next.1));
            assert_eq!(parse_stamp(&stamp_etag(next.0, next.1)), Some(next));
            prev = Some(next);
        }
        assert_eq!(next_stamp(5, 7, Some((5, 999_999_999))).0, 6, "carried");
        assert_eq!(parse_stamp("3-00ab"), None, "a plain file's ETag");
        assert_eq!(parse_stamp("1.1000000000"), None);
    }

    /// A stamped file's body length comes from its size and its ETag alone:
    /// the header's length grows with the digits of the body's.
    #[test]
    fn a_body_length_is_found_from_the_file_size() {
        for etag in ["1764000000.000000001", "17640.999999999"] {
            for len in (0..2_000usize).chain([9_999, 10_000, 99_999, 100_000, 1_000_000]) {
                let total = header(etag, &vec![b'x'; len]).len() + len;
                assert_eq!(
                    body_len(etag, total as u64),
                    Some(len as u64),
                    "{etag} {len}"
                );
            }
            assert_eq!(body_len(etag, 10), None, "too short for any header");
        }
    }

    /// A reader thread the runtime never ran (dropped at shutdown): the
    /// reads queued for it fail instead of waiting for ever, and the next
    /// read may start a thread again.
    #[test]
    fn reads_queued_for_a_thread_never_run_fail_and_free_the_queue() {
        let reads = Arc::new(ReadQueue::default());
        let (tx, mut rx) = tokio::sync::oneshot::channel::<Result<(), StoreError>>();
        {
            let mut st = reads.state.lock().unwrap();
            st.0.push(Box::new(move |_| {
                let _ = tx.send(Ok(()));
            }));
            st.1 = true;
        }
        drop(Unserved(Some(reads.clone())));
        assert!(
            matches!(
                rx.try_recv(),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed)
            ),
            "the queued read must fail, not be answered or left waiting"
        );
        let st = reads.state.lock().unwrap();
        assert!(
            st.0.is_empty() && !st.1,
            "queue emptied, no thread marked at work"
        );
        drop(st);
        // A thread that ran took the queue out of its guard: the guard then
        // leaves the queue to whoever is at work.
        reads.state.lock().unwrap().1 = true;
        drop(Unserved(None));
        assert!(reads.state.lock().unwrap().1);
    }
}
