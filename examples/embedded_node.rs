//! A node embedded in a service: the service's own process runs leasehold's
//! pull loop, and "runs" each session it is given as a task of its own (an
//! in-process actor) rather than as an OS process. The `Runner` trait is
//! the seam: `start` with the lease's deadline, `announce` a later one,
//! `stop`, and report exits.
//!
//! ```sh
//! cargo run --example embedded_node -- file:///tmp/fleet api-1 10
//! ```
//!
//! runs node `api-1` on the store for 10 seconds (the store needs its fleet
//! marker: `leasehold init --store file:///tmp/fleet`), then shuts down
//! gracefully: its sessions are stopped and their claims released.
//!
//! The deadline is the contract that matters: a session must not run past
//! it (the node's lease may be another node's by then). Here each actor
//! checks it before every step; an OS-process runner enforces it from
//! outside (leasehold's `ExecRunner` and its watchdog).

use leasehold::clock::{Clock, MonoTime, SystemClock};
use leasehold::fleet::node::{NodeConfig, NodeDeps, run};
use leasehold::fleet::runner::{Exit, Runner, SessionStart};
use leasehold::store::{OpenOptions, open_store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Sessions as tokio tasks that tick until stopped or past their deadline.
#[derive(Debug)]
struct Actors {
    clock: Arc<dyn Clock>,
    deadline: Arc<Mutex<MonoTime>>,
    running: Mutex<HashMap<String, (u64, CancellationToken)>>,
    exits: Arc<Mutex<Vec<Exit>>>,
}

#[async_trait::async_trait]
impl Runner for Actors {
    async fn start(&self, s: SessionStart) -> leasehold::Result<()> {
        if self.clock.now() >= s.deadline {
            return Err(leasehold::fleet::runner::deadline_passed(&s.name, s.epoch));
        }
        *self.deadline.lock().unwrap() = s.deadline;
        let stop = CancellationToken::new();
        let (clock, deadline, exits) = (
            self.clock.clone(),
            self.deadline.clone(),
            self.exits.clone(),
        );
        let (name, epoch, token) = (s.name.clone(), s.epoch, stop.clone());
        tokio::spawn(async move {
            loop {
                if clock.now() >= *deadline.lock().unwrap() {
                    // The lease may be lost: stop acting at once.
                    exits.lock().unwrap().push(Exit {
                        name,
                        epoch,
                        code: 137,
                        deadline: true,
                        watchdog_lost: false,
                        reason: None,
                    });
                    return;
                }
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = clock.sleep(Duration::from_millis(500)) => {
                        println!("{name} (epoch {epoch}) works");
                    }
                }
            }
        });
        self.running.lock().unwrap().insert(s.name, (epoch, stop));
        Ok(())
    }

    fn announce(&self, deadline: MonoTime) {
        *self.deadline.lock().unwrap() = deadline;
    }

    async fn stop(&self, name: &str) -> Option<Exit> {
        if let Some((_, stop)) = self.running.lock().unwrap().remove(name) {
            stop.cancel();
        }
        None // an actor never ends by itself here
    }

    fn take_exits(&self) -> Vec<Exit> {
        let exits = std::mem::take(&mut *self.exits.lock().unwrap());
        let mut running = self.running.lock().unwrap();
        for x in &exits {
            running.remove(&x.name);
        }
        exits
    }

    fn running(&self) -> Vec<(String, u64)> {
        let running = self.running.lock().unwrap();
        running.iter().map(|(n, (e, _))| (n.clone(), *e)).collect()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(id)) = (args.next(), args.next()) else {
        eprintln!("usage: embedded_node STORE_URL NODE_ID [SECONDS]");
        std::process::exit(2);
    };
    let seconds: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let store = open_store(&url, &OpenOptions::default()).await?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let runner = Arc::new(Actors {
        clock: clock.clone(),
        deadline: Arc::new(Mutex::new(MonoTime::ZERO)),
        running: Mutex::new(HashMap::new()),
        exits: Arc::new(Mutex::new(Vec::new())),
    });
    let cfg = NodeConfig::new(leasehold::Name::new(id)?, Duration::from_secs(10));
    let deps = NodeDeps::new(store, clock.clone(), runner);
    let shutdown = CancellationToken::new();
    let node = tokio::spawn(run(cfg, deps, shutdown.clone()));
    clock.sleep(Duration::from_secs(seconds)).await;
    // Graceful: sessions stopped, claims and the node lease released, so
    // peers take over at once.
    shutdown.cancel();
    node.await??;
    Ok(())
}
