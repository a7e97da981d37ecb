//! One node's own memory and CPU, apart from the rest of the fleet: every
//! node runs in a process of its own (this binary, `footprint-node`), so
//! its RSS and CPU time are the kernel's figures for that node alone. The
//! store is a local directory (laptop mode) every process opens; on tmpfs
//! by default, so that fsync does not set the pace.

use futures::StreamExt;
use leasehold::clock::{Clock, Entropy, OsEntropy, SystemClock};
use leasehold::fleet::claim::ClaimRecord;
use leasehold::fleet::journal::{EventKind, Journal};
use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
use leasehold::fleet::runner::RecordingRunner;
use leasehold::store::{OpenOptions, Store, open_store};
use leasehold::{Name, Result};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::io::AsyncWriteExt as _;

/// What a node process reports, one JSON line every `REPORT` while it runs
/// and once more after it stopped.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    pub secs: f64,
    pub running: usize,
    /// User + system CPU of the whole process so far.
    pub cpu_ms: u64,
    pub rss_kb: u64,
    /// Peak RSS so far (VmHWM).
    pub hwm_kb: u64,
    /// Bytes the allocator has handed out and not had back (glibc's
    /// `mallinfo2`: in-use small blocks plus mmapped ones): the heap the
    /// node holds, beside what RSS holds on its behalf.
    #[serde(default)]
    pub heap_kb: u64,
    pub started: u64,
    pub claimed: u64,
    pub conflicts: u64,
    pub lost: u64,
    pub reregistered: u64,
    /// The latest start of a renewal after it was due, so far (ms).
    #[serde(default)]
    pub renew_late_max_ms: u64,
    /// List pages of `manifests/` so far: only a full listing lists it
    /// (a light pass reads the feed), so the window's count of pages,
    /// over the pages one listing takes, counts its full listings.
    #[serde(default)]
    pub manifest_list_pages: u64,
    pub done: bool,
}

const REPORT: Duration = Duration::from_secs(2);
/// The report interval once the parent asks for it (a `fast` line on
/// stdin): while it times a failover. Not during the CPU window, where
/// every wake-up would be charged to the node.
const REPORT_FAST: Duration = Duration::from_millis(100);

fn proc_status_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn heap_kb() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    ((m.uordblks + m.hblkhd) / 1024) as u64
}

fn cpu_ms() -> u64 {
    // SAFETY: getrusage writes into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
    ms(u.ru_utime) + ms(u.ru_stime)
}

/// CPU time of the calling thread, in µs.
fn thread_cpu_us() -> u64 {
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime writes into the struct it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000
}

