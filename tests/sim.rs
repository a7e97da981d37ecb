//! Seeded deterministic simulation of the lease protocol under faults.
//!
//! Each schedule draws 2-5 contenders for one lease, each with its own
//! monotonic clock (arbitrary origin, rate drift up to ±0.5 %) and wall clock
//! (offset up to ±3 s), its own view of the bucket through a fault-injecting
//! store (lost responses, writes that land but report failure, latency,
//! partitions), and a life that includes freezes and crash-restarts (a new
//! instance with the host lock). Half the schedules also have a vandal that
//! deletes the lease object at any step, or wipes the bucket, and half
//! start with the lease undeclared (no object at all). Everything runs on one thread against the
//! in-memory store; the only time is a shared mock clock, so a seed
//! reproduces a schedule exactly.
//!
//! Checked on every step:
//! - no two contenders ever *believe* they hold the lease at the same
//!   instant of true time (belief = a live `Lease` whose validity deadline,
//!   mapped from the holder's clock to true time, is still ahead);
//! - epochs strictly increase across holders, and every committed write to
//!   the lease object is by its current holder or a legal takeover; after a
//!   deletion a new tenure must still be above every epoch committed before
//!   it, except (counted and reported, not failed: the limit documented in
//!   docs/protocol.md) when the deleted epoch was seen by no live contender;
//! - a contender that acts on its lease holds the newest epoch in the bucket
//!   (no stale holder's action is ever accepted by a fencing-token check).
//!
//! A failure prints the seed; `LEASEHOLD_SIM_SEED=<seed> cargo test --test
//! sim` re-runs just that schedule. `LEASEHOLD_SIM_SCHEDULES` overrides the
//! count (default 10,000).

use async_trait::async_trait;
use bytes::Bytes;
use leasehold::Name;
use leasehold::clock::{Clock, MonoTime, SeededEntropy};
use leasehold::hostlock::HostLock;
use leasehold::lease::{Acquire, AcquireOptions, Lease, LeaseClient};
use leasehold::record::{Kind, LeaseRecord};
use leasehold::store::{
    Cond, Fault, FaultPlan, FaultStore, ObjectStoreBackend, Store, StoreError, Version,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEY: &str = "leases/sim";

// ---------------------------------------------------------------- clocks --

/// True time for the whole simulation. `sleep` returns a future that stays
/// pending until the event loop advances time past its deadline, so requests
/// in flight overlap with other nodes' actions.
#[derive(Debug, Clone, Default)]
struct VirtualTime {
    now_ns: Arc<Mutex<u64>>,
    timers: Arc<Mutex<Vec<u64>>>,
}

impl VirtualTime {
    fn now_ns(&self) -> u64 {
        *self.now_ns.lock().unwrap()
    }
    fn advance_to(&self, t: u64) {
        let mut n = self.now_ns.lock().unwrap();
        assert!(t >= *n);
        *n = t;
        self.timers.lock().unwrap().retain(|&d| d > t);
    }
    fn next_timer(&self) -> Option<u64> {
        self.timers.lock().unwrap().iter().copied().min()
    }
    fn sleep_until(&self, deadline: u64) -> futures::future::BoxFuture<'static, ()> {
        self.timers.lock().unwrap().push(deadline);
        let now = self.now_ns.clone();
        Box::pin(futures::future::poll_fn(move |_| {
            if *now.lock().unwrap() >= deadline {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        }))
    }
}

impl Clock for VirtualTime {
    fn now(&self) -> MonoTime {
        MonoTime::from_since_origin(Duration::from_nanos(self.now_ns()))
    }
    fn wall_ms(&self) -> u64 {
        leasehold::clock::MOCK_WALL_EPOCH_MS + self.now_ns() / 1_000_000
    }
    fn sleep(&self, d: Duration) -> futures::future::BoxFuture<'static, ()> {
        self.sleep_until(self.now_ns() + d.as_nanos() as u64)
    }
}

/// One node's clocks as a view of true time: `local = origin + t * (1 + ppm)`.
#[derive(Debug, Clone)]
struct SkewClock {
    base: VirtualTime,
    origin_ns: i128,
    ppm: i128,
    wall_offset_ms: i64,
}

