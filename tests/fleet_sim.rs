//! Seeded simulation of whole nodes under faults, on a manual clock: three
//! nodes run their real pull loops against one in-memory bucket, each
//! through its own fault-injecting store (requests delayed before and after
//! reaching the bucket, so writes land late; writes that land but report
//! failure; requests that fail outright), and each node is cut off from the
//! bucket at random for up to three TTLs. The property: no session ever runs
//! on two nodes at overlapping (virtual) times, and every session keeps
//! getting placed. Recording runners stop a session at the node's validity
//! deadline, as the exec runner's watchdog does.

use leasehold::Name;
mod common;

use futures::stream::BoxStream;
use leasehold::clock::{Clock, Entropy, ManualClock, MonoTime, SeededEntropy};
use leasehold::fleet::feed::{HintFaults, HintForms, HintingStore};
use leasehold::fleet::journal::Journal;
use leasehold::fleet::manifest::{self, Spec};
use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
use leasehold::fleet::runner::{RecordingRunner, Runner};
use leasehold::store::{Entry, FaultPlan, FaultStore, ObjectStoreBackend, Store, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_millis(600);
const STEP: Duration = Duration::from_millis(10);

struct SimNode {
    id: String,
    store: Arc<FaultStore>,
    runner: Arc<RecordingRunner>,
    journal: Arc<Journal>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<leasehold::Result<()>>,
}

type Run = common::Run<MonoTime>;

/// What the bucket itself does to the fleet in a schedule (beyond each
/// node's faulty view of it).
#[derive(Debug, Clone, Copy, Default)]
struct Adversary {
    /// At random moments: delete a node record, a claim or a manifest (the
    /// manifest is applied again at the next moment, as an operator would);
    /// write foreign bytes or a 2 MiB object under a prefix; overwrite a
    /// manifest with garbage.
    vandal: bool,
    /// Delete every object at this virtual time: every node must stop.
    wipe_at: Option<Duration>,
    /// Conditions checked without a lock; the probe is on: every node must
    /// refuse to serve.
    lock_free: bool,
    /// Within this window of virtual time, delete `sessions/s0` every 10 to
    /// 80 ms (drawn from the seed), whatever stands there: a claim made again and deleted again between
    /// two of a node's listings, over and over (the absence ABA).
    churn: Option<(Duration, Duration)>,
    /// No injected request faults and no partitions: the adversary alone.
    calm: bool,
    /// The change feed on (light passes between full listings every
    /// `FEED_FULL_EVERY`), with every writer's hints lost, duplicated and
    /// stamped late (reordered) as drawn from the seed.
    feed: Option<HintFaults>,
    /// Every 0.5 to 1.5 s, an operator deletes a manifest with `delete`
    /// (through the writers' store: hinted when the feed is on) and applies
    /// it again 0.3 s later: its session stops, its claim is released, and
    /// it is placed again, never at an epoch already run.
    redeploy: bool,
    /// With the feed on: nodes stretch their full-listing interval with
    /// the fleet (`full_every_objects`: one `FEED_FULL_EVERY` per
    /// `GROW_PER` listed objects, so up to three of them here), publishing
    /// it first; peers read every record again before making a vanished
    /// claim.
    grow: bool,
    /// With `grow`: a node of an older build (its record publishes no
    /// `proto`; no pull loop) comes and goes, registered for 0.5 to 3 s and
    /// away as long, renewed every ttl/3 while there, leaving by release or
    /// by silence (half each): the nodes' intervals are held, shrink and
    /// grow again (`Node::older_peer_live`) under the other faults.
    older: bool,
    /// The sessions sleep when they exit 75 (each run does at once), and
    /// every 30 to 150 ms an operator sets an alarm 20 to 400 ms ahead for
    /// one of them that is asleep: each alarm may wake its session at most
    /// once.
    alarms: bool,
}

/// Listed objects per full-listing interval when `Adversary::grow` is set:
/// 6 manifests and their claims make 3 intervals (9 s), and deleted ones
/// fewer, so intervals grow and shrink within a schedule.
const GROW_PER: u64 = 4;

/// Counts the change feed's reads (`list_after` of `changes/`): proof that
/// light passes ran.
#[derive(Debug)]
struct FeedReads(Arc<dyn Store>, Arc<std::sync::atomic::AtomicU64>);

impl std::fmt::Display for FeedReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[async_trait::async_trait]
impl leasehold::store::Forward for FeedReads {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }

    fn list_after(&self, p: &str, a: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        if p == leasehold::keys::CHANGES {
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.0.list_after(p, a)
    }
}

thread_local! {
    /// Feed reads by every node of the schedule that ran last on this
    /// thread (tests run side by side in one process, one per thread).
    static FEED_READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// With `Adversary::older`: samples of the nodes' published intervals
    /// taken as the older node comes and goes, in the schedule that ran
    /// last on this thread: (an older node present, every node at the
    /// fixed interval; none present, some node grown).
    static OLDER_SEEN: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    /// With `Adversary::alarms`: alarms set, and alarms fired (distinct),
    /// in the schedule that ran last on this thread. A second firing of
    /// one alarm fails the schedule itself.
    static ALARMS_SEEN: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// The published intervals (`max_poll_ms`) of the nodes' records that
/// decode.
async fn published_intervals(store: &Arc<dyn Store>) -> Vec<u64> {
    let mut out = Vec::new();
    for n in 0..3 {
        let key = format!("nodes/n{n}");
        if let Ok(Some(o)) = store.get(&key).await
            && let Ok(r) = leasehold::record::LeaseRecord::decode(
                &key,
                &o.bytes,
                leasehold::record::Kind::Node,
            )
        {
            out.push(leasehold::fleet::attrs::NodeAttrs::of(&r).max_poll_ms);
        }
    }
    out
}

/// The anti-entropy interval of nodes with the feed on: 5 ttls, 15 polls
/// of `max_poll`, so most passes are light (an adversary schedule of 4 s
/// has two full listings per node: at its start and about 2.8 s in).
const FEED_FULL_EVERY: Duration = Duration::from_millis(3_000);

/// Hints as badly as the feed may treat them and still be of use: a fifth
/// lost, a fifth doubled, each stamped up to two skew windows late (so
/// some fall behind readers' cursors and are missed, and many land out of
/// order).
const HINT_FAULTS: HintFaults = HintFaults {
    lose: 0.2,
    duplicate: 0.2,
    back_ms: 4_000,
};

/// Runs one schedule; returns every session run and the faults injected.
async fn schedule(seed: u64, virtual_secs: u64) -> (Vec<Run>, u64) {
    schedule_with(seed, virtual_secs, Adversary::default())
        .await
        .0
}

/// Deletes every object (a wiped bucket).
async fn wipe(inner: &Arc<dyn Store>) {
    use futures::StreamExt;
    let keys: Vec<String> = inner
        .list("")
        .filter_map(|e| async move { e.ok().map(|e| e.key) })
        .collect()
        .await;
    for k in keys {
        let _ = inner.delete(&k).await;
    }
}

/// One act of the vandal, drawn from `pick`. Returns a manifest it deleted
/// (to be applied again next time).
async fn vandalise(inner: &Arc<dyn Store>, pick: &SeededEntropy, n: u64) -> Option<String> {
    use futures::StreamExt;
    use leasehold::store::Cond;
    let prefixes = ["nodes/", "sessions/", "manifests/"];
    let prefix = prefixes[(pick.next_u64() % 3) as usize];
    match pick.next_u64() % 4 {
        0 | 1 => {
            let keys: Vec<String> = inner
                .list(prefix)
                .filter_map(|e| async move { e.ok().map(|e| e.key) })
                .collect()
                .await;
            if keys.is_empty() {
                return None;
            }
            let k = &keys[(pick.next_u64() % keys.len() as u64) as usize];
            let _ = inner.delete(k).await;
            k.strip_prefix("manifests/").map(str::to_string)
        }
        2 => {
            let big = pick.next_u64().is_multiple_of(2);
            let bytes = if big {
                bytes::Bytes::from(vec![b'x'; 2 << 20])
            } else {
                bytes::Bytes::from_static(b"not ours\n")
            };
            let _ = inner
                .put(&format!("{prefix}stray{n}"), bytes, Cond::Create)
                .await;
            None
        }
        _ => {
            let k = format!("manifests/s{}", pick.next_u64() % 6);
            if let Ok(Some(o)) = inner.get(&k).await {
                let _ = inner
                    .put(
                        &k,
                        bytes::Bytes::from_static(b"garbage"),
                        Cond::Match(o.version),
                    )
                    .await;
            }
            None
        }
    }
}

/// Runs one schedule with an adversary: every session run, the faults
/// injected, and how each node's run ended (Ok, or the error's kind).
async fn schedule_with(
    seed: u64,
    virtual_secs: u64,
    adversary: Adversary,
) -> ((Vec<Run>, u64), Vec<Option<leasehold::ErrorKind>>) {
    let clock = ManualClock::new();
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let entropy = Arc::new(SeededEntropy::new(seed));
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    leasehold::fleet::marker::init(&inner, entropy.as_ref(), 0, 1)
        .await
        .unwrap();
    // Writers hint through the feed (with its faults) when it is on. Half
    // of them, by seed and salt, spell their hints flat, as a writer of an
    // older build does (`keys::HintForm`), so readers meet both forms in
    // one feed; the rest decide as `node run` does, by listing `nodes/`.
    let hinted = |store: Arc<dyn Store>, salt: u64| -> Arc<dyn Store> {
        match adversary.feed {
            Some(f) => Arc::new(
                HintingStore::new(
                    store,
                    dyn_clock.clone(),
                    Arc::new(SeededEntropy::new(seed * 7 + salt)),
                )
                .with_faults(f)
                .with_forms(if (seed + salt).is_multiple_of(2) {
                    HintForms::fixed(leasehold::keys::HintForm::Flat)
                } else {
                    HintForms::auto()
                }),
            ),
            None => store,
        }
    };
    let operator = hinted(inner.clone(), 100);
    let mut spec = Spec::new("sleep", &[]);
    if adversary.alarms {
        spec.restart = leasehold::fleet::manifest::RestartPolicy::Always.into();
        spec.sleep = Some(leasehold::fleet::sleep::SleepRule {
            after_idle: None,
            on_exit: Some(75),
        });
    }
    let apply = async |name: &str| {
        let _ = manifest::apply(
            &operator,
            entropy.as_ref(),
            &Name::new(name).unwrap(),
            &spec,
            None,
        )
        .await;
    };
    for i in 0..6 {
        apply(&format!("s{i}")).await;
    }
    // The nodes' view of the bucket: a lock-free store for that adversary.
    let bucket: Arc<dyn Store> = if adversary.lock_free {
        Arc::new(leasehold::store::fault::LockFreeConditions {
            inner: inner.clone(),
            window: Duration::ZERO,
            clock: dyn_clock.clone(),
        })
    } else {
        inner.clone()
    };
    let feed_reads = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bucket: Arc<dyn Store> = if adversary.feed.is_some() {
        Arc::new(FeedReads(bucket, feed_reads.clone()))
    } else {
        bucket
    };
    let mut nodes = Vec::new();
    for n in 0..3u64 {
        let id = format!("n{n}");
        let store = Arc::new(
            FaultStore::new(bucket.clone())
                .with_clock(dyn_clock.clone())
                .with_plan(
                    seed * 31 + n,
                    FaultPlan {
                        fail_before: if adversary.calm { 0.0 } else { 0.02 },
                        land_then_fail: if adversary.calm { 0.0 } else { 0.02 },
                        delay: if adversary.calm { 0.0 } else { 0.15 },
                        // Requests wait before reaching the bucket and again
                        // before the response: writes land late, passes run
                        // long. (Much harsher, and nodes mostly lose their
                        // leases, so little is left to test.)
                        max_delay: TTL * 3 / 4,
                    },
                ),
        );
        let mut cfg = NodeConfig::new(Name::new(&id).unwrap(), TTL);
        cfg.capacity = 4;
        cfg.probe = adversary.lock_free;
        cfg.poll = Duration::from_millis(50);
        cfg.max_poll = Duration::from_millis(200);
        cfg.grace = Duration::from_millis(100);
        if adversary.feed.is_some() {
            cfg.full_every = FEED_FULL_EVERY;
            if adversary.grow {
                cfg.full_every_objects = GROW_PER;
            }
            // One in three with `nodes/` never listed by a light pass
            // unless something asks (the watch, the bell, a nudge, a hint
            // naming a stranger, a peer about to expire, a refused fence):
            // judgements then rest on listings as old as a full listing.
            if seed % 3 == 1 {
                cfg.nodes_every = Duration::from_secs(3600);
            }
        }
        let runner = Arc::new(RecordingRunner::new(dyn_clock.clone()));
        let journal = Arc::new(Journal::new(100_000, 64 << 20));
        let deps = NodeDeps {
            entropy: Arc::new(SeededEntropy::new(seed * 17 + n)),
            journal: journal.clone(),
            ..NodeDeps::new(hinted(store.clone(), n), dyn_clock.clone(), runner.clone())
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
        nodes.push(SimNode {
            id,
            store,
            runner,
            journal,
            shutdown,
            task,
        });
    }
    // Partitions: drawn from the seed, each node cut off for up to 3 TTLs at
    // a time, about a third of the time.
    let mut partitions: Vec<(MonoTime, usize, bool)> = Vec::new();
    let pick = SeededEntropy::new(seed ^ 0x5eed);
    let below = |n: u64| pick.next_u64() % n;
    let mut t = Duration::ZERO;
    while !adversary.calm && t < Duration::from_secs(virtual_secs) {
        t += Duration::from_millis(200 + below(1500));
        let who = below(3) as usize;
        let len = Duration::from_millis(100 + below(3 * TTL.as_millis() as u64));
        partitions.push((MonoTime::from_since_origin(t), who, true));
        partitions.push((MonoTime::from_since_origin(t + len), who, false));
    }
    partitions.sort_by_key(|p| p.0);
    let mut next = 0;
    let steps = virtual_secs * 1000 / STEP.as_millis() as u64;
    let vandal = SeededEntropy::new(seed ^ 0xbad);
    let mut next_act = Duration::from_millis(300 + vandal.next_u64() % 1200);
    let mut reapply: Option<String> = None;
    // Its own draws: the vandal's schedules stay as they were.
    let operator_rng = SeededEntropy::new(seed ^ 0xde1e7e);
    let mut next_redeploy = Duration::from_millis(500 + operator_rng.next_u64() % 1000);
    let mut redeployed: Option<(String, Duration)> = None;
    let mut acts = 0u64;
    let mut wiped = false;
    let mut next_churn = Duration::ZERO;
    // The older node: its lease while registered, its next renewal, and
    // when it next comes or goes.
    let older_rng = SeededEntropy::new(seed ^ 0x01de7);
    let older_client =
        leasehold::lease::LeaseClient::builder(inner.clone(), Name::new("old").unwrap())
            .clock(dyn_clock.clone())
            .entropy(Arc::new(SeededEntropy::new(seed ^ 0x01d)))
            .build()
            .unwrap();
    let mut older: Option<leasehold::lease::Lease> = None;
    let mut older_renew = Duration::ZERO;
    let mut older_toggle = Duration::from_millis(500 + older_rng.next_u64() % 2500);
    let (mut held_seen, mut grown_seen) = (0u64, 0u64);
    // Alarms: their own draws, so the other schedules stay as they were.
    let alarm_rng = SeededEntropy::new(seed ^ 0xa1a4);
    let mut next_alarm = Duration::from_millis(100);
    let mut last_at = 0u64;
    let mut alarms_set = 0u64;
    // Each session's last alarm: another only once that one is well past.
    let mut armed: std::collections::HashMap<String, u64> = Default::default();
    for _ in 0..steps {
        clock.advance(STEP);
        let now = clock.now().since_origin();
        if adversary.alarms && !wiped {
            // Every run asks to sleep at once (exit 75).
            for n in &nodes {
                for (s, _) in n.runner.running() {
                    n.runner.exit(&s, 75);
                }
            }
            // For a session asleep (one awake would consume it), from a
            // random one on.
            let mut asleep = None;
            if now >= next_alarm {
                let from = alarm_rng.next_u64() % 6;
                let wall = dyn_clock.wall_ms();
                for k in 0..6 {
                    let s = format!("s{}", (from + k) % 6);
                    if armed.get(&s).is_some_and(|at| wall < at + 300) {
                        continue;
                    }
                    if let Ok(Some(o)) = inner.get(&format!("sessions/{s}")).await
                        && leasehold::fleet::claim::ClaimRecord::decode("c", &o.bytes)
                            .is_ok_and(|c| c.state == leasehold::fleet::claim::ClaimState::Sleeping)
                    {
                        asleep = Some(s);
                        break;
                    }
                }
            }
            if let Some(session) = asleep {
                let wall = dyn_clock.wall_ms();
                // Distinct times: a firing names its alarm by its time.
                let at = (wall + 20 + alarm_rng.next_u64() % 380).max(last_at + 1);
                if leasehold::fleet::alarm::set(
                    &operator,
                    entropy.as_ref(),
                    &Name::new(session.as_str()).unwrap(),
                    at,
                    wall,
                )
                .await
                .is_ok()
                {
                    alarms_set += 1;
                    last_at = at;
                    armed.insert(session, at);
                }
            }
            if now >= next_alarm {
                next_alarm = now + Duration::from_millis(30 + alarm_rng.next_u64() % 120);
            }
        }
        if adversary.older && adversary.grow && !wiped {
            if now >= older_toggle {
                let fixed = FEED_FULL_EVERY.as_millis() as u64;
                let shown = published_intervals(&inner).await;
                match older.take() {
                    Some(lease) => {
                        // Present for a while: every node gave the fixed
                        // interval back by now?
                        if !shown.is_empty() && shown.iter().all(|m| *m <= fixed) {
                            held_seen += 1;
                        }
                        if older_rng.next_u64().is_multiple_of(2) {
                            let _ = lease.release().await;
                        }
                    }
                    None => {
                        if shown.iter().any(|m| *m > fixed) {
                            grown_seen += 1;
                        }
                        let mut opts = leasehold::lease::AcquireOptions::ttl(TTL);
                        opts.attrs = serde_json::json!({
                            "capacity": 0, "max_poll_ms": TTL.as_millis() as u64, "load": 0, "labels": {}
                        })
                        .as_object()
                        .unwrap()
                        .clone();
                        if let Ok(leasehold::lease::Acquire::Acquired(l)) = older_client
                            .acquire_kind(
                                leasehold::record::Kind::Node,
                                &Name::new("old").unwrap(),
                                &opts,
                            )
                            .await
                        {
                            older = Some(l);
                            older_renew = now + TTL / 3;
                        }
                    }
                }
                acts += 1;
                older_toggle = now + Duration::from_millis(500 + older_rng.next_u64() % 2500);
            } else if now >= older_renew
                && let Some(l) = older.as_mut()
            {
                if l.renew_once().await.is_err() {
                    older = None;
                }
                older_renew = now + TTL / 3;
            }
        }
        if adversary.vandal && !wiped && now >= next_act {
            if let Some(m) = reapply.take() {
                apply(&m).await;
            }
            reapply = vandalise(&inner, &vandal, acts).await;
            acts += 1;
            next_act = now + Duration::from_millis(300 + vandal.next_u64() % 1200);
        }
        if adversary.redeploy {
            if let Some((m, at)) = redeployed.take() {
                if now >= at {
                    apply(&m).await;
                } else {
                    redeployed = Some((m, at));
                }
            } else if now >= next_redeploy {
                let m = format!("s{}", operator_rng.next_u64() % 6);
                let _ = manifest::delete(&operator, &Name::new(&m).unwrap()).await;
                acts += 1;
                redeployed = Some((m, now + Duration::from_millis(300)));
                next_redeploy = now + Duration::from_millis(500 + operator_rng.next_u64() % 1000);
            }
        }
        if let Some((from, to)) = adversary.churn
            && now >= from
            && now < to
            && now >= next_churn
        {
            let _ = inner.delete("sessions/s0").await;
            acts += 1;
            next_churn = now + STEP * (1 + (vandal.next_u64() % 8) as u32);
        }
        if let Some(at) = adversary.wipe_at
            && !wiped
            && now >= at
        {
            wipe(&inner).await;
            wiped = true;
        }
        while next < partitions.len() && partitions[next].0 <= clock.now() {
            let (_, who, cut) = partitions[next];
            nodes[who].store.set_partitioned(cut);
            next += 1;
        }
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
    // Heal, then let every session settle somewhere.
    for n in &nodes {
        n.store.set_partitioned(false);
    }
    let injected: u64 = nodes.iter().map(|n| n.store.injected()).sum::<u64>() + acts;
    if adversary.vandal || adversary.churn.is_some() {
        // Deleted claims: an epoch may be reused by a node that never saw
        // it (counted by the caller; docs/protocol.md). No session may run
        // twice at once: a vanished claim is made again only after the
        // version of its marker was watched for the hold period (before
        // that rule, listings' "absent" let seed 5907 overlap 10 ms: a claim
        // deleted, made again and deleted again between two listings).
        let mut runs: Vec<Run> = Vec::new();
        for n in &nodes {
            for (s, e, a, b) in n.runner.history() {
                runs.push((s, e, n.id.clone(), a, b));
            }
        }
        let o = common::overlaps(&runs);
        assert!(o.is_empty(), "seed {seed}: ran twice at once: {o:?}");
    } else {
        check_never_twice(seed, &nodes);
    }
    for n in nodes.iter() {
        n.shutdown.cancel();
    }
    for _ in 0..2000 {
        clock.advance(STEP);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
        if nodes.iter().all(|n| n.task.is_finished()) {
            break;
        }
    }
    let mut runs: Vec<Run> = Vec::new();
    for n in &nodes {
        for (s, e, a, b) in n.runner.history() {
            runs.push((s, e, n.id.clone(), a, b));
        }
    }
    runs.sort();
    if adversary.alarms {
        // Each alarm woke its session at most once, whichever node fired
        // it: every firing names its alarm's time.
        let mut fired: std::collections::BTreeMap<(String, String), Vec<String>> =
            Default::default();
        for n in &nodes {
            let page = n.journal.after(0, usize::MAX).unwrap();
            assert!(
                page.gap.is_none(),
                "seed {seed}: the journal dropped events"
            );
            for e in page.events {
                if e.kind == leasehold::fleet::journal::EventKind::AlarmFired {
                    fired
                        .entry((e.session.clone().unwrap_or_default(), e.detail.clone()))
                        .or_default()
                        .push(n.id.clone());
                }
            }
        }
        for ((s, alarm), by) in &fired {
            assert_eq!(
                by.len(),
                1,
                "seed {seed}: {s}'s {alarm} fired twice, by {by:?}"
            );
        }
        ALARMS_SEEN.set((alarms_set, fired.len() as u64));
    }
    FEED_READS.set(feed_reads.load(std::sync::atomic::Ordering::Relaxed));
    OLDER_SEEN.set((held_seen, grown_seen));
    let mut ends = Vec::new();
    for n in nodes {
        // A node may end with an error (its store was cut off while it shut
        // down); what matters is that it ended.
        ends.push(n.task.await.unwrap().err().map(|e| e.kind()));
    }
    ((runs, injected), ends)
}

/// No session ran on two nodes at overlapping times; no epoch ran on two.
fn check_never_twice(seed: u64, nodes: &[SimNode]) {
    let mut runs: Vec<common::Run<MonoTime>> = Vec::new();
    for n in nodes {
        for (s, e, a, b) in n.runner.history() {
            runs.push((s, e, n.id.clone(), a, b));
        }
    }
    common::assert_never_twice(&format!("seed {seed}: "), &runs);
}

#[tokio::test(flavor = "current_thread")]
async fn nodes_under_faults_and_partitions_never_run_a_session_twice() {
    let mut total_runs = 0;
    let mut moved = 0;
    let mut total_faults = 0;
    for seed in 0..200 {
        let (runs, faults) = schedule(seed, 20).await;
        total_runs += runs.len();
        // Runs at an epoch above 1: the session was taken over.
        moved += runs.iter().filter(|r| r.1 > 1).count();
        total_faults += faults;
    }
    eprintln!(
        "200 schedules: {total_runs} session runs ({moved} after a takeover), {total_faults} faults injected"
    );
    // The schedules must have exercised something: sessions ran, moved
    // between nodes, and faults were injected.
    assert!(total_runs > 200 * 6, "{total_runs} runs");
    assert!(moved > 1000, "{moved} runs after a takeover");
    assert!(total_faults > 10_000, "{total_faults} faults");
}

/// Issue #14: with the change feed on, most passes are light (they read
/// only what hints name) and hints are lost, doubled and late; the
/// never-twice checks (no overlap, no epoch on two nodes) hold under the
/// same request faults and partitions, in half the schedules with
/// manifests deleted and applied again all along, and sessions still move
/// (a lost hint delays a change until the next full listing, never decides
/// one).
#[tokio::test(flavor = "current_thread")]
async fn the_change_feed_under_lost_and_reordered_hints_never_runs_a_session_twice() {
    let (mut total_runs, mut moved, mut total_faults, mut reads) = (0, 0, 0, 0);
    let (mut held, mut grown) = (0, 0);
    for seed in 0..100 {
        let adversary = Adversary {
            // A quarter without request faults or partitions: there nodes
            // keep their leases and most passes are light (under faults
            // they re-register often, and a registration lists everything).
            calm: seed % 4 == 3,
            feed: Some(HINT_FAULTS),
            // Half with `delete` and `apply` again all along (hinted).
            redeploy: seed % 2 == 0,
            // Two in three with intervals that grow with the fleet.
            grow: seed % 3 != 2,
            // Half of those with an older node coming and going (with
            // and without redeploys).
            older: (seed / 2) % 2 == 0,
            alarms: false,
            ..Adversary::default()
        };
        let ((runs, faults), _) = schedule_with(seed, 20, adversary).await;
        total_runs += runs.len();
        moved += runs.iter().filter(|r| r.1 > 1).count();
        total_faults += faults;
        reads += FEED_READS.get();
        if adversary.older && adversary.grow {
            let (h, g) = OLDER_SEEN.get();
            held += h;
            grown += g;
        }
    }
    eprintln!(
        "100 schedules with the feed: {total_runs} session runs ({moved} at epochs above 1), {total_faults} faults and acts, {reads} feed reads; with an older node coming and going, every node held at the fixed interval in {held} samples, some node grown without it in {grown}"
    );
    // The older node's schedules exercised the gate both ways.
    assert!(held > 0 && grown > 0, "held {held}, grown {grown}");
    assert!(total_runs > 100 * 6, "{total_runs} runs");
    assert!(moved > 500, "{moved} runs at epochs above 1");
    // Light passes ran: about 3 nodes × 130 passes in each calm schedule.
    assert!(reads > 25 * 300, "{reads} feed reads");
}

/// The same seed gives the same history, run for run, in one process: a
/// failure found by the simulation can be replayed (across processes too:
/// `a_seed_replays_across_processes`). (Seed 8 is the one that catches a
/// takeover without fencing the owner's lease: a session ran on two nodes
/// for 600 virtual ms.)
#[tokio::test(flavor = "current_thread")]
async fn a_seed_replays_exactly() {
    let (a, fa) = schedule(8, 20).await;
    let (b, fb) = schedule(8, 20).await;
    assert_eq!(fa, fb);
    assert_eq!(a, b);
    assert!(a.len() > 6);
}

/// A schedule with growing intervals and an older node coming and going
/// replays too. (The reads before a growth go out in key order, not a
/// HashMap's, since each read draws the store's faults; found by review.
/// This test does not catch that order: the faults fall on the same
/// request numbers whatever key each carries, and these histories came out
/// the same without it.)
#[tokio::test(flavor = "current_thread")]
async fn a_seed_with_an_older_node_replays_exactly() {
    let adversary = Adversary {
        feed: Some(HINT_FAULTS),
        grow: true,
        older: true,
        ..Adversary::default()
    };
    for seed in 0..10 {
        let a = schedule_with(seed, 20, adversary).await;
        let b = schedule_with(seed, 20, adversary).await;
        assert_eq!(a, b, "seed {seed}");
        assert!(a.0.0.len() > 6, "seed {seed}: {:?}", a.0.0);
    }
}

/// The bucket as an adversary, in 10,000 short schedules over four tests
/// (both cores): objects deleted, stray and oversized objects, garbage
/// manifests (every schedule); a wipe at a random moment (one in four); a
/// store that checks conditions without a lock (one in eight). Never-twice
/// holds in every schedule; after a wipe every node has stopped with a data
/// error (the marker is gone) and no session ran past the wipe by more than
/// a node's validity; on a lock-free store every node refused to serve.
async fn adversary_schedules(from: u64, to: u64) {
    let (mut runs_total, mut acts, mut wiped, mut lock_free, mut refused) = (0, 0, 0, 0, 0);
    let (mut reused, mut noticed) = (0, 0);
    for seed in from..to {
        let pick = seed % 8;
        let adversary = Adversary {
            vandal: true,
            wipe_at: (pick % 4 == 1).then(|| Duration::from_millis(1000 + (seed * 37) % 2500)),
            lock_free: pick == 6,
            churn: None,
            calm: false,
            // Half the schedules with the feed and its faults.
            feed: (seed % 2 == 1).then_some(HINT_FAULTS),
            redeploy: false,
            // Half of those with intervals that grow with the fleet, and
            // half of these with an older node coming and going.
            grow: seed % 4 == 3,
            older: seed % 8 == 7,
            alarms: false,
        };
        let ((runs, injected), ends) = schedule_with(seed, 4, adversary).await;
        runs_total += runs.len();
        reused += common::epochs_reused(&runs).len();
        acts += injected;
        use leasehold::ErrorKind::{Data, Unavailable, Unsupported};
        if adversary.lock_free {
            lock_free += 1;
            // Refused by the probe, or still probing after a fault during
            // it (a transient failure is probed again with back-off, and
            // the schedule may end first): nobody served.
            assert!(
                runs.is_empty(),
                "seed {seed}: ran on a lock-free store: {runs:?}"
            );
            assert!(
                ends.iter()
                    .all(|e| matches!(e, Some(Unsupported | Unavailable) | None)),
                "seed {seed}: {ends:?}"
            );
            refused += ends.iter().filter(|e| **e == Some(Unsupported)).count();
        } else if let Some(at) = adversary.wipe_at {
            wiped += 1;
            // Someone noticed the marker gone and stopped, and no session
            // ran on much past the wipe: a node that did not see it (cut
            // off) lost its lease's validity instead.
            if ends.contains(&Some(Data)) {
                noticed += 1;
            }
            let bound = MonoTime::from_since_origin(at + TTL * 3);
            for r in &runs {
                assert!(
                    r.4 <= bound,
                    "seed {seed}: {r:?} ran on after the wipe at {at:?}"
                );
            }
        }
    }
    eprintln!(
        "schedules {from}..{to}: {runs_total} session runs, {acts} faults and acts, {wiped} wipes ({noticed} seen by a node before the end), {lock_free} lock-free stores ({refused} node refusals by the probe), {reused} epochs reused after a claim deletion"
    );
    // Nodes cut off at the wipe until the end see nothing (their sessions
    // still stop, at their validity: checked above); most schedules see it.
    assert!(
        noticed * 10 >= wiped * 9,
        "{noticed} of {wiped} wipes noticed"
    );
    assert!(lock_free == 0 || refused > 0, "the probe never refused");
    assert!(runs_total > (to - from) as usize * 3, "{runs_total} runs");
}

/// Issue #39's alarm target: at least 10,000 alarms over seeded schedules
/// of three nodes with the bucket as adversary (half with the vandal
/// deleting node records, claims and manifests and writing foreign bytes,
/// half with the change feed's lost, doubled and late hints; all but a
/// quarter with delayed, failed and lost-reply requests and partitions),
/// sessions that fall asleep as soon as they run, and an alarm set every
/// 30-150 ms: no alarm fires twice, no session runs on two nodes at once.
#[tokio::test(flavor = "current_thread")]
async fn ten_thousand_alarms_fire_at_most_once_with_the_bucket_as_adversary() {
    let (mut set, mut fired, mut schedules) = (0u64, 0u64, 0u64);
    let mut seed = 0u64;
    while set < 10_000 {
        let adversary = Adversary {
            vandal: seed.is_multiple_of(2),
            calm: seed % 4 == 3,
            feed: (seed % 2 == 1).then_some(HINT_FAULTS),
            alarms: true,
            ..Adversary::default()
        };
        let _ = schedule_with(seed, 4, adversary).await;
        let (s, f) = ALARMS_SEEN.get();
        set += s;
        fired += f;
        schedules += 1;
        seed += 1;
    }
    eprintln!("{schedules} schedules: {set} alarms set, {fired} fired, none twice");
    // Most fire (the rest came due while their session was awake after an
    // earlier alarm, lost their session to the vandal, or were due after
    // the schedule's end).
    assert!(fired * 2 >= set, "{fired} of {set} fired");
}

/// Churn: `sessions/s0` deleted every 10-80 ms for two virtual seconds,
/// whatever stands there (claims, markers, tombstones), in 40 schedules
/// (half without request faults or partitions). Never twice at once, and
/// the session is placed again once the churn ends. (The scripted ABA,
/// which the old absence rule fails, is `tests/fleet.rs`
/// `a_peer_blind_to_a_claim_never_makes_it_again_beside_its_holder`; this
/// churn did not make the old rule overlap in 1,000 schedules, so it guards
/// liveness under markers more than the ABA itself.)
#[tokio::test(flavor = "current_thread")]
async fn a_claim_deleted_over_and_over_never_runs_twice() {
    let mut after = 0;
    for seed in 0..40u64 {
        let adversary = Adversary {
            churn: Some((Duration::from_millis(1500), Duration::from_millis(3500))),
            calm: seed % 2 == 0,
            ..Adversary::default()
        };
        let ((runs, _), _) = schedule_with(seed, 7, adversary).await;
        let end_of_churn = MonoTime::from_since_origin(Duration::from_millis(3500));
        if runs.iter().any(|r| r.0 == "s0" && r.3 > end_of_churn) {
            after += 1;
        }
    }
    // Placement goes on after the churn: always in the calm schedules (half
    // of them); the others lose node leases to partitions and faults.
    assert!(
        after >= 20,
        "s0 ran again after the churn in {after} of 40 schedules"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn bucket_adversary_schedules_0() {
    adversary_schedules(0, 2500).await;
}

#[tokio::test(flavor = "current_thread")]
async fn bucket_adversary_schedules_1() {
    adversary_schedules(2500, 5000).await;
}

#[tokio::test(flavor = "current_thread")]
async fn bucket_adversary_schedules_2() {
    adversary_schedules(5000, 7500).await;
}

#[tokio::test(flavor = "current_thread")]
async fn bucket_adversary_schedules_3() {
    adversary_schedules(7500, 10_000).await;
}

/// A seed replays exactly in another process too (a failure found in CI
/// reruns on a laptop): this test runs schedules here and in two child
/// processes of this test binary, and compares every run of every session
/// (epoch, node, virtual start and end), the faults injected and how each
/// node ended. What could make processes differ is randomness the seed does
/// not drive: tokio's `select!` branch order and `HashMap` iteration order
/// are both seeded per process. This test caught the second (2026-12-02,
/// after a pacing change): the loops over a node's owned sessions that
/// issue requests (release, reconcile, exits) ran in HashMap order, so the
/// seeded fault plan hit other requests in another process. They run in
/// name order now, and the node's `select!`s are `biased`.
/// (`LEASEHOLD_SIM_REPLAY_SEEDS=40`: 44 schedules, twice, identical.)
#[test]
fn a_seed_replays_across_processes() {
    let digest = || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut d = String::new();
            // (LEASEHOLD_SIM_REPLAY_SEEDS=N adds seeds 100..100+N, to look
            // for a rare divergence.)
            let extra: u64 = std::env::var("LEASEHOLD_SIM_REPLAY_SEEDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            for seed in [8, 1, 2, 3].into_iter().chain(100..100 + extra) {
                let (runs, faults) = schedule(seed, 20).await;
                d.push_str(&format!("seed {seed}: {faults} {runs:?}; "));
            }
            for seed in [5907, 11] {
                let vandal = Adversary {
                    vandal: true,
                    ..Adversary::default()
                };
                let ((runs, faults), ends) = schedule_with(seed, 10, vandal).await;
                d.push_str(&format!("vandal {seed}: {faults} {runs:?} {ends:?}; "));
            }
            // The change feed with its faults: hints' keys, their order in
            // listings and which are lost all come from the seed.
            for seed in [4, 12] {
                let feed = Adversary {
                    vandal: true,
                    feed: Some(HINT_FAULTS),
                    ..Adversary::default()
                };
                let ((runs, faults), ends) = schedule_with(seed, 10, feed).await;
                d.push_str(&format!("feed {seed}: {faults} {runs:?} {ends:?}; "));
            }
            d
        })
    };
    if std::env::var_os("LEASEHOLD_SIM_REPLAY_CHILD").is_some() {
        println!("replay-digest: {}", digest());
        return;
    }
    let here = digest();
    for _ in 0..2 {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_seed_replays_across_processes", "--nocapture"])
            .env("LEASEHOLD_SIM_REPLAY_CHILD", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let child = stdout
            .lines()
            .find_map(|l| l.strip_prefix("replay-digest: "))
            .unwrap_or_else(|| panic!("no digest from the child: {stdout}"));
        if child != here {
            let at = here
                .chars()
                .zip(child.chars())
                .position(|(a, b)| a != b)
                .unwrap_or(here.len().min(child.len()));
            panic!(
                "the child's history differs from character {at}:\n here: {:?}\nchild: {:?}",
                &here[at.saturating_sub(100)..(at + 300).min(here.len())],
                &child[at.saturating_sub(100)..(at + 300).min(child.len())]
            );
        }
    }
}

type WatchNode = (
    String,
    Arc<RecordingRunner>,
    CancellationToken,
    tokio::task::JoinHandle<leasehold::Result<()>>,
);

/// Advances the clock `n` steps, letting every task run after each.
async fn step(clock: &ManualClock, n: u64) {
    for _ in 0..n {
        clock.advance(STEP);
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }
}

/// Three nodes for the ring-watch tests: ttl 600 ms, idle pauses backing off
/// to 64 polls of 200 ms (12.8 s, under max_poll), `sessions` sleepers, on
/// one counting in-memory bucket.
async fn watch_fleet(
    sessions: usize,
) -> (
    ManualClock,
    Arc<leasehold::store::CountingStore>,
    Vec<WatchNode>,
) {
    let clock = ManualClock::new();
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let counting = Arc::new(leasehold::store::CountingStore::new(Arc::new(
        ObjectStoreBackend::memory(),
    )));
    let store: Arc<dyn Store> = counting.clone();
    let entropy = SeededEntropy::new(7);
    leasehold::fleet::marker::init(&store, &entropy, 0, 1)
        .await
        .unwrap();
    for i in 0..sessions {
        manifest::apply(
            &store,
            &entropy,
            &Name::new(format!("s{i}")).unwrap(),
            &Spec::new("sleep", &[]),
            None,
        )
        .await
        .unwrap();
    }
    let mut nodes = Vec::new();
    for n in 0..3u64 {
        let mut cfg = NodeConfig::new(Name::new(format!("n{n}")).unwrap(), TTL);
        cfg.capacity = 6;
        cfg.probe = false;
        cfg.poll = Duration::from_millis(200);
        cfg.max_poll = Duration::from_secs(20);
        cfg.grace = Duration::from_millis(100);
        let runner = Arc::new(RecordingRunner::new(dyn_clock.clone()));
        let deps = NodeDeps {
            entropy: Arc::new(SeededEntropy::new(n)),
            ..NodeDeps::new(store.clone(), dyn_clock.clone(), runner.clone())
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
        nodes.push((format!("n{n}"), runner, shutdown, task));
    }
    (clock, counting, nodes)
}

/// A dead peer that nobody fences (it held no sessions) stays listed,
/// expired, until `gc`. Its watchers noticed it once; it must not end every
/// pause from then on (a pass every ttl/2 instead of every 12.8 s). Nor may
/// the brisk pace kept while a peer is about to expire go on once it has.
/// Fails with the watch's live filter removed (1,026 list pages) and with
/// `peer_expiring`'s upper bound removed (1,800: a pass every poll, which
/// every fleet with a dead node that held nothing paid before this test).
#[tokio::test(flavor = "current_thread")]
async fn a_dead_peer_with_no_sessions_hurries_its_watchers_once_not_forever() {
    let (clock, counting, mut nodes) = watch_fleet(0).await;
    let step = async |n: u64| step(&clock, n).await;
    step(60_000 / STEP.as_millis() as u64).await;
    let (_, _, _, task) = nodes.remove(0);
    task.abort();
    // Noticed within seconds; then a minute of the survivors' idle pace.
    step(10_000 / STEP.as_millis() as u64).await;
    let before = counting.counts();
    step(60_000 / STEP.as_millis() as u64).await;
    let lists = counting.counts().since(&before).list_pages;
    // Two nodes, three listings a pass, a pass every 12.8 s: about 30 (a
    // pass every ttl/2 would be 1,200).
    assert!(lists <= 60, "{lists} list pages in a minute of idling");
    for (_, _, shutdown, _) in &nodes {
        shutdown.cancel();
    }
    step(200).await;
}

/// Issue #14: an idle node backs off to `max_poll` between passes, and
/// noticing a dead peer by listings alone takes two listings ttl + margin
/// apart: up to two long pauses (measured 104 s at ttl 10 s, max_poll 60 s).
/// Its ring successors' watchers read their records every ttl/2 between
/// passes and run a pass as soon as one has stood still past ttl + margin.
/// Here: ttl 600 ms, idle pauses of 12.8 s; the busiest node is aborted (as kill -9)
/// on an idle fleet, and its sessions must run elsewhere within ttl + margin
/// + ttl/2 + a few polls and graces, never at the end of a 12.8 s pause. It
/// fails with the watch disabled (`watching = false` in `serve`: moved after 16.6 s).
#[tokio::test(flavor = "current_thread")]
async fn a_dead_peer_is_noticed_by_its_watchers_not_at_the_end_of_an_idle_pause() {
    let (clock, _, mut nodes) = watch_fleet(6).await;
    let step = async |n: u64| step(&clock, n).await;
    // Placed, then idle long enough for every node to back off to 20 s.
    step(60_000 / STEP.as_millis() as u64).await;
    let running = |runner: &RecordingRunner| {
        let mut r: Vec<String> = runner.running().into_iter().map(|(n, _)| n).collect();
        r.sort();
        r
    };
    let total: usize = nodes.iter().map(|(_, r, _, _)| running(r).len()).sum();
    assert_eq!(total, 6, "placed before the kill");
    let victim = (0..3).max_by_key(|&i| running(&nodes[i].1).len()).unwrap();
    let theirs = running(&nodes[victim].1);
    assert!(!theirs.is_empty());
    let (victim_id, victim_runner, _, task) = nodes.remove(victim);
    task.abort();
    let t0 = clock.now();
    let mut moved_after = None;
    for _ in 0..(45_000 / STEP.as_millis() as u64) {
        step(1).await;
        let elsewhere: Vec<String> = nodes.iter().flat_map(|(_, r, _, _)| running(r)).collect();
        if theirs.iter().all(|s| elsewhere.contains(s)) {
            moved_after = Some(clock.now().saturating_since(t0));
            break;
        }
    }
    let moved_after = moved_after.expect("the dead node's sessions never moved in 45 s");
    let bound = TTL + TTL / 10 + TTL / 2 + Duration::from_millis(1500);
    assert!(
        moved_after <= bound,
        "moved after {moved_after:?}, over {bound:?}: noticed at an idle pass, not by a watcher"
    );
    // The hurry never made a session run twice: the victim's runs ended at
    // its deadline before any survivor's began.
    let mut runs: Vec<Run> = Vec::new();
    for (id, runner) in nodes
        .iter()
        .map(|(id, r, _, _)| (id, r))
        .chain([(&victim_id, &victim_runner)])
    {
        for (s, e, a, b) in runner.history() {
            runs.push((s, e, id.clone(), a, b));
        }
    }
    common::assert_never_twice("watch: ", &runs);
    for (_, _, shutdown, _) in &nodes {
        shutdown.cancel();
    }
    step(200).await;
}
