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
use super::manifest::{ManifestRecord, RestartPolicy, Spec};
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

/// The daemon's `--full-every-objects`: a full listing every `full_every`
/// (10 minutes at ttl 10 s) for each 20,000 listed objects, that is 10,000
/// sessions (a manifest and a claim each). Up to that size a node lists
/// everything as often as before; at 100,000 sessions, every 100 minutes.
pub const DEFAULT_FULL_EVERY_OBJECTS: u64 = 20_000;

/// `NodeConfig::nodes_every`'s default, in ttls: a minute at ttl 10 s.
/// Light passes then list `nodes/` six times a minute less: 300 list pages
/// per node-hour at the defaults, $1.10 a node-month on S3 (issue #14).
pub const NODES_EVERY_TTLS: u32 = 6;

/// How a node behaves.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub id: Name,
    /// Most sessions this node runs at once.
    pub capacity: u32,
    pub labels: BTreeMap<String, String>,
    /// Published in the node lease and in claims.
    pub address: Option<String>,
    /// Node lease TTL. Sessions move about ttl + margin + one poll after a
    /// node dies.
    pub ttl: Duration,
    /// Listing interval when things change; an idle fleet backs off to
    /// `max_poll`.
    pub poll: Duration,
    /// Published in the node lease (`max_poll_ms`): the node's belief in its
    /// claims is renewed by its listings, and peers wait for a vanished
    /// claim accordingly (see `Node::confirmed_until`).
    pub max_poll: Duration,
    /// The anti-entropy interval: at most this long between two passes
    /// that list all of `manifests/` and `sessions/`. Passes in between are
    /// light: they list `nodes/` and the change feed from its cursor (see
    /// [`super::feed`]) and read only the keys hints name, so their cost
    /// does not grow with the number of sessions. The node's belief in its
    /// claims comes only from full listings, so a peer waits for one of its
    /// vanished claims for the longer of this and `max_poll` (published as
    /// `max_poll_ms`). At or below `max_poll` every pass is full and the
    /// feed is not read: the library's default is zero, since a library
    /// user's writers may not hint (the daemon's is 60 ttls).
    pub full_every: Duration,
    /// The fleet size `full_every` is for, in listed objects (manifests and
    /// claims): a node whose full listing counted more lists everything
    /// once every `full_every` per this many (`core::full_listing_pace`),
    /// so the anti-entropy listing's cost per hour does not grow with the
    /// fleet (issue #14). Zero: every `full_every`, whatever the fleet
    /// (the library's default; the daemon's is
    /// [`DEFAULT_FULL_EVERY_OBJECTS`]). Only with the feed on. The longer
    /// interval is published before it is used, and peers read it before
    /// they make a vanished claim again; what it costs is that wait.
    pub full_every_objects: u64,
    /// Placement delay per rank: the node ranked r waits r × grace. Keep it
    /// above `poll`, or rank 1 races rank 0.
    pub grace: Duration,
    /// With the feed on, how long a light pass may go without listing
    /// `nodes/` (`core::nodes_listing_due`). Peers' liveness does not need
    /// it often: the ring watch reads the two successors' records as they
    /// renew, the first node to judge one holding sessions dead fences it
    /// and hints the tombstone (the ring re-forms around fenced peers, so a
    /// death its watchers shared is watched next), and a peer's news
    /// (cordon, the unproven mark, a first registration, a release at
    /// shutdown) is hinted by the peer. What is left to this listing: a
    /// dead peer that held no sessions (nobody fences it; placement ranks
    /// it, so a new session it ranks first waits one grace at the next
    /// node), a peer whose hint was lost, a peer that recovered after being
    /// judged dead: at most about twice this late. A pass lists `nodes/`
    /// anyway when the watch or the bell woke it, when nudged, when a hint
    /// names a peer it does not know, while a peer is about to expire or
    /// marked unproven and not yet still, after a fence that found its
    /// owner renewed or gone, after a pause too brisk to watch, after a
    /// failed pass, and on every full pass. Default [`NODES_EVERY_TTLS`]
    /// ttls.
    pub nodes_every: Duration,
    /// Run the conditional-write probe before serving.
    pub probe: bool,
    /// How stale a peer's node record (capacity, load, labels, instance) may
    /// get before it is read again. Liveness never waits for this: it comes
    /// from the listed version, by observation.
    pub node_refresh: Duration,
}

impl NodeConfig {
    /// How often a peer's record is read for its attributes when its
    /// version changes as usual (`node_refresh`). With the feed on, nodes
    /// hint their own attribute changes (cordon, the unproven mark), so the
    /// periodic read is only the anti-entropy for a lost hint: every
    /// `full_every`. Liveness never waits for it (it is judged on listed
    /// versions), and a stale mark or cordon only delays placement.
    pub fn peer_refresh(&self) -> Duration {
        if self.feed_on() {
            self.node_refresh.max(self.full_every)
        } else {
            self.node_refresh
        }
    }

    /// Are passes between full listings light (the change feed on)?
    pub fn feed_on(&self) -> bool {
        self.full_every > self.max_poll
    }

    pub fn new(id: Name, ttl: Duration) -> Self {
        NodeConfig {
            id,
            capacity: 16,
            labels: BTreeMap::new(),
            address: None,
            ttl,
            poll: ttl / 3,
            max_poll: ttl,
            // Every pass full, the feed off, whatever `max_poll` is set to
            // (a library user's writers may not hint).
            full_every: Duration::ZERO,
            full_every_objects: 0,
            // More than one poll: the top-ranked node must get a full tick
            // (listing included) to claim before rank 1 tries. At grace =
            // poll, 21 nodes measured 0.07 conflicts per claim.
            grace: ttl * 2 / 3,
            probe: true,
            node_refresh: ttl * 3,
            nodes_every: ttl * NODES_EVERY_TTLS,
        }
    }
}

/// What the node publishes about itself for its HTTP API and tests: a
/// snapshot replaced at the end of every tick, so readers never touch the
/// pull loop's state; and a histogram of renew latencies.
#[derive(Debug, Default)]
pub struct NodeStatus {
    inner: std::sync::RwLock<StatusSnapshot>,
    /// Snapshots set so far: a publisher that knows the count its own
    /// snapshot stood at knows whether anyone replaced it since.
    sets: std::sync::atomic::AtomicU64,
    renew: std::sync::Mutex<RenewHistogram>,
    live: std::sync::Mutex<ReadinessInputs>,
    corrupt: std::sync::Mutex<Vec<String>>,
    /// Published in the node record (`cordoned`): this node takes no new
    /// sessions (`leasehold node cordon`).
    cordoned: std::sync::atomic::AtomicBool,
    /// Set by a nudge (`POST /v1/nudge`): the next pass comes at once and
    /// re-reads this node's control object.
    nudged: std::sync::atomic::AtomicBool,
    nudge: tokio::sync::Notify,
}

/// What readiness is computed from, at the moment it is asked: never a
/// stored flag, which a hung pull loop would leave saying "ready".
#[derive(Debug, Default)]
struct ReadinessInputs {
    clock: Option<Arc<dyn Clock>>,
    /// The node lease's validity as the renew task last extended it.
    valid_until: Option<MonoTime>,
    /// When the pull loop last completed a pass, and how old that may get.
    last_pass: Option<MonoTime>,
    pass_bound: Duration,
}

/// The answer to [`NodeStatus::readiness`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    /// Why not, when not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Upper bounds of the renew-latency buckets, in seconds (Prometheus style).
pub const RENEW_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// Adds one observation to a histogram over [`RENEW_BUCKETS`].
fn bucket(buckets: &mut [u64; 10], count: &mut u64, sum: &mut f64, d: Duration) {
    let secs = d.as_secs_f64();
    if let Some(i) = RENEW_BUCKETS.iter().position(|b| secs <= *b) {
        buckets[i] += 1;
    }
    *count += 1;
    *sum += secs;
}

/// Cumulative renew-latency histogram.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RenewHistogram {
    /// Counts per bucket of [`RENEW_BUCKETS`] (not cumulative).
    pub buckets: [u64; 10],
    pub count: u64,
    pub sum_seconds: f64,
    pub failures: u64,
    /// How late after it was due (its timer's end) each renewal started,
    /// in the same buckets: a renew task starved of its thread by long
    /// synchronous work shows here before it shows as a lost lease.
    pub late_buckets: [u64; 10],
    pub late_count: u64,
    pub late_sum_seconds: f64,
    /// The longest of them since the process started (for the spike).
    pub max_late_seconds: f64,
}

/// See [`NodeStatus`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StatusSnapshot {
    pub node: String,
    /// Empty until registered.
    pub instance: String,
    /// Registered and within the node lease's validity at the last tick.
    pub ready: bool,
    pub sessions: Vec<SessionStatus>,
}

/// One owned session as the node sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionStatus {
    pub name: String,
    pub epoch: u64,
    pub state: ClaimState,
    pub running: bool,
    pub restarts: u32,
}

impl NodeStatus {
    /// Asks the pull loop for a pass now (best effort; at most one pass per
    /// [`NUDGE_MIN_GAP`] however often it is asked), which also re-reads the
    /// node's control object. The bucket stays the truth: a nudge only
    /// makes the node look sooner.
    pub fn nudge(&self) {
        self.nudged.store(true, std::sync::atomic::Ordering::SeqCst);
        self.nudge.notify_one();
    }

    /// Whether a nudge is waiting for the next pass (which clears it).
    pub fn nudge_pending(&self) -> bool {
        self.nudged.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether this node is cordoned (takes no new sessions).
    pub fn cordoned(&self) -> bool {
        self.cordoned.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many sessions the last published snapshot shows running: what a
    /// sampler asks often, without copying the snapshot (one entry per
    /// owned session).
    pub fn running_count(&self) -> usize {
        self.inner
            .read()
            .unwrap()
            .sessions
            .iter()
            .filter(|s| s.running)
            .count()
    }

    /// The last published snapshot, with `ready` computed now.
    pub fn snapshot(&self) -> StatusSnapshot {
        let mut s = self.inner.read().unwrap().clone();
        s.ready = self.readiness().ready;
        s
    }

    /// Ready means: registered, within the node lease's validity as of now,
    /// and a pass of the pull loop completed within its bound (a loop stuck
    /// on a store call or a session is not ready, whatever it last said).
    pub fn readiness(&self) -> Readiness {
        let l = self.live.lock().unwrap();
        let not = |r: &str| Readiness {
            ready: false,
            reason: Some(r.to_string()),
        };
        let (Some(clock), Some(until), Some(pass)) = (&l.clock, l.valid_until, l.last_pass) else {
            return not("not registered");
        };
        let now = clock.now();
        if now >= until {
            return not("the node lease's validity has passed");
        }
        let age = now.saturating_since(pass);
        if age > l.pass_bound {
            return not(&format!(
                "the last pass of the pull loop completed {} ago (bound {})",
                humantime::format_duration(Duration::from_millis(age.as_millis() as u64)),
                humantime::format_duration(l.pass_bound)
            ));
        }
        Readiness {
            ready: true,
            reason: None,
        }
    }

    /// The renew task: the node lease is valid until `until` (None: lost,
    /// released or not yet registered).
    pub fn set_valid_until(&self, clock: &Arc<dyn Clock>, until: Option<MonoTime>) {
        let mut l = self.live.lock().unwrap();
        l.clock = Some(clock.clone());
        l.valid_until = until;
    }

    /// Keys the pull loop skips as corrupt or foreign (for `/metrics`).
    pub fn set_corrupt(&self, mut keys: Vec<String>) {
        keys.sort();
        *self.corrupt.lock().unwrap() = keys;
    }

    pub fn corrupt(&self) -> Vec<String> {
        self.corrupt.lock().unwrap().clone()
    }

    /// The pull loop completed a pass at `at`; the next is due within `bound`.
    pub fn pass_completed(&self, at: MonoTime, bound: Duration) {
        let mut l = self.live.lock().unwrap();
        l.last_pass = Some(at);
        l.pass_bound = bound;
    }

    /// Records one successful renew's latency (send to response).
    pub fn record_renew(&self, latency: Duration) {
        let h = &mut *self.renew.lock().unwrap();
        bucket(&mut h.buckets, &mut h.count, &mut h.sum_seconds, latency);
    }

    /// Records how late after its due time a renewal started.
    pub fn record_renew_late(&self, late: Duration) {
        let h = &mut *self.renew.lock().unwrap();
        bucket(
            &mut h.late_buckets,
            &mut h.late_count,
            &mut h.late_sum_seconds,
            late,
        );
        h.max_late_seconds = h.max_late_seconds.max(late.as_secs_f64());
    }

    /// Records a renew that failed (transiently or for good).
    pub fn record_renew_failure(&self) {
        self.renew.lock().unwrap().failures += 1;
    }

    pub fn renew_histogram(&self) -> RenewHistogram {
        self.renew.lock().unwrap().clone()
    }

    /// Replaces the snapshot. The node loop calls it every tick; embedders
    /// that drive their own loop (and tests) may too.
    pub fn set(&self, s: StatusSnapshot) -> u64 {
        let mut inner = self.inner.write().unwrap();
        *inner = s;
        // Counted under the lock: the count a setter gets back is the one
        // its snapshot stands at.
        self.sets.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    /// Snapshots set so far (see `set`).
    fn sets(&self) -> u64 {
        self.sets.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// What a node needs from outside: the store, time, randomness, a runner,
/// an optional host lock (for immediate reclaim after a restart), and the
/// journal it records into.
#[derive(Debug, Clone)]
pub struct NodeDeps {
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub entropy: Arc<dyn Entropy>,
    pub runner: Arc<dyn Runner>,
    pub host_lock: Option<Arc<HostLock>>,
    pub journal: Arc<Journal>,
    pub status: Arc<NodeStatus>,
    /// Requests to claim a session now (the wake path); see [`claim_channel`].
    pub claims: Option<ClaimInbox>,
    /// How this node nudges the ranked takers of a peer it fences
    /// (`super::nudge`); `None`: they notice at their own pace.
    pub nudge: Option<Arc<dyn super::nudge::Nudge>>,
    /// Where the renew task runs. `Some`: a runtime no pass ever occupies
    /// ([`super::renew_thread::RenewThread`], as the daemon and the spike
    /// set it; keep it until `run` returns), so a renewal never waits behind
    /// a pass (what it can wait for there is listed on that module).
    /// `None`: the runtime `run` is called on, where a long pass delays it
    /// (the seeded simulation, whose nodes share one current-thread runtime
    /// on a manual clock, and tests of the protocol itself).
    pub renew_on: Option<tokio::runtime::Handle>,
    /// How hints are spelt (`super::feed::HintForms`): this node sets it
    /// after each `nodes/` listing and spells its own node hints by it.
    /// Share it with the `HintingStore` in `store`
    /// (`HintingStore::forms`), which then never lists `nodes/` itself to
    /// decide.
    pub hint_forms: Arc<super::feed::HintForms>,
}

impl NodeDeps {
    /// The usual dependencies around a store, a clock and a runner: OS
    /// randomness, no host lock, a journal of 10,000 events / 4 MiB (the
    /// daemon's), fresh status, no claim inbox. Override fields with struct
    /// update syntax (`NodeDeps { host_lock: Some(l), ..NodeDeps::new(..) }`).
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, runner: Arc<dyn Runner>) -> Self {
        NodeDeps {
            store,
            clock,
            entropy: Arc::new(crate::clock::OsEntropy::new()),
            runner,
            host_lock: None,
            journal: Arc::new(Journal::new(10_000, 4 << 20)),
            status: Default::default(),
            claims: None,
            nudge: None,
            renew_on: None,
            hint_forms: super::feed::HintForms::auto(),
        }
    }
}

/// What a node answered when asked to claim a session now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "claim", rename_all = "snake_case")]
pub enum ClaimAnswer {
    /// This node now holds the claim at `epoch` and has started the session.
    Claimed {
        node: String,
        epoch: u64,
        /// Bucket requests the claim cost (fresh reads + the write).
        round_trips: u32,
    },
    /// This node already held it.
    AlreadyOwned { node: String, epoch: u64 },
    /// Not claimed, and why: no free capacity, labels do not match, paused,
    /// completed, no manifest, owner still live, or another node won.
    Declined { node: String, reason: String },
}

struct ClaimRequest {
    name: Name,
    reply: tokio::sync::oneshot::Sender<Result<ClaimAnswer>>,
}

/// The sending side: cheap to clone, usable from any task (the HTTP API, an
/// embedding service's wake path via [`crate::wake::Resolver::with_claimer`]).
#[derive(Debug, Clone)]
pub struct NodeHandle {
    node: String,
    tx: tokio::sync::mpsc::Sender<ClaimRequest>,
}

/// The node's side, put in [`NodeDeps::claims`]. One receiver that outlives
/// re-registrations: each new instance serves it in turn.
#[derive(Clone)]
pub struct ClaimInbox(Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<ClaimRequest>>>);

impl std::fmt::Debug for ClaimInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimInbox")
    }
}

/// A handle to ask node `id` to claim sessions now, and the inbox it serves.
/// Requests queue (at most 64) while the node is between passes; each is
/// answered after fresh reads of the manifest, the claim and the owner's node
/// record, under the same takeover rules as the pull loop, but without the
/// placement grace delay: the caller chose this node.
pub fn claim_channel(id: &Name) -> (NodeHandle, ClaimInbox) {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    (
        NodeHandle {
            node: id.to_string(),
            tx,
        },
        ClaimInbox(Arc::new(tokio::sync::Mutex::new(rx))),
    )
}

impl NodeHandle {
    /// The node this handle asks.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Asks the node to claim `name` now. A node that is not running (shut
    /// down, or its `run` returned) declines.
    pub async fn claim_now(&self, name: &Name) -> Result<ClaimAnswer> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let declined = || ClaimAnswer::Declined {
            node: self.node.clone(),
            reason: "the node is not running".into(),
        };
        if self
            .tx
            .send(ClaimRequest {
                name: name.clone(),
                reply,
            })
            .await
            .is_err()
        {
            return Ok(declined());
        }
        answer.await.unwrap_or_else(|_| Ok(declined()))
    }
}

/// The node lease's state as the renew task publishes it.
#[derive(Debug, Clone, Copy)]
struct Validity {
    until: MonoTime,
    lost: bool,
}

/// A peer's node record as last read, and the version last listed.
#[derive(Debug, Clone)]
struct PeerNode {
    listed: Version,
    /// When our listings first and last showed `listed`: a version seen
    /// unchanged across listings more than ttl/2 apart has stood still.
    listed_since: MonoTime,
    listed_last: MonoTime,
    fetched: Version,
    fetched_at: MonoTime,
    record: LeaseRecord,
}

/// What one round of the ring watch found (see `Node::watch_peers`).
#[derive(Debug, Default)]
struct Watch {
    /// Run a pass now.
    pass: bool,
    /// Watched records found missing, with the version the listing showed.
    missing: Vec<(String, Version)>,
    /// The peers read, when each response arrived, and (for a new version
    /// whose record decoded) when its next renewal is expected.
    read: Vec<(String, MonoTime, Option<Option<MonoTime>>)>,
    /// The bell, if read: when, and the version it showed.
    bell: Option<(MonoTime, Option<Version>)>,
}

/// What the ring watch remembers of a watched peer (`core::watch_wait`).
#[derive(Debug, Clone, Copy)]
struct WatchedPeer {
    /// When the last read's response arrived.
    read_at: MonoTime,
    /// When its next renewal is expected to have been sent (from the last
    /// record read: a schedule only, never a judgement).
    expect_at: Option<MonoTime>,
}

/// A session this node holds the claim for.
#[derive(Debug, Clone)]
struct Owned {
    record: ClaimRecord,
    version: Version,
    running: bool,
    /// The send time of the last request that showed this claim ours: our
    /// write of it, or a listing or read that showed our version. See
    /// `Node::confirmed_until`.
    confirmed: MonoTime,
    /// When the current run started (for the crash-loop back-off).
    started_at: MonoTime,
    /// Consecutive runs that exited within [`QUICK_EXIT`] of starting.
    quick_exits: u32,
    /// A restart held back by the crash-loop back-off until then.
    restart_at: Option<MonoTime>,
    /// The spec last read for it, with its digest (`Node::spec_for`).
    spec: Option<(plan::Digest, Arc<Spec>)>,
}

/// What a node keeps of a manifest: what placement and the restart rules
/// need, not the spec. At 100,000 sessions the specs (command, arguments,
/// environment, nonce) were most of every node's memory, though a node runs
/// a tenth of them at most (issue #14); a spec is read when a session of
/// this node starts (`Node::spec_for`) and kept only beside its claim.
#[derive(Debug, Clone)]
struct KnownManifest {
    view: ManifestView,
    restart: RestartPolicy,
}

/// What a node keeps of a claim it reads (`plan::ClaimView`), decoded.
fn decode_claim_view(key: &str, bytes: &[u8]) -> Result<ClaimView> {
    ClaimRecord::decode(key, bytes).map(|c| ClaimView::from(&c))
}

impl KnownManifest {
    fn of(m: &ManifestRecord) -> Self {
        KnownManifest {
            view: manifest_view(m),
            restart: m.spec.restart,
        }
    }

    fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        ManifestRecord::decode(key, bytes).map(|m| KnownManifest::of(&m))
    }
}

/// The least time between two passes however often the node is nudged.
pub const NUDGE_MIN_GAP: Duration = Duration::from_millis(200);

