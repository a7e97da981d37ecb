//! `leasehold logs NAME [-f] [--tail N]`: a session's output, read from its
//! owner node's HTTP API (`/v1/sessions/{name}/logs`, bearer token).
//!
//! The owner comes from the claim (one GET of `sessions/<name>`). With
//! `--follow`, when the owner's stream ends (the session left that node:
//! moved, stopped, the node died) the claim is read again every second, and
//! once it names another owner or epoch the new owner's log is followed,
//! after a line on stderr saying where it went. Without an owner to ask
//! (queued, released, no address published) it fails with a clear error.

use super::{Failure, StoreArgs, open};
use futures::StreamExt;
use leasehold::clock::{Clock, SystemClock};
use leasehold::error::Error;
use leasehold::name::Name;
use leasehold::wake::{Owned, Resolver};
use std::io::Write;
use std::time::Duration;

pub async fn run(
    name: String,
    store: &StoreArgs,
    token_file: &std::path::Path,
    follow: bool,
    tail: Option<usize>,
) -> Result<(), Failure> {
    let name = Name::new(name)?;
    let token = String::from_utf8_lossy(&leasehold::http::read_token(token_file)?).into_owned();
    let store = open(store).await?;
    let resolver = Resolver::new(store);
    let clock = SystemClock::new();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| Error::Internal(format!("http client: {e}")))?;
    let mut last: Option<(String, u64)> = None;
    // The owner we last said the session moved to.
    let mut told: Option<(String, u64)> = None;
    let mut tail = tail;
    loop {
        let r = resolver.resolve(&name).await?;
        let (node, address, epoch) = match r.owner {
            Owned::Claimed {
                node,
                address,
                epoch,
                ..
            } => (node, address, epoch),
            other if last.is_none() => {
                let why = match other {
                    Owned::Released { epoch } => {
                        format!("its claim was released (epoch {epoch})")
                    }
                    Owned::Unowned => "it is queued: no node owns it".into(),
                    _ => "there is no such session".into(),
                };
                return Err(Error::NotFound {
                    key: format!(
                        "{} ({why}; no owner to ask for its log)",
                        leasehold::keys::session(name)
                    ),
                }
                .into());
            }
            _ => {
                clock.sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let same_owner = last.as_ref() == Some(&(node.clone(), epoch));
        if same_owner {
            // Still the owner we just read from (the stream broke, or the
            // session is leaving it): ask again in a moment, new output only.
            clock.sleep(Duration::from_millis(500)).await;
            tail = Some(0);
        }
        let Some(address) = address else {
            return Err(Error::invalid(
                "session owner",
                format!("node {node} publishes no address (start it with --listen)"),
            )
            .into());
        };
        if last.is_some() && !same_owner && told.as_ref() != Some(&(node.clone(), epoch)) {
            eprintln!("--- {name} is now on {node} (epoch {epoch}) ---");
            told = Some((node.clone(), epoch));
            // On the next owner, show its whole log of this session.
            tail = None;
        }
        let mut url = format!(
            "{}/v1/sessions/{name}/logs?follow={follow}",
            address.trim_end_matches('/')
        );
        if let Some(n) = tail {
            url.push_str(&format!("&tail={n}"));
        }
        let resp = match client.get(&url).bearer_auth(&token).send().await {
            Ok(r) => r,
            // Following, an owner we cannot reach has most likely died: wait
            // for the claim to name the next one.
            Err(_) if follow && last.is_some() => {
                last = Some((node, epoch));
                clock.sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(unavailable(&node, without_url(&e)).into()),
        };
        let status = resp.status();
        if follow && status.as_u16() == 404 {
            // Claimed, not started yet (no log so far): wait for it, as
            // `kubectl logs -f` waits for a container to start.
            clock.sleep(Duration::from_millis(500)).await;
            continue;
        }
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            let msg = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or(body);
            let e = match status.as_u16() {
                401 | 403 => Error::Denied {
                    what: "bearer token".into(),
                    reason: format!("node {node} answered {status}: {msg} (check --token-file)"),
                },
                404 => Error::NotFound {
                    key: format!("log of {name} on node {node}: {msg}"),
                },
                _ => unavailable(&node, format!("HTTP {status}: {msg}")),
            };
            return Err(e.into());
        }
        let mut body = resp.bytes_stream();
        let mut out = std::io::stdout();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                // The owner went away mid-stream: follow it to the next.
                Err(_) if follow => break,
                Err(e) => return Err(unavailable(&node, without_url(&e)).into()),
            };
            if out.write_all(&chunk).and_then(|_| out.flush()).is_err() {
                return Ok(()); // the reader went away (a closed pipe)
            }
        }
        if !follow {
            return Ok(());
        }
        last = Some((node, epoch));
    }
}

/// reqwest's errors name the URL; the message is redacted of userinfo and
/// query strings all the same.
fn without_url(e: &reqwest::Error) -> String {
    leasehold::store::objstore::redact(&e.to_string())
}

fn unavailable(node: &str, message: String) -> Error {
    Error::Unavailable {
        op: "GET",
        key: format!("the log on node {node}"),
        source: leasehold::store::StoreError::Unavailable { message },
    }
}