impl SkewClock {
    fn local_ns(&self, true_ns: i128) -> i128 {
        self.origin_ns + true_ns + true_ns * self.ppm / 1_000_000
    }
    /// The true instant at which this clock reads `local` (rounded up, so a
    /// belief is never cut short by rounding).
    fn true_of(&self, local: MonoTime) -> i128 {
        let l = local.since_origin().as_nanos() as i128 - self.origin_ns;
        (l * 1_000_000 + (1_000_000 + self.ppm) - 1) / (1_000_000 + self.ppm)
    }
}

impl Clock for SkewClock {
    fn now(&self) -> MonoTime {
        let t = self.base.now_ns() as i128;
        MonoTime::from_since_origin(Duration::from_nanos(self.local_ns(t) as u64))
    }
    fn wall_ms(&self) -> u64 {
        (self.base.wall_ms() as i64 + self.wall_offset_ms) as u64
    }
    fn sleep(&self, d: Duration) -> futures::future::BoxFuture<'static, ()> {
        let den = 1_000_000 + self.ppm;
        let true_ns = (d.as_nanos() as i128 * 1_000_000 + den - 1) / den;
        self.base.sleep(Duration::from_nanos(true_ns as u64))
    }
}

// --------------------------------------------------------------- history --

/// The bucket's side of the invariants: every committed write to the lease
/// object is checked against the one before it.
#[derive(Debug)]
struct History {
    inner: Arc<dyn Store>,
    /// The last record committed since the object was last deleted.
    last: Mutex<Option<LeaseRecord>>,
    /// The highest epoch of any holder's record ever committed, deletions or
    /// not: the fencing token a downstream system may have seen.
    max_held: Mutex<u64>,
    /// Epochs of new tenures at or below `max_held` (after a deletion).
    reissued: Mutex<Vec<u64>>,
    /// The epoch of the last holder's record committed (deletions do not
    /// reset it): the tenure a fencing check would accept now.
    current: Mutex<u64>,
    /// Has the vandal struck yet?
    deleted: Mutex<bool>,
    violations: Mutex<Vec<String>>,
    commits: Mutex<u64>,
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sim-bucket")
    }
}

impl History {
    fn current_epoch(&self) -> u64 {
        *self.current.lock().unwrap()
    }

    /// The vandal: deletes the lease object behind everyone's back.
    fn vandalise(&self) {
        if std::env::var_os("LEASEHOLD_SIM_TRACE").is_some() {
            eprintln!("delete");
        }
        futures::executor::block_on(self.inner.delete(KEY)).unwrap();
        *self.last.lock().unwrap() = None;
        *self.deleted.lock().unwrap() = true;
    }

    fn check(&self, new: &LeaseRecord) {
        if std::env::var_os("LEASEHOLD_SIM_TRACE").is_some() {
            eprintln!(
                "commit {}@{} released={} node={}",
                new.holder.instance, new.epoch, new.released, new.holder.node
            );
        }
        let mut last = self.last.lock().unwrap();
        let mut max_held = self.max_held.lock().unwrap();
        let bad = |b: String| self.violations.lock().unwrap().push(b);
        if new.is_placeholder() {
            // A marker or a declaration: never above what was handed out.
            if new.epoch > *max_held {
                bad(format!(
                    "a placeholder invented epoch {} above {}",
                    new.epoch, *max_held
                ));
            }
            *last = Some(new.clone());
            return;
        }
        match last.as_ref() {
            // The same tenure: a renewal or the release.
            Some(prev)
                if !prev.is_placeholder()
                    && prev.holder == new.holder
                    && prev.epoch == new.epoch =>
            {
                if prev.released {
                    bad(format!(
                        "a released lease was revived at its epoch {}",
                        new.epoch
                    ));
                }
            }
            // A new tenure.
            Some(p) if !p.is_placeholder() => {
                // Straight over the record it took over: one above; more
                // only when the taker knew a higher epoch from before a
                // deletion (never less).
                let deleted = *self.deleted.lock().unwrap();
                if new.epoch <= p.epoch || (!deleted && new.epoch != p.epoch + 1) {
                    bad(format!(
                        "epoch went {}@{} -> {}@{}",
                        p.holder.instance, p.epoch, new.holder.instance, new.epoch
                    ));
                }
            }
            Some(p) => {
                // Over a marker or a declaration: above it, and above every
                // token handed out before, unless the marker knew less than
                // was deleted (counted: the documented limit).
                if new.epoch <= p.epoch {
                    bad(format!(
                        "epoch {} not above the placeholder's {}",
                        new.epoch, p.epoch
                    ));
                } else if new.epoch <= *max_held {
                    self.reissued.lock().unwrap().push(new.epoch);
                }
                if *max_held == 0 && new.epoch != 1 {
                    bad(format!("first epoch {}", new.epoch));
                }
            }
            None => bad(format!(
                "a holder's record (epoch {}) created where none was (highest so far {})",
                new.epoch, *max_held
            )),
        }
        *max_held = (*max_held).max(new.epoch);
        *self.current.lock().unwrap() = new.epoch;
        *last = Some(new.clone());
    }
}

