//! The fenced lease: one object, changed only by compare-and-swap.
//!
//! See docs/protocol.md for the protocol as built. In short:
//!
//! - **acquire** is one create-if-absent on a fresh key. Otherwise it reads
//!   the record and takes over (If-Match, epoch + 1) only a released lease, a
//!   lease expired *by observation*, or one held by a dead earlier instance of
//!   this node on this host (proved by the [`HostLock`]). Else: `Held`.
//! - **renew** is one If-Match on the ETag of our last write, no read first.
//! - **release** writes a tombstone with the epoch unchanged; nothing is
//!   deleted, so epochs never restart.
//! - Every write carries a fresh nonce, so its bytes (and ETag) change, and an
//!   ambiguous or rejected write is read back: if the stored nonce is one we
//!   sent, the write is ours and committed; otherwise someone else won.
//!
//! # Time
//!
//! A holder believes it holds the lease until `t_sent + ttl - margin` on its
//! own monotonic clock, `t_sent` being when its last successful write was
//! *sent*. An observer calls a lease expired only once it has seen the same
//! version unchanged for `ttl + margin`, counted from when the response that
//! carried it *arrived*. The write landed after it was sent and before any
//! response showing it arrived, so the holder's belief always ends before the
//! observer's starts, whatever the wall clocks say; the margins absorb clock
//! rate drift (up to about `margin / ttl` relative).

use crate::clock::{Clock, Entropy, MonoTime, OsEntropy, SystemClock};
use crate::error::{Error, Result};
use crate::hostlock::HostLock;
use crate::name::Name;
use crate::record::{Holder, Kind, LeaseRecord, SCHEMA};
use crate::store::{Cond, Store, Version};
use backon::BackoffBuilder;
use bytes::Bytes;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Shortest TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The object key of a lease of `kind` named `name`.
pub fn key_for(kind: Kind, name: &Name) -> String {
    match kind {
        Kind::Lease => crate::keys::lease(name),
        Kind::Node => crate::keys::node(name),
    }
}

/// The default safety margin for a TTL: a tenth of it. It must cover the
/// relative drift between two machines' monotonic clocks (real clocks drift
/// by parts per million) plus the holder's reaction time.
pub fn default_margin(ttl: Duration) -> Duration {
    ttl / 10
}

/// What acquire asks for.
#[derive(Debug, Clone)]
pub struct AcquireOptions {
    pub ttl: Duration,
    /// Defaults to [`default_margin`].
    pub margin: Option<Duration>,
    pub address: Option<String>,
    pub attrs: serde_json::Map<String, serde_json::Value>,
}

impl AcquireOptions {
    pub fn ttl(ttl: Duration) -> Self {
        AcquireOptions {
            ttl,
            margin: None,
            address: None,
            attrs: Default::default(),
        }
    }

    fn validate(&self) -> Result<Duration> {
        // Durations compared, not milliseconds cast: a cast of a huge ttl
        // wraps (18446744073709552s passed as 384 ms).
        if self.ttl < MIN_TTL || self.ttl > Duration::from_millis(crate::record::MAX_TTL_MS) {
            return Err(Error::invalid(
                "ttl",
                format!("{:?} outside {:?}..=24h", self.ttl, MIN_TTL),
            ));
        }
        let margin = self.margin.unwrap_or_else(|| default_margin(self.ttl));
        if margin >= self.ttl / 2 {
            return Err(Error::invalid("margin", "must be less than half the ttl"));
        }
        Ok(margin)
    }
}

/// Why a held record may be taken over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Takeover {
    /// The record (not released) already names this very instance: another
    /// handle of ours, or an earlier acquire whose outcome we could not read
    /// back. A new tenure all the same, so a new epoch.
    Own,
    /// The holder released it.
    Released,
    /// Seen unchanged for ttl + margin.
    Expired,
    /// Held by an earlier instance of this node on this host that held the
    /// host lock, and we hold it now, so that instance is dead.
    PredecessorDead,
    /// The record went missing and the marker written in its place
    /// ([`LeaseRecord::vanished`]) has been seen unchanged for its ttl +
    /// margin: any holder whose record was deleted has stopped believing.
    Vanished,
}

/// The pure takeover rule. `observed_for` is how long this observer has seen
/// the record's current version unchanged (zero on first sight).
pub fn decide_takeover(
    current: &LeaseRecord,
    me: &Holder,
    my_lock: Option<&str>,
    observed_for: Duration,
    observer_margin: Duration,
) -> Option<Takeover> {
    use crate::liveness::{Evidence, Liveness, absent_long_enough, judge};
    // A vanished marker is absence, not a release: it is watched like an
    // unchanged version before anyone takes the lease again.
    if current.is_vanished() {
        let ttl = Duration::from_millis(current.ttl_ms);
        return absent_long_enough(observed_for, ttl, observer_margin)
            .then_some(Takeover::Vanished);
    }
    let liveness = judge(
        Some(current),
        None,
        Evidence::Observed {
            unchanged_for: observed_for,
            margin: observer_margin,
        },
    );
    // Released first: a tombstone ends a tenure, even our own, and the next
    // tenure must carry a higher fencing token.
    if matches!(liveness, Liveness::Released | Liveness::Fenced) {
        return Some(Takeover::Released);
    }
    if current.holder.instance == me.instance
        && current.holder.node == me.node
        && current.holder.host == me.host
    {
        return Some(Takeover::Own);
    }
    if let Some(lock) = my_lock
        && current.lock_id.as_deref() == Some(lock)
        && current.holder.node == me.node
        && current.holder.host == me.host
    {
        return Some(Takeover::PredecessorDead);
    }
    (liveness == Liveness::Expired).then_some(Takeover::Expired)
}

/// Expiry by observation: for each key, the version last seen and the
/// instant the response carrying it first arrived.
///
/// Kept by the key's first segment (`nodes/`, `sessions/`, ...; keys
/// without a `/` together): after each listing of `nodes/` (every pass of a
/// node) the keys under it are retained, and with one map that walked every
/// claim key in the fleet too, a tenth of an idle node's CPU at 100,000
/// sessions (issue #14).
#[derive(Debug, Default)]
pub struct Observer {
    seen: Mutex<HashMap<String, Seen>>,
}

type Seen = HashMap<String, (Version, MonoTime)>;

/// The segment `key` is kept under: up to and including its first `/`.
fn segment(key: &str) -> &str {
    key.find('/').map_or("", |i| &key[..=i])
}

impl Observer {
    fn with<T>(&self, key: &str, f: impl FnOnce(Option<&mut Seen>) -> T) -> T {
        let mut seen = self.seen.lock().unwrap();
        f(seen.get_mut(segment(key)))
    }

    /// Notes that `version` of `key` arrived at `arrived` (take it *after* the
    /// response is in hand), and returns how long that same version has been
    /// seen unchanged.
    pub fn observe(&self, key: &str, version: &Version, arrived: MonoTime) -> Duration {
        let mut seen = self.seen.lock().unwrap();
        let seg = segment(key);
        let map = match seen.get_mut(seg) {
            Some(m) => m,
            None => seen.entry(seg.to_string()).or_default(),
        };
        match map.get(key) {
            Some((v, first)) if v == version => arrived.saturating_since(*first),
            _ => {
                map.insert(key.to_string(), (version.clone(), arrived));
                Duration::ZERO
            }
        }
    }

