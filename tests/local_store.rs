//! The local directory store beyond the shared suite: compare-and-swap across
//! OS processes, and refusal of symlinks, replaced roots and foreign files.

use bytes::Bytes;
use futures::StreamExt;
use leasehold::store::{Cond, LocalDirStore, Store, StoreError};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

const CHILD_ENV: &str = "LEASEHOLD_CAS_CHILD_DIR";
const INCREMENTS: u64 = 150;

/// Child half of `two_processes_contend_like_two_nodes`: increments a counter
/// by read + If-Match write, retrying on Precondition. Ignored so that it runs
/// only when the parent starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by two_processes_contend_like_two_nodes"]
async fn cas_child() {
    let dir = std::env::var(CHILD_ENV).expect("parent sets the directory");
    let s = LocalDirStore::open(dir).unwrap();
    let mut done = 0;
    let mut conflicts = 0u64;
    while done < INCREMENTS {
        let o = s.get("counter/value").await.unwrap().unwrap();
        let n: u64 = std::str::from_utf8(&o.bytes).unwrap().parse().unwrap();
        match s
            .put(
                "counter/value",
                Bytes::from((n + 1).to_string()),
                Cond::Match(o.version),
            )
            .await
        {
            Ok(_) => done += 1,
            Err(StoreError::Precondition) => conflicts += 1,
            Err(e) => panic!("{e}"),
        }
    }
    println!("CHILD-CONFLICTS {conflicts}");
}

#[tokio::test]
async fn two_processes_contend_like_two_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    s.put("counter/value", Bytes::from_static(b"0"), Cond::Create)
        .await
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "cas_child", "--nocapture"])
                .env(CHILD_ENV, dir.path())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut conflicts = 0u64;
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
        let out = String::from_utf8_lossy(&o.stdout);
        let line = out
            .lines()
            .find(|l| l.starts_with("CHILD-CONFLICTS"))
            .expect("child ran");
        conflicts += line.split(' ').nth(1).unwrap().parse::<u64>().unwrap();
    }
    let v = s.get("counter/value").await.unwrap().unwrap();
    assert_eq!(
        std::str::from_utf8(&v.bytes).unwrap(),
        (3 * INCREMENTS).to_string(),
        "no lost update"
    );
    eprintln!("3 processes x {INCREMENTS} increments, {conflicts} rejected stale writes");
}

const SLOT_CHILD_ENV: &str = "LEASEHOLD_SLOT_CHILD_DIR";
const SLOT_GO_ENV: &str = "LEASEHOLD_SLOT_CHILD_GO";
const SLOT_ROUNDS: u64 = 400;