#[async_trait]
impl leasehold::store::Forward for History {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let r = self.inner.put(key, bytes.clone(), cond).await;
        if r.is_ok() && key == KEY {
            *self.commits.lock().unwrap() += 1;
            let new =
                LeaseRecord::decode(key, &bytes, Kind::Lease).expect("we write valid records");
            self.check(&new);
        }
        r
    }
}

// ------------------------------------------------------------ contenders --

type Op = std::pin::Pin<Box<dyn std::future::Future<Output = Done>>>;

/// What an operation in flight hands back when its response arrives.
#[allow(clippy::large_enum_variant)] // one per node in flight; size is irrelevant
enum Done {
    Acquire(leasehold::Result<Acquire>),
    Renew(Box<Lease>, leasehold::Result<()>),
    Release(leasehold::Result<()>),
    /// Naive baseline: Some(epoch) if its wall-clock takeover committed.
    Naive(Option<u64>),
}

/// Held while a host lock is taken, and from the moment this test binary
/// spawns a child until that child has run its own code
/// ([`spawn_settled`]). A child holds a copy of every open descriptor from
/// its fork until its exec has closed the close-on-exec ones, and an
/// `flock` stays held while any copy of its descriptor is open: a crashed
/// sim node's lock, dropped in that window, would still be held when its
/// next instance tries to take it. (A node daemon never meets this: its
/// predecessor is another process, whose descriptors died with it.)
static NO_FORK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Spawns `cmd` with stdout piped, and returns once the child has written
/// its first byte (or closed stdout), holding [`NO_FORK`] until then.
///
/// Why not release at `spawn()`'s return: `spawn` returns when the child's
/// exec has replaced its memory (the vfork completion, or Rust's exec-error
/// pipe), but the kernel closes close-on-exec descriptors after that point,
/// and releases their `flock`s only on the child's way back to user space.
/// A byte on stdout is written from user space after exec, so by then every
/// inherited lock descriptor is gone. Releasing at `spawn()` let a restarted
/// sim node meet its own dead predecessor's lock; the test
/// `a_child_never_holds_a_sim_node_s_host_lock` catches that within a few
/// dozen spawns.
fn spawn_settled(cmd: &mut std::process::Command) -> (std::process::Child, Vec<u8>) {
    use std::io::Read;
    let _no_fork = NO_FORK.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut first = [0u8; 1];
    let n = child.stdout.as_mut().unwrap().read(&mut first).unwrap_or(0);
    (child, first[..n].to_vec())
}

struct Node {
    id: String,
    host: String,
    lock_dir: std::path::PathBuf,
    clock: SkewClock,
    faults: Arc<FaultStore>,
    client: Option<LeaseClient>,
    /// The lease, when held and no operation on it is in flight.
    lease: Option<Lease>,
    /// The true instant this node believes it holds the lease until, and the
    /// epoch it believes it holds. Set when a response shows the lease ours;
    /// cleared on loss, release (before the write) and crash.
    belief: Option<(i128, u64)>,
    op: Option<Op>,
    frozen_until: i128,
    partitioned_until: i128,
    incarnation: u64,
    seed: u64,
}