    /// How long `key` has been seen at `version` unchanged as of `now`, or
    /// None if it was last seen at another version (or never).
    pub fn unchanged_for(&self, key: &str, version: &Version, now: MonoTime) -> Option<Duration> {
        self.with(key, |m| match m.and_then(|m| m.get(key)) {
            Some((v, first)) if v == version => Some(now.saturating_since(*first)),
            _ => None,
        })
    }

    /// The version of `key` seen last (by any response), if any.
    pub fn version(&self, key: &str) -> Option<Version> {
        self.with(key, |m| m.and_then(|m| m.get(key)).map(|(v, _)| v.clone()))
    }

    pub fn forget(&self, key: &str) {
        self.with(key, |m| m.map(|m| m.remove(key)));
    }

    /// After a complete listing of `prefix`: forgets the keys under it that
    /// the listing no longer shows, so a long-lived observer does not grow
    /// with every session that ever existed. Forgetting is conservative: a
    /// key that comes back starts a fresh observation. Only the segments
    /// that can hold keys under `prefix` are looked at: a key of segment
    /// `s` starts with `s`, so it can start with `prefix` only if one of the
    /// two starts with the other (keys without a `/`, segment "", always).
    pub fn retain_listed<S>(&self, prefix: &str, listed: &std::collections::HashSet<S>)
    where
        S: std::borrow::Borrow<str> + std::hash::Hash + Eq,
    {
        let mut seen = self.seen.lock().unwrap();
        for (seg, map) in seen.iter_mut() {
            if seg.starts_with(prefix) || prefix.starts_with(seg.as_str()) {
                map.retain(|k, _| !k.starts_with(prefix) || listed.contains(k.as_str()));
                // A map that once held every listed key and now holds a
                // few (`observe_listing_where`) gives its table back.
                crate::memory::shrink_if_sparse(map);
            }
        }
        // A segment nothing is observed under any more goes too (an
        // embedder may observe keys of any shape).
        seen.retain(|_, map| !map.is_empty());
    }

    /// How many keys are being observed.
    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().values().map(|m| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The answer to [`LeaseClient::acquire`].
// `Acquired` is the common answer and is moved straight out; boxing it would
// cost every caller an allocation and a deref for no benefit.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Acquire {
    Acquired(Lease),
    /// Someone else holds it.
    Held {
        holder: Holder,
        epoch: u64,
        /// How long this client has seen the record unchanged so far.
        observed_for: Duration,
        /// How much longer, if nothing changes, before it counts as expired.
        expires_after: Duration,
    },
    /// The lease has no record: never created ([`LeaseClient::create`]), or
    /// deleted, perhaps under a holder that still believes in it. A marker
    /// now stands in its place ([`LeaseRecord::vanished`]), and the lease can
    /// be acquired once this client has watched the marker unchanged for
    /// `expires_after` more (acquire again then, as for `Held`).
    Absent {
        /// The marker's epoch: the next holder's is higher.
        epoch: u64,
        observed_for: Duration,
        expires_after: Duration,
    },
}

/// A lease token for one-shot commands: enough to renew or release a lease
/// acquired by an earlier process. It names the holder instance and the
/// version of its last write; it carries no secret.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseToken {
    pub instance: String,
    pub version: Version,
    pub epoch: u64,
}

impl LeaseToken {
    pub fn encode(&self) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(self).expect("token serialises"))
    }

    pub fn decode(s: &str) -> Result<Self> {
        use base64::Engine;
        // The encoding is ours, not the user's business: say what is wrong
        // with the token in the user's terms, not base64's or serde's.
        let bad = |r: &str| Error::invalid("lease token", r.to_string());
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim())
            .map_err(|_| {
                bad("not a token printed by `leasehold lease acquire` or `renew` (mistyped or cut short?)")
            })?;
        serde_json::from_slice(&raw).map_err(|_| {
            bad("not a leasehold lease token (it decodes, but not to a token: from another tool?)")
        })
    }
}

struct Inner {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    entropy: Arc<dyn Entropy>,
    holder: Holder,
    host_lock: Option<Arc<HostLock>>,
    observer: Observer,
    /// New records start at `epoch_base + 1`; takeovers never go below it
    /// (see [`crate::fleet::marker::epoch_base`]).
    epoch_base: u64,
    /// Per key, the highest epoch and the longest ttl of any record this
    /// client has read or written there: what a vanished marker it writes
    /// carries, so that a deleted lease is neither waited for too briefly
    /// nor taken again at an epoch this client has already seen.
    known: Mutex<HashMap<String, Known>>,
}

/// See `Inner::known`.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    epoch: u64,
    ttl_ms: u64,
}

/// Acquires and inspects leases as one holder identity (node, host, instance).
/// Cheap to clone.
#[derive(Clone)]
pub struct LeaseClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseClient")
            .field("store", &self.inner.store.to_string())
            .field("holder", &self.inner.holder)
            .finish()
    }
}

/// Builds a [`LeaseClient`].
pub struct LeaseClientBuilder {
    store: Arc<dyn Store>,
    node: Name,
    host: Option<String>,
    instance: Option<String>,
    clock: Option<Arc<dyn Clock>>,
    entropy: Option<Arc<dyn Entropy>>,
    host_lock: Option<Arc<HostLock>>,
    epoch_base: u64,
}

impl LeaseClientBuilder {
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }
    /// Adopt an existing instance id (one-shot commands resuming a token).
    pub fn instance(mut self, id: impl Into<String>) -> Self {
        self.instance = Some(id.into());
        self
    }
    pub fn clock(mut self, c: Arc<dyn Clock>) -> Self {
        self.clock = Some(c);
        self
    }
    pub fn entropy(mut self, e: Arc<dyn Entropy>) -> Self {
        self.entropy = Some(e);
        self
    }
    /// Epochs of this client's new records start above `base`: the fleet
    /// marker's generation ([`crate::fleet::marker::epoch_base`]), so tokens
    /// made after a wipe and a new `init` are higher than any before it.
    pub fn epoch_base(mut self, base: u64) -> Self {
        self.epoch_base = base;
        self
    }
    /// With the host lock, leases held by an earlier instance of this node on
    /// this host are taken over at once.
    pub fn host_lock(mut self, l: impl Into<Arc<HostLock>>) -> Self {
        self.host_lock = Some(l.into());
        self
    }
    pub fn build(self) -> Result<LeaseClient> {
        let entropy = self.entropy.unwrap_or_else(|| Arc::new(OsEntropy::new()));
        let host = match (self.host, &self.host_lock) {
            (Some(h), Some(l)) if h != l.host() => {
                return Err(Error::invalid("host", "differs from the host lock's host"));
            }
            (Some(h), _) => h,
            (None, Some(l)) => l.host().to_string(),
            (None, None) => crate::hostlock::hostname(),
        };
        let holder = Holder {
            node: self.node.to_string(),
            host,
            instance: self.instance.unwrap_or_else(|| entropy.hex_id()),
        };
        if holder.instance == crate::record::PLACEHOLDER_INSTANCE {
            return Err(Error::invalid(
                "holder identity",
                "instance \"queued\" names placeholders, never a process",
            ));
        }
        let probe = LeaseRecord {
            schema: SCHEMA.into(),
            kind: Kind::Lease,
            holder: holder.clone(),
            epoch: 1,
            ttl_ms: 1000,
            renewed_at_ms: 0,
            released: false,
            host_locked: false,
            lock_id: None,
            address: None,
            attrs: Default::default(),
            nonce: "x".into(),
        };
        probe
            .validate()
            .map_err(|r| Error::invalid("holder identity", r))?;
        // Every new record starts at the base + 1 (a floor read from the
        // bucket's marker, so bounded on decode): one at the highest epoch
        // leaves no token to issue.
        if crate::record::next_epoch(self.epoch_base).is_none() {
            return Err(Error::invalid(
                "epoch base",
                "at the highest epoch: no fencing token above it exists",
            ));
        }
        Ok(LeaseClient {
            inner: Arc::new(Inner {
                store: self.store,
                clock: self.clock.unwrap_or_else(|| Arc::new(SystemClock::new())),
                entropy,
                holder,
                host_lock: self.host_lock,
                observer: Observer::default(),
                epoch_base: self.epoch_base,
                known: Default::default(),
            }),
        })
    }
}