/// The child: one node at the daemon's defaults (`node run`: full listing
/// every 60 ttls unless `full_every` says, the hinting store, a journal of
/// 10,000 events) with a recording runner, until its stdin closes.
pub async fn node_child(
    url: &str,
    id: &str,
    ttl: Duration,
    capacity: u32,
    full_every: Option<Duration>,
    full_every_objects: u64,
) -> Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    // As `node run` does: renewals, and the store's socket work, on a
    // thread of their own.
    let renew = leasehold::fleet::renew_thread::RenewThread::start("leasehold-renew")?;
    let raw = open_store(
        url,
        &OpenOptions {
            io_runtime: Some(renew.handle()),
            ..OpenOptions::default()
        },
    )
    .await?;
    // Counted by key segment for `manifest_list_pages` (an atomic add per
    // request: nothing a node's CPU figure would show).
    let segments = Arc::new(leasehold::store::BySegment::new(raw));
    // The hints' form is the node's to decide, as in `node run`.
    let (store, hint_forms) = crate::fleet::hinting(segments.clone(), &clock);
    let mut cfg = NodeConfig::new(Name::new(id).unwrap(), ttl);
    cfg.capacity = capacity;
    cfg.full_every = full_every.unwrap_or(ttl * crate::fleet::DEFAULT_FULL_EVERY_TTLS);
    cfg.full_every_objects = full_every_objects;
    cfg.probe = false;
    let journal = Arc::new(Journal::new(10_000, 4 << 20));
    let deps = NodeDeps {
        journal: journal.clone(),
        renew_on: Some(renew.handle()),
        hint_forms,
        ..NodeDeps::new(
            store,
            clock.clone(),
            Arc::new(RecordingRunner::new(clock.clone())),
        )
    };
    let status = deps.status.clone();
    let stop = tokio_util::sync::CancellationToken::new();
    // As `node run` does (`leasehold::memory`); the arenas are capped in
    // `main` for this subcommand, before the runtime starts.
    let trimmer = tokio::spawn(leasehold::memory::trim_periodically(
        clock.clone(),
        leasehold::memory::TRIM_EVERY,
        stop.clone(),
    ));
    let task = tokio::spawn(node::run(cfg, deps, stop.clone()));
    // stdin closing is the parent's word to stop.
    let eof = stop.clone();
    let fast = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fast_set = fast.clone();
    std::thread::spawn(move || {
        let mut s = String::new();
        while std::io::stdin()
            .lock()
            .read_line(&mut s)
            .is_ok_and(|n| n > 0)
        {
            match s.trim() {
                "fast" => fast_set.store(true, std::sync::atomic::Ordering::Relaxed),
                // The peak RSS (VmHWM) from now on: the window's own, apart
                // from placement's (Linux's clear_refs, value 5).
                "reset-peak" => {
                    let _ = std::fs::write("/proc/self/clear_refs", "5");
                }
                _ => {}
            }
            s.clear();
        }
        eof.cancel();
    });
    let t0 = clock.now();
    // CPU µs the sampler itself spent (the status walk, mallinfo2, the JSON
    // line), subtracted from the process's figure: in a profile of a node
    // at 100,000 sessions the sampler was a quarter of the process's CPU
    // (it copied the 10,000-session status snapshot every 2 s).
    let harness = std::cell::Cell::new(0u64);
    // mallinfo2 walks every arena (tens of ms at 100,000 sessions): read
    // once every 15 samples, not charged to the node every 2 s.
    let heap = std::cell::Cell::new((0u32, 0u64));
    let sample = |done: bool| {
        let (k, mut h) = heap.get();
        // Not while timing a failover: it would slow the survivors.
        if (k % 15 == 0 && !fast.load(std::sync::atomic::Ordering::Relaxed)) || done {
            h = heap_kb();
        }
        heap.set((k + 1, h));
        let t = journal.totals();
        let get = |k: EventKind| t.get(&k).copied().unwrap_or(0);
        Sample {
            secs: clock.now().saturating_since(t0).as_secs_f64(),
            running: status.running_count(),
            // The sampler's own CPU is not the node's: see `harness`.
            cpu_ms: cpu_ms().saturating_sub(harness.get() / 1000),
            rss_kb: proc_status_kb("VmRSS:"),
            hwm_kb: proc_status_kb("VmHWM:"),
            heap_kb: h,
            started: get(EventKind::Started),
            claimed: get(EventKind::Claimed),
            conflicts: get(EventKind::Conflict),
            lost: get(EventKind::LeaseLost),
            reregistered: get(EventKind::ReRegistering),
            renew_late_max_ms: (status.renew_histogram().max_late_seconds * 1000.0).round() as u64,
            manifest_list_pages: segments
                .counts()
                .get(leasehold::keys::MANIFESTS)
                .map_or(0, |c| c.list_pages),
            done,
        }
    };
    let out = |s: &Sample| {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{}", serde_json::to_string(s).unwrap());
        let _ = o.flush();
    };
    // Each sample, timed on the thread that takes it (it runs synchronously
    // there), is charged to the harness, not to the node.
    let timed = |done: bool| {
        let t = thread_cpu_us();
        out(&sample(done));
        harness.set(harness.get() + thread_cpu_us().saturating_sub(t));
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = clock.sleep(if fast.load(std::sync::atomic::Ordering::Relaxed) {
                REPORT_FAST
            } else {
                REPORT
            }) => timed(false),
        }
    }
    let r = task.await;
    let _ = trimmer.await;
    timed(true);
    match r {
        Ok(r) => r,
        Err(e) => Err(leasehold::Error::Internal(format!("node task: {e}"))),
    }
}

