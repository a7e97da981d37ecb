//! `leasehold watch`: a client-side merge of every live node's event stream.
//!
//! There is no bucket event log: each node serves its own journal. Watch
//! lists `nodes/` every couple of seconds, follows each live node instance's
//! SSE stream (`/v1/events`), and prints events tagged by node as they come.
//! A dropped stream is resumed with `Last-Event-ID`; a node that re-registers
//! is a new instance whose sequence starts again, so it gets a new follower.
//! Gaps (events evicted before we read them) are shown, never hidden.

use super::{Failure, StoreArgs, open};
use futures::StreamExt;
use leasehold::clock::{Clock, SystemClock};
use leasehold::error::Error;
use leasehold::fleet::journal::Event;
use leasehold::record::{Kind, LeaseRecord};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What followers send to the printer.
#[derive(Debug)]
/// The data of an SSE `gap` frame.
#[derive(serde::Deserialize)]
struct Gap {
    from: u64,
    to: u64,
}

enum Msg {
    Event {
        node: String,
        event: Event,
    },
    Gap {
        node: String,
        from: u64,
        to: u64,
    },
    Status {
        node: String,
        text: String,
    },
    /// A node refused our token: watching cannot succeed until it is
    /// fixed, so watch stops with exit 8 rather than retrying forever.
    Denied {
        node: String,
        status: u16,
    },
}

