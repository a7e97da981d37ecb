//! `leasehold wake NAME`: wake a session and wait until it is ready (a
//! live owner runs it and its health check, if any, passes); and
//! `leasehold sleep`, a session's request to fall asleep.

use super::{Failure, StoreArgs, hinting, open, print_json};
use leasehold::clock::{Clock, SystemClock};
use leasehold::wake::{Ready, Resolver};
use leasehold::{Error, Name};
use std::time::Duration;

/// `wake NAME --at TIME`: an alarm (see `leasehold::fleet::alarm`). The
/// time is checked before anything is read; the session must have a
/// manifest.
pub async fn alarm(name: String, store: &StoreArgs, at: &str, json: bool) -> Result<(), Failure> {
    let name = Name::new(name)?;
    let now_ms = SystemClock::new().wall_ms();
    let at_ms = parse_at(at, now_ms)?;
    let store = open(store).await?;
    let key = leasehold::fleet::alarm::set(
        &store,
        &leasehold::clock::OsEntropy::new(),
        &name,
        at_ms,
        now_ms,
    )
    .await?;
    let when =
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(at_ms));
    if json {
        print_json(
            &serde_json::json!({"name": name.as_str(), "alarm": key, "at": when.to_string(), "at_ms": at_ms}),
        );
    } else {
        println!("{name}: alarm set for {when} ({key}); a node wakes it then if it is asleep");
    }
    Ok(())
}

/// `--at`: RFC 3339 (`2026-12-24T18:00:00Z`) or `+DURATION` from `now_ms`.
fn parse_at(at: &str, now_ms: u64) -> Result<u64, Error> {
    let bad = |why: String| Error::invalid("--at", why);
    let at_ms = if let Some(rel) = at.strip_prefix('+') {
        let d =
            humantime::parse_duration(rel).map_err(|e| bad(format!("{at:?}: {e} (e.g. +10m)")))?;
        now_ms.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    } else {
        let t = humantime::parse_rfc3339_weak(at).map_err(|e| {
            bad(format!(
                "{at:?}: {e} (an RFC 3339 time such as 2026-12-24T18:00:00Z, or +10m)"
            ))
        })?;
        let ms = t
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| bad(format!("{at:?} is before 1970")))?
            .as_millis();
        u64::try_from(ms).unwrap_or(u64::MAX)
    };
    if at_ms <= now_ms {
        return Err(bad(format!("{at:?} has passed")));
    }
    Ok(at_ms)
}

pub async fn wake(
    name: String,
    store: &StoreArgs,
    wait: Duration,
    token_file: Option<&std::path::Path>,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    let name = Name::new(name)?;
    // Its wake request is a claim write: hinted, so nodes see it at once.
    let store = hinting(open(store).await?);
    let mut resolver = Resolver::new(store).with_max_skew(max_skew);
    if let Some(f) = token_file {
        resolver = resolver.with_token(leasehold::http::read_token(f)?);
    }
    let clock = SystemClock::new();
    let start = clock.now();
    match resolver.wake_ready(&name, wait).await? {
        Ready::Ready {
            node,
            epoch,
            endpoint,
            address,
            woken,
        } => {
            let took = clock.now().saturating_since(start);
            if json {
                print_json(&serde_json::json!({
                    "name": name.as_str(), "ready": true, "node": node, "epoch": epoch,
                    "endpoint": endpoint, "address": address, "woken": woken,
                    "took_ms": took.as_millis() as u64,
                }));
            } else {
                println!(
                    "{name}: running on {node}, epoch {epoch}{}{} (ready in {:.2}s)",
                    endpoint
                        .as_ref()
                        .map(|e| format!(" at {e}"))
                        .unwrap_or_default(),
                    if woken { ", woken" } else { "" },
                    took.as_secs_f64()
                );
            }
            Ok(())
        }
        Ready::NotFound => Err(Error::NotFound {
            key: leasehold::keys::manifest(&name),
        }
        .into()),
        Ready::Declined { reason } => {
            if json {
                print_json(&serde_json::json!({
                    "name": name.as_str(), "ready": false, "declined": reason,
                }));
            } else {
                println!("{name}: not woken: {reason}");
            }
            Err(Failure::Held)
        }
        Ready::Starting { node, epoch, woken } => {
            if json {
                print_json(&serde_json::json!({
                    "name": name.as_str(), "ready": false, "starting": true, "node": node,
                    "epoch": epoch, "woken": woken,
                }));
            } else {
                println!(
                    "{name}: starting on {node}, epoch {epoch}{}; not ready after {}",
                    if woken { ", woken" } else { "" },
                    humantime::format_duration(wait)
                );
            }
            Err(Failure::Held)
        }
        Ready::TimedOut { last } => {
            if json {
                print_json(&serde_json::json!({
                    "name": name.as_str(), "ready": false, "waiting_for": last,
                    "waited_ms": wait.as_millis() as u64,
                }));
            } else {
                println!(
                    "{name}: not ready after {} ({last})",
                    humantime::format_duration(wait)
                );
            }
            Err(Failure::Held)
        }
        other => {
            println!("{name}: {other:?}");
            Err(Failure::Held)
        }
    }
}

pub async fn sleep(wake_in: Option<Duration>) -> Result<(), Failure> {
    let c = leasehold::fleet::channel::client::SessionClient::from_env()?;
    // The node sets the alarm once the session is asleep.
    c.sleep_then_wake(wake_in).await?;
    Ok(())
}
