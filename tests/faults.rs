//! Ambiguous and failed writes, one path at a time, with scripted faults and a
//! mock clock: every outcome is resolved by reading back, never guessed, and
//! every typed error leaves the bucket as it was.

use async_trait::async_trait;
use bytes::Bytes;
use leasehold::clock::{MockClock, SeededEntropy};
use leasehold::lease::{Acquire, AcquireOptions, LeaseClient};
use leasehold::record::Kind;
use leasehold::store::{
    Cond, CountingStore, Fault, FaultStore, Object, ObjectStoreBackend, Store, StoreError, Version,
};
use leasehold::{ErrorKind, Name};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn setup() -> (
    Arc<dyn Store>,
    Arc<FaultStore>,
    Arc<CountingStore>,
    MockClock,
) {
    let bucket: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let clock = MockClock::new();
    let faults = Arc::new(FaultStore::new(bucket.clone()).with_clock(Arc::new(clock.clone())));
    let counting = Arc::new(CountingStore::new(faults.clone()));
    (bucket, faults, counting, clock)
}

fn client(store: Arc<dyn Store>, node: &str, clock: &MockClock, seed: u64) -> LeaseClient {
    LeaseClient::builder(store, Name::new(node).unwrap())
        .host("h")
        .clock(Arc::new(clock.clone()))
        .entropy(Arc::new(SeededEntropy::new(seed)))
        .build()
        .unwrap()
}

fn opts() -> AcquireOptions {
    AcquireOptions::ttl(Duration::from_secs(1))
}

fn name() -> Name {
    Name::new("job").unwrap()
}

async fn snapshot(bucket: &Arc<dyn Store>) -> Option<Object> {
    bucket.get("leases/job").await.unwrap()
}

/// Declares `leases/job` straight in the bucket (no faults, not counted), so
/// that the first acquire takes it at once.
async fn declare(bucket: &Arc<dyn Store>) {
    let admin = LeaseClient::builder(bucket.clone(), Name::new("admin").unwrap())
        .build()
        .unwrap();
    assert!(admin.create(&name()).await.unwrap());
}

// The create path (one create-if-absent, read back when ambiguous) is the
// node lease's: a standalone lease is never created by acquire.
async fn node_snapshot(bucket: &Arc<dyn Store>) -> Option<Object> {
    bucket.get("nodes/job").await.unwrap()
}

#[tokio::test]
async fn create_that_lands_but_reports_failure_is_acquired_by_read_back() {
    let (bucket, faults, counting, clock) = setup();
    let c = client(counting.clone(), "n1", &clock, 1);
    faults.push(Fault::LandThenFail);
    let Acquire::Acquired(l) = c.acquire_kind(Kind::Node, &name(), &opts()).await.unwrap() else {
        panic!("our own landed create must be recognised by its nonce")
    };
    assert_eq!(l.epoch(), 1);
    assert_eq!(l.version(), &node_snapshot(&bucket).await.unwrap().version);
    let used = counting.counts();
    assert_eq!(
        (used.put_create, used.get),
        (1, 1),
        "one create, one read-back"
    );
}

#[tokio::test]
async fn create_that_never_landed_is_unavailable_and_changes_nothing() {
    let (bucket, faults, _, clock) = setup();
    let c = client(faults.clone(), "n1", &clock, 2);
    faults.push(Fault::FailBefore);
    let e = c
        .acquire_kind(Kind::Node, &name(), &opts())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(node_snapshot(&bucket).await.is_none());
    // Trying again works.
    assert!(matches!(
        c.acquire_kind(Kind::Node, &name(), &opts()).await.unwrap(),
        Acquire::Acquired(_)
    ));
}

#[tokio::test]
async fn read_back_failure_leaves_outcome_unknown_not_guessed() {
    let (bucket, faults, _, clock) = setup();
    let c = client(faults.clone(), "n1", &clock, 3);
    faults.push(Fault::LandThenFail); // the create lands...
    faults.push(Fault::FailBefore); // ...and the read-back fails
    let e = c
        .acquire_kind(Kind::Node, &name(), &opts())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    // It did land: the record names us, and a later acquire by this same
    // instance recognises it as its own (a new tenure: epoch 2).
    let rec = c.read(Kind::Node, &name()).await.unwrap().unwrap().0;
    assert_eq!(&rec.holder, c.holder());
    let Acquire::Acquired(l) = c.acquire_kind(Kind::Node, &name(), &opts()).await.unwrap() else {
        panic!()
    };
    assert_eq!(l.epoch(), 2);
    let _ = bucket;
}

