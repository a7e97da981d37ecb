//! Between passes (a store violation, a lost or lapsed lease, shutdown; never re-registering into a wiped bucket) and each pass's schedules (marker, control object, nudges).

use super::*;

/// What the serving loop knows between passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Between {
    /// An audit caught the store breaking its conditional writes.
    pub violation: bool,
    /// The renewal said the lease is lost.
    pub lease_lost: bool,
    /// The lease's validity has passed by the node's own clock (a renewal
    /// that has not come back in time counts as lost: past it, nothing is
    /// acted on).
    pub lease_expired: bool,
    pub shutdown: bool,
}

/// The serving loop's verdict before each pass, in this order: a store that
/// broke its conditions is refused (never re-registered with), then a lost
/// or lapsed lease stops everything, then a shutdown releases gracefully.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopVerdict {
    Refuse,
    LeaseLost,
    Shutdown,
    Pass,
}

pub fn between_passes(b: Between) -> LoopVerdict {
    if b.violation {
        LoopVerdict::Refuse
    } else if b.lease_lost || b.lease_expired {
        LoopVerdict::LeaseLost
    } else if b.shutdown {
        LoopVerdict::Shutdown
    } else {
        LoopVerdict::Pass
    }
}

/// After the lease is lost: a lost lease may be a wiped bucket, so the
/// marker is checked first, and a node never registers into a wiped or
/// replaced bucket. An unreadable marker is not a wipe (the next
/// registration's read checks again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerSeen {
    Same,
    WipedOrReplaced,
    Unreadable,
}

pub fn reregister_after_loss(marker: MarkerSeen) -> bool {
    marker != MarkerSeen::WipedOrReplaced
}

/// Is the fleet marker due for a re-read this pass? Before the first pass,
/// and `every` ttls after the last confirmation (every claim and fence
/// write checks it too, and a wiped bucket fails renewals within ttl/3).
pub fn marker_due(since_checked: Option<Duration>, ttl: Duration, every: u32) -> bool {
    since_checked.is_none_or(|d| d >= ttl.saturating_mul(every))
}

/// Is the operator's control object (`control/<id>`) due for a read this
/// pass? When nudged, until a read has succeeded (a cordoned node
/// restarting must not claim in the meantime), every pass while a drain
/// has sessions left, and one pass in `every` otherwise (`pass` counts
/// from 1).
pub fn control_due(
    nudged: bool,
    read_once: bool,
    draining_with_sessions: bool,
    pass: u64,
    every: u64,
) -> bool {
    nudged || !read_once || draining_with_sessions || (every > 0 && pass % every == 1 % every)
}

/// Keep the brisk pace while a peer's lease is about to expire (its listed
/// version unchanged, as of the listing, for over half its ttl but not yet
/// ttl + margin): detecting the expiry then costs one base poll, not one
/// backed-off poll. Once expired it was dealt with by this very pass; a
/// dead node that nobody fences (it held no sessions) stays listed until
/// `gc`, and must not keep every peer at the brisk pace until then.
pub fn peer_expiring(released: bool, unchanged_for: Option<Duration>, ttl: Duration) -> bool {
    !released
        && unchanged_for.is_some_and(|d| {
            d > ttl / 2 && !crate::liveness::stood_still_long_enough(d, ttl, default_margin(ttl))
        })
}

/// The pause after a nudge arrives during `pause`: brought forward to
/// `min_gap` at most once per pass, so a flood of nudges costs no more
/// than a pass every `min_gap`.
pub fn nudged_pause(pause: Duration, min_gap: Duration) -> Option<Duration> {
    (pause > min_gap).then_some(min_gap)
}

/// How long a pass may take before readiness reports the loop stalled:
/// two of the longest pauses plus a ttl.
pub fn pass_bound(poll: Duration, max_poll: Duration, ttl: Duration) -> Duration {
    max_poll.max(poll).saturating_mul(2).saturating_add(ttl)
}

