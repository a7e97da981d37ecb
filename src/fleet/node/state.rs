//! The node's state (`Node`) and the small records it keeps: owned
//! sessions, known manifests, peers, validity; with its constructor and the
//! journal and audit helpers every part uses.

use super::*;

/// The node lease's state as the renew task publishes it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Validity {
    pub(super) until: MonoTime,
    pub(super) lost: bool,
}

/// A peer's node record as last read, and the version last listed.
#[derive(Debug, Clone)]
pub(super) struct PeerNode {
    pub(super) listed: Version,
    /// When our listings first and last showed `listed`: a version seen
    /// unchanged across listings more than ttl/2 apart has stood still.
    pub(super) listed_since: MonoTime,
    pub(super) listed_last: MonoTime,
    pub(super) fetched: Version,
    pub(super) fetched_at: MonoTime,
    pub(super) record: LeaseRecord,
}

/// What the ring watch remembers of a watched peer (`core::watch_wait`).
#[derive(Debug, Clone, Copy)]
pub(super) struct WatchedPeer {
    /// When the last read's response arrived.
    pub(super) read_at: MonoTime,
    /// When its next renewal is expected to have been sent (from the last
    /// record read: a schedule only, never a judgement).
    pub(super) expect_at: Option<MonoTime>,
}

/// A session this node holds the claim for.
#[derive(Debug, Clone)]
pub(super) struct Owned {
    pub(super) record: ClaimRecord,
    pub(super) version: Version,
    pub(super) running: bool,
    /// The send time of the last request that showed this claim ours: our
    /// write of it, or a listing or read that showed our version. See
    /// `Node::confirmed_until`.
    pub(super) confirmed: MonoTime,
    /// When the current run started (for the crash-loop back-off).
    pub(super) started_at: MonoTime,
    /// Consecutive runs that exited within [`QUICK_EXIT`] of starting.
    pub(super) quick_exits: u32,
    /// A restart held back by the crash-loop back-off until then.
    pub(super) restart_at: Option<MonoTime>,
    /// When its restarts on this node were, within its restart window
    /// (kept only for a rule with a window).
    pub(super) restart_times: std::collections::VecDeque<MonoTime>,
    /// The spec last read for it, with its digest (`Node::spec_for`).
    pub(super) spec: Option<(plan::Digest, Arc<Spec>)>,
    /// Its run finished, but the write that records it did not land (the
    /// store was unreachable): the claim still says running. Until it is
    /// written, the session is neither started again nor released (either
    /// would run a finished job again); each pass retries the write.
    pub(super) pending_finish: Option<PendingFinish>,
    /// When a wake request last reached this node for it (or its run
    /// started): `sleep.after_idle` counts from here.
    pub(super) active_at: MonoTime,
}

/// A finish to record (see [`Owned::pending_finish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PendingFinish {
    pub(super) state: ClaimState,
    pub(super) exit_code: Option<i32>,
    pub(super) reason: Option<String>,
}

/// What a node keeps of a manifest: what placement and the restart rules
/// need, not the spec. At 100,000 sessions the specs (command, arguments,
/// environment, nonce) were most of every node's memory, though a node runs
/// a tenth of them at most (issue #14); a spec is read when a session of
/// this node starts (`Node::spec_for`) and kept only beside its claim.
#[derive(Debug, Clone)]
pub(super) struct KnownManifest {
    pub(super) view: ManifestView,
    pub(super) restart: Restart,
    /// Its schedule, compiled (`schedules.rs`); `None` for most.
    pub(super) schedule: Option<Arc<super::schedules::ScheduleOf>>,
    /// What a claim made without the spec at hand (a wake's,
    /// `wake_now.rs`) must still say from it: the session's port (its
    /// endpoint) and whether it has a health check (`starting` until it
    /// passes, so no waker calls it ready before).
    pub(super) port: Option<u16>,
    pub(super) checked: bool,
}

/// What a node keeps of a claim it reads (`plan::ClaimView`), decoded.
pub(super) fn decode_claim_view(key: &str, bytes: &[u8]) -> Result<ClaimView> {
    ClaimRecord::decode(key, bytes).map(|c| ClaimView::from(&c))
}

impl KnownManifest {
    pub(super) fn of(m: &ManifestRecord) -> Self {
        KnownManifest {
            view: manifest_view(m),
            restart: m.spec.restart,
            schedule: super::schedules::ScheduleOf::of(&m.spec),
            port: m.spec.port,
            checked: m.spec.check.is_some(),
        }
    }