/// Performs every put twice, as an HTTP client's internal retry does after a
/// lost response: the first lands, the caller sees the second's answer.
#[derive(Debug)]
struct RetriedPut(Arc<dyn Store>);
impl fmt::Display for RetriedPut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "retried-put")
    }
}
#[async_trait]
impl leasehold::store::Forward for RetriedPut {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }

    async fn put(&self, k: &str, b: Bytes, c: Cond) -> Result<Version, StoreError> {
        let _ = self.0.put(k, b.clone(), c.clone()).await;
        self.0.put(k, b, c).await
    }
}

#[tokio::test]
async fn already_exists_from_our_own_retried_create_is_acquired() {
    let bucket: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let clock = MockClock::new();
    let c = client(Arc::new(RetriedPut(bucket.clone())), "n1", &clock, 4);
    let Acquire::Acquired(mut l) = c.acquire_kind(Kind::Node, &name(), &opts()).await.unwrap()
    else {
        panic!("AlreadyExists from our own retry must be read back, not reported Held")
    };
    assert_eq!(l.epoch(), 1);
    // Likewise a renew whose retry answers Precondition.
    l.renew_once().await.unwrap();
    assert!(l.is_valid());
    assert_eq!(l.version(), &node_snapshot(&bucket).await.unwrap().version);
}

#[tokio::test]
async fn renew_that_lands_but_reports_failure_is_renewed() {
    let (bucket, faults, _, clock) = setup();
    declare(&bucket).await;
    let c = client(faults.clone(), "n1", &clock, 5);
    let Acquire::Acquired(mut l) = c.acquire(&name(), &opts()).await.unwrap() else {
        panic!()
    };
    clock.advance(Duration::from_millis(500));
    faults.push(Fault::LandThenFail);
    l.renew_once().await.unwrap();
    assert_eq!(l.version(), &snapshot(&bucket).await.unwrap().version);
    assert_eq!(
        l.remaining(),
        Duration::from_millis(900),
        "validity from the send time"
    );
}

#[tokio::test]
async fn renew_unknown_then_late_landing_is_recognised() {
    let (bucket, faults, _, clock) = setup();
    declare(&bucket).await;
    let c = client(faults.clone(), "n1", &clock, 6);
    let Acquire::Acquired(mut l) = c.acquire(&name(), &opts()).await.unwrap() else {
        panic!()
    };
    clock.advance(Duration::from_millis(200));
    faults.push(Fault::LandThenFail); // renew lands...
    faults.push(Fault::FailBefore); // ...read-back fails: unknown
    let e = l.renew_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(l.is_valid(), "still within the old validity");
    // The next attempt's If-Match (old version) is rejected; the read-back
    // finds the earlier attempt's nonce: ours, renewed from that send time.
    clock.advance(Duration::from_millis(100));
    l.renew_once().await.unwrap();
    assert_eq!(l.version(), &snapshot(&bucket).await.unwrap().version);
    assert_eq!(
        l.remaining(),
        Duration::from_millis(800),
        "from the first attempt's send"
    );
}

#[tokio::test]
async fn renew_retries_with_backoff_then_succeeds() {
    let (bucket, faults, counting, clock) = setup();
    declare(&bucket).await;
    let c = client(counting.clone(), "n1", &clock, 7);
    let Acquire::Acquired(mut l) = c.acquire(&name(), &opts()).await.unwrap() else {
        panic!()
    };
    let before = counting.counts();
    for _ in 0..3 {
        faults.push(Fault::FailBefore); // the write
        faults.push(Fault::None); // its read-back shows it did not land
    }
    let t0 = leasehold::clock::Clock::now(&clock).since_origin();
    l.renew().await.unwrap();
    let used = counting.counts().since(&before);
    assert_eq!(used.put_match, 4, "three failures then success");
    assert!(
        leasehold::clock::Clock::now(&clock).since_origin() > t0,
        "backed off on the injected clock"
    );
    assert!(l.is_valid());
}

