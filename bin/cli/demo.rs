//! `leasehold demo`: a fleet of three nodes in one process on a local
//! directory store (the default), and `leasehold demo --lease`: leader
//! election among three contenders. No server and no credentials.
//!
//! The lease demo: The leader is killed
//! (its process state dropped without a release) and a follower takes over
//! once the lease has been seen unchanged for ttl + margin; then the new
//! leader releases gracefully and the next takes over at once.

use leasehold::Name;
use leasehold::clock::{Clock, SystemClock};
use leasehold::error::Error;
use leasehold::lease::{Acquire, AcquireOptions, Lease, LeaseClient};
use leasehold::store::{CountingStore, OpenOptions, Store, open_store};
use std::sync::Arc;
use std::time::Duration;

fn default_store(store_url: Option<String>) -> (String, Option<TempDir>) {
    match store_url {
        Some(u) => (u, None),
        None => {
            let dir = std::env::temp_dir().join(format!("leasehold-demo-{}", std::process::id()));
            (format!("file://{}", dir.display()), Some(TempDir(dir)))
        }
    }
}

pub async fn run(store_url: Option<String>, ttl: Duration) -> Result<(), Error> {
    let (url, _tmp) = default_store(store_url);
    let store = open_store(&url, &OpenOptions::default()).await?;
    let counting = Arc::new(CountingStore::new(store));
    let store: Arc<dyn Store> = counting.clone();
    println!("store   {url}");
    refuse_occupied(&store).await?;
    let report = leasehold::probe::probe(
        &store,
        &leasehold::clock::OsEntropy::new(),
        &SystemClock::new(),
    )
    .await?;
    println!(
        "probe   conditional writes honoured ({} steps ok)",
        report.steps.iter().filter(|s| s.ok).count()
    );
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let name = Name::new("leader")?;
    let opts = AcquireOptions::ttl(ttl);
    let nodes: Vec<LeaseClient> = ["alpha", "bravo", "charlie"]
        .iter()
        .map(|n| {
            LeaseClient::builder(store.clone(), Name::new(*n)?)
                .clock(clock.clone())
                .build()
        })
        .collect::<Result<_, _>>()?;
    let requests_before = counting.counts();
    let t0 = clock.now();

    // A new lease is declared once (as `leasehold lease create` does): a
    // name with no record is otherwise taken for a deleted one and waited
    // out for a ttl.
    nodes[0].create(&name).await?;
    println!(
        "{:>7}  leases/leader declared (create-if-absent of a released placeholder)",
        ms(t0, &clock)
    );

    // Round 1: everyone tries; exactly one wins.
    let mut leader: Option<(usize, Lease)> = None;
    for (i, n) in nodes.iter().enumerate() {
        match n.acquire(&name, &opts).await? {
            Acquire::Acquired(l) => {
                println!(
                    "{:>7}  {} acquired leases/leader, epoch {}",
                    ms(t0, &clock),
                    n.holder().node,
                    l.epoch()
                );
                leader = Some((i, l));
            }
            Acquire::Held { holder, epoch, .. } => {
                println!(
                    "{:>7}  {} sees it held by {} (epoch {epoch})",
                    ms(t0, &clock),
                    n.holder().node,
                    holder.node
                )
            }
            Acquire::Absent { .. } => {
                return Err(Error::Internal(
                    "leases/leader vanished right after it was declared".into(),
                ));
            }
        }
    }
    let (li, mut lease) =
        leader.ok_or_else(|| Error::Internal("nobody won the first round".into()))?;
    let placed = clock.now().saturating_since(t0);
    for _ in 0..2 {
        clock.sleep(ttl / 3).await;
        lease.renew().await?;
        println!(
            "{:>7}  {} renewed (one conditional PUT), valid for {}ms more",
            ms(t0, &clock),
            nodes[li].holder().node,
            lease.remaining().as_millis()
        );
    }

    // Kill the leader: no release, it simply stops renewing.
    let old_epoch = lease.epoch();
    drop(lease);
    let killed_at = clock.now();
    println!(
        "{:>7}  {} is killed (no release); followers must wait ttl + margin of unchanged observation",
        ms(t0, &clock),
        nodes[li].holder().node
    );
    let (ni, mut lease) = follow_until_acquired(&nodes, &[li], &name, &opts, &clock, t0).await?;
    let failover = clock.now().saturating_since(killed_at);
    assert!(lease.epoch() > old_epoch);

    // Graceful hand-over: release, and the next one takes over at once.
    lease.renew().await?;
    let epoch = lease.epoch();
    lease.release().await?;
    println!(
        "{:>7}  {} released (tombstone keeps epoch {epoch})",
        ms(t0, &clock),
        nodes[ni].holder().node
    );
    let released_at = clock.now();
    let (_, l3) = follow_until_acquired(&nodes, &[li, ni], &name, &opts, &clock, t0).await?;
    let handover = clock.now().saturating_since(released_at);
    let used = counting.counts().since(&requests_before);
    println!();
    println!("summary");
    println!("  time to elect a leader      {}", fmt_d(placed));
    println!(
        "  failover after a kill       {} (ttl {} + margin {} + polling)",
        fmt_d(failover),
        fmt_d(ttl),
        fmt_d(leasehold::lease::default_margin(ttl))
    );
    println!("  hand-over after a release   {}", fmt_d(handover));
    println!(
        "  epochs (fencing tokens)     1 -> {} -> {}",
        old_epoch + 1,
        l3.epoch()
    );
    println!(
        "  bucket requests             {} ({} creates, {} conditional updates, {} reads)",
        used.total(),
        used.put_create,
        used.put_match,
        used.get
    );
    l3.release().await?;
    Ok(())
}