/// Child half of `create_and_delete_across_processes_admits_one_creator`:
/// creates a key, overwrites it by If-Match on the version its create
/// returned, deletes it; again and again, beside other processes doing the
/// same. Once its create landed, the key is its own until it deletes it
/// (everyone else's create finds it there), so its If-Match can fail only
/// if two writers were let in at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by create_and_delete_across_processes_admits_one_creator"]
async fn slot_child() {
    let dir = std::env::var(SLOT_CHILD_ENV).expect("parent sets the directory");
    let s = LocalDirStore::open(dir).unwrap();
    let me = std::process::id();
    // All start together (the parent makes the file once all are spawned).
    let go = std::env::var(SLOT_GO_ENV).expect("parent sets the start file");
    let mut waited = 0;
    while !std::path::Path::new(&go).exists() {
        waited += 1;
        assert!(waited < 60_000, "no start");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (mut won, mut lost, mut broken) = (0u64, 0u64, 0u64);
    for i in 0..SLOT_ROUNDS {
        match s
            .put(SLOT_KEY, Bytes::from(format!("{me}-{i}")), Cond::Create)
            .await
        {
            Ok(v) => {
                won += 1;
                match s
                    .put(
                        SLOT_KEY,
                        Bytes::from(format!("{me}-{i}-again")),
                        Cond::Match(v),
                    )
                    .await
                {
                    Ok(_) => {}
                    Err(StoreError::Precondition) => broken += 1,
                    Err(e) => panic!("{e}"),
                }
                s.delete(SLOT_KEY).await.unwrap();
            }
            Err(StoreError::AlreadyExists) => lost += 1,
            Err(e) => panic!("{e}"),
        }
    }
    println!("CHILD-SLOT {won} {lost} {broken}");
}

/// The key the slot children contend for: two levels deep, so each delete
/// also removes its directory (`slot/d`, emptied) and each create makes it
/// again, across processes.
const SLOT_KEY: &str = "slot/d/x";

/// A deleted key's lock file goes with it (before: every key ever written
/// left one under `.leasehold/locks/`, so each change hint, written once
/// and expired, left a file for ever), and unlinking it while others wait
/// on it admits one writer at a time still: four processes create, rewrite
/// and delete one key 400 times each, and no create ever lands over
/// another's (a writer checks, once it holds the lock, that the path still
/// names the file it locked). The key's directory goes and comes with it
/// (`remove_empty_dirs`), and no write or delete fails for that.
#[tokio::test]
async fn create_and_delete_across_processes_admits_one_creator() {
    let dir = tmpfs_dir();
    let start = tempfile::tempdir().unwrap();
    let go = start.path().join("go");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&exe)
                .args(["--ignored", "--exact", "slot_child", "--nocapture"])
                .env(SLOT_CHILD_ENV, dir.path())
                .env(SLOT_GO_ENV, &go)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(&go, b"").unwrap();
    let (mut won, mut lost, mut broken) = (0u64, 0u64, 0u64);
    for c in children {
        let o = c.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{out}");
        let line = out
            .lines()
            .find(|l| l.starts_with("CHILD-SLOT"))
            .expect("child ran");
        let n: Vec<u64> = line
            .split(' ')
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        won += n[0];
        lost += n[1];
        broken += n[2];
    }
    eprintln!(
        "4 processes x {SLOT_ROUNDS} rounds: {won} creates landed, {lost} found the key held, {broken} overwritten by another"
    );
    // The processes overlapped: a create alone never finds the key held.
    assert!(lost > 0, "no contention: {won} {lost}");
    assert_eq!(broken, 0, "a create landed over another's");
    let locks = dir.path().join(".leasehold/keylocks");
    let left: Vec<_> = std::fs::read_dir(&locks)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "lock files left: {left:?}");
    assert!(
        !dir.path().join("slot/d").exists(),
        "the emptied directory is gone"
    );
}

/// Every path that ends with no object leaves no lock file: a delete, a
/// delete of what is not there, an If-Match on what is not there; a key
/// that exists keeps its own.
#[tokio::test]
async fn a_key_that_is_gone_leaves_no_lock_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    for i in 0..50 {
        let k = format!("changes/{i:013}-00-s-x");
        s.put(&k, Bytes::new(), Cond::Create).await.unwrap();
        s.delete(&k).await.unwrap();
    }
    s.delete("sessions/never").await.unwrap();
    s.delete("changes/never").await.unwrap(); // its directory exists
    // A write refused before anything is written (a parent segment that
    // is an object): no lock file left for it either.
    s.put("plain", Bytes::new(), Cond::Create).await.unwrap();
    assert!(matches!(
        s.put("plain/under", Bytes::new(), Cond::Create).await,
        Err(StoreError::Corrupt { .. })
    ));
    s.delete("plain").await.unwrap();
    let stale = leasehold::store::Version {
        etag: Some("1.1".into()),
        version: None,
    };
    assert!(matches!(
        s.put("sessions/gone", Bytes::new(), Cond::Match(stale))
            .await,
        Err(StoreError::Precondition)
    ));
    s.put("manifests/kept", Bytes::from_static(b"{}"), Cond::Create)
        .await
        .unwrap();
    let left: Vec<String> = std::fs::read_dir(dir.path().join(".leasehold/keylocks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, vec!["manifests%kept.lock".to_string()]);
}

/// Names written behind the store's back that its `get` refuses (another
/// tool's `a:b`, a space, a directory named so, a key over 1,024 bytes) are
/// not listed: each stopped every CLI command that reads what it lists
/// (exit 2, "invalid request"). What is listed can be read.
#[tokio::test]
async fn a_listing_holds_only_keys_the_store_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    s.put("manifests/good", Bytes::from_static(b"{}"), Cond::Create)
        .await
        .unwrap();
    let m = dir.path().join("manifests");
    for name in ["a:b", "bad name", "UPPER~tilde", "pct%2Fx"] {
        std::fs::write(m.join(name), "x").unwrap();
    }
    std::fs::create_dir(m.join("d:ir")).unwrap();
    std::fs::write(m.join("d:ir").join("inner"), "x").unwrap();
    let mut deep = m.clone();
    for _ in 0..6 {
        deep = deep.join("x".repeat(200));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("leaf"), "x").unwrap();
    let listed: Vec<String> = s.list("manifests/").map(|e| e.unwrap().key).collect().await;
    assert_eq!(listed, vec!["manifests/good".to_string()]);
    for k in &listed {
        s.get(k).await.unwrap().unwrap();
    }
}

