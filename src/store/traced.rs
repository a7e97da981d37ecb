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
        // `otel.*` fields are read by the OpenTelemetry layer (span name,
        // kind, status); the rest become span attributes and log fields.
        let span = tracing::debug_span!(
            "bucket",
            otel.name = %format_args!("bucket {op}"),
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            op,
            key,
            outcome = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
        );
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
        span.record("outcome", outcome);
        span.record("latency_ms", latency_ms);
        // Rejected conditional writes and misses are answers, not failures:
        // only an unreachable, refusing or misbehaving store marks the span.
        if matches!(
            r,
            Err(StoreError::Ambiguous { .. }
                | StoreError::Unavailable { .. }
                | StoreError::Denied { .. }
                | StoreError::Corrupt { .. }
                | StoreError::NotSupported { .. })
        ) {
            span.record("otel.status_code", "ERROR");
        }
        tracing::debug!(parent: &span, outcome, latency_ms, "bucket request");
        r
    }
}

impl fmt::Display for TracedStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

impl TracedStore {
    fn traced_list(
        &self,
        op: &'static str,
        prefix: &str,
        inner: BoxStream<'static, Result<Entry, StoreError>>,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        let span = tracing::debug_span!(
            "bucket",
            otel.name = "bucket list",
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            op,
            prefix,
            outcome = tracing::field::Empty,
            entries = tracing::field::Empty,
            latency_ms = tracing::field::Empty,
        );
        Box::pin(TracedList {
            inner,
            span,
            clock: self.clock.clone(),
            t0: self.clock.now(),
            entries: 0,
            done: false,
        })
    }
}

#[async_trait]
impl crate::store::Forward for TracedStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

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
            Cond::Match(_) | Cond::MatchAs(..) => "put_match",
        };
        self.traced(op, key, self.inner.put(key, bytes, cond)).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.traced("delete", key, self.inner.delete(key)).await
    }

    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.traced_list("list", prefix, self.inner.list(prefix))
    }

    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.traced_list("list_after", prefix, self.inner.list_after(prefix, after))
    }
}

/// A listing under one span that lasts from the first request to the last
/// page (or until the caller drops the stream), recording how many entries
/// it yielded and how it ended.
struct TracedList {
    inner: BoxStream<'static, Result<Entry, StoreError>>,
    span: tracing::Span,
    clock: Arc<dyn Clock>,
    t0: crate::clock::MonoTime,
    entries: u64,
    done: bool,
}

impl TracedList {
    fn finish(&mut self, outcome: &'static str) {
        if self.done {
            return;
        }
        self.done = true;
        let latency_ms = self.clock.now().saturating_since(self.t0).as_secs_f64() * 1000.0;
        self.span.record("outcome", outcome);
        self.span.record("entries", self.entries);
        self.span.record("latency_ms", latency_ms);
        if outcome == "error" {
            self.span.record("otel.status_code", "ERROR");
        }
        tracing::debug!(parent: &self.span, outcome, entries = self.entries, latency_ms, "bucket request");
    }
}

impl futures::Stream for TracedList {
    type Item = Result<Entry, StoreError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = &mut *self;
        let polled = {
            let _enter = this.span.enter();
            this.inner.as_mut().poll_next(cx)
        };
        match &polled {
            std::task::Poll::Ready(Some(Ok(_))) => this.entries += 1,
            std::task::Poll::Ready(Some(Err(_))) => this.finish("error"),
            std::task::Poll::Ready(None) => this.finish("ok"),
            std::task::Poll::Pending => {}
        }
        polled
    }
}

impl Drop for TracedList {
    fn drop(&mut self) {
        // A caller that stops early (a bounded `ls`) ends the listing.
        self.finish("abandoned");
    }
}
