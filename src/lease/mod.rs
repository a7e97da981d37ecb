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

mod client;
mod held;
mod observer;

use client::{Attempt, Written, not_landed};
pub use client::{LeaseClient, LeaseClientBuilder};
pub use held::Lease;
use held::State;
pub use observer::{Observer, Takeover, decide_takeover};

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
