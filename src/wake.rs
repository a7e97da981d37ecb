//! The wake path: find which node owns a session, in one round trip.
//!
//! ```no_run
//! # async fn f() -> leasehold::Result<()> {
//! use leasehold::store::{open_store, OpenOptions};
//! use leasehold::wake::{Resolver, Owned};
//! let store = open_store("s3://my-bucket/fleet-a", &OpenOptions::default()).await?;
//! let resolver = Resolver::new(store);
//! // One GET of sessions/<name>. Repeats are conditional (If-None-Match on
//! // the cached ETag): a 304, no body, when nothing moved.
//! let r = resolver.resolve(&leasehold::Name::new("web")?).await?;
//! if let Owned::Claimed { node, address, epoch, .. } = &r.owner {
//!     println!("web is on {node} at {address:?}, epoch {epoch}");
//! }
//! // wake: resolve, dial the owner; only if that fails, read its node lease
//! // (one more GET) to tell a dead owner from a network problem.
//! let w = resolver.wake(&leasehold::Name::new("web")?, std::time::Duration::from_secs(1)).await?;
//! println!("{:?}", w.outcome);
//! # Ok(()) }
//! ```
//!
//! Round trips: `resolve` 1 (plus 1 to tell "unowned" from "no manifest" when
//! there is no claim); `wake` 1 plus a TCP dial, plus 1 more only when the
//! dial fails.
//!
//! A service that runs a node in-process can let `wake` claim an orphaned
//! session on that node ([`Resolver::with_claimer`]); the claim costs 3 or 4
//! more requests (fresh reads of manifest, claim and owner record; one
//! conditional write) and honours every takeover rule:
//!
//! ```no_run
//! # async fn f(store: std::sync::Arc<dyn leasehold::store::Store>, deps: leasehold::fleet::node::NodeDeps) -> leasehold::Result<()> {
//! use leasehold::fleet::node::{claim_channel, run, NodeConfig};
//! use leasehold::wake::{Resolver, WakeOutcome};
//! let id = leasehold::Name::new("api-1")?;
//! let (handle, inbox) = claim_channel(&id);
//! let deps = leasehold::fleet::node::NodeDeps { claims: Some(inbox), ..deps };
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! tokio::spawn(run(NodeConfig::new(id, std::time::Duration::from_secs(10)), deps, shutdown.clone()));
//! let resolver = Resolver::new(store).with_claimer(handle);
//! let w = resolver.wake(&leasehold::Name::new("web")?, std::time::Duration::from_secs(1)).await?;
//! if let WakeOutcome::ClaimedHere { epoch, .. } = w.outcome {
//!     println!("web now runs here, fencing token {epoch}");
//! }
//! # Ok(()) }
//! ```

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::fleet::claim::{ClaimRecord, ClaimState};
use crate::fleet::endpoint::{ClaimAnswer, NodeHandle};
use crate::name::Name;
use crate::record::{Kind, LeaseRecord};
use crate::store::{Conditional, Store, Version};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod ready;
pub use ready::Ready;

/// Who owns a session, as its claim says. More cases may come (a
/// sleeping session): match with a wildcard arm.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Owned {
    /// A claim names an owner (its liveness is not checked by `resolve`).
    Claimed {
        node: String,
        instance: String,
        /// The owner node's API.
        address: Option<String>,
        /// The session's own address (`host:port`), when its spec names a
        /// port.
        endpoint: Option<String>,
        epoch: u64,
        status: ClaimState,
        /// A checked run's health (`starting`, `unhealthy`), if not passing.
        #[serde(skip_serializing_if = "Option::is_none")]
        health: Option<crate::fleet::check::Health>,
        /// Until when a crash-loop back-off holds the next start (the
        /// owner's wall clock, advisory).
        #[serde(skip_serializing_if = "Option::is_none")]
        backoff_until_ms: Option<u64>,
    },
    /// The claim was released (its tombstone keeps the epoch).
    Released { epoch: u64 },
    /// Asleep (see [`crate::fleet::sleep`]): no owner until a wake; its
    /// next run's epoch is above `epoch`. `since_ms`: when it fell asleep,
    /// by its last owner's wall clock.
    Sleeping { epoch: u64, since_ms: u64 },
    /// No claim, but a manifest: queued, waiting for a node.
    Unowned,
    /// Neither claim nor manifest.
    NoManifest,
}

