//! A wake's claim (`NodeHandle::wake_now`): a sleeping session claimed by
//! one conditional write on the version its waker just read, answered as
//! soon as that write commits. This is the wake path's whole budget
//! (DESIGN, "Wake path"; issue #39): the waker's resolve, this one write,
//! and the round trip to this node. Nothing is read here, unless this node
//! has never listed the manifest, or its last look at the fleet marker is
//! older than [`MARKER_FRESH_FOR`] of a ttl.

use super::*;
use crate::fleet::endpoint::Reply;

/// A wake's claim leans on a fleet-marker check made within this part of a
/// ttl (a renewal period) instead of making one: in a bucket wiped or
/// replaced since, this node's renewals fail within the same period, and it
/// stops everything. A wake after a longer quiet pays the one conditional
/// GET, as any claim does.
pub(super) const MARKER_FRESH_FOR: u32 = 3;

impl Node {
    /// Claims `name`, asleep in `claim` at `version` as the waker read it,
    /// or declines (nothing written) so the waker can fall back to
    /// releasing it for the fleet to place. A sleeping claim has no holder
    /// to fence: taking it is releasing it and claiming the release in one
    /// write, so it is judged as that release would be (`plan::claimable`
    /// on it, then the pull loop's own `core::gate`), and the write is
    /// If-Match on the very version read: a claim that moved since (another
    /// wake, an alarm) rejects it, and N concurrent wakes start one run.
    ///
    /// The manifest is judged by what this node's last listing saw. A
    /// manifest changed since costs what it costs the pull loop: the spec
    /// read after the write finds the new digest or no manifest, starts
    /// nothing, and the next pass reconciles the claim with it.
    pub(super) async fn wake_now(
        &mut self,
        name: &Name,
        version: Version,
        claim: ClaimRecord,
        reply: &Reply,
    ) -> Result<ClaimAnswer> {
        self.pass += 1;
        let node = self.me.node.clone();
        let declined = |reason: &str| ClaimAnswer::Declined {
            node: node.clone(),
            reason: reason.to_string(),
        };
        let now = self.deps.clock.now();
        if let Some(owned) = self.touch_owned(name) {
            return Ok(owned);
        }
        if claim.state != ClaimState::Sleeping {
            return Ok(declined("not asleep"));
        }
        if self.load() >= self.cfg.capacity {
            return Ok(declined("no free capacity"));
        }
        let mkey = crate::keys::manifest(name);
        let mut reads = 0;
        let (mv, port, checked) = match self.manifests.get(&mkey) {
            Some((_, k)) if !self.corrupt.contains_key(&mkey) => {
                (k.view.clone(), k.port, k.checked)
            }
            _ => {
                reads += 1;
                let Some((m, mversion)) =
                    crate::fleet::manifest::get(&self.deps.store, name).await?
                else {
                    return Ok(declined("no manifest"));
                };
                let known = KnownManifest::of(&m);
                let fields = (known.view.clone(), known.port, known.checked);
                self.manifests.insert(mkey, (mversion, known));
                fields
            }
        };
        if !plan::selects(&mv.selector, &self.cfg.labels) {
            return Ok(declined("this node's labels do not match the selector"));
        }
        // Not cached: the waker's read may be older than what this node
        // holds; the write's outcome is cached as any claim's.
        let asleep = ClaimView::from(&claim);
        let mut released = asleep.clone();
        released.state = ClaimState::Released;
        let loads = self.claim_loads();
        let views = self.node_views(&loads);
        let candidate = core::Candidate {
            claim_corrupt: false,
            manifest_corrupt: false,
            owner_corrupt: false,
            claimable: plan::claimable(&mv, Some(&released), &views, &self.me),
            control_read: self.control.read,
            cordoned: self.deps.status.cordoned(),
            draining: self.control.draining,
            // The claim is there (the waker read it).
            absence_pending: false,
            // A release has no owner to judge.
            owner_stale: false,
            claimable_for: Duration::MAX,
            grace: self.cfg.grace,
            predecessor_unproven: self.predecessor_unproven(Some(&released)),
        };
        match core::gate_chosen(&candidate) {
            core::Gate::Claim => {}
            core::Gate::Skip => {
                return Ok(declined(core::skip_reason(false, self.control.read)));
            }
            core::Gate::NotClaimable => {
                return Ok(declined(core::not_claimable_reason(&mv, Some(&released))));
            }
            _ => return Ok(declined("not claimable now")),
        }
        if core::at_highest_epoch(Some(&asleep)) {
            return Ok(declined(
                "its claim is at the highest epoch: no fencing token above it exists",
            ));
        }
        let Some(mut t) = self.claim_try(
            name.as_str(),
            mv.digest.to_string(),
            Some((version, asleep)),
            None,
        ) else {
            return Ok(declined("this node's lease is not valid now"));
        };
        // As a claim made with the spec at hand would say (`claim_try`).
        t.endpoint = port.map(|p| self.endpoint_at(p));
        t.health = checked.then_some(crate::fleet::check::Health::Starting);
        // A recent marker check stands for this claim's (see
        // MARKER_FRESH_FOR); else `claim_batch` makes one.
        if let Some((_, at)) = self.bucket.checked
            && now.saturating_since(at) < self.cfg.ttl / MARKER_FRESH_FOR
        {
            self.bucket.checked = Some((self.pass, at));
        } else {
            reads += 1;
        }
        t.early = Some(EarlyAnswer {
            reply: reply.clone(),
            node: node.clone(),
            reads,
        });
        self.claim_batch(vec![t]).await?;
        Ok(match self.owned.get(name.as_str()) {
            Some(o) => ClaimAnswer::Claimed {
                node: node.clone(),
                epoch: o.record.epoch,
                round_trips: reads + 1,
            },
            // Rejected: the claim moved since the waker read it (another
            // wake, an alarm, a node): what stands there now is cached.
            // Or not sent: this node's validity ended first.
            None => declined("its claim changed since it was read, or this node's lease ended"),
        })
    }
}
