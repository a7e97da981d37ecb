//! The one liveness judgement: is the holder of a lease record (a node lease
//! or a standalone lease) still entitled to act on it?
//!
//! Every path that asks asks here, so none can decide differently: the pull
//! loop's placement view and its takeover fence, the claim endpoint (both
//! through the node's view), `LeaseClient::acquire`'s takeover rule, wake,
//! `ls` / `nodes`, `watch` and `lease show`. What differs between them is only
//! the *evidence* they have:
//!
//! - a long-lived observer (a node, a waiting `acquire`) has seen the record's
//!   version unchanged for some time, measured from the arrival of the first
//!   response that showed it. That is the only evidence that licenses a
//!   takeover: the holder's own validity deadline is at most ttl − margin
//!   after its last renewal was *sent*, which came before that response, so
//!   ttl + margin of observed stillness outlasts it whatever the clocks say;
//! - a one-shot reader has one read and the wall clocks. Its "expired" is
//!   advisory (the clocks may be skewed by up to `max_skew`), and nothing
//!   acts on it but humans and scripts.
//!
//! # Contract
//!
//! - A released record is [`Liveness::Released`], or [`Liveness::Fenced`] if a
//!   peer released it (`released_by`): in both the holder has stopped (or will
//!   fail its next renewal) and its epoch is final.
//! - A record naming another instance than the one asked about is
//!   [`Liveness::Superseded`] (the node restarted; the old instance is gone),
//!   unless it is marked unproven (created over a deleted record: the asked
//!   instance may still run). Then it is judged by its own stillness, as a
//!   live record, even released by its holder; fenced by a peer (written
//!   only over a version still for ttl + margin), it is Fenced.
//! - No record, or a vanished lease's marker standing in for one
//!   ([`LeaseRecord::vanished`]), is [`Liveness::Absent`]: an *observation*, never a death
//!   certificate. A holder whose record was deleted may still act until its
//!   validity lapses, so absence licenses a takeover only once observed for
//!   ttl + margin ([`absent_long_enough`]), exactly as an unchanged version.
//! - Otherwise [`Liveness::Expired`] when the evidence shows ttl + margin of
//!   observed stillness (or, by wall clock, ttl + skew since the renewal), and
//!   [`Liveness::Live`] when it does not.

use crate::record::LeaseRecord;
use std::time::Duration;

/// The vocabulary every reader uses (`ls`, `nodes`, wake, JSON output).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Liveness {
    /// Held, and the evidence does not show it expired.
    Live,
    /// Held, but not renewed for longer than the evidence allows.
    Expired,
    /// Released by its holder (a graceful end).
    Released,
    /// Released by a peer that observed it expired and took over.
    Fenced,
    /// Held by another instance than the one asked about.
    Superseded,
    /// No record at all.
    Absent,
}

/// What the judge knows besides the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// This observer has seen the record's current version unchanged for
    /// `unchanged_for` (from the arrival of the first response showing it);
    /// `margin` is the observer's safety margin.
    Observed {
        unchanged_for: Duration,
        margin: Duration,
    },
    /// A one-shot reader: the wall clock now and the skew it allows.
    WallClock { now_ms: u64, max_skew: Duration },
}

/// Judges `record` (None: there is none), as a lease of `instance` when one
/// is asked about (a claim's owner), given `evidence`. See the module docs.
pub fn judge(record: Option<&LeaseRecord>, instance: Option<&str>, evidence: Evidence) -> Liveness {
    let Some(r) = record else {
        return Liveness::Absent;
    };
    judge_as(
        r,
        instance.is_some_and(|i| i != r.holder.instance),
        evidence,
    )
}

/// `r` as an earlier instance of its node id reads it (a claim's owner
/// that the record no longer names): [`judge`] asked about another
/// instance. Live only while `r` is marked unproven and has neither stood
/// still for ttl + margin nor been fenced: what `plan::NodeView::unproven`
/// says, so placement and the judgement share one rule.
pub fn judge_earlier(r: &LeaseRecord, evidence: Evidence) -> Liveness {
    judge_as(r, true, evidence)
}

