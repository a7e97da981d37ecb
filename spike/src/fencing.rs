//! The fencing experiment: our protocol beside a naive wall-clock design, on
//! any store, in real time.
//!
//! N contenders in one process compete for one lease. Each has the shared
//! monotonic clock (so belief intervals are comparable) and its own wall
//! clock, offset by up to ±3 s. While holding, a contender sometimes pauses
//! (as a GC pause or a SIGSTOP would) for up to two TTLs without renewing.
//! While it believes it holds the lease it writes its epoch to a fenced
//! resource.
//!
//! Reported per run: acquisitions; epochs claimed by two contenders; fenced
//! writes accepted from a holder whose epoch was already superseded; and the
//! total time during which two contenders both believed they held the lease.
//!
//! The naive design judges expiry by comparing the record's `renewed_at_ms +
//! ttl_ms` with the reader's wall clock, and the holder believes until its
//! last renewal + ttl on its own clock.

use leasehold::clock::{Clock, Entropy, MonoTime, OsEntropy, SystemClock};
use leasehold::lease::{Acquire, AcquireOptions, LeaseClient};
use leasehold::record::Kind;
use leasehold::store::{Cond, OpenOptions, Store, open_store};
use leasehold::{Name, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A wall clock offset from the real one; the monotonic clock is shared.
#[derive(Debug)]
struct Offset {
    base: Arc<SystemClock>,
    wall_offset_ms: i64,
}

impl Clock for Offset {
    fn now(&self) -> MonoTime {
        self.base.now()
    }
    fn wall_ms(&self) -> u64 {
        (self.base.wall_ms() as i64 + self.wall_offset_ms) as u64
    }
    fn sleep(&self, d: Duration) -> futures::future::BoxFuture<'static, ()> {
        self.base.sleep(d)
    }
}

#[derive(Default)]
struct Shared {
    /// (contender, epoch, start, end) belief intervals on the shared clock.
    beliefs: Vec<(usize, u64, MonoTime, MonoTime)>,
    /// epoch -> contenders that believed they acquired it.
    owners: BTreeMap<u64, Vec<usize>>,
    /// Highest epoch any contender has acquired so far.
    newest: u64,
    /// The fenced resource: highest epoch written.
    resource: u64,
    stale_accepted: u64,
    writes: u64,
    acquisitions: u64,
}

pub struct RunResult {
    pub acquisitions: u64,
    pub two_owner_epochs: usize,
    pub stale_accepted: u64,
    pub writes: u64,
    pub overlap: Duration,
}

fn record_belief(sh: &Mutex<Shared>, who: usize, epoch: u64, start: MonoTime, end: MonoTime) {
    if end > start {
        sh.lock().unwrap().beliefs.push((who, epoch, start, end));
    }
}

/// A fenced write: the resource accepts epochs not below the highest seen.
/// It is stale if a newer epoch had already been acquired.
fn fenced_write(sh: &Mutex<Shared>, epoch: u64) {
    let mut s = sh.lock().unwrap();
    s.writes += 1;
    if epoch >= s.resource {
        s.resource = epoch;
        if epoch < s.newest {
            s.stale_accepted += 1;
        }
    }
}

fn overlap(beliefs: &[(usize, u64, MonoTime, MonoTime)]) -> Duration {
    // Sweep: time during which two or more contenders believe.
    let mut points: Vec<(MonoTime, i32)> = Vec::new();
    for (_, _, a, b) in beliefs {
        points.push((*a, 1));
        points.push((*b, -1));
    }
    points.sort_by(|x, y| x.0.cmp(&y.0).then(x.1.cmp(&y.1)));
    let (mut depth, mut total, mut since) = (0, Duration::ZERO, MonoTime::ZERO);
    for (t, d) in points {
        if depth >= 2 {
            total += t.saturating_since(since);
        }
        depth += d;
        since = t;
    }
    total
}

