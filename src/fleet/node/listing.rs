//! Listing a prefix into a cache: a streamed listing keeps only what the
//! cache does not hold at that version, reads what changed, and drops what
//! was not listed.

use super::*;

/// Concurrent reads when refreshing changed manifests and claims.
pub(super) const REFRESH_CONCURRENCY: usize = 16;

/// What a full listing of one prefix left to do, gathered as it streamed
/// past (see [`Listed::take`]): the keys it showed, and the entries whose
/// version the cache does not hold.
///
/// Why not the entries themselves: at 100,000 sessions two collected
/// listings held 200,000 of them (key, ETag, size, time) beside the caches
/// they were compared with, lifting a node 30-50 MB above its steady size
/// for the length of a full pass (issue #14; docs/evidence.md, "A full
/// listing streamed"). The keys alone are a third of that, and what is
/// unchanged (all but a few in steady state) is kept no further.
///
/// Which entries are stale is decided as each streams past, against the
/// cache and the corrupt set as they are then: neither may change between
/// the listing and its `refresh` (nothing in a pass writes them between
/// the two; a read placed there would have its key skipped by `refresh`).
pub(super) struct Listed {
    pub(super) prefix: &'static str,
    pub(super) keys: std::collections::HashSet<String>,
    pub(super) stale: Vec<Entry>,
    /// Keys that are not `<prefix><name>`, at the version listed: marked
    /// corrupt by `refresh`, so a listing that fails half-way changes
    /// nothing.
    pub(super) foreign: Vec<Entry>,
}

impl Listed {
    pub(super) fn new(prefix: &'static str) -> Self {
        Listed {
            prefix,
            keys: Default::default(),
            stale: Vec::new(),
            foreign: Vec::new(),
        }
    }

    /// Takes one listed entry: remembered as listed, and kept for a read
    /// unless the cache holds its version (or that version is known
    /// corrupt). A key that is not `<prefix><name>` is not ours (a stray
    /// `notes.txt`, a nested path): reported once, never read.
    pub(super) fn take<T>(&mut self, e: Entry, cache: &Cached<T>, corrupt: &Tracked<Version>) {
        let known = cache.get(&e.key).is_some_and(|(v, _)| *v == e.version)
            || corrupt.get(&e.key) == Some(&e.version);
        self.keys.insert(e.key.clone());
        if known {
            return;
        }
        let ours = e
            .key
            .strip_prefix(self.prefix)
            .is_some_and(|n| !n.contains('/') && Name::new(n).is_ok());
        if ours {
            self.stale.push(e);
        } else {
            self.foreign.push(e);
        }
    }
}

/// A complete listing of `prefix` taken into `listed`, yielding now and
/// then (see `tick`).
pub(super) async fn list_into<T>(
    store: &Arc<dyn Store>,
    listed: &mut Listed,
    cache: &Cached<T>,
    corrupt: &Tracked<Version>,
) -> Result<()> {
    let mut s = store.list(listed.prefix);
    while let Some(e) = s.next().await {
        tokio::task::coop::consume_budget().await;
        let e = e.map_err(|e| Error::from_store("list", listed.prefix, e))?;
        listed.take(e, cache, corrupt);
    }
    Ok(())
}

