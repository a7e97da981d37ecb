//! Hot paths: record encode/decode, rendezvous ranking, one reconcile
//! pass of the pure decision core over 100,000 manifests, and a listing of
//! 100,000 objects in the local directory store (the anti-entropy listing's
//! cost per prefix on a laptop fleet; on tmpfs where `/dev/shm` exists).
//!
//!     cargo bench --bench hot_paths
//!
//! Goal (issue 5): a reconcile pass over 100,000 manifests under 100 ms on
//! one core.

use leasehold::fleet::claim::{ClaimState, Owner};
use leasehold::fleet::core;
use leasehold::fleet::plan::{self, ClaimView, ManifestView, NodeView};
use leasehold::record::{Holder, Kind, LeaseRecord, SCHEMA};
use std::collections::BTreeMap;
use std::time::Duration;

fn main() {
    divan::main();
}

fn record() -> LeaseRecord {
    LeaseRecord {
        schema: SCHEMA.into(),
        kind: Kind::Node,
        holder: Holder {
            node: "node-17".into(),
            host: "web-3.example".into(),
            instance: "9495537d09c645ca".into(),
        },
        epoch: 42,
        ttl_ms: 10_000,
        renewed_at_ms: 1_767_225_600_000,
        released: false,
        host_locked: true,
        lock_id: None,
        address: Some("http://10.0.0.7:7400".into()),
        attrs: serde_json::json!({"capacity": 16, "load": 9, "labels": {"zone": "a"}})
            .as_object()
            .unwrap()
            .clone(),
        nonce: "f88c462fab41b01b".into(),
    }
}

#[divan::bench]
fn encode_record(b: divan::Bencher) {
    let r = record();
    b.bench(|| divan::black_box(&r).encode().unwrap());
}

#[divan::bench]
fn decode_record(b: divan::Bencher) {
    let bytes = record().encode().unwrap();
    b.bench(|| LeaseRecord::decode("nodes/node-17", divan::black_box(&bytes), Kind::Node).unwrap());
}

fn nodes(n: usize) -> Vec<NodeView> {
    (0..n)
        .map(|i| NodeView {
            id: format!("node-{i:02}"),
            instance: format!("inst-{i}"),
            unproven: false,
            capacity: 16 + (i as u32 % 3) * 8,
            load: i as u32 % 5,
            labels: BTreeMap::from([(
                "zone".to_string(),
                if i % 2 == 0 { "a" } else { "b" }.to_string(),
            )]),
            live: i % 7 != 3,
        })
        .collect()
}

fn manifest(i: usize) -> ManifestView {
    ManifestView {
        name: format!("session-{i:06}"),
        digest: "d".into(),
        selector: if i.is_multiple_of(4) {
            BTreeMap::from([("zone".to_string(), "a".to_string())])
        } else {
            BTreeMap::new()
        },
        preferred: vec![],
        paused: false,
        scheduled: false,
    }
}

#[divan::bench(args = [10, 100])]
fn rank_one_session(b: divan::Bencher, n: usize) {
    let ns = nodes(n);
    let m = manifest(7);
    b.bench(|| plan::rank(divan::black_box(&m), &ns).len());
}

/// One pass of the claim decision as a node's tick runs it: for every
/// manifest, placement's verdict and rank, then the node's gate.
#[divan::bench(sample_count = 10)]
fn reconcile_100k_manifests_10_nodes(b: divan::Bencher) {
    let ns = nodes(10);
    let me = Owner {
        node: "node-00".into(),
        instance: "inst-0".into(),
    };
    let manifests: Vec<ManifestView> = (0..100_000).map(manifest).collect();
    // A third unclaimed, a third owned by live nodes, a third by dead ones.
    let claims: Vec<Option<ClaimView>> = (0..100_000)
        .map(|i| match i % 3 {
            0 => None,
            1 => Some(ClaimView {
                owner: std::sync::Arc::new(Owner {
                    node: "node-01".into(),
                    instance: "inst-1".into(),
                }),
                epoch: 3,
                state: ClaimState::Running,
                digest: "d".into(),
                tick: None,
            }),
            _ => Some(ClaimView {
                owner: std::sync::Arc::new(Owner {
                    node: "node-03".into(),
                    instance: "inst-3".into(),
                }),
                epoch: 3,
                state: ClaimState::Running,
                digest: "d".into(),
                tick: None,
            }),
        })
        .collect();
    // The node's own gate (`fleet::core::gate`), fed as the pull loop feeds
    // it: placement's verdict and rank, and the rest of the facts settled.
    b.bench(|| {
        let mut claim_now = 0usize;
        for (m, c) in manifests.iter().zip(&claims) {
            let g = core::gate(
                &core::Candidate {
                    claim_corrupt: false,
                    manifest_corrupt: false,
                    owner_corrupt: false,
                    claimable: plan::claimable(m, c.as_ref(), &ns, &me),
                    control_read: true,
                    cordoned: false,
                    draining: false,
                    absence_pending: false,
                    owner_stale: false,
                    claimable_for: Duration::ZERO,
                    grace: Duration::from_millis(500),
                    predecessor_unproven: false,
                },
                || {
                    plan::my_rank(m, &ns, &me.node).map(|position| core::Rank {
                        position,
                        ahead_idle_for: Duration::MAX,
                    })
                },
            );
            if g == core::Gate::Claim {
                claim_now += 1;
            }
        }
        claim_now
    });
}

/// The local store benches' runtime: one thread, as the blocking pool's
/// hand-offs are part of what they measure.
fn current_thread_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// A temporary directory on tmpfs where there is one (the local store's
/// benches measure its system calls, not a disk).
fn shm_tempdir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .unwrap()
}

