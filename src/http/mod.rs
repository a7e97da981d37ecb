//! The node's HTTP API (axum).
//!
//! | route | auth | what |
//! |---|---|---|
//! | `GET /healthz` | no | 200 while the process serves |
//! | `GET /readyz` | no | 200 while registered, within the node lease's validity *now*, and with a pass of the pull loop completed within its bound; else 503 with the reason |
//! | `GET /metrics` | no | Prometheus text: events by kind, bucket requests by kind, renew latency |
//! | `GET /v1/sessions` | bearer | this node's view of its sessions |
//! | `GET /v1/events?after=N&limit=M` | bearer | a JSON page of the journal |
//! | `GET /v1/events` + `Accept: text/event-stream` | bearer | SSE, resumable with `Last-Event-ID` |
//! | `GET /v1/sessions/{name}/logs?tail=N&follow=true` | bearer | the session's log on this node (stdout and stderr); `follow` streams new output until the session's run here ends (it finished, stopped or left this node) |
//! | `POST /v1/sessions/{name}/claim` | bearer | claim the session now (the wake path) |
//! | `POST /v1/sessions/{name}/wake?wait=10s` | bearer | wake the session (a sleeping one is released and claimed here, if this node can) and answer once it is ready (`ready`, with its node, epoch and endpoint), `declined` with why, or `timed_out` with what it waited for; at most 60 s |
//! | `POST /v1/sessions/{name}/touch` | bearer | a wake reached the owner: the session's `sleep.after_idle` restarts |
//! | `POST /v1/nudge` | bearer | look at the bucket now: a pass within 200 ms (at most one per 200 ms), re-reading the node's control object |
//!
//! Connections: at most `max_connections` at once (256 by default, and never
//! more than half the process's descriptor limit: bucket connections must
//! always find a descriptor); when all are taken, the connection idle
//! longest is closed to make room for a new one, so idle connections never
//! keep `/readyz` or anyone else waiting (see `conns`); a client has
//! [`HEADER_TIMEOUT`] to send each request's headers, idle keep-alive
//! connections included, then it is closed.
//!
//! A cursor older than retention gets an explicit gap (`"gap": [from, to]`
//! in a page, an `event: gap` in a stream); a cursor beyond the latest event
//! is a typed 416. An SSE stream reads the journal at its subscriber's pace:
//! a slow subscriber holds no queue of its own and meets a gap, never
//! unbounded memory. Malformed requests get a typed 4xx
//! (`{"error": code, "message": ...}`), never a panic.
//!
//! The bearer token is read from a file, compared in constant time, and never
//! logged. The default bind is loopback.

mod conns;

pub(crate) use conns::serve_app;

use crate::fleet::journal::Journal;
use crate::fleet::status::NodeStatus;
use crate::store::CountingStore;
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Largest page of events.
pub const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 100;

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    pub journal: Arc<Journal>,
    pub status: Arc<NodeStatus>,
    pub requests: Option<Arc<CountingStore>>,
    /// Serves `POST /v1/sessions/{name}/claim` when set.
    pub claimer: Option<crate::fleet::endpoint::NodeHandle>,
    /// Where session logs are, for `/v1/sessions/{name}/logs`.
    pub logs: Option<std::path::PathBuf>,
    /// The bucket, for `POST /v1/sessions/{name}/wake` (with `claimer`).
    pub store: Option<Arc<dyn crate::store::Store>>,
    max_connections: usize,
    token: Arc<Vec<u8>>,
}

/// How long a client may take to send a request's headers, counted from
/// when the connection starts waiting for them (so an idle keep-alive
/// connection is closed after this long too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for HttpState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpState { token: <redacted>, .. }")
    }
}

impl HttpState {
    /// `token` must be at least 16 bytes.
    pub fn new(
        journal: Arc<Journal>,
        status: Arc<NodeStatus>,
        requests: Option<Arc<CountingStore>>,
        token: Vec<u8>,
    ) -> crate::Result<Self> {
        if token.len() < 16 {
            return Err(crate::Error::invalid("bearer token", "at least 16 bytes"));
        }
        Ok(HttpState {
            journal,
            status,
            requests,
            claimer: None,
            logs: None,
            store: None,
            max_connections: 256,
            token: Arc::new(token),
        })
    }

