//! Garbage collection (`leasehold gc`): tombstones of deleted sessions,
//! orphaned claims and dead node records, once older than a retention, and
//! never in a way that lets a fencing token be issued twice.
//!
//! # Why a floor
//!
//! A claim's tombstone is what keeps its epochs rising: the next holder
//! takes over at its epoch + 1. Delete it, re-apply the session, and a node
//! that never saw the old claim would start at 1 again, reissuing tokens a
//! downstream system may already have seen. So before gc deletes anything
//! it raises the **epoch floor** (a field of the fleet marker, changed only
//! by If-Match; losing it is losing the marker, which stops every node) to
//! above every epoch it is about to delete, and every
//! writer that creates a record where none is (a node creating a claim
//! after an observed absence, `apply`'s placeholder, a node's registration)
//! starts above the floor. The floor is raised *before* the deletes, and a
//! creator reads it *after* observing the absence the delete made, so it
//! always sees it.
//!
//! # What is removed (all older than the retention, by the objects' own
//! wall-clock stamps; advisory ages, which is why the default is a day)
//!
//! - a released claim (a tombstone or a placeholder) whose manifest is gone;
//! - a claim whose manifest is gone and whose owner's tenure is over for
//!   good (released, fenced, superseded, absent: nobody will stop or take
//!   it over);
//! - a node record that is released or fenced (the node shut down or was
//!   taken over). Its control object (an operator's cordon) is kept;
//! - a cron tick's record (`ticks/`) whose session's manifest is gone.
//!   Tick records fence nothing (the claim carries its tick: see
//!   `fleet::cron`), so no floor is needed for them; an object under
//!   `ticks/` that is not a tick record is left alone.
//!
//! Never: a manifest, a live node's record, a claim with a manifest, the
//! fleet marker, the floor.

use super::claim::{ClaimRecord, ClaimState};
use crate::clock::Entropy;
use crate::error::{Error, Result};
use crate::liveness::{Evidence, Liveness, judge};
use crate::record::{Kind, LeaseRecord, MAX_EPOCH};
use crate::store::{Cond, Store, StoreError};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// The epoch floor: every record created where none is starts above it
/// (0 when gc never ran, or without a fleet marker). It lives in the fleet
/// marker (see [`super::marker::FleetMarker::epoch_floor`]).
pub async fn floor(store: &Arc<dyn Store>) -> Result<u64> {
    Ok(super::marker::read(store)
        .await?
        .map_or(0, |(m, _)| m.epoch_floor))
}

/// The highest epoch gc removes: the floor goes one above it, and a record
/// made after must start above the floor, within [`MAX_EPOCH`]. A record
/// above this (only foreign bytes put one there) is left where it is: its
/// key is stuck either way, and removing it would raise the floor to where
/// no token is left for any new record, or past what a marker may hold
/// (every node would then stop on a marker it cannot read).
pub const MAX_REMOVABLE_EPOCH: u64 = MAX_EPOCH - 2;

/// Raises the floor to at least `epoch`: an If-Match on the marker, retried
/// on a race. Nodes accept the changed marker (same fleet, same generation).
/// A floor that would leave no token above it is refused, never written.
pub async fn raise_floor(store: &Arc<dyn Store>, entropy: &dyn Entropy, epoch: u64) -> Result<()> {
    if epoch > MAX_REMOVABLE_EPOCH + 1 {
        return Err(Error::invalid(
            "epoch floor",
            format!("{epoch} would leave no fencing token above it"),
        ));
    }
    for _ in 0..10 {
        let (mut m, version) = super::marker::require(store).await?;
        if m.epoch_floor >= epoch {
            return Ok(());
        }
        m.epoch_floor = epoch;
        m.nonce = entropy.hex_id();
        let bytes = Bytes::from(serde_json::to_vec(&m).expect("marker serialises"));
        match store
            .put(super::marker::KEY, bytes, Cond::Match(version))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.is_rejection() => continue,
            // Landed or not, the next round reads it back.
            Err(StoreError::Ambiguous { .. }) => continue,
            Err(e) => return Err(Error::from_store("put", super::marker::KEY, e)),
        }
    }
    Err(Error::Conflict {
        key: super::marker::KEY.into(),
    })
}

