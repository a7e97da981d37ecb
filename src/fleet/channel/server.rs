//! The node's side of the session channel (see [`super`]): an HTTP/1 server
//! on an abstract Unix socket.

use super::{AckAnswer, DEFAULT_MARGIN, Lookup, Registry, RunId, SelfView};
use crate::clock::Clock;
use crate::fleet::claim::ClaimState;
use crate::fleet::journal::{EventKind, Journal};
use crate::fleet::status::NodeStatus;
use crate::store::Store;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;
use std::time::Duration;

/// See [`ChannelState::running`].
pub type RunningNow = Arc<dyn Fn() -> Vec<(String, u64)> + Send + Sync>;

/// What the channel's handlers read.
#[derive(Clone)]
pub struct ChannelState {
    pub registry: Arc<Registry>,
    pub store: Arc<dyn Store>,
    pub status: Arc<NodeStatus>,
    /// The runs alive here, as the runner reports them (session, epoch):
    /// `runner::running_of(runner)`. A function, not the `Runner`, so that
    /// the channel does not depend on the runner, whose sessions it serves.
    pub running: RunningNow,
    pub clock: Arc<dyn Clock>,
    pub journal: Arc<Journal>,
}

impl std::fmt::Debug for ChannelState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelState")
            .field("address", &self.registry.address())
            .finish_non_exhaustive()
    }
}

/// A socket name in the abstract namespace, unguessable:
/// `@leasehold-<pid>-<n>-<16 random hex>` (a process that bound a
/// predictable name before the node, or after it died, could answer its
/// sessions).
pub fn abstract_name(n: u32) -> String {
    format!(
        "@leasehold-{}-{n}-{}",
        std::process::id(),
        &crate::fleet::channel::new_token()[..16]
    )
}

/// The least margin an ack may ask for.
pub const MIN_MARGIN: Duration = Duration::from_millis(10);

/// Binds `address` (`@name`: the abstract namespace; else a path).
pub fn bind(address: &str) -> std::io::Result<tokio::net::UnixListener> {
    let std = std::os::unix::net::UnixListener::bind_addr(&super::socket_addr(address)?)?;
    std.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(std)
}

/// Serves the channel on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::UnixListener,
    state: ChannelState,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/v1/self", get(get_self))
        .route("/v1/self/ack", post(ack))
        .route("/v1/self/sleep", post(sleep))
        .route("/v1/self/alarm", post(alarm))
        .with_state(state);
    // Anyone on the host can connect to an abstract socket: the same
    // connection cap, header timeout and bounded shutdown as the node API.
    crate::http::serve_app(listener, app, MAX_CONNECTIONS, shutdown).await
}

/// Connections the channel serves at once (sessions ask briefly; a
/// process that holds connections open gets no more).
pub const MAX_CONNECTIONS: usize = 64;

pub use super::MAX_ACKS_IN_FLIGHT;

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(serde_json::json!({"error": code, "message": message.into()})),
    )
        .into_response()
}

/// The run a request's credential names, still running here under this
/// node instance; else the refusal to send (journalled for a known run).
fn caller(s: &ChannelState, headers: &HeaderMap) -> Result<RunId, Box<Response>> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(Box::new(error(
            StatusCode::UNAUTHORIZED,
            "no_credential",
            "no run credential (Authorization: Bearer $LEASEHOLD_RUN_TOKEN)",
        )));
    };
    let run = match s.registry.lookup(token) {
        Lookup::Run(r) => r,
        Lookup::Retired(why) => {
            return Err(Box::new(error(StatusCode::GONE, "run_ended", why)));
        }
        Lookup::Unknown => {
            return Err(Box::new(error(
                StatusCode::UNAUTHORIZED,
                "unknown_credential",
                "not a credential of any run on this node",
            )));
        }
    };
    let refuse = |why: String| {
        journal_refusal(s, &run, &why);
        Box::new(error(StatusCode::GONE, "run_ended", why))
    };
    if let Err(why) = current(s, &run) {
        return Err(refuse(why));
    }
    Ok(run)
}

/// Journals a refusal of a known run, the same one at most every 10 s.
fn journal_refusal(s: &ChannelState, run: &RunId, why: &str) {
    let now = s.clock.wall_ms();
    if s.registry.journal_once(&run.session, why, now) {
        s.journal.record(
            now,
            EventKind::Refused,
            Some(&run.session),
            Some(run.epoch),
            why,
        );
    }
}