async fn follow_until_acquired(
    nodes: &[LeaseClient],
    skip: &[usize],
    name: &Name,
    opts: &AcquireOptions,
    clock: &Arc<dyn Clock>,
    t0: leasehold::clock::MonoTime,
) -> Result<(usize, Lease), Error> {
    loop {
        for (i, n) in nodes.iter().enumerate() {
            if skip.contains(&i) {
                continue;
            }
            if let Acquire::Acquired(l) = n.acquire(name, opts).await? {
                println!(
                    "{:>7}  {} took over leases/leader, epoch {}",
                    ms(t0, clock),
                    n.holder().node,
                    l.epoch()
                );
                return Ok((i, l));
            }
        }
        clock.sleep(opts.ttl / 5).await;
    }
}

fn fmt_d(d: Duration) -> String {
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

fn ms(t0: leasehold::clock::MonoTime, clock: &Arc<dyn Clock>) -> String {
    format!("{}ms", clock.now().saturating_since(t0).as_millis())
}

/// Removes the demo's directory on exit.
struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One in-process node of the fleet demo.
struct DemoNode {
    id: String,
    shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), Error>>,
    /// Its renewals' thread, as a daemon has (dropped after the node).
    _renew: leasehold::fleet::renew_thread::RenewThread,
}

/// Current claims: session -> (owner node, epoch, state).
async fn claims(
    store: &Arc<dyn Store>,
) -> Result<
    std::collections::BTreeMap<String, (String, u64, leasehold::fleet::claim::ClaimState)>,
    Error,
> {
    use futures::StreamExt;
    let mut out = std::collections::BTreeMap::new();
    let mut list = store.list(leasehold::keys::SESSIONS);
    while let Some(e) = list.next().await {
        let e = e.map_err(|e| Error::from_store("list", leasehold::keys::SESSIONS, e))?;
        if let Some(o) = store
            .get(&e.key)
            .await
            .map_err(|err| Error::from_store("get", &e.key, err))?
        {
            let c = leasehold::fleet::claim::ClaimRecord::decode(&e.key, &o.bytes)?;
            out.insert(
                leasehold::keys::tail(leasehold::keys::SESSIONS, &e.key).to_string(),
                (c.owner.node, c.epoch, c.state),
            );
        }
    }
    Ok(out)
}

