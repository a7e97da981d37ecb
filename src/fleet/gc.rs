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
//! it raises the **epoch floor** (`fleet-floor`, one small object, changed
//! only by If-Match) to at least every epoch it is about to delete, and every
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
//!   taken over), with its control object.
//!
//! Never: a manifest, a live node's record, a claim with a manifest, the
//! fleet marker, the floor.

use super::claim::{ClaimRecord, ClaimState};
use crate::clock::Entropy;
use crate::error::{Error, Result};
use crate::liveness::{Evidence, Liveness, judge};
use crate::record::{Kind, LeaseRecord};
use crate::store::{Cond, Store, StoreError};
use bytes::Bytes;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// The epoch floor's key.
pub const FLOOR_KEY: &str = "fleet-floor";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Floor {
    schema: String,
    kind: String,
    /// Every epoch ever deleted by gc is at most this.
    epoch: u64,
    nonce: String,
}

/// The epoch floor: every record created where none is starts above it
/// (0 when gc never ran).
pub async fn floor(store: &Arc<dyn Store>) -> Result<u64> {
    match store
        .get(FLOOR_KEY)
        .await
        .map_err(|e| Error::from_store("get", FLOOR_KEY, e))?
    {
        None => Ok(0),
        Some(o) => Ok(decode(&o.bytes)?.epoch),
    }
}

fn decode(bytes: &[u8]) -> Result<Floor> {
    let f: Floor = serde_json::from_slice(bytes)
        .map_err(|e| Error::corrupt(FLOOR_KEY, format!("not an epoch floor: {e}")))?;
    if f.schema != crate::record::SCHEMA || f.kind != "epoch-floor" {
        return Err(Error::corrupt(FLOOR_KEY, "not an epoch floor"));
    }
    Ok(f)
}

/// Raises the floor to at least `epoch` (If-Match, retried on a race).
pub async fn raise_floor(store: &Arc<dyn Store>, entropy: &dyn Entropy, epoch: u64) -> Result<()> {
    for _ in 0..10 {
        let (cur, cond) = match store
            .get(FLOOR_KEY)
            .await
            .map_err(|e| Error::from_store("get", FLOOR_KEY, e))?
        {
            None => (0, Cond::Create),
            Some(o) => (decode(&o.bytes)?.epoch, Cond::Match(o.version)),
        };
        if cur >= epoch {
            return Ok(());
        }
        let f = Floor {
            schema: crate::record::SCHEMA.into(),
            kind: "epoch-floor".into(),
            epoch,
            nonce: entropy.hex_id(),
        };
        let bytes = Bytes::from(serde_json::to_vec(&f).expect("floor serialises"));
        match store.put(FLOOR_KEY, bytes, cond).await {
            Ok(_) => return Ok(()),
            Err(e) if e.is_rejection() => continue,
            // Landed or not, the next round reads it back.
            Err(StoreError::Ambiguous { .. }) => continue,
            Err(e) => return Err(Error::from_store("put", FLOOR_KEY, e)),
        }
    }
    Err(Error::Conflict {
        key: FLOOR_KEY.into(),
    })
}

/// One object gc would remove, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Removal {
    pub key: String,
    pub reason: String,
    pub epoch: u64,
}

/// What to remove now: see the module docs. Pure over the listed records.
pub fn plan(
    manifests: &BTreeSet<String>,
    claims: &BTreeMap<String, ClaimRecord>,
    nodes: &BTreeMap<String, LeaseRecord>,
    now_ms: u64,
    retention: Duration,
) -> Vec<Removal> {
    let old = |at_ms: u64| now_ms.saturating_sub(at_ms) >= retention.as_millis() as u64;
    let mut out = Vec::new();
    for (name, c) in claims {
        if manifests.contains(name) || !old(c.updated_at_ms) {
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
            key: format!("sessions/{name}"),
            reason: reason.into(),
            epoch: c.epoch,
        });
    }
    for (id, r) in nodes {
        if r.released && old(r.renewed_at_ms) {
            out.push(Removal {
                key: format!("nodes/{id}"),
                reason: if r.attrs.contains_key("released_by") {
                    "node record fenced by a peer".into()
                } else {
                    "node record released at shutdown".into()
                },
                epoch: r.epoch,
            });
        }
    }
    out
}

