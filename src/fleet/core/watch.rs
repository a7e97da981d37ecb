//! The ring watch: which peers a node watches, when it reads them, and when what it saw hurries a pass.

use super::*;

/// How many ring successors each node watches between passes. Two, so a
/// node is still watched when one of its watchers died with it.
pub const WATCHED: usize = 2;

/// The peers a node watches between passes (issue #14): the `k` after it in
/// the ring of node ids, sorted, wrapping; never itself. Every node computes
/// the ring from its own listing, so views that differ only shift who
/// watches whom: a node may be watched by one more or one less peer for a
/// pass, never decided about by the watch alone.
pub fn ring_successors<'a>(me: &str, peers: &[&'a str], k: usize) -> Vec<&'a str> {
    let mut ring: Vec<&'a str> = peers.iter().copied().filter(|p| *p != me).collect();
    ring.sort_unstable();
    ring.dedup();
    let start = ring.partition_point(|p| *p < me);
    (0..k.min(ring.len()))
        .map(|i| ring[(start + i) % ring.len()])
        .collect()
}

/// How often a watched peer's record is read when nothing better is known
/// (a conditional GET each, "not modified" while nothing changed), by its
/// place among our ring successors: the first twice per renewal period of
/// its ttl, the second (a stand-in for when the first died with it) every
/// ttl/2. The first is read sooner when its renewals can be foreseen
/// (`watch_wait`).
pub fn watch_period(ttl: Duration, position: usize) -> Duration {
    if position == 0 {
        renew_period(ttl) / 2
    } else {
        ttl / 2
    }
}

/// How long after a renewal is expected to have landed the first watched
/// peer is read: the write's own latency.
pub fn watch_slack(ttl: Duration) -> Duration {
    ttl / 50
}

/// How often the first watched peer is read again while a renewal it was
/// expected to have made has not shown (a late write, or a dead peer).
pub fn watch_retry(ttl: Duration) -> Duration {
    ttl / 40
}

/// When a watched peer's next renewal is expected to have been sent, as
/// of now (from its last record read: `next_renewal_in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreseen {
    /// Nothing foresees it (no record read yet, or its time could not be
    /// used).
    Unknown,
    /// In this long.
    In(Duration),
    /// This long ago.
    Overdue(Duration),
}

/// How long until a watched peer's record is read again.
///
/// Why it matters: a dead node is judged by how long its *last* version
/// has stood still since a response carrying it arrived (DESIGN, "Time"),
/// so every second between that renewal landing and a watcher reading it
/// is a second added to failover. Read every ttl/2 that lag was up to 5 s
/// at the default ttl.
///
/// - The first successor (`position` 0) is read when its next renewal is
///   expected to have landed (`foreseen`: its record's `renewed_at_ms` +
///   its renewal period, on wall clocks) plus `watch_slack`; while that
///   renewal is overdue but by less than a quarter period, every
///   `watch_retry`; past that, every `watch_period`. A wall clock only
///   schedules a read here, never judges: a peer's clock behind ours
///   makes the reads early (at most four retries per renewal), one ahead
///   makes them late (by at most a renewal period). In steady state with
///   clocks in step: one GET per renewal, about `watch_slack` after it.
/// - Otherwise every `watch_period` since the last read (`since_read`;
///   `None`: never read, so now).
/// - And never later than the instant its version will have stood still
///   for ttl + margin (`unchanged_for`, as of now), once: that read judges,
///   so a dead peer is seen dead at its deadline. A read at or past the
///   deadline has judged, and the next waits for the period again. In
///   steady state this costs nothing: a live peer's version changes every
///   ttl/3, long before its deadline.
pub fn watch_wait(
    ttl: Duration,
    position: usize,
    since_read: Option<Duration>,
    unchanged_for: Option<Duration>,
    foreseen: Foreseen,
) -> Duration {
    let period = renew_period(ttl);
    let by_period = match (since_read, foreseen) {
        (None, _) => Duration::ZERO,
        (Some(_), Foreseen::In(e)) if position == 0 => e.saturating_add(watch_slack(ttl)),
        (Some(r), Foreseen::Overdue(o)) if position == 0 && o < period / 4 => {
            watch_retry(ttl).saturating_sub(r)
        }
        (Some(r), _) => watch_period(ttl, position).saturating_sub(r),
    };
    let need = ttl.saturating_add(default_margin(ttl));
    let by_deadline = match (unchanged_for, since_read) {
        (Some(u), _) if u < need => need - u,
        // The deadline passed since our last read: that read did not judge.
        (Some(u), Some(r)) if r > u - need => Duration::ZERO,
        // Judged already (or never read): the period alone.
        _ => Duration::MAX,
    };
    by_period.min(by_deadline)
}

