//! The monitor thread: notices exits and stopped processes without polling each session.

use super::*;

/// Whether `pid` is stopped (state T or t in `/proc/<pid>/stat`).
pub(super) fn process_stopped(pid: i32) -> bool {
    crate::fleet::contain::stat(pid).is_some_and(|p| p.stopped)
}

/// The monitor thread: see [`ExecRunner`]. Ends when the runner is dropped.
///
/// It looks every 50 ms, and at once when a watchdog's output ends (it is
/// exiting): then, since the watchdog may not have finished exiting yet,
/// again every 2 ms a few times, until the round finds it.
pub(super) fn monitor(shared: std::sync::Weak<Shared>, woken: std::sync::mpsc::Receiver<()>) {
    let mut soon = 0u32;
    loop {
        let wait = if soon > 0 {
            soon -= 1;
            Duration::from_millis(2)
        } else {
            Duration::from_millis(50)
        };
        if woken.recv_timeout(wait).is_ok() {
            soon = 10;
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut done = Vec::new();
        {
            let mut children = shared.children.lock().unwrap();
            // A watchdog that is stopped (a session can SIGSTOP its own
            // watchdog) or has let its deadline pass is not a dead-man
            // switch any more: kill it; the lost-watchdog path below then
            // kills the session's tree.
            let now_ns = crate::fleet::watchdog::monotonic_ns();
            for p in children.values_mut() {
                let stopped = process_stopped(p.child.id() as i32);
                if stopped || now_ns > p.deadline_ns.saturating_add(200_000_000) {
                    let _ = p.child.kill();
                }
            }
            let exited: Vec<String> = children
                .iter_mut()
                .filter_map(|(n, p)| matches!(p.child.try_wait(), Ok(Some(_))).then(|| n.clone()))
                .collect();
            if !exited.is_empty() {
                soon = 0;
            }
            for name in exited {
                let p = children.remove(&name).expect("present");
                shared.exiting.lock().unwrap().insert(name.clone());
                watchdogs().lock().unwrap().remove(&(p.child.id() as i32));
                done.push((name, p));
            }
        }
        for (name, p) in done {
            let report = p.report();
            p.contain();
            let lost = report.is_none();
            if lost {
                tracing::warn!(session = %name, "the session's watchdog died; its processes were killed");
            }
            let (reason, code) = report.unwrap_or(("watchdog-lost".into(), 137));
            let p_name = name.clone();
            shared.exits.lock().unwrap().push(Exit {
                name,
                epoch: p.epoch,
                code,
                deadline: reason == "deadline",
                watchdog_lost: lost,
                reason: p.limit_reason(code),
            });
            shared.exiting.lock().unwrap().remove(&p_name);
            shared.exited.notify_one();
        }
        sweep_orphans();
    }
}
