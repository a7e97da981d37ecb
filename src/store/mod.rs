//! The store layer: the narrow slice of an object store that leasehold needs.
//!
//! Every backend (S3 and S3-compatibles, Azure Blob, GCS, the in-memory store
//! and the local directory store) and every wrapper (fault injection, request
//! counting) implements [`Store`], and the shared conformance suite in
//! `testkit::conformance` (feature `testkit`) runs against each of them.
//!
//! # Contract
//!
//! - `put` with [`Cond::Create`] succeeds only if no object exists at the key;
//!   otherwise it fails with [`StoreError::AlreadyExists`] and changes nothing.
//! - `put` with [`Cond::Match`] succeeds only if the object's current version
//!   equals the given one; otherwise [`StoreError::Precondition`] and nothing
//!   changes. A missing object also answers `Precondition`.
//! - A successful `put` returns the new [`Version`], which differs from every
//!   earlier version of that key whenever the bytes differ. (Many S3-compatible
//!   stores use the body's MD5 as the ETag, so identical bytes may keep the
//!   version: callers that rely on a version change must change the bytes.)
//! - A `put` that fails for a transport reason (timeout, 5xx, reset) answers
//!   [`StoreError::Ambiguous`]: it may or may not have landed. Callers read back.
//! - `get` returns the bytes and version of one committed write, never a mix.
//! - `get_if_changed` answers `NotModified` when the version still matches.
//! - `list` returns every key under the prefix with its current version, in
//!   lexicographic order, paginating internally. `list_after` returns the
//!   part of that listing after a given key. A listing holds only keys
//!   this store's `get` accepts: an object under a name it cannot address
//!   (one that [`check_key`] or the store's own charset refuses, written
//!   behind its back) is skipped with a warning, since a key nobody can
//!   read would stop every caller that reads what it lists.
//! - Keys are relative, `/`-separated, non-empty segments without `.` or `..`.
//!
//! These properties are exactly what the store probe (`crate::probe`) checks on
//! a live store before trusting it.

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::fmt::{Debug, Display};

pub mod counting;
#[cfg(any(test, feature = "testkit"))]
pub mod fault;
pub mod local;
pub mod mem;
pub mod objstore;
pub mod open;
pub mod traced;

pub use counting::{BySegment, CountingStore, RequestCounts};
#[cfg(any(test, feature = "testkit"))]
pub use fault::{Fault, FaultPlan, FaultStore};
pub use local::{LOCAL_IDENTITY_PREFIX, LocalDirStore};
pub use mem::MemoryStore;
pub use objstore::ObjectStoreBackend;
pub use open::{OpenOptions, Raw, open_raw, open_store};
pub use traced::TracedStore;

/// The version of one committed write: the ETag and, where the store has one,
/// its version or generation (GCS fences on generations). Both are kept and
/// both are sent back on conditional writes.
///
/// Two versions are the same write when their ETags are equal, if both have
/// one; else when both fields are. The version field does not take part
/// when ETags are there because some listings omit it where reads carry it
/// (object_store's GCS listing has no generation; an S3 bucket with
/// versioning lists no version id), and expiry by observation compares a
/// listed version with a read one. Our records carry a fresh nonce in every
/// write, so an ETag never repeats across writes of a key (the store
/// contract).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Version {
    pub etag: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        match (&self.etag, &other.etag) {
            (Some(a), Some(b)) => a == b,
            _ => self.etag == other.etag && self.version == other.version,
        }
    }
}

impl Eq for Version {}

impl std::hash::Hash for Version {
    // Consistent with `eq`: equal versions with ETags share the ETag; equal
    // versions without share both fields.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        match &self.etag {
            Some(e) => e.hash(state),
            None => self.version.hash(state),
        }
    }
}

impl Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.etag, &self.version) {
            (Some(e), Some(v)) => write!(f, "{e} (version {v})"),
            (Some(e), None) => f.write_str(e),
            (None, Some(v)) => write!(f, "version {v}"),
            (None, None) => f.write_str("<no version>"),
        }
    }
}

/// The condition a write is made under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cond {
    /// Create-if-absent (`If-None-Match: *`).
    Create,
    /// Replace only this exact version (`If-Match`).
    Match(Version),
    /// As `Match`, with the ETag written in this form whatever the store's
    /// dialect ([`EtagDialect`]). Only the probe uses it: it tests a form
    /// for one request without switching the form that every other writer
    /// of the same handle is using. Stores without dialects treat it as
    /// `Match`.
    MatchAs(Version, EtagDialect),
}

impl Cond {
    /// The version an If-Match names (None for a create).
    pub fn version(&self) -> Option<&Version> {
        match self {
            Cond::Create => None,
            Cond::Match(v) | Cond::MatchAs(v, _) => Some(v),
        }
    }
}

/// One object as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub bytes: Bytes,
    pub version: Version,
}

