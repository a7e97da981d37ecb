//! spike: reproduce the bucket-lease measurements against any store URL.
//!
//! Each subcommand prints a markdown table (or `--json`). Timings are
//! reported as ratios against raw requests measured in the same run on the
//! same store, alternating A/B so that drift and noise hit both sides alike.
//!
//!   spike matrix  --store URL    conditional-write behaviour, one row
//!   spike latency --store URL    our operations against raw object_store requests

use bytes::Bytes;
use clap::{Parser, Subcommand};
use leasehold::Name;
use leasehold::clock::{Clock, Entropy, OsEntropy, SystemClock};
use leasehold::lease::{Acquire, AcquireOptions, LeaseClient};
use leasehold::record::Kind;
use leasehold::store::{
    Cond, CountingStore, OpenOptions, Raw, Store, StoreError, open_raw, open_store,
};
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::sync::Arc;
use std::time::Duration;

mod alarms;
mod fencing;
mod fleet;
mod footprint;
mod gate;
mod wake;

#[derive(Parser)]
#[command(name = "spike", about = "Bucket-lease measurements against any store")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Conditional-write matrix: one row per store.
    Matrix {
        #[arg(long, required = true)]
        store: Vec<String>,
        #[arg(long)]
        json: bool,
    },
    /// Fleet placement and failover: N nodes in this process (recording
    /// runners), M manifests; time to place all, conflicts per claim, then
    /// kill nodes one at a time and time how long their sessions take to run
    /// elsewhere.
    Fleet {
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 1000)]
        manifests: usize,
        #[arg(long, default_value = "2000")]
        ttl_ms: u64,
        /// Nodes to kill, one after another.
        #[arg(long, default_value_t = 5)]
        kills: usize,
        /// Sessions per node; default: room for every manifest on one node.
        #[arg(long)]
        capacity: Option<u32>,
        /// Nodes as `node run` configures them (poll ttl/3, grace 2/3 ttl,
        /// max poll one ttl, a full listing every 60 ttls, the change feed
        /// on) and manifests applied through the hinting store as `leasehold
        /// apply` writes them; default: the library's defaults with poll
        /// ttl/10 (every pass a full listing).
        #[arg(long)]
        daemon_defaults: bool,
        /// Renewals on the runtime every node's pass runs on, as before
        /// each node had a renew thread of its own (for an A/B).
        #[arg(long)]
        renew_inline: bool,
        /// Every GET and PUT of the nodes (not the applier's) takes a
        /// round trip drawn uniformly from 0..2×this many ms (mean: this),
        /// as a remote bucket would; listings and deletes are not delayed.
        #[arg(long, default_value_t = 0)]
        latency_ms: u64,
        /// Seconds between placement and the first kill (0: kill at once,
        /// while the nodes still read the hints placement left).
        #[arg(long, default_value_t = 0)]
        settle_secs: u64,
        #[arg(long)]
        json: bool,
    },
    /// Fencing under clock skew: our protocol beside a naive wall-clock
    /// design, N contenders with wall clocks offset -3 s..+3 s.
    Fencing {
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 8)]
        nodes: usize,
        #[arg(long, default_value = "400")]
        ttl_ms: u64,
        #[arg(long, default_value_t = 5)]
        secs: u64,
        #[arg(long, default_value_t = 4)]
        runs: usize,
        #[arg(long)]
        json: bool,
    },
    /// Contention: N contenders × M acquires on one name (each winner
    /// releases at once): ownerships, clean conflicts, errors (must be 0),
    /// final epoch, epochs distinct.
    Contention {
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 50)]
        attempts: usize,
        #[arg(long, default_value = "50")]
        ttl_ms: u64,
        #[arg(long)]
        json: bool,
    },
    /// The ack gate's cost: POST /v1/self/ack through a session channel
    /// against a raw GET of the same claim, interleaved.
    Gate {
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 1000)]
        iterations: usize,
        #[arg(long)]
        json: bool,
    },
    /// Inventory: time to list sessions/ at several sizes.
    Inventory {
        #[arg(long)]
        store: String,
        #[arg(long, value_delimiter = ',', default_value = "503,10000,100000")]
        sizes: Vec<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Steady-state bucket requests per node-hour and per session-hour,
    /// counted exactly over one virtual hour on a manual clock, with dollar
    /// figures at list prices.
    Cost {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, default_value_t = 30)]
        sessions: usize,
        #[arg(long, default_value = "10000")]
        ttl_ms: u64,
        /// The nodes' `--max-poll` (default: the ttl).
        #[arg(long)]
        max_poll_ms: Option<u64>,
        /// The nodes' `--full-every` (default: 60 ttls, the daemon's);
        /// at or below max_poll the change feed is off.
        #[arg(long)]
        full_every_ms: Option<u64>,
        /// As `node run --full-every-objects` (its default): listed objects
        /// per full-listing interval; 0 keeps the interval fixed.
        #[arg(long, default_value_t = leasehold::fleet::node::DEFAULT_FULL_EVERY_OBJECTS)]
        full_every_objects: u64,
        /// Virtual minutes measured (default an hour). Figures are per hour;
        /// a window of whole grown intervals counts full listings exactly.
        #[arg(long, default_value_t = 60)]
        window_mins: u64,
        /// After the hour, abort the busiest node and time the failover
        /// (as `--kills 1`).
        #[arg(long)]
        failover: bool,
        /// After the hour, this many failovers: each aborts the busiest
        /// node at a different phase, times it, and starts a fresh node.
        #[arg(long, default_value_t = 0)]
        kills: usize,
        /// Nodes nudge the ranked takers of a peer they fence (as `node run
        /// --listen --token-file` does over HTTP).
        #[arg(long)]
        nudge: bool,
        /// Instead of one hour: a table of cost against failover time for
        /// the ttl and max-poll settings a user can choose.
        #[arg(long)]
        sweep: bool,
        #[arg(long)]
        json: bool,
    },
    /// Apply → running and delete → stopped at the default ttl, on an idle
    /// fleet (nodes backed off to one pass per ttl), with and without the
    /// nudge `apply --token-file` / `delete --token-file` send (the HTTP
    /// endpoint calls exactly `NodeStatus::nudge`). Wall-clock time.
    Admit {
        #[arg(long, default_value = "memory://")]
        store: String,
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, default_value = "10000")]
        ttl_ms: u64,
        /// Samples per mode.
        #[arg(long, default_value_t = 5)]
        samples: usize,
        #[arg(long)]
        json: bool,
    },
    /// The wake path (issue #39): a wake of a sleeping session through a
    /// node's HTTP API, answered once its claim is written, against a raw
    /// GET + conditional PUT + HTTP round trip to the same node, interleaved.
    Wake {
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 20)]
        sessions: usize,
        #[arg(long, default_value_t = 300)]
        iterations: usize,
        #[arg(long, default_value = "10000")]
        ttl_ms: u64,
        #[arg(long)]
        json: bool,
    },
    /// Alarms under node kills: N nodes in this process, sessions asleep
    /// as soon as they run, an alarm a second (5 s ahead) for one asleep,
    /// a node killed every `kill_every_secs`: how late each fired.
    Alarms {
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 5)]
        nodes: usize,
        #[arg(long, default_value_t = 50)]
        sessions: usize,
        #[arg(long, default_value = "10000")]
        ttl_ms: u64,
        #[arg(long, default_value_t = 300)]
        secs: u64,
        #[arg(long, default_value_t = 60)]
        kill_every_secs: u64,
        #[arg(long)]
        json: bool,
    },
    /// One node's own RSS and CPU: N node processes (this binary) over a
    /// local-directory store (on tmpfs by default) holding S sessions;
    /// placement time, then each process's CPU over a steady-state window
    /// and its peak RSS, claims, conflicts and epochs.
    Footprint {
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 100_000)]
        sessions: usize,
        #[arg(long, default_value = "10000")]
        ttl_ms: u64,
        /// Steady-state seconds measured (after placement and the settle).
        #[arg(long, default_value_t = 600)]
        window_secs: u64,
        /// Seconds between placement and the window (default 3 ttls).
        #[arg(long)]
        settle_secs: Option<u64>,
        /// Where the store directory goes (default /dev/shm).
        #[arg(long)]
        dir: Option<std::path::PathBuf>,
        /// After the window, kill the busiest node (SIGKILL) and time until
        /// every session runs on a survivor.
        #[arg(long)]
        kill: bool,
        #[arg(long)]
        json: bool,
        /// Seconds between a node's full listings (default 60 ttls, as
        /// `node run`): shorter puts full listings into a short window.
        #[arg(long)]
        full_every_secs: Option<u64>,
        /// As `node run --full-every-objects` (its default): listed objects
        /// per full-listing interval; 0 keeps the interval fixed.
        #[arg(long, default_value_t = leasehold::fleet::node::DEFAULT_FULL_EVERY_OBJECTS)]
        full_every_objects: u64,
    },
    /// (internal) One node of `footprint`, until stdin closes.
    #[command(hide = true)]
    FootprintNode {
        #[arg(long)]
        store: String,
        #[arg(long)]
        id: String,
        #[arg(long)]
        ttl_ms: u64,
        #[arg(long)]
        capacity: u32,
        #[arg(long)]
        full_every_ms: Option<u64>,
        #[arg(long)]
        full_every_objects: u64,
    },
    /// Latency of acquire-fresh, renew, resolve and release against raw
    /// PUT-create, PUT-If-Match and GET, with round trips per operation.
    Latency {
        #[arg(long)]
        store: String,
        #[arg(long, default_value_t = 200)]
        iterations: usize,
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    // A footprint node runs as `node run` does: arenas capped before any
    // thread exists (`leasehold::memory`).
    if std::env::args().nth(1).as_deref() == Some("footprint-node") {
        leasehold::memory::limit_arenas();
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(async_main());
}

async fn async_main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Matrix { store, json } => matrix(store, json).await,
        Cmd::Latency {
            store,
            iterations,
            json,
        } => latency(&store, iterations, json).await,
        Cmd::Fleet {
            store,
            nodes,
            manifests,
            ttl_ms,
            kills,
            capacity,
            daemon_defaults,
            renew_inline,
            latency_ms,
            settle_secs,
            json,
        } => {
            fleet::placement(
                &store,
                nodes,
                manifests,
                Duration::from_millis(ttl_ms),
                kills,
                capacity,
                daemon_defaults,
                renew_inline,
                Duration::from_millis(latency_ms),
                Duration::from_secs(settle_secs),
                json,
            )
            .await
        }
        Cmd::Fencing {
            store,
            nodes,
            ttl_ms,
            secs,
            runs,
            json,
        } => {
            fencing::fencing(
                &store,
                nodes,
                Duration::from_millis(ttl_ms),
                secs,
                runs,
                json,
            )
            .await
        }
        Cmd::Contention {
            store,
            nodes,
            attempts,
            ttl_ms,
            json,
        } => {
            fencing::contention(&store, nodes, attempts, Duration::from_millis(ttl_ms), json).await
        }
        Cmd::Inventory { store, sizes, json } => fencing::inventory(&store, &sizes, json).await,
        Cmd::Gate {
            store,
            iterations,
            json,
        } => gate::gate(&store, iterations, json).await,
        Cmd::Cost {
            nodes,
            sessions,
            sweep: true,
            json,
            ..
        } => fleet::cost_sweep(nodes, sessions, json).await,
        Cmd::Cost {
            nodes,
            sessions,
            ttl_ms,
            max_poll_ms,
            full_every_ms,
            full_every_objects,
            window_mins,
            failover,
            kills,
            nudge,
            json,
            ..
        } => {
            let set = fleet::Settings {
                ttl: Duration::from_millis(ttl_ms),
                max_poll: max_poll_ms.map(Duration::from_millis),
                full_every: full_every_ms.map(Duration::from_millis),
                nudge,
                full_every_objects,
                window: Duration::from_secs(window_mins.max(1) * 60),
            };
            fleet::cost(nodes, sessions, set, kills.max(usize::from(failover)), json).await
        }
        Cmd::Footprint {
            nodes,
            sessions,
            ttl_ms,
            window_secs,
            settle_secs,
            dir,
            kill,
            json,
            full_every_secs,
            full_every_objects,
        } => {
            footprint::footprint(
                nodes,
                sessions,
                Duration::from_millis(ttl_ms),
                Duration::from_secs(window_secs),
                settle_secs.map(Duration::from_secs),
                dir,
                kill,
                json,
                full_every_secs.map(Duration::from_secs),
                full_every_objects,
            )
            .await
        }
        Cmd::FootprintNode {
            store,
            id,
            ttl_ms,
            capacity,
            full_every_ms,
            full_every_objects,
        } => {
            footprint::node_child(
                &store,
                &id,
                Duration::from_millis(ttl_ms),
                capacity,
                full_every_ms.map(Duration::from_millis),
                full_every_objects,
            )
            .await
        }
        Cmd::Admit {
            store,
            nodes,
            ttl_ms,
            samples,
            json,
        } => fleet::admit(&store, nodes, Duration::from_millis(ttl_ms), samples, json).await,
        Cmd::Wake {
            store,
            sessions,
            iterations,
            ttl_ms,
            json,
        } => {
            wake::wake(
                &store,
                sessions,
                iterations,
                Duration::from_millis(ttl_ms),
                json,
            )
            .await
        }
        Cmd::Alarms {
            store,
            nodes,
            sessions,
            ttl_ms,
            secs,
            kill_every_secs,
            json,
        } => {
            alarms::alarms(
                &store,
                nodes,
                sessions,
                Duration::from_millis(ttl_ms),
                secs,
                Duration::from_secs(kill_every_secs),
                json,
            )
            .await
        }
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn matrix(urls: Vec<String>, json: bool) -> leasehold::Result<()> {
    let mut rows = Vec::new();
    for url in urls {
        let store = open_store(&url, &OpenOptions::default()).await?;
        let entropy = OsEntropy::new();
        let (verdict, steps) =
            match leasehold::probe::probe(&store, &entropy, &leasehold::clock::SystemClock::new())
                .await
            {
                Ok(r) => ("honours conditions".to_string(), r.steps),
                Err(e) => (format!("REFUSED: {e}"), Vec::new()),
            };
        // The probe does not try If-Match on a missing key; do it here.
        let missing = format!("_probe/{}/missing", entropy.hex_id());
        let v = leasehold::store::Version {
            etag: Some("nope".into()),
            version: None,
        };
        let missing_ok = matches!(
            store
                .put(&missing, Bytes::from_static(b"{}"), Cond::Match(v))
                .await,
            Err(StoreError::Precondition)
        );
        let mut row = serde_json::Map::new();
        row.insert("store".into(), url.clone().into());
        for s in &steps {
            row.insert(s.name.into(), s.ok.into());
        }
        row.insert("missing-key update rejected".into(), missing_ok.into());
        row.insert("verdict".into(), verdict.into());
        rows.push(serde_json::Value::Object(row));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows).unwrap());
        return Ok(());
    }
    let cols = [
        "create",
        "rejected create",
        "update",
        "rejected stale update",
        "missing-key update rejected",
        "create race",
        "update race",
        "conditional get",
        "verdict",
    ];
    println!("| store | {} |", cols.join(" | "));
    println!("|---|{}", "---|".repeat(cols.len()));
    for r in rows {
        let cells: Vec<String> = cols
            .iter()
            .map(|c| match &r[*c] {
                serde_json::Value::Bool(true) => "yes".into(),
                serde_json::Value::Bool(false) => "**no**".into(),
                serde_json::Value::Null => "-".into(),
                v => v.as_str().unwrap_or_default().to_string(),
            })
            .collect();
        println!(
            "| {} | {} |",
            r["store"].as_str().unwrap(),
            cells.join(" | ")
        );
    }
    Ok(())
}

