//! Serving connections: a bounded number at once, and room made for a
//! newcomer by closing the connection that has been idle longest.
//!
//! Issue #44: 400 idle TCP connections kept `/readyz` from answering for
//! ten seconds. Every slot was held by a connection that had sent nothing,
//! and a slot came free only when its header timeout ran out.
//!
//! # Contract
//!
//! - At most `limit` connections are served at once, and never more than
//!   half the process's descriptors (the bucket's connections must always
//!   find one). One more may be accepted while waiting for room.
//! - A connection is **busy** from the moment a request's headers are read
//!   until its response body is dropped (an SSE stream or `logs -f` is busy
//!   for as long as it streams); otherwise it is **idle**: waiting for its
//!   first request, part-way through a request's headers, or kept alive
//!   between requests.
//! - When every slot is taken and a connection arrives, an idle one is
//!   closed to make room, as nginx and Envoy close idle keep-alive
//!   connections under pressure: first the oldest that never completed a
//!   request (it is dropped: it sent nothing whole), then the one idle
//!   longest since its last response (closed gracefully: hyper finishes
//!   writing that response, whose body it may have taken whole before the
//!   bytes left, then closes). A client that opens connections and sends
//!   nothing therefore delays nobody. Only busy connections make a
//!   newcomer wait (in the kernel's backlog, then in the accept loop, which
//!   asks the next idle one to close as each goes idle).
//! - What a close can cost: a dropped connection that never completed a
//!   request may have had one part-way in its socket; its client sees the
//!   connection closed with no answer, as from any server shedding load,
//!   and retries. A connection that turned busy just as it was chosen
//!   answers that request first.
//! - Each request's headers must arrive within [`HEADER_TIMEOUT`].
//! - At shutdown, connections get two seconds to finish (SSE streams never
//!   do).

use super::HEADER_TIMEOUT;
use axum::Router;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