/// Runs a node until `shutdown` is cancelled.
pub async fn run(cfg: NodeConfig, deps: NodeDeps, shutdown: CancellationToken) -> Result<()> {
    if cfg.capacity == 0 {
        return Err(Error::invalid("capacity", "must be at least 1"));
    }
    if cfg.probe {
        crate::probe::probe(&deps.store, deps.entropy.as_ref(), deps.clock.as_ref()).await?;
    }
    // No marker, no service: a bucket without one is new (init it) or wiped.
    // A transient failure to read it is retried, as registration is.
    let marker = loop {
        match super::marker::require(&deps.store).await {
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e, "reading the fleet marker");
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
                    tracing::warn!(node = %cfg.id, holder = ?holder, "node id held by another instance; waiting");
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
            (_, Err(e)) => tracing::warn!(node = %cfg.id, error = %e, "registering"),
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

mod cached {
    use crate::store::Version;
    use std::collections::HashMap;

    /// A map by key whose every change is counted (`generation`): a
    /// `HashMap` for reading (`Deref`); every way to change it goes through
    /// a method here that counts. `get_mut` and `iter_mut` count whether or
    /// not the caller then changes anything (a count too many costs one
    /// look more, never a missed change).
    ///
    /// Why: what a pass derives from a whole map (the claim counts per node
    /// instance over every claim in the fleet; which owned sessions the
    /// rules ask anything of; the HTTP status) need only be derived again
    /// when something in it changed. A steady-state pass changes nothing,
    /// and must not cost O(sessions) for it (issue #14). There is no
    /// `DerefMut`, `retain` shows values read-only, and the fields are
    /// private to this module: no change can slip past the count.
    pub(super) struct Tracked<V> {
        map: HashMap<String, V>,
        generation: u64,
    }

    /// Objects read from the bucket, by key, with the version each was
    /// read at.
    pub(super) type Cached<T> = Tracked<(Version, T)>;

    impl<V> Default for Tracked<V> {
        fn default() -> Self {
            Tracked {
                map: HashMap::new(),
                generation: 0,
            }
        }
    }

    impl<V> std::ops::Deref for Tracked<V> {
        type Target = HashMap<String, V>;
        fn deref(&self) -> &Self::Target {
            &self.map
        }
    }

    impl<V> Tracked<V> {
        pub(super) fn insert(&mut self, key: String, value: V) -> Option<V> {
            self.generation += 1;
            self.map.insert(key, value)
        }

        pub(super) fn remove(&mut self, key: &str) -> Option<V> {
            let out = self.map.remove(key);
            self.generation += u64::from(out.is_some());
            out
        }

        pub(super) fn retain(&mut self, mut keep: impl FnMut(&String, &V) -> bool) {
            let before = self.map.len();
            self.map.retain(|k, v| keep(k, v));
            self.generation += u64::from(self.map.len() != before);
        }

        pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut V> {
            self.generation += 1;
            self.map.get_mut(key)
        }

        pub(super) fn iter_mut(&mut self) -> std::collections::hash_map::IterMut<'_, String, V> {
            self.generation += 1;
            self.map.iter_mut()
        }

        pub(super) fn clear(&mut self) {
            self.generation += 1;
            self.map.clear();
        }

        /// Changes so far: equal counts, equal contents.
        pub(super) fn generation(&self) -> u64 {
            self.generation
        }
    }
}
use cached::{Cached, Tracked};

/// Observations a node process keeps across re-registrations (see the
/// fields of the same names on `Node`).
#[derive(Default)]
struct Memory {
    absent_nodes: HashMap<String, (MonoTime, Duration)>,
    seen_claims: HashMap<String, u64>,
    longest: (Duration, Duration),
}

enum Ended {
    Shutdown,
    LeaseLost,
    /// The audit caught the store breaking its conditions, or the fleet
    /// marker vanished or changed (the bucket was wiped or replaced).
    Fatal(Error),
}

struct Node {
    cfg: NodeConfig,
    deps: NodeDeps,
    client: LeaseClient,
    me: Owner,
    owned: Tracked<Owned>,
    /// A lower bound of the earliest `Owned::confirmed` (None: no bound
    /// known, as with nothing owned), exact after `recount_confirmed`.
    /// Why: the deadline every session runs under is that minimum plus the
    /// belief (`confirmed_until`), and it is asked for at every claim and
    /// every start; a walk over the owned sessions each time made placing
    /// N sessions on one node cost O(N²) (4% of a 100,000-session fleet's
    /// CPU during placement, the most of any function of ours). A bound
    /// that is low only makes deadlines earlier, never later, so it is kept
    /// cheaply: the one insertion site lowers it, raises of a `confirmed`
    /// and removals leave it (low), and each pass recounts it once.
    confirmed_floor: Option<MonoTime>,
    /// Peers' node records (never our own: we know it).
    nodes: HashMap<String, PeerNode>,
    /// Listed node keys whose record is corrupt: their owners' claims are
    /// never taken over (corruption is not absence).
    corrupt_nodes: std::collections::HashSet<String>,
    /// Listed manifest and claim keys that cannot be decoded (or are not
    /// ours at all), with the version found so: each affects its own key
    /// only. A corrupt manifest leaves its session as last known; a corrupt
    /// claim is never taken over; our own claim turning corrupt is lost.
    corrupt: Tracked<Version>,
    /// Sessions whose claim sits at the highest epoch (foreign bytes: no
    /// token above it exists, so nothing may take it over), each said once.
    stuck: std::collections::HashSet<String>,
    manifests: Cached<KnownManifest>,
    claims: Cached<ClaimView>,
    /// `claim_loads` as of the claims' generation it was counted at.
    loads: Option<(u64, HashMap<String, u32>)>,
    /// The inputs' generations (`owned_inputs`) at which `owned_due`'s
    /// last scan found nothing due.
    owned_idle: Option<[u64; 4]>,
    /// What `publish_status` last published: the owned sessions' generation,
    /// `ready`, and the status's count of snapshots set after ours.
    published: Option<(u64, bool, u64)>,
    /// Each peer's claim count at the last pass, and when it last rose
    /// (`note_progress`).
    progress: HashMap<String, (u32, Option<MonoTime>)>,
    /// When each session was first seen claimable (for rank × grace).
    first_claimable: HashMap<String, MonoTime>,
    /// Absence is an observation, never a death certificate. Node keys a
    /// claim names that we found absent: since when (the arrival of the
    /// first response that showed them absent) and the TTL of the last
    /// record we had (else ours).
    absent_nodes: HashMap<String, (MonoTime, Duration)>,
    /// The highest epoch we have seen for each claim key (listed manifests
    /// only): a claim that vanished is made again above it, not at 1.
    seen_claims: HashMap<String, u64>,
    /// The longest (ttl, max_poll) any node record we ever decoded
    /// published, ours included: only ever grows, so a peer whose record
    /// vanished, turned corrupt or is cached stale still counts in the hold
    /// a vanished claim waits out (`absent_claim_wait`).
    longest: (Duration, Duration),
    idle_ticks: u32,
    /// Draining (see `apply_control`): not even a predecessor's sessions
    /// are reclaimed.
    draining: bool,
    /// A read of the control object has succeeded in this registration;
    /// until then nothing is claimed (see `tick`).
    control_read: bool,
    /// When the last `nodes/` listing was sent. A peer counts as expired only
    /// if a listing *sent* ttl + margin after its version first arrived still
    /// showed that version: judging against the time the pass reaches its
    /// decision instead would let a slow pass (seconds of reads after the
    /// listing) call peers expired that renewed in the meantime.
    nodes_listed_at: MonoTime,
    /// The next light pass lists `nodes/` whatever `nodes_every` says:
    /// something asked for it since the last listing (the list is at
    /// `NodeConfig::nodes_every`).
    nodes_due: bool,
    /// The node lease's validity as the renew task last published it.
    validity: Option<watch::Receiver<Validity>>,
    /// Shares `confirmed_until` with the renew task, which announces
    /// min(lease validity, it) to the runner.
    confirmed_tx: watch::Sender<MonoTime>,
    /// Set when an audit read-back contradicts a write the store reported
    /// committed (here or in the renew task): the node stops serving.
    violation: Arc<std::sync::Mutex<Option<String>>>,
    /// Conditional writes of claims so far, for the audit's sample.
    claim_writes: u64,
    /// The fleet marker this node serves (checked every pass), and the
    /// epoch base of its generation: no claim of ours is made at or below it.
    marker: (super::marker::FleetMarker, Version),
    epoch_base: u64,
    /// Passes so far (a claim request between passes counts as one), and
    /// the pass and time of the last confirmation of the marker.
    pass: u64,
    marker_checked: Option<(u64, MonoTime)>,
    /// Watched peers whose record a watch read found missing, with the
    /// listed version then: each hurries one pass (see `watch_peers`).
    watch_missing: HashMap<String, Version>,
    /// What the ring watch remembers of each watched peer.
    watch_read: HashMap<String, WatchedPeer>,
    /// The fleet's bell as last read (`feed::ring_bell`): when, and the
    /// version it showed (`None`: missing).
    bell: Option<(MonoTime, Option<Version>)>,
    /// Until when another instance of this node id is not known to have
    /// stopped: set when this instance's registration *created* its node
    /// record (an operator deleted it, or gc did). Without the host lock's
    /// proof, the earlier instance may run until its own deadline, which is
    /// within ttl + margin of that creation (its last renewal was sent
    /// before the deletion, which was before the create).
    predecessor_unproven_until: Option<MonoTime>,
    /// The instance whose record this registration took over by a proof
    /// (its release, its expiry, or our host lock): its claims are ours at
    /// once even during the wait above, which is for instances before it.
    proven_predecessor: Option<String>,
    /// The change feed's cursor (light passes; see [`super::feed`]).
    feed: super::feed::FeedCursor,
    /// When the last full listing of `manifests/` and `sessions/` was sent.
    last_full: Option<MonoTime>,
    /// The next pass lists everything (a hint showed a claim missing: the
    /// absence rules run on full listings).
    full_forced: bool,
    /// The next pass looks at every manifest, not only those hints named
    /// (a full listing; control changed; capacity ran out; a pass failed).
    rescan: bool,
    /// The peers as the last pass saw them (id, instance, live, offers
    /// capacity, unproven): a change means a look at the names their
    /// claims hold (`core::peers_changed`).
    fleet_seen: Vec<core::PeerSeen>,
    /// Names to look at again in the next pass whatever the hints say: those
    /// the last pass did not claim and did not find unclaimable (grace,
    /// rank, absence waits, a refused write, capacity).
    revisit: std::collections::BTreeSet<String>,
    /// Set while a pass runs; still set at the next one if it failed.
    pass_incomplete: bool,
    /// When the feed was last covered (read, or a full listing sent).
    feed_read_at: Option<MonoTime>,
    /// The retention task, if one runs, and when it was last started.
    expiring: Option<AbortOnDrop<()>>,
    /// Peers this node fenced whose ranked takers are not nudged yet.
    fenced_now: Vec<String>,
    /// The nudges in flight (best effort; aborted when the node ends).
    nudges: tokio::task::JoinSet<()>,
    expired_at: Option<MonoTime>,
    /// The anti-entropy interval this node lists at (`core::adopt_pace`):
    /// `cfg.full_every` at registration (what the registration published),
    /// then grown with the fleet only as far as a landed renewal carried.
    full_every: Duration,
    /// The interval the last full listing's count calls for
    /// (`core::full_listing_pace`).
    full_every_wanted: Duration,
    /// To the renew task: the interval to publish (`max_poll_ms`).
    pace_tx: watch::Sender<Duration>,
    /// From the renew task: the interval its last landed renewal carried.
    pace_landed: Option<watch::Receiver<Duration>>,
    /// The interval our belief in our claims is measured in
    /// (`confirmed_until`): `full_every` once every claim we hold was
    /// confirmed after its last growth (`grown_at`), the shorter one
    /// before. Why: a claim confirmed when we promised (published) to list
    /// again within the old interval may have been deleted since, and a
    /// peer may have waited out only that interval; a longer belief would
    /// stretch that confirmation after the fact, and a session whose
    /// deadline lapsed would be started again beside the peer's.
    belief_pace: Duration,
    grown_at: MonoTime,
    /// The interval would grow, but `note_fleet_size` holds it at
    /// `full_every` (logged once each time it starts holding).
    growth_held: bool,
    /// When every node record was last read again, whole and decodable,
    /// before a vanished claim was made (`read_holds`): when those reads
    /// were sent.
    holds_read: Option<MonoTime>,
}

/// A serving node re-reads the fleet marker at least every this many ttls
/// even when it writes nothing (see `Node::ensure_marker`).
pub const MARKER_EVERY: u32 = 10;

/// One in this many of a node's own renewals and claim updates is read back
/// by the audit (every claim creation, takeover and fence is).
pub const AUDIT_SAMPLE: u64 = 16;

/// The next claim request, or never when this node has no inbox.
async fn recv(
    inbox: &mut Option<tokio::sync::OwnedMutexGuard<tokio::sync::mpsc::Receiver<ClaimRequest>>>,
) -> Option<ClaimRequest> {
    match inbox {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn name_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

impl Node {
    fn new(
        cfg: NodeConfig,
        deps: NodeDeps,
        client: LeaseClient,
        marker: (super::marker::FleetMarker, Version),
        memory: Memory,
    ) -> Self {
        let me = Owner {
            node: cfg.id.to_string(),
            instance: client.holder().instance.clone(),
        };
        let cfg_skew = core::feed_skew(cfg.ttl);
        let full_every = cfg.full_every;
        Node {
            cfg,
            deps,
            client,
            me,
            owned: Tracked::default(),
            confirmed_floor: None,
            nodes: HashMap::new(),
            corrupt_nodes: Default::default(),
            corrupt: Tracked::default(),
            stuck: Default::default(),
            manifests: Cached::default(),
            claims: Cached::default(),
            loads: None,
            owned_idle: None,
            published: None,
            first_claimable: HashMap::new(),
            progress: HashMap::new(),
            absent_nodes: memory.absent_nodes,
            seen_claims: memory.seen_claims,
            longest: memory.longest,
            idle_ticks: 0,
            draining: false,
            control_read: false,
            nodes_listed_at: MonoTime::ZERO,
            nodes_due: true,
            validity: None,
            confirmed_tx: watch::Sender::new(MonoTime::ZERO),
            violation: Default::default(),
            claim_writes: 0,
            epoch_base: super::marker::epoch_base(marker.0.generation),
            marker,
            pass: 0,
            marker_checked: None,
            watch_missing: HashMap::new(),
            watch_read: HashMap::new(),
            bell: None,
            predecessor_unproven_until: None,
            proven_predecessor: None,
            feed: super::feed::FeedCursor::new(cfg_skew),
            last_full: None,
            full_forced: false,
            rescan: true,
            fleet_seen: Vec::new(),
            revisit: Default::default(),
            pass_incomplete: false,
            feed_read_at: None,
            expiring: None,
            fenced_now: Vec::new(),
            nudges: tokio::task::JoinSet::new(),
            expired_at: None,
            full_every,
            full_every_wanted: full_every,
            pace_tx: watch::Sender::new(full_every),
            pace_landed: None,
            holds_read: None,
            belief_pace: full_every,
            grown_at: MonoTime::ZERO,
            growth_held: false,
        }
    }

    /// The longest between two listings that confirm our claims, as this
    /// node lists now (the longer of `max_poll` and the interval grown with
    /// the fleet, `full_every`): our own part of a vanished claim's hold.
    /// Our belief is measured in `belief_pace`, never longer.
    fn confirm_every(&self) -> Duration {
        self.cfg.max_poll.max(self.full_every)
    }

    /// After a full listing that counted `objects` manifests and claims:
    /// the interval wanted for them, taken at once if shorter, and handed
    /// to the renew task to publish. Longer is taken only once published
    /// (`take_published_pace`). Only with the feed on: without it every
    /// pass lists everything.
    ///
    /// Not grown while a peer of an older build is live
    /// (`older_peer_live`; judged on this full pass's `nodes/` listing and
    /// on records read since it, see `fetch_unread_nodes`): such a peer
    /// would not read our record before making one of our vanished claims
    /// again. When those reads failed (`records_read` false) the interval
    /// is kept as it is, neither grown nor shrunk.
    ///
    /// Called after the pass has stopped what its listing no longer showed
    /// (`reconcile_owned`): a shorter interval shortens our belief at once,
    /// and a claim the listing did not show (deleted by hand) still carries
    /// the confirmation of the listing before, which measured in the
    /// shorter belief may already have run out, and would end every
    /// session's deadline with it (the runner's deadline is the node's).
    ///
    /// Nor shrunk while a claim we hold was not confirmed by this listing
    /// (`all_confirmed` false: one it did not show that could not be read
    /// back): measured in the shorter belief, that claim's older
    /// confirmation would end every session's deadline with it. Staying at
    /// the longer interval a pass more is safe: every peer that could wait
    /// out our claims read it (an older peer that joined while we were
    /// grown read it in its first pass; `longest` only grows).
    fn note_fleet_size(&mut self, objects: u64, records_read: bool, all_confirmed: bool) {
        if !self.cfg.feed_on() {
            return;
        }
        let grown =
            core::full_listing_pace(self.cfg.full_every, self.cfg.full_every_objects, objects);
        self.full_every_wanted = if grown > self.cfg.full_every
            && self.older_peer_live(super::attrs::PROTO_READS_HOLDS)
        {
            if !std::mem::replace(&mut self.growth_held, true) {
                tracing::info!(
                    wanted_ms = grown.as_millis() as u64,
                    kept_ms = self.cfg.full_every.as_millis() as u64,
                    "the full-listing interval is not grown: a live peer of an older build does not read holds"
                );
            }
            self.cfg.full_every
        } else if grown > self.full_every && (!records_read || self.corrupt_peer_unsettled()) {
            // The records could not be read, or one listed under `nodes/`
            // does not decode and has been renewed lately (a node of an
            // unknown build may stand behind it): not grown this time.
            tracing::debug!("peer records not read: the full-listing interval is kept");
            self.full_every
        } else {
            self.growth_held = false;
            grown
        };
        if self.full_every_wanted < self.full_every && !all_confirmed {
            tracing::debug!("a claim not confirmed by this listing: the interval shrinks later");
            self.full_every_wanted = self.full_every;
        }
        self.take_published_pace();
        let wanted = self.full_every_wanted;
        self.pace_tx.send_if_modified(|v| {
            let changed = *v != wanted;
            *v = wanted;
            changed
        });
    }

    /// Takes up as much of the wanted interval as a landed renewal has
    /// published (`core::adopt_pace`).
    fn take_published_pace(&mut self) {
        let published = self
            .pace_landed
            .as_ref()
            .map_or(self.cfg.full_every, |rx| *rx.borrow());
        let next = core::adopt_pace(self.full_every, self.full_every_wanted, published);
        if next > self.full_every {
            self.grown_at = self.deps.clock.now();
            // Our claims were confirmed at the old interval and keep its
            // belief (`belief_pace`), which would run out before a listing
            // at the new one: a full listing now confirms them at it.
            self.full_forced = true;
        }
        // Shorter at once; longer once every claim is confirmed at it
        // (`recount_confirmed`).
        self.belief_pace = self.belief_pace.min(next);
        if next != self.full_every {
            tracing::info!(
                from = ?self.full_every,
                to = ?next,
                "full listings: interval changed with the fleet's size"
            );
            self.full_every = next;
        }
    }

    fn event(
        &self,
        kind: EventKind,
        session: Option<&str>,
        epoch: Option<u64>,
        detail: impl Into<String>,
    ) {
        self.deps
            .journal
            .record(self.deps.clock.wall_ms(), kind, session, epoch, detail);
    }

    fn take_memory(&mut self) -> Memory {
        Memory {
            absent_nodes: std::mem::take(&mut self.absent_nodes),
            seen_claims: std::mem::take(&mut self.seen_claims),
            longest: self.longest,
        }
    }

    /// Confirms the fleet marker (a conditional GET: a 304 when unchanged)
    /// before this pass issues an epoch (a claim, a takeover, a fence): once
    /// per pass. A wiped or replaced bucket is `Corrupt` at key `fleet`,
    /// which ends the node (see `serve`).
    async fn ensure_marker(&mut self) -> Result<()> {
        if self.marker_checked.is_some_and(|(p, _)| p == self.pass) {
            return Ok(());
        }
        super::marker::check(&self.deps.store, &self.marker.0, &self.marker.1).await?;
        self.marker_checked = Some((self.pass, self.deps.clock.now()));
        Ok(())
    }

    /// Reads back a write the store reported committed (see
    /// [`super::audit`]). A contradiction is a store violation, recorded for
    /// the serve loop to act on; a read that fails is no evidence either way.
    async fn audit(&mut self, key: &str, nonce: &str, epoch: u64) {
        let r = audit(&self.deps.store, key, nonce, epoch).await;
        self.note_audit(key, r, epoch);
    }

    /// What the audit read-back of one of our committed writes found: a
    /// store that let two writers win stops the node.
    fn note_audit(&mut self, key: &str, r: Result<()>, epoch: u64) {
        match r {
            Err(e) if e.kind() == crate::ErrorKind::Unsupported => {
                tracing::error!(error = %e, "store violation: stopping");
                self.event(EventKind::StoreViolation, None, Some(epoch), e.to_string());
                *self.violation.lock().unwrap() = Some(match e {
                    Error::Unsupported { detail, .. } => detail,
                    other => other.to_string(),
                });
            }
            Err(e) => tracing::warn!(key, error = %e, "audit read-back failed"),
            Ok(()) => {}
        }
    }

    async fn serve(&mut self, lease: Lease, shutdown: &CancellationToken) -> Result<Ended> {
        let took_unproven = lease.replaced().is_some_and(|r| NodeAttrs::of(r).unproven);
        self.proven_predecessor = lease.replaced().map(|r| r.holder.instance.clone());
        if lease.created() || took_unproven {
            // Our ttl, or a longer one this process has read in a node
            // record before. A fresh process knows only its own, and the
            // earlier instance's ttl went with its record: with a longer
            // ttl there, the wait falls short by the difference (a known
            // gap, docs/fleet.md "Known gaps": use one ttl per node id).
            let ttl = self.cfg.ttl.max(self.longest.0);
            self.predecessor_unproven_until =
                Some(self.deps.clock.now() + ttl + default_margin(ttl));
        }
        let (valid_tx, valid_rx) = watch::channel(Validity {
            until: lease.valid_until(),
            lost: false,
        });
        let (load_tx, load_rx) = watch::channel(0u32);
        // The registration published `cfg.full_every` (`node_attrs`).
        let (pace_landed_tx, pace_landed_rx) = watch::channel(self.cfg.full_every);
        self.pace_landed = Some(pace_landed_rx);
        let stop_renew = CancellationToken::new();
        let task = renew_task(
            lease,
            self.cfg.clone(),
            self.deps.clone(),
            RenewLinks {
                valid: valid_tx,
                load: load_rx,
                confirmed: self.confirmed_tx.subscribe(),
                violation: self.violation.clone(),
                stop: stop_renew.clone(),
                unproven_until: self.predecessor_unproven_until,
                pace: self.pace_tx.subscribe(),
                pace_landed: pace_landed_tx,
            },
        );
        // Aborted with this future: a node whose task dies must not leave its
        // lease renewing behind it (on whichever runtime it runs).
        let mut renew = AbortOnDrop(match &self.deps.renew_on {
            Some(rt) => rt.spawn(task),
            None => tokio::spawn(task),
        });
        self.validity = Some(valid_rx.clone());
        self.deps
            .status
            .set_valid_until(&self.deps.clock, Some(valid_rx.borrow().until));
        let mut valid_rx = valid_rx;
        // Held for this instance's lifetime; the next instance takes it over.
        let mut inbox = match &self.deps.claims {
            Some(i) => Some(i.0.clone().lock_owned().await),
            None => None,
        };
        let mut request: Option<ClaimRequest> = None;
        let ended = loop {
            let violation = self.violation.lock().unwrap().clone();
            // Marks the value seen, so `changed()` below waits for the next one.
            let v = *valid_rx.borrow_and_update();
            // The renew task publishes until it is stopped below; a closed
            // channel means it is gone (its runtime shut down under it, see
            // `RenewThread`): nothing renews the lease any more, so it is
            // lost now, rather than passes running back to back until it
            // lapses (every pause ends at once on a closed channel).
            let renewer_gone = valid_rx.has_changed().is_err();
            match core::between_passes(core::Between {
                violation: violation.is_some(),
                lease_lost: v.lost || renewer_gone,
                lease_expired: self.deps.clock.now() >= v.until,
                shutdown: shutdown.is_cancelled(),
            }) {
                core::LoopVerdict::Refuse => {
                    self.stop_all("the store broke its conditional writes")
                        .await;
                    self.owned.clear();
                    break Ended::Fatal(Error::Unsupported {
                        store: self.deps.store.to_string(),
                        step: "audit".into(),
                        detail: violation.unwrap_or_default(),
                    });
                }
                core::LoopVerdict::LeaseLost => {
                    self.stop_all("node lease lost").await;
                    // Our claims died with the lease: nothing left to release.
                    self.owned.clear();
                    break Ended::LeaseLost;
                }
                core::LoopVerdict::Shutdown => break Ended::Shutdown,
                core::LoopVerdict::Pass => {}
            }
            if let Some(req) = request.take() {
                let answer = self.claim_now(&req.name).await;
                let _ = req.reply.send(answer);
            }
            let changed = match self.tick().await {
                Ok(changed) => changed,
                // A wiped or replaced bucket stops the node for good; any
                // other failed pass is retried next pass, at the brisk pace.
                Err(e) if marker_gone(&e) => {
                    tracing::error!(error = %e, "stopping every session");
                    self.event(EventKind::BucketWiped, None, None, e.to_string());
                    self.stop_all("the bucket was wiped or replaced").await;
                    self.owned.clear();
                    break Ended::Fatal(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pull loop tick failed");
                    true
                }
            };
            let _ = load_tx.send(self.load());
            self.publish_status(self.deps.clock.now() < valid_rx.borrow().until);
            self.deps.status.pass_completed(
                self.deps.clock.now(),
                core::pass_bound(self.cfg.poll, self.cfg.max_poll, self.cfg.ttl),
            );
            self.idle_ticks = core::idle_after(self.idle_ticks, changed);
            let pause = core::pace(self.cfg.poll, self.cfg.max_poll, self.idle_ticks);
            // Wait for the next tick; wake early only for shutdown or a lost
            // lease (a renewal is not a reason to list again).
            let sleep = self.deps.clock.sleep(pause);
            tokio::pin!(sleep);
            let status = self.deps.status.clone();
            let nudge = &status.nudge;
            let runner = self.deps.runner.clone();
            let mut shortened = false;
            // Between passes, the ring successors' records are read on the
            // watch's schedule (`core::watch_wait`: the first as each of its
            // renewals lands, the second every ttl/2, each once more at its
            // deadline), and the bell every ttl/6: a dead peer is noticed
            // about ttl + margin after its last renewal, and its sessions'
            // takers hear of it within about ttl/6 more, not at the end of
            // an idle pause.
            let period = core::watch_period(self.cfg.ttl, 0);
            let watching = core::watch_during(pause, self.cfg.ttl);
            // Too brisk to watch: the next pass lists `nodes/` instead.
            self.nodes_due |= !watching;
            let watch = self.deps.clock.sleep(self.watch_wait().unwrap_or(pause));
            tokio::pin!(watch);
            loop {
                // `biased`: branches are tried in this order, not tokio's
                // per-process random one, so a seeded simulation replays the
                // same history in any process. Losses and shutdown first.
                tokio::select! {
                    biased;
                    r = valid_rx.changed() => {
                        if r.is_err() || valid_rx.borrow().lost {
                            break;
                        }
                    }
                    _ = shutdown.cancelled() => break,
                    Some(req) = recv(&mut inbox) => {
                        request = Some(req);
                        break;
                    }
                    // A nudge brings the next pass forward, at most to
                    // NUDGE_MIN_GAP after this one: a flood of nudges costs
                    // no more than a pass every NUDGE_MIN_GAP.
                    _ = nudge.notified(), if !shortened => {
                        shortened = true;
                        if let Some(gap) = core::nudged_pause(pause, NUDGE_MIN_GAP) {
                            sleep.set(self.deps.clock.sleep(gap));
                        }
                        self.idle_ticks = 0;
                    }
                    _ = &mut sleep => break,
                    // A session ended: its end is recorded now (one fenced
                    // write of its claim; a restart starts at once or is
                    // scheduled), not at the next pass, which may be
                    // seconds away on an idle node.
                    _ = runner.exited() => {
                        if self.handle_exits().await {
                            self.idle_ticks = 0;
                            let _ = load_tx.send(self.load());
                            self.publish_status(self.deps.clock.now() < valid_rx.borrow().until);
                        }
                    }
                    _ = &mut watch, if watching => {
                        // The reads race what the pause waits for: a lost
                        // lease or a shutdown is not held up by a slow store,
                        // and a round never outlasts its period.
                        let clock = self.deps.clock.clone();
                        // (A renewal of our own lease interrupts a round
                        // too: its reads are simply done again at once.)
                        let (w, cut_off) = tokio::select! {
                            biased;
                            r = valid_rx.changed() => {
                                if r.is_err() || valid_rx.borrow().lost {
                                    break;
                                }
                                (None, false)
                            }
                            _ = shutdown.cancelled() => break,
                            _ = clock.sleep(period) => (None, true),
                            w = self.watch_peers() => (Some(w), false),
                        };
                        if let Some(w) = w {
                            self.watch_missing.extend(w.missing);
                            for (key, read_at, expected) in w.read {
                                let prior = self.watch_read.get(&key).and_then(|p| p.expect_at);
                                let expect_at = expected.unwrap_or(prior);
                                self.watch_read.insert(key, WatchedPeer { read_at, expect_at });
                            }
                            if w.bell.is_some() {
                                self.bell = w.bell;
                            }
                            let nodes = &self.nodes;
                            self.watch_read.retain(|k, _| nodes.contains_key(k));
                            if w.pass {
                                // A watched peer stood still, or the bell
                                // rang (a fence, a release, an apply): the
                                // pass judges on a fresh `nodes/` listing.
                                self.nodes_due = true;
                                self.idle_ticks = 0;
                                break;
                            }
                        }
                        // At least a tenth of the closest period between
                        // rounds: a round that failed, or a store that
                        // answers at once, never spins; a round cut off by
                        // a store slower than the period waits a period.
                        let next = if cut_off {
                            period
                        } else {
                            self.watch_wait().unwrap_or(pause).max(period / 10)
                        };
                        watch.set(self.deps.clock.sleep(next));
                    }
                }
            }
        };
        self.publish_status(false);
        self.deps.status.set_valid_until(&self.deps.clock, None);
        stop_renew.cancel();
        let lease = (&mut renew.0)
            .await
            .map_err(|e| Error::Internal(format!("renew task: {e}")))?;
        if let Ended::Shutdown = ended {
            let ended = self.stop_all("shutting down").await;
            self.finish_exits(ended).await;
            let held = !self.owned.is_empty();
            self.release_claims(true).await;
            let mut released = false;
            if let Some(l) = lease {
                let epoch = l.epoch();
                match l.release().await {
                    Ok(()) => {
                        released = true;
                        self.event(EventKind::Released, None, Some(epoch), "node lease")
                    }
                    Err(e) => tracing::warn!(error = %e, "releasing the node lease"),
                }
            }
            // Peers hear of the end now: the released record is hinted (a
            // light pass reads a peer's record only on a hint, and lists
            // `nodes/` only at the slow pace, so placement would rank this
            // node for up to two of those), and the bell sends every node
            // to look, the released sessions' ranked takers among them
            // (their claims were hinted as written).
            if released && self.cfg.feed_on() {
                super::feed::write_hint_retried(
                    &self.deps.store,
                    &self.deps.hint_forms,
                    self.deps.clock.as_ref(),
                    self.deps.clock.wall_ms(),
                    self.deps.entropy.as_ref(),
                    crate::keys::Hinted::Node,
                    self.me.node.as_str(),
                )
                .await;
            }
            if held || released {
                super::feed::ring_bell(&self.deps.store, self.deps.entropy.as_ref()).await;
            }
        }
        Ok(ended)
    }

    /// Is `c` owned by another instance of this node id whose end nothing
    /// proves yet (see `predecessor_unproven_until`)?
    fn predecessor_unproven(&self, c: Option<&plan::ClaimView>) -> bool {
        c.is_some_and(|c| {
            c.owner.node == self.me.node
                && c.owner.instance != self.me.instance
                && self.proven_predecessor.as_ref() != Some(&c.owner.instance)
        }) && self
            .predecessor_unproven_until
            .is_some_and(|t| self.deps.clock.now() < t)
    }

    /// The peers the ring watch reads, with their place among our ring
    /// successors and their ttl: the peers the last pass judged live (one
    /// already expired, a dead node with no sessions that nobody fenced,
    /// was dealt with, and must not hurry every pause from now on).
    fn watched(&self) -> Vec<(String, usize, Duration)> {
        let observer = self.client.observer();
        let ids: Vec<&str> = self
            .nodes
            .iter()
            .filter(|(key, n)| {
                let ttl = Duration::from_millis(n.record.ttl_ms);
                !n.record.released
                    && observer
                        .unchanged_for(key, &n.listed, self.nodes_listed_at)
                        .is_none_or(|d| {
                            !crate::liveness::stood_still_long_enough(d, ttl, default_margin(ttl))
                        })
            })
            .map(|(_, n)| n.record.holder.node.as_str())
            .collect();
        core::ring_successors(&self.me.node, &ids, core::WATCHED)
            .into_iter()
            .enumerate()
            .filter_map(|(position, id)| {
                let key = crate::keys::node(id);
                let ttl = Duration::from_millis(self.nodes.get(&key)?.record.ttl_ms);
                Some((key, position, ttl))
            })
            .collect()
    }

    /// How long until the watched peer `key` is due a read (`core::watch_wait`).
    fn watch_wait_for(&self, key: &str, position: usize, ttl: Duration, now: MonoTime) -> Duration {
        let observer = self.client.observer();
        let unchanged = observer
            .version(key)
            .and_then(|v| observer.unchanged_for(key, &v, now));
        let peer = self.watch_read.get(key);
        let since_read = peer.map(|p| now.saturating_since(p.read_at));
        let foreseen = match peer.and_then(|p| p.expect_at) {
            None => core::Foreseen::Unknown,
            Some(t) if t > now => core::Foreseen::In(t.saturating_since(now)),
            Some(t) => core::Foreseen::Overdue(now.saturating_since(t)),
        };
        core::watch_wait(ttl, position, since_read, unchanged, foreseen)
    }

    /// How long until the next watch read is due (a watched peer's or the
    /// bell's), if any peer is watched.
    fn watch_wait(&self) -> Option<Duration> {
        let now = self.deps.clock.now();
        let peers = self
            .watched()
            .into_iter()
            .map(|(key, position, ttl)| self.watch_wait_for(&key, position, ttl, now))
            .min()?;
        Some(peers.min(self.bell_wait(now)))
    }

    /// How long until the bell is due a read (now if never read).
    fn bell_wait(&self, now: MonoTime) -> Duration {
        self.bell.as_ref().map_or(Duration::ZERO, |(at, _)| {
            core::bell_period(self.cfg.ttl).saturating_sub(now.saturating_since(*at))
        })
    }

    /// Reads the bell (a conditional GET on the version last seen). Returns
    /// what to remember, and whether it rang: a version other than the one
    /// an earlier read showed, a first one where it was missing included
    /// (this node's first read only learns it; a bell found missing is no
    /// ring).
    async fn read_bell(&self) -> ((MonoTime, Option<Version>), bool) {
        let read_before = self.bell.is_some();
        let known = self.bell.as_ref().and_then(|(_, v)| v.clone());
        let read = match &known {
            Some(v) => self.deps.store.get_if_changed(crate::keys::BELL, v).await,
            None => self
                .deps
                .store
                .get(crate::keys::BELL)
                .await
                .map(|o| o.map_or(Conditional::Missing, Conditional::Changed)),
        };
        let at = self.deps.clock.now();
        match read {
            Ok(Conditional::NotModified) => ((at, known), false),
            Ok(Conditional::Changed(o)) => ((at, Some(o.version)), read_before),
            // Never rung since `init` made it, or deleted: a plain GET
            // each time until a ring creates it again (a reader does not:
            // it must not write into a bucket that may have been wiped).
            Ok(Conditional::Missing) => ((at, None), false),
            Err(e) => {
                tracing::debug!(error = %e, "reading the bell");
                ((at, known), false)
            }
        }
    }

    /// Reads the watched peers' node records (a conditional GET each, on
    /// the version the last listing showed), feeding what they show to the
    /// same observer the listings feed. Returns whether a pass should run
    /// now: a watched peer has stood still past its ttl + margin, or its
    /// record is missing. A hint only: the pass judges again from its own
    /// listing, and the observation it adds is a response's arrival like
    /// any other (never earlier than the write that made the version).
    async fn watch_peers(&self) -> Watch {
        let now = self.deps.clock.now();
        let watched: Vec<String> = self
            .watched()
            .into_iter()
            .filter(|(key, position, ttl)| {
                self.watch_wait_for(key, *position, *ttl, now) == Duration::ZERO
            })
            .map(|(key, _, _)| key)
            .collect();
        let observer = self.client.observer();
        // Both reads at once: the pause is waiting on them.
        let reads = watched.into_iter().filter_map(|key| {
            let n = self.nodes.get(&key)?;
            let ttl = Duration::from_millis(n.record.ttl_ms);
            // The latest version any response showed (a watch read may have
            // seen a renewal the last listing did not).
            let known = observer.version(&key).unwrap_or(n.listed.clone());
            let released = n.record.released && n.fetched == known;
            // A record found missing hurries one pass per listed version: a
            // store whose listings lag its deletes must not make every
            // watch a pass.
            let hurried = self.watch_missing.get(&key) == Some(&n.listed);
            let listed = n.listed.clone();
            Some(async move {
                let read = self.deps.store.get_if_changed(&key, &known).await;
                let arrived = self.deps.clock.now();
                let mut expected = None;
                let seen = match read {
                    Ok(Conditional::NotModified) => core::Watched::Unchanged {
                        for_: observer.observe(&key, &known, arrived),
                        released,
                    },
                    Ok(Conditional::Changed(o)) => {
                        observer.observe(&key, &o.version, arrived);
                        // When its next renewal should land, by its own
                        // record's wall time: only when to read next.
                        expected = Some(
                            LeaseRecord::decode(&key, &o.bytes, Kind::Node)
                                .ok()
                                .and_then(|r| {
                                    core::next_renewal_in(
                                        Duration::from_millis(r.ttl_ms),
                                        r.renewed_at_ms,
                                        self.deps.clock.wall_ms(),
                                    )
                                })
                                .map(|d| arrived + d),
                        );
                        core::Watched::Renewed
                    }
                    Ok(Conditional::Missing) if hurried => core::Watched::Unknown,
                    Ok(Conditional::Missing) => core::Watched::Missing,
                    Err(e) => {
                        tracing::debug!(peer = key, error = %e, "watching a peer");
                        core::Watched::Unknown
                    }
                };
                (
                    key,
                    listed,
                    seen,
                    core::watch_says_pass(seen, ttl),
                    arrived,
                    expected,
                )
            })
        });
        let bell_due = self.bell_wait(now) == Duration::ZERO;
        let bell = async {
            if bell_due {
                Some(self.read_bell().await)
            } else {
                None
            }
        };
        let (reads, bell) = futures::future::join(futures::future::join_all(reads), bell).await;
        let mut w = Watch::default();
        if let Some((remember, rang)) = bell {
            w.bell = Some(remember);
            if rang {
                tracing::debug!("the bell rang: a pass now");
                w.pass = true;
            }
        }
        for (key, listed, seen, pass, arrived, expected) in reads {
            w.pass |= pass;
            w.read.push((key.clone(), arrived, expected));
            if seen == core::Watched::Missing {
                w.missing.push((key, listed));
            }
        }
        w
    }

    /// Before taking over `c`, makes its owner's death final in the bucket.
    ///
    /// A claim is attached to its owner's node lease, but the takeover is a
    /// conditional write on the *claim*, which the owner's renewals never
    /// touch. Expiry by observation says the owner's validity for the version
    /// we watched has ended; it cannot say that no renewal of that version is
    /// still in flight, or that the owner did not renew after the listing we
    /// judged by. So when the owner's lease is judged expired (not released,
    /// not superseded), write a tombstone over it with If-Match on that very
    /// version. If it lands, the owner's own renewals (If-Match on the same
    /// version) can never succeed again: it is fenced, and its deadline has
    /// passed. If it is rejected, the owner renewed after all: no takeover.
    ///
    /// One write per dead node (the first node to take any of its sessions),
    /// not per session. Returns whether the takeover may proceed.
    async fn fence_owner(&mut self, c: &ClaimView) -> Result<bool> {
        let key = crate::keys::node(&c.owner.node);
        let cached = self.nodes.get(&key).cloned();
        let view = match &cached {
            None => core::OwnerRecord::Unknown,
            Some(n) => core::OwnerRecord::Known {
                judged: owner_liveness(&n.record, &c.owner.instance),
                at_listed: n.fetched == n.listed,
            },
        };
        let n = match core::fence(
            c.state == ClaimState::Released,
            c.owner.node == self.me.node,
            view,
        ) {
            core::Fence::Go => return Ok(true),
            core::Fence::ReadOwner => {
                // Not in our view: read it (see `core::after_owner_read`).
                // Absent, the owner may still be acting on the validity of
                // its last renewal (its next one fails on the missing record
                // and it stops). The next pass lists `nodes/` too: a peer
                // not in our view may be one the slow listing missed.
                self.nodes_due = true;
                self.fetch_node(&key, None).await?;
                return Ok(core::after_owner_read(
                    self.nodes.contains_key(&key),
                    self.corrupt_nodes.contains(&key),
                    self.node_absent_long_enough(&key),
                ));
            }
            core::Fence::Tombstone | core::Fence::ReadAtListed => cached,
        };
        let Some(n) = n else {
            return Ok(false); // (only a known owner is fenced)
        };
        // Build the tombstone from the record at the watched version: the
        // cached one if we read that very version (claim_now just did),
        // else read it now.
        let record = if n.fetched == n.listed {
            n.record
        } else {
            let current = self
                .deps
                .store
                .get(&key)
                .await
                .map_err(|e| Error::from_store("get", &key, e))?;
            let mut read = None;
            let seen = match &current {
                None => core::OwnerRead::Missing,
                Some(o) if o.version != n.listed => core::OwnerRead::Other,
                Some(o) => {
                    let Ok(record) = LeaseRecord::decode(&key, &o.bytes, Kind::Node) else {
                        // Unreadable: never fenced, never taken over (as a
                        // corrupt record met by a listing).
                        self.corrupt_nodes.insert(key.clone());
                        return Ok(false);
                    };
                    let judged = owner_liveness(&record, &c.owner.instance);
                    // The stillness that judged it used the ttl of the
                    // copy we held; the version listed may stand for a
                    // longer one (a new instance with another --ttl). Not
                    // final: it must have stood still for its own ttl too.
                    let ttl = Duration::from_millis(record.ttl_ms);
                    let still =
                        self.client
                            .observer()
                            .unchanged_for(&key, &n.listed, self.nodes_listed_at);
                    if !judged.is_final()
                        && !still.is_some_and(|d| {
                            crate::liveness::stood_still_long_enough(d, ttl, default_margin(ttl))
                        })
                    {
                        return Ok(false);
                    }
                    read = Some(record);
                    core::OwnerRead::AtListed(judged)
                }
            };
            match core::after_fresh_read(seen) {
                // Not dead after all, or gone: the next pass judges on a
                // fresh `nodes/` listing, not again on the one that was
                // overtaken (at most `nodes_every` old).
                core::FreshRead::Absent => {
                    self.nodes_due = true;
                    let now = self.deps.clock.now();
                    let ttl = Duration::from_millis(n.record.ttl_ms);
                    self.nodes.remove(&key);
                    self.absent_nodes.entry(key).or_insert((now, ttl));
                    return Ok(false);
                }
                core::FreshRead::Changed => {
                    self.nodes_due = true;
                    self.fetch_node(&key, None).await?;
                    return Ok(false);
                }
                core::FreshRead::Final => {
                    self.fetch_node(&key, None).await?;
                    return Ok(true);
                }
                core::FreshRead::Tombstone => match read {
                    Some(record) => record,
                    None => return Ok(false), // (judged only at the listed version)
                },
            }
        };
        self.ensure_marker().await?;
        let mut tomb = record;
        tomb.released = true;
        tomb.nonce = self.deps.entropy.hex_id();
        tomb.attrs = NodeAttrs {
            released_by: Some(self.me.node.clone()),
            ..NodeAttrs::of(&tomb)
        }
        .to_map();
        let put = put_checked(
            &self.deps.store,
            &key,
            Bytes::from(tomb.encode()?),
            Cond::Match(n.listed.clone()),
            &tomb.nonce,
            json_nonce,
        )
        .await?;
        match put {
            Put::Committed(version) => {
                self.audit(&key, &tomb.nonce, tomb.epoch).await;
                self.fenced_now.push(tomb.holder.node.clone());
                self.event(
                    EventKind::Fenced,
                    None,
                    Some(tomb.epoch),
                    format!(
                        "node {} instance {} expired by observation; its lease released",
                        tomb.holder.node, tomb.holder.instance
                    ),
                );
                self.nodes.insert(
                    key,
                    PeerNode {
                        listed: version.clone(),
                        listed_since: self.deps.clock.now(),
                        listed_last: self.deps.clock.now(),
                        fetched: version,
                        fetched_at: self.deps.clock.now(),
                        record: tomb,
                    },
                );
                Ok(true)
            }
            Put::Rejected(_) => {
                self.nodes_due = true;
                self.fetch_node(&key, None).await?;
                Ok(core::after_tombstone_rejected(
                    self.nodes
                        .get(&key)
                        .map(|n| owner_liveness(&n.record, &c.owner.instance)),
                ))
            }
        }
    }

    /// Claims `name` now if the pull loop's rules allow it, after fresh reads
    /// (the caches may be a pass old). Skips only placement's ranking and
    /// its grace delay (the caller chose this node): the verdict is the pull
    /// loop's own `core::gate`, so the two cannot decide differently.
    async fn claim_now(&mut self, name: &Name) -> Result<ClaimAnswer> {
        self.pass += 1;
        let node = self.me.node.clone();
        let declined = |reason: &str| ClaimAnswer::Declined {
            node: node.clone(),
            reason: reason.to_string(),
        };
        if let Some(o) = self.owned.get(name.as_str()) {
            return Ok(ClaimAnswer::AlreadyOwned {
                node: node.clone(),
                epoch: o.record.epoch,
            });
        }
        if self.load() >= self.cfg.capacity {
            return Ok(declined("no free capacity"));
        }
        let mut round_trips = 1;
        let Some((m, mversion)) = super::manifest::get(&self.deps.store, name).await? else {
            return Ok(declined("no manifest"));
        };
        let mkey = crate::keys::manifest(name);
        self.manifests
            .insert(mkey, (mversion, KnownManifest::of(&m)));
        let key = crate::keys::session(name);
        round_trips += 1;
        let claim = super::claim::get(&self.deps.store, name.as_str())
            .await?
            .map(|(c, v)| (v, ClaimView::from(&c)));
        match &claim {
            Some((v, c)) => {
                self.claims.insert(key.clone(), (v.clone(), c.clone()));
            }
            // Gone: what the last listing cached is no longer there, and
            // must not stand in for what `absent_claim_wait` watches.
            None => {
                self.claims.remove(&key);
            }
        }
        let mut owner_corrupt = false;
        if let Some((_, c)) = &claim
            && c.owner.node != self.me.node
            && c.state != ClaimState::Released
        {
            round_trips += 1;
            let owner = crate::keys::node(&c.owner.node);
            self.fetch_node(&owner, None).await?;
            owner_corrupt = self.corrupt_nodes.contains(&owner);
        }
        let mv = manifest_view(&m);
        if !mv
            .selector
            .iter()
            .all(|(k, v)| self.cfg.labels.get(k) == Some(v))
        {
            return Ok(declined("this node's labels do not match the selector"));
        }
        let cv = claim.as_ref().map(|(_, c)| c.clone());
        let vanished = self.claim_vanished(&key, claim.as_ref().map(|(_, c)| c));
        if vanished && self.holds_unread_for(name.as_str()) {
            round_trips += 1;
            // Failed: the claim is declined as waiting (below).
            if let Err(e) = self.read_holds().await {
                tracing::warn!(session = %name, error = %e, "reading node records before a vanished claim");
            }
        }
        let loads = self.claim_loads();
        let views = self.node_views(&loads);
        let candidate = core::Candidate {
            // A corrupt claim or manifest failed the reads above (an error,
            // not a verdict).
            claim_corrupt: false,
            manifest_corrupt: false,
            owner_corrupt,
            claimable: plan::claimable(&mv, cv.as_ref(), &views, &self.me),
            control_read: self.control_read,
            cordoned: self.deps.status.cordoned(),
            draining: self.draining,
            absence_pending: vanished && self.absent_claim_wait(name.as_str()).is_some(),
            // Read just now.
            owner_stale: false,
            claimable_for: Duration::MAX,
            grace: self.cfg.grace,
            predecessor_unproven: self.predecessor_unproven(cv.as_ref()),
        };
        match core::gate(&candidate, || {
            Some(core::Rank {
                position: 0,
                ahead_idle_for: Duration::MAX,
            })
        }) {
            core::Gate::Claim => {}
            core::Gate::Skip => {
                return Ok(declined(if owner_corrupt {
                    "the owner's node record is corrupt"
                } else if !self.control_read {
                    "this node has not read its control object yet"
                } else {
                    "this node is cordoned"
                }));
            }
            core::Gate::NotClaimable => {
                return Ok(declined(match &cv {
                    _ if mv.paused => "paused",
                    Some(c) if c.state.is_terminal() && c.digest == mv.digest => "completed",
                    Some(_) => "its owner is live",
                    None => "not claimable",
                }));
            }
            core::Gate::AbsencePending if claim.is_none() => {
                // Witness the absence with a version of our own (see
                // `tick`); a missing claim is never taken, however long it
                // was missing.
                if let Err(e) = self.mark_vanished(name.as_str()).await {
                    tracing::warn!(session = %name, error = %e, "writing a vanished marker");
                }
                return Ok(declined(
                    "its claim vanished from the bucket; marked, to be made again after the hold period",
                ));
            }
            core::Gate::AbsencePending => {
                let left = self
                    .absent_claim_wait(name.as_str())
                    .unwrap_or(Duration::ZERO);
                return Ok(declined(&format!(
                    "its claim vanished from the bucket; waiting for the absence to be observed ({} left)",
                    humantime::format_duration(Duration::from_millis(left.as_millis() as u64))
                )));
            }
            // Grace: an unproven predecessor's claim (see
            // `predecessor_unproven_until`). The others are not reachable
            // with the owner read just now, a rank given and no grace to
            // wait; declined rather than assumed.
            core::Gate::RefetchOwner | core::Gate::Unranked | core::Gate::Grace => {
                return Ok(declined("not claimable now"));
            }
        }
        // As in a pass: no token can follow it, so nothing is read or sent.
        if let Some((_, c)) = &claim
            && crate::record::next_epoch(c.epoch).is_none()
        {
            return Ok(declined(
                "its claim is at the highest epoch: no fencing token above it exists",
            ));
        }
        if let Some((_, c)) = &claim {
            if !self.fence_owner(c).await? {
                return Ok(declined(
                    "its owner renewed its lease, or its absence is too recent",
                ));
            }
            // Its other sessions' takers: hinted, rung, nudged.
            self.after_fence(&views);
            round_trips += 1;
        }
        round_trips += 1;
        let digest = m.digest.clone();
        self.claim(name.as_str(), digest, claim, Some(Arc::new(m.spec)))
            .await?;
        Ok(match self.owned.get(name.as_str()) {
            Some(o) => ClaimAnswer::Claimed {
                node: node.clone(),
                epoch: o.record.epoch,
                round_trips,
            },
            None => declined("another node claimed it first"),
        })
    }

    /// Publishes what the node holds for the HTTP status, unless it is what
    /// is published already: each owned session looked up in the published
    /// list (sorted by name), allocating nothing. Rebuilding it every pass
    /// was one string per owned session per pass (issue #14).
    fn publish_status(&mut self, ready: bool) {
        // Nothing owned changed since our snapshot, and nobody replaced it:
        // no look at the 10,000 sessions a node may own (issue #14).
        let generation = self.owned.generation();
        if self.published == Some((generation, ready, self.deps.status.sets())) {
            return;
        }
        {
            let published = self
                .deps
                .status
                .inner
                .read()
                .unwrap_or_else(|p| p.into_inner());
            if published.ready == ready
                && published.node == self.me.node
                && published.instance == self.me.instance
                && published.sessions.len() == self.owned.len()
                && self.owned.iter().all(|(name, o)| {
                    // Names are unique on both sides and the counts equal:
                    // every owned session found equal means the same set.
                    published
                        .sessions
                        .binary_search_by(|p| p.name.as_str().cmp(name))
                        .is_ok_and(|i| {
                            let p = &published.sessions[i];
                            p.epoch == o.record.epoch
                                && p.state == o.record.state
                                && p.running == o.running
                                && p.restarts == o.record.restarts
                        })
                })
            {
                // Read under the snapshot's lock, which `set` counts under.
                let sets = self.deps.status.sets();
                drop(published);
                self.published = Some((generation, ready, sets));
                return;
            }
        }
        let mut sessions: Vec<SessionStatus> = self
            .owned
            .iter()
            .map(|(name, o)| SessionStatus {
                name: name.clone(),
                epoch: o.record.epoch,
                state: o.record.state,
                running: o.running,
                restarts: o.record.restarts,
            })
            .collect();
        sessions.sort_by(|a, b| a.name.cmp(&b.name));
        let sets = self.deps.status.set(StatusSnapshot {
            node: self.me.node.clone(),
            instance: self.me.instance.clone(),
            ready,
            sessions,
        });
        self.published = Some((generation, ready, sets));
    }

    /// Stops every running session (`why` goes into the journal); the claims
    /// stay owned until released or forgotten by the caller. Returns the
    /// runs that had ended by themselves before their stop reached them
    /// (see the runner's contract): a caller that goes on to release claims
    /// records them first (`finish_exits`), so a job that finished is not
    /// released to run again.
    async fn stop_all(&mut self, why: &str) -> Vec<Exit> {
        // In name order, as every loop over `owned` that acts: a HashMap's
        // order is random per process, and a seeded simulation must replay
        // the same requests in the same order in any process.
        let mut names: Vec<String> = self
            .owned
            .iter()
            .filter(|(_, o)| o.running)
            .map(|(n, _)| n.clone())
            .collect();
        names.sort_unstable();
        // Stopped together, STOP_CONCURRENCY at a time: a stop waits for
        // the session to exit, up to the runner's grace (a session that
        // ignores the request takes all of it), so one after the other a
        // node shutting down with a thousand sessions took a thousand
        // graces. Each is stopped before anything is written of it (its
        // claim is released after this returns), as before.
        let runner = self.deps.runner.clone();
        let mut ended: Vec<Exit> = futures::stream::iter(names.clone())
            .map(move |name| {
                let runner = runner.clone();
                async move { runner.stop(&name).await }
            })
            .buffer_unordered(STOP_CONCURRENCY)
            .filter_map(|x| async move { x })
            .collect()
            .await;
        ended.sort_by(|a, b| a.name.cmp(&b.name)); // buffer_unordered's order is the runner's
        for name in &names {
            let Some(o) = self.owned.get_mut(name) else {
                continue;
            };
            o.running = false;
            if ended.iter().any(|x| x.name == *name) {
                continue; // journalled as its exit by `finish_exits`
            }
            self.deps.journal.record(
                self.deps.clock.wall_ms(),
                EventKind::Stopped,
                Some(name),
                Some(o.record.epoch),
                why.to_string(),
            );
        }
        ended
    }

    /// Records the runs that ended by themselves, `ended` (from `stop_all`)
    /// and whatever the runner reported since the last pass, before their
    /// claims are released: a run its policy finishes gets its terminal
    /// state, and nothing is restarted (the node is handing its sessions
    /// over). A finished run-to-completion job is then never released to run
    /// again, however its end and the node's stop were ordered.
    async fn finish_exits(&mut self, ended: Vec<Exit>) {
        let mut exits = self.deps.runner.take_exits();
        exits.extend(ended);
        exits.sort_by(|a, b| a.name.cmp(&b.name)); // see `stop_all`
        for x in exits {
            self.on_exit(x, false).await;
        }
    }

    /// Reads this node's control object and applies it: cordon (no new
    /// sessions; published in the node record at the next renewal), drain
    /// (cordon, and hand every session over: stop it, release the claim),
    /// or neither. An unreadable object leaves things as they are.
    async fn apply_control(&mut self) -> bool {
        let c = match super::control::get(&self.deps.store, &self.me.node).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "reading this node's control object");
                return false;
            }
        };
        self.control_read = true;
        let (cordon, drain) = c.map_or((false, false), |c| (c.cordon || c.drain, c.drain));
        let was = self
            .deps
            .status
            .cordoned
            .swap(cordon, std::sync::atomic::Ordering::SeqCst);
        let mut changed = false;
        if was != cordon {
            self.event(
                if cordon {
                    EventKind::Cordoned
                } else {
                    EventKind::Uncordoned
                },
                None,
                None,
                if cordon {
                    "taking no new sessions"
                } else {
                    "taking sessions again"
                },
            );
            changed = true;
        }
        self.draining = drain;
        if drain && !self.owned.is_empty() {
            self.event(
                EventKind::Draining,
                None,
                None,
                format!("handing {} sessions over", self.owned.len()),
            );
            let ended = self.stop_all("node drained").await;
            self.finish_exits(ended).await;
            self.release_claims(false).await;
            changed = true;
        }
        changed
    }

    /// Releases every owned claim. At shutdown the rest are forgotten (the
    /// node lease is released next, which frees them all); on a drain a
    /// claim whose release did not commit stays owned, stopped, and is
    /// released again at the next pass (`apply_control`), so it is never
    /// left looking owned by a live node that will not run it.
    ///
    /// A finished run-to-completion session (succeeded, failed) is not
    /// released: its terminal claim stays as it is, and it is only
    /// forgotten here. A released claim is claimable by anyone, so releasing
    /// it ran a finished job again on the next node (DESIGN.md, "Session
    /// lifecycle": a terminal state survives every release). Its claim
    /// then names an owner that no longer holds it, which is harmless:
    /// `plan::claimable` never takes a finished claim of the manifest's
    /// digest, and one of a changed manifest is taken over at epoch + 1
    /// once that owner is judged gone, as any orphan.
    async fn release_claims(&mut self, forget_the_rest: bool) {
        self.owned
            .retain(|_, o| o.running || !o.record.state.is_terminal());
        let mut names: Vec<String> = self.owned.keys().cloned().collect();
        names.sort_unstable(); // see `stop_all`
        // Written CLAIM_CONCURRENCY at a time (one round trip each, and its
        // hint): one after the other, a node with a thousand sessions took
        // about a minute to shut down or drain at 30 ms per request, past
        // most supervisors' stop timeouts. Each outcome is then applied in
        // name order, as `set_state` would.
        let mut writes = Vec::with_capacity(names.len());
        for name in names {
            match self.state_change(&name, ClaimState::Released, None) {
                Ok(Some((version, next))) => writes.push((name, version, next)),
                Ok(None) => {}
                Err(e) => tracing::warn!(session = name, error = %e, "releasing claim"),
            }
        }
        let io = ClaimIo::of(&self.deps);
        let sent: Vec<_> = futures::stream::iter(writes)
            .map(move |(name, version, next)| {
                let io = io.clone();
                async move {
                    let w = ClaimWrite::send(io, &name, version, next).await;
                    (name, w)
                }
            })
            .buffered(CLAIM_CONCURRENCY)
            .collect()
            .await;
        for (name, w) in sent {
            if let Err(e) = self.apply_state_change(&name, w).await {
                tracing::warn!(session = name, error = %e, "releasing claim");
            }
        }
        if forget_the_rest {
            self.owned.clear();
        }
    }

    /// Lists, refreshes changed records, and acts. Returns whether anything
    /// changed (for pacing).
    /// The end of this node's validity now: the latest the renew task
    /// published, or zero once lost. Sessions are started with it, so they
    /// never get a deadline older than the lease's.
    /// Until when we may act on our sessions: the node lease's validity,
    /// and no later than `confirmed_until`.
    fn valid_until(&self) -> MonoTime {
        let lease = self
            .validity
            .as_ref()
            .map(|rx| *rx.borrow())
            .filter(|v| !v.lost)
            .map(|v| v.until);
        core::session_deadline(lease, self.confirmed_until()).unwrap_or(MonoTime::ZERO)
    }

    /// Our belief in the claims we hold, each as of the last request that
    /// showed it ours (`Owned::confirmed`): until that *send* time + `hold` −
    /// margin (`core::claim_belief`; the earliest of them bounds every
    /// session: the deadline is the node's). A claim deleted from the bucket
    /// does not fence our node lease, so this is what bounds us: a peer makes
    /// a vanished claim again only by taking over the marker written where
    /// it was, after observing that marker's version unchanged for `hold` +
    /// margin (with the longest ttl and `max_poll_ms` it ever read) from the
    /// *arrival* of the first listing that showed it; the marker landed after
    /// the deletion, which came after our confirming request was sent (or
    /// that request would not have shown our claim).
    /// Passes come at least every `max_poll`, and the first that no longer
    /// shows our claim stops the session at once; a stalled pass lets the
    /// sessions' deadlines lapse (they restart at the next pass).
    ///
    /// Read from `confirmed_floor` (O(1)): at or before the exact bound,
    /// and equal to it after `recount_confirmed`, which every pass runs.
    fn confirmed_until(&self) -> Option<MonoTime> {
        let belief = core::claim_belief(self.cfg.ttl, self.cfg.max_poll.max(self.belief_pace));
        // Checked in test builds (small fleets only: the walk is what the
        // floor saves): a floor above an owned session's confirmation
        // would give that session a deadline past its belief.
        #[cfg(debug_assertions)]
        if self.owned.len() <= 4096 {
            let exact = self.owned.values().map(|o| o.confirmed).min();
            debug_assert!(
                exact.is_none() || self.confirmed_floor.is_some_and(|f| Some(f) <= exact),
                "confirmed_floor {:?} above the earliest confirmation {exact:?}",
                self.confirmed_floor
            );
        }
        if self.owned.is_empty() {
            return None;
        }
        self.confirmed_floor.map(|t| t + belief)
    }

    /// Sets `confirmed_floor` to the exact earliest confirmation: once per
    /// pass (O(owned), as the pass's announcement always was), after the
    /// full listing's confirmations and the pass's removals.
    ///
    /// `raise`: the belief may be raised to the grown interval here. A full
    /// pass recounts without it before its interval is decided
    /// (`note_fleet_size`, after `reconcile_owned`), and with it after: a
    /// growth taken at the start of the pass may be given back by it (an
    /// older peer seen), and the grown belief must not be announced in
    /// between.
    fn recount_confirmed(&mut self, raise: bool) {
        self.confirmed_floor = self.owned.values().map(|o| o.confirmed).min();
        // Every claim confirmed at the grown interval (or none held): our
        // belief may be measured in it (see `belief_pace`).
        if raise
            && self.belief_pace < self.full_every
            && self.confirmed_floor.is_none_or(|f| f >= self.grown_at)
        {
            self.belief_pace = self.full_every;
        }
    }

    /// Keeps `seen_claims` (the highest epoch seen per claim of a listed
    /// manifest); called after each complete listing of `manifests/` and
    /// `sessions/`.
    fn observe_claim_absence(&mut self) {
        // Without a copy of every listed key or a key formatted per claim
        // into a fresh string: this runs over every session in the fleet
        // at each full listing (issue #14).
        use crate::keys::{MANIFESTS, SESSIONS, key_in, tail};
        let (manifests, corrupt) = (&self.manifests, &self.corrupt);
        let listed = |mkey: &str| manifests.contains_key(mkey) || corrupt.contains_key(mkey);
        let mut ckey = String::new();
        for m in manifests
            .keys()
            .chain(corrupt.keys().filter(|k| k.starts_with(MANIFESTS)))
        {
            let ckey = key_in(&mut ckey, SESSIONS, tail(MANIFESTS, m));
            // Markers too: a raised marker carries its last holder's epoch.
            if let Some((_, c)) = self.claims.get(ckey) {
                match self.seen_claims.get_mut(ckey) {
                    Some(e) => *e = (*e).max(c.epoch),
                    None => {
                        self.seen_claims.insert(ckey.to_string(), c.epoch);
                    }
                }
            }
        }
        let mut mkey = String::new();
        self.seen_claims
            .retain(|k, _| listed(key_in(&mut mkey, MANIFESTS, tail(SESSIONS, k))));
    }

    /// Writes a vanished marker at `epoch` to `key` under `cond` (a fresh
    /// nonce each time, so its version is new); the marker is returned too.
    async fn put_marker(&self, key: &str, epoch: u64, cond: Cond) -> (Result<Put>, ClaimRecord) {
        let marker =
            ClaimRecord::vanished(epoch, self.deps.entropy.hex_id(), self.deps.clock.wall_ms());
        let put = put_checked(
            &self.deps.store,
            key,
            Bytes::from(marker.encode()),
            cond,
            &marker.nonce,
            json_nonce,
        )
        .await;
        (put, marker)
    }

    /// Writes the marker of `name`'s vanished claim (create-if-absent; see
    /// `ClaimRecord::vanished`) at the highest epoch we saw for it. Landed,
    /// it is cached; rejected, someone wrote the key first (their marker,
    /// or a claim), which the next listing shows.
    async fn mark_vanished(&mut self, name: &str) -> Result<()> {
        let key = crate::keys::session(name);
        let epoch = self.seen_claims.get(&key).copied().unwrap_or(0);
        let (put, marker) = self.put_marker(&key, epoch, Cond::Create).await;
        match put? {
            Put::Committed(v) => {
                self.event(
                    EventKind::Vanished,
                    Some(name),
                    Some(epoch),
                    "its claim vanished from the bucket; marked, to be made again after the hold period",
                );
                self.claims.insert(key, (v, ClaimView::from(&marker)));
            }
            Put::Rejected(found) => self.cache_read_back(&key, found),
        }
        Ok(())
    }

    /// Caches what a rejected conditional write of claim `key` found there
    /// (None: nothing, for an If-Match).
    fn cache_read_back(&mut self, key: &str, found: Option<(Bytes, Version)>) {
        match found {
            Some((bytes, version)) => match decode_claim_view(key, &bytes) {
                Ok(c) => {
                    self.corrupt.remove(key);
                    self.claims.insert(key.to_string(), (version, c));
                }
                Err(_) => {
                    self.corrupt.insert(key.to_string(), version);
                }
            },
            None => {
                self.claims.remove(key);
            }
        }
        self.note_claim(key);
    }

    /// A vanished marker (at `version`, `epoch`) below the highest epoch we
    /// saw for `name`: raise it (If-Match), so that whichever node makes the
    /// claim again, however little it saw, goes above every epoch we saw.
    /// The new version restarts every node's watch. Nothing to do otherwise.
    async fn raise_marker(&mut self, name: &str, version: Version, c: &ClaimView) -> Result<()> {
        let key = crate::keys::session(name);
        let seen = self.seen_claims.get(&key).copied().unwrap_or(0);
        let Some(epoch) = core::marker_raise(Some(c), seen) else {
            return Ok(());
        };
        let (put, marker) = self.put_marker(&key, epoch, Cond::Match(version)).await;
        if let Put::Committed(v) = put? {
            self.claims.insert(key, (v, ClaimView::from(&marker)));
        }
        Ok(())
    }

    /// How long before the vanished claim of `name` may be made again
    /// (`core::vanished_claim_wait`, on the version standing where it was as
    /// this node's listings observed it); `None`: it may now.
    ///
    /// Ripe by what this node has read, it is still pending until it has
    /// read every node record again (`read_holds`), and it is judged as of
    /// those reads: ripe only if its wait had run out when they were sent.
    /// Why: a peer whose full listings grew further apart with the fleet
    /// (`core::full_listing_pace`) may have published the longer interval
    /// since we last read its record. What makes the reads enough is the
    /// holder's side: its belief is never longer than what its record
    /// showed when the belief's confirmation was made (a longer interval is
    /// published before it is used, `core::adopt_pace`, and old
    /// confirmations keep the old belief, `belief_pace`; a shorter one
    /// shortens the belief at once), and `longest` only grows. So a wait
    /// that had run out as of the reads stays so: the holder's deadline
    /// for the vanished claim had passed by then, and nothing confirms
    /// that claim again.
    fn absent_claim_wait(&self, name: &str) -> Option<Duration> {
        let known = self.absent_claim_wait_as_of(name, Duration::ZERO);
        if known.is_some() {
            return known;
        }
        match self.holds_read {
            Some(at) => {
                let back = self.deps.clock.now().saturating_since(at);
                self.absent_claim_wait_as_of(name, back)
                    .map(|left| left.saturating_sub(back))
            }
            // Left: nothing but the reads.
            None => Some(Duration::ZERO),
        }
    }

    /// Must the node records be read again (`read_holds`) before `name`'s
    /// vanished claim may be made: ripe by the holds this node knows, not
    /// ripe as of the last reads, and those at least a ttl ago (a name
    /// that stays unclaimable by this node for other reasons, rank or a
    /// selector, costs one read, not one per pass).
    fn holds_unread_for(&self, name: &str) -> bool {
        if self.absent_claim_wait_as_of(name, Duration::ZERO).is_some() {
            return false;
        }
        match self.holds_read {
            None => true,
            Some(at) => {
                let back = self.deps.clock.now().saturating_since(at);
                back >= self.cfg.ttl && self.absent_claim_wait_as_of(name, back).is_some()
            }
        }
    }

    /// Reads every peer's node record again (a listing of `nodes/` and a
    /// GET each) before a vanished claim is made again: its holder's
    /// published interval, whatever it is now, goes into the hold
    /// (`longest`). Only when a vanished claim's wait ran out, at most once
    /// a ttl (`holds_unread_for`). Counts as read only if every listed
    /// record was read and decoded: a corrupt one (even a truncated
    /// response) may be the holder's, whose interval we would not know.
    async fn read_holds(&mut self) -> Result<()> {
        // Sent before the reads: what they show is as of this moment or later.
        let at = self.deps.clock.now();
        let mut listed = Vec::new();
        let mut listing = self.deps.store.list(crate::keys::NODES);
        while let Some(e) = listing.next().await {
            let e = e.map_err(|e| Error::from_store("list", crate::keys::NODES, e))?;
            listed.push((e.key, e.version));
        }
        drop(listing);
        let own = crate::keys::node(&self.cfg.id);
        for (key, version) in listed.iter().filter(|(k, _)| *k != own) {
            self.fetch_node(key, None).await?;
            if !self.corrupt_nodes.contains(key) {
                continue;
            }
            // Corrupt as read (a truncated response, or foreign bytes): its
            // interval is unknown, unless nothing has renewed it for a ttl
            // and the margin, so that no live holder stands behind it (the
            // liveness rule; a holder's belief ends with its lease).
            let ttl = self.cfg.ttl.max(self.longest.0);
            let still = self
                .client
                .observer()
                .unchanged_for(key, version, self.deps.clock.now());
            if still.is_none_or(|d| d < ttl.saturating_add(default_margin(ttl))) {
                return Err(Error::Corrupt {
                    key: key.clone(),
                    reason: "a node record read before making a vanished claim again".into(),
                });
            }
        }
        self.holds_read = Some(at);
        Ok(())
    }

    /// The wait of `absent_claim_wait` by the holds this node knows, with
    /// the observation taken `back` ago (as of earlier reads).
    fn absent_claim_wait_as_of(&self, name: &str, back: Duration) -> Option<Duration> {
        let ckey = crate::keys::session(name);
        let holds = core::Holds {
            own_ttl: self.cfg.ttl,
            own_max_poll: self.confirm_every(),
            // `longest` keeps every record we ever read, gone or not.
            longest_ttl: self.longest.0,
            longest_max_poll: self.longest.1,
        };
        // Missing (no marker yet), or its version not seen in a listing:
        // no observation.
        let unchanged_for = self.claims.get(&ckey).and_then(|(v, _)| {
            self.client
                .observer()
                .unchanged_for(&ckey, v, self.deps.clock.now())
                .map(|d| d.saturating_sub(back))
        });
        core::vanished_claim_wait(holds, unchanged_for)
    }

    /// Has no listing shown the version standing where `name`'s claim
    /// vanished (its marker) yet?
    fn marker_unobserved(&self, name: &str) -> bool {
        let ckey = crate::keys::session(name);
        self.claims.get(&ckey).is_none_or(|(v, _)| {
            self.client
                .observer()
                .unchanged_for(&ckey, v, self.deps.clock.now())
                .is_none()
        })
    }

    /// The claim gate for session `name` (manifest key `mkey`, claim key
    /// `ckey`, its owner's node key `okey`) as this pass sees it: the one
    /// question the claim loop asks of every name it looks at.
    #[allow(clippy::too_many_arguments)]
    fn gate_for(
        &self,
        name: &str,
        mkey: &str,
        ckey: &str,
        okey: Option<&str>,
        mv: &plan::ManifestView,
        cv: Option<&ClaimView>,
        views: &[plan::NodeView],
        refetched: &std::collections::HashSet<String>,
        now: MonoTime,
    ) -> core::Gate {
        let claimable = plan::claimable(mv, cv, views, &self.me);
        let owner_stale = match (cv, okey) {
            (Some(c), Some(key)) if c.state != ClaimState::Released => {
                !refetched.contains(key)
                    && self
                        .nodes
                        .get(key)
                        .is_none_or(|n| n.record.holder.instance != c.owner.instance)
            }
            _ => false,
        };
        let vanished = self.claim_vanished(ckey, cv);
        core::gate(
            &core::Candidate {
                claim_corrupt: self.corrupt.contains_key(ckey),
                manifest_corrupt: self.corrupt.contains_key(mkey),
                owner_corrupt: okey.is_some_and(|k| self.corrupt_nodes.contains(k)),
                claimable,
                control_read: self.control_read,
                cordoned: self.deps.status.cordoned(),
                draining: self.draining,
                absence_pending: vanished && self.absent_claim_wait(name).is_some(),
                owner_stale,
                claimable_for: self
                    .first_claimable
                    .get(name)
                    .map_or(Duration::ZERO, |first| now.saturating_since(*first)),
                grace: self.cfg.grace,
                predecessor_unproven: self.predecessor_unproven(cv),
            },
            || {
                let ranked = plan::rank(mv, views);
                let position = ranked.iter().position(|n| n.id == self.me.node)?;
                let ahead_idle_for = ranked[..position]
                    .iter()
                    .filter_map(|n| self.progress.get(&n.id).and_then(|(_, t)| *t))
                    .map(|t| now.saturating_since(t))
                    .min()
                    .unwrap_or(Duration::MAX);
                Some(core::Rank {
                    position,
                    ahead_idle_for,
                })
            },
        )
    }

    /// Is the claim at `key` (as last read) gone (`core::claim_gone`)?
    fn claim_vanished(&self, key: &str, claim: Option<&ClaimView>) -> bool {
        core::claim_gone(claim, self.seen_claims.get(key).copied().unwrap_or(0))
    }

    /// Has node record `key`, a claim's owner, been observed absent long
    /// enough (`core::owner_absent_long_enough`)?
    fn node_absent_long_enough(&self, key: &str) -> bool {
        self.absent_nodes.get(key).is_some_and(|(since, ttl)| {
            core::owner_absent_long_enough(
                self.deps.clock.now().saturating_since(*since),
                *ttl,
                self.cfg.ttl,
            )
        })
    }

    #[tracing::instrument(level = "debug", name = "node pass", skip_all)]
    async fn tick(&mut self) -> Result<bool> {
        let mut changed = false;
        self.pass += 1;
        // Is this still the bucket we serve? Checked before any epoch is
        // issued (`ensure_marker` before every claim and fence write), and
        // at least every MARKER_EVERY ttls when nothing is written: a wiped
        // bucket also fails our renewals within ttl/3, which stops
        // everything, and the next registration checks it again.
        if core::marker_due(
            self.marker_checked
                .map(|(_, t)| self.deps.clock.now().saturating_since(t)),
            self.cfg.ttl,
            MARKER_EVERY,
        ) {
            self.ensure_marker().await?;
        }
        // Operator control (`control/<id>`): at the first pass, every
        // CONTROL_EVERY passes, and at once when nudged.
        let nudged = self
            .deps
            .status
            .nudged
            .swap(false, std::sync::atomic::Ordering::SeqCst);
        // Until a read succeeds (a cordoned node restarting must not claim
        // in the meantime), and while a drain has sessions left, every pass.
        if core::control_due(
            nudged,
            self.control_read,
            self.draining && !self.owned.is_empty(),
            self.pass,
            super::control::CONTROL_EVERY,
        ) && self.apply_control().await
        {
            changed = true;
            self.rescan = true;
        }
        // A pass that failed half-way may have consumed state that says
        // what to look at (the fleet's change, names left waiting): look at
        // everything this time.
        if std::mem::replace(&mut self.pass_incomplete, true) {
            self.rescan = true;
            self.nodes_due = true;
        }
        self.take_published_pace();
        let now = self.deps.clock.now();
        let full = core::full_listing_due(
            self.cfg.feed_on(),
            self.last_full.map(|t| now.saturating_since(t)),
            self.full_every,
            self.cfg.max_poll,
            self.full_forced
                // Hints older than the retention may be gone unread.
                || self.feed_read_at.is_some_and(|t| {
                    now.saturating_since(t).saturating_add(core::feed_skew(self.cfg.ttl))
                        >= super::feed::RETENTION
                }),
        );
        let listed_at = self.deps.clock.now();
        // Sent before the listings below: every hint stamped from then on
        // (less the skew window) is for a write they may not have shown.
        let wall_at = self.deps.clock.wall_ms();
        // The feed, from the cursor: on a full pass for node records only
        // (a full listing covers manifests and claims, not peers'
        // attributes). Committed at the end of the pass, once acted on.
        // Read before `nodes/`, whose listing a hint naming an unknown
        // peer makes due.
        let read = if self.cfg.feed_on() {
            Some(
                self.feed
                    .read(&self.deps.store, wall_at)
                    .await
                    .map_err(|e| Error::from_store("list", crate::keys::CHANGES, e))?,
            )
        } else {
            None
        };
        let hinted_keys: Vec<String> = read
            .as_ref()
            .map(|r| r.keys.iter().cloned().collect())
            .unwrap_or_default();
        let (node_keys, keys): (Vec<String>, Vec<String>) = hinted_keys
            .into_iter()
            .partition(|k| k.starts_with(crate::keys::NODES));
        let mine = crate::keys::node(&self.me.node);
        // A peer's record changed (a fence, a release, news in its
        // attributes), or one we do not know yet: `nodes/` is listed this
        // pass. The record the hint makes us read counts as a release only
        // at the version a listing showed (`peer_evidence`: a release read
        // at another version may be a new instance's), so without the
        // listing a hinted tombstone would be read and not acted on until
        // the slow `nodes/` listing (`NodeConfig::nodes_every`) or the bell.
        // Node hints are rare (at most a few per peer and hour), so this
        // is not a listing per pass.
        let peer_hinted = node_keys.iter().any(|k| *k != mine);
        // `nodes/` (see `NodeConfig::nodes_every`). A pass that does not
        // list it judges peers as of the last listing that did
        // (`nodes_listed_at`): later than it could have, never earlier.
        let node_entries = if core::nodes_listing_due(
            full || !self.cfg.feed_on(),
            std::mem::take(&mut self.nodes_due) || nudged || peer_hinted,
            now.saturating_since(self.nodes_listed_at),
            self.cfg.nodes_every,
        ) {
            let at = self.deps.clock.now();
            let entries = self.client.observe_listing(crate::keys::NODES).await?;
            self.nodes_listed_at = at;
            Some(entries)
        } else {
            None
        };
        // Names a hint named this pass (light passes only).
        let mut hinted: std::collections::BTreeSet<String> = Default::default();
        // What a full listing counted (`note_fleet_size`, after reconcile).
        let mut fleet_size = None;
        if full {
            // Manifests are never judged by expiry: listed without the
            // observer, which then remembers nodes and claims only.
            let mut manifests_listed = Listed::new(crate::keys::MANIFESTS);
            list_into(
                &self.deps.store,
                &mut manifests_listed,
                &self.manifests,
                &self.corrupt,
            )
            .await?;
            let claims_listed_at = self.deps.clock.now();
            // Only what the absence rules may wait out is observed: a
            // version this node holds as an ordinary claim is never judged
            // by how long it stood (`absent_claim_wait` runs on vanished
            // markers and placeholders only), and when a marker replaces
            // it, that is a version the cache does not know, observed from
            // the first listing that shows it, as before.
            let claims = &self.claims;
            let corrupt = &self.corrupt;
            let mut claims_listed = Listed::new(crate::keys::SESSIONS);
            self.client
                .observe_listing_each(
                    crate::keys::SESSIONS,
                    |e| {
                        !claims.get(&e.key).is_some_and(|(v, c)| {
                            *v == e.version && !c.is_vanished() && !c.is_placeholder()
                        })
                    },
                    |e| claims_listed.take(e, claims, corrupt),
                )
                .await?;
            // Peers renew every ttl/3, so their versions always change: that
            // is not news (it does not reset pacing) and needs no read.
            if let Some(entries) = &node_entries {
                self.refresh_nodes(entries).await?;
            }
            self.read_hinted_nodes(node_keys).await?;
            self.note_hint_form();
            changed |= refresh(
                &self.deps.store,
                manifests_listed,
                &mut self.manifests,
                &mut self.corrupt,
                KnownManifest::decode,
                |_, _, _| {},
            )
            .await?;
            // What this listing observed only because the cache did not
            // know it yet (a node's first listing: every claim), now read:
            // the ordinary claims among it need no observation either.
            // (Only a read can turn a watched version into an ordinary
            // claim at that version: one watched and not read was a marker
            // or placeholder the cache already held, or foreign, or known
            // corrupt, and stays so.)
            let observer = self.client.observer();
            changed |= refresh(
                &self.deps.store,
                claims_listed,
                &mut self.claims,
                &mut self.corrupt,
                decode_claim_view,
                |key, listed, (v, c)| {
                    if v == listed && !c.is_vanished() && !c.is_placeholder() {
                        observer.forget(key);
                    }
                },
            )
            .await?;
            self.observe_claim_absence();
            // Every claim we hold that this listing showed at our version is
            // confirmed as of the listing's send time (see
            // `confirmed_until`); one it did not show is not.
            // (Compared through the refreshed cache, which holds the version
            // a GET returned when the listing's differed: on a versioned
            // bucket listings carry ETags only.)
            let mut ckey = String::new();
            for (name, o) in self.owned.iter_mut() {
                if self
                    .claims
                    .get(crate::keys::key_in(&mut ckey, crate::keys::SESSIONS, name))
                    .is_some_and(|(v, _)| *v == o.version)
                {
                    o.confirmed = o.confirmed.max(claims_listed_at);
                }
            }
            self.last_full = Some(listed_at);
            self.full_forced = false;
            self.rescan = true;
            fleet_size = Some((
                (self.manifests.len() + self.claims.len()) as u64,
                claims_listed_at,
            ));
        } else {
            if let Some(entries) = &node_entries {
                self.refresh_nodes(entries).await?;
            }
            self.read_hinted_nodes(node_keys).await?;
            self.note_hint_form();
            // A peer of an older build joined while our interval is grown:
            // the next pass lists everything, which confirms our claims
            // and takes the fixed interval back (`note_fleet_size`).
            // Shrinking here instead would end the beliefs of claims
            // confirmed up to the grown interval ago, and stop them.
            if self.full_every > self.cfg.full_every
                && self.older_peer_live(super::attrs::PROTO_READS_HOLDS)
            {
                self.full_forced = true;
            }
            let (manifest_keys, claim_keys): (Vec<String>, Vec<String>) = keys
                .into_iter()
                .partition(|k| k.starts_with(crate::keys::MANIFESTS));
            changed |= refresh_keys(
                &self.deps.store,
                &manifest_keys,
                &mut self.manifests,
                &mut self.corrupt,
                KnownManifest::decode,
            )
            .await?;
            changed |= refresh_keys(
                &self.deps.store,
                &claim_keys,
                &mut self.claims,
                &mut self.corrupt,
                decode_claim_view,
            )
            .await?;
            for k in &claim_keys {
                self.note_claim(k);
            }
            for k in manifest_keys.iter().chain(&claim_keys) {
                hinted.insert(name_of(k).to_string());
            }
        }
        let nodes = &self.nodes;
        self.watch_missing
            .retain(|k, v| nodes.get(k).is_some_and(|n| n.listed == *v));
        self.deps.status.set_corrupt(
            self.corrupt
                .keys()
                .chain(&self.corrupt_nodes)
                .cloned()
                .collect(),
        );
        self.recount_confirmed(!full);
        // Every manifest is claimable at once while a fleet is placed; the
        // table that held them is given back once placement is over.
        crate::memory::shrink_if_sparse(&mut self.first_claimable);
        // ZERO: no claims, no bound beyond the lease's.
        self.confirmed_tx
            .send_replace(self.confirmed_until().unwrap_or(MonoTime::ZERO));
        self.deps.runner.announce(self.valid_until());

        let now = self.deps.clock.now();
        // Keep the brisk pace while a peer's lease is about to expire (its
        // listed version unchanged for over half its TTL): detecting the
        // expiry then costs one base poll, not one backed-off poll.
        // The next pass lists `nodes/` then, whatever `nodes_every` says:
        // the expiry is judged on a listing.
        let expiring = self.nodes.iter().any(|(key, n)| {
            core::peer_expiring(
                n.record.released,
                self.client
                    .observer()
                    .unchanged_for(key, &n.listed, self.nodes_listed_at),
                Duration::from_millis(n.record.ttl_ms),
            )
        });
        self.nodes_due |= expiring;
        changed |= expiring;
        // Loads as of this pass's listing, for every node alike (our own
        // claims from this pass are not counted until the next): see
        // `claim_loads`.
        let loads = self.claim_loads();
        let mut views = self.node_views(&loads);
        // A peer marked unproven that has not stood still yet (a twin, live
        // or ended) holds back the earlier instance's sessions until it
        // has: that is judged on listings, so list `nodes/` every pass
        // until then, not at the slow pace (rare, and bounded by a ttl +
        // margin of stillness or the end of the twin's own wait).
        self.nodes_due |= views.iter().any(|v| v.unproven);
        self.note_progress(&views, now);
        let mut refetched = std::collections::HashSet::new();
        changed |= self.handle_exits().await;
        changed |= self.reconcile_owned().await;
        if full {
            let announced = self.confirmed_until();
            if let Some((objects, listed_at)) = fleet_size
                && self.cfg.feed_on()
            {
                // A growth is judged on the records as they stand.
                let grows = core::full_listing_pace(
                    self.cfg.full_every,
                    self.cfg.full_every_objects,
                    objects,
                ) > self.full_every;
                let read = !grows || self.fetch_unread_nodes().await;
                // Every claim we still hold was confirmed by this listing
                // (one it did not show and that could not be read back
                // keeps the listing before's confirmation).
                let confirmed = self.owned.values().all(|o| o.confirmed >= listed_at);
                self.note_fleet_size(objects, read, confirmed);
            }
            // The interval is decided: the belief may be raised to it now,
            // or was shortened with it. Either way, what was announced
            // above, and what the claims below are started with, is
            // measured in it from now on (the floor recounted without what
            // reconcile dropped).
            self.recount_confirmed(true);
            if self.confirmed_until() != announced {
                self.confirmed_tx
                    .send_replace(self.confirmed_until().unwrap_or(MonoTime::ZERO));
                self.deps.runner.announce(self.valid_until());
            }
        }

        // Claim what is claimable, within capacity, in rank order: every
        // manifest after a full listing or a change in the fleet, else only
        // those hints named and those left waiting by the last pass.
        let mut seen: Vec<_> = views
            .iter()
            .map(|v| {
                (
                    v.id.clone(),
                    v.instance.clone(),
                    v.live,
                    v.capacity > 0,
                    v.unproven,
                )
            })
            .collect();
        seen.sort();
        // A change in the fleet is looked at where it matters: the names
        // whose claim names a peer that changed (`core::peers_changed`
        // says why no others), not every manifest. A survivor of a death
        // at 100,000 sessions looks at its dead peer's ~10,000, not all.
        let changed_peers = core::peers_changed(&self.fleet_seen, &seen);
        self.fleet_seen = seen;
        let scan_all = std::mem::take(&mut self.rescan);
        let names: Vec<String> = if scan_all {
            let mut all: Vec<String> = self
                .manifests
                .keys()
                .map(|k| name_of(k).to_string())
                .collect();
            all.sort();
            all
        } else {
            let mut some = std::mem::take(&mut self.revisit);
            some.extend(hinted.iter().cloned());
            if !changed_peers.is_empty() {
                some.extend(
                    self.claims
                        .iter()
                        .filter(|(_, (_, c))| changed_peers.contains(c.owner.node.as_str()))
                        .filter_map(|(k, _)| crate::keys::name_in(crate::keys::SESSIONS, k))
                        .map(str::to_string),
                );
            }
            some.into_iter()
                .filter(|n| self.manifests.contains_key(&crate::keys::manifest(n)))
                .collect()
        };
        self.fence_dead_peers(&views, &loads).await;
        let mut revisit = std::collections::BTreeSet::new();
        // `load()` walks every owned session: counted once, then by what
        // each claim adds (one that could not start is failed, terminal,
        // and not counted), so the loop is not O(names × owned).
        let mut load = self.load();
        // Claims decided and not yet sent (`claim_batch`).
        let mut batch: Vec<ClaimTry> = Vec::new();
        let (mut mkey, mut ckey, mut okey_buf) = (String::new(), String::new(), String::new());
        for name in names {
            // A pass over 100,000 sessions is hundreds of milliseconds of
            // work with no I/O between claims; without a yield point it
            // holds its worker thread all along, and on a busy or
            // single-threaded runtime the renew task (and every other
            // node's) waits behind it past its deadline. Tokio's coop
            // budget yields once every 128 items, at no cost otherwise.
            tokio::task::coop::consume_budget().await;
            if self.owned.contains_key(&name) {
                continue;
            }
            debug_assert_eq!(load as usize, self.load() as usize + batch.len());
            if load >= self.cfg.capacity {
                // What is left is looked at again once there is room.
                self.rescan = true;
                break;
            }
            // First asked by reference, with keys formatted into buffers:
            // in the rescan after a full listing nearly every name is held
            // by a live peer, and is answered so without an allocation
            // (issue #14: 100,000 names every full listing).
            crate::keys::key_in(&mut mkey, crate::keys::MANIFESTS, &name);
            crate::keys::key_in(&mut ckey, crate::keys::SESSIONS, &name);
            let first = {
                let mv = &self.manifests[mkey.as_str()].1.view;
                let cv = self.claims.get(ckey.as_str()).map(|(_, c)| c);
                let okey = cv
                    .map(|c| crate::keys::key_in(&mut okey_buf, crate::keys::NODES, &c.owner.node));
                self.gate_for(&name, &mkey, &ckey, okey, mv, cv, &views, &refetched, now)
            };
            if first == core::Gate::NotClaimable {
                self.first_claimable.remove(&name);
                continue;
            }
            // Unless claimed below, looked at again.
            revisit.insert(name.clone());
            let mv = self.manifests[mkey.as_str()].1.view.clone();
            let claim = self.claims.get(ckey.as_str()).cloned();
            let cv = claim.as_ref().map(|(_, c)| c.clone());
            let owner_key = cv.as_ref().map(|c| crate::keys::node(&c.owner.node));
            // Asked again at most twice: after re-reading a stale owner
            // record, and, for a vanished claim ripe by what we knew, after
            // reading every node record again (`absent_claim_wait`; a failed
            // read leaves the claim waiting, and the pass goes on).
            let mut gate = first;
            let mut holds_tried = false;
            loop {
                match (gate, &owner_key) {
                    (core::Gate::RefetchOwner, Some(key)) if !refetched.contains(key) => {
                        refetched.insert(key.clone());
                        if let Err(e) = self.fetch_node(key, None).await {
                            // What this pass decided is sent before it ends (a
                            // fence already written may be waiting on it).
                            let _ = self.send_claims(&mut batch, &mut revisit, &mut load).await;
                            return Err(e);
                        }
                    }
                    (core::Gate::AbsencePending, _)
                        if !holds_tried && self.holds_unread_for(&name) =>
                    {
                        holds_tried = true;
                        if let Err(e) = self.read_holds().await {
                            tracing::warn!(session = name, error = %e, "reading node records before a vanished claim");
                        }
                    }
                    _ => break,
                }
                views = self.node_views(&loads);
                gate = self.gate_for(
                    &name,
                    &mkey,
                    &ckey,
                    owner_key.as_deref(),
                    &mv,
                    cv.as_ref(),
                    &views,
                    &refetched,
                    now,
                );
            }
            match gate {
                core::Gate::NotClaimable => {
                    self.first_claimable.remove(&name);
                    revisit.remove(&name);
                    continue;
                }
                core::Gate::Skip | core::Gate::RefetchOwner => continue,
                core::Gate::AbsencePending => {
                    // One key's trouble (a write refused or lost) must not
                    // stop the pass for every other session.
                    let r = match &claim {
                        None => self.mark_vanished(&name).await,
                        Some((v, c)) => self.raise_marker(&name, v.clone(), c).await,
                    };
                    if let Err(e) = r {
                        tracing::warn!(session = name, error = %e, "writing a vanished marker");
                    }
                    if !self.cfg.feed_on() {
                        changed = true; // keep polling briskly meanwhile
                    } else if self.marker_unobserved(&name) {
                        // The wait runs from a listing's first sight of the
                        // marker, then on time alone (the claim is made by
                        // an If-Match on that very version): a full listing
                        // next if none has seen it yet, else the usual pace
                        // (the name is revisited every pass).
                        self.full_forced = true;
                    }
                    continue;
                }
                core::Gate::Unranked => {
                    self.first_claimable.entry(name.clone()).or_insert(now);
                    continue;
                }
                core::Gate::Grace => {
                    self.first_claimable.entry(name.clone()).or_insert(now);
                    changed = true; // keep polling briskly while a claim is pending
                    continue;
                }
                core::Gate::Claim => {
                    self.first_claimable.entry(name.clone()).or_insert(now);
                }
            }
            // A claim no token can follow is left before the fence: its
            // owner's record read at every pass would buy nothing.
            if let Some((_, c)) = &claim
                && crate::record::next_epoch(c.epoch).is_none()
            {
                if self.stuck.insert(name.clone()) {
                    tracing::warn!(
                        session = %name,
                        epoch = c.epoch,
                        "claim at the highest epoch: no fencing token above it exists; not claimed"
                    );
                }
                continue;
            }
            if let Some((_, c)) = &claim {
                match self.fence_owner(c).await {
                    Ok(true) => {}
                    Ok(false) => {
                        views = self.node_views(&loads);
                        changed = true;
                        continue;
                    }
                    Err(e) => {
                        // As above: the batch goes out before the error.
                        let _ = self.send_claims(&mut batch, &mut revisit, &mut load).await;
                        return Err(e);
                    }
                }
            }
            self.after_fence(&views);
            if let Some(t) = self.claim_try(&name, mv.digest.to_string(), claim, None) {
                // Counted as if it lands; recounted once the batch is in.
                load += 1;
                batch.push(t);
                if batch.len() >= CLAIM_BATCH {
                    changed |= self
                        .send_claims(&mut batch, &mut revisit, &mut load)
                        .await?;
                }
            }
        }
        changed |= self
            .send_claims(&mut batch, &mut revisit, &mut load)
            .await?;
        self.revisit = revisit;
        // As a full listing forgets the epochs of sessions whose manifest
        // is gone (`observe_claim_absence`), so that one deleted with
        // `delete`, its tombstone collected by `gc` (which raises the epoch
        // floor) and applied again is placed at once: but only over a
        // holder's own release (a tombstone, not apply's placeholder nor a
        // vanished marker, which are released too), read or written this
        // pass. A missing claim is what the absence rules wait out (a claim
        // deleted by hand), so its epoch is kept: a placeholder over it is
        // then a vanished claim, made again above it.
        for name in &hinted {
            let ckey = crate::keys::session(name);
            if !self.manifests.contains_key(&crate::keys::manifest(name))
                && self.claims.get(&ckey).is_some_and(|(_, c)| {
                    c.state == ClaimState::Released && !c.is_vanished() && !c.is_placeholder()
                })
            {
                self.seen_claims.remove(&ckey);
            }
        }
        // Acted on: the feed's hints are seen (a pass that returned early
        // with an error reads them again).
        if let Some(read) = read {
            self.feed.commit(read);
        }
        if full || self.cfg.feed_on() {
            // Covered by this pass's listings or the feed read.
            self.feed_read_at = Some(listed_at);
        }
        if full {
            self.feed.covered_until(wall_at);
        }
        // Retention of the feed: one node does it (the first live id), in a
        // task of its own (a burst leaves hundreds of thousands of hints),
        // every RETENTION / 2; others' deletes would only race it. Whether
        // or not this node reads the feed: every CLI writer hints.
        let first = views.iter().filter(|v| v.live).map(|v| &v.id).min() == Some(&self.me.node);
        let due = self.expired_at.is_none_or(|t| {
            self.deps.clock.now().saturating_since(t) >= super::feed::RETENTION / 2
        });
        let idle = self.expiring.as_ref().is_none_or(|t| t.0.is_finished());
        if first && due && idle {
            self.expired_at = Some(self.deps.clock.now());
            let store = self.deps.store.clone();
            let wall = self.deps.clock.wall_ms();
            self.expiring = Some(AbortOnDrop(tokio::spawn(async move {
                match super::feed::expire(&store, wall).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!(hints = n, "expired change hints"),
                    Err(e) => tracing::warn!(error = %e, "expiring change hints"),
                }
            })));
        }
        self.pass_incomplete = false;
        Ok(changed)
    }

    /// Fences, once per pass, each peer this pass judges dead that still
    /// holds sessions: its listed version has stood still for its ttl +
    /// margin (no view of its id `live`), its record is not a release or a
    /// fence already, and `loads` counts claims of its current instance.
    /// Then hints the tombstones, rings the bell and nudges the ranked
    /// takers (`after_fence`). Best effort: a failure is logged and the
    /// pass goes on (the takers fence it themselves).
    ///
    /// Why here, before the claims and whatever this node's rank, room or
    /// cordon: a dead node's record is read closely only by its ring
    /// watchers, and the nodes ranked for its sessions are mostly others,
    /// who would judge it dead themselves only at their own next pass and
    /// a ttl + margin after their own first sight of its last version. The
    /// fence is the same write, under the same rule, as the first taker's
    /// (`fence_owner`: If-Match on the version judged); fencing is not
    /// claiming, so a full or cordoned node may do it. A peer that renewed
    /// after all rejects it, and the pass goes on.
    async fn fence_dead_peers(&mut self, views: &[NodeView], loads: &HashMap<String, u32>) {
        let mut dead: Vec<(String, String)> = self
            .nodes
            .iter()
            .filter(|(key, n)| {
                let (id, instance) = (&n.record.holder.node, &n.record.holder.instance);
                // A record under its own key only (one copied under another
                // key must not get its namesake fenced), not final, holding
                // claims, and no view of its id live (as `plan::owner_live`
                // asks before a takeover). `fence_owner` reads it again at
                // the listed version and judges that version's own ttl.
                **key == crate::keys::node(id)
                    && !n.record.released
                    && *id != self.me.node.as_str()
                    && loads
                        .get(&format!("{id}/{instance}"))
                        .is_some_and(|c| *c > 0)
                    && views.iter().any(|v| v.id == *id && v.instance == *instance)
                    && !views.iter().any(|v| v.id == *id && v.live)
            })
            .map(|(_, n)| {
                (
                    n.record.holder.node.clone(),
                    n.record.holder.instance.clone(),
                )
            })
            .collect();
        // In key order: a seeded simulation replays the same writes.
        dead.sort();
        for (id, instance) in dead {
            let claim = self
                .claims
                .values()
                .find(|(_, c)| {
                    c.owner.node == id
                        && c.owner.instance == instance
                        && c.state != ClaimState::Released
                        && !c.state.is_terminal()
                })
                .map(|(_, c)| c.clone());
            if let Some(c) = claim {
                // Best effort: the takers fence it themselves if this fails
                // (an unreadable record must not stall the whole pass).
                if let Err(e) = self.fence_owner(&c).await {
                    tracing::warn!(peer = id, error = %e, "fencing a dead peer");
                }
            }
        }
        self.after_fence(views);
    }

    /// After this node fenced peers (their tombstones landed): hints each
    /// fenced record in the change feed, then nudges the nodes placement
    /// ranks first for their sessions, from a task beside the pass.
    ///
    /// Why the hint: a light pass sees a peer's record only as a version in
    /// the `nodes/` listing, and reads its body on a hint (or once per
    /// `--full-every`); a hinted peer also makes that pass list `nodes/`,
    /// so the tombstone read is the version listed and counts. Without it
    /// a tombstone looks like one more renewal, and the ranked takers would
    /// wait for it to stand still for a ttl + margin of their own before
    /// taking anything. With it, a lost ring of the bell costs a taker at
    /// most its idle pause.
    ///
    /// Why the nudge (`super::nudge`): with it the ranked takers run a pass
    /// within `NUDGE_MIN_GAP`, read the hinted tombstone, and claim at once
    /// by the usual rules, instead of at their next pass (up to an idle
    /// pause later). Two per session, as `apply` nudges (views of load
    /// differ a little between nodes), at most `MAX_NUDGED` in all.
    fn after_fence(&mut self, views: &[NodeView]) {
        while self.nudges.try_join_next().is_some() {}
        if self.fenced_now.is_empty() {
            return;
        }
        let dead: Vec<String> = {
            let mut d = std::mem::take(&mut self.fenced_now);
            d.sort();
            d.dedup();
            d
        };
        let mut takers = std::collections::BTreeSet::new();
        if self.deps.nudge.is_some() {
            for (ckey, (_, c)) in self.claims.iter() {
                if takers.len() >= super::nudge::MAX_NUDGED {
                    break;
                }
                if !dead.contains(&c.owner.node) || c.state == ClaimState::Released {
                    continue;
                }
                let Some(name) = crate::keys::name_in(crate::keys::SESSIONS, ckey) else {
                    continue;
                };
                let Some((_, m)) = self.manifests.get(&crate::keys::manifest(name)) else {
                    continue;
                };
                for v in plan::rank(&m.view, views)
                    .into_iter()
                    .filter(|v| !dead.contains(&v.id))
                    .take(2)
                {
                    if v.id != self.me.node.as_str() {
                        takers.insert(v.id.clone());
                    }
                }
            }
        }
        let peers: Vec<(String, Option<String>)> = takers
            .into_iter()
            .take(super::nudge::MAX_NUDGED)
            .map(|id| {
                let address = self
                    .nodes
                    .get(&crate::keys::node(&id))
                    .and_then(|n| n.record.address.clone());
                (id, address)
            })
            .collect();
        let hint = self.cfg.feed_on();
        let (store, entropy) = (self.deps.store.clone(), self.deps.entropy.clone());
        let clock = self.deps.clock.clone();
        let forms = self.deps.hint_forms.clone();
        let wall = self.deps.clock.wall_ms();
        let nudge = self.deps.nudge.clone();
        self.nudges.spawn(async move {
            if hint {
                // Retried: without it a taker that does not watch the dead
                // peer learns of the tombstone only at its slow `nodes/`
                // listing (`NodeConfig::nodes_every`).
                for id in &dead {
                    super::feed::write_hint_retried(
                        &store,
                        &forms,
                        clock.as_ref(),
                        wall,
                        entropy.as_ref(),
                        crate::keys::Hinted::Node,
                        id,
                    )
                    .await;
                }
            }
            // After the hints: a rung or nudged pass must find them.
            super::feed::ring_bell(&store, entropy.as_ref()).await;
            if let Some(nudge) = nudge
                && !peers.is_empty()
            {
                tracing::debug!(
                    peers = peers.len(),
                    "nudging the ranked takers of a fenced peer"
                );
                let each = peers
                    .iter()
                    .map(|(id, address)| nudge.nudge(id, address.as_deref()));
                futures::future::join_all(each).await;
            }
        });
    }

    /// Reads the records of peers whose nodes hinted an attribute change
    /// (only peers the listing showed: a hint is not a listing).
    async fn read_hinted_nodes(&mut self, keys: Vec<String>) -> Result<()> {
        let mine = crate::keys::node(&self.me.node);
        for k in keys {
            if k != mine && self.nodes.contains_key(&k) {
                self.fetch_node(&k, None).await?;
            }
        }
        Ok(())
    }

    /// A claim read outside a full listing (a hint, a write's answer): its
    /// epoch joins `seen_claims` (a vanished claim is made again above
    /// every epoch seen, whichever way it was seen), and if it is gone in
    /// the absence rules' sense the next pass is a full one (those rules
    /// run on listings).
    fn note_claim(&mut self, key: &str) {
        let Some(name) = crate::keys::name_in(crate::keys::SESSIONS, key) else {
            return;
        };
        if !self.manifests.contains_key(&crate::keys::manifest(name)) {
            return;
        }
        let seen = self.seen_claims.get(key).copied().unwrap_or(0);
        let claim = self.claims.get(key).map(|(_, c)| c);
        if let Some(c) = claim {
            self.seen_claims.insert(key.to_string(), seen.max(c.epoch));
        }
        if core::claim_gone(claim, seen) {
            self.full_forced = true;
        }
    }

    /// Sessions held per node instance ("node/instance"), counted from the
    /// claims this node has read: every claim not released, as a node counts
    /// its own against capacity.
    ///
    /// Why from the claims and not from each node's published `load`: placement
    /// weights by free capacity, and every node must compute nearly the same
    /// weights or two nodes each rank themselves first and race. Published
    /// loads are read every `node_refresh` (3 TTLs) and a node knows its own
    /// live, so views diverged (0.085–0.141 conflicts per claim measured).
    /// Every node re-reads changed claims every pass, so counts from claims
    /// differ between nodes only by the claims of the last poll.
    /// Sessions that count against our capacity: every owned claim but the
    /// finished ones (succeeded, failed), which hold no process and run
    /// again only if their manifest changes. A paused session keeps its
    /// slot, to resume into.
    fn load(&self) -> u32 {
        self.owned
            .values()
            .filter(|o| !o.record.state.is_terminal())
            .count() as u32
    }

    /// Notes which peers are taking sessions: their count of claims up
    /// since the last pass (`core::gate` holds a lower rank meanwhile).
    /// A peer first seen has shown nothing yet, whatever it holds.
    fn note_progress(&mut self, views: &[NodeView], now: MonoTime) {
        let ids: std::collections::HashSet<&str> = views.iter().map(|v| v.id.as_str()).collect();
        self.progress.retain(|id, _| ids.contains(id.as_str()));
        for v in views.iter().filter(|v| v.id != self.me.node) {
            let e = self.progress.entry(v.id.clone()).or_insert((v.load, None));
            if v.load > e.0 {
                e.1 = Some(now);
            }
            e.0 = v.load;
        }
    }

    /// Counted again only when the claims changed since the last count
    /// (`Cached::generation`): a pass that read no claim does no work
    /// proportional to the fleet's sessions here.
    fn claim_loads(&mut self) -> HashMap<String, u32> {
        let generation = self.claims.generation();
        if let Some((at, loads)) = &self.loads
            && *at == generation
        {
            return loads.clone();
        }
        // Counted on borrowed names, then one key per owner: a pass over
        // 100,000 claims allocates per node, not per claim.
        let mut by: HashMap<(&str, &str), u32> = HashMap::new();
        for (_, c) in self.claims.values() {
            // As `load`: released and finished claims take no capacity.
            if c.state != ClaimState::Released && !c.state.is_terminal() {
                *by.entry((&c.owner.node, &c.owner.instance)).or_insert(0) += 1;
            }
        }
        let loads = by
            .into_iter()
            .map(|((node, instance), n)| (format!("{node}/{instance}"), n))
            .collect();
        self.loads.insert((generation, loads)).1.clone()
    }

    fn node_views(&self, loads: &HashMap<String, u32>) -> Vec<NodeView> {
        let load_of = |node: &str, instance: &str| {
            loads
                .get(&format!("{node}/{instance}"))
                .copied()
                .unwrap_or(0)
        };
        // A cordoned node offers no capacity: placement ranks it out, so
        // peers never wait for it to claim.
        let mut out = vec![NodeView {
            id: self.me.node.clone(),
            instance: self.me.instance.clone(),
            capacity: if self.deps.status.cordoned() {
                0
            } else {
                self.cfg.capacity
            },
            load: load_of(&self.me.node, &self.me.instance),
            labels: self.cfg.labels.clone(),
            live: true,
            // Our own wait is the gate's (`predecessor_unproven`), which
            // knows the instance our takeover proved gone; the mark is for
            // peers.
            unproven: false,
        }];
        for (key, n) in &self.nodes {
            let rec = &n.record;
            let (judged, evidence) = self.peer_evidence(key, n);
            let judged = judged.as_ref();
            let liveness = crate::liveness::judge(Some(judged), None, evidence);
            let attrs = NodeAttrs::of(rec);
            out.push(NodeView {
                id: rec.holder.node.clone(),
                instance: rec.holder.instance.clone(),
                capacity: if attrs.cordoned { 0 } else { attrs.capacity },
                load: load_of(&rec.holder.node, &rec.holder.instance),
                labels: attrs.labels,
                live: liveness == crate::liveness::Liveness::Live,
                // Holding back an earlier instance of its id: judged as
                // that instance would be (a peer's fence ends it at once).
                unproven: crate::liveness::judge_earlier(judged, evidence)
                    == crate::liveness::Liveness::Live,
            });
        }
        out
    }

    /// A peer's record as placement judges it, and the evidence: the
    /// stillness of the *listed* version, as of the send time of the listing
    /// that last showed it (see `nodes_listed_at`); a release counts only if
    /// we read that very version (a newer one may be a renewal by a new
    /// instance).
    fn peer_evidence<'a>(
        &self,
        key: &str,
        n: &'a PeerNode,
    ) -> (std::borrow::Cow<'a, LeaseRecord>, crate::liveness::Evidence) {
        let rec = &n.record;
        let unchanged_for = self
            .client
            .observer()
            .unchanged_for(key, &n.listed, self.nodes_listed_at)
            .unwrap_or(Duration::ZERO);
        let judged = if n.listed == n.fetched {
            std::borrow::Cow::Borrowed(rec)
        } else {
            std::borrow::Cow::Owned(LeaseRecord {
                released: false,
                ..rec.clone()
            })
        };
        let evidence = crate::liveness::Evidence::Observed {
            unchanged_for,
            margin: default_margin(Duration::from_millis(rec.ttl_ms)),
        };
        (judged, evidence)
    }

    /// Spells hints bucketed unless a live peer reads flat ones only
    /// (`feed::HintForms`), judged on the records as last read. Every
    /// pass, from the peers as this pass left them: the decision stays
    /// current while the node runs, so its `HintingStore` never lists
    /// `nodes/` to decide.
    fn note_hint_form(&self) {
        let wall = self.deps.clock.wall_ms();
        // Our own record publishes `PROTO_LEVEL`, never below the level.
        let form = if self.older_peer_live(super::attrs::PROTO_BUCKETED_HINTS) {
            crate::keys::HintForm::Flat
        } else {
            crate::keys::HintForm::Bucketed
        };
        self.deps.hint_forms.set(form, wall);
    }

    /// Is a peer of an older build live, as placement judges it: one whose
    /// record publishes a protocol level (`NodeAttrs::proto`) below
    /// `level`? Below `attrs::PROTO_READS_HOLDS`, it does not read every
    /// node record before it makes a vanished claim again: it waits out
    /// one of our vanished claims by the interval it last read from our
    /// record, so while it is live we do not grow ours
    /// (`note_fleet_size`). Below `attrs::PROTO_BUCKETED_HINTS`, it reads
    /// flat hints only (`note_hint_form`).
    fn older_peer_live(&self, level: u32) -> bool {
        self.nodes.iter().any(|(key, n)| {
            NodeAttrs::of(&n.record).proto < level && {
                let (judged, evidence) = self.peer_evidence(key, n);
                crate::liveness::judge(Some(judged.as_ref()), None, evidence)
                    == crate::liveness::Liveness::Live
            }
        })
    }

    /// Is a record under `nodes/` corrupt as last read, and has its listed
    /// version not stood still for a ttl and the margin (the longest ttl
    /// any record showed)? Then a live node of unknown build may stand
    /// behind it, and the interval does not grow (as `read_holds` will not
    /// make a vanished claim again on such a read). A stray object stops
    /// counting once it has stood still that long.
    fn corrupt_peer_unsettled(&self) -> bool {
        let ttl = self.cfg.ttl.max(self.longest.0);
        let observer = self.client.observer();
        self.corrupt_nodes.iter().any(|key| {
            observer.version(key).is_none_or(|v| {
                observer
                    .unchanged_for(key, &v, self.nodes_listed_at)
                    .is_none_or(|d| d < ttl.saturating_add(default_margin(ttl)))
            })
        })
    }

    /// Reads again every peer record whose listed version we have not read
    /// (peers renew every ttl/3, and a light pass reads a record only on a
    /// hint or every `peer_refresh`): the gate on growing the interval
    /// (`older_peer_live`) judges attributes as they stand, so a node id
    /// rolled back to an older build is not taken for the newer one it was.
    /// Only at a full pass whose count calls for a growth (with the feed
    /// on): once or twice per growth, or once per full pass while an older
    /// peer holds the interval back. Whether every read succeeded.
    async fn fetch_unread_nodes(&mut self) -> bool {
        let mut unread: Vec<(String, Version)> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.listed != n.fetched)
            .map(|(k, n)| (k.clone(), n.listed.clone()))
            .collect();
        // In key order: each read draws the store's faults in a seeded
        // simulation, which must replay (`nodes` is a HashMap).
        unread.sort_by(|a, b| a.0.cmp(&b.0));
        for (key, listed) in unread {
            if let Err(e) = self.fetch_node(&key, Some(listed)).await {
                tracing::debug!(error = %e, key, "reading a node record before growing the interval");
                return false;
            }
            // Corrupt as read (a truncated response, foreign bytes): its
            // build is unknown, so it counts as not read.
            if self.corrupt_nodes.contains(&key) {
                return false;
            }
        }
        true
    }

    /// Reads a peer's node record now. `listed` is the version the listing
    /// showed (None: keep the one we had).
    async fn fetch_node(&mut self, key: &str, listed: Option<Version>) -> Result<()> {
        let got = self.deps.store.get(key).await;
        // As of the response's arrival: absence is observed from then on.
        let now = self.deps.clock.now();
        match got {
            Ok(Some(o)) => match LeaseRecord::decode(key, &o.bytes, Kind::Node) {
                Ok(record) => {
                    self.corrupt_nodes.remove(key);
                    self.absent_nodes.remove(key);
                    let mp = NodeAttrs::of(&record).max_poll_ms;
                    self.longest = (
                        self.longest.0.max(Duration::from_millis(record.ttl_ms)),
                        self.longest.1.max(Duration::from_millis(mp)),
                    );
                    let listed = listed
                        .or_else(|| self.nodes.get(key).map(|n| n.listed.clone()))
                        .unwrap_or_else(|| o.version.clone());
                    let (listed_since, listed_last) = match self.nodes.get(key) {
                        Some(n) if n.listed == listed => (n.listed_since, n.listed_last),
                        _ => (now, now),
                    };
                    self.nodes.insert(
                        key.to_string(),
                        PeerNode {
                            listed,
                            listed_since,
                            listed_last,
                            fetched: o.version,
                            fetched_at: now,
                            record,
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "corrupt node record; its sessions are left alone");
                    self.corrupt_nodes.insert(key.to_string());
                    self.nodes.remove(key);
                }
            },
            Ok(None) => {
                let ttl = self
                    .nodes
                    .remove(key)
                    .map_or(self.cfg.ttl, |n| Duration::from_millis(n.record.ttl_ms));
                self.absent_nodes
                    .entry(key.to_string())
                    .or_insert((now, ttl));
            }
            Err(
                e @ (crate::store::StoreError::Corrupt { .. }
                | crate::store::StoreError::Invalid { .. }),
            ) => {
                tracing::warn!(key, error = %e, "unreadable node record; its sessions are left alone");
                self.corrupt_nodes.insert(key.to_string());
                self.nodes.remove(key);
            }
            Err(e) => return Err(Error::from_store("get", key, e)),
        }
        Ok(())
    }

    /// Brings peers' node records in line with a listing: new peers are read,
    /// known ones only every `node_refresh` (their versions change at every
    /// renewal, which is no news), except a peer whose version changes after
    /// standing still (unchanged in our listings over half its TTL apart):
    /// that change is a release, a
    /// fence by another node, a re-registration or a late renewal, and peers
    /// must see which at once (a released record reads as live again until
    /// read, which would hold up failover for a TTL).
    async fn refresh_nodes(&mut self, entries: &[Entry]) -> Result<()> {
        let mine = crate::keys::node(&self.me.node);
        let listed: std::collections::HashSet<&str> =
            entries.iter().map(|e| e.key.as_str()).collect();
        let now = self.deps.clock.now();
        // A peer that vanished from the listing is absent as of now (after
        // the listing arrived), not dead: see `node_absent_long_enough`.
        for (k, n) in &self.nodes {
            if !listed.contains(k.as_str()) {
                self.absent_nodes
                    .entry(k.clone())
                    .or_insert((now, Duration::from_millis(n.record.ttl_ms)));
            }
        }
        self.absent_nodes
            .retain(|k, _| !listed.contains(k.as_str()));
        // Bounded: only keys some claim still names are worth remembering.
        // Looked for only while some node is absent (rarely), and without
        // formatting a key per claim: this ran every pass over every claim
        // in the fleet, a fifth of an idle node's CPU at 100,000 sessions
        // (issue #14).
        if !self.absent_nodes.is_empty() {
            let named: std::collections::HashSet<&str> = self
                .claims
                .values()
                .map(|(_, c)| c.owner.node.as_str())
                .collect();
            self.absent_nodes.retain(|k, _| {
                k.strip_prefix(crate::keys::NODES)
                    .is_some_and(|id| named.contains(id))
            });
        }
        self.nodes.retain(|k, _| listed.contains(k.as_str()));
        self.corrupt_nodes.retain(|k| listed.contains(k.as_str()));
        for e in entries {
            if e.key == mine {
                continue;
            }
            let due = match self.nodes.get_mut(&e.key) {
                Some(n) => {
                    // Stood still: two of our listings more than ttl/2
                    // apart showed the same version. (Not merely "changed
                    // since our last listing": an idle node lists every TTL
                    // and would read every peer every time.)
                    let mut stalled = false;
                    if n.listed == e.version {
                        n.listed_last = now;
                    } else {
                        stalled = n.listed_last.saturating_since(n.listed_since)
                            > Duration::from_millis(n.record.ttl_ms) / 2;
                        n.listed = e.version.clone();
                        n.listed_since = now;
                        n.listed_last = now;
                    }
                    stalled
                        || (n.fetched != e.version
                            && now.saturating_since(n.fetched_at) >= self.cfg.peer_refresh())
                }
                None => true,
            };
            if due {
                self.fetch_node(&e.key, Some(e.version.clone())).await?;
            }
        }
        Ok(())
    }

    /// Claims one session now (the wake path): [`Node::claim_try`], then a
    /// batch of one.
    async fn claim(
        &mut self,
        name: &str,
        digest: String,
        existing: Option<(Version, ClaimView)>,
        spec: Option<Arc<Spec>>,
    ) -> Result<bool> {
        match self.claim_try(name, digest, existing, spec) {
            Some(t) => self.claim_batch(vec![t]).await,
            None => Ok(false),
        }
    }

    /// A claim this pass decided to make, not yet sent: its condition and
    /// the epoch it goes at (gc's floor still to apply), or `None` when our
    /// validity has ended (nothing may be claimed then) or no epoch above
    /// the claim's exists.
    fn claim_try(
        &self,
        name: &str,
        digest: String,
        existing: Option<(Version, ClaimView)>,
        spec: Option<Arc<Spec>>,
    ) -> Option<ClaimTry> {
        if self.deps.clock.now() >= self.valid_until() {
            return None;
        }
        let key = crate::keys::session(name);
        // Above any epoch we saw for it (should it have vanished), above
        // the claim we replace, and at least the generation's first.
        let (cond, above) = match &existing {
            None => (Cond::Create, 0),
            Some((v, c)) => (Cond::Match(v.clone()), c.epoch),
        };
        let highest = above
            .max(self.seen_claims.get(&key).copied().unwrap_or(0))
            .max(self.epoch_base);
        let Some(epoch) = crate::record::next_epoch(highest) else {
            // Only foreign bytes put a claim there (decoding refuses one
            // above the bound): the session is stuck, not this node.
            tracing::warn!(
                session = name,
                epoch = highest,
                "claim at the highest epoch: no fencing token above it exists; not claimed"
            );
            return None;
        };
        // A claim created where none is, or over a placeholder, may follow
        // a claim that `gc` deleted: it starts above gc's epoch floor (one
        // GET, on these paths only; see `gc`).
        let needs_floor =
            !matches!(&existing, Some((_, c)) if !c.is_placeholder() && !c.is_vanished());
        // The spec is read with the claim when none came with it (the
        // manifest's, unless the listing found it corrupt: `spec_for`).
        let read_spec = spec.is_none() && !self.corrupt.contains_key(&crate::keys::manifest(name));
        Some(ClaimTry {
            name: name.to_string(),
            key,
            digest,
            existing,
            spec,
            cond,
            epoch,
            needs_floor,
            read_spec,
            owner: self.me.clone(),
            address: self.cfg.address.clone(),
            live: Live {
                decided: self.valid_until(),
                lease: self.validity.clone(),
                violation: self.violation.clone(),
            },
        })
    }

    /// Sends `tries` [`CLAIM_CONCURRENCY`] at a time and applies each
    /// outcome in order as it comes. Every outcome is applied, whatever an
    /// earlier one was: a claim that landed is recorded as ours (and
    /// started) even when another in the batch failed, so no claim of ours
    /// stands unknown to us (short of a store violation, which stops the
    /// node: `apply_claim`). The first error is returned after all are
    /// applied, as a failed claim ends the pass.
    ///
    /// Why concurrent: a claim is two to four round trips (gc's floor on a
    /// create, the conditional write, its audit read-back, the manifest's
    /// spec), and a pass that placed or took over sessions one after the
    /// other spent them in series: at 30-60 ms per request on S3, about a
    /// thousand sessions of a dead peer took a survivor minutes (issue
    /// #14). The decisions are unchanged: each claim is still an If-Match
    /// or create-if-absent on what this pass saw, and the gate runs before
    /// any is sent.
    async fn claim_batch(&mut self, tries: Vec<ClaimTry>) -> Result<bool> {
        if tries.is_empty() {
            return Ok(false);
        }
        self.ensure_marker().await?;
        let io = ClaimIo::of(&self.deps);
        // Each applied as it comes back, in order: a claim that landed is
        // ours (and started) without waiting for the slowest of the batch.
        let mut sent = futures::stream::iter(tries)
            .map(move |t| t.send(io.clone()))
            .buffered(CLAIM_CONCURRENCY);
        let mut changed = false;
        let mut first_err = None;
        while let Some(s) = sent.next().await {
            match self.apply_claim(s).await {
                Ok(c) => changed |= c,
                Err(e) => {
                    changed = true;
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(changed),
        }
    }

    /// Sends the claim loop's `batch` (`claim_batch`), then counts what it
    /// came to: the load it counted as landing is recounted from what is
    /// owned now, and a name claimed is not revisited.
    async fn send_claims(
        &mut self,
        batch: &mut Vec<ClaimTry>,
        revisit: &mut std::collections::BTreeSet<String>,
        load: &mut u32,
    ) -> Result<bool> {
        let names: Vec<String> = batch.iter().map(|t| t.name.clone()).collect();
        *load = load.saturating_sub(names.len() as u32);
        let r = self.claim_batch(std::mem::take(batch)).await;
        for name in &names {
            if let Some(o) = self.owned.get(name) {
                revisit.remove(name);
                *load += u32::from(!o.record.state.is_terminal());
            }
        }
        r
    }

    /// What one sent claim came to, applied to this node: recorded as ours
    /// and started, or the rival's claim cached, or the error returned.
    async fn apply_claim(&mut self, s: ClaimSent) -> Result<bool> {
        let ClaimSent {
            t,
            sent,
            record,
            outcome,
        } = s;
        match outcome? {
            ClaimOutcome::Committed {
                version,
                audit,
                manifest,
            } => {
                self.note_audit(&t.key, audit, record.epoch);
                // A store that let two writers win: nothing more is started
                // or recorded (the node stops, and its lease with it).
                if self.violation.lock().unwrap().is_some() {
                    return Ok(true);
                }
                let (name, key, epoch) = (t.name.as_str(), t.key.as_str(), record.epoch);
                self.first_claimable.remove(name);
                self.event(
                    EventKind::Claimed,
                    Some(name),
                    Some(epoch),
                    match &t.existing {
                        None => "claim made again after its absence".to_string(),
                        Some((_, c)) if c.is_vanished() => {
                            "claim made again after its absence".to_string()
                        }
                        Some((_, c)) if c.is_placeholder() => "new session".to_string(),
                        Some((_, c)) => format!(
                            "from {}/{} at epoch {}",
                            c.owner.node, c.owner.instance, c.epoch
                        ),
                    },
                );
                self.claims
                    .insert(key.to_string(), (version.clone(), ClaimView::from(&record)));
                self.note_claim(key);
                // The only insertion: the floor stays at or below every
                // confirmation (see `confirmed_floor`).
                self.confirmed_floor = Some(self.confirmed_floor.map_or(sent, |f| f.min(sent)));
                self.owned.insert(
                    name.to_string(),
                    Owned {
                        record,
                        version,
                        running: false,
                        confirmed: sent,
                        started_at: sent,
                        quick_exits: 0,
                        restart_at: None,
                        spec: t.spec.map(|s| (plan::Digest::new(&t.digest), s)),
                    },
                );
                if let Some(m) = manifest {
                    self.take_manifest(name, *m);
                }
                // The renew task must bound this session too, from now.
                self.confirmed_tx
                    .send_replace(self.confirmed_until().unwrap_or(MonoTime::ZERO));
                self.start(name).await;
                Ok(true)
            }
            ClaimOutcome::NotSent => Ok(false),
            ClaimOutcome::Rejected(found) => {
                // Another node claimed first: placement should make this
                // rare. What stands there now replaces our cached view (a
                // light pass may have had a stale one), so the next pass
                // does not repeat a write that cannot succeed.
                self.cache_read_back(&t.key, found);
                self.event(
                    EventKind::Conflict,
                    Some(&t.name),
                    Some(record.epoch),
                    "lost the claim race",
                );
                Ok(true)
            }
        }
    }

    /// A manifest read for the claim of `name` (with the claim, or by
    /// `spec_for`): what we know of it is updated, and its spec kept beside
    /// the claim if its digest is the claim's.
    fn take_manifest(&mut self, name: &str, read: ManifestRead) {
        let mkey = crate::keys::manifest(name);
        match read {
            Ok(Some((m, v))) => {
                let known = KnownManifest::of(&m);
                self.manifests.insert(mkey, (v, known));
                if let Some(o) = self.owned.get_mut(name)
                    && o.record.digest == m.digest
                {
                    o.spec = Some((plan::Digest::new(&m.digest), Arc::new(m.spec)));
                }
            }
            Ok(None) => {
                self.manifests.remove(&mkey);
            }
            // Read again when it is started (`spec_for`).
            Err(e) => {
                tracing::warn!(session = name, error = %e, "reading the manifest to start it")
            }
        }
    }

    /// The spec to start `name` with: the one kept beside its claim if its
    /// digest is the manifest's we know, else read now. A read that finds
    /// another digest (the manifest changed since our last listing) or no
    /// manifest updates what we know and starts nothing: the next pass
    /// reconciles the claim with it, as for any change. An unreadable one is
    /// tried again by the next pass (the session is owned and not running).
    async fn spec_for(&mut self, name: &str) -> Option<Arc<Spec>> {
        let mkey = crate::keys::manifest(name);
        let digest = self.manifests.get(&mkey)?.1.view.digest.clone();
        // Only under the claim made for it: a manifest changed since is
        // the next reconcile's (stop, adopt the digest, start), which
        // would otherwise start the session twice.
        if digest != self.owned.get(name)?.record.digest {
            return None;
        }
        if let Some((d, spec)) = self.owned.get(name).and_then(|o| o.spec.as_ref())
            && *d == digest
        {
            return Some(spec.clone());
        }
        // Unreadable now (the listing found it corrupt): nothing to start
        // but a spec kept above. (The claim loop does not take a session
        // whose manifest is corrupt: `Candidate::manifest_corrupt`.)
        if self.corrupt.contains_key(&mkey) {
            return None;
        }
        let n = Name::new(name).ok()?;
        let read = super::manifest::get(&self.deps.store, &n).await;
        self.take_manifest(name, read);
        // Kept only if the manifest read has the claim's digest.
        let (d, spec) = self.owned.get(name)?.spec.as_ref()?;
        (*d == digest).then(|| spec.clone())
    }

    async fn start(&mut self, name: &str) {
        // None for a session not owned, too.
        let Some(spec) = self.spec_for(name).await else {
            return;
        };
        let Some(o) = self.owned.get(name) else {
            return;
        };
        let epoch = o.record.epoch;
        let valid_until = self.valid_until();
        if self.deps.clock.now() >= valid_until {
            // Our validity ended: not the session's failure. It stays
            // unstarted; the lease-loss path stops everything and the next
            // instance reclaims it.
            return;
        }
        let start = SessionStart {
            name: name.to_string(),
            node: self.me.node.clone(),
            epoch,
            spec: (*spec).clone(),
            deadline: valid_until,
        };
        match self.deps.runner.start(start).await {
            Ok(()) => {
                let now = self.deps.clock.now();
                if let Some(o) = self.owned.get_mut(name) {
                    o.running = true;
                    o.started_at = now;
                    o.restart_at = None;
                }
                self.event(EventKind::Started, Some(name), Some(epoch), "");
            }
            Err(e) if e.kind() == crate::ErrorKind::Fenced => {
                tracing::warn!(session = name, error = %e, "not started: the node's deadline passed");
            }
            Err(e) => {
                self.event(
                    EventKind::Failed,
                    Some(name),
                    Some(epoch),
                    format!("could not start: {e}"),
                );
                let _ = self.set_state(name, ClaimState::Failed, Some(127)).await;
            }
        }
    }

    /// Fenced state change of an owned claim (If-Match on our last version).
    /// A rejection means a peer took the claim over: stop and forget it.
    async fn set_state(
        &mut self,
        name: &str,
        state: ClaimState,
        exit_code: Option<i32>,
    ) -> Result<()> {
        let Some((version, next)) = self.state_change(name, state, exit_code)? else {
            return Ok(());
        };
        let w = ClaimWrite::send(ClaimIo::of(&self.deps), name, version, next).await;
        self.apply_state_change(name, w).await
    }

    /// The write that moves our claim `name` to `state` (If-Match on the
    /// version we hold), or `None` if we do not hold it; an error if the
    /// claim may not become `state`.
    fn state_change(
        &self,
        name: &str,
        state: ClaimState,
        exit_code: Option<i32>,
    ) -> Result<Option<(Version, ClaimRecord)>> {
        let Some(o) = self.owned.get(name) else {
            return Ok(None);
        };
        if !o.record.state.can_become(state) {
            return Err(Error::invalid(
                "claim transition",
                format!("{:?} -> {:?} for {name}", o.record.state, state),
            ));
        }
        let mut next = o.record.clone();
        next.state = state;
        next.exit_code = exit_code;
        Ok(Some((o.version.clone(), next)))
    }

    /// A state change's write applied (`apply_claim_write`), then its event.
    async fn apply_state_change(&mut self, name: &str, w: ClaimWrite) -> Result<()> {
        let (state, epoch, exit_code) = (w.next.state, w.next.epoch, w.next.exit_code);
        self.apply_claim_write(name, w).await?;
        let kind = match state {
            ClaimState::Running => EventKind::Running,
            ClaimState::Paused => EventKind::Paused,
            ClaimState::Succeeded => EventKind::Succeeded,
            ClaimState::Failed => EventKind::Failed,
            ClaimState::Released => EventKind::Released,
        };
        self.event(
            kind,
            Some(name),
            Some(epoch),
            exit_code.map(|c| format!("exit {c}")).unwrap_or_default(),
        );
        Ok(())
    }

    /// Writes `next` over our claim `name` (If-Match on the version we
    /// hold), and keeps the caches in line. A rejection means a peer took the
    /// claim over: stop the session and forget it.
    async fn write_claim(&mut self, name: &str, o: &Owned, next: ClaimRecord) -> Result<()> {
        let w = ClaimWrite::send(ClaimIo::of(&self.deps), name, o.version.clone(), next).await;
        self.apply_claim_write(name, w).await
    }

    /// What a write of our claim `name` came to (`ClaimWrite::send`),
    /// applied: the caches follow a committed one; a rejected one means a
    /// peer took the claim over, so the session is stopped and forgotten.
    async fn apply_claim_write(&mut self, name: &str, w: ClaimWrite) -> Result<()> {
        let ClaimWrite { sent, next, put } = w;
        let key = crate::keys::session(name);
        match put? {
            Put::Committed(v) => {
                self.claim_writes += 1;
                if self.claim_writes.is_multiple_of(AUDIT_SAMPLE) {
                    self.audit(&key, &next.nonce, next.epoch).await;
                }
                self.claims.insert(key, (v.clone(), ClaimView::from(&next)));
                if next.state == ClaimState::Released {
                    self.owned.remove(name);
                } else if let Some(o) = self.owned.get_mut(name) {
                    o.record = next;
                    o.version = v;
                    o.confirmed = o.confirmed.max(sent);
                }
                Ok(())
            }
            Put::Rejected(_) => {
                self.lose(name, "claim changed by another writer").await;
                Err(Error::Lost {
                    key,
                    epoch: next.epoch,
                    reason: "claim taken over".into(),
                })
            }
        }
    }

    async fn lose(&mut self, name: &str, why: &str) {
        if let Some(o) = self.owned.remove(name) {
            if o.running {
                self.deps.runner.stop(name).await;
            }
            self.event(
                EventKind::Lost,
                Some(name),
                Some(o.record.epoch),
                why.to_string(),
            );
        }
    }

    /// Applies the restart policy to sessions that ended by themselves.
    async fn handle_exits(&mut self) -> bool {
        let mut exits = self.deps.runner.take_exits();
        exits.sort_by(|a, b| a.name.cmp(&b.name)); // see `stop_all`
        let changed = !exits.is_empty();
        for x in exits {
            self.on_exit(x, true).await;
        }
        changed
    }

    /// One run's end: journalled, then its restart policy applied. With
    /// `restart` false (the node is handing its sessions over) a run the
    /// policy would start again is left for the release, and only a
    /// finished one is recorded.
    async fn on_exit(&mut self, x: Exit, restart: bool) {
        let Some(o) = self.owned.get_mut(&x.name) else {
            return;
        };
        if o.record.epoch != x.epoch {
            return;
        }
        o.running = false;
        self.event(
            EventKind::Exited,
            Some(&x.name),
            Some(x.epoch),
            format!(
                "code {}{}",
                x.code,
                if x.deadline {
                    " (deadline)"
                } else if x.watchdog_lost {
                    " (its watchdog was killed; every process of it was killed)"
                } else {
                    ""
                }
            ),
        );
        let Some(policy) = self
            .manifests
            .get(&crate::keys::manifest(&x.name))
            .map(|(_, m)| m.restart)
        else {
            return;
        };
        let now = self.deps.clock.now();
        let (ran_for, quick) = match self.owned.get(&x.name) {
            Some(o) => (now.saturating_since(o.started_at), o.quick_exits),
            None => return,
        };
        match core::after_exit(policy, x.code, x.deadline, ran_for, quick) {
            core::AfterExit::LeaseLapsed => {} // the loop notices and stops all
            core::AfterExit::Finish(state) => {
                let _ = self.set_state(&x.name, state, Some(x.code)).await;
            }
            core::AfterExit::Restart { .. } if !restart => {}
            core::AfterExit::Restart { quick_exits, delay } => {
                // Persisted before the restart (one fenced write per
                // restart), so `ls` shows the count and the last exit code.
                if let Some(o) = self.owned.get(&x.name).cloned() {
                    let mut next = o.record.clone();
                    next.restarts += 1;
                    next.exit_code = Some(x.code);
                    if self.write_claim(&x.name, &o, next).await.is_err() {
                        return; // taken over, or the store is unreachable
                    }
                }
                // The back-off runs from after the write (a slow store
                // must not shorten it).
                let after_write = self.deps.clock.now();
                if let Some(o) = self.owned.get_mut(&x.name) {
                    o.quick_exits = quick_exits;
                    o.restart_at = (!delay.is_zero()).then_some(after_write + delay);
                }
                if delay.is_zero() {
                    self.start(&x.name).await;
                } else {
                    // The pass that finds the wait over starts it
                    // (`reconcile_owned`).
                    self.event(
                        EventKind::Backoff,
                        Some(&x.name),
                        Some(x.epoch),
                        format!("crash loop: restarting in {delay:?}"),
                    );
                }
            }
        }
    }

    /// Our own claim as the cache shows it, in the order the rules apply
    /// (a corrupt key keeps its last good record in `claims`: bytes we
    /// cannot read where our claim was mean we cannot show we hold it).
    /// None: not cached, so not in the last listing; it must be read.
    fn cached_own_claim(&self, key: &str, o: &Owned) -> Option<OwnClaim> {
        Some(match self.claims.get(key) {
            Some((v, c)) if *v != o.version && c.is_vanished() => OwnClaim::Vanished {
                below_ours: c.epoch < o.record.epoch,
            },
            Some((v, _)) if *v != o.version => OwnClaim::Changed,
            _ if self.corrupt.contains_key(key) => OwnClaim::Corrupt,
            Some(_) => OwnClaim::Ours,
            None => return None,
        })
    }

    /// The owned sessions this pass must look at closely, in name order:
    /// those whose claim is not cached (to be read), and those for which
    /// `core::reconcile_owned` asks anything.
    ///
    /// Why a scan first: at steady state nothing is asked of nearly every
    /// owned session, and the close look (a clone of the session, its keys
    /// formatted, its manifest's digest copied) cost allocations per owned
    /// session per pass, the largest share of an idle node's CPU at 10,000
    /// sessions (issue #14). This scan allocates nothing per session.
    ///
    /// Skipping a session here changes nothing: whether the rules ask
    /// anything does not depend on `full` (it picks only between actions),
    /// a back-off that is not pending now is not pending later in the pass,
    /// and what the close look does to one session changes no other
    /// session's facts but `full`.
    ///
    /// And no scan at all when the last one found nothing due and nothing
    /// it looks at has changed since (`owned_inputs`): at steady state this
    /// scan over every owned session was a tenth of an idle node's CPU at
    /// 10,000 sessions.
    fn owned_due(&mut self, full: bool) -> Vec<String> {
        let now = self.deps.clock.now();
        let inputs = self.owned_inputs();
        if self.owned_idle == Some(inputs) {
            return Vec::new();
        }
        let (mut ckey, mut mkey) = (String::new(), String::new());
        let mut due: Vec<String> = self
            .owned
            .iter()
            .filter(|(name, o)| {
                let ckey = crate::keys::key_in(&mut ckey, crate::keys::SESSIONS, name);
                let Some(claim) = self.cached_own_claim(ckey, o) else {
                    return true;
                };
                let mkey = crate::keys::key_in(&mut mkey, crate::keys::MANIFESTS, name);
                !core::reconcile_owned(&core::Owned {
                    claim,
                    manifest: own_manifest(
                        self.manifests
                            .get(mkey)
                            .map(|(_, m)| (m.view.paused, &m.view.digest)),
                    ),
                    state: o.record.state,
                    digest: &o.record.digest,
                    running: o.running,
                    backoff_pending: o.restart_at.is_some_and(|t| now < t),
                    full,
                })
                .is_empty()
            })
            .map(|(name, _)| name.clone())
            .collect();
        // Time alone never makes an idle answer stale: the one fact time
        // changes is a back-off ending, and a pending back-off is itself
        // asked of (`Wait`; checked over every combination in `core`).
        self.owned_idle = due.is_empty().then_some(inputs);
        due.sort_unstable(); // see `stop_all`
        due
    }

    /// The generations of everything `owned_due`'s scan reads.
    fn owned_inputs(&self) -> [u64; 4] {
        [
            self.owned.generation(),
            self.claims.generation(),
            self.manifests.generation(),
            self.corrupt.generation(),
        ]
    }

    /// Keeps owned sessions in line with their manifests and claims: the
    /// shell of `core::reconcile_owned`, which decides; here only the read
    /// of a claim the listing did not show, and the actions.
    async fn reconcile_owned(&mut self) -> bool {
        let mut changed = false;
        // Counted once, then adjusted by each session's actions (which may
        // finish, lose, release or restart it): not once per owned session
        // (O(owned²) at 10,000 owned).
        let mut load = self.load();
        for name in self.owned_due(load >= self.cfg.capacity) {
            let key = crate::keys::session(&name);
            let Some(o) = self.owned.get(&name).cloned() else {
                continue;
            };
            let claim = match self.cached_own_claim(&key, &o) {
                Some(claim) => claim,
                // Not in the listing: read it (a listing may lag a write on
                // some stores). Gone, it is lost at once: a holder whose own
                // record vanishes has lost it.
                None => {
                    let sent = self.deps.clock.now();
                    match super::claim::get(&self.deps.store, &name).await {
                        Ok(Some((c, v))) if v == o.version => {
                            self.claims.insert(key.clone(), (v, ClaimView::from(&c)));
                            if let Some(x) = self.owned.get_mut(&name) {
                                x.confirmed = x.confirmed.max(sent);
                            }
                            OwnClaim::Ours
                        }
                        Ok(Some((c, v))) if c.is_vanished() => {
                            let below_ours = c.epoch < o.record.epoch;
                            // Cached, so that RaiseMarker matches its version.
                            self.claims.insert(key.clone(), (v, ClaimView::from(&c)));
                            OwnClaim::Vanished { below_ours }
                        }
                        Ok(Some(_)) => OwnClaim::Changed,
                        Ok(None) => OwnClaim::Deleted,
                        Err(e) => {
                            // Unreadable now; `confirmed_until` bounds us.
                            tracing::warn!(session = name, error = %e, "reading our own claim");
                            OwnClaim::Unreadable
                        }
                    }
                }
            };
            let manifest = self
                .manifests
                .get(&crate::keys::manifest(&name))
                .map(|(_, m)| (m.view.paused, m.view.digest.clone()));
            let facts = core::Owned {
                claim,
                manifest: own_manifest(manifest.as_ref().map(|(p, d)| (*p, d))),
                state: o.record.state,
                digest: &o.record.digest,
                running: o.running,
                backoff_pending: o.restart_at.is_some_and(|t| self.deps.clock.now() < t),
                full: load >= self.cfg.capacity,
            };
            let actions = core::reconcile_owned(&facts);
            // Changed means something was done: a state write that failed
            // (a store outage) leaves the pace to back off.
            let was_changed = changed;
            for action in actions {
                changed = true;
                match action {
                    OwnedAction::Lose(why) => self.lose(&name, why).await,
                    OwnedAction::MarkVanished | OwnedAction::RaiseMarker => {
                        // We know the epoch it had, and have just stopped.
                        // Someone else's claim already there wins; a failure
                        // here only costs that floor.
                        let cond = match (action, self.claims.get(&key)) {
                            (OwnedAction::RaiseMarker, Some((v, _))) => Cond::Match(v.clone()),
                            _ => Cond::Create,
                        };
                        let _ = self.put_marker(&key, o.record.epoch, cond).await;
                    }
                    OwnedAction::Stop(detail) => {
                        self.deps.runner.stop(&name).await;
                        if let Some(x) = self.owned.get_mut(&name) {
                            x.running = false;
                        }
                        if let Some(detail) = detail {
                            self.event(
                                EventKind::Stopped,
                                Some(&name),
                                Some(o.record.epoch),
                                detail,
                            );
                        }
                    }
                    OwnedAction::AdoptDigest => {
                        if let (Some(x), Some((_, digest))) = (self.owned.get_mut(&name), &manifest)
                        {
                            x.record.digest = digest.to_string();
                        }
                    }
                    OwnedAction::SetState(state) => {
                        if self.set_state(&name, state, None).await.is_err() {
                            changed = was_changed;
                            break; // lost (rejected) or unwritable: no more steps
                        }
                    }
                    OwnedAction::Start => {
                        if manifest.is_some() {
                            self.start(&name).await;
                        }
                    }
                    OwnedAction::Wait => {} // the pass stays at its base pace
                }
            }
            // Only this session's entry changed: adjust by it.
            let counted =
                |x: Option<&Owned>| u32::from(x.is_some_and(|x| !x.record.state.is_terminal()));
            load = load - counted(Some(&o)) + counted(self.owned.get(&name));
            debug_assert_eq!(load, self.load());
        }
        changed
    }
}

/// An owned session's manifest (paused, digest) as the rules see it: one
/// mapping for `owned_due`'s scan and the close look, which must agree.
fn own_manifest(m: Option<(bool, &plan::Digest)>) -> OwnManifest<'_> {
    match m {
        None => OwnManifest::Deleted,
        Some((true, _)) => OwnManifest::Paused,
        Some((false, digest)) => OwnManifest::Spec { digest },
    }
}

/// The final verdicts about a claim owner's record (superseded, released,
/// fenced) need no evidence beyond the record itself; expiry is judged in
/// `node_views` with the observer's evidence.
fn owner_liveness(record: &LeaseRecord, instance: &str) -> Liveness {
    crate::liveness::judge(
        Some(record),
        Some(instance),
        crate::liveness::Evidence::Observed {
            unchanged_for: Duration::ZERO,
            margin: Duration::ZERO,
        },
    )
}

/// The placement view of a manifest (also for the CLI's nudge targets).
pub fn manifest_view(m: &ManifestRecord) -> ManifestView {
    ManifestView {
        name: m.name.clone(),
        digest: plan::Digest::new(&m.digest),
        selector: m.spec.selector.clone(),
        preferred: m.spec.preferred_nodes.clone(),
        paused: m.spec.paused,
    }
}

/// Concurrent reads when refreshing changed manifests and claims.
const REFRESH_CONCURRENCY: usize = 16;

/// Claims in flight at once in a pass (see `Node::claim_batch`), and how
/// many a pass gathers before it sends them: a batch is sent when full and
/// at the end of the claim loop.
const CLAIM_CONCURRENCY: usize = 16;
const CLAIM_BATCH: usize = 64;

/// A claim decided by a pass and not yet sent (`Node::claim_try`).
struct ClaimTry {
    name: String,
    key: String,
    digest: String,
    /// What the pass saw there: `None` for a create.
    existing: Option<(Version, ClaimView)>,
    spec: Option<Arc<Spec>>,
    cond: Cond,
    /// Before gc's floor.
    epoch: u64,
    needs_floor: bool,
    /// Read the manifest once the claim lands (no spec came with it).
    read_spec: bool,
    owner: Owner,
    address: Option<String>,
    /// Whether it may still be sent when its turn comes.
    live: Live,
}

/// What says whether a claim waiting in a batch may still be sent: the
/// node's validity when the claim was decided (the confirmation of its
/// claims included), and, as they are now, the renew task's word on the
/// lease and the audit's on the store. Past any of them the node stops
/// acting, as `claim` did before each write when claims went one at a time.
#[derive(Clone)]
struct Live {
    decided: MonoTime,
    lease: Option<watch::Receiver<Validity>>,
    violation: Arc<std::sync::Mutex<Option<String>>>,
}

impl Live {
    fn ended(&self, now: MonoTime) -> bool {
        now >= self.decided
            || self.lease.as_ref().is_some_and(|rx| {
                let v = *rx.borrow();
                v.lost || now >= v.until
            })
            || self.violation.lock().unwrap().is_some()
    }
}

/// A write over one of our claims (If-Match on the version we hold), as
/// sent, and what came of it (`Node::apply_claim_write`).
struct ClaimWrite {
    /// Taken before the write was sent.
    sent: MonoTime,
    next: ClaimRecord,
    put: Result<Put>,
}

impl ClaimWrite {
    /// The write's round trip, touching no node state (so that a shutdown
    /// or drain can have several in flight).
    fn send(
        deps: ClaimIo,
        name: &str,
        version: Version,
        mut next: ClaimRecord,
    ) -> futures::future::BoxFuture<'static, Self> {
        let key = crate::keys::session(name);
        async move {
            let sent = deps.clock.now();
            next.updated_at_ms = deps.clock.wall_ms();
            next.nonce = deps.entropy.hex_id();
            let put = put_checked(
                &deps.store,
                &key,
                Bytes::from(next.encode()),
                Cond::Match(version),
                &next.nonce,
                json_nonce,
            )
            .await;
            ClaimWrite { sent, next, put }
        }
        .boxed()
    }
}

