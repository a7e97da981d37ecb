//! The claim endpoint's answer: a caller (the wake path, `resolve --wake`,
//! a peer) asks this node to claim one session now, between passes. The
//! same gate as the pull loop's decides (`core`); this file runs it for one
//! name and says why it declined.

use super::*;

impl Node {
    /// A claim request for a session this node holds: a wake that reached
    /// the owner, so the session is in use, and its idle time
    /// (`sleep.after_idle`) counts from now. `None` if it is not ours.
    pub(super) fn touch_owned(&mut self, name: &Name) -> Option<ClaimAnswer> {
        let now = self.deps.clock.now();
        let o = self.owned.get_mut(name.as_str())?;
        o.active_at = now;
        Some(ClaimAnswer::AlreadyOwned {
            node: self.me.node.clone(),
            epoch: o.record.epoch,
        })
    }

    /// Claims `name` now if the pull loop's rules allow it, after fresh reads
    /// (the caches may be a pass old). Skips only placement's ranking and
    /// its grace delay (the caller chose this node): the verdict is the pull
    /// loop's own `core::gate`, so the two cannot decide differently.
    pub(super) async fn claim_now(&mut self, name: &Name) -> Result<ClaimAnswer> {
        self.pass += 1;
        let node = self.me.node.clone();
        let declined = |reason: &str| ClaimAnswer::Declined {
            node: node.clone(),
            reason: reason.to_string(),
        };
        if let Some(owned) = self.touch_owned(name) {
            return Ok(owned);
        }
        if self.load() >= self.cfg.capacity {
            return Ok(declined("no free capacity"));
        }
        let mut round_trips = 1;

        let Some((m, mversion)) = crate::fleet::manifest::get(&self.deps.store, name).await? else {
            return Ok(declined("no manifest"));
        };
        let mkey = crate::keys::manifest(name);
        self.manifests
            .insert(mkey, (mversion, KnownManifest::of(&m)));
        let key = crate::keys::session(name);
        round_trips += 1;
        let claim = crate::fleet::claim::get(&self.deps.store, name.as_str())
            .await?
            .map(|(c, v)| (v, ClaimView::from(&c)));
        match &claim {
            Some((v, c)) => {
                self.claims.insert(key.clone(), (v.clone(), c.clone()));
            }
            // Gone: what the last listing cached is no longer there, and
            // must not stand in for what `absent_claim_wait` watches.
            None => {
                self.claims.remove(&key);
            }
        }
        let mut owner_corrupt = false;
        if let Some((_, c)) = &claim
            && c.owner.node != self.me.node
            && c.state != ClaimState::Released
            && c.state != ClaimState::Sleeping
        {
            round_trips += 1;
            let owner = crate::keys::node(&c.owner.node);
            self.fetch_node(&owner, None).await?;
            owner_corrupt = self.peers.corrupt.contains(&owner);
        }
        let mv = manifest_view(&m);
        if !plan::selects(&mv.selector, &self.cfg.labels) {
            return Ok(declined("this node's labels do not match the selector"));
        }
        let cv = claim.as_ref().map(|(_, c)| c.clone());
        let vanished = self.claim_vanished(&key, claim.as_ref().map(|(_, c)| c));
        if vanished && self.holds_unread_for(name.as_str()) {
            round_trips += 1;
            // Failed: the claim is declined as waiting (below).
            if let Err(e) = self.read_holds().await {
                tracing::warn!(session = %name, error = %crate::error::Chain(&e), "reading node records before a vanished claim");
            }
        }
        let loads = self.claim_loads();
        let views = self.node_views(&loads);
        let candidate = core::Candidate {
            // A corrupt claim or manifest failed the reads above (an error,
            // not a verdict).
            claim_corrupt: false,
            manifest_corrupt: false,
            owner_corrupt,
            claimable: plan::claimable(&mv, cv.as_ref(), &views, &self.me),
            control_read: self.control.read,
            cordoned: self.deps.status.cordoned(),
            draining: self.control.draining,
            absence_pending: vanished && self.absent_claim_wait(name.as_str()).is_some(),
            // Read just now.
            owner_stale: false,
            claimable_for: Duration::MAX,
            grace: self.cfg.grace,
            predecessor_unproven: self.predecessor_unproven(cv.as_ref()),
        };
        match core::gate_chosen(&candidate) {
            core::Gate::Claim => {}
            core::Gate::Skip => {
                return Ok(declined(core::skip_reason(
                    owner_corrupt,
                    self.control.read,
                )));
            }
            core::Gate::NotClaimable => {
                return Ok(declined(core::not_claimable_reason(&mv, cv.as_ref())));
            }
            core::Gate::AbsencePending if claim.is_none() => {
                // Witness the absence with a version of our own (see
                // `tick`); a missing claim is never taken, however long it
                // was missing.
                if let Err(e) = self.mark_vanished(name.as_str()).await {
                    tracing::warn!(session = %name, error = %crate::error::Chain(&e), "writing a vanished marker");
                }
                return Ok(declined(
                    "its claim vanished from the bucket; marked, to be made again after the hold period",
                ));
            }
            core::Gate::AbsencePending => {
                let left = self
                    .absent_claim_wait(name.as_str())
                    .unwrap_or(Duration::ZERO);
                return Ok(declined(&format!(
                    "its claim vanished from the bucket; waiting for the absence to be observed ({} left)",
                    humantime::format_duration(Duration::from_millis(left.as_millis() as u64))
                )));
            }
            // Grace: an unproven predecessor's claim (see
            // `predecessor_unproven_until`). The others are not reachable
            // with the owner read just now, a rank given and no grace to
            // wait; declined rather than assumed.
            core::Gate::RefetchOwner | core::Gate::Unranked | core::Gate::Grace => {
                return Ok(declined("not claimable now"));
            }
        }
        // As in a pass: no token can follow it, so nothing is read or sent.
        if core::at_highest_epoch(cv.as_ref()) {
            return Ok(declined(
                "its claim is at the highest epoch: no fencing token above it exists",
            ));
        }
        if let Some((_, c)) = &claim {
            if !self.fence_owner(c).await? {
                return Ok(declined(
                    "its owner renewed its lease, or its absence is too recent",
                ));
            }
            // Its other sessions' takers: hinted, rung, nudged.
            self.after_fence(&views);
            round_trips += 1;
        }
        round_trips += 1;
        let digest = m.digest.clone();
        self.claim(name.as_str(), digest, claim, Some(Arc::new(m.spec)))
            .await?;
        Ok(match self.owned.get(name.as_str()) {
            Some(o) => ClaimAnswer::Claimed {
                node: node.clone(),
                epoch: o.record.epoch,
                round_trips,
            },
            None => declined("another node claimed it first"),
        })
    }
}
