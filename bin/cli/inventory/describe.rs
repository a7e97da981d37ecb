//! `leasehold describe` and `leasehold inspect`: one session, or one object, in full.

use super::*;

pub async fn inspect(key: &str, store: &StoreArgs, json: bool) -> Result<(), Failure> {
    leasehold::store::check_key(key).map_err(|e| Error::invalid("key", e.to_string()))?;
    let store = open(store).await?;
    let Some(o) = store
        .get(key)
        .await
        .map_err(|e| Error::from_store("get", key, e))?
    else {
        // A bare name most likely meant one of its objects: say which exist.
        if !key.contains('/') {
            let mut found = Vec::new();
            for p in ["sessions", "manifests", "nodes", "leases"] {
                let k = format!("{p}/{key}");
                if let Ok(Some(_)) = store.get(&k).await {
                    found.push(k);
                }
            }
            if !found.is_empty() {
                return Err(Error::NotFound {
                    key: format!(
                        "{key} (keys are prefixed: did you mean {}?)",
                        found.join(" or ")
                    ),
                }
                .into());
            }
        }
        return Err(Error::NotFound {
            key: key.to_string(),
        }
        .into());
    };
    let decoded: Result<serde_json::Value, Error> = match key.split('/').next() {
        Some("leases") => LeaseRecord::decode(key, &o.bytes, Kind::Lease)
            .map(|r| serde_json::to_value(r).expect("json")),
        Some("nodes") => LeaseRecord::decode(key, &o.bytes, Kind::Node)
            .map(|r| serde_json::to_value(r).expect("json")),
        Some("sessions") => {
            ClaimRecord::decode(key, &o.bytes).map(|r| serde_json::to_value(r).expect("json"))
        }
        Some("manifests") => {
            ManifestRecord::decode(key, &o.bytes).map(|r| serde_json::to_value(r).expect("json"))
        }
        _ if key == leasehold::keys::MARKER => {
            leasehold::fleet::marker::FleetMarker::decode(&o.bytes)
                .map(|m| serde_json::to_value(m).expect("json"))
        }
        // The bell's body is a random token: a new one is a ring.
        _ if key == leasehold::keys::BELL => {
            Ok(serde_json::json!({"bell": String::from_utf8_lossy(&o.bytes)}))
        }
        Some("control") => leasehold::fleet::control::ControlRecord::decode(key, &o.bytes)
            .map(|r| serde_json::to_value(r).expect("json")),
        Some("changes") => match leasehold::keys::parse_hint(key) {
            Some((at_ms, kind, name)) => {
                Ok(serde_json::json!({"hint": {"at_ms": at_ms, "names": kind.key(name)}}))
            }
            None => Err(Error::corrupt(key, "not a change hint of this version")),
        },
        _ => Err(Error::invalid(
            "key",
            format!(
                "{key:?} is not under leases/, nodes/, sessions/, manifests/, control/ or changes/, \
                 nor the fleet marker ({}) or the bell ({})",
                leasehold::keys::MARKER,
                leasehold::keys::BELL
            ),
        )),
    };
    let raw = String::from_utf8_lossy(&o.bytes[..o.bytes.len().min(64 * 1024)]).into_owned();
    if json {
        let mut v = serde_json::json!({"key": key, "version": o.version, "size": o.bytes.len(), "raw": raw});
        match &decoded {
            Ok(d) => v["decoded"] = d.clone(),
            Err(e) => v["error"] = e.to_string().into(),
        }
        print_json(&v);
    } else {
        println!("key      {key}");
        println!("version  {}", o.version);
        println!("size     {} bytes", o.bytes.len());
        println!("raw      {}", raw.escape_debug());
        match &decoded {
            Ok(d) => println!(
                "decoded  {}",
                serde_json::to_string_pretty(d).expect("json")
            ),
            Err(e) => println!("decoded  ({e})"),
        }
    }
    decoded.map(|_| ()).map_err(Failure::Error)
}

