//! Pacing: how often a node passes and lists, how the full listing's pace grows with the fleet, which peers' views changed.

use super::*;

/// How a pass saw one peer: (id, instance, live, offers capacity,
/// unproven). A pass keeps the sorted list of these to tell a change in the
/// fleet.
pub type PeerSeen = (String, String, bool, bool, bool);

/// The ids of the peers whose view differs between two passes (`before`
/// and `after` sorted): one that came, went, or changed instance,
/// liveness, its unproven mark or whether it offers capacity.
///
/// Why a pass needs no more than these after a fleet change (issue #14: a
/// survivor rescanned all 100,000 manifests when one peer died): a name
/// that was not claimable stays so until its manifest or claim changes
/// (hints and full listings name those) or its holder's liveness does
/// ([`plan::owner_live`](crate::fleet::plan::owner_live), which reads the views of
/// the holder's id only). Every other name the last pass looked at and did
/// not claim is revisited anyway, ranks and all (a corrupt key answers
/// Skip, never NotClaimable, so it is revisited too). A node's own owner
/// is fixed for its life (a re-registration starts a new `Node`, which
/// looks at everything). So the names to look at again are those whose
/// claim names one of these ids.
pub fn peers_changed(
    before: &[PeerSeen],
    after: &[PeerSeen],
) -> std::collections::BTreeSet<String> {
    let (b, a): (std::collections::BTreeSet<_>, std::collections::BTreeSet<_>) =
        (before.iter().collect(), after.iter().collect());
    b.symmetric_difference(&a).map(|p| p.0.clone()).collect()
}

/// The pause before the next pass: the base poll while anything changes,
/// doubling with each idle pass up to `max_poll`.
pub fn pace(poll: Duration, max_poll: Duration, idle_passes: u32) -> Duration {
    poll.saturating_mul(2u32.saturating_pow(idle_passes.min(6)))
        .min(max_poll)
}

/// Must this pass list all of `manifests/` and `sessions/` (anti-entropy),
/// or may it be light (the change feed only)? Full when the feed is off, at
/// the first pass (`since_full` None), when forced, and early enough that
/// the pause after this pass (at most `max_poll`) cannot carry the next
/// full listing past `full_every`: the belief in our claims is measured in
/// `full_every` (`claim_belief`), so the listings that confirm them must
/// come at least that often, as passes come at least every `max_poll`
/// when the feed is off.
pub fn full_listing_due(
    feed_on: bool,
    since_full: Option<Duration>,
    full_every: Duration,
    max_poll: Duration,
    forced: bool,
) -> bool {
    !feed_on || forced || since_full.is_none_or(|d| d.saturating_add(max_poll) >= full_every)
}

/// The anti-entropy interval a node wants for a fleet of `objects` listed
/// objects (manifests and claims, as its last full listing counted them):
/// `full_every` for each `per` of them, at least one (issue #14). A full
/// listing's cost grows with the fleet; stretched so, its cost per hour
/// does not, up to [`FULL_EVERY_CAP`] (a `full_every` set longer stands).
/// `per` zero: always `full_every`.
///
/// What a longer interval trades, and why it is safe: a node's belief in
/// its claims, and the hold a peer waits out before making one of its
/// vanished claims again, are both measured in it (`claim_belief`,
/// `claim_hold`), so a claim deleted by hand waits longer to be made again.
/// A node never lists less often than it has published (`adopt_pace`), and
/// a peer reads every node record again before it makes a vanished claim
/// (`Node::read_holds`).
pub fn full_listing_pace(full_every: Duration, per: u64, objects: u64) -> Duration {
    if per == 0 {
        return full_every;
    }
    let steps = objects.div_ceil(per).max(1);
    full_every
        .saturating_mul(u32::try_from(steps).unwrap_or(u32::MAX))
        .min(FULL_EVERY_CAP.max(full_every))
}

/// The longest a full-listing interval grows with the fleet (as `node run
/// --full-every` allows at most): a claim deleted by hand waits about
/// twice it, however large the fleet.
pub const FULL_EVERY_CAP: Duration = Duration::from_secs(24 * 3600);

/// The interval a node may list at now (`current`), given the one it wants
/// (`wanted`, `full_listing_pace`) and the longest its node record carries
/// in a renewal that has landed (`published`). Shorter at once: listing
/// more often than published only ends beliefs sooner. Longer only as far
/// as published: a peer about to make one of our vanished claims again
/// reads our record first (`Node::read_holds`), so it waits out any
/// interval we list at; one we had not published yet it could not know.
pub fn adopt_pace(current: Duration, wanted: Duration, published: Duration) -> Duration {
    if wanted <= current {
        wanted
    } else {
        current.max(wanted.min(published))
    }
}

/// The change feed's skew window: how far a light pass's cursor trails its
/// own wall clock. It covers writers' clock offsets and the latency between
/// a hint's stamp and its landing; a hint beyond it waits for the full
/// listing. A ttl, at least 2 s: node clocks are trusted to about a
/// second elsewhere too (the doctor warns beyond).
pub fn feed_skew(ttl: Duration) -> Duration {
    ttl.max(Duration::from_secs(2))
}

/// Does this pass list `nodes/`? Always when it lists everything (`full`:
/// a full pass, or the feed off) or something asks for it now (`asked`:
/// the watch or the bell woke it, a nudge, a hint naming a peer not yet
/// known, a peer about to expire, a pass that failed half-way); else once
/// `every` has passed since the last listing of it (`since`).
///
/// Safe at any pace: a peer is judged expired only if a listing *sent*
/// ttl + margin after its version first arrived still showed it, so a
/// listing skipped only makes a judgement later, never earlier; and a
/// takeover still fences the owner with If-Match on the version judged.
pub fn nodes_listing_due(full: bool, asked: bool, since: Duration, every: Duration) -> bool {
    full || asked || since >= every
}