/// A listing from a cursor reads the directories at and after it, never
/// one wholly before it: the change feed's bucketed hints
/// (`keys::HintForm::Bucketed`) cost a pass the buckets from its cursor
/// on, not every hint within the retention (issue #14: about 200,000
/// names a pass after placing 100,000 sessions).
#[tokio::test]
async fn a_listing_from_a_cursor_skips_the_directories_before_it() {
    use leasehold::keys::{self, HintForm, Hinted};
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    let t0 = 1_764_700_000_000u64;
    // Thirty old buckets of forty hints each, then one of five.
    for b in 0..30u64 {
        for i in 0..40u64 {
            let k = keys::hint(
                t0 + b * 10_000 + i,
                "00",
                Hinted::Claim,
                "x",
                HintForm::Bucketed,
            );
            s.put(&k, Bytes::new(), Cond::Create).await.unwrap();
        }
    }
    let now = t0 + 30 * 10_000;
    for i in 0..5u64 {
        let k = keys::hint(now + i, "00", Hinted::Claim, "y", HintForm::Bucketed);
        s.put(&k, Bytes::new(), Cond::Create).await.unwrap();
    }
    let before = s.entries_walked();
    let listed: Vec<String> = s
        .list_after(keys::CHANGES, &keys::hint_cursor(now))
        .map(|e| e.unwrap().key)
        .collect()
        .await;
    let walked = s.entries_walked() - before;
    assert_eq!(listed.len(), 5, "{listed:?}");
    // `changes/` (31 buckets, `.` and `..`) and the last bucket (5, `.`
    // and `..`): 40. Walking every bucket reads 1,200 more.
    assert!(walked <= 40, "{walked} entries read for 5 hints");
    let before = s.entries_walked();
    let all = s.list(keys::CHANGES).count().await;
    assert_eq!(all, 1205);
    assert!(
        s.entries_walked() - before > 1200,
        "a full listing reads them all"
    );
}

/// A delete removes the directories it empties below the top level, so a
/// key scheme that spreads keys over directories (the feed's ten-second
/// buckets) leaves none behind, in either lock scheme; a top-level one
/// (which an older build may be writing in, and would not make again) is
/// kept. A write under a removed directory makes it again, and a refused
/// write makes none.
#[tokio::test]
async fn a_delete_removes_the_directories_it_empties() {
    for legacy in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        if legacy {
            std::fs::create_dir_all(dir.path().join(".leasehold/locks")).unwrap();
        }
        let s = LocalDirStore::open(dir.path()).unwrap();
        for k in [
            "changes/001/a",
            "changes/001/b",
            "changes/002/x/c",
            "sessions/s",
        ] {
            s.put(k, Bytes::new(), Cond::Create).await.unwrap();
        }
        s.delete("changes/001/a").await.unwrap();
        assert!(dir.path().join("changes/001").is_dir(), "b is still in it");
        s.delete("changes/001/b").await.unwrap();
        assert!(!dir.path().join("changes/001").exists(), "legacy {legacy}");
        assert!(dir.path().join("changes/002/x").is_dir());
        s.delete("changes/002/x/c").await.unwrap();
        assert!(
            !dir.path().join("changes/002").exists(),
            "emptied to the second level"
        );
        assert!(
            dir.path().join("changes").is_dir(),
            "a top-level directory is kept"
        );
        s.delete("sessions/s").await.unwrap();
        assert!(dir.path().join("sessions").is_dir());
        s.put("changes/001/a", Bytes::from_static(b"again"), Cond::Create)
            .await
            .unwrap();
        assert_eq!(
            &s.get("changes/001/a").await.unwrap().unwrap().bytes[..],
            b"again"
        );
        // An If-Match on a key that is not there makes no directory.
        let stale = leasehold::store::Version {
            etag: Some("1.1".into()),
            version: None,
        };
        assert!(matches!(
            s.put("changes/003/gone", Bytes::new(), Cond::Match(stale))
                .await,
            Err(StoreError::Precondition)
        ));
        assert!(!dir.path().join("changes/003").exists());
    }
}

