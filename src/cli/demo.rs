//! `leasehold demo`: leader election among three contenders on a local
//! directory store, with no server and no credentials. The leader is killed
//! (its process state dropped without a release) and a follower takes over
//! once the lease has been seen unchanged for ttl + margin; then the new
//! leader releases gracefully and the next takes over at once.

use crate::Name;
use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::lease::{Acquire, AcquireOptions, Lease, LeaseClient};
use crate::store::{CountingStore, OpenOptions, Store, open_store};
use std::sync::Arc;
use std::time::Duration;

pub async fn run(store_url: Option<String>, ttl: Duration) -> Result<(), Error> {
    let (url, _tmp) = match store_url {
        Some(u) => (u, None),
        None => {
            let dir = std::env::temp_dir().join(format!("leasehold-demo-{}", std::process::id()));
            (format!("file://{}", dir.display()), Some(TempDir(dir)))
        }
    };
    let store = open_store(&url, &OpenOptions::default()).await?;
    let counting = Arc::new(CountingStore::new(store));
    let store: Arc<dyn Store> = counting.clone();
    println!("store   {url}");
    let report = crate::probe::probe(&store, &crate::clock::OsEntropy::new()).await?;
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
        fmt_d(crate::lease::default_margin(ttl))
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
    t0: crate::clock::MonoTime,
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

fn ms(t0: crate::clock::MonoTime, clock: &Arc<dyn Clock>) -> String {
    format!("{}ms", clock.now().saturating_since(t0).as_millis())
}

/// Removes the demo's directory on exit.
struct TempDir(std::path::PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
