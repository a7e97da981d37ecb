//! For anyone who writes a [`Store`](crate::store::Store) or a wrapper of
//! one, and for leasehold's own tests (feature `testkit`).
//!
//! - [`conformance::run_all`]: the suite every backend runs (memory, the
//!   local directory, moto, Azurite, Ceph RGW in `scripts/test`). A store
//!   that passes it and `leasehold doctor` is one leasehold can trust.
//! - The doubles: [`FaultStore`](crate::store::FaultStore) and the wrappers
//!   of [`crate::store::fault`] (scripted faults, a store that ignores
//!   conditions, one that checks them without a lock, ETag dialect quirks);
//!   [`ManualClock`](crate::clock::ManualClock),
//!   [`MockClock`](crate::clock::MockClock) and
//!   [`SeededEntropy`](crate::clock::SeededEntropy) for seeded, replayable
//!   time and randomness; [`RecordingRunner`](crate::fleet::runner::RecordingRunner)
//!   for a fleet without processes. They exist only with this feature (and
//!   in leasehold's unit tests), so a production build does not carry them.
//!
//! ```toml
//! [dev-dependencies]
//! leasehold = { version = "0.1", features = ["testkit"] }
//! ```
//!
//! ```ignore
//! #[tokio::test(flavor = "multi_thread")]
//! async fn my_store_conforms() {
//!     leasehold::testkit::conformance::run_all(&|| {
//!         Box::pin(async { std::sync::Arc::new(MyStore::fresh()) as _ })
//!     })
//!     .await;
//! }
//! ```

pub mod conformance;