/// When, from a record just read, its holder's next renewal is expected to
/// have been sent: `renewed_at_ms` + its renewal period, as a wait from our
/// wall clock's `now_ms`, at most one renewal period (a clock far off must
/// not postpone the watch). `None` if that instant has passed by our clock.
pub fn next_renewal_in(ttl: Duration, renewed_at_ms: u64, now_ms: u64) -> Option<Duration> {
    let period = renew_period(ttl);
    let at = renewed_at_ms.saturating_add(u64::try_from(period.as_millis()).unwrap_or(u64::MAX));
    (at > now_ms).then(|| Duration::from_millis(at - now_ms).min(period))
}

/// How often a node reads the fleet's bell (`keys::BELL`) during a pause:
/// twice per renewal period, like the first watched peer. A ring (a new
/// version) runs a pass at once.
pub fn bell_period(ttl: Duration) -> Duration {
    renew_period(ttl) / 2
}

/// Is a pause of this length long enough to watch peers during it? Any
/// pause longer than the closest watch period. A pause shorter than that
/// asks the next pass to list `nodes/` instead (`nodes_listing_due`), which
/// learns as much.
pub fn watch_during(pause: Duration, ttl: Duration) -> bool {
    pause > watch_period(ttl, 0)
}

/// What a watch read of a peer's record showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// The version the listing showed, unchanged for this long since the
    /// first response that carried it arrived; `released`: it is a release
    /// or a fence (final already, nothing to hurry).
    Unchanged { for_: Duration, released: bool },
    /// Another version: it renewed.
    Renewed,
    /// No record: an absence to start observing.
    Missing,
    /// The read failed.
    Unknown,
}

