//! The host lock: proof, local to one machine, that no other instance of a
//! node is alive on it.
//!
//! A node process holds an exclusive `flock` on a file named after (the
//! store's canonical identity, node id) for its whole life. The kernel drops
//! the lock when the process dies, however it dies. So a new instance that
//! obtains the lock knows every earlier instance of this node that held the
//! *same file* is gone, and may take over that instance's leases at once
//! (epoch + 1) instead of waiting a TTL.
//!
//! Identity, not an accident of spelling or environment:
//!
//! - the file is keyed by [`crate::store::Store::identity`], so
//!   `file:///x/store` and `file:///x/store/` (or two S3 URLs with different
//!   slashes) lock one file;
//! - the lock has an id (the lock file's device and inode), which the node
//!   lease records. An immediate takeover needs the record to name the very
//!   lock the newcomer holds. Two instances that locked different files (a
//!   different `LEASEHOLD_LOCK_DIR`, a lock file deleted and recreated) have
//!   different ids: the later one waits out the TTL by observation, which a
//!   live holder never lets pass, so it never serves beside the first;
//! - the default directory is fixed per host (`/run/lock/leasehold`, else
//!   `/tmp/leasehold-locks`), not derived from `XDG_RUNTIME_DIR` or the user.
//!
//! A record naming another host is never taken over this way: two machines
//! misconfigured with one node id cannot steal from each other.

use crate::error::Error;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// A held host lock. Dropping it releases the lock.
#[derive(Debug)]
pub struct HostLock {
    _file: File,
    path: PathBuf,
    host: String,
    id: String,
}

/// The directory host locks live in: `$LEASEHOLD_LOCK_DIR` when set, else
/// `/run/lock/leasehold` where `/run/lock` exists (not cleaned while the
/// machine runs, and not private to a service the way `/tmp` may be), else
/// `/tmp/leasehold-locks`. The same for every user and every environment;
/// an override is safe (see the module docs), only slower to take over.
pub fn default_lock_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LEASEHOLD_LOCK_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if Path::new("/run/lock").is_dir() {
        return PathBuf::from("/run/lock/leasehold");
    }
    PathBuf::from("/tmp/leasehold-locks")
}

/// The lock id: the lock file's device and inode, and this boot of this
/// kernel (a rescheduled container with the same host name and the same
/// lock-directory layout can land on the same device and inode numbers; it
/// cannot have the same boot id), hashed to fit a record's id field.
fn lock_id(dev: u64, ino: u64) -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let h = crate::store::local::fnv1a64(format!("{dev}:{ino}:{}", boot.trim()).as_bytes());
    format!("{dev:x}-{ino:x}-{h:016x}")
}

/// This machine's name, as recorded in `holder.host`.
pub fn hostname() -> String {
    let h = gethostname::gethostname().to_string_lossy().into_owned();
    let h: String = h.chars().filter(|c| !c.is_control()).take(253).collect();
    if h.is_empty() { "localhost".into() } else { h }
}

impl HostLock {
    /// Takes the lock for `node` on the store whose canonical identity is
    /// `store` ([`crate::store::Store::identity`]) without waiting. Fails
    /// with `Conflict` if another live process holds it.
    pub fn acquire(dir: &Path, store: &str, node: &str, host: &str) -> Result<HostLock, Error> {
        // Shared by every user of the host, like /tmp: world-writable and
        // sticky, so nobody removes another's lock file.
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o1777)
                .create(dir)
                .map_err(|e| Error::invalid("lock directory", format!("{}: {e}", dir.display())))?;
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
        }
        let path = dir.join(format!(
            "{node}-{:016x}.lock",
            crate::store::local::fnv1a64(store.as_bytes())
        ));
        let mut f = crate::store::local::open_lock_file(&path)
            .map_err(|e| Error::invalid("host lock", format!("{}: {e}", path.display())))?;
        // Only a lock file of our own user proves anything. The directory is
        // shared, and a file another user made (a session running as
        // `nobody` can write here) is one that user may unlink while we
        // hold it: the next instance would then lock a fresh file and take
        // over at once beside us.
        {
            use std::os::unix::fs::MetadataExt;
            let owner = f
                .metadata()
                .map_err(|e| Error::Internal(format!("stat {}: {e}", path.display())))?
                .uid();
            // SAFETY: geteuid cannot fail.
            let me = unsafe { libc::geteuid() };
            if owner != me {
                return Err(Error::invalid(
                    "host lock",
                    format!(
                        "{} belongs to uid {owner}, not to this node's uid {me}: another user \
                         (or a session) made it; remove it if no node of this id runs here",
                        path.display()
                    ),
                ));
            }
        }
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Conflict {
                    key: format!(
                        "host lock {} (another instance of node {node:?} is running on this host)",
                        path.display()
                    ),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::Internal(format!("flock {}: {e}", path.display())));
            }
        }
        // For operators: who holds it. Not used for any decision.
        let _ = f.set_len(0);
        let _ = writeln!(f, "pid {} store {store}", std::process::id());
        use std::os::unix::fs::MetadataExt;
        let md = f
            .metadata()
            .map_err(|e| Error::Internal(format!("stat {}: {e}", path.display())))?;
        Ok(HostLock {
            _file: f,
            path,
            host: host.to_string(),
            id: lock_id(md.dev(), md.ino()),
        })
    }

    /// This lock's id (its file's device and inode), recorded in the node
    /// lease as `lock_id`.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn host(&self) -> &str {
        &self.host
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_conflicts_until_first_dropped() {
        let d = tempfile::tempdir().unwrap();
        let a = HostLock::acquire(d.path(), "memory://", "n1", "h").unwrap();
        let e = HostLock::acquire(d.path(), "memory://", "n1", "h").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Conflict);
        // Another node id or another store is independent.
        let _b = HostLock::acquire(d.path(), "memory://", "n2", "h").unwrap();
        let _c = HostLock::acquire(d.path(), "file:///x", "n1", "h").unwrap();
        drop(a);
        let again = HostLock::acquire(d.path(), "memory://", "n1", "h").unwrap();
        // The same file: the same id. Another directory: another id.
        let other = tempfile::tempdir().unwrap();
        let elsewhere = HostLock::acquire(other.path(), "memory://", "n1", "h").unwrap();
        assert_ne!(again.id(), elsewhere.id());
        let id = again.id().to_string();
        drop(again);
        assert_eq!(
            HostLock::acquire(d.path(), "memory://", "n1", "h")
                .unwrap()
                .id(),
            id
        );
    }
}
