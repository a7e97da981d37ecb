//! Several nodes in one process, on memory and on the local directory store:
//! manifests materialise on exactly one node, move when that node dies, and
//! never run twice at once. All nodes share one clock so that their runners'
//! histories can be compared; each node has its own recording runner, which
//! enforces deadlines as the exec runner's watchdog does.

mod common;

use leasehold::clock::{Clock, OsEntropy, SystemClock};
use leasehold::fleet::claim::{ClaimRecord, ClaimState};
use leasehold::fleet::journal::{EventKind, Journal};
use leasehold::fleet::manifest::{self, Applied, RestartPolicy, Spec};
use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
use leasehold::fleet::runner::RecordingRunner;
use leasehold::store::{LocalDirStore, ObjectStoreBackend, Store};
use leasehold::{ErrorKind, Name};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_millis(600);

struct TestNode {
    id: String,
    runner: Arc<RecordingRunner>,
    status: Arc<leasehold::fleet::node::NodeStatus>,
    journal: Arc<Journal>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<leasehold::Result<()>>,
}

struct Fleet {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    nodes: Vec<TestNode>,
    dead: Vec<TestNode>,
}

/// The fleet marker every node needs before it serves (`leasehold init`);
/// idempotent, and retried through the faults of a faulty store.
async fn init_marker(store: &Arc<dyn Store>) {
    for _ in 0..200 {
        if leasehold::fleet::marker::init(store, &leasehold::clock::OsEntropy::new(), 0, 1)
            .await
            .is_ok()
        {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("could not write the fleet marker");
}

fn spec(cmd: &str) -> Spec {
    Spec::new(cmd, &[])
}

impl Fleet {
    fn new(store: Arc<dyn Store>) -> Self {
        Fleet {
            store,
            clock: Arc::new(SystemClock::new()),
            nodes: Vec::new(),
            dead: Vec::new(),
        }
    }

    fn start(&mut self, id: &str, capacity: u32, labels: &[(&str, &str)]) {
        self.start_on(self.store.clone(), id, capacity, labels);
    }

    /// As `start`, with a store of its own (a wrapper that misbehaves for
    /// this node only).
    fn start_on(
        &mut self,
        store: Arc<dyn Store>,
        id: &str,
        capacity: u32,
        labels: &[(&str, &str)],
    ) {
        let mut cfg = NodeConfig::new(Name::new(id).unwrap(), TTL);
        cfg.capacity = capacity;
        cfg.poll = Duration::from_millis(50);
        cfg.max_poll = Duration::from_millis(100);
        cfg.grace = Duration::from_millis(100);
        cfg.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let runner = Arc::new(RecordingRunner::new(self.clock.clone()));
        let journal = Arc::new(Journal::new(10_000, 1 << 20));
        let deps = NodeDeps {
            journal: journal.clone(),
            ..NodeDeps::new(store, self.clock.clone(), runner.clone())
        };
        let shutdown = CancellationToken::new();
        let init_store = self.store.clone();
        let stop = shutdown.clone();
        let status = deps.status.clone();
        let task = tokio::spawn(async move {
            init_marker(&init_store).await;
            node::run(cfg, deps, stop).await
        });
        self.nodes.push(TestNode {
            id: id.into(),
            runner,
            status,
            journal,
            shutdown,
            task,
        });
    }

    /// Starts a node with a claim endpoint (the caller's node of a wake) on
    /// `store` with `cfg`, and returns its handle. It joins `nodes`, so
    /// `finish` checks it and shuts it down.
    fn start_caller(&mut self, store: Arc<dyn Store>, cfg: NodeConfig) -> node::NodeHandle {
        let runner = Arc::new(RecordingRunner::new(self.clock.clone()));
        let journal = Arc::new(Journal::new(10_000, 1 << 20));
        let (handle, inbox) = node::claim_channel(&cfg.id);
        let deps = NodeDeps {
            journal: journal.clone(),
            claims: Some(inbox),
            ..NodeDeps::new(store, self.clock.clone(), runner.clone())
        };
        let shutdown = CancellationToken::new();
        let init_store = self.store.clone();
        let stop = shutdown.clone();
        let id = cfg.id.to_string();
        let status = deps.status.clone();
        let task = tokio::spawn(async move {
            init_marker(&init_store).await;
            node::run(cfg, deps, stop).await
        });
        self.nodes.push(TestNode {
            id,
            runner,
            status,
            journal,
            shutdown,
            task,
        });
        handle
    }

    /// Waits (bounded) until `n` node records are listed, then long enough
    /// for every node to have listed them too (a few base polls).
    async fn wait_registered(&self, n: usize) {
        use futures::StreamExt;
        for _ in 0..400 {
            let listed = self.store.list("nodes/").count().await;
            if listed >= n {
                self.clock.sleep(Duration::from_millis(300)).await;
                return;
            }
            self.clock.sleep(Duration::from_millis(25)).await;
        }
        panic!("{n} nodes never registered");
    }

    /// Where each session runs now: name -> [(node, epoch)].
    fn placement(&self) -> BTreeMap<String, Vec<(String, u64)>> {
        let mut m: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
        for n in self.nodes.iter().chain(self.dead.iter()) {
            for (s, e) in leasehold::fleet::runner::Runner::running(n.runner.as_ref()) {
                m.entry(s).or_default().push((n.id.clone(), e));
            }
        }
        m
    }

    async fn wait_for(
        &self,
        what: &str,
        mut ok: impl FnMut(&BTreeMap<String, Vec<(String, u64)>>) -> bool,
    ) {
        for _ in 0..800 {
            if ok(&self.placement()) {
                return;
            }
            self.clock.sleep(Duration::from_millis(25)).await;
        }
        panic!("timed out waiting for {what}: {:?}", self.placement());
    }

    /// The end of every scenario: check that no session ever ran twice at
    /// once, then shut the remaining nodes down gracefully.
    async fn finish(mut self) {
        self.assert_never_twice();
        for n in self.nodes.drain(..) {
            n.shutdown.cancel();
            n.task.await.unwrap().unwrap();
        }
    }

    /// No session ever ran on two nodes at overlapping times.
    fn assert_never_twice(&self) {
        let mut runs: Vec<common::Run<Duration>> = Vec::new();
        for n in self.nodes.iter().chain(self.dead.iter()) {
            for (s, e, a, b) in n.runner.history() {
                runs.push((s, e, n.id.clone(), a.since_origin(), b.since_origin()));
            }
        }
        common::assert_never_twice("", &runs);
    }

    /// Waits (bounded) until the claim of `name` reaches `state`; the caller
    /// asserts on it afterwards.
    async fn wait_claim_state(&self, name: &str, state: ClaimState) {
        for _ in 0..100 {
            if self.claim(name).await.state == state {
                return;
            }
            self.clock.sleep(Duration::from_millis(20)).await;
        }
    }

    async fn claim(&self, name: &str) -> ClaimRecord {
        let o = self
            .store
            .get(&format!("sessions/{name}"))
            .await
            .unwrap()
            .unwrap();
        ClaimRecord::decode(name, &o.bytes).unwrap()
    }
}

async fn apply(store: &Arc<dyn Store>, name: &str, s: &Spec) -> Applied {
    manifest::apply(store, &OsEntropy::new(), &Name::new(name).unwrap(), s, None)
        .await
        .unwrap()
}

async fn scenario(store: Arc<dyn Store>) {
    let mut f = Fleet::new(store.clone());
    for id in ["n1", "n2", "n3"] {
        f.start(id, 8, &[("zone", if id == "n3" { "b" } else { "a" })]);
    }
    // Spread is asserted below: a node that lists manifests before its peers
    // have registered rightly takes them all (on a slow server, it happens).
    f.wait_registered(3).await;
    for i in 0..6 {
        assert!(matches!(
            apply(&store, &format!("s{i}"), &spec("sleep")).await,
            Applied::Created(_)
        ));
    }
    let mut zoned = spec("sleep");
    zoned.selector.insert("zone".into(), "b".into());
    apply(&store, "zoned", &zoned).await;

    // Every session runs on exactly one node. (Usually at epoch 1; on a
    // starved machine a renewal can miss the 600 ms TTL and a peer rightly
    // takes over, so the epoch is not asserted here: only that it rises.)
    f.wait_for("7 sessions placed", |p| {
        p.len() == 7 && p.values().all(|v| v.len() == 1)
    })
    .await;
    let p = f.placement();
    assert_eq!(p["zoned"][0].0, "n3", "the selector is honoured");
    let spread: std::collections::BTreeSet<_> = p.values().map(|v| v[0].0.clone()).collect();
    assert!(spread.len() >= 2, "placement spreads: {p:?}");

    // Idempotent admission: same digest answers Unchanged; another digest is
    // a Conflict and changes nothing.
    assert!(matches!(
        apply(&store, "s0", &spec("sleep")).await,
        Applied::Unchanged(_)
    ));
    let before = store.get("manifests/s0").await.unwrap().unwrap();
    let e = manifest::apply(
        &store,
        &OsEntropy::new(),
        &Name::new("s0").unwrap(),
        &spec("other"),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert_eq!(store.get("manifests/s0").await.unwrap().unwrap(), before);

    // Crash a node (no graceful shutdown): its sessions move to the others
    // after its node lease is observed unchanged for ttl + margin, each at a
    // higher epoch than it had.
    let victim = f
        .nodes
        .iter()
        .position(|n| p.values().any(|v| v[0].0 == n.id) && n.id != "n3")
        .unwrap();
    let dead = f.nodes.remove(victim);
    dead.task.abort();
    let dead_id = dead.id.clone();
    let moved: Vec<String> = p
        .iter()
        .filter(|(_, v)| v[0].0 == dead_id)
        .map(|(k, _)| k.clone())
        .collect();
    f.dead.push(dead);
    let before: BTreeMap<String, u64> = moved.iter().map(|s| (s.clone(), p[s][0].1)).collect();
    f.wait_for("failover", |p| {
        moved.iter().all(|s| {
            p.get(s)
                .is_some_and(|v| v.len() == 1 && v[0].0 != dead_id && v[0].1 > before[s])
        })
    })
    .await;
    for s in &moved {
        let c = f.claim(s).await;
        assert!(
            c.epoch > before[s],
            "{s}: epoch {} after {}",
            c.epoch,
            before[s]
        );
        assert_ne!(c.owner.node, dead_id);
    }

    // Graceful shutdown of another node: its claims are released and move
    // at once (no TTL wait), epoch + 1.
    let p = f.placement();
    let leaving = f
        .nodes
        .iter()
        .position(|n| n.id != "n3" && p.values().any(|v| v[0].0 == n.id));
    if let Some(i) = leaving {
        let mut n = f.nodes.remove(i);
        let gone = n.id.clone();
        n.shutdown.cancel();
        (&mut n.task).await.unwrap().unwrap();
        assert!(
            n.journal
                .after(0, 10_000)
                .unwrap()
                .events
                .iter()
                .any(|e| e.kind == EventKind::Released)
        );
        let was: Vec<String> = p
            .iter()
            .filter(|(_, v)| v[0].0 == gone)
            .map(|(k, _)| k.clone())
            .collect();
        f.dead.push(n);
        f.wait_for("hand-over after release", |p| {
            was.iter()
                .all(|s| p.get(s).is_some_and(|v| v.len() == 1 && v[0].0 != gone))
        })
        .await;
    }

    // Deleting a manifest stops its session and releases the claim; the
    // tombstone keeps the epoch.
    manifest::delete(&store, &Name::new("s1").unwrap())
        .await
        .unwrap();
    f.wait_for("s1 stopped", |p| !p.contains_key("s1")).await;
    f.wait_claim_state("s1", ClaimState::Released).await;
    assert_eq!(f.claim("s1").await.state, ClaimState::Released);

    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fleet_on_memory() {
    scenario(Arc::new(ObjectStoreBackend::memory())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fleet_on_local_directory() {
    let d = tempfile::tempdir().unwrap();
    scenario(Arc::new(LocalDirStore::open(d.path()).unwrap())).await;
}

/// Finished sessions free their slot: on a capacity-1 node, the next job
/// runs once the first has succeeded (it used to stay queued until the
/// finished one's manifest was deleted). A new spec for the finished one,
/// while the node is full again, releases it to placement rather than
/// overcommitting the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finished_sessions_free_their_capacity() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("one", 1, &[]);
    let mut job = spec("true");
    job.restart = RestartPolicy::Never.into();
    apply(&store, "first", &job).await;
    f.wait_for("first running", |p| p.contains_key("first"))
        .await;
    apply(&store, "second", &job).await;
    let runner = f.nodes[0].runner.clone();
    runner.exit("first", 0);
    f.wait_claim_state("first", ClaimState::Succeeded).await;
    assert_eq!(f.claim("first").await.state, ClaimState::Succeeded);
    f.wait_for("second runs in the freed slot", |p| {
        p.contains_key("second")
    })
    .await;
    assert!(!f.placement().contains_key("first"));
    // The node is full (second runs); first gets a new spec: released, not
    // run beside second.
    let (_, v) = manifest::get(&store, &Name::new("first").unwrap())
        .await
        .unwrap()
        .unwrap();
    let mut changed = job.clone();
    changed.args = vec!["again".into()];
    manifest::apply(
        &store,
        &OsEntropy::new(),
        &Name::new("first").unwrap(),
        &changed,
        Some(&v),
    )
    .await
    .unwrap();
    f.wait_claim_state("first", ClaimState::Released).await;
    assert_eq!(f.claim("first").await.state, ClaimState::Released);
    assert_eq!(f.placement().len(), 1, "{:?}", f.placement());
    f.finish().await;
}

/// A crash loop is visible and backs off: the first restart is at once,
/// then each quick exit waits longer (250 ms, 500 ms, ...), each wait is a
/// `backoff` event in the journal, and the claim counts every restart and
/// keeps the last exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_crash_loop_backs_off_and_counts_its_restarts() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("solo", 4, &[]);
    let mut svc = spec("crasher");
    svc.restart = RestartPolicy::Always.into();
    apply(&store, "svc", &svc).await;
    f.wait_for("running", |p| p.contains_key("svc")).await;
    let runner = f.nodes[0].runner.clone();
    let journal = f.nodes[0].journal.clone();
    let count = |k: EventKind| journal.totals().get(&k).copied().unwrap_or(0);
    // The published status (HTTP `/v1/sessions`) follows each change: it is
    // rebuilt only when what the node holds differs from it, so a compare
    // that missed a field would leave it stale.
    let status = f.nodes[0].status.clone();
    let shown = |restarts: u32, running: bool| {
        let snap = status.snapshot();
        snap.sessions.len() == 1
            && snap.sessions[0].name == "svc"
            && snap.sessions[0].restarts == restarts
            && snap.sessions[0].running == running
    };
    for i in 1..=4 {
        runner.exit("svc", 7);
        for _ in 0..400 {
            if count(EventKind::Exited) >= i {
                break;
            }
            f.clock.sleep(Duration::from_millis(10)).await;
        }
        assert!(count(EventKind::Exited) >= i, "exit {i} never seen");
        f.wait_for("restarted", |p| p.contains_key("svc")).await;
        if i == 1 {
            // The first restart has no back-off: the exit, the restart's
            // write and the start happen in one pass, so only `restarts`
            // differs from what was published.
            for _ in 0..400 {
                if shown(1, true) {
                    break;
                }
                f.clock.sleep(Duration::from_millis(10)).await;
            }
            assert!(
                shown(1, true),
                "after the first restart: {:?}",
                status.snapshot().sessions
            );
        }
    }
    assert!(
        count(EventKind::Backoff) >= 3,
        "three waits after four quick exits: {:?}",
        journal.totals()
    );
    let c = f.claim("svc").await;
    if c.epoch == 1 {
        assert_eq!((c.restarts, c.exit_code), (4, Some(7)), "{c:?}");
    }
    for _ in 0..400 {
        if shown(c.restarts, true) {
            break;
        }
        f.clock.sleep(Duration::from_millis(10)).await;
    }
    assert!(shown(c.restarts, true), "{:?}", status.snapshot().sessions);
    store
        .delete(&leasehold::keys::manifest("svc"))
        .await
        .unwrap();
    for _ in 0..400 {
        if status.snapshot().sessions.is_empty() {
            break;
        }
        f.clock.sleep(Duration::from_millis(10)).await;
    }
    assert!(
        status.snapshot().sessions.is_empty(),
        "a released session left in the status: {:?}",
        status.snapshot().sessions
    );
    f.finish().await;
}

/// gc removes a deleted session's tombstone, yet a session applied again
/// under the same name never gets an epoch it had: the floor is raised
/// before the delete, and a claim made over a placeholder or an absence
/// starts above it. (Without the floor, the new claim would be epoch 1.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_never_lets_an_epoch_be_issued_twice() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("solo", 4, &[]);
    apply(&store, "web", &spec("daemon")).await;
    f.wait_for("web running", |p| p.contains_key("web")).await;
    let first = f.claim("web").await.epoch;
    manifest::delete(&store, &Name::new("web").unwrap())
        .await
        .unwrap();
    f.wait_claim_state("web", ClaimState::Released).await;
    assert_eq!(f.claim("web").await.state, ClaimState::Released);
    let entropy = OsEntropy::new();
    let plan = leasehold::fleet::gc::scan(&store, u64::MAX / 2, Duration::ZERO)
        .await
        .unwrap();
    assert!(plan.iter().any(|r| r.key == "sessions/web"), "{plan:?}");
    assert!(
        !plan.iter().any(|r| r.key == "nodes/solo"),
        "a live node's record is never removed: {plan:?}"
    );
    let removed = leasehold::fleet::gc::apply(&store, &entropy, &plan)
        .await
        .unwrap();
    assert!(removed.contains(&"sessions/web".to_string()), "{removed:?}");
    assert!(store.get("sessions/web").await.unwrap().is_none());
    assert!(leasehold::fleet::gc::floor(&store).await.unwrap() > first);
    // The same name again: a fresh placeholder, claimed above the floor.
    apply(&store, "web", &spec("daemon")).await;
    f.wait_for("web running again", |p| p.contains_key("web"))
        .await;
    let again = f.claim("web").await.epoch;
    assert!(again > first, "epoch {again} after gc, was {first}");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_policies_and_pause() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("solo", 8, &[]);
    let mut once = spec("true");
    once.restart = RestartPolicy::OnFailure.into();
    apply(&store, "once", &once).await;
    let mut svc = spec("daemon");
    svc.restart = RestartPolicy::Always.into();
    apply(&store, "svc", &svc).await;
    f.wait_for("both running", |p| p.len() == 2).await;
    let runner = f.nodes[0].runner.clone();
    // on-failure, exit 0: succeeded, not restarted.
    runner.exit("once", 0);
    f.wait_for("once done", |p| !p.contains_key("once")).await;
    f.wait_claim_state("once", ClaimState::Succeeded).await;
    let c = f.claim("once").await;
    assert_eq!((c.state, c.exit_code), (ClaimState::Succeeded, Some(0)));
    // always: restarted on the same claim, and the claim in the bucket
    // shows the restart and the last exit code (not only the node's memory).
    runner.exit("svc", 3);
    f.clock.sleep(Duration::from_millis(300)).await;
    assert!(f.placement().contains_key("svc"), "restarted");
    let c = f.claim("svc").await;
    // (A starved machine can make the node lose its lease and take the claim
    // back at epoch 2, which starts the count afresh.)
    if c.epoch == 1 {
        assert_eq!(
            (c.state, c.restarts, c.exit_code),
            (ClaimState::Running, 1, Some(3))
        );
    }
    // Pause: stopped, claim paused; unpause: runs again.
    let (_, v) = manifest::get(&store, &Name::new("svc").unwrap())
        .await
        .unwrap()
        .unwrap();
    let mut paused = svc.clone();
    paused.paused = true;
    let r = manifest::apply(
        &store,
        &OsEntropy::new(),
        &Name::new("svc").unwrap(),
        &paused,
        Some(&v),
    )
    .await
    .unwrap();
    assert!(matches!(r, Applied::Replaced(_)));
    f.wait_for("svc paused", |p| !p.contains_key("svc")).await;
    f.wait_claim_state("svc", ClaimState::Paused).await;
    assert_eq!(f.claim("svc").await.state, ClaimState::Paused);
    let (_, v) = manifest::get(&store, &Name::new("svc").unwrap())
        .await
        .unwrap()
        .unwrap();
    manifest::apply(
        &store,
        &OsEntropy::new(),
        &Name::new("svc").unwrap(),
        &svc,
        Some(&v),
    )
    .await
    .unwrap();
    f.wait_for("svc resumed", |p| p.contains_key("svc")).await;
    // A stale replace (old version) is a Conflict and changes nothing.
    let e = manifest::apply(
        &store,
        &OsEntropy::new(),
        &Name::new("svc").unwrap(),
        &paused,
        Some(&v),
    )
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fleet_on_moto() {
    let Some(base) = common::server("LEASEHOLD_TEST_S3") else {
        return;
    };
    use leasehold::clock::Entropy;
    let url = format!("{base}/fleet-{}", OsEntropy::new().hex_id());
    let store = leasehold::store::open_store(&url, &Default::default())
        .await
        .unwrap();
    scenario(store).await;
}

/// Steady-state cost, counted exactly on a manual clock: an idle node (no
/// manifests) and a busy one (10 sessions) over one virtual hour. The
/// pull loop must sleep between listings (a hot loop once made thousands of
/// requests a second), and sessions must cost ~nothing at steady state: only
/// the node lease is renewed.
#[tokio::test(flavor = "current_thread")]
async fn steady_state_requests_per_node_hour() {
    use leasehold::clock::ManualClock;
    use leasehold::store::CountingStore;
    async fn hour(sessions: u32) -> leasehold::store::RequestCounts {
        let clock = ManualClock::new();
        let counting = Arc::new(CountingStore::new(Arc::new(ObjectStoreBackend::memory())));
        let store: Arc<dyn Store> = counting.clone();
        for i in 0..sessions {
            apply(&store, &format!("s{i}"), &spec("sleep")).await;
        }
        let mut cfg = NodeConfig::new(Name::new("n1").unwrap(), Duration::from_secs(10));
        cfg.probe = false;
        let runner = Arc::new(RecordingRunner::new(Arc::new(clock.clone())));
        let status: Arc<leasehold::fleet::node::NodeStatus> = Default::default();
        let deps = NodeDeps {
            journal: Arc::new(Journal::new(1000, 1 << 20)),
            status: status.clone(),
            ..NodeDeps::new(store.clone(), Arc::new(clock.clone()), runner.clone())
        };
        init_marker(&store).await;
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
        // Warm up: register and place everything (virtual 30 s).
        let step = Duration::from_millis(100);
        let settle = async |n: u32| {
            for _ in 0..n {
                clock.advance(step);
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
            }
        };
        settle(300).await;
        assert_eq!(
            leasehold::fleet::runner::Runner::running(runner.as_ref()).len(),
            sessions as usize
        );
        let before = counting.counts();
        let renews_before = status.renew_histogram().count;
        settle(36_000).await; // one virtual hour
        let used = counting.counts().since(&before);
        // Every renew write was timed for the /metrics histogram.
        assert_eq!(
            status.renew_histogram().count - renews_before,
            used.put_match
        );
        assert_eq!(status.renew_histogram().failures, 0);
        assert_eq!(
            leasehold::fleet::runner::Runner::running(runner.as_ref()).len(),
            sessions as usize
        );
        shutdown.cancel();
        clock.advance(step);
        task.await.unwrap().unwrap();
        used
    }
    let idle = hour(0).await;
    let busy = hour(10).await;
    eprintln!(
        "per node-hour: idle {idle:?} total {}; with 10 sessions {busy:?} total {}",
        idle.total(),
        busy.total()
    );
    // Renewals: one every ttl/3 = 3.3 s, i.e. about 1,080 an hour.
    assert!((1000..=1100).contains(&idle.put_match), "{idle:?}");
    // Listings back off to one round (3 lists) per max_poll = ttl = 10 s when
    // idle: about 1,080 an hour; far fewer than one a second. The alarm
    // index adds one a minute (60 an hour).
    assert!(idle.list_pages <= 3 * 360 + 60 + 60, "{idle:?}");
    // The bell, read every ttl/6 by a lone node too: about 2,160 an hour.
    assert!((2000..=2300).contains(&idle.get_if_changed), "{idle:?}");
    // Sessions add nothing at steady state but their share of renew-time
    // node-record reads: no per-session writes or reads.
    assert_eq!(busy.put_match, idle.put_match, "{busy:?} vs {idle:?}");
    assert_eq!(busy.put_create, 0);
    assert!(busy.total() <= idle.total() + 20, "{busy:?} vs {idle:?}");
}

/// Advances a manual clock `steps` × 100 ms, letting every task run
/// between steps (a current-thread runtime: the nodes never lag the clock).
async fn step_virtual(clock: &leasehold::clock::ManualClock, steps: u32) {
    for _ in 0..steps {
        clock.advance(Duration::from_millis(100));
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
}

/// Issue #14's fleets: nodes on one manual clock and one in-memory bucket,
/// at ttl 10 s, each writing through a hinting store (the change feed).
struct FeedFleet {
    clock: leasehold::clock::ManualClock,
    dyn_clock: Arc<dyn Clock>,
    bucket: Arc<dyn Store>,
    shutdown: CancellationToken,
    nodes: Vec<FeedNode>,
    /// How the nodes nudge each other (none: as without `--token-file`).
    nudge: Option<Arc<dyn leasehold::fleet::nudge::Nudge>>,
    /// Runners wake their node on an exit, as the exec runner does.
    exit_wakeups: bool,
}

struct FeedNode {
    id: String,
    runner: Arc<RecordingRunner>,
    status: Arc<leasehold::fleet::node::NodeStatus>,
    task: tokio::task::JoinHandle<leasehold::Result<()>>,
}

impl FeedFleet {
    async fn new() -> Self {
        let clock = leasehold::clock::ManualClock::new();
        let bucket: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
        init_marker(&bucket).await;
        FeedFleet {
            dyn_clock: Arc::new(clock.clone()),
            clock,
            bucket,
            shutdown: CancellationToken::new(),
            nodes: Vec::new(),
            nudge: None,
            exit_wakeups: false,
        }
    }

    /// `store` (the bucket, or a wrapper of it) writing hints, a fraction
    /// `lose` of them lost.
    fn hinting_over(&self, store: Arc<dyn Store>, salt: u64, lose: f64) -> Arc<dyn Store> {
        use leasehold::fleet::feed::{HintFaults, HintingStore};
        Arc::new(
            HintingStore::new(
                store,
                self.dyn_clock.clone(),
                Arc::new(leasehold::clock::SeededEntropy::new(salt)),
            )
            .with_faults(HintFaults {
                lose,
                ..HintFaults::default()
            }),
        )
    }

    fn hinting(&self, salt: u64, lose: f64) -> Arc<dyn Store> {
        self.hinting_over(self.bucket.clone(), salt, lose)
    }

    /// Applies `s00`, `s01`, ... (`n` of them, spec `s`) as the CLI does:
    /// through a hinting store, so each is hinted and rings the bell.
    async fn apply_sessions(&self, n: usize, s: &Spec) {
        let writer = self.hinting(100, 0.0);
        for i in 0..n {
            apply(&writer, &format!("s{i:02}"), s).await;
        }
    }

    /// Starts node `id` on `store`, full listings every `full_every`.
    fn start(&mut self, id: &str, full_every: Duration, store: Arc<dyn Store>) {
        self.start_labelled(id, full_every, store, &[]);
    }

    /// As `start`, with node labels.
    fn start_labelled(
        &mut self,
        id: &str,
        full_every: Duration,
        store: Arc<dyn Store>,
        labels: &[(&str, &str)],
    ) {
        self.start_with(id, store, |cfg| {
            cfg.full_every = full_every;
            cfg.labels = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        });
    }

    /// Starts node `id` on `store` (ttl 10 s, no probe), its configuration
    /// set by `set`.
    fn start_with(&mut self, id: &str, store: Arc<dyn Store>, set: impl FnOnce(&mut NodeConfig)) {
        self.start_node(id, store, set, None);
    }

    /// As `start_with`, serving a claim channel: its handle (the wake
    /// path's claimer, as `POST /v1/sessions/{name}/wake` has one).
    fn start_claiming(
        &mut self,
        id: &str,
        store: Arc<dyn Store>,
        set: impl FnOnce(&mut NodeConfig),
    ) -> leasehold::fleet::endpoint::NodeHandle {
        let (handle, inbox) = node::claim_channel(&Name::new(id).unwrap());
        self.start_node(id, store, set, Some(inbox));
        handle
    }

    fn start_node(
        &mut self,
        id: &str,
        store: Arc<dyn Store>,
        set: impl FnOnce(&mut NodeConfig),
        claims: Option<leasehold::fleet::endpoint::ClaimInbox>,
    ) {
        let mut cfg = NodeConfig::new(Name::new(id).unwrap(), Duration::from_secs(10));
        cfg.probe = false;
        set(&mut cfg);
        let runner = RecordingRunner::new(self.dyn_clock.clone());
        let runner = Arc::new(if self.exit_wakeups {
            runner.with_exit_wakeups()
        } else {
            runner
        });
        let status: Arc<leasehold::fleet::node::NodeStatus> = Default::default();
        let deps = NodeDeps {
            journal: Arc::new(Journal::new(1000, 1 << 20)),
            status: status.clone(),
            nudge: self.nudge.clone(),
            claims,
            ..NodeDeps::new(store, self.dyn_clock.clone(), runner.clone())
        };
        self.nodes.push(FeedNode {
            id: id.to_string(),
            runner,
            status,
            task: tokio::spawn(node::run(cfg, deps, self.shutdown.clone())),
        });
    }

    async fn step(&self, steps: u32) {
        step_virtual(&self.clock, steps).await;
    }

    /// Ends every run every node's runner holds, with exit `code`.
    fn exit_running(&self, code: i32) {
        for node in &self.nodes {
            for (n, _) in leasehold::fleet::runner::Runner::running(node.runner.as_ref()) {
                node.runner.exit(&n, code);
            }
        }
    }

    /// The bucket as a node sees it through faults drawn from `seed`: a
    /// fraction `p` of requests failed, `p` landing with the reply lost,
    /// `p` held up to 20 s; writing hints, a fraction `hint_loss` lost.
    fn faulty(&self, seed: u64, p: f64, hint_loss: f64) -> Arc<dyn Store> {
        use leasehold::store::{FaultPlan, FaultStore};
        let s: Arc<dyn Store> = Arc::new(FaultStore::new(self.bucket.clone()).with_plan(
            seed,
            FaultPlan {
                fail_before: p,
                land_then_fail: p,
                delay: p,
                max_delay: Duration::from_secs(20),
            },
        ));
        self.hinting_over(s, seed, hint_loss)
    }

    /// Five sessions (`s0`..`s4`) applied, then `n1` started on `store`
    /// with the interval `growing`: a minute later it runs all five and has
    /// published the interval grown to 200 s.
    async fn grown_over_five(&mut self, store: Arc<dyn Store>) {
        for i in 0..5 {
            apply(&self.bucket, &format!("s{i}"), &spec("sleep")).await;
        }
        self.start_with("n1", store, growing);
        self.step(600).await;
        assert_eq!(self.running(0), 5, "n1 runs all five");
        assert_eq!(
            published_attrs(&self.bucket, "n1").await.max_poll_ms,
            200_000
        );
    }

    /// Steps `rounds` × 3 s, renewing `lease` (a node lease the test holds,
    /// ttl 10 s) after each: every ttl/3, as a node would.
    async fn step_beside(&self, lease: &mut leasehold::lease::Lease, rounds: u32) {
        for _ in 0..rounds {
            self.step(30).await;
            lease.renew_once().await.unwrap();
        }
    }

    /// Steps (100 ms each) until `done`, at most `max` steps; says whether
    /// it came.
    async fn step_until(&self, max: u32, done: impl Fn() -> bool) -> bool {
        for _ in 0..max {
            self.step(1).await;
            if done() {
                return true;
            }
        }
        done()
    }

    fn running(&self, i: usize) -> usize {
        leasehold::fleet::runner::Runner::running(self.nodes[i].runner.as_ref()).len()
    }

    /// Every run of every node, by start time.
    fn runs(&self) -> Vec<common::Run<leasehold::clock::MonoTime>> {
        let mut runs = Vec::new();
        for n in &self.nodes {
            for (s, e, a, b) in n.runner.history() {
                runs.push((s, e, n.id.clone(), a, b));
            }
        }
        runs.sort_by_key(|r| r.3);
        runs
    }

    /// Shuts every node down; each ends cleanly (or was aborted by the test).
    async fn finish(self) {
        self.shutdown.cancel();
        self.step(2).await;
        for n in self.nodes {
            match n.task.await {
                Ok(r) => r.unwrap(),
                Err(e) => assert!(e.is_cancelled(), "{e}"),
            }
        }
    }
}

/// Issue #14, the change feed: a node whose full listings are an hour apart
/// starts a manifest applied after its first pass within one idle pause,
/// because `apply`'s hint names it (a light pass reads only that). With
/// every hint lost the same manifest waits for the next full listing (so
/// it is the feed that placed it, not a listing), and is placed then.
#[tokio::test(flavor = "current_thread")]
async fn the_change_feed_places_a_new_manifest_without_a_full_listing() {
    async fn placed_after(lose: f64) -> Option<Duration> {
        let mut f = FeedFleet::new().await;
        f.start("n1", Duration::from_secs(3600), f.hinting(1, lose));
        // Registered, first (full) pass done, backed off to idle.
        f.step(600).await;
        apply(&f.hinting(2, lose), "late", &spec("sleep")).await;
        let t0 = f.clock.now();
        let mut placed = None;
        // Up to just past the next full listing (an hour after the first).
        for _ in 0..36_200 {
            f.step(1).await;
            if f.running(0) > 0 {
                placed = Some(f.clock.now().saturating_since(t0));
                break;
            }
        }
        f.finish().await;
        placed
    }
    let hinted = placed_after(0.0).await.expect("placed with hints");
    // One idle pause (max_poll = ttl = 10 s) and the pass: far from an hour.
    assert!(hinted <= Duration::from_secs(12), "{hinted:?}");
    let lost = placed_after(1.0).await.expect("placed by the full listing");
    eprintln!("placed {hinted:?} after apply with hints, {lost:?} without");
    assert!(
        lost >= Duration::from_secs(3000),
        "without hints it waited for the full listing, not {lost:?}"
    );
}

/// Issue #14: an idle pass skips the scan of its owned sessions when
/// nothing it reads changed since the last scan found nothing to do
/// (`owned_due`). A crash-loop back-off ending changes no map, only the
/// time: with the change feed on (full listings an hour apart, so no full
/// listing touches the sessions meanwhile) every restart must still come
/// when its back-off ends, not at the next full listing.
#[tokio::test(flavor = "current_thread")]
async fn a_back_off_ending_restarts_the_session_between_full_listings() {
    let mut f = FeedFleet::new().await;
    f.start("n1", Duration::from_secs(3600), f.hinting(1, 0.0));
    f.step(600).await;
    let mut svc = spec("crasher");
    svc.restart = RestartPolicy::Always.into();
    apply(&f.hinting(2, 0.0), "svc", &svc).await;
    assert!(f.step_until(200, || f.running(0) == 1).await, "placed");
    let runner = f.nodes[0].runner.clone();
    let mut took = Vec::new();
    // Back-offs of 0, 250 ms, 500 ms, 1 s, 2 s.
    for i in 2..=6 {
        // The exit is seen at the node's next check of its sessions.
        runner.exit("svc", 7);
        let t0 = f.clock.now();
        let restarted = f.step_until(600, || runner.history().len() == i).await;
        took.push(f.clock.now().saturating_since(t0));
        assert!(restarted, "not restarted within 60 s: {took:?}");
    }
    eprintln!("restarts after each exit: {took:?}");
    // The back-off and one idle pause (max_poll = ttl = 10 s) at most.
    assert!(
        took.iter().all(|t| *t <= Duration::from_secs(13)),
        "{took:?}"
    );
    f.finish().await;
}

/// A crash-loop restart comes when its back-off ends, as the journal says
/// ("restarting in 500ms"): the wait between passes ends with it. It came
/// at the next pass instead, seconds later on an idle node (issue #38:
/// "restarting in 250ms", then the start 3.36 s later). On the manual
/// clock, in steps of 100 ms.
#[tokio::test(flavor = "current_thread")]
async fn a_back_off_restarts_the_session_when_it_ends() {
    let mut f = FeedFleet::new().await;
    f.start("n1", Duration::from_secs(3600), f.hinting(1, 0.0));
    f.step(600).await;
    let mut svc = spec("crasher");
    svc.restart = RestartPolicy::Always.into();
    apply(&f.hinting(2, 0.0), "svc", &svc).await;
    assert!(f.step_until(200, || f.running(0) == 1).await, "placed");
    let runner = f.nodes[0].runner.clone();
    // The first quick exit restarts at once.
    runner.exit("svc", 7);
    assert!(
        f.step_until(600, || runner.history().len() == 2).await,
        "restarted"
    );
    let mut gaps = Vec::new();
    for (i, want_ms) in [250u64, 500, 1000, 2000].into_iter().enumerate() {
        runner.exit("svc", 7);
        // The node takes the exit at its next pass (the recording runner
        // does not wake it); the back-off runs from then.
        assert!(f.step_until(600, || f.running(0) == 0).await, "exit taken");
        let t0 = f.clock.now();
        assert!(
            f.step_until(600, || runner.history().len() == i + 3).await,
            "restart {i} within 60 s"
        );
        let gap = f.clock.now().saturating_since(t0);
        gaps.push(gap);
        let want = Duration::from_millis(want_ms);
        assert!(
            gap + Duration::from_millis(100) >= want && gap <= want + Duration::from_millis(300),
            "restart {i}: after {gap:?}, its back-off {want:?} (all: {gaps:?})"
        );
    }
    f.finish().await;
}

async fn claim_of(store: &Arc<dyn Store>, name: &str) -> ClaimRecord {
    let o = store
        .get(&format!("sessions/{name}"))
        .await
        .unwrap()
        .unwrap();
    ClaimRecord::decode(name, &o.bytes).unwrap()
}

/// As the exec runner does, an exit wakes the node, which records it at
/// once and schedules the back-off between passes: the restart must still
/// come when the back-off ends. (The wait between passes armed its back-off
/// timer only before it began; a reviewer found, 2026-12-06, that a
/// back-off scheduled by an exit recorded there was not re-armed. This
/// fleet's short pauses bring the next pass within ~150 ms either way, so
/// this test holds with or without that re-arm: it guards the exit-wakeup
/// path's timing, not that line.)
#[tokio::test(flavor = "current_thread")]
async fn a_back_off_scheduled_between_passes_restarts_on_time() {
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    // Writes without hints: nothing the node writes rings the bell, so
    // nothing but its own timers ends its wait between passes.
    f.start("n1", Duration::from_secs(3600), f.bucket.clone());
    f.step(600).await;
    let mut svc = spec("crasher");
    svc.restart = RestartPolicy::Always.into();
    apply(&f.hinting(2, 0.0), "svc", &svc).await;
    assert!(f.step_until(200, || f.running(0) == 1).await, "placed");
    let runner = f.nodes[0].runner.clone();
    runner.exit("svc", 7);
    assert!(f.step_until(600, || runner.history().len() == 2).await);
    // Let the node settle into its idle pause (up to ttl = 10 s).
    f.step(30).await;
    let mut gaps = Vec::new();
    for (i, want_ms) in [250u64, 500, 1000, 2000].into_iter().enumerate() {
        runner.exit("svc", 7);
        let t0 = f.clock.now();
        assert!(
            f.step_until(600, || runner.history().len() == i + 3).await,
            "restart {i} within 60 s"
        );
        let gap = f.clock.now().saturating_since(t0);
        gaps.push(gap);
        let want = Duration::from_millis(want_ms);
        assert!(
            gap + Duration::from_millis(100) >= want && gap <= want + Duration::from_millis(300),
            "restart {i}: after {gap:?}, its back-off {want:?} (all: {gaps:?})"
        );
        f.step(30).await;
    }
    f.finish().await;
}

/// A restart rule's attempts: an `on-failure` session whose restarts are
/// spent is failed with the reason "gave up after N restarts", and its
/// claim keeps it (no further run); a window forgives restarts older than
/// it. Before, `on-failure` restarted forever (issue #38: 13 restarts and
/// counting). On the manual clock.
#[tokio::test(flavor = "current_thread")]
async fn a_restart_rule_gives_up_after_its_attempts() {
    use leasehold::fleet::manifest::Restart;
    let mut f = FeedFleet::new().await;
    f.start("n1", Duration::from_secs(3600), f.hinting(1, 0.0));
    f.step(600).await;
    let mut job = spec("crasher");
    job.restart = Restart {
        policy: RestartPolicy::OnFailure,
        attempts: Some(2),
        window: None,
        delay: Some(Duration::from_millis(100)),
        max_delay: Some(Duration::from_millis(200)),
    };
    apply(&f.hinting(2, 0.0), "job", &job).await;
    let mut svc = spec("crasher");
    svc.restart = Restart {
        policy: RestartPolicy::Always,
        attempts: Some(1),
        window: Some(Duration::from_secs(5)),
        delay: None,
        max_delay: None,
    };
    apply(&f.hinting(2, 0.0), "svc", &svc).await;
    assert!(f.step_until(200, || f.running(0) == 2).await, "placed");
    let runner = f.nodes[0].runner.clone();
    let runs = |name: &str| runner.history().iter().filter(|(n, ..)| n == name).count();
    // job: the first run and two restarts, then it gives up.
    runner.exit("job", 7);
    assert!(f.step_until(100, || runs("job") == 2).await, "restart 1");
    runner.exit("job", 7);
    assert!(f.step_until(100, || runs("job") == 3).await, "restart 2");
    runner.exit("job", 7);
    f.step(50).await;
    let c = claim_of(&f.bucket, "job").await;
    assert_eq!(c.state, ClaimState::Failed, "{c:?}");
    assert_eq!(
        c.reason.as_deref(),
        Some("gave up after 2 restarts (last exit 7)")
    );
    assert_eq!((c.restarts, c.exit_code), (2, Some(7)));
    assert_eq!(runs("job"), 3, "no run after it gave up");
    // svc: one restart allowed in any 5 s. Exits 10 s apart are forgiven.
    for i in 0..3 {
        runner.exit("svc", 1);
        assert!(
            f.step_until(100, || runs("svc") == i + 2).await,
            "svc restart {i}: {:?}",
            claim_of(&f.bucket, "svc").await
        );
        f.step(100).await; // 10 s
    }
    // Two quick exits within 5 s: the second gives up.
    runner.exit("svc", 1);
    assert!(f.step_until(100, || runs("svc") == 5).await);
    runner.exit("svc", 1);
    f.step(50).await;
    let c = claim_of(&f.bucket, "svc").await;
    assert_eq!(c.state, ClaimState::Failed, "{c:?}");
    assert_eq!(
        c.reason.as_deref(),
        Some("gave up after 1 restart in 5s (last exit 1)")
    );
    assert_eq!(runs("svc"), 5);
    f.finish().await;
}

/// A store that refuses every write of one key while `deny` is set, and
/// the next `deny_next` writes of it (unavailable before anything lands),
/// passing everything else through.
#[derive(Debug)]
struct DenyWrites {
    inner: Arc<dyn Store>,
    key: &'static str,
    deny: std::sync::atomic::AtomicBool,
    deny_next: std::sync::atomic::AtomicU32,
}

impl std::fmt::Display for DenyWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "deny-writes({})", self.inner)
    }
}

#[async_trait::async_trait]
impl leasehold::store::Forward for DenyWrites {
    fn inner(&self) -> &dyn Store {
        self.inner.as_ref()
    }
    async fn put(
        &self,
        key: &str,
        bytes: bytes::Bytes,
        cond: leasehold::store::Cond,
    ) -> Result<leasehold::store::Version, leasehold::store::StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let counted = key == self.key
            && self
                .deny_next
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if key == self.key && (counted || self.deny.load(SeqCst)) {
            return Err(leasehold::store::StoreError::Unavailable {
                message: "denied by the test".into(),
            });
        }
        self.inner.put(key, bytes, cond).await
    }
}

/// A new spec runs under epoch + 1, which the owner writes to its claim
/// before the run starts. While that write fails (the store is down for
/// the claim), no run may start under the new epoch: the bucket still
/// holds the old one, and a peer taking over would hand the new token out
/// again. (The owner adopted the new epoch in memory before the write and
/// kept it when the write failed: the next pass started the run under it.)
#[tokio::test(flavor = "current_thread")]
async fn no_run_starts_under_an_epoch_the_bucket_does_not_hold() {
    let mut f = FeedFleet::new().await;
    let store = Arc::new(DenyWrites {
        inner: f.hinting(1, 0.0),
        key: "sessions/svc",
        deny: std::sync::atomic::AtomicBool::new(false),
        deny_next: Default::default(),
    });
    f.start("n1", Duration::from_secs(3600), store.clone());
    f.step(600).await;
    let mut svc = spec("sleep");
    svc.restart = RestartPolicy::Always.into();
    let writer = f.hinting(2, 0.0);
    apply(&writer, "svc", &svc).await;
    assert!(f.step_until(200, || f.running(0) == 1).await, "placed");
    assert_eq!(claim_of(&f.bucket, "svc").await.epoch, 1);
    let runner = f.nodes[0].runner.clone();
    store.deny.store(true, std::sync::atomic::Ordering::SeqCst);
    let (_, version) = manifest::get(&writer, &Name::new("svc").unwrap())
        .await
        .unwrap()
        .unwrap();
    svc.args = vec!["2".into()];
    manifest::apply(
        &writer,
        &OsEntropy::new(),
        &Name::new("svc").unwrap(),
        &svc,
        Some(&version),
    )
    .await
    .unwrap();
    // Many passes with the claim unwritable: the old run is stopped, and
    // nothing runs above the bucket's epoch.
    for _ in 0..300 {
        f.step(1).await;
        let held = claim_of(&f.bucket, "svc").await.epoch;
        for (name, epoch, ..) in runner.history() {
            assert!(
                name != "svc" || epoch <= held,
                "svc ran at epoch {epoch} while the bucket holds {held}"
            );
        }
    }
    // Writable again: the new run, at epoch 2, written first.
    store.deny.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(
        f.step_until(300, || runner
            .history()
            .iter()
            .any(|(n, e, ..)| n == "svc" && *e == 2))
            .await,
        "the new run"
    );
    assert_eq!(claim_of(&f.bucket, "svc").await.epoch, 2);
    f.finish().await;
}

/// A finished run whose end cannot be written (the store refuses the
/// claim's write) is never run again: not restarted by the next passes,
/// which retry the write until it lands, and not released when its node
/// stops meanwhile (a released claim would run the job on the next node).
/// (Before: the claim kept saying running, and the next pass started the
/// finished job again.)
#[tokio::test(flavor = "current_thread")]
async fn a_finish_that_cannot_be_written_is_retried_never_rerun() {
    let mut f = FeedFleet::new().await;
    let job_store = Arc::new(DenyWrites {
        inner: f.hinting(1, 0.0),
        key: "sessions/job",
        deny: std::sync::atomic::AtomicBool::new(false),
        deny_next: Default::default(),
    });
    f.start("n1", Duration::from_secs(3600), job_store.clone());
    f.step(600).await;
    let mut job = spec("once");
    job.restart = RestartPolicy::Never.into();
    let writer = f.hinting(2, 0.0);
    apply(&writer, "job", &job).await;
    assert!(f.step_until(200, || f.running(0) == 1).await, "placed");
    let runner = f.nodes[0].runner.clone();
    let runs = || runner.history().iter().filter(|(n, ..)| n == "job").count();
    assert_eq!(runs(), 1);
    job_store
        .deny
        .store(true, std::sync::atomic::Ordering::SeqCst);
    runner.exit("job", 0);
    for _ in 0..300 {
        f.step(1).await;
        assert_eq!(runs(), 1, "the finished job ran again");
    }
    assert_eq!(claim_of(&f.bucket, "job").await.state, ClaimState::Running);
    job_store
        .deny
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let mut c = claim_of(&f.bucket, "job").await;
    for _ in 0..300 {
        if c.state != ClaimState::Running {
            break;
        }
        f.step(1).await;
        c = claim_of(&f.bucket, "job").await;
    }
    assert_eq!(c.state, ClaimState::Succeeded, "{c:?}");
    assert_eq!((c.exit_code, c.epoch), (Some(0), 1));
    assert_eq!(runs(), 1);

    // Again (a new spec is a new run), and the node stops while that run's
    // end is unwritten: the claim is left running at its epoch, not
    // released, and the job does not run again.
    let (_, v) = manifest::get(&writer, &Name::new("job").unwrap())
        .await
        .unwrap()
        .unwrap();
    job.args = vec!["2".into()];
    manifest::apply(
        &writer,
        &OsEntropy::new(),
        &Name::new("job").unwrap(),
        &job,
        Some(&v),
    )
    .await
    .unwrap();
    assert!(f.step_until(300, || runs() == 2).await, "the new run");
    job_store
        .deny
        .store(true, std::sync::atomic::Ordering::SeqCst);
    runner.exit("job", 0);
    f.step(50).await;
    assert_eq!(runs(), 2);
    // The outage lasts through the stop's three tries, then ends: the
    // release that would come next must not be written.
    job_store
        .deny
        .store(false, std::sync::atomic::Ordering::SeqCst);
    job_store
        .deny_next
        .store(3, std::sync::atomic::Ordering::SeqCst);
    let bucket = f.bucket.clone();
    f.finish().await;
    let c = claim_of(&bucket, "job").await;
    assert_eq!(
        (c.state, c.epoch),
        (ClaimState::Running, 2),
        "left as it was, not released: {c:?}"
    );
}

/// A run whose health check fails just as it ends by itself: the end the
/// runner already took is applied once, to that run, never to the run the
/// check's restart starts. (Before: the check's stop found nothing, the
/// node restarted it, and the next pass applied the old end to the new run:
/// started again while it ran, or failed with the new run going on.)
#[tokio::test(flavor = "current_thread")]
async fn an_unhealthy_run_that_just_ended_is_ended_once() {
    let mut f = FeedFleet::new().await;
    f.start("n1", Duration::from_secs(3600), f.hinting(1, 0.0));
    f.step(600).await;
    // A TCP check against a port the test holds open, then closes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut svc = spec("sleep");
    svc.restart = RestartPolicy::Always.into();
    svc.check = Some(
        serde_json::from_value(serde_json::json!({
            "tcp": port, "interval": "100ms", "threshold": 1
        }))
        .unwrap(),
    );
    let writer = f.hinting(2, 0.0);
    apply(&writer, "svc", &svc).await;
    assert!(f.step_until(200, || f.running(0) == 1).await, "placed");
    let mut passed = false;
    for _ in 0..50 {
        f.step(1).await;
        if claim_of(&f.bucket, "svc").await.health.is_none() {
            passed = true;
            break;
        }
    }
    assert!(passed, "the check passed while the port was open");
    let runner = f.nodes[0].runner.clone();
    // It ends by itself, its exit taken by the runner, and its port closes,
    // all before the next probe (100 ms) and far from the next pass; the
    // port opens again for the run the check's restart starts.
    runner.exit_taken("svc", 3);
    drop(listener);
    assert!(
        f.step_until(50, || runner
            .history()
            .iter()
            .filter(|(n, ..)| n == "svc")
            .count()
            == 2)
            .await,
        "restarted after the unhealthy run"
    );
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    for _ in 0..400 {
        f.step(1).await;
    }
    let runs: Vec<_> = runner
        .history()
        .into_iter()
        .filter(|(n, ..)| n == "svc")
        .collect();
    assert_eq!(runs.len(), 2, "the second run goes on: {runs:?}");
    let c = claim_of(&f.bucket, "svc").await;
    assert_eq!((c.state, c.health), (ClaimState::Running, None), "{c:?}");
    drop(listener);
    f.finish().await;
}

/// Issue #14: an idle pass skips the scan of its owned sessions while none
/// of the maps that scan reads has changed (`owned_due`: the owned
/// sessions, the claim and manifest caches, the corrupt keys). Between full
/// listings (an hour apart here), a hinted change to each must still reach
/// the session it concerns within one idle pause: a claim another writer
/// took (the claim cache), a deleted manifest (the manifest cache), a
/// claim overwritten with foreign bytes (only the corrupt keys change: the
/// last good view of it stays cached), a changed spec.
#[tokio::test(flavor = "current_thread")]
async fn an_idle_node_acts_on_each_hinted_change_to_its_sessions() {
    use leasehold::fleet::runner::Runner;
    use leasehold::store::Cond;
    let mut f = FeedFleet::new().await;
    f.start("n1", Duration::from_secs(3600), f.hinting(1, 0.0));
    f.step(600).await;
    let writer = f.hinting(2, 0.0);
    for name in ["taken", "deleted", "garbled", "changed"] {
        apply(&writer, name, &spec("sleep")).await;
    }
    assert!(f.step_until(200, || f.running(0) == 4).await, "placed");
    let runner = f.nodes[0].runner.clone();
    let runs = |name: &str| runner.history().iter().filter(|(n, ..)| n == name).count();
    let running = |name: &str| runner.running().iter().any(|(n, _)| n == name);
    let claim = |name: &str| {
        let bucket = f.bucket.clone();
        let key = leasehold::keys::session(name);
        async move {
            let o = bucket.get(&key).await.unwrap().unwrap();
            (ClaimRecord::decode(&key, &o.bytes).unwrap(), o.version)
        }
    };
    // One change at a time, each after a minute idle (every pass since
    // found nothing to do), so that no other change brings the scan.
    let mut took = Vec::new();
    for change in ["taken", "deleted", "garbled", "changed"] {
        f.step(600).await;
        match change {
            "taken" => {
                let (mut other, v) = claim("taken").await;
                other.owner.node = "elsewhere".into();
                other.owner.instance = "i-elsewhere".into();
                other.epoch += 1;
                other.nonce = "another-writer".into();
                let key = leasehold::keys::session("taken");
                let bytes = bytes::Bytes::from(other.encode());
                writer.put(&key, bytes, Cond::Match(v)).await.unwrap();
            }
            "deleted" => {
                let key = leasehold::keys::manifest("deleted");
                writer.delete(&key).await.unwrap();
            }
            "garbled" => {
                let (_, v) = claim("garbled").await;
                let key = leasehold::keys::session("garbled");
                let bytes = bytes::Bytes::from_static(b"not a claim");
                writer.put(&key, bytes, Cond::Match(v)).await.unwrap();
            }
            _ => {
                let mut changed = spec("sleep");
                changed.args = vec!["2".into()];
                let key = leasehold::keys::manifest("changed");
                let current = writer.get(&key).await.unwrap().unwrap().version;
                let name = Name::new("changed").unwrap();
                manifest::apply(&writer, &OsEntropy::new(), &name, &changed, Some(&current))
                    .await
                    .unwrap();
            }
        }
        let done = || match change {
            "changed" => runs("changed") == 2,
            name => !running(name),
        };
        let t0 = f.clock.now();
        let acted = f.step_until(600, done).await;
        took.push(f.clock.now().saturating_since(t0));
        assert!(acted, "{change}: not acted on within 60 s");
    }
    eprintln!("acted on each change after {took:?}");
    // One idle pause (max_poll = ttl = 10 s) and the pass, not an hour.
    assert!(
        took.iter().all(|t| *t <= Duration::from_secs(13)),
        "{took:?}"
    );
    // The status (rebuilt only when the owned sessions changed) follows
    // what runs: the deleted and garbled ones gone, the new spec running,
    // and the taken one taken back (its taker is no live node).
    f.step(150).await;
    let shown: Vec<_> = f.nodes[0]
        .status
        .snapshot()
        .sessions
        .iter()
        .map(|s| (s.name.clone(), s.running))
        .collect();
    let mut runs_now: Vec<_> = runner
        .running()
        .into_iter()
        .map(|(n, _)| (n, true))
        .collect();
    runs_now.sort();
    assert_eq!(shown, runs_now);
    assert!(shown.contains(&("changed".to_string(), true)), "{shown:?}");
    assert!(
        !shown.iter().any(|(n, _)| n == "deleted" || n == "garbled"),
        "{shown:?}"
    );
    f.finish().await;
}

/// Issue #14, failover at the defaults (ttl 10 s, full listings every 10
/// min, no HTTP): four nodes, twelve sessions; the busiest is aborted (as
/// kill -9) at five phases of its renewals, and every one of its sessions
/// runs on a survivor within ttl + margin + 2 s = 13 s each time. What it
/// takes: the first ring watcher reads the peer's record as each renewal
/// lands and once more at its deadline (`core::watch_wait`); the first
/// node to judge it dead fences it at once even within its grace, hints
/// the tombstone and rings the bell (`feed::ring_bell`), and every node
/// reads the bell twice per renewal period, so the nodes ranked for its
/// sessions (most not watching it) look at once instead of at their next
/// idle pass (before: 17 s in the spike). With the bell or the early fence
/// reverted, a taker that is not a watcher waits for its own judgement,
/// up to an idle pause later.
#[tokio::test(flavor = "current_thread")]
async fn a_dead_node_is_replaced_within_ttl_margin_and_2s_at_the_defaults() {
    let mut took = Vec::new();
    for phase in [0, 700, 1400, 2100, 2800] {
        took.push(failover_at_the_defaults(phase, &[], true).await);
    }
    eprintln!("failover at five phases: {took:?}");
    assert!(took.iter().all(|t| *t <= FAILOVER_GOAL), "{took:?}");
}

/// Issue #14: with the feed on, a light pass lists `nodes/` only every
/// `NodeConfig::nodes_every` (a minute at ttl 10 s) unless something asks
/// for it, since the ring watch, the fence's hinted tombstone and the bell
/// carry a death, and peers hint their own news. An idle fleet of three
/// at the daemon's settings, counted for a virtual hour: about 60 listings
/// of `nodes/` per node, not one per pass (360 when it listed every pass;
/// reverted, this test counts about 360). And it still sees a death: one
/// node killed, every session runs on a survivor within the goal.
#[tokio::test(flavor = "current_thread")]
async fn an_idle_node_lists_nodes_only_at_the_slow_pace_and_still_sees_a_death() {
    use leasehold::store::BySegment;
    let mut f = FeedFleet::new().await;
    let counted = Arc::new(BySegment::new(f.bucket.clone()));
    let node_lists = || counted.counts()[leasehold::keys::NODES].list_pages;
    for (i, id) in ["n1", "n2", "n3"].iter().enumerate() {
        let store = f.hinting_over(counted.clone(), i as u64 + 1, 0.0);
        f.start(id, Duration::from_secs(600), store);
    }
    f.step(300).await;
    f.apply_sessions(9, &spec("sleep")).await;
    f.step(1200).await;
    assert_eq!((0..3).map(|i| f.running(i)).sum::<usize>(), 9);
    let before = node_lists();
    f.step(36_000).await; // a virtual hour
    let per_node_hour = (node_lists() - before) / 3;
    eprintln!("nodes/ listings per node-hour: {per_node_hour}");
    // One a minute (60), and those the full listings (6) and bell rings
    // ask for; far below one per pass (360).
    assert!((50..=100).contains(&per_node_hour), "{per_node_hour}");
    let held: Vec<usize> = (0..3).map(|i| f.running(i)).collect();
    let victim = (0..3).max_by_key(|i| held[*i]).unwrap();
    f.nodes[victim].task.abort();
    let t0 = f.clock.now();
    let moved = f
        .step_until(400, || {
            (0..3)
                .filter(|i| *i != victim)
                .map(|i| f.running(i))
                .sum::<usize>()
                == 9
        })
        .await;
    let took = f.clock.now().saturating_since(t0);
    eprintln!("failover: {took:?}");
    assert!(moved && took <= FAILOVER_GOAL, "{took:?}");
    f.finish().await;
}

/// Issue #44: a lone node, which watches no peer, reads the bell too, so a
/// session applied without a token (the CLI's write rings the bell) runs
/// within about a bell period (ttl/6, 1.7 s at ttl 10 s), not at the end
/// of an idle pause (the ttl): 1.2-3.9 s on a real lone node before. Five
/// applies at five phases of the node's pauses, in virtual time. Reverted
/// (no bell without a watched peer), a sample waits up to the ttl.
#[tokio::test(flavor = "current_thread")]
async fn a_lone_node_hears_the_bell() {
    let mut f = FeedFleet::new().await;
    let store = f.hinting(1, 0.0);
    f.start("n1", Duration::from_secs(600), store);
    let writer = f.hinting(100, 0.0);
    let mut took = Vec::new();
    for (i, phase) in [0u32, 7, 23, 41, 66].into_iter().enumerate() {
        // A minute idle: the node's pauses have backed off to the ttl.
        f.step(600 + phase).await;
        let t0 = f.clock.now();
        apply(&writer, &format!("s{i}"), &spec("sleep")).await;
        let came = f.step_until(200, || f.running(0) == i + 1).await;
        assert!(came, "s{i} never ran");
        took.push(f.clock.now().saturating_since(t0));
    }
    eprintln!("apply -> running on a lone node: {took:?}");
    let bell = leasehold::fleet::core::bell_period(Duration::from_secs(10));
    assert!(
        took.iter().all(|t| *t <= bell + Duration::from_millis(500)),
        "{took:?} (bell period {bell:?})"
    );
    f.finish().await;
}

/// As above, where only a node that does not watch the dead one may take
/// its sessions: they select `zone=b` (n3 and n4) and prefer n3, so all
/// run there; n2 and n1 watch n3, n4 does not. The first watcher, n2, is
/// ranked nowhere for them and cordoned besides, so it used to leave the
/// fencing to the taker; it fences at once instead
/// (`fence_dead_peers`, before the claims), and the bell sends n4 (before:
/// n4 took them when its own judgement came, up to an idle pause later).
#[tokio::test(flavor = "current_thread")]
async fn a_watcher_ranked_after_others_fences_a_dead_peer_at_once() {
    let mut took = Vec::new();
    for phase in [0, 1400, 2800] {
        took.push(failover_at_the_defaults(phase, &["n3"], true).await);
    }
    eprintln!("failover at three phases: {took:?}");
    assert!(took.iter().all(|t| *t <= FAILOVER_GOAL), "{took:?}");
}

/// Issue #14: a node that fences a dead peer nudges the nodes placement
/// ranks for its sessions (`fleet::nudge`; over HTTP with `--token-file`,
/// here in-process), so they look at once rather than at their next pass
/// or ring of the bell. Every nudge goes to a survivor other than the
/// fencer, and they still take every session by the usual rules.
#[tokio::test(flavor = "current_thread")]
async fn a_node_that_fences_a_peer_nudges_its_ranked_takers() {
    use async_trait::async_trait;
    use leasehold::fleet::nudge::{LocalNudge, Nudge};
    #[derive(Debug, Default)]
    struct Recorded {
        local: LocalNudge,
        sent: std::sync::Mutex<Vec<String>>,
    }
    #[async_trait]
    impl Nudge for Recorded {
        async fn nudge(&self, node: &str, address: Option<&str>) -> bool {
            self.sent.lock().unwrap().push(node.to_string());
            self.local.nudge(node, address).await
        }
    }
    let rec = Arc::new(Recorded::default());
    let mut f = FeedFleet::new().await;
    f.nudge = Some(rec.clone());
    for (i, id) in ["n1", "n2", "n3", "n4"].iter().enumerate() {
        f.start(id, Duration::from_secs(600), f.hinting(i as u64 + 1, 0.0));
        rec.local.register(id, f.nodes[i].status.clone());
    }
    f.step(300).await;
    f.apply_sessions(12, &spec("sleep")).await;
    f.step(900).await;
    let held: Vec<usize> = (0..4).map(|i| f.running(i)).collect();
    let victim = (0..4).max_by_key(|i| held[*i]).unwrap();
    f.nodes[victim].task.abort();
    assert!(
        rec.sent.lock().unwrap().is_empty(),
        "no nudge before a death"
    );
    f.step(150).await;
    let running: usize = (0..4).filter(|i| *i != victim).map(|i| f.running(i)).sum();
    assert_eq!(running, 12, "every session taken over");
    let sent = rec.sent.lock().unwrap().clone();
    let dead = f.nodes[victim].id.clone();
    // Who fenced it: its tombstone says.
    let key = leasehold::keys::node(&dead);
    let o = f.bucket.get(&key).await.unwrap().expect("the tombstone");
    let tomb =
        leasehold::record::LeaseRecord::decode(&key, &o.bytes, leasehold::record::Kind::Node)
            .unwrap();
    assert!(tomb.released);
    let fencer = leasehold::fleet::attrs::NodeAttrs::of(&tomb)
        .released_by
        .expect("fenced by a peer");
    eprintln!("{dead} died, {fencer} fenced it and nudged {sent:?}");
    assert!(!sent.is_empty(), "the fencer nudged the ranked takers");
    assert!(
        sent.iter()
            .all(|n| *n != dead && *n != fencer && f.nodes.iter().any(|x| x.id == *n)),
        "{sent:?}"
    );
    f.finish().await;
}

/// Issue #14 (found in review): a node record copied under another key (an
/// operator's copy, a partial restore: `nodes/n9` holding n2's bytes)
/// stands still, so the copy reads as a dead n2. Fencing dead peers early
/// must not fence the real, live n2 over it: only a record under its own
/// key, with no live view of its id, is fenced. n2 keeps its lease and
/// its sessions, and nothing runs twice. (With those two checks removed
/// this still passes here: the tombstone's If-Match on n2's listed
/// version, and the fresh read's stillness check, refuse it as n2 renews.
/// It guards the whole chain, not the key check alone.)
#[tokio::test(flavor = "current_thread")]
async fn a_node_record_copied_under_another_key_gets_nobody_fenced() {
    use leasehold::record::{Kind, LeaseRecord};
    let mut f = FeedFleet::new().await;
    for (i, id) in ["n1", "n2", "n3"].iter().enumerate() {
        f.start(id, Duration::from_secs(600), f.hinting(i as u64 + 1, 0.0));
    }
    f.step(300).await;
    f.apply_sessions(9, &spec("sleep")).await;
    f.step(900).await;
    let before: Vec<usize> = (0..3).map(|i| f.running(i)).collect();
    assert_eq!(before.iter().sum::<usize>(), 9, "{before:?}");
    assert!(before[1] > 0, "n2 holds sessions: {before:?}");
    let real = f.bucket.get("nodes/n2").await.unwrap().unwrap();
    f.bucket
        .put(
            "nodes/n9",
            real.bytes.clone(),
            leasehold::store::Cond::Create,
        )
        .await
        .unwrap();
    // Long past the copy's ttl + margin, by every node's observation.
    f.step(600).await;
    let now = f.bucket.get("nodes/n2").await.unwrap().unwrap();
    let rec = LeaseRecord::decode("nodes/n2", &now.bytes, Kind::Node).unwrap();
    assert!(!rec.released, "the live n2 was fenced over its copy");
    let after: Vec<usize> = (0..3).map(|i| f.running(i)).collect();
    assert_eq!(after, before, "n2 kept its sessions; none moved");
    f.finish().await;
}

/// Issue #14: the fence's hinted tombstone acts without the bell. A ring
/// is a hint and may be lost (here the nodes' rings are refused: a bucket
/// policy on one key, a flaky request); the taker that does not watch the
/// dead node then learns of it from the feed at its next idle pass. That
/// pass reads the hinted record, which counts as the peer's end only at the
/// version a listing of `nodes/` showed (a release read at any other version
/// may be a new instance's), so the hint makes that pass list `nodes/` too.
/// Before: the tombstone read in the pass was ignored and n4 took the
/// sessions at its slow `nodes/` listing, up to `nodes_every` (a minute)
/// later. Bound: ttl + margin, one idle pause (`--max-poll`, 10 s), 2 s.
#[tokio::test(flavor = "current_thread")]
async fn a_hinted_tombstone_acts_at_the_next_pass_without_the_bell() {
    let mut took = Vec::new();
    for phase in [0, 1400, 2800] {
        took.push(failover_at_the_defaults(phase, &["n3"], false).await);
    }
    eprintln!("failover without the bell, at three phases: {took:?}");
    let goal = Duration::from_secs(10 + 1 + 10 + 2);
    assert!(took.iter().all(|t| *t <= goal), "{took:?}");
}

/// ttl + margin + 2 s at ttl 10 s (issue #14's target).
const FAILOVER_GOAL: Duration = Duration::from_secs(13);

/// Refuses every write of the fleet's bell (`keys::BELL`): a node on it
/// never rings.
#[derive(Debug)]
struct NoRing(Arc<dyn Store>);

impl std::fmt::Display for NoRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[async_trait::async_trait]
impl leasehold::store::Forward for NoRing {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }

    async fn put(
        &self,
        key: &str,
        bytes: bytes::Bytes,
        cond: leasehold::store::Cond,
    ) -> Result<leasehold::store::Version, leasehold::store::StoreError> {
        if key == leasehold::keys::BELL {
            return Err(leasehold::store::StoreError::Denied {
                message: "the bell is not ours to ring".into(),
            });
        }
        self.0.put(key, bytes, cond).await
    }
}