/// The error for a write whose read-back shows it did not land: transient,
/// and safe to retry (a late landing is recognised by its nonce).
fn not_landed(op: &'static str, key: &str, advice: &str) -> Error {
    Error::Unavailable {
        op,
        key: key.to_string(),
        source: crate::store::StoreError::Unavailable {
            message: format!("the {op} did not land; {advice}"),
        },
    }
}

/// One attempted write: its nonce and when it was sent.
#[derive(Debug, Clone)]
struct Attempt {
    nonce: String,
    sent: MonoTime,
}

/// The outcome of a write after any read-back.
enum Written {
    Committed {
        version: Version,
        sent: MonoTime,
        record: LeaseRecord,
    },
    /// Someone else's write is in place (or the object is gone).
    Rejected {
        current: Option<(LeaseRecord, Version, MonoTime)>,
    },
    /// The write failed in transport and the read-back shows it did not land
    /// (yet). Retrying is safe: a late landing is recognised by its nonce.
    NotLanded,
}

impl LeaseClient {
    pub fn builder(store: Arc<dyn Store>, node: Name) -> LeaseClientBuilder {
        LeaseClientBuilder {
            store,
            node,
            host: None,
            instance: None,
            clock: None,
            entropy: None,
            host_lock: None,
            epoch_base: 0,
        }
    }

    pub fn holder(&self) -> &Holder {
        &self.inner.holder
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }

    pub fn observer(&self) -> &Observer {
        &self.inner.observer
    }

    fn new_record(&self, kind: Kind, epoch: u64, opts: &AcquireOptions) -> LeaseRecord {
        LeaseRecord {
            schema: SCHEMA.into(),
            kind,
            holder: self.inner.holder.clone(),
            epoch,
            ttl_ms: opts.ttl.as_millis() as u64,
            renewed_at_ms: self.inner.clock.wall_ms(),
            released: false,
            host_locked: self.inner.host_lock.is_some(),
            lock_id: self.inner.host_lock.as_ref().map(|l| l.id().to_string()),
            address: opts.address.clone(),
            attrs: opts.attrs.clone(),
            nonce: self.inner.entropy.hex_id(),
        }
    }

    /// Reads and decodes a lease record; `None` if there is no object.
    pub async fn read(
        &self,
        kind: Kind,
        name: &Name,
    ) -> Result<Option<(LeaseRecord, Version, MonoTime)>> {
        self.read_key(kind, &key_for(kind, name)).await
    }

    async fn read_key(
        &self,
        kind: Kind,
        key: &str,
    ) -> Result<Option<(LeaseRecord, Version, MonoTime)>> {
        let obj = self
            .inner
            .store
            .get(key)
            .await
            .map_err(|e| Error::from_store("get", key, e))?;
        // The arrival instant: taken after the response is in hand.
        let arrived = self.inner.clock.now();
        match obj {
            None => Ok(None),
            Some(o) => {
                let rec = LeaseRecord::decode(key, &o.bytes, kind)?;
                self.note(key, &rec);
                Ok(Some((rec, o.version, arrived)))
            }
        }
    }

    /// Remembers `rec`'s epoch and ttl for `key` (see `Inner::known`).
    fn note(&self, key: &str, rec: &LeaseRecord) {
        let mut known = self.inner.known.lock().unwrap();
        let k = known.entry(key.to_string()).or_default();
        k.epoch = k.epoch.max(rec.epoch);
        if !rec.is_placeholder() || rec.is_vanished() {
            k.ttl_ms = k.ttl_ms.max(rec.ttl_ms);
        }
    }

    fn known(&self, key: &str) -> Known {
        self.inner
            .known
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or_default()
    }

    /// The marker this client writes where `key`'s record is missing: at the
    /// highest epoch it knows (at least `floor`), with the longest ttl it
    /// knows (at least `ttl`).
    fn vanished_marker(&self, key: &str, floor: u64, ttl: Duration) -> LeaseRecord {
        let k = self.known(key);
        LeaseRecord::vanished(
            k.epoch.max(floor).max(self.inner.epoch_base),
            k.ttl_ms.max(ttl.as_millis() as u64),
            self.inner.entropy.hex_id(),
            self.inner.clock.wall_ms(),
        )
    }

    /// Our marker (written or raised) landed at `version`: watched from the
    /// arrival of the response that showed it (ours, which came after it
    /// landed), and the whole wait is ahead.
    fn marker_written(&self, key: &str, version: &Version, marker: &LeaseRecord) -> Acquire {
        let arrived = self.inner.clock.now();
        self.inner.observer.observe(key, version, arrived);
        let ttl = Duration::from_millis(marker.ttl_ms);
        tracing::debug!(key, epoch = marker.epoch, "vanished marker written");
        Acquire::Absent {
            epoch: marker.epoch,
            observed_for: Duration::ZERO,
            expires_after: ttl + default_margin(ttl),
        }
    }