/// The raw side of the comparison: the backend without leasehold's layers.
struct RawSide {
    raw: Raw,
    base: String,
}

impl RawSide {
    fn path(&self, key: &str) -> Path {
        match &self.raw {
            Raw::Object { prefix, .. } if !prefix.is_empty() => {
                Path::from(format!("{prefix}/{}/{key}", self.base))
            }
            _ => Path::from(format!("{}/{key}", self.base)),
        }
    }

    /// A raw PUT: create-if-absent when `version` is None, else If-Match.
    async fn put(
        &self,
        key: &str,
        body: Bytes,
        version: Option<(Option<String>, Option<String>)>,
    ) -> (Option<String>, Option<String>) {
        match &self.raw {
            Raw::Local(l) => {
                let cond = match version {
                    None => Cond::Create,
                    Some((etag, version)) => {
                        Cond::Match(leasehold::store::Version { etag, version })
                    }
                };
                let v = l
                    .put(&format!("{}/{key}", self.base), body, cond)
                    .await
                    .unwrap();
                (v.etag, v.version)
            }
            Raw::Object { store, .. } => {
                let mode = match version {
                    None => PutMode::Create,
                    Some((e_tag, version)) => PutMode::Update(UpdateVersion { e_tag, version }),
                };
                let opts = PutOptions {
                    mode,
                    ..Default::default()
                };
                let r = store
                    .put_opts(&self.path(key), PutPayload::from_bytes(body), opts)
                    .await
                    .unwrap();
                (r.e_tag, r.version)
            }
        }
    }