pub async fn fleet(store_url: Option<String>, ttl: Duration, sessions: u32) -> Result<(), Error> {
    use leasehold::fleet::claim::ClaimState;
    use leasehold::fleet::manifest::{self, RestartPolicy, Spec};
    use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
    use leasehold::fleet::runner::ExecRunner;
    if ttl < Duration::from_millis(100) {
        return Err(Error::invalid("ttl", "at least 100ms for the fleet demo"));
    }
    let (url, _tmp) = default_store(store_url);
    // An HTTP store's socket work on a thread of its own, outliving every
    // node: the nodes' renew threads share its connections, never own them.
    let io = leasehold::fleet::renew_thread::RenewThread::start("leasehold-io")?;
    let opts = OpenOptions {
        io_runtime: Some(io.handle()),
        ..OpenOptions::default()
    };
    // The nodes' requests are counted; the demo's own watching is not.
    let observer_store = open_store(&url, &opts).await?;
    let counting = Arc::new(CountingStore::new(observer_store.clone()));
    let store: Arc<dyn Store> = counting.clone();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let entropy = Arc::new(leasehold::clock::OsEntropy::new());
    println!("store   {url}");
    refuse_occupied(&observer_store).await?;
    leasehold::probe::probe(&store, entropy.as_ref(), clock.as_ref()).await?;
    println!("probe   conditional writes honoured");
    let (marker, _) =
        leasehold::fleet::marker::init(&store, entropy.as_ref(), clock.wall_ms(), 1).await?;
    println!("init    {}", marker.describe());
    let exe = std::env::current_exe().map_err(|e| Error::Internal(e.to_string()))?;
    let lock_dir =
        std::env::temp_dir().join(format!("leasehold-demo-locks-{}", std::process::id()));
    let _locks = TempDir(lock_dir.clone());
    let start = |id: &str| -> Result<DemoNode, Error> {
        let mut cfg = NodeConfig::new(Name::new(id)?, ttl);
        cfg.capacity = sessions.max(1);
        cfg.probe = false; // probed once above
        let lock = leasehold::hostlock::HostLock::acquire(
            &lock_dir,
            &store.identity(),
            id,
            &leasehold::hostlock::hostname(),
        )?;
        let runner = Arc::new(
            ExecRunner::new(exe.clone(), clock.clone(), Duration::from_millis(500))
                // As `node run` does: nobody when this runs as root.
                .with_session_users(super::session_users(None, false)?)
                .with_containment(leasehold::fleet::contain::Mode::Auto)?,
        );
        let renew = leasehold::fleet::renew_thread::RenewThread::start(&format!("renew-{id}"))?;
        let deps = NodeDeps {
            entropy: entropy.clone(),
            host_lock: Some(Arc::new(lock)),
            renew_on: Some(renew.handle()),
            journal: Arc::new(leasehold::fleet::journal::Journal::new(1000, 1 << 20)),
            ..NodeDeps::new(store.clone(), clock.clone(), runner)
        };
        let shutdown = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
        Ok(DemoNode {
            id: id.to_string(),
            shutdown,
            task,
            _renew: renew,
        })
    };
    let mut nodes = vec![start("alpha")?, start("bravo")?, start("charlie")?];
    println!(
        "nodes   alpha, bravo, charlie (ttl {}ms, each session is `sleep 3600` under a dead-man switch)",
        ttl.as_millis()
    );
    let before = counting.counts();
    let t0 = clock.now();
    for i in 0..sessions {
        let spec = Spec {
            restart: RestartPolicy::Always.into(),
            ..Spec::new("sleep", &["3600"])
        };
        manifest::apply(
            &store,
            entropy.as_ref(),
            &Name::new(format!("job-{i}"))?,
            &spec,
            None,
        )
        .await?;
    }
    println!("applied {sessions} manifests");
    let deadline = clock.now() + Duration::from_secs(30) + ttl * 5;
    let placed = loop {
        let c = claims(&observer_store).await?;
        if c.len() == sessions as usize && c.values().all(|v| v.2 == ClaimState::Running) {
            break c;
        }
        if clock.now() >= deadline {
            return Err(Error::Internal(format!(
                "sessions were not placed in time: {}",
                summary(&c, sessions)
            )));
        }
        clock.sleep(Duration::from_millis(20)).await;
    };
    let time_to_place = clock.now().saturating_since(t0);
    println!();
    print_placement(&placed);
    // Kill the busiest node abruptly: no release, no goodbye. Its watchdogs
    // see it vanish and kill its sessions at once.
    let mut load: std::collections::BTreeMap<&str, usize> = Default::default();
    for (n, _, _) in placed.values() {
        *load.entry(n.as_str()).or_default() += 1;
    }
    let victim_id = load
        .iter()
        .max_by_key(|(_, c)| **c)
        .map(|(n, _)| n.to_string())
        .unwrap_or_default();
    let Some(victim) = nodes.iter().position(|n| n.id == victim_id) else {
        return Err(Error::Internal(format!(
            "no demo node runs a session ({})",
            summary(&placed, sessions)
        )));
    };
    let v = nodes.remove(victim);
    v.task.abort();
    let _ = v.task.await;
    let killed_at = clock.now();
    println!();
    println!(
        "{:>7}  killed {victim_id} abruptly; its sessions wait for its node lease to be seen unchanged for ttl + margin",
        ms(t0, &clock)
    );
    let moved = loop {
        let c = claims(&observer_store).await?;
        let done = c
            .values()
            .all(|(n, _, s)| *n != victim_id && *s == ClaimState::Running);
        if done {
            break c;
        }
        if clock.now() >= deadline + ttl * 10 {
            return Err(Error::Internal(format!(
                "sessions did not move in time: {}",
                summary(&c, sessions)
            )));
        }
        clock.sleep(Duration::from_millis(20)).await;
    };
    let failover = clock.now().saturating_since(killed_at);
    println!();
    print_placement(&moved);
    let used = counting.counts().since(&before);
    for n in nodes.drain(..) {
        n.shutdown.cancel();
        n.task.await.map_err(|e| Error::Internal(e.to_string()))??;
    }
    println!();
    println!("summary");
    println!(
        "  time to place {sessions} sessions   {}",
        fmt_d(time_to_place)
    );
    println!(
        "  failover after kill -9      {} (ttl {} + margin {} + polling)",
        fmt_d(failover),
        fmt_d(ttl),
        fmt_d(leasehold::lease::default_margin(ttl))
    );
    let moved_count = placed.values().filter(|(n, _, _)| *n == victim_id).count();
    println!("  sessions moved              {moved_count} (epoch 1 -> 2)");
    println!(
        "  bucket requests by nodes    {} ({} list pages, {} reads, {} creates, {} conditional updates)",
        used.total(),
        used.list_pages,
        used.get,
        used.put_create,
        used.put_match
    );
    Ok(())
}

