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

use leasehold::clock::{Clock, Entropy, ManualClock, MonoTime, SeededEntropy};
use leasehold::fleet::journal::Journal;
use leasehold::fleet::manifest::{self, Spec};
use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
use leasehold::fleet::runner::RecordingRunner;
use leasehold::store::{FaultPlan, FaultStore, ObjectStoreBackend, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const TTL: Duration = Duration::from_millis(600);
const STEP: Duration = Duration::from_millis(10);

struct SimNode {
    id: String,
    store: Arc<FaultStore>,
    runner: Arc<RecordingRunner>,
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
}

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
    let apply = async |name: &str| {
        let _ = manifest::apply(
            &inner,
            entropy.as_ref(),
            &Name::new(name).unwrap(),
            &Spec::new("sleep", &[]),
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
    let mut nodes = Vec::new();
    for n in 0..3u64 {
        let id = format!("n{n}");
        let store = Arc::new(
            FaultStore::new(bucket.clone())
                .with_clock(dyn_clock.clone())
                .with_plan(
                    seed * 31 + n,
                    FaultPlan {
                        fail_before: 0.02,
                        land_then_fail: 0.02,
                        delay: 0.15,
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
        let runner = Arc::new(RecordingRunner::new(dyn_clock.clone()));
        let deps = NodeDeps {
            entropy: Arc::new(SeededEntropy::new(seed * 17 + n)),
            journal: Arc::new(Journal::new(100_000, 64 << 20)),
            ..NodeDeps::new(store.clone(), dyn_clock.clone(), runner.clone())
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
        nodes.push(SimNode {
            id,
            store,
            runner,
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
    while t < Duration::from_secs(virtual_secs) {
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
    let mut acts = 0u64;
    let mut wiped = false;
    for _ in 0..steps {
        clock.advance(STEP);
        let now = clock.now().since_origin();
        if adversary.vandal && !wiped && now >= next_act {
            if let Some(m) = reapply.take() {
                apply(&m).await;
            }
            reapply = vandalise(&inner, &vandal, acts).await;
            acts += 1;
            next_act = now + Duration::from_millis(300 + vandal.next_u64() % 1200);
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
    if adversary.vandal {
        // Deleted claims: an epoch may be reused by a node that never saw
        // it, and a claim deleted, made again and deleted again between two
        // of a node's listings reads to it as one long absence (the gap in
        // docs/protocol.md): overlaps are counted by the caller and bounded
        // here by the owner's hold, which its deadline never passes.
        let mut runs: Vec<Run> = Vec::new();
        for n in &nodes {
            for (s, e, a, b) in n.runner.history() {
                runs.push((s, e, n.id.clone(), a, b));
            }
        }
        for (s, d) in common::overlaps(&runs) {
            assert!(d <= TTL * 2, "seed {seed}: {s} ran twice for {d:?}");
        }
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

/// The same seed gives the same history, run for run, in one process: a
/// failure found by the simulation can be replayed. (Across processes tokio's
/// `select!` starts from a random branch, which can shift a schedule a
/// little; the failures found so far recurred in every rerun.) (Seed 8 is the one that catches a
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

/// The bucket as an adversary, in 10,000 short schedules over four tests
/// (both cores): objects deleted, stray and oversized objects, garbage
/// manifests (every schedule); a wipe at a random moment (one in four); a
/// store that checks conditions without a lock (one in eight). Never-twice
/// holds in every schedule; after a wipe every node has stopped with a data
/// error (the marker is gone) and no session ran past the wipe by more than
/// a node's validity; on a lock-free store every node refused to serve.
async fn adversary_schedules(from: u64, to: u64) {
    let (mut runs_total, mut acts, mut wiped, mut lock_free, mut refused) = (0, 0, 0, 0, 0);
    let (mut reused, mut noticed, mut overlapped, mut overlap_ms) = (0, 0, 0, 0u128);
    for seed in from..to {
        let pick = seed % 8;
        let adversary = Adversary {
            vandal: true,
            wipe_at: (pick % 4 == 1).then(|| Duration::from_millis(1000 + (seed * 37) % 2500)),
            lock_free: pick == 6,
        };
        let ((runs, injected), ends) = schedule_with(seed, 4, adversary).await;
        runs_total += runs.len();
        reused += common::epochs_reused(&runs).len();
        let o = common::overlaps(&runs);
        if !o.is_empty() {
            overlapped += 1;
            overlap_ms += o.iter().map(|(_, d)| d.as_millis()).sum::<u128>();
            eprintln!("seed {seed}: overlaps after claim deletions {o:?}");
        }
        acts += injected;
        use leasehold::ErrorKind::{Data, Unavailable, Unsupported};
        if adversary.lock_free {
            lock_free += 1;
            // Refused by the probe (or kept out by a fault during it, and
            // then refused at a retry): nobody served.
            assert!(
                runs.is_empty(),
                "seed {seed}: ran on a lock-free store: {runs:?}"
            );
            assert!(
                ends.iter()
                    .all(|e| matches!(e, Some(Unsupported | Unavailable))),
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
        "schedules {from}..{to}: {runs_total} session runs, {acts} faults and acts, {wiped} wipes ({noticed} seen by a node before the end), {lock_free} lock-free stores ({refused} node refusals by the probe), {reused} epochs reused after a claim deletion, {overlapped} schedules with an overlap after claim deletions ({overlap_ms} ms in all)"
    );
    // Nodes cut off at the wipe until the end see nothing (their sessions
    // still stop, at their validity: checked above); most schedules see it.
    assert!(
        noticed * 10 >= wiped * 9,
        "{noticed} of {wiped} wipes noticed"
    );
    assert!(lock_free == 0 || refused > 0, "the probe never refused");
    // The known gap (a claim deleted twice between two of a node's
    // listings) shows in about 1 schedule in 10,000; a broken rule shows in
    // dozens. Each test may see at most 2.
    assert!(
        overlapped <= 2,
        "{overlapped} schedules ran a session twice"
    );
    assert!(runs_total > (to - from) as usize * 3, "{runs_total} runs");
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