/// Four nodes at the defaults on a manual clock, twelve sessions (each
/// preferring `preferred`); the busiest node aborted `phase_ms` into its
/// idle; how long until every one of its sessions runs on a survivor.
/// Without `ring`, no node can ring the bell (`NoRing`).
async fn failover_at_the_defaults(phase_ms: u32, preferred: &[&str], ring: bool) -> Duration {
    let mut f = FeedFleet::new().await;
    if !preferred.is_empty() {
        // n3's first watcher is cordoned: it takes nothing new at all.
        leasehold::fleet::control::set(
            &f.bucket,
            &leasehold::clock::SeededEntropy::new(9),
            "n2",
            false,
            0,
        )
        .await
        .unwrap();
    }
    for (i, id) in ["n1", "n2", "n3", "n4"].iter().enumerate() {
        let store = if ring {
            f.hinting(i as u64 + 1, 0.0)
        } else {
            f.hinting_over(Arc::new(NoRing(f.bucket.clone())), i as u64 + 1, 0.0)
        };
        let zone = if i < 2 { "a" } else { "b" };
        f.start_labelled(id, Duration::from_secs(600), store, &[("zone", zone)]);
    }
    // Every node registered and listed by every other, then the sessions.
    f.step(300).await;
    let mut s = spec("sleep");
    s.preferred_nodes = preferred.iter().map(|p| p.to_string()).collect();
    if !preferred.is_empty() {
        s.selector.insert("zone".into(), "b".into());
    }
    f.apply_sessions(12, &s).await;
    // Placed, settled to idle, then the phase.
    f.step(900 + phase_ms / 100).await;
    let held: Vec<Vec<String>> = (0..4)
        .map(|i| {
            leasehold::fleet::runner::Runner::running(f.nodes[i].runner.as_ref())
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        })
        .collect();
    assert_eq!(held.iter().map(Vec::len).sum::<usize>(), 12, "{held:?}");
    let victim = (0..4).max_by_key(|i| held[*i].len()).unwrap();
    if !preferred.is_empty() {
        assert_eq!(f.nodes[victim].id, preferred[0], "{held:?}");
    }
    f.nodes[victim].task.abort();
    let t0 = f.clock.now();
    let mut took = Duration::MAX;
    for _ in 0..400 {
        f.step(1).await;
        let elsewhere = held[victim].iter().all(|name| {
            (0..4).filter(|i| *i != victim).any(|i| {
                leasehold::fleet::runner::Runner::running(f.nodes[i].runner.as_ref())
                    .iter()
                    .any(|(n, _)| n == name)
            })
        });
        if elsewhere {
            took = f.clock.now().saturating_since(t0);
            break;
        }
    }
    f.finish().await;
    took
}