    pub(super) fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        ManifestRecord::decode(key, bytes).map(|m| KnownManifest::of(&m))
    }
}

/// Observations a node process keeps across re-registrations (`Node::memory`;
/// see its fields).
#[derive(Default)]
pub(super) struct Memory {
    /// Absence is an observation, never a death certificate. Node keys a
    /// claim names that we found absent: since when (the arrival of the
    /// first response that showed them absent) and the TTL of the last
    /// record we had (else ours).
    pub(super) absent_nodes: HashMap<String, (MonoTime, Duration)>,
    /// The highest epoch we have seen for each claim key (listed manifests
    /// only): a claim that vanished is made again above it, not at 1.
    pub(super) seen_claims: HashMap<String, u64>,
    /// The longest (ttl, max_poll) any node record we ever decoded
    /// published, ours included: only ever grows, so a peer whose record
    /// vanished, turned corrupt or is cached stale still counts in the hold
    /// a vanished claim waits out (`absent_claim_wait`).
    pub(super) longest: (Duration, Duration),
}

pub(super) enum Ended {
    Shutdown,
    LeaseLost,
    /// The audit caught the store breaking its conditions, or the fleet
    /// marker vanished or changed (the bucket was wiped or replaced).
    Fatal(Error),
}

pub(super) struct Node {
    pub(super) cfg: NodeConfig,
    pub(super) deps: NodeDeps,
    pub(super) client: LeaseClient,
    pub(super) me: Owner,
    pub(super) owned: Tracked<Owned>,
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
    pub(super) confirmed_floor: Option<MonoTime>,
    /// Listed manifest and claim keys that cannot be decoded (or are not
    /// ours at all), with the version found so: each affects its own key
    /// only. A corrupt manifest leaves its session as last known; a corrupt
    /// claim is never taken over; our own claim turning corrupt is lost.
    pub(super) corrupt: Tracked<Version>,
    pub(super) manifests: Cached<KnownManifest>,
    pub(super) claims: Cached<ClaimView>,
    pub(super) idle_ticks: u32,
    /// No crash-loop back-off of an owned session ends before this (a
    /// lower bound: a session lost or restarted since leaves it early,
    /// which costs one pass). The wait between passes ends here, so a
    /// restart comes when the journal said it would, not at the end of an
    /// idle pause.
    pub(super) next_restart: Option<MonoTime>,
    /// The health checks of running sessions (`checks.rs`).
    pub(super) checks: super::checks::Checks,
    /// Owned sessions with a `sleep.after_idle` (the idle check scans
    /// these, not every owned session; entries of sessions no longer owned
    /// are dropped as it goes).
    pub(super) sleepers: std::collections::BTreeSet<String>,
    /// Exits were recorded during the last claim batch (`send_claims`).
    pub(super) exits_mid_batch: bool,
    /// The node lease's validity as the renew task last published it.
    pub(super) validity: Option<watch::Receiver<Validity>>,
    /// Shares `confirmed_until` with the renew task, which announces
    /// min(lease validity, it) to the runner.
    pub(super) confirmed_tx: watch::Sender<MonoTime>,
    /// Passes so far (a claim request between passes counts as one), and
    /// the pass and time of the last confirmation of the marker.
    pub(super) pass: u64,
    /// What the next pass must do beyond its schedule, and why.
    pub(super) next: NextPass,
    /// Set while a pass runs; still set at the next one if it failed.
    pub(super) pass_incomplete: bool,
    /// When every node record was last read again, whole and decodable,
    /// before a vanished claim was made (`read_holds`): when those reads
    /// were sent.
    pub(super) holds_read: Option<MonoTime>,
    /// The change feed as this node reads it, and its retention.
    pub(super) feed: FeedState,
    /// The ring watch and the bell between passes.
    pub(super) ring: RingWatch,
    /// The bucket this node serves: its fleet marker, checked every pass.
    pub(super) bucket: Bucket,
    /// What this node process keeps across re-registrations.
    pub(super) memory: Memory,
    /// The listing interval, and the belief in our claims measured in it.
    pub(super) pace: Pace,
    /// Peers as this node sees them: their node records (never our own), those that cannot be read, when `nodes/` was last listed, who is busy claiming, the fleet as the last pass saw it, and the peers fenced whose takers are not nudged yet.
    pub(super) peers: Peers,
    /// An earlier instance of this node id, and what is proven of it.
    pub(super) predecessor: Predecessor,
    /// What the operator asked of this node (`control/<id>`).
    pub(super) control: Control,
    /// The audit of our own writes: a contradiction seen, and how many claim writes were sent (for the sample).
    pub(super) audit: Audit,
    /// Answers kept while their inputs' generations stand (change-counted caches).
    pub(super) memo: Memo,
    /// The claim gate's memory between passes: when each session was first seen claimable, the names to look at again, the sessions stuck at the highest epoch.
    pub(super) gate: GateState,
    /// The alarm index as last listed (`alarms.rs`).
    pub(super) alarms: super::alarms::AlarmBook,
    /// The scheduled sessions' ticks (`schedules.rs`).
    pub(super) ticks: super::schedules::TickBook,
}

