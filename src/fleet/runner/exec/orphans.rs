//! Watchdogs this process started, and the sweep of orphans a dead node left.

use super::*;

/// Process-wide: the watchdogs every [`ExecRunner`] in this process started,
/// so the orphan sweep never mistakes one for an orphan (a process may hold
/// several runners: the demo runs three nodes). Spawns happen under this
/// lock, so a watchdog is registered before a sweep can see it.
pub(super) fn watchdogs() -> &'static Mutex<HashSet<i32>> {
    static W: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// Kills what re-parented to this process (a subreaper) from a session whose
/// watchdog died: every child that is not in this process's own session and
/// is not a watchdog we started. Session processes can never be in the
/// node's session (the watchdog called `setsid`; a session cannot be
/// joined), and the node's own helpers (a credentials process) are.
pub(super) fn sweep_orphans() -> usize {
    let me = std::process::id() as i32;
    // SAFETY: getsid(0) has no preconditions.
    let my_sid = unsafe { libc::getsid(0) };
    let registered = watchdogs().lock().unwrap();
    let mut n = 0;
    for p in crate::fleet::contain::scan() {
        if p.ppid != me || p.sid == my_sid || registered.contains(&p.pid) {
            continue;
        }
        if !p.zombie {
            // SAFETY: a child of ours that we did not start as a watchdog.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
            n += 1;
        }
        let mut st = 0;
        // SAFETY: reaps that one child only (never -1: std's Child handles
        // of our watchdogs must keep their statuses).
        unsafe { libc::waitpid(p.pid, &mut st, libc::WNOHANG) };
    }
    n
}
