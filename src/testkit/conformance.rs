//! The conformance suite, in the manner of object_store's `integration`
//! module: every backend and every wrapper runs every check. A backend's
//! test creates a fresh, empty store (a new prefix on real servers) for
//! each check and calls [`run_all`].
//!
//! # Contract checked
//!
//! - `put(Cond::Create)` is exclusive; `put(Cond::Match(v))` lands only on
//!   version `v`, and on a missing key it is a precondition failure, never a
//!   create; of many concurrent conditional writers exactly one wins.
//! - `get_if_changed` answers "not modified" for the current version.
//! - Listings show every key under a prefix with the version a read returns.
//! - Delete, then create, works; bad keys are refused before any request.
//! - The probe passes on the store and refuses a wrapper that ignores
//!   conditions.
//! - Leases on it behave: one round trip to acquire fresh or renew, release
//!   then the next epoch, expiry by observation, predecessor takeover only
//!   with the host lock, corrupt records never overwritten, token resume,
//!   invalid input costs no request, a lost lease stays lost.
//!
//! The checks panic on failure (as `assert!` in a test does).

use crate::clock::{MockClock, SeededEntropy};
use crate::hostlock::HostLock;
use crate::lease::{Acquire, AcquireOptions, LeaseClient, LeaseToken};
use crate::record::Kind;
use crate::store::{Cond, Conditional, CountingStore, Store, StoreError};
use crate::{ErrorKind, Name};
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;

pub type MakeStore<'a> =
    &'a (dyn Fn() -> futures::future::BoxFuture<'static, Arc<dyn Store>> + Sync);

/// Runs the whole suite; each check gets a fresh store from `make`.
pub async fn run_all(make: MakeStore<'_>) {
    store_create_is_exclusive(make().await).await;
    store_update_is_conditional(make().await).await;
    store_update_of_missing_is_precondition(make().await).await;
    store_conditional_get(make().await).await;
    store_list(make().await).await;
    store_list_after(make().await).await;
    store_list_after_nested(make().await).await;
    store_delete_and_recreate(make().await).await;
    store_races_have_one_winner(make().await).await;
    store_refuses_bad_keys(make().await).await;
    probe_passes(make().await).await;
    probe_refuses_store_ignoring_conditions(make().await).await;
    lease_declared_acquire_is_two_round_trips(make().await).await;
    lease_missing_record_is_watched_before_a_takeover(make().await).await;
    lease_deleted_under_its_holder_is_never_taken_beside_it(make().await).await;
    lease_held_changes_nothing(make().await).await;
    lease_renew_is_one_round_trip(make().await).await;
    lease_release_then_next_epoch(make().await).await;
    lease_expiry_by_observation(make().await).await;
    lease_predecessor_takeover_needs_host_lock_and_same_host(make().await).await;
    lease_corrupt_objects_are_never_overwritten(make().await).await;
    lease_token_resume(make().await).await;
    lease_invalid_input_makes_no_request(make().await).await;
    lease_lost_after_takeover(make().await).await;
}

fn name(s: &str) -> Name {
    Name::new(s).unwrap()
}

fn client(store: Arc<dyn Store>, node: &str, clock: &MockClock, seed: u64) -> LeaseClient {
    LeaseClient::builder(store, name(node))
        .host("host-a")
        .clock(Arc::new(clock.clone()))
        .entropy(Arc::new(SeededEntropy::new(seed)))
        .build()
        .unwrap()
}

/// Declares a new lease (`LeaseClient::create`): without it a missing
/// record is taken for a deleted one and waited out.
async fn declare(c: &LeaseClient, n: &str) {
    assert!(c.create(&name(n)).await.unwrap(), "{n} was new");
}

fn ttl(ms: u64) -> AcquireOptions {
    AcquireOptions::ttl(Duration::from_millis(ms))
}

async fn bytes_of(store: &Arc<dyn Store>, key: &str) -> Option<Bytes> {
    store.get(key).await.unwrap().map(|o| o.bytes)
}