impl Node {
    fn start(&mut self) {
        self.incarnation += 1;
        let lock = {
            let _no_fork = NO_FORK.lock().unwrap_or_else(|p| p.into_inner());
            HostLock::acquire(&self.lock_dir, "sim", &self.id, &self.host)
                .expect("the previous instance is dead, so its host lock is free")
        };
        let client = LeaseClient::builder(self.faults.clone(), Name::new(self.id.clone()).unwrap())
            .host_lock(lock)
            .clock(Arc::new(self.clock.clone()))
            .entropy(Arc::new(SeededEntropy::new(
                self.seed ^ (self.incarnation << 32),
            )))
            .build()
            .unwrap();
        self.client = Some(client);
    }

    fn believes_at(&self, t: i128) -> bool {
        self.belief.is_some_and(|(until, _)| until > t)
    }
}

// -------------------------------------------------------------- schedule --

#[derive(Debug, Clone, Copy)]
struct Config {
    /// Replace expiry-by-observation with a wall-clock judgment for the last
    /// contender: the baseline the checker must catch.
    naive: bool,
    steps: usize,
    /// Let a vandal delete the object and wipe the bucket (in the schedules
    /// whose seed draws one).
    vandal: bool,
}

#[derive(Debug, Default)]
struct Outcome {
    violations: Vec<String>,
    trace_hash: u64,
    acquisitions: u64,
    commits: u64,
    faults: u64,
    deletions: u64,
    absent_answers: u64,
    reissued: u64,
}

fn fnv(h: &mut u64, s: &str) {
    for b in s.bytes() {
        *h ^= b as u64;
        *h = h.wrapping_mul(0x100000001b3);
    }
}

/// Checks that nobody but `me` believes at true instant `now`.
fn check_exclusive(nodes: &[Node], me: usize, now: i128, what: &str, v: &mut Vec<String>) {
    // A response that arrives after its own deadline (a frozen process, a
    // slow network) establishes no belief.
    if !nodes[me].believes_at(now) {
        return;
    }
    for (j, other) in nodes.iter().enumerate() {
        if j != me && other.believes_at(now) {
            let (until, epoch) = other.belief.unwrap();
            v.push(format!(
                "t={}ms: node {me} ({what}, epoch {:?}) and node {j} (epoch {epoch}, believes {}ms more) both believe they hold the lease",
                now / 1_000_000,
                nodes[me].belief.map(|b| b.1),
                (until - now) / 1_000_000
            ));
        }
    }
}

