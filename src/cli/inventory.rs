//! Inventory commands: `resolve`, `ls`, `nodes`, `inspect`.
//!
//! These are one-shot readers. They cannot judge expiry by observation (that
//! needs watching a record for a TTL), so liveness here is what one read can
//! prove: a claim's owner is live while its node lease names the claim's
//! instance and is not released. The age columns use wall clocks and are
//! labelled advisory.

use super::{Failure, LsWhat, StoreArgs, open, print_json};
use crate::Name;
use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::fleet::claim::{self, ClaimRecord, Status};
use crate::fleet::manifest::ManifestRecord;
use crate::record::{Kind, LeaseRecord};
use crate::store::{Entry, Store};
use crate::wake::{Owned, OwnerLease, Resolver, WakeOutcome};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Parallel reads for listings.
const READS: usize = 32;

pub async fn resolve(
    name: String,
    store: &StoreArgs,
    wake: bool,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    let name = Name::new(name)?;
    let store = open(store).await?;
    let resolver = Resolver::new(store).with_max_skew(max_skew);
    if wake {
        let w = resolver.wake(&name, Duration::from_secs(2)).await?;
        if json {
            print_json(&serde_json::to_value(&w).expect("json"));
        } else {
            match &w.outcome {
                WakeOutcome::Reachable {
                    node,
                    address,
                    epoch,
                } => {
                    println!("{name}: on {node} at {address}, epoch {epoch} (reachable)")
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
                    }
                ),
                WakeOutcome::ClaimedHere { node, epoch } => {
                    println!("{name}: claimed on {node}, epoch {epoch}")
                }
            }
        }
        return match w.outcome {
            WakeOutcome::Reachable { .. }
            | WakeOutcome::Unreachable { .. }
            | WakeOutcome::ClaimedHere { .. } => Ok(()),
            _ => Err(Failure::Held),
        };
    }
    let r = resolver.resolve(&name).await?;
    let lease = match &r.owner {
        Owned::Claimed { node, instance, .. } => Some(resolver.owner_lease(node, instance).await?),
        _ => None,
    };
    let live = lease == Some(OwnerLease::Live);
    if json {
        let mut v = serde_json::to_value(&r).expect("json");
        v["live"] = live.into();
        if let Some(l) = lease {
            v["owner_lease"] = serde_json::to_value(l).expect("json");
        }
        print_json(&v);
    } else {
        match &r.owner {
            Owned::Claimed {
                node,
                address,
                epoch,
                status,
                ..
            } => println!(
                "{name}: {node} epoch {epoch} {}{}{}",
                status.as_str(),
                address
                    .as_ref()
                    .map(|a| format!(" at {a}"))
                    .unwrap_or_default(),
                match lease {
                    Some(OwnerLease::Live) | None => String::new(),
                    Some(l) => format!(" (owner {}: interrupted)", lease_text(l)),
                }
            ),
            Owned::Released { epoch } => println!("{name}: released (epoch {epoch}); queued"),
            Owned::Unowned => println!("{name}: queued (no claim yet)"),
            Owned::NoManifest => println!("{name}: no such session (no claim, no manifest)"),
        }
    }
    // Exit 0 means "a live owner runs it": a failed, succeeded or paused
    // session has an owner on record but nothing to reach.
    let running = matches!(
        &r.owner,
        Owned::Claimed { status, .. } if *status == crate::fleet::claim::ClaimState::Running
    );
    if live && running { Ok(()) } else { Err(Failure::Held) }
}

/// Lists `prefix` and reads every object, `READS` at a time. Listings are
/// paged by the store (1,000 keys a page), so 100,000 keys work.
/// A corrupt object becomes a row of its own (`Err(reason)`); anything else
/// that fails aborts the listing.
type Read = Result<Option<bytes::Bytes>, String>;

async fn read_all(store: &Arc<dyn Store>, prefix: &str) -> Result<Vec<(Entry, Read)>, Error> {
    let mut entries = Vec::new();
    let mut list = store.list(prefix);
    while let Some(e) = list.next().await {
        entries.push(e.map_err(|e| Error::from_store("list", prefix, e))?);
    }
    let out: Vec<_> = futures::stream::iter(entries)
        .map(|e| {
            let store = store.clone();
            async move {
                let got = store.get(&e.key).await;
                (e, got)
            }
        })
        .buffered(READS)
        .collect()
        .await;
    out.into_iter()
        .map(|(e, got)| match got {
            Ok(o) => Ok((e, Ok(o.map(|o| o.bytes)))),
            Err(crate::store::StoreError::Corrupt { reason }) => Ok((e, Err(reason))),
            Err(err) => {
                let key = e.key.clone();
                Err(Error::from_store("get", &key, err))
            }
        })
        .collect()
}

