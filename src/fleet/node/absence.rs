//! Absence rules for a claim that vanished from the bucket: the hold a
//! vanished claim's marker must be observed for before anyone makes it again,
//! the markers themselves (made, raised, read back), and the reads that
//! prove a hold. docs/protocol.md, "Absence", states the rules; `core`
//! decides them.

use super::*;

impl Node {
    /// Keeps `seen_claims` (the highest epoch seen per claim of a listed
    /// manifest); called after each complete listing of `manifests/` and
    /// `sessions/`.
    pub(super) fn observe_claim_absence(&mut self) {
        // Without a copy of every listed key or a key formatted per claim
        // into a fresh string: this runs over every session in the fleet
        // at each full listing (issue #14).
        use crate::keys::{MANIFESTS, SESSIONS, key_in, tail};
        let (manifests, corrupt) = (&self.manifests, &self.corrupt);
        let listed = |mkey: &str| manifests.contains_key(mkey) || corrupt.contains_key(mkey);
        let mut ckey = String::new();
        for m in manifests
            .keys()
            .chain(corrupt.keys().filter(|k| k.starts_with(MANIFESTS)))
        {
            let ckey = key_in(&mut ckey, SESSIONS, tail(MANIFESTS, m));
            // Markers too: a raised marker carries its last holder's epoch.
            if let Some((_, c)) = self.claims.get(ckey) {
                match self.memory.seen_claims.get_mut(ckey) {
                    Some(e) => *e = (*e).max(c.epoch),
                    None => {
                        self.memory.seen_claims.insert(ckey.to_string(), c.epoch);
                    }
                }
            }
        }
        let mut mkey = String::new();
        self.memory
            .seen_claims
            .retain(|k, _| listed(key_in(&mut mkey, MANIFESTS, tail(SESSIONS, k))));
    }

    /// Writes a vanished marker at `epoch` to `key` under `cond` (a fresh
    /// nonce each time, so its version is new); the marker is returned too.
    pub(super) async fn put_marker(
        &self,
        key: &str,
        epoch: u64,
        cond: Cond,
    ) -> (Result<Put>, ClaimRecord) {
        let marker =
            ClaimRecord::vanished(epoch, self.deps.entropy.hex_id(), self.deps.clock.wall_ms());
        let put = put_checked(
            &self.deps.store,
            key,
            Bytes::from(marker.encode()),
            cond,
            &marker.nonce,
            json_nonce,
        )
        .await;
        (put, marker)
    }

    /// Writes the marker of `name`'s vanished claim (create-if-absent; see
    /// `ClaimRecord::vanished`) at the highest epoch we saw for it. Landed,
    /// it is cached; rejected, someone wrote the key first (their marker,
    /// or a claim), which the next listing shows.
    pub(super) async fn mark_vanished(&mut self, name: &str) -> Result<()> {
        let key = crate::keys::session(name);
        let epoch = self.memory.seen_claims.get(&key).copied().unwrap_or(0);
        let (put, marker) = self.put_marker(&key, epoch, Cond::Create).await;
        match put? {
            Put::Committed(v) => {
                self.event(
                    EventKind::Vanished,
                    Some(name),
                    Some(epoch),
                    "its claim vanished from the bucket; marked, to be made again after the hold period",
                );
                self.claims.insert(key, (v, ClaimView::from(&marker)));
            }
            Put::Rejected(found) => self.cache_read_back(&key, found),
        }
        Ok(())
    }

    /// Caches what a rejected conditional write of claim `key` found there
    /// (None: nothing, for an If-Match).
    pub(super) fn cache_read_back(&mut self, key: &str, found: Option<(Bytes, Version)>) {
        match found {
            Some((bytes, version)) => match decode_claim_view(key, &bytes) {
                Ok(c) => {
                    self.corrupt.remove(key);
                    self.claims.insert(key.to_string(), (version, c));
                }
                Err(_) => {
                    self.corrupt.insert(key.to_string(), version);
                }
            },
            None => {
                self.claims.remove(key);
            }
        }
        self.note_claim(key);
    }

    /// A vanished marker (at `version`, `epoch`) below the highest epoch we
    /// saw for `name`: raise it (If-Match), so that whichever node makes the
    /// claim again, however little it saw, goes above every epoch we saw.
    /// The new version restarts every node's watch. Nothing to do otherwise.
    pub(super) async fn raise_marker(
        &mut self,
        name: &str,
        version: Version,
        c: &ClaimView,
    ) -> Result<()> {
        let key = crate::keys::session(name);
        let seen = self.memory.seen_claims.get(&key).copied().unwrap_or(0);
        let Some(epoch) = core::marker_raise(Some(c), seen) else {
            return Ok(());
        };
        let (put, marker) = self.put_marker(&key, epoch, Cond::Match(version)).await;
        if let Put::Committed(v) = put? {
            self.claims.insert(key, (v, ClaimView::from(&marker)));
        }
        Ok(())
    }