    /// Declares the standalone lease `leases/<name>` (`leasehold lease
    /// create`): writes its placeholder if the key has no object, so the
    /// first acquire takes it at once. Returns whether this call created it.
    ///
    /// Declaring asserts that the name is new. Without a declaration a
    /// missing record is taken for a deleted one, and the first acquire
    /// waits out a ttl + margin (see [`Acquire::Absent`]); after a deletion
    /// of a held lease, declaring it again would let an acquire take it while
    /// the deleted holder still believes, and restart its epochs (as a new
    /// generation would, without the generation's higher base).
    pub async fn create(&self, name: &Name) -> Result<bool> {
        let key = key_for(Kind::Lease, name);
        let rec = LeaseRecord::declared(
            self.inner.epoch_base,
            self.inner.entropy.hex_id(),
            self.inner.clock.wall_ms(),
        );
        let encoded = rec.encode()?;
        match self
            .inner
            .store
            .put(&key, Bytes::from(encoded.clone()), Cond::Create)
            .await
        {
            Ok(_) => Ok(true),
            Err(crate::store::StoreError::AlreadyExists) => Ok(false),
            Err(crate::store::StoreError::Ambiguous { .. }) => {
                // Landed or not? Read back: our bytes (with their nonce)
                // mean this call created it.
                match self.inner.store.get(&key).await {
                    Ok(Some(o)) => Ok(o.bytes.as_ref() == encoded.as_slice()),
                    Ok(None) => Err(not_landed("create", &key, "try again")),
                    Err(e) => Err(Error::from_store("get", &key, e)),
                }
            }
            Err(e) => Err(Error::from_store("put", &key, e)),
        }
    }

    /// A holder found its record gone or replaced by a marker below its
    /// epoch: writes (or raises) the marker to its epoch, so the next holder's
    /// token is above every token this one handed out. Best effort: a failure
    /// is logged (the marker of whoever finds the key missing next stands).
    async fn keep_epoch(
        &self,
        key: &str,
        epoch: u64,
        ttl_ms: u64,
        current: Option<(LeaseRecord, Version)>,
    ) {
        let marker = self.vanished_marker(key, epoch, Duration::from_millis(ttl_ms));
        let cond = match current {
            None => Cond::Create,
            Some((rec, version)) if rec.is_vanished() && rec.epoch < epoch => Cond::Match(version),
            Some(_) => return,
        };
        let Ok(bytes) = marker.encode() else { return };
        match self.inner.store.put(key, Bytes::from(bytes), cond).await {
            Ok(_) => tracing::warn!(
                key,
                epoch,
                "lease record vanished; marker written at its epoch"
            ),
            Err(e) => {
                tracing::warn!(key, epoch, error = %e, "lease record vanished; could not write its marker")
            }
        }
    }

    /// Writes `record` under `cond` and resolves every non-success by reading
    /// back: a stored nonce matching any of `attempts` means the write (or an
    /// earlier attempt of the same operation) is ours and committed.
    async fn write(
        &self,
        key: &str,
        record: LeaseRecord,
        cond: Cond,
        attempts: &mut Vec<Attempt>,
    ) -> Result<Written> {
        let bytes = Bytes::from(record.encode()?);
        let sent = self.inner.clock.now();
        let cond_version = cond.version().cloned();
        attempts.push(Attempt {
            nonce: record.nonce.clone(),
            sent,
        });
        use crate::checked::{self, Failure, Outcome};
        let failure = match self.inner.store.put(key, bytes, cond).await {
            Ok(version) => {
                self.note(key, &record);
                return Ok(Written::Committed {
                    version,
                    sent,
                    record,
                });
            }
            Err(e) => {
                if let crate::store::StoreError::Ambiguous { message } = &e {
                    tracing::debug!(key, %message, "ambiguous write; reading back");
                }
                Failure::of(e).map_err(|e| Error::from_store("put", key, e))?
            }
        };
        // Read back. A failure here leaves the outcome unknown: report it as
        // transient, and the next attempt will recognise a late landing. Ours
        // is our holder with the nonce of any attempt of this operation.
        let current = self.read_key(record.kind, key).await?;
        let ours = current.as_ref().and_then(|(rec, _, _)| {
            (rec.holder == self.inner.holder)
                .then(|| attempts.iter().find(|a| a.nonce == rec.nonce))
                .flatten()
        });
        let read = checked::read_back(
            ours.is_some(),
            current.as_ref().map(|(_, v, _)| v),
            cond_version.as_ref(),
        );
        match (checked::outcome(failure, read), ours, current) {
            (Outcome::Committed, Some(a), Some((rec, version, _))) => Ok(Written::Committed {
                version,
                sent: a.sent,
                record: rec,
            }),
            (Outcome::Rejected, _, current) => Ok(Written::Rejected { current }),
            _ => Ok(Written::NotLanded),
        }
    }

    fn lease(
        &self,
        key: String,
        record: LeaseRecord,
        version: Version,
        sent: MonoTime,
        margin: Duration,
    ) -> Lease {
        let ttl = Duration::from_millis(record.ttl_ms);
        Lease {
            client: self.clone(),
            key,
            valid_until: sent + ttl.saturating_sub(margin),
            record,
            version,
            margin,
            state: State::Held,
            pending: Vec::new(),
            created: false,
            replaced: None,
        }
    }

    /// Acquires the standalone lease `leases/<name>`.
    pub async fn acquire(&self, name: &Name, opts: &AcquireOptions) -> Result<Acquire> {
        self.acquire_kind(Kind::Lease, name, opts).await
    }