/// Issue #14, apply → running without a nudge: `apply` (through the
/// hinting store, as the CLI writes) rings the bell after its hint, and
/// every idle node reads the bell every ttl/6, so a new manifest starts
/// within about ttl/6 of its apply at any phase of the nodes' idle pauses
/// (10 s at the defaults), and a deleted one stops as soon. Without the
/// ring it waits for a node's next pass: up to the pause.
#[tokio::test(flavor = "current_thread")]
async fn an_apply_rings_the_bell_and_an_idle_fleet_acts_within_a_bell_period() {
    let mut f = FeedFleet::new().await;
    f.start("n1", Duration::from_secs(600), f.hinting(1, 0.0));
    f.start("n2", Duration::from_secs(600), f.hinting(2, 0.0));
    f.step(600).await; // registered, listed each other, idle
    let writer = f.hinting(100, 0.0);
    let running = |f: &FeedFleet| f.running(0) + f.running(1);
    let mut up = Vec::new();
    let mut down = Vec::new();
    for (i, phase) in [0u32, 17, 33, 51, 68, 86].into_iter().enumerate() {
        f.step(phase).await;
        apply(&writer, &format!("a{i}"), &spec("sleep")).await;
        let t0 = f.clock.now();
        while running(&f) < 1 {
            f.step(1).await;
            assert!(f.clock.now().saturating_since(t0) < Duration::from_secs(60));
        }
        up.push(f.clock.now().saturating_since(t0));
        f.step(200 + phase).await; // idle again, at another phase
        leasehold::fleet::manifest::delete(&writer, &Name::new(format!("a{i}")).unwrap())
            .await
            .unwrap();
        let t1 = f.clock.now();
        while running(&f) > 0 {
            f.step(1).await;
            assert!(f.clock.now().saturating_since(t1) < Duration::from_secs(60));
        }
        down.push(f.clock.now().saturating_since(t1));
        f.step(200).await;
    }
    eprintln!("apply → running {up:?}; delete → stopped {down:?}");
    let bound =
        leasehold::fleet::core::bell_period(Duration::from_secs(10)) + Duration::from_millis(300);
    assert!(
        up.iter().chain(&down).all(|d| *d <= bound),
        "{up:?} {down:?}"
    );
    f.finish().await;
}

/// Issue #14: with the feed on, a node reads a peer's record only when the
/// peer hints that its attributes changed (or once per full listing): none
/// in ten idle minutes, then one within a pass or two of the peer's cordon.
/// (With the feed off it reads every peer every `node_refresh`, 3 ttls:
/// `idle_fleet_reads_peer_records_only_every_node_refresh`.)
#[tokio::test(flavor = "current_thread")]
async fn a_peer_record_is_read_when_its_node_hints_a_change() {
    use async_trait::async_trait;

    use leasehold::clock::SeededEntropy;
    use leasehold::store::{Object, StoreError};
    use std::sync::atomic::{AtomicU64, Ordering};
    /// Counts this node's reads of one key's body (`get`; the ring
    /// watch's conditional GETs, a liveness check on every renewal, are
    /// not these reads: `a_dead_node_is_replaced_within_ttl_margin_and_2s_at_the_defaults`).
    #[derive(Debug)]
    struct ReadsOf(Arc<dyn Store>, &'static str, Arc<AtomicU64>);
    impl std::fmt::Display for ReadsOf {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", self.0)
        }
    }
    #[async_trait]
    impl leasehold::store::Forward for ReadsOf {
        fn inner(&self) -> &dyn Store {
            &*self.0
        }

        async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
            if key == self.1 {
                self.2.fetch_add(1, Ordering::SeqCst);
            }
            self.0.get(key).await
        }
    }
    let mut f = FeedFleet::new().await;
    let reads = Arc::new(AtomicU64::new(0));
    let counted: Arc<dyn Store> = Arc::new(ReadsOf(f.bucket.clone(), "nodes/b", reads.clone()));
    f.start(
        "a",
        Duration::from_secs(3600),
        f.hinting_over(counted, 0, 0.0),
    );
    f.start("b", Duration::from_secs(3600), f.hinting(1, 0.0));
    f.step(600).await; // a minute: registered, b's first renewal hinted
    let before = reads.load(Ordering::SeqCst);
    assert!(before >= 1, "a read b's record when it first listed it");
    f.step(6000).await; // ten idle minutes
    let idle = reads.load(Ordering::SeqCst) - before;
    assert_eq!(idle, 0, "no periodic reads of b's record with the feed on");
    leasehold::fleet::control::set(&f.bucket, &SeededEntropy::new(9), "b", false, 0)
        .await
        .unwrap();
    f.nodes[1].status.nudge();
    f.step(300).await; // b's next pass and renewal, then a's light pass
    let after = reads.load(Ordering::SeqCst) - before;
    assert!(
        after >= 1,
        "b's cordon was hinted and a read it ({after} reads)"
    );
    f.finish().await;
}