/// Whether `run` still runs here under the node instance that started it.
fn current(s: &ChannelState, run: &RunId) -> Result<(), String> {
    if !(s.running)()
        .iter()
        .any(|(n, e)| *n == run.session && *e == run.epoch)
    {
        return Err(format!(
            "this run of {} (epoch {}) has ended: it does not run on this node",
            run.session, run.epoch
        ));
    }
    if s.status.snapshot().instance != run.instance {
        return Err(format!(
            "this run of {} (epoch {}) was started by an earlier instance of this node",
            run.session, run.epoch
        ));
    }
    Ok(())
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn get_self(State(s): State<ChannelState>, headers: HeaderMap) -> Response {
    let run = match caller(&s, &headers) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    axum::Json(SelfView {
        node: s.status.snapshot().node,
        session: run.session,
        epoch: run.epoch,
        instance: run.instance,
        valid_for_ms: s.status.valid_for().map_or(0, ms),
    })
    .into_response()
}

#[derive(serde::Deserialize)]
struct SleepQuery {
    /// An alarm to set once asleep, this long from now (`10m`).
    wake_in: Option<String>,
}

/// `POST /v1/self/sleep[?wake_in=10m]`: the calling run asks to sleep;
/// with `wake_in`, the node sets an alarm for that time once the session
/// is asleep (set before, it could come due while the session was still
/// awake, and be consumed).
async fn sleep(
    State(s): State<ChannelState>,
    headers: HeaderMap,
    q: Result<Query<SleepQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let run = match caller(&s, &headers) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let Ok(Query(q)) = q else {
        return error(StatusCode::BAD_REQUEST, "bad_query", "wake_in=DURATION");
    };
    let wake_at_ms = match q.wake_in.as_deref().map(humantime::parse_duration) {
        None => None,
        Some(Ok(d))
            if d > Duration::ZERO
                && d <= Duration::from_millis(crate::fleet::alarm::MAX_AHEAD_MS) =>
        {
            Some(s.clock.wall_ms().saturating_add(ms(d)))
        }
        Some(Ok(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_time",
                "wake_in: more than zero, at most a year",
            );
        }
        Some(Err(e)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_time",
                format!("wake_in: {e} (e.g. wake_in=10m)"),
            );
        }
    };
    if !run.may_sleep {
        let why = format!(
            "{} has no sleep rule in its spec: it cannot sleep",
            run.session
        );
        journal_refusal(&s, &run, &why);
        return error(StatusCode::CONFLICT, "no_sleep_rule", why);
    }
    let answer = serde_json::json!({"session": run.session, "epoch": run.epoch, "sleeping": true});
    s.registry.request_sleep(run, wake_at_ms);
    (StatusCode::ACCEPTED, axum::Json(answer)).into_response()
}

#[derive(serde::Deserialize)]
struct AlarmQuery {
    /// When, by wall clock (ms since the Unix epoch).
    at_ms: Option<u64>,
    /// Or how long from now (`10m`, `30s`).
    #[serde(rename = "in")]
    in_: Option<String>,
}

/// `POST /v1/self/alarm?in=10m` (or `?at_ms=N`): the calling run sets an
/// alarm for its own session (`fleet::alarm`): a node wakes it then if it
/// is asleep. Only a current run of a session with a sleep rule may (an
/// alarm for a session that never sleeps would only ever be consumed).
/// 201 with the alarm's key; 400 for a time unreadable, passed or over a
/// year ahead; 404 if its manifest is gone; 409 without a sleep rule; 429
/// for a second alarm within [`super::ALARM_GAP_MS`]; 503 if the write
/// failed (try again).
async fn alarm(
    State(s): State<ChannelState>,
    headers: HeaderMap,
    q: Result<Query<AlarmQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let run = match caller(&s, &headers) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let Ok(Query(q)) = q else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "in=DURATION or at_ms=N",
        );
    };
    let now_ms = s.clock.wall_ms();
    let at_ms = match (q.at_ms, q.in_.as_deref()) {
        (Some(at), None) => at,
        (None, Some(d)) => match humantime::parse_duration(d) {
            Ok(d) => now_ms.saturating_add(ms(d)),
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_time",
                    format!("in={d:?}: {e} (e.g. in=10m)"),
                );
            }
        },
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_query",
                "exactly one of in=DURATION or at_ms=N",
            );
        }
    };
    if !run.may_sleep {
        let why = format!(
            "{} has no sleep rule in its spec: an alarm could only be consumed",
            run.session
        );
        journal_refusal(&s, &run, &why);
        return error(StatusCode::CONFLICT, "no_sleep_rule", why);
    }
    let Ok(name) = crate::Name::new(run.session.as_str()) else {
        return error(StatusCode::BAD_REQUEST, "bad_name", "not a session name");
    };
    if !s.registry.may_set_alarm(&run.session, now_ms) {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_alarms",
            format!("one alarm per {} ms per session", super::ALARM_GAP_MS),
        );
    }
    match crate::fleet::alarm::set(
        &s.store,
        &crate::clock::OsEntropy::new(),
        &name,
        at_ms,
        now_ms,
    )
    .await
    {
        Ok(key) => (
            StatusCode::CREATED,
            axum::Json(serde_json::json!({"session": run.session, "alarm": key, "at_ms": at_ms})),
        )
            .into_response(),
        Err(e) if e.kind() == crate::ErrorKind::Invalid => {
            error(StatusCode::BAD_REQUEST, "bad_time", e.to_string())
        }
        // Its manifest is gone: nothing to wake, and retrying cannot help.
        Err(e) if e.kind() == crate::ErrorKind::NotFound => {
            error(StatusCode::NOT_FOUND, "no_manifest", e.to_string())
        }
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            crate::error::Chain(&e).to_string(),
        ),
    }
}