#[tokio::test]
async fn partition_until_deadline_loses_the_lease_and_changes_nothing() {
    let (bucket, faults, _, clock) = setup();
    declare(&bucket).await;
    let c = client(faults.clone(), "n1", &clock, 8);
    let Acquire::Acquired(mut l) = c.acquire(&name(), &opts()).await.unwrap() else {
        panic!()
    };
    let before = snapshot(&bucket).await;
    faults.set_partitioned(true);
    let e = l.renew().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert!(e.to_string().contains("unreachable"), "{e}");
    assert!(!l.is_valid());
    assert!(
        leasehold::clock::Clock::now(&clock).since_origin() >= Duration::from_millis(900),
        "gave up at the deadline, not before"
    );
    faults.set_partitioned(false);
    assert_eq!(snapshot(&bucket).await, before);
    // Once lost, always lost: no write is attempted.
    assert_eq!(l.renew_once().await.unwrap_err().kind(), ErrorKind::Fenced);
    assert_eq!(snapshot(&bucket).await, before);
}

#[tokio::test]
async fn release_that_lands_but_reports_failure_is_released() {
    let (bucket, faults, _, clock) = setup();
    declare(&bucket).await;
    let c = client(faults.clone(), "n1", &clock, 9);
    let Acquire::Acquired(l) = c.acquire(&name(), &opts()).await.unwrap() else {
        panic!()
    };
    faults.push(Fault::LandThenFail);
    l.release().await.unwrap();
    let rec = leasehold::record::LeaseRecord::decode(
        "leases/job",
        &snapshot(&bucket).await.unwrap().bytes,
        leasehold::record::Kind::Lease,
    )
    .unwrap();
    assert!(rec.released);
    assert_eq!(rec.epoch, 1);
}

/// Lets a competitor write just before our first If-Match write.
#[derive(Debug)]
struct Interloper {
    inner: Arc<dyn Store>,
    competitor: Mutex<Option<Bytes>>,
}
impl fmt::Display for Interloper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "interloper")
    }
}
#[async_trait]
impl leasehold::store::Forward for Interloper {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn put(&self, k: &str, b: Bytes, c: Cond) -> Result<Version, StoreError> {
        if let Cond::Match(v) = &c {
            let comp = self.competitor.lock().unwrap().take();
            if let Some(bytes) = comp {
                self.inner
                    .put(k, bytes, Cond::Match(v.clone()))
                    .await
                    .unwrap();
            }
        }
        self.inner.put(k, b, c).await
    }
}