async fn store_create_is_exclusive(s: Arc<dyn Store>) {
    let v1 = s
        .put("t/a", Bytes::from_static(b"one"), Cond::Create)
        .await
        .unwrap();
    let e = s
        .put("t/a", Bytes::from_static(b"two"), Cond::Create)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::AlreadyExists), "{s}: {e:?}");
    let o = s.get("t/a").await.unwrap().unwrap();
    assert_eq!(o.bytes, Bytes::from_static(b"one"));
    assert_eq!(o.version, v1, "{s}: get returns the version put returned");
}

async fn store_update_is_conditional(s: Arc<dyn Store>) {
    let v1 = s
        .put("t/u", Bytes::from_static(b"one"), Cond::Create)
        .await
        .unwrap();
    let v2 = s
        .put("t/u", Bytes::from_static(b"two"), Cond::Match(v1.clone()))
        .await
        .unwrap();
    assert_ne!(v1, v2, "{s}: new bytes, new version");
    let e = s
        .put("t/u", Bytes::from_static(b"three"), Cond::Match(v1))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Precondition), "{s}: {e:?}");
    assert_eq!(
        bytes_of(&s, "t/u").await.unwrap(),
        Bytes::from_static(b"two")
    );
    // Rewriting with the current version works again.
    let v3 = s
        .put("t/u", Bytes::from_static(b"four"), Cond::Match(v2))
        .await
        .unwrap();
    assert_eq!(s.get("t/u").await.unwrap().unwrap().version, v3);
}

async fn store_update_of_missing_is_precondition(s: Arc<dyn Store>) {
    let v = s
        .put("t/m", Bytes::from_static(b"x"), Cond::Create)
        .await
        .unwrap();
    let e = s
        .put("t/missing", Bytes::from_static(b"y"), Cond::Match(v))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Precondition), "{s}: {e:?}");
    assert!(s.get("t/missing").await.unwrap().is_none());
}

async fn store_conditional_get(s: Arc<dyn Store>) {
    let v1 = s
        .put("t/c", Bytes::from_static(b"one"), Cond::Create)
        .await
        .unwrap();
    assert_eq!(
        s.get_if_changed("t/c", &v1).await.unwrap(),
        Conditional::NotModified,
        "{s}"
    );
    let v2 = s
        .put("t/c", Bytes::from_static(b"two"), Cond::Match(v1.clone()))
        .await
        .unwrap();
    match s.get_if_changed("t/c", &v1).await.unwrap() {
        Conditional::Changed(o) => {
            assert_eq!(o.bytes, Bytes::from_static(b"two"));
            assert_eq!(o.version, v2);
        }
        other => panic!("{s}: {other:?}"),
    }
    s.delete("t/c").await.unwrap();
    assert_eq!(
        s.get_if_changed("t/c", &v2).await.unwrap(),
        Conditional::Missing
    );
}

async fn store_list(s: Arc<dyn Store>) {
    let mut versions = Vec::new();
    for k in [
        "sessions/b",
        "sessions/a",
        "sessions/ab",
        "sessionsx/z",
        "nodes/n1",
    ] {
        versions.push((
            k,
            s.put(k, Bytes::from(k.to_string()), Cond::Create)
                .await
                .unwrap(),
        ));
    }
    let listed: Vec<_> = s.list("sessions/").map(|r| r.unwrap()).collect().await;
    let keys: Vec<&str> = listed.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["sessions/a", "sessions/ab", "sessions/b"], "{s}");
    for e in &listed {
        let (_, v) = versions.iter().find(|(k, _)| *k == e.key).unwrap();
        assert_eq!(
            e.version.etag, v.etag,
            "{s}: listing carries the current ETag"
        );
        assert_eq!(e.size, e.key.len() as u64);
    }
    let partial: Vec<_> = s.list("sessions/a").map(|r| r.unwrap().key).collect().await;
    assert_eq!(partial, ["sessions/a", "sessions/ab"], "{s}");
    let all: Vec<_> = s.list("").map(|r| r.unwrap().key).collect().await;
    assert_eq!(all.len(), 5, "{s}: {all:?}");
    let none: Vec<_> = s.list("leases/").map(|r| r.unwrap().key).collect().await;
    assert!(none.is_empty());
}