/// `leasehold describe NAME`: everything known about one session, in one
/// place, as `kubectl describe` gives it: the manifest, the claim, the
/// owner's liveness (by wall clock, labelled so), the status and its reason,
/// the restart count and last exit, and (with a token file) the session's
/// recent events from its owner's journal.
pub async fn describe(
    name: String,
    store: &StoreArgs,
    token_file: Option<&std::path::Path>,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    use leasehold::liveness::{Evidence, judge};
    let name = Name::new(name)?;
    let store = open(store).await?;
    let now = SystemClock::new().wall_ms();
    let manifest = leasehold::fleet::manifest::get(&store, &name).await?;
    let claim = leasehold::fleet::claim::get(&store, name.as_str()).await?;
    let (facts, unreadable) = node_facts(&store, now, max_skew).await?;
    let m = manifest.as_ref().map(|(m, _)| m);
    let c = claim
        .as_ref()
        .map(|(c, _)| c)
        .filter(|c| !c.is_placeholder());
    let Some(x) = explain(m, c, &facts, &unreadable, now, max_skew) else {
        return Err(Error::NotFound {
            key: format!("session {name} (no manifest; its claim, if any, is a tombstone)"),
        }
        .into());
    };
    // Asleep, a session has no owner: its claim names nobody.
    let asleep = c.is_some_and(|c| c.state == leasehold::fleet::claim::ClaimState::Sleeping);
    let owner = c.filter(|_| !asleep).map(|c| {
        let l = judge(
            facts.get(&c.owner.node).map(|n| &n.record),
            Some(&c.owner.instance),
            Evidence::WallClock {
                now_ms: now,
                max_skew,
            },
        );
        (c, l)
    });
    let alarms = pending_alarms(&store, name.as_str()).await;
    // A scheduled session's recent ticks and its next (best effort).
    let schedule = m.and_then(|m| m.spec.schedule.as_ref());
    let ticks = match schedule {
        Some(_) => leasehold::fleet::cron::recent(&store, &name)
            .await
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let next_tick = schedule
        .and_then(|s| s.compile().ok())
        .and_then(|c| c.next_after(now));
    // The owner's journal, filtered to this session: best effort.
    let mut events: Vec<serde_json::Value> = Vec::new();
    let mut events_note = String::new();
    match (owner.as_ref(), token_file) {
        (Some((c, _)), Some(tf)) => {
            let address = facts
                .get(&c.owner.node)
                .and_then(|n| n.record.address.clone())
                .or_else(|| c.address.clone());
            match address {
                Some(a) => match owner_events(&a, tf, name.as_str()).await {
                    Ok(ev) => events = ev,
                    Err(e) => events_note = e,
                },
                None => events_note = "the owner publishes no address".into(),
            }
        }
        (Some(_), None) => events_note = "pass --token-file to read the owner's journal".into(),
        (None, _) if asleep => events_note = "asleep: no owner".into(),
        (None, _) => events_note = "no owner".into(),
    }
    if json {
        print_json(&serde_json::json!({
            "name": name.as_str(), "status": x.status, "reason": x.reason,
            "manifest": m, "claim": claim.as_ref().map(|(c, _)| c),
            // "unreadable" where the owner's record is corrupt: not one of
            // the judge's answers, which would call it absent.
            "owner_liveness": owner.as_ref().map(|(c, l)| if unreadable.contains(&c.owner.node) {
                serde_json::json!("unreadable")
            } else {
                serde_json::json!(l)
            }),
            "alarms": alarms.iter().map(|(k, at)| serde_json::json!({"key": k, "at_ms": at, "at": rfc3339(*at)})).collect::<Vec<_>>(),
            "next_tick_ms": next_tick,
            "ticks": ticks.iter().map(|t| serde_json::json!({
                "tick_ms": t.tick_ms, "tick": rfc3339(t.tick_ms), "decision": t.decision,
                "outcome": t.decision.describe(), "node": t.node, "decided_at_ms": t.decided_at_ms,
            })).collect::<Vec<_>>(),
            "events": events, "events_note": (!events_note.is_empty()).then_some(&events_note),
        }));
        return Ok(());
    }
    println!("Name:       {name}");
    println!(
        "Status:     {}{}",
        serde_json::to_value(x.status)
            .expect("json")
            .as_str()
            .unwrap_or(""),
        if x.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", x.reason)
        }
    );
    match m {
        Some(m) => {
            println!(
                "Manifest:   manifests/{name} (digest {})",
                &m.digest[..12.min(m.digest.len())]
            );
            let mut cmd = vec![m.spec.command.clone()];
            cmd.extend(m.spec.args.iter().cloned());
            println!("  Command:  {}", shown(&cmd.join(" ")));
            println!("  Restart:  {}", m.spec.restart.describe());
            if !m.labels.is_empty() {
                let labels: Vec<String> =
                    m.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!("  Labels:   {}", labels.join(","));
            }
            if !m.spec.selector.is_empty() {
                println!("  Selector: {}", m.spec.selector_text());
            }
            for (label, v) in [
                ("User:    ", &m.spec.user),
                ("Group:   ", &m.spec.group),
                ("Workdir: ", &m.spec.workdir),
            ] {
                if let Some(v) = v {
                    println!("  {label} {}", shown(v));
                }
            }
            if let Some(p) = m.spec.port {
                println!("  Port:     {p}");
            }
            if let Some(r) = &m.spec.sleep {
                println!("  Sleep:    {}", r.describe());
            }
            if let Some(s) = &m.spec.schedule {
                println!(
                    "  Schedule: {} ({}), concurrency {}{}",
                    shown(&s.cron),
                    shown(s.zone_name()),
                    s.concurrency.as_str(),
                    s.starting_deadline
                        .map(|d| format!(", starting deadline {}", crate::cli::for_humans(d)))
                        .unwrap_or_default()
                );
            }
            if let Some(c) = &m.spec.check {
                println!("  Check:    {}", shown(&c.describe()));
            }
            if !m.spec.limits.is_empty() {
                println!("  Limits:   {}", m.spec.limits.describe());
            }
            if m.spec.paused {
                println!("  Paused:   yes");
            }
        }
        None => println!("Manifest:   none (deleted)"),
    }
    match &owner {
        Some((c, l)) => {
            println!(
                "Claim:      sessions/{name} epoch {} {} (updated {} ago by wall clock)",
                c.epoch,
                c.state.as_str(),
                ago(now.saturating_sub(c.updated_at_ms))
            );
            if unreadable.contains(&c.owner.node) {
                println!(
                    "Owner:      {} instance {} (its node record is unreadable: `leasehold inspect nodes/{}`)",
                    c.owner.node, c.owner.instance, c.owner.node
                );
            } else {
                println!(
                    "Owner:      {} instance {} ({}, by wall clock within {:?})",
                    c.owner.node,
                    c.owner.instance,
                    l.as_str(),
                    max_skew
                );
            }
            if let Some(e) = &c.endpoint {
                println!("Endpoint:   {e}");
            }
            println!(
                "Restarts:   {}{}",
                c.restarts,
                c.exit_code
                    .map(|e| format!(" (last exit {e})"))
                    .unwrap_or_default()
            );
        }
        None => println!("Claim:      none yet"),
    }
    for (i, (_, at)) in alarms.iter().enumerate() {
        let label = if i == 0 { "Alarms:" } else { "" };
        println!(
            "{label:<12}{} (in {})",
            rfc3339(*at),
            crate::cli::for_humans(Duration::from_millis(at.saturating_sub(now)))
        );
    }
    if schedule.is_some() {
        match next_tick {
            Some(t) => println!(
                "Next tick:  {} (in {})",
                rfc3339(t),
                crate::cli::for_humans(Duration::from_millis(t.saturating_sub(now)))
            ),
            None => println!("Next tick:  none"),
        }
        if ticks.is_empty() {
            println!("Ticks:      none recorded");
        }
        for (i, t) in ticks.iter().enumerate() {
            let label = if i == 0 { "Ticks:" } else { "" };
            println!(
                "{label:<12}{} {} (by {})",
                rfc3339(t.tick_ms),
                shown(&t.decision.describe()),
                t.node
            );
        }
    }
    println!("Events:");
    if events.is_empty() {
        println!(
            "  {}",
            if events_note.is_empty() {
                "none retained"
            } else {
                &events_note
            }
        );
    }
    for e in &events {
        // When, by the owner's wall clock, and how long ago by ours.
        let when = e["at_ms"]
            .as_u64()
            .map(|at| {
                format!(
                    "{} ({} ago) ",
                    humantime::format_rfc3339_millis(
                        std::time::UNIX_EPOCH + Duration::from_millis(at)
                    ),
                    ago(now.saturating_sub(at))
                )
            })
            .unwrap_or_default();
        println!(
            "  #{:<5} {when}{:<10} {}{}",
            e["seq"],
            // A remote node's words: escaped like a spec's.
            shown(e["kind"].as_str().unwrap_or("")),
            e.get("epoch")
                .map(|x| format!("epoch {x} "))
                .unwrap_or_default(),
            shown(e["detail"].as_str().unwrap_or(""))
        );
    }
    Ok(())
}

