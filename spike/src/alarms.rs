//! Alarms under node kills (issue #39's target): N nodes in this process on
//! one store, each session asleep as soon as it runs, an alarm set every
//! second for a session asleep (5 s ahead), and one node killed every
//! `kill_every` (its task aborted, as kill -9: nothing released, its lease
//! left to expire) with a fresh node started in its place. Reports how late
//! each alarm fired: the firing node's `alarm-fired` event against the
//! alarm's time, both on this process's wall clock.

use leasehold::clock::{Clock, OsEntropy, SystemClock};
use leasehold::fleet::claim::{ClaimRecord, ClaimState};
use leasehold::fleet::journal::{EventKind, Journal};
use leasehold::fleet::manifest::{self, RestartPolicy, Spec};
use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
use leasehold::fleet::runner::{RecordingRunner, Runner};
use leasehold::store::{OpenOptions, Store, open_store};
use leasehold::{Name, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct AlarmNode {
    journal: Arc<Journal>,
    runner: Arc<RecordingRunner>,
    task: tokio::task::JoinHandle<Result<()>>,
}

fn start(id: &str, ttl: Duration, store: &Arc<dyn Store>, clock: &Arc<dyn Clock>) -> AlarmNode {
    let mut cfg = NodeConfig::new(Name::new(id).unwrap(), ttl);
    cfg.probe = false;
    cfg.capacity = 1000;
    let journal = Arc::new(Journal::new(1_000_000, 256 << 20));
    let runner = Arc::new(RecordingRunner::new(clock.clone()).with_exit_wakeups());
    let deps = NodeDeps {
        journal: journal.clone(),
        ..NodeDeps::new(store.clone(), clock.clone(), runner.clone())
    };
    AlarmNode {
        journal,
        runner,
        task: tokio::spawn(node::run(cfg, deps, CancellationToken::new())),
    }
}

#[allow(clippy::too_many_arguments)]
pub async fn alarms(
    url: &str,
    n: usize,
    sessions: usize,
    ttl: Duration,
    secs: u64,
    kill_every: Duration,
    json: bool,
) -> Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let store = open_store(url, &OpenOptions::default()).await?;
    let entropy = OsEntropy::new();
    leasehold::fleet::marker::init(&store, &entropy, clock.wall_ms(), 1).await?;
    let mut spec = Spec::new("sleep", &[]);
    spec.restart = RestartPolicy::Always.into();
    spec.sleep = Some(leasehold::fleet::sleep::SleepRule {
        after_idle: None,
        on_exit: Some(75),
    });
    let names: Vec<Name> = (0..sessions)
        .map(|i| Name::new(format!("alarm-{i:03}")).unwrap())
        .collect();
    for name in &names {
        manifest::apply(&store, &entropy, name, &spec, None).await?;
    }
    let mut nodes: Vec<AlarmNode> = (0..n)
        .map(|i| start(&format!("n{i}"), ttl, &store, &clock))
        .collect();
    let mut dead: Vec<AlarmNode> = Vec::new();
    let t0 = clock.now();
    let end = Duration::from_secs(secs);
    // Alarms from when every session has been placed and slept once.
    let mut next_alarm = ttl * 3;
    let mut next_kill = next_alarm + kill_every;
    let (mut kills, mut set) = (0usize, 0u64);
    let mut armed: HashMap<String, u64> = HashMap::new();
    let mut pick = 0usize;
    loop {
        let t = clock.now().saturating_since(t0);
        if t >= end {
            break;
        }
        for node in &nodes {
            for (s, _) in node.runner.running() {
                node.runner.exit(&s, 75);
            }
        }
        if t >= next_kill {
            let i = kills % n;
            kills += 1;
            let fresh = start(&format!("n{i}-{kills}"), ttl, &store, &clock);
            let old = std::mem::replace(&mut nodes[i], fresh);
            old.task.abort();
            dead.push(old);
            next_kill += kill_every;
        }
        if t >= next_alarm {
            next_alarm += Duration::from_secs(1);
            let wall = clock.wall_ms();
            for _ in 0..sessions {
                pick = (pick + 1) % sessions;
                let name = &names[pick];
                if armed
                    .get(name.as_str())
                    .is_some_and(|at| wall < at + 10_000)
                {
                    continue;
                }
                let asleep = match store.get(&leasehold::keys::session(name)).await {
                    Ok(Some(o)) => ClaimRecord::decode("c", &o.bytes)
                        .is_ok_and(|c| c.state == ClaimState::Sleeping),
                    _ => false,
                };
                if asleep {
                    let at = wall + 5_000;
                    leasehold::fleet::alarm::set(&store, &entropy, name, at, wall).await?;
                    armed.insert(name.to_string(), at);
                    set += 1;
                    break;
                }
            }
        }
        clock.sleep(Duration::from_millis(50)).await;
    }
    // Alarms set near the end: time to fire.
    clock.sleep(ttl * 2).await;
    for node in nodes.iter().chain(dead.iter()) {
        node.task.abort();
    }
    let mut fired: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
    for node in nodes.iter().chain(dead.iter()) {
        let page = node
            .journal
            .after(0, usize::MAX)
            .map_err(|e| leasehold::Error::invalid("journal", format!("{e:?}")))?;
        for e in page.events {
            if e.kind == EventKind::AlarmFired {
                fired
                    .entry((e.session.clone().unwrap_or_default(), e.detail.clone()))
                    .or_default()
                    .push(e.at_ms);
            }
        }
    }
    let twice = fired.values().filter(|v| v.len() > 1).count();
    let mut late: Vec<u64> = fired
        .iter()
        .filter_map(|((_, detail), at)| {
            let set_for: u64 = detail
                .strip_prefix("the alarm set for ")?
                .strip_suffix(" ms")?
                .parse()
                .ok()?;
            Some(at.iter().min()?.saturating_sub(set_for))
        })
        .collect();
    late.sort_unstable();
    let q = |p: f64| {
        late.get(((late.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0)
    };
    let bound = ttl.as_millis() as u64 + 2_000;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "nodes": n, "sessions": sessions, "ttl_ms": ttl.as_millis() as u64,
                "secs": secs, "kills": kills, "alarms_set": set, "alarms_fired": fired.len(),
                "fired_twice": twice, "late_p50_ms": q(0.5), "late_p99_ms": q(0.99),
                "late_max_ms": late.last().copied().unwrap_or(0), "bound_ms": bound,
            })
        );
    } else {
        println!(
            "| nodes | kills | alarms set | fired | fired twice | late p50 | late p99 | late max | bound (ttl + 2 s) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        println!(
            "| {n} | {kills} (one every {} s) | {set} | {} | {twice} | {} ms | {} ms | {} ms | {bound} ms |",
            kill_every.as_secs(),
            fired.len(),
            q(0.5),
            q(0.99),
            late.last().copied().unwrap_or(0)
        );
    }
    Ok(())
}