/// Writers and deleters of different keys in the same directories, at
/// once: a delete that empties a directory removes it, possibly between a
/// writer making (or finding) it and creating its temporary file there;
/// the writer makes it again. Every write and delete succeeds, and every
/// object written and not deleted is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_and_deletes_in_one_directory_race_without_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(LocalDirStore::open(dir.path()).unwrap());
    let mut tasks = Vec::new();
    for w in 0..6 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for i in 0..400 {
                // Two levels, and three (whose middle level a delete
                // removes too, under a writer that just made the last).
                let k = match i % 4 {
                    0 | 1 => format!("changes/{:03}/w{w}-{i}", i % 2),
                    _ => format!("deep/{}/x/w{w}-{i}", i % 2),
                };
                if let Err(e) = s.put(&k, Bytes::new(), Cond::Create).await {
                    failures.push(format!("put {k}: {e}"));
                }
                if let Err(e) = s.delete(&k).await {
                    failures.push(format!("delete {k}: {e}"));
                }
            }
            let kept = format!("changes/{:03}/w{w}-kept", w % 2);
            if let Err(e) = s.put(&kept, Bytes::new(), Cond::Create).await {
                failures.push(format!("put {kept}: {e}"));
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let left: Vec<String> = s.list("changes/").map(|e| e.unwrap().key).collect().await;
    assert_eq!(left.len(), 6, "{left:?}");
}

/// Beside an older build, which locks `.leasehold/locks/<key>.lock` and
/// never unlinks it: a directory it wrote keeps that scheme (lock files
/// kept, so an older writer waiting on one is never left holding an
/// unlinked file beside a new one), and a new directory is marked so that
/// an older build's writes fail rather than run beside ours unexcluded
/// (it creates `locks/` as a directory first, which a file there refuses).
#[tokio::test]
async fn an_older_builds_lock_scheme_is_kept_and_a_new_directory_refuses_it() {
    // A new directory: `locks` is a file, and the older build's first step
    // fails.
    let fresh = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(fresh.path()).unwrap();
    s.put("leases/a", Bytes::new(), Cond::Create).await.unwrap();
    let marker = fresh.path().join(".leasehold/locks");
    assert!(std::fs::symlink_metadata(&marker).unwrap().is_file());
    assert!(
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(&marker)
            .is_err(),
        "an older build could still lock under locks/"
    );
    // A directory an older build wrote: its scheme, its files kept.
    let old = tempfile::tempdir().unwrap();
    let locks = old.path().join(".leasehold/locks");
    std::fs::create_dir_all(&locks).unwrap();
    let s = LocalDirStore::open(old.path()).unwrap();
    s.put("leases/a", Bytes::new(), Cond::Create).await.unwrap();
    s.delete("leases/a").await.unwrap();
    assert!(
        locks.join("leases%a.lock").is_file(),
        "the lock file an older writer may wait on was unlinked"
    );
    assert!(!old.path().join(".leasehold/keylocks").exists());
    // Neither a directory nor a file (a symlink to one, here): refused
    // with a clear error, nothing written.
    let odd = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(odd.path().join(".leasehold")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), odd.path().join(".leasehold/locks")).unwrap();
    let s = LocalDirStore::open(odd.path()).unwrap();
    match s.put("leases/a", Bytes::new(), Cond::Create).await {
        Err(StoreError::Invalid { reason }) => {
            assert!(
                reason.contains("neither a directory nor a file"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(s.get("leases/a").await.unwrap().is_none());
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
}

#[tokio::test]
async fn files_are_owner_only_and_etag_changes_on_identical_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path().join("root")).unwrap();
    let v1 = s
        .put("a/b", Bytes::from_static(b"same"), Cond::Create)
        .await
        .unwrap();
    let v2 = s
        .put("a/b", Bytes::from_static(b"same"), Cond::Match(v1.clone()))
        .await
        .unwrap();
    assert_ne!(v1, v2, "identical bytes still get a new ETag");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    // Stamped (read-only, see `a_listing_takes_a_stamped_version_without_opening_the_file`)
    // where the filesystem keeps nanoseconds, as tmp does here.
    assert!(s.stamps(), "this filesystem keeps nanosecond times");
    assert_eq!(mode(&dir.path().join("root/a/b")), 0o400);
    assert_eq!(mode(&dir.path().join("root/a")), 0o700);
    assert_eq!(mode(&dir.path().join("root")), 0o700);
    let plain = s.without_stamps();
    plain
        .put("a/c", Bytes::from_static(b"x"), Cond::Create)
        .await
        .unwrap();
    assert_eq!(mode(&dir.path().join("root/a/c")), 0o600);
    assert!(
        std::fs::read_dir(dir.path().join("root/.leasehold"))
            .unwrap()
            .all(|e| !e.unwrap().file_name().to_string_lossy().contains("probe")),
        "the open's check leaves no file behind"
    );
}

/// Replaces a file's bytes in place as a careless operator or a hostile
/// host would, keeping its mode (and so whether it is stamped).
fn overwrite_in_place(path: &std::path::Path, bytes: &[u8]) {
    let mode = std::fs::metadata(path).unwrap().permissions().mode();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A stamped object's version is listed from its metadata (one `fstatat`),
/// not from its header (issue #14: opening each file was most of a full
/// listing's cost). Proved by bytes replaced under a kept stamp: the
/// listing still shows the version written, while a read finds the
/// corruption. A stamp changed by hand only makes the listing disagree with
/// the header (a change, so readers read): conditional writes still go by
/// the header, and the next write makes them agree again.
#[tokio::test]
async fn a_listing_takes_a_stamped_version_without_opening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    assert!(s.stamps());
    let v = s
        .put("sessions/a", Bytes::from_static(b"{\"a\":1}"), Cond::Create)
        .await
        .unwrap();
    let listed = |s: LocalDirStore| async move {
        s.list("sessions/")
            .map(|r| r.unwrap())
            .collect::<Vec<_>>()
            .await
    };
    let first = listed(s.clone()).await;
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].version, v,
        "listed at the version the write returned"
    );
    assert_eq!(first[0].size, 7, "the body's length, not the file's");
    let path = dir.path().join("sessions/a");
    let stamp = std::fs::metadata(&path).unwrap().modified().unwrap();
    // Foreign bytes of the same length (a shorter file could not hold a
    // header with this stamp, and would be opened).
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    overwrite_in_place(&path, &vec![b'#'; len]);
    std::fs::File::open(&path)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    let under = listed(s.clone()).await;
    assert_eq!(
        under[0].version, v,
        "the listing read the stamp, not the (now foreign) bytes"
    );
    assert!(matches!(
        s.get("sessions/a").await,
        Err(StoreError::Corrupt { .. })
    ));
    // A fresh object, then its stamp moved by hand.
    let v = s
        .put("sessions/b", Bytes::from_static(b"2"), Cond::Create)
        .await
        .unwrap();
    let path = dir.path().join("sessions/b");
    std::fs::File::open(&path)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000))
        .unwrap();
    let touched = listed(s.clone()).await;
    assert_ne!(touched[1].version, v, "a moved stamp lists as a change");
    assert_eq!(s.get("sessions/b").await.unwrap().unwrap().version, v);
    assert!(
        matches!(
            s.put(
                "sessions/b",
                Bytes::from_static(b"3"),
                Cond::Match(touched[1].version.clone())
            )
            .await,
            Err(StoreError::Precondition)
        ),
        "a write conditioned on the moved stamp is refused: writes go by the header"
    );
    let v2 = s
        .put("sessions/b", Bytes::from_static(b"3"), Cond::Match(v))
        .await
        .unwrap();
    assert_eq!(
        listed(s.clone()).await[1].version,
        v2,
        "agree again after a write"
    );
}