/// Brings `cache` in line with a complete listing: drops keys no longer
/// listed and GETs only keys whose version changed. A corrupt object is
/// logged and left out (never overwritten); it stays out until its version
/// changes. `on_read` sees each object read and cached, with the version
/// its listing showed.
pub(super) async fn refresh<T>(
    store: &Arc<dyn Store>,
    listed: Listed,
    cache: &mut Cached<T>,
    corrupt: &mut Tracked<Version>,
    decode: impl Fn(&str, &[u8]) -> Result<T>,
    mut on_read: impl FnMut(&str, &Version, &(Version, T)),
) -> Result<bool> {
    let Listed {
        prefix,
        keys,
        stale,
        foreign,
    } = listed;
    let mut changed = false;
    let before = cache.len();
    cache.retain(|k, _| keys.contains(k.as_str()));
    changed |= cache.len() != before;
    corrupt.retain(|k, _| !k.starts_with(prefix) || keys.contains(k.as_str()));
    drop(keys);
    for e in foreign {
        tracing::warn!(key = e.key, "skipping a foreign key (not a valid name)");
        corrupt.insert(e.key, e.version);
    }
    // Read what changed, a few at a time: on a real store a tick after a
    // burst of manifests would otherwise take one round trip per object. A
    // version already found corrupt is not read again until it changes.
    // Each answer is taken as it comes rather than all collected first (at
    // a node's first listing, 100,000 objects' bytes at once): each key's
    // outcome depends on its own answer only, so the order is immaterial.
    let mut fetched = futures::stream::iter(stale)
        .map(|e| {
            let store = store.clone();
            async move {
                let got = store.get(&e.key).await;
                (e, got)
            }
        })
        .buffer_unordered(REFRESH_CONCURRENCY);
    while let Some((e, got)) = fetched.next().await {
        changed = true;
        let bad = match got {
            Ok(Some(o)) => match decode(&e.key, &o.bytes) {
                Ok(rec) => {
                    corrupt.remove(&e.key);
                    let value = (o.version, rec);
                    on_read(&e.key, &e.version, &value);
                    cache.insert(e.key.clone(), value);
                    None
                }
                Err(err) => Some((err.to_string(), o.version)),
            },
            Ok(None) => {
                corrupt.remove(&e.key);
                cache.remove(&e.key);
                None
            }
            // Foreign bytes, an oversized object, a key the store refuses:
            // this key's problem only.
            Err(
                err @ (crate::store::StoreError::Corrupt { .. }
                | crate::store::StoreError::Invalid { .. }),
            ) => Some((err.to_string(), e.version.clone())),
            Err(err) => return Err(Error::from_store("get", &e.key, err)),
        };
        if let Some((reason, version)) = bad {
            // Never read as deleted: the last good record (if any) stays as
            // it was, and the key is reported until it is repaired.
            tracing::warn!(key = e.key, error = %reason, "skipping a corrupt object (its session is left as it was)");
            corrupt.insert(e.key.clone(), version);
        }
    }
    Ok(changed)
}