/// Peers as this node sees them: their node records (never our own), those that cannot be read, when `nodes/` was last listed, who is busy claiming, the fleet as the last pass saw it, and the peers fenced whose takers are not nudged yet.
pub(super) struct Peers {
    /// Peers' node records (never our own: we know it).
    pub(super) nodes: HashMap<String, PeerNode>,
    /// Listed node keys whose record is corrupt: their owners' claims are
    /// never taken over (corruption is not absence).
    pub(super) corrupt: std::collections::HashSet<String>,
    /// When the last `nodes/` listing was sent. A peer counts as expired only
    /// if a listing *sent* ttl + margin after its version first arrived still
    /// showed that version: judging against the time the pass reaches its
    /// decision instead would let a slow pass (seconds of reads after the
    /// listing) call peers expired that renewed in the meantime.
    pub(super) listed_at: MonoTime,
    /// Each peer's claim count at the last pass, and when it last rose
    /// (`note_progress`).
    pub(super) progress: HashMap<String, (u32, Option<MonoTime>)>,
    /// The peers as the last pass saw them (id, instance, live, offers
    /// capacity, unproven): a change means a look at the names their
    /// claims hold (`core::peers_changed`).
    pub(super) seen: Vec<core::PeerSeen>,
    /// Peers this node fenced whose ranked takers are not nudged yet.
    pub(super) fenced_now: Vec<String>,
    /// The nudges in flight (best effort; aborted when the node ends).
    pub(super) nudges: tokio::task::JoinSet<()>,
}

/// An earlier instance of this node id, and what is proven of it.
#[derive(Default)]
pub(super) struct Predecessor {
    /// Until when another instance of this node id is not known to have
    /// stopped: set when this instance's registration *created* its node
    /// record (an operator deleted it, or gc did). Without the host lock's
    /// proof, the earlier instance may run until its own deadline, which is
    /// within ttl + margin of that creation (its last renewal was sent
    /// before the deletion, which was before the create).
    pub(super) unproven_until: Option<MonoTime>,
    /// The instance whose record this registration took over by a proof
    /// (its release, its expiry, or our host lock): its claims are ours at
    /// once even during the wait above, which is for instances before it.
    pub(super) proven: Option<String>,
}

/// What the operator asked of this node (`control/<id>`).
#[derive(Default)]
pub(super) struct Control {
    /// Draining (see `apply_control`): not even a predecessor's sessions
    /// are reclaimed.
    pub(super) draining: bool,
    /// A read of the control object has succeeded in this registration;
    /// until then nothing is claimed (see `tick`).
    pub(super) read: bool,
}

/// The audit of our own writes: a contradiction seen, and how many claim writes were sent (for the sample).
#[derive(Default)]
pub(super) struct Audit {
    /// Set when an audit read-back contradicts a write the store reported
    /// committed (here or in the renew task): the node stops serving.
    pub(super) violation: Arc<std::sync::Mutex<Option<String>>>,
    /// Conditional writes of claims so far, for the audit's sample.
    pub(super) claim_writes: u64,
}

/// Answers kept while their inputs' generations stand (change-counted caches).
#[derive(Default)]
pub(super) struct Memo {
    /// `claim_loads` as of the claims' generation it was counted at.
    pub(super) loads: Option<(u64, HashMap<String, u32>)>,
    /// The inputs' generations (`owned_inputs`) at which `owned_due`'s
    /// last scan found nothing due.
    pub(super) owned_idle: Option<[u64; 4]>,
    /// What `publish_status` last published: the owned sessions' generation,
    /// `ready`, and the status's count of snapshots set after ours.
    pub(super) published: Option<(u64, bool, u64)>,
}