fn run_schedule(seed: u64, cfg: Config) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let time = VirtualTime::default();
    let history = Arc::new(History {
        inner: Arc::new(ObjectStoreBackend::memory()),
        last: Mutex::new(None),
        max_held: Mutex::new(0),
        reissued: Mutex::new(Vec::new()),
        current: Mutex::new(0),
        deleted: Mutex::new(false),
        violations: Mutex::new(Vec::new()),
        commits: Mutex::new(0),
    });
    let vandal = cfg.vandal && rng.random_bool(0.5);
    let declared = rng.random_bool(0.5);
    let tmp = tempfile::tempdir().unwrap();
    let ttl_ms = [200u64, 400, 1000, 3000][rng.random_range(0..4)];
    let ttl = Duration::from_millis(ttl_ms);
    let ttl_ns = ttl.as_nanos() as i128;
    let n = rng.random_range(2..=5usize);
    let mut nodes: Vec<Node> = (0..n)
        .map(|i| {
            // Sometimes two machines are misconfigured with one node id.
            let id = if i == 1 && rng.random_bool(0.2) {
                "n0".to_string()
            } else {
                format!("n{i}")
            };
            let host = format!("host{i}");
            let clock = SkewClock {
                base: time.clone(),
                origin_ns: rng.random_range(0..10_000_000_000_000i128),
                ppm: rng.random_range(-5000..=5000),
                wall_offset_ms: rng.random_range(-3000..=3000),
            };
            let plan = FaultPlan {
                fail_before: rng.random_range(0.0..0.15),
                land_then_fail: rng.random_range(0.0..0.15),
                delay: rng.random_range(0.0..0.5),
                max_delay: ttl / 3,
            };
            let faults = Arc::new(
                FaultStore::new(history.clone())
                    .with_clock(Arc::new(time.clone()))
                    .with_plan(rng.random(), plan),
            );
            Node {
                id,
                lock_dir: tmp.path().join(&host),
                host,
                clock,
                faults,
                client: None,
                lease: None,
                belief: None,
                op: None,
                frozen_until: 0,
                partitioned_until: 0,
                incarnation: 0,
                seed: rng.random(),
            }
        })
        .collect();
    for node in nodes.iter_mut() {
        node.start();
    }
    if declared {
        // Straight to the bucket: the fault stores' delays wait on the
        // simulation's time, which does not move here.
        let c = LeaseClient::builder(history.clone(), Name::new("admin").unwrap())
            .entropy(Arc::new(SeededEntropy::new(seed)))
            .build()
            .unwrap();
        futures::executor::block_on(c.create(&Name::new("sim").unwrap())).unwrap();
    }
    let opts = AcquireOptions::ttl(ttl);
    let name = Name::new("sim").unwrap();
    let mut out = Outcome::default();
    let mut h: u64 = 0xcbf29ce484222325;
    let mut violations: Vec<String> = Vec::new();
    let waker = futures::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);

    let mut step = 0;
    let mut next_action = time.now_ns() + rng.random_range(0..(ttl_ns / 4) as u64);
    while step < cfg.steps {
        // Advance to the next event: a timer firing (a delayed request
        // reaching the store or its response arriving) or the next action.
        let target = time
            .next_timer()
            .map_or(next_action, |t| t.min(next_action));
        time.advance_to(target);
        let now = time.now_ns() as i128;

        // Deliver whatever completed. Frozen processes are not polled: their
        // requests make no progress (as if delayed in the network) and they
        // handle no responses.
        for i in 0..n {
            if now < nodes[i].frozen_until {
                continue;
            }
            let partitioned = now < nodes[i].partitioned_until;
            nodes[i].faults.set_partitioned(partitioned);
            let Some(op) = nodes[i].op.as_mut() else {
                continue;
            };
            let std::task::Poll::Ready(done) = op.as_mut().poll(&mut cx) else {
                continue;
            };
            nodes[i].op = None;
            match done {
                Done::Acquire(Ok(Acquire::Acquired(lease))) => {
                    let until = nodes[i].clock.true_of(lease.valid_until());
                    fnv(&mut h, &format!("{now} acquired {i} {}", lease.epoch()));
                    nodes[i].belief = Some((until, lease.epoch()));
                    nodes[i].lease = Some(lease);
                    out.acquisitions += 1;
                    check_exclusive(&nodes, i, now, "acquired", &mut violations);
                }
                Done::Acquire(Ok(Acquire::Held { epoch, .. })) => {
                    fnv(&mut h, &format!("{now} held {i} {epoch}"))
                }
                Done::Acquire(Ok(Acquire::Absent { epoch, .. })) => {
                    out.absent_answers += 1;
                    fnv(&mut h, &format!("{now} absent {i} {epoch}"))
                }
                Done::Acquire(Err(e)) => {
                    assert!(
                        matches!(
                            e.kind(),
                            leasehold::ErrorKind::Conflict | leasehold::ErrorKind::Unavailable
                        ),
                        "seed {seed}: unexpected error {e}"
                    );
                    fnv(&mut h, &format!("{now} acquire-err {i} {:?}", e.kind()));
                }
                Done::Renew(lease, r) => {
                    fnv(
                        &mut h,
                        &format!("{now} renew {i} {:?}", r.as_ref().map_err(|e| e.kind())),
                    );
                    match r {
                        Ok(()) => {
                            let until = nodes[i].clock.true_of(lease.valid_until());
                            nodes[i].belief = Some((until, lease.epoch()));
                            nodes[i].lease = Some(*lease);
                            check_exclusive(&nodes, i, now, "renewed", &mut violations);
                        }
                        Err(e) if e.kind() == leasehold::ErrorKind::Fenced => {
                            nodes[i].belief = None
                        }
                        Err(_) => nodes[i].lease = Some(*lease),
                    }
                }
                Done::Release(r) => fnv(
                    &mut h,
                    &format!("{now} released {i} {:?}", r.map_err(|e| e.kind())),
                ),
                Done::Naive(Some(epoch)) => {
                    nodes[i].belief = Some((now + ttl_ns * 9 / 10, epoch));
                    out.acquisitions += 1;
                    check_exclusive(&nodes, i, now, "naive takeover", &mut violations);
                }
                Done::Naive(None) => {}
            }
        }
        // Beliefs end at their deadlines.
        for node in nodes.iter_mut() {
            if node.belief.is_some() && !node.believes_at(now) {
                node.belief = None;
            }
        }
        if target < next_action {
            continue;
        }

        // One action by a random node.
        step += 1;
        next_action = time.now_ns() + rng.random_range(0..(ttl_ns / 4) as u64);
        let i = rng.random_range(0..n);
        let roll: f64 = rng.random();
        if roll < 0.02 {
            nodes[i].frozen_until = now + rng.random_range(0..3 * ttl_ns);
            fnv(&mut h, &format!("{step} freeze {i}"));
            continue;
        } else if roll < 0.03 {
            // Crash: the process, its request in flight and its beliefs die;
            // a new instance starts and takes the host lock.
            let node = &mut nodes[i];
            node.op = None;
            node.lease = None;
            node.belief = None;
            node.client = None;
            node.frozen_until = 0;
            node.start();
            fnv(&mut h, &format!("{step} crash {i}"));
            continue;
        } else if roll < 0.05 {
            nodes[i].partitioned_until = now + rng.random_range(0..2 * ttl_ns);
            fnv(&mut h, &format!("{step} partition {i}"));
            continue;
        } else if vandal && roll < 0.08 {
            // An operator, a lifecycle rule or a wipe (in this sim's bucket,
            // the lease object is all there is) removes the object. Nobody
            // is told; requests in flight land on whatever is there.
            history.vandalise();
            out.deletions += 1;
            fnv(&mut h, &format!("{step} delete"));
            continue;
        }
        let node = &mut nodes[i];
        if now < node.frozen_until || node.op.is_some() {
            continue;
        }
        let client = node.client.clone().unwrap();

        if cfg.naive && i == n - 1 {
            if node.belief.is_some() {
                continue;
            }
            // Baseline: judge expiry from the record's wall-clock field.
            let faults = node.faults.clone();
            let wall = node.clock.clone();
            let name = name.clone();
            let tag = format!("naive{step}");
            node.op = Some(Box::pin(async move {
                let Ok(Some((rec, version, _))) = client.read(Kind::Lease, &name).await else {
                    return Done::Naive(None);
                };
                if !(rec.released || rec.renewed_at_ms + rec.ttl_ms <= wall.wall_ms()) {
                    return Done::Naive(None);
                }
                let mut next = rec.clone();
                next.holder = client.holder().clone();
                next.epoch += 1;
                next.released = false;
                next.nonce = tag;
                next.renewed_at_ms = wall.wall_ms();
                let bytes = Bytes::from(next.encode().unwrap());
                match faults.put(KEY, bytes, Cond::Match(version)).await {
                    Ok(_) => Done::Naive(Some(next.epoch)),
                    Err(_) => Done::Naive(None),
                }
            }));
            continue;
        }

        if let Some(lease) = node.lease.take() {
            if !lease.is_valid() {
                fnv(&mut h, &format!("{step} expired {i}"));
                node.belief = None;
                continue;
            }
            // Acting on the lease: its fencing token must be the newest.
            if lease.epoch() != history.current_epoch() {
                violations.push(format!(
                    "t={}ms: node {i} acted with epoch {} while the bucket is at {}",
                    now / 1_000_000,
                    lease.epoch(),
                    history.current_epoch()
                ));
            }
            let action: f64 = rng.random();
            if action < 0.05 {
                node.belief = None; // stops believing before the write
                node.op = Some(Box::pin(
                    async move { Done::Release(lease.release().await) },
                ));
            } else if action < 0.7 {
                let mut lease = Box::new(lease);
                node.op = Some(Box::pin(async move {
                    let r = lease.renew_once().await;
                    Done::Renew(lease, r)
                }));
            } else {
                node.lease = Some(lease);
            }
        } else {
            let name = name.clone();
            let opts = opts.clone();
            node.op = Some(Box::pin(async move {
                Done::Acquire(client.acquire(&name, &opts).await)
            }));
        }
    }
    violations.extend(history.violations.lock().unwrap().drain(..));
    out.violations = violations;
    out.trace_hash = h;
    out.commits = *history.commits.lock().unwrap();
    out.faults = nodes.iter().map(|n| n.faults.injected()).sum();
    out.reissued = history.reissued.lock().unwrap().len() as u64;
    out
}

