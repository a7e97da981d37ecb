//! Runs the shared suite against every backend. The real servers (moto for
//! the S3 API, Azurite for Azure Blob) are started by `scripts/test`, which
//! sets LEASEHOLD_TEST_S3 / LEASEHOLD_TEST_AZURE and LEASEHOLD_REQUIRE_SERVERS;
//! under it a missing server fails the run instead of skipping.

mod common;
// The suite lives in the library (feature `testkit`), so that anyone writing
// a `Store` runs the very checks these backends run.
use leasehold::testkit::conformance as suite;

use common::server;

use leasehold::clock::{Entropy, OsEntropy, SystemClock};
use leasehold::store::{
    EtagDialect, LocalDirStore, ObjectStoreBackend, OpenOptions, Store, open_store,
};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory() {
    suite::run_all(&|| {
        Box::pin(async { Arc::new(ObjectStoreBackend::memory()) as Arc<dyn Store> })
    })
    .await;
}

/// A wrapper that overrides nothing (`Forward` with `inner` alone).
#[derive(Debug)]
struct Bare(Arc<dyn Store>);
impl std::fmt::Display for Bare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl leasehold::store::Forward for Bare {
    fn inner(&self) -> &dyn Store {
        &*self.0
    }
}

/// Wrappers keep the contract: one that forwards everything by default
/// (`store::Forward`), under the counting and tracing wrappers a node
/// stacks over its store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forwarding_wrappers() {
    use leasehold::store::{CountingStore, TracedStore};
    suite::run_all(&|| {
        Box::pin(async {
            let inner: Arc<dyn Store> = Arc::new(ObjectStoreBackend::memory());
            Arc::new(TracedStore::new(Arc::new(CountingStore::new(Arc::new(
                Bare(inner),
            ))))) as Arc<dyn Store>
        })
    })
    .await;
}

/// `memory://` (`MemoryStore`, paged listings from a cursor).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_url() {
    suite::run_all(&|| {
        Box::pin(async {
            leasehold::store::open_store("memory://", &Default::default())
                .await
                .unwrap()
        })
    })
    .await;
}

/// The local directory store, each run on a fresh subdirectory: writes
/// stamped (`stamped`: versions in files' modification times, as where the
/// filesystem keeps nanoseconds) or plain (as before stamps, or on a
/// filesystem without nanosecond times: listings read every header).
async fn local_directory_suite(stamped: bool) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let n = std::sync::atomic::AtomicU32::new(0);
    suite::run_all(&|| {
        let sub = root.join(format!(
            "s{}",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        Box::pin(async move {
            let s = LocalDirStore::open(sub).unwrap();
            assert!(s.stamps(), "this filesystem keeps nanosecond times");
            let s = if stamped { s } else { s.without_stamps() };
            Arc::new(s) as Arc<dyn Store>
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_directory() {
    local_directory_suite(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_directory_without_stamps() {
    local_directory_suite(false).await;
}

async fn run_on_server(base: String) {
    let entropy = OsEntropy::new();
    let run = entropy.hex_id();
    let n = std::sync::atomic::AtomicU32::new(0);
    suite::run_all(&|| {
        let url = format!(
            "{base}/run-{run}/s{}",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        Box::pin(async move { open_store(&url, &OpenOptions::default()).await.unwrap() })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_moto() {
    if let Some(base) = server("LEASEHOLD_TEST_S3") {
        run_on_server(base).await;
    }
}

/// Ceph RGW (Debian's 16.2.15): If-Match matches only bare ETags there. The
/// probe learns that on a fresh handle (quoted by default); every store the
/// suite then opens speaks the learned form, as a node's store does after
/// its start-up probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_ceph_rgw() {
    let Some((base, endpoint)) = common::rgw() else {
        return;
    };
    let opts = OpenOptions {
        endpoint: Some(endpoint),
        ..Default::default()
    };
    let entropy = OsEntropy::new();
    let run = entropy.hex_id();
    let first = open_store(&format!("{base}/run-{run}/probe"), &opts)
        .await
        .unwrap();
    assert_eq!(first.etag_dialect(), Some(EtagDialect::Quoted));
    let report = leasehold::probe::probe(&first, &entropy, &SystemClock::new())
        .await
        .unwrap();
    assert_eq!(
        report.etag_dialect,
        Some(EtagDialect::Unquoted),
        "{:?}",
        report.steps
    );
    let n = std::sync::atomic::AtomicU32::new(0);
    suite::run_all(&|| {
        let url = format!(
            "{base}/run-{run}/s{}",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let opts = opts.clone();
        Box::pin(async move {
            let s = open_store(&url, &opts).await.unwrap();
            assert!(s.set_etag_dialect(EtagDialect::Unquoted));
            s
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn azure_azurite() {
    if let Some(base) = server("LEASEHOLD_TEST_AZURE") {
        run_on_server(base).await;
    }
}

/// A create into a bucket or container that does not exist is a typed
/// configuration error that names it, on both real servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bucket_or_container_is_named() {
    for (var, missing) in [
        ("LEASEHOLD_TEST_S3", "s3://leasehold-no-such-bucket"),
        ("LEASEHOLD_TEST_AZURE", "az://leasehold-no-such-container"),
    ] {
        if server(var).is_none() {
            continue;
        }
        let store = open_store(missing, &OpenOptions::default()).await.unwrap();
        let e = store
            .put(
                "k",
                bytes::Bytes::from_static(b"x"),
                leasehold::store::Cond::Create,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&e, leasehold::store::StoreError::Invalid { reason } if reason.contains("does not exist")),
            "{missing}: {e}"
        );
    }
}