/// Issue #14 (found in review): with the feed on, a takeover between full
/// listings is seen by the other nodes only through its hint. That must
/// count as a sighting of its epoch: when the holder dies and its claim is
/// deleted by hand, the survivor makes it again above it. (Before,
/// `seen_claims` grew only at full listings, and the claim came back at
/// epoch 2, the epoch the takeover had already run.)
#[tokio::test(flavor = "current_thread")]
async fn a_claim_seen_only_through_hints_is_not_made_again_at_its_epoch() {
    let mut f = FeedFleet::new().await;
    apply(&f.hinting(99, 0.0), "x", &spec("sleep")).await;
    for (i, id) in ["c", "a", "b"].into_iter().enumerate() {
        f.start(id, Duration::from_secs(3600), f.hinting(i as u64, 0.0));
        f.step(300).await; // c claims x first
    }
    assert_eq!(f.running(0), 1, "c runs x");
    f.nodes[0].task.abort(); // kill -9: no release
    f.step(900).await; // c expires; a or b takes x over in a light pass
    let holder = 1 + (1..3).position(|i| f.running(i) > 0).expect("x taken over");
    // The holder dies too, and its claim is deleted by hand (no hint): the
    // survivor saw epoch 2 only through the takeover's hint.
    f.nodes[holder].task.abort();
    f.bucket.delete("sessions/x").await.unwrap();
    f.step(2 * 36_000).await; // past the next full listings and the hold
    let runs = f.runs();
    eprintln!("holder {}: {runs:?}", f.nodes[holder].id);
    assert!(
        runs.iter().any(|r| r.1 == 2),
        "the takeover ran at epoch 2: {runs:?}"
    );
    let again = runs.iter().map(|r| r.1).max().unwrap();
    assert!(
        again >= 3,
        "made again above the takeover's epoch: {runs:?}"
    );
    common::assert_never_twice("", &runs);
    f.finish().await;
}

/// Issue #14 (found in review): a claim deleted by hand, then the session
/// deleted with `delete` and applied again, all between two full listings.
/// The holder's refused release is hinted, so every node reads the claim
/// missing through the feed; that must not make it forget the epoch it saw
/// (only a holder's own release does), or the placeholder `apply` writes
/// over the gap reads as a new session and epoch 1 is issued again.
#[tokio::test(flavor = "current_thread")]
async fn a_claim_deleted_by_hand_then_redeployed_is_not_issued_its_epoch_again() {
    let mut f = FeedFleet::new().await;
    let operator = f.hinting(99, 0.0);
    apply(&operator, "x", &spec("sleep")).await;
    for (i, id) in ["a", "b"].into_iter().enumerate() {
        f.start(id, Duration::from_secs(3600), f.hinting(i as u64, 0.0));
    }
    f.step(300).await;
    f.bucket.delete("sessions/x").await.unwrap(); // by hand: no hint
    f.step(50).await;
    manifest::delete(&operator, &Name::new("x").unwrap())
        .await
        .unwrap();
    f.step(300).await; // the holder stops; its release is refused
    apply(&operator, "x", &spec("sleep")).await;
    f.step(2 * 36_000).await;
    let runs = f.runs();
    eprintln!("{runs:?}");
    assert_eq!(runs[0].1, 1, "{runs:?}");
    assert!(runs.len() >= 2, "applied again, it runs again: {runs:?}");
    assert!(
        runs[1..].iter().all(|r| r.1 >= 2),
        "epoch 1 issued again: {runs:?}"
    );
    common::assert_never_twice("", &runs);
    f.finish().await;
}

/// Issue #14: a node whose full listings are a minute apart believes in its
/// claims for that minute (plus a ttl, less the margin), so it publishes
/// that minute as `max_poll_ms` and a peer waits it out before making one
/// of its claims again. Here an operator deletes n1's claim by hand (no
/// hint), n2's hints are lost too, and n2 lists everything every pass (its
/// feed off): if n1 published only its `max_poll` (10 s), n2 would make
/// the claim again about 21 s after seeing it gone, while n1 runs the
/// session until its next full listing, up to a minute later.
#[tokio::test(flavor = "current_thread")]
async fn a_node_with_rare_full_listings_is_waited_out_for_them() {
    let mut f = FeedFleet::new().await;
    apply(&f.bucket, "s", &spec("sleep")).await;
    for (i, full_every) in [(1u64, 60u64), (2, 10)] {
        f.start(
            &format!("n{i}"),
            Duration::from_secs(full_every),
            f.hinting(i, 1.0),
        );
        // n1 registers, lists everything and claims before n2 starts.
        f.step(30).await;
    }
    assert_eq!(f.running(0), 1, "n1 runs s");
    f.step(20).await;
    f.bucket.delete("sessions/s").await.unwrap();
    f.step(1800).await; // three virtual minutes
    let runs = f.runs();
    eprintln!("{runs:?}");
    let o = common::overlaps(&runs);
    assert!(o.is_empty(), "ran twice at once: {o:?} in {runs:?}");
    // And the session was made again (at a higher epoch) and runs.
    assert!(
        runs.iter().any(|r| r.1 > 1 && r.4 >= f.clock.now()),
        "{runs:?}"
    );
    f.finish().await;
}

/// Issue #14: a node whose full listings grow further apart with the fleet
/// (`full_every_objects`) publishes the longer interval before it lists at
/// it, and a peer reads every node record again before it makes a vanished
/// claim. Here n2 read n1's record while n1 published 20 s, before n1's
/// interval grew to 200 s (10 listed objects, one interval each); n2 reads
/// no hints (its feed off) and re-reads peers' records only hourly; every
/// hint is lost; an operator deletes one of n1's claims by hand. Going by
/// the record it had read, n2 would make the claim again about 31 s after
/// seeing it gone, while n1 runs the session until its next full listing,
/// up to 200 s later. A foreign object under `nodes/` (never renewed) does
/// not stall that read: the claim is still made again.
#[tokio::test(flavor = "current_thread")]
async fn a_vanished_claim_waits_for_its_holders_grown_full_listing_interval() {
    let mut f = FeedFleet::new().await;
    for i in 0..5 {
        apply(&f.bucket, &format!("s{i}"), &spec("sleep")).await;
    }
    f.bucket
        .put(
            "nodes/stray",
            bytes::Bytes::from_static(b"not a node record"),
            leasehold::store::Cond::Create,
        )
        .await
        .unwrap();
    f.start_with("n1", f.hinting(1, 1.0), growing);
    // n1 registers (publishing 20 s), lists everything and claims all five.
    // (It grows its interval only once the stray object under `nodes/` has
    // stood still for a ttl and the margin, at its second full listing:
    // a record that does not decode may be a live node of unknown build.)
    f.step(10).await;
    f.start_with("n2", f.hinting(2, 1.0), |cfg| {
        cfg.full_every = Duration::from_secs(10); // = max_poll: the feed off
        cfg.node_refresh = Duration::from_secs(3600);
    });
    f.step(300).await;
    assert_eq!(f.running(0), 5, "n1 runs all five");
    assert_eq!(
        published_attrs(&f.bucket, "n1").await.max_poll_ms,
        200_000,
        "n1 published its grown interval (5 manifests and 5 claims)"
    );
    f.bucket.delete("sessions/s0").await.unwrap();
    f.step(5000).await; // 500 s
    let runs = f.runs();
    eprintln!("{runs:?}");
    let o = common::overlaps(&runs);
    assert!(o.is_empty(), "ran twice at once: {o:?} in {runs:?}");
    // Made again (at a higher epoch) and running; n1 stopped it first.
    assert!(
        runs.iter()
            .any(|r| r.0 == "s0" && r.1 > 1 && r.4 >= f.clock.now()),
        "{runs:?}"
    );
    f.finish().await;
}

/// A node whose full-listing interval grows with the fleet from 20 s, one
/// interval per listed object (5 manifests and their claims: 200 s).
fn growing(cfg: &mut NodeConfig) {
    cfg.full_every = Duration::from_secs(20);
    cfg.full_every_objects = 1;
}

/// The attributes node `id` publishes in its record now.
async fn published_attrs(bucket: &Arc<dyn Store>, id: &str) -> leasehold::fleet::attrs::NodeAttrs {
    let key = format!("nodes/{id}");
    let o = bucket.get(&key).await.unwrap().unwrap();
    let r = leasehold::record::LeaseRecord::decode(&key, &o.bytes, leasehold::record::Kind::Node)
        .unwrap();
    leasehold::fleet::attrs::NodeAttrs::of(&r)
}

/// The attributes a node of an older build writes (no `proto`), with
/// capacity 0 (placement gives it nothing).
fn older_attrs() -> serde_json::Map<String, serde_json::Value> {
    serde_json::json!({
        "capacity": 0, "max_poll_ms": 10_000, "load": 0, "labels": {}
    })
    .as_object()
    .unwrap()
    .clone()
}

/// A node of an older build, as its peers find it: a node lease whose
/// record carries `older_attrs`, renewed by the test, with no pull loop.
async fn older_node(
    bucket: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    id: &str,
) -> leasehold::lease::Lease {
    node_lease(bucket, clock, id, older_attrs()).await
}

/// A node lease `id` with attributes `attrs` (ttl 10 s), held by the test.
async fn node_lease(
    bucket: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    id: &str,
    attrs: serde_json::Map<String, serde_json::Value>,
) -> leasehold::lease::Lease {
    use leasehold::lease::{Acquire, AcquireOptions, LeaseClient};
    let client = LeaseClient::builder(bucket.clone(), Name::new(id).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut opts = AcquireOptions::ttl(Duration::from_secs(10));
    opts.attrs = attrs;
    let Acquire::Acquired(lease) = client
        .acquire_kind(
            leasehold::record::Kind::Node,
            &Name::new(id).unwrap(),
            &opts,
        )
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    lease
}

/// Issue #14's upgrade order, kept by the nodes: a node does not grow its
/// full-listing interval with the fleet while a peer of an older build is
/// live (its record publishes no `proto`), since such a peer waits out a
/// vanished claim by the interval it last read, not the one published
/// since. It grows once that peer is gone, and when an older peer joins
/// later it goes back to the fixed interval within its slow `nodes/`
/// listing and one full pass, its sessions running on throughout (the full
/// pass confirms their claims before the interval shrinks), even with one
/// claim deleted by hand meanwhile: that claim's confirmation is from the
/// listing before, and the shorter belief applied before the pass stopped
/// its session ended every session's deadline with it (found by review).
#[tokio::test(flavor = "current_thread")]
async fn an_older_node_in_the_fleet_keeps_the_listing_interval_from_growing() {
    let mut f = FeedFleet::new().await;
    for i in 0..5 {
        apply(&f.bucket, &format!("s{i}"), &spec("sleep")).await;
    }
    let mut old = older_node(&f.bucket, &f.dyn_clock, "old").await;
    f.start_with("n1", f.hinting(1, 0.0), growing);
    // 102 s, the older node renewing every 3 s.
    f.step_beside(&mut old, 34).await;
    assert_eq!(f.running(0), 5, "n1 runs all five");
    assert_eq!(
        published_attrs(&f.bucket, "n1").await.max_poll_ms,
        20_000,
        "not grown (5 manifests and 5 claims would make 200 s) beside an older node"
    );
    assert_eq!(
        published_attrs(&f.bucket, "n1").await.proto,
        leasehold::fleet::attrs::PROTO_LEVEL
    );
    // The older node stops (released): n1 grows at its next full listing.
    old.release().await.unwrap();
    f.step(600).await;
    assert_eq!(
        published_attrs(&f.bucket, "n1").await.max_poll_ms,
        200_000,
        "grown once no older node is live"
    );
    // An operator deletes s0's claim by hand (no hint: only a full listing
    // shows it), and an older node joins (it does not hint either: the
    // slow `nodes/` listing finds it, within a minute).
    f.bucket.delete("sessions/s0").await.unwrap();
    let mut late = older_node(&f.bucket, &f.dyn_clock, "late").await;
    f.step_beside(&mut late, 30).await;
    assert_eq!(
        published_attrs(&f.bucket, "n1").await.max_poll_ms,
        20_000,
        "back to the fixed interval within 90 s of an older node joining"
    );
    let runs = f.runs();
    let now = f.clock.now();
    for i in 1..5 {
        let of: Vec<_> = runs.iter().filter(|r| r.0 == format!("s{i}")).collect();
        assert!(
            of.len() == 1 && of[0].4 >= now,
            "s{i} ran on, never stopped or started again: {runs:?}"
        );
    }
    // (n1 may have made its own vanished claim again since, at epoch 2.)
    assert!(
        runs.iter().any(|r| r.0 == "s0" && r.1 == 1 && r.4 < now),
        "s0 stopped, its claim gone: {runs:?}"
    );
    let o = common::overlaps(&runs);
    assert!(o.is_empty(), "{o:?}");
    f.finish().await;
}

/// When the interval shrinks (an older node joined), the deadline the
/// runner holds is measured in the shorter belief at once, not at the next
/// pass: here every listing stalls right after the pass that shrank it (the
/// renewals go on), and the sessions stop within the short belief (about
/// 29 s) of that pass's confirmation. With the shorter belief applied after
/// the pass's announcement and not announced again, they ran on at the
/// grown belief's deadline (about 209 s): by then a peer that read the
/// short interval may have taken a claim deleted by hand (found by review).
#[tokio::test(flavor = "current_thread")]
async fn a_shrunk_interval_bounds_the_running_sessions_at_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Every listing waits while `stall` is set.
    #[derive(Debug)]
    struct StallLists {
        inner: Arc<dyn Store>,
        stall: Arc<AtomicBool>,
        clock: Arc<dyn Clock>,
    }
    impl std::fmt::Display for StallLists {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "stall-lists({})", self.inner)
        }
    }
    impl StallLists {
        fn held(
            &self,
            list: futures::stream::BoxStream<
                'static,
                Result<leasehold::store::Entry, leasehold::store::StoreError>,
            >,
        ) -> futures::stream::BoxStream<
            'static,
            Result<leasehold::store::Entry, leasehold::store::StoreError>,
        > {
            use futures::StreamExt;
            let (stall, clock) = (self.stall.clone(), self.clock.clone());
            futures::stream::once(async move {
                while stall.load(Ordering::SeqCst) {
                    clock.sleep(Duration::from_millis(100)).await;
                }
                list
            })
            .flatten()
            .boxed()
        }
    }
    impl leasehold::store::Forward for StallLists {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }
        fn list(
            &self,
            prefix: &str,
        ) -> futures::stream::BoxStream<
            'static,
            Result<leasehold::store::Entry, leasehold::store::StoreError>,
        > {
            self.held(self.inner.list(prefix))
        }
        fn list_after(
            &self,
            prefix: &str,
            after: &str,
        ) -> futures::stream::BoxStream<
            'static,
            Result<leasehold::store::Entry, leasehold::store::StoreError>,
        > {
            self.held(self.inner.list_after(prefix, after))
        }
    }

    let mut f = FeedFleet::new().await;
    let stall = Arc::new(AtomicBool::new(false));
    let store: Arc<dyn Store> = Arc::new(StallLists {
        inner: f.hinting(1, 0.0),
        stall: stall.clone(),
        clock: f.dyn_clock.clone(),
    });
    f.grown_over_five(store).await;
    // An older node joins; the moment n1's record shows the fixed interval
    // again (published by the renewal after the pass that shrank it), every
    // listing stalls.
    let mut late = older_node(&f.bucket, &f.dyn_clock, "late").await;
    let mut shrunk = false;
    for step in 1..=1200 {
        f.step(1).await;
        if step % 30 == 0 {
            late.renew_once().await.unwrap();
        }
        if published_attrs(&f.bucket, "n1").await.max_poll_ms == 20_000 {
            stall.store(true, Ordering::SeqCst);
            shrunk = true;
            break;
        }
    }
    assert!(shrunk, "n1 took the fixed interval back within 120 s");
    let at = f.clock.now();
    f.step_beside(&mut late, 20).await;
    let runs = f.runs();
    let now = f.clock.now();
    assert!(
        runs.iter()
            .all(|r| r.4 < now && r.4 < at + Duration::from_secs(40)),
        "every session stopped within the short belief: {runs:?} (stalled at {at:?})"
    );
    stall.store(false, Ordering::SeqCst);
    f.finish().await;
}

/// A growth taken at the start of a full pass and given back by that pass
/// (an older node registered after the listing that decided the growth and
/// before it landed, so it read the fixed interval) is never announced:
/// the pass raises the belief to the grown interval only once the interval
/// is decided. Here that pass stalls in between (a session's exit, whose
/// claim write hangs) while the renew task goes on renewing and announcing
/// what the pass left it: the sessions stop within the fixed interval's
/// belief (about 29 s). Before, the pass had announced the grown belief
/// (about 209 s) and they ran on (found by review).
#[tokio::test(flavor = "current_thread")]
async fn a_growth_given_back_in_its_own_pass_is_never_announced() {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Claim writes (`sessions/`) wait while `stall` is set.
    #[derive(Debug)]
    struct StallClaimWrites {
        inner: Arc<dyn Store>,
        stall: Arc<AtomicBool>,
        clock: Arc<dyn Clock>,
    }
    impl std::fmt::Display for StallClaimWrites {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "stall-claim-writes({})", self.inner)
        }
    }
    #[async_trait::async_trait]
    impl leasehold::store::Forward for StallClaimWrites {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }
        async fn put(
            &self,
            key: &str,
            bytes: bytes::Bytes,
            cond: leasehold::store::Cond,
        ) -> Result<leasehold::store::Version, leasehold::store::StoreError> {
            while key.starts_with("sessions/") && self.stall.load(Ordering::SeqCst) {
                self.clock.sleep(Duration::from_millis(100)).await;
            }
            self.inner.put(key, bytes, cond).await
        }
    }

    let mut f = FeedFleet::new().await;
    let stall = Arc::new(AtomicBool::new(false));
    let store = f.hinting_over(
        Arc::new(StallClaimWrites {
            inner: f.bucket.clone(),
            stall: stall.clone(),
            clock: f.dyn_clock.clone(),
        }),
        1,
        0.0,
    );
    f.start_with("n1", store, growing);
    // Registered and listed: nothing to grow for.
    f.step(100).await;
    // Five sessions (no hints: the next full listing finds them and
    // decides a growth, published at the next renewal).
    for i in 0..5 {
        apply(&f.bucket, &format!("s{i}"), &spec("sleep")).await;
    }
    assert!(
        f.step_until(400, || f.running(0) == 5).await,
        "n1 placed all five"
    );
    // The deciding pass has listed: an older node registers now, and reads
    // the fixed interval.
    assert_eq!(published_attrs(&f.bucket, "n1").await.max_poll_ms, 20_000);
    let mut old = older_node(&f.bucket, &f.dyn_clock, "old").await;
    // The growth lands; the pass that takes it up will meet a session's
    // exit whose claim write hangs.
    let mut landed = false;
    for step in 1..=100 {
        f.step(1).await;
        if step % 30 == 0 {
            old.renew_once().await.unwrap();
        }
        if published_attrs(&f.bucket, "n1").await.max_poll_ms > 20_000 {
            landed = true;
            break;
        }
    }
    assert!(landed, "the growth landed after the older node registered");
    let at = f.clock.now();
    f.nodes[0].runner.exit("s4", 0);
    stall.store(true, Ordering::SeqCst);
    f.step_beside(&mut old, 20).await;
    let runs = f.runs();
    let now = f.clock.now();
    assert!(
        runs.iter()
            .all(|r| r.4 < now && r.4 < at + Duration::from_secs(40)),
        "every session stopped within the fixed interval's belief: {runs:?} (landed at {at:?})"
    );
    stall.store(false, Ordering::SeqCst);
    f.step(100).await;
    f.finish().await;
}

/// The interval does not shrink in a pass whose listing did not confirm
/// every claim held: a claim deleted by hand that cannot be read back
/// (here its reads fail) keeps the previous listing's confirmation, and
/// measured in the shorter belief it ended every session's deadline with
/// it. The shrink waits for a pass that confirms them all (found by
/// review); meanwhile the others run on, and then it comes.
#[tokio::test(flavor = "current_thread")]
async fn the_interval_shrinks_only_when_every_claim_held_is_confirmed() {
    use std::sync::atomic::{AtomicBool, Ordering};
    /// Reads of `sessions/s0` fail while `fail` is set.
    #[derive(Debug)]
    struct FailReads {
        inner: Arc<dyn Store>,
        fail: Arc<AtomicBool>,
    }
    impl std::fmt::Display for FailReads {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "fail-reads({})", self.inner)
        }
    }
    #[async_trait::async_trait]
    impl leasehold::store::Forward for FailReads {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }
        async fn get(
            &self,
            key: &str,
        ) -> Result<Option<leasehold::store::Object>, leasehold::store::StoreError> {
            if key == "sessions/s0" && self.fail.load(Ordering::SeqCst) {
                return Err(leasehold::store::StoreError::Unavailable {
                    message: "injected".into(),
                });
            }
            self.inner.get(key).await
        }
    }

    let mut f = FeedFleet::new().await;
    let fail = Arc::new(AtomicBool::new(false));
    let store = f.hinting_over(
        Arc::new(FailReads {
            inner: f.bucket.clone(),
            fail: fail.clone(),
        }),
        1,
        0.0,
    );
    f.grown_over_five(store).await;
    // s0's claim deleted by hand, and unreadable to n1; an older node joins.
    f.bucket.delete("sessions/s0").await.unwrap();
    fail.store(true, Ordering::SeqCst);
    let mut late = older_node(&f.bucket, &f.dyn_clock, "late").await;
    f.step_beside(&mut late, 40).await;
    let now = f.clock.now();
    let runs = f.runs();
    for i in 1..5 {
        assert!(
            runs.iter().any(|r| r.0 == format!("s{i}") && r.4 >= now),
            "s{i} runs on: {runs:?}"
        );
    }
    assert_eq!(
        published_attrs(&f.bucket, "n1").await.max_poll_ms,
        200_000,
        "not shrunk while s0's claim is unconfirmed"
    );
    // s0 reads (as gone) again: the next full pass drops it and shrinks.
    fail.store(false, Ordering::SeqCst);
    f.step_beside(&mut late, 20).await;
    assert_eq!(published_attrs(&f.bucket, "n1").await.max_poll_ms, 20_000);
    let runs = f.runs();
    let now = f.clock.now();
    for i in 1..5 {
        let of: Vec<_> = runs.iter().filter(|r| r.0 == format!("s{i}")).collect();
        assert!(
            of.len() == 1 && of[0].4 >= now,
            "s{i} ran on, never stopped: {runs:?}"
        );
    }
    f.finish().await;
}

/// The gate on growing the interval judges peers' records as they stand,
/// not as last read: a light pass reads a known peer's record only on a
/// hint or every `peer_refresh` (an hour here), so a node id rolled back
/// to an older build (here: the same lease renewed with an older build's
/// attributes, no hint) would still read as the newer build. Before the
/// interval grows, every record whose listed version is unread is read
/// again (found by review).
#[tokio::test(flavor = "current_thread")]
async fn the_growth_gate_reads_peer_records_as_they_stand() {
    let mut f = FeedFleet::new().await;
    let mut newer = older_attrs();
    newer.insert("proto".into(), leasehold::fleet::attrs::PROTO_LEVEL.into());
    let mut rb = node_lease(&f.bucket, &f.dyn_clock, "rb", newer).await;
    f.start_with("n1", f.hinting(1, 0.0), |cfg| {
        growing(cfg);
        cfg.node_refresh = Duration::from_secs(3600);
    });
    // 30 s: n1 registered and read rb's record; nothing to grow for.
    f.step_beside(&mut rb, 10).await;
    assert_eq!(published_attrs(&f.bucket, "n1").await.max_poll_ms, 20_000);
    rb.set_attrs(older_attrs()).await.unwrap();
    // Five sessions (no hints: the next full listing finds them), which
    // would grow the interval to 200 s.
    for i in 0..5 {
        apply(&f.bucket, &format!("s{i}"), &spec("sleep")).await;
    }
    f.step_beside(&mut rb, 40).await;
    assert_eq!(f.running(0), 5, "n1 runs all five");
    assert_eq!(
        published_attrs(&f.bucket, "n1").await.max_poll_ms,
        20_000,
        "not grown: rb's record now says an older build"
    );
    f.finish().await;
}

