//! Per-key lock files: what serialises writers of one key across processes.

use super::*;

/// What `.leasehold/locks` holds when it is a file (see `Inner::lock_scheme`).
pub(super) const LOCKS_NOTE: &str = "This store's lock files are under keylocks/. A leasehold build that \
locks under locks/ (before the change that made this file) cannot write here: it would not \
exclude this build's writers. To go back to such a build, stop every process using this \
directory and remove this file.\n";

/// How many times a writer locks afresh after finding its lock file
/// unlinked under it (`Inner::lock`).
pub(super) const LOCK_TRIES: usize = 10_000;

/// A key's write lock (`Inner::lock`): released when dropped (the file is
/// closed).
pub(super) struct KeyLock {
    pub(super) file: File,
    /// Where lock files are unlinked with their key (`Inner::lock_scheme`).
    pub(super) path: Option<PathBuf>,
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
    pub(super) fn unlink(self) {
        if let Some(path) = &self.path
            && let Err(e) = fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %crate::error::Chain(&e), "local store: a lock file not removed");
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