#[derive(serde::Deserialize)]
struct AckQuery {
    margin: Option<String>,
    epoch: Option<u64>,
}

async fn ack(
    State(s): State<ChannelState>,
    headers: HeaderMap,
    q: Result<Query<AckQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = q else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "query: margin=DURATION (e.g. 1s), epoch=N",
        );
    };
    let margin = match q.margin.as_deref().map(humantime::parse_duration) {
        None => DEFAULT_MARGIN,
        Some(Ok(m)) if (MIN_MARGIN..=Duration::from_secs(3600)).contains(&m) => m,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_margin",
                "margin is a duration from 10ms to 1h (250ms, 2s)",
            );
        }
    };
    let run = match caller(&s, &headers) {
        Ok(r) => r,
        Err(resp) => return *resp,
    };
    let no = |reason: String| {
        journal_refusal(&s, &run, &format!("ack refused: {reason}"));
        (
            StatusCode::CONFLICT,
            axum::Json(AckAnswer {
                ack: false,
                session: run.session.clone(),
                epoch: run.epoch,
                valid_for_ms: None,
                reason: Some(reason),
            }),
        )
            .into_response()
    };
    if let Some(e) = q.epoch
        && e != run.epoch
    {
        return no(format!("the credential is of epoch {}, not {e}", run.epoch));
    }
    let me = s.status.snapshot();
    // At most a few at once node-wide: each is a bucket GET.
    let Ok(_permit) = s.registry.acks.try_acquire() else {
        return error(
            StatusCode::TOO_MANY_REQUESTS,
            "busy",
            "too many acks in flight on this node: ask again shortly",
        );
    };
    // One GET of the claim, never a cache: the bucket is the witness.
    let claim = match crate::fleet::claim::get(&s.store, &run.session).await {
        Ok(c) => c,
        Err(e) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!("the claim could not be read: {e}"),
            );
        }
    };
    // What counts is what holds once the read is back: the run still runs
    // under the instance that started it (a node that lost its lease and
    // registered again during a slow read has a new instance, and a
    // validity that is not the run's), and the lease is valid for the
    // margin from now.
    if let Err(why) = current(&s, &run) {
        return no(why);
    }
    let Some(valid_for) = s.status.valid_for() else {
        return no("this node holds no lease".into());
    };
    match claim {
        None => no("its claim is gone from the bucket".into()),
        Some((c, _)) if c.owner.node != me.node || c.owner.instance != run.instance => no(format!(
            "its claim names {} (instance {}) at epoch {}",
            c.owner.node, c.owner.instance, c.epoch
        )),
        Some((c, _)) if c.epoch != run.epoch => no(format!(
            "its claim is at epoch {}, this run at {}",
            c.epoch, run.epoch
        )),
        Some((c, _)) if c.state != ClaimState::Running => {
            no(format!("its claim is {}", c.state.as_str()))
        }
        Some(_) if valid_for < margin => no(format!(
            "the node's lease stays valid for {}, less than the margin {}",
            humantime::format_duration(Duration::from_millis(ms(valid_for))),
            humantime::format_duration(margin)
        )),
        Some(_) => axum::Json(AckAnswer {
            ack: true,
            session: run.session,
            epoch: run.epoch,
            valid_for_ms: Some(ms(valid_for)),
            reason: None,
        })
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, MonoTime};
    use crate::fleet::channel::client::SessionClient;
    use crate::fleet::claim::{ClaimRecord, Owner};
    use crate::fleet::runner::{RecordingRunner, Runner as _, SessionStart};
    use crate::fleet::status::StatusSnapshot;
    use crate::store::{Cond, ObjectStoreBackend};
    use bytes::Bytes;

    async fn put_claim(
        store: &Arc<dyn Store>,
        node: &str,
        instance: &str,
        epoch: u64,
        state: ClaimState,
    ) {
        let key = crate::keys::session("w");
        let mut c = ClaimRecord::placeholder("n".into(), 0);
        c.owner = Owner {
            node: node.into(),
            instance: instance.into(),
        };
        c.epoch = epoch;
        c.state = state;
        c.digest = "d".into();
        let cond = match store.get(&key).await.unwrap() {
            Some(o) => Cond::Match(o.version),
            None => Cond::Create,
        };
        store
            .put(&key, Bytes::from(c.encode()), cond)
            .await
            .unwrap();
    }

    /// The gate reads the claim, not the node's memory: a claim that names
    /// another node (a takeover this node has not noticed yet), another
    /// epoch, or a finished state is a no; a lease shorter than the margin
    /// is a no; an epoch the run does not hold is a no; a store that cannot
    /// be read is no answer. Only a claim naming this run is a yes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_gate_answers_from_the_claim_not_from_memory() {
        let clock = Arc::new(ManualClock::new());
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
        let runner = Arc::new(RecordingRunner::new(dyn_clock.clone()));
        runner
            .start(SessionStart {
                name: "w".into(),
                node: "n1".into(),
                epoch: 2,
                spec: crate::fleet::manifest::Spec::new("sleep", &[]),
                deadline: MonoTime::ZERO + Duration::from_secs(3600),
                channel: None,
            })
            .await
            .unwrap();
        let status: Arc<NodeStatus> = Default::default();
        status.set(StatusSnapshot {
            node: "n1".into(),
            instance: "i1".into(),
            ..Default::default()
        });
        status.set_valid_until(&dyn_clock, Some(clock.now() + Duration::from_secs(10)));
        let address = format!("@leasehold-test-{}-gate", std::process::id());
        let registry = Arc::new(Registry::new(address.clone()));
        registry.register(
            "tok",
            RunId {
                session: "w".into(),
                epoch: 2,
                instance: "i1".into(),
                may_sleep: false,
            },
        );
        let journal = Arc::new(Journal::new(100, 1 << 20));
        let state = ChannelState {
            registry,
            store: store.clone(),
            status: status.clone(),
            running: crate::fleet::runner::running_of(runner.clone()),
            clock: dyn_clock.clone(),
            journal: journal.clone(),
        };
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(serve(bind(&address).unwrap(), state, shutdown.clone()));
        let client = SessionClient::new(address.clone(), "tok").with_epoch(2);
        let margin = Duration::from_secs(1);
        let no = |r: crate::Result<crate::fleet::channel::AckAnswer>| {
            let e = r.unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Fenced, "{e}");
            format!("{e:?}")
        };

        put_claim(&store, "n1", "i1", 2, ClaimState::Running).await;
        let yes = client.ack(margin).await.unwrap();
        assert!(yes.ack && yes.epoch == 2);
        assert_eq!(client.check().await.unwrap().epoch, 2);
        // Taken over in the bucket; this node has not noticed yet.
        put_claim(&store, "n2", "i9", 3, ClaimState::Running).await;
        assert!(no(client.ack(margin).await).contains("names n2"));
        put_claim(&store, "n1", "i1", 3, ClaimState::Running).await;
        assert!(no(client.ack(margin).await).contains("at epoch 3"));
        put_claim(&store, "n1", "i1", 2, ClaimState::Succeeded).await;
        assert!(no(client.ack(margin).await).contains("succeeded"));
        put_claim(&store, "n1", "i1", 2, ClaimState::Running).await;
        assert!(no(client.ack(Duration::from_secs(30)).await).contains("less than the margin"));
        let stale_epoch = SessionClient::new(address.clone(), "tok").with_epoch(1);
        assert!(no(stale_epoch.ack(margin).await).contains("not 1"));
        // The lease runs out: a no, though the claim still names the run.
        clock.advance(Duration::from_secs(10));
        assert!(no(client.ack(margin).await).contains("less than the margin"));
        // Each no is journalled with the run (the same one once per 10 s).
        let refused = journal
            .after(0, 100)
            .unwrap()
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Refused && e.session.as_deref() == Some("w"))
            .count();
        assert_eq!(refused, 6);
        // A credential of no run, or none.
        let e = SessionClient::new(address.clone(), "forged")
            .check()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Permission);
        shutdown.cancel();
        let _ = server.await;
    }
}
