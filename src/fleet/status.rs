//! What a node publishes about itself to its HTTP API and metrics:
//! readiness, the session table, renew latencies.

use crate::clock::{Clock, MonoTime};
use crate::fleet::claim::ClaimState;
use std::sync::Arc;
use std::time::Duration;

/// What the node publishes about itself for its HTTP API and tests: a
/// snapshot replaced at the end of every tick, so readers never touch the
/// pull loop's state; and a histogram of renew latencies.
#[derive(Debug, Default)]
pub struct NodeStatus {
    pub(crate) inner: std::sync::RwLock<StatusSnapshot>,
    /// Snapshots set so far: a publisher that knows the count its own
    /// snapshot stood at knows whether anyone replaced it since.
    pub(crate) sets: std::sync::atomic::AtomicU64,
    pub(crate) renew: std::sync::Mutex<RenewHistogram>,
    pub(crate) live: std::sync::Mutex<ReadinessInputs>,
    pub(crate) corrupt: std::sync::Mutex<Vec<String>>,
    /// Published in the node record (`cordoned`): this node takes no new
    /// sessions (`leasehold node cordon`).
    pub(crate) cordoned: std::sync::atomic::AtomicBool,
    /// Set by a nudge (`POST /v1/nudge`): the next pass comes at once and
    /// re-reads this node's control object.
    pub(crate) nudged: std::sync::atomic::AtomicBool,
    pub(crate) nudge: tokio::sync::Notify,
    /// Sessions a wake reached since the pull loop last looked
    /// (`POST /v1/sessions/{name}/touch`): their idle time restarts.
    pub(crate) touched: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// What readiness is computed from, at the moment it is asked: never a
/// stored flag, which a hung pull loop would leave saying "ready".
#[derive(Debug, Default)]
pub(crate) struct ReadinessInputs {
    pub(crate) clock: Option<Arc<dyn Clock>>,
    /// The node lease's validity as the renew task last extended it.
    pub(crate) valid_until: Option<MonoTime>,
    /// When the pull loop last completed a pass, and how old that may get.
    pub(crate) last_pass: Option<MonoTime>,
    pub(crate) pass_bound: Duration,
}

/// The answer to [`NodeStatus::readiness`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    /// Why not, when not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Upper bounds of the renew-latency buckets, in seconds (Prometheus style).
pub const RENEW_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];

/// Adds one observation to a histogram over [`RENEW_BUCKETS`].
fn bucket(buckets: &mut [u64; 10], count: &mut u64, sum: &mut f64, d: Duration) {
    let secs = d.as_secs_f64();
    if let Some(i) = RENEW_BUCKETS.iter().position(|b| secs <= *b) {
        buckets[i] += 1;
    }
    *count += 1;
    *sum += secs;
}

/// Cumulative renew-latency histogram.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RenewHistogram {
    /// Counts per bucket of [`RENEW_BUCKETS`] (not cumulative).
    pub buckets: [u64; 10],
    pub count: u64,
    pub sum_seconds: f64,
    pub failures: u64,
    /// How late after it was due (its timer's end) each renewal started,
    /// in the same buckets: a renew task starved of its thread by long
    /// synchronous work shows here before it shows as a lost lease.
    pub late_buckets: [u64; 10],
    pub late_count: u64,
    pub late_sum_seconds: f64,
    /// The longest of them since the process started (for the spike).
    pub max_late_seconds: f64,
}

/// See [`NodeStatus`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StatusSnapshot {
    pub node: String,
    /// Empty until registered.
    pub instance: String,
    /// Registered and within the node lease's validity at the last tick.
    pub ready: bool,
    pub sessions: Vec<SessionStatus>,
}

/// One owned session as the node sees it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionStatus {
    pub name: String,
    pub epoch: u64,
    pub state: ClaimState,
    pub running: bool,
    pub restarts: u32,
}

impl NodeStatus {
    /// Asks the pull loop for a pass now (best effort; at most one pass per
    /// [`NUDGE_MIN_GAP`](super::node::NUDGE_MIN_GAP) however often it is asked), which also re-reads the
    /// node's control object. The bucket stays the truth: a nudge only
    /// makes the node look sooner.
    pub fn nudge(&self) {
        self.nudged.store(true, std::sync::atomic::Ordering::SeqCst);
        self.nudge.notify_one();
    }