pub async fn run(
    store: &StoreArgs,
    token_file: &std::path::Path,
    from_start: bool,
    duration: Option<Duration>,
    json: bool,
) -> Result<(), Failure> {
    let token =
        Arc::new(String::from_utf8_lossy(&leasehold::http::read_token(token_file)?).into_owned());
    let store = open(store).await?;
    let clock = SystemClock::new();
    let deadline = duration.map(|d| clock.now() + d);
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| Error::Internal(format!("http client: {e}")))?;
    let (tx, mut rx) = mpsc::channel::<Msg>(1024);
    // (node, instance) -> follower task
    let mut followers: HashMap<(String, String), tokio::task::JoinHandle<()>> = HashMap::new();
    let mut next_scan = clock.now();
    loop {
        if deadline.is_some_and(|d| clock.now() >= d) {
            break;
        }
        if clock.now() >= next_scan {
            next_scan = clock.now() + Duration::from_secs(2);
            let live = live_nodes(&store).await?;
            // Stop following instances that are gone.
            followers.retain(|k, task| {
                let keep = live.iter().any(|(n, i, _)| (n, i) == (&k.0, &k.1));
                if !keep {
                    task.abort();
                    let _ = tx.try_send(Msg::Status {
                        node: k.0.clone(),
                        text: format!("left (instance {})", k.1),
                    });
                }
                keep
            });
            for (node, instance, address) in live {
                let key = (node.clone(), instance.clone());
                if followers.contains_key(&key) {
                    continue;
                }
                let _ = tx.try_send(Msg::Status {
                    node: node.clone(),
                    text: format!("following {address} (instance {instance})"),
                });
                followers.insert(
                    key,
                    tokio::spawn(follow(
                        client.clone(),
                        node,
                        address,
                        token.clone(),
                        from_start,
                        tx.clone(),
                    )),
                );
            }
        }
        let wait = match deadline {
            Some(d) => d
                .saturating_since(clock.now())
                .min(Duration::from_millis(500)),
            None => Duration::from_millis(500),
        };
        tokio::select! {
            m = rx.recv() => {
                if let Some(Msg::Denied { node, status }) = &m {
                    for (_, t) in followers {
                        t.abort();
                    }
                    return Err(Error::Denied {
                        what: "bearer token".into(),
                        reason: format!("node {node} answered HTTP {status} (check --token-file)"),
                    }
                    .into());
                }
                if let Some(m) = m {
                    print(&m, json);
                }
            }
            _ = clock.sleep(wait) => {}
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    for (_, t) in followers {
        t.abort();
    }
    while let Ok(m) = rx.try_recv() {
        print(&m, json);
    }
    Ok(())
}

fn print(m: &Msg, json: bool) {
    if json {
        let v = match m {
            Msg::Event { node, event } => serde_json::json!({"node": node, "event": event}),
            Msg::Gap { node, from, to } => serde_json::json!({"node": node, "gap": [from, to]}),
            Msg::Status { node, text } => serde_json::json!({"node": node, "status": text}),
            Msg::Denied { node, status } => serde_json::json!({"node": node, "denied": status}),
        };
        println!("{v}");
        return;
    }
    match m {
        Msg::Event { node, event } => println!(
            "{:<12} #{:<5} {:<12} {:<20} {}{}",
            node,
            event.seq,
            event.kind.as_str(),
            event.session.as_deref().unwrap_or("-"),
            event
                .epoch
                .map(|e| format!("epoch {e} "))
                .unwrap_or_default(),
            event.detail
        ),
        Msg::Gap { node, from, to } => {
            println!("{node:<12} GAP: events {from}..={to} were evicted before they could be read")
        }
        Msg::Status { node, text } => println!("{node:<12} -- {text}"),
        Msg::Denied { node, status } => println!("{node:<12} -- HTTP {status}"),
    }
}

/// Live node instances with an address: (node, instance, address).
async fn live_nodes(
    store: &Arc<dyn leasehold::store::Store>,
) -> Result<Vec<(String, String, String)>, Error> {
    let mut out = Vec::new();
    let mut list = store.list(leasehold::keys::NODES);
    let mut keys = Vec::new();
    while let Some(e) = list.next().await {
        keys.push(
            e.map_err(|e| Error::from_store("list", leasehold::keys::NODES, e))?
                .key,
        );
    }
    for k in keys {
        let Some(o) = store
            .get(&k)
            .await
            .map_err(|e| Error::from_store("get", &k, e))?
        else {
            continue;
        };
        let Ok(r) = LeaseRecord::decode(&k, &o.bytes, Kind::Node) else {
            tracing::warn!(key = k, "skipping corrupt node record");
            continue;
        };
        // Followed unless its tenure is over (released or fenced): an
        // expired-looking node may be alive behind a skewed clock, and
        // following it costs a failed connection at worst.
        let over = leasehold::liveness::judge(
            Some(&r),
            None,
            leasehold::liveness::Evidence::WallClock {
                now_ms: 0,
                max_skew: Duration::ZERO,
            },
        )
        .is_final();
        if let (false, Some(a)) = (over, r.address.clone())
            && a.starts_with("http://")
        {
            out.push((r.holder.node, r.holder.instance, a));
        }
    }
    Ok(out)
}

/// Tells the printer a node refused our token (watch then ends, exit 8).
async fn denied(tx: &mpsc::Sender<Msg>, node: &str, status: u16) {
    let _ = tx
        .send(Msg::Denied {
            node: node.to_string(),
            status,
        })
        .await;
}

/// Reports a follower's state to the printer (a closed printer is fine: we
/// are shutting down).
async fn say(tx: &mpsc::Sender<Msg>, node: &str, text: String) {
    let _ = tx
        .send(Msg::Status {
            node: node.to_string(),
            text,
        })
        .await;
}

/// Follows one node instance's stream, resuming after disconnects.
async fn follow(
    client: reqwest::Client,
    node: String,
    address: String,
    token: Arc<String>,
    from_start: bool,
    tx: mpsc::Sender<Msg>,
) {
    let clock = SystemClock::new();
    let url = format!("{}/v1/events", address.trim_end_matches('/'));
    // Where to start: the beginning, or the latest event now.
    let mut cursor: Option<u64> = if from_start { Some(0) } else { None };
    let mut backoff = Duration::from_millis(200);
    loop {
        if cursor.is_none() {
            match client
                .get(format!("{url}?limit=1"))
                .bearer_auth(token.as_str())
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => {
                    if let Ok(b) = r.bytes().await
                        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&b)
                    {
                        cursor = v["latest"].as_u64();
                    }
                }
                Ok(r) if matches!(r.status().as_u16(), 401 | 403) => {
                    return denied(&tx, &node, r.status().as_u16()).await;
                }
                Ok(r) => {
                    say(&tx, &node, format!("HTTP {}", r.status())).await;
                }
                Err(e) => {
                    say(&tx, &node, format!("unreachable: {e}")).await;
                }
            }
        }
        if let Some(c) = cursor {
            let resp = client
                .get(&url)
                .bearer_auth(token.as_str())
                .header("accept", "text/event-stream")
                .header("last-event-id", c.to_string())
                .send()
                .await;
            match resp {
                Ok(r) if r.status().is_success() => {
                    backoff = Duration::from_millis(200);
                    let mut body = r.bytes_stream();
                    let mut buf = String::new();
                    while let Some(chunk) = body.next().await {
                        let Ok(chunk) = chunk else { break };
                        buf.push_str(&String::from_utf8_lossy(&chunk));
                        while let Some(end) = buf.find("\n\n") {
                            let frame: String = buf.drain(..end + 2).collect();
                            let (mut ev, mut data, mut id) = (String::new(), String::new(), None);
                            for line in frame.lines() {
                                if let Some(v) = line.strip_prefix("event:") {
                                    ev = v.trim().to_string();
                                } else if let Some(v) = line.strip_prefix("data:") {
                                    data.push_str(v.trim());
                                } else if let Some(v) = line.strip_prefix("id:") {
                                    id = v.trim().parse::<u64>().ok();
                                }
                            }
                            if let Some(id) = id {
                                cursor = Some(id);
                            }
                            if data.is_empty() {
                                continue; // a keep-alive comment
                            }
                            let msg = if ev == "gap" {
                                serde_json::from_str::<Gap>(&data).map(|g| Msg::Gap {
                                    node: node.clone(),
                                    from: g.from,
                                    to: g.to,
                                })
                            } else {
                                serde_json::from_str::<Event>(&data).map(|event| Msg::Event {
                                    node: node.clone(),
                                    event,
                                })
                            };
                            // A frame we cannot read is said, not dropped
                            // unseen (the cursor moves past it all the same).
                            let msg = msg.unwrap_or_else(|e| Msg::Status {
                                node: node.clone(),
                                text: format!(
                                    "skipped a malformed {} frame: {e}",
                                    if ev.is_empty() { "event" } else { &ev }
                                ),
                            });
                            if tx.send(msg).await.is_err() {
                                return;
                            }
                        }
                    }
                    say(&tx, &node, "stream ended; resuming".into()).await;
                }
                Ok(r) if r.status() == reqwest::StatusCode::RANGE_NOT_SATISFIABLE => {
                    // Our cursor is beyond this journal: a restarted node that
                    // kept its address. Start again from its latest.
                    cursor = None;
                }
                Ok(r) if matches!(r.status().as_u16(), 401 | 403) => {
                    return denied(&tx, &node, r.status().as_u16()).await;
                }
                Ok(r) => {
                    say(&tx, &node, format!("HTTP {}", r.status())).await;
                }
                Err(e) => {
                    say(&tx, &node, format!("disconnected: {e}")).await;
                }
            }
        }
        clock.sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