    /// How long before the vanished claim of `name` may be made again
    /// (`core::vanished_claim_wait`, on the version standing where it was as
    /// this node's listings observed it); `None`: it may now.
    ///
    /// Ripe by what this node has read, it is still pending until it has
    /// read every node record again (`read_holds`), and it is judged as of
    /// those reads: ripe only if its wait had run out when they were sent.
    /// Why: a peer whose full listings grew further apart with the fleet
    /// (`core::full_listing_pace`) may have published the longer interval
    /// since we last read its record. What makes the reads enough is the
    /// holder's side: its belief is never longer than what its record
    /// showed when the belief's confirmation was made (a longer interval is
    /// published before it is used, `core::adopt_pace`, and old
    /// confirmations keep the old belief, `pace.belief`; a shorter one
    /// shortens the belief at once), and `longest` only grows. So a wait
    /// that had run out as of the reads stays so: the holder's deadline
    /// for the vanished claim had passed by then, and nothing confirms
    /// that claim again.
    pub(super) fn absent_claim_wait(&self, name: &str) -> Option<Duration> {
        let known = self.absent_claim_wait_as_of(name, Duration::ZERO);
        if known.is_some() {
            return known;
        }
        match self.holds_read {
            Some(at) => {
                let back = self.deps.clock.now().saturating_since(at);
                self.absent_claim_wait_as_of(name, back)
                    .map(|left| left.saturating_sub(back))
            }
            // Left: nothing but the reads.
            None => Some(Duration::ZERO),
        }
    }

    /// Must the node records be read again (`read_holds`) before `name`'s
    /// vanished claim may be made: ripe by the holds this node knows, not
    /// ripe as of the last reads, and those at least a ttl ago (a name
    /// that stays unclaimable by this node for other reasons, rank or a
    /// selector, costs one read, not one per pass).
    pub(super) fn holds_unread_for(&self, name: &str) -> bool {
        if self.absent_claim_wait_as_of(name, Duration::ZERO).is_some() {
            return false;
        }
        match self.holds_read {
            None => true,
            Some(at) => {
                let back = self.deps.clock.now().saturating_since(at);
                back >= self.cfg.ttl && self.absent_claim_wait_as_of(name, back).is_some()
            }
        }
    }

    /// Reads every peer's node record again (a listing of `nodes/` and a
    /// GET each) before a vanished claim is made again: its holder's
    /// published interval, whatever it is now, goes into the hold
    /// (`longest`). Only when a vanished claim's wait ran out, at most once
    /// a ttl (`holds_unread_for`). Counts as read only if every listed
    /// record was read and decoded: a corrupt one (even a truncated
    /// response) may be the holder's, whose interval we would not know.
    pub(super) async fn read_holds(&mut self) -> Result<()> {
        // Sent before the reads: what they show is as of this moment or later.
        let at = self.deps.clock.now();
        let mut listed = Vec::new();
        let mut listing = self.deps.store.list(crate::keys::NODES);
        while let Some(e) = listing.next().await {
            let e = e.map_err(|e| Error::from_store("list", crate::keys::NODES, e))?;
            listed.push((e.key, e.version));
        }
        drop(listing);
        let own = crate::keys::node(&self.cfg.id);
        for (key, version) in listed.iter().filter(|(k, _)| *k != own) {
            self.fetch_node(key, None).await?;
            if !self.peers.corrupt.contains(key) {
                continue;
            }
            // Corrupt as read (a truncated response, or foreign bytes): its
            // interval is unknown, unless nothing has renewed it for a ttl
            // and the margin, so that no live holder stands behind it (the
            // liveness rule; a holder's belief ends with its lease).
            let ttl = self.cfg.ttl.max(self.memory.longest.0);
            let still = self
                .client
                .observer()
                .unchanged_for(key, version, self.deps.clock.now());
            if still.is_none_or(|d| d < ttl.saturating_add(default_margin(ttl))) {
                return Err(Error::Corrupt {
                    key: key.clone(),
                    reason: "a node record read before making a vanished claim again".into(),
                });
            }
        }
        self.holds_read = Some(at);
        Ok(())
    }

    /// The wait of `absent_claim_wait` by the holds this node knows, with
    /// the observation taken `back` ago (as of earlier reads).
    pub(super) fn absent_claim_wait_as_of(&self, name: &str, back: Duration) -> Option<Duration> {
        let ckey = crate::keys::session(name);
        let holds = core::Holds {
            own_ttl: self.cfg.ttl,
            own_max_poll: self.confirm_every(),
            // `longest` keeps every record we ever read, gone or not.
            longest_ttl: self.memory.longest.0,
            longest_max_poll: self.memory.longest.1,
        };
        // Missing (no marker yet), or its version not seen in a listing:
        // no observation.
        let unchanged_for = self.claims.get(&ckey).and_then(|(v, _)| {
            self.client
                .observer()
                .unchanged_for(&ckey, v, self.deps.clock.now())
                .map(|d| d.saturating_sub(back))
        });
        core::vanished_claim_wait(holds, unchanged_for)
    }

    /// Has no listing shown the version standing where `name`'s claim
    /// vanished (its marker) yet?
    pub(super) fn marker_unobserved(&self, name: &str) -> bool {
        let ckey = crate::keys::session(name);
        self.claims.get(&ckey).is_none_or(|(v, _)| {
            self.client
                .observer()
                .unchanged_for(&ckey, v, self.deps.clock.now())
                .is_none()
        })
    }

    /// Is the claim at `key` (as last read) gone (`core::claim_gone`)?
    pub(super) fn claim_vanished(&self, key: &str, claim: Option<&ClaimView>) -> bool {
        core::claim_gone(
            claim,
            self.memory.seen_claims.get(key).copied().unwrap_or(0),
        )
    }

    /// Has node record `key`, a claim's owner, been observed absent long
    /// enough (`core::owner_absent_long_enough`)?
    pub(super) fn node_absent_long_enough(&self, key: &str) -> bool {
        self.memory
            .absent_nodes
            .get(key)
            .is_some_and(|(since, ttl)| {
                core::owner_absent_long_enough(
                    self.deps.clock.now().saturating_since(*since),
                    *ttl,
                    self.cfg.ttl,
                )
            })
    }
}
