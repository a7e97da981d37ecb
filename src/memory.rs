//! Process-level allocator settings for the node daemon.
//!
//! Why: a node's heap is mostly long-lived caches (one small entry per
//! session in the fleet), but its passes allocate and free in bursts (a
//! full listing, thousands of claims at placement). With glibc's malloc
//! the freed pages stay in the process, one arena per thread that ever
//! allocated (up to 8 per core): at 100,000 sessions a node held 130 MB of
//! heap in 290 MB of RSS (issue #14, `spike footprint`). Two arenas and a
//! periodic `malloc_trim` hand the free pages back. Elsewhere (musl, other
//! systems) these are no-ops. Only the daemon calls them: a library does
//! not set its host process's allocator.

use crate::clock::Clock;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often [`trim_periodically`] returns free pages (a trim walks the
/// arenas: a few milliseconds at 100,000 sessions).
pub const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Caps glibc's malloc arenas at 2. Call first thing in `main`, before
/// threads start (arenas already made stay).
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Gives a hash map's table back once it holds under a quarter of what it
/// has room for: hash maps never shrink by themselves, and a node's maps
/// that peak at placement (every manifest claimable at once) or at a first
/// listing (every claim observed) are near empty after it (issue #14).
/// Unlike the rest of this module, a library's own data: any caller may.
pub fn shrink_if_sparse<K: Eq + std::hash::Hash, V, S: std::hash::BuildHasher>(
    m: &mut std::collections::HashMap<K, V, S>,
) {
    if m.capacity() > 64 && m.capacity() / 4 > m.len() {
        m.shrink_to_fit();
    }
}

/// Returns the allocator's free pages to the system.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe; it only releases free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Runs [`trim`] every `every` on a blocking thread until `shutdown`.
pub async fn trim_periodically(
    clock: Arc<dyn Clock>,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = clock.sleep(every) => {
                let _ = tokio::task::spawn_blocking(trim).await;
            }
        }
    }
}
