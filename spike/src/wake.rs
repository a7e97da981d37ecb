//! The wake path's cost (issue #39's target): a wake of a sleeping session
//! through a node's `POST /v1/sessions/{name}/wake?wait=0s` (the node
//! resolves, claims the sleeping claim by one conditional write, answers
//! `starting` with the new epoch), against what the budget allows measured
//! as raw requests in the same run: a GET of the same claim, a conditional
//! PUT of an object of the same size (If-Match on its last version), and an
//! HTTP round trip to the same node (`GET /readyz`), one after the other.
//! Interleaved, in alternating order, so that drift and noise hit both
//! sides alike. The session's own start and health check are not counted:
//! the node answers once the claim is written, and the run is ended (exit
//! 75, asleep again) between iterations.
//!
//! One node in this process (a recording runner: no processes) with its HTTP
//! API on 127.0.0.1, and `sessions` sleeping sessions woken in turn. The raw
//! side uses the same store client as the node (`open_store`), so the ratio
//! is the wake path's own work, not a difference of HTTP stacks to the
//! bucket.

use crate::fleet::pct;
use leasehold::clock::{Clock, Entropy, OsEntropy, SystemClock};
use leasehold::fleet::claim::{ClaimRecord, ClaimState};
use leasehold::fleet::journal::Journal;
use leasehold::fleet::manifest::{self, RestartPolicy, Spec};
use leasehold::fleet::node::{self, NodeConfig, NodeDeps};
use leasehold::fleet::runner::RecordingRunner;
use leasehold::store::{Cond, OpenOptions, Store, Version, open_store};
use leasehold::wake::{Ready, Resolver};
use leasehold::{Error, Name, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn fail(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("{what}: {e}"))
}

/// Counts the node's reads of the fleet marker: a wake's claim leans on
/// a recent check and makes one only after a quiet of ttl/3.
#[derive(Debug)]
struct MarkerReads(Arc<dyn Store>, AtomicU64);

