//! The pace of full listings: how often a pass lists every prefix, grown
//! and shrunk with the fleet's size and published in the node record so
//! that peers can tell how stale this node's view may be.

use super::*;

impl Node {
    /// The longest between two listings that confirm our claims, as this
    /// node lists now (the longer of `max_poll` and the interval grown with
    /// the fleet, `full_every`): our own part of a vanished claim's hold.
    /// Our belief is measured in `pace.belief`, never longer.
    pub(super) fn confirm_every(&self) -> Duration {
        self.cfg.max_poll.max(self.pace.full_every)
    }

    /// After a full listing that counted `objects` manifests and claims:
    /// the interval wanted for them, taken at once if shorter, and handed
    /// to the renew task to publish. Longer is taken only once published
    /// (`take_published_pace`). Only with the feed on: without it every
    /// pass lists everything.
    ///
    /// Not grown while a peer of an older build is live
    /// (`older_peer_live`; judged on this full pass's `nodes/` listing and
    /// on records read since it, see `fetch_unread_nodes`): such a peer
    /// would not read our record before making one of our vanished claims
    /// again. When those reads failed (`records_read` false) the interval
    /// is kept as it is, neither grown nor shrunk.
    ///
    /// Called after the pass has stopped what its listing no longer showed
    /// (`reconcile_owned`): a shorter interval shortens our belief at once,
    /// and a claim the listing did not show (deleted by hand) still carries
    /// the confirmation of the listing before, which measured in the
    /// shorter belief may already have run out, and would end every
    /// session's deadline with it (the runner's deadline is the node's).
    ///
    /// Nor shrunk while a claim we hold was not confirmed by this listing
    /// (`all_confirmed` false: one it did not show that could not be read
    /// back): measured in the shorter belief, that claim's older
    /// confirmation would end every session's deadline with it. Staying at
    /// the longer interval a pass more is safe: every peer that could wait
    /// out our claims read it (an older peer that joined while we were
    /// grown read it in its first pass; `longest` only grows).
    pub(super) fn note_fleet_size(
        &mut self,
        objects: u64,
        records_read: bool,
        all_confirmed: bool,
    ) {
        if !self.cfg.feed_on() {
            return;
        }
        let grown =
            core::full_listing_pace(self.cfg.full_every, self.cfg.full_every_objects, objects);
        self.pace.wanted = if grown > self.cfg.full_every
            && self.older_peer_live(crate::fleet::attrs::PROTO_READS_HOLDS)
        {
            if !std::mem::replace(&mut self.pace.growth_held, true) {
                tracing::info!(
                    wanted_ms = grown.as_millis() as u64,
                    kept_ms = self.cfg.full_every.as_millis() as u64,
                    "the full-listing interval is not grown: a live peer of an older build does not read holds"
                );
            }
            self.cfg.full_every
        } else if grown > self.pace.full_every && (!records_read || self.corrupt_peer_unsettled()) {
            // The records could not be read, or one listed under `nodes/`
            // does not decode and has been renewed lately (a node of an
            // unknown build may stand behind it): not grown this time.
            tracing::debug!("peer records not read: the full-listing interval is kept");
            self.pace.full_every
        } else {
            self.pace.growth_held = false;
            grown
        };
        if self.pace.wanted < self.pace.full_every && !all_confirmed {
            tracing::debug!("a claim not confirmed by this listing: the interval shrinks later");
            self.pace.wanted = self.pace.full_every;
        }
        self.take_published_pace();
        let wanted = self.pace.wanted;
        self.pace.tx.send_if_modified(|v| {
            let changed = *v != wanted;
            *v = wanted;
            changed
        });
    }

    /// Takes up as much of the wanted interval as a landed renewal has
    /// published (`core::adopt_pace`).
    pub(super) fn take_published_pace(&mut self) {
        let published = self
            .pace
            .landed
            .as_ref()
            .map_or(self.cfg.full_every, |rx| *rx.borrow());
        let next = core::adopt_pace(self.pace.full_every, self.pace.wanted, published);
        if next > self.pace.full_every {
            self.pace.grown_at = self.deps.clock.now();
            // Our claims were confirmed at the old interval and keep its
            // belief (`pace.belief`), which would run out before a listing
            // at the new one: a full listing now confirms them at it.
            self.next.list_all(Why::PaceGrew);
        }
        // Shorter at once; longer once every claim is confirmed at it
        // (`recount_confirmed`).
        self.pace.belief = self.pace.belief.min(next);
        if next != self.pace.full_every {
            tracing::info!(
                from = ?self.pace.full_every,
                to = ?next,
                "full listings: interval changed with the fleet's size"
            );
            self.pace.full_every = next;
        }
    }
}
