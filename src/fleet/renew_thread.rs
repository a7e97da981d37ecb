//! A thread of its own for a node's lease renewals.
//!
//! # Why
//!
//! A node's pass is CPU work between awaits: decoding a listing, planning,
//! walking its claims. At 100,000 sessions one pass holds a worker for
//! hundreds of milliseconds, and ten nodes in one process held both of this
//! machine's workers for seconds: a renewal started 5.8 s after it was due
//! and the node lost its lease (docs/evidence.md, session 16). A renewal that
//! waits behind the pull loop is a lease lost for no fault of the bucket, so
//! the renew task runs on a current-thread runtime of its own
//! ([`NodeDeps::renew_on`](super::node::NodeDeps::renew_on)); there it waits
//! only for its timer and its request.
//!
//! The request must not wait for the pull loop's runtime either. A store
//! whose HTTP connections are driven by tasks on that runtime would stall the
//! renewal all the same, so the daemon opens its store with this thread as
//! the store's I/O runtime ([`crate::store::OpenOptions::io_runtime`]): every
//! request's socket work runs here. That work is non-blocking and short per
//! poll (the parsing of listings stays with the caller), so a renewal queues
//! behind at most the I/O in flight, never behind a pass. The memory store
//! answers in the caller's task and the local-directory store on the
//! blocking pool of the runtime that asks, so both need nothing more.
//!
//! The seeded simulation does not use it: every node there runs on one
//! current-thread runtime on a manual clock, and a task on another thread
//! would escape the seeded schedule.

use crate::error::{Error, Result};

/// A current-thread tokio runtime on a thread of its own, for the renew
/// task (and, in the daemon, the store's I/O). Dropping it stops the thread:
/// tasks still on it are dropped (a node's renew task is aborted with its
/// node anyway, see `node::run`).
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
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the renew runtime: {e}")))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                rt.block_on(async {
                    // Ok or Err (the sender dropped): either way, stop.
                    let _ = stopped.await;
                });
            })
            .map_err(|e| Error::Internal(format!("cannot start the renew thread: {e}")))?;
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