/// A directory written before stamps, or by a store on a filesystem
/// without nanoseconds, holds plain files: they list from their headers,
/// beside stamped ones, each at the version a read gives, and either kind
/// of store replaces either kind of file by compare-and-swap.
#[tokio::test]
async fn stamped_and_plain_files_list_at_the_versions_reads_give() {
    let dir = tempfile::tempdir().unwrap();
    let stamped = LocalDirStore::open(dir.path()).unwrap();
    let plain = stamped.clone().without_stamps();
    let put = |s: &LocalDirStore, k: &'static str, cond: Cond| {
        let s = s.clone();
        async move { s.put(k, Bytes::from_static(b"{}"), cond).await.unwrap() }
    };
    let a = put(&plain, "sessions/a", Cond::Create).await;
    put(&plain, "sessions/b", Cond::Create).await;
    put(&stamped, "sessions/c", Cond::Create).await;
    let a = put(&stamped, "sessions/a", Cond::Match(a)).await;
    put(
        &plain,
        "sessions/c",
        Cond::Match(stamped.get("sessions/c").await.unwrap().unwrap().version),
    )
    .await;
    put(&stamped, "sessions/a", Cond::Match(a)).await;
    let listed: Vec<_> = stamped
        .list("sessions/")
        .map(|r| r.unwrap())
        .collect()
        .await;
    let mode = |k: &str| {
        std::fs::metadata(dir.path().join(k))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };
    let mut seen = Vec::new();
    for e in &listed {
        let got = stamped.get(&e.key).await.unwrap().unwrap();
        assert_eq!(e.version, got.version, "{}", e.key);
        assert_eq!(e.size, 2, "{}", e.key);
        seen.push((e.key.as_str(), mode(&e.key)));
    }
    assert_eq!(
        seen,
        [
            ("sessions/a", 0o400),
            ("sessions/b", 0o600),
            ("sessions/c", 0o600)
        ]
    );
}

