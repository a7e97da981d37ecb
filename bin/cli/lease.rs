//! `leasehold lease`: the lease primitive from the command line.

use super::*;

pub(super) async fn lease(op: LeaseOp, max_skew: Duration) -> Result<(), Failure> {
    match op {
        LeaseOp::Acquire {
            name,
            store,
            ttl,
            node,
            address,
            wait,
            create,
            no_probe,
            json,
        } => {
            let name = Name::new(name)?;
            let node = node_name(node)?;
            let mut opts = AcquireOptions::ttl(ttl);
            opts.address = address;
            let store = if no_probe {
                open_for_match(&store).await?
            } else {
                let store = open(&store).await?;
                leasehold::probe::probe(&store, &OsEntropy::new(), &SystemClock::new()).await?;
                store
            };
            let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
            let base = epoch_base_of(&store).await?;
            let client = LeaseClient::builder(store, node)
                .clock(clock.clone())
                .epoch_base(base)
                .build()?;
            if create {
                // Create-if-absent: a deleted lease's marker stays, and is
                // waited out below like any absence.
                client.create(&name).await?;
            }
            let deadline = clock.now() + wait.unwrap_or(Duration::ZERO);
            let mut conflicts = 0;
            loop {
                let answer = match client.acquire(&name, &opts).await {
                    // Lost the final write to another acquirer: look again,
                    // and report whoever won (as Held) rather than the race.
                    Err(e) if e.kind() == ErrorKind::Conflict && conflicts < 3 => {
                        conflicts += 1;
                        continue;
                    }
                    r => r?,
                };
                match answer {
                    Acquire::Acquired(l) => {
                        let token = l.token().encode();
                        if json {
                            print_json(&serde_json::json!({
                                "acquired": true, "key": l.key(), "epoch": l.epoch(),
                                "holder": l.record().holder, "ttl_ms": l.record().ttl_ms,
                                "token": token,
                            }));
                        } else {
                            println!("acquired {} epoch {} (ttl {:?})", l.key(), l.epoch(), ttl);
                            println!("token {token}");
                        }
                        return Ok(());
                    }
                    answer @ (Acquire::Held { .. } | Acquire::Absent { .. }) => {
                        let expires_after = match &answer {
                            Acquire::Held { expires_after, .. }
                            | Acquire::Absent { expires_after, .. } => *expires_after,
                            Acquire::Acquired(_) => Duration::ZERO,
                        };
                        let now = clock.now();
                        if now >= deadline {
                            print_not_acquired(&name, &answer, json);
                            return Err(Failure::Held);
                        }
                        // Poll at most every second, and no later than the
                        // earliest moment it could count as expired.
                        let pause = expires_after
                            .min(Duration::from_secs(1))
                            .min(deadline.saturating_since(now))
                            .max(Duration::from_millis(10));
                        clock.sleep(pause).await;
                    }
                }
            }
        }
        LeaseOp::Create { name, store, json } => {
            let name = Name::new(name)?;
            let store = open(&store).await?;
            let base = epoch_base_of(&store).await?;
            let client = LeaseClient::builder(store, Name::new("cli")?)
                .epoch_base(base)
                .build()?;
            let created = client.create(&name).await?;
            let key = leasehold::keys::lease(&name);
            // Not created: say whether what stands is a lease or the marker
            // of a deleted one (which the next acquire must wait out).
            let vanished = !created
                && client
                    .read(Kind::Lease, &name)
                    .await?
                    .is_some_and(|(rec, _, _)| rec.is_vanished());
            if json {
                print_json(
                    &serde_json::json!({"key": key, "created": created, "vanished": vanished}),
                );
            } else if created {
                println!("created {key}");
            } else if vanished {
                println!(
                    "exists {key} (unchanged): the marker of a deleted record; the next acquire waits its ttl + margin"
                );
            } else {
                println!("exists {key} (unchanged)");
            }
            Ok(())
        }
        LeaseOp::Renew {
            name,
            store,
            token,
            json,
        } => {
            let name = Name::new(name)?;
            let token = LeaseToken::decode(&token)?;
            let client = resumed_client(&store).await?;
            let mut l = client.resume(Kind::Lease, &name, &token).await?;
            l.renew().await?;
            let token = l.token().encode();
            if json {
                print_json(
                    &serde_json::json!({"renewed": true, "key": l.key(), "epoch": l.epoch(), "token": token}),
                );
            } else {
                println!("renewed {} epoch {}", l.key(), l.epoch());
                println!("token {token}");
            }
            Ok(())
        }
        LeaseOp::Release {
            name,
            store,
            token,
            json,
        } => {
            let name = Name::new(name)?;
            let token = LeaseToken::decode(&token)?;
            let client = resumed_client(&store).await?;
            let l = client.resume(Kind::Lease, &name, &token).await?;
            let epoch = l.epoch();
            l.release().await?;
            if json {
                print_json(
                    &serde_json::json!({"released": true, "key": leasehold::keys::lease(name), "epoch": epoch}),
                );
            } else {
                println!("released leases/{name} epoch {epoch}");
            }
            Ok(())
        }
        LeaseOp::Show { name, store, json } => {
            let name = Name::new(name)?;
            let store = open(&store).await?;
            let clock = SystemClock::new();
            // Any identity will do for reading.
            let client = LeaseClient::builder(store, Name::new("reader")?).build()?;
            let Some((rec, version, _)) = client.read(Kind::Lease, &name).await? else {
                return Err(Error::NotFound {
                    key: leasehold::keys::lease(name),
                }
                .into());
            };
            // Wall-clock age is for humans only, and says so.
            let age_ms = clock.wall_ms() as i64 - rec.renewed_at_ms as i64;
            // The one vocabulary (leasehold::liveness), by wall clock within the
            // skew bound: advisory, as the human output says.
            let liveness = leasehold::liveness::judge(
                Some(&rec),
                None,
                leasehold::liveness::Evidence::WallClock {
                    now_ms: clock.wall_ms(),
                    max_skew,
                },
            );
            if json {
                print_json(&serde_json::json!({
                    "key": leasehold::keys::lease(name), "version": version, "record": rec,
                    "wall_clock_age_ms": age_ms, "state": liveness,
                }));
            } else {
                println!("key       leases/{name}");
                println!("version   {version}");
                println!(
                    "state     {}{}",
                    liveness.as_str(),
                    match liveness {
                        leasehold::liveness::Liveness::Live
                        | leasehold::liveness::Liveness::Expired =>
                            " (by wall clock; takeovers are judged by observation)",
                        _ => "",
                    }
                );
                println!("epoch     {}", rec.epoch);
                println!(
                    "holder    {}/{} on {}",
                    rec.holder.node, rec.holder.instance, rec.holder.host
                );
                println!("ttl       {}ms", rec.ttl_ms);
                println!("renewed   {age_ms}ms ago by wall clocks (advisory: clocks may differ)");
                if let Some(a) = &rec.address {
                    println!("address   {a}");
                }
            }
            Ok(())
        }
    }
}

