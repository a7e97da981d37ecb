//! Alarms: a sleeping session woken at a time (issue #39), as a Durable
//! Object's alarm or a Dapr reminder wakes an inactive actor.
//!
//! An alarm is an object `alarms/<minute>/<session>/<nonce>` (the minute of
//! its time, so the index is time-bucketed as celld's `wake/<minute>/`)
//! written create-if-absent by `leasehold wake NAME --at TIME` or
//! [`set`]; setting one rings the bell. It lives in the bucket, so it
//! survives every node's death.
//!
//! # Contract
//!
//! - **At most once.** An alarm wakes its session at most once, however
//!   many nodes act on it, fail over, or lose replies. Firing is two
//!   conditional writes: the alarm is *taken* (rewritten, If-Match on the
//!   version read, with `fired_at_epoch` = the epoch of the sleeping claim
//!   it found), then that claim is released (If-Match on its version, only
//!   while it is still `sleeping` at that epoch), as a wake request does.
//!   A claim sleeping at epoch E is released at most once: once released it
//!   is claimed at E+1, and it can sleep again only at E+1 or above. A node
//!   that read the alarm before another took it loses the first write.
//! - **At least once, within a bound.** Every node lists `alarms/` at least
//!   once a minute and after every ring of the bell, and ends its pause at
//!   the next alarm due. The nodes are ranked for the session (rendezvous
//!   of their ids and its name among the live nodes): the first acts at
//!   the alarm's time, the k-th k poll intervals (ttl/3 each) later, so an
//!   alarm whose first-ranked node died fires about ttl/3 later. A taken
//!   alarm whose release was not written (its taker died between the two
//!   writes) is finished by whoever reads it next. The firing node also
//!   looks at the released session at its next passes, so a lost hint
//!   and a lost ring cannot leave it unplaced until a full listing.
//! - **Nothing to wake.** An alarm that comes due while its session is
//!   running, queued or starting (awake), or whose session is gone, is
//!   deleted: it is consumed, as a Durable Object's alarm is by a running
//!   object. A woken session's start follows the usual placement, restart
//!   and back-off rules.
//! - **Cost.** One LIST of `alarms/` per node per minute (43,200 per
//!   node-month: $0.22 at S3's LIST price), and after a ring of the bell at
//!   most one per poll interval (ttl/3); a page more per thousand alarms
//!   pending; per alarm fired, reads and writes by the first-ranked node
//!   (the others look only a poll interval per rank later, by when it is
//!   usually gone).
//! - **Deleted sessions.** An alarm outlives its session's manifest until
//!   its time, when it is deleted; a session created again under the name
//!   before then is woken by it (a claim's epochs never restart, so a
//!   taken alarm cannot match the new session's claim).
//!
//! The decision (what to do with an alarm, given its session's claim) is
//! [`step`]: pure, table-tested. The node's shell is
//! `fleet::node::alarms`.

use crate::clock::Entropy;
use crate::error::{Error, Result};
use crate::store::{Cond, Store};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::claim::{ClaimRecord, ClaimState};

pub use crate::keys::ALARMS;

/// The most bytes an alarm object may have.
pub const MAX_ALARM_BYTES: usize = 4096;

/// The furthest ahead an alarm may be set: a year.
pub const MAX_AHEAD_MS: u64 = 366 * 86_400_000;

pub use crate::record::MAX_AT_MS;

/// An alarm as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlarmRecord {
    pub schema: String,
    pub kind: String,
    /// The session it wakes.
    pub session: String,
    /// When, by wall clock (ms since the epoch).
    pub at_ms: u64,
    /// Taken to fire: the epoch of the sleeping claim it releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fired_at_epoch: Option<u64>,
    /// When it was set, by the setter's wall clock (for humans).
    pub set_at_ms: u64,
    pub nonce: String,
}

impl AlarmRecord {
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        let r: AlarmRecord =
            crate::record::decode_as(key, bytes, "alarm", MAX_ALARM_BYTES, "alarm")?;
        if crate::Name::new(r.session.as_str()).is_err() {
            return Err(Error::corrupt(key, "not a session name"));
        }
        // Year 9999 at most: every time shown is then a valid RFC 3339 one.
        if r.at_ms > MAX_AT_MS {
            return Err(Error::corrupt(key, "a time past the year 9999"));
        }
        if parse_key(key).map(|(_, s)| s) != Some(r.session.as_str()) {
            return Err(Error::corrupt(key, "the session does not match the key"));
        }
        Ok(r)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("alarm serialises")
    }
}

pub use crate::keys::{alarm as key, parse_alarm as parse_key};

/// What to do with an alarm now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Not due yet (for this node).
    Wait,
    /// Take it (If-Match on the alarm): it will release the claim sleeping
    /// at `epoch`.
    Take { epoch: u64 },
    /// Release the claim sleeping at `epoch` (If-Match on the claim).
    Release { epoch: u64 },
    /// Consumed, or nothing to wake: delete it.
    Delete,
}

/// The claim an alarm's session has, as [`step`] needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Session {
    /// No claim and no manifest: gone.
    Gone,
    /// Asleep at this epoch.
    Sleeping { epoch: u64 },
    /// Anything else: running, queued, starting, released, stopped.
    Awake,
}