/// The claim gate's memory between passes: when each session was first seen claimable, the names to look at again, the sessions stuck at the highest epoch.
#[derive(Default)]
pub(super) struct GateState {
    /// When each session was first seen claimable (for rank × grace).
    pub(super) first_claimable: HashMap<String, MonoTime>,
    /// Names to look at again in the next pass whatever the hints say: those
    /// the last pass did not claim and did not find unclaimable (grace,
    /// rank, absence waits, a refused write, capacity).
    pub(super) revisit: std::collections::BTreeSet<String>,
    /// Sessions whose claim sits at the highest epoch (foreign bytes: no
    /// token above it exists, so nothing may take it over), each said once.
    pub(super) stuck: std::collections::HashSet<String>,
}

/// The change feed as this node reads it (light passes; see [`crate::fleet::feed`]), and the feed's retention.
pub(super) struct FeedState {
    /// The change feed's cursor (light passes; see [`crate::fleet::feed`]).
    pub(super) cursor: crate::fleet::feed::FeedCursor,
    /// When the feed was last covered (read, or a full listing sent).
    pub(super) read_at: Option<MonoTime>,
    /// The retention task, if one runs, and when it was last started.
    pub(super) expiring: Option<AbortOnDrop<()>>,
    pub(super) expired_at: Option<MonoTime>,
}

/// What the ring watch and the bell remember between passes (`ring_watch.rs`).
pub(super) struct RingWatch {
    /// Watched peers whose record a watch read found missing, with the
    /// listed version then: each hurries one pass (see `watch_peers`).
    pub(super) missing: HashMap<String, Version>,
    /// What the ring watch remembers of each watched peer.
    pub(super) read: HashMap<String, WatchedPeer>,
    /// The fleet's bell as last read (`feed::ring_bell`): when, and the
    /// version it showed (`None`: missing).
    pub(super) bell: Option<(MonoTime, Option<Version>)>,
}

/// The bucket this node serves: the fleet marker, its generation's epoch base (no claim of ours is made at or below it), and when it was last confirmed.
pub(super) struct Bucket {
    /// The fleet marker this node serves (checked every pass), and the
    /// epoch base of its generation: no claim of ours is made at or below it.
    pub(super) marker: (crate::fleet::marker::FleetMarker, Version),
    pub(super) epoch_base: u64,
    pub(super) checked: Option<(u64, MonoTime)>,
}

/// The anti-entropy interval this node lists at, and the interval its belief in its claims is measured in: the belief is never longer than the interval (`Pace::check`).
pub(super) struct Pace {
    /// The anti-entropy interval this node lists at (`core::adopt_pace`):
    /// `cfg.full_every` at registration (what the registration published),
    /// then grown with the fleet only as far as a landed renewal carried.
    pub(super) full_every: Duration,
    /// The interval the last full listing's count calls for
    /// (`core::full_listing_pace`).
    pub(super) wanted: Duration,
    /// To the renew task: the interval to publish (`max_poll_ms`).
    pub(super) tx: watch::Sender<Duration>,
    /// From the renew task: the interval its last landed renewal carried.
    pub(super) landed: Option<watch::Receiver<Duration>>,
    /// The interval our belief in our claims is measured in
    /// (`confirmed_until`): `full_every` once every claim we hold was
    /// confirmed after its last growth (`grown_at`), the shorter one
    /// before. Why: a claim confirmed when we promised (published) to list
    /// again within the old interval may have been deleted since, and a
    /// peer may have waited out only that interval; a longer belief would
    /// stretch that confirmation after the fact, and a session whose
    /// deadline lapsed would be started again beside the peer's.
    pub(super) belief: Duration,
    pub(super) grown_at: MonoTime,
    /// The interval would grow, but `note_fleet_size` holds it at
    /// `full_every` (logged once each time it starts holding).
    pub(super) growth_held: bool,
    /// When the last full listing of `manifests/` and `sessions/` was sent.
    pub(super) last_full: Option<MonoTime>,
}

impl Pace {
    fn new(full_every: Duration) -> Self {
        Pace {
            full_every,
            wanted: full_every,
            tx: watch::Sender::new(full_every),
            landed: None,
            belief: full_every,
            grown_at: MonoTime::ZERO,
            growth_held: false,
            last_full: None,
        }
    }

    /// The invariant this group owns: a belief longer than the interval
    /// would stretch a claim's confirmation past the listing that gave it.
    #[cfg(debug_assertions)]
    pub(super) fn check(&self) {
        assert!(
            self.belief <= self.full_every,
            "belief {:?} longer than the listing interval {:?}",
            self.belief,
            self.full_every
        );
    }
}

