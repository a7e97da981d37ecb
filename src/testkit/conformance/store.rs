//! The store's contract: conditional create, update and get, listings from a cursor, deletes, one winner per race, bad keys refused.

use super::*;

pub(super) async fn store_create_is_exclusive(s: Arc<dyn Store>) {
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

pub(super) async fn store_update_is_conditional(s: Arc<dyn Store>) {
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

pub(super) async fn store_update_of_missing_is_precondition(s: Arc<dyn Store>) {
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

pub(super) async fn store_conditional_get(s: Arc<dyn Store>) {
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

pub(super) async fn store_list(s: Arc<dyn Store>) {
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
pub(super) async fn changes_after(s: Arc<dyn Store>, cursor: &'static str) -> Vec<String> {
    s.list_after("changes/", cursor)
        .map(|r| r.unwrap().key)
        .collect()
        .await
}

/// `list_after` is the listing with everything up to the cursor cut off:
/// the cursor itself is excluded, need not exist, and never lets a key from
/// outside the prefix in (the change feed's cursors are full keys).
pub(super) async fn store_list_after(s: Arc<dyn Store>) {
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
pub(super) async fn store_list_after_nested(s: Arc<dyn Store>) {
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

pub(super) async fn store_delete_and_recreate(s: Arc<dyn Store>) {
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

pub(super) async fn store_races_have_one_winner(s: Arc<dyn Store>) {
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

pub(super) async fn store_refuses_bad_keys(s: Arc<dyn Store>) {
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