/// What a claim's round trips use of a node's deps, owned (cheap clones).
#[derive(Clone)]
struct ClaimIo {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
}

impl ClaimIo {
    fn of(deps: &NodeDeps) -> Self {
        ClaimIo {
            store: deps.store.clone(),
            clock: deps.clock.clone(),
            entropy: deps.entropy.clone(),
        }
    }
}

/// Sessions stopped at once when a node stops them all (`Node::stop_all`).
const STOP_CONCURRENCY: usize = 256;

/// A claim as sent, and what came of it.
struct ClaimSent {
    t: ClaimTry,
    /// Taken before the write was sent: the claim is ours as of then at
    /// the latest (see `Node::confirmed_until`).
    sent: MonoTime,
    record: ClaimRecord,
    outcome: Result<ClaimOutcome>,
}

/// A manifest read: absent, or the record and its version.
type ManifestRead = Result<Option<(ManifestRecord, Version)>>;

enum ClaimOutcome {
    Committed {
        version: Version,
        /// The audit's read-back.
        audit: Result<()>,
        /// Boxed: a manifest record is large beside the other outcomes.
        manifest: Option<Box<ManifestRead>>,
    },
    Rejected(Option<(Bytes, Version)>),
    /// Our validity ended (or the lease or the store's audit failed)
    /// before it was sent.
    NotSent,
}