/// The parent: applies `s` manifests to a fresh local store, starts `n`
/// node processes, waits until every session runs, lets them settle, then
/// measures each process's CPU over `window` and its peak RSS.
#[allow(clippy::too_many_arguments)]
pub async fn footprint(
    n: usize,
    s: usize,
    ttl: Duration,
    window: Duration,
    settle: Option<Duration>,
    dir: Option<std::path::PathBuf>,
    kill: bool,
    json: bool,
    full_every: Option<Duration>,
    full_every_objects: u64,
) -> Result<()> {
    let base = dir.unwrap_or_else(|| std::path::PathBuf::from("/dev/shm"));
    let root = base.join(format!("leasehold-footprint-{}", OsEntropy::new().hex_id()));
    std::fs::create_dir_all(&root)
        .map_err(|e| leasehold::Error::Internal(format!("{}: {e}", root.display())))?;
    let url = format!("file://{}", root.display());
    // By default 3 ttls; a steady state proper waits out the placement's
    // hints too (`--settle-secs 900`: retention and one expiry round).
    let settle = settle.unwrap_or(ttl * 3);
    let r = measure(
        &url,
        n,
        s,
        ttl,
        window,
        settle,
        kill,
        json,
        full_every,
        full_every_objects,
    )
    .await;
    let _ = std::fs::remove_dir_all(&root);
    r
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    url: &str,
    n: usize,
    s: usize,
    ttl: Duration,
    window: Duration,
    settle: Duration,
    kill: bool,
    json: bool,
    full_every: Option<Duration>,
    full_every_objects: u64,
) -> Result<()> {
    let clock = SystemClock::new();
    let elapsed = |t| clock.now().saturating_since(t);
    let store = open_store(url, &OpenOptions::default()).await?;
    let entropy = OsEntropy::new();
    leasehold::fleet::marker::init(&store, &entropy, 0, 1).await?;
    let exe = std::env::current_exe()
        .map_err(|e| leasehold::Error::Internal(format!("current_exe: {e}")))?;
    let latest: Arc<std::sync::Mutex<BTreeMap<String, Sample>>> = Default::default();
    let mut children = Vec::new();
    let mut readers = Vec::new();
    for i in 0..n {
        let id = format!("n{i:02}");
        // `SPIKE_FOOTPRINT_WRAP_FIRST="heaptrack -o /tmp/n00"` runs the
        // first node under a tool (a profiler), the others as they are:
        // that node's figures are then the tool's, not the node's.
        let wrap: Vec<String> = std::env::var("SPIKE_FOOTPRINT_WRAP_FIRST")
            .ok()
            .filter(|_| i == 0)
            .map(|w| w.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let mut command = match wrap.split_first() {
            Some((tool, args)) => {
                let mut c = tokio::process::Command::new(tool);
                c.args(args).arg(&exe);
                c
            }
            None => tokio::process::Command::new(&exe),
        };
        let mut child = command
            .args([
                "footprint-node",
                "--store",
                url,
                "--id",
                &id,
                "--ttl-ms",
                &ttl.as_millis().to_string(),
                "--capacity",
                &s.max(1).to_string(),
                "--full-every-objects",
                &full_every_objects.to_string(),
            ])
            .args(
                full_every
                    .map(|d| vec!["--full-every-ms".to_string(), d.as_millis().to_string()])
                    .unwrap_or_default(),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| leasehold::Error::Internal(format!("spawn: {e}")))?;
        let stdout = child.stdout.take().unwrap();
        let latest = latest.clone();
        readers.push(tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(x) = serde_json::from_str::<Sample>(&l) {
                    latest.lock().unwrap().insert(id.clone(), x);
                }
            }
        }));
        children.push(child);
    }
    // The nodes are up and registered (every one has reported, and two
    // ttls passed); then the manifests, through the hinting store as
    // `leasehold apply` writes them.
    loop {
        clock.sleep(Duration::from_millis(200)).await;
        if latest.lock().unwrap().len() == n {
            break;
        }
    }
    clock.sleep(ttl * 2).await;
    let hinting: Arc<dyn Store> = Arc::new(leasehold::fleet::feed::HintingStore::new(
        store.clone(),
        Arc::new(SystemClock::new()),
        Arc::new(OsEntropy::new()),
    ));
    let t_apply = clock.now();
    futures::stream::iter(0..s)
        .map(|i| {
            let store = hinting.clone();
            async move {
                let e = OsEntropy::new();
                leasehold::fleet::manifest::apply(
                    &store,
                    &e,
                    &Name::new(format!("s{i:06}")).unwrap(),
                    &crate::fleet::spec(),
                    None,
                )
                .await
            }
        })
        .buffer_unordered(32)
        .for_each(|r| {
            if let Err(e) = r {
                eprintln!("apply: {e}");
            }
            futures::future::ready(())
        })
        .await;
    let applied = elapsed(t_apply);
    let t0 = clock.now();
    eprintln!("applied {s} manifests in {applied:?}");
    let snapshot = || latest.lock().unwrap().clone();
    // Placement: until every session runs somewhere.
    let placed = loop {
        clock.sleep(Duration::from_millis(500)).await;
        let l = snapshot();
        let running: usize = l.values().map(|x| x.running).sum();
        eprint!("\rrunning {running}/{s} after {:?}   ", elapsed(t0));
        if running >= s && l.len() == n {
            break elapsed(t0);
        }
        if elapsed(t0) > Duration::from_secs(1800) {
            return Err(leasehold::Error::Internal(
                "not placed within 30 min".into(),
            ));
        }
    };
    eprintln!("\nplaced in {placed:?}; settling {settle:?}");
    clock.sleep(settle).await;
    let before = snapshot();
    // From here each node's peak RSS is the window's (placement's is
    // `before`'s).
    for c in &mut children {
        if let Some(stdin) = c.stdin.as_mut() {
            let _ = stdin.write_all(b"reset-peak\n").await;
            let _ = stdin.flush().await;
        }
    }
    eprintln!("measuring for {window:?}");
    clock.sleep(window).await;
    let after = snapshot();
    // Every session claimed exactly once fleet-wide: epoch 1 everywhere.
    let epochs = claim_epochs(&store).await?;
    // Failover: the busiest node killed (SIGKILL: no release), timed until
    // every session runs on a survivor, as their reports show (each every
    // REPORT_FAST, so the figure is high by up to that much).
    let failover = if kill {
        let (victim, moved) = after
            .iter()
            .max_by_key(|(_, x)| x.running)
            .map(|(id, x)| (id.clone(), x.running))
            .unwrap_or_default();
        // Children were started in id order (`n00`, `n01`, ...).
        let i = (0..n)
            .position(|i| format!("n{i:02}") == victim)
            .ok_or_else(|| leasehold::Error::Internal(format!("no child for {victim}")))?;
        let starts_before: u64 = snapshot()
            .iter()
            .filter(|(id, _)| **id != victim)
            .map(|(_, x)| x.started)
            .sum();
        // Survivors report every REPORT_FAST from now on; a second for
        // the word to reach them all.
        for c in &mut children {
            if let Some(stdin) = c.stdin.as_mut() {
                let _ = stdin.write_all(b"fast\n").await;
                let _ = stdin.flush().await;
            }
        }
        clock.sleep(Duration::from_secs(1)).await;
        let at_kill = snapshot();
        let t_kill = clock.now();
        let kill_wall_ms = clock.wall_ms();
        children[i]
            .start_kill()
            .map_err(|e| leasehold::Error::Internal(format!("kill: {e}")))?;
        // How long before the kill the victim last renewed (its record's
        // own stamp, this machine's wall clock): the part of the failover
        // that only the kill's phase decides. Read at once, before a
        // watcher's fence replaces the record.
        let since_renewal_ms = match store.get(&leasehold::keys::node(&victim)).await {
            Ok(Some(o)) => leasehold::record::LeaseRecord::decode(
                &leasehold::keys::node(&victim),
                &o.bytes,
                leasehold::record::Kind::Node,
            )
            .ok()
            .map(|r| kill_wall_ms.saturating_sub(r.renewed_at_ms)),
            _ => None,
        };
        // Per survivor: when its claims first rose after the kill, and
        // when its running count last rose (the sessions it took over).
        let mut first_claim: BTreeMap<String, u64> = BTreeMap::new();
        let mut last_start: BTreeMap<String, (usize, u64)> = BTreeMap::new();
        let took = loop {
            clock.sleep(Duration::from_millis(100)).await;
            let l = snapshot();
            let now_ms = elapsed(t_kill).as_millis() as u64;
            for (id, x) in l.iter().filter(|(id, _)| **id != victim) {
                let b = at_kill.get(id).cloned().unwrap_or_default();
                if x.claimed > b.claimed {
                    first_claim.entry(id.clone()).or_insert(now_ms);
                }
                let e = last_start.entry(id.clone()).or_insert((b.running, 0));
                if x.running > e.0 {
                    *e = (x.running, now_ms);
                }
            }
            let running: usize = l
                .iter()
                .filter(|(id, _)| **id != victim)
                .map(|(_, x)| x.running)
                .sum();
            eprint!(
                "\rrunning on survivors {running}/{s} after {:?}   ",
                elapsed(t_kill)
            );
            if running >= s {
                break elapsed(t_kill);
            }
            if elapsed(t_kill) > Duration::from_secs(1800) {
                return Err(leasehold::Error::Internal(
                    "not failed over within 30 min".into(),
                ));
            }
        };
        eprintln!("\nfailed over in {took:?}");
        let starts_after: u64 = snapshot()
            .iter()
            .filter(|(id, _)| **id != victim)
            .map(|(_, x)| x.started)
            .sum();
        let timeline: Vec<serde_json::Value> = first_claim
            .iter()
            .map(|(id, first)| {
                let (running, last) = last_start.get(id).copied().unwrap_or_default();
                let took_over = running.saturating_sub(at_kill.get(id).map_or(0, |x| x.running));
                serde_json::json!({
                    "node": id,
                    "first_claim_ms": first,
                    "last_start_ms": last,
                    "took_over": took_over,
                })
            })
            .collect();
        eprintln!(
            "victim last renewed {since_renewal_ms:?} ms before the kill; per survivor (first claim, last start, sessions): {}",
            timeline
                .iter()
                .map(|t| format!(
                    "{} {}/{}/{}",
                    t["node"].as_str().unwrap_or(""),
                    t["first_claim_ms"],
                    t["last_start_ms"],
                    t["took_over"]
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Some(serde_json::json!({
            "killed": victim,
            "sessions_moved": moved,
            "all_running_on_survivors_ms": took.as_millis() as u64,
            "victim_renewed_before_kill_ms": since_renewal_ms,
            "survivors": timeline,
            "starts_on_survivors": starts_after - starts_before,
            "epochs_after": claim_epochs(&store).await?,
        }))
    } else {
        None
    };
    // Stopped together, after the epochs are read: a node stopping first
    // releases its claims, and the others would take them over.
    for c in &mut children {
        drop(c.stdin.take());
    }
    for mut c in children.drain(..) {
        // A child that does not stop in time is killed when dropped.
        tokio::select! {
            _ = c.wait() => {}
            _ = clock.sleep(Duration::from_secs(120)) => {}
        }
    }
    for r in readers {
        let _ = r.await;
    }
    let last = snapshot();
    let secs = |b: &Sample, a: &Sample| (a.secs - b.secs).max(1e-9);
    let mut rows = Vec::new();
    for (id, a) in &after {
        let b = before.get(id).cloned().unwrap_or_default();
        let l = a.clone();
        // Lifetime peaks: placement's (`b`, before the reset) included.
        let peak = last
            .get(id)
            .map_or(a.hwm_kb, |x| x.hwm_kb.max(a.hwm_kb))
            .max(b.hwm_kb);
        let cpu_per_hour = (a.cpu_ms - b.cpu_ms) as f64 / 1000.0 * 3600.0 / secs(&b, a);
        // One full listing lists every manifest, a page per 1,000.
        let full_listings =
            (a.manifest_list_pages - b.manifest_list_pages) as f64 / s.div_ceil(1000).max(1) as f64;
        rows.push(serde_json::json!({
            "node": id,
            "sessions": a.running,
            "cpu_s_per_hour": (cpu_per_hour * 10.0).round() / 10.0,
            "full_listings_in_window": (full_listings * 100.0).round() / 100.0,
            "rss_mb": a.rss_kb / 1024,
            "heap_mb": a.heap_kb / 1024,
            "peak_rss_mb": a.hwm_kb.max(b.hwm_kb) / 1024,
            "peak_rss_mb_placement": b.hwm_kb / 1024,
            "peak_rss_mb_window": a.hwm_kb / 1024,
            "peak_rss_mb_with_shutdown": peak / 1024,
            "started": l.started,
            "claimed": l.claimed,
            "conflicts": l.conflicts,
            "leases_lost": l.lost,
            "re_registered": l.reregistered,
            "renew_late_max_ms": last.get(id).map_or(l.renew_late_max_ms, |x| x.renew_late_max_ms.max(l.renew_late_max_ms)),
        }));
    }
    let total = |k: &str| rows.iter().map(|r| r[k].as_u64().unwrap_or(0)).sum::<u64>();
    let claimed = total("claimed");
    let conflicts = total("conflicts");
    let out = serde_json::json!({
        "nodes": n, "sessions": s, "ttl_ms": ttl.as_millis() as u64,
        "store": "local directory on tmpfs",
        "apply_ms": applied.as_millis() as u64,
        "placed_after_last_apply_ms": placed.as_millis() as u64,
        "window_s": window.as_secs(),
        "settle_s": settle.as_secs(),
        "full_every_ms": full_every.map(|d| d.as_millis() as u64),
        "full_every_objects": full_every_objects,
        "claims": claimed, "conflicts": conflicts,
        "conflicts_per_claim": conflicts as f64 / claimed.max(1) as f64,
        "starts": total("started"),
        "leases_lost": total("leases_lost"),
        "epochs": epochs,
        "per_node": rows,
        "failover": failover,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap());
        return Ok(());
    }
    println!(
        "{n} nodes, {s} sessions, ttl {ttl:?}: applied in {:.1} s, all running {:.1} s after the last apply; {claimed} claims, {conflicts} conflicts, {} starts, {} leases lost; claim epochs {epochs:?}",
        applied.as_secs_f64(),
        placed.as_secs_f64(),
        total("started"),
        total("leases_lost")
    );
    println!(
        "| node | sessions | CPU s per node-hour | full listings in the window | RSS MB | heap in use MB | peak RSS MB (placement / window) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} / {} |",
            r["node"].as_str().unwrap_or(""),
            r["sessions"],
            r["cpu_s_per_hour"],
            r["full_listings_in_window"],
            r["rss_mb"],
            r["heap_mb"],
            r["peak_rss_mb_placement"],
            r["peak_rss_mb_window"]
        );
    }
    Ok(())
}

/// How many claims stand at each epoch.
async fn claim_epochs(store: &Arc<dyn Store>) -> Result<BTreeMap<u64, usize>> {
    let mut epochs: BTreeMap<u64, usize> = BTreeMap::new();
    let mut listing = store.list(leasehold::keys::SESSIONS);
    let mut keys = Vec::new();
    while let Some(e) = listing.next().await {
        keys.push(
            e.map_err(|e| leasehold::Error::Internal(format!("list: {e}")))?
                .key,
        );
    }
    for k in keys {
        if let Some(o) = store
            .get(&k)
            .await
            .map_err(|e| leasehold::Error::Internal(format!("get: {e}")))?
            && let Ok(c) = ClaimRecord::decode(&k, &o.bytes)
        {
            *epochs.entry(c.epoch).or_default() += 1;
        }
    }
    Ok(epochs)
}