    /// Whether a nudge is waiting for the next pass (which clears it).
    pub fn nudge_pending(&self) -> bool {
        self.nudged.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether this node is cordoned (takes no new sessions).
    pub fn cordoned(&self) -> bool {
        self.cordoned.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many sessions the last published snapshot shows running: what a
    /// sampler asks often, without copying the snapshot (one entry per
    /// owned session).
    pub fn running_count(&self) -> usize {
        self.inner
            .read()
            .unwrap()
            .sessions
            .iter()
            .filter(|s| s.running)
            .count()
    }

    /// The last published snapshot, with `ready` computed now.
    pub fn snapshot(&self) -> StatusSnapshot {
        let mut s = self.inner.read().unwrap().clone();
        s.ready = self.readiness().ready;
        s
    }

    /// Ready means: registered, within the node lease's validity as of now,
    /// and a pass of the pull loop completed within its bound (a loop stuck
    /// on a store call or a session is not ready, whatever it last said).
    pub fn readiness(&self) -> Readiness {
        let l = self.live.lock().unwrap();
        let not = |r: &str| Readiness {
            ready: false,
            reason: Some(r.to_string()),
        };
        let (Some(clock), Some(until), Some(pass)) = (&l.clock, l.valid_until, l.last_pass) else {
            return not("not registered");
        };
        let now = clock.now();
        if now >= until {
            return not("the node lease's validity has passed");
        }
        let age = now.saturating_since(pass);
        if age > l.pass_bound {
            return not(&format!(
                "the last pass of the pull loop completed {} ago (bound {})",
                humantime::format_duration(Duration::from_millis(age.as_millis() as u64)),
                humantime::format_duration(l.pass_bound)
            ));
        }
        Readiness {
            ready: true,
            reason: None,
        }
    }

    /// A wake reached this node for `session` (its `sleep.after_idle`
    /// counts from the pull loop's next look). Bounded: a flood of names
    /// keeps at most 100,000.
    pub fn touch(&self, session: &str) {
        let mut t = self.touched.lock().unwrap();
        if t.len() < 100_000 {
            t.insert(session.to_string());
        }
    }

    /// The sessions touched since the last call.
    #[cfg(feature = "node")]
    pub(crate) fn take_touches(&self) -> std::collections::HashSet<String> {
        std::mem::take(&mut self.touched.lock().unwrap())
    }

    /// Whether this node's last published session table lists `session`.
    pub fn runs(&self, session: &str) -> bool {
        self.inner
            .read()
            .unwrap()
            .sessions
            .iter()
            .any(|s| s.name == session)
    }

    /// How long the node lease stays valid from now (None: not registered,
    /// lost or released; zero: past).
    pub fn valid_for(&self) -> Option<Duration> {
        let l = self.live.lock().unwrap();
        let (clock, until) = (l.clock.as_ref()?, l.valid_until?);
        Some(until.saturating_since(clock.now()))
    }

    /// The renew task: the node lease is valid until `until` (None: lost,
    /// released or not yet registered).
    pub fn set_valid_until(&self, clock: &Arc<dyn Clock>, until: Option<MonoTime>) {
        let mut l = self.live.lock().unwrap();
        l.clock = Some(clock.clone());
        l.valid_until = until;
    }

    /// Keys the pull loop skips as corrupt or foreign (for `/metrics`).
    pub fn set_corrupt(&self, mut keys: Vec<String>) {
        keys.sort();
        *self.corrupt.lock().unwrap() = keys;
    }

    pub fn corrupt(&self) -> Vec<String> {
        self.corrupt.lock().unwrap().clone()
    }

    /// The pull loop completed a pass at `at`; the next is due within `bound`.
    pub fn pass_completed(&self, at: MonoTime, bound: Duration) {
        let mut l = self.live.lock().unwrap();
        l.last_pass = Some(at);
        l.pass_bound = bound;
    }

    /// Records one successful renew's latency (send to response).
    pub fn record_renew(&self, latency: Duration) {
        let h = &mut *self.renew.lock().unwrap();
        bucket(&mut h.buckets, &mut h.count, &mut h.sum_seconds, latency);
    }

    /// Records how late after its due time a renewal started.
    pub fn record_renew_late(&self, late: Duration) {
        let h = &mut *self.renew.lock().unwrap();
        bucket(
            &mut h.late_buckets,
            &mut h.late_count,
            &mut h.late_sum_seconds,
            late,
        );
        h.max_late_seconds = h.max_late_seconds.max(late.as_secs_f64());
    }

    /// Records a renew that failed (transiently or for good).
    pub fn record_renew_failure(&self) {
        self.renew.lock().unwrap().failures += 1;
    }

    pub fn renew_histogram(&self) -> RenewHistogram {
        self.renew.lock().unwrap().clone()
    }

    /// Replaces the snapshot. The node loop calls it every tick; embedders
    /// that drive their own loop (and tests) may too.
    pub fn set(&self, s: StatusSnapshot) -> u64 {
        let mut inner = self.inner.write().unwrap();
        *inner = s;
        // Counted under the lock: the count a setter gets back is the one
        // its snapshot stands at.
        self.sets.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1
    }

    /// Snapshots set so far (see `set`).
    #[cfg(feature = "node")]
    pub(crate) fn sets(&self) -> u64 {
        self.sets.load(std::sync::atomic::Ordering::SeqCst)
    }
}