/// On a slow store a tick can outlast the TTL. A session must then be started
/// with the lease's latest deadline, and a start refused because the node's
/// own deadline passed must not mark the session failed (it once did, and
/// 23 of 200 sessions on moto were never run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_store_places_everything_and_fails_nothing() {
    use leasehold::store::{FaultPlan, FaultStore};
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    for i in 0..40 {
        apply(&inner, &format!("slow{i}"), &spec("sleep")).await;
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let slow: Arc<dyn Store> = Arc::new(
        FaultStore::new(inner.clone())
            .with_clock(clock.clone())
            .with_plan(
                7,
                FaultPlan {
                    delay: 1.0,
                    max_delay: Duration::from_millis(40),
                    ..Default::default()
                },
            ),
    );
    let mut f = Fleet::new(slow);
    f.clock = clock;
    f.start("a", 64, &[]);
    f.start("b", 64, &[]);
    f.wait_for("all 40 running", |p| {
        p.len() == 40 && p.values().all(|v| v.len() == 1)
    })
    .await;
    for i in 0..40 {
        let c = f.claim(&format!("slow{i}")).await;
        assert_eq!(c.state, ClaimState::Running, "slow{i}: {c:?}");
    }
    f.finish().await;
}

/// `wake` with a claimer: the caller's own node claims an unowned or
/// released session at once (its pull loop is slowed to 30 s so only the wake
/// path can have done it), and declines, with a reason, what the takeover
/// rules or its capacity and labels forbid. The same through the node's HTTP
/// endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wake_claims_on_the_callers_node_within_the_rules() {
    use leasehold::fleet::node::ClaimAnswer;
    use leasehold::wake::{Owned, Resolver, WakeOutcome};
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    // A peer with an ordinary pull loop, in zone b.
    let mut f = Fleet::new(store.clone());
    f.start("peer", 8, &[("zone", "b")]);
    apply(&store, "busy", &spec("sleep")).await;
    f.wait_for("busy on peer", |p| p.contains_key("busy")).await;

    // The caller's node, zone a, capacity 2, listing only every 30 s.
    let mut cfg = NodeConfig::new(Name::new("caller").unwrap(), TTL);
    cfg.capacity = 2;
    cfg.poll = Duration::from_secs(30);
    cfg.max_poll = Duration::from_secs(30);
    cfg.labels.insert("zone".into(), "a".into());
    let handle = f.start_caller(store.clone(), cfg);
    let runner = f.nodes[1].runner.clone();
    let journal = f.nodes[1].journal.clone();
    // Registered (and its first pass done) once its journal says so.
    for _ in 0..200 {
        if journal.totals().contains_key(&EventKind::Registered) {
            break;
        }
        clock.sleep(Duration::from_millis(10)).await;
    }
    clock.sleep(Duration::from_millis(100)).await;
    let resolver = Resolver::new(store.clone()).with_claimer(handle.clone());
    let wake = async |name: &str| {
        resolver
            .wake(&Name::new(name).unwrap(), Duration::from_millis(200))
            .await
            .unwrap()
    };
    let running = || leasehold::fleet::runner::Runner::running(runner.as_ref());

    // Unowned (applied after the caller's first pass): claimed here, now.
    let mut web = spec("sleep");
    web.selector.insert("zone".into(), "a".into());
    apply(&store, "web", &web).await;
    let w = wake("web").await;
    assert_eq!(
        w.outcome,
        WakeOutcome::ClaimedHere {
            node: "caller".into(),
            epoch: 1
        },
        "{w:?}"
    );
    assert!(
        matches!(w.claim, Some(ClaimAnswer::Claimed { epoch: 1, .. })),
        "{w:?}"
    );
    assert_eq!(running(), vec![("web".to_string(), 1)]);
    assert_eq!(f.claim("web").await.owner.node, "caller");

    // No manifest: nothing to claim, and the node is not asked.
    let w = wake("ghost").await;
    assert_eq!(
        w.outcome,
        WakeOutcome::NoOwner {
            owner: Owned::NoManifest
        }
    );
    assert_eq!(w.claim, None);

    // The selector names zone b: declined, with the reason.
    let mut zoned = spec("sleep");
    zoned.selector.insert("zone".into(), "b".into());
    zoned.paused = true; // and the peer must not take it either
    apply(&store, "zoned", &zoned).await;
    let w = wake("zoned").await;
    assert!(
        matches!(&w.claim, Some(ClaimAnswer::Declined { reason, .. }) if reason.contains("labels")),
        "{w:?}"
    );

    // Owned by a live peer (which publishes no address, so it is not
    // reachable): the caller's node sees the owner's lease live and declines.
    let w = wake("busy").await;
    assert!(
        matches!(&w.outcome, WakeOutcome::Unreachable { node, .. } if node == "peer"),
        "{w:?}"
    );
    assert!(
        matches!(&w.claim, Some(ClaimAnswer::Declined { reason, .. }) if reason.contains("owner is live")),
        "{w:?}"
    );
    assert_eq!(f.claim("busy").await.owner.node, "peer");

    // Fill the caller's capacity (2), then ask for a third: declined.
    let mut api = spec("sleep");
    api.selector.insert("zone".into(), "a".into());
    apply(&store, "api", &api).await;
    // Every claim request is followed by a pass of the caller's pull loop,
    // and the pass that followed "busy" may list manifests after this apply
    // and claim "api" itself (only the caller matches zone a, so it ranks
    // first). Either way the caller holds it at epoch 1: what this step needs
    // is a full node. (This raced 2 runs in 5 when only `Claimed` passed;
    // and when that pass had claimed it before the wake read the claim,
    // the wake found it owned by the caller, which publishes no address,
    // and asked nothing: 1 suite run in 3 on 2026-12-06.)
    let w = wake("api").await;
    assert!(
        matches!(
            &w.claim,
            Some(ClaimAnswer::Claimed { node, epoch: 1, .. } | ClaimAnswer::AlreadyOwned { node, epoch: 1 })
                if node == "caller"
        ) || (w.claim.is_none()
            && matches!(&w.outcome, WakeOutcome::Unreachable { node, .. } if node == "caller")),
        "{w:?}"
    );
    assert_eq!(f.claim("api").await.owner.node, "caller");
    let mut third = spec("sleep");
    third.selector.insert("zone".into(), "a".into());
    apply(&store, "third", &third).await;
    let w = wake("third").await;
    assert!(
        matches!(&w.claim, Some(ClaimAnswer::Declined { reason, .. }) if reason.contains("capacity")),
        "{w:?}"
    );
    assert_eq!(running().len(), 2);

    // The peer shuts down gracefully and releases "busy" (the tombstone
    // keeps its epoch). Deleting "api" frees a slot on the caller.
    let busy_epoch = f.claim("busy").await.epoch;
    let mut peer = f.nodes.remove(0);
    peer.shutdown.cancel();
    (&mut peer.task).await.unwrap().unwrap();
    f.dead.push(peer);
    manifest::delete(&store, &Name::new("api").unwrap())
        .await
        .unwrap();
    // Deletion is acted on at the caller's next pass; ask for "third" until
    // the slot is free (each wake wakes the node, so this is quick).
    // Wakes `name` until the caller's node holds it (bounded: 20 s, a
    // pass under a loaded machine's full listings; 2 s once fell short
    // beside ten node processes listing 100,000 sessions each). The pass
    // that acts on the deletion may claim it itself (the caller ranks
    // first for zone a): then a wake finds it already owned, which is the
    // same end (1 failure in a filtered run of these tests, 2026-12-06).
    let wake_until_claimed = async |name: &str| {
        for _ in 0..1000 {
            let w = wake(name).await;
            if matches!(
                w.claim,
                Some(ClaimAnswer::Claimed { .. } | ClaimAnswer::AlreadyOwned { .. })
            ) {
                return w.claim;
            }
            clock.sleep(Duration::from_millis(20)).await;
        }
        None
    };
    let answer = wake_until_claimed("third").await;
    assert!(
        matches!(
            &answer,
            Some(ClaimAnswer::Claimed { node, epoch: 1, .. } | ClaimAnswer::AlreadyOwned { node, epoch: 1 })
                if node == "caller"
        ),
        "{answer:?}"
    );
    assert_eq!(f.claim("busy").await.state, ClaimState::Released);
    assert_eq!(f.claim("busy").await.epoch, busy_epoch);
    // Full again; deleting "third" frees the slot, and the released "busy"
    // is taken over at epoch + 1.
    manifest::delete(&store, &Name::new("third").unwrap())
        .await
        .unwrap();
    let answer = wake_until_claimed("busy").await;
    assert!(
        matches!(
            answer,
            Some(ClaimAnswer::Claimed { epoch, .. } | ClaimAnswer::AlreadyOwned { epoch, .. })
                if epoch == busy_epoch + 1
        ),
        "{answer:?}"
    );

    // The same request over the node's HTTP API (bearer token required).
    let token = b"0123456789abcdef-claim".to_vec();
    let state =
        leasehold::http::HttpState::new(journal.clone(), Default::default(), None, token.clone())
            .unwrap()
            .with_claimer(handle.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop_http = CancellationToken::new();
    tokio::spawn(leasehold::http::serve(listener, state, stop_http.clone()));
    let post_blocking = move |path: String, auth: bool| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n"
        );
        if auth {
            req.push_str("Authorization: Bearer 0123456789abcdef-claim\r\n");
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let code: u16 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
        (
            code,
            out.split_once("\r\n\r\n")
                .map(|(_, b)| b.to_string())
                .unwrap_or_default(),
        )
    };
    // The client blocks; keep it off the runtime's threads.
    let post = async |path: &str, auth: bool| {
        let path = path.to_string();
        tokio::task::spawn_blocking(move || post_blocking(path, auth))
            .await
            .unwrap()
    };
    let (code, _) = post("/v1/sessions/web/claim", false).await;
    assert_eq!(code, 401);
    let (code, body) = post("/v1/sessions/Bad%20Name/claim", true).await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = post("/v1/sessions/web/claim", true).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["claim"], "already_owned");
    assert_eq!(v["epoch"], 1);
    let (code, body) = post("/v1/sessions/zoned/claim", true).await;
    assert_eq!(code, 409, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["claim"], "declined");
    stop_http.cancel();

    let caller = f.nodes.pop().unwrap();
    caller.shutdown.cancel();
    caller.task.await.unwrap().unwrap();
    // After the node stopped, the handle declines instead of hanging.
    assert!(matches!(
        handle.claim_now(&Name::new("web").unwrap()).await.unwrap(),
        ClaimAnswer::Declined { .. }
    ));
    f.finish().await;
}

/// Placement weighs free capacity: a node that joins a loaded fleet takes a
/// larger share of new sessions than its peers (with capacity weights it
/// would get 1 in 5 here, about 8 of 40; with free-capacity weights
/// 25:25:25:25:100, about half).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_node_takes_more_than_its_share_of_new_sessions() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    for id in ["n1", "n2", "n3", "n4"] {
        f.start(id, 100, &[]);
    }
    for i in 0..300 {
        apply(&store, &format!("old{i:03}"), &spec("sleep")).await;
    }
    f.wait_for("300 placed", |p| p.len() == 300).await;
    f.start("fresh", 100, &[]);
    // Let every peer list the newcomer and the newcomer read every claim.
    f.clock.sleep(TTL).await;
    for i in 0..40 {
        apply(&store, &format!("new{i:03}"), &spec("sleep")).await;
    }
    f.wait_for("340 placed", |p| p.len() == 340).await;
    let p = f.placement();
    let on_fresh = p
        .iter()
        .filter(|(s, v)| s.starts_with("new") && v[0].0 == "fresh")
        .count();
    let loads: BTreeMap<&str, usize> = p.values().fold(BTreeMap::new(), |mut m, v| {
        *m.entry(v[0].0.as_str()).or_default() += 1;
        m
    });
    eprintln!("newcomer took {on_fresh} of 40; loads {loads:?}");
    assert!(
        on_fresh >= 14,
        "the newcomer took {on_fresh} of 40 new sessions (capacity weights: ~8); loads {loads:?}"
    );
    f.finish().await;
}

/// Registers node `node` (a node lease taken directly, no pull loop) and
/// writes a running claim by it, at epoch 1, for a freshly applied manifest
/// `session`: a peer's session as another node finds it.
async fn foreign_claim(
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    node: &str,
    session: &str,
) -> leasehold::lease::Lease {
    use leasehold::lease::{Acquire, AcquireOptions, LeaseClient};
    let client = LeaseClient::builder(store.clone(), Name::new(node).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let Acquire::Acquired(lease) = client
        .acquire_kind(
            leasehold::record::Kind::Node,
            &Name::new(node).unwrap(),
            &AcquireOptions::ttl(TTL),
        )
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    apply(store, session, &spec("sleep")).await;
    let digest = manifest::get(store, &Name::new(session).unwrap())
        .await
        .unwrap()
        .unwrap()
        .0
        .digest;
    let claim = ClaimRecord {
        schema: leasehold::record::SCHEMA.into(),
        kind: "session".into(),
        owner: leasehold::fleet::claim::Owner {
            node: node.into(),
            instance: client.holder().instance.clone(),
        },
        epoch: 1,
        state: ClaimState::Running,
        digest,
        address: None,
        exit_code: None,
        reason: None,
        backoff_until_ms: None,
        health: None,
        endpoint: None,
        restarts: 0,
        updated_at_ms: 0,
        tick_ms: None,
        nonce: "c1".into(),
    };
    // Over the placeholder `apply` wrote.
    let key = format!("sessions/{session}");
    let current = store.get(&key).await.unwrap().unwrap().version;
    store
        .put(
            &key,
            claim.encode().into(),
            leasehold::store::Cond::Match(current),
        )
        .await
        .unwrap();
    lease
}

/// Taking a session over from a node whose lease expired by observation must
/// first fence that node's lease in the bucket (a tombstone written with
/// If-Match on the version watched go stale). Otherwise a renewal still in
/// flight, landing after the listing, would leave the owner believing in its
/// lease while a peer runs its session. Here the owner's late renewal lands
/// just before the fence: the fence is refused, nothing is taken over; when
/// the owner then falls silent for good, the fence lands and the session
/// moves. Checked as an invariant at every write of the claim: the owner's
/// node lease is already released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn takeover_fences_the_owners_lease_first_even_against_a_late_renewal() {
    use async_trait::async_trait;

    use leasehold::record::{Kind, LeaseRecord};
    use leasehold::store::{Cond, StoreError, Version};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    #[derive(Debug)]
    struct Watch {
        inner: Arc<dyn Store>,
        late_renewal: AtomicBool,
        late_renewals: AtomicU32,
        takeovers: AtomicU32,
        violations: AtomicU32,
    }
    impl std::fmt::Display for Watch {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "watch({})", self.inner)
        }
    }
    #[async_trait]
    impl leasehold::store::Forward for Watch {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }

        async fn put(
            &self,
            key: &str,
            bytes: bytes::Bytes,
            cond: Cond,
        ) -> Result<Version, StoreError> {
            if key == "nodes/owner" && self.late_renewal.swap(false, Ordering::SeqCst) {
                // The owner's renewal, sent before its deadline, lands now.
                let cur = self.inner.get(key).await?.unwrap();
                let mut r = LeaseRecord::decode(key, &cur.bytes, Kind::Node).unwrap();
                r.nonce = "late-renewal".into();
                self.inner
                    .put(key, r.encode().unwrap().into(), Cond::Match(cur.version))
                    .await?;
                self.late_renewals.fetch_add(1, Ordering::SeqCst);
            }
            if key == "sessions/orphan" && matches!(cond, Cond::Match(_)) {
                self.takeovers.fetch_add(1, Ordering::SeqCst);
                let o = self.inner.get("nodes/owner").await?.unwrap();
                let r = LeaseRecord::decode("nodes/owner", &o.bytes, Kind::Node).unwrap();
                if !r.released {
                    self.violations.fetch_add(1, Ordering::SeqCst);
                }
            }
            self.inner.put(key, bytes, cond).await
        }
    }

    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    // The owner: a node lease and a running claim, then silence.
    let mut owner_lease = foreign_claim(&inner, &clock, "owner", "orphan").await;

    let watch = Arc::new(Watch {
        inner: inner.clone(),
        late_renewal: AtomicBool::new(true),
        late_renewals: AtomicU32::new(0),
        takeovers: AtomicU32::new(0),
        violations: AtomicU32::new(0),
    });
    let mut f = Fleet::new(watch.clone());
    f.clock = clock.clone();
    f.start("taker", 8, &[]);
    f.wait_for("orphan taken over", |p| {
        p.get("orphan")
            .is_some_and(|v| v.iter().any(|(n, e)| n == "taker" && *e >= 2))
    })
    .await;
    assert_eq!(
        watch.violations.load(Ordering::SeqCst),
        0,
        "taken over from a live lease"
    );
    assert_eq!(
        watch.late_renewals.load(Ordering::SeqCst),
        1,
        "the late renewal landed"
    );
    assert!(watch.takeovers.load(Ordering::SeqCst) >= 1);
    let c = f.claim("orphan").await;
    assert_eq!((c.owner.node.as_str(), c.epoch), ("taker", 2));
    let totals = f.nodes[0].journal.totals();
    assert_eq!(totals.get(&EventKind::Fenced), Some(&1), "{totals:?}");
    // The owner's lease is released (by the taker); the owner, waking past
    // its deadline, does not even try to renew.
    let o = inner.get("nodes/owner").await.unwrap().unwrap();
    let r = LeaseRecord::decode("nodes/owner", &o.bytes, Kind::Node).unwrap();
    assert!(r.released);
    assert_eq!(r.attrs.get("released_by"), Some(&"taker".into()));
    let e = owner_lease.renew_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    f.finish().await;
}

/// A claim whose owner's node record is missing from this node's view (the
/// owner registered after our `nodes/` listing) is not orphaned: its record
/// is read first. Here the listing never shows the owner at all, as if every
/// pass raced its registration; its claim must never be taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_by_a_node_missing_from_our_listing_is_not_taken() {
    use async_trait::async_trait;
    use futures::StreamExt;
    use futures::stream::BoxStream;
    use leasehold::store::{Entry, StoreError};

    #[derive(Debug)]
    struct HideFromListing(Arc<dyn Store>);
    impl std::fmt::Display for HideFromListing {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "hide({})", self.0)
        }
    }
    #[async_trait]
    impl leasehold::store::Forward for HideFromListing {
        fn inner(&self) -> &dyn Store {
            &*self.0
        }

        fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
            self.0
                .list(prefix)
                .filter(|e| {
                    let hidden = matches!(e, Ok(e) if e.key == "nodes/late");
                    async move { !hidden }
                })
                .boxed()
        }
    }

    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let mut lease = foreign_claim(&inner, &clock, "late", "theirs").await;
    let mut f = Fleet::new(Arc::new(HideFromListing(inner.clone())));
    f.clock = clock.clone();
    f.start("taker", 8, &[]);
    // A control session shows the taker's loop is claiming meanwhile.
    apply(&inner, "control", &spec("sleep")).await;
    f.wait_for("control placed", |p| p.contains_key("control"))
        .await;
    // Keep the owner alive for several TTLs (it renews; we never list it).
    for _ in 0..8 {
        lease.renew_once().await.unwrap();
        clock.sleep(TTL / 3).await;
    }
    let c = f.claim("theirs").await;
    assert_eq!((c.owner.node.as_str(), c.epoch), ("late", 1), "{c:?}");
    assert!(!f.placement().contains_key("theirs"));
    f.finish().await;
}

/// Peers' node records are read when new and then every `node_refresh`
/// (3 TTLs), not at every listing: an idle 3-node fleet at ttl 10 s makes
/// about 2 peers × 120 reads per node-hour. (A rule meant to spot a stalled
/// peer once read every peer at every idle listing: 3 times as many.)
#[tokio::test(flavor = "current_thread")]
async fn idle_fleet_reads_peer_records_only_every_node_refresh() {
    use leasehold::clock::ManualClock;
    use leasehold::store::CountingStore;
    let clock = ManualClock::new();
    let counting = Arc::new(CountingStore::new(Arc::new(ObjectStoreBackend::memory())));
    let store: Arc<dyn Store> = counting.clone();
    let mut tasks = Vec::new();
    let shutdown = CancellationToken::new();
    for id in ["a", "b", "c"] {
        let mut cfg = NodeConfig::new(Name::new(id).unwrap(), Duration::from_secs(10));
        cfg.probe = false;
        let deps = NodeDeps {
            journal: Arc::new(Journal::new(1000, 1 << 20)),
            ..NodeDeps::new(
                store.clone(),
                Arc::new(clock.clone()),
                Arc::new(RecordingRunner::new(Arc::new(clock.clone()))),
            )
        };
        init_marker(&store).await;
        tasks.push(tokio::spawn(node::run(cfg, deps, shutdown.clone())));
    }
    let step = Duration::from_millis(100);
    let settle = async |n: u32| {
        for _ in 0..n {
            clock.advance(step);
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        }
    };
    settle(300).await; // register and see each other
    let before = counting.counts();
    settle(36_000).await; // one virtual hour
    let used = counting.counts().since(&before);
    // Besides peer records, the audit reads back one in AUDIT_SAMPLE of each
    // node's renewals (its only conditional writes here): count those apart.
    let audits = used.put_match / leasehold::fleet::node::AUDIT_SAMPLE + 3;
    // And each node reads its control object (cordon, drain) once every
    // CONTROL_EVERY passes; a pass lists three prefixes.
    let controls = used.list_pages / 3 / leasehold::fleet::control::CONTROL_EVERY;
    let peer_reads = used.get.saturating_sub(audits + controls);
    assert!(
        used.get >= audits.saturating_sub(6),
        "the audit did not run: {used:?}"
    );
    assert!(peer_reads <= 800, "{used:?}");
    assert!(peer_reads >= 600, "peers are still re-read: {used:?}");
    shutdown.cancel();
    clock.advance(step);
    for t in tasks {
        t.await.unwrap().unwrap();
    }
}

/// A claim deleted while its owner's pass is stuck (its listing of
/// `sessions/` hangs; its renewals go on, so its node lease stays valid).
/// The owner cannot see the deletion, so what ends its session is the
/// confirmation bound: no deadline past its last listing's send time +
/// max(max_poll, ttl) + ttl − margin. The peer, which saw the claim, waits
/// out that much absence (+ margin) before making it again at epoch 2.
/// Without the bound the owner's session runs on beside the peer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_owner_cannot_outlive_the_confirmation_of_its_claims() {
    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use leasehold::store::{Entry, StoreError};
    use std::sync::atomic::{AtomicBool, Ordering};

    #[derive(Debug)]
    struct StallSessions(Arc<dyn Store>, Arc<AtomicBool>, Arc<dyn Clock>);
    impl std::fmt::Display for StallSessions {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "stall({})", self.0)
        }
    }
    #[async_trait]
    impl leasehold::store::Forward for StallSessions {
        fn inner(&self) -> &dyn Store {
            &*self.0
        }

        fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
            use futures::StreamExt;
            let (inner, stall, clock) = (self.0.clone(), self.1.clone(), self.2.clone());
            let prefix = prefix.to_string();
            futures::stream::once(async move {
                while prefix == "sessions/" && stall.load(Ordering::SeqCst) {
                    clock.sleep(Duration::from_millis(10)).await;
                }
                inner.list(&prefix)
            })
            .flatten()
            .boxed()
        }
    }

    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let stall = Arc::new(AtomicBool::new(false));
    let mut f = Fleet::new(inner.clone());
    let owner_store: Arc<dyn Store> =
        Arc::new(StallSessions(inner.clone(), stall.clone(), f.clock.clone()));
    f.start_on(owner_store, "owner", 8, &[]);
    apply(&inner, "web", &spec("sleep")).await;
    f.wait_for("web on owner", |p| {
        p.get("web").is_some_and(|v| v[0].0 == "owner")
    })
    .await;
    f.start("peer", 8, &[]);
    f.wait_registered(2).await;
    stall.store(true, Ordering::SeqCst);
    inner.delete("sessions/web").await.unwrap();
    f.wait_for("web on peer at epoch 2", |p| {
        p.get("web")
            .is_some_and(|v| v.contains(&("peer".to_string(), 2)))
    })
    .await;
    f.assert_never_twice();
    stall.store(false, Ordering::SeqCst);
    f.finish().await;
}

/// The continuous audit: a store that passes the probe and later reports a
/// takeover of a claim committed without writing it (another writer's
/// record stays, at a lower epoch) is caught by the read-back after the
/// takeover. The node stops serving with `Unsupported` at step "audit" and
/// never starts the session it was told it had won.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::disallowed_methods)] // a real-time bound on waiting for the node to stop; nothing is timed
async fn the_audit_refuses_a_store_that_reports_a_takeover_it_did_not_make() {
    use async_trait::async_trait;

    use leasehold::store::{Cond, StoreError, Version};

    #[derive(Debug)]
    struct DropsClaimUpdates(Arc<dyn Store>);
    impl std::fmt::Display for DropsClaimUpdates {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "drops({})", self.0)
        }
    }
    #[async_trait]
    impl leasehold::store::Forward for DropsClaimUpdates {
        fn inner(&self) -> &dyn Store {
            &*self.0
        }

        async fn put(
            &self,
            key: &str,
            bytes: bytes::Bytes,
            cond: Cond,
        ) -> Result<Version, StoreError> {
            if key.starts_with("sessions/") && matches!(cond, Cond::Match(_)) {
                // "Committed", and nothing written.
                return Ok(Version {
                    etag: Some("never-written".into()),
                    version: None,
                });
            }
            self.0.put(key, bytes, cond).await
        }
    }

    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(inner.clone());
    f.start("a", 8, &[]);
    apply(&inner, "web", &spec("sleep")).await;
    f.wait_for("web on a", |p| p.contains_key("web")).await;
    let a = f.nodes.remove(0);
    a.task.abort();
    f.dead.push(a);
    f.start_on(Arc::new(DropsClaimUpdates(inner.clone())), "b", 8, &[]);
    let b = f.nodes.pop().unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), b.task)
        .await
        .expect("b stops serving")
        .unwrap();
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(e.to_string().contains("audit"), "{e}");
    assert!(b.journal.totals().contains_key(&EventKind::StoreViolation));
    assert!(leasehold::fleet::runner::Runner::running(b.runner.as_ref()).is_empty());
    let c = f.claim("web").await;
    assert_eq!((c.owner.node.as_str(), c.epoch), ("a", 1));
}