/// The answer to `resolve`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Resolution {
    pub name: String,
    pub owner: Owned,
    /// Bucket requests this answer cost.
    pub round_trips: u32,
    /// The claim was unchanged since the last resolve (a 304).
    pub not_modified: bool,
}

/// What `wake` found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WakeOutcome {
    /// The owner answered at its address. `status` is the claim's: a
    /// succeeded, failed or paused session has a reachable owner and
    /// nothing running.
    Reachable {
        node: String,
        address: String,
        /// The session's own address, when its spec names a port.
        endpoint: Option<String>,
        epoch: u64,
        status: ClaimState,
    },
    /// The owner did not answer, but its node lease still names the claim's
    /// instance: a network problem or a slow node, not a dead one.
    Unreachable {
        node: String,
        address: Option<String>,
        reason: String,
    },
    /// The owner's node lease is released, names a newer instance, is
    /// missing, or (advisory, by wall clock) has expired: the session is
    /// orphaned and a node will claim it.
    OwnerGone {
        node: String,
        epoch: u64,
        lease: OwnerLease,
    },
    /// Nobody owns it (released, unowned, or no manifest).
    NoOwner { owner: Owned },
    /// The caller's own node (see [`Resolver::with_claimer`]) claimed it.
    ClaimedHere { node: String, epoch: u64 },
    /// It was asleep, and this wake released its claim to be placed (or
    /// found another wake had: `by_us` false): a node claims it at an epoch
    /// above `epoch`. With a claimer attached, the caller's node is asked
    /// first.
    Woken { epoch: u64, by_us: bool },
    /// Not woken, and why (a sleeping session whose manifest is paused).
    Declined { reason: String, owner: Owned },
}

/// The answer to `wake`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Wake {
    pub name: String,
    pub outcome: WakeOutcome,
    /// Includes the claim's requests when the caller's node tried to claim.
    pub round_trips: u32,
    /// What the caller's node answered when asked to claim (absent when no
    /// claimer is attached or the owner answered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimAnswer>,
    /// It was asleep and this call's write released it.
    pub woken: bool,
}

/// Resolves sessions, caching each claim's ETag so repeats are conditional.
#[derive(Debug)]
pub struct Resolver {
    store: Arc<dyn Store>,
    cache: Mutex<HashMap<String, (Version, ClaimRecord)>>,
    claimer: Option<NodeHandle>,
    clock: Arc<dyn Clock>,
    max_skew: Duration,
    cache_capacity: usize,
    /// The fleet's bearer token: with it, a wake of a running session
    /// reaches its owner (`POST /v1/sessions/{name}/touch`), which restarts
    /// the session's idle time; without it, the owner's `GET /healthz`.
    token: Option<Token>,
}