/// One listed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key relative to the store's root (prefix removed).
    pub key: String,
    pub version: Version,
    pub size: u64,
    /// The store's own clock at the last write, in ms since the Unix epoch,
    /// where the store says. For the doctor's clock-offset estimate and for
    /// humans; never for safety.
    pub last_modified_ms: Option<u64>,
}

/// The answer to a conditional read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Conditional {
    NotModified,
    Changed(Object),
    Missing,
}

/// How a store wants the ETag of an If-Match written.
///
/// HTTP quotes entity tags (`If-Match: "abc"`), and most stores match only
/// that form. Ceph RGW 16 (and, by report, DigitalOcean Spaces and Hetzner)
/// match only the bare form. The probe learns which one a store speaks
/// (`crate::probe`): a 412 is a definite "not written", so trying the other
/// form after one is safe, and the probe then checks that a stale ETag is
/// refused in *both* forms, so learning a dialect never relaxes a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EtagDialect {
    /// `If-Match: "abc"`, as HTTP specifies.
    Quoted,
    /// `If-Match: abc` (Ceph RGW 16).
    Unquoted,
}

impl EtagDialect {
    pub fn as_str(self) -> &'static str {
        match self {
            EtagDialect::Quoted => "quoted",
            EtagDialect::Unquoted => "unquoted",
        }
    }
}

impl std::str::FromStr for EtagDialect {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "quoted" => Ok(EtagDialect::Quoted),
            "unquoted" => Ok(EtagDialect::Unquoted),
            other => Err(format!("{other:?} is not quoted or unquoted")),
        }
    }
}

// Defined beside `Error`, which wraps it: the error module depends on
// nothing, and every module (this one included) depends on it.
pub use crate::error::StoreError;

/// An object store as leasehold uses it. See the module docs for the contract.
#[async_trait]
pub trait Store: Send + Sync + Debug + Display + 'static {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError>;
    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError>;
    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError>;
    /// Unconditional delete; only garbage collection and probe clean-up use it.
    async fn delete(&self, key: &str) -> Result<(), StoreError>;
    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>>;

    /// The listing of `prefix` from after `after` (a whole key, which need
    /// not exist): exactly the entries of `list(prefix)` whose key sorts
    /// after it, in the same order (S3's `start-after`). The change feed
    /// reads from a cursor with it, so on S3 a pass pays for the hints after
    /// the cursor only. The default filters `list`; a backend whose service
    /// takes an offset overrides it, and wrappers forward it.
    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        use futures::TryStreamExt;
        let after = after.to_string();
        self.list(prefix)
            .try_filter(move |e| futures::future::ready(e.key.as_str() > after.as_str()))
            .boxed()
    }

    /// The store's canonical identity: equal for two handles on the same
    /// bucket and prefix however their URLs were spelled (trailing or
    /// doubled slashes, scheme aliases; for a directory, its device and
    /// inode). The host lock is keyed by it. Wrappers forward it. The default
    /// is the display name.
    fn identity(&self) -> String {
        self.to_string()
    }

    /// The form in which this store writes an If-Match ETag, or None for a
    /// store without HTTP ETags (the local directory store, the test
    /// doubles). Wrappers forward it.
    fn etag_dialect(&self) -> Option<EtagDialect> {
        None
    }

    /// Switches the If-Match form; false if the store has no such choice.
    /// Only the probe calls this, on evidence (see [`EtagDialect`]).
    fn set_etag_dialect(&self, _dialect: EtagDialect) -> bool {
        false
    }
}

/// A [`Store`] that sends every request on to another ([`Forward::inner`]),
/// changing only the methods it overrides. Every wrapper is one: tracing,
/// counting, the change feed's hints, fault injection, the tests' doubles.
/// A type that implements `Forward` is a `Store` (a blanket impl), so a
/// wrapper cannot forget a method: `list_after` (one that did not would
/// list a whole prefix where the service takes an offset), `identity` (the
/// host lock's key) and the ETag dialect (one that did not would hide Ceph
/// RGW's form from the probe, and every If-Match on RGW would fail) all
/// reach the inner store unless overridden.
///
/// # Contract
///
/// - Each method's default is the inner store's, called as it was called.
///   An override keeps `Store`'s contract for that method (the module docs).
/// - Methods are forwarded one by one: a wrapper that overrides `list`
///   alone sends `list_after` to the inner store's, unchanged. Override
///   both when the change must hold for the change feed's reads too.
/// - A method added to [`Store`] is added here too, with a forwarding
///   default; the blanket impl calls it.
/// - Implement it by path (`impl leasehold::store::Forward for X`), and do
///   not import it where `X`'s `Store` methods are called: both traits name
///   the same methods.
#[async_trait]
pub trait Forward: Send + Sync + Debug + Display + 'static {
    /// The store every request not overridden goes to.
    fn inner(&self) -> &dyn Store;

    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        self.inner().get(key).await
    }
    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        self.inner().get_if_changed(key, known).await
    }
    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        self.inner().put(key, bytes, cond).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner().delete(key).await
    }
    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.inner().list(prefix)
    }
    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        self.inner().list_after(prefix, after)
    }
    fn identity(&self) -> String {
        self.inner().identity()
    }
    fn etag_dialect(&self) -> Option<EtagDialect> {
        self.inner().etag_dialect()
    }
    fn set_etag_dialect(&self, dialect: EtagDialect) -> bool {
        self.inner().set_etag_dialect(dialect)
    }
}