/// Should the node run a pass now, rather than at the end of its pause?
/// Only a hint: the pass judges the peer again from its own listing, by the
/// same rule as always, and takes nothing over on the watch's word.
pub fn watch_says_pass(w: Watched, ttl: Duration) -> bool {
    match w {
        Watched::Unchanged { for_, released } => {
            !released && crate::liveness::stood_still_long_enough(for_, ttl, default_margin(ttl))
        }
        Watched::Missing => true,
        Watched::Renewed | Watched::Unknown => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn each_node_watches_its_ring_successors() {
        let all = ["a", "b", "c", "d"];
        assert_eq!(ring_successors("a", &all, 2), vec!["b", "c"]);
        assert_eq!(ring_successors("c", &all, 2), vec!["d", "a"], "wraps");
        assert_eq!(ring_successors("d", &all, 2), vec!["a", "b"]);
        // Not yet in the peers' list (just registered), or never listed.
        assert_eq!(ring_successors("bb", &all, 2), vec!["c", "d"]);
        assert_eq!(ring_successors("z", &all, 2), vec!["a", "b"]);
        assert_eq!(ring_successors("a", &["a", "b"], 2), vec!["b"]);
        assert!(ring_successors("a", &["a"], 2).is_empty());
        assert!(ring_successors("a", &[], 2).is_empty());
        // Every node of a ring is watched by exactly k others.
        let mut watched = std::collections::HashMap::new();
        for me in all {
            for p in ring_successors(me, &all, 2) {
                *watched.entry(p).or_insert(0) += 1;
            }
        }
        assert!(all.iter().all(|n| watched[n] == 2), "{watched:?}");
    }

    #[test]
    fn the_watch_hurries_a_pass_only_for_a_peer_standing_still_past_its_ttl() {
        let ttl = S * 10;
        let m = default_margin(ttl);
        let still = |for_| Watched::Unchanged {
            for_,
            released: false,
        };
        assert!(!watch_says_pass(still(ttl), ttl));
        assert!(!watch_says_pass(
            still(ttl + m - Duration::from_millis(1)),
            ttl
        ));
        assert!(watch_says_pass(still(ttl + m), ttl));
        assert!(!watch_says_pass(
            Watched::Unchanged {
                for_: ttl * 9,
                released: true
            },
            ttl
        ));
        assert!(watch_says_pass(Watched::Missing, ttl));
        assert!(!watch_says_pass(Watched::Renewed, ttl));
        assert!(!watch_says_pass(Watched::Unknown, ttl));
    }

    #[test]
    fn the_first_successor_is_read_as_its_renewal_lands_and_at_its_deadline() {
        let ttl = S * 10;
        let ms = Duration::from_millis;
        let r = renew_period(ttl);
        assert_eq!(watch_period(ttl, 0), r / 2);
        assert_eq!(watch_period(ttl, 1), S * 5);
        assert!(watch_during(ttl, ttl), "the default pause watches");
        assert!(!watch_during(r / 2, ttl));
        use Foreseen::*;
        // Never read: now.
        assert_eq!(watch_wait(ttl, 0, None, None, Unknown), Duration::ZERO);
        assert_eq!(watch_wait(ttl, 1, None, Some(S), In(S)), Duration::ZERO);
        // Foreseen: when the next renewal has landed (slack 200 ms).
        assert_eq!(
            watch_wait(ttl, 0, Some(ms(10)), Some(ms(10)), In(S * 3)),
            ms(3200)
        );
        // Not foreseen: the period.
        assert_eq!(
            watch_wait(ttl, 0, Some(ms(500)), Some(S * 6), Unknown),
            r / 2 - ms(500)
        );
        // The expected renewal has not shown yet: retried every 250 ms...
        assert_eq!(
            watch_wait(ttl, 0, Some(ms(100)), Some(S * 4), Overdue(ms(300))),
            ms(150)
        );
        // ...for a quarter period (833 ms), then the period (a clock far
        // off, or a dead peer: its deadline read comes anyway).
        assert_eq!(
            watch_wait(ttl, 0, Some(ms(100)), Some(S * 4), Overdue(ms(900))),
            r / 2 - ms(100)
        );
        // The second: every ttl/2, no foresight.
        assert_eq!(watch_wait(ttl, 1, Some(S), Some(S), In(S)), S * 4);
        // But no later than the deadline (ttl + margin = 11 s standing still).
        assert_eq!(
            watch_wait(ttl, 1, Some(S), Some(ms(10_500)), Unknown),
            ms(500)
        );
        assert_eq!(
            watch_wait(ttl, 0, Some(ms(100)), Some(S * 10), In(S * 3)),
            S
        );
        // Past it: read once more if the last read came before it...
        assert_eq!(
            watch_wait(ttl, 0, Some(S * 9), Some(S * 12), Overdue(S)),
            Duration::ZERO
        );
        // ...and not again before the period if it came after (no spinning
        // on a peer the watch cannot hurry, e.g. a release).
        assert_eq!(watch_wait(ttl, 1, Some(S), Some(S * 12), Unknown), S * 4);
        // The foresight: from the record's wall time, at most one period.
        assert_eq!(next_renewal_in(ttl, 100_000, 101_000), Some(ms(2333)));
        assert_eq!(next_renewal_in(ttl, 100_000, 103_334), None, "passed");
        assert_eq!(
            next_renewal_in(ttl, 200_000, 100_000),
            Some(r),
            "a clock far ahead"
        );
        assert_eq!(bell_period(ttl), r / 2);
    }
}