/// [`judge`] of a record that is there; `other`: asked about another
/// instance than the one it names.
fn judge_as(r: &LeaseRecord, other: bool, evidence: Evidence) -> Liveness {
    // A vanished lease's marker stands for the missing record it replaced:
    // judged as absence (watched for ttl + margin before a takeover), never
    // as a release, whoever asks.
    if r.is_vanished() {
        return Liveness::Absent;
    }
    // A newer instance whose record was created over a deleted one proves
    // nothing about the earlier instance until its wait ends: judged by how
    // long this record stands, not as the earlier instance's end. Not even
    // once it released it itself: that ends the newer instance only, and
    // the earlier one (cut off from the bucket, its record deleted by hand)
    // may still act until its own validity lapses. Fenced by a peer, it is
    // final again: a fence is written only over a version observed still
    // for ttl + margin, the very evidence that ends the wait (so one
    // tombstone ends it for every peer, not one per takeover).
    let unproven_other = other && {
        if !crate::fleet::attrs::NodeAttrs::of(r).unproven {
            return Liveness::Superseded;
        }
        true
    };
    let fenced = r.attrs.contains_key(crate::fleet::attrs::RELEASED_BY);
    if r.released && (fenced || !unproven_other) {
        return if fenced {
            Liveness::Fenced
        } else {
            Liveness::Released
        };
    }
    let ttl = Duration::from_millis(r.ttl_ms);
    let expired = match evidence {
        Evidence::Observed {
            unchanged_for,
            margin,
        } => stood_still_long_enough(unchanged_for, ttl, margin),
        Evidence::WallClock { now_ms, max_skew } => r.expired_by_wall_clock(now_ms, max_skew),
    };
    if expired {
        Liveness::Expired
    } else {
        Liveness::Live
    }
}

/// Has a record that was there (with `ttl`) been observed absent long enough
/// to act as if it expired? The same bound as an unchanged version: ttl +
/// margin from the arrival of the first response that showed it missing.
pub fn absent_long_enough(absent_for: Duration, ttl: Duration, margin: Duration) -> bool {
    stood_still_long_enough(absent_for, ttl, margin)
}

/// The one rule of expiry by observation: a version (or an absence) seen
/// unchanged for `ttl + margin`, counted from the arrival of the first
/// response that showed it. Every judgement of a lease, a node record or a
/// vanished marker, and every hint that hurries one (the ring watch, the
/// brisk pace), asks this.
pub fn stood_still_long_enough(unchanged_for: Duration, ttl: Duration, margin: Duration) -> bool {
    unchanged_for >= ttl.saturating_add(margin)
}