#[async_trait]
impl<T: Forward> Store for T {
    async fn get(&self, key: &str) -> Result<Option<Object>, StoreError> {
        Forward::get(self, key).await
    }
    async fn get_if_changed(&self, key: &str, known: &Version) -> Result<Conditional, StoreError> {
        Forward::get_if_changed(self, key, known).await
    }
    async fn put(&self, key: &str, bytes: Bytes, cond: Cond) -> Result<Version, StoreError> {
        Forward::put(self, key, bytes, cond).await
    }
    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        Forward::delete(self, key).await
    }
    fn list(&self, prefix: &str) -> BoxStream<'static, Result<Entry, StoreError>> {
        Forward::list(self, prefix)
    }
    fn list_after(
        &self,
        prefix: &str,
        after: &str,
    ) -> BoxStream<'static, Result<Entry, StoreError>> {
        Forward::list_after(self, prefix, after)
    }
    fn identity(&self) -> String {
        Forward::identity(self)
    }
    fn etag_dialect(&self) -> Option<EtagDialect> {
        Forward::etag_dialect(self)
    }
    fn set_etag_dialect(&self, dialect: EtagDialect) -> bool {
        Forward::set_etag_dialect(self, dialect)
    }
}

/// Checks a key against the contract's shape. Stores call this before touching
/// anything, so a bad key is refused the same way everywhere.
pub fn check_key(key: &str) -> Result<(), StoreError> {
    let bad = |reason: &str| {
        Err(StoreError::Invalid {
            reason: format!("key {key:?} {reason}"),
        })
    };
    if key.is_empty() {
        return bad("is empty");
    }
    if key.len() > 1024 {
        return bad("is longer than 1024 bytes");
    }
    for seg in key.split('/') {
        if seg.is_empty() || seg == "." || seg == ".." {
            return bad("has an empty, '.' or '..' segment");
        }
        if seg.chars().any(|c| c.is_control() || c == '\\') {
            return bad("has a control character or backslash");
        }
    }
    Ok(())
}

/// Checks a listing prefix: empty, or a key optionally ending in `/`.
pub fn check_prefix(prefix: &str) -> Result<(), StoreError> {
    let trimmed = prefix.strip_suffix('/').unwrap_or(prefix);
    if trimmed.is_empty() {
        return Ok(());
    }
    check_key(trimmed)
}

#[cfg(test)]
mod tests {
    use super::Version;

    /// The methods declared in the block of this file that starts with
    /// `start`, up to the next line that is `}`.
    fn methods_in(start: &str) -> Vec<String> {
        let src = include_str!("mod.rs");
        let at = src.find(start).expect("block present");
        let block = &src[at..at + src[at..].find("\n}\n").expect("block end")];
        block
            .split("fn ")
            .skip(1)
            .map(|rest| rest.split('(').next().unwrap_or("").trim().to_string())
            .collect()
    }

    /// `Forward` forwards every method of `Store`: a method added to
    /// `Store` with a default but not here would silently take `Store`'s
    /// default in every wrapper (the ETag dialect was the example).
    #[test]
    fn forward_declares_and_forwards_every_store_method() {
        let store = methods_in("pub trait Store:");
        let forward = methods_in("pub trait Forward:");
        let blanket = methods_in("impl<T: Forward> Store for T {");
        assert!(store.len() >= 9, "{store:?}");
        assert_eq!(
            forward,
            std::iter::once("inner".to_string())
                .chain(store.iter().cloned())
                .collect::<Vec<_>>()
        );
        assert_eq!(blanket, store);
    }

    fn v(etag: Option<&str>, version: Option<&str>) -> Version {
        Version {
            etag: etag.map(str::to_string),
            version: version.map(str::to_string),
        }
    }

    /// A listing without the generation (GCS through object_store) shows the
    /// same write a read shows with it; different ETags never match; without
    /// ETags both fields decide.
    #[test]
    fn versions_match_by_etag_when_both_have_one() {
        assert_eq!(v(Some("a"), Some("17")), v(Some("a"), None));
        assert_ne!(v(Some("a"), Some("17")), v(Some("b"), Some("17")));
        assert_ne!(v(Some("a"), None), v(None, Some("17")));
        assert_eq!(v(None, Some("17")), v(None, Some("17")));
        assert_ne!(v(None, Some("17")), v(None, Some("18")));
        use std::collections::HashSet;
        let s: HashSet<Version> = [v(Some("a"), Some("1")), v(Some("a"), None)].into();
        assert_eq!(s.len(), 1, "hash agrees with eq");
    }
}
