//! Fleet measurements: placement, conflicts, failover, steady-state cost.

use leasehold::clock::{Clock, Entropy, ManualClock, OsEntropy, SystemClock};
use leasehold::fleet::claim::{ClaimRecord, ClaimState};
use leasehold::fleet::feed::HintForms;
use leasehold::fleet::journal::{EventKind, Journal};
use leasehold::fleet::manifest::{self, RestartPolicy, Spec};
use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
use leasehold::fleet::renew_thread::RenewThread;
use leasehold::fleet::runner::RecordingRunner;
use leasehold::store::{
    CountingStore, ObjectStoreBackend, OpenOptions, RequestCounts, Store, open_store,
};
use leasehold::{Name, Result};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub fn spec() -> Spec {
    Spec {
        restart: RestartPolicy::Always.into(),
        ..Spec::new("sleep", &["3600"])
    }
}

/// Applies `m` sleeper manifests named s00000, s00001, ...
async fn apply_sleepers(store: &Arc<dyn Store>, m: usize) -> Result<()> {
    let entropy = OsEntropy::new();
    for i in 0..m {
        manifest::apply(
            store,
            &entropy,
            &Name::new(format!("s{i:05}")).unwrap(),
            &spec(),
            None,
        )
        .await?;
    }
    Ok(())
}

struct SpikeNode {
    id: String,
    journal: Arc<Journal>,
    status: Arc<leasehold::fleet::node::NodeStatus>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<()>>,
    /// The node's renewals' thread, as `node run` has one (`None`: renewals
    /// on the nodes' shared runtime, as in the virtual hour).
    _renew: Option<RenewThread>,
}

/// Options that put an HTTP store's socket work on `io`: a thread that
/// outlives every node of the run, so the nodes' renew threads (dropped with
/// a killed node) never own a connection the others reuse.
fn io_on(io: &RenewThread) -> OpenOptions {
    OpenOptions {
        io_runtime: Some(io.handle()),
        ..OpenOptions::default()
    }
}

/// `store` writing hints as `node run`'s does: their form is the nodes'
/// to decide (`NodeDeps::hint_forms`, the forms returned, shared by every
/// node that writes through it).
pub(crate) fn hinting(
    store: Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
) -> (Arc<dyn Store>, Arc<HintForms>) {
    let forms = HintForms::auto();
    let store =
        leasehold::fleet::feed::HintingStore::new(store, clock.clone(), Arc::new(OsEntropy::new()))
            .with_forms(forms.clone());
    (Arc::new(store), forms)
}

/// A renew thread for a node on the real clock, unless `inline`.
fn renew_thread(id: &str, inline: bool) -> Option<RenewThread> {
    (!inline).then(|| RenewThread::start(&format!("renew-{id}")).expect("renew thread"))
}

/// A node's configuration at `poll` (grace twice it, `max_poll` four
/// times), or the defaults.
fn poll_cfg(id: &str, ttl: Duration, capacity: u32, poll: Option<Duration>) -> NodeConfig {
    let mut cfg = NodeConfig::new(Name::new(id).unwrap(), ttl);
    cfg.capacity = capacity;
    if let Some(p) = poll {
        cfg.poll = p;
        cfg.grace = p * 2;
        cfg.max_poll = p * 4;
    }
    cfg
}

/// On the real clock; with a renew thread of its own unless `inline`.
fn start_cfg(
    cfg: NodeConfig,
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    inline: bool,
    forms: &Arc<HintForms>,
) -> SpikeNode {
    let renew = renew_thread(cfg.id.as_str(), inline);
    start_nudged(cfg, store, clock, None, renew, forms)
}

/// As `start_cfg`, reachable through (and nudging through) `nudge`.
fn start_nudged(
    mut cfg: NodeConfig,
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    nudge: Option<&leasehold::fleet::nudge::LocalNudge>,
    renew: Option<RenewThread>,
    forms: &Arc<HintForms>,
) -> SpikeNode {
    cfg.probe = false;
    let id = cfg.id.to_string();
    let journal = Arc::new(Journal::new(1_000_000, 256 << 20));
    let deps = NodeDeps {
        journal: journal.clone(),
        nudge: nudge.map(|n| Arc::new(n.clone()) as Arc<dyn leasehold::fleet::nudge::Nudge>),
        renew_on: renew.as_ref().map(RenewThread::handle),
        hint_forms: forms.clone(),
        ..NodeDeps::new(
            store.clone(),
            clock.clone(),
            Arc::new(RecordingRunner::new(clock.clone())),
        )
    };
    let status = deps.status.clone();
    if let Some(n) = nudge {
        n.register(&id, status.clone());
    }
    let shutdown = CancellationToken::new();
    let init_store = store.clone();
    let stop = shutdown.clone();
    let task = tokio::spawn(async move {
        // The marker a node needs (as `leasehold init` writes it); idempotent.
        leasehold::fleet::marker::init(&init_store, &leasehold::clock::OsEntropy::new(), 0, 1)
            .await?;
        node::run(cfg, deps, stop).await
    });
    SpikeNode {
        id,
        journal,
        status,
        shutdown,
        task,
        _renew: renew,
    }
}