impl Liveness {
    /// The word printed in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Live => "live",
            Liveness::Expired => "expired",
            Liveness::Released => "released",
            Liveness::Fenced => "fenced",
            Liveness::Superseded => "superseded",
            Liveness::Absent => "absent",
        }
    }

    /// A phrase for a sentence about a claim's owner ("owner n1 is ...").
    pub fn describe(self) -> &'static str {
        match self {
            Liveness::Live => "live",
            Liveness::Expired => "expired (not renewed within its ttl)",
            Liveness::Released => "released its lease",
            Liveness::Fenced => "fenced by a peer that took its sessions over",
            Liveness::Superseded => "restarted as a new instance",
            Liveness::Absent => "without a node record",
        }
    }

    /// Is the holder's tenure over for good (released, fenced or
    /// superseded)? Expired and absent are not final: a renewal or a
    /// re-created record may follow, and only observation decides.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Liveness::Released | Liveness::Fenced | Liveness::Superseded
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Holder, Kind};

    fn rec(instance: &str, released: bool, by_peer: bool) -> LeaseRecord {
        let mut r = LeaseRecord {
            schema: crate::record::SCHEMA.into(),
            kind: Kind::Node,
            holder: Holder {
                node: "n1".into(),
                host: "h".into(),
                instance: instance.into(),
            },
            epoch: 7,
            ttl_ms: 10_000,
            renewed_at_ms: 1_000_000,
            released: false,
            host_locked: false,
            lock_id: None,
            address: None,
            attrs: Default::default(),
            nonce: "nonce".into(),
        };
        r.released = released;
        if by_peer {
            r.attrs.insert("released_by".into(), "n2".into());
        }
        r
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    /// The whole rule as a table: record, instance asked, evidence, verdict.
    #[test]
    fn the_judgement_table() {
        let obs = |secs: u64| Evidence::Observed {
            unchanged_for: S(secs),
            margin: S(1),
        };
        let wall = |now_ms: u64| Evidence::WallClock {
            now_ms,
            max_skew: S(5),
        };
        let live = rec("i1", false, false);
        let released = rec("i1", true, false);
        let fenced = rec("i1", true, true);
        let mut unproven = rec("i1", false, false);
        unproven
            .attrs
            .insert(crate::fleet::attrs::UNPROVEN.into(), true.into());
        let mut unproven_released = unproven.clone();
        unproven_released.released = true;
        let mut unproven_fenced = unproven_released.clone();
        unproven_fenced
            .attrs
            .insert("released_by".into(), "n2".into());
        let cases: Vec<(Option<&LeaseRecord>, Option<&str>, Evidence, Liveness)> = vec![
            (None, None, obs(100), Liveness::Absent),
            (None, Some("i1"), wall(0), Liveness::Absent),
            (Some(&live), None, obs(0), Liveness::Live),
            (Some(&live), None, obs(10), Liveness::Live), // ttl, not ttl + margin
            (Some(&live), None, obs(11), Liveness::Expired),
            (Some(&live), Some("i1"), obs(11), Liveness::Expired),
            (Some(&live), Some("i0"), obs(0), Liveness::Superseded),
            (Some(&released), Some("i0"), obs(0), Liveness::Superseded),
            // Created over a deleted record: no proof that i0 stopped.
            (Some(&unproven), Some("i0"), obs(0), Liveness::Live),
            (Some(&unproven), Some("i0"), obs(11), Liveness::Expired),
            // ... and released by itself: still no proof for i0, which may
            // act until its validity lapses.
            (Some(&unproven_released), Some("i0"), obs(0), Liveness::Live),
            (
                Some(&unproven_released),
                Some("i0"),
                obs(11),
                Liveness::Expired,
            ),
            // Fenced by a peer (written only over a version still for ttl
            // + margin): final for i0 too.
            (Some(&unproven_fenced), Some("i0"), obs(0), Liveness::Fenced),
            // Asked about itself, its end is final as any.
            (
                Some(&unproven_released),
                Some("i1"),
                obs(0),
                Liveness::Released,
            ),
            (Some(&unproven_fenced), None, obs(0), Liveness::Fenced),
            (Some(&released), None, obs(0), Liveness::Released),
            (Some(&fenced), None, obs(0), Liveness::Fenced),
            (Some(&fenced), Some("i1"), wall(0), Liveness::Fenced),
            // Renewed at 1,000 s; ttl 10 s; skew 5 s.
            (Some(&live), None, wall(1_015_000), Liveness::Live),
            (Some(&live), None, wall(1_015_001), Liveness::Expired),
            (Some(&released), None, wall(9_999_999), Liveness::Released),
        ];
        for (i, (r, inst, ev, want)) in cases.into_iter().enumerate() {
            assert_eq!(judge(r, inst, ev), want, "case {i}: {r:?} {inst:?} {ev:?}");
        }
        // As an earlier instance reads it (`NodeView::unproven` is Live):
        // held back only by a marked record neither still nor fenced.
        for (r, secs, want) in [
            (&live, 0, Liveness::Superseded),
            (&released, 0, Liveness::Superseded),
            (&unproven, 0, Liveness::Live),
            (&unproven, 11, Liveness::Expired),
            (&unproven_released, 0, Liveness::Live),
            (&unproven_released, 11, Liveness::Expired),
            (&unproven_fenced, 0, Liveness::Fenced),
        ] {
            assert_eq!(judge_earlier(r, obs(secs)), want, "{r:?} {secs}");
            assert_eq!(judge(Some(r), Some("i0"), obs(secs)), want, "{r:?} {secs}");
        }
        let marker = LeaseRecord::vanished(7, 10_000, "n".into(), 0);
        assert_eq!(judge(Some(&marker), None, obs(100)), Liveness::Absent);
        let declared = LeaseRecord::declared(0, "n".into(), 0);
        assert_eq!(judge(Some(&declared), None, obs(0)), Liveness::Released);
        assert!(!absent_long_enough(S(10), S(10), S(1)));
        assert!(absent_long_enough(S(11), S(10), S(1)));
        assert!(Liveness::Fenced.is_final() && !Liveness::Expired.is_final());
        assert!(!Liveness::Absent.is_final());
    }
}