    /// Acquires the lease of `kind` named `name`.
    ///
    /// A standalone lease: a read, then one If-Match write if a takeover is
    /// allowed; losing that final write is [`Error::Conflict`]. A missing
    /// record is never taken for a fresh key (it may have been deleted under
    /// a holder that still believes): a marker is written in its place and
    /// the answer is [`Acquire::Absent`] until the marker has been watched
    /// for its ttl + margin. [`LeaseClient::create`] declares a new name so
    /// that its first acquire is immediate.
    ///
    /// A node lease keeps one round trip on a fresh key (create-if-absent):
    /// the fleet judges a missing node record by observation itself, and
    /// claims name the node's instance, never its epoch.
    #[tracing::instrument(level = "debug", name = "lease acquire", skip_all, fields(kind = ?kind, name = %name))]
    pub async fn acquire_kind(
        &self,
        kind: Kind,
        name: &Name,
        opts: &AcquireOptions,
    ) -> Result<Acquire> {
        let margin = opts.validate()?;
        let key = key_for(kind, name);
        let mut attempts = Vec::new();
        // Refuse what could never be written (attributes too large, say)
        // before any request.
        self.new_record(kind, self.inner.epoch_base + 1, opts)
            .encode()?;
        let current = if kind == Kind::Lease {
            match self.read_key(kind, &key).await? {
                Some(c) => Some(c),
                None => {
                    let marker = self.vanished_marker(&key, 0, opts.ttl);
                    match self
                        .write(&key, marker, Cond::Create, &mut attempts)
                        .await?
                    {
                        Written::Committed {
                            version, record, ..
                        } => return Ok(self.marker_written(&key, &version, &record)),
                        Written::Rejected { current } => current,
                        Written::NotLanded => {
                            return Err(not_landed("vanished marker", &key, "try again"));
                        }
                    }
                }
            }
        } else {
            let fresh = self.new_record(kind, self.inner.epoch_base + 1, opts);
            match self.write(&key, fresh, Cond::Create, &mut attempts).await? {
                Written::Committed {
                    version,
                    sent,
                    record,
                } => {
                    let mut lease = self.lease(key, record, version, sent, margin);
                    lease.created = true;
                    return Ok(Acquire::Acquired(lease));
                }
                Written::Rejected { current } => current,
                Written::NotLanded => return Err(not_landed("create", &key, "try again")),
            }
        };
        let Some((rec, version, arrived)) = current else {
            // Rejected, yet nothing there: deleted in between (garbage
            // collection). Report a conflict rather than loop.
            return Err(Error::Conflict { key });
        };
        let known = self.known(&key);
        if rec.is_vanished() && (known.epoch > rec.epoch || known.ttl_ms > rec.ttl_ms) {
            // The marker's writer knew less than we do (a lower epoch, a
            // shorter ttl): raise it, so that whoever takes the lease next
            // goes above every epoch we saw and waits long enough. A new
            // version: every watcher starts again.
            let marker = self.vanished_marker(&key, known.epoch, opts.ttl);
            return match self
                .write(&key, marker, Cond::Match(version), &mut attempts)
                .await?
            {
                Written::Committed {
                    version, record, ..
                } => Ok(self.marker_written(&key, &version, &record)),
                Written::Rejected { .. } => Err(Error::Conflict { key }),
                Written::NotLanded => Err(not_landed("vanished marker", &key, "try again")),
            };
        }
        let observed_for = self.inner.observer.observe(&key, &version, arrived);
        // A marker is watched for the longest ttl this client knows for the
        // key, its own included, if that is longer than the marker says: the
        // marker's writer may have known less.
        let mut judged = rec.clone();
        if judged.is_vanished() {
            judged.ttl_ms = judged
                .ttl_ms
                .max(known.ttl_ms)
                .max(opts.ttl.as_millis() as u64);
        }
        let observer_margin = default_margin(Duration::from_millis(judged.ttl_ms));
        let Some(why) = decide_takeover(
            &judged,
            &self.inner.holder,
            self.inner.host_lock.as_ref().map(|l| l.id()),
            observed_for,
            observer_margin,
        ) else {
            let need = Duration::from_millis(judged.ttl_ms) + observer_margin;
            if rec.is_vanished() {
                return Ok(Acquire::Absent {
                    epoch: rec.epoch,
                    observed_for,
                    expires_after: need.saturating_sub(observed_for),
                });
            }
            return Ok(Acquire::Held {
                holder: rec.holder,
                epoch: rec.epoch,
                observed_for,
                expires_after: need.saturating_sub(observed_for),
            });
        };
        // Every new tenure gets a new fencing token. (Our own retried create,
        // recognised by its nonce, never reaches here: it is committed.)
        // Above every epoch this client has seen here too: a record made
        // again after a deletion may carry less than the one deleted.
        let Some(epoch) = crate::record::next_epoch(rec.epoch.max(known.epoch)) else {
            return Err(Error::corrupt(
                &key,
                "epoch at its maximum: no higher token exists".to_string(),
            ));
        };
        let epoch = epoch.max(self.inner.epoch_base + 1);
        tracing::debug!(key, ?why, epoch, "taking over");
        let replaced = rec.clone();
        let next = self.new_record(kind, epoch, opts);
        match self
            .write(&key, next, Cond::Match(version), &mut attempts)
            .await?
        {
            Written::Committed {
                version,
                sent,
                record,
            } => {
                self.inner.observer.forget(&key);
                let mut lease = self.lease(key, record, version, sent, margin);
                lease.replaced = Some(Box::new(replaced));
                Ok(Acquire::Acquired(lease))
            }
            Written::Rejected { .. } => Err(Error::Conflict { key }),
            Written::NotLanded => Err(not_landed("takeover", &key, "try again")),
        }
    }

    /// Picks up a lease from a token issued to an earlier process (a one-shot
    /// `leasehold lease acquire`). The returned lease acts as the holder named
    /// in the record, once the record's instance and version match the token.
    /// Its validity is unknown until the next successful renew (we do not
    /// know when the last write was sent), so [`Lease::is_valid`] is false
    /// until then.
    pub async fn resume(&self, kind: Kind, name: &Name, token: &LeaseToken) -> Result<Lease> {
        let key = key_for(kind, name);
        let current = self.read_key(kind, &key).await?;
        let deleted = match &current {
            None => kind == Kind::Lease,
            Some((rec, _, _)) => rec.is_vanished(),
        };
        if deleted {
            // Deleted under this token's holder: lost, and the token's epoch
            // goes on the marker (raised, or created where none is yet), so
            // that no later holder reuses it. The watch is the acquirers' to
            // lengthen (this one-shot client knows no ttl, so a marker it
            // creates says 1 ms): the only holder of this epoch is the
            // caller, who is told it lost before any taker can have watched.
            match current {
                Some((rec, version, _)) => {
                    let ttl = rec.ttl_ms;
                    self.keep_epoch(&key, token.epoch, ttl, Some((rec, version)))
                        .await
                }
                None => self.keep_epoch(&key, token.epoch, 1, None).await,
            }
            return Err(Error::Lost {
                key,
                epoch: token.epoch,
                reason: "the record was deleted (a marker stands in its place)".into(),
            });
        }
        let Some((rec, version, _)) = current else {
            return Err(Error::NotFound { key });
        };
        if rec.holder.instance == token.instance && rec.released {
            return Err(Error::Lost {
                key,
                epoch: rec.epoch,
                reason: "already released (by this holder)".into(),
            });
        }
        if rec.holder.instance == token.instance && version != token.version {
            // Our own later write (a renew printed a newer token): whoever
            // holds this token must not act on it (fenced), but the message
            // says what happened: not another holder, a newer token.
            return Err(Error::Lost {
                key,
                epoch: token.epoch,
                reason: format!(
                    "this token is stale: the same holder renewed since (epoch {}); use the token from the last renew",
                    rec.epoch
                ),
            });
        }
        if rec.holder.instance != token.instance {
            return Err(Error::Lost {
                key,
                epoch: token.epoch,
                reason: format!(
                    "the lease changed hands since the token was issued (now epoch {} held by {}/{}{})",
                    rec.epoch,
                    rec.holder.node,
                    rec.holder.instance,
                    if rec.released { ", released" } else { "" }
                ),
            });
        }
        if rec.released {
            return Err(Error::Lost {
                key,
                epoch: rec.epoch,
                reason: "already released".into(),
            });
        }
        // Act as the record's holder exactly (node, host, instance), so that
        // read-backs recognise our writes; the token proved the instance.
        let as_holder = LeaseClient {
            inner: Arc::new(Inner {
                store: self.inner.store.clone(),
                clock: self.inner.clock.clone(),
                entropy: self.inner.entropy.clone(),
                holder: rec.holder.clone(),
                host_lock: None,
                observer: Observer::default(),
                epoch_base: self.inner.epoch_base,
                known: Default::default(),
            }),
        };
        let margin = default_margin(Duration::from_millis(rec.ttl_ms));
        let mut l = as_holder.lease(key, rec, version, MonoTime::ZERO, margin);
        l.valid_until = MonoTime::ZERO;
        l.state = State::Resumed;
        Ok(l)
    }

    /// Lists `prefix` and feeds every version seen to the observer; returns
    /// the entries. Listings carry ETags, so expiry by observation costs no
    /// extra requests.
    pub async fn observe_listing(&self, prefix: &str) -> Result<Vec<crate::store::Entry>> {
        self.observe_listing_where(prefix, |_| true).await
    }