/// A bearer token that never prints.
#[derive(Clone)]
struct Token(Arc<Vec<u8>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How long a wake waits for the caller's node to claim a sleeping session
/// before releasing it for the fleet instead (see `Resolver::wake_here`).
pub const WAKE_NOW_WAIT: Duration = Duration::from_secs(5);

/// Most claims a [`Resolver`] keeps for conditional repeats.
pub const RESOLVER_CACHE_CAPACITY: usize = 100_000;

/// The default wall-clock skew bound (it lives in [`crate::clock`]).
pub use crate::clock::DEFAULT_MAX_SKEW;

impl Resolver {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Resolver {
            store,
            cache: Mutex::new(HashMap::new()),
            claimer: None,
            clock: Arc::new(crate::clock::SystemClock::new()),
            max_skew: DEFAULT_MAX_SKEW,
            cache_capacity: RESOLVER_CACHE_CAPACITY,
            token: None,
        }
    }

    /// Wakes reach the owner with the fleet's bearer token (see the
    /// field): what keeps a session with `sleep.after_idle` awake while
    /// callers wake it.
    pub fn with_token(mut self, token: Vec<u8>) -> Self {
        self.token = Some(Token(Arc::new(token)));
        self
    }

    /// Makes `wake` claim orphaned and unowned sessions on the caller's own
    /// node (one running in this process, from
    /// [`crate::fleet::node::claim_channel`]) instead of only reporting
    /// them. The node applies every takeover rule itself, judging an
    /// unreachable owner's expiry by its own observation; it skips only the
    /// placement grace delay, and declines when it has no free capacity or its
    /// labels do not match.
    pub fn with_claimer(mut self, node: NodeHandle) -> Self {
        self.claimer = Some(node);
        self
    }

    /// One GET of `sessions/<name>` (conditional when cached).
    #[tracing::instrument(level = "debug", name = "resolve", skip_all, fields(name = %name))]
    pub async fn resolve(&self, name: &Name) -> Result<Resolution> {
        let key = crate::keys::session(name);
        let cached = self.cache.lock().unwrap().get(&key).cloned();
        let mut round_trips = 1;
        let (claim, not_modified) = match &cached {
            Some((v, c)) => match self
                .store
                .get_if_changed(&key, v)
                .await
                .map_err(|e| Error::from_store("get", &key, e))?
            {
                Conditional::NotModified => (Some(c.clone()), true),
                Conditional::Changed(o) => {
                    let c = ClaimRecord::decode(&key, &o.bytes)?;
                    self.remember(&key, o.version, &c);
                    (Some(c), false)
                }
                Conditional::Missing => {
                    self.cache.lock().unwrap().remove(&key);
                    (None, false)
                }
            },
            None => match crate::fleet::claim::get(&self.store, name.as_str()).await? {
                Some((c, version)) => {
                    self.remember(&key, version, &c);
                    (Some(c), false)
                }
                None => (None, false),
            },
        };
        let owner = match claim {
            // Applied, never claimed: queued (or its manifest is gone since).
            Some(c) if c.is_placeholder() => {
                round_trips += 1;
                match crate::fleet::manifest::get(&self.store, name).await? {
                    Some(_) => Owned::Unowned,
                    None => Owned::NoManifest,
                }
            }
            Some(c) if c.state == ClaimState::Released => Owned::Released { epoch: c.epoch },
            Some(c) if c.state == ClaimState::Sleeping => Owned::Sleeping {
                epoch: c.epoch,
                since_ms: c.updated_at_ms,
            },
            Some(c) => Owned::Claimed {
                node: c.owner.node,
                instance: c.owner.instance,
                address: c.address,
                endpoint: c.endpoint,
                epoch: c.epoch,
                status: c.state,
                health: c.health,
                backoff_until_ms: c.backoff_until_ms,
            },
            None => {
                round_trips += 1;
                match crate::fleet::manifest::get(&self.store, name).await? {
                    Some(_) => Owned::Unowned,
                    None => Owned::NoManifest,
                }
            }
        };
        Ok(Resolution {
            name: name.to_string(),
            owner,
            round_trips,
            not_modified,
        })
    }

    /// Reads the owner's node lease (one GET) and says whether `instance`
    /// still holds it. A one-shot reader cannot judge expiry by observation;
    /// it sees a release or a newer instance for certain, and an expiry only
    /// by wall clock within the resolver's skew bound
    /// ([`Resolver::with_max_skew`], 5 s by default): see
    /// [`LeaseRecord::expired_by_wall_clock`].
    pub async fn owner_lease(&self, node: &str, instance: &str) -> Result<OwnerLease> {
        let key = crate::keys::node(node);
        match self
            .store
            .get(&key)
            .await
            .map_err(|e| Error::from_store("get", &key, e))?
        {
            None => Ok(OwnerLease::Absent),
            Some(o) => {
                let r = LeaseRecord::decode(&key, &o.bytes, Kind::Node)?;
                Ok(owner_lease_of(
                    &r,
                    instance,
                    self.clock.wall_ms(),
                    self.max_skew,
                ))
            }
        }
    }

    /// `owner_lease(..) == Live`.
    pub async fn owner_alive(&self, node: &str, instance: &str) -> Result<bool> {
        Ok(self.owner_lease(node, instance).await? == OwnerLease::Live)
    }

    /// Caches a claim's version for conditional repeats. The cache is bounded
    /// ([`RESOLVER_CACHE_CAPACITY`] keys by default): a long-lived resolver over many
    /// sessions must not grow without end. When full, an arbitrary entry goes;
    /// its next resolve is a plain GET instead of a conditional one.
    fn remember(&self, key: &str, version: Version, claim: &ClaimRecord) {
        let mut cache = self.cache.lock().unwrap();
        if cache.len() >= self.cache_capacity.max(1)
            && !cache.contains_key(key)
            && let Some(victim) = cache.keys().next().cloned()
        {
            cache.remove(&victim);
        }
        cache.insert(key.to_string(), (version, claim.clone()));
    }

    /// Bounds the conditional-repeat cache to `keys` claims.
    pub fn with_cache_capacity(mut self, keys: usize) -> Self {
        self.cache_capacity = keys;
        self
    }

    /// Sets the wall-clock skew bound for [`Resolver::owner_lease`].
    pub fn with_max_skew(mut self, max_skew: Duration) -> Self {
        self.max_skew = max_skew;
        self
    }

    /// Replaces the wall clock used only for the advisory expiry judgement.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Resolves, dials the owner's address (a TCP connect with `timeout`),
    /// and only if that fails reads the owner's node lease.
    #[tracing::instrument(level = "debug", name = "wake", skip_all, fields(name = %name))]
    pub async fn wake(&self, name: &Name, timeout: Duration) -> Result<Wake> {
        let r = self.resolve(name).await?;
        let mut round_trips = r.round_trips;
        // What the caller's node answered when asked to take it asleep, and
        // whether it did.
        let (mut asked, mut woke_here) = (None, false);
        let outcome = match r.owner {
            Owned::Claimed {
                node,
                instance,
                address,
                endpoint,
                epoch,
                status,
                ..
            } => {
                let dialled = match &address {
                    Some(a) => {
                        dial(
                            a,
                            name,
                            self.token.as_ref().map(|t| t.0.as_slice()),
                            timeout,
                        )
                        .await
                    }
                    None => Err("no address published".to_string()),
                };
                match dialled {
                    Ok(()) => WakeOutcome::Reachable {
                        node,
                        address: address.unwrap_or_default(),
                        endpoint,
                        epoch,
                        status,
                    },
                    Err(reason) => {
                        round_trips += 1;
                        match self.owner_lease(&node, &instance).await? {
                            OwnerLease::Live => WakeOutcome::Unreachable {
                                node,
                                address,
                                reason,
                            },
                            lease => WakeOutcome::OwnerGone { node, epoch, lease },
                        }
                    }
                }
            }
            Owned::Sleeping { epoch, since_ms } => {
                // The caller's node takes it over in one write (or runs it
                // already); else it is released for the fleet to place.
                asked = self.wake_here(name).await?;
                let here = match &asked {
                    Some(ClaimAnswer::Claimed {
                        node,
                        epoch,
                        round_trips: n,
                    }) => {
                        round_trips += n;
                        woke_here = true;
                        Some((node.clone(), *epoch))
                    }
                    Some(ClaimAnswer::AlreadyOwned { node, epoch }) => Some((node.clone(), *epoch)),
                    Some(ClaimAnswer::Declined { .. }) | None => None,
                };
                match here {
                    Some((node, epoch)) => WakeOutcome::ClaimedHere { node, epoch },
                    None => {
                        self.release_or_decline(name, epoch, since_ms, &mut round_trips)
                            .await?
                    }
                }
            }
            other => WakeOutcome::NoOwner { owner: other },
        };
        let wants_claim = match &outcome {
            WakeOutcome::Reachable { .. }
            | WakeOutcome::ClaimedHere { .. }
            | WakeOutcome::Declined { .. } => false,
            WakeOutcome::NoOwner { owner } => !matches!(owner, Owned::NoManifest),
            WakeOutcome::Unreachable { .. } | WakeOutcome::OwnerGone { .. } => true,
            // Released by this call after the caller's node declined to
            // take it asleep: asked once is enough; the fleet places it.
            // Released by another: the caller's node may take the release.
            WakeOutcome::Woken { by_us, .. } => !(*by_us && asked.is_some()),
        };
        let mut claim = asked;
        let woken = woke_here || matches!(outcome, WakeOutcome::Woken { by_us: true, .. });
        let mut outcome = outcome;
        if let (true, Some(node)) = (wants_claim, &self.claimer) {
            // A failed claim leaves the outcome as found (a release this
            // call wrote stands: the fleet places it).
            let answer = match node.claim_now(name).await {
                Ok(a) => a,
                Err(e) => ClaimAnswer::Declined {
                    node: node.node().to_string(),
                    reason: format!("the claim failed: {e}"),
                },
            };
            match &answer {
                ClaimAnswer::Claimed {
                    node,
                    epoch,
                    round_trips: n,
                } => {
                    round_trips += n;
                    outcome = WakeOutcome::ClaimedHere {
                        node: node.clone(),
                        epoch: *epoch,
                    };
                }
                ClaimAnswer::AlreadyOwned { node, epoch } => {
                    outcome = WakeOutcome::ClaimedHere {
                        node: node.clone(),
                        epoch: *epoch,
                    };
                }
                ClaimAnswer::Declined { .. } => {}
            }
            claim = Some(answer);
        }
        Ok(Wake {
            name: name.to_string(),
            outcome,
            round_trips,
            claim,
            woken,
        })
    }

    /// With a node of the caller's own ([`Resolver::with_claimer`]), asks
    /// it to claim `name` asleep, over the claim and version the resolve
    /// just read: one conditional write, no read (`NodeHandle::wake_now`).
    /// `None` without a claimer, when the cache no longer holds a sleeping
    /// claim, and when the node failed or did not answer within
    /// [`WAKE_NOW_WAIT`] (it answers between passes): the caller then
    /// releases the claim for the fleet, and a late claim by the node and
    /// that release are both If-Match on the version read, so at most one
    /// lands.
    async fn wake_here(&self, name: &Name) -> Result<Option<ClaimAnswer>> {
        let Some(node) = &self.claimer else {
            return Ok(None);
        };
        let key = crate::keys::session(name);
        let Some((version, claim)) = self.cache.lock().unwrap().get(&key).cloned() else {
            return Ok(None);
        };
        if claim.state != ClaimState::Sleeping {
            return Ok(None);
        }
        tokio::select! {
            a = node.wake_now(name, version, claim) => match a {
                Ok(a) => Ok(Some(a)),
                Err(e) => {
                    tracing::warn!(session = %name, error = %crate::error::Chain(&e), "the caller's node could not claim it; releasing it for the fleet");
                    Ok(None)
                }
            },
            _ = self.clock.sleep(WAKE_NOW_WAIT) => Ok(None),
        }
    }

    /// A sleeping session, not taken by the caller's node: released for
    /// the fleet to place, if its manifest lets it run (one GET of the
    /// manifest, one conditional write); no write for one whose manifest is
    /// gone or paused.
    async fn release_or_decline(
        &self,
        name: &Name,
        epoch: u64,
        since_ms: u64,
        round_trips: &mut u32,
    ) -> Result<WakeOutcome> {
        *round_trips += 1;
        Ok(
            match crate::fleet::manifest::get(&self.store, name).await? {
                None => WakeOutcome::NoOwner {
                    owner: Owned::NoManifest,
                },
                Some((m, _)) if m.spec.paused => WakeOutcome::Declined {
                    reason: "paused by its manifest: resume it to wake it".into(),
                    owner: Owned::Sleeping { epoch, since_ms },
                },
                Some(_) => {
                    *round_trips += 1;
                    let by_us = self.release_sleeping(name).await?;
                    WakeOutcome::Woken { epoch, by_us }
                }
            },
        )
    }
}

