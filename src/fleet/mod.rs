//! The fleet runtime: manifests in the bucket materialise as sessions on some
//! node, and move when that node dies. No control plane and no scheduler:
//! every node runs the same pull loop over the same listings and ranks
//! candidates the same way.
//!
//! - [`manifest`]: desired sessions and idempotent admission;
//! - [`claim`]: session claims, attached to the owner's node lease;
//! - [`plan`]: the pure decision core (placement, claimability);
//! - [`runner`]: what runs a session (a trait, an in-process recorder for
//!   tests, and the exec runner under a dead-man switch);
//! - [`node`]: the pull loop, `run(..., shutdown)`.

pub mod claim;
pub mod contain;
pub mod journal;
pub mod manifest;
pub mod node;
pub mod plan;
pub mod runner;
pub mod watchdog;

use crate::error::{Error, Result};
use crate::store::{Cond, Store, StoreError, Version};
use bytes::Bytes;
use std::sync::Arc;

/// The outcome of a conditional write of a JSON record with a nonce, after
/// any read-back: the same three-outcome discipline as the lease protocol.
pub(crate) enum Put {
    Committed(Version),
    /// Someone else's write is there (or nothing, for If-Match).
    Rejected(Option<(Bytes, Version)>),
}

/// Writes `bytes` (which carry `nonce`) under `cond`; on a rejection or an
/// ambiguous failure reads back and decides by the stored nonce, which
/// `nonce_of` extracts.
pub(crate) async fn put_checked(
    store: &Arc<dyn Store>,
    key: &str,
    bytes: Bytes,
    cond: Cond,
    nonce: &str,
    nonce_of: impl Fn(&[u8]) -> Option<String>,
) -> Result<Put> {
    let rejected = match store.put(key, bytes, cond).await {
        Ok(v) => return Ok(Put::Committed(v)),
        Err(e) if e.is_rejection() => true,
        Err(StoreError::Ambiguous { .. }) => false,
        Err(e) => return Err(Error::from_store("put", key, e)),
    };
    let current = store
        .get(key)
        .await
        .map_err(|e| Error::from_store("get", key, e))?;
    match current {
        Some(o) if nonce_of(&o.bytes).as_deref() == Some(nonce) => Ok(Put::Committed(o.version)),
        Some(o) if rejected => Ok(Put::Rejected(Some((o.bytes, o.version)))),
        None if rejected => Ok(Put::Rejected(None)),
        _ => Err(Error::Unavailable {
            op: "put",
            key: key.to_string(),
            source: StoreError::Unavailable {
                message: "the write did not land; try again".into(),
            },
        }),
    }
}

/// Extracts the `nonce` field of a JSON object, for [`put_checked`].
pub(crate) fn json_nonce(bytes: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    v.get("nonce")?.as_str().map(str::to_string)
}
