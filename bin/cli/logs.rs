//! `leasehold logs NAME [-f] [--tail N]`: a session's output, read from its
//! owner node's HTTP API (`/v1/sessions/{name}/logs`, bearer token).
//!
//! The owner comes from the claim (one GET of `sessions/<name>`). With
//! `--follow`, when the owner's stream ends (the session left that node:
//! moved, stopped, the node died) the claim is read again every second, and
//! once it names another owner or epoch the new owner's log is followed,
//! after a line on stderr saying where it went. Without an owner to ask
//! (queued, released, no address published) it fails with a clear error.
//!
//! `--follow` ends, as `kubectl logs -f` does when its container ends: once
//! the run it followed has finished (`succeeded` or `failed`, with its exit
//! code and reason on stderr), or was paused, or its manifest was deleted.
//! A hand-over to another node (a drain, a takeover) is followed, not an
//! end.

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
    let resolver = Resolver::new(store.clone());
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
        // Following, and the run we read from is over: say how, and end.
        if follow && let Some(end) = ended(&r.owner, last.as_ref(), &store, &name).await? {
            eprintln!("--- {name} {end} ---");
            return Ok(());
        }
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

/// Whether the run `logs -f` followed (`last`: its owner and epoch) is
/// over, and how to say so: finished (with its exit and reason), paused,
/// or deleted. None while it runs, moves, or waits for a node.
async fn ended(
    owner: &Owned,
    last: Option<&(String, u64)>,
    store: &std::sync::Arc<dyn leasehold::store::Store>,
    name: &Name,
) -> Result<Option<String>, Failure> {
    use leasehold::fleet::claim::ClaimState;
    let Some(last) = last else {
        return Ok(None); // nothing read yet: show what there is first
    };
    if let Owned::Claimed {
        node,
        epoch,
        status,
        ..
    } = owner
        && (node, *epoch) == (&last.0, last.1)
    {
        return Ok(match status {
            ClaimState::Succeeded | ClaimState::Failed => {
                let c = leasehold::fleet::claim::get(store, name.as_str())
                    .await?
                    .map(|(c, _)| c);
                let exit = c
                    .as_ref()
                    .and_then(|c| c.exit_code)
                    .map(|e| format!(" (exit {e})"))
                    .unwrap_or_default();
                let why = c
                    .and_then(|c| c.reason)
                    // Printable: a claim's reason is checked on decode.
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                Some(format!("{}{exit}{why}", status.as_str()))
            }
            ClaimState::Paused => Some("paused".into()),
            _ => None,
        });
    }
    // Released or gone: a deleted manifest ends it; a hand-over does not.
    if matches!(
        owner,
        Owned::Released { .. } | Owned::Unowned | Owned::NoManifest
    ) && leasehold::fleet::manifest::get(store, name)
        .await?
        .is_none()
    {
        return Ok(Some("was deleted".into()));
    }
    Ok(None)
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