/// The marker is confirmed before any epoch is issued, not only every few
/// passes: a bucket whose marker was replaced (here: deleted and made again
/// at generation 2, the node records left alone so no renewal fails) gets
/// no claim from a node that served the old one; the node stops serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[allow(clippy::disallowed_methods)] // a real-time bound on waiting for the node to stop; nothing is timed
async fn no_epoch_is_issued_under_a_replaced_marker() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("a", 8, &[]);
    apply(&store, "first", &spec("sleep")).await;
    f.wait_for("first on a", |p| p.contains_key("first")).await;
    store.delete(leasehold::fleet::marker::KEY).await.unwrap();
    leasehold::fleet::marker::init(&store, &leasehold::clock::OsEntropy::new(), 0, 2)
        .await
        .unwrap();
    apply(&store, "second", &spec("sleep")).await;
    let a = f.nodes.pop().unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), a.task)
        .await
        .expect("a stops serving")
        .unwrap();
    let e = r.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Data, "{e}");
    assert!(e.to_string().contains("bucket wiped or replaced"), "{e}");
    let c = f.claim("second").await;
    assert_eq!(
        c.epoch, 0,
        "a claim was made under the new marker by the old node: {c:?}"
    );
    assert!(
        !leasehold::fleet::runner::Runner::running(a.runner.as_ref())
            .iter()
            .any(|(s, _)| s == "second")
    );
}

/// The absence ABA, scripted. A peer whose listings never show a claim
/// (here: blind to `sessions/web`, as when a claim is made again and deleted
/// again between two of its listings) once took that for one long absence
/// and made the claim again after hold + margin from its *first* sight of
/// nothing, while the holder, confirmed long after that first sight, still
/// ran: about half a second of overlap here. Now the peer must first write
/// a marker where the claim was and see that very version unchanged for the
/// hold period; blind, it never sees it, so it never claims; once it sees,
/// the holder's deadline has long passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_blind_to_a_claim_never_makes_it_again_beside_its_holder() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(inner.clone());
    let tampered = |blind: &Arc<AtomicBool>, stall: &Arc<AtomicBool>| -> Arc<dyn Store> {
        Arc::new(Tampered {
            inner: inner.clone(),
            blind: blind.clone(),
            stall: stall.clone(),
            reject_create: Arc::new(AtomicBool::new(false)),
            deny: Arc::new(AtomicBool::new(false)),
            clock: f.clock.clone(),
        })
    };
    let (owner_blind, owner_stall) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (peer_blind, peer_stall) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let owner_store = tampered(&owner_blind, &owner_stall);
    let peer_store = tampered(&peer_blind, &peer_stall);
    f.start_on(owner_store, "owner", 8, &[]);
    apply(&inner, "web", &spec("sleep")).await;
    f.wait_for("web on owner", |p| {
        p.get("web").is_some_and(|v| v[0].0 == "owner")
    })
    .await;
    f.start_on(peer_store, "peer", 8, &[]);
    f.wait_registered(2).await;
    // The peer stops seeing the claim; the owner keeps confirming it for
    // another 600 ms (a TTL), then its pass sticks and the claim is deleted.
    peer_blind.store(true, Ordering::SeqCst);
    f.clock.sleep(TTL).await;
    owner_stall.store(true, Ordering::SeqCst);
    inner.delete(KEY).await.unwrap();
    // Long past the peer's hold + margin from its first sight of nothing,
    // and past the owner's deadline: the old rule overlapped in here.
    f.clock.sleep(TTL * 4).await;
    f.assert_never_twice();
    let runs = f.nodes[1].runner.history();
    assert!(
        runs.iter().all(|r| r.0 != "web"),
        "the blind peer ran web: {runs:?}"
    );
    // Its sight back, the peer watches the marker for the hold period and
    // takes the session over, above the owner's epoch.
    peer_blind.store(false, Ordering::SeqCst);
    f.wait_for("web on peer at epoch 2 or more", |p| {
        p.get("web")
            .is_some_and(|v| v.iter().any(|(n, e)| n == "peer" && *e >= 2))
    })
    .await;
    owner_stall.store(false, Ordering::SeqCst);
    let _ = (&owner_blind, &peer_stall);
    f.finish().await;
}

/// The claim endpoint (the wake path) and a claim deleted under it. A
/// caller's node that had watched the owner's claim for long, asked to claim
/// at once after the claim's deletion, once found it missing by its read,
/// had its marker refused (another node's marker stood there a moment), and
/// then judged the wait by the claim its last listing had cached, long
/// watched: it made the claim with a create, beside the owner. Now a missing
/// claim is declined outright and the stale cache entry dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_claim_endpoint_never_takes_a_missing_claim() {
    use leasehold::fleet::node::ClaimAnswer;
    use std::sync::atomic::{AtomicBool, Ordering};
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(inner.clone());
    let flag = || Arc::new(AtomicBool::new(false));
    let owner_stall = flag();
    f.start_on(
        Arc::new(Tampered {
            inner: inner.clone(),
            blind: flag(),
            stall: owner_stall.clone(),
            reject_create: flag(),
            deny: flag(),
            clock: f.clock.clone(),
        }),
        "owner",
        8,
        &[],
    );
    apply(&inner, "web", &spec("sleep")).await;
    f.wait_for("web on owner", |p| {
        p.get("web").is_some_and(|v| v[0].0 == "owner")
    })
    .await;
    // The caller's node, with a claim endpoint, on a view that can refuse
    // one create.
    let reject = flag();
    let caller_store: Arc<dyn Store> = Arc::new(Tampered {
        inner: inner.clone(),
        blind: flag(),
        stall: flag(),
        reject_create: reject.clone(),
        deny: flag(),
        clock: f.clock.clone(),
    });
    let mut cfg = NodeConfig::new(Name::new("caller").unwrap(), TTL);
    cfg.poll = Duration::from_millis(50);
    cfg.max_poll = Duration::from_millis(100);
    let handle = f.start_caller(caller_store, cfg);
    let runner = f.nodes[1].runner.clone();
    // Long enough for the caller to have watched the owner's claim for
    // more than its hold + margin (1.2 s + 60 ms).
    f.clock.sleep(Duration::from_millis(2000)).await;
    owner_stall.store(true, Ordering::SeqCst);
    reject.store(true, Ordering::SeqCst);
    inner.delete(KEY).await.unwrap();
    let answer = handle.claim_now(&Name::new("web").unwrap()).await.unwrap();
    assert!(
        matches!(&answer, ClaimAnswer::Declined { reason, .. } if reason.contains("vanished")),
        "{answer:?}"
    );
    let runs = runner.history();
    assert!(
        runs.iter().all(|r| r.0 != "web"),
        "the caller ran web: {runs:?}"
    );
    owner_stall.store(false, Ordering::SeqCst);
    f.finish().await;
}

/// The claim endpoint's verdict is the pull loop's (`core::gate`): a
/// cordoned node declines a session it would not take in a pass, and takes
/// it once uncordoned; an unclaimable one is declined with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_claim_endpoint_declines_where_the_pull_loop_would() {
    use leasehold::fleet::node::ClaimAnswer;
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(inner.clone());
    init_marker(&inner).await;
    leasehold::fleet::control::set(&inner, &OsEntropy::new(), "caller", false, 0)
        .await
        .unwrap();
    apply(&inner, "web", &spec("sleep")).await;
    let mut cfg = NodeConfig::new(Name::new("caller").unwrap(), TTL);
    cfg.poll = Duration::from_millis(50);
    cfg.max_poll = Duration::from_millis(100);
    let handle = f.start_caller(inner.clone(), cfg);
    let runner = f.nodes[0].runner.clone();
    f.clock.sleep(Duration::from_millis(500)).await;
    let web = Name::new("web").unwrap();
    let answer = handle.claim_now(&web).await.unwrap();
    assert!(
        matches!(&answer, ClaimAnswer::Declined { reason, .. } if reason.contains("cordoned")),
        "{answer:?}"
    );
    assert!(runner.history().iter().all(|r| r.0 != "web"));
    // Paused: not claimable, whoever asks.
    let mut paused = spec("sleep");
    paused.paused = true;
    apply(&inner, "idle", &paused).await;
    // Uncordoned: the node reads its control object again within a few
    // passes.
    leasehold::fleet::control::clear(&inner, "caller")
        .await
        .unwrap();
    let claimed = async {
        for _ in 0..100 {
            match handle.claim_now(&web).await.unwrap() {
                ClaimAnswer::Claimed { .. } | ClaimAnswer::AlreadyOwned { .. } => return true,
                _ => f.clock.sleep(Duration::from_millis(50)).await,
            }
        }
        false
    };
    assert!(claimed.await, "uncordoned, it takes web");
    let answer = handle.claim_now(&Name::new("idle").unwrap()).await.unwrap();
    assert!(
        matches!(&answer, ClaimAnswer::Declined { reason, .. } if reason == "paused"),
        "{answer:?}"
    );
    f.finish().await;
}

/// One key whose vanished marker cannot be written (the store refuses
/// writes to it) must not stop the pass: every other session is still
/// placed. (The pass once returned the marker write's error, and every pass
/// stopped at that key.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_marker_that_cannot_be_written_stalls_only_its_own_session() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(inner.clone());
    let deny = Arc::new(AtomicBool::new(false));
    f.start_on(
        Arc::new(Tampered {
            inner: inner.clone(),
            blind: Arc::new(AtomicBool::new(false)),
            stall: Arc::new(AtomicBool::new(false)),
            reject_create: Arc::new(AtomicBool::new(false)),
            deny: deny.clone(),
            clock: f.clock.clone(),
        }),
        "n1",
        8,
        &[],
    );
    apply(&inner, "web", &spec("sleep")).await;
    f.wait_for("web on n1", |p| p.contains_key("web")).await;
    deny.store(true, Ordering::SeqCst);
    inner.delete(KEY).await.unwrap();
    // Sorted after `web`, so a pass that stops at web never reaches it.
    apply(&inner, "zeta", &spec("sleep")).await;
    f.wait_for("zeta placed", |p| p.contains_key("zeta")).await;
    deny.store(false, Ordering::SeqCst);
    f.finish().await;
}

mod tampered {
    use super::*;
    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use leasehold::store::{Cond, Entry, Object, StoreError, Version};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A node's view of the bucket, tampered with for the absence tests.
    /// `blind`: listings leave out `sessions/web` and reads of it find
    /// nothing. `stall`: listings of `sessions/` wait (a stuck pass).
    /// `reject_create`: the next create of `sessions/web` is refused without
    /// writing, as when another node's marker stood there a moment (the flag
    /// clears itself). `deny`: every write of it is refused (permissions).
    #[derive(Debug)]
    pub struct Tampered {
        pub inner: Arc<dyn Store>,
        pub blind: Arc<AtomicBool>,
        pub stall: Arc<AtomicBool>,
        pub reject_create: Arc<AtomicBool>,
        pub deny: Arc<AtomicBool>,
        pub clock: Arc<dyn Clock>,
    }
    impl std::fmt::Display for Tampered {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "tampered({})", self.inner)
        }
    }
    pub const KEY: &str = "sessions/web";
    #[async_trait]
    impl leasehold::store::Forward for Tampered {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }

        async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
            if key == KEY && self.blind.load(Ordering::SeqCst) {
                return Ok(None);
            }
            self.inner.get(key).await
        }

        async fn put(
            &self,
            key: &str,
            bytes: bytes::Bytes,
            cond: Cond,
        ) -> Result<Version, StoreError> {
            if key == KEY
                && matches!(cond, Cond::Create)
                && self.reject_create.swap(false, Ordering::SeqCst)
            {
                return Err(StoreError::AlreadyExists);
            }
            if key == KEY && self.deny.load(Ordering::SeqCst) {
                return Err(StoreError::Denied {
                    message: "no write access to this key".into(),
                });
            }
            self.inner.put(key, bytes, cond).await
        }

        fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
            use futures::StreamExt;
            let (inner, blind, stall, clock) = (
                self.inner.clone(),
                self.blind.clone(),
                self.stall.clone(),
                self.clock.clone(),
            );
            let prefix = prefix.to_string();
            futures::stream::once(async move {
                while prefix == "sessions/" && stall.load(Ordering::SeqCst) {
                    clock.sleep(Duration::from_millis(10)).await;
                }
                inner.list(&prefix)
            })
            .flatten()
            .filter(move |e| {
                let hide = blind.load(Ordering::SeqCst) && e.as_ref().is_ok_and(|e| e.key == KEY);
                futures::future::ready(!hide)
            })
            .boxed()
        }
    }
}
use tampered::{KEY, Tampered};

/// A node takes back what it released itself: drained (its claims released
/// in its own name) and uncordoned with no peer to take them, it runs its
/// sessions again. (It once never did: its own released claim read as "ours
/// already", so nobody ran them until the node restarted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drained_node_takes_its_released_sessions_back_when_uncordoned() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("solo", 8, &[]);
    apply(&store, "web", &spec("sleep")).await;
    f.wait_for("web on solo", |p| p.contains_key("web")).await;
    leasehold::fleet::control::set(&store, &OsEntropy::new(), "solo", true, 0)
        .await
        .unwrap();
    f.wait_for("web stopped", |p| !p.contains_key("web")).await;
    let released = f.claim("web").await;
    assert_eq!(released.state, ClaimState::Released, "{released:?}");
    assert_eq!(released.owner.node, "solo");
    leasehold::fleet::control::clear(&store, "solo")
        .await
        .unwrap();
    f.wait_for("web running again", |p| p.contains_key("web"))
        .await;
    let again = f.claim("web").await;
    assert_eq!(again.owner.node, "solo");
    assert!(again.epoch > released.epoch, "{again:?} after {released:?}");
    f.finish().await;
}

/// A claim in a node's own name that the node no longer holds (here: our
/// record rewritten with another nonce, as a late-landing write of ours
/// would leave it) is taken back at the next epoch, not left looking owned
/// by a live node that does not run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_in_our_name_that_we_lost_track_of_is_taken_back() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("solo", 8, &[]);
    apply(&store, "web", &spec("sleep")).await;
    f.wait_for("web on solo", |p| p.contains_key("web")).await;
    let o = store.get("sessions/web").await.unwrap().unwrap();
    let mut twin = ClaimRecord::decode("sessions/web", &o.bytes).unwrap();
    let epoch = twin.epoch;
    twin.nonce = "a-write-of-ours-that-landed-late".into();
    store
        .put(
            "sessions/web",
            bytes::Bytes::from(twin.encode()),
            leasehold::store::Cond::Match(o.version),
        )
        .await
        .unwrap();
    let mut taken_back = None;
    for _ in 0..400 {
        let c = f.claim("web").await;
        if c.epoch > epoch && f.placement().get("web").is_some_and(|r| r[0].1 == c.epoch) {
            taken_back = Some(c);
            break;
        }
        f.clock.sleep(Duration::from_millis(25)).await;
    }
    let c = taken_back.unwrap_or_else(|| panic!("never taken back: {:?}", f.placement()));
    assert_eq!(c.owner.node, "solo");
    f.finish().await;
}

/// A node record deleted under its holder, and a second instance of that
/// node id (another host lock: a misconfigured twin, or the same node
/// started again elsewhere) registering meanwhile: it creates the record
/// where none is, and nothing proves the first instance stopped. Its
/// claims must wait until the first instance's deadline has passed, not be
/// taken at once as a predecessor's. Here the first instance is cut off
/// from the bucket (it cannot even learn its record is gone) and runs its
/// sessions until its own deadline. (Found by the overlap soak with
/// --vandal: 211 ms of two instances of n2 running the same sessions.) Fails
/// with `predecessor_unproven` ignored by the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_node_record_lets_no_twin_take_its_sessions_beside_it() {
    deleted_node_record_and_a_twin(false).await;
}

/// n2 running a, b and c through a store the test can cut off from the
/// bucket (`FaultStore::set_partitioned`); the bucket itself beside.
async fn three_on_n2_behind_a_cut() -> (Fleet, Arc<dyn Store>, Arc<leasehold::store::FaultStore>) {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    let cut = Arc::new(leasehold::store::FaultStore::new(store.clone()));
    f.start_on(cut.clone(), "n2", 8, &[]);
    for s in ["a", "b", "c"] {
        apply(&store, s, &spec("sleep")).await;
    }
    f.wait_for("all three on n2", |p| p.len() == 3).await;
    (f, store, cut)
}

/// The first instance of n2 runs a, b and c, is cut off from the bucket,
/// and its record is deleted; a twin of n2 starts (and, with `third`, a
/// node n3 that first reads `nodes/n2` as the twin's record). Done when the
/// three run off the first instance; `finish` checks that none ran twice
/// at once (the first instance stopped at its own deadline).
async fn deleted_node_record_and_a_twin(third: bool) {
    let (mut f, store, cut) = three_on_n2_behind_a_cut().await;
    cut.set_partitioned(true);
    store.delete("nodes/n2").await.unwrap();
    f.start("n2", 8, &[]);
    f.nodes.last_mut().unwrap().id = "n2-twin".into();
    if third {
        f.start("n3", 8, &[]);
    }
    f.wait_for("all three moved off the first instance", |p| {
        p.len() == 3
            && p.values()
                .all(|r| r.iter().any(|(n, _)| n == "n2-twin" || n == "n3"))
    })
    .await;
    let first = f.nodes.remove(0);
    first.shutdown.cancel();
    first.task.abort();
    f.dead.push(first);
    f.finish().await;
}

/// As above, where the twin registers and at once shuts down cleanly (a
/// misconfigured copy stopped by its operator): its record, created over
/// the deleted one and so unproven, ends released. That ends the twin, and
/// proves nothing about the first instance, which is cut off and runs its
/// sessions until its own deadline: n3 must not take them before then.
/// (`liveness::judge` used to read a released record of another, unproven
/// instance as final: n3 took the three at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_twin_that_registers_and_leaves_proves_nothing_about_the_first_instance() {
    let (mut f, store, cut) = three_on_n2_behind_a_cut().await;
    f.start("n3", 8, &[]);
    f.wait_registered(2).await;
    let first = store.get("nodes/n2").await.unwrap().unwrap().version;
    cut.set_partitioned(true);
    let cut_at = f.clock.now();
    store.delete("nodes/n2").await.unwrap();
    // n3 lists the absence (it then reads whatever record comes next).
    f.clock.sleep(Duration::from_millis(150)).await;
    // The twin, stopped once registered.
    f.start("n2", 8, &[]);
    f.nodes.last_mut().unwrap().id = "n2-twin".into();
    let mut registered = false;
    for _ in 0..5000 {
        if store
            .get("nodes/n2")
            .await
            .unwrap()
            .is_some_and(|o| o.version != first)
        {
            registered = true;
            break;
        }
        f.clock.sleep(Duration::from_millis(2)).await;
    }
    assert!(registered, "the twin registered");
    eprintln!(
        "twin registered {:?} after the cut",
        f.clock.now().saturating_since(cut_at)
    );
    let mut twin = f.nodes.pop().unwrap();
    twin.shutdown.cancel();
    (&mut twin.task).await.unwrap().unwrap();
    let o = store.get("nodes/n2").await.unwrap().unwrap();
    let r =
        leasehold::record::LeaseRecord::decode("nodes/n2", &o.bytes, leasehold::record::Kind::Node)
            .unwrap();
    assert!(
        r.released && leasehold::fleet::attrs::NodeAttrs::of(&r).unproven,
        "the twin left its record released and unproven: {r:?}"
    );
    f.dead.push(twin);
    f.wait_for("all three on n3", |p| {
        p.len() == 3 && p.values().all(|r| r.iter().any(|(n, _)| n == "n3"))
    })
    .await;
    // One fence ends the wait for every session (a tombstone by a peer is
    // final); it once took one tombstone per session, each restarting the
    // wait of every other peer.
    let n3 = f.nodes.iter().find(|n| n.id == "n3").unwrap();
    assert_eq!(
        n3.journal
            .totals()
            .get(&EventKind::Fenced)
            .copied()
            .unwrap_or(0),
        1,
        "tombstones written"
    );
    let first = f.nodes.remove(0);
    first.shutdown.cancel();
    first.task.abort();
    f.dead.push(first);
    f.finish().await;
}

/// As above, with a third node that first reads `nodes/n2` as the twin's
/// record: a record naming another instance used to read as "the first
/// instance is superseded", so the third node took its sessions at once,
/// beside it. The created record says `unproven` until its creator's wait
/// ends, and no node takes it as the first instance's end before then.
/// Fails with `NodeAttrs::unproven` ignored by `plan::owner_live` and
/// `liveness::judge` (n3 ran b at 30 ms beside n2 until 158 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_node_record_lets_no_third_node_take_its_sessions_beside_it() {
    deleted_node_record_and_a_twin(true).await;
}

/// A node keeps only the specs of its own sessions (issue #14), so a
/// session whose manifest turned unreadable cannot be run by a node taking
/// it over: it is not taken (rather than held and never started) until the
/// manifest is readable again, and then it is. Its owner keeps running it
/// meanwhile (bucket_adversary case 5). Fails with the gate's
/// `manifest_corrupt` ignored: n2 takes the claim and starts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_with_an_unreadable_manifest_is_not_taken_over_until_it_reads() {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let mut f = Fleet::new(store.clone());
    f.start("n1", 8, &[]);
    apply(&store, "web", &spec("sleep")).await;
    f.wait_for("web on n1", |p| p.contains_key("web")).await;
    f.start("n2", 8, &[]);
    f.wait_registered(2).await; // and n2 has listed the good manifest
    let good = store.get("manifests/web").await.unwrap().unwrap();
    let bad = store
        .put(
            "manifests/web",
            bytes::Bytes::from_static(b"garbage"),
            leasehold::store::Cond::Match(good.version.clone()),
        )
        .await
        .unwrap();
    f.clock.sleep(Duration::from_millis(300)).await; // n2 lists it
    let before = f.claim("web").await;
    let n1 = f.nodes.remove(0);
    n1.task.abort(); // kill -9
    f.dead.push(n1);
    // Several times ttl + margin: n1 is dead to n2 long before the end.
    f.clock.sleep(TTL * 6).await;
    let held = f.claim("web").await;
    assert_eq!(
        (held.owner.node.as_str(), held.epoch),
        ("n1", before.epoch),
        "taken over with an unreadable manifest: {held:?}"
    );
    store
        .put(
            "manifests/web",
            good.bytes.clone(),
            leasehold::store::Cond::Match(bad),
        )
        .await
        .unwrap();
    f.wait_for("web on n2", |p| {
        p.get("web")
            .is_some_and(|v| v.iter().any(|(n, e)| n == "n2" && *e > before.epoch))
    })
    .await;
    f.finish().await;
}