    /// As [`observe_listing`](Self::observe_listing), but an entry for which
    /// `watch` answers false is not observed, and what was observed of its
    /// key is forgotten.
    ///
    /// Why: a caller that will never judge a version by how long it stood
    /// (a fleet node's view of a live claim: only a vanished claim's marker
    /// is ever waited out) need not keep an observation per listed key. At
    /// 100,000 sessions those were a sixth of a node's heap (issue #14).
    /// Forgetting is conservative as everywhere here: a version observed
    /// again starts a fresh observation. So `watch` must answer true for
    /// any version it does not know to be one it will never judge.
    pub async fn observe_listing_where(
        &self,
        prefix: &str,
        watch: impl FnMut(&crate::store::Entry) -> bool,
    ) -> Result<Vec<crate::store::Entry>> {
        let mut out = Vec::new();
        self.observe_listing_each(prefix, watch, |e| out.push(e))
            .await?;
        Ok(out)
    }

    /// As [`observe_listing_where`](Self::observe_listing_where), but each
    /// entry is handed to `each` as it is listed instead of being collected.
    ///
    /// Why: a fleet node's full listing at 100,000 sessions collected
    /// 200,000 entries (key, ETag, size, time: about 180 bytes each) to
    /// compare them with its caches, which lifted a node 30-50 MB above its
    /// steady size while it ran (issue #14). A caller that keeps only what
    /// differs from what it knows needs none of that.
    pub async fn observe_listing_each(
        &self,
        prefix: &str,
        mut watch: impl FnMut(&crate::store::Entry) -> bool,
        mut each: impl FnMut(crate::store::Entry),
    ) -> Result<()> {
        let mut s = self.inner.store.list(prefix);
        // The keys observed: the observer forgets every other key under
        // `prefix` (unlisted or declined) once the listing is complete.
        let mut keep: std::collections::HashSet<String> = Default::default();
        while let Some(e) = s.next().await {
            // An in-memory or local listing yields every page at once: a
            // yield point now and then (tokio's coop budget) keeps a long
            // listing from holding its thread (see the node's pass).
            tokio::task::coop::consume_budget().await;
            let e = e.map_err(|e| Error::from_store("list", prefix, e))?;
            if watch(&e) {
                // Taken as each entry is yielded, which is no earlier than
                // the arrival of the page carrying it: conservative.
                let arrived = self.inner.clock.now();
                self.inner.observer.observe(&e.key, &e.version, arrived);
                keep.insert(e.key.clone());
            }
            each(e);
        }
        // One pass under the observer's lock forgets both what the listing
        // no longer shows and what `watch` declined. Only after the last
        // page: a listing that fails half-way forgets nothing.
        self.inner.observer.retain_listed(prefix, &keep);
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Held,
    /// From a token: validity unknown until renewed.
    Resumed,
    Lost,
    Released,
}

/// A lease this process holds (or held). Renew it every ttl/3 or so.
///
/// Dropping a `Lease` does not release it (that needs a write); the lease then
/// expires by observation after its TTL.
#[derive(Debug)]
pub struct Lease {
    client: LeaseClient,
    key: String,
    record: LeaseRecord,
    version: Version,
    valid_until: MonoTime,
    margin: Duration,
    state: State,
    /// Attempts of the renew in progress, to recognise a late landing.
    pending: Vec<Attempt>,
    /// Acquired by creating a record where none was: nothing proves that
    /// an earlier holder (whose record was deleted) has stopped.
    created: bool,
    /// The record this lease's takeover replaced, if it was a takeover.
    replaced: Option<Box<LeaseRecord>>,
}

impl Lease {
    /// Whether this lease was acquired by creating its record where none
    /// was (rather than by taking over a released, expired or proven-dead
    /// holder's). A node whose record was deleted under it may still be
    /// running until its own deadline: see the fleet's predecessor rule.
    pub fn created(&self) -> bool {
        self.created
    }

