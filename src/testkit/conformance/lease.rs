//! The probe and the lease protocol over the store: what a backend must let leasehold do, and never do.

use super::*;

pub(super) async fn probe_passes(s: Arc<dyn Store>) {
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

pub(super) async fn probe_refuses_store_ignoring_conditions(s: Arc<dyn Store>) {
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

pub(super) async fn lease_declared_acquire_is_two_round_trips(s: Arc<dyn Store>) {
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

pub(super) async fn lease_missing_record_is_watched_before_a_takeover(s: Arc<dyn Store>) {
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

pub(super) async fn lease_deleted_under_its_holder_is_never_taken_beside_it(s: Arc<dyn Store>) {
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

pub(super) async fn lease_held_changes_nothing(s: Arc<dyn Store>) {
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

pub(super) async fn lease_renew_is_one_round_trip(s: Arc<dyn Store>) {
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

pub(super) async fn lease_release_then_next_epoch(s: Arc<dyn Store>) {
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

pub(super) async fn lease_expiry_by_observation(s: Arc<dyn Store>) {
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

pub(super) async fn lease_predecessor_takeover_needs_host_lock_and_same_host(s: Arc<dyn Store>) {
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

pub(super) async fn lease_corrupt_objects_are_never_overwritten(s: Arc<dyn Store>) {
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

pub(super) async fn lease_token_resume(s: Arc<dyn Store>) {
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

pub(super) async fn lease_invalid_input_makes_no_request(s: Arc<dyn Store>) {
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

pub(super) async fn lease_lost_after_takeover(s: Arc<dyn Store>) {
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