/// One object gc would remove, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Removal {
    pub key: String,
    pub reason: String,
    pub epoch: u64,
    /// The object's nonce as planned: removed only if still this write.
    #[serde(skip)]
    pub nonce: String,
}

/// What to remove now: see the module docs. Pure over the listed records.
pub fn plan(
    manifests: &BTreeSet<String>,
    claims: &BTreeMap<String, ClaimRecord>,
    nodes: &BTreeMap<String, LeaseRecord>,
    now_ms: u64,
    retention: Duration,
) -> Vec<Removal> {
    // Saturating: a retention too long for u64 ms keeps everything.
    let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    let old = |at_ms: u64| now_ms.saturating_sub(at_ms) >= retention_ms;
    let mut out = Vec::new();
    for (name, c) in claims {
        if manifests.contains(name) || !old(c.updated_at_ms) || c.epoch > MAX_REMOVABLE_EPOCH {
            continue;
        }
        let reason = if c.state == ClaimState::Released {
            "tombstone of a deleted session"
        } else {
            let owner = judge(
                nodes.get(&c.owner.node),
                Some(&c.owner.instance),
                // Only final verdicts count; no evidence of expiry is used.
                Evidence::Observed {
                    unchanged_for: Duration::ZERO,
                    margin: Duration::ZERO,
                },
            );
            if !(owner.is_final() || owner == Liveness::Absent) {
                continue; // its owner may still be stopping it
            }
            "claim of a deleted session whose owner is gone"
        };
        out.push(Removal {
            key: crate::keys::session(name),
            reason: reason.into(),
            epoch: c.epoch,
            nonce: c.nonce.clone(),
        });
    }
    for (id, r) in nodes {
        if r.released && old(r.renewed_at_ms) && r.epoch <= MAX_REMOVABLE_EPOCH {
            out.push(Removal {
                key: crate::keys::node(id),
                reason: if r.attrs.contains_key(super::attrs::RELEASED_BY) {
                    "node record fenced by a peer".into()
                } else {
                    "node record released at shutdown".into()
                },
                epoch: r.epoch,
                nonce: r.nonce.clone(),
            });
        }
    }
    out
}

/// The tick records to remove: each `(key, session, age stamp, nonce)`
/// of a session with no manifest, older than the retention. Pure.
pub fn plan_ticks(
    manifests: &BTreeSet<String>,
    ticks: &[(String, String, u64, String)],
    now_ms: u64,
    retention: Duration,
) -> Vec<Removal> {
    let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    ticks
        .iter()
        .filter(|(_, session, at, _)| {
            !manifests.contains(session) && now_ms.saturating_sub(*at) >= retention_ms
        })
        .map(|(key, _, _, nonce)| Removal {
            key: key.clone(),
            reason: "tick record of a deleted session".into(),
            epoch: 0,
            nonce: nonce.clone(),
        })
        .collect()
}

