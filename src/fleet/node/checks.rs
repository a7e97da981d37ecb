//! Health checks of the sessions this node runs: one probe task per
//! checked run, whose results the wait between passes hands to
//! [`Node::on_check`]; the rule that folds them is
//! [`crate::fleet::check::Tracker`].
//!
//! Writes: a checked run's claim says `starting` from its start (with the
//! start's own write where there is one), `running` once its check passes
//! (one write), `unhealthy` when it fails `threshold` times in a row (one
//! write, then the run is stopped and its restart policy applies as to a
//! run that failed). Nothing is written per probe.

use super::*;
use crate::fleet::check::{self, Check, Health, Probe, Tracker, Verdict};

/// One probe's result, for the node.
#[derive(Debug)]
pub(super) struct Probed {
    pub(super) name: String,
    pub(super) epoch: u64,
    /// Which run of it (restarts keep the epoch): a result of an earlier
    /// run still queued is not the new run's.
    pub(super) run: u64,
    pub(super) result: std::result::Result<(), String>,
}

/// The probe tasks of running sessions, and where their results go.
pub(super) struct Checks {
    tx: tokio::sync::mpsc::UnboundedSender<Probed>,
    /// Taken by the wait between passes (`serve`), which owns it while it
    /// waits; given back after.
    pub(super) rx: Option<tokio::sync::mpsc::UnboundedReceiver<Probed>>,
    runs: HashMap<String, Run>,
    http: Option<reqwest::Client>,
    /// Runs probed so far (the next run's id).
    started: u64,
}

struct Run {
    epoch: u64,
    id: u64,
    started: MonoTime,
    tracker: Tracker,
    task: tokio::task::AbortHandle,
}

impl Default for Checks {
    fn default() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Checks {
            tx,
            rx: Some(rx),
            runs: HashMap::new(),
            http: None,
            started: 0,
        }
    }
}

impl Drop for Checks {
    /// A node that ends takes its probes with it.
    fn drop(&mut self) {
        for r in self.runs.values() {
            r.task.abort();
        }
    }
}

impl Checks {
    /// Stops the probes of `name`, if any.
    pub(super) fn stop(&mut self, name: &str) {
        if let Some(r) = self.runs.remove(name) {
            r.task.abort();
        }
    }

    /// Whether a result can still matter (a probe of the run we track).
    fn current(&self, p: &Probed) -> bool {
        self.runs
            .get(&p.name)
            .is_some_and(|r| r.epoch == p.epoch && r.id == p.run)
    }
}

impl Node {
    /// Starts probing run `epoch` of `name`, if its spec has a check
    /// (replacing any probes of an earlier run).
    pub(super) fn start_check(&mut self, name: &str, epoch: u64, spec: &Spec) {
        self.checks.stop(name);
        let Some(check) = spec.check.clone() else {
            return;
        };
        let http = match &check.probe {
            Probe::Http(_) => Some(
                self.checks
                    .http
                    .get_or_insert_with(|| {
                        reqwest::Client::builder()
                            .redirect(reqwest::redirect::Policy::none())
                            .no_proxy()
                            .build()
                            .unwrap_or_default()
                    })
                    .clone(),
            ),
            _ => None,
        };
        let (tx, clock, runner) = (
            self.checks.tx.clone(),
            self.deps.clock.clone(),
            self.deps.runner.clone(),
        );
        let (name2, port) = (name.to_string(), spec.port);
        self.checks.started += 1;
        let run = self.checks.started;
        let task = tokio::spawn(async move {
            // The first probe soon after the start (a quick starter is
            // `running` within a fraction of a second), then every
            // interval.
            let mut wait = check.interval().min(Duration::from_millis(250));
            loop {
                clock.sleep(wait).await;
                wait = check.interval();
                let result = probe(&check, &name2, port, http.as_ref(), &*runner).await;
                let p = Probed {
                    name: name2.clone(),
                    epoch,
                    run,
                    result,
                };
                if tx.send(p).is_err() {
                    return;
                }
            }
        });
        self.checks.runs.insert(
            name.to_string(),
            Run {
                epoch,
                id: run,
                started: self.deps.clock.now(),
                tracker: Tracker::default(),
                task: task.abort_handle(),
            },
        );
    }