/// The keys `s` lists under `changes/` after `cursor`.
async fn changes_after(s: Arc<dyn Store>, cursor: &'static str) -> Vec<String> {
    s.list_after("changes/", cursor)
        .map(|r| r.unwrap().key)
        .collect()
        .await
}

/// `list_after` is the listing with everything up to the cursor cut off:
/// the cursor itself is excluded, need not exist, and never lets a key from
/// outside the prefix in (the change feed's cursors are full keys).
async fn store_list_after(s: Arc<dyn Store>) {
    for k in [
        "changes/0002-b",
        "changes/0001-a",
        "changes/0003-c",
        "changes/00031-d",
        "changesx/0009",
        "manifests/m",
    ] {
        s.put(k, Bytes::from_static(b"h"), Cond::Create)
            .await
            .unwrap();
    }
    let after = |cursor: &'static str| changes_after(s.clone(), cursor);
    assert_eq!(
        after("changes/0001-a").await,
        ["changes/0002-b", "changes/0003-c", "changes/00031-d"],
        "{s}: the cursor itself is excluded"
    );
    assert_eq!(
        after("changes/0002").await,
        ["changes/0002-b", "changes/0003-c", "changes/00031-d"],
        "{s}: a cursor that is no key"
    );
    assert_eq!(
        after("changes/0003-c").await,
        ["changes/00031-d"],
        "{s}: lexicographic, not numeric"
    );
    assert_eq!(
        after("changes/").await.len(),
        4,
        "{s}: the prefix as cursor is the whole listing"
    );
    assert!(
        after("changes/9").await.is_empty(),
        "{s}: nothing after the last key, and nothing from beyond the prefix"
    );
    assert_eq!(
        after("a").await.len(),
        4,
        "{s}: a cursor before the prefix lists all of it"
    );
}

/// `list_after` over keys nested under their time bucket (the change
/// feed's bucketed hints beside flat ones, `keys::HintForm`): a key order
/// across levels, where a store that walks directories (the local store)
/// skips those wholly before the cursor. And a level emptied by deletes
/// (which the local store removes) takes writes again at once.
async fn store_list_after_nested(s: Arc<dyn Store>) {
    let keys = [
        "changes/000/0001-a",
        "changes/000/0009-b",
        "changes/0001-flat",
        "changes/001/0010-c",
        "changes/001/0012-d",
        "changes/0011-flat",
        "changes/002/0020-e",
    ];
    for k in keys {
        s.put(k, Bytes::from_static(b"h"), Cond::Create)
            .await
            .unwrap();
    }
    let after = |cursor: &'static str| changes_after(s.clone(), cursor);
    assert_eq!(
        after("changes/").await,
        keys,
        "{s}: key order across levels"
    );
    assert_eq!(
        after("changes/001/0010").await,
        [
            "changes/001/0010-c",
            "changes/001/0012-d",
            "changes/0011-flat",
            "changes/002/0020-e"
        ],
        "{s}: from inside a level"
    );
    assert_eq!(
        after("changes/000/0009-b").await,
        [
            "changes/0001-flat",
            "changes/001/0010-c",
            "changes/001/0012-d",
            "changes/0011-flat",
            "changes/002/0020-e"
        ],
        "{s}: the cursor at a level's last key"
    );
    assert_eq!(
        after("changes/0010").await,
        ["changes/0011-flat", "changes/002/0020-e"],
        "{s}: a level that sorts before the cursor is skipped whole"
    );
    for k in ["changes/001/0010-c", "changes/001/0012-d"] {
        s.delete(k).await.unwrap();
    }
    assert_eq!(
        after("changes/000/0009-b").await,
        [
            "changes/0001-flat",
            "changes/0011-flat",
            "changes/002/0020-e"
        ],
        "{s}: an emptied level lists nothing"
    );
    s.put("changes/001/0013-f", Bytes::from_static(b"h"), Cond::Create)
        .await
        .unwrap();
    assert_eq!(
        after("changes/0011-flat").await,
        ["changes/002/0020-e"],
        "{s}"
    );
    assert_eq!(
        after("changes/001/").await,
        [
            "changes/001/0013-f",
            "changes/0011-flat",
            "changes/002/0020-e"
        ],
        "{s}: written again under the emptied level"
    );
}

