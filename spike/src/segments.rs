//! Requests counted by what they are for: a `Store` wrapper that sends each
//! request on to one `CountingStore` per key segment (node records, claims,
//! manifests, the change feed, the bell, anything else), all over the same
//! inner store. The spike's cost figures split by it, so what a node-hour
//! pays for each purpose is counted, not inferred.

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use leasehold::keys;
use leasehold::store::{
    Cond, Conditional, CountingStore, Entry, Object, RequestCounts, Store, StoreError, Version,
};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// The segments, in report order; the last takes every other key.
pub const SEGMENTS: [&str; 6] = [
    keys::NODES,
    keys::SESSIONS,
    keys::MANIFESTS,
    keys::CHANGES,
    keys::BELL,
    "other",
];

#[derive(Debug)]
pub struct BySegment {
    inner: Arc<dyn Store>,
    counters: Vec<CountingStore>,
}

impl BySegment {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        BySegment {
            counters: SEGMENTS
                .iter()
                .map(|_| CountingStore::new(inner.clone()))
                .collect(),
            inner,
        }
    }

    fn of(&self, key: &str) -> &CountingStore {
        let i = SEGMENTS[..SEGMENTS.len() - 1]
            .iter()
            .position(|s| {
                if s.ends_with('/') {
                    key.starts_with(s)
                } else {
                    key == *s
                }
            })
            .unwrap_or(SEGMENTS.len() - 1);
        &self.counters[i]
    }

    pub fn counts(&self) -> BTreeMap<&'static str, RequestCounts> {
        SEGMENTS
            .iter()
            .zip(&self.counters)
            .map(|(s, c)| (*s, c.counts()))
            .collect()
    }
}

/// The counts of `now` less those of `before`, segment by segment.
pub fn since(
    now: &BTreeMap<&'static str, RequestCounts>,
    before: &BTreeMap<&'static str, RequestCounts>,
) -> BTreeMap<&'static str, RequestCounts> {
    now.iter().map(|(s, c)| (*s, c.since(&before[s]))).collect()
}

impl fmt::Display for BySegment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

#[async_trait]
impl Store for BySegment {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.of(key).get(key).await
    }
    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        self.of(key).get_if_changed(key, known).await
    }
    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        self.of(key).put(key, bytes, cond).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.of(key).delete(key).await
    }
    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.of(prefix).list(prefix)
    }
    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.of(prefix).list_after(prefix, after)
    }
    fn identity(&self) -> String {
        self.inner.identity()
    }
    fn etag_dialect(&self) -> Option<leasehold::store::EtagDialect> {
        self.inner.etag_dialect()
    }
    fn set_etag_dialect(&self, d: leasehold::store::EtagDialect) -> bool {
        self.inner.set_etag_dialect(d)
    }
}