#[tokio::test]
async fn losing_the_final_cas_is_conflict_and_the_winner_stays() {
    let bucket: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
    let clock = MockClock::new();
    declare(&bucket).await;
    let a = client(bucket.clone(), "n1", &clock, 10);
    let Acquire::Acquired(l) = a.acquire(&name(), &opts()).await.unwrap() else {
        panic!()
    };
    l.release().await.unwrap();
    // n3 takes the released lease between n2's read and n2's write.
    let rival = client(Arc::new(ObjectStoreBackend::memory()), "n3", &clock, 11);
    let mut rec = a
        .read(leasehold::record::Kind::Lease, &name())
        .await
        .unwrap()
        .unwrap()
        .0;
    rec.holder = rival.holder().clone();
    rec.epoch += 1;
    rec.released = false;
    rec.nonce = "rival".into();
    let rival_bytes = Bytes::from(rec.encode().unwrap());
    let b = client(
        Arc::new(Interloper {
            inner: bucket.clone(),
            competitor: Mutex::new(Some(rival_bytes.clone())),
        }),
        "n2",
        &clock,
        12,
    );
    let e = b.acquire(&name(), &opts()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    assert_eq!(
        snapshot(&bucket).await.unwrap().bytes,
        rival_bytes,
        "the winner's write stands"
    );
}

/// The probe's power against a store that checks conditions without a lock
/// (reads, compares, waits `window`, overwrites), at the default settings,
/// always refused at a race step; and a correct store is never refused.
/// Counts go to stderr for docs/stores.md.
///
/// With a window of 1 ms (a network store's check-to-write gap is at least
/// that; the real lock-free moto of `scripts/test` is refused with 20 ms)
/// the claim is 999 of 1,000. With the narrowest window there is, one
/// `yield_now`, the race is a few microseconds between the runtime's two
/// worker threads, and on a loaded machine whole probes can run every
/// writer of every round one after another: 1 and 2 of 1,000 passed in two
/// loaded runs of the test command (and 0 of 1,000 on a quiet machine). So
/// that case is measured and bounded at 990, not claimed at 999.
async fn lock_free_power(window: Duration) -> (usize, usize, Vec<Vec<leasehold::probe::Step>>) {
    use leasehold::clock::{OsEntropy, SystemClock};
    use leasehold::store::fault::LockFreeConditions;
    let entropy = OsEntropy::new();
    let (mut refused, mut at_race, mut passed) = (0, 0, Vec::new());
    for _ in 0..1000 {
        let racy: Arc<dyn Store> = Arc::new(LockFreeConditions {
            inner: Arc::new(ObjectStoreBackend::memory()),
            window,
            clock: Arc::new(SystemClock::new()),
        });
        match leasehold::probe::probe(&racy, &entropy, &SystemClock::new()).await {
            Ok(r) => passed.push(r.steps),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                refused += 1;
                if e.to_string().contains("race") {
                    at_race += 1;
                }
            }
        }
    }
    eprintln!(
        "lock-free store, window {window:?}: refused {refused} of 1000 probes ({at_race} at a race step)"
    );
    (refused, at_race, passed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_refuses_a_lock_free_store_with_measured_power() {
    use leasehold::clock::{OsEntropy, SystemClock};
    let entropy = OsEntropy::new();
    let mut counts = 0;
    let (refused, at_race, passed) = lock_free_power(Duration::from_millis(1)).await;
    assert!(
        refused >= 999,
        "a lock-free store (1 ms window) passed {} of 1000 probes: {passed:?}",
        passed.len()
    );
    assert_eq!(at_race, refused, "the sequential steps cannot see this bug");
    let (refused, at_race, passed) = lock_free_power(Duration::ZERO).await;
    assert!(
        refused >= 990,
        "a lock-free store (one-yield window) passed {} of 1000 probes: {passed:?}",
        passed.len()
    );
    assert_eq!(at_race, refused, "the sequential steps cannot see this bug");
    // A correct store: never refused, and what one probe costs.
    for _ in 0..1000 {
        let good = Arc::new(CountingStore::new(Arc::new(ObjectStoreBackend::memory())));
        let s: Arc<dyn Store> = good.clone();
        leasehold::probe::probe(&s, &entropy, &SystemClock::new())
            .await
            .unwrap();
        counts = good.counts().total();
    }
    eprintln!("a passing probe costs {counts} requests");
    assert!(counts <= 320, "{counts}");
}

/// A store whose If-Match matches only bare ETags (Ceph RGW 16): the probe
/// learns the dialect instead of refusing the store, and the adapter then
/// speaks it for everything after (a renew, a takeover after release).
#[tokio::test]
async fn the_probe_learns_an_unquoted_etag_dialect_and_leases_work_in_it() {
    use leasehold::store::EtagDialect;
    use leasehold::store::fault::{DialectDouble, DialectQuirk};
    let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::new(
        Arc::new(DialectDouble::new(DialectQuirk::UnquotedOnly)),
        "",
        "rgw-like://",
    ));
    assert_eq!(store.etag_dialect(), Some(EtagDialect::Quoted));
    let r = leasehold::probe::probe(&store, &SeededEntropy::new(3), &MockClock::new())
        .await
        .unwrap();
    assert_eq!(r.etag_dialect, Some(EtagDialect::Unquoted), "{:?}", r.steps);
    assert!(
        r.steps
            .iter()
            .any(|s| s.name == "update" && s.detail.contains("unquoted")),
        "{:?}",
        r.steps
    );
    // The learned dialect is what the adapter now speaks.
    let clock = MockClock::new();
    declare(&store).await;
    let a = client(store.clone(), "n1", &clock, 1);
    let Acquire::Acquired(mut lease) = a.acquire(&name(), &opts()).await.unwrap() else {
        panic!("fresh acquire");
    };
    lease.renew().await.unwrap();
    lease.release().await.unwrap();
    let b = client(store.clone(), "n2", &clock, 2);
    let Acquire::Acquired(l2) = b.acquire(&name(), &opts()).await.unwrap() else {
        panic!("takeover after release");
    };
    assert_eq!(l2.token().epoch, 2);
}

/// The ETag dialect and the identity reach the store below every wrapper
/// (`store::Forward`): the probe, run through the stack a node and the CLI
/// use (hints over counting over tracing over fault injection), learns
/// Ceph RGW's unquoted form and sets it on the adapter itself. A wrapper
/// that kept `Store`'s defaults would answer "no dialect" and refuse it.
#[tokio::test]
async fn the_etag_dialect_and_identity_pass_through_every_wrapper() {
    use leasehold::fleet::feed::HintingStore;
    use leasehold::store::fault::{DialectDouble, DialectQuirk};
    use leasehold::store::{EtagDialect, TracedStore};
    let adapter: Arc<dyn Store> = Arc::new(ObjectStoreBackend::new(
        Arc::new(DialectDouble::new(DialectQuirk::UnquotedOnly)),
        "",
        "rgw-like://",
    ));
    let clock = Arc::new(MockClock::new());
    let stack: Arc<dyn Store> = Arc::new(HintingStore::new(
        Arc::new(CountingStore::new(Arc::new(TracedStore::new(Arc::new(
            FaultStore::new(adapter.clone()),
        ))))),
        clock.clone(),
        Arc::new(SeededEntropy::new(5)),
    ));
    assert_eq!(stack.identity(), adapter.identity());
    assert_eq!(stack.etag_dialect(), Some(EtagDialect::Quoted));
    let r = leasehold::probe::probe(&stack, &SeededEntropy::new(3), clock.as_ref())
        .await
        .unwrap();
    assert_eq!(r.etag_dialect, Some(EtagDialect::Unquoted), "{:?}", r.steps);
    assert_eq!(adapter.etag_dialect(), Some(EtagDialect::Unquoted));
    assert_eq!(stack.etag_dialect(), Some(EtagDialect::Unquoted));
}

/// Learning a dialect never relaxes a check: a store that honours the
/// quoted form but lets a bare stale ETag overwrite is refused, naming the
/// form; and one whose listings carry no versions is refused at its own
/// step (expiry by observation would strand a dead node's sessions there).
#[tokio::test]
async fn the_probe_refuses_a_stale_etag_in_either_form_and_listings_without_versions() {
    use leasehold::store::fault::{DialectDouble, DialectQuirk};
    let mut sides = [false; 2];
    for (quirk, step, says) in [
        (
            DialectQuirk::UnquotedIgnored,
            "rejected stale update",
            "unquoted ETag",
        ),
        (
            DialectQuirk::ListsWithoutEtags,
            "listing versions",
            "listing shows version",
        ),
        (DialectQuirk::NoEtagOnPut, "create", "no ETag or version"),
    ] {
        let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::new(
            Arc::new(DialectDouble::new(quirk)),
            "",
            "quirky://",
        ));
        let (report, outcome) =
            leasehold::probe::probe_report(&store, &SeededEntropy::new(4), &MockClock::new()).await;
        let e = outcome.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{quirk:?}: {e}");
        let msg = e.to_string();
        assert!(msg.contains(step) && msg.contains(says), "{quirk:?}: {msg}");
        // The report keeps every step up to the failed one.
        let last = report.steps.last().unwrap();
        assert_eq!((last.name, last.ok), (step, false), "{:?}", report.steps);
        assert!(report.steps[..report.steps.len() - 1].iter().all(|s| s.ok));
        // A dialect is reported only once the probe learned it (issue #44:
        // doctor printed the handle's default after a probe that failed
        // before it could learn anything).
        let learned = report
            .steps
            .iter()
            .any(|s| s.name == "rejected stale update" && s.ok);
        assert_eq!(
            report.etag_dialect.is_some(),
            learned,
            "{quirk:?}: {:?} after {:?}",
            report.etag_dialect,
            report.steps
        );
        sides[learned as usize] = true;
    }
    // One failed before the dialect was learned and one after: both sides
    // of the rule above were exercised.
    assert_eq!(sides, [true, true]);
}