fn schedules() -> Vec<u64> {
    if let Ok(s) = std::env::var("LEASEHOLD_SIM_SEED") {
        return vec![s.parse().expect("LEASEHOLD_SIM_SEED must be a number")];
    }
    let n: u64 = std::env::var("LEASEHOLD_SIM_SCHEDULES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    (0..n).map(|i| 0x5eed_0000 + i).collect()
}

#[test]
fn no_two_holders_ever_believe_at_once() {
    let seeds = schedules();
    let cfg = Config {
        naive: false,
        steps: 150,
        vandal: true,
    };
    // Two cores: split the seeds; each schedule is independent.
    let results: Vec<(u64, Outcome)> = std::thread::scope(|s| {
        let halves: Vec<_> = seeds
            .chunks(seeds.len().div_ceil(2).max(1))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|&seed| (seed, run_schedule(seed, cfg)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        halves.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut acquisitions = 0;
    let mut commits = 0;
    let mut faults = 0;
    let (mut deletions, mut absent, mut reissued) = (0, 0, 0);
    for (seed, o) in &results {
        assert!(
            o.violations.is_empty(),
            "seed {seed} violated safety (re-run: LEASEHOLD_SIM_SEED={seed} cargo test --test sim):\n{}",
            o.violations.join("\n")
        );
        acquisitions += o.acquisitions;
        commits += o.commits;
        faults += o.faults;
        deletions += o.deletions;
        absent += o.absent_answers;
        reissued += o.reissued;
    }
    eprintln!(
        "{} schedules: {acquisitions} acquisitions, {commits} committed writes, {faults} injected faults, \
         {deletions} deletions, {absent} absent answers, {reissued} epochs made again after a deletion \
         that no live contender saw, 0 violations",
        results.len()
    );
    if seeds.len() >= 1000 {
        assert!(
            deletions as usize > seeds.len(),
            "too few deletions: {deletions}"
        );
        assert!(
            absent as usize > seeds.len() / 10,
            "too few absent answers: {absent}"
        );
    }
    // The schedules must actually exercise the protocol.
    assert!(
        acquisitions as usize > seeds.len(),
        "too few acquisitions: {acquisitions}"
    );
    assert!(faults as usize > seeds.len(), "too few faults: {faults}");
}

#[test]
fn one_seed_replays_identically() {
    let cfg = Config {
        naive: false,
        steps: 300,
        vandal: true,
    };
    let a = run_schedule(42, cfg);
    let b = run_schedule(42, cfg);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(
        (a.acquisitions, a.commits, a.faults),
        (b.acquisitions, b.commits, b.faults)
    );
    let c = run_schedule(43, cfg);
    assert_ne!(
        a.trace_hash, c.trace_hash,
        "different seeds, different schedules"
    );
}

/// A seed replays exactly in another process too: the trace hash (every
/// step's action and answer) of a few schedules, here and in a child
/// process of this test binary.
#[test]
fn a_seed_replays_across_processes() {
    let digest = || {
        let cfg = Config {
            naive: false,
            steps: 300,
            vandal: true,
        };
        [42u64, 7, 1234]
            .map(|seed| {
                let o = run_schedule(seed, cfg);
                format!("{seed}:{:x}:{}:{}", o.trace_hash, o.acquisitions, o.commits)
            })
            .join(" ")
    };
    if std::env::var_os("LEASEHOLD_SIM_REPLAY_CHILD").is_some() {
        println!("replay-digest: {}", digest());
        return;
    }
    let here = digest();
    let (child, mut stdout) = spawn_settled(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "a_seed_replays_across_processes", "--nocapture"])
            .env("LEASEHOLD_SIM_REPLAY_CHILD", "1")
            .env_remove("LEASEHOLD_SIM_SEED")
            .stderr(std::process::Stdio::piped()),
    );
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.extend_from_slice(&out.stdout);
    let stdout = String::from_utf8_lossy(&stdout);
    let child = stdout
        .lines()
        .find_map(|l| l.strip_prefix("replay-digest: "))
        .unwrap_or_else(|| panic!("no digest from the child: {stdout}"));
    assert_eq!(child, here, "the child process replayed differently");
}

/// The checker is not vacuous: a contender that judges expiry by comparing
/// the record's wall-clock field with its own wall clock (the naive design)
/// is caught double-believing under ±3 s clock offsets.
#[test]
fn checker_catches_the_wall_clock_baseline() {
    let cfg = Config {
        naive: true,
        steps: 300,
        vandal: false,
    };
    let caught = (0..200u64)
        .filter(|&seed| !run_schedule(0xbad_0000 + seed, cfg).violations.is_empty())
        .count();
    eprintln!("wall-clock baseline caught double-believing in {caught}/200 schedules");
    assert!(
        caught >= 20,
        "the naive baseline should be caught often; caught in {caught}/200"
    );
}

#[test]
fn fault_store_script_is_honoured() {
    // A tiny direct check that the fault script applies in order.
    let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let f = FaultStore::new(inner.clone());
    f.push(Fault::LandThenFail);
    f.push(Fault::FailBefore);
    let e = futures::executor::block_on(f.put("k/a", Bytes::from_static(b"1"), Cond::Create))
        .unwrap_err();
    assert!(matches!(e, StoreError::Ambiguous { .. }));
    assert!(
        futures::executor::block_on(inner.get("k/a"))
            .unwrap()
            .is_some(),
        "landed"
    );
    let e = futures::executor::block_on(f.put("k/b", Bytes::from_static(b"1"), Cond::Create))
        .unwrap_err();
    assert!(matches!(e, StoreError::Ambiguous { .. }));
    assert!(
        futures::executor::block_on(inner.get("k/b"))
            .unwrap()
            .is_none(),
        "did not land"
    );
}

/// The sim's crash-restart relies on a dead instance's host lock being free
/// at once. A child process spawned by this binary holds copies of every
/// open descriptor until its exec has closed them, so [`spawn_settled`]
/// keeps sim nodes from taking locks until the child runs its own code.
/// Here a spawner forks children as fast as it can beside crash-heavy
/// schedules; with the wait removed (released at `spawn()`'s return), a
/// restart meets its predecessor's lock within a few dozen spawns.
#[test]
fn a_child_never_holds_a_sim_node_s_host_lock() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const SPAWNS: u64 = 300;
    const MIN_SCHEDULES: u64 = 150;
    let done = Arc::new(AtomicBool::new(false));
    let spawner = {
        let done = done.clone();
        std::thread::spawn(move || {
            for _ in 0..SPAWNS {
                let (child, _) = spawn_settled(std::process::Command::new("/bin/echo").arg("x"));
                child.wait_with_output().unwrap();
            }
            done.store(true, Ordering::Relaxed);
        })
    };
    let cfg = Config {
        naive: true,
        steps: 300,
        vandal: false,
    };
    // Schedules until every spawn is done (at least MIN_SCHEDULES): counts,
    // not time, so a loaded machine changes how long this takes, not what
    // it covers.
    let restarts = std::panic::catch_unwind(|| {
        let mut seed = 0u64;
        while seed < MIN_SCHEDULES || !done.load(Ordering::Relaxed) {
            run_schedule(0xf0_0000 + seed, cfg);
            seed += 1;
        }
        seed
    });
    spawner.join().unwrap();
    match restarts {
        Ok(schedules) => {
            eprintln!("{SPAWNS} children spawned beside {schedules} crash-restarting schedules")
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
