//! The ack gate's cost: `POST /v1/self/ack` through a node's session
//! channel (a Unix socket, HTTP/1, one GET of the claim) against a raw GET
//! of the same claim on the same store, interleaved in one run. The store
//! behind the gate counts its requests: each ack must cost exactly one GET.

use leasehold::clock::{Clock, MonoTime, SystemClock};
use leasehold::fleet::channel::client::SessionClient;
use leasehold::fleet::channel::server::{self, ChannelState};
use leasehold::fleet::channel::{Registry, RunId};
use leasehold::fleet::claim::{ClaimRecord, ClaimState, Owner};
use leasehold::fleet::journal::Journal;
use leasehold::fleet::runner::{Exit, Runner, SessionStart};
use leasehold::fleet::status::{NodeStatus, StatusSnapshot};
use leasehold::store::{Cond, CountingStore, OpenOptions, Store, open_store};
use std::sync::Arc;
use std::time::Duration;

/// A runner that runs nothing and says one session runs (the gate asks).
#[derive(Debug)]
struct OneRun;

#[async_trait::async_trait]
impl Runner for OneRun {
    async fn start(&self, _: SessionStart) -> leasehold::Result<()> {
        Ok(())
    }
    fn announce(&self, _: MonoTime) {}
    async fn stop(&self, _: &str) -> Option<Exit> {
        None
    }
    fn take_exits(&self) -> Vec<Exit> {
        Vec::new()
    }
    fn running(&self) -> Vec<(String, u64)> {
        vec![("gate-bench".into(), 1)]
    }
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

pub async fn gate(url: &str, iterations: usize, json: bool) -> leasehold::Result<()> {
    let raw = open_store(url, &OpenOptions::default()).await?;
    let counting = Arc::new(CountingStore::new(raw.clone()));
    let store: Arc<dyn Store> = counting.clone();
    let key = leasehold::keys::session("gate-bench");
    let mut c = ClaimRecord::placeholder("n".into(), 0);
    c.owner = Owner {
        node: "n1".into(),
        instance: "i1".into(),
    };
    c.epoch = 1;
    c.state = ClaimState::Running;
    c.digest = "d".into();
    let cond = match raw
        .get(&key)
        .await
        .map_err(|e| leasehold::Error::from_store("get", &key, e))?
    {
        Some(o) => Cond::Match(o.version),
        None => Cond::Create,
    };
    raw.put(&key, bytes::Bytes::from(c.encode()), cond)
        .await
        .map_err(|e| leasehold::Error::from_store("put", &key, e))?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let status: Arc<NodeStatus> = Default::default();
    status.set(StatusSnapshot {
        node: "n1".into(),
        instance: "i1".into(),
        ..Default::default()
    });
    status.set_valid_until(&clock, Some(clock.now() + Duration::from_secs(3600)));
    let address = server::abstract_name(9);
    let registry = Arc::new(Registry::new(address.clone()));
    registry.register(
        "bench-token",
        RunId {
            session: "gate-bench".into(),
            epoch: 1,
            instance: "i1".into(),
            may_sleep: false,
        },
    );
    let shutdown = tokio_util::sync::CancellationToken::new();
    let listener = server::bind(&address).map_err(|e| leasehold::Error::Internal(e.to_string()))?;
    let srv = tokio::spawn(server::serve(
        listener,
        ChannelState {
            registry,
            store,
            status,
            running: leasehold::fleet::runner::running_of(Arc::new(OneRun)),
            clock: clock.clone(),
            journal: Arc::new(Journal::new(100, 1 << 20)),
        },
        shutdown.clone(),
    ));
    let client = SessionClient::new(address, "bench-token").with_epoch(1);
    let margin = Duration::from_secs(1);
    // Warm both paths.
    for _ in 0..20 {
        client.ack(margin).await?;
        let _ = raw.get(&key).await;
    }
    let before = counting.counts();
    let (mut acks, mut gets) = (
        Vec::with_capacity(iterations),
        Vec::with_capacity(iterations),
    );
    for _ in 0..iterations {
        let t = clock.now();
        let a = client.ack(margin).await?;
        acks.push(clock.now().saturating_since(t));
        assert!(a.ack);
        let t = clock.now();
        raw.get(&key)
            .await
            .map_err(|e| leasehold::Error::from_store("get", &key, e))?;
        gets.push(clock.now().saturating_since(t));
    }
    let used = counting.counts().since(&before);
    shutdown.cancel();
    let _ = srv.await;
    let (a50, a99) = (pct(&mut acks, 0.5), pct(&mut acks, 0.99));
    let (g50, g99) = (pct(&mut gets, 0.5), pct(&mut gets, 0.99));
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let per_ack = used.total() as f64 / iterations as f64;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "store": url, "iterations": iterations,
                "ack_p50_ms": ms(a50), "ack_p99_ms": ms(a99),
                "get_p50_ms": ms(g50), "get_p99_ms": ms(g99),
                "p50_ratio": ms(a50) / ms(g50),
                "overhead_p50_ms": ms(a50) - ms(g50),
                "store_requests_per_ack": per_ack,
                "gets_per_ack": used.get as f64 / iterations as f64,
            })
        );
    } else {
        println!(
            "{url}: ack p50 {:.3} ms p99 {:.3} ms; raw GET p50 {:.3} ms p99 {:.3} ms; p50 ratio {:.2}; overhead {:.3} ms; {per_ack:.2} store requests per ack ({} GETs over {iterations})",
            ms(a50),
            ms(a99),
            ms(g50),
            ms(g99),
            ms(a50) / ms(g50),
            ms(a50) - ms(g50),
            used.get
        );
    }
    Ok(())
}
