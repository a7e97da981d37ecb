//! `memory://`: an in-process [`Store`] on an ordered map.
//!
//! object_store's `InMemory` served this before, through the same adapter as
//! the cloud backends. It answers a listing by copying every object under
//! the prefix and a listing from a cursor (`list_after`, S3's `start-after`)
//! by copying them all and filtering. The change feed reads from a cursor
//! every pass, so each node paid for every hint in the bucket on every pass:
//! at 100,000 sessions that copy was 17% of all CPU while a fleet was being
//! placed (measured 2026-12-03; git history of docs/evidence.md). Here a listing reads the map in
//! pages of [`PAGE`] keys from where the last page ended, as S3 pages do: a
//! cursor costs what follows it, and a full listing holds one page at a time.
//!
//! Like a bucket, a listing is not a snapshot: a key written behind the
//! page being read is not shown, one written ahead of it is. ETags are a
//! counter per store, never reused, so a version seen once never names
//! other bytes later (a deleted and recreated key gets a new one).

use super::{
    Cond, Conditional, Entry, Object, Store, StoreError, Version, check_key, check_prefix,
};
use crate::clock::{Clock, SystemClock};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Bound;
use std::sync::{Arc, Mutex};

/// Keys per listing page (S3's, Azure's and GCS's page size).
pub const PAGE: usize = 1000;

/// An in-process store. Cheap to clone; clones share the objects.
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

#[derive(Default)]
struct State {
    objects: BTreeMap<String, Stored>,
    /// The last ETag issued.
    issued: u64,
}

struct Stored {
    bytes: Bytes,
    etag: String,
    /// The wall clock at the write (`Entry::last_modified_ms`).
    modified_ms: u64,
}

impl State {
    fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves the map whole (no
        // update here is left half-done), so a poisoned lock is still usable.
        state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Stored {
    fn version(&self) -> Version {
        Version {
            etag: Some(self.etag.clone()),
            version: None,
        }
    }
}

impl MemoryStore {
    /// An empty store stamping writes with the real wall clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock::new()))
    }

    /// An empty store stamping writes with `clock`'s wall time.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore {
            state: Arc::default(),
            clock,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        State::lock(&self.state)
    }

    /// The listing of `prefix` after `after` (exclusive), one page per lock.
    fn pages(
        &self,
        prefix: &str,
        after: Option<&str>,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        if let Err(e) = check_prefix(prefix) {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        let state = self.state.clone();
        let prefix = prefix.to_string();
        // Where the next page starts: after the cursor, or at the prefix.
        let start = match after {
            Some(a) if a >= prefix.as_str() => Bound::Excluded(a.to_string()),
            _ => Bound::Included(prefix.clone()),
        };
        futures::stream::unfold(Some(start), move |from| {
            let state = state.clone();
            let prefix = prefix.clone();
            async move {
                let from = from?;
                let page: Vec<Entry> = {
                    let st = State::lock(&state);
                    st.objects
                        .range::<String, _>((from, Bound::Unbounded))
                        .take_while(|(k, _)| k.starts_with(prefix.as_str()))
                        .take(PAGE)
                        .map(|(k, o)| Entry {
                            key: k.clone(),
                            version: o.version(),
                            size: o.bytes.len() as u64,
                            last_modified_ms: Some(o.modified_ms),
                        })
                        .collect()
                };
                let next =
                    (page.len() == PAGE).then(|| Bound::Excluded(page[PAGE - 1].key.clone()));
                Some((futures::stream::iter(page.into_iter().map(Ok)), next))
            }
        })
        .flatten()
        .boxed()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl fmt::Display for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memory://")
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        check_key(key)?;
        Ok(self.lock().objects.get(key).map(|o| Object {
            bytes: o.bytes.clone(),
            version: o.version(),
        }))
    }

    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        check_key(key)?;
        let st = self.lock();
        Ok(match st.objects.get(key) {
            None => Conditional::Missing,
            Some(o) if known.etag.as_deref() == Some(o.etag.as_str()) => Conditional::NotModified,
            Some(o) => Conditional::Changed(Object {
                bytes: o.bytes.clone(),
                version: o.version(),
            }),
        })
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        check_key(key)?;
        let modified_ms = self.clock.wall_ms();
        let mut st = self.lock();
        match (&cond, st.objects.get(key)) {
            (Cond::Create, Some(_)) => return Err(StoreError::AlreadyExists),
            (Cond::Create, None) => {}
            (Cond::Match(want) | Cond::MatchAs(want, _), Some(o))
                if want.etag.as_deref() == Some(o.etag.as_str()) => {}
            (Cond::Match(_) | Cond::MatchAs(..), _) => return Err(StoreError::Precondition),
        }
        st.issued += 1;
        let stored = Stored {
            bytes,
            etag: st.issued.to_string(),
            modified_ms,
        };
        let version = stored.version();
        st.objects.insert(key.to_string(), stored);
        Ok(version)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        check_key(key)?;
        self.lock().objects.remove(key);
        Ok(())
    }

    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.pages(prefix, None)
    }

    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.pages(prefix, Some(after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    async fn keys(s: BoxStream<'static, Result<Entry, StoreError>>) -> Vec<String> {
        s.map_ok(|e| e.key).try_collect().await.unwrap()
    }

    /// Pages join without a gap or a repeat, and a cursor anywhere (before
    /// the prefix, inside it, on a missing key, past it) lists exactly what
    /// sorts after it.
    #[tokio::test]
    async fn pages_and_cursors_list_exactly_what_follows() {
        let s = MemoryStore::new();
        let n = PAGE * 2 + 7;
        for i in 0..n {
            s.put(&format!("p/{i:05}"), Bytes::from_static(b"x"), Cond::Create)
                .await
                .unwrap();
        }
        s.put("o/before", Bytes::new(), Cond::Create).await.unwrap();
        s.put("q/after", Bytes::new(), Cond::Create).await.unwrap();
        let all = keys(s.list("p/")).await;
        assert_eq!(all.len(), n);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(keys(s.list_after("p/", "a")).await, all);
        assert_eq!(keys(s.list_after("p/", "p/00999")).await, all[1000..]);
        assert_eq!(keys(s.list_after("p/", "p/00999x")).await, all[1000..]);
        assert_eq!(
            keys(s.list_after("p/", &all[n - 1])).await,
            Vec::<String>::new()
        );
        assert_eq!(keys(s.list_after("p/", "z")).await, Vec::<String>::new());
    }

    /// An ETag is never issued twice, so a key deleted and written again is
    /// not matched by the version it had before.
    #[tokio::test]
    async fn a_recreated_key_has_a_new_version() {
        let s = MemoryStore::new();
        let v1 = s
            .put("k/a", Bytes::from_static(b"1"), Cond::Create)
            .await
            .unwrap();
        s.delete("k/a").await.unwrap();
        let v2 = s
            .put("k/a", Bytes::from_static(b"1"), Cond::Create)
            .await
            .unwrap();
        assert_ne!(v1, v2);
        let e = s
            .put("k/a", Bytes::new(), Cond::Match(v1))
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Precondition), "{e}");
    }
}