/// Lists the fleet and computes [`plan`].
pub async fn scan(store: &Arc<dyn Store>, now_ms: u64, retention: Duration) -> Result<Vec<Removal>> {
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
    let manifests: BTreeSet<String> = keys("manifests/")
        .await?
        .into_iter()
        .map(|(k, _)| k["manifests/".len()..].to_string())
        .collect();
    let mut claims = BTreeMap::new();
    for (k, modified) in keys("sessions/").await? {
        if let Some(o) = store.get(&k).await.map_err(|e| Error::from_store("get", &k, e))?
            && let Ok(mut c) = ClaimRecord::decode(&k, &o.bytes)
        {
            c.updated_at_ms = c.updated_at_ms.max(modified);
            claims.insert(k["sessions/".len()..].to_string(), c);
        }
    }
    let mut nodes = BTreeMap::new();
    for (k, modified) in keys("nodes/").await? {
        if let Some(o) = store.get(&k).await.map_err(|e| Error::from_store("get", &k, e))?
            && let Ok(mut r) = LeaseRecord::decode(&k, &o.bytes, Kind::Node)
        {
            r.renewed_at_ms = r.renewed_at_ms.max(modified);
            nodes.insert(k["nodes/".len()..].to_string(), r);
        }
    }
    Ok(plan(&manifests, &claims, &nodes, now_ms, retention))
}

/// Removes `removals`: the floor first (above every epoch removed), then
/// each object, re-read just before and removed only if still what the plan
/// saw (same epoch, still removable: a session re-applied since, or a node
/// that registered again, is left alone).
pub async fn apply(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    removals: &[Removal],
) -> Result<usize> {
    let Some(top) = removals.iter().map(|r| r.epoch).max() else {
        return Ok(0);
    };
    raise_floor(store, entropy, top).await?;
    let mut done = 0;
    for r in removals {
        let still = match store.get(&r.key).await.map_err(|e| Error::from_store("get", &r.key, e))? {
            None => false,
            Some(o) => {
                if let Some(name) = r.key.strip_prefix("sessions/") {
                    let manifest = format!("manifests/{name}");
                    let gone = store
                        .get(&manifest)
                        .await
                        .map_err(|e| Error::from_store("get", &manifest, e))?
                        .is_none();
                    gone && ClaimRecord::decode(&r.key, &o.bytes).is_ok_and(|c| c.epoch == r.epoch)
                } else {
                    LeaseRecord::decode(&r.key, &o.bytes, Kind::Node)
                        .is_ok_and(|n| n.released && n.epoch == r.epoch)
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
        if let Some(id) = r.key.strip_prefix("nodes/") {
            let _ = store.delete(&super::control::key(id)).await;
        }
        done += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::claim::Owner;
    use crate::record::Holder;

    const NOW: u64 = 100 * 3_600_000;
    const DAY: Duration = Duration::from_secs(86_400);

    fn claim(owner: &str, state: ClaimState, epoch: u64, age_h: u64) -> ClaimRecord {
        ClaimRecord {
            schema: crate::record::SCHEMA.into(),
            kind: "session".into(),
            owner: Owner {
                node: owner.into(),
                instance: format!("{owner}-i"),
            },
            epoch,
            state,
            digest: "d".into(),
            address: None,
            exit_code: None,
            restarts: 0,
            updated_at_ms: NOW - age_h * 3_600_000,
            nonce: "n".into(),
        }
    }

    fn node(id: &str, released: bool, fenced: bool, age_h: u64) -> LeaseRecord {
        let mut attrs = serde_json::Map::new();
        if fenced {
            attrs.insert("released_by".into(), "n9".into());
        }
        LeaseRecord {
            schema: crate::record::SCHEMA.into(),
            kind: Kind::Node,
            holder: Holder {
                node: id.into(),
                host: "h".into(),
                instance: format!("{id}-i"),
            },
            epoch: 3,
            ttl_ms: 10_000,
            renewed_at_ms: NOW - age_h * 3_600_000,
            released,
            host_locked: false,
            lock_id: None,
            address: None,
            attrs,
            nonce: "n".into(),
        }
    }

    #[test]
    fn only_old_dead_objects_without_a_manifest_are_planned() {
        let manifests: BTreeSet<String> = ["kept".to_string()].into();
        let claims: BTreeMap<String, ClaimRecord> = [
            ("kept", claim("live", ClaimState::Released, 4, 48)), // has a manifest
            ("tomb", claim("live", ClaimState::Released, 7, 48)), // removable
            ("young", claim("live", ClaimState::Released, 2, 1)), // too young
            ("orphan", claim("gone", ClaimState::Running, 5, 48)), // owner absent
            ("stopping", claim("live", ClaimState::Running, 6, 48)), // owner live
            ("fenced-owner", claim("fenced", ClaimState::Running, 8, 48)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let nodes: BTreeMap<String, LeaseRecord> = [
            ("live", node("live", false, false, 48)), // held: never
            ("fenced", node("fenced", true, true, 48)),
            ("shut", node("shut", true, false, 48)),
            ("fresh", node("fresh", true, false, 1)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let keys: Vec<String> = plan(&manifests, &claims, &nodes, NOW, DAY)
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(
            keys,
            [
                "sessions/fenced-owner",
                "sessions/orphan",
                "sessions/tomb",
                "nodes/fenced",
                "nodes/shut"
            ]
        );
    }
}
