//! How long this node may act: the lease's validity, and each owned claim's
//! confirmation bound (a claim not seen as ours for too long stops its
//! session as a lost lease would).

use super::*;

impl Node {
    /// Lists, refreshes changed records, and acts. Returns whether anything
    /// changed (for pacing).
    /// The end of this node's validity now: the latest the renew task
    /// published, or zero once lost. Sessions are started with it, so they
    /// never get a deadline older than the lease's.
    /// Until when we may act on our sessions: the node lease's validity,
    /// and no later than `confirmed_until`.
    pub(super) fn valid_until(&self) -> MonoTime {
        let lease = self
            .validity
            .as_ref()
            .map(|rx| *rx.borrow())
            .filter(|v| !v.lost)
            .map(|v| v.until);
        core::session_deadline(lease, self.confirmed_until()).unwrap_or(MonoTime::ZERO)
    }

    /// Our belief in the claims we hold, each as of the last request that
    /// showed it ours (`Owned::confirmed`): until that *send* time + `hold` −
    /// margin (`core::claim_belief`; the earliest of them bounds every
    /// session: the deadline is the node's). A claim deleted from the bucket
    /// does not fence our node lease, so this is what bounds us: a peer makes
    /// a vanished claim again only by taking over the marker written where
    /// it was, after observing that marker's version unchanged for `hold` +
    /// margin (with the longest ttl and `max_poll_ms` it ever read) from the
    /// *arrival* of the first listing that showed it; the marker landed after
    /// the deletion, which came after our confirming request was sent (or
    /// that request would not have shown our claim).
    /// Passes come at least every `max_poll`, and the first that no longer
    /// shows our claim stops the session at once; a stalled pass lets the
    /// sessions' deadlines lapse (they restart at the next pass).
    ///
    /// Read from `confirmed_floor` (O(1)): at or before the exact bound,
    /// and equal to it after `recount_confirmed`, which every pass runs.
    pub(super) fn confirmed_until(&self) -> Option<MonoTime> {
        let belief = core::claim_belief(self.cfg.ttl, self.cfg.max_poll.max(self.pace.belief));
        // Checked in test builds (small fleets only: the walk is what the
        // floor saves): a floor above an owned session's confirmation
        // would give that session a deadline past its belief.
        #[cfg(debug_assertions)]
        if self.owned.len() <= 4096 {
            let exact = self.owned.values().map(|o| o.confirmed).min();
            debug_assert!(
                exact.is_none() || self.confirmed_floor.is_some_and(|f| Some(f) <= exact),
                "confirmed_floor {:?} above the earliest confirmation {exact:?}",
                self.confirmed_floor
            );
        }
        if self.owned.is_empty() {
            return None;
        }
        self.confirmed_floor.map(|t| t + belief)
    }

    /// Sets `confirmed_floor` to the exact earliest confirmation: once per
    /// pass (O(owned), as the pass's announcement always was), after the
    /// full listing's confirmations and the pass's removals.
    ///
    /// `raise`: the belief may be raised to the grown interval here. A full
    /// pass recounts without it before its interval is decided
    /// (`note_fleet_size`, after `reconcile_owned`), and with it after: a
    /// growth taken at the start of the pass may be given back by it (an
    /// older peer seen), and the grown belief must not be announced in
    /// between.
    pub(super) fn recount_confirmed(&mut self, raise: bool) {
        self.confirmed_floor = self.owned.values().map(|o| o.confirmed).min();
        // Every claim confirmed at the grown interval (or none held): our
        // belief may be measured in it (see `pace.belief`).
        if raise
            && self.pace.belief < self.pace.full_every
            && self.confirmed_floor.is_none_or(|f| f >= self.pace.grown_at)
        {
            self.pace.belief = self.pace.full_every;
        }
    }
}