/// Brings `cache` in line with the bucket for `keys` (those the change feed
/// named): a conditional GET for a cached key (a 304 is the cheapest
/// answer), a GET otherwise. A missing key leaves the cache; a corrupt one
/// is handled as `refresh` does. Returns whether anything changed.
pub(super) async fn refresh_keys<T>(
    store: &Arc<dyn Store>,
    keys: &[String],
    cache: &mut Cached<T>,
    corrupt: &mut Tracked<Version>,
    decode: impl Fn(&str, &[u8]) -> Result<T>,
) -> Result<bool> {
    let mut asks: Vec<(String, Option<Version>)> = keys
        .iter()
        .map(|k| (k.clone(), cache.get(k).map(|(v, _)| v.clone())))
        .collect();
    // In key order: what a pass does next must not depend on which read
    // came back first (seeded runs replay). Each answer is taken as it
    // comes, in that order (`buffered`), rather than all collected first:
    // at placement a pass's hints name thousands of objects, and their
    // bytes held at once were a node's largest transient (13.6 MB of its
    // peak heap in a heaptrack run at 100,000 sessions, issue #14).
    asks.sort_by(|a, b| a.0.cmp(&b.0));
    let mut fetched = futures::stream::iter(asks)
        .map(|(key, known)| {
            let store = store.clone();
            async move {
                let got = match &known {
                    Some(v) => store.get_if_changed(&key, v).await,
                    None => store.get(&key).await.map(|o| match o {
                        Some(o) => crate::store::Conditional::Changed(o),
                        None => crate::store::Conditional::Missing,
                    }),
                };
                (key, got)
            }
        })
        .buffered(REFRESH_CONCURRENCY);
    let mut changed = false;
    while let Some((key, got)) = fetched.next().await {
        tokio::task::coop::consume_budget().await;
        match got {
            Ok(crate::store::Conditional::NotModified) => {}
            Ok(crate::store::Conditional::Changed(o)) => {
                changed = true;
                match decode(&key, &o.bytes) {
                    Ok(rec) => {
                        corrupt.remove(&key);
                        cache.insert(key, (o.version, rec));
                    }
                    Err(err) => {
                        tracing::warn!(key, error = %err, "skipping a corrupt object (its session is left as it was)");
                        corrupt.insert(key, o.version);
                    }
                }
            }
            Ok(crate::store::Conditional::Missing) => {
                changed |= cache.remove(&key).is_some() | corrupt.remove(&key).is_some();
            }
            Err(
                err @ (crate::store::StoreError::Corrupt { .. }
                | crate::store::StoreError::Invalid { .. }),
            ) => {
                tracing::warn!(key, error = %err, "skipping a corrupt object (its session is left as it was)");
                // No version to remember: the next full listing has one.
            }
            Err(err) => return Err(Error::from_store("get", &key, err)),
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version {
            etag: Some(s.to_string()),
            version: None,
        }
    }

    fn entry(key: &str, version: Version) -> Entry {
        Entry {
            key: key.to_string(),
            version,
            size: 1,
            last_modified_ms: None,
        }
    }

    /// A full listing streamed through `Listed` leaves for reading only what
    /// the cache does not hold at the listed version (a changed key, a new
    /// key), never a version known corrupt or a foreign key (reported
    /// corrupt instead), and remembers every key it showed.
    #[test]
    fn a_streamed_listing_keeps_only_what_the_cache_does_not_hold() {
        let mut cache: Cached<()> = Default::default();
        cache.insert("manifests/a".into(), (v("1"), ()));
        cache.insert("manifests/b".into(), (v("1"), ()));
        let mut corrupt: Tracked<Version> = Default::default();
        corrupt.insert("manifests/bad".into(), v("7"));
        let mut l = Listed::new(crate::keys::MANIFESTS);
        for e in [
            entry("manifests/a", v("1")),
            entry("manifests/b", v("2")),
            entry("manifests/bad", v("7")),
            entry("manifests/c", v("1")),
            entry("manifests/x/y", v("1")),
        ] {
            l.take(e, &cache, &corrupt);
        }
        let stale: Vec<(&str, &Version)> = l
            .stale
            .iter()
            .map(|e| (e.key.as_str(), &e.version))
            .collect();
        assert_eq!(stale, [("manifests/b", &v("2")), ("manifests/c", &v("1"))]);
        let mut keys: Vec<&str> = l.keys.iter().map(String::as_str).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "manifests/a",
                "manifests/b",
                "manifests/bad",
                "manifests/c",
                "manifests/x/y"
            ]
        );
        let foreign: Vec<&str> = l.foreign.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(foreign, ["manifests/x/y"]);
        assert_eq!(corrupt.len(), 1, "nothing marked until the refresh");
    }

    /// `refresh` after a streamed listing: a key the listing did not show
    /// leaves the cache (and the corrupt set), a changed one is read at the
    /// version the store has, an unchanged one is not read at all (nor
    /// shown to `on_read`), and a foreign key is marked corrupt at the
    /// version listed.
    #[tokio::test]
    async fn refresh_from_a_streamed_listing_drops_the_unlisted_and_reads_the_changed() {
        let mem = crate::store::MemoryStore::new();
        let store: Arc<dyn Store> = Arc::new(mem);
        let b = store
            .put("manifests/b", Bytes::from_static(b"b2"), Cond::Create)
            .await
            .unwrap();
        let c = store
            .put("manifests/c", Bytes::from_static(b"c1"), Cond::Create)
            .await
            .unwrap();
        let mut cache: Cached<String> = Default::default();
        // "a" is in the cache at a version the store never had: were it
        // read, its value would change; it is listed at that version, so
        // it must be left alone.
        cache.insert("manifests/a".into(), (v("a-old"), "a".into()));
        cache.insert("manifests/b".into(), (v("b-old"), "b1".into()));
        cache.insert("manifests/gone".into(), (v("1"), "gone".into()));
        let mut corrupt: Tracked<Version> = Default::default();
        corrupt.insert("manifests/gone-bad".into(), v("9"));
        let mut l = Listed::new(crate::keys::MANIFESTS);
        for e in [
            entry("manifests/a", v("a-old")),
            entry("manifests/b", b.clone()),
            entry("manifests/c", c.clone()),
            entry("manifests/not a name", v("3")),
        ] {
            l.take(e, &cache, &corrupt);
        }
        let mut read = Vec::new();
        let changed = refresh(
            &store,
            l,
            &mut cache,
            &mut corrupt,
            |_, bytes| Ok(String::from_utf8(bytes.to_vec()).unwrap()),
            |key, listed, (version, value)| {
                assert_eq!(listed, version, "{key}: read at the listed version");
                read.push((key.to_string(), value.clone()));
            },
        )
        .await
        .unwrap();
        assert!(changed);
        read.sort();
        assert_eq!(
            read,
            [
                ("manifests/b".to_string(), "b2".to_string()),
                ("manifests/c".to_string(), "c1".to_string())
            ]
        );
        let mut got: Vec<(&str, &str)> = cache
            .iter()
            .map(|(k, (_, t))| (k.as_str(), t.as_str()))
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("manifests/a", "a"),
                ("manifests/b", "b2"),
                ("manifests/c", "c1")
            ]
        );
        assert_eq!(cache.get("manifests/b").map(|(v, _)| v), Some(&b));
        let corrupt: Vec<(&str, &Version)> = corrupt.iter().map(|(k, v)| (k.as_str(), v)).collect();
        assert_eq!(
            corrupt,
            [("manifests/not a name", &v("3"))],
            "an unlisted corrupt key is forgotten, a foreign one marked"
        );
    }
}
