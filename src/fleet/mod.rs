//! The fleet runtime: manifests in the bucket materialise as sessions on some
//! node, and move when that node dies. No control plane and no scheduler:
//! every node runs the same pull loop over the same listings and ranks
//! candidates the same way.
//!
//! - [`manifest`]: desired sessions and idempotent admission;
//! - [`claim`]: session claims, attached to the owner's node lease;
//! - [`marker`]: the fleet marker (the bucket's identity, its generation);
//! - [`attrs`]: what a node publishes in its node record;
//! - [`plan`]: placement, pure (rendezvous ranking, claimability);
//! - [`core`]: every other rule the node applies, pure (no async, I/O,
//!   clock or randomness), each table-tested;
//! - [`node`]: the pull loop's shell, `run(..., shutdown)`: it gathers the
//!   facts `plan` and `core` decide on and carries out their verdicts;
//! - [`endpoint`]: the claim channel between a node's loop and its
//!   callers (the wake path, the HTTP claim endpoint); [`status`]: what a
//!   node publishes of itself (readiness, sessions, renew latencies);
//! - [`feed`]: the change feed (hints, the bell); [`nudge`]: peers asking
//!   peers to look now;
//! - [`identity`]: who a session runs as (user, group; never root unless
//!   asked for twice);
//! - [`runner`]: what runs a session (a trait, an in-process recorder for
//!   tests, and the exec runner under a dead-man switch), with
//!   [`watchdog`] and [`contain`];
//! - [`journal`]: the node's event journal; [`explain`]: the reason shown
//!   beside a status;
//! - [`control`]: cordon and drain; [`gc`]: garbage collection under the
//!   epoch floor; [`renew_thread`]: renewals on a thread of their own;
//! - [`check`]: health checks (the spec, the rule that folds probe results,
//!   the probes); [`limits`]: memory, cpu and pids limits (the spec; their
//!   enforcement with feature `node`); [`sleep`]: when a session sleeps;
//! - [`channel`]: the session channel (feature `session`: its client, which
//!   a session links to; the server with feature `node`).
//!
//! Without the `node` feature (a service that embeds only the wake path)
//! this module holds the records and the pure rules: manifests, claims,
//! node records, placement, `core`; `node`, `runner`, `watchdog`,
//! `contain` and `renew_thread` come with the feature.

pub mod alarm;
pub mod attrs;
#[cfg(feature = "session")]
pub mod channel;
pub mod check;
pub mod claim;
#[cfg(feature = "node")]
pub mod contain;
pub mod control;
pub mod core;
pub mod cron;
pub mod endpoint;
pub mod explain;
pub mod feed;
pub mod gc;
pub mod identity;
pub mod journal;
pub mod limits;
pub mod manifest;
pub mod marker;
#[cfg(feature = "node")]
pub mod node;
pub mod nudge;
pub(crate) mod opt_duration;
pub mod plan;
#[cfg(feature = "node")]
pub mod renew_thread;
#[cfg(feature = "node")]
pub mod runner;
pub mod sleep;
pub mod status;
pub mod stop_signal;
#[cfg(feature = "node")]
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
/// ambiguous failure reads back and decides by [`crate::checked`]'s rules,
/// recognising our write by the stored nonce, which `nonce_of` extracts.
/// "Not landed" is returned as a transient error.
pub(crate) async fn put_checked(
    store: &Arc<dyn Store>,
    key: &str,
    bytes: Bytes,
    cond: Cond,
    nonce: &str,
    nonce_of: impl Fn(&[u8]) -> Option<String>,
) -> Result<Put> {
    use crate::checked::{self, Failure, Outcome};
    let matched = cond.version().cloned();
    let failure = match store.put(key, bytes, cond).await {
        Ok(v) => return Ok(Put::Committed(v)),
        Err(e) => Failure::of(e).map_err(|e| Error::from_store("put", key, e))?,
    };
    let current = store
        .get(key)
        .await
        .map_err(|e| Error::from_store("get", key, e))?;
    let ours = current
        .as_ref()
        .is_some_and(|o| nonce_of(&o.bytes).as_deref() == Some(nonce));
    let read = checked::read_back(ours, current.as_ref().map(|o| &o.version), matched.as_ref());
    match (checked::outcome(failure, read), current) {
        (Outcome::Committed, Some(o)) => Ok(Put::Committed(o.version)),
        (Outcome::Rejected, current) => Ok(Put::Rejected(current.map(|o| (o.bytes, o.version)))),
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

/// The continuous audit: reads `key` back after a write the store reported
/// committed (`nonce`, `epoch`). Finding another writer's record at the same
/// or a lower epoch means two writers were both told they won: the store
/// does not honour its conditions (a lock-free check, a lost quorum). That
/// is [`Error::Unsupported`] at step "audit"; the node stops serving and the
/// store is refused until `leasehold doctor` passes again. A higher epoch is
/// a legitimate later takeover; an absent or undecodable object is left to
/// the absence and corruption rules.
#[cfg(feature = "node")]
pub(crate) async fn audit(
    store: &Arc<dyn Store>,
    key: &str,
    nonce: &str,
    epoch: u64,
) -> Result<()> {
    // A store whose reads may lag an overwrite gets a second look before
    // it is called a liar.
    if audit_once(store, key, nonce, epoch).await.is_ok() {
        return Ok(());
    }
    audit_once(store, key, nonce, epoch).await
}

#[cfg(feature = "node")]
async fn audit_once(store: &Arc<dyn Store>, key: &str, nonce: &str, epoch: u64) -> Result<()> {
    let Some(o) = store
        .get(key)
        .await
        .map_err(|e| Error::from_store("get", key, e))?
    else {
        return Ok(());
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&o.bytes) else {
        return Ok(());
    };
    let (Some(theirs), Some(their_epoch)) = (
        v.get("nonce").and_then(|n| n.as_str()),
        v.get("epoch").and_then(|e| e.as_u64()),
    ) else {
        return Ok(());
    };
    if theirs != nonce && their_epoch <= epoch {
        return Err(Error::Unsupported {
            store: store.to_string(),
            step: "audit".into(),
            detail: format!(
                "{key}: our conditional write at epoch {epoch} was reported committed, \
                 yet the read-back holds another writer's record at epoch {their_epoch}: \
                 the store let two writers win"
            ),
        });
    }
    Ok(())
}

/// Where the audit's refusal of a store is remembered on this host, until
/// `leasehold doctor` passes on it: `<lock dir>/refused-<hash(identity)>`.
pub fn refusal_marker(lock_dir: &std::path::Path, store_identity: &str) -> std::path::PathBuf {
    lock_dir.join(format!(
        "refused-{:016x}",
        crate::store::local::fnv1a64(store_identity.as_bytes())
    ))
}