/// The idle count after a pass.
pub fn idle_after(idle_passes: u32, changed: bool) -> u32 {
    if changed {
        0
    } else {
        idle_passes.saturating_add(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn peers_changed_names_every_peer_whose_view_moved_and_no_other() {
        let p = |id: &str, inst: &str, live: bool, cap: bool, unproven: bool| -> PeerSeen {
            (id.into(), inst.into(), live, cap, unproven)
        };
        let before = vec![
            p("a", "1", true, true, false),
            p("b", "1", true, true, false),
            p("c", "1", true, true, false),
            p("d", "1", true, true, false),
            p("e", "1", true, true, false),
        ];
        let mut after = vec![
            p("a", "1", true, true, false),  // unchanged
            p("b", "1", false, true, false), // died
            p("c", "2", true, true, false),  // a new instance
            p("d", "1", true, false, false), // full
            p("e", "1", true, true, true),   // unproven
            p("f", "1", true, true, false),  // came
        ];
        after.sort();
        let got: Vec<String> = peers_changed(&before, &after).into_iter().collect();
        assert_eq!(got, ["b", "c", "d", "e", "f"]);
        // One that went; and nothing at all when nothing moved.
        let got: Vec<String> = peers_changed(&before, &before[..4]).into_iter().collect();
        assert_eq!(got, ["e"]);
        assert!(peers_changed(&before, &before).is_empty());
    }

    /// Full listings come at least every `full_every` counting the pause
    /// after them; light passes only with the feed on, never first.
    #[test]
    fn full_listings_come_before_the_belief_runs_out() {
        let (full, poll) = (ms(600_000), ms(10_000));
        assert!(
            full_listing_due(false, Some(ms(1)), full, poll, false),
            "feed off"
        );
        assert!(
            full_listing_due(true, None, full, poll, false),
            "first pass"
        );
        assert!(
            full_listing_due(true, Some(ms(1)), full, poll, true),
            "forced"
        );
        assert!(!full_listing_due(true, Some(ms(1)), full, poll, false));
        assert!(!full_listing_due(
            true,
            Some(ms(589_999)),
            full,
            poll,
            false
        ));
        assert!(full_listing_due(true, Some(ms(590_000)), full, poll, false));
        // Whatever the timing of passes (each pause at most max_poll), no
        // two full listings are further apart than full_every.
        for pause in [1, 999, 4_321, 10_000] {
            let (mut t, mut last) = (0u64, 0u64);
            while t < 5_000_000 {
                t += pause;
                if full_listing_due(true, Some(ms(t - last)), full, poll, false) {
                    assert!(t - last <= 600_000, "pause {pause}: {}", t - last);
                    last = t;
                }
            }
        }
        assert_eq!(feed_skew(ms(10_000)), ms(10_000));
        assert_eq!(feed_skew(ms(600)), ms(2_000));
    }

    /// The anti-entropy interval grows with the fleet, a `full_every` per
    /// `per` objects, and is taken up only as far as it was published.
    #[test]
    fn the_full_listing_pace_grows_with_the_fleet_once_published() {
        let ten = ms(600_000);
        assert_eq!(full_listing_pace(ten, 0, 200_000), ten, "fixed");
        assert_eq!(full_listing_pace(ten, 20_000, 0), ten);
        assert_eq!(full_listing_pace(ten, 20_000, 20_000), ten);
        assert_eq!(full_listing_pace(ten, 20_000, 20_001), ten * 2);
        assert_eq!(full_listing_pace(ten, 20_000, 200_000), ten * 10);
        assert_eq!(
            full_listing_pace(Duration::MAX, 1, u64::MAX),
            Duration::MAX,
            "saturates"
        );
        assert_eq!(
            full_listing_pace(ten, 1, u64::MAX),
            FULL_EVERY_CAP,
            "capped"
        );
        assert_eq!(full_listing_pace(ten, 20_000, 3_000_000), FULL_EVERY_CAP);
        let long = FULL_EVERY_CAP * 2;
        assert_eq!(
            full_listing_pace(long, 1, 5),
            long,
            "a longer full_every stands"
        );
        let (cur, want) = (ms(600_000), ms(6_000_000));
        assert_eq!(adopt_pace(cur, want, cur), cur, "not published: kept");
        assert_eq!(
            adopt_pace(cur, want, ms(1_200_000)),
            ms(1_200_000),
            "as far as published"
        );
        assert_eq!(adopt_pace(cur, want, want * 2), want);
        assert_eq!(adopt_pace(want, cur, want), cur, "shorter at once");
        assert_eq!(adopt_pace(want, cur, ms(1)), cur, "whatever is published");
        assert_eq!(adopt_pace(cur, want, ms(1)), cur, "never below the current");
    }

    #[test]
    fn pacing_doubles_while_idle_up_to_max_poll() {
        let (poll, max) = (Duration::from_millis(100), Duration::from_secs(2));
        let got: Vec<u128> = (0..8).map(|i| pace(poll, max, i).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(
            pace(Duration::from_secs(1), Duration::MAX, u32::MAX),
            Duration::from_secs(64)
        );
        assert_eq!(idle_after(5, true), 0);
        assert_eq!(idle_after(u32::MAX, false), u32::MAX);
    }
}