/// A FIFO planted where a key would be (a hostile or careless host) is a
/// foreign object: read as corrupt, listed without a version, never waited
/// on. Opening it for reading used to block until a writer came, and with
/// it every listing of the store.
#[tokio::test]
async fn a_fifo_in_the_directory_blocks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    s.put("sessions/ok", Bytes::from_static(b"1"), Cond::Create)
        .await
        .unwrap();
    let path = dir.path().join("sessions/pipe");
    let fifo = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads the NUL-terminated path it is given.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    // Bounded: a store call stuck in `open` is released (a writer opens the
    // FIFO) before failing, so that the test fails instead of hanging.
    async fn bounded<T>(
        what: &str,
        path: &std::path::Path,
        f: impl std::future::Future<Output = T>,
    ) -> T {
        // An I/O bound on a test, not protocol time.
        #[allow(clippy::disallowed_methods)]
        let bounded = tokio::time::timeout(std::time::Duration::from_secs(10), f).await;
        match bounded {
            Ok(v) => v,
            Err(_) => {
                let _ = std::fs::OpenOptions::new().write(true).open(path);
                panic!("{what} waited on the FIFO");
            }
        }
    }
    let listed: Vec<_> = bounded(
        "list",
        &path,
        s.list("sessions/").map(|r| r.unwrap()).collect::<Vec<_>>(),
    )
    .await;
    let keys: Vec<_> = listed.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["sessions/ok", "sessions/pipe"]);
    assert_eq!(
        listed[1].version.etag, None,
        "a foreign file has no version"
    );
    let got = bounded("get", &path, s.get("sessions/pipe")).await;
    assert!(matches!(got, Err(StoreError::Corrupt { .. })), "{got:?}");
    let put = bounded(
        "put",
        &path,
        s.put("sessions/pipe", Bytes::from_static(b"2"), Cond::Create),
    )
    .await;
    assert!(matches!(put, Err(StoreError::Corrupt { .. })), "{put:?}");
}

#[tokio::test]
async fn symlinks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("target"), b"outside").unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    // A symlinked key.
    std::fs::create_dir(dir.path().join("leases")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("target"), dir.path().join("leases/x")).unwrap();
    assert!(matches!(
        s.get("leases/x").await,
        Err(StoreError::Invalid { .. })
    ));
    let v = s
        .put("leases/y", Bytes::from_static(b"1"), Cond::Create)
        .await
        .unwrap();
    let _ = v;
    let e = s
        .put("leases/x", Bytes::from_static(b"2"), Cond::Create)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Invalid { .. }), "{e:?}");
    // A symlinked directory on the way.
    std::os::unix::fs::symlink(outside.path(), dir.path().join("nodes")).unwrap();
    let e = s
        .put("nodes/n1", Bytes::from_static(b"2"), Cond::Create)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Invalid { .. }), "{e:?}");
    assert_eq!(
        std::fs::read(outside.path().join("target")).unwrap(),
        b"outside"
    );
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        1,
        "nothing written outside"
    );
    let listed: Vec<_> = s.list("").map(|r| r.unwrap().key).collect().await;
    assert_eq!(listed, ["leases/y"], "symlinks are not listed");
}

#[tokio::test]
async fn a_replaced_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let s = LocalDirStore::open(&root).unwrap();
    s.put("k/a", Bytes::from_static(b"1"), Cond::Create)
        .await
        .unwrap();
    std::fs::rename(&root, dir.path().join("moved")).unwrap();
    std::fs::create_dir(&root).unwrap();
    let e = s
        .put("k/b", Bytes::from_static(b"1"), Cond::Create)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("changed identity"), "{e}");
    assert!(matches!(
        s.get("k/a").await,
        Err(StoreError::Invalid { .. })
    ));
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        0,
        "nothing written to the new root"
    );
}