/// Lists the fleet and computes [`plan`] and [`plan_ticks`].
pub async fn scan(
    store: &Arc<dyn Store>,
    now_ms: u64,
    retention: Duration,
) -> Result<Vec<Removal>> {
    // (key, the store's last-modified stamp): an object's age is judged by
    // the later of its writer's stamp and the store's, so neither a writer
    // with a slow clock nor a stamp never set (a placeholder's) makes it
    // look older than it is.
    let keys = |prefix: &'static str| async move {
        let mut out = Vec::new();
        let mut list = store.list(prefix);
        while let Some(e) = list.next().await {
            let e = e.map_err(|e| Error::from_store("list", prefix, e))?;
            out.push((e.key, e.last_modified_ms.unwrap_or(0)));
        }
        Ok::<_, Error>(out)
    };
    let manifests: BTreeSet<String> = keys(crate::keys::MANIFESTS)
        .await?
        .into_iter()
        .map(|(k, _)| crate::keys::tail(crate::keys::MANIFESTS, &k).to_string())
        .collect();
    let mut claims = BTreeMap::new();
    for (k, modified) in keys(crate::keys::SESSIONS).await? {
        if let Some(o) = store
            .get(&k)
            .await
            .map_err(|e| Error::from_store("get", &k, e))?
            && let Ok(mut c) = ClaimRecord::decode(&k, &o.bytes)
        {
            c.updated_at_ms = c.updated_at_ms.max(modified);
            claims.insert(crate::keys::tail(crate::keys::SESSIONS, &k).to_string(), c);
        }
    }
    let mut nodes = BTreeMap::new();
    for (k, modified) in keys(crate::keys::NODES).await? {
        if let Some(o) = store
            .get(&k)
            .await
            .map_err(|e| Error::from_store("get", &k, e))?
            && let Ok(mut r) = LeaseRecord::decode(&k, &o.bytes, Kind::Node)
        {
            r.renewed_at_ms = r.renewed_at_ms.max(modified);
            nodes.insert(crate::keys::tail(crate::keys::NODES, &k).to_string(), r);
        }
    }
    // Tick records: read only those of sessions with no manifest.
    let mut ticks = Vec::new();
    for (k, modified) in keys(crate::keys::TICKS).await? {
        let Some((session, _)) = crate::keys::parse_tick(&k) else {
            continue;
        };
        if manifests.contains(session) {
            continue;
        }
        if let Some(o) = store
            .get(&k)
            .await
            .map_err(|e| Error::from_store("get", &k, e))?
            && let Ok(t) = super::cron::TickRecord::decode(&k, &o.bytes)
        {
            ticks.push((k.clone(), t.session, t.decided_at_ms.max(modified), t.nonce));
        }
    }
    let mut out = plan(&manifests, &claims, &nodes, now_ms, retention);
    out.extend(plan_ticks(&manifests, &ticks, now_ms, retention));
    Ok(out)
}

/// Removes `removals`: the floor first, then each object, re-read just
/// before and removed only if it is still the very write the plan saw (its
/// nonce: a session re-applied and claimed since, or a node that registered
/// again, is left alone). Returns the keys removed.
///
/// The floor is raised to one *above* the highest epoch planned: a delete
/// is not conditional (not every store has conditional deletes), so a claim
/// taken over between the re-read and the delete (one takeover: a second
/// needs a release or an observed expiry) may be deleted too, and its epoch
/// (at most that + 1) must be covered as well.
pub async fn apply(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    removals: &[Removal],
) -> Result<Vec<String>> {
    if removals.is_empty() {
        return Ok(Vec::new());
    }
    // Tick records hold no epoch: they need no floor.
    if let Some(top) = removals
        .iter()
        .filter(|r| !r.key.starts_with(crate::keys::TICKS))
        .map(|r| r.epoch)
        .max()
    {
        raise_floor(store, entropy, top.saturating_add(1)).await?;
    }
    let mut done = Vec::new();
    for r in removals {
        let still = match store
            .get(&r.key)
            .await
            .map_err(|e| Error::from_store("get", &r.key, e))?
        {
            None => false,
            Some(o) => {
                if let Some((session, _)) = crate::keys::parse_tick(&r.key) {
                    let manifest = crate::keys::manifest(session);
                    let gone = store
                        .get(&manifest)
                        .await
                        .map_err(|e| Error::from_store("get", &manifest, e))?
                        .is_none();
                    gone && super::cron::TickRecord::decode(&r.key, &o.bytes)
                        .is_ok_and(|t| t.nonce == r.nonce)
                } else if let Some(name) = r.key.strip_prefix(crate::keys::SESSIONS) {
                    let manifest = crate::keys::manifest(name);
                    let gone = store
                        .get(&manifest)
                        .await
                        .map_err(|e| Error::from_store("get", &manifest, e))?
                        .is_none();
                    gone && ClaimRecord::decode(&r.key, &o.bytes).is_ok_and(|c| c.nonce == r.nonce)
                } else {
                    LeaseRecord::decode(&r.key, &o.bytes, Kind::Node)
                        .is_ok_and(|n| n.released && n.nonce == r.nonce)
                }
            }
        };
        if !still {
            continue;
        }
        store
            .delete(&r.key)
            .await
            .map_err(|e| Error::from_store("delete", &r.key, e))?;
        done.push(r.key.clone());
    }
    Ok(done)
}
