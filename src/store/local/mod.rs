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

mod format;
mod list;
mod locks;
mod ops;

pub use format::fnv1a64;
use format::*;
use list::*;
pub(crate) use locks::open_lock_file;
use locks::*;
pub use locks::{LockFiles, lock_files};
use ops::*;

/// How a local directory's [`Store::identity`] begins (then its device and
/// inode): how a caller that holds only a `dyn Store` knows it is one.
pub const LOCAL_IDENTITY_PREFIX: &str = "file-inode:";
/// Largest body accepted, matching the cloud adapter's read bound.
const MAX_BODY: usize = super::objstore::MAX_READ_BYTES as usize;
const META_DIR: &str = ".leasehold";

/// How many times a writer makes a key's directories again after finding
/// one removed under it (`Inner::parent_dir`, `Inner::write`): each retry
/// follows a delete that emptied the directory in between.
const DIR_TRIES: usize = 1_000;

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
