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

mod lease;
mod store;

use lease::*;
use store::*;

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