/// Decodes one listed object for a row: None when it vanished since the
/// listing, `Some(Err(reason))` when it is corrupt (the row says so).
fn decode_row<T>(
    key: &str,
    read: &Read,
    decode: impl Fn(&str, &[u8]) -> Result<T, Error>,
) -> Option<Result<T, String>> {
    match read {
        Ok(Some(b)) => Some(decode(key, b).map_err(|e| e.to_string())),
        Ok(None) => None,
        Err(reason) => Some(Err(reason.clone())),
    }
}

/// Prints a CORRUPT line for a row that has one, naming it by `field`.
fn printed_corrupt(r: &serde_json::Value, field: &str, width: usize) -> bool {
    let Some(c) = r.get("corrupt") else {
        return false;
    };
    println!(
        "{:<width$} CORRUPT: {}",
        r[field].as_str().unwrap_or(""),
        c.as_str().unwrap_or("")
    );
    true
}

/// A wall-clock age in milliseconds, for humans.
fn ago(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 600_000 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

/// One-shot readers judge by wall clock, and say so.
fn lease_text(l: OwnerLease) -> &'static str {
    match l {
        OwnerLease::Expired => "expired by wall clock",
        other => other.describe(),
    }
}

pub async fn ls(
    what: LsWhat,
    store: &StoreArgs,
    prefix: &str,
    json: bool,
    max_skew: Duration,
) -> Result<(), Failure> {
    if !prefix.is_empty()
        && !prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(Error::invalid("--prefix", "names are [A-Za-z0-9._-]").into());
    }
    let store = open(store).await?;
    let now = SystemClock::new().wall_ms();
    match what {
        LsWhat::Nodes => {
            let mut rows = Vec::new();
            for (e, bytes) in read_all(&store, &format!("nodes/{prefix}")).await? {
                let Some(decoded) =
                    decode_row(&e.key, &bytes, |k, b| LeaseRecord::decode(k, b, Kind::Node))
                else {
                    continue;
                };
                let row = match decoded {
                    Ok(r) => serde_json::json!({
                        "node": r.holder.node, "instance": r.holder.instance, "host": r.holder.host,
                        "epoch": r.epoch, "released": r.released, "address": r.address,
                        "capacity": r.attrs.get("capacity"), "load": r.attrs.get("load"),
                        "labels": r.attrs.get("labels"), "renewed_ms_ago_wall": now.saturating_sub(r.renewed_at_ms),
                        // One vocabulary (crate::liveness): live, expired
                        // (by wall clock, within the skew bound), released,
                        // fenced (released by a peer that took over).
                        "state": crate::liveness::judge(Some(&r), None, crate::liveness::Evidence::WallClock { now_ms: now, max_skew }).as_str(),
                        "released_by": r.attrs.get("released_by"),
                    }),
                    Err(err) => {
                        serde_json::json!({"node": &e.key["nodes/".len()..], "corrupt": err})
                    }
                };
                rows.push(row);
            }
            if json {
                print_json(&serde_json::Value::Array(rows));
            } else {
                println!(
                    "{:<16} {:<17} {:<6} {:<9} {:<10} {:<22} renewed (wall clock)",
                    "NODE", "INSTANCE", "EPOCH", "LOAD", "STATE", "ADDRESS"
                );
                for r in rows {
                    if printed_corrupt(&r, "node", 16) {
                        continue;
                    }
                    println!(
                        "{:<16} {:<17} {:<6} {:<9} {:<10} {:<22} {} ago",
                        r["node"].as_str().unwrap_or(""),
                        r["instance"].as_str().unwrap_or(""),
                        r["epoch"].to_string(),
                        format!("{}/{}", r["load"], r["capacity"]),
                        r["state"].as_str().unwrap_or(""),
                        r["address"].as_str().unwrap_or("-"),
                        ago(r["renewed_ms_ago_wall"].as_u64().unwrap_or(0)),
                    );
                }
            }
        }
        LsWhat::Manifests => {
            let mut rows = Vec::new();
            for (e, bytes) in read_all(&store, &format!("manifests/{prefix}")).await? {
                let Some(decoded) = decode_row(&e.key, &bytes, ManifestRecord::decode) else {
                    continue;
                };
                rows.push(match decoded {
                    Ok(m) => serde_json::json!({
                        "name": m.name, "digest": m.digest, "command": m.spec.command,
                        "args": m.spec.args, "restart": m.spec.restart, "paused": m.spec.paused,
                    }),
                    Err(err) => {
                        serde_json::json!({"name": &e.key["manifests/".len()..], "corrupt": err})
                    }
                });
            }
            if json {
                print_json(&serde_json::Value::Array(rows));
            } else {
                println!(
                    "{:<24} {:<13} {:<11} {:<7} COMMAND",
                    "NAME", "DIGEST", "RESTART", "PAUSED"
                );
                for r in rows {
                    if printed_corrupt(&r, "name", 24) {
                        continue;
                    }
                    println!(
                        "{:<24} {:<13} {:<11} {:<7} {} {}",
                        r["name"].as_str().unwrap_or(""),
                        &r["digest"].as_str().unwrap_or("")
                            [..12.min(r["digest"].as_str().unwrap_or("").len())],
                        r["restart"].as_str().unwrap_or(""),
                        r["paused"].to_string(),
                        r["command"].as_str().unwrap_or(""),
                        r["args"]
                            .as_array()
                            .map(|a| a
                                .iter()
                                .filter_map(|x| x.as_str())
                                .collect::<Vec<_>>()
                                .join(" "))
                            .unwrap_or_default(),
                    );
                }
            }
        }
        LsWhat::Sessions => {
            // Sessions are the union of manifests and claims; liveness needs
            // the node leases.
            let manifests = read_all(&store, &format!("manifests/{prefix}")).await?;
            let claims = read_all(&store, &format!("sessions/{prefix}")).await?;
            let nodes = read_all(&store, "nodes/").await?;
            let mut node_records: BTreeMap<String, LeaseRecord> = BTreeMap::new();
            for (e, b) in &nodes {
                if let Ok(Some(b)) = b
                    && let Ok(r) = LeaseRecord::decode(&e.key, b, Kind::Node)
                {
                    node_records.insert(r.holder.node.clone(), r);
                }
            }
            let mut rows: BTreeMap<String, serde_json::Value> = BTreeMap::new();
            for (e, b) in &manifests {
                let name = e.key["manifests/".len()..].to_string();
                let Some(decoded) = decode_row(&e.key, b, ManifestRecord::decode) else {
                    continue;
                };
                let corrupt = decoded.err();
                rows.insert(name.clone(), serde_json::json!({"name": name, "status": Status::Queued, "manifest": corrupt.is_none()}));
                if let Some(err) = corrupt {
                    rows.get_mut(&name).unwrap()["corrupt"] = err.into();
                }
            }
            for (e, b) in &claims {
                let name = e.key["sessions/".len()..].to_string();
                let Some(decoded) = decode_row(&e.key, b, ClaimRecord::decode) else {
                    continue;
                };
                let row = match decoded {
                    Ok(c) => {
                        let owner_live = node_records.get(&c.owner.node).is_some_and(|r| {
                            crate::wake::owner_lease_of(r, &c.owner.instance, now, max_skew)
                                == OwnerLease::Live
                        });
                        serde_json::json!({
                            "name": name, "status": claim::status(Some(&c), owner_live),
                            "owner": c.owner.node, "instance": c.owner.instance, "epoch": c.epoch,
                            "address": c.address, "restarts": c.restarts, "exit_code": c.exit_code,
                            "updated_ms_ago_wall": now.saturating_sub(c.updated_at_ms),
                            "manifest": rows.get(&name).is_some_and(|r| r["manifest"] == true),
                        })
                    }
                    Err(err) => serde_json::json!({"name": name, "corrupt": err}),
                };
                rows.insert(name, row);
            }
            if json {
                print_json(&serde_json::Value::Array(rows.into_values().collect()));
            } else {
                println!(
                    "{:<24} {:<12} {:<16} {:<6} AGE (wall clock)",
                    "NAME", "STATUS", "OWNER", "EPOCH"
                );
                for r in rows.values() {
                    if printed_corrupt(r, "name", 24) {
                        continue;
                    }
                    let status = r["status"].as_str().unwrap_or("");
                    println!(
                        "{:<24} {:<12} {:<16} {:<6} {}",
                        r["name"].as_str().unwrap_or(""),
                        status,
                        r["owner"].as_str().unwrap_or("-"),
                        r.get("epoch").map(|e| e.to_string()).unwrap_or("-".into()),
                        r.get("updated_ms_ago_wall")
                            .and_then(|v| v.as_u64())
                            .map(ago)
                            .unwrap_or("-".into()),
                    );
                }
            }
        }
    }
    Ok(())
}

pub async fn inspect(key: &str, store: &StoreArgs, json: bool) -> Result<(), Failure> {
    crate::store::check_key(key).map_err(|e| Error::invalid("key", e.to_string()))?;
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
                    key: format!("{key} (keys are prefixed: did you mean {}?)", found.join(" or ")),
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
        _ => Err(Error::invalid(
            "key",
            format!("{key:?} is not under leases/, nodes/, sessions/ or manifests/"),
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