/// A serving node re-reads the fleet marker at least every this many ttls
/// even when it writes nothing (see `Node::ensure_marker`).
pub const MARKER_EVERY: u32 = 10;

/// One in this many of a node's own renewals and claim updates is read back
/// by the audit (every claim creation, takeover and fence is).
pub const AUDIT_SAMPLE: u64 = 16;

pub(super) fn name_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

impl Node {
    pub(super) fn new(
        cfg: NodeConfig,
        deps: NodeDeps,
        client: LeaseClient,
        marker: (crate::fleet::marker::FleetMarker, Version),
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
            corrupt: Tracked::default(),
            manifests: Cached::default(),
            claims: Cached::default(),
            idle_ticks: 0,
            validity: None,
            confirmed_tx: watch::Sender::new(MonoTime::ZERO),
            pass: 0,
            next_restart: None,
            checks: Default::default(),
            sleepers: Default::default(),
            exits_mid_batch: false,
            next: NextPass::registered(),
            pass_incomplete: false,
            holds_read: None,
            feed: FeedState {
                cursor: crate::fleet::feed::FeedCursor::new(cfg_skew),
                read_at: None,
                expiring: None,
                expired_at: None,
            },
            ring: RingWatch {
                missing: HashMap::new(),
                read: HashMap::new(),
                bell: None,
            },
            bucket: Bucket {
                epoch_base: crate::fleet::marker::epoch_base(marker.0.generation),
                marker,
                checked: None,
            },
            memory,
            pace: Pace::new(full_every),
            peers: Peers {
                nodes: HashMap::new(),
                corrupt: Default::default(),
                listed_at: MonoTime::ZERO,
                progress: HashMap::new(),
                seen: Vec::new(),
                fenced_now: Vec::new(),
                nudges: tokio::task::JoinSet::new(),
            },
            predecessor: Predecessor {
                unproven_until: None,
                proven: None,
            },
            control: Control {
                draining: false,
                read: false,
            },
            audit: Audit {
                violation: Default::default(),
                claim_writes: 0,
            },
            memo: Memo {
                loads: None,
                owned_idle: None,
                published: None,
            },
            gate: GateState {
                first_claimable: HashMap::new(),
                revisit: Default::default(),
                stuck: Default::default(),
            },
            alarms: Default::default(),
            ticks: Default::default(),
        }
    }

    pub(super) fn event(
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

    pub(super) fn take_memory(&mut self) -> Memory {
        std::mem::take(&mut self.memory)
    }

    /// Confirms the fleet marker (a conditional GET: a 304 when unchanged)
    /// before this pass issues an epoch (a claim, a takeover, a fence): once
    /// per pass. A wiped or replaced bucket is `Corrupt` at key `fleet`,
    /// which ends the node (see `serve`).
    pub(super) async fn ensure_marker(&mut self) -> Result<()> {
        if self.bucket.checked.is_some_and(|(p, _)| p == self.pass) {
            return Ok(());
        }
        // As of when it was sent: what a wake's claim leans on
        // (`wake_now::MARKER_FRESH_FOR`) is never younger than it is.
        let sent = self.deps.clock.now();
        crate::fleet::marker::check(
            &self.deps.store,
            &self.bucket.marker.0,
            &self.bucket.marker.1,
        )
        .await?;
        self.bucket.checked = Some((self.pass, sent));
        Ok(())
    }

    /// Reads back a write the store reported committed (see
    /// [`crate::fleet::audit`]). A contradiction is a store violation, recorded for
    /// the serve loop to act on; a read that fails is no evidence either way.
    pub(super) async fn audit(&mut self, key: &str, nonce: &str, epoch: u64) {
        let r = audit(&self.deps.store, key, nonce, epoch).await;
        self.note_audit(key, r, epoch);
    }

    /// What the audit read-back of one of our committed writes found: a
    /// store that let two writers win stops the node.
    pub(super) fn note_audit(&mut self, key: &str, r: Result<()>, epoch: u64) {
        match r {
            Err(e) if e.kind() == crate::ErrorKind::Unsupported => {
                tracing::error!(error = %crate::error::Chain(&e), "store violation: stopping");
                self.event(EventKind::StoreViolation, None, Some(epoch), e.to_string());
                *self.audit.violation.lock().unwrap() = Some(match e {
                    Error::Unsupported { detail, .. } => detail,
                    other => other.to_string(),
                });
            }
            Err(e) => {
                tracing::warn!(key, error = %crate::error::Chain(&e), "audit read-back failed")
            }
            Ok(()) => {}
        }
    }
}
