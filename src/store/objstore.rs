//! [`Store`] over any `object_store` backend (S3, Azure Blob, GCS, in-memory).

use super::{
    Cond, Conditional, Entry, EtagDialect, Object, Store, StoreError, Version, check_key,
    check_prefix,
};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use object_store::path::Path;
use object_store::{
    GetOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Largest object leasehold will read. Our records are a few hundred bytes;
/// anything far larger is foreign, and reading it whole would let a stray
/// upload exhaust a node's memory.
pub const MAX_READ_BYTES: u64 = 1 << 20;

/// Adapts an `object_store` backend, rooted at an optional prefix.
#[derive(Debug, Clone)]
pub struct ObjectStoreBackend {
    inner: Arc<dyn ObjectStore>,
    root: String,
    display: String,
    identity: Option<String>,
    /// See [`EtagDialect`]; shared by clones, so what the probe learns on
    /// one handle holds for every handle of the store.
    unquoted: Arc<AtomicBool>,
}

impl ObjectStoreBackend {
    /// `root` is the key prefix inside the bucket ("" or e.g. "fleet-a");
    /// `display` is how the store is named in messages (a URL without
    /// credentials).
    pub fn new(inner: Arc<dyn ObjectStore>, root: &str, display: impl Into<String>) -> Self {
        ObjectStoreBackend {
            inner,
            root: root.trim_matches('/').to_string(),
            display: display.into(),
            identity: None,
            unquoted: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Sets the canonical identity ([`Store::identity`]): the URL with the
    /// endpoint or account it resolves to, normalised.
    pub fn with_identity(mut self, id: impl Into<String>) -> Self {
        self.identity = Some(id.into());
        self
    }

    /// Starts in `dialect` (see [`Store::set_etag_dialect`]).
    pub fn with_etag_dialect(self, dialect: EtagDialect) -> Self {
        self.unquoted
            .store(dialect == EtagDialect::Unquoted, Ordering::Relaxed);
        self
    }

    /// [`Version`] ETags are kept without quotes, because some services quote
    /// them in PUT and GET responses but not in listings (Azure Blob does),
    /// and expiry by observation compares versions from both. On the wire,
    /// If-None-Match gets the quotes back, as HTTP requires.
    fn wire(&self, etag: String) -> String {
        if !etag.starts_with('"') && !etag.starts_with("W/") {
            format!("\"{etag}\"")
        } else {
            etag
        }
    }

    /// An If-Match ETag in `form`, else the store's dialect ([`EtagDialect`]).
    fn wire_match(&self, etag: String, form: Option<EtagDialect>) -> String {
        let unquoted = match form {
            Some(f) => f == EtagDialect::Unquoted,
            None => self.unquoted.load(Ordering::Relaxed),
        };
        if unquoted {
            etag.trim_matches('"').to_string()
        } else {
            self.wire(etag)
        }
    }

    /// The in-memory backend (`memory://`).
    pub fn memory() -> Self {
        Self::new(
            Arc::new(object_store::memory::InMemory::new()),
            "",
            "memory://",
        )
    }

    fn path(&self, key: &str) -> Result<Path, StoreError> {
        check_key(key)?;
        let full = if self.root.is_empty() {
            key.to_string()
        } else {
            format!("{}/{}", self.root, key)
        };
        Path::parse(&full).map_err(|e| StoreError::Invalid {
            reason: e.to_string(),
        })
    }
}

impl fmt::Display for ObjectStoreBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

fn version(e_tag: Option<String>, version: Option<String>) -> Version {
    Version {
        etag: e_tag.map(|e| {
            e.strip_prefix('"')
                .and_then(|e| e.strip_suffix('"'))
                .map(str::to_string)
                .unwrap_or(e)
        }),
        version,
    }
}

/// Maps an object_store error. `write` selects how transport failures read:
/// on a write they are ambiguous (it may have landed), on a read merely
/// unavailable.
fn map_err(e: object_store::Error, write: bool) -> StoreError {
    use object_store::Error as E;
    match e {
        E::AlreadyExists { .. } => StoreError::AlreadyExists,
        E::Precondition { .. } => StoreError::Precondition,
        E::NotFound { .. } => StoreError::NotFound,
        E::PermissionDenied { source, .. } | E::Unauthenticated { source, .. } => {
            StoreError::Denied {
                message: redact(&source.to_string()),
            }
        }
        E::InvalidPath { source } => StoreError::Invalid {
            reason: source.to_string(),
        },
        E::NotSupported { source } => StoreError::NotSupported {
            message: redact(&source.to_string()),
        },
        E::NotImplemented { .. } => StoreError::NotSupported {
            message: "operation not implemented by this backend".into(),
        },
        other => {
            let message = redact(&error_chain(&other));
            // A response without the ETag header the protocol needs (some
            // emulators): not a transport failure, a store leasehold cannot
            // use, and the probe refuses it at the step that saw it.
            if message.contains("ETag Header missing") {
                return StoreError::NotSupported {
                    message: "the store returned no ETag (version) on a write or read".into(),
                };
            }
            // A 501 is definite (nothing was done), and permanent: the
            // request this protocol needs is not implemented there.
            // object_store keeps the status only in its message.
            if message.contains("status code: 501") {
                return StoreError::NotSupported {
                    message: "the store answered 501 Not Implemented".into(),
                };
            }
            if write {
                StoreError::Ambiguous { message }
            } else {
                StoreError::Unavailable { message }
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Removes query strings and user-info from any URL in `s`: SAS tokens and
/// presigned parameters live there, and error messages must not carry them.
pub fn redact(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find("://") {
        // Copy up to and including the scheme separator.
        out.push_str(&rest[..pos + 3]);
        rest = &rest[pos + 3..];
        let end = rest
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | '>' | ','))
            .unwrap_or(rest.len());
        let url = &rest[..end];
        let url = match url.rfind('@') {
            Some(at) if url[..at].find('/').is_none() => &url[at + 1..],
            _ => url,
        };
        match url.find('?') {
            Some(q) => {
                out.push_str(&url[..q]);
                out.push_str("?<redacted>");
            }
            None => out.push_str(url),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    strip_userinfo(&out)
}

/// Replaces `user:secret@` wherever it stands, with or without a scheme
/// before it (connection pools log bare authorities: `user:pw@host:9000`).
/// A token with an `@` but no `:` before it (an e-mail address) stays.
fn strip_userinfo(s: &str) -> String {
    let stop =
        |c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '(' | ',' | '/' | '=' | '[' | '<');
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('@') {
        let head = &rest[..at];
        let start = head.rfind(stop).map_or(0, |i| {
            i + head[i..].chars().next().map_or(1, char::len_utf8)
        });
        let token = &head[start..];
        if token.contains(':') {
            out.push_str(&head[..start]);
            out.push_str("<redacted>@");
        } else {
            out.push_str(head);
            out.push('@');
        }
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

#[async_trait]
impl Store for ObjectStoreBackend {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        let path = self.path(key)?;
        match self.inner.get_opts(&path, GetOptions::default()).await {
            Ok(r) => {
                if r.meta.size > MAX_READ_BYTES {
                    return Err(StoreError::Corrupt {
                        reason: format!(
                            "object is {} bytes, larger than any leasehold object ({MAX_READ_BYTES})",
                            r.meta.size
                        ),
                    });
                }
                let v = version(r.meta.e_tag.clone(), r.meta.version.clone());
                let bytes = r.bytes().await.map_err(|e| map_err(e, false))?;
                Ok(Some(Object { bytes, version: v }))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(map_err(e, false)),
        }
    }

    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        let Some(etag) = known.etag.clone() else {
            return Ok(match self.get(key).await? {
                Some(o) => Conditional::Changed(o),
                None => Conditional::Missing,
            });
        };
        let path = self.path(key)?;
        let opts = GetOptions {
            if_none_match: Some(self.wire(etag)),
            ..Default::default()
        };
        match self.inner.get_opts(&path, opts).await {
            Ok(r) => {
                if r.meta.size > MAX_READ_BYTES {
                    return Err(StoreError::Corrupt {
                        reason: format!("object is {} bytes", r.meta.size),
                    });
                }
                let v = version(r.meta.e_tag.clone(), r.meta.version.clone());
                let bytes = r.bytes().await.map_err(|e| map_err(e, false))?;
                Ok(Conditional::Changed(Object { bytes, version: v }))
            }
            Err(object_store::Error::NotModified { .. }) => Ok(Conditional::NotModified),
            Err(object_store::Error::NotFound { .. }) => Ok(Conditional::Missing),
            Err(e) => Err(map_err(e, false)),
        }
    }

    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        let path = self.path(key)?;
        let mode = match cond {
            Cond::Create => PutMode::Create,
            Cond::Match(v) => PutMode::Update(UpdateVersion {
                e_tag: v.etag.map(|e| self.wire_match(e, None)),
                version: v.version,
            }),
            Cond::MatchAs(v, d) => PutMode::Update(UpdateVersion {
                e_tag: v.etag.map(|e| self.wire_match(e, Some(d))),
                version: v.version,
            }),
        };
        let is_update = matches!(mode, PutMode::Update(_));
        let opts = PutOptions {
            mode,
            ..Default::default()
        };
        match self
            .inner
            .put_opts(&path, PutPayload::from_bytes(bytes), opts)
            .await
        {
            Ok(r) => Ok(version(r.e_tag, r.version)),
            // An If-Match on a missing object: some stores answer 404.
            Err(object_store::Error::NotFound { .. }) if is_update => Err(StoreError::Precondition),
            // A create cannot miss its object: a 404 here is the bucket or
            // container (S3 NoSuchBucket, Azure ContainerNotFound). Say so,
            // rather than "<key> not found".
            Err(object_store::Error::NotFound { .. }) => Err(StoreError::Invalid {
                reason: format!(
                    "the bucket or container of {} does not exist (a create answered 404)",
                    self.display
                ),
            }),
            Err(e) => Err(map_err(e, true)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        match self.inner.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(map_err(e, true)),
        }
    }

    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.list_from(prefix, None)
    }

    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.list_from(prefix, Some(after))
    }

    fn identity(&self) -> String {
        self.identity
            .clone()
            .unwrap_or_else(|| self.display.clone())
    }

    fn etag_dialect(&self) -> Option<EtagDialect> {
        Some(if self.unquoted.load(Ordering::Relaxed) {
            EtagDialect::Unquoted
        } else {
            EtagDialect::Quoted
        })
    }

    fn set_etag_dialect(&self, dialect: EtagDialect) -> bool {
        self.unquoted
            .store(dialect == EtagDialect::Unquoted, Ordering::Relaxed);
        true
    }
}

impl ObjectStoreBackend {
    /// A listing of `prefix`, from after `after` when given: object_store
    /// sends the offset to the service (S3 `start-after`, GCS
    /// `startOffset`, Azure `startFrom`), so the pages are only those after
    /// the cursor; the conformance suite checks the answer on each.
    fn list_from(
        &self,
        prefix: &str,
        after: Option<&str>,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        if let Err(e) = check_prefix(prefix) {
            return futures::stream::once(async move { Err(e) }).boxed();
        }
        // object_store lists whole path segments; list the directory that
        // contains the prefix and filter the rest client-side.
        let dir = match prefix.rfind('/') {
            Some(i) => &prefix[..i],
            None => "",
        };
        let full_dir = match (self.root.is_empty(), dir.is_empty()) {
            (true, _) => dir.to_string(),
            (false, true) => self.root.clone(),
            (false, false) => format!("{}/{}", self.root, dir),
        };
        let dir_path = if full_dir.is_empty() {
            None
        } else {
            Some(Path::from(full_dir))
        };
        let strip = if self.root.is_empty() {
            String::new()
        } else {
            format!("{}/", self.root)
        };
        let prefix = prefix.to_string();
        let inner = self.inner.clone();
        let stream = match after {
            None => inner.list(dir_path.as_ref()),
            Some(after) => {
                let full = if strip.is_empty() {
                    after.to_string()
                } else {
                    format!("{strip}{after}")
                };
                inner.list_with_offset(dir_path.as_ref(), &Path::from(full))
            }
        };
        stream
            .filter_map(move |r| {
                let out = match r {
                    Ok(meta) => {
                        let loc = meta.location.to_string();
                        match loc.strip_prefix(&strip) {
                            // A key `get` refuses (written by another
                            // tool): see the listing contract.
                            Some(k) if k.starts_with(&prefix) && check_key(k).is_err() => {
                                tracing::warn!(
                                    key = k,
                                    "skipping a key this store cannot address in listing"
                                );
                                None
                            }
                            Some(k) if k.starts_with(&prefix) => Some(Ok(Entry {
                                key: k.to_string(),
                                version: version(meta.e_tag, meta.version),
                                size: meta.size,
                                last_modified_ms: u64::try_from(
                                    meta.last_modified.timestamp_millis(),
                                )
                                .ok(),
                            })),
                            _ => None,
                        }
                    }
                    Err(e) => Some(Err(map_err(e, false))),
                };
                futures::future::ready(out)
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    /// A key another tool wrote that `get` refuses (longer than 1,024
    /// bytes: object_store escapes what else it could not name) is not
    /// listed: see the listing contract in `store`.
    #[tokio::test]
    async fn a_listing_holds_only_keys_get_accepts() {
        use crate::store::Store;
        use futures::StreamExt;
        use object_store::{ObjectStoreExt, memory::InMemory, path::Path};
        let inner = std::sync::Arc::new(InMemory::new());
        let long = format!("root/manifests/{}", "x".repeat(1100));
        for k in ["root/manifests/good", &long] {
            inner.put(&Path::from(k), "x".into()).await.unwrap();
        }
        let s = super::ObjectStoreBackend::new(inner, "root", "mem");
        let listed: Vec<String> = s.list("manifests/").map(|e| e.unwrap().key).collect().await;
        assert_eq!(listed, vec!["manifests/good".to_string()]);
    }

    #[test]
    fn redact_strips_query_and_userinfo() {
        let s = "error sending request for url (https://acct.blob.core.windows.net/c/k?sv=2020&sig=SECRET): timeout";
        let r = redact(s);
        assert!(!r.contains("SECRET"), "{r}");
        assert!(r.contains("https://acct.blob.core.windows.net/c/k?<redacted>"));
        let s = "http://user:pw@host:9000/b/k failed";
        assert_eq!(redact(s), "http://host:9000/b/k failed");
        assert_eq!(redact("no urls here"), "no urls here");
        // Bare authorities, as a connection pool logs them.
        assert_eq!(
            redact("checkout for (\"http\", user:pw@127.0.0.1:9)"),
            "checkout for (\"http\", <redacted>@127.0.0.1:9)"
        );
        assert_eq!(redact("mail ops@example.com"), "mail ops@example.com");
    }
}