    /// Serves session logs from `dir` (the runner's log directory).
    pub fn with_logs(mut self, dir: std::path::PathBuf) -> Self {
        self.logs = Some(dir);
        self
    }

    /// Caps concurrent connections (at least 1; see the module docs).
    pub fn with_max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// Lets callers ask this node to claim a session now (the wake path).
    pub fn with_claimer(mut self, handle: crate::fleet::endpoint::NodeHandle) -> Self {
        self.claimer = Some(handle);
        self
    }

    /// The bucket: with a claimer, this node serves
    /// `POST /v1/sessions/{name}/wake`.
    pub fn with_store(mut self, store: Arc<dyn crate::store::Store>) -> Self {
        self.store = Some(store);
        self
    }
}

/// A session name from a route's path: a 400 `invalid_name` when it is not
/// one.
fn session_name(raw: String) -> Result<crate::Name, Box<Response>> {
    crate::Name::new(raw).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "invalid_name",
            e.to_string(),
        ))
    })
}

/// Reads a bearer token from a file (surrounding whitespace trimmed). The
/// error names the file, never its contents.
pub fn read_token(path: &std::path::Path) -> crate::Result<Vec<u8>> {
    let raw = std::fs::read(path)
        .map_err(|e| crate::Error::invalid("token file", format!("{}: {e}", path.display())))?;
    let t = String::from_utf8_lossy(&raw).trim().as_bytes().to_vec();
    if t.len() < 16 {
        return Err(crate::Error::invalid(
            "token file",
            format!("{}: the token must be at least 16 bytes", path.display()),
        ));
    }
    // As ssh does with a key, though not refused: a token others on the
    // host can read lets them read every session's output and steer the
    // fleet. Said, with the fix; the token itself never is.
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path)
            && m.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                file = %path.display(),
                mode = format!("{:o}", m.permissions().mode() & 0o777),
                "the token file is readable by others on this host; `chmod 600` it"
            );
        }
    }
    Ok(t)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"error": code, "message": message.into()});
    (status, axum::Json(body)).into_response()
}

/// The 401 to answer with, if the request lacks the right bearer token.
fn unauthorised(state: &HttpState, headers: &HeaderMap) -> Option<Response> {
    use subtle::ConstantTimeEq;
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::as_bytes);
    let ok = presented
        .is_some_and(|p| p.len() == state.token.len() && bool::from(p.ct_eq(&state.token)));
    if ok {
        None
    } else {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        Some(r)
    }
}