/// See `Cmd::Admit`.
pub async fn admit(url: &str, n: usize, ttl: Duration, samples: usize, json: bool) -> Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let io = RenewThread::start("spike-io")?;
    // As the CLI and the daemon write: through the hinting store (a hint
    // per manifest and claim write, a ring of the bell per manifest write).
    let (store, forms) = hinting(open_store(url, &io_on(&io)).await?, &clock);
    // The daemon's defaults: full listings every 60 ttls.
    let nodes: Vec<SpikeNode> = (0..n)
        .map(|i| {
            let mut cfg = NodeConfig::new(Name::new(format!("n{i}")).unwrap(), ttl);
            cfg.capacity = 1000;
            cfg.full_every = ttl * DEFAULT_FULL_EVERY_TTLS;
            start_cfg(cfg, &store, &clock, false, &forms)
        })
        .collect();
    // Idle: a node backs off to one pass per max_poll (= ttl) after about
    // three quiet passes (ttl/3, 2ttl/3, ttl).
    let idle = ttl * 2 + ttl / 2;
    clock.sleep(idle).await;
    let entropy = OsEntropy::new();
    let claim_state = |name: String| {
        let store = store.clone();
        async move {
            match store.get(&leasehold::keys::session(name)).await {
                Ok(Some(o)) => ClaimRecord::decode("c", &o.bytes).ok().map(|c| c.state),
                _ => None,
            }
        }
    };
    // Spread over one ttl, deterministically.
    let phase = |i: usize, k: u64| {
        Duration::from_millis((i as u64 * 2_719 + k * 1_123) % ttl.as_millis().max(1) as u64)
    };
    let mut results = BTreeMap::new();
    for nudge in [false, true] {
        let (mut up, mut down) = (Vec::new(), Vec::new());
        for i in 0..samples {
            let name = Name::new(format!("a{}-{i}", if nudge { "n" } else { "p" })).unwrap();
            let t0 = clock.now();
            manifest::apply(&store, &entropy, &name, &spec(), None).await?;
            if nudge {
                // `apply --token-file` nudges the (at most two) nodes ranked
                // first; in process, nudging every node is the same or more.
                for node in &nodes {
                    node.status.nudge();
                }
            }
            while claim_state(name.to_string()).await != Some(ClaimState::Running) {
                clock.sleep(Duration::from_millis(5)).await;
            }
            up.push(clock.now().saturating_since(t0));
            // Idle again, at another phase of the nodes' bell reads and
            // passes (a whole number of bell periods would land every
            // sample at the same point of them).
            clock.sleep(idle + phase(i, 1)).await;
            let t1 = clock.now();
            manifest::delete(&store, &name).await?;
            if nudge {
                for node in &nodes {
                    node.status.nudge();
                }
            }
            while claim_state(name.to_string()).await != Some(ClaimState::Released) {
                clock.sleep(Duration::from_millis(5)).await;
            }
            down.push(clock.now().saturating_since(t1));
            clock.sleep(idle + phase(i, 2)).await;
        }
        results.insert(if nudge { "nudged" } else { "plain" }, (up, down));
    }
    for node in nodes {
        node.shutdown.cancel();
        let _ = node.task.await;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    if json {
        let v: serde_json::Value = results
            .iter()
            .map(|(k, (u, d))| {
                (
                    k.to_string(),
                    serde_json::json!({
                        "apply_to_running_ms_p50": ms(pct(u, 0.5)), "apply_to_running_ms_max": ms(pct(u, 1.0)),
                        "delete_to_released_ms_p50": ms(pct(d, 0.5)), "delete_to_released_ms_max": ms(pct(d, 1.0)),
                        "samples": u.len(),
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
        println!("{}", serde_json::to_string_pretty(&v).expect("json"));
    } else {
        println!(
            "{n} idle nodes, ttl {} ms, {samples} samples per mode (wall clock)",
            ttl.as_millis()
        );
        for (k, (u, d)) in &results {
            println!(
                "  {k:<7} apply -> running p50 {:>7.0} ms max {:>7.0} ms   delete -> released p50 {:>7.0} ms max {:>7.0} ms",
                ms(pct(u, 0.5)),
                ms(pct(u, 1.0)),
                ms(pct(d, 0.5)),
                ms(pct(d, 1.0))
            );
        }
    }
    Ok(())
}

/// session -> (owner, epoch) for running claims.
async fn owners(store: &Arc<dyn Store>) -> Result<BTreeMap<String, (String, u64)>> {
    use futures::StreamExt;
    let mut out = BTreeMap::new();
    let keys: Vec<String> = store
        .list(leasehold::keys::SESSIONS)
        .filter_map(|e| async move { e.ok().map(|e| e.key) })
        .collect()
        .await;
    for k in keys {
        if let Ok(Some(o)) = store.get(&k).await
            && let Ok(c) = ClaimRecord::decode(&k, &o.bytes)
            && c.state == ClaimState::Running
        {
            out.insert(
                leasehold::keys::tail(leasehold::keys::SESSIONS, &k).to_string(),
                (c.owner.node, c.epoch),
            );
        }
    }
    Ok(out)
}

/// The `p` quantile (0..=1) of `v`, nearest rank.
pub(crate) fn pct(v: &[Duration], p: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[allow(clippy::too_many_arguments)]
pub async fn placement(
    url: &str,
    n: usize,
    m: usize,
    ttl: Duration,
    kills: usize,
    capacity: Option<u32>,
    daemon_defaults: bool,
    renew_inline: bool,
    latency: Duration,
    settle: Duration,
    json: bool,
) -> Result<()> {
    let io = RenewThread::start("spike-io")?;
    let base = open_store(url, &io_on(&io)).await?;
    let run = OsEntropy::new().hex_id();
    // Fresh namespace per run on shared stores.
    let store: Arc<dyn Store> = match url {
        u if u.starts_with("memory") => base,
        u => {
            open_store(
                &format!("{}/spike-fleet-{run}", u.trim_end_matches('/')),
                &io_on(&io),
            )
            .await?
        }
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    // With the daemon's defaults every writer hints, as `node run` and
    // `leasehold apply` do: the nodes read the change feed between full
    // listings, so a manifest applied without a hint would wait for one.
    // The hints' form is the nodes' to decide, as in `node run` (one
    // decision shared by every node here: they are all of this build).
    let (store, forms) = if daemon_defaults {
        hinting(store, &clock)
    } else {
        (store, HintForms::auto())
    };
    // The nodes' latency (a FaultStore delays a GET or PUT on its way in
    // and again on its way out, each uniformly up to `latency`; listings
    // and deletes are not delayed): the applier writes without it, so
    // that placement, not the apply, is measured.
    let slow: Arc<dyn Store> = if latency.is_zero() {
        store.clone()
    } else {
        Arc::new(
            leasehold::store::FaultStore::new(store.clone())
                .with_clock(clock.clone())
                .with_plan(
                    1,
                    leasehold::store::FaultPlan {
                        delay: 1.0,
                        max_delay: latency,
                        ..Default::default()
                    },
                ),
        )
    };
    let counting = Arc::new(CountingStore::new(slow));
    let node_store: Arc<dyn Store> = counting.clone();
    // By default, room for every session on the last node standing.
    let capacity = capacity.unwrap_or(m.max(8) as u32);
    if (capacity as usize) * n.saturating_sub(kills) < m {
        return Err(leasehold::Error::Invalid {
            what: "--capacity".into(),
            reason: format!(
                "{n} nodes less {kills} kills cannot hold {m} sessions at {capacity} each"
            ),
        });
    }
    let poll = if daemon_defaults { ttl / 3 } else { ttl / 10 };
    let mut nodes: Vec<SpikeNode> = (0..n)
        .map(|i| {
            let id = format!("n{i:02}");
            if daemon_defaults {
                let mut cfg = NodeConfig::new(Name::new(id).unwrap(), ttl);
                cfg.capacity = capacity;
                cfg.full_every = ttl * DEFAULT_FULL_EVERY_TTLS;
                cfg.full_every_objects = leasehold::fleet::node::DEFAULT_FULL_EVERY_OBJECTS;
                start_cfg(cfg, &node_store, &clock, renew_inline, &forms)
            } else {
                start_cfg(
                    poll_cfg(&id, ttl, capacity, Some(poll)),
                    &node_store,
                    &clock,
                    renew_inline,
                    &forms,
                )
            }
        })
        .collect();
    clock.sleep(ttl / 2).await; // let every node register
    eprintln!("applying {m} manifests to {n} nodes (ttl {ttl:?}, poll {poll:?})");
    let t0 = clock.now();
    apply_sleepers(&store, m).await?;
    let applied = clock.now().saturating_since(t0);
    let applied_wall = clock.wall_ms();
    // Progress is read from the nodes' journals in memory, not by polling
    // the store: polling every claim loaded a slow server (moto) enough to
    // distort what was being measured.
    // Copying every journal each time would cost a core at 100,000
    // sessions and slow what is measured: read incrementally.
    let mut started = Started {
        marks: vec![0; nodes.len()],
        names: Default::default(),
    };
    let placed_at;
    loop {
        started.advance(&nodes);
        if started.names.len() == m {
            placed_at = clock.now().saturating_since(t0);
            break;
        }
        if clock.now().saturating_since(t0) > Duration::from_secs(1800) {
            return Err(leasehold::Error::Internal(format!(
                "placed {} of {m} in 30 min",
                started.names.len()
            )));
        }
        eprint!("\rplaced {}/{m}", started.names.len());
        clock.sleep(Duration::from_millis(20)).await;
    }
    eprintln!("\rplaced {m}/{m}     ");
    let claims: usize = nodes
        .iter()
        .map(|n| count(&n.journal, EventKind::Claimed))
        .sum();
    let conflicts: usize = nodes
        .iter()
        .map(|n| count(&n.journal, EventKind::Conflict))
        .sum();
    let spread: BTreeMap<String, usize> =
        owners(&store)
            .await?
            .values()
            .fold(BTreeMap::new(), |mut a, (n, _)| {
                *a.entry(n.clone()).or_default() += 1;
                a
            });
    // Failover: kill nodes one at a time (abort: no release), time until all
    // of the victim's sessions run elsewhere.
    clock.sleep(settle).await;
    let mut failovers = Vec::new();
    let mut phases = Vec::new();
    for k in 0..kills.min(n.saturating_sub(1)) {
        let o = owners(&store).await?;
        let victim = nodes.remove(0);
        let theirs: Vec<String> = o
            .iter()
            .filter(|(_, (n, _))| *n == victim.id)
            .map(|(s, _)| s.clone())
            .collect();
        let mut started = Started::from_latest(&nodes);
        let kill_wall = clock.wall_ms();
        victim.task.abort();
        let _ = victim.task.await;
        let t = clock.now();
        // Done when every one of the victim's sessions has started on a
        // survivor (journals, in memory, read incrementally: no polling of
        // the store).
        loop {
            started.advance(&nodes);
            if theirs.iter().all(|s| started.names.contains(s)) {
                break;
            }
            clock.sleep(Duration::from_millis(5)).await;
        }
        let d = clock.now().saturating_since(t);
        eprintln!(
            "kill {}: {} sessions of {} moved in {d:?}",
            k + 1,
            theirs.len(),
            victim.id
        );
        failovers.push(d);
        // Where the time went (survivors' journals, wall ms after the
        // kill): the first fence of the victim, then the first and last
        // claim and start of its sessions.
        let mine: std::collections::HashSet<&str> = theirs.iter().map(String::as_str).collect();
        let (mut fenced, mut claimed, mut started_at) = (None::<u64>, Vec::new(), Vec::new());
        for node in &nodes {
            if let Ok(p) = node.journal.after(0, usize::MAX) {
                for e in p.events.iter().filter(|e| e.at_ms >= kill_wall) {
                    let after = e.at_ms - kill_wall;
                    let theirs = e.session.as_deref().is_some_and(|s| mine.contains(s));
                    match e.kind {
                        EventKind::Fenced => fenced = Some(fenced.map_or(after, |f| f.min(after))),
                        EventKind::Claimed if theirs => claimed.push(after),
                        EventKind::Started if theirs => started_at.push(after),
                        _ => {}
                    }
                }
            }
        }
        let span = |v: &[u64]| serde_json::json!([v.iter().min(), v.iter().max()]);
        phases.push(serde_json::json!({
            "fenced_ms": fenced,
            "claimed_ms": span(&claimed),
            "started_ms": span(&started_at),
        }));
    }
    // When claims and conflicts happened, in 5 s buckets from the last
    // apply (surviving nodes): whether conflicts come with the main wave
    // of claims or after it.
    let mut when: BTreeMap<&str, BTreeMap<i64, u64>> = BTreeMap::new();
    for node in &nodes {
        if let Ok(p) = node.journal.after(0, usize::MAX) {
            for e in p.events {
                let k = match e.kind {
                    EventKind::Claimed => "claimed",
                    EventKind::Conflict => "conflict",
                    _ => continue,
                };
                let b = (e.at_ms as i64 - applied_wall as i64).div_euclid(5000) * 5;
                *when.entry(k).or_default().entry(b).or_default() += 1;
            }
        }
    }
    let used = counting.counts();
    // Every journal event kind, summed over the nodes still in the fleet: a
    // run where nodes lost their leases (an overloaded store) shows it here.
    let mut events: BTreeMap<String, u64> = BTreeMap::new();
    for node in &nodes {
        for (k, v) in node.journal.totals() {
            *events.entry(k.to_string()).or_default() += v;
        }
    }
    // How late the surviving nodes' renewals started, at worst: a renew
    // task starved of its thread shows here before it loses a lease.
    let renew_late_max = nodes
        .iter()
        .map(|n| n.status.renew_histogram().max_late_seconds)
        .fold(0.0f64, f64::max);
    // Graceful shutdown of every survivor at once (each stops its sessions
    // and releases their claims): how long until the last has finished.
    let t = clock.now();
    for n in &nodes {
        n.shutdown.cancel();
    }
    for n in nodes.drain(..) {
        let _ = n.task.await;
    }
    let shutdown = clock.now().saturating_since(t);
    let row = serde_json::json!({
        "shutdown_ms": shutdown.as_millis() as u64,
        "store": url, "nodes": n, "manifests": m, "capacity": capacity, "ttl_ms": ttl.as_millis() as u64, "poll_ms": poll.as_millis() as u64,
        "daemon_defaults": daemon_defaults,
        "renew_thread": !renew_inline,
        "latency_ms": latency.as_millis() as u64,
        "failover_phases": phases,
        "settle_ms": settle.as_millis() as u64,
        "apply_ms": applied.as_millis() as u64,
        "place_all_ms": placed_at.as_millis() as u64,
        "placed_after_last_apply_ms": placed_at.saturating_sub(applied).as_millis() as u64,
        "claims": claims, "conflicts": conflicts,
        "conflicts_per_claim": conflicts as f64 / claims.max(1) as f64,
        "spread": spread,
        "failover_ms": failovers.iter().map(|d| d.as_millis() as u64).collect::<Vec<_>>(),
        "failover_p50_ms": if failovers.is_empty() { 0 } else { pct(&failovers, 0.5).as_millis() as u64 },
        "failover_max_ms": failovers.iter().max().map_or(0, |d| d.as_millis() as u64),
        "requests": used,
        "events": events,
        "renew_late_max_ms": (renew_late_max * 1000.0).round() as u64,
        "by_5s_after_last_apply": when,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&row).unwrap());
        return Ok(());
    }
    println!(
        "| store | nodes | manifests | capacity | ttl | poll | time to place all (from first apply) | claims | conflicts | conflicts per claim |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {url} | {n} | {m} | {capacity} | {}ms | {}ms | {}ms (applying took {}ms) | {claims} | {conflicts} | {:.4} |",
        ttl.as_millis(),
        poll.as_millis(),
        placed_at.as_millis(),
        applied.as_millis(),
        conflicts as f64 / claims.max(1) as f64
    );
    println!();
    println!("spread: {spread:?}");
    println!("journal events (surviving nodes): {events:?}");
    println!(
        "latest start of a renewal after it was due (surviving nodes): {:.0} ms",
        renew_late_max * 1000.0
    );
    if !failovers.is_empty() {
        println!();
        println!("| kills | failover times (ms) | max | goal: ttl + one poll + 1 s |");
        println!("|---|---|---|---|");
        let bound = ttl + poll + Duration::from_secs(1);
        println!(
            "| {} | {:?} | {}ms | {}ms |",
            failovers.len(),
            failovers.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
            failovers.iter().max().unwrap().as_millis(),
            bound.as_millis()
        );
    }
    Ok(())
}

/// The sessions started on each node since a mark, read incrementally:
/// each `advance` copies only the events written since the last, so
/// polling it often costs the nodes (on the same runtime) next to nothing
/// even at 100,000 sessions.
struct Started {
    marks: Vec<u64>,
    names: std::collections::BTreeSet<String>,
}

impl Started {
    /// From each node's latest event on.
    fn from_latest(nodes: &[SpikeNode]) -> Self {
        Started {
            marks: nodes.iter().map(|n| n.journal.latest()).collect(),
            names: Default::default(),
        }
    }

    fn advance(&mut self, nodes: &[SpikeNode]) {
        for (n, mark) in nodes.iter().zip(&mut self.marks) {
            if let Ok(p) = n.journal.after(*mark, usize::MAX) {
                for e in p.events {
                    *mark = (*mark).max(e.seq);
                    if e.kind == EventKind::Started
                        && let Some(name) = e.session
                    {
                        self.names.insert(name);
                    }
                }
            }
        }
    }
}

fn count(j: &Journal, kind: EventKind) -> usize {
    j.after(0, usize::MAX)
        .map(|p| p.events.iter().filter(|e| e.kind == kind).count())
        .unwrap_or(0)
}

/// The settings a user chooses for a node (`node run --ttl`, `--max-poll`).
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub ttl: Duration,
    /// `None`: the default (= ttl).
    pub max_poll: Option<Duration>,
    /// `None`: the daemon's default (`node run --full-every`: 60 ttls).
    /// At or below `max_poll` every pass lists everything (the feed off).
    pub full_every: Option<Duration>,
    /// Nodes nudge the ranked takers of a peer they fence (`node run` with
    /// `--listen` and `--token-file`; here in-process, `fleet::nudge::LocalNudge`).
    pub nudge: bool,
    /// `node run --full-every-objects` (its default unless set): listed
    /// objects per `full_every`, so the interval grows with the fleet; 0
    /// keeps it fixed.
    pub full_every_objects: u64,
    /// The measured window (virtual). An hour unless set; a window that
    /// holds whole grown intervals counts each node's full listings exactly
    /// (at 100,000 sessions one comes every 110 minutes at the defaults).
    pub window: Duration,
}

/// `node run --full-every`'s default, in ttls (bin/cli).
pub const DEFAULT_FULL_EVERY_TTLS: u32 = 60;

impl Settings {
    pub fn full_every(&self) -> Duration {
        self.full_every
            .unwrap_or(self.ttl * DEFAULT_FULL_EVERY_TTLS)
    }
}

/// What one virtual window measured.
struct Hour {
    /// Every request in the window (divide by `hours` for an hour's).
    used: RequestCounts,
    /// The same, by key segment (`leasehold::store::counting::SEGMENTS`).
    by_segment: BTreeMap<&'static str, RequestCounts>,
    hours: f64,
    placed: usize,
    /// Abort of the busiest node → every one of its sessions running on a
    /// survivor, in virtual time, one per kill asked for (`None`: never,
    /// within 20 ttls).
    failover: Vec<Option<Duration>>,
}

impl Hour {
    /// The failover samples' p50, p99 and max (a failover that never ended
    /// counts as the longest); `None` without samples.
    fn failover_stats(&self) -> Option<(Duration, Duration, Duration)> {
        let mut v: Vec<Duration> = self
            .failover
            .iter()
            .map(|f| f.unwrap_or(Duration::MAX))
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort();
        let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
        Some((at(0.5), at(0.99), *v.last().unwrap()))
    }
}

fn secs(d: Duration) -> String {
    if d == Duration::MAX {
        "never".to_string()
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// One virtual hour of steady state with `n` nodes and `s` sessions; then,
/// `kills` times, the busiest node aborted (as kill -9: no release) and the
/// time until its sessions run elsewhere, a fresh node started in its place
/// before the next kill. The kills fall at different phases of the nodes'
/// renewals and passes (an offset stepped by 737 ms, modulo two ttls), so
/// the samples spread over the cases a real kill meets.
async fn virtual_hour(n: usize, s: usize, set: Settings, kills: usize) -> Result<Hour> {
    let ttl = set.ttl;
    let clock = ManualClock::new();
    let dyn_clock: Arc<dyn Clock> = Arc::new(clock.clone());
    let segments = Arc::new(leasehold::store::BySegment::new(Arc::new(
        ObjectStoreBackend::memory(),
    )));
    let counting = Arc::new(CountingStore::new(segments.clone()));
    // Every writer hints through the feed, as the CLI and the daemon do;
    // the hints' writes are counted with everything else.
    let (store, forms) = hinting(counting.clone(), &dyn_clock);
    apply_sleepers(&store, s).await?;
    let nudges = leasehold::fleet::nudge::LocalNudge::new();
    let nodes: Vec<SpikeNode> = (0..n)
        .map(|i| {
            let mut cfg = NodeConfig::new(Name::new(format!("n{i:02}")).unwrap(), ttl);
            cfg.capacity = s.max(1) as u32;
            if let Some(m) = set.max_poll {
                cfg.max_poll = m;
            }
            cfg.full_every = set.full_every();
            cfg.full_every_objects = set.full_every_objects;
            // On the manual clock, every task on this one runtime.
            start_nudged(
                cfg,
                &store,
                &dyn_clock,
                set.nudge.then_some(&nudges),
                None,
                &forms,
            )
        })
        .collect();
    let step = Duration::from_millis(100);
    let advance = async |steps: u64| {
        for _ in 0..steps {
            clock.advance(step);
            for _ in 0..50 {
                tokio::task::yield_now().await;
            }
        }
    };
    // Settle: ten of the longer of ttl and max_poll; with the feed on, also
    // past the retention of the hints the setup wrote (a steady-state hour
    // deletes as many hints as it writes, not the setup's).
    let mut settle = ttl.max(set.max_poll.unwrap_or(ttl)) * 10;
    if set.full_every() > set.max_poll.unwrap_or(ttl) {
        settle = settle.max(leasehold::fleet::feed::RETENTION + set.full_every());
    }
    advance(settle.as_millis() as u64 / 100).await;
    let placed = owners(&store).await?.len();
    let before = counting.counts();
    let before_seg = segments.counts();
    advance(set.window.as_millis() as u64 / 100).await;
    let used = counting.counts().since(&before);
    let by_segment = leasehold::store::counting::since(&segments.counts(), &before_seg);
    let mut failover = Vec::new();
    let mut nodes = nodes;
    let fresh_cfg = |id: String| {
        let mut cfg = NodeConfig::new(Name::new(id).unwrap(), ttl);
        cfg.capacity = s.max(1) as u32;
        if let Some(m) = set.max_poll {
            cfg.max_poll = m;
        }
        cfg.full_every = set.full_every();
        cfg.full_every_objects = set.full_every_objects;
        cfg
    };
    for k in 0..if s > 0 { kills } else { 0 } {
        if k > 0 {
            // The replacement registers and every node lists it (three
            // ttls), then the kill's phase.
            let phase = (k as u64 * 737) % (ttl.as_millis() as u64 * 2);
            advance(ttl.as_millis() as u64 * 3 / 100 + phase / 100).await;
        }
        let placement = owners(&store).await?;
        let mut per_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, (node, _)) in &placement {
            per_node.entry(node.clone()).or_default().push(name.clone());
        }
        let Some((victim, theirs)) = per_node.into_iter().max_by_key(|(_, v)| v.len()) else {
            break;
        };
        let i = nodes.iter().position(|nd| nd.id == victim).unwrap();
        let nd = nodes.remove(i);
        nd.task.abort();
        let _ = nd.task.await;
        let t0 = clock.now();
        // Checked every virtual 100 ms, for at most 20 ttls.
        let limit = (ttl * 20).as_millis() as u64 / 100;
        let mut took = None;
        for _ in 0..limit {
            advance(1).await;
            let now = owners(&store).await?;
            if theirs
                .iter()
                .all(|x| now.get(x).is_some_and(|(node, _)| *node != victim))
            {
                took = Some(clock.now().saturating_since(t0));
                break;
            }
        }
        if std::env::var_os("SPIKE_DEBUG_FAILOVER").is_some() {
            let t0_wall = clock.wall_ms() - clock.now().saturating_since(t0).as_millis() as u64;
            eprintln!(
                "kill {k}: {victim} ({} sessions), took {took:?}",
                theirs.len()
            );
            for nd in &nodes {
                if let Ok(p) = nd.journal.after(0, usize::MAX) {
                    for e in p.events.iter().filter(|e| e.at_ms + 20_000 >= t0_wall) {
                        eprintln!(
                            "  {} {:+} ms {} {:?} {}",
                            nd.id,
                            e.at_ms as i64 - t0_wall as i64,
                            e.kind.as_str(),
                            e.session,
                            e.detail
                        );
                    }
                }
            }
        }
        failover.push(took);
        nodes.push(start_nudged(
            fresh_cfg(format!("r{k:02}")),
            &store,
            &dyn_clock,
            set.nudge.then_some(&nudges),
            None,
            &forms,
        ));
    }
    for nd in nodes {
        nd.shutdown.cancel();
        clock.advance(step);
        tokio::task::yield_now().await;
        nd.task.abort();
    }
    Ok(Hour {
        used,
        by_segment,
        hours: set.window.as_secs_f64() / 3600.0,
        placed,
        failover,
    })
}

/// Runs a virtual hour on a current-thread runtime of its own: there, each
/// `yield_now` hands every ready node task its turn, so the manual clock never
/// outruns the nodes (on a multi-threaded runtime it would).
fn virtual_hour_blocking(n: usize, s: usize, set: Settings, kills: usize) -> Result<Hour> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(virtual_hour(n, s, set, kills))
    })
    .join()
    .expect("virtual hour thread")
}

/// List prices (USD): S3 Standard PUT/LIST $0.005 per 1,000, GET $0.0004
/// per 1,000; R2 class A (PUT, LIST) $4.50 per million, class B (GET)
/// $0.36 per million. DELETE is free on both.
fn dollars(c: &RequestCounts, a: f64, b: f64) -> f64 {
    (c.put_create + c.put_match + c.list_pages) as f64 * a + (c.get + c.get_if_changed) as f64 * b
}
fn s3(c: &RequestCounts) -> f64 {
    dollars(c, 0.005 / 1000.0, 0.0004 / 1000.0)
}
fn r2(c: &RequestCounts) -> f64 {
    dollars(c, 4.5 / 1e6, 0.36 / 1e6)
}
/// Hours in a month, as cloud price sheets count them.
const MONTH_H: f64 = 730.0;
const HOUR: Duration = Duration::from_secs(3600);

pub async fn cost(n: usize, s: usize, set: Settings, kills: usize, json: bool) -> Result<()> {
    let ttl = set.ttl;
    // An idle fleet lists nothing that grows: one hour of it is every hour.
    let idle = virtual_hour_blocking(
        n,
        0,
        Settings {
            window: HOUR,
            ..set
        },
        0,
    )?
    .used;
    let busy = virtual_hour_blocking(n, s, set, kills)?;
    let placed = busy.placed;
    if placed != s {
        return Err(leasehold::Error::Internal(format!(
            "only {placed} of {s} sessions placed before measuring"
        )));
    }
    let busy_used = busy.used;
    let hours = busy.hours;
    // What each segment costs per node-month on S3, from the same counts.
    let seg_usd: BTreeMap<&str, f64> = busy
        .by_segment
        .iter()
        .map(|(k, c)| (*k, s3(c) / hours / n as f64 * MONTH_H))
        .collect();
    // The headline counts every request of the busy fleet (renewals, every
    // list page, every read, every write), per node and per hour of the
    // window. The idle figure and the per-session difference are beside it,
    // not instead of it.
    let per_node = busy_used.total() as f64 / n as f64 / hours;
    let idle_per_node = idle.total() as f64 / n as f64;
    let per_session = (busy_used.total() as f64 / hours - idle.total() as f64) / s.max(1) as f64;
    // The alternative design: one object per session renewed every ttl/3.
    let per_session_alt = 3600.0 / (ttl.as_secs_f64() / 3.0);
    let usd_s3 = s3(&busy_used) / hours / n as f64 * MONTH_H;
    let usd_r2 = r2(&busy_used) / hours / n as f64 * MONTH_H;
    let row = serde_json::json!({
        "nodes": n, "sessions": s, "placed": placed, "ttl_ms": ttl.as_millis() as u64,
        "max_poll_ms": set.max_poll.unwrap_or(ttl).as_millis() as u64,
        "full_every_ms": set.full_every().as_millis() as u64,
        "full_every_objects": set.full_every_objects,
        "full_every_grown_ms": leasehold::fleet::core::full_listing_pace(
            set.full_every(),
            set.full_every_objects,
            (2 * s) as u64,
        ).as_millis() as u64,
        "window_hours": hours,
        "idle_fleet_hour": idle, "busy_fleet_window": busy_used,
        "busy_fleet_window_by_segment": busy.by_segment,
        "usd_per_node_month_s3_by_segment": seg_usd,
        "requests_per_node_hour": per_node,
        "idle_requests_per_node_hour": idle_per_node,
        "requests_per_session_hour": per_session,
        "usd_per_node_month_s3": usd_s3,
        "usd_per_node_month_r2": usd_r2,
        "failover_ms": busy.failover.iter().map(|f| f.map(|d| d.as_millis() as u64)).collect::<Vec<_>>(),
        "one_object_per_session_requests_per_session_hour": per_session_alt,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&row).unwrap());
        return Ok(());
    }
    println!(
        "{hours:.2} virtual hours at steady state, ttl {}ms, max_poll {}ms, full listings every {}ms per {} objects, {n} nodes, {s} sessions ({placed} placed)",
        ttl.as_millis(),
        set.max_poll.unwrap_or(ttl).as_millis(),
        set.full_every().as_millis(),
        set.full_every_objects,
    );
    println!();
    println!("| fleet, per hour | renew PUTs | list pages | GETs | creates | deletes | total |");
    println!("|---|---|---|---|---|---|---|");
    for (label, c, h) in [("idle", &idle, 1.0), ("busy", &busy_used, hours)] {
        println!(
            "| {label} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            c.put_match as f64 / h,
            c.list_pages as f64 / h,
            (c.get + c.get_if_changed) as f64 / h,
            c.put_create as f64 / h,
            c.delete as f64 / h,
            c.total() as f64 / h
        );
    }
    println!();
    println!(
        "| busy fleet, per node-hour, by key | renew PUTs | list pages | GETs | creates | deletes | USD per node-month S3 |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (seg, c) in &busy.by_segment {
        let per = |x: u64| x as f64 / hours / n as f64;
        println!(
            "| {seg} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} |",
            per(c.put_match),
            per(c.list_pages),
            per(c.get + c.get_if_changed),
            per(c.put_create),
            per(c.delete),
            seg_usd[seg]
        );
    }
    println!();
    println!("| figure | leasehold | one object per session, renewed every ttl/3 |");
    println!("|---|---|---|");
    println!(
        "| requests per node-hour (every request of the busy fleet) | {per_node:.0} | {per_node:.0} + sessions' renewals |"
    );
    println!("| of which an idle fleet's | {idle_per_node:.0} | |");
    println!("| requests per session-hour | {per_session:.1} | {per_session_alt:.0} |");
    println!("| USD per node-month, S3 Standard | {usd_s3:.2} | |");
    println!("| USD per node-month, R2 | {usd_r2:.2} | |");
    println!(
        "| USD per session-hour, S3 Standard | {:.6} | {:.6} |",
        per_session * 0.005 / 1000.0,
        per_session_alt * 0.005 / 1000.0
    );
    if let Some((p50, p99, max)) = busy.failover_stats() {
        let goal = ttl + leasehold::lease::default_margin(ttl) + Duration::from_secs(2);
        println!(
            "| failover after an abort (virtual; {} kills): p50 / p99 / max | {} / {} / {} | goal p99 ≤ ttl + margin + 2 s = {} |",
            busy.failover.len(),
            secs(p50),
            secs(p99),
            secs(max),
            secs(goal)
        );
    }
    Ok(())
}

/// Cost against failover time for the settings a user can choose: one row
/// per (ttl, max_poll), each a virtual hour of `n` nodes and `s` sessions
/// followed by the abort of the busiest node.
pub async fn cost_sweep(n: usize, s: usize, json: bool) -> Result<()> {
    let sec = Duration::from_secs;
    // (ttl, max_poll, full_every): None = the defaults.
    let rows = [
        (sec(10), None, Some(sec(10))),
        (sec(5), None, None),
        (sec(10), None, None),
        (sec(10), None, Some(sec(1800))),
        (sec(10), Some(sec(30)), None),
        (sec(10), Some(sec(60)), None),
        (sec(20), None, None),
        (sec(30), None, None),
        (sec(60), None, None),
    ];
    let mut out = Vec::new();
    if !json {
        println!("{n} nodes, {s} sessions; one virtual hour each, then the busiest node aborted");
        println!();
        println!(
            "| ttl | max_poll | full listings every | requests per node-hour | USD per node-month S3 | USD per node-month R2 | failover (virtual) |"
        );
        println!("|---|---|---|---|---|---|---|");
    }
    for (ttl, max_poll, full_every) in rows {
        let set = Settings {
            ttl,
            max_poll,
            full_every,
            nudge: false,
            full_every_objects: leasehold::fleet::node::DEFAULT_FULL_EVERY_OBJECTS,
            window: HOUR,
        };
        let h = virtual_hour_blocking(n, s, set, 1)?;
        if h.placed != s {
            return Err(leasehold::Error::Internal(format!(
                "ttl {ttl:?}: only {} of {s} sessions placed before measuring",
                h.placed
            )));
        }
        let per_node = h.used.total() as f64 / n as f64;
        let (a, b) = (
            s3(&h.used) / n as f64 * MONTH_H,
            r2(&h.used) / n as f64 * MONTH_H,
        );
        let f = h
            .failover
            .first()
            .copied()
            .flatten()
            .map(|d| d.as_millis() as u64);
        if json {
            out.push(serde_json::json!({
                "ttl_ms": ttl.as_millis() as u64,
                "max_poll_ms": max_poll.unwrap_or(ttl).as_millis() as u64,
                "full_every_ms": set.full_every().as_millis() as u64,
                "requests_per_node_hour": per_node,
                "usd_per_node_month_s3": a, "usd_per_node_month_r2": b,
                "failover_ms": f,
            }));
        } else {
            println!(
                "| {} s | {} s | {} s | {per_node:.0} | {a:.2} | {b:.2} | {} |",
                ttl.as_secs(),
                max_poll.unwrap_or(ttl).as_secs(),
                set.full_every().as_secs(),
                f.map_or("never".to_string(), |ms| format!(
                    "{:.1} s",
                    ms as f64 / 1000.0
                ))
            );
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap());
    }
    Ok(())
}
