//! A [`Store`] wrapper that puts a tracing span around every bucket request,
//! with the operation, the key, the outcome and the latency. `open_store`
//! wraps every store in it; `LEASEHOLD_LOG=leasehold::store=debug` shows them.

use super::{Cond, Conditional, Entry, Object, Store, StoreError, Version};
use crate::clock::{Clock, SystemClock};
use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use std::fmt;
use std::sync::Arc;
use tracing::Instrument;

/// Traces every request of the store it wraps.
#[derive(Debug)]
pub struct TracedStore {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
}

impl TracedStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        TracedStore {
            inner,
            clock: Arc::new(SystemClock::new()),
        }
    }

    async fn traced<T>(
        &self,
        op: &'static str,
        key: &str,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = tracing::debug_span!("bucket", op, key);
        let t0 = self.clock.now();
        let r = f.instrument(span.clone()).await;
        let latency_ms = self.clock.now().saturating_since(t0).as_secs_f64() * 1000.0;
        let outcome = match &r {
            Ok(_) => "ok",
            Err(StoreError::AlreadyExists) => "already_exists",
            Err(StoreError::Precondition) => "precondition",
            Err(StoreError::NotFound) => "not_found",
            Err(StoreError::Ambiguous { .. }) => "ambiguous",
            Err(StoreError::Unavailable { .. }) => "unavailable",
            Err(StoreError::Denied { .. }) => "denied",
            Err(StoreError::Invalid { .. }) => "invalid",
            Err(StoreError::Corrupt { .. }) => "corrupt",
            Err(StoreError::NotSupported { .. }) => "not_supported",
        };
        tracing::debug!(parent: &span, outcome, latency_ms, "bucket request");
        r
    }
}

impl fmt::Display for TracedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
impl Store for TracedStore {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.traced("get", key, self.inner.get(key)).await
    }
    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        self.traced("get_if_changed", key, self.inner.get_if_changed(key, known))
            .await
    }
    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let op = match cond {
            Cond::Create => "put_create",
            Cond::Match(_) => "put_match",
        };
        self.traced(op, key, self.inner.put(key, bytes, cond)).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.traced("delete", key, self.inner.delete(key)).await
    }
    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        tracing::debug!(op = "list", prefix, "bucket request");
        self.inner.list(prefix)
    }
}