/// The rule. `due_after_ms` is how long past its time this node waits
/// before acting (0 for the node ranked first, k poll intervals for the
/// k-th).
pub fn step(alarm: &AlarmRecord, session: Session, now_ms: u64, due_after_ms: u64) -> Step {
    match (alarm.fired_at_epoch, session) {
        // Taken: finish it, or it is done.
        (Some(e), Session::Sleeping { epoch }) if epoch == e => Step::Release { epoch },
        (Some(_), _) => Step::Delete,
        (None, _) if now_ms < alarm.at_ms.saturating_add(due_after_ms) => Step::Wait,
        (None, Session::Sleeping { epoch }) => Step::Take { epoch },
        (None, Session::Awake | Session::Gone) => Step::Delete,
    }
}

/// Sets an alarm for `session` at `at_ms` (wall clock): one create-if-absent
/// write, then a ring of the bell so every node lists the index now. The
/// session must have a manifest; the time must be ahead of `now_ms` and at
/// most [`MAX_AHEAD_MS`] away. Returns the alarm's key.
pub async fn set(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    session: &crate::Name,
    at_ms: u64,
    now_ms: u64,
) -> Result<String> {
    if at_ms <= now_ms {
        return Err(Error::invalid("--at", "the time has passed"));
    }
    if at_ms - now_ms > MAX_AHEAD_MS {
        return Err(Error::invalid("--at", "at most a year ahead"));
    }
    if super::manifest::get(store, session).await?.is_none() {
        return Err(Error::NotFound {
            key: crate::keys::manifest(session),
        });
    }
    let nonce = entropy.hex_id();
    let rec = AlarmRecord {
        schema: crate::record::SCHEMA.into(),
        kind: "alarm".into(),
        session: session.to_string(),
        at_ms,
        fired_at_epoch: None,
        set_at_ms: now_ms,
        nonce: nonce.clone(),
    };
    let key = key(at_ms, session.as_str(), &nonce);
    match super::put_checked(
        store,
        &key,
        Bytes::from(rec.encode()),
        Cond::Create,
        &nonce,
        super::json_nonce,
    )
    .await?
    {
        super::Put::Committed(_) => {}
        // A fresh nonce: nobody else writes this key.
        super::Put::Rejected(_) => return Err(Error::Conflict { key }),
    }
    super::feed::ring_bell(store, entropy).await;
    Ok(key)
}

/// How [`step`] sees a claim (and whether a manifest exists).
pub fn session_of(claim: Option<&ClaimRecord>, manifest: bool) -> Session {
    match claim {
        Some(c) if c.state == ClaimState::Sleeping => Session::Sleeping { epoch: c.epoch },
        None if !manifest => Session::Gone,
        _ => Session::Awake,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alarm(at_ms: u64, fired: Option<u64>) -> AlarmRecord {
        AlarmRecord {
            schema: crate::record::SCHEMA.into(),
            kind: "alarm".into(),
            session: "s".into(),
            at_ms,
            fired_at_epoch: fired,
            set_at_ms: 0,
            nonce: "n".into(),
        }
    }

    #[test]
    fn the_rule() {
        use Session::*;
        use Step::*;
        let cases = [
            // (alarm at, fired at epoch, session, now, wait past due) -> step
            (1000, None, Sleeping { epoch: 3 }, 999, 0, Wait),
            (
                1000,
                None,
                Sleeping { epoch: 3 },
                1000,
                0,
                Take { epoch: 3 },
            ),
            (1000, None, Sleeping { epoch: 3 }, 1000, 500, Wait),
            (
                1000,
                None,
                Sleeping { epoch: 3 },
                1500,
                500,
                Take { epoch: 3 },
            ),
            (1000, None, Awake, 2000, 0, Delete),
            (1000, None, Gone, 2000, 0, Delete),
            (1000, None, Awake, 10, 0, Wait),
            // Taken: released once, at its epoch only.
            (
                1000,
                Some(3),
                Sleeping { epoch: 3 },
                0,
                0,
                Release { epoch: 3 },
            ),
            (1000, Some(3), Sleeping { epoch: 4 }, 5000, 0, Delete),
            (1000, Some(3), Awake, 5000, 0, Delete),
            (1000, Some(3), Gone, 5000, 0, Delete),
        ];
        for (at, fired, session, now, after, want) in cases {
            assert_eq!(
                step(&alarm(at, fired), session, now, after),
                want,
                "{at} {fired:?} {session:?} {now} {after}"
            );
        }
    }

    #[test]
    fn keys_round_trip_and_foreign_ones_are_refused() {
        let k = key(120_000, "web", "ab12");
        assert_eq!(k, "alarms/000000000002/web/ab12");
        assert_eq!(parse_key(&k), Some((2, "web")));
        for bad in [
            "alarms/x/web/n",
            "alarms/000000000002/web",
            "alarms/1/a/b/c",
            "nodes/a",
        ] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
        let mut a = alarm(120_000, None);
        a.session = "web".into();
        assert!(AlarmRecord::decode(&k, &a.encode()).is_ok());
        a.session = "other".into();
        assert!(AlarmRecord::decode(&k, &a.encode()).is_err());
        a.session = "web".into();
        a.at_ms = MAX_AT_MS + 1;
        assert!(AlarmRecord::decode(&k, &a.encode()).is_err());
        assert!(AlarmRecord::decode(&k, b"{\"schema\":1}").is_err());
    }
}
