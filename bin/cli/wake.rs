//! `leasehold wake NAME`: wake a session and wait until it is ready (a
//! live owner runs it and its health check, if any, passes); and
//! `leasehold sleep`, a session's request to fall asleep.

use super::{Failure, StoreArgs, hinting, open, print_json};
use leasehold::clock::{Clock, SystemClock};
use leasehold::fleet::claim::ClaimState;
use leasehold::wake::{Owned, OwnerLease, Resolver, WakeOutcome};
use leasehold::{Error, Name};
use std::time::Duration;

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
    let w = resolver.wake(&name, Duration::from_secs(2)).await?;
    let woke = matches!(w.outcome, WakeOutcome::Woken { .. });
    match &w.outcome {
        WakeOutcome::NoOwner {
            owner: Owned::NoManifest,
        } => {
            return Err(Error::NotFound {
                key: leasehold::keys::manifest(&name),
            }
            .into());
        }
        WakeOutcome::Declined { reason, .. } => {
            println!("{name}: not woken: {reason}");
            return Err(Failure::Held);
        }
        _ => {}
    }
    // Ready: a live owner runs it, and its check passed.
    let deadline = start + wait;
    loop {
        let r = resolver.resolve(&name).await?;
        if let Owned::Claimed {
            node,
            instance,
            address,
            endpoint,
            epoch,
            status,
            health,
            ..
        } = &r.owner
        {
            let live = resolver.owner_lease(node, instance).await? == OwnerLease::Live;
            match status {
                ClaimState::Running if live && health.is_none() => {
                    let took = clock.now().saturating_since(start);
                    if json {
                        print_json(&serde_json::json!({
                            "name": name.as_str(), "ready": true, "node": node, "epoch": epoch,
                            "endpoint": endpoint, "address": address, "woken": woke,
                            "took_ms": took.as_millis() as u64,
                        }));
                    } else {
                        println!(
                            "{name}: running on {node}, epoch {epoch}{}{} (ready in {:.2}s)",
                            endpoint
                                .as_ref()
                                .map(|e| format!(" at {e}"))
                                .unwrap_or_default(),
                            if woke { ", woken" } else { "" },
                            took.as_secs_f64()
                        );
                    }
                    return Ok(());
                }
                ClaimState::Paused | ClaimState::Succeeded | ClaimState::Failed => {
                    println!("{name}: {} on {node}: nothing to wake", status.as_str());
                    return Err(Failure::Held);
                }
                _ => {}
            }
        }
        let last = match &r.owner {
            Owned::Claimed { node, status, .. } => format!("{} on {node}", status.as_str()),
            Owned::Sleeping { .. } => "asleep".into(),
            Owned::Released { .. } | Owned::Unowned => "waiting for a node".into(),
            Owned::NoManifest => "deleted".into(),
            other => format!("{other:?}"),
        };
        if clock.now() >= deadline {
            println!(
                "{name}: not ready after {} ({last})",
                humantime::format_duration(wait)
            );
            return Err(Failure::Held);
        }
        clock.sleep(Duration::from_millis(50)).await;
    }
}

pub async fn sleep() -> Result<(), Failure> {
    let c = leasehold::fleet::channel::client::SessionClient::from_env()?;
    c.sleep().await?;
    Ok(())
}