    /// Folds one probe's result; see the module docs for what it writes.
    pub(super) async fn on_check(&mut self, p: Probed) {
        let running = self
            .owned
            .get(&p.name)
            .is_some_and(|o| o.running && o.record.epoch == p.epoch);
        if !running {
            // The run ended (or was lost) since: its probes end too.
            if self.checks.current(&p) {
                self.checks.stop(&p.name);
            }
            return;
        }
        if !self.checks.current(&p) {
            return; // a probe of an earlier run, already replaced
        }
        let Some(spec) = self
            .owned
            .get(&p.name)
            .and_then(|o| o.spec.as_ref().map(|s| s.1.clone()))
        else {
            return;
        };
        let Some(check) = spec.check.as_ref() else {
            return;
        };
        let now = self.deps.clock.now();
        let Some(run) = self.checks.runs.get_mut(&p.name) else {
            return;
        };
        let verdict = run
            .tracker
            .after(check, &p.result, now.saturating_since(run.started));
        match verdict {
            Verdict::Same => {}
            Verdict::Passing => {
                let Some(o) = self.owned.get(&p.name).cloned() else {
                    return;
                };
                if o.record.health.is_some() || o.record.reason.is_some() {
                    let mut next = o.record.clone();
                    next.health = None;
                    // The last run's end is history once this one passes.
                    next.reason = None;
                    if self.write_claim(&p.name, &o, next).await.is_err() {
                        // Not written: the next passing probe tries again.
                        if let Some(r) = self.checks.runs.get_mut(&p.name) {
                            r.tracker.passing = false;
                        }
                        return;
                    }
                }
                self.event(
                    EventKind::Healthy,
                    Some(&p.name),
                    Some(p.epoch),
                    format!("check passed ({})", check.describe()),
                );
            }
            Verdict::Unhealthy { failures, last } => {
                let reason = check::unhealthy_reason(check, failures, &last);
                self.event(
                    EventKind::Unhealthy,
                    Some(&p.name),
                    Some(p.epoch),
                    reason.clone(),
                );
                // Recorded before the stop, so readers see `unhealthy`
                // while it stops (its grace may be long). Unwritten (the
                // store is down), it is stopped all the same.
                if let Some(o) = self.owned.get(&p.name).cloned() {
                    let mut next = o.record.clone();
                    next.health = Some(Health::Unhealthy);
                    next.reason = Some(reason.clone());
                    if self.write_claim(&p.name, &o, next).await.is_err()
                        && !self.owned.contains_key(&p.name)
                    {
                        return; // taken over: already stopped and forgotten
                    }
                }
                self.checks.stop(&p.name);
                let own = self.deps.runner.stop(&p.name).await;
                // It may have ended by itself just before the stop (the
                // monitor took it first): that end is this run's, and is
                // taken here, never applied a second time to the next run.
                let mut others = self.deps.runner.take_exits();
                let raced = others
                    .iter()
                    .position(|x| x.name == p.name && x.epoch == p.epoch)
                    .map(|i| others.remove(i));
                // As a failed run: its policy restarts it (or, with
                // `never`, it is failed with this reason). An exit of its
                // own that raced the stop keeps its code.
                let x = Exit {
                    name: p.name.clone(),
                    epoch: p.epoch,
                    code: own.or(raced).as_ref().map_or(137, |x| x.code).max(1),
                    deadline: false,
                    watchdog_lost: false,
                    reason: Some(reason),
                };
                self.on_exit(x, true).await;
                others.sort_by(|a, b| a.name.cmp(&b.name)); // see `stop_all`
                for x in others {
                    self.on_exit(x, true).await;
                }
            }
        }
    }
}

/// Runs one probe of `check`.
async fn probe(
    check: &Check,
    name: &str,
    port: Option<u16>,
    http: Option<&reqwest::Client>,
    runner: &dyn Runner,
) -> std::result::Result<(), String> {
    match &check.probe {
        Probe::Tcp(p) => check::probe_tcp(*p, check.timeout()).await,
        Probe::Http(url) => match http {
            Some(c) => check::probe_http(c, url, port, check.timeout()).await,
            None => Err("no HTTP client".into()),
        },
        Probe::Exec(argv) => runner.exec_check(name, argv, check.timeout()).await,
    }
}
