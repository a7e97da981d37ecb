//! The node: registers `nodes/<id>`, renews it, and runs the pull loop.
//!
//! [`run`] is the whole node, in the manner of mini-redis: it returns when
//! `shutdown` is cancelled, after stopping its sessions, releasing their
//! claims and releasing its node lease, so peers take over at once.
//!
//! Safety rests on two rules:
//! - a session claim is live only while its owner's node lease is live with
//!   the same instance, so a session may run only until this node's lease
//!   validity deadline; the runner enforces that deadline on its own (the
//!   watchdog kills at it), and the deadline moves only after a successful
//!   renew;
//! - a peer takes a claim over only once it has seen the owner's node lease
//!   unchanged for ttl + margin, or released, or superseded by a newer
//!   instance: by then the owner's validity has ended.

use super::attrs::NodeAttrs;
use super::claim::{ClaimRecord, ClaimState, Owner};
use super::core::{self, OwnClaim, OwnManifest, OwnedAction};
use super::journal::{EventKind, Journal};
use super::manifest::{ManifestRecord, Restart, Spec};
use super::plan::{self, ClaimView, ManifestView, NodeView};
use super::runner::{Exit, Runner, SessionStart};
use super::{Put, audit, json_nonce, put_checked};
use crate::clock::{Clock, Entropy, MonoTime};
use crate::error::{Error, Result};
use crate::hostlock::HostLock;
use crate::lease::{Acquire, AcquireOptions, Lease, LeaseClient, default_margin};
use crate::liveness::Liveness;
use crate::name::Name;
use crate::record::{Kind, LeaseRecord, SCHEMA};
use crate::store::{Cond, Conditional, Entry, Store, Version};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use cached::{Cached, Tracked};
use next_pass::{NextPass, Why};

mod absence;
mod alarms;
mod cached;
mod checks;
mod claim_now;
mod claim_write;
mod claiming;
mod config;
mod exits;
mod fence;
mod handover;
mod invariants;
mod listing;
mod next_pass;
mod owned;
mod pace;
mod pass;
mod peers;
mod publish;
mod renew;
mod ring_watch;
mod schedules;
mod serve;
mod sleep;
mod state;
mod validity;
mod wake_now;

pub use super::endpoint::{ClaimAnswer, ClaimInbox, NodeHandle, claim_channel};
use super::endpoint::{ClaimRequest, recv};
pub use super::status::{
    NodeStatus, RENEW_BUCKETS, Readiness, RenewHistogram, SessionStatus, StatusSnapshot,
};
use claim_write::*;
use claiming::*;
pub use config::{DEFAULT_FULL_EVERY_OBJECTS, NODES_EVERY_TTLS, NodeConfig, NodeDeps};
use listing::*;
pub use owned::manifest_view;
use renew::*;
use state::*;
pub use state::{AUDIT_SAMPLE, MARKER_EVERY};

/// The least time between two passes however often the node is nudged.
pub const NUDGE_MIN_GAP: Duration = Duration::from_millis(200);

/// Runs a node until `shutdown` is cancelled.
pub async fn run(cfg: NodeConfig, deps: NodeDeps, shutdown: CancellationToken) -> Result<()> {
    if cfg.capacity == 0 {
        return Err(Error::invalid("capacity", "must be at least 1"));
    }
    if cfg.probe {
        // A store not reachable yet at start (a network still coming up, a
        // throttled burst) is probed again with back-off, as the marker is
        // read below; a refusal (the store ignores conditions) or any other
        // definite answer still stops the node.
        let mut delays = backon::BackoffBuilder::build(
            backon::ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(500))
                .with_max_delay(Duration::from_secs(30))
                .without_max_times(),
        );
        loop {
            // A shutdown is not kept waiting by a request that hangs.
            let probed = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return Ok(()),
                r = crate::probe::probe(&deps.store, deps.entropy.as_ref(), deps.clock.as_ref()) => r,
            };
            match probed {
                Err(e) if e.is_transient() => {
                    // Up to half again, from the node's entropy (seeded in
                    // the simulations): a fleet restarted during an outage
                    // does not probe in step.
                    let base = delays.next().unwrap_or(Duration::from_secs(30));
                    let wait = base + base.mul_f64((deps.entropy.next_u64() % 500) as f64 / 1000.0);
                    tracing::warn!(error = %crate::error::Chain(&e), cause = crate::error::cause_of(&e).unwrap_or("-"), retry_in = ?wait, "probing the store; trying again");
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = deps.clock.sleep(wait) => {}
                    }
                }
                other => break other.map(|_| ())?,
            }
        }
    }
    // No marker, no service: a bucket without one is new (init it) or wiped.
    // A transient failure to read it is retried, as registration is.
    let marker = loop {
        match super::marker::require(&deps.store).await {
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %crate::error::Chain(&e), "reading the fleet marker");
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = deps.clock.sleep(cfg.poll) => {}
                }
            }
            other => break other?,
        }
    };
    let base = super::marker::epoch_base(marker.0.generation);
    // What this process has observed outlives each registration: a node
    // that re-registers must not forget that a claim existed.
    let mut memory = Memory::default();
    loop {
        // One registration: a fresh instance id every time. Above gc's
        // epoch floor, should gc have removed this node's old record.
        let floor = loop {
            match super::gc::floor(&deps.store).await {
                Err(e) if e.is_transient() => {
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = deps.clock.sleep(cfg.poll) => {}
                    }
                }
                other => break other?,
            }
        };
        let mut builder = LeaseClient::builder(deps.store.clone(), cfg.id.clone())
            .clock(deps.clock.clone())
            .entropy(deps.entropy.clone())
            .epoch_base(base.max(floor));
        if let Some(l) = &deps.host_lock {
            builder = builder.host_lock(l.clone());
        }
        let client = builder.build()?;
        let Some(lease) = register(&cfg, &deps, &client, &shutdown).await? else {
            return Ok(()); // shut down while waiting
        };
        let mut node = Node::new(cfg.clone(), deps.clone(), client, marker.clone(), memory);
        let ended = node.serve(lease, &shutdown).await;
        memory = node.take_memory();
        match ended? {
            Ended::Shutdown => return Ok(()),
            Ended::Fatal(e) => return Err(e),
            Ended::LeaseLost => {
                // A lost lease may be a wiped bucket: never register into one.
                let checked = super::marker::check(&deps.store, &marker.0, &marker.1).await;
                let seen = match &checked {
                    Ok(()) => core::MarkerSeen::Same,
                    Err(e) if marker_gone(e) => core::MarkerSeen::WipedOrReplaced,
                    Err(_) => core::MarkerSeen::Unreadable,
                };
                if !core::reregister_after_loss(seen)
                    && let Err(e) = checked
                {
                    deps.journal.record(
                        deps.clock.wall_ms(),
                        EventKind::BucketWiped,
                        None,
                        None,
                        e.to_string(),
                    );
                    return Err(e);
                }
                deps.journal.record(
                    deps.clock.wall_ms(),
                    EventKind::ReRegistering,
                    None,
                    None,
                    "node lease lost",
                );
            }
        }
    }
}