impl ClaimTry {
    /// The claim's round trips, touching no node state, so that a pass can
    /// have several in flight: gc's floor where needed, the conditional
    /// write (resolved by read-back when its answer is lost), then on
    /// success the audit's read-back and the manifest for the spec.
    /// Boxed and owning what it uses: futures that borrow, gathered by a
    /// stream combinator inside the node's loop, made the compiler give up
    /// proving the spawned loop `Send` (rust-lang/rust#102211).
    fn send(self, deps: ClaimIo) -> futures::future::BoxFuture<'static, ClaimSent> {
        async move {
            // Our validity ended (or the lease was lost, or the store
            // caught lying) while the batch waited: nothing is sent.
            let mut expired = self.live.ended(deps.clock.now());
            let floor = if expired {
                Ok(0)
            } else if self.needs_floor {
                super::gc::floor(&deps.store).await
            } else {
                Ok(0)
            };
            // Above gc's floor (bounded on decode, so `f + 1` fits); none
            // may exceed the highest epoch, and one that would is not sent.
            let epoch = self.epoch.max(floor.as_ref().map_or(0, |f| f + 1));
            let beyond = epoch > crate::record::MAX_EPOCH;
            if beyond {
                tracing::warn!(
                    session = %self.name,
                    "gc's epoch floor is at the highest epoch: no fencing token above it exists; not claimed"
                );
            }
            // Again right before the write: the floor's read takes a trip.
            expired = expired || beyond || self.live.ended(deps.clock.now());
            let sent = deps.clock.now();
            let record = ClaimRecord {
                schema: SCHEMA.into(),
                kind: "session".into(),
                owner: self.owner.clone(),
                epoch,
                state: ClaimState::Running,
                digest: self.digest.clone(),
                address: self.address.clone(),
                exit_code: None,
                restarts: 0,
                // Drawn only for a claim sent (the seeded entropy stream of
                // a simulation is as it was with claims one at a time).
                updated_at_ms: if expired { 0 } else { deps.clock.wall_ms() },
                nonce: if expired {
                    String::new()
                } else {
                    deps.entropy.hex_id()
                },
            };
            let outcome = match floor {
                _ if expired => Ok(ClaimOutcome::NotSent),
                Err(e) => Err(e),
                Ok(_) => self.write(&deps, &record).await,
            };
            ClaimSent {
                t: self,
                sent,
                record,
                outcome,
            }
        }
        .boxed()
    }

    async fn write(&self, deps: &ClaimIo, record: &ClaimRecord) -> Result<ClaimOutcome> {
        let put = put_checked(
            &deps.store,
            &self.key,
            Bytes::from(record.encode()),
            self.cond.clone(),
            &record.nonce,
            json_nonce,
        )
        .await?;
        Ok(match put {
            Put::Committed(version) => {
                let audit = audit(&deps.store, &self.key, &record.nonce, record.epoch).await;
                let manifest = match (self.read_spec, Name::new(&self.name)) {
                    (true, Ok(n)) => Some(Box::new(super::manifest::get(&deps.store, &n).await)),
                    _ => None,
                };
                ClaimOutcome::Committed {
                    version,
                    audit,
                    manifest,
                }
            }
            Put::Rejected(found) => ClaimOutcome::Rejected(found),
        })
    }
}

