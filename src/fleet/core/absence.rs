//! The absence rules of a vanished claim: the holder's belief and the waiter's wait from one function, markers to write or raise, an absent owner.

use super::*;

/// A claim's hold: how long after the request that last showed a claim ours
/// its holder may go on believing in it (less the margin), and how long a
/// peer watches the version that stands where a vanished claim was before
/// making it again (plus the margin). Both sides use this one function, so
/// the wait cannot fall short of the belief by an edit to one of them.
/// Passes come at least every `max_poll`, and the first that no longer
/// shows a holder its claim stops the session; the extra ttl covers a
/// pass that overruns.
pub fn claim_hold(ttl: Duration, max_poll: Duration) -> Duration {
    max_poll.max(ttl).saturating_add(ttl)
}

/// How long a holder believes in its claims after their confirmation:
/// `claim_hold − margin` of its own settings.
pub fn claim_belief(ttl: Duration, max_poll: Duration) -> Duration {
    claim_hold(ttl, max_poll).saturating_sub(default_margin(ttl))
}

/// The settings a node knows of: its own, and the longest any node record
/// it ever decoded published (`ttl`, `max_poll`), gone or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holds {
    pub own_ttl: Duration,
    pub own_max_poll: Duration,
    pub longest_ttl: Duration,
    pub longest_max_poll: Duration,
}

/// May a vanished claim be made again? `unchanged_for` is how long the
/// version standing where it was (its vanished marker, or `apply`'s
/// placeholder over a claim we saw) has been observed unchanged, from the
/// arrival of the first listing that showed it; `None` if no such version
/// was seen yet (a missing claim is never enough: its marker is written
/// first). The owner may hold on for the hold of its own settings, which a
/// restarted peer may not know: so the longest any node publishes, never
/// less than ours. Every holder was confirmed before the deletion, which
/// was before the marker landed, which was before we first saw it. Returns
/// how long is left, or `None` when it may.
pub fn vanished_claim_wait(h: Holds, unchanged_for: Option<Duration>) -> Option<Duration> {
    let ttl = h.own_ttl.max(h.longest_ttl);
    let need =
        claim_hold(ttl, h.own_max_poll.max(h.longest_max_poll)).saturating_add(default_margin(ttl));
    match unchanged_for {
        None => Some(need),
        Some(seen) => (seen < need).then(|| need - seen),
    }
}

/// Is a claim gone in the absence rules' sense: missing, a vanished marker,
/// or `apply`'s placeholder where we saw a real claim (at `seen_epoch` > 0:
/// it was written over a deleted one)?
pub fn claim_gone(claim: Option<&ClaimView>, seen_epoch: u64) -> bool {
    match claim {
        None => true,
        Some(c) => c.is_vanished() || (c.is_placeholder() && seen_epoch > 0),
    }
}

/// A vanished marker standing below the highest epoch this node saw for
/// its claim is raised to that epoch (If-Match), so whoever makes the claim
/// again goes above every epoch anyone saw. Returns the epoch to raise it
/// to, if any.
pub fn marker_raise(claim: Option<&ClaimView>, seen_epoch: u64) -> Option<u64> {
    claim.filter(|c| c.is_vanished() && c.epoch < seen_epoch)?;
    Some(seen_epoch)
}

/// Has a claim's owner's node record, observed absent (neither listed nor
/// readable) for `absent_for`, been gone long enough to take over? Judged
/// as an unchanged version (DESIGN: a missing record is an observation, not
/// a death), with the longer of its last ttl and ours.
pub fn owner_absent_long_enough(
    absent_for: Duration,
    its_ttl: Duration,
    own_ttl: Duration,
) -> bool {
    let ttl = its_ttl.max(own_ttl);
    crate::liveness::absent_long_enough(absent_for, ttl, default_margin(ttl))
}