/// The probe's clean-up deletes only keys it sent a write to (issue #44:
/// refused at its first write, it tried to delete 18 keys it never made,
/// and warned about them).
#[tokio::test]
async fn a_probe_refused_at_its_first_write_deletes_only_that_key() {
    use leasehold::store::counting::CountingStore;
    use leasehold::store::fault::{DialectDouble, DialectQuirk};
    let counting = Arc::new(CountingStore::new(Arc::new(ObjectStoreBackend::new(
        Arc::new(DialectDouble::new(DialectQuirk::NoEtagOnPut)),
        "",
        "quirky://",
    ))));
    let store: Arc<dyn Store> = counting.clone();
    let (report, outcome) =
        leasehold::probe::probe_report(&store, &SeededEntropy::new(4), &MockClock::new()).await;
    assert!(outcome.is_err());
    assert_eq!(report.steps.last().unwrap().name, "create");
    let c = counting.counts();
    assert_eq!((c.put_create + c.put_match, c.delete), (1, 1), "{c:?}");
    // A probe that passes cleans up every key it wrote, and only those.
    let counting = Arc::new(CountingStore::new(Arc::new(
        leasehold::store::MemoryStore::new(),
    )));
    let store: Arc<dyn Store> = counting.clone();
    leasehold::probe::probe(&store, &SeededEntropy::new(5), &MockClock::new())
        .await
        .unwrap();
    let left: Vec<_> = futures::StreamExt::collect::<Vec<_>>(store.list("_probe/")).await;
    assert!(left.is_empty(), "{left:?}");
    let c = counting.counts();
    assert!(c.delete >= 3 && c.delete <= c.put_create, "{c:?}");
}