/// A listener [`serve_app`] accepts connections from (TCP for the node's
/// API, a Unix socket for the session channel).
pub(crate) trait Accept: Send {
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    fn accept_io(&self) -> impl std::future::Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> std::io::Result<Self::Io> {
        tokio::net::TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> std::io::Result<Self::Io> {
        tokio::net::UnixListener::accept(self).await.map(|(s, _)| s)
    }
}

/// One served connection, as the accept loop sees it.
#[derive(Default)]
struct Slot {
    /// Requests being answered (headers read, body not yet dropped).
    busy: AtomicUsize,
    /// When it last went idle, on the table's own counter (an order, not a
    /// time: no clock decides anything here).
    idle_since: AtomicU64,
    /// Chosen to make room; set once.
    evicted: AtomicBool,
    /// Answered a request already (closed gracefully when chosen; one that
    /// never did is dropped, and chosen first).
    used: AtomicBool,
    /// Wakes the connection's task to close.
    close: tokio::sync::Notify,
}

impl Slot {
    /// Idle and not yet asked to close: a candidate to make room.
    fn idle(&self) -> bool {
        self.busy.load(Ordering::SeqCst) == 0 && !self.evicted.load(Ordering::SeqCst)
    }
}

/// The open connections, and a signal for "one went idle" (a newcomer
/// waiting for room tries again then).
#[derive(Default)]
struct Table {
    open: Mutex<BTreeMap<u64, Arc<Slot>>>,
    next: AtomicU64,
    went_idle: tokio::sync::Notify,
}

impl Table {
    fn tick(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    fn insert(&self) -> (u64, Arc<Slot>) {
        let id = self.tick();
        let slot = Arc::new(Slot::default());
        slot.idle_since.store(id, Ordering::SeqCst);
        lock(&self.open).insert(id, slot.clone());
        (id, slot)
    }

    fn remove(&self, id: u64) {
        lock(&self.open).remove(&id);
    }

    /// Asks an idle connection to close: the oldest that never completed a
    /// request, else the one idle longest. Returns whether one was asked
    /// (none is idle: every slot is answering a request).
    fn evict_idlest(&self) -> bool {
        let open = lock(&self.open);
        let idlest = open.values().filter(|s| s.idle()).min_by_key(|s| {
            (
                s.used.load(Ordering::SeqCst),
                s.idle_since.load(Ordering::SeqCst),
            )
        });
        match idlest {
            Some(s) => {
                s.evicted.store(true, Ordering::SeqCst);
                // A stored permit: the task sees it even if it is not
                // waiting yet.
                s.close.notify_one();
                true
            }
            None => false,
        }
    }
}

/// A poisoned lock only means a panic elsewhere; the table stays usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A request being answered: its connection is busy while this lives.
struct Busy {
    slot: Arc<Slot>,
    table: Arc<Table>,
}

impl Busy {
    fn new(slot: Arc<Slot>, table: Arc<Table>) -> Self {
        slot.busy.fetch_add(1, Ordering::SeqCst);
        slot.used.store(true, Ordering::SeqCst);
        Busy { slot, table }
    }
}

/// Removes a connection from the table when its task ends, however it
/// ends (a panic in a handler included).
struct Listed {
    id: u64,
    table: Arc<Table>,
}

impl Drop for Listed {
    fn drop(&mut self) {
        self.table.remove(self.id);
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.slot
            .idle_since
            .store(self.table.tick(), Ordering::SeqCst);
        if self.slot.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.table.went_idle.notify_one();
        }
    }
}

/// A response body that keeps its connection busy until it is dropped
/// (fully sent, or the client went away).
struct BusyBody {
    inner: axum::body::Body,
    _busy: Busy,
}

impl http_body::Body for BusyBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Serves `app` on `listener` by the module's contract: at most `limit`
/// connections at once (and never more than half the process's
/// descriptors), the idlest closed to make room, [`HEADER_TIMEOUT`] for
/// each request's headers, and at shutdown two seconds for the connections
/// to finish. Every server of ours goes through it.
// The shutdown's drain is an I/O bound, not protocol time.
#[allow(clippy::disallowed_methods)]
pub(crate) async fn serve_app<L: Accept>(
    listener: L,
    app: Router,
    limit: usize,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let limit = limit.min(descriptor_limit() / 2).max(1);
    let permits = Arc::new(tokio::sync::Semaphore::new(limit));
    let table = Arc::new(Table::default());
    let mut conns = tokio::task::JoinSet::new();
    'accept: loop {
        // Reap finished connection tasks so the set stays small.
        while conns.try_join_next().is_some() {}
        let room = match permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            // Full: nothing is accepted until a slot frees or an idle
            // connection exists to make room (the newcomer waits in the
            // backlog while every slot answers a request).
            Err(_) => tokio::select! {
                p = permits.clone().acquire_owned() => Some(p.expect("never closed")),
                _ = idle_exists(&table) => None,
                _ = shutdown.cancelled() => break,
            },
        };
        let stream = tokio::select! {
            r = listener.accept_io() => match r {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %crate::error::Chain(&e), "accept");
                    // A pause, not a spin, while descriptors are short.
                    // Not a protocol timer: nothing decides by this clock.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        // A slot may have freed while the accept waited: no eviction then.
        let room = room.or_else(|| permits.clone().try_acquire_owned().ok());
        let permit = match room {
            Some(p) => p,
            None => {
                // Make room: an idle connection closes and its permit is
                // ours. Whichever slot frees first is taken; while none
                // does, each connection that goes idle is asked too (one
                // asked may have turned busy, or be finishing a response).
                table.evict_idlest();
                loop {
                    tokio::select! {
                        p = permits.clone().acquire_owned() => break p.expect("never closed"),
                        _ = table.went_idle.notified() => {
                            table.evict_idlest();
                        }
                        _ = shutdown.cancelled() => break 'accept,
                    }
                }
            }
        };
        let (id, slot) = table.insert();
        let listed = Listed {
            id,
            table: table.clone(),
        };
        let svc = {
            let (app, slot, table) = (app.clone(), slot.clone(), table.clone());
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let busy = Busy::new(slot.clone(), table.clone());
                let mut app = app.clone();
                async move {
                    let resp = tower_service::Service::call(&mut app, req).await;
                    resp.map(|r| {
                        r.map(|inner| axum::body::Body::new(BusyBody { inner, _busy: busy }))
                    })
                }
            })
        };
        let stop = shutdown.clone();
        conns.spawn(async move {
            let _permit = permit;
            let _listed = listed;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = slot.close.notified() => {
                    if slot.used.load(Ordering::SeqCst)
                        || slot.busy.load(Ordering::SeqCst) > 0
                    {
                        // It answered before (a response may still be
                        // leaving), or turned busy as it was chosen:
                        // finish, then close; a client that stops reading
                        // gets the header timeout's worth, not the slot.
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(HEADER_TIMEOUT, conn).await;
                    }
                    // Never answered anything: dropped here.
                }
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    Ok(())
}

/// Resolves once some open connection is idle (at once if one is).
async fn idle_exists(table: &Table) {
    loop {
        let notified = table.went_idle.notified();
        tokio::pin!(notified);
        // Registered before looking, so a connection going idle between
        // the look and the wait is not missed.
        notified.as_mut().enable();
        let any = lock(&table.open).values().any(|s| s.idle());
        if any {
            return;
        }
        notified.await;
    }
}

/// This process's soft limit on open descriptors.
fn descriptor_limit() -> usize {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 || r.rlim_cur == 0 {
        return 1024;
    }
    usize::try_from(r.rlim_cur).unwrap_or(usize::MAX)
}