pub async fn run_once(
    store: Arc<dyn Store>,
    naive: bool,
    n: usize,
    ttl: Duration,
    secs: u64,
    seed: u64,
) -> Result<RunResult> {
    let base = Arc::new(SystemClock::new());
    let shared = Arc::new(Mutex::new(Shared::default()));
    let end = base.now() + Duration::from_secs(secs);
    let name = Name::new(format!("fence-{}", OsEntropy::new().hex_id())).unwrap();
    // Declared once, so the first acquire is immediate (a missing record is
    // otherwise waited out as a possible deletion).
    LeaseClient::builder(store.clone(), Name::new("setup").unwrap())
        .build()?
        .create(&name)
        .await?;
    let mut tasks = Vec::new();
    for i in 0..n {
        let offset = -3000 + (6000 * i as i64) / (n.max(2) as i64 - 1);
        let clock: Arc<dyn Clock> = Arc::new(Offset {
            base: base.clone(),
            wall_offset_ms: offset,
        });
        let client = LeaseClient::builder(store.clone(), Name::new(format!("c{i}")).unwrap())
            .clock(clock.clone())
            .build()?;
        let sh = shared.clone();
        let name = name.clone();
        let store = store.clone();
        let mut rng_state = seed ^ (i as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15);
        tasks.push(tokio::spawn(async move {
            let mut rand = move || {
                rng_state ^= rng_state << 13;
                rng_state ^= rng_state >> 7;
                rng_state ^= rng_state << 17;
                (rng_state % 10_000) as f64 / 10_000.0
            };
            let opts = AcquireOptions::ttl(ttl);
            while clock.now() < end {
                if naive {
                    naive_round(&store, &client, &clock, &name, ttl, i, &sh, &mut rand, end).await;
                    continue;
                }
                match client.acquire(&name, &opts).await {
                    Ok(Acquire::Acquired(mut lease)) => {
                        let epoch = lease.epoch();
                        {
                            let mut s = sh.lock().unwrap();
                            s.acquisitions += 1;
                            s.owners.entry(epoch).or_default().push(i);
                            s.newest = s.newest.max(epoch);
                        }
                        let mut start = clock.now();
                        loop {
                            if !lease.is_valid() || clock.now() >= end {
                                record_belief(
                                    &sh,
                                    i,
                                    epoch,
                                    start,
                                    lease.valid_until().min(clock.now()),
                                );
                                break;
                            }
                            fenced_write(&sh, epoch);
                            if rand() < 0.05 {
                                // A pause while holding: no renewals. Belief
                                // ends at the deadline whatever happens.
                                clock.sleep(ttl.mul_f64(2.0 * rand())).await;
                            } else {
                                clock.sleep(ttl / 4).await;
                            }
                            let until = lease.valid_until();
                            let r = lease.renew_once().await;
                            let now = clock.now();
                            match r {
                                Ok(()) => {
                                    // The old belief ran to its deadline or
                                    // until now; the new one starts now.
                                    record_belief(&sh, i, epoch, start, until.min(now));
                                    start = now;
                                }
                                Err(e) if e.is_transient() => {}
                                Err(_) => {
                                    record_belief(&sh, i, epoch, start, until.min(now));
                                    break;
                                }
                            }
                        }
                    }
                    Ok(Acquire::Held { .. } | Acquire::Absent { .. }) | Err(_) => {
                        clock.sleep(ttl / 5).await
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let s = shared.lock().unwrap();
    Ok(RunResult {
        acquisitions: s.acquisitions,
        two_owner_epochs: s.owners.values().filter(|v| v.len() > 1).count(),
        stale_accepted: s.stale_accepted,
        writes: s.writes,
        overlap: overlap(&s.beliefs),
    })
}

/// The naive design's round for contender `i`.
#[allow(clippy::too_many_arguments)]
async fn naive_round(
    store: &Arc<dyn Store>,
    client: &LeaseClient,
    clock: &Arc<dyn Clock>,
    name: &Name,
    ttl: Duration,
    i: usize,
    sh: &Arc<Mutex<Shared>>,
    rand: &mut impl FnMut() -> f64,
    end: MonoTime,
) {
    let key = leasehold::keys::lease(name);
    let current = client.read(Kind::Lease, name).await.ok().flatten();
    let (mut rec, cond) = match current {
        None => {
            let opts = AcquireOptions::ttl(ttl);
            // First holder: use the real acquire for the create.
            if let Ok(Acquire::Acquired(l)) = client.acquire(name, &opts).await {
                let mut r = l.record().clone();
                r.renewed_at_ms = clock.wall_ms();
                (r, Cond::Match(l.version().clone()))
            } else {
                clock.sleep(ttl / 5).await;
                return;
            }
        }
        Some((r, v, _)) => {
            let expired = r.released || r.renewed_at_ms + r.ttl_ms <= clock.wall_ms();
            if !expired {
                clock.sleep(ttl / 5).await;
                return;
            }
            let mut next = r.clone();
            next.holder = client.holder().clone();
            next.epoch += 1;
            next.released = false;
            (next, Cond::Match(v))
        }
    };
    let mut cond = cond;
    let epoch = rec.epoch;
    let mut first = true;
    loop {
        rec.renewed_at_ms = clock.wall_ms();
        rec.nonce = OsEntropy::new().hex_id();
        let sent = clock.now();
        let Ok(bytes) = rec.encode() else { return };
        match store.put(&key, bytes.into(), cond.clone()).await {
            Ok(v) => {
                if first {
                    let mut s = sh.lock().unwrap();
                    s.acquisitions += 1;
                    s.owners.entry(epoch).or_default().push(i);
                    s.newest = s.newest.max(epoch);
                    first = false;
                }
                cond = Cond::Match(v);
                // Believes until its write + ttl on its own clock.
                let until = sent + ttl;
                let start = clock.now();
                fenced_write(sh, epoch);
                let pause = if rand() < 0.05 {
                    ttl.mul_f64(2.0 * rand())
                } else {
                    ttl / 4
                };
                clock.sleep(pause).await;
                record_belief(sh, i, epoch, start, until.min(clock.now()));
                if clock.now() >= end {
                    return;
                }
            }
            Err(_) => return,
        }
    }
}

pub async fn fencing(
    url: &str,
    n: usize,
    ttl: Duration,
    secs: u64,
    runs: usize,
    json: bool,
) -> Result<()> {
    let base = url.trim_end_matches('/').to_string();
    let mut rows = Vec::new();
    for design in ["leasehold", "naive wall-clock"] {
        for r in 0..runs {
            let store = if base.starts_with("memory") {
                open_store(&base, &OpenOptions::default()).await?
            } else {
                open_store(
                    &format!("{base}/spike-fencing-{}", OsEntropy::new().hex_id()),
                    &OpenOptions::default(),
                )
                .await?
            };
            eprintln!("{design}: run {} of {runs} ({secs} s)", r + 1);
            let res = run_once(
                store,
                design != "leasehold",
                n,
                ttl,
                secs,
                0xfe2c_e000 + r as u64,
            )
            .await?;
            rows.push(serde_json::json!({
                "design": design, "run": r + 1, "acquisitions": res.acquisitions,
                "epochs_with_two_owners": res.two_owner_epochs,
                "stale_fenced_writes_accepted": res.stale_accepted, "fenced_writes": res.writes,
                "two_believers_ms": res.overlap.as_secs_f64() * 1000.0,
            }));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return Ok(());
    }
    println!(
        "{n} contenders, wall clocks -3 s..+3 s, ttl {}ms, {secs} s runs, store {url}",
        ttl.as_millis()
    );
    println!();
    println!(
        "| design | run | acquisitions | epochs with two owners | stale fenced writes accepted / all | time two believed they held it |"
    );
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} / {} | {:.0} ms |",
            r["design"].as_str().unwrap(),
            r["run"],
            r["acquisitions"],
            r["epochs_with_two_owners"],
            r["stale_fenced_writes_accepted"],
            r["fenced_writes"],
            r["two_believers_ms"].as_f64().unwrap()
        );
    }
    Ok(())
}

/// Contention: `n` contenders × `attempts` acquires on one name with a short
/// TTL; every acquired lease is released at once so the next can win.
pub async fn contention(
    url: &str,
    n: usize,
    attempts: usize,
    ttl: Duration,
    json: bool,
) -> Result<()> {
    let base = url.trim_end_matches('/').to_string();
    let store = if base.starts_with("memory") {
        open_store(&base, &OpenOptions::default()).await?
    } else {
        open_store(
            &format!("{base}/spike-contention-{}", OsEntropy::new().hex_id()),
            &OpenOptions::default(),
        )
        .await?
    };
    let name = Name::new("contended").unwrap();
    LeaseClient::builder(store.clone(), Name::new("setup").unwrap())
        .build()?
        .create(&name)
        .await?;
    let epochs = Arc::new(Mutex::new(Vec::<u64>::new()));
    let counts = Arc::new(Mutex::new((0u64, 0u64, 0u64, 0u64))); // owned, held, conflicts, errors
    let mut tasks = Vec::new();
    for i in 0..n {
        let client =
            LeaseClient::builder(store.clone(), Name::new(format!("c{i}")).unwrap()).build()?;
        let (name, epochs, counts) = (name.clone(), epochs.clone(), counts.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::ttl(ttl);
            for _ in 0..attempts {
                match client.acquire(&name, &opts).await {
                    Ok(Acquire::Acquired(l)) => {
                        epochs.lock().unwrap().push(l.epoch());
                        counts.lock().unwrap().0 += 1;
                        let _ = l.release().await;
                    }
                    Ok(Acquire::Held { .. } | Acquire::Absent { .. }) => {
                        counts.lock().unwrap().1 += 1
                    }
                    Err(e) if e.kind() == leasehold::ErrorKind::Conflict => {
                        counts.lock().unwrap().2 += 1
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        counts.lock().unwrap().3 += 1;
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut e = epochs.lock().unwrap().clone();
    let (owned, held, conflicts, errors) = *counts.lock().unwrap();
    e.sort();
    let distinct = e.windows(2).all(|w| w[0] < w[1]);
    let final_epoch = store_epoch(&store, &name).await?;
    let row = serde_json::json!({
        "store": url, "contenders": n, "attempts_each": attempts, "ttl_ms": ttl.as_millis() as u64,
        "ownerships": owned, "held": held, "clean_conflicts": conflicts, "errors": errors,
        "final_epoch": final_epoch, "epochs_distinct_and_increasing": distinct,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&row).unwrap());
    } else {
        println!(
            "| store | contenders × attempts | ttl | ownerships | answered held | clean conflicts | errors | final epoch | every ownership a distinct epoch |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        println!(
            "| {url} | {n} × {attempts} | {}ms | {owned} | {held} | {conflicts} | {errors} | {final_epoch} | {distinct} |",
            ttl.as_millis()
        );
    }
    Ok(())
}

async fn store_epoch(store: &Arc<dyn Store>, name: &Name) -> Result<u64> {
    let c = LeaseClient::builder(store.clone(), Name::new("reader").unwrap()).build()?;
    Ok(c.read(Kind::Lease, name)
        .await?
        .map_or(0, |(r, _, _)| r.epoch))
}

/// Inventory: time to list `sessions/` holding 503, 10,000 and 100,000 keys
/// (or the sizes given), created 64 at a time beforehand.
pub async fn inventory(url: &str, sizes: &[usize], json: bool) -> Result<()> {
    use futures::StreamExt;
    let clock = SystemClock::new();
    let mut rows = Vec::new();
    for &size in sizes {
        let store = if url.starts_with("memory") {
            open_store(url, &OpenOptions::default()).await?
        } else {
            open_store(
                &format!(
                    "{}/spike-inventory-{}",
                    url.trim_end_matches('/'),
                    OsEntropy::new().hex_id()
                ),
                &OpenOptions::default(),
            )
            .await?
        };
        let t0 = clock.now();
        futures::stream::iter(0..size)
            .map(|i| {
                let s = store.clone();
                async move {
                    s.put(
                        &leasehold::keys::session(format!("s{i:06}")),
                        bytes::Bytes::from_static(b"{}"),
                        Cond::Create,
                    )
                    .await
                }
            })
            .buffer_unordered(64)
            .for_each(|_| async {})
            .await;
        let created = clock.now().saturating_since(t0);
        let t0 = clock.now();
        let mut n = 0usize;
        let mut list = store.list(leasehold::keys::SESSIONS);
        while let Some(e) = list.next().await {
            e.map_err(|e| leasehold::Error::Internal(e.to_string()))?;
            n += 1;
        }
        let listed = clock.now().saturating_since(t0);
        eprintln!("{size}: created in {created:?}, listed {n} in {listed:?}");
        rows.push(
            serde_json::json!({"keys": size, "listed": n, "list_ms": listed.as_secs_f64() * 1000.0,
            "list_pages": n.div_ceil(1000).max(1), "create_ms": created.as_secs_f64() * 1000.0}),
        );
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
    } else {
        println!("| store | keys | listed | list time | pages (1,000 keys each) |");
        println!("|---|---|---|---|---|");
        for r in rows {
            println!(
                "| {url} | {} | {} | {:.1} ms | {} |",
                r["keys"],
                r["listed"],
                r["list_ms"].as_f64().unwrap(),
                r["list_pages"]
            );
        }
    }
    Ok(())
}