/// A local directory store holding 100,000 small objects under `sessions/`,
/// made once per bench process (about ten seconds) and removed at exit:
/// stamped (each version in its file's modification time, as the store
/// writes where the filesystem keeps nanoseconds) or plain (each version in
/// its header only, as before stamps).
fn local_with_objects(
    stamped: bool,
) -> &'static (
    tempfile::TempDir,
    std::sync::Arc<dyn leasehold::store::Store>,
) {
    use leasehold::store::{Cond, LocalDirStore, Store};
    type Fixture = std::sync::OnceLock<(tempfile::TempDir, std::sync::Arc<dyn Store>)>;
    static STAMPED: Fixture = std::sync::OnceLock::new();
    static PLAIN: Fixture = std::sync::OnceLock::new();
    let cell = if stamped { &STAMPED } else { &PLAIN };
    cell.get_or_init(|| {
        let dir = shm_tempdir();
        let local = LocalDirStore::open(dir.path()).unwrap();
        assert!(local.stamps(), "the bench's filesystem keeps nanoseconds");
        let store: std::sync::Arc<dyn Store> = if stamped {
            std::sync::Arc::new(local)
        } else {
            std::sync::Arc::new(local.without_stamps())
        };
        current_thread_rt().block_on(async {
            for i in 0..100_000 {
                store
                    .put(
                        &format!("sessions/s{i:06}"),
                        bytes::Bytes::from_static(br#"{"owner":"n01"}"#),
                        Cond::Create,
                    )
                    .await
                    .unwrap();
            }
        });
        (dir, store)
    })
}

/// One complete listing of 100,000 objects (ETags, sizes, times) in the
/// local directory store: one `fstatat` per object (stamped).
#[divan::bench(sample_count = 10)]
fn local_list_100k(b: divan::Bencher) {
    use futures::StreamExt;
    let (_, store) = local_with_objects(true);
    let rt = current_thread_rt();
    b.bench(|| rt.block_on(store.list("sessions/").count()));
}

/// The same listing of plain files: every object's header is read (open,
/// read, fstat, close), as every listing did before stamps.
#[divan::bench(sample_count = 10)]
fn local_list_100k_plain(b: divan::Bencher) {
    use futures::StreamExt;
    let (_, store) = local_with_objects(false);
    let rt = current_thread_rt();
    b.bench(|| rt.block_on(store.list("sessions/").count()));
}

/// The change feed's cursor at the end of 100,000 keys: every name is
/// read from the directory and none is kept (the light pass's feed read
/// on the local store, after a burst of hints).
#[divan::bench(sample_count = 10)]
fn local_list_after_100k_none_left(b: divan::Bencher) {
    use futures::StreamExt;
    let (_, store) = local_with_objects(true);
    let rt = current_thread_rt();
    b.bench(|| rt.block_on(store.list_after("sessions/", "sessions/t").count()));
}

/// A local directory store holding the change feed a placement of 100,000
/// sessions leaves: 200,000 hints over 30 seconds, spelt `form`, made once
/// per bench process and removed at exit. Returns the store and the
/// cursor a light pass a minute later lists from.
fn local_with_hints(
    form: leasehold::keys::HintForm,
) -> &'static (
    tempfile::TempDir,
    std::sync::Arc<dyn leasehold::store::Store>,
    String,
) {
    use leasehold::keys::{self, HintForm, Hinted};
    use leasehold::store::{Cond, LocalDirStore, Store};
    type Fixture = std::sync::OnceLock<(tempfile::TempDir, std::sync::Arc<dyn Store>, String)>;
    static FLAT: Fixture = std::sync::OnceLock::new();
    static BUCKETED: Fixture = std::sync::OnceLock::new();
    let cell = match form {
        HintForm::Flat => &FLAT,
        HintForm::Bucketed => &BUCKETED,
    };
    cell.get_or_init(|| {
        let dir = shm_tempdir();
        let store: std::sync::Arc<dyn Store> =
            std::sync::Arc::new(LocalDirStore::open(dir.path()).unwrap());
        let t0 = 1_764_700_000_000u64;
        current_thread_rt().block_on(async {
            for i in 0..200_000u64 {
                // 30 seconds of hints, a manifest's and a claim's per session.
                let kind = if i % 2 == 0 {
                    Hinted::Manifest
                } else {
                    Hinted::Claim
                };
                let k = keys::hint(
                    t0 + i * 30_000 / 200_000,
                    "0badcafe",
                    kind,
                    format!("s{:06}", i / 2),
                    form,
                );
                store
                    .put(&k, bytes::Bytes::new(), Cond::Create)
                    .await
                    .unwrap();
            }
        });
        (dir, store, keys::hint_cursor(t0 + 60_000))
    })
}

/// A light pass's feed read a minute after placing 100,000 sessions, with
/// nothing new: flat hints (every name in `changes/` read and compared
/// with the cursor, as before the buckets).
#[divan::bench(sample_count = 10)]
fn local_feed_read_after_placement_flat(b: divan::Bencher) {
    use futures::StreamExt;
    let (_, store, cursor) = local_with_hints(leasehold::keys::HintForm::Flat);
    let rt = current_thread_rt();
    b.bench(|| rt.block_on(store.list_after(leasehold::keys::CHANGES, cursor).count()));
}

/// The same with bucketed hints: the buckets before the cursor are
/// skipped without being opened.
#[divan::bench(sample_count = 10)]
fn local_feed_read_after_placement_bucketed(b: divan::Bencher) {
    use futures::StreamExt;
    let (_, store, cursor) = local_with_hints(leasehold::keys::HintForm::Bucketed);
    let rt = current_thread_rt();
    b.bench(|| rt.block_on(store.list_after(leasehold::keys::CHANGES, cursor).count()));
}