/// Whether a pass forgets the highest epoch it saw for a claim (the
/// `seen_claims` entry that makes a vanished claim come back above it):
/// only when its manifest is gone and the claim is a holder's own release
/// (a tombstone, not apply's placeholder nor a vanished marker, which are
/// released too). Then a session deleted with `delete`, its tombstone
/// collected by `gc` (which raises the epoch floor) and applied again is
/// placed at once. A missing claim is what the absence rules wait out (a
/// claim deleted by hand), so its epoch is kept.
pub fn forget_epoch(manifest_listed: bool, claim: Option<&ClaimView>) -> bool {
    !manifest_listed
        && claim.is_some_and(|c| {
            c.state == ClaimState::Released && !c.is_vanished() && !c.is_placeholder()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::claim::ClaimRecord;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// The safety relation between the two sides of a vanished claim: for
    /// any holder's settings that the waiter knows of (its own, or the
    /// longest it read), the waiter's wait outlasts the holder's belief,
    /// by at least the margin; and it is exactly the hold + margin of the
    /// longest settings, no more.
    #[test]
    fn the_vanished_wait_outlasts_every_known_holders_belief() {
        let settings = [
            ms(100),
            ms(600),
            ms(1_000),
            ms(10_000),
            ms(30_000),
            ms(120_000),
        ];
        for ttl in settings {
            for max_poll in settings {
                let belief = claim_belief(ttl, max_poll);
                assert!(belief < claim_hold(ttl, max_poll));
                for (own_ttl, own_poll) in [(ms(100), ms(100)), (ms(10_000), ms(10_000))] {
                    // The holder's settings are known as the longest read,
                    // or are the waiter's own.
                    for h in [
                        Holds {
                            own_ttl,
                            own_max_poll: own_poll,
                            longest_ttl: ttl,
                            longest_max_poll: max_poll,
                        },
                        Holds {
                            own_ttl: ttl,
                            own_max_poll: max_poll,
                            longest_ttl: Duration::ZERO,
                            longest_max_poll: Duration::ZERO,
                        },
                    ] {
                        let need = vanished_claim_wait(h, None).unwrap();
                        assert!(
                            need > belief + default_margin(ttl),
                            "{h:?}: wait {need:?} vs belief {belief:?}"
                        );
                        assert_eq!(
                            vanished_claim_wait(h, Some(belief)),
                            Some(need - belief),
                            "{h:?}"
                        );
                        // Observed the whole wait: go; a moment less: not.
                        assert_eq!(vanished_claim_wait(h, Some(need)), None);
                        assert_eq!(vanished_claim_wait(h, Some(need - ms(1))), Some(ms(1)));
                    }
                }
            }
        }
        // The figures: ttl 600 ms, max_poll 100 ms: hold 1.2 s, belief
        // 1.14 s, wait 1.26 s (tests/fleet.rs waits on these).
        assert_eq!(claim_hold(ms(600), ms(100)), ms(1_200));
        assert_eq!(claim_belief(ms(600), ms(100)), ms(1_140));
        let h = Holds {
            own_ttl: ms(600),
            own_max_poll: ms(100),
            longest_ttl: ms(600),
            longest_max_poll: ms(100),
        };
        assert_eq!(vanished_claim_wait(h, None), Some(ms(1_260)));
        // A peer that publishes a longer max_poll lengthens every wait.
        let h = Holds {
            longest_max_poll: ms(5_000),
            ..h
        };
        assert_eq!(vanished_claim_wait(h, None), Some(ms(5_660)));
        // Saturates, never panics.
        assert_eq!(claim_hold(Duration::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(
            claim_belief(Duration::MAX, Duration::ZERO),
            Duration::MAX - default_margin(Duration::MAX)
        );
    }

    #[test]
    fn what_counts_as_a_gone_claim_and_which_markers_are_raised() {
        let claim = ClaimRecord {
            epoch: 4,
            owner: crate::fleet::claim::Owner {
                node: "n1".into(),
                instance: "i1".into(),
            },
            state: ClaimState::Running,
            ..ClaimRecord::placeholder("n".into(), 0)
        };
        let placeholder = ClaimView::from(&ClaimRecord::placeholder("n".into(), 0));
        let marker = ClaimView::from(&ClaimRecord::vanished(3, "n".into(), 0));
        let claim = ClaimView::from(&claim);
        // (claim, highest epoch seen, gone?, raise to)
        let table: [(Option<&ClaimView>, u64, bool, Option<u64>); 9] = [
            (None, 0, true, None),
            (None, 7, true, None),
            (Some(&marker), 0, true, None),
            (Some(&marker), 3, true, None),
            (Some(&marker), 5, true, Some(5)),
            // A placeholder is a new session, unless it stands where we
            // saw a real claim (apply over a deleted one).
            (Some(&placeholder), 0, false, None),
            (Some(&placeholder), 2, true, None),
            (Some(&claim), 0, false, None),
            (Some(&claim), 9, false, None),
        ];
        for (c, seen, gone, raise) in table {
            assert_eq!(claim_gone(c, seen), gone, "{c:?} seen {seen}");
            assert_eq!(marker_raise(c, seen), raise, "{c:?} seen {seen}");
        }
    }

    #[test]
    fn an_absent_owner_is_waited_out_with_the_longer_ttl() {
        // (absent for, its ttl, our ttl, long enough?)
        let table = [
            (ms(0), ms(600), ms(600), false),
            (ms(659), ms(600), ms(600), false),
            (ms(660), ms(600), ms(600), true),
            // Its ttl longer than ours: its own.
            (ms(660), ms(10_000), ms(600), false),
            (ms(11_000), ms(10_000), ms(600), true),
            // Ours longer (its record said less, or nothing): ours.
            (ms(660), ms(0), ms(1_000), false),
            (ms(1_100), ms(0), ms(1_000), true),
        ];
        for (absent_for, its, own, go) in table {
            assert_eq!(
                owner_absent_long_enough(absent_for, its, own),
                go,
                "{absent_for:?} {its:?} {own:?}"
            );
        }
    }

    #[test]
    fn an_epoch_is_forgotten_only_over_a_holders_own_release_of_a_deleted_session() {
        let tomb = {
            let mut c = ClaimView::from(&ClaimRecord::placeholder("n".into(), 0));
            c.epoch = 7;
            c.owner = std::sync::Arc::new(crate::fleet::claim::Owner {
                node: "n1".into(),
                instance: "i1".into(),
            });
            c
        };
        assert!(tomb.state == ClaimState::Released && !tomb.is_placeholder());
        assert!(forget_epoch(false, Some(&tomb)));
        assert!(!forget_epoch(true, Some(&tomb)), "its manifest is listed");
        assert!(
            !forget_epoch(false, None),
            "missing: the absence rules wait it out"
        );
        let placeholder = ClaimView::from(&ClaimRecord::placeholder("n".into(), 0));
        assert!(!forget_epoch(false, Some(&placeholder)));
        let marker = ClaimView::from(&ClaimRecord::vanished(3, "n".into(), 0));
        assert!(!forget_epoch(false, Some(&marker)));
        let running = ClaimView {
            state: ClaimState::Running,
            ..tomb
        };
        assert!(!forget_epoch(false, Some(&running)));
    }
}