/// The fleet marker vanished or changed: the bucket was wiped or replaced.
fn marker_gone(e: &Error) -> bool {
    matches!(e, Error::Corrupt { key, .. } if key == super::marker::KEY)
}

/// The node record's attributes; `full_every` is the anti-entropy interval
/// to publish (`Node::full_every`, grown with the fleet).
fn node_attrs(
    cfg: &NodeConfig,
    full_every: Duration,
    load: u32,
    cordoned: bool,
    unproven: bool,
) -> serde_json::Map<String, serde_json::Value> {
    NodeAttrs {
        capacity: cfg.capacity,
        load,
        max_poll_ms: u64::try_from(cfg.max_poll.max(full_every).as_millis()).unwrap_or(u64::MAX),
        cordoned,
        labels: cfg.labels.clone(),
        released_by: None,
        unproven,
        proto: super::attrs::PROTO_LEVEL,
    }
    .to_map()
}

/// Acquires `nodes/<id>`. Without the host lock, a live earlier instance
/// (or a node of the same id elsewhere) is waited out by observation.
async fn register(
    cfg: &NodeConfig,
    deps: &NodeDeps,
    client: &LeaseClient,
    shutdown: &CancellationToken,
) -> Result<Option<Lease>> {
    let mut opts = AcquireOptions::ttl(cfg.ttl);
    opts.address = cfg.address.clone();
    // Unproven until the first renewal says otherwise: the registration
    // may create the record where an operator deleted a live instance's.
    opts.attrs = node_attrs(cfg, cfg.full_every, 0, deps.status.cordoned(), true);
    // The holder last warned of: a wait is said once per holder (at every
    // retry, a few a second, it drowned the log), then at debug level.
    let mut warned: Option<crate::record::Holder> = None;
    loop {
        let answer = client.acquire_kind(Kind::Node, &cfg.id, &opts).await;
        let seen = match &answer {
            Ok(Acquire::Acquired(_)) => core::Registration::Acquired,
            Ok(Acquire::Held { holder, .. }) => {
                if warned.as_ref() != Some(holder) {
                    tracing::warn!(node = %cfg.id, holder = %holder, "node id held by another instance; waiting");
                    warned = Some(holder.clone());
                } else {
                    tracing::debug!(node = %cfg.id, "node id still held; waiting");
                }
                core::Registration::Held
            }
            // Node leases are created where none is (acquire_kind's node
            // path); this answer is for standalone leases.
            Ok(Acquire::Absent { .. }) => {
                tracing::warn!(node = %cfg.id, "node record absent; waiting");
                core::Registration::Absent
            }
            Err(e) if e.is_transient() => core::Registration::Transient,
            Err(e) if e.kind() == crate::ErrorKind::Conflict => core::Registration::Conflict,
            Err(_) => core::Registration::Failed,
        };
        match (core::after_register(seen), answer) {
            (core::AfterRegister::Serve, Ok(Acquire::Acquired(l))) => {
                deps.journal.record(
                    deps.clock.wall_ms(),
                    EventKind::Registered,
                    None,
                    Some(l.epoch()),
                    format!("instance {}", client.holder().instance),
                );
                return Ok(Some(l));
            }
            (core::AfterRegister::Fail, Err(e)) => return Err(e),
            (_, Err(e)) => {
                tracing::warn!(node = %cfg.id, error = %crate::error::Chain(&e), "registering")
            }
            _ => {}
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => return Ok(None),
            _ = deps.clock.sleep(cfg.poll) => {}
        }
    }
}

struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
