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
    assert_eq!(mode(&dir.path().join("root/a/b")), 0o600);
    assert_eq!(mode(&dir.path().join("root/a")), 0o700);
    assert_eq!(mode(&dir.path().join("root")), 0o700);
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
    std::fs::write(&path, &full[..full.len() - 3]).unwrap();
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
    std::fs::write(&path, &flipped).unwrap();
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
    std::fs::File::options()
        .write(true)
        .open(dir.path().join("sessions/far"))
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