#[tokio::test]
async fn half_written_and_foreign_files_are_corrupt_not_absent() {
    let dir = tempfile::tempdir().unwrap();
    let s: Arc<dyn Store> = Arc::new(LocalDirStore::open(dir.path()).unwrap());
    let v = s
        .put("leases/t", Bytes::from_static(b"{\"a\":1}"), Cond::Create)
        .await
        .unwrap();
    let path = dir.path().join("leases/t");
    let full = std::fs::read(&path).unwrap();
    // Truncated.
    overwrite_in_place(&path, &full[..full.len() - 3]);
    let e = s.get("leases/t").await.unwrap_err();
    assert!(
        matches!(&e, StoreError::Corrupt { reason } if reason.contains("truncated")),
        "{e:?}"
    );
    // A write conditioned on the old version is refused, and so is a create:
    // corruption is never treated as absent nor overwritten.
    assert!(matches!(
        s.put("leases/t", Bytes::from_static(b"x"), Cond::Match(v))
            .await,
        Err(StoreError::Corrupt { .. })
    ));
    assert!(matches!(
        s.put("leases/t", Bytes::from_static(b"x"), Cond::Create)
            .await,
        Err(StoreError::Corrupt { .. })
    ));
    assert_eq!(std::fs::read(&path).unwrap(), &full[..full.len() - 3]);
    // Bit flip.
    let mut flipped = full.clone();
    let last = flipped.len() - 2;
    flipped[last] ^= 1;
    overwrite_in_place(&path, &flipped);
    assert!(
        matches!(s.get("leases/t").await, Err(StoreError::Corrupt { reason }) if reason.contains("checksum"))
    );
    // Foreign file: listed without a version, reading it is Corrupt.
    std::fs::write(dir.path().join("leases/foreign"), b"{}").unwrap();
    let listed: Vec<_> = s.list("leases/").map(|r| r.unwrap()).collect().await;
    let f = listed.iter().find(|e| e.key == "leases/foreign").unwrap();
    assert_eq!(f.version.etag, None);
    assert!(matches!(
        s.get("leases/foreign").await,
        Err(StoreError::Corrupt { .. })
    ));
    // Leftover temporary files from a crash are invisible.
    std::fs::write(dir.path().join("leases/.tmp-dead"), b"junk").unwrap();
    let keys: Vec<_> = s.list("").map(|r| r.unwrap().key).collect().await;
    assert_eq!(keys, ["leases/foreign", "leases/t"]);
}

/// A temporary directory on tmpfs where there is one (`/dev/shm`), else
/// in the system's temporary directory.
fn tmpfs_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap()
}

/// Foreign changes to the directory under a listing are taken as found,
/// never as an error of the whole listing: a file whose time is beyond
/// what milliseconds since 1970 can hold in 64 bits (set by hand or by a
/// hostile host; tmpfs keeps it) lists with no time; a subdirectory that
/// is a symlink is skipped, not followed.
#[tokio::test]
async fn odd_files_under_a_listing_list_or_are_skipped() {
    // tmpfs where there is one: it keeps such a time, where ext4 clamps it.
    let dir = tmpfs_dir();
    let s = LocalDirStore::open(dir.path()).unwrap();
    for k in ["sessions/far", "sessions/ok", "elsewhere/x"] {
        s.put(k, Bytes::from_static(b"1"), Cond::Create)
            .await
            .unwrap();
    }
    let far = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1 << 60);
    // The owner may set the time through a read-only descriptor.
    std::fs::File::open(dir.path().join("sessions/far"))
        .unwrap()
        .set_modified(far)
        .unwrap();
    std::os::unix::fs::symlink(
        dir.path().join("elsewhere"),
        dir.path().join("sessions/linked"),
    )
    .unwrap();
    let listed: Vec<_> = s
        .list("sessions/")
        .map(|r| r.unwrap())
        .collect::<Vec<_>>()
        .await;
    let keys: Vec<_> = listed.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["sessions/far", "sessions/ok"]);
    assert!(listed.iter().all(|e| e.version.etag.is_some()));
    assert_eq!(listed[0].last_modified_ms, None);
    assert!(listed[1].last_modified_ms.is_some());
}