/// Standalone leases in a fleet's bucket take its generation's epochs too
/// (one GET); without a fleet marker, epochs start at 1.
pub(super) async fn epoch_base_of(store: &Arc<dyn Store>) -> Result<u64, Error> {
    Ok(leasehold::fleet::marker::read(store)
        .await?
        .map_or(0, |(m, _)| {
            leasehold::fleet::marker::epoch_base(m.generation)
        }))
}

/// What `lease acquire` prints when it gives up (exit 1).
pub(super) fn print_not_acquired(name: &Name, answer: &Acquire, json: bool) {
    let key = leasehold::keys::lease(name);
    match answer {
        Acquire::Held { holder, epoch, .. } => {
            if json {
                print_json(&serde_json::json!({
                    "acquired": false, "key": key, "epoch": epoch, "holder": holder,
                }));
            } else {
                println!(
                    "held: {key} epoch {epoch} by {}/{} on {}",
                    holder.node, holder.instance, holder.host
                );
            }
        }
        Acquire::Absent {
            epoch,
            expires_after,
            observed_for,
        } => {
            // A new process watches from the start: suggest the whole wait.
            let expires_after = &(*expires_after + *observed_for);
            if json {
                print_json(&serde_json::json!({
                    "acquired": false, "key": key, "epoch": epoch, "state": "absent",
                    "expires_after_ms": expires_after.as_millis() as u64,
                }));
            } else {
                println!(
                    "absent: {key} has no record (never declared with `leasehold lease create` or \
                     `acquire --create`, or deleted); a marker at epoch {epoch} stands in its place. \
                     It can be taken after watching it unchanged {:?} more: acquire with --wait {}s",
                    expires_after,
                    expires_after.as_secs() + 1
                );
            }
        }
        Acquire::Acquired(_) => {}
    }
}

pub(super) async fn resumed_client(store: &StoreArgs) -> Result<LeaseClient, Error> {
    // `resume` takes the holder identity from the record, checked against the
    // token; this client's own identity is not used.
    LeaseClient::builder(open_for_match(store).await?, Name::new("cli")?).build()
}
