//! The claim gate: whether a claimable session may be claimed this pass (corruption, cordon and drain, absence, stale owner records, rank and grace), for the pull loop and the claim endpoint alike.

use super::*;

/// Everything the claim gate looks at for one session this node does not
/// hold, in the order the rules apply.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// Its claim's bytes cannot be read: never taken over.
    pub claim_corrupt: bool,
    /// Its owner's node record cannot be read: the owner cannot be judged.
    pub owner_corrupt: bool,
    /// Its manifest's bytes cannot be read now: a node that takes it has
    /// no spec to run (it keeps only the specs of its own sessions).
    pub manifest_corrupt: bool,
    /// Placement's verdict (`plan::claimable`).
    pub claimable: Option<Claimable>,
    /// The control object has been read at least once since start.
    pub control_read: bool,
    pub cordoned: bool,
    pub draining: bool,
    /// Its claim vanished and the absence has not been observed long
    /// enough yet.
    pub absence_pending: bool,
    /// The cached record of its owner may be stale (names another instance,
    /// or is missing) and has not been read again this pass.
    pub owner_stale: bool,
    /// How long it has been claimable, by this node's observation.
    pub claimable_for: Duration,
    /// Owned by another instance of this node id whose end nothing proves
    /// yet: this instance created its node record where none was (an
    /// operator deleted it), so the earlier instance may still run until
    /// its own deadline. Its claims wait ttl + margin from the creation.
    pub predecessor_unproven: bool,
    /// The grace per rank (`NodeConfig::grace`).
    pub grace: Duration,
}

/// The claim gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Not for us (now or yet); nothing pending.
    Skip,
    /// Not claimable: forget when it first was.
    NotClaimable,
    /// Its claim vanished: wait out the absence (keep the brisk pace). The
    /// rank's grace has not started.
    AbsencePending,
    /// Read the owner's node record again, then ask again.
    RefetchOwner,
    /// Placement ranks this node nowhere for it. (Past here, every verdict
    /// means the session has become claimable for us: the shell records
    /// when, and `claimable_for` counts from it.)
    Unranked,
    /// Within the grace of a lower rank: wait (keep the brisk pace).
    Grace,
    /// Go: fence the owner if it needs it, then claim.
    Claim,
}

/// This node's place among a session's candidates (`plan::rank`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    /// 0 for the first.
    pub position: usize,
    /// Since the last time a node ranked ahead of us was seen taking a
    /// session (its claims counted up between two passes); `Duration::MAX`
    /// if never, or if none is ahead.
    pub ahead_idle_for: Duration,
}

/// How many graces past its rank's own wait a node holds back for busy
/// nodes ranked ahead of it, at most (`gate`). Views differ by a pass, so
/// two busy nodes can each rank the other first; the bound makes the
/// hold a delay in every case (200 s at ttl 10 s), never a standstill.
pub const BUSY_HOLD_GRACES: u32 = 30;

/// [`gate`] for a node its caller chose (a claim or wake request): ranked
/// first, with nobody ahead of it, so placement neither delays nor
/// defers; every other rule holds.
pub fn gate_chosen(c: &Candidate) -> Gate {
    gate(c, || {
        Some(Rank {
            position: 0,
            ahead_idle_for: Duration::MAX,
        })
    })
}

/// May this node claim the candidate this pass? `rank` is this node's rank
/// among the candidates; asked only when the verdict needs it, because
/// ranking is the pass's largest CPU cost.
///
/// A node ranked r waits r graces from when it first saw the session
/// claimable, and also while a node ranked ahead of it has been seen
/// taking sessions within the last grace. Why the second: at placement of
/// thousands of sessions at once, the first-ranked node is alive but
/// needs longer than a few graces to reach them all; without it the nodes
/// ranked after it stepped in for the same sessions (issue #14: 0.4
/// conflicts per claim at 100,000 sessions). A node that is dead, stuck
/// or done takes nothing more, so the wait ends one grace later; and at
/// most [`BUSY_HOLD_GRACES`] graces past the rank's own wait: this only
/// delays, and only while someone ahead is busy claiming.
pub fn gate(c: &Candidate, rank: impl FnOnce() -> Option<Rank>) -> Gate {
    if c.claim_corrupt || c.owner_corrupt || c.manifest_corrupt {
        return Gate::Skip;
    }
    let Some(why) = c.claimable else {
        return Gate::NotClaimable;
    };
    // Cordoned: nothing new; a predecessor's sessions are ours already
    // (unless draining). Nothing at all before the control object was read:
    // a cordoned node restarting must not claim in the meantime.
    if !c.control_read || (c.cordoned && (why != Claimable::Predecessor || c.draining)) {
        return Gate::Skip;
    }
    if c.absence_pending {
        return Gate::AbsencePending;
    }
    if why == Claimable::Predecessor && c.predecessor_unproven {
        return Gate::Grace;
    }
    // Records only move to newer instances, so an owner record that names
    // another instance is believed only after a fresh read still does; and
    // a claim by a node we have no record of is most often by one that
    // registered after our listing.
    if why == Claimable::Orphaned && c.owner_stale {
        return Gate::RefetchOwner;
    }
    let wait = match why {
        Claimable::Predecessor => Duration::ZERO,
        _ => match rank() {
            Some(r)
                if r.position > 0
                    && r.ahead_idle_for < c.grace
                    && c.claimable_for
                        < c.grace.saturating_mul(r.position as u32 + BUSY_HOLD_GRACES) =>
            {
                return Gate::Grace;
            }
            Some(r) => c.grace.saturating_mul(r.position as u32),
            None => return Gate::Unranked,
        },
    };
    if c.claimable_for < wait {
        return Gate::Grace;
    }
    Gate::Claim
}

