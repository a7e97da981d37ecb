//! Runs the shared suite against every backend. The real servers (moto for
//! the S3 API, Azurite for Azure Blob) are started by `scripts/test`, which
//! sets LEASEHOLD_TEST_S3 / LEASEHOLD_TEST_AZURE and LEASEHOLD_REQUIRE_SERVERS;
//! under it a missing server fails the run instead of skipping.

mod common;
mod suite;

use common::server;

use leasehold::clock::{Entropy, OsEntropy};
use leasehold::store::{LocalDirStore, ObjectStoreBackend, OpenOptions, Store, open_store};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory() {
    suite::run_all(&|| {
        Box::pin(async { Arc::new(ObjectStoreBackend::memory()) as Arc<dyn Store> })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let n = std::sync::atomic::AtomicU32::new(0);
    suite::run_all(&|| {
        let sub = root.join(format!(
            "s{}",
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        Box::pin(async move { Arc::new(LocalDirStore::open(sub).unwrap()) as Arc<dyn Store> })
    })
    .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn azure_azurite() {
    if let Some(base) = server("LEASEHOLD_TEST_AZURE") {
        run_on_server(base).await;
    }
}