/// What a full listing of one prefix left to do, gathered as it streamed
/// past (see [`Listed::take`]): the keys it showed, and the entries whose
/// version the cache does not hold.
///
/// Why not the entries themselves: at 100,000 sessions two collected
/// listings held 200,000 of them (key, ETag, size, time) beside the caches
/// they were compared with, lifting a node 30-50 MB above its steady size
/// for the length of a full pass (issue #14; docs/evidence.md, "A full
/// listing streamed"). The keys alone are a third of that, and what is
/// unchanged (all but a few in steady state) is kept no further.
///
/// Which entries are stale is decided as each streams past, against the
/// cache and the corrupt set as they are then: neither may change between
/// the listing and its `refresh` (nothing in a pass writes them between
/// the two; a read placed there would have its key skipped by `refresh`).
struct Listed {
    prefix: &'static str,
    keys: std::collections::HashSet<String>,
    stale: Vec<Entry>,
    /// Keys that are not `<prefix><name>`, at the version listed: marked
    /// corrupt by `refresh`, so a listing that fails half-way changes
    /// nothing.
    foreign: Vec<Entry>,
}

impl Listed {
    fn new(prefix: &'static str) -> Self {
        Listed {
            prefix,
            keys: Default::default(),
            stale: Vec::new(),
            foreign: Vec::new(),
        }
    }