/// Reads share a blocking thread (`LocalDirStore::read_blocking`): many at
/// once from several worker threads, each must get its own object (or its
/// own absence, or its own corruption), and none may be left waiting when
/// the thread finds the queue empty as another read is queued (rounds of
/// bursts, each with a deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reads_each_get_their_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let s = LocalDirStore::open(dir.path()).unwrap();
    for i in 0..64u32 {
        s.put(
            &format!("r/k{i:02}"),
            Bytes::from(format!("v{i}")),
            Cond::Create,
        )
        .await
        .unwrap();
    }
    std::fs::write(dir.path().join("r").join("bad"), b"not ours").unwrap();
    for round in 0..200u32 {
        let tasks: Vec<_> = (0..66u32)
            .map(|i| {
                let s = s.clone();
                tokio::spawn(async move {
                    // k00..k63 exist, k64 does not, 65 is the foreign file.
                    let key = if i == 65 {
                        "r/bad".to_string()
                    } else {
                        format!("r/k{i:02}")
                    };
                    (i, s.get(&key).await)
                })
            })
            .collect();
        #[allow(clippy::disallowed_methods)] // a hang here is the failure
        let done = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            futures::future::join_all(tasks),
        )
        .await
        .unwrap_or_else(|_| panic!("round {round}: a read never answered"));
        for t in done {
            let (i, got) = t.unwrap();
            match (i, got) {
                (64, Ok(None)) => {}
                (65, Err(StoreError::Corrupt { .. })) => {}
                (i, Ok(Some(o))) if i < 64 => assert_eq!(o.bytes, format!("v{i}").as_bytes()),
                (i, other) => panic!("round {round}, read {i}: {other:?}"),
            }
        }
        if round % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Each listed key with its ETag, in listing order.
fn listed_etags(listed: &[leasehold::store::Entry]) -> Vec<(&str, &Option<String>)> {
    listed
        .iter()
        .map(|e| (e.key.as_str(), &e.version.etag))
        .collect()
}

/// Each expected key with its ETag, in key order.
fn want_etags(
    want: &std::collections::BTreeMap<String, leasehold::store::Version>,
) -> Vec<(&str, &Option<String>)> {
    want.iter().map(|(k, v)| (k.as_str(), &v.etag)).collect()
}

/// A listing reads its names first and each object's header only when its
/// chunk (1,000 entries) is reached, for up to 16 directories (files in
/// any further directory are read in the name pass). Whichever way an
/// entry was read: every key once, in order, at its current version. The
/// directory the prefix names is one of those read late even with more
/// than 16 stray folders in it, so what changes there between the two
/// steps is taken as found (an object deleted before its chunk is left
/// out, one rewritten lists at its new version), as a change during the
/// walk always was.
#[tokio::test]
async fn a_long_and_wide_listing_is_whole_sorted_and_current() {
    let dir = tmpfs_dir();
    let s = LocalDirStore::open(dir.path()).unwrap();
    let mut want = std::collections::BTreeMap::new();
    for i in 0..2_500u32 {
        let k = format!("sessions/s{i:05}");
        let v = s
            .put(&k, Bytes::from(format!("{i}")), Cond::Create)
            .await
            .unwrap();
        want.insert(k, v);
    }
    // More stray folders in it than the listing holds open; they sort
    // after the objects above.
    for i in 0..20u32 {
        let k = format!("sessions/sub{i:02}/x");
        let v = s
            .put(&k, Bytes::from_static(b"x"), Cond::Create)
            .await
            .unwrap();
        want.insert(k, v);
    }
    // Wide: 40 directories, each with an object, and objects beside them.
    let mut wide = std::collections::BTreeMap::new();
    for i in 0..40u32 {
        for k in [format!("deep/d{i:02}/x"), format!("deep/e{i:02}")] {
            let v = s
                .put(&k, Bytes::from_static(b"w"), Cond::Create)
                .await
                .unwrap();
            wide.insert(k, v);
        }
    }
    let listed: Vec<_> = s.list("deep/").map(|r| r.unwrap()).collect().await;
    assert_eq!(
        listed_etags(&listed),
        want_etags(&wide),
        "every directory's objects, in key order"
    );

    let mut stream = s.list("sessions/");
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.key, "sessions/s00000");
    // Both in chunks not read yet.
    s.delete("sessions/s01500").await.unwrap();
    let old = want.remove("sessions/s01500");
    assert!(old.is_some());
    let o = s.get("sessions/s02000").await.unwrap().unwrap();
    let newer = s
        .put(
            "sessions/s02000",
            Bytes::from_static(b"rewritten"),
            Cond::Match(o.version.clone()),
        )
        .await
        .unwrap();
    assert_ne!(newer.etag, o.version.etag);
    want.insert("sessions/s02000".into(), newer);
    let mut rest: Vec<_> = stream.map(|r| r.unwrap()).collect().await;
    rest.insert(0, first);
    assert_eq!(rest.len(), 2_499 + 20);
    assert_eq!(
        listed_etags(&rest),
        want_etags(&want),
        "sorted, whole, each at its version when read"
    );
}
