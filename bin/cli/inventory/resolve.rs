//! `leasehold resolve`: who owns a session, from one read of its claim.

use super::*;

pub async fn resolve(
    name: String,
    store: &StoreArgs,
    wake: bool,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    let name = Name::new(name)?;
    let store = open(store).await?;
    let resolver = Resolver::new(store.clone()).with_max_skew(max_skew);
    if wake {
        let w = resolver.wake(&name, Duration::from_secs(2)).await?;
        if json {
            print_json(&serde_json::to_value(&w).expect("json"));
        } else {
            match &w.outcome {
                WakeOutcome::Reachable {
                    node,
                    address,
                    endpoint,
                    epoch,
                    status,
                    ..
                } => {
                    println!(
                        "{name}: {}on {node} (node API {address}), epoch {epoch} {} (reachable)",
                        endpoint
                            .as_ref()
                            .map(|e| format!("at {e} "))
                            .unwrap_or_default(),
                        status.as_str()
                    )
                }
                WakeOutcome::Unreachable { node, reason, .. } => {
                    println!(
                        "{name}: on {node}, which is alive by its lease but did not answer: {reason}"
                    )
                }
                WakeOutcome::OwnerGone { node, epoch, lease } => {
                    println!(
                        "{name}: owner {node} is gone ({}, epoch {epoch}); a node will claim it",
                        lease_text(*lease)
                    )
                }
                WakeOutcome::NoOwner { owner } => println!(
                    "{name}: no owner ({})",
                    match owner {
                        Owned::Released { epoch } => format!("released at epoch {epoch}; queued"),
                        Owned::Unowned => "queued, never claimed".into(),
                        Owned::NoManifest => "no such session: no claim, no manifest".into(),
                        Owned::Claimed { node, status, .. } =>
                            format!("{} on {node}", status.as_str()),
                        other => format!("{other:?}"),
                    }
                ),
                WakeOutcome::ClaimedHere { node, epoch } => {
                    println!("{name}: claimed on {node}, epoch {epoch}")
                }
                WakeOutcome::Woken { epoch, .. } => println!(
                    "{name}: woken (it slept at epoch {epoch}); a node claims it at a higher epoch"
                ),
                WakeOutcome::Declined { reason, .. } => {
                    println!("{name}: not woken: {reason}")
                }
                other => println!("{name}: {other:?}"),
            }
        }
        // Exit 0 as without --wake, "a live owner runs it", and here
        // also that it answered: an owner that did not is exit 1 (its lease
        // says live, but the caller could not reach it), as is a reachable
        // owner of a succeeded, failed or paused session.
        return match w.outcome {
            WakeOutcome::Reachable {
                status: leasehold::fleet::claim::ClaimState::Running,
                ..
            } => Ok(()),
            WakeOutcome::ClaimedHere { .. } => Ok(()),
            _ => Err(Failure::Held),
        };
    }
    let r = resolver.resolve(&name).await?;
    let lease = match &r.owner {
        Owned::Claimed { node, instance, .. } => Some(resolver.owner_lease(node, instance).await?),
        _ => None,
    };
    let live = lease == Some(OwnerLease::Live);
    // With no owner, paused or queued is the manifest's to say (one more
    // GET, only then): `ls` says paused for a paused manifest never claimed.
    let paused = matches!(r.owner, Owned::Released { .. } | Owned::Unowned)
        // A manifest that cannot be read says nothing here (`describe`
        // reports it); resolve answers from the claim as before.
        && leasehold::fleet::manifest::get(&store, &name)
            .await
            .ok()
            .flatten()
            .is_some_and(|(m, _)| m.spec.paused);
    // The word `ls` and `describe` print for it (`Status::of`).
    let word = match &r.owner {
        Owned::Claimed {
            status,
            health,
            backoff_until_ms,
            ..
        } => leasehold::fleet::claim::Status::of(
            *status,
            *health,
            *backoff_until_ms,
            live,
            SystemClock::new().wall_ms(),
        )
        .as_str(),
        Owned::Released { .. } | Owned::Unowned if paused => "paused",
        Owned::Released { .. } | Owned::Unowned => "queued",
        Owned::Sleeping { .. } => "sleeping",
        _ => "none",
    };
    if json {
        let mut v = serde_json::to_value(&r).expect("json");
        v["live"] = live.into();
        v["status"] = word.into();
        if let Some(l) = lease {
            v["owner_lease"] = serde_json::to_value(l).expect("json");
        }
        print_json(&v);
    } else {
        match &r.owner {
            Owned::Claimed {
                node,
                address,
                endpoint,
                epoch,
                status,
                ..
            } => println!(
                "{name}: {node} epoch {epoch} {word}{}{}{}",
                endpoint
                    .as_ref()
                    .map(|e| format!(" at {e}"))
                    .unwrap_or_default(),
                address
                    .as_ref()
                    .map(|a| if endpoint.is_some() {
                        format!(" (node API {a})")
                    } else {
                        format!(" (node API {a}; the session publishes no port)")
                    })
                    .unwrap_or_default(),
                match lease {
                    Some(OwnerLease::Live) | None => String::new(),
                    Some(l) => format!(
                        " (owner {}; its claim says {})",
                        lease_text(l),
                        status.as_str()
                    ),
                }
            ),
            Owned::Released { epoch } => println!("{name}: released (epoch {epoch}); {word}"),
            Owned::Sleeping { epoch, .. } => println!(
                "{name}: sleeping (epoch {epoch}); `leasehold wake {name}` runs it at a higher epoch"
            ),
            Owned::Unowned => println!("{name}: {word} (never claimed)"),
            Owned::NoManifest => println!("{name}: no such session (no claim, no manifest)"),
            other => println!("{name}: {other:?}"),
        }
    }
    // Exit 0 means "a live owner runs it": a failed, succeeded or paused
    // session has an owner on record but nothing to reach.
    let running = matches!(
        &r.owner,
        Owned::Claimed { status, .. } if *status == leasehold::fleet::claim::ClaimState::Running
    );
    if live && running {
        Ok(())
    } else {
        Err(Failure::Held)
    }
}
