//! Expiry by observation (`Observer`) and the takeover decision (`decide_takeover`), both pure of I/O.

use super::*;

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
    pub(super) seen: Mutex<HashMap<String, Seen>>,
}

pub(super) type Seen = HashMap<String, (Version, MonoTime)>;

/// The segment `key` is kept under: up to and including its first `/`.
pub(super) fn segment(key: &str) -> &str {
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