/// The last 20 events of `session` in the journal at `address`.
async fn owner_events(
    address: &str,
    token_file: &std::path::Path,
    session: &str,
) -> Result<Vec<serde_json::Value>, String> {
    let token = leasehold::http::read_token(token_file).map_err(|e| e.to_string())?;
    let token = String::from_utf8_lossy(&token).into_owned();
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    // The newest 1,000 events (a journal keeps up to 10,000): the latest
    // sequence number first, then the page that ends there.
    let base = address.trim_end_matches('/');
    let latest = client
        .get(format!("{base}/v1/events?limit=1"))
        .bearer_auth(&token)
        .send()
        .await
        .ok()
        .filter(|r| r.status().is_success());
    let latest = match latest {
        Some(r) => r
            .bytes()
            .await
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["latest"].as_u64())
            .unwrap_or(0),
        None => 0,
    };
    let url = format!(
        "{base}/v1/events?after={}&limit=1000",
        latest.saturating_sub(1000)
    );
    let r = client
        .get(&url)
        .bearer_auth(token)
        .send()
        .await
        .map_err(|e| {
            format!(
                "the owner did not answer: {}",
                leasehold::store::objstore::redact(&e.to_string())
            )
        })?;
    if !r.status().is_success() {
        return Err(format!("the owner answered HTTP {}", r.status()));
    }
    let body = r
        .bytes()
        .await
        .map_err(|e| format!("reading the journal page: {e}"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("bad journal page: {e}"))?;
    let mut ev: Vec<serde_json::Value> = v["events"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e["session"] == session)
        .collect();
    let skip = ev.len().saturating_sub(20);
    ev.drain(..skip);
    Ok(ev)
}

/// The session's alarms not yet fired, earliest first: one listing of
/// `alarms/` and a read of each of its own (best effort: an alarm that
/// cannot be read is not shown).
async fn pending_alarms(store: &Arc<dyn Store>, session: &str) -> Vec<(String, u64)> {
    use futures::StreamExt;
    use leasehold::fleet::alarm::{ALARMS, AlarmRecord, parse_key};
    let keys: Vec<String> = store
        .list(ALARMS)
        .filter_map(|e| async move { e.ok() })
        .map(|e| e.key)
        .filter(|k| std::future::ready(parse_key(k).is_some_and(|(_, s)| s == session)))
        .collect()
        .await;
    let mut out = Vec::new();
    for k in keys {
        if let Ok(Some(o)) = store.get(&k).await
            && let Ok(a) = AlarmRecord::decode(&k, &o.bytes)
            && a.fired_at_epoch.is_none()
        {
            out.push((k, a.at_ms));
        }
    }
    out.sort_by_key(|(_, at)| *at);
    out
}

/// A wall-clock instant in ms, as RFC 3339 (UTC, seconds).
fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}
