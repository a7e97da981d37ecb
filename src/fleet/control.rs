//! Operator control of one node: `control/<node-id>`, written by `leasehold
//! node cordon | drain | uncordon`, read by that node.
//!
//! A node's own record (`nodes/<id>`) is written only by the node (a write
//! by anyone else would read to the node as losing its lease), so operator
//! intent lives in an object of its own. The node reads it at start, every
//! [`CONTROL_EVERY`] passes (one GET, about 2 % of an idle node's requests),
//! and at once when nudged over its HTTP API (`POST /v1/nudge`, which the CLI
//! sends when it has the fleet's token). The bucket is the truth: a lost
//! nudge only delays.
//!
//! - **cordon**: the node takes no new sessions (its record says
//!   `"cordoned": true`, so peers rank it out of placement and `ls` says
//!   so); running sessions stay.
//! - **drain**: cordon, and hand every session over: each is stopped and its
//!   claim released, so peers claim it at once (a released claim needs no
//!   expiry).
//! - **uncordon**: the object is deleted; the node takes sessions again.

use crate::clock::Entropy;
use crate::error::{Error, Result};
use crate::store::{Cond, Store, StoreError};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Passes between two reads of the control object (besides nudges).
pub const CONTROL_EVERY: u64 = 5;

/// The key of node `id`'s control object.
pub fn key(id: &str) -> String {
    crate::keys::control(id)
}

/// What the operator asked of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlRecord {
    pub schema: String,
    pub kind: String,
    pub node: String,
    /// Take no new sessions.
    pub cordon: bool,
    /// Also hand every session over.
    pub drain: bool,
    /// Operator's wall clock; for humans.
    pub at_ms: u64,
    pub nonce: String,
}

impl ControlRecord {
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        if bytes.len() > 4096 {
            return Err(Error::corrupt(key, "larger than any control object"));
        }
        let r: ControlRecord = serde_json::from_slice(bytes)
            .map_err(|e| Error::corrupt(key, format!("not a control object: {e}")))?;
        if r.schema != crate::record::SCHEMA || r.kind != "control" {
            return Err(Error::corrupt(
                key,
                format!("schema {:?} kind {:?}", r.schema, r.kind),
            ));
        }
        Ok(r)
    }
}

/// Reads node `id`'s control object (None: no instructions).
pub async fn get(store: &Arc<dyn Store>, id: &str) -> Result<Option<ControlRecord>> {
    let k = key(id);
    match store
        .get(&k)
        .await
        .map_err(|e| Error::from_store("get", &k, e))?
    {
        None => Ok(None),
        Some(o) => Ok(Some(ControlRecord::decode(&k, &o.bytes)?)),
    }
}

/// Writes node `id`'s control object (replacing what is there: the last
/// operator's word wins, as with `kubectl cordon`).
pub async fn set(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    id: &str,
    drain: bool,
    now_ms: u64,
) -> Result<ControlRecord> {
    let k = key(id);
    let rec = ControlRecord {
        schema: crate::record::SCHEMA.into(),
        kind: "control".into(),
        node: id.to_string(),
        cordon: true,
        drain,
        at_ms: now_ms,
        nonce: entropy.hex_id(),
    };
    let bytes = Bytes::from(serde_json::to_vec(&rec).expect("control serialises"));
    // Create, or replace the version just read; a race with another
    // operator is retried a few times, then reported.
    for _ in 0..5 {
        let cond = match store
            .get(&k)
            .await
            .map_err(|e| Error::from_store("get", &k, e))?
        {
            Some(o) => Cond::Match(o.version),
            None => Cond::Create,
        };
        match store.put(&k, bytes.clone(), cond).await {
            Ok(_) => return Ok(rec),
            Err(e) if e.is_rejection() => continue,
            Err(StoreError::Ambiguous { .. }) => {
                // Read back: ours is there, or try again.
                if let Ok(Some(o)) = store.get(&k).await
                    && ControlRecord::decode(&k, &o.bytes).is_ok_and(|r| r.nonce == rec.nonce)
                {
                    return Ok(rec);
                }
            }
            Err(e) => return Err(Error::from_store("put", &k, e)),
        }
    }
    Err(Error::Conflict { key: k })
}

/// Deletes node `id`'s control object (uncordon). True if there was one.
pub async fn clear(store: &Arc<dyn Store>, id: &str) -> Result<bool> {
    let k = key(id);
    let existed = store
        .get(&k)
        .await
        .map_err(|e| Error::from_store("get", &k, e))?
        .is_some();
    store
        .delete(&k)
        .await
        .map_err(|e| Error::from_store("delete", &k, e))?;
    Ok(existed)
}