    /// Takes one listed entry: remembered as listed, and kept for a read
    /// unless the cache holds its version (or that version is known
    /// corrupt). A key that is not `<prefix><name>` is not ours (a stray
    /// `notes.txt`, a nested path): reported once, never read.
    fn take<T>(&mut self, e: Entry, cache: &Cached<T>, corrupt: &Tracked<Version>) {
        let known = cache.get(&e.key).is_some_and(|(v, _)| *v == e.version)
            || corrupt.get(&e.key) == Some(&e.version);
        self.keys.insert(e.key.clone());
        if known {
            return;
        }
        let ours = e
            .key
            .strip_prefix(self.prefix)
            .is_some_and(|n| !n.contains('/') && Name::new(n).is_ok());
        if ours {
            self.stale.push(e);
        } else {
            self.foreign.push(e);
        }
    }
}

/// A complete listing of `prefix` taken into `listed`, yielding now and
/// then (see `tick`).
async fn list_into<T>(
    store: &Arc<dyn Store>,
    listed: &mut Listed,
    cache: &Cached<T>,
    corrupt: &Tracked<Version>,
) -> Result<()> {
    let mut s = store.list(listed.prefix);
    while let Some(e) = s.next().await {
        tokio::task::coop::consume_budget().await;
        let e = e.map_err(|e| Error::from_store("list", listed.prefix, e))?;
        listed.take(e, cache, corrupt);
    }
    Ok(())
}