    /// The record a takeover replaced (None when created, or resumed).
    pub fn replaced(&self) -> Option<&LeaseRecord> {
        self.replaced.as_deref()
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: hand it to whatever this holder drives, so that
    /// downstream systems can refuse a stale holder.
    pub fn epoch(&self) -> u64 {
        self.record.epoch
    }

    pub fn record(&self) -> &LeaseRecord {
        &self.record
    }

    pub fn version(&self) -> &Version {
        &self.version
    }

    /// The end of validity on this process's monotonic clock.
    pub fn valid_until(&self) -> MonoTime {
        self.valid_until
    }

    /// True while this holder may act on the lease: held, and before the
    /// validity deadline. Check it before every fenced action.
    pub fn is_valid(&self) -> bool {
        self.state == State::Held && self.client.inner.clock.now() < self.valid_until
    }

    /// Time left before the validity deadline.
    pub fn remaining(&self) -> Duration {
        if self.state != State::Held {
            return Duration::ZERO;
        }
        self.valid_until
            .saturating_since(self.client.inner.clock.now())
    }

    pub fn token(&self) -> LeaseToken {
        LeaseToken {
            instance: self.record.holder.instance.clone(),
            version: self.version.clone(),
            epoch: self.record.epoch,
        }
    }

    fn lost(&mut self, reason: impl Into<String>) -> Error {
        self.state = State::Lost;
        Error::Lost {
            key: self.key.clone(),
            epoch: self.record.epoch,
            reason: reason.into(),
        }
    }

    /// One renew attempt: one If-Match write, no read first (a read-back only
    /// when the write is rejected or ambiguous).
    ///
    /// - `Ok(())`: renewed; validity now runs from this write's send time.
    /// - `Err(Lost)`: another writer won, or the deadline passed. Stop acting.
    /// - a transient error: the outcome is not known; try again before the
    ///   deadline ([`Lease::renew`] does).
    #[tracing::instrument(level = "debug", name = "lease renew", skip_all)]
    pub async fn renew_once(&mut self) -> Result<()> {
        self.write_update(|_| {}).await
    }

    /// Replaces the record's attributes, fenced by If-Match (and renewing).
    pub async fn set_attrs(
        &mut self,
        attrs: serde_json::Map<String, serde_json::Value>,
    ) -> Result<()> {
        let size: usize = serde_json::to_vec(&attrs).map(|v| v.len()).unwrap_or(0);
        if size > crate::record::MAX_RECORD_BYTES {
            return Err(Error::TooLarge {
                what: "lease attributes".into(),
                size,
                limit: crate::record::MAX_RECORD_BYTES,
            });
        }
        self.write_update(move |r| r.attrs = attrs).await
    }

    async fn write_update(&mut self, edit: impl FnOnce(&mut LeaseRecord)) -> Result<()> {
        match self.state {
            State::Held | State::Resumed => {}
            State::Lost => return Err(self.lost("already lost")),
            State::Released => return Err(self.lost("already released")),
        }
        let clock = self.client.inner.clock.clone();
        if self.state == State::Held && clock.now() >= self.valid_until {
            return Err(self.lost("validity deadline passed before a renew succeeded"));
        }
        let mut next = self.record.clone();
        edit(&mut next);
        next.nonce = self.client.inner.entropy.hex_id();
        next.renewed_at_ms = clock.wall_ms();
        // Whoever writes says whether it holds the host lock (a resumed
        // one-shot holder does not, even if the node that acquired did).
        next.host_locked = self.client.inner.host_lock.is_some();
        next.lock_id = self
            .client
            .inner
            .host_lock
            .as_ref()
            .map(|l| l.id().to_string());
        let mut pending = std::mem::take(&mut self.pending);
        let r = self
            .client
            .write(
                &self.key,
                next,
                Cond::Match(self.version.clone()),
                &mut pending,
            )
            .await;
        match r {
            Ok(Written::Committed {
                version,
                sent,
                record,
            }) => {
                let ttl = Duration::from_millis(record.ttl_ms);
                let until = sent + ttl.saturating_sub(self.margin);
                self.valid_until = self.valid_until.max(until);
                self.version = version;
                self.record = record;
                self.state = State::Held;
                Ok(())
            }
            Ok(Written::Rejected { current }) => {
                let who = match &current {
                    Some((r, _, _)) if r.is_vanished() => {
                        "the record was deleted (a marker stands in its place)".into()
                    }
                    Some((r, _, _)) => format!(
                        "now epoch {} held by {}/{}{}",
                        r.epoch,
                        r.holder.node,
                        r.holder.instance,
                        if r.released { " (released)" } else { "" }
                    ),
                    None => "the object is gone".into(),
                };
                // Stop believing first; then keep our epoch in the bucket.
                let e = self.lost(format!("another writer changed the lease: {who}"));
                self.after_vanished(current).await;
                Err(e)
            }
            Ok(Written::NotLanded) => {
                self.pending = pending;
                Err(not_landed("renew", &self.key, "retry before the deadline"))
            }
            Err(e) => {
                if e.is_transient() {
                    self.pending = pending;
                }
                Err(e)
            }
        }
    }

    /// After a rejected write of a standalone lease: if the record is gone or
    /// a marker below our epoch stands in its place, put our epoch there
    /// (see [`LeaseClient::keep_epoch`]).
    async fn after_vanished(&self, current: Option<(LeaseRecord, Version, MonoTime)>) {
        if self.record.kind != Kind::Lease {
            return;
        }
        if current.as_ref().is_some_and(|(r, _, _)| !r.is_vanished()) {
            return;
        }
        self.client
            .keep_epoch(
                &self.key,
                self.record.epoch,
                self.record.ttl_ms,
                current.map(|(r, v, _)| (r, v)),
            )
            .await;
    }

    /// Renews, retrying transport failures with exponential backoff (backon)
    /// until the validity deadline; past it the lease is lost.
    pub async fn renew(&mut self) -> Result<()> {
        let ttl = Duration::from_millis(self.record.ttl_ms);
        let mut delays = backon::ExponentialBuilder::default()
            .with_min_delay((ttl / 50).max(Duration::from_millis(5)))
            .with_max_delay((ttl / 6).max(Duration::from_millis(5)))
            .without_max_times()
            .build();
        let clock = self.client.inner.clock.clone();
        let mut last_error: Option<Error> = None;
        loop {
            if let Some(e) = &last_error
                && self.state == State::Held
                && clock.now() >= self.valid_until
            {
                let reason =
                    format!("bucket unreachable until the validity deadline (last error: {e})");
                return Err(self.lost(reason));
            }
            match self.renew_once().await {
                Ok(()) => return Ok(()),
                // A resumed lease has no known deadline to retry against.
                Err(e) if e.is_transient() && self.state == State::Held => {
                    let remaining = self.valid_until.saturating_since(clock.now());
                    if self.state == State::Held && remaining.is_zero() {
                        return Err(self.lost(format!(
                            "bucket unreachable until the validity deadline ({e})"
                        )));
                    }
                    let d = delays.next().unwrap_or(ttl / 6).min(remaining);
                    tracing::warn!(key = %self.key, error = %e, retry_in = ?d, "renew failed");
                    last_error = Some(e);
                    clock.sleep(d).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Releases: a tombstone with the epoch unchanged, so the next holder's
    /// epoch is higher. This holder stops believing at once, before the write.
    #[tracing::instrument(level = "debug", name = "lease release", skip_all)]
    pub async fn release(mut self) -> Result<()> {
        match self.state {
            State::Held | State::Resumed => {}
            State::Lost => return Err(self.lost("already lost")),
            State::Released => return Ok(()),
        }
        self.state = State::Released;
        let clock = self.client.inner.clock.clone();
        let mut next = self.record.clone();
        next.released = true;
        let mut attempts = Vec::new();
        let ttl = Duration::from_millis(self.record.ttl_ms);
        let mut tries = 0;
        loop {
            next.nonce = self.client.inner.entropy.hex_id();
            next.renewed_at_ms = clock.wall_ms();
            let r = self
                .client
                .write(
                    &self.key,
                    next.clone(),
                    Cond::Match(self.version.clone()),
                    &mut attempts,
                )
                .await;
            match r {
                Ok(Written::Committed { .. }) => return Ok(()),
                Ok(Written::Rejected { current }) => {
                    let e = self.lost("another writer changed the lease before release");
                    self.after_vanished(current).await;
                    return Err(e);
                }
                Ok(Written::NotLanded) if tries < 3 => {
                    tries += 1;
                    clock.sleep(ttl / 20).await;
                }
                Err(e) if e.is_transient() && tries < 3 => {
                    tracing::warn!(key = %self.key, error = %e, "release failed; retrying");
                    tries += 1;
                    clock.sleep(ttl / 20).await;
                }
                Ok(Written::NotLanded) => {
                    return Err(not_landed(
                        "release",
                        &self.key,
                        "the lease will expire by observation",
                    ));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `observe_listing_where`: an entry `watch` declines is not observed
    /// and what was observed of its key is forgotten; the others are
    /// observed from their first listing, as `observe_listing` does; a
    /// segment's table shrinks once most of its keys are gone.
    #[tokio::test]
    async fn a_listing_observes_only_what_the_caller_watches() {
        let store: Arc<dyn Store> = Arc::new(crate::store::ObjectStoreBackend::memory());
        let clock = crate::clock::MockClock::new();
        let client = LeaseClient::builder(store.clone(), Name::new("n1").unwrap())
            .host("h")
            .clock(Arc::new(clock.clone()))
            .build()
            .unwrap();
        for i in 0..200 {
            store
                .put(
                    &format!("s/k{i:03}"),
                    Bytes::from_static(b"x"),
                    Cond::Create,
                )
                .await
                .unwrap();
        }
        let listed = client.observe_listing("s/").await.unwrap();
        assert_eq!(listed.len(), 200);
        assert_eq!(client.observer().len(), 200);
        clock.advance(Duration::from_secs(3));
        // Watch one key in ten from now on.
        let watched = |k: &str| k.ends_with('0');
        let listed = client
            .observe_listing_where("s/", |e| watched(&e.key))
            .await
            .unwrap();
        assert_eq!(listed.len(), 200, "every entry is still returned");
        assert_eq!(client.observer().len(), 20);
        let now = clock.now();
        for e in &listed {
            let seen = client.observer().unchanged_for(&e.key, &e.version, now);
            if watched(&e.key) {
                // Observed since the first listing, not restarted.
                assert_eq!(seen, Some(Duration::from_secs(3)), "{}", e.key);
            } else {
                assert_eq!(seen, None, "{} was forgotten", e.key);
            }
        }
        // The next retain gives the emptied table back.
        let seen = client.inner.observer.seen.lock().unwrap();
        let map = seen.get("s/").unwrap();
        assert!(
            map.capacity() < 200,
            "capacity {} for {} keys",
            map.capacity(),
            map.len()
        );
    }

    fn rec(instance: &str, released: bool) -> LeaseRecord {
        LeaseRecord {
            epoch: 5,
            host_locked: true,
            lock_id: Some("lock-a".into()),
            ..crate::record::sample(instance, released)
        }
    }

    fn me(node: &str, host: &str, instance: &str) -> Holder {
        Holder {
            node: node.into(),
            host: host.into(),
            instance: instance.into(),
        }
    }

    #[test]
    fn takeover_rule() {
        let m = Duration::from_millis(100);
        let held = rec("i1", false);
        let z = Duration::ZERO;
        // A stranger waits for ttl + margin of unchanged observation.
        assert_eq!(
            decide_takeover(&held, &me("n2", "h2", "j"), None, z, m),
            None
        );
        assert_eq!(
            decide_takeover(
                &held,
                &me("n2", "h2", "j"),
                Some("lock-a"),
                Duration::from_millis(1099),
                m
            ),
            None
        );
        assert_eq!(
            decide_takeover(
                &held,
                &me("n2", "h2", "j"),
                None,
                Duration::from_millis(1100),
                m
            ),
            Some(Takeover::Expired)
        );
        // Released: at once, by anyone, including the previous holder.
        assert_eq!(
            decide_takeover(&rec("i1", true), &me("n2", "h2", "j"), None, z, m),
            Some(Takeover::Released)
        );
        assert_eq!(
            decide_takeover(&rec("i1", true), &me("n1", "h1", "i1"), None, z, m),
            Some(Takeover::Released)
        );
        // Our own live record.
        assert_eq!(
            decide_takeover(&held, &me("n1", "h1", "i1"), None, z, m),
            Some(Takeover::Own)
        );
        // Predecessor on this host: only with the host lock.
        assert_eq!(
            decide_takeover(&held, &me("n1", "h1", "i2"), None, z, m),
            None
        );
        assert_eq!(
            decide_takeover(&held, &me("n1", "h1", "i2"), Some("lock-a"), z, m),
            Some(Takeover::PredecessorDead)
        );
        // A predecessor that never held the host lock proves nothing.
        let unlocked = LeaseRecord {
            host_locked: false,
            lock_id: None,
            ..held.clone()
        };
        assert_eq!(
            decide_takeover(&unlocked, &me("n1", "h1", "i2"), Some("lock-a"), z, m),
            None
        );
        // Nor does one that held another lock (another lock directory, a
        // recreated lock file): we hold ours, which says nothing of its.
        assert_eq!(
            decide_takeover(&held, &me("n1", "h1", "i2"), Some("lock-b"), z, m),
            None
        );
        // Same node id on another host never steals early.
        assert_eq!(
            decide_takeover(&held, &me("n1", "h9", "i2"), Some("lock-a"), z, m),
            None
        );
    }

    #[test]
    fn observer_forgets_keys_a_complete_listing_no_longer_shows() {
        let o = Observer::default();
        let t = MonoTime::ZERO;
        let v = Version {
            etag: Some("1".into()),
            version: None,
        };
        for k in ["sessions/a", "sessions/b", "nodes/a"] {
            o.observe(k, &v, t);
        }
        o.retain_listed(crate::keys::SESSIONS, &["sessions/b"].into_iter().collect());
        assert_eq!(o.len(), 2);
        assert_eq!(o.unchanged_for("sessions/a", &v, t), None, "forgotten");
        assert!(o.unchanged_for("sessions/b", &v, t).is_some());
        assert!(
            o.unchanged_for("nodes/a", &v, t).is_some(),
            "other prefixes kept"
        );
    }

    /// Kept by segment, it answers as one map would: every prefix shape
    /// (empty, within a segment's name, a whole segment, deeper than one,
    /// keys without a `/`) against a plain map, over random operations.
    #[test]
    fn observer_by_segment_answers_as_one_map() {
        let keys = [
            "loose",
            "lo",
            "nodes/a",
            "nodes/b",
            "nodesx/a",
            "sessions/a",
            "sessions/ab",
            "sessions/b",
            "sessions/a/deep",
            "leases/x",
        ];
        let prefixes = [
            "",
            "l",
            "lo",
            "nodes/",
            "nodes",
            "sessions/",
            "sessions/a",
            "sess",
            "z/",
        ];
        let o = Observer::default();
        let mut model: HashMap<String, (Version, MonoTime)> = HashMap::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        for step in 0..20_000u64 {
            let t = MonoTime::ZERO + Duration::from_millis(step);
            match next(4) {
                0 | 1 => {
                    let k = keys[next(keys.len())];
                    let v = Version {
                        etag: Some(format!("{}", next(3))),
                        version: None,
                    };
                    let d = o.observe(k, &v, t);
                    let want = match model.get(k) {
                        Some((mv, first)) if *mv == v => t.saturating_since(*first),
                        _ => {
                            model.insert(k.to_string(), (v, t));
                            Duration::ZERO
                        }
                    };
                    assert_eq!(d, want, "{k}");
                }
                2 => {
                    let p = prefixes[next(prefixes.len())];
                    let listed: std::collections::HashSet<&str> =
                        keys.iter().copied().filter(|_| next(2) == 0).collect();
                    o.retain_listed(p, &listed);
                    model.retain(|k, _| !k.starts_with(p) || listed.contains(k.as_str()));
                    let seen = o.seen.lock().unwrap();
                    assert!(
                        seen.values().all(|m| !m.is_empty()),
                        "emptied segments dropped"
                    );
                }
                _ => {
                    let k = keys[next(keys.len())];
                    o.forget(k);
                    model.remove(k);
                }
            }
            for k in keys {
                assert_eq!(o.version(k), model.get(k).map(|(v, _)| v.clone()), "{k}");
            }
            assert_eq!(o.len(), model.len());
        }
    }

    #[test]
    fn observer_counts_from_first_arrival_of_a_version() {
        let o = Observer::default();
        let v1 = Version {
            etag: Some("a".into()),
            version: None,
        };
        let v2 = Version {
            etag: Some("b".into()),
            version: None,
        };
        let t = |ms| MonoTime::from_since_origin(Duration::from_millis(ms));
        assert_eq!(o.observe("k", &v1, t(100)), Duration::ZERO);
        assert_eq!(o.observe("k", &v1, t(600)), Duration::from_millis(500));
        assert_eq!(
            o.observe("k", &v2, t(700)),
            Duration::ZERO,
            "a new version restarts the count"
        );
        assert_eq!(o.observe("k", &v2, t(900)), Duration::from_millis(200));
    }
}