impl Resolver {
    /// A wake request for a sleeping session: its claim written `released`
    /// (one conditional write on the version just read, epoch kept), so a
    /// node claims it, above its epoch. True if this call wrote it; false
    /// if another wake (or anything else) changed the claim first: N
    /// concurrent wakes write once, and start one run.
    async fn release_sleeping(&self, name: &Name) -> Result<bool> {
        use crate::clock::Entropy as _;
        let key = crate::keys::session(name);
        let Some((version, claim)) = self.cache.lock().unwrap().get(&key).cloned() else {
            return Ok(false);
        };
        if claim.state != ClaimState::Sleeping {
            return Ok(false);
        }
        let released = crate::fleet::claim::release_sleeping(
            &self.store,
            name.as_str(),
            claim,
            version,
            self.clock.wall_ms(),
            crate::clock::OsEntropy::new().hex_id(),
        )
        .await?;
        Ok(released.is_some())
    }
}

/// How a one-shot reader sees a claim owner's node lease: the one liveness
/// vocabulary ([`crate::liveness`]), judged by wall clock within the skew
/// bound (advisory: a peer takes over only once it has *observed* expiry).
pub type OwnerLease = crate::liveness::Liveness;

/// Classifies an owner's node record for a one-shot reader.
pub fn owner_lease_of(
    r: &LeaseRecord,
    instance: &str,
    now_wall_ms: u64,
    max_skew: Duration,
) -> OwnerLease {
    crate::liveness::judge(
        Some(r),
        Some(instance),
        crate::liveness::Evidence::WallClock {
            now_ms: now_wall_ms,
            max_skew,
        },
    )
}