/// The claim state as `ls` spells it.
fn state_word(s: leasehold::fleet::claim::ClaimState) -> &'static str {
    s.as_str()
}

/// "4 of 6 running (job-2: released on bravo, ...)", for a demo that timed out.
fn summary(
    c: &std::collections::BTreeMap<String, (String, u64, leasehold::fleet::claim::ClaimState)>,
    want: u32,
) -> String {
    use leasehold::fleet::claim::ClaimState;
    let running = c.values().filter(|v| v.2 == ClaimState::Running).count();
    let others: Vec<String> = c
        .iter()
        .filter(|(_, v)| v.2 != ClaimState::Running)
        .take(5)
        .map(|(s, (n, _, st))| format!("{s}: {} on {n}", state_word(*st)))
        .collect();
    format!(
        "{running} of {want} running, {} claimed{}",
        c.len(),
        if others.is_empty() {
            String::new()
        } else {
            format!(" ({})", others.join(", "))
        }
    )
}

/// The demo writes a fleet of its own (a marker, manifests, three nodes):
/// never into a store that holds anything, a live fleet above all.
async fn refuse_occupied(store: &Arc<dyn Store>) -> Result<(), Error> {
    use futures::StreamExt;
    let mut list = store.list("");
    if let Some(e) = list.next().await {
        let e = e.map_err(|e| Error::from_store("list", "", e))?;
        return Err(Error::invalid(
            "--store",
            format!(
                "{store} is not empty (it holds {}, maybe more): the demo runs its own fleet and writes only into an empty store; omit --store for a fresh local one",
                e.key
            ),
        ));
    }
    Ok(())
}

fn print_placement(
    c: &std::collections::BTreeMap<String, (String, u64, leasehold::fleet::claim::ClaimState)>,
) {
    println!("  {:<10} {:<8} {:<6} state", "session", "node", "epoch");
    for (s, (n, e, st)) in c {
        println!("  {s:<10} {n:<8} {e:<6} {}", state_word(*st));
    }
}
