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

/// Runs one schedule; returns every session run and the faults injected.
async fn schedule(seed: u64, virtual_secs: u64) -> (Vec<Run>, u64) {
    let clock = ManualClock::new();
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let entropy = Arc::new(SeededEntropy::new(seed));
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    leasehold::fleet::marker::init(&inner, entropy.as_ref(), 0, 1)
        .await
        .unwrap();
    for i in 0..6 {
        manifest::apply(
            &inner,
            entropy.as_ref(),
            &Name::new(format!("s{i}")).unwrap(),
            &Spec::new("sleep", &[]),
            None,
        )
        .await
        .unwrap();
    }
    let mut nodes = Vec::new();
    for n in 0..3u64 {
        let id = format!("n{n}");
        let store = Arc::new(
            FaultStore::new(inner.clone())
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
        cfg.probe = false;
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
    for _ in 0..steps {
        clock.advance(STEP);
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
    let injected: u64 = nodes.iter().map(|n| n.store.injected()).sum();
    check_never_twice(seed, &nodes);
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
    for n in nodes {
        // A node may end with an error (its store was cut off while it shut
        // down); what matters is that it ended.
        let _ = n.task.await.unwrap();
    }
    (runs, injected)
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