/// The owner's API must answer within `timeout` (`http://host:port[/...]`
/// or `host:port`): with the fleet's token, `POST
/// /v1/sessions/{name}/touch` (which also restarts the session's idle
/// time), else `GET /healthz`. A TCP connect alone is not enough: the
/// kernel accepts connections for a stopped process, so a frozen node
/// would look reachable; an answer needs the node running.
async fn dial(
    address: &str,
    name: &Name,
    token: Option<&[u8]>,
    timeout: Duration,
) -> Result<(), String> {
    let rest = address
        .strip_prefix("http://")
        .or_else(|| address.strip_prefix("https://"))
        .unwrap_or(address);
    let hostport = rest.split('/').next().unwrap_or(rest);
    let client = reqwest::Client::builder()
        .connect_timeout(timeout)
        .timeout(timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let request = match token {
        Some(t) => client
            .post(format!("http://{hostport}/v1/sessions/{name}/touch"))
            .bearer_auth(String::from_utf8_lossy(t)),
        None => client.get(format!("http://{hostport}/healthz")),
    };
    match request.send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("{hostport} answered HTTP {}", r.status().as_u16())),
        Err(e) if e.is_timeout() => Err(format!("{hostport} did not answer within {timeout:?}")),
        Err(_) => Err(format!("{hostport} did not answer (connection failed)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Cond, ObjectStoreBackend};

    #[tokio::test]
    async fn the_conditional_cache_is_bounded() {
        let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
        for n in ["a", "b", "c"] {
            let mut c = crate::fleet::claim::tests::sample_claim();
            c.nonce = n.into();
            store
                .put(&crate::keys::session(n), c.encode().into(), Cond::Create)
                .await
                .unwrap();
        }
        let r = Resolver::new(store).with_cache_capacity(2);
        let name = |n: &str| Name::new(n).unwrap();
        for n in ["a", "b", "c"] {
            assert!(!r.resolve(&name(n)).await.unwrap().not_modified);
        }
        assert_eq!(r.cache.lock().unwrap().len(), 2, "bounded");
        // The newest stays cached: a repeat is a 304.
        assert!(r.resolve(&name("c")).await.unwrap().not_modified);
        // One of the first two was evicted: its repeat is a plain GET.
        let a = r.resolve(&name("a")).await.unwrap().not_modified;
        let b = r.resolve(&name("b")).await.unwrap().not_modified;
        assert!(!(a && b), "one of a, b was evicted");
    }
}
