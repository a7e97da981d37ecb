//! What a node is told at start ([`NodeConfig`]) and what it is given to
//! work with ([`NodeDeps`]: store, clock, entropy, runner, journal).

use super::*;

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
    /// The host in a session's endpoint (`<host>:<port>` for a spec with a
    /// `port`). Default: the host of `address`, else this machine's name.
    pub session_host: Option<String>,
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
    /// [`crate::fleet::feed`]) and read only the keys hints name, so their cost
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
            session_host: None,
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
    /// (`crate::fleet::nudge`); `None`: they notice at their own pace.
    pub nudge: Option<Arc<dyn crate::fleet::nudge::Nudge>>,
    /// Where the renew task runs. `Some`: a runtime no pass ever occupies
    /// ([`crate::fleet::renew_thread::RenewThread`], as the daemon and the spike
    /// set it; keep it until `run` returns), so a renewal never waits behind
    /// a pass (what it can wait for there is listed on that module).
    /// `None`: the runtime `run` is called on, where a long pass delays it
    /// (the seeded simulation, whose nodes share one current-thread runtime
    /// on a manual clock, and tests of the protocol itself).
    pub renew_on: Option<tokio::runtime::Handle>,
    /// How hints are spelt (`crate::fleet::feed::HintForms`): this node sets it
    /// after each `nodes/` listing and spells its own node hints by it.
    /// Share it with the `HintingStore` in `store`
    /// (`HintingStore::forms`), which then never lists `nodes/` itself to
    /// decide.
    pub hint_forms: Arc<crate::fleet::feed::HintForms>,
    /// The session channel's registry (`crate::fleet::channel`), when this
    /// node serves one: each run gets a credential registered here.
    pub channel: Option<Arc<crate::fleet::channel::Registry>>,
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
            channel: None,
            hint_forms: crate::fleet::feed::HintForms::auto(),
        }
    }
}
