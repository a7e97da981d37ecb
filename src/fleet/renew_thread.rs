//! A thread of its own for a node's lease renewals.
//!
//! # Why
//!
//! A node's pass is CPU work between awaits: decoding a listing, planning,
//! walking its claims. At 100,000 sessions one pass holds a worker for
//! hundreds of milliseconds, and ten nodes in one process held both of this
//! machine's workers for seconds: a renewal started 5.8 s after it was due
//! and the node lost its lease (measured 2026-12-03; git history of
//! docs/evidence.md). A renewal that
//! waits behind the pull loop is a lease lost for no fault of the bucket, so
//! the renew task runs on a current-thread runtime of its own
//! ([`NodeDeps::renew_on`](super::node::NodeDeps::renew_on)). There it never
//! waits behind a pass.
//!
//! The request must not wait for the pull loop's runtime either. A store
//! whose HTTP connections are driven by tasks on that runtime would stall the
//! renewal all the same, so the daemon opens its store with this thread as
//! the store's I/O runtime ([`crate::store::OpenOptions::io_runtime`]): every
//! request's socket work (TLS, HTTP framing, the bodies of listing pages)
//! runs here. That work is non-blocking and short per poll (decoding a
//! listing stays with the caller). So what a renewal can queue behind here
//! is bounded: the node's I/O in flight, the deadline written to each
//! session's watchdog pipe after each renewal (one small non-blocking write
//! per session), the sampled audit read (on the local store it shares the
//! batched reader with the pull loop's reads). None of it is a pass. The
//! memory store answers in the caller's task and the local-directory store
//! on the blocking pool of the runtime that asks, so both need nothing more.
//!
//! The seeded simulation does not use it: every node there runs on one
//! current-thread runtime on a manual clock, and a task on another thread
//! would escape the seeded schedule.

use crate::error::{Error, Result};

/// A current-thread tokio runtime on a thread of its own, for the renew
/// task (and, in the daemon, the store's I/O). Dropping it tells the thread
/// to stop without waiting for it: the tasks still on it are dropped there
/// (its blocking pool finishes what it has). Keep it until every node using
/// it has returned from `run`: a node whose renew task is dropped under it
/// ends as if its lease were lost (`node::run`), which is safe but no way to
/// stop a node.
#[derive(Debug)]
pub struct RenewThread {
    handle: tokio::runtime::Handle,
    /// Dropped with `self`: the thread's `block_on` returns and the runtime
    /// is dropped there, where blocking is allowed (dropping a runtime
    /// inside another runtime's task panics).
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl RenewThread {
    /// Starts the thread, named `name` (as `top -H` and debuggers show it).
    pub fn start(name: &str) -> Result<Self> {
        // Built on the new thread and dropped there: a runtime must not be
        // dropped inside another's task, as it would be here if the thread
        // failed to start with the runtime already built.
        let (ready, handle) = std::sync::mpsc::sync_channel(1);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready.send(Err(e.to_string()));
                        return;
                    }
                };
                if ready.send(Ok(rt.handle().clone())).is_err() {
                    return;
                }
                rt.block_on(async {
                    // Ok or Err (the sender dropped): either way, stop.
                    let _ = stopped.await;
                });
            })
            .map_err(|e| Error::Internal(format!("cannot start the renew thread: {e}")))?;
        let handle = handle
            .recv()
            .map_err(|_| Error::Internal("the renew thread ended at start".into()))?
            .map_err(|e| Error::Internal(format!("cannot start the renew runtime: {e}")))?;
        Ok(RenewThread {
            handle,
            _stop: stop,
        })
    }

    /// The runtime to spawn on (`NodeDeps::renew_on`, `OpenOptions::io_runtime`).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.handle.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_tasks_on_its_own_thread_and_stops_when_dropped() {
        let t = RenewThread::start("renew-test").unwrap();
        let name = t
            .handle()
            .block_on(
                t.handle()
                    .spawn(async { std::thread::current().name().map(str::to_string) }),
            )
            .unwrap();
        assert_eq!(name.as_deref(), Some("renew-test"));
        let h = t.handle();
        drop(t);
        // The runtime shuts down on its thread; a spawn afterwards is
        // refused (its JoinHandle reports cancellation) rather than run.
        let mut tries = 0;
        loop {
            let r = h.block_on(async { h.spawn(async {}).await });
            if r.is_err() {
                break;
            }
            tries += 1;
            assert!(tries < 1000, "the renew runtime kept running after drop");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