/// The router for a node.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/sessions", get(sessions))
        .route("/v1/events", get(events))
        .route("/v1/nudge", axum::routing::post(nudge))
        .route("/v1/sessions/{name}/claim", axum::routing::post(claim))
        .route("/v1/sessions/{name}/touch", axum::routing::post(touch))
        .route("/v1/sessions/{name}/wake", axum::routing::post(wake))
        .route("/v1/sessions/{name}/logs", get(logs))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown`.
///
/// At most `max_connections` connections are served at once; past that, new
/// ones wait in the kernel's backlog until one closes. An accept error (out
/// of descriptors) backs off briefly instead of spinning. On shutdown, open
/// connections get up to two seconds to finish (SSE streams never do).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let limit = state.max_connections;
    serve_app(listener, router(state), limit, shutdown).await
}

/// `POST /v1/nudge`: look at the bucket now (a pass, and this node's control
/// object), at most one pass per `NUDGE_MIN_GAP`. Best effort; the answer
/// does not wait for the pass.
async fn nudge(State(s): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorised(&s, &headers) {
        return r;
    }
    s.status.nudge();
    (
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({"nudged": true})),
    )
        .into_response()
}

async fn readyz(State(s): State<HttpState>) -> Response {
    let snap = s.status.snapshot();
    let r = s.status.readiness();
    let body = serde_json::json!({"ready": r.ready, "reason": r.reason, "node": snap.node, "instance": snap.instance});
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

async fn sessions(State(s): State<HttpState>, headers: HeaderMap) -> Response {
    if let Some(r) = unauthorised(&s, &headers) {
        return r;
    }
    axum::Json(s.status.snapshot()).into_response()
}

/// `POST /v1/sessions/{name}/claim`: ask this node to claim the session now
/// (skipping only placement's grace delay; every takeover rule still holds).
/// 200 with `claimed` or `already_owned`; 409 with `declined` and the reason;
/// 400 for a bad name; 404 when the node was started without this endpoint.
// A claim request waits for the node in real time (an HTTP bound, not
// protocol time): `tokio::time::timeout` is allowed here.
#[derive(serde::Deserialize)]
struct WakeQuery {
    wait: Option<String>,
}

/// Wakes a session from any node: claimed here when this node can (a
/// sleeping one by one conditional write on the claim just read), else
/// released for the fleet to place; answered when ready (200), or when
/// `wait` ends (202: `starting` with the run's epoch once a live node has
/// claimed it, else `timed_out`). `wait=0s` answers as soon as the claim is
/// written: one resolve, one write, this request's round trip.
/// 404 when no manifest names it, 409 when it is declined (paused,
/// finished).
async fn wake(
    State(s): State<HttpState>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
    q: Result<Query<WakeQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Some(r) = unauthorised(&s, &headers) {
        return r;
    }
    let (Some(handle), Some(store)) = (&s.claimer, &s.store) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this node does not take wake requests",
        );
    };
    let name = match session_name(name) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let wait = match q.ok().and_then(|Query(q)| q.wait) {
        None => Duration::from_secs(10),
        Some(w) => match humantime::parse_duration(&w) {
            Ok(d) if d <= Duration::from_secs(60) => d,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_wait",
                    "wait is a duration of at most 60s",
                );
            }
        },
    };
    let resolver = crate::wake::Resolver::new(store.clone())
        .with_claimer(handle.clone())
        .with_token(s.token.to_vec());
    match resolver.wake_ready(&name, wait).await {
        Ok(r) => {
            let code = match r {
                crate::wake::Ready::Ready { .. } => StatusCode::OK,
                crate::wake::Ready::Starting { .. } | crate::wake::Ready::TimedOut { .. } => {
                    StatusCode::ACCEPTED
                }
                crate::wake::Ready::NotFound => StatusCode::NOT_FOUND,
                _ => StatusCode::CONFLICT,
            };
            (code, axum::Json(r)).into_response()
        }
        Err(e) => error(
            match e.kind() {
                crate::ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
            "wake_failed",
            e.to_string(),
        ),
    }
}

/// A wake reached the owner: the session's idle time restarts (its
/// `sleep.after_idle`). Cheap: no pass, no bucket request. 200 with
/// whether this node runs it.
async fn touch(
    State(s): State<HttpState>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    if let Some(r) = unauthorised(&s, &headers) {
        return r;
    }
    let name = match session_name(name) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let runs = s.status.runs(name.as_str());
    if runs {
        s.status.touch(name.as_str());
    }
    axum::Json(serde_json::json!({"session": name.as_str(), "runs_here": runs})).into_response()
}

// The claim's wait is an I/O bound on the node's answer.
#[allow(clippy::disallowed_methods)]
async fn claim(
    State(s): State<HttpState>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    if let Some(r) = unauthorised(&s, &headers) {
        return r;
    }
    let Some(handle) = &s.claimer else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this node does not take claim requests",
        );
    };
    let name = match session_name(name) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    // The node answers between passes; a store that hangs must not hold the
    // HTTP request forever.
    match tokio::time::timeout(Duration::from_secs(30), handle.claim_now(&name)).await {
        Ok(Ok(answer)) => {
            let code = match answer {
                crate::fleet::endpoint::ClaimAnswer::Declined { .. } => StatusCode::CONFLICT,
                _ => StatusCode::OK,
            };
            (code, axum::Json(answer)).into_response()
        }
        Ok(Err(e)) => {
            let code = match e.kind() {
                crate::ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                crate::ErrorKind::Data => StatusCode::BAD_GATEWAY,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(code, "claim_failed", e.to_string())
        }
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout",
            "the node did not answer within 30 s",
        ),
    }
}

/// Prometheus text for one histogram over `RENEW_BUCKETS` (counts per
/// bucket, not cumulative, in `buckets`).
fn histogram(out: &mut String, name: &str, help: &str, buckets: &[u64], count: u64, sum: f64) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} histogram\n"));
    let mut cumulative = 0;
    for (bound, n) in crate::fleet::status::RENEW_BUCKETS.iter().zip(buckets) {
        cumulative += n;
        out.push_str(&format!("{name}_bucket{{le=\"{bound}\"}} {cumulative}\n"));
    }
    out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {count}\n"));
    out.push_str(&format!("{name}_sum {sum}\n{name}_count {count}\n"));
}

async fn metrics(State(s): State<HttpState>) -> Response {
    let mut out = String::new();
    out.push_str("# HELP leasehold_events_total Journal events recorded, by kind (claimed, conflict, lost, ...).\n");
    out.push_str("# TYPE leasehold_events_total counter\n");
    // Every kind, recorded or not, so that a rate over a kind that has not
    // happened yet is 0 rather than no series.
    let totals = s.journal.totals();
    let kinds = crate::fleet::journal::EventKind::ALL.iter().chain(
        totals
            .keys()
            .filter(|k| !crate::fleet::journal::EventKind::ALL.contains(k)),
    );
    for k in kinds {
        let v = totals.get(k).copied().unwrap_or(0);
        out.push_str(&format!("leasehold_events_total{{kind=\"{k}\"}} {v}\n"));
    }
    if let Some(c) = &s.requests {
        let c = c.counts();
        out.push_str("# HELP leasehold_bucket_requests_total Bucket requests, by kind.\n");
        out.push_str("# TYPE leasehold_bucket_requests_total counter\n");
        for (k, v) in [
            ("get", c.get),
            ("get_if_changed", c.get_if_changed),
            ("put_create", c.put_create),
            ("put_match", c.put_match),
            ("delete", c.delete),
            ("list_page", c.list_pages),
        ] {
            out.push_str(&format!(
                "leasehold_bucket_requests_total{{kind=\"{k}\"}} {v}\n"
            ));
        }
    }
    let h = s.status.renew_histogram();
    histogram(
        &mut out,
        "leasehold_renew_seconds",
        "Node lease renew latency, send to response.",
        &h.buckets,
        h.count,
        h.sum_seconds,
    );
    histogram(
        &mut out,
        "leasehold_renew_late_seconds",
        "How late after it was due each renewal started.",
        &h.late_buckets,
        h.late_count,
        h.late_sum_seconds,
    );
    out.push_str("# TYPE leasehold_renew_failures_total counter\n");
    out.push_str(&format!("leasehold_renew_failures_total {}\n", h.failures));
    let snap = s.status.snapshot();
    out.push_str("# TYPE leasehold_ready gauge\n");
    out.push_str(&format!("leasehold_ready {}\n", u8::from(snap.ready)));
    let corrupt = s.status.corrupt();
    out.push_str("# HELP leasehold_corrupt_objects Listed keys skipped as corrupt or foreign (each affects its own key only).\n");
    out.push_str("# TYPE leasehold_corrupt_objects gauge\n");
    out.push_str(&format!("leasehold_corrupt_objects {}\n", corrupt.len()));
    out.push_str("# TYPE leasehold_sessions gauge\n");
    out.push_str(&format!("leasehold_sessions {}\n", snap.sessions.len()));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// A parsed `/v1/events` request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventsQuery {
    pub after: u64,
    pub limit: usize,
}

/// Parses the query and the `Last-Event-ID` header (which wins, as a browser
/// reconnecting sends it). Unknown parameters are refused, so a typo is not
/// silently ignored.
pub fn parse_events_query(
    params: &HashMap<String, String>,
    last_event_id: Option<&str>,
) -> Result<EventsQuery, (&'static str, String)> {
    if let Some(k) = params
        .keys()
        .find(|k| !matches!(k.as_str(), "after" | "limit"))
    {
        return Err((
            "unknown_parameter",
            format!("unknown query parameter {k:?}"),
        ));
    }
    let num = |name: &str, v: &str| -> Result<u64, (&'static str, String)> {
        if v.is_empty() || v.len() > 20 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err((
                "bad_cursor",
                format!("{name} must be a non-negative integer, got {v:?}"),
            ));
        }
        v.parse()
            .map_err(|_| ("bad_cursor", format!("{name} is out of range")))
    };
    let mut after = match params.get("after") {
        Some(v) => num("after", v)?,
        None => 0,
    };
    if let Some(id) = last_event_id {
        after = num("Last-Event-ID", id.trim())?;
    }
    let limit = match params.get("limit") {
        None => DEFAULT_LIMIT,
        Some(v) => {
            let n = num("limit", v).map_err(|(_, m)| ("bad_limit", m))?;
            if n == 0 || n > MAX_LIMIT as u64 {
                return Err((
                    "bad_limit",
                    format!("limit must be 1..={MAX_LIMIT}, got {n}"),
                ));
            }
            n as usize
        }
    };
    Ok(EventsQuery { after, limit })
}

async fn events(
    State(s): State<HttpState>,
    headers: HeaderMap,
    params: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Some(r) = unauthorised(&s, &headers) {
        return r;
    }
    let Ok(Query(params)) = params else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_query",
            "malformed query string",
        );
    };
    let last_event_id = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_cursor",
                "Last-Event-ID is not text",
            );
        }
    };
    let q = match parse_events_query(&params, last_event_id) {
        Ok(q) => q,
        Err((code, msg)) => return error(StatusCode::BAD_REQUEST, code, msg),
    };
    let latest = s.journal.latest();
    if q.after > latest {
        let mut r = error(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "cursor_beyond_latest",
            format!("cursor {} is beyond the latest event {latest}", q.after),
        );
        if let Ok(v) = header::HeaderValue::from_str(&latest.to_string()) {
            r.headers_mut().insert("x-latest-event-id", v);
        }
        return r;
    }
    let wants_sse = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !wants_sse {
        return match s.journal.after(q.after, q.limit) {
            Ok(page) => axum::Json(page).into_response(),
            Err(e) => error(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "cursor_beyond_latest",
                e.to_string(),
            ),
        };
    }
    // SSE: pull from the journal at the subscriber's pace.
    let journal = s.journal.clone();
    let stream = futures::stream::unfold(
        (journal, q.after, VecDeque::<SseEvent>::new()),
        |(j, mut cursor, mut buf)| async move {
            loop {
                if let Some(ev) = buf.pop_front() {
                    return Some((Ok::<_, std::convert::Infallible>(ev), (j, cursor, buf)));
                }
                // Registered before reading, so an append in between wakes us.
                let notified = j.appended();
                let page = match j.after(cursor, DEFAULT_LIMIT) {
                    Ok(p) => p,
                    Err(_) => return None,
                };
                if let Some((from, to)) = page.gap {
                    buf.push_back(
                        SseEvent::default()
                            .event("gap")
                            .id(to.to_string())
                            .data(serde_json::json!({"from": from, "to": to}).to_string()),
                    );
                    cursor = to;
                }
                for e in page.events {
                    cursor = e.seq;
                    buf.push_back(
                        SseEvent::default()
                            .event("journal")
                            .id(e.seq.to_string())
                            .data(serde_json::to_string(&e).expect("event serialises")),
                    );
                }
                if buf.is_empty() {
                    notified.await;
                }
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(
        pairs: &[(&str, &str)],
        last: Option<&str>,
    ) -> Result<EventsQuery, (&'static str, String)> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        parse_events_query(&m, last)
    }

    #[test]
    fn events_query_parsing() {
        assert_eq!(
            q(&[], None).unwrap(),
            EventsQuery {
                after: 0,
                limit: 100
            }
        );
        assert_eq!(
            q(&[("after", "7"), ("limit", "5")], None).unwrap(),
            EventsQuery { after: 7, limit: 5 }
        );
        assert_eq!(
            q(&[("after", "7")], Some("9")).unwrap().after,
            9,
            "Last-Event-ID wins"
        );
        for (pairs, last, code) in [
            (vec![("after", "-1")], None, "bad_cursor"),
            (vec![("after", "1e3")], None, "bad_cursor"),
            (vec![("after", "")], None, "bad_cursor"),
            (
                vec![("after", "99999999999999999999999")],
                None,
                "bad_cursor",
            ),
            (vec![("limit", "0")], None, "bad_limit"),
            (vec![("limit", "1001")], None, "bad_limit"),
            (vec![("limit", "x")], None, "bad_limit"),
            (vec![("afterr", "1")], None, "unknown_parameter"),
            (vec![], Some("abc"), "bad_cursor"),
        ] {
            let e = q(&pairs, last).unwrap_err();
            assert_eq!(e.0, code, "{pairs:?} {last:?}: {e:?}");
        }
    }
}

/// Query of `GET /v1/sessions/{name}/logs`.
#[derive(Debug, serde::Deserialize)]
struct LogsQuery {
    /// Last N lines (default: everything kept).
    tail: Option<usize>,
    #[serde(default)]
    follow: bool,
}

/// The last `n` lines of `bytes` (all of it when `n` is None).
pub fn tail_lines(bytes: &[u8], n: Option<usize>) -> &[u8] {
    let Some(n) = n else { return bytes };
    if n == 0 {
        return &bytes[bytes.len()..];
    }
    // A final newline ends the last line; it does not start another.
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &bytes[i + 1..];
            }
        }
    }
    bytes
}

/// `GET /v1/sessions/{name}/logs`: the rotated file then the current one,
/// cut to `tail` lines; with `follow`, new output as it is written, polled
/// every 200 ms, until the session has not been on this node for two polls
/// in a row (the client then asks its new owner).
async fn logs(
    State(s): State<HttpState>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
    q: Result<Query<LogsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Some(r) = unauthorised(&s, &headers) {
        return r;
    }
    let Query(q) = match q {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_query", e.body_text()),
    };
    let name = match session_name(name) {
        Ok(n) => n,
        Err(r) => return *r,
    };
    let Some(dir) = s.logs.clone() else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this node keeps no session logs",
        );
    };
    let path = dir.join(format!("{name}.log"));
    let rotated = dir.join(format!("{name}.log.1"));
    let mut all = std::fs::read(&rotated).unwrap_or_default();
    let current = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let owned = s
                .status
                .snapshot()
                .sessions
                .iter()
                .any(|x| x.name == name.as_str());
            if !owned && all.is_empty() {
                return error(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("no log of session {name} on this node"),
                );
            }
            Vec::new()
        }
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "log_unreadable",
                format!("{name}: {e}"),
            );
        }
    };
    let offset = current.len() as u64;
    all.extend_from_slice(&current);
    let first = bytes::Bytes::copy_from_slice(tail_lines(&all, q.tail));
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    if !q.follow {
        return (text, first).into_response();
    }
    let status = s.status.clone();
    let stream = futures::stream::unfold(
        (Some(first), path, offset, 0u32),
        move |(pending, path, mut offset, mut away)| {
            let status = status.clone();
            let name = name.clone();
            async move {
                if let Some(b) = pending {
                    return Some((Ok::<_, std::io::Error>(b), (None, path, offset, away)));
                }
                loop {
                    // A poll, not a protocol timer.
                    #[allow(clippy::disallowed_methods)]
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                    if len < offset {
                        offset = 0; // rotated: the new file starts over
                    }
                    if len > offset {
                        let chunk = read_from(&path, offset, (len - offset).min(1 << 20));
                        offset += chunk.len() as u64;
                        if !chunk.is_empty() {
                            return Some((
                                Ok(bytes::Bytes::from(chunk)),
                                (None, path, offset, away),
                            ));
                        }
                    }
                    // A run that ended here (finished, stopped, in a
                    // back-off) ends the stream as one that left: the
                    // client reads the claim to tell which.
                    let here = status
                        .snapshot()
                        .sessions
                        .iter()
                        .any(|x| x.name == name.as_str() && x.running);
                    away = if here { 0 } else { away + 1 };
                    if away >= 2 {
                        return None;
                    }
                }
            }
        },
    );
    (text, axum::body::Body::from_stream(stream)).into_response()
}

fn read_from(path: &std::path::Path, offset: u64, max: u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(max).read_to_end(&mut buf);
    buf
}

#[cfg(test)]
mod log_tests {
    use super::tail_lines;

    #[test]
    fn tail_counts_lines_from_the_end() {
        assert_eq!(tail_lines(b"a\nb\nc\n", Some(2)), b"b\nc\n");
        assert_eq!(tail_lines(b"a\nb\nc", Some(2)), b"b\nc");
        assert_eq!(tail_lines(b"a\nb\n", Some(5)), b"a\nb\n");
        assert_eq!(tail_lines(b"a\nb\n", Some(0)), b"");
        assert_eq!(tail_lines(b"a\nb\n", None), b"a\nb\n");
        assert_eq!(tail_lines(b"", Some(3)), b"");
    }
}