async fn store_delete_and_recreate(s: Arc<dyn Store>) {
    s.put("t/d", Bytes::from_static(b"one"), Cond::Create)
        .await
        .unwrap();
    s.delete("t/d").await.unwrap();
    assert!(s.get("t/d").await.unwrap().is_none());
    s.delete("t/d").await.unwrap(); // deleting nothing is fine
    s.put("t/d", Bytes::from_static(b"two"), Cond::Create)
        .await
        .unwrap();
}

async fn store_races_have_one_winner(s: Arc<dyn Store>) {
    for round in 0..3 {
        let key = format!("t/race{round}");
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = s.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                s.put(&key, Bytes::from(format!("c{i}")), Cond::Create)
                    .await
            }));
        }
        let mut won = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(_) => won += 1,
                Err(StoreError::AlreadyExists) => {}
                Err(e) => panic!("{s}: {e:?}"),
            }
        }
        assert_eq!(won, 1, "{s}: creates");
        let v = s.get(&key).await.unwrap().unwrap().version;
        let mut tasks = Vec::new();
        for i in 0..8 {
            let s = s.clone();
            let key = key.clone();
            let v = v.clone();
            tasks.push(tokio::spawn(async move {
                let b = Bytes::from(format!("u{i}"));
                (b.clone(), s.put(&key, b, Cond::Match(v)).await)
            }));
        }
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (b, Ok(_)) => winners.push(b),
                (_, Err(StoreError::Precondition)) => {}
                (_, Err(e)) => panic!("{s}: {e:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "{s}: updates");
        assert_eq!(bytes_of(&s, &key).await.unwrap(), winners[0]);
    }
}

async fn store_refuses_bad_keys(s: Arc<dyn Store>) {
    for k in ["", "a//b", "../x", "a/./b", "a/..", "/a", "a/"] {
        let e = s
            .put(k, Bytes::from_static(b"x"), Cond::Create)
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Invalid { .. }), "{s}: {k:?}: {e:?}");
        assert!(
            matches!(s.get(k).await, Err(StoreError::Invalid { .. })),
            "{k:?}"
        );
    }
    let all: Vec<_> = s.list("").collect().await;
    assert!(all.is_empty(), "{s}: nothing was written");
}

async fn probe_passes(s: Arc<dyn Store>) {
    let r = crate::probe::probe(
        &s,
        &SeededEntropy::new(1),
        &crate::clock::SystemClock::new(),
    )
    .await
    .unwrap();
    assert!(
        r.steps
            .iter()
            .filter(|s| s.name != "conditional get")
            .all(|s| s.ok),
        "{r:?}"
    );
    assert_eq!(r.steps.len(), 8);
    let left: Vec<_> = s.list("").collect().await;
    assert!(
        left.is_empty(),
        "{s}: probe cleans up after itself: {left:?}"
    );
}

