//! The node's HTTP API over a real socket, with a raw HTTP/1.1 client: auth,
//! pages, gaps, beyond-latest, malformed requests, SSE resume, live follow,
//! and a slow subscriber meeting a gap instead of growing memory.

use leasehold::fleet::journal::{EventKind, Journal};
use leasehold::fleet::node::{NodeStatus, StatusSnapshot};
use leasehold::http::{HttpState, serve};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "test-token-0123456789abcdef";

struct Server {
    addr: SocketAddr,
    journal: Arc<Journal>,
    status: Arc<NodeStatus>,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn server(max_events: usize) -> Server {
    let journal = Arc::new(Journal::new(max_events, 1 << 20));
    let status: Arc<NodeStatus> = Default::default();
    let state = HttpState::new(
        journal.clone(),
        status.clone(),
        None,
        TOKEN.as_bytes().to_vec(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(serve(listener, state, shutdown.clone()));
    Server {
        addr,
        journal,
        status,
        shutdown,
    }
}

/// Sends raw bytes, returns (status code, headers, body) of a complete response.
fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, head.to_string(), body.to_string())
}

fn get(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> (u16, String, String) {
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    raw(addr, req.as_bytes())
}

fn auth() -> (&'static str, String) {
    ("Authorization", format!("Bearer {TOKEN}"))
}

fn authed(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let (k, v) = auth();
    get(addr, path, &[(k, &v)])
}

fn json(body: &str) -> serde_json::Value {
    // Bodies of Connection: close responses may be chunked; take the JSON part.
    let start = body
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {body:?}"));
    let end = body.rfind('}').unwrap();
    serde_json::from_str(&body[start..=end]).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_and_auth() {
    let s = server(100).await;
    let addr = s.addr;
    let (c, _, b) = tokio::task::spawn_blocking(move || get(addr, "/healthz", &[]))
        .await
        .unwrap();
    assert_eq!((c, b.trim()), (200, "ok"));
    let (c, _, _) = tokio::task::spawn_blocking(move || get(addr, "/readyz", &[]))
        .await
        .unwrap();
    assert_eq!(c, 503, "not registered yet");
    // Readiness is computed when asked, from the lease's validity and the
    // age of the last completed pass; a stored flag saying "ready" is not
    // believed.
    s.status.set(StatusSnapshot {
        node: "n1".into(),
        instance: "i".into(),
        ready: true,
        sessions: vec![],
    });
    let (c, _, b) = tokio::task::spawn_blocking(move || get(addr, "/readyz", &[]))
        .await
        .unwrap();
    assert_eq!(c, 503, "a stored flag is not readiness: {b}");
    let clock = leasehold::clock::ManualClock::new();
    let dyn_clock: Arc<dyn leasehold::clock::Clock> = Arc::new(clock.clone());
    let t0 = leasehold::clock::Clock::now(&clock);
    s.status
        .set_valid_until(&dyn_clock, Some(t0 + Duration::from_secs(9)));
    s.status.pass_completed(t0, Duration::from_secs(5));
    let (c, _, b) = tokio::task::spawn_blocking(move || get(addr, "/readyz", &[]))
        .await
        .unwrap();
    assert_eq!(c, 200);
    assert_eq!(json(&b)["node"], "n1");
    // The pull loop stops completing passes: not ready once the bound passes,
    // though the lease is still valid, and the reason says so.
    clock.advance(Duration::from_secs(6));
    let (c, _, b) = tokio::task::spawn_blocking(move || get(addr, "/readyz", &[]))
        .await
        .unwrap();
    assert_eq!(c, 503);
    assert!(
        json(&b)["reason"].as_str().unwrap().contains("last pass"),
        "{b}"
    );
    // A pass completes, but the validity has gone by (renewals stopped).
    s.status
        .pass_completed(leasehold::clock::Clock::now(&clock), Duration::from_secs(5));
    clock.advance(Duration::from_secs(4));
    let (c, _, b) = tokio::task::spawn_blocking(move || get(addr, "/readyz", &[]))
        .await
        .unwrap();
    assert_eq!(c, 503);
    assert!(
        json(&b)["reason"].as_str().unwrap().contains("validity"),
        "{b}"
    );
    // Renewed: ready again.
    s.status.set_valid_until(
        &dyn_clock,
        Some(leasehold::clock::Clock::now(&clock) + Duration::from_secs(9)),
    );
    let (c, _, _) = tokio::task::spawn_blocking(move || get(addr, "/readyz", &[]))
        .await
        .unwrap();
    assert_eq!(c, 200);
    // /v1/* needs the token; a wrong or missing one is 401, in constant time.
    for hdr in [
        None,
        Some("Bearer wrong"),
        Some("Basic abc"),
        Some("Bearer test-token-0123456789abcdeX"),
    ] {
        let (c, head, b) = tokio::task::spawn_blocking(move || match hdr {
            None => get(addr, "/v1/sessions", &[]),
            Some(h) => get(addr, "/v1/sessions", &[("Authorization", h)]),
        })
        .await
        .unwrap();
        assert_eq!(c, 401, "{hdr:?}");
        assert!(
            head.to_ascii_lowercase()
                .contains("www-authenticate: bearer")
        );
        assert_eq!(json(&b)["error"], "unauthorized");
        assert!(!b.contains(TOKEN));
    }
    let (c, _, b) = tokio::task::spawn_blocking(move || authed(addr, "/v1/sessions"))
        .await
        .unwrap();
    assert_eq!(c, 200);
    assert_eq!(json(&b)["ready"], true);
    let (c, _, b) = tokio::task::spawn_blocking(move || get(addr, "/nope", &[]))
        .await
        .unwrap();
    assert_eq!((c, json(&b)["error"].as_str().unwrap()), (404, "not_found"));
    s.status.record_renew(Duration::from_millis(3));
    s.status.record_renew(Duration::from_millis(40));
    s.status.record_renew(Duration::from_secs(9));
    s.status.record_renew_failure();
    s.status.record_renew_late(Duration::from_millis(250));
    s.status.record_renew_late(Duration::from_millis(40));
    s.journal
        .record(0, EventKind::Claimed, Some("web"), Some(1), "");
    s.journal
        .record(0, EventKind::Claimed, Some("api"), Some(1), "");
    let (c, _, b) = tokio::task::spawn_blocking(move || get(addr, "/metrics", &[]))
        .await
        .unwrap();
    assert_eq!(c, 200);
    assert!(b.contains("leasehold_ready 1"), "{b}");
    // Every kind has a series, recorded or not.
    assert!(
        b.contains("leasehold_events_total{kind=\"claimed\"} 2"),
        "{b}"
    );
    assert!(
        b.contains("leasehold_events_total{kind=\"lease-lost\"} 0"),
        "{b}"
    );
    // Cumulative buckets: 3 ms in le=0.005, 40 ms by le=0.05, 9 s only in +Inf.
    assert!(
        b.contains("leasehold_renew_seconds_bucket{le=\"0.005\"} 1"),
        "{b}"
    );
    assert!(
        b.contains("leasehold_renew_seconds_bucket{le=\"0.05\"} 2"),
        "{b}"
    );
    assert!(
        b.contains("leasehold_renew_seconds_bucket{le=\"5\"} 2"),
        "{b}"
    );
    assert!(
        b.contains("leasehold_renew_seconds_bucket{le=\"+Inf\"} 3"),
        "{b}"
    );
    assert!(b.contains("leasehold_renew_seconds_count 3"), "{b}");
    assert!(b.contains("leasehold_renew_failures_total 1"), "{b}");
    // Lateness: 40 ms by le=0.05, 250 ms by le=0.25.
    for line in [
        "leasehold_renew_late_seconds_bucket{le=\"0.025\"} 0\n",
        "leasehold_renew_late_seconds_bucket{le=\"0.05\"} 1\n",
        "leasehold_renew_late_seconds_bucket{le=\"0.25\"} 2\n",
        "leasehold_renew_late_seconds_count 2\n",
    ] {
        assert!(b.contains(line), "{line}: {b}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_gaps_and_typed_errors() {
    let s = server(5).await;
    let addr = s.addr;
    for i in 0..8 {
        s.journal
            .record(0, EventKind::Claimed, Some(&format!("s{i}")), Some(1), "");
    }
    // Retention is 5: events 1..=3 are gone, and a reader from 0 is told.
    let (c, _, b) = tokio::task::spawn_blocking(move || authed(addr, "/v1/events?after=0&limit=2"))
        .await
        .unwrap();
    assert_eq!(c, 200);
    let p = json(&b);
    assert_eq!(p["gap"], serde_json::json!([1, 3]));
    assert_eq!(
        p["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [4, 5]
    );
    assert_eq!(p["latest"], 8);
    let (_, _, b) = tokio::task::spawn_blocking(move || authed(addr, "/v1/events?after=6"))
        .await
        .unwrap();
    let p = json(&b);
    assert_eq!(p["gap"], serde_json::Value::Null);
    assert_eq!(p["events"].as_array().unwrap().len(), 2);
    // Beyond the latest: a typed 416.
    let (c, head, b) = tokio::task::spawn_blocking(move || authed(addr, "/v1/events?after=9"))
        .await
        .unwrap();
    assert_eq!(c, 416);
    assert_eq!(json(&b)["error"], "cursor_beyond_latest");
    assert!(head.to_ascii_lowercase().contains("x-latest-event-id: 8"));
    // Malformed cursors and limits: typed 400s.
    for (path, code) in [
        ("/v1/events?after=-1", "bad_cursor"),
        ("/v1/events?after=abc", "bad_cursor"),
        ("/v1/events?limit=0", "bad_limit"),
        ("/v1/events?limit=100000", "bad_limit"),
        ("/v1/events?cursor=1", "unknown_parameter"),
        ("/v1/events?after=%ZZ", "bad_cursor"),
    ] {
        let (c, _, b) = tokio::task::spawn_blocking(move || authed(addr, path))
            .await
            .unwrap();
        assert_eq!(c, 400, "{path}: {b}");
        assert_eq!(json(&b)["error"], code, "{path}");
    }
    let (k, v) = auth();
    let (c, _, b) = tokio::task::spawn_blocking(move || {
        get(
            addr,
            "/v1/events",
            &[
                (k, &v),
                ("Last-Event-ID", "x1"),
                ("Accept", "text/event-stream"),
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(
        (c, json(&b)["error"].as_str().unwrap()),
        (400, "bad_cursor")
    );
    // Malformed HTTP: hyper answers 400, and the server keeps serving.
    let (c, _, _) = tokio::task::spawn_blocking(move || raw(addr, b"NONSENSE\r\n\r\n"))
        .await
        .unwrap();
    assert_eq!(c, 400);
    let (c, _, _) = tokio::task::spawn_blocking(move || {
        raw(
            addr,
            b"GET /v1/events HTTP/1.1\r\nHost: x\r\nAuthorization: \xff\xfe\r\n\r\n",
        )
    })
    .await
    .unwrap();
    assert!(c == 400 || c == 401, "{c}");
    let (c, _, _) = tokio::task::spawn_blocking(move || get(addr, "/healthz", &[]))
        .await
        .unwrap();
    assert_eq!(c, 200);
}

/// Reads SSE frames (event, id, data) from a stream until `done` holds for
/// the frames read by this call.
fn sse_until(
    s: &mut TcpStream,
    done: impl Fn(&[(String, u64, String)]) -> bool,
) -> Vec<(String, u64, String)> {
    let mut buf = String::new();
    let mut chunk = [0u8; 65536];
    loop {
        let mut frames = Vec::new();
        for block in buf.split("\n\n") {
            let mut ev = String::new();
            let mut id = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    ev = v.trim().into();
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = v.trim().into();
                }
            }
            if let Some(id) = id {
                frames.push((ev, id, data));
            }
        }
        if done(&frames) {
            return frames;
        }
        let k = s.read(&mut chunk).unwrap_or_else(|e| {
            panic!(
                "read: {e}; frames so far: {:?}",
                frames.iter().map(|f| f.1).collect::<Vec<_>>()
            )
        });
        assert!(k > 0, "stream closed early");
        buf.push_str(&String::from_utf8_lossy(&chunk[..k]));
    }
}

fn sse_frames(s: &mut TcpStream, n: usize) -> Vec<(String, u64, String)> {
    sse_until(s, |f| f.len() >= n)
}

fn open_sse(addr: SocketAddr, last_id: Option<u64>) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = format!(
        "GET /v1/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\nAuthorization: Bearer {TOKEN}\r\n"
    );
    if let Some(id) = last_id {
        req.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_resumes_follows_and_reports_gaps() {
    let s = server(1000).await;
    let addr = s.addr;
    for i in 0..3 {
        s.journal
            .record(0, EventKind::Claimed, Some(&format!("s{i}")), Some(1), "");
    }
    let journal = s.journal.clone();
    let frames = tokio::task::spawn_blocking(move || {
        let mut st = open_sse(addr, Some(1));
        let first = sse_frames(&mut st, 2);
        // Live: an event appended now arrives on the open stream.
        journal.record(0, EventKind::Started, Some("s9"), Some(1), "");
        let live = sse_frames(&mut st, 1);
        (first, live)
    })
    .await
    .unwrap();
    assert_eq!(
        frames.0.iter().map(|f| f.1).collect::<Vec<_>>(),
        [2, 3],
        "resumed after Last-Event-ID 1"
    );
    assert_eq!(frames.1[0].1, 4);
    assert_eq!(frames.1[0].0, "journal");
    assert!(frames.1[0].2.contains("\"started\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_subscriber_meets_a_gap_not_unbounded_memory() {
    let s = server(50).await;
    let addr = s.addr;
    s.journal
        .record(0, EventKind::Claimed, Some("first"), Some(1), "");
    let journal = s.journal.clone();
    let frames = tokio::task::spawn_blocking(move || {
        let mut st = open_sse(addr, Some(0));
        let first = sse_frames(&mut st, 1);
        // The subscriber stops reading while 20,000 events are written into a
        // journal that keeps 50. The server holds no queue for it: what is not
        // yet in the socket is evicted, and the reader is told.
        for i in 0..20_000 {
            journal.record(
                0,
                EventKind::Claimed,
                Some(&format!("s{i}")),
                Some(1),
                "x".repeat(100),
            );
        }
        // Read until the gap and the latest event (20,001) have arrived.
        let later = sse_until(&mut st, |f| {
            f.iter().any(|x| x.0 == "gap") && f.last().is_some_and(|x| x.1 == 20_001)
        });
        (first, later)
    })
    .await
    .unwrap();
    assert_eq!(frames.0[0].1, 1);
    let gap = frames.1.iter().find(|f| f.0 == "gap").expect("a gap frame");
    let d: serde_json::Value = serde_json::from_str(&gap.2).unwrap();
    assert!(d["to"].as_u64().unwrap() > d["from"].as_u64().unwrap());
    // Nothing goes missing silently: every sequence number from 1 to the
    // latest is covered exactly once, by an event or by a gap.
    let mut next = 1u64;
    for f in frames.0.iter().chain(frames.1.iter()) {
        let (from, to) = if f.0 == "gap" {
            let d: serde_json::Value = serde_json::from_str(&f.2).unwrap();
            (d["from"].as_u64().unwrap(), d["to"].as_u64().unwrap())
        } else {
            (f.1, f.1)
        };
        assert_eq!(from, next, "frame {f:?}");
        next = to + 1;
    }
    assert_eq!(next, 20_002);
}

/// A property test of request parsing: arbitrary query strings never panic and
/// either parse to in-range values or are refused with a typed code.
#[test]
fn events_query_parsing_never_panics() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let alphabet: Vec<char> = "0123456789-+ e.%afterlimit=&\u{0}é".chars().collect();
    for _ in 0..20_000 {
        let mut params = std::collections::HashMap::new();
        for key in ["after", "limit", "x"] {
            if rng.random_bool(0.5) {
                let len = rng.random_range(0..25);
                let v: String = (0..len)
                    .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                    .collect();
                params.insert(key.to_string(), v);
            }
        }
        let last: Option<String> = rng
            .random_bool(0.3)
            .then(|| rng.random::<u64>().to_string());
        match leasehold::http::parse_events_query(&params, last.as_deref()) {
            Ok(q) => {
                assert!((1..=leasehold::http::MAX_LIMIT).contains(&q.limit));
                assert!(!params.contains_key("x"));
            }
            Err((code, _)) => {
                assert!(["bad_cursor", "bad_limit", "unknown_parameter"].contains(&code))
            }
        }
    }
}

/// The nudge a node sends the ranked takers of a peer it fenced
/// (`fleet::nudge::HttpNudge`): `POST /v1/nudge` with the fleet's token
/// reaches the peer's pull loop; a wrong token, an address that is not the
/// node API's plain HTTP, no address, or nobody listening is a plain
/// "not answered", never an error or a panic.
#[tokio::test]
async fn a_peer_nudge_reaches_the_node_with_the_fleet_token_only() {
    use leasehold::fleet::nudge::{HttpNudge, Nudge};
    let s = server(10).await;
    let at = format!("http://{}", s.addr);
    let wrong = HttpNudge::new(b"another-token-0123456789").unwrap();
    assert!(!wrong.nudge("n1", Some(&at)).await);
    assert!(!s.status.nudge_pending(), "a refused nudge does nothing");
    let right = HttpNudge::new(TOKEN.as_bytes()).unwrap();
    assert!(!right.nudge("n1", None).await);
    assert!(
        !right
            .nudge("n1", Some(&format!("https://{}", s.addr)))
            .await
    );
    assert!(!right.nudge("n1", Some("not a url")).await);
    assert!(!s.status.nudge_pending());
    assert!(right.nudge("n1", Some(&format!("{at}/"))).await);
    assert!(
        s.status.nudge_pending(),
        "the pull loop's next pause is cut short"
    );
    // Nobody listening there any more: not answered.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    assert!(
        !right
            .nudge("n1", Some(&format!("http://127.0.0.1:{port}")))
            .await
    );
    // The token never shows in the handle's debug form.
    assert!(!format!("{right:?}").contains(TOKEN));
}