/// AWS S3 answers concurrent conditional writes with 409
/// ConditionalRequestConflict, which object_store reports as AlreadyExists
/// once its retries are spent. leasehold reads back and decides by its
/// nonce: a 409 after the write landed is a renew, and a 409 that wrote
/// nothing (the version it matched is still there) is "not landed", to
/// retry, never "lost" to a writer that does not exist.
#[tokio::test]
async fn a_409_on_a_conditional_put_is_read_back_not_guessed() {
    use leasehold::store::fault::{DialectDouble, DialectQuirk};
    for landed in [true, false] {
        let quirk = if landed {
            DialectQuirk::Conflict409Landed
        } else {
            DialectQuirk::Conflict409NotLanded
        };
        let store: Arc<dyn Store> = Arc::new(ObjectStoreBackend::new(
            Arc::new(DialectDouble::new(quirk)),
            "",
            "s3-409://",
        ));
        let clock = MockClock::new();
        let a = client(store.clone(), "n1", &clock, 1);
        let Acquire::Acquired(mut lease) =
            a.acquire_kind(Kind::Node, &name(), &opts()).await.unwrap()
        else {
            panic!("fresh acquire");
        };
        let before = store.get("nodes/job").await.unwrap().unwrap();
        let r = lease.renew_once().await;
        let after = store.get("nodes/job").await.unwrap().unwrap();
        if landed {
            r.unwrap_or_else(|e| panic!("a landed write is a renew: {e}"));
            assert_ne!(before.version, after.version);
            assert_eq!(lease.token().version, after.version);
        } else {
            let e = r.unwrap_err();
            assert_eq!(
                e.kind(),
                ErrorKind::Unavailable,
                "not landed, not lost: {e}"
            );
            assert_eq!(before, after, "nothing was written");
            // The next attempt (no 409 now) renews the same tenure.
            lease.renew_once().await.unwrap();
            assert_eq!(lease.token().epoch, 1);
        }
    }
}