    async fn get(&self, key: &str) -> Bytes {
        match &self.raw {
            Raw::Local(l) => {
                l.get(&format!("{}/{key}", self.base))
                    .await
                    .unwrap()
                    .unwrap()
                    .bytes
            }
            Raw::Object { store, .. } => store
                .get_opts(&self.path(key), GetOptions::default())
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap(),
        }
    }
}

struct Series(Vec<Duration>);

impl Series {
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

async fn latency(url: &str, iterations: usize, json: bool) -> leasehold::Result<()> {
    let entropy = OsEntropy::new();
    let base = format!("spike-latency-{}", entropy.hex_id());
    let inner = open_store(url, &OpenOptions::default()).await?;
    let counting = Arc::new(CountingStore::new(inner));
    let store: Arc<dyn Store> = counting.clone();
    leasehold::probe::probe(&store, &entropy, &leasehold::clock::SystemClock::new()).await?;
    let raw = RawSide {
        raw: open_raw(url, &OpenOptions::default()).await?,
        base: base.clone(),
    };
    // Our keys live under leases/, the raw ones under <base>/; both fresh.
    let clock = SystemClock::new();
    let client = LeaseClient::builder(store.clone(), Name::new("spike")?).build()?;
    let opts = AcquireOptions::ttl(Duration::from_secs(30));
    let body = Bytes::from(vec![b'x'; 260]); // about one lease record
    let names = [
        "create + acquire (new name)",
        "renew",
        "resolve (GET record)",
        "release",
        "resolve + dial (wake)",
    ];
    let raws = [
        "raw PUT create",
        "raw PUT If-Match",
        "raw GET",
        "raw PUT If-Match",
        "raw GET + TCP connect",
    ];
    // Something to dial: a listener that accepts and drops.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| leasehold::Error::Internal(e.to_string()))?;
    let dial_addr = listener
        .local_addr()
        .map_err(|e| leasehold::Error::Internal(e.to_string()))?;
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            drop(s);
        }
    });
    let mut ours: Vec<Series> = (0..5).map(|_| Series(Vec::new())).collect();
    let mut theirs: Vec<Series> = (0..5).map(|_| Series(Vec::new())).collect();
    let mut trips = [0u64; 5];
    let time = |t0: leasehold::clock::MonoTime| clock.now().saturating_since(t0);
    for i in 0..iterations {
        let name = Name::new(format!("{base}-{i}"))?;
        let key = format!("k{i}");
        // Alternate which side goes first.
        for side in if i % 2 == 0 { [0, 1] } else { [1, 0] } {
            if side == 0 {
                let c0 = counting.counts();
                let t0 = clock.now();
                // A new name is declared, then acquired: both are the cost
                // of a first acquire (a missing record is never taken at once).
                client.create(&name).await?;
                let Acquire::Acquired(mut l) = client.acquire(&name, &opts).await? else {
                    return Err(leasehold::Error::Internal(
                        "a declared key was not acquired".into(),
                    ));
                };
                ours[0].0.push(time(t0));
                let c1 = counting.counts();
                let t0 = clock.now();
                l.renew_once().await?;
                ours[1].0.push(time(t0));
                let c2 = counting.counts();
                let t0 = clock.now();
                client.read(Kind::Lease, &name).await?.expect("present");
                ours[2].0.push(time(t0));
                let c3 = counting.counts();
                let t0 = clock.now();
                l.release().await?;
                ours[3].0.push(time(t0));
                let c4 = counting.counts();
                // The wake path: a claim naming our listener (written
                // untimed), then resolve + dial with a fresh resolver.
                let claim = leasehold::fleet::claim::ClaimRecord {
                    schema: leasehold::record::SCHEMA.into(),
                    kind: "session".into(),
                    owner: leasehold::fleet::claim::Owner {
                        node: "spike".into(),
                        instance: "i".into(),
                    },
                    epoch: 1,
                    state: leasehold::fleet::claim::ClaimState::Running,
                    digest: "d".into(),
                    address: Some(format!("http://{dial_addr}")),
                    endpoint: None,
                    health: None,
                    exit_code: None,
                    reason: None,
                    backoff_until_ms: None,
                    restarts: 0,
                    updated_at_ms: 0,
                    tick_ms: None,
                    nonce: entropy.hex_id(),
                };
                store
                    .put(
                        &leasehold::keys::session(&name),
                        Bytes::from(claim.encode()),
                        Cond::Create,
                    )
                    .await
                    .map_err(|e| leasehold::Error::Internal(e.to_string()))?;
                let resolver = leasehold::wake::Resolver::new(store.clone());
                let c5 = counting.counts();
                let t0 = clock.now();
                let w = resolver.wake(&name, Duration::from_secs(2)).await?;
                ours[4].0.push(time(t0));
                assert!(
                    matches!(w.outcome, leasehold::wake::WakeOutcome::Reachable { .. }),
                    "{w:?}"
                );
                let c6 = counting.counts();
                for (j, (a, b)) in [(c0, c1), (c1, c2), (c2, c3), (c3, c4), (c5, c6)]
                    .iter()
                    .enumerate()
                {
                    trips[j] += b.since(a).total();
                }
            } else {
                let t0 = clock.now();
                let v = raw.put(&key, body.clone(), None).await;
                theirs[0].0.push(time(t0));
                let t0 = clock.now();
                let v = raw.put(&key, body.clone(), Some(v)).await;
                theirs[1].0.push(time(t0));
                let t0 = clock.now();
                raw.get(&key).await;
                theirs[2].0.push(time(t0));
                let t0 = clock.now();
                raw.put(&key, body.clone(), Some(v)).await;
                theirs[3].0.push(time(t0));
                let t0 = clock.now();
                raw.get(&key).await;
                let _ = tokio::net::TcpStream::connect(dial_addr).await;
                theirs[4].0.push(time(t0));
            }
        }
    }
    let mut rows = Vec::new();
    for j in 0..5 {
        let (a, b) = (&ours[j], &theirs[j]);
        rows.push(serde_json::json!({
            "operation": names[j], "baseline": raws[j],
            "p50_ms": a.pct(0.5).as_secs_f64() * 1e3, "p99_ms": a.pct(0.99).as_secs_f64() * 1e3,
            "raw_p50_ms": b.pct(0.5).as_secs_f64() * 1e3, "raw_p99_ms": b.pct(0.99).as_secs_f64() * 1e3,
            "p50_ratio": a.pct(0.5).as_secs_f64() / b.pct(0.5).as_secs_f64(),
            "round_trips": trips[j] as f64 / iterations as f64,
        }));
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"store": url, "iterations": iterations, "rows": rows})
            )
            .unwrap()
        );
        return Ok(());
    }
    println!("store {url}, {iterations} iterations, A/B alternating");
    println!();
    println!(
        "| operation | round trips | p50 ms | p99 ms | baseline | raw p50 ms | raw p99 ms | p50 ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for j in 0..5 {
        let (a, b) = (&ours[j], &theirs[j]);
        println!(
            "| {} | {:.2} | {} | {} | {} | {} | {} | {:.2} |",
            names[j],
            trips[j] as f64 / iterations as f64,
            ms(a.pct(0.5)),
            ms(a.pct(0.99)),
            raws[j],
            ms(b.pct(0.5)),
            ms(b.pct(0.99)),
            a.pct(0.5).as_secs_f64() / b.pct(0.5).as_secs_f64()
        );
    }
    Ok(())
}