/// A pass that holds its runtime's only thread for three ttls (CPU work at
/// 100,000 sessions did this to renewals: docs/evidence.md, sessions 16-17)
/// must not cost the node its lease. With a renew thread of its own
/// (`NodeDeps::renew_on`) renewals land while the pass holds the thread, and
/// the node stays registered as the same instance. With the renew task on the
/// pull loop's runtime, as before, none lands: the hazard is real here.
#[tokio::test(flavor = "current_thread")]
async fn renewals_land_while_a_pass_holds_the_pull_loops_only_thread() {
    use async_trait::async_trait;
    use futures::stream::BoxStream;
    use leasehold::fleet::renew_thread::RenewThread;
    use leasehold::store::{Cond, Entry, StoreError, Version};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    /// Once armed, the next listing holds the calling thread (as a long
    /// synchronous pass does) and counts the node's renewals meanwhile.
    #[derive(Debug)]
    struct Hog {
        inner: Arc<dyn Store>,
        armed: AtomicBool,
        hogging: AtomicBool,
        hogged: AtomicU32,
        renewed_meanwhile: AtomicU32,
    }
    impl std::fmt::Display for Hog {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "hog({})", self.inner)
        }
    }
    #[async_trait]
    impl leasehold::store::Forward for Hog {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }

        async fn put(
            &self,
            key: &str,
            bytes: bytes::Bytes,
            cond: Cond,
        ) -> Result<Version, StoreError> {
            let during = self.hogging.load(Ordering::SeqCst);
            let r = self.inner.put(key, bytes, cond).await;
            if during && key == "nodes/hog" && r.is_ok() {
                self.renewed_meanwhile.fetch_add(1, Ordering::SeqCst);
            }
            r
        }

        fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
            if self.armed.swap(false, Ordering::SeqCst) {
                self.hogging.store(true, Ordering::SeqCst);
                std::thread::sleep(TTL * 3);
                self.hogging.store(false, Ordering::SeqCst);
                self.hogged.fetch_add(1, Ordering::SeqCst);
            }
            self.inner.list(prefix)
        }
    }

    /// (renewals landed while the thread was held, journal totals after).
    async fn hogged(renew_on: Option<tokio::runtime::Handle>) -> (u32, BTreeMap<EventKind, u64>) {
        let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
        init_marker(&inner).await;
        let hog = Arc::new(Hog {
            inner,
            armed: AtomicBool::new(false),
            hogging: AtomicBool::new(false),
            hogged: AtomicU32::new(0),
            renewed_meanwhile: AtomicU32::new(0),
        });
        let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
        let mut cfg = NodeConfig::new(Name::new("hog").unwrap(), TTL);
        cfg.probe = false;
        cfg.poll = Duration::from_millis(50);
        cfg.max_poll = Duration::from_millis(100);
        let journal = Arc::new(Journal::new(10_000, 1 << 20));
        let deps = NodeDeps {
            journal: journal.clone(),
            renew_on,
            ..NodeDeps::new(
                hog.clone(),
                clock.clone(),
                Arc::new(RecordingRunner::new(clock.clone())),
            )
        };
        let status = deps.status.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
        let mut waited = 0;
        while !status.snapshot().ready {
            clock.sleep(Duration::from_millis(20)).await;
            waited += 1;
            assert!(waited < 500, "the node never registered");
        }
        hog.armed.store(true, Ordering::SeqCst);
        while hog.hogged.load(Ordering::SeqCst) == 0 {
            clock.sleep(Duration::from_millis(20)).await;
        }
        clock.sleep(TTL * 2).await;
        let totals = journal.totals();
        shutdown.cancel();
        let _ = task.await;
        (hog.renewed_meanwhile.load(Ordering::SeqCst), totals)
    }

    let thread = RenewThread::start("renew-hog").unwrap();
    let (renewed, totals) = hogged(Some(thread.handle())).await;
    // One due every ttl/3 while the thread was held for three ttls: about 9.
    assert!(renewed >= 3, "{renewed} renewals landed; {totals:?}");
    assert_eq!(totals.get(&EventKind::LeaseLost), None, "{totals:?}");
    assert_eq!(totals.get(&EventKind::ReRegistering), None, "{totals:?}");
    // The same node with its renewals on the held thread: none can land.
    let (renewed, _) = hogged(None).await;
    assert_eq!(renewed, 0, "renewals landed on a thread that was held");
}

/// A node whose renew thread is dropped under it (an embedder that lets
/// it go too soon) stops at once as if its lease were lost: it does not run
/// passes back to back until the lease lapses (a closed validity channel
/// ends every pause at once), and `run` returns an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_renew_thread_is_dropped_stops_at_once() {
    use leasehold::fleet::renew_thread::RenewThread;
    use leasehold::store::CountingStore;
    let counting = Arc::new(CountingStore::new(Arc::new(ObjectStoreBackend::memory())));
    let store: Arc<dyn Store> = counting.clone();
    init_marker(&store).await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    // A long ttl: the lease would stay valid for seconds after the drop.
    let mut cfg = NodeConfig::new(Name::new("orphan").unwrap(), Duration::from_secs(6));
    cfg.probe = false;
    let thread = RenewThread::start("renew-orphan").unwrap();
    let deps = NodeDeps {
        renew_on: Some(thread.handle()),
        ..NodeDeps::new(
            store.clone(),
            clock.clone(),
            Arc::new(RecordingRunner::new(clock.clone())),
        )
    };
    let status = deps.status.clone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
    let mut waited = 0;
    while !status.snapshot().ready {
        clock.sleep(Duration::from_millis(20)).await;
        waited += 1;
        assert!(waited < 500, "the node never registered");
    }
    let before = counting.counts().list_pages;
    drop(thread);
    let r = task.await.unwrap();
    let passes = counting.counts().list_pages - before;
    let e = r.expect_err("a node without its renewer must not go on");
    assert!(e.to_string().contains("renew task"), "{e}");
    // One pass in flight at most (three listings each), not a spin.
    assert!(
        passes <= 12,
        "{passes} list pages after the renewer was gone"
    );
    assert!(!status.snapshot().ready);
}

/// A memory bucket made a fleet, with `n` sleepers named `<prefix>00`...
async fn memory_fleet_of(prefix: &str, n: usize) -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    init_marker(&store).await;
    for i in 0..n {
        apply(&store, &format!("{prefix}{i:02}"), &spec("sleep")).await;
    }
    store
}

/// Counts the claim writes (`sessions/` puts) in flight at once: each
/// waits 20 ms before it reaches the store, and the one at `fail_once`
/// fails there once without landing.
#[derive(Debug)]
struct ClaimWrites {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    in_flight: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
    fail_once: std::sync::Mutex<Option<&'static str>>,
    /// When set: the runner whose sessions must all have stopped before
    /// any of their claims is written released; `early` counts those that
    /// had not.
    runner: std::sync::Mutex<Option<Arc<dyn leasehold::fleet::runner::Runner>>>,
    early: std::sync::atomic::AtomicUsize,
}

impl ClaimWrites {
    fn new(inner: Arc<dyn Store>, clock: Arc<dyn Clock>, fail_once: Option<&'static str>) -> Self {
        ClaimWrites {
            inner,
            clock,
            in_flight: Default::default(),
            most: Default::default(),
            fail_once: std::sync::Mutex::new(fail_once),
            runner: Default::default(),
            early: Default::default(),
        }
    }

    /// The most in flight at once since the last call.
    fn take_most(&self) -> usize {
        self.most.swap(0, std::sync::atomic::Ordering::SeqCst)
    }
}

impl std::fmt::Display for ClaimWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait::async_trait]
impl leasehold::store::Forward for ClaimWrites {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn put(
        &self,
        key: &str,
        b: bytes::Bytes,
        c: leasehold::store::Cond,
    ) -> Result<leasehold::store::Version, leasehold::store::StoreError> {
        use std::sync::atomic::Ordering;
        if !key.starts_with("sessions/") {
            return self.inner.put(key, b, c).await;
        }
        let runner = self.runner.lock().unwrap().clone();
        if let Some(runner) = runner
            && let Ok(r) = ClaimRecord::decode(key, &b)
            && r.state == ClaimState::Released
            && !runner.running().is_empty()
        {
            self.early.fetch_add(1, Ordering::SeqCst);
        }
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        self.clock.sleep(Duration::from_millis(20)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let fail = {
            let mut f = self.fail_once.lock().unwrap();
            *f == Some(key) && f.take().is_some()
        };
        if fail {
            return Err(leasehold::store::StoreError::Unavailable {
                message: "injected: not landed".into(),
            });
        }
        self.inner.put(key, b, c).await
    }
}

/// Issue #14: a pass sends its claims several at a time (a claim is two to
/// four round trips, and a survivor taking over a thousand sessions one
/// after the other on S3 took minutes), and every claim that lands is
/// recorded as ours even when another of the same batch fails. Here each
/// claim write waits 20 ms in flight, and the first one fails without
/// landing (its pass ends with the error). Fails with the claims sent one
/// at a time (at most one in flight), and with a batch whose outcomes are
/// applied only up to the failure: the claims that landed after it would
/// stand unknown to their node, which takes them back at epoch 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_sends_its_claims_together_and_keeps_every_one_that_lands() {
    let inner = memory_fleet_of("c", 48).await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let writes = Arc::new(ClaimWrites::new(
        inner.clone(),
        clock.clone(),
        Some("sessions/c00"),
    ));
    let mut f = Fleet::new(writes.clone());
    f.clock = clock;
    f.start("a", 64, &[]);
    f.wait_for("all 48 running", |p| {
        p.len() == 48 && p.values().all(|v| v.len() == 1)
    })
    .await;
    assert!(
        writes.fail_once.lock().unwrap().is_none(),
        "the injected failure happened"
    );
    let most = writes.take_most();
    assert!(most >= 8, "claim writes in flight at once: at most {most}");
    for (name, runs) in f.placement() {
        assert_eq!(runs, vec![("a".to_string(), 1)], "{name}");
    }
    f.finish().await;
}

