//! A [`Store`] wrapper that counts requests by kind, for round-trip tests,
//! the cost model and the spike.

use super::{Cond, Conditional, Entry, Object, Store, StoreError, Version};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
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
impl Store for CountingStore {
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

    /// Counted as S3 charges `start-after`: pages of what follows the cursor.
    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.pages(self.inner.list_after(prefix, after))
    }

    fn identity(&self) -> String {
        self.inner.identity()
    }

    fn etag_dialect(&self) -> Option<crate::store::EtagDialect> {
        self.inner.etag_dialect()
    }

    fn set_etag_dialect(&self, d: crate::store::EtagDialect) -> bool {
        self.inner.set_etag_dialect(d)
    }
}