impl std::fmt::Display for MarkerReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[async_trait::async_trait]
impl leasehold::store::Forward for MarkerReads {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }
    async fn get(
        &self,
        key: &str,
    ) -> std::result::Result<Option<leasehold::store::Object>, leasehold::store::StoreError> {
        if key == leasehold::keys::MARKER {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
        self.0.get(key).await
    }
    async fn get_if_changed(
        &self,
        key: &str,
        known: &Version,
    ) -> std::result::Result<leasehold::store::Conditional, leasehold::store::StoreError> {
        if key == leasehold::keys::MARKER {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
        self.0.get_if_changed(key, known).await
    }
}

async fn claim_of(store: &Arc<dyn Store>, name: &Name) -> Result<Option<ClaimRecord>> {
    Ok(leasehold::fleet::claim::get(store, name.as_str())
        .await?
        .map(|(c, _)| c))
}

pub async fn wake(
    url: &str,
    sessions: usize,
    iterations: usize,
    ttl: Duration,
    json: bool,
) -> Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let entropy = OsEntropy::new();
    let store = open_store(url, &OpenOptions::default()).await?;
    leasehold::fleet::marker::init(&store, &entropy, clock.wall_ms(), 1).await?;
    let run = entropy.hex_id();
    let mut spec = Spec::new("serve", &[]);
    spec.restart = RestartPolicy::Always.into();
    spec.sleep = Some(leasehold::fleet::sleep::SleepRule {
        after_idle: None,
        on_exit: Some(75),
    });
    let names: Vec<Name> = (0..sessions)
        .map(|i| Name::new(format!("wake-{}-{i:03}", &run[..8])).unwrap())
        .collect();
    for name in &names {
        manifest::apply(&store, &entropy, name, &spec, None).await?;
    }
    // The node, counting its reads of the fleet marker.
    let id = Name::new(format!("wake-{}", &run[..8]))?;
    let counted = Arc::new(MarkerReads(store.clone(), AtomicU64::new(0)));
    let node_store: Arc<dyn Store> = counted.clone();
    let (handle, inbox) = node::claim_channel(&id);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| fail("bind", e))?;
    let address = format!(
        "http://{}",
        listener.local_addr().map_err(|e| fail("bind", e))?
    );
    let mut cfg = NodeConfig::new(id, ttl);
    cfg.probe = false;
    cfg.capacity = sessions as u32 + 1;
    cfg.address = Some(address.clone());
    let journal = Arc::new(Journal::new(100_000, 64 << 20));
    let runner = Arc::new(RecordingRunner::new(clock.clone()).with_exit_wakeups());
    let status: Arc<leasehold::fleet::status::NodeStatus> = Default::default();
    let deps = NodeDeps {
        journal: journal.clone(),
        status: status.clone(),
        claims: Some(inbox),
        ..NodeDeps::new(node_store.clone(), clock.clone(), runner.clone())
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node::run(cfg, deps, shutdown.clone()));
    let token = entropy.hex_id();
    let library = Resolver::new(store.clone()).with_claimer(handle.clone());
    let state = leasehold::http::HttpState::new(journal, status, None, token.clone().into_bytes())?
        .with_claimer(handle)
        .with_store(node_store);
    let server = tokio::spawn(leasehold::http::serve(listener, state, shutdown.clone()));
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| fail("http client", e))?;
    // Every session placed, run once, and asleep.
    let t0 = clock.now();
    loop {
        for (s, _) in leasehold::fleet::runner::Runner::running(runner.as_ref()) {
            runner.exit(&s, 75);
        }
        let mut all = true;
        for n in &names {
            all &= claim_of(&store, n)
                .await?
                .is_some_and(|c| c.state == ClaimState::Sleeping);
        }
        if all {
            break;
        }
        if clock.now().saturating_since(t0) > ttl * 6 {
            return Err(fail("setup", "the sessions did not all fall asleep"));
        }
        clock.sleep(Duration::from_millis(50)).await;
    }
    // The raw side's objects: a copy of a sleeping claim (the same size)
    // to PUT If-Match over, under a key of its own.
    let scratch = format!("spike/wake-{run}");
    let body = bytes::Bytes::from(
        claim_of(&store, &names[0])
            .await?
            .ok_or_else(|| fail("setup", "no claim"))?
            .encode(),
    );
    let mut version = store
        .put(&scratch, body.clone(), Cond::Create)
        .await
        .map_err(|e| Error::from_store("put", &scratch, e))?;
    let (mut wakes, mut raws) = (Vec::new(), Vec::new());
    let (mut lib_wakes, mut lib_raws) = (Vec::new(), Vec::new());
    let (mut gets, mut puts, mut rtts) = (Vec::new(), Vec::new(), Vec::new());
    let mut epochs_ok = 0usize;
    let before = counted.1.load(Ordering::Relaxed);
    let warmup = 10.min(iterations);
    for i in 0..iterations + warmup {
        let name = &names[i % sessions];
        // Asleep again (untimed): its last run ended with exit 75.
        let t = clock.now();
        let asleep_at = loop {
            for (s, _) in leasehold::fleet::runner::Runner::running(runner.as_ref()) {
                runner.exit(&s, 75);
            }
            match claim_of(&store, name).await? {
                Some(c) if c.state == ClaimState::Sleeping => break c.epoch,
                _ if clock.now().saturating_since(t) > ttl * 3 => {
                    return Err(fail("measure", format!("{name} did not fall asleep")));
                }
                _ => clock.sleep(Duration::from_millis(5)).await,
            }
        };
        // A gap, so that a wake meets the node as a caller would: its
        // pass after the last wake and the sleep's write done or not.
        clock
            .sleep(Duration::from_millis(20 + (i as u64 * 37) % 80))
            .await;
        let raw = async {
            let t = clock.now();
            store
                .get(&leasehold::keys::session(name))
                .await
                .map_err(|e| fail("raw get", e))?;
            let g = clock.now();
            let v = store
                .put(&scratch, body.clone(), Cond::Match(version.clone()))
                .await
                .map_err(|e| fail("raw put", e))?;
            let p = clock.now();
            let r = http
                .get(format!("{address}/readyz"))
                .send()
                .await
                .map_err(|e| fail("readyz", e))?;
            r.bytes().await.map_err(|e| fail("readyz", e))?;
            let h = clock.now();
            Ok::<_, Error>((
                v,
                h.saturating_since(t),
                g.saturating_since(t),
                p.saturating_since(g),
                h.saturating_since(p),
            ))
        };
        // Even pairs through the node's HTTP API, odd ones through the
        // library with the node as claimer (an embedding service's path).
        let via_http = (i / 2) % 2 == 0;
        let woke = async {
            let t = clock.now();
            if !via_http {
                return match library.wake_ready(name, Duration::ZERO).await? {
                    Ready::Starting { epoch, .. } => Ok((clock.now().saturating_since(t), epoch)),
                    other => Err(fail("wake", format!("{name}: {other:?}"))),
                };
            }
            let r = http
                .post(format!("{address}/v1/sessions/{name}/wake?wait=0s"))
                .bearer_auth(&token)
                .send()
                .await
                .map_err(|e| fail("wake", e))?;
            let code = r.status().as_u16();
            let b = r.bytes().await.map_err(|e| fail("wake", e))?;
            let took = clock.now().saturating_since(t);
            let v: serde_json::Value =
                serde_json::from_slice(&b).map_err(|e| fail("wake answer", e))?;
            if code != 202 || v["outcome"] != "starting" {
                return Err(fail("wake", format!("{name}: HTTP {code} {v}")));
            }
            Ok::<_, Error>((took, v["epoch"].as_u64().unwrap_or(0)))
        };
        // The same gap between the two: the node's work after a wake (the
        // audit's read-back, the spec's read, the start, a pass) must not
        // overlap the raw requests, nor the raw requests the wake.
        let gap = Duration::from_millis(30);
        let ((v, raw, g, p, h), (took, epoch)) = if i % 2 == 0 {
            let r = raw.await?;
            clock.sleep(gap).await;
            (r, woke.await?)
        } else {
            let w = woke.await?;
            clock.sleep(gap).await;
            (raw.await?, w)
        };
        version = v;
        if i < warmup {
            continue;
        }
        epochs_ok += usize::from(epoch > asleep_at);
        if via_http {
            wakes.push(took);
            raws.push(raw);
        } else {
            lib_wakes.push(took);
            lib_raws.push(g + p);
        }
        gets.push(g);
        puts.push(p);
        rtts.push(h);
    }
    let marker_reads = counted.1.load(Ordering::Relaxed) - before;
    shutdown.cancel();
    let _ = task.await;
    let _ = server.await;
    let ratio = wakes_ratio(&wakes, &raws);
    let lib_ratio = wakes_ratio(&lib_wakes, &lib_raws);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "store": url, "sessions": sessions, "iterations": iterations,
                "wake_p50_ms": ms(pct(&wakes, 0.5)), "wake_p90_ms": ms(pct(&wakes, 0.9)),
                "wake_p99_ms": ms(pct(&wakes, 0.99)),
                "raw_p50_ms": ms(pct(&raws, 0.5)), "raw_p90_ms": ms(pct(&raws, 0.9)),
                "raw_p99_ms": ms(pct(&raws, 0.99)),
                "get_p50_ms": ms(pct(&gets, 0.5)), "put_p50_ms": ms(pct(&puts, 0.5)),
                "http_p50_ms": ms(pct(&rtts, 0.5)),
                "p50_ratio": ratio, "epochs_above": epochs_ok,
                "library_wakes": lib_wakes.len(),
                "library_wake_p50_ms": ms(pct(&lib_wakes, 0.5)),
                "library_wake_p99_ms": ms(pct(&lib_wakes, 0.99)),
                "library_raw_p50_ms": ms(pct(&lib_raws, 0.5)),
                "library_p50_ratio": lib_ratio,
                "marker_reads": marker_reads,
            })
        );
    } else {
        println!(
            "| path | store | wakes | wake p50 | p90 | p99 | raw p50 | raw p90 | raw p99 | p50 ratio |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
        let row = |path: &str, wakes: &[Duration], raws: &[Duration], ratio: f64| {
            let q = |v: &[Duration]| [0.5, 0.9, 0.99].map(|p| format!("{} ms", ms(pct(v, p))));
            println!(
                "| {path} | {url} | {} | {} | {} | {ratio:.2}x |",
                wakes.len(),
                q(wakes).join(" | "),
                q(raws).join(" | "),
            );
        };
        row(
            "HTTP `wake?wait=0s` vs GET + PUT + HTTP",
            &wakes,
            &raws,
            ratio,
        );
        row(
            "library `wake_ready(0)` vs GET + PUT",
            &lib_wakes,
            &lib_raws,
            lib_ratio,
        );
        println!(
            "\nraw parts p50: GET {} ms, PUT {} ms, HTTP {} ms; every wake answered a new epoch: {epochs_ok} of {}; the node's marker reads: {marker_reads}",
            ms(pct(&gets, 0.5)),
            ms(pct(&puts, 0.5)),
            ms(pct(&rtts, 0.5)),
            wakes.len() + lib_wakes.len(),
        );
    }
    let _ = store.delete(&scratch).await;
    Ok(())
}

fn wakes_ratio(wakes: &[Duration], raws: &[Duration]) -> f64 {
    let r = pct(raws, 0.5).as_secs_f64();
    if r == 0.0 {
        return 0.0;
    }
    (pct(wakes, 0.5).as_secs_f64() / r * 100.0).round() / 100.0
}