/// A runner whose stops take 20 ms (a session given time to exit), counting
/// how many are under way at once.
#[derive(Debug)]
struct SlowStops {
    inner: RecordingRunner,
    clock: Arc<dyn Clock>,
    in_flight: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl leasehold::fleet::runner::Runner for SlowStops {
    async fn start(&self, s: leasehold::fleet::runner::SessionStart) -> leasehold::Result<()> {
        self.inner.start(s).await
    }
    fn announce(&self, deadline: leasehold::clock::MonoTime) {
        self.inner.announce(deadline)
    }
    async fn stop(&self, name: &str) -> Option<leasehold::fleet::runner::Exit> {
        use std::sync::atomic::Ordering;
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        self.clock.sleep(Duration::from_millis(20)).await;
        let exit = self.inner.stop(name).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        exit
    }
    fn take_exits(&self) -> Vec<leasehold::fleet::runner::Exit> {
        self.inner.take_exits()
    }
    fn running(&self) -> Vec<(String, u64)> {
        self.inner.running()
    }
}

/// A node shutting down stops its sessions together and then releases
/// their claims together: one after the other, a thousand sessions took a
/// thousand stop graces and, at 30 ms per request, about a minute of claim
/// writes, past most supervisors' stop timeouts. Every session has stopped
/// before any claim is written released, and every claim ends released.
/// Fails with either loop one at a time (at most one in flight), and with
/// the releases sent before the stops have all ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_stops_and_releases_its_sessions_together() {
    use leasehold::fleet::runner::Runner;
    use std::sync::atomic::Ordering;
    let inner = memory_fleet_of("r", 40).await;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let writes = Arc::new(ClaimWrites::new(inner.clone(), clock.clone(), None));
    let runner = Arc::new(SlowStops {
        inner: RecordingRunner::new(clock.clone()),
        clock: clock.clone(),
        in_flight: Default::default(),
        most: Default::default(),
    });
    let mut cfg = NodeConfig::new(Name::new("a").unwrap(), TTL);
    cfg.capacity = 64;
    cfg.poll = Duration::from_millis(50);
    cfg.max_poll = Duration::from_millis(100);
    let deps = NodeDeps::new(writes.clone(), clock.clone(), runner.clone());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
    for _ in 0..400 {
        if runner.running().len() == 40 {
            break;
        }
        clock.sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(runner.running().len(), 40, "all placed");
    writes.take_most();
    *writes.runner.lock().unwrap() = Some(runner.clone());
    shutdown.cancel();
    task.await.unwrap().unwrap();
    let early = writes.early.load(Ordering::SeqCst);
    assert_eq!(early, 0, "claims released while sessions still ran");
    assert!(runner.running().is_empty(), "every session stopped");
    let stops = runner.most.load(Ordering::SeqCst);
    assert!(stops >= 8, "stops under way at once: at most {stops}");
    let releases = writes.take_most();
    assert!(
        releases >= 8,
        "releases in flight at once: at most {releases}"
    );
    for i in 0..40 {
        let name = format!("r{i:02}");
        let o = inner
            .get(&format!("sessions/{name}"))
            .await
            .unwrap()
            .unwrap();
        let c = ClaimRecord::decode(&name, &o.bytes).unwrap();
        assert_eq!(c.state, ClaimState::Released, "{name}");
    }
}

/// A store out of reach when the node starts is probed again with back-off
/// (issue #44): the node serves once it answers, instead of exiting at its
/// first transport error. A refusal still stops it (the probe tests).
#[tokio::test(flavor = "current_thread")]
async fn a_store_out_of_reach_at_start_is_probed_again_until_it_answers() {
    use leasehold::clock::ManualClock;
    use leasehold::store::fault::FaultStore;
    let clock = ManualClock::new();
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    init_marker(&inner).await;
    let faulty = Arc::new(FaultStore::new(inner.clone()));
    faulty.set_partitioned(true);
    let counting = Arc::new(leasehold::store::CountingStore::new(faulty.clone()));
    let store: Arc<dyn Store> = counting.clone();
    let cfg = NodeConfig::new(Name::new("n1").unwrap(), Duration::from_secs(10));
    assert!(cfg.probe);
    let runner = Arc::new(RecordingRunner::new(Arc::new(clock.clone())));
    let status: Arc<leasehold::fleet::node::NodeStatus> = Default::default();
    let deps = NodeDeps {
        journal: Arc::new(Journal::new(1000, 1 << 20)),
        status: status.clone(),
        ..NodeDeps::new(store.clone(), Arc::new(clock.clone()), runner.clone())
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
    let step = async |n: u32| {
        for _ in 0..n {
            clock.advance(Duration::from_millis(100));
            for _ in 0..20 {
                tokio::task::yield_now().await;
            }
        }
    };
    // A virtual minute out of reach: still trying, not ended, and backing
    // off (0.5 s doubling to 30 s, up to half again: 5 to 7 probes, each
    // refused at its first write), not hammering the store.
    step(600).await;
    assert!(!task.is_finished(), "the node gave up: {:?}", task.await);
    assert!(inner.get("nodes/n1").await.unwrap().is_none());
    let probes = counting.counts().put_create;
    assert!(
        (4..=9).contains(&probes),
        "{probes} probes in a virtual minute"
    );
    faulty.set_partitioned(false);
    // Back-off is at most 30 s: registered within a virtual minute more.
    let mut registered = false;
    for _ in 0..600 {
        step(1).await;
        if inner.get("nodes/n1").await.unwrap().is_some() {
            registered = true;
            break;
        }
    }
    assert!(
        registered,
        "the node did not register once the store answered"
    );
    shutdown.cancel();
    step(50).await;
    task.await.unwrap().unwrap();
    // A shutdown during the back-off ends the node at once.
    faulty.set_partitioned(true);
    let cfg = NodeConfig::new(Name::new("n2").unwrap(), Duration::from_secs(10));
    let deps = NodeDeps {
        journal: Arc::new(Journal::new(1000, 1 << 20)),
        ..NodeDeps::new(store.clone(), Arc::new(clock.clone()), runner.clone())
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
    step(100).await;
    assert!(!task.is_finished());
    shutdown.cancel();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(task.is_finished(), "still waiting out its back-off");
    task.await.unwrap().unwrap();
}

/// Issue #39: alarms fire once each with the bucket as adversary: 5% of
/// requests under every node fail before reaching it and 5% land and lose
/// their reply, and a node is killed (aborted, as kill -9) half-way and
/// replaced. Eight sessions sleep on exit 75; each round puts them all to
/// sleep and sets an alarm for each 5 s ahead; every alarm must bring
/// exactly one new run, and none more afterwards. Virtual time. Without
/// the take step (an alarm released by whoever reads it sleeping), a slow
/// reader wakes a session that an earlier firing put back to sleep.
#[tokio::test(flavor = "current_thread")]
async fn alarms_fire_once_each_under_faults_and_a_kill() {
    let late = alarm_rounds(true, 6).await;
    eprintln!("alarms under faults: fired at most {late:?} after their time");
}

/// Issue #39's bound, with a kill but no bucket faults: each alarm is
/// fired (its sleeping claim released) within ttl + 2 s of its time,
/// the round after n1 is killed (-9) included: its place is taken by the
/// next-ranked node a poll interval (ttl/3) later.
#[tokio::test(flavor = "current_thread")]
async fn alarms_fire_within_ttl_and_2s_across_a_kill() {
    let late = alarm_rounds(false, 6).await;
    let bound = Duration::from_secs(10) + Duration::from_secs(2);
    eprintln!("alarms: fired at most {late:?} after their time");
    assert!(late <= bound, "{late:?} > {bound:?}");
}

/// Runs `rounds` rounds of eight alarms (see above); returns the latest an
/// alarm fired (its claim left `sleeping`) after its time.
async fn alarm_rounds(faults: bool, rounds: usize) -> Duration {
    use leasehold::fleet::alarm;
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    let p = if faults { 0.05 } else { 0.0 };
    let faulty = |f: &FeedFleet, seed: u64| f.faulty(seed, p, 0.0);
    for (i, id) in ["n1", "n2", "n3"].iter().enumerate() {
        let store = faulty(&f, i as u64 + 1);
        f.start(id, Duration::from_secs(600), store);
    }
    let mut s = spec("sleep");
    s.restart = leasehold::fleet::manifest::RestartPolicy::Always.into();
    s.sleep = Some(leasehold::fleet::sleep::SleepRule {
        after_idle: None,
        on_exit: Some(75),
    });
    let names: Vec<String> = (0..8).map(|i| format!("s{i:02}")).collect();
    let writer = f.hinting(100, 0.0);
    for n in &names {
        apply(&writer, n, &s).await;
    }
    let runs_of = |f: &FeedFleet, name: &str| {
        f.nodes
            .iter()
            .flat_map(|n| n.runner.history())
            .filter(|r| r.0 == name)
            .count()
    };
    let mut late = Duration::ZERO;
    for round in 0..rounds {
        // Every session asleep: those running are made to exit 75.
        let mut asleep = false;
        for _ in 0..600 {
            f.exit_running(75);
            f.step(1).await;
            let mut all = true;
            for n in &names {
                let c = claim_of(&f.bucket, n).await;
                all &= c.state == ClaimState::Sleeping;
            }
            if all {
                asleep = true;
                break;
            }
        }
        assert!(asleep, "round {round}: all asleep");
        let before: Vec<usize> = names.iter().map(|n| runs_of(&f, n)).collect();
        let at_ms = f.dyn_clock.wall_ms() + 5_000;
        for n in &names {
            alarm::set(
                &f.bucket,
                &leasehold::clock::OsEntropy::new(),
                &Name::new(n.as_str()).unwrap(),
                at_ms,
                f.dyn_clock.wall_ms(),
            )
            .await
            .unwrap();
        }
        if round == 3 {
            // kill -9 of n1 as the alarms are set (the first-ranked node
            // for some of them), and a fresh node in its place.
            f.nodes[0].task.abort();
            let store = faulty(&f, 50);
            f.start("n4", Duration::from_secs(600), store);
        }
        let mut woken = vec![None; names.len()];
        for _ in 0..1200 {
            f.step(1).await;
            for (k, n) in names.iter().enumerate() {
                if woken[k].is_none() && claim_of(&f.bucket, n).await.state != ClaimState::Sleeping
                {
                    woken[k] = Some(f.dyn_clock.wall_ms());
                }
            }
            if woken.iter().all(Option::is_some) {
                break;
            }
        }
        for (k, w) in woken.iter().enumerate() {
            let w = w.unwrap_or_else(|| panic!("round {round}: {} never woken", names[k]));
            assert!(w >= at_ms, "round {round}: {} woken early", names[k]);
            late = late.max(Duration::from_millis(w - at_ms));
        }
        // Each runs again (placement after the release)...
        assert!(
            f.step_until(1200, || names
                .iter()
                .enumerate()
                .all(|(k, n)| runs_of(&f, n) > before[k]))
                .await,
            "round {round}: not every woken session ran"
        );
        // Settle: no second run for the same alarm. Under faults, each run
        // falls asleep again at once, so that a node still acting on the
        // alarm with a late reply (a read held up to 20 s) would find it
        // sleeping again at a higher epoch.
        for _ in 0..200 {
            if faults {
                f.exit_running(75);
            }
            f.step(1).await;
        }
        for (k, n) in names.iter().enumerate() {
            assert_eq!(
                runs_of(&f, n),
                before[k] + 1,
                "round {round}: {n} woken twice"
            );
        }
    }
    let left: Vec<_> = {
        use futures::StreamExt;
        f.bucket
            .list(alarm::ALARMS)
            .map(|e| e.unwrap().key)
            .collect::<Vec<_>>()
            .await
    };
    assert!(left.is_empty(), "{left:?}");
    if faults {
        // A clean shutdown through a faulty bucket retries on the virtual
        // clock, which `finish` no longer steps: end them as kill -9.
        for n in &f.nodes {
            n.task.abort();
        }
    } else {
        f.finish().await;
    }
    late
}

/// Issue #39's cron target: 1,000 ticks (50 sessions, every minute, for 20
/// minutes, `concurrency: forbid`) on three nodes whose stores fail, land
/// then fail (a lost reply), or hold up (to 20 s) 5% of their requests
/// each, with hints lost too, n1 killed (-9) at minute 10 and n4 started
/// in its place. Every tick is decided once (`ticks/`); each tick decided
/// `start` from epoch E runs exactly once, at epoch E + 1; no run has any
/// other epoch; and nearly every tick starts (a skip needs the last run's
/// end still unwritten a minute later). Fails with "run twice" when a
/// start's release is not fenced by the epoch it found at rest.
#[tokio::test(flavor = "current_thread")]
async fn cron_runs_each_tick_once_under_faults_and_a_kill() {
    use leasehold::fleet::cron::{self, Concurrency, Decision, Schedule};
    const SESSIONS: usize = 50;
    const TICKS: u64 = 20;
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    let faulty = |f: &FeedFleet, seed: u64| f.faulty(seed, 0.05, 0.05);
    let capacious = |cfg: &mut NodeConfig| cfg.capacity = 200;
    for (i, id) in ["n1", "n2", "n3"].iter().enumerate() {
        let store = faulty(&f, i as u64 + 1);
        f.start_with(id, store, capacious);
    }
    let mut s = spec("job");
    s.restart = leasehold::fleet::manifest::RestartPolicy::Never.into();
    s.schedule = Some(Schedule {
        cron: "* * * * *".into(),
        time_zone: None,
        concurrency: Concurrency::Forbid,
        starting_deadline: None,
    });
    f.apply_sessions(SESSIONS, &s).await;
    let names: Vec<String> = (0..SESSIONS).map(|i| format!("s{i:02}")).collect();
    // The first tick is the next minute's start after the applies.
    let first = (f.dyn_clock.wall_ms() / 60_000 + 1) * 60_000;
    let last = first + (TICKS - 1) * 60_000;
    // Every run seen, by (session, epoch): how many times it started.
    let mut killed = false;
    // Until the last tick's runs are over (the next tick would trim the
    // first's record: 20 are kept).
    while f.dyn_clock.wall_ms() < last + 45_000 {
        f.step(1).await;
        f.exit_running(0);
        if !killed && f.dyn_clock.wall_ms() >= first + 10 * 60_000 - 15_000 {
            // kill -9 of n1 a quarter of a minute before a tick (its runs
            // of the last one long ended), and a fresh node in its place.
            killed = true;
            f.nodes[0].task.abort();
            let store = faulty(&f, 50);
            f.start_with("n4", store, capacious);
        }
    }
    // Ended as kill -9: a clean shutdown through a faulty bucket retries
    // on the virtual clock, which no longer steps.
    for n in &f.nodes {
        n.task.abort();
    }
    // Every run every node's runner started (ended or not), by (session,
    // epoch): how many times.
    let mut runs: BTreeMap<(String, u64), u32> = BTreeMap::new();
    for node in &f.nodes {
        for (n, e, _, _) in node.runner.history() {
            *runs.entry((n, e)).or_default() += 1;
        }
    }
    let mut started = 0;
    let mut decided = 0;
    for n in &names {
        let ticks = cron::recent(&f.bucket, &Name::new(n.as_str()).unwrap())
            .await
            .unwrap();
        // The epochs each started tick found at rest, in tick order.
        let mut from: Vec<u64> = Vec::new();
        for t in ticks.iter().rev() {
            assert!(
                t.tick_ms >= first && t.tick_ms <= last,
                "{n}: tick {}",
                t.tick_ms
            );
            decided += 1;
            if let Decision::Start { from_epoch, .. } = t.decision {
                from.push(from_epoch);
            }
        }
        assert!(from.windows(2).all(|w| w[0] < w[1]), "{n}: {from:?}");
        started += from.len();
        // Each started tick ran once: exactly one run above the epoch it
        // found at rest and at or below the one the next start found (a
        // claim write whose reply was lost moves the epoch up without a
        // run, so the run is not always at that epoch + 1). No run below
        // the first start, none twice at one epoch.
        let ran: Vec<(u64, u32)> = runs
            .iter()
            .filter(|((s, _), _)| s == n)
            .map(|((_, e), c)| (*e, *c))
            .collect();
        for (e, c) in &ran {
            assert_eq!(*c, 1, "{n}: epoch {e} run twice (on two nodes)");
            assert!(
                from.first().is_some_and(|f| e > f),
                "{n}: run at epoch {e} before any tick started it ({from:?})"
            );
        }
        for (k, f0) in from.iter().enumerate() {
            let upto = from.get(k + 1).copied().unwrap_or(u64::MAX);
            let in_window = ran.iter().filter(|(e, _)| e > f0 && *e <= upto).count();
            assert_eq!(
                in_window, 1,
                "{n}: the tick that started from epoch {f0} ran {in_window} times (runs {ran:?}, starts {from:?})"
            );
        }
    }
    eprintln!("cron: {decided} ticks decided, {started} started, over {SESSIONS} sessions");
    assert_eq!(
        decided,
        SESSIONS * TICKS as usize,
        "every tick decided once"
    );
    assert!(
        started * 100 >= decided * 95,
        "{started} of {decided} started"
    );
}

/// A scheduled session waits for its first tick, and the concurrency
/// policies do what docs/fleet.md says when a tick finds the last run
/// still going: `forbid` skips the tick, `replace` stops the run (its node
/// releases it) and starts anew, `allow` starts once the run has ended. A
/// paused one's tick is skipped, and one looked at past its
/// `starting_deadline` is missed.
#[tokio::test(flavor = "current_thread")]
async fn cron_concurrency_policies_and_deadlines() {
    use leasehold::fleet::cron::{self, Concurrency, Decision, Schedule};
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    for (i, id) in ["n1", "n2"].iter().enumerate() {
        let store = f.hinting(i as u64 + 1, 0.0);
        f.start(id, Duration::from_secs(600), store);
    }
    let writer = f.hinting(100, 0.0);
    let sched = |c: Concurrency| {
        let mut s = spec("job");
        s.restart = RestartPolicy::Never.into();
        s.schedule = Some(Schedule {
            cron: "* * * * *".into(),
            time_zone: None,
            concurrency: c,
            starting_deadline: None,
        });
        s
    };
    apply(&writer, "forbid", &sched(Concurrency::Forbid)).await;
    apply(&writer, "replace", &sched(Concurrency::Replace)).await;
    apply(&writer, "allow", &sched(Concurrency::Allow)).await;
    let mut paused = sched(Concurrency::Forbid);
    paused.paused = true;
    apply(&writer, "paused", &paused).await;
    let first = (f.dyn_clock.wall_ms() / 60_000 + 1) * 60_000;
    let runs_of = |f: &FeedFleet, name: &str| {
        f.nodes
            .iter()
            .flat_map(|n| n.runner.history())
            .filter(|r| r.0 == name)
            .count()
    };
    // Nothing runs before the first tick.
    while f.dyn_clock.wall_ms() < first - 1_000 {
        f.step(1).await;
    }
    for n in ["forbid", "replace", "allow", "paused"] {
        assert_eq!(runs_of(&f, n), 0, "{n} ran before its first tick");
    }
    // The first tick starts each; the runs go on past the second tick.
    while f.dyn_clock.wall_ms() < first + 70_000 {
        f.step(1).await;
    }
    assert_eq!(runs_of(&f, "forbid"), 1);
    assert_eq!(runs_of(&f, "allow"), 1, "allow waits for the run to end");
    assert_eq!(
        runs_of(&f, "replace"),
        2,
        "replace stopped the first run and started anew"
    );
    assert_eq!(runs_of(&f, "paused"), 0);
    // The runs end: allow's second tick starts now, once.
    f.exit_running(0);
    while f.dyn_clock.wall_ms() < first + 100_000 {
        f.step(1).await;
        f.exit_running(0);
    }
    assert_eq!(
        runs_of(&f, "allow"),
        2,
        "allow ran the second tick after the first run"
    );
    assert_eq!(runs_of(&f, "forbid"), 1);
    // The third tick: all at rest, each starts once.
    while f.dyn_clock.wall_ms() < first + 150_000 {
        f.step(1).await;
        f.exit_running(0);
    }
    assert_eq!(runs_of(&f, "forbid"), 2);
    assert_eq!(runs_of(&f, "allow"), 3);
    assert_eq!(runs_of(&f, "replace"), 3);
    let bucket = f.bucket.clone();
    let decisions = |name: &'static str| {
        let bucket = bucket.clone();
        async move {
            let mut t = cron::recent(&bucket, &Name::new(name).unwrap())
                .await
                .unwrap();
            t.reverse();
            t.into_iter()
                .map(|t| {
                    assert!((t.tick_ms - first).is_multiple_of(60_000));
                    t.decision
                })
                .collect::<Vec<_>>()
        }
    };
    let f_ = decisions("forbid").await;
    assert!(
        matches!(f_[0], Decision::Start { from_epoch: 0, .. }),
        "{f_:?}"
    );
    assert!(
        matches!(&f_[1], Decision::Skip { reason } if reason.contains("still going")),
        "{f_:?}"
    );
    assert!(matches!(f_[2], Decision::Start { .. }), "{f_:?}");
    let r = decisions("replace").await;
    assert!(matches!(r[1], Decision::Replace { epoch: 1 }), "{r:?}");
    let a = decisions("allow").await;
    assert!(
        a.iter().all(|d| matches!(d, Decision::Start { .. })),
        "{a:?}"
    );
    let p = decisions("paused").await;
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(
        p.iter()
            .all(|d| matches!(d, Decision::Skip { reason } if reason.contains("paused"))),
        "{p:?}"
    );
    // A deadline: with every node down over a tick, the tick is looked at
    // late when a node comes back, and recorded missed, not run.
    let mut late = sched(Concurrency::Forbid);
    if let Some(s) = late.schedule.as_mut() {
        s.starting_deadline = Some(Duration::from_secs(5));
    }
    let name = Name::new("forbid").unwrap();
    let (_, v) = manifest::get(&writer, &name).await.unwrap().unwrap();
    manifest::apply(&writer, &OsEntropy::new(), &name, &late, Some(&v))
        .await
        .unwrap();
    f.step(50).await;
    for n in &f.nodes {
        n.task.abort();
    }
    let next = (f.dyn_clock.wall_ms() / 60_000 + 1) * 60_000;
    while f.dyn_clock.wall_ms() < next + 20_000 {
        f.step(10).await;
    }
    let store = f.hinting(7, 0.0);
    f.start("n3", Duration::from_secs(600), store);
    f.step(100).await;
    let d = decisions("forbid").await;
    assert!(matches!(d.last(), Some(Decision::Missed)), "{d:?}");
    assert_eq!(runs_of(&f, "forbid"), 2, "a missed tick does not run");
    for n in &f.nodes {
        n.task.abort();
    }
}

/// A tick's run is fenced by the claim itself, not by its record: with
/// every tick record deleted and every node replaced by one that never saw
/// the tick, the tick is not run again; a session deleted and applied
/// again does not run at the apply (its tombstone is at rest), nor for the
/// tick recorded before (that start names another claim); and each later
/// tick runs once. Fails without the tick carried on the claim (a second
/// run after the records are deleted) or without the start naming the
/// claim it found (a run at the re-apply).
#[tokio::test(flavor = "current_thread")]
async fn cron_needs_no_record_to_run_a_tick_once_and_a_reapply_waits() {
    use leasehold::fleet::cron::{Concurrency, Schedule};
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    let start_two = |f: &mut FeedFleet, a: &str, b: &str| {
        for (i, id) in [a, b].iter().enumerate() {
            let store = f.hinting(i as u64 + 1, 0.0);
            f.start(id, Duration::from_secs(600), store);
        }
    };
    start_two(&mut f, "n1", "n2");
    let writer = f.hinting(100, 0.0);
    let mut s = spec("job");
    s.restart = RestartPolicy::Never.into();
    s.schedule = Some(Schedule {
        cron: "* * * * *".into(),
        time_zone: None,
        concurrency: Concurrency::Forbid,
        starting_deadline: None,
    });
    apply(&writer, "job", &s).await;
    let runs = |f: &FeedFleet| {
        f.nodes
            .iter()
            .flat_map(|n| n.runner.history())
            .filter(|r| r.0 == "job")
            .count()
    };
    let until = async |f: &FeedFleet, wall: u64| {
        while f.dyn_clock.wall_ms() < wall {
            f.step(1).await;
            f.exit_running(0);
        }
    };
    let kill_all = |f: &FeedFleet| {
        for n in &f.nodes {
            n.task.abort();
        }
    };
    let delete_ticks = async |f: &FeedFleet| {
        use futures::StreamExt;
        let keys: Vec<String> = f
            .bucket
            .list("ticks/")
            .map(|e| e.unwrap().key)
            .collect()
            .await;
        for k in &keys {
            f.bucket.delete(k).await.unwrap();
        }
        keys.len()
    };
    let first = (f.dyn_clock.wall_ms() / 60_000 + 1) * 60_000;
    until(&f, first + 30_000).await;
    assert_eq!(runs(&f), 1, "the first tick ran");
    // Every record gone, every node replaced: nothing runs again for it.
    assert_eq!(delete_ticks(&f).await, 1);
    kill_all(&f);
    start_two(&mut f, "n3", "n4");
    until(&f, first + 55_000).await;
    assert_eq!(runs(&f), 1, "the first tick ran again without its record");
    until(&f, first + 90_000).await;
    assert_eq!(runs(&f), 2, "the second tick ran once");
    // Deleted and applied again: its tombstone rests until the next tick.
    let name = Name::new("job").unwrap();
    manifest::delete(&writer, &name).await.unwrap();
    until(&f, first + 100_000).await;
    apply(&writer, "job", &s).await;
    until(&f, first + 115_000).await;
    assert_eq!(runs(&f), 2, "a re-apply over its tombstone ran it");
    until(&f, first + 150_000).await;
    assert_eq!(runs(&f), 3, "the third tick ran once");
    // Deleted with its claim (as gc removes a tombstone) and applied again:
    // the next tick starts its placeholder (epoch 0) and runs. Then the
    // same again within that minute, looked at by nodes that never saw
    // it: that tick's record names the placeholder it released, not the
    // new one, which waits for the next tick.
    let again = async |f: &FeedFleet| {
        kill_all(f);
        manifest::delete(&writer, &name).await.unwrap();
        f.bucket.delete("sessions/job").await.unwrap();
        apply(&writer, "job", &s).await;
    };
    again(&f).await;
    start_two(&mut f, "n5", "n6");
    until(&f, first + 210_000).await;
    assert_eq!(runs(&f), 4, "the fourth tick ran its new placeholder");
    again(&f).await;
    start_two(&mut f, "n7", "n8");
    until(&f, first + 235_000).await;
    assert_eq!(
        runs(&f),
        4,
        "the fourth tick's start was followed on the new placeholder"
    );
    until(&f, first + 270_000).await;
    assert_eq!(runs(&f), 5, "the fifth tick ran once");
    kill_all(&f);
}

/// Issue #39's concurrent-wake target: 1,000 wakes at once, spread over
/// 100 sleeping sessions and five nodes (three in four through a node's
/// claim endpoint, as `POST /v1/sessions/{name}/wake` does, the rest from
/// clients with no node, which release the claim for placement): every
/// session starts exactly once, and every caller is answered `ready` with
/// that run's epoch.
#[tokio::test(flavor = "current_thread")]
async fn a_thousand_concurrent_wakes_start_each_sleeping_session_once() {
    use leasehold::wake::{Ready, Resolver};
    const SESSIONS: usize = 100;
    const WAKES: usize = 1_000;
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    let mut handles = Vec::new();
    for i in 0..5u64 {
        let store = f.hinting(i + 1, 0.0);
        handles.push(f.start_claiming(&format!("n{}", i + 1), store, |cfg| {
            cfg.capacity = SESSIONS as u32
        }));
    }
    let mut s = spec("serve");
    s.restart = RestartPolicy::Always.into();
    s.sleep = Some(leasehold::fleet::sleep::SleepRule {
        after_idle: None,
        on_exit: Some(75),
    });
    f.apply_sessions(SESSIONS, &s).await;
    let names: Vec<String> = (0..SESSIONS).map(|i| format!("s{i:02}")).collect();
    // Each runs once and asks to sleep (exit 75).
    let mut asleep = false;
    for _ in 0..1200 {
        f.exit_running(75);
        f.step(1).await;
        let mut all = true;
        for n in &names {
            all &= claim_of(&f.bucket, n).await.state == ClaimState::Sleeping;
        }
        if all {
            asleep = true;
            break;
        }
    }
    assert!(asleep, "every session asleep");
    let runs_before: usize = f.nodes.iter().map(|n| n.runner.history().len()).sum();
    assert_eq!(runs_before, SESSIONS);
    // 1,000 wakes at once.
    let mut tasks = Vec::new();
    for i in 0..WAKES {
        let name = Name::new(names[i % SESSIONS].as_str()).unwrap();
        let mut r = Resolver::new(f.hinting(1000 + i as u64, 0.0)).with_clock(f.dyn_clock.clone());
        if i % 4 != 3 {
            r = r.with_claimer(handles[(i * 7 / 3) % 5].clone());
        }
        tasks.push(tokio::spawn(async move {
            let ready = r.wake_ready(&name, Duration::from_secs(60)).await;
            (name, ready)
        }));
    }
    for _ in 0..1200 {
        if tasks.iter().all(|t| t.is_finished()) {
            break;
        }
        f.step(1).await;
    }
    let mut epochs: BTreeMap<String, std::collections::BTreeSet<u64>> = BTreeMap::new();
    for t in tasks {
        assert!(t.is_finished(), "a wake never answered");
        let (name, r) = t.await.unwrap();
        match r.unwrap() {
            Ready::Ready { epoch, .. } => {
                epochs.entry(name.to_string()).or_default().insert(epoch);
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(epochs.len(), SESSIONS);
    for (n, e) in &epochs {
        assert_eq!(e.len(), 1, "{n}: callers answered with epochs {e:?}");
        let c = claim_of(&f.bucket, n).await;
        assert_eq!(
            (c.state, Some(c.epoch)),
            (ClaimState::Running, e.first().copied()),
            "{n}"
        );
    }
    // Each session started once more: one run each, at that epoch.
    let mut runs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for node in &f.nodes {
        for (n, e, _, _) in node.runner.history() {
            if e > 1 {
                runs.entry(n).or_default().push(e);
            }
        }
    }
    for n in &names {
        let woke = epochs[n].first().copied();
        assert_eq!(
            runs.get(n).map(Vec::as_slice),
            woke.as_ref().map(std::slice::from_ref),
            "{n}: runs after the wakes"
        );
    }
    for n in &f.nodes {
        n.task.abort();
    }
}

/// Issue #39's wake budget, counted where it is spent: a wake of a
/// sleeping session through the caller's own node (as `POST
/// /v1/sessions/{name}/wake` makes one) is the resolve's GET of its claim
/// and one conditional write of it, and the caller is answered then: the
/// node reads neither the claim nor the manifest nor the fleet marker first,
/// and the audit's read-back after the write is held here until the answer
/// came. Every caller of a second, concurrent wake gets the same epoch.
/// With a node that re-read the claim before writing (the release-then-
/// claim path this replaced), the counts differ.
#[tokio::test(flavor = "current_thread")]
async fn a_wake_of_a_sleeping_session_is_one_resolve_and_one_write() {
    use leasehold::store::{Cond, Object, StoreError, Version};
    use leasehold::wake::{Ready, Resolver, WakeOutcome};
    use std::sync::Mutex;
    /// Records each request of the node (op, key); a GET of `sessions/s00`
    /// made after a write of it logged at or after `hold` (an index in the
    /// log) waits for `go`.
    #[derive(Debug)]
    struct Ledger {
        inner: Arc<dyn Store>,
        log: Mutex<Vec<(&'static str, String)>>,
        hold: std::sync::atomic::AtomicUsize,
        go: tokio::sync::Semaphore,
    }
    impl std::fmt::Display for Ledger {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{}", self.inner)
        }
    }
    impl Ledger {
        fn note(&self, op: &'static str, key: &str) {
            self.log.lock().unwrap().push((op, key.to_string()));
        }
        fn count(&self, from: usize, op: &str, key: &str) -> usize {
            self.log.lock().unwrap()[from..]
                .iter()
                .filter(|(o, k)| *o == op && k == key)
                .count()
        }
        /// Requests `op` of `key` after `from` and before the first write
        /// of `sessions/s00`.
        fn before_write(&self, from: usize, op: &str, key: &str) -> usize {
            let log = self.log.lock().unwrap();
            log[from..]
                .iter()
                .take_while(|(o, k)| !(*o == "put" && k == "sessions/s00"))
                .filter(|(o, k)| *o == op && k == key)
                .count()
        }
    }
    #[async_trait::async_trait]
    impl leasehold::store::Forward for Ledger {
        fn inner(&self) -> &dyn Store {
            &*self.inner
        }
        async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
            let from = self.hold.load(std::sync::atomic::Ordering::SeqCst);
            let written = self
                .log
                .lock()
                .unwrap()
                .iter()
                .skip(from)
                .any(|(o, k)| *o == "put" && k == key);
            self.note("get", key);
            if key == "sessions/s00" && written {
                let _ = self.go.acquire().await.unwrap();
            }
            self.inner.get(key).await
        }
        async fn get_if_changed(
            &self,
            key: &str,
            known: &Version,
        ) -> Result<leasehold::store::Conditional, StoreError> {
            self.note("get_if_changed", key);
            self.inner.get_if_changed(key, known).await
        }
        async fn put(
            &self,
            key: &str,
            bytes: bytes::Bytes,
            cond: Cond,
        ) -> Result<Version, StoreError> {
            self.note("put", key);
            self.inner.put(key, bytes, cond).await
        }
    }
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    let ledger = Arc::new(Ledger {
        inner: f.bucket.clone(),
        log: Mutex::new(Vec::new()),
        hold: usize::MAX.into(),
        go: tokio::sync::Semaphore::new(0),
    });
    let store = f.hinting_over(ledger.clone(), 1, 0.0);
    let handle = f.start_claiming("n1", store, |_| {});
    let mut s = spec("serve");
    s.restart = RestartPolicy::Always.into();
    s.sleep = Some(leasehold::fleet::sleep::SleepRule {
        after_idle: None,
        on_exit: Some(75),
    });
    s.port = Some(8080);
    f.apply_sessions(1, &s).await;
    let asleep = |f: &FeedFleet| {
        let bucket = f.bucket.clone();
        async move { claim_of(&bucket, "s00").await.state == ClaimState::Sleeping }
    };
    let mut slept = false;
    for _ in 0..300 {
        f.exit_running(75);
        f.step(1).await;
        if f.nodes[0].runner.history().len() == 1 && asleep(&f).await {
            slept = true;
            break;
        }
    }
    assert!(slept, "s00 ran once and fell asleep");
    let before = claim_of(&f.bucket, "s00").await.epoch;
    let name = Name::new("s00").unwrap();
    let resolver = Resolver::new(f.bucket.clone())
        .with_clock(f.dyn_clock.clone())
        .with_claimer(handle.clone());
    let from = ledger.log.lock().unwrap().len();
    ledger.hold.store(from, std::sync::atomic::Ordering::SeqCst);
    let woken = {
        let name = name.clone();
        tokio::spawn(async move { resolver.wake(&name, Duration::from_secs(1)).await })
    };
    let answered = f.step_until(50, || woken.is_finished()).await;
    // Answered; the audit's read-back of the write (and all after it, the
    // spec's read and the start) still held.
    let puts = ledger.count(from, "put", "sessions/s00");
    let reads = ["sessions/s00", "manifests/s00", leasehold::keys::MARKER].map(|k| {
        ledger.before_write(from, "get", k) + ledger.before_write(from, "get_if_changed", k)
    });
    let spec_reads = ledger.count(from, "get", "manifests/s00");
    // The claim as written says what the spec decides (its endpoint),
    // though the node wrote it without the spec at hand.
    let written = claim_of(&f.bucket, "s00").await;
    ledger
        .hold
        .store(usize::MAX, std::sync::atomic::Ordering::SeqCst);
    ledger.go.add_permits(1000);
    assert!(
        answered,
        "the wake was not answered before its claim's audit read-back"
    );
    let w = woken.await.unwrap().unwrap();
    let epoch = match &w.outcome {
        WakeOutcome::ClaimedHere { node, epoch } => {
            assert_eq!(node, "n1");
            *epoch
        }
        other => panic!("{other:?}"),
    };
    assert!(
        epoch > before,
        "the run's token is above the sleeping claim's"
    );
    assert!(w.woken);
    // The resolve's one GET, and the node's one write: nothing else.
    assert_eq!(w.round_trips, 2, "{w:?}");
    assert_eq!(puts, 1, "one write of the claim");
    assert_eq!(
        reads,
        [0, 0, 0],
        "the node's reads of the claim, the manifest and the marker before its write"
    );
    assert_eq!(spec_reads, 0, "answered before the spec was read");
    assert_eq!(
        (
            written.state,
            written.epoch,
            written
                .endpoint
                .as_ref()
                .is_some_and(|e| e.ends_with(":8080"))
        ),
        (ClaimState::Running, epoch, true),
        "{written:?}"
    );
    // A second wake, at once: the same run, no write.
    let again = Resolver::new(f.bucket.clone())
        .with_clock(f.dyn_clock.clone())
        .with_claimer(handle);
    let from = ledger.log.lock().unwrap().len();
    let r = again.wake_ready(&name, Duration::ZERO).await.unwrap();
    assert!(
        matches!(&r, Ready::Ready { node, epoch: e, woken: false, .. } if node == "n1" && *e == epoch),
        "{r:?}"
    );
    assert_eq!(ledger.count(from, "put", "sessions/s00"), 0);
    // It starts once, at that epoch.
    assert!(
        f.step_until(100, || f.nodes[0].runner.history().len() == 2)
            .await
    );
    let runs = f.nodes[0].runner.history();
    assert_eq!(runs[1].1, epoch);
    f.nodes[0].task.abort();
}

/// A wake's claim that finds the fleet marker gone (the bucket wiped or
/// replaced since the node's last check, more than ttl/3 before) stops the
/// node at once, as a pass that finds it does: every session stopped, the
/// node's loop ended, the caller told why. Without that, the node served
/// on until its next periodic marker check, ten ttls later.
#[tokio::test(flavor = "current_thread")]
async fn a_wake_that_finds_the_marker_gone_stops_the_node() {
    use leasehold::wake::{Resolver, WakeOutcome};
    let mut f = FeedFleet::new().await;
    f.exit_wakeups = true;
    let handle = f.start_claiming("n1", f.hinting(1, 0.0), |_| {});
    let mut s = spec("serve");
    s.restart = RestartPolicy::Always.into();
    s.sleep = Some(leasehold::fleet::sleep::SleepRule {
        after_idle: None,
        on_exit: Some(75),
    });
    f.apply_sessions(2, &s).await;
    let mut asleep = false;
    for _ in 0..300 {
        f.exit_running(75);
        f.step(1).await;
        if claim_of(&f.bucket, "s00").await.state == ClaimState::Sleeping
            && claim_of(&f.bucket, "s01").await.state == ClaimState::Sleeping
        {
            asleep = true;
            break;
        }
    }
    assert!(asleep);
    // s01 runs again; then the marker goes, and a quiet longer than ttl/3.
    let resolver = Resolver::new(f.bucket.clone())
        .with_clock(f.dyn_clock.clone())
        .with_claimer(handle.clone());
    let w = resolver
        .wake(&Name::new("s01").unwrap(), Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        matches!(w.outcome, WakeOutcome::ClaimedHere { .. }),
        "{w:?}"
    );
    f.step(5).await;
    assert_eq!(
        leasehold::fleet::runner::Runner::running(f.nodes[0].runner.as_ref()).len(),
        1,
        "s01 runs"
    );
    f.bucket.delete(leasehold::keys::MARKER).await.unwrap();
    f.step(40).await;
    assert!(!f.nodes[0].task.is_finished());
    // Asked directly (a resolver would fall back to releasing it, which
    // the next pass would try to claim, checking the marker then).
    let (c, v) = leasehold::fleet::claim::get(&f.bucket, "s00")
        .await
        .unwrap()
        .unwrap();
    let e = handle
        .wake_now(&Name::new("s00").unwrap(), v, c)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("wiped or replaced"), "{e}");
    assert!(
        f.step_until(20, || f.nodes[0].task.is_finished()).await,
        "the node stopped"
    );
    assert!(
        leasehold::fleet::runner::Runner::running(f.nodes[0].runner.as_ref()).is_empty(),
        "s01 stopped"
    );
}

/// `gc` removes the tick records of a deleted scheduled session (tick
/// records fence nothing: the claim carries its tick), keeps those of a
/// session that has a manifest, and leaves foreign bytes under `ticks/`
/// alone.
#[tokio::test(flavor = "current_thread")]
async fn gc_removes_the_ticks_of_deleted_sessions_only() {
    use leasehold::fleet::cron::{self, Decision, TickRecord};
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    init_marker(&store).await;
    apply(&store, "kept", &spec("job")).await;
    let tick = |session: &str, at: u64| TickRecord {
        schema: leasehold::record::SCHEMA.into(),
        kind: "tick".into(),
        session: session.into(),
        tick_ms: at,
        decision: Decision::Skip { reason: "x".into() },
        node: "n1".into(),
        decided_at_ms: at,
        nonce: format!("{session}{at}"),
    };
    for (s, at) in [("gone", 60_000), ("gone", 120_000), ("kept", 60_000)] {
        store
            .put(
                &cron::key(s, at),
                bytes::Bytes::from(tick(s, at).encode()),
                leasehold::store::Cond::Create,
            )
            .await
            .unwrap();
    }
    let foreign = cron::key("gone", 180_000);
    store
        .put(
            &foreign,
            bytes::Bytes::from_static(b"not a tick"),
            leasehold::store::Cond::Create,
        )
        .await
        .unwrap();
    let plan = leasehold::fleet::gc::scan(&store, u64::MAX / 2, Duration::ZERO)
        .await
        .unwrap();
    let mut planned: Vec<&str> = plan
        .iter()
        .filter(|r| r.key.starts_with(cron::TICKS))
        .map(|r| r.key.as_str())
        .collect();
    planned.sort();
    assert_eq!(
        planned,
        [cron::key("gone", 60_000), cron::key("gone", 120_000)]
    );
    let removed = leasehold::fleet::gc::apply(&store, &OsEntropy::new(), &plan)
        .await
        .unwrap();
    assert!(removed.contains(&cron::key("gone", 120_000)), "{removed:?}");
    assert!(
        store
            .get(&cron::key("gone", 60_000))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        store
            .get(&cron::key("kept", 60_000))
            .await
            .unwrap()
            .is_some()
    );
    assert!(store.get(&foreign).await.unwrap().is_some());
    // Nothing with an epoch was removed: the floor is where it was.
    assert_eq!(leasehold::fleet::gc::floor(&store).await.unwrap(), 0);
}