/// Brings `cache` in line with a complete listing: drops keys no longer
/// listed and GETs only keys whose version changed. A corrupt object is
/// logged and left out (never overwritten); it stays out until its version
/// changes. `on_read` sees each object read and cached, with the version
/// its listing showed.
async fn refresh<T>(
    store: &Arc<dyn Store>,
    listed: Listed,
    cache: &mut Cached<T>,
    corrupt: &mut Tracked<Version>,
    decode: impl Fn(&str, &[u8]) -> Result<T>,
    mut on_read: impl FnMut(&str, &Version, &(Version, T)),
) -> Result<bool> {
    let Listed {
        prefix,
        keys,
        stale,
        foreign,
    } = listed;
    let mut changed = false;
    let before = cache.len();
    cache.retain(|k, _| keys.contains(k.as_str()));
    changed |= cache.len() != before;
    corrupt.retain(|k, _| !k.starts_with(prefix) || keys.contains(k.as_str()));
    drop(keys);
    for e in foreign {
        tracing::warn!(key = e.key, "skipping a foreign key (not a valid name)");
        corrupt.insert(e.key, e.version);
    }
    // Read what changed, a few at a time: on a real store a tick after a
    // burst of manifests would otherwise take one round trip per object. A
    // version already found corrupt is not read again until it changes.
    // Each answer is taken as it comes rather than all collected first (at
    // a node's first listing, 100,000 objects' bytes at once): each key's
    // outcome depends on its own answer only, so the order is immaterial.
    let mut fetched = futures::stream::iter(stale)
        .map(|e| {
            let store = store.clone();
            async move {
                let got = store.get(&e.key).await;
                (e, got)
            }
        })
        .buffer_unordered(REFRESH_CONCURRENCY);
    while let Some((e, got)) = fetched.next().await {
        changed = true;
        let bad = match got {
            Ok(Some(o)) => match decode(&e.key, &o.bytes) {
                Ok(rec) => {
                    corrupt.remove(&e.key);
                    let value = (o.version, rec);
                    on_read(&e.key, &e.version, &value);
                    cache.insert(e.key.clone(), value);
                    None
                }
                Err(err) => Some((err.to_string(), o.version)),
            },
            Ok(None) => {
                corrupt.remove(&e.key);
                cache.remove(&e.key);
                None
            }
            // Foreign bytes, an oversized object, a key the store refuses:
            // this key's problem only.
            Err(
                err @ (crate::store::StoreError::Corrupt { .. }
                | crate::store::StoreError::Invalid { .. }),
            ) => Some((err.to_string(), e.version.clone())),
            Err(err) => return Err(Error::from_store("get", &e.key, err)),
        };
        if let Some((reason, version)) = bad {
            // Never read as deleted: the last good record (if any) stays as
            // it was, and the key is reported until it is repaired.
            tracing::warn!(key = e.key, error = %reason, "skipping a corrupt object (its session is left as it was)");
            corrupt.insert(e.key.clone(), version);
        }
    }
    Ok(changed)
}

