//! The host lock: proof, local to one machine, that no other instance of a
//! node is alive on it.
//!
//! A node process holds an exclusive `flock` on a file named after (store,
//! node id) for its whole life. The kernel drops the lock when the process
//! dies, however it dies. So a new instance that obtains the lock knows every
//! earlier instance of this node on this host is gone, and may take over that
//! instance's leases at once (epoch + 1) instead of waiting a TTL. A record
//! naming another host is never taken over this way: two machines
//! misconfigured with one node id cannot steal from each other.

use crate::error::Error;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A held host lock. Dropping it releases the lock.
#[derive(Debug)]
pub struct HostLock {
    _file: File,
    path: PathBuf,
    host: String,
}

/// The directory host locks live in: `$LEASEHOLD_LOCK_DIR`, else
/// `$XDG_RUNTIME_DIR/leasehold`, else `/tmp/leasehold-<uid>`.
pub fn default_lock_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LEASEHOLD_LOCK_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("leasehold");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/leasehold-{uid}"))
}

/// This machine's name, as recorded in `holder.host`.
pub fn hostname() -> String {
    let h = gethostname::gethostname().to_string_lossy().into_owned();
    let h: String = h.chars().filter(|c| !c.is_control()).take(253).collect();
    if h.is_empty() { "localhost".into() } else { h }
}

impl HostLock {
    /// Takes the lock for `node` on `store` (its display URL) without waiting.
    /// Fails with `Conflict` if another live process holds it.
    pub fn acquire(dir: &Path, store: &str, node: &str, host: &str) -> Result<HostLock, Error> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| Error::invalid("lock directory", format!("{}: {e}", dir.display())))?;
        let path = dir.join(format!(
            "{node}-{:016x}.lock",
            crate::store::local::fnv1a64(store.as_bytes())
        ));
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| Error::invalid("host lock", format!("{}: {e}", path.display())))?;
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
        Ok(HostLock {
            _file: f,
            path,
            host: host.to_string(),
        })
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
        HostLock::acquire(d.path(), "memory://", "n1", "h").unwrap();
    }
}