/// The epoch a claim goes at: above the claim it replaces, above every
/// epoch this node saw for it (should it have vanished), and at least the
/// generation's first. `Err(highest)` when no fencing token above it exists:
/// only foreign bytes put a claim there (decoding refuses one above the
/// bound), and the session is stuck, not the node.
pub fn claim_epoch(replaced: u64, seen: u64, base: u64) -> Result<u64, u64> {
    let highest = replaced.max(seen).max(base);
    crate::record::next_epoch(highest).ok_or(highest)
}

/// A claim no fencing token can follow: left before the fence (its owner's
/// record read at every pass would buy nothing), by the pull loop and the
/// claim endpoint alike.
pub fn at_highest_epoch(claim: Option<&ClaimView>) -> bool {
    claim.is_some_and(|c| crate::record::next_epoch(c.epoch).is_none())
}

/// Why the claim endpoint declines when the gate says `Skip`.
pub fn skip_reason(owner_corrupt: bool, control_read: bool) -> &'static str {
    if owner_corrupt {
        "the owner's node record is corrupt"
    } else if !control_read {
        "this node has not read its control object yet"
    } else {
        "this node is cordoned"
    }
}

/// Why the claim endpoint declines when the gate says `NotClaimable`, in
/// the words `ls` uses for the same states.
pub fn not_claimable_reason(manifest: &ManifestView, claim: Option<&ClaimView>) -> &'static str {
    match claim {
        _ if manifest.paused => "paused",
        Some(c)
            if manifest.scheduled
                && (c.is_placeholder()
                    || c.state.is_terminal()
                    || (c.state == ClaimState::Released
                        && c.tick.is_none()
                        && !c.is_vanished())) =>
        {
            "scheduled: it waits for its next tick"
        }
        Some(c) if c.state.is_terminal() && c.digest == manifest.digest => "completed",
        Some(c) if c.state == ClaimState::Sleeping => "asleep: a wake releases it first",
        Some(_) => "its owner is live",
        None => "not claimable",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn candidate() -> Candidate {
        Candidate {
            claim_corrupt: false,
            manifest_corrupt: false,
            owner_corrupt: false,
            claimable: Some(Claimable::Orphaned),
            control_read: true,
            cordoned: false,
            draining: false,
            absence_pending: false,
            owner_stale: false,
            claimable_for: Duration::ZERO,
            grace: S,
            predecessor_unproven: false,
        }
    }

    #[rustfmt::skip]
    #[test]
    fn the_claim_gate() {
        let c = candidate();
        let pre = Some(Claimable::Predecessor);
        let at = |position: usize, ahead_idle_for: Duration| Some(Rank { position, ahead_idle_for });
        let r0 = at(0, Duration::MAX);
        let rows: Vec<(&str, Candidate, Option<Rank>, Gate)> = vec![
            ("first rank claims at once", c, r0, Gate::Claim),
            ("corrupt claim: never", Candidate { claim_corrupt: true, ..c }, r0, Gate::Skip),
            ("corrupt owner record: never", Candidate { owner_corrupt: true, ..c }, r0, Gate::Skip),
            ("not claimable", Candidate { claimable: None, ..c }, r0, Gate::NotClaimable),
            ("control not read yet", Candidate { control_read: false, ..c }, r0, Gate::Skip),
            ("cordoned: nothing new", Candidate { cordoned: true, ..c }, r0, Gate::Skip),
            ("cordoned keeps a predecessor's", Candidate { cordoned: true, claimable: pre, ..c }, r0, Gate::Claim),
            ("draining gives even those up", Candidate { cordoned: true, draining: true, claimable: pre, ..c }, r0, Gate::Skip),
            ("a vanished claim waits out its absence", Candidate { absence_pending: true, ..c }, r0, Gate::AbsencePending),
            ("absence first, then the refetch", Candidate { absence_pending: true, owner_stale: true, ..c }, r0, Gate::AbsencePending),
            ("stale owner record: read it again", Candidate { owner_stale: true, ..c }, r0, Gate::RefetchOwner),
            ("a fresh claim needs no owner", Candidate { owner_stale: true, claimable: Some(Claimable::Fresh), ..c }, r0, Gate::Claim),
            ("rank 2 waits two graces", Candidate { claimable_for: S, ..c }, at(2, Duration::MAX), Gate::Grace),
            ("rank 2 after two graces", Candidate { claimable_for: 2 * S, ..c }, at(2, Duration::MAX), Gate::Claim),
            ("rank 2 holds while one ahead is taking sessions", Candidate { claimable_for: 9 * S, ..c }, at(2, S / 2), Gate::Grace),
            ("... for 30 graces past its own wait at most", Candidate { claimable_for: 32 * S, ..c }, at(2, S / 2), Gate::Claim),
            ("a corrupt manifest: never", Candidate { manifest_corrupt: true, ..c }, r0, Gate::Skip),
            ("rank 2 goes once those ahead were idle a grace", Candidate { claimable_for: 2 * S, ..c }, at(2, S), Gate::Claim),
            ("the first rank never waits for others' progress", c, at(0, Duration::ZERO), Gate::Claim),
            ("unranked: not for us", c, None, Gate::Unranked),
            ("a predecessor's: no rank, no grace", Candidate { claimable: pre, ..c }, None, Gate::Claim),
            // Our record was created where none was: the earlier instance
            // may still run until its deadline.
            ("an unproven predecessor's waits", Candidate { claimable: pre, predecessor_unproven: true, ..c }, None, Gate::Grace),
            ("only a predecessor's", Candidate { predecessor_unproven: true, ..c }, r0, Gate::Claim),
        ];
        for (what, c, rank, want) in rows {
            assert_eq!(gate(&c, || rank), want, "{what}");
        }
        // Ranking is asked for only when the verdict needs it.
        let asked = std::cell::Cell::new(0);
        let count = || {
            asked.set(asked.get() + 1);
            r0
        };
        assert_eq!(gate(&Candidate { claimable: None, ..c }, count), Gate::NotClaimable);
        assert_eq!(gate(&Candidate { claimable: pre, ..c }, count), Gate::Claim);
        assert_eq!(asked.get(), 0);
    }

    #[test]
    fn a_claim_goes_above_everything_seen_and_never_past_the_highest_epoch() {
        let max = crate::record::MAX_EPOCH;
        assert_eq!(claim_epoch(0, 0, 0), Ok(1));
        assert_eq!(claim_epoch(4, 9, 2), Ok(10), "a vanished claim's epoch");
        assert_eq!(claim_epoch(4, 0, 100), Ok(101), "the generation's base");
        assert_eq!(claim_epoch(max - 1, 0, 0), Ok(max));
        assert_eq!(claim_epoch(max, 0, 0), Err(max));
        assert_eq!(claim_epoch(0, max, 0), Err(max));
        let at = |epoch| {
            let mut c = ClaimView::from(&crate::fleet::claim::ClaimRecord::placeholder(
                "n".into(),
                0,
            ));
            c.epoch = epoch;
            c
        };
        assert!(at_highest_epoch(Some(&at(max))));
        assert!(!at_highest_epoch(Some(&at(max - 1))));
        assert!(!at_highest_epoch(None));
    }

    #[test]
    fn the_claim_endpoint_says_why_it_declines() {
        assert_eq!(
            skip_reason(true, false),
            "the owner's node record is corrupt"
        );
        assert_eq!(
            skip_reason(false, false),
            "this node has not read its control object yet"
        );
        assert_eq!(skip_reason(false, true), "this node is cordoned");
        let m = |paused| ManifestView {
            name: "s".into(),
            digest: crate::fleet::plan::Digest::from("d1"),
            selector: Default::default(),
            preferred: vec![],
            paused,
            scheduled: false,
        };
        let claim = |state, digest: &str| {
            let mut c = ClaimView::from(&crate::fleet::claim::ClaimRecord::placeholder(
                "s".into(),
                0,
            ));
            c.state = state;
            c.digest = crate::fleet::plan::Digest::from(digest);
            c
        };
        use ClaimState::*;
        assert_eq!(
            not_claimable_reason(&m(true), Some(&claim(Running, "d1"))),
            "paused"
        );
        assert_eq!(
            not_claimable_reason(&m(false), Some(&claim(Succeeded, "d1"))),
            "completed"
        );
        assert_eq!(
            not_claimable_reason(&m(false), Some(&claim(Succeeded, "d2"))),
            "its owner is live"
        );
        assert_eq!(
            not_claimable_reason(&m(false), Some(&claim(Sleeping, "d1"))),
            "asleep: a wake releases it first"
        );
        assert_eq!(
            not_claimable_reason(&m(false), Some(&claim(Running, "d1"))),
            "its owner is live"
        );
        assert_eq!(not_claimable_reason(&m(false), None), "not claimable");
    }
}