/// Whether this node expires the change feed's old hints now: one node
/// does it (the first live id; others' deletes would only race it), every
/// `every` (`feed::RETENTION / 2`), and never while its last run is still
/// going (a burst leaves hundreds of thousands of hints).
pub fn runs_retention(
    me: &str,
    views: &[NodeView],
    since_last: Option<Duration>,
    every: Duration,
    last_finished: bool,
) -> bool {
    let first = views.iter().filter(|v| v.live).map(|v| v.id.as_str()).min() == Some(me);
    first && since_last.is_none_or(|d| d >= every) && last_finished
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[rustfmt::skip]
    #[test]
    fn between_passes_a_violation_outranks_a_lost_lease_which_outranks_shutdown() {
        use LoopVerdict::*;
        let b = Between { violation: false, lease_lost: false, lease_expired: false, shutdown: false };
        let rows: &[(&str, Between, LoopVerdict)] = &[
            ("serving", b, Pass),
            ("shutdown", Between { shutdown: true, ..b }, Shutdown),
            ("renewal lost", Between { lease_lost: true, shutdown: true, ..b }, LeaseLost),
            // A renewal still in flight past the deadline: not acted on.
            ("lapsed", Between { lease_expired: true, ..b }, LeaseLost),
            ("violation", Between { violation: true, lease_lost: true, shutdown: true, ..b }, Refuse),
        ];
        for (what, b, want) in rows {
            assert_eq!(between_passes(*b), *want, "{what}");
        }
        assert!(reregister_after_loss(MarkerSeen::Same));
        assert!(reregister_after_loss(MarkerSeen::Unreadable));
        assert!(!reregister_after_loss(MarkerSeen::WipedOrReplaced));
    }

    #[test]
    fn pass_schedules() {
        // The marker: before the first pass, then every `every` ttls.
        assert!(marker_due(None, S, 10));
        assert!(!marker_due(Some(S * 9), S, 10));
        assert!(marker_due(Some(S * 10), S, 10));
        // The control object.
        assert!(control_due(false, true, false, 1, 5), "first pass");
        assert!(!control_due(false, true, false, 2, 5));
        assert!(control_due(false, true, false, 6, 5));
        assert!(control_due(true, true, false, 2, 5), "nudged");
        assert!(control_due(false, false, false, 2, 5), "never read yet");
        assert!(control_due(false, true, true, 2, 5), "draining");
        assert!(control_due(false, true, false, 2, 1), "every pass");
        // A peer about to expire keeps the brisk pace; a released one or a
        // fresh version does not.
        assert!(peer_expiring(false, Some(S * 6), S * 10));
        assert!(peer_expiring(false, Some(S * 10), S * 10));
        assert!(
            !peer_expiring(false, Some(S * 11), S * 10),
            "expired: dealt with"
        );
        assert!(!peer_expiring(false, Some(S * 600), S * 10));
        assert!(!peer_expiring(false, Some(S * 5), S * 10));
        assert!(!peer_expiring(true, Some(S * 9), S * 10));
        assert!(!peer_expiring(false, None, S * 10));
        // A nudge shortens a long pause, never lengthens a short one.
        let gap = Duration::from_millis(200);
        assert_eq!(nudged_pause(S * 5, gap), Some(gap));
        assert_eq!(nudged_pause(Duration::from_millis(100), gap), None);
        assert_eq!(pass_bound(S, S * 4, S * 10), S * 18);
    }

    #[test]
    fn the_first_live_node_expires_the_feed_every_half_retention() {
        let v = |id: &str, live| NodeView {
            id: id.into(),
            instance: "1".into(),
            capacity: 1,
            load: 0,
            labels: Default::default(),
            live,
            unproven: false,
        };
        let views = [v("a", false), v("b", true), v("c", true)];
        let every = 60 * S;
        assert!(
            runs_retention("b", &views, None, every, true),
            "first live id"
        );
        assert!(!runs_retention("a", &views, None, every, true), "not live");
        assert!(!runs_retention("c", &views, None, every, true), "not first");
        assert!(!runs_retention("b", &views, Some(every - S), every, true));
        assert!(runs_retention("b", &views, Some(every), every, true));
        assert!(
            !runs_retention("b", &views, None, every, false),
            "the last run goes on"
        );
        assert!(
            !runs_retention("x", &[], None, every, true),
            "no view: nobody"
        );
    }
}
