//! A [`Store`] wrapper that counts requests by kind, for round-trip tests,
//! the cost model and the spike.

use super::{Cond, Conditional, Entry, Object, Store, StoreError, Version};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Objects per list page on S3, GCS and Azure; a listing of N keys costs
/// max(1, ceil(N / 1000)) requests.
pub const LIST_PAGE: u64 = 1000;

#[derive(Debug, Default)]
struct Counters {
    get: AtomicU64,
    get_if_changed: AtomicU64,
    put_create: AtomicU64,
    put_match: AtomicU64,
    delete: AtomicU64,
    list_pages: AtomicU64,
}

/// A snapshot of request counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestCounts {
    pub get: u64,
    pub get_if_changed: u64,
    pub put_create: u64,
    pub put_match: u64,
    pub delete: u64,
    pub list_pages: u64,
}

impl RequestCounts {
    pub fn total(&self) -> u64 {
        self.get
            + self.get_if_changed
            + self.put_create
            + self.put_match
            + self.delete
            + self.list_pages
    }

    pub fn since(&self, earlier: &RequestCounts) -> RequestCounts {
        RequestCounts {
            get: self.get - earlier.get,
            get_if_changed: self.get_if_changed - earlier.get_if_changed,
            put_create: self.put_create - earlier.put_create,
            put_match: self.put_match - earlier.put_match,
            delete: self.delete - earlier.delete,
            list_pages: self.list_pages - earlier.list_pages,
        }
    }
}

/// Counts every request that passes through it.
#[derive(Debug, Clone)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    c: Arc<Counters>,
}

impl CountingStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        CountingStore {
            inner,
            c: Arc::default(),
        }
    }

    pub fn counts(&self) -> RequestCounts {
        let c = &self.c;
        RequestCounts {
            get: c.get.load(Ordering::Relaxed),
            get_if_changed: c.get_if_changed.load(Ordering::Relaxed),
            put_create: c.put_create.load(Ordering::Relaxed),
            put_match: c.put_match.load(Ordering::Relaxed),
            delete: c.delete.load(Ordering::Relaxed),
            list_pages: c.list_pages.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Display for CountingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.inner)
    }
}

impl CountingStore {
    /// Counts a listing's pages: the first is requested even for an empty
    /// listing; each further LIST_PAGE entries cost one more.
    fn pages(
        &self,
        stream: BoxStream<'static, Result<Entry, StoreError>>,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.c.list_pages.fetch_add(1, Ordering::Relaxed);
        let c = self.c.clone();
        let mut n = 0u64;
        stream
            .inspect(move |_| {
                if n > 0 && n.is_multiple_of(LIST_PAGE) {
                    c.list_pages.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
            })
            .boxed()
    }
}

#[async_trait]
impl crate::store::Forward for CountingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.c.get.fetch_add(1, Ordering::Relaxed);
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        self.c.get_if_changed.fetch_add(1, Ordering::Relaxed);
        self.inner.get_if_changed(key, known).await
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        match cond {
            Cond::Create => self.c.put_create.fetch_add(1, Ordering::Relaxed),
            Cond::Match(_) | Cond::MatchAs(..) => self.c.put_match.fetch_add(1, Ordering::Relaxed),
        };
        self.inner.put(key, bytes, cond).await
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.c.delete.fetch_add(1, Ordering::Relaxed);
        self.inner.delete(key).await
    }

    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.pages(self.inner.list(prefix))
    }

    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.pages(self.inner.list_after(prefix, after))
    }
}

/// [`BySegment`]'s segments, in report order; the last takes every other
/// key.
pub const SEGMENTS: [&str; 6] = [
    crate::keys::NODES,
    crate::keys::SESSIONS,
    crate::keys::MANIFESTS,
    crate::keys::CHANGES,
    crate::keys::BELL,
    "other",
];

/// Requests counted by what they are for: a [`Store`] wrapper that sends
/// each request on to one [`CountingStore`] per key segment (node records,
/// claims, manifests, the change feed, the bell, anything else), all over
/// the same inner store. The spike's cost figures split by it, so what a
/// node-hour pays for each purpose is counted, not inferred; tests count one
/// segment's requests with it.
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

    fn of(&self, key: &str) -> &dyn Store {
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
impl crate::store::Forward for BySegment {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ObjectStoreBackend;
    use futures::StreamExt;

    /// Each request is counted under its key's segment only, listings under
    /// their prefix's, and a key under no known segment as "other".
    #[tokio::test]
    async fn requests_are_counted_by_segment() {
        let s = BySegment::new(Arc::new(ObjectStoreBackend::memory()));
        s.put("nodes/n1", Bytes::from_static(b"x"), Cond::Create)
            .await
            .unwrap();
        s.get(crate::keys::BELL).await.unwrap();
        s.get("bellows").await.unwrap();
        s.get("control/n1").await.unwrap();
        let _ = s.list(crate::keys::NODES).count().await;
        let _ = s
            .list_after(crate::keys::CHANGES, "changes/0")
            .count()
            .await;
        let c = s.counts();
        assert_eq!((c["nodes/"].put_create, c["nodes/"].list_pages), (1, 1));
        assert_eq!(c["nodes/"].total(), 2);
        assert_eq!(c[crate::keys::BELL].total(), 1);
        assert_eq!(c["other"].get, 2, "bellows and control/: {c:?}");
        assert_eq!(c["changes/"].list_pages, 1);
        assert_eq!(c["sessions/"].total() + c["manifests/"].total(), 0);
    }
}