async fn probe_refuses_store_ignoring_conditions(s: Arc<dyn Store>) {
    use crate::store::fault::IgnoreConditions;
    for (ic, im, step) in [
        (true, false, "rejected create"),
        (false, true, "rejected stale update"),
    ] {
        let broken: Arc<dyn Store> = Arc::new(IgnoreConditions {
            inner: s.clone(),
            ignore_create: ic,
            ignore_match: im,
        });
        let e = crate::probe::probe(
            &broken,
            &SeededEntropy::new(2),
            &crate::clock::SystemClock::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        let msg = e.to_string();
        assert!(msg.contains(step) && msg.contains(&s.to_string()), "{msg}");
    }
    let left: Vec<_> = s.list("").collect().await;
    assert!(left.is_empty(), "{s}: {left:?}");
}

async fn lease_declared_acquire_is_two_round_trips(s: Arc<dyn Store>) {
    let counting = Arc::new(CountingStore::new(s));
    let clock = MockClock::new();
    let c = client(counting.clone(), "n1", &clock, 10);
    let before = counting.counts();
    declare(&c, "fresh").await;
    assert!(!c.create(&name("fresh")).await.unwrap(), "declared once");
    let used = counting.counts().since(&before);
    assert_eq!((used.total(), used.put_create), (2, 2), "{used:?}");
    let before = counting.counts();
    let Acquire::Acquired(lease) = c.acquire(&name("fresh"), &ttl(1000)).await.unwrap() else {
        panic!("a declared key is acquired at once")
    };
    let used = counting.counts().since(&before);
    assert_eq!((used.total(), used.put_match), (2, 1), "{used:?}");
    assert_eq!(lease.epoch(), 1);
    assert!(lease.is_valid());
    // Validity: ttl - margin from the send time.
    assert_eq!(lease.remaining(), Duration::from_millis(900));
}

async fn lease_missing_record_is_watched_before_a_takeover(s: Arc<dyn Store>) {
    let counting = Arc::new(CountingStore::new(s.clone()));
    let clock = MockClock::new();
    let c = client(counting.clone(), "n1", &clock, 12);
    // No record: never declared, or deleted. A marker is written in its
    // place (one create after the read) and nothing is held.
    let before = counting.counts();
    match c.acquire(&name("undeclared"), &ttl(1000)).await.unwrap() {
        Acquire::Absent {
            epoch,
            expires_after,
            ..
        } => {
            assert_eq!(epoch, 0);
            assert_eq!(expires_after, Duration::from_millis(1100));
        }
        other => panic!("{other:?}"),
    }
    let used = counting.counts().since(&before);
    assert_eq!((used.get, used.put_create), (1, 1), "{used:?}");
    let (rec, _, _) = c
        .read(Kind::Lease, &name("undeclared"))
        .await
        .unwrap()
        .unwrap();
    assert!(rec.is_vanished() && rec.released, "{rec:?}");
    // Declaring now changes nothing: the marker stands.
    assert!(!c.create(&name("undeclared")).await.unwrap());
    clock.advance(Duration::from_millis(1099));
    assert!(matches!(
        c.acquire(&name("undeclared"), &ttl(1000)).await.unwrap(),
        Acquire::Absent { .. }
    ));
    // Another client that first sees the marker now starts its own watch.
    let other = client(s.clone(), "n2", &clock, 13);
    assert!(matches!(
        other
            .acquire(&name("undeclared"), &ttl(1000))
            .await
            .unwrap(),
        Acquire::Absent { .. }
    ));
    clock.advance(Duration::from_millis(1));
    let Acquire::Acquired(l) = c.acquire(&name("undeclared"), &ttl(1000)).await.unwrap() else {
        panic!("the marker was watched for ttl + margin")
    };
    assert_eq!(l.epoch(), 1);
    l.release().await.unwrap();
}

async fn lease_deleted_under_its_holder_is_never_taken_beside_it(s: Arc<dyn Store>) {
    let clock_a = MockClock::new();
    let clock_b = MockClock::new();
    let a = client(s.clone(), "n1", &clock_a, 14);
    let b = client(s.clone(), "n2", &clock_b, 15);
    declare(&a, "del").await;
    let Acquire::Acquired(first) = a.acquire(&name("del"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    first.release().await.unwrap();
    let Acquire::Acquired(mut la) = a.acquire(&name("del"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    assert_eq!(la.epoch(), 2);
    // Deleted behind the holder's back. B has never seen the lease, so its
    // marker knows no epoch; A still believes (its validity has 900 ms left).
    s.delete("leases/del").await.unwrap();
    match b.acquire(&name("del"), &ttl(1000)).await.unwrap() {
        Acquire::Absent { epoch: 0, .. } => {}
        other => panic!("a missing record is no licence: {other:?}"),
    }
    assert!(la.is_valid());
    // A's next renewal fails on the marker; A stops, and raises the marker
    // to its epoch, which restarts B's watch.
    clock_a.advance(Duration::from_millis(300));
    let e = la.renew_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert!(!la.is_valid());
    let (rec, _, _) = b.read(Kind::Lease, &name("del")).await.unwrap().unwrap();
    assert!(rec.is_vanished() && rec.epoch == 2, "{rec:?}");
    clock_b.advance(Duration::from_millis(1100));
    match b.acquire(&name("del"), &ttl(1000)).await.unwrap() {
        Acquire::Absent {
            epoch: 2,
            observed_for,
            ..
        } => assert_eq!(observed_for, Duration::ZERO),
        other => panic!("the raised marker is a new version to watch: {other:?}"),
    }
    clock_b.advance(Duration::from_millis(1100));
    let Acquire::Acquired(lb) = b.acquire(&name("del"), &ttl(1000)).await.unwrap() else {
        panic!("watched for ttl + margin")
    };
    assert_eq!(lb.epoch(), 3, "no fencing token handed out twice");
    // A client that saw the record before its deletion carries its epoch
    // (and ttl) into the marker, even with the holder gone.
    a.read(Kind::Lease, &name("del")).await.unwrap().unwrap();
    s.delete("leases/del").await.unwrap();
    match a.acquire(&name("del"), &ttl(10)).await.unwrap() {
        Acquire::Absent {
            epoch: 3,
            expires_after,
            ..
        } => assert_eq!(
            expires_after,
            Duration::from_millis(1100),
            "the longest ttl known"
        ),
        other => panic!("{other:?}"),
    }
    drop(lb);
}

async fn lease_held_changes_nothing(s: Arc<dyn Store>) {
    let clock = MockClock::new();
    let a = client(s.clone(), "n1", &clock, 20);
    let b = client(s.clone(), "n2", &clock, 21);
    declare(&a, "x").await;
    let Acquire::Acquired(_l) = a.acquire(&name("x"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    let before = s.get("leases/x").await.unwrap().unwrap();
    match b.acquire(&name("x"), &ttl(1000)).await.unwrap() {
        Acquire::Held {
            holder,
            epoch,
            expires_after,
            ..
        } => {
            assert_eq!(holder.node, "n1");
            assert_eq!(epoch, 1);
            assert_eq!(expires_after, Duration::from_millis(1100));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.get("leases/x").await.unwrap().unwrap(),
        before,
        "Held changes nothing"
    );
}

async fn lease_renew_is_one_round_trip(s: Arc<dyn Store>) {
    let counting = Arc::new(CountingStore::new(s));
    let clock = MockClock::new();
    let c = client(counting.clone(), "n1", &clock, 30);
    declare(&c, "r").await;
    let Acquire::Acquired(mut l) = c.acquire(&name("r"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    let v0 = l.version().clone();
    clock.advance(Duration::from_millis(300));
    let before = counting.counts();
    l.renew().await.unwrap();
    let used = counting.counts().since(&before);
    assert_eq!((used.total(), used.put_match), (1, 1), "{used:?}");
    assert_ne!(l.version(), &v0, "every write changes the version");
    assert_eq!(l.epoch(), 1);
    assert_eq!(l.remaining(), Duration::from_millis(900));
}

async fn lease_release_then_next_epoch(s: Arc<dyn Store>) {
    let clock = MockClock::new();
    let a = client(s.clone(), "n1", &clock, 40);
    let b = client(s.clone(), "n2", &clock, 41);
    declare(&a, "rel").await;
    let Acquire::Acquired(l) = a.acquire(&name("rel"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    l.release().await.unwrap();
    let (rec, _, _) = a.read(Kind::Lease, &name("rel")).await.unwrap().unwrap();
    assert!(rec.released);
    assert_eq!(rec.epoch, 1, "release keeps the epoch");
    let Acquire::Acquired(l2) = b.acquire(&name("rel"), &ttl(1000)).await.unwrap() else {
        panic!("a released lease is taken over at once")
    };
    assert_eq!(l2.epoch(), 2);
    l2.release().await.unwrap();
    let Acquire::Acquired(l3) = a.acquire(&name("rel"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    assert_eq!(l3.epoch(), 3, "epochs never restart");
}

async fn lease_expiry_by_observation(s: Arc<dyn Store>) {
    let clock_a = MockClock::new();
    let clock_b = MockClock::new().with_wall_offset_ms(3_000_000); // wall clocks are irrelevant
    let a = client(s.clone(), "n1", &clock_a, 50);
    let b = client(s.clone(), "n2", &clock_b, 51);
    declare(&a, "exp").await;
    let Acquire::Acquired(mut la) = a.acquire(&name("exp"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    // B has never seen it: Held, whatever the time.
    clock_b.advance(Duration::from_secs(100));
    assert!(matches!(
        b.acquire(&name("exp"), &ttl(1000)).await.unwrap(),
        Acquire::Held { .. }
    ));
    clock_b.advance(Duration::from_millis(1099));
    assert!(matches!(
        b.acquire(&name("exp"), &ttl(1000)).await.unwrap(),
        Acquire::Held { .. }
    ));
    // A renews: a new version restarts B's observation.
    la.renew_once().await.unwrap();
    clock_b.advance(Duration::from_millis(1000));
    assert!(matches!(
        b.acquire(&name("exp"), &ttl(1000)).await.unwrap(),
        Acquire::Held { .. }
    ));
    clock_b.advance(Duration::from_millis(1100));
    let Acquire::Acquired(lb) = b.acquire(&name("exp"), &ttl(1000)).await.unwrap() else {
        panic!("unchanged for ttl + margin: expired")
    };
    assert_eq!(lb.epoch(), 2);
    // A's own clock says its validity ended long ago (it never advanced past
    // 900 ms here only because A's clock is separate); its renew is fenced.
    clock_a.advance(Duration::from_millis(500));
    let e = la.renew_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    assert!(!la.is_valid());
}

async fn lease_predecessor_takeover_needs_host_lock_and_same_host(s: Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let clock = MockClock::new();
    let with_lock = |seed: u64| {
        LeaseClient::builder(s.clone(), name("n1"))
            .host_lock(HostLock::acquire(dir.path(), &s.to_string(), "n1", "host-a").unwrap())
            .clock(Arc::new(clock.clone()))
            .entropy(Arc::new(SeededEntropy::new(seed)))
            .build()
            .unwrap()
    };
    // A holder without the host lock (a one-shot CLI process, say): a node
    // instance with the lock cannot prove it dead, and must wait.
    let unlocked = client(s.clone(), "n1", &clock, 59);
    declare(&unlocked, "unlocked").await;
    declare(&unlocked, "pred").await;
    let Acquire::Acquired(_u) = unlocked
        .acquire(&name("unlocked"), &ttl(60_000))
        .await
        .unwrap()
    else {
        panic!()
    };
    let locked = with_lock(58);
    assert!(matches!(
        locked
            .acquire(&name("unlocked"), &ttl(60_000))
            .await
            .unwrap(),
        Acquire::Held { .. }
    ));
    drop(locked);
    let old = with_lock(60);
    let Acquire::Acquired(old_lease) = old.acquire(&name("pred"), &ttl(60_000)).await.unwrap()
    else {
        panic!()
    };
    // The old instance dies: its client, its lease handle and its host lock.
    drop((old, old_lease));
    // Same node, same host, without the host lock: must wait.
    let no_lock = client(s.clone(), "n1", &clock, 61);
    assert!(matches!(
        no_lock.acquire(&name("pred"), &ttl(60_000)).await.unwrap(),
        Acquire::Held { .. }
    ));
    // Same node id on another host, even with its own host lock: must wait.
    let other_host = LeaseClient::builder(s.clone(), name("n1"))
        .host_lock(HostLock::acquire(dir.path(), &s.to_string(), "n1", "host-b").unwrap())
        .clock(Arc::new(clock.clone()))
        .entropy(Arc::new(SeededEntropy::new(62)))
        .build()
        .unwrap();
    assert!(matches!(
        other_host
            .acquire(&name("pred"), &ttl(60_000))
            .await
            .unwrap(),
        Acquire::Held { .. }
    ));
    drop(other_host);
    // Same node, same host, holding the host lock: immediate takeover.
    let new = with_lock(63);
    let Acquire::Acquired(l) = new.acquire(&name("pred"), &ttl(60_000)).await.unwrap() else {
        panic!("host lock proves the predecessor dead")
    };
    assert_eq!(l.epoch(), 2);
}

async fn lease_corrupt_objects_are_never_overwritten(s: Arc<dyn Store>) {
    let clock = MockClock::new();
    let c = client(s.clone(), "n1", &clock, 70);
    let cases: [(&str, &[u8]); 4] = [
        ("garbage", b"\x00\x01 not json"),
        (
            "truncated",
            br#"{"schema":"leasehold/v1","kind":"lease","holder":{"no"#,
        ),
        ("future", br#"{"schema":"leasehold/v9","kind":"lease"}"#),
        ("foreign", br#"{"hello":"world"}"#),
    ];
    for (n, bytes) in cases {
        let key = format!("leases/{n}");
        s.put(&key, Bytes::from_static(bytes), Cond::Create)
            .await
            .unwrap();
        let before = s.get(&key).await.unwrap().unwrap();
        for _ in 0..2 {
            clock.advance(Duration::from_secs(3600));
            let e = c.acquire(&name(n), &ttl(1000)).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Data, "{n}: {e}");
            assert!(e.to_string().contains(&key), "{e}");
        }
        assert_eq!(
            s.get(&key).await.unwrap().unwrap(),
            before,
            "{n}: untouched"
        );
    }
}

async fn lease_token_resume(s: Arc<dyn Store>) {
    let clock = MockClock::new();
    let a = client(s.clone(), "n1", &clock, 80);
    declare(&a, "tok").await;
    let Acquire::Acquired(l) = a.acquire(&name("tok"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    let token = LeaseToken::decode(&l.token().encode()).unwrap();
    assert_eq!(token, l.token());
    // A different process: any identity; resume adopts the record's holder.
    let resumed_client = LeaseClient::builder(s.clone(), name("other"))
        .clock(Arc::new(clock.clone()))
        .entropy(Arc::new(SeededEntropy::new(81)))
        .build()
        .unwrap();
    let mut r = resumed_client
        .resume(Kind::Lease, &name("tok"), &token)
        .await
        .unwrap();
    assert!(!r.is_valid(), "validity unknown until renewed");
    r.renew().await.unwrap();
    assert!(r.is_valid());
    assert_eq!(r.epoch(), 1);
    // The old token is now stale.
    let e = resumed_client
        .resume(Kind::Lease, &name("tok"), &token)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
    r.release().await.unwrap();
}

async fn lease_invalid_input_makes_no_request(s: Arc<dyn Store>) {
    let counting = Arc::new(CountingStore::new(s.clone()));
    let clock = MockClock::new();
    let c = client(counting.clone(), "n1", &clock, 90);
    for bad in ["", "a/b", "..", "x\n"] {
        let e = Name::new(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Invalid);
    }
    let e = c.acquire(&name("t"), &ttl(1)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
    let mut big = ttl(1000);
    big.attrs.insert("blob".into(), "x".repeat(70_000).into());
    let e = c.acquire(&name("t"), &big).await.unwrap_err();
    assert!(matches!(e, crate::Error::TooLarge { .. }), "{e}");
    assert_eq!(counting.counts().total(), 0, "refused before any request");
    let all: Vec<_> = s.list("").collect().await;
    assert!(all.is_empty());
}

async fn lease_lost_after_takeover(s: Arc<dyn Store>) {
    let clock = MockClock::new();
    let a = client(s.clone(), "n1", &clock, 100);
    let b = client(s.clone(), "n2", &clock, 101);
    declare(&a, "lost").await;
    let Acquire::Acquired(mut la) = a.acquire(&name("lost"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    assert!(matches!(
        b.acquire(&name("lost"), &ttl(1000)).await.unwrap(),
        Acquire::Held { .. }
    ));
    clock.advance(Duration::from_millis(1100));
    assert!(!la.is_valid(), "A stopped believing at ttl - margin");
    let Acquire::Acquired(_lb) = b.acquire(&name("lost"), &ttl(1000)).await.unwrap() else {
        panic!()
    };
    let after_takeover = s.get("leases/lost").await.unwrap().unwrap();
    let e = la.renew_once().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);
    let e = la.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Fenced);
    assert_eq!(
        s.get("leases/lost").await.unwrap().unwrap(),
        after_takeover,
        "stale holder changed nothing"
    );
}