/// Brings `cache` in line with the bucket for `keys` (those the change feed
/// named): a conditional GET for a cached key (a 304 is the cheapest
/// answer), a GET otherwise. A missing key leaves the cache; a corrupt one
/// is handled as `refresh` does. Returns whether anything changed.
async fn refresh_keys<T>(
    store: &Arc<dyn Store>,
    keys: &[String],
    cache: &mut Cached<T>,
    corrupt: &mut Tracked<Version>,
    decode: impl Fn(&str, &[u8]) -> Result<T>,
) -> Result<bool> {
    let mut asks: Vec<(String, Option<Version>)> = keys
        .iter()
        .map(|k| (k.clone(), cache.get(k).map(|(v, _)| v.clone())))
        .collect();
    // In key order: what a pass does next must not depend on which read
    // came back first (seeded runs replay). Each answer is taken as it
    // comes, in that order (`buffered`), rather than all collected first:
    // at placement a pass's hints name thousands of objects, and their
    // bytes held at once were a node's largest transient (13.6 MB of its
    // peak heap in a heaptrack run at 100,000 sessions, issue #14).
    asks.sort_by(|a, b| a.0.cmp(&b.0));
    let mut fetched = futures::stream::iter(asks)
        .map(|(key, known)| {
            let store = store.clone();
            async move {
                let got = match &known {
                    Some(v) => store.get_if_changed(&key, v).await,
                    None => store.get(&key).await.map(|o| match o {
                        Some(o) => crate::store::Conditional::Changed(o),
                        None => crate::store::Conditional::Missing,
                    }),
                };
                (key, got)
            }
        })
        .buffered(REFRESH_CONCURRENCY);
    let mut changed = false;
    while let Some((key, got)) = fetched.next().await {
        tokio::task::coop::consume_budget().await;
        match got {
            Ok(crate::store::Conditional::NotModified) => {}
            Ok(crate::store::Conditional::Changed(o)) => {
                changed = true;
                match decode(&key, &o.bytes) {
                    Ok(rec) => {
                        corrupt.remove(&key);
                        cache.insert(key, (o.version, rec));
                    }
                    Err(err) => {
                        tracing::warn!(key, error = %err, "skipping a corrupt object (its session is left as it was)");
                        corrupt.insert(key, o.version);
                    }
                }
            }
            Ok(crate::store::Conditional::Missing) => {
                changed |= cache.remove(&key).is_some() | corrupt.remove(&key).is_some();
            }
            Err(
                err @ (crate::store::StoreError::Corrupt { .. }
                | crate::store::StoreError::Invalid { .. }),
            ) => {
                tracing::warn!(key, error = %err, "skipping a corrupt object (its session is left as it was)");
                // No version to remember: the next full listing has one.
            }
            Err(err) => return Err(Error::from_store("get", &key, err)),
        }
    }
    Ok(changed)
}

/// What the renew task shares with the pull loop.
struct RenewLinks {
    /// Out: the lease's validity after each renewal.
    valid: watch::Sender<Validity>,
    /// In: the node's load, published in its attributes.
    load: watch::Receiver<u32>,
    /// In: the pull loop's confirmation of its claims (`confirmed_until`).
    confirmed: watch::Receiver<MonoTime>,
    /// Out: a store violation the audit of a renewal found.
    violation: Arc<std::sync::Mutex<Option<String>>>,
    stop: CancellationToken,
    /// Until then, the node record says `unproven` (see `NodeAttrs`).
    unproven_until: Option<MonoTime>,
    /// In: the anti-entropy interval to publish (`Node::note_fleet_size`).
    pace: watch::Receiver<Duration>,
    /// Out: the interval the last renewal that landed with attributes
    /// carried; the node lists no less often than that
    /// (`Node::take_published_pace`).
    pace_landed: watch::Sender<Duration>,
}

/// Renews the node lease every ttl/3 (publishing the node's load in its
/// attributes), announces each new deadline to the runner, and publishes the
/// validity. Returns the lease when stopped, for release.
async fn renew_task(
    mut lease: Lease,
    cfg: NodeConfig,
    deps: NodeDeps,
    links: RenewLinks,
) -> Option<Lease> {
    let RenewLinks {
        valid,
        load,
        confirmed,
        violation,
        stop,
        unproven_until,
        pace,
        pace_landed,
    } = links;
    let period = core::renew_period(cfg.ttl);
    let mut renewals: u64 = 0;
    // The attributes peers need fresh (cordoned, unproven, the interval) as
    // last written; a change is hinted in the feed (`NodeConfig::peer_refresh`).
    let mut published: Option<(bool, bool, Duration)> = None;
    loop {
        let due = deps.clock.now() + period;
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Some(lease),
            _ = deps.clock.sleep(period) => {}
        }
        let unproven = unproven_until.is_some_and(|t| deps.clock.now() < t);
        let news = (deps.status.cordoned(), unproven, *pace.borrow());
        let attrs = node_attrs(&cfg, news.2, *load.borrow(), news.0, news.1);
        // A shorter interval counts from its sending: the record may show
        // either until the outcome is known (the node shortened its belief
        // already; only a growth waits for `pace_landed`).
        pace_landed.send_if_modified(|v| {
            let lower = news.2 < *v;
            if lower {
                *v = news.2;
            }
            lower
        });
        let t0 = deps.clock.now();
        deps.status.record_renew_late(t0.saturating_since(due));
        let mut with_attrs = true;
        let mut r = lease.set_attrs(attrs).await;
        let step = loop {
            let outcome = match &r {
                Ok(()) => core::RenewOutcome::Committed,
                Err(e) if e.is_transient() => core::RenewOutcome::Transient,
                Err(_) => core::RenewOutcome::Lost,
            };
            match &r {
                Ok(()) => deps
                    .status
                    .record_renew(deps.clock.now().saturating_since(t0)),
                Err(_) => deps.status.record_renew_failure(),
            }
            let step = core::after_renew(
                outcome,
                with_attrs,
                renewals.saturating_add(1),
                AUDIT_SAMPLE,
            );
            if step != core::AfterRenew::RenewPlainly {
                break step;
            }
            with_attrs = false;
            r = lease.renew().await;
        };
        match (step, r) {
            (core::AfterRenew::Renewed { audit: due }, Ok(())) => {
                renewals += 1;
                // What our record now carries (with attributes or not: a
                // plain renewal keeps the record's): the node may list this
                // seldom (a peer reading the record sees it).
                let carried = Duration::from_millis(NodeAttrs::of(lease.record()).max_poll_ms);
                pace_landed.send_if_modified(|v| {
                    let changed = *v != carried;
                    *v = carried;
                    changed
                });
                if with_attrs && published != Some(news) {
                    published = Some(news);
                    if cfg.feed_on() {
                        // Beside the renewals, never before the deadline is
                        // announced: a slow PUT must not hold up the lease.
                        let (store, entropy) = (deps.store.clone(), deps.entropy.clone());
                        let (wall, id) = (deps.clock.wall_ms(), cfg.id.to_string());
                        let forms = deps.hint_forms.clone();
                        tokio::spawn(async move {
                            let form = forms.decide(&store, wall).await;
                            super::feed::write_hint(
                                &store,
                                form,
                                wall,
                                entropy.as_ref(),
                                crate::keys::Hinted::Node,
                                &id,
                            )
                            .await;
                        });
                    }
                }
                if due {
                    let r = audit(
                        &deps.store,
                        lease.key(),
                        &lease.record().nonce,
                        lease.epoch(),
                    )
                    .await;
                    if let Err(e) = r
                        && e.kind() == crate::ErrorKind::Unsupported
                    {
                        deps.journal.record(
                            deps.clock.wall_ms(),
                            EventKind::StoreViolation,
                            None,
                            Some(lease.epoch()),
                            e.to_string(),
                        );
                        *violation.lock().unwrap() = Some(match e {
                            Error::Unsupported { detail, .. } => detail,
                            other => other.to_string(),
                        });
                        let _ = valid.send(Validity {
                            until: lease.valid_until(),
                            lost: true,
                        });
                        return None;
                    }
                }
                // Never past the pull loop's confirmation of our claims.
                let c = *confirmed.borrow();
                let until = core::session_deadline(
                    Some(lease.valid_until()),
                    (c != MonoTime::ZERO).then_some(c),
                )
                .unwrap_or(MonoTime::ZERO);
                deps.runner.announce(until);
                deps.status
                    .set_valid_until(&deps.clock, Some(lease.valid_until()));
                let _ = valid.send(Validity {
                    until: lease.valid_until(),
                    lost: false,
                });
            }
            (_, r) => {
                let why = match r {
                    Err(e) => e.to_string(),
                    Ok(()) => "renewal".to_string(),
                };
                deps.status.set_valid_until(&deps.clock, None);
                deps.journal.record(
                    deps.clock.wall_ms(),
                    EventKind::LeaseLost,
                    None,
                    Some(lease.epoch()),
                    why,
                );
                let _ = valid.send(Validity {
                    until: lease.valid_until(),
                    lost: true,
                });
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version {
            etag: Some(s.to_string()),
            version: None,
        }
    }

    fn entry(key: &str, version: Version) -> Entry {
        Entry {
            key: key.to_string(),
            version,
            size: 1,
            last_modified_ms: None,
        }
    }

    /// A full listing streamed through `Listed` leaves for reading only what
    /// the cache does not hold at the listed version (a changed key, a new
    /// key), never a version known corrupt or a foreign key (reported
    /// corrupt instead), and remembers every key it showed.
    #[test]
    fn a_streamed_listing_keeps_only_what_the_cache_does_not_hold() {
        let mut cache: Cached<()> = Default::default();
        cache.insert("manifests/a".into(), (v("1"), ()));
        cache.insert("manifests/b".into(), (v("1"), ()));
        let mut corrupt: Tracked<Version> = Default::default();
        corrupt.insert("manifests/bad".into(), v("7"));
        let mut l = Listed::new(crate::keys::MANIFESTS);
        for e in [
            entry("manifests/a", v("1")),
            entry("manifests/b", v("2")),
            entry("manifests/bad", v("7")),
            entry("manifests/c", v("1")),
            entry("manifests/x/y", v("1")),
        ] {
            l.take(e, &cache, &corrupt);
        }
        let stale: Vec<(&str, &Version)> = l
            .stale
            .iter()
            .map(|e| (e.key.as_str(), &e.version))
            .collect();
        assert_eq!(stale, [("manifests/b", &v("2")), ("manifests/c", &v("1"))]);
        let mut keys: Vec<&str> = l.keys.iter().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "manifests/a",
                "manifests/b",
                "manifests/bad",
                "manifests/c",
                "manifests/x/y"
            ]
        );
        let foreign: Vec<&str> = l.foreign.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(foreign, ["manifests/x/y"]);
        assert_eq!(corrupt.len(), 1, "nothing marked until the refresh");
    }

    /// `refresh` after a streamed listing: a key the listing did not show
    /// leaves the cache (and the corrupt set), a changed one is read at the
    /// version the store has, an unchanged one is not read at all (nor
    /// shown to `on_read`), and a foreign key is marked corrupt at the
    /// version listed.
    #[tokio::test]
    async fn refresh_from_a_streamed_listing_drops_the_unlisted_and_reads_the_changed() {
        let mem = crate::store::MemoryStore::new();
        let store: Arc<dyn Store> = Arc::new(mem);
        let b = store
            .put("manifests/b", Bytes::from_static(b"b2"), Cond::Create)
            .await
            .unwrap();
        let c = store
            .put("manifests/c", Bytes::from_static(b"c1"), Cond::Create)
            .await
            .unwrap();
        let mut cache: Cached<String> = Default::default();
        // "a" is in the cache at a version the store never had: were it
        // read, its value would change; it is listed at that version, so
        // it must be left alone.
        cache.insert("manifests/a".into(), (v("a-old"), "a".into()));
        cache.insert("manifests/b".into(), (v("b-old"), "b1".into()));
        cache.insert("manifests/gone".into(), (v("1"), "gone".into()));
        let mut corrupt: Tracked<Version> = Default::default();
        corrupt.insert("manifests/gone-bad".into(), v("9"));
        let mut l = Listed::new(crate::keys::MANIFESTS);
        for e in [
            entry("manifests/a", v("a-old")),
            entry("manifests/b", b.clone()),
            entry("manifests/c", c.clone()),
            entry("manifests/not a name", v("3")),
        ] {
            l.take(e, &cache, &corrupt);
        }
        let mut read = Vec::new();
        let changed = refresh(
            &store,
            l,
            &mut cache,
            &mut corrupt,
            |_, bytes| Ok(String::from_utf8(bytes.to_vec()).unwrap()),
            |key, listed, (version, value)| {
                assert_eq!(listed, version, "{key}: read at the listed version");
                read.push((key.to_string(), value.clone()));
            },
        )
        .await
        .unwrap();
        assert!(changed);
        read.sort();
        assert_eq!(
            read,
            [
                ("manifests/b".to_string(), "b2".to_string()),
                ("manifests/c".to_string(), "c1".to_string())
            ]
        );
        let mut got: Vec<(&str, &str)> = cache
            .iter()
            .map(|(k, (_, t))| (k.as_str(), t.as_str()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("manifests/a", "a"),
                ("manifests/b", "b2"),
                ("manifests/c", "c1")
            ]
        );
        assert_eq!(cache.get("manifests/b").map(|(v, _)| v), Some(&b));
        let corrupt: Vec<(&str, &Version)> = corrupt.iter().map(|(k, v)| (k.as_str(), v)).collect();
        assert_eq!(
            corrupt,
            [("manifests/not a name", &v("3"))],
            "an unlisted corrupt key is forgotten, a foreign one marked"
        );
    }
}

#[cfg(test)]
mod live_tests {
    use super::*;

    /// A claim waiting in a batch is not sent once its validity as decided
    /// has passed, nor once the renew task says the lease is lost or past
    /// its end, nor once the audit caught the store letting two writers
    /// win, whatever the validity saved when it was decided (issue #14:
    /// before, a batch checked only that saved validity).
    #[test]
    fn a_batched_claim_is_not_sent_past_the_lease_or_a_store_violation() {
        let t0 = MonoTime::ZERO + Duration::from_secs(100);
        let secs = Duration::from_secs;
        let (tx, rx) = watch::channel(Validity {
            until: t0 + secs(10),
            lost: false,
        });
        let lease = |until: MonoTime, lost: bool| {
            tx.send_replace(Validity { until, lost });
        };
        let live = Live {
            decided: t0 + secs(5),
            lease: Some(rx),
            violation: Default::default(),
        };
        assert!(!live.ended(t0));
        assert!(live.ended(t0 + secs(5)), "past the decided validity");
        lease(t0 + secs(2), false);
        assert!(!live.ended(t0));
        assert!(live.ended(t0 + secs(2)), "past the lease's end now");
        lease(t0 + secs(10), true);
        assert!(live.ended(t0), "the lease lost");
        lease(t0 + secs(10), false);
        assert!(!live.ended(t0));
        *live.violation.lock().unwrap() = Some("two writers won".into());
        assert!(live.ended(t0), "the store caught lying");
    }
}
