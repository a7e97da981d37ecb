//! What the next pass must do beyond its schedule, and why: list `nodes/`
//! whatever `nodes_every` says, list everything rather than read the feed's
//! hints, or look at every manifest rather than the names hinted and left
//! waiting. Set from a dozen places (fences, the watch, the absence rules,
//! control, a failed pass); each says why, and a pass logs the reasons it
//! acted on (`debug`), so "why did this pass list everything?" has an
//! answer in the log.

/// Why the next pass was asked to do more than its schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// A new registration: nothing is known yet.
    Registered,
    /// The last pass failed half-way and may have consumed what said what
    /// to look at (the feed's hints, names left waiting).
    PassFailed,
    /// The control object changed (cordon, drain, uncordon).
    ControlChanged,
    /// A full listing: every manifest is looked at after one.
    FullListing,
    /// Capacity ran out with names left to look at.
    CapacityRanOut,
    /// A fence needs the owner's record, which was not in our view: a peer
    /// the slow `nodes/` listing missed.
    OwnerNotInView,
    /// A fence's fresh read found the owner's record gone or changed since
    /// the listing it judged on.
    OwnerOvertaken,
    /// A fence's tombstone lost its race: the owner renewed or was fenced.
    TombstoneRejected,
    /// A peer's listed version has stood still for over half its ttl: its
    /// expiry is judged on a listing.
    PeerExpiring,
    /// A peer marked unproven has not stood still yet.
    PeerUnproven,
    /// The pause between passes is too brisk to watch the ring.
    TooBriskToWatch,
    /// The ring watch saw a peer stand still, or the bell rang.
    WatchOrBell,
    /// A claim went missing (the absence rules run on full listings).
    ClaimGone,
    /// A vanished marker no listing has shown yet.
    MarkerUnobserved,
    /// The listing interval grew: our claims are confirmed at the new one.
    PaceGrew,
    /// A peer of an older build is live while our interval is grown.
    OlderPeer,
}

/// See the module docs. Each field keeps the first reason given since the
/// pass that last acted on it.
#[derive(Debug)]
pub(super) struct NextPass {
    nodes: Option<Why>,
    full: Option<Why>,
    rescan: Option<Why>,
}

impl NextPass {
    /// A registration's first pass: lists `nodes/` and looks at everything.
    pub(super) fn registered() -> Self {
        NextPass {
            nodes: Some(Why::Registered),
            full: None,
            rescan: Some(Why::Registered),
        }
    }

    pub(super) fn list_nodes(&mut self, why: Why) {
        self.nodes.get_or_insert(why);
    }

    pub(super) fn list_all(&mut self, why: Why) {
        self.full.get_or_insert(why);
    }

    pub(super) fn rescan(&mut self, why: Why) {
        self.rescan.get_or_insert(why);
    }

    /// Whether a full listing was asked for (read, not taken: the pass
    /// that lists everything clears it with [`NextPass::listed_all`]).
    pub(super) fn full_asked(&self) -> bool {
        self.full.is_some()
    }

    /// A full listing was sent: the ask is met, and every manifest is
    /// looked at after it.
    pub(super) fn listed_all(&mut self) {
        if let Some(why) = self.full.take() {
            tracing::debug!(?why, "listed everything");
        }
        self.rescan(Why::FullListing);
    }

    /// Takes the ask to list `nodes/`.
    pub(super) fn take_nodes(&mut self) -> Option<Why> {
        let why = self.nodes.take();
        if let Some(why) = why {
            tracing::debug!(?why, "listing nodes/ this pass");
        }
        why
    }

    /// Takes the ask to look at every manifest.
    pub(super) fn take_rescan(&mut self) -> Option<Why> {
        let why = self.rescan.take();
        if let Some(why) = why {
            tracing::debug!(?why, "looking at every manifest this pass");
        }
        why
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ask_keeps_its_first_reason_until_taken() {
        let mut n = NextPass::registered();
        assert_eq!(n.take_nodes(), Some(Why::Registered));
        assert_eq!(n.take_nodes(), None);
        n.list_nodes(Why::PeerExpiring);
        n.list_nodes(Why::WatchOrBell);
        assert_eq!(n.take_nodes(), Some(Why::PeerExpiring));
        assert!(!n.full_asked());
        n.list_all(Why::ClaimGone);
        assert!(n.full_asked());
        assert_eq!(n.take_rescan(), Some(Why::Registered));
        n.listed_all();
        assert!(!n.full_asked());
        assert_eq!(n.take_rescan(), Some(Why::FullListing));
    }
}
