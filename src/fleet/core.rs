//! The node's rules, as pure functions of what the node has observed.
//!
//! No async, no `Store`, no clock reads, no randomness: every input is a
//! value the shell (`node/`) gathered (a listing, a read, a runner exit,
//! the time it read once), and every output is a decision the shell carries
//! out. That is what lets each rule be a table test here, and what keeps the
//! shell's job to I/O and bookkeeping. The module imports nothing from the
//! runtime; `tests::the_core_reads_no_clock_and_does_no_io` checks its
//! source for the ambient ones.
//!
//! What it decides (issue #13; docs/fleet.md has the table): registration,
//! renewal and the sessions' deadline, the loop between passes (a store
//! violation, a lost or lapsed lease, shutdown; never re-registering into a
//! wiped bucket), each pass's schedules and pacing, what a session's exit
//! leads to, what an owned session's claim and manifest require, whether a
//! claimable session may be claimed this pass (the pull loop and the claim
//! endpoint alike), the absence rules of a vanished claim (the hold, the
//! wait, markers) and each step of the fence before a takeover. The order of
//! the I/O stays in the shell: one async method per step, not one
//! `step(state, input) -> actions` machine (docs/fleet.md says why).

use super::claim::ClaimState;
use super::manifest::{Restart, RestartPolicy};
use super::plan::{ClaimView, Claimable};
use crate::lease::default_margin;
use crate::liveness::Liveness;
use std::time::Duration;

/// A run shorter than this counts as a quick exit (a crash loop).
pub const QUICK_EXIT: Duration = Duration::from_secs(10);

/// The wait before restart number `n` of a crash loop: none for the first
/// quick exit, then `delay` doubling to `max` (as Kubernetes'
/// CrashLoopBackOff, on a shorter scale by default: 250 ms to 30 s). A run
/// that lasted QUICK_EXIT resets it.
pub fn restart_backoff(quick_exits: u32, delay: Duration, max: Duration) -> Duration {
    if quick_exits <= 1 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (quick_exits - 2).min(16);
    delay.saturating_mul(factor).min(max)
}

/// What a session's exit leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// Killed at the node's deadline: the lease lapsed, and the loop's
    /// lease-loss path stops everything. Nothing to do for the session.
    LeaseLapsed,
    /// Run again (its policy says so): persist the restart, then start it
    /// after `delay` (zero: at once). `quick_exits` is the new count.
    Restart { quick_exits: u32, delay: Duration },
    /// Done: the claim becomes this terminal state.
    Finish(ClaimState),
    /// Its policy would restart it, but it has had `restarts` restarts
    /// (in its window, when it has one), its `attempts`: failed, with
    /// reason "gave up after N restarts".
    GiveUp { restarts: u32 },
}

/// The restart rule applied to one exit. `ran_for` is how long the run
/// lasted; `quick_exits` the count before this exit; `restarts` the
/// restarts its `attempts` count (in its window, or over the run's life).
pub fn after_exit(
    rule: &Restart,
    code: i32,
    deadline: bool,
    ran_for: Duration,
    quick_exits: u32,
    restarts: u32,
) -> AfterExit {
    if deadline {
        return AfterExit::LeaseLapsed;
    }
    let restart = match rule.policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => code != 0,
        RestartPolicy::Never => false,
    };
    if !restart {
        return AfterExit::Finish(if code == 0 {
            ClaimState::Succeeded
        } else {
            ClaimState::Failed
        });
    }
    if rule.attempts().is_some_and(|a| restarts >= a) {
        return AfterExit::GiveUp { restarts };
    }
    let quick_exits = if ran_for < QUICK_EXIT {
        quick_exits.saturating_add(1)
    } else {
        0
    };
    AfterExit::Restart {
        quick_exits,
        delay: restart_backoff(quick_exits, rule.delay(), rule.max_delay()),
    }
}

/// Our own claim of a session we hold, as this pass saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnClaim {
    /// At the version we wrote (listed, or read back when the listing did
    /// not show it).
    Ours,
    /// Not listed, and the read-back failed: unknown for now. The claim's
    /// confirmation bound (`confirmed_until`) stops us if it stays unknown.
    Unreadable,
    /// At another version: another writer took it; we were judged dead.
    Changed,
    /// Replaced by a vanished claim's marker (someone found it missing):
    /// it was deleted. `below_ours`: the marker's epoch is below ours.
    Vanished { below_ours: bool },
    /// Gone from the bucket.
    Deleted,
    /// Bytes that are not a claim.
    Corrupt,
}

/// The session's manifest, as this pass saw it. A manifest that cannot be
/// decoded is seen as the last good one (never as deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnManifest<'a> {
    Deleted,
    Paused,
    Spec { digest: &'a super::plan::Digest },
}

/// Everything the owned-session rule looks at.
#[derive(Debug, Clone, Copy)]
pub struct Owned<'a> {
    pub claim: OwnClaim,
    pub manifest: OwnManifest<'a>,
    /// The claim's state and the digest it runs.
    pub state: ClaimState,
    pub digest: &'a str,
    /// A process of it is running here.
    pub running: bool,
    /// A crash-loop back-off is still waiting.
    pub backoff_pending: bool,
    /// Its run finished but the write that records it has not landed: the
    /// claim still says running.
    pub finish_pending: bool,
    /// This node is at capacity.
    pub full: bool,
}

/// One step of keeping an owned session in line, in the order the shell
/// carries them out. A failed `SetState` ends the list (the write was
/// rejected: the claim is lost, and the shell has already stopped it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnedAction {
    /// Stop the session and forget the claim: the reason is logged.
    Lose(&'static str),
    /// Write a vanished marker at our epoch where our deleted claim was
    /// (create-if-absent), so the next holder waits out the hold period and
    /// takes over above our epoch instead of starting at 1 again.
    MarkVanished,
    /// Raise the marker that replaced our claim to our epoch (If-Match on
    /// its version), for the same reason: its writer saw an older epoch.
    RaiseMarker,
    /// Stop the running process; the detail, if any, is journalled.
    Stop(Option<&'static str>),
    /// Record the manifest's digest as the one the claim runs.
    AdoptDigest,
    /// Fenced write of the claim's state.
    SetState(ClaimState),
    /// Retry the write of a finished run's end (its state, code and
    /// reason, kept by the shell). Nothing else happens to the session
    /// until it lands: starting it again, or releasing it, would run a
    /// finished job again.
    Finish,
    /// Start the session.
    Start,
    /// A crash-loop back-off holds the restart; keep the brisk pace.
    Wait,
}

/// What an owned session needs this pass. An empty list: nothing.
pub fn reconcile_owned(o: &Owned) -> Vec<OwnedAction> {
    use OwnedAction::*;
    match o.claim {
        OwnClaim::Changed => return vec![Lose("claim changed by another writer")],
        OwnClaim::Deleted => {
            return vec![Lose("claim deleted from the bucket"), MarkVanished];
        }
        OwnClaim::Vanished { below_ours } => {
            let mut out = vec![Lose("claim deleted from the bucket")];
            if below_ours {
                out.push(RaiseMarker);
            }
            return out;
        }
        OwnClaim::Corrupt => {
            return vec![Lose("claim overwritten with bytes that are not a claim")];
        }
        OwnClaim::Ours | OwnClaim::Unreadable => {}
    }
    // A finished run whose end is not written yet: write it, and nothing
    // more, whatever else changed (a pause, a resume), short of a deleted
    // manifest (released) or a new spec (a new run, which needs no record
    // of the old one's end).
    if o.finish_pending && !o.running {
        match o.manifest {
            OwnManifest::Deleted => {}
            OwnManifest::Spec { digest } if *digest != *o.digest => {}
            _ => return vec![Finish],
        }
    }
    let mut out = Vec::new();
    match o.manifest {
        OwnManifest::Deleted => {
            if o.running {
                out.push(Stop(Some("manifest deleted")));
            }
            out.push(SetState(ClaimState::Released));
        }
        OwnManifest::Paused => {
            if o.running {
                out.push(Stop(None));
            }
            // A finished session stays finished: pausing it changes
            // nothing (and its claim may not become paused).
            if o.state != ClaimState::Paused && !o.state.is_terminal() {
                out.push(SetState(ClaimState::Paused));
            }
        }
        OwnManifest::Spec { digest } => {
            let new_spec = *digest != *o.digest;
            let mut running = o.running;
            if new_spec && running {
                out.push(Stop(Some("manifest changed")));
                running = false;
            }
            // A finished session takes no capacity; run again (a new spec)
            // on a node that is full since, it would overcommit it. Release
            // it to placement instead.
            if o.state.is_terminal() && new_spec && o.full {
                out.push(SetState(ClaimState::Released));
                return out;
            }
            // A back-off still running holds the restart (a new spec does
            // not wait).
            if !running && !new_spec && o.backoff_pending {
                out.push(Wait);
                return out;
            }
            let finished_same = o.state.is_terminal() && !new_spec;
            if !running && !finished_same {
                if new_spec || o.state != ClaimState::Running {
                    out.push(AdoptDigest);
                    out.push(SetState(ClaimState::Running));
                }
                out.push(Start);
            }
        }
    }
    out
}

/// Everything the claim gate looks at for one session this node does not
/// hold, in the order the rules apply.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    /// Its claim's bytes cannot be read: never taken over.
    pub claim_corrupt: bool,
    /// Its owner's node record cannot be read: the owner cannot be judged.
    pub owner_corrupt: bool,
    /// Its manifest's bytes cannot be read now: a node that takes it has
    /// no spec to run (it keeps only the specs of its own sessions).
    pub manifest_corrupt: bool,
    /// Placement's verdict (`plan::claimable`).
    pub claimable: Option<Claimable>,
    /// The control object has been read at least once since start.
    pub control_read: bool,
    pub cordoned: bool,
    pub draining: bool,
    /// Its claim vanished and the absence has not been observed long
    /// enough yet.
    pub absence_pending: bool,
    /// The cached record of its owner may be stale (names another instance,
    /// or is missing) and has not been read again this pass.
    pub owner_stale: bool,
    /// How long it has been claimable, by this node's observation.
    pub claimable_for: Duration,
    /// Owned by another instance of this node id whose end nothing proves
    /// yet: this instance created its node record where none was (an
    /// operator deleted it), so the earlier instance may still run until
    /// its own deadline. Its claims wait ttl + margin from the creation.
    pub predecessor_unproven: bool,
    /// The grace per rank (`NodeConfig::grace`).
    pub grace: Duration,
}

/// The claim gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Not for us (now or yet); nothing pending.
    Skip,
    /// Not claimable: forget when it first was.
    NotClaimable,
    /// Its claim vanished: wait out the absence (keep the brisk pace). The
    /// rank's grace has not started.
    AbsencePending,
    /// Read the owner's node record again, then ask again.
    RefetchOwner,
    /// Placement ranks this node nowhere for it. (Past here, every verdict
    /// means the session has become claimable for us: the shell records
    /// when, and `claimable_for` counts from it.)
    Unranked,
    /// Within the grace of a lower rank: wait (keep the brisk pace).
    Grace,
    /// Go: fence the owner if it needs it, then claim.
    Claim,
}

/// This node's place among a session's candidates (`plan::rank`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    /// 0 for the first.
    pub position: usize,
    /// Since the last time a node ranked ahead of us was seen taking a
    /// session (its claims counted up between two passes); `Duration::MAX`
    /// if never, or if none is ahead.
    pub ahead_idle_for: Duration,
}

/// How many graces past its rank's own wait a node holds back for busy
/// nodes ranked ahead of it, at most (`gate`). Views differ by a pass, so
/// two busy nodes can each rank the other first; the bound makes the
/// hold a delay in every case (200 s at ttl 10 s), never a standstill.
pub const BUSY_HOLD_GRACES: u32 = 30;

/// May this node claim the candidate this pass? `rank` is this node's rank
/// among the candidates; asked only when the verdict needs it, because
/// ranking is the pass's largest CPU cost.
///
/// A node ranked r waits r graces from when it first saw the session
/// claimable, and also while a node ranked ahead of it has been seen
/// taking sessions within the last grace. Why the second: at placement of
/// thousands of sessions at once, the first-ranked node is alive but
/// needs longer than a few graces to reach them all; without it the nodes
/// ranked after it stepped in for the same sessions (issue #14: 0.4
/// conflicts per claim at 100,000 sessions). A node that is dead, stuck
/// or done takes nothing more, so the wait ends one grace later; and at
/// most [`BUSY_HOLD_GRACES`] graces past the rank's own wait: this only
/// delays, and only while someone ahead is busy claiming.
pub fn gate(c: &Candidate, rank: impl FnOnce() -> Option<Rank>) -> Gate {
    if c.claim_corrupt || c.owner_corrupt || c.manifest_corrupt {
        return Gate::Skip;
    }
    let Some(why) = c.claimable else {
        return Gate::NotClaimable;
    };
    // Cordoned: nothing new; a predecessor's sessions are ours already
    // (unless draining). Nothing at all before the control object was read:
    // a cordoned node restarting must not claim in the meantime.
    if !c.control_read || (c.cordoned && (why != Claimable::Predecessor || c.draining)) {
        return Gate::Skip;
    }
    if c.absence_pending {
        return Gate::AbsencePending;
    }
    if why == Claimable::Predecessor && c.predecessor_unproven {
        return Gate::Grace;
    }
    // Records only move to newer instances, so an owner record that names
    // another instance is believed only after a fresh read still does; and
    // a claim by a node we have no record of is most often by one that
    // registered after our listing.
    if why == Claimable::Orphaned && c.owner_stale {
        return Gate::RefetchOwner;
    }
    let wait = match why {
        Claimable::Predecessor => Duration::ZERO,
        _ => match rank() {
            Some(r)
                if r.position > 0
                    && r.ahead_idle_for < c.grace
                    && c.claimable_for
                        < c.grace.saturating_mul(r.position as u32 + BUSY_HOLD_GRACES) =>
            {
                return Gate::Grace;
            }
            Some(r) => c.grace.saturating_mul(r.position as u32),
            None => return Gate::Unranked,
        },
    };
    if c.claimable_for < wait {
        return Gate::Grace;
    }
    Gate::Claim
}

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
/// ([`plan::owner_live`](super::plan::owner_live), which reads the views of
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

// ------------------------------------------------------------- absence --

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

// --------------------------------------------------------------- fence --

/// What this node has of a claim's owner's node record, before a takeover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerRecord {
    /// Not in the node's view (neither listed nor read).
    Unknown,
    /// In the view: its judgement for the claim's instance, and whether the
    /// cached bytes are of the version the listing showed.
    Known { judged: Liveness, at_listed: bool },
}

/// The first step of the fence before a takeover (the gate said `Claim`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// Nothing to fence: take over.
    Go,
    /// Read the owner's record (not in the view), then ask
    /// `after_owner_read`.
    ReadOwner,
    /// Read the owner's record again (the cache is not of the watched
    /// version), then ask `after_fresh_read`.
    ReadAtListed,
    /// Write the tombstone over the watched version, from the cached record.
    Tombstone,
}

/// The fence: a released claim, or one of our own node (a predecessor of
/// this instance, which the host lock proves gone), needs none; an owner
/// superseded, or released or fenced at the watched version, is final
/// already; else the owner's lease is released in its name (If-Match on
/// the version watched unchanged) before its sessions are taken.
pub fn fence(claim_released: bool, owner_is_me: bool, owner: OwnerRecord) -> Fence {
    if claim_released || owner_is_me {
        return Fence::Go;
    }
    match owner {
        OwnerRecord::Unknown => Fence::ReadOwner,
        OwnerRecord::Known { judged, at_listed } => {
            if judged == Liveness::Superseded || (judged.is_final() && at_listed) {
                Fence::Go
            } else if at_listed {
                Fence::Tombstone
            } else {
                Fence::ReadAtListed
            }
        }
    }
}

/// What a read of an owner that was not in the view allows. Present (just
/// written or just listed): not watched for a ttl, so not yet. Unreadable:
/// never. Absent: only once observed absent long enough.
pub fn after_owner_read(present: bool, corrupt: bool, absent_long_enough: bool) -> bool {
    !present && !corrupt && absent_long_enough
}

/// What the fresh read of the owner's record shows, against the version
/// the listing showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreshRead {
    /// Vanished since the listing: an absence to observe (the owner may
    /// have renewed just before), not a death. Not yet.
    Absent,
    /// Another version: renewed after all. Not yet (refresh the view).
    Changed,
    /// Released, fenced or superseded at that version: go.
    Final,
    /// Still the watched version, still held: write the tombstone over it.
    Tombstone,
}

/// A fresh read of the owner's record, against the version the listing
/// showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerRead {
    Missing,
    /// Another version than the listed one.
    Other,
    /// The listed version, judged for the claim's instance.
    AtListed(Liveness),
}

/// Classifies the fresh read.
pub fn after_fresh_read(read: OwnerRead) -> FreshRead {
    match read {
        OwnerRead::Missing => FreshRead::Absent,
        OwnerRead::Other => FreshRead::Changed,
        OwnerRead::AtListed(judged) if judged.is_final() => FreshRead::Final,
        OwnerRead::AtListed(_) => FreshRead::Tombstone,
    }
}

/// A tombstone rejected: the owner renewed (no takeover), or another node
/// fenced it a moment ago, which is final all the same. Judged on the record
/// read after the rejection.
pub fn after_tombstone_rejected(judged: Option<Liveness>) -> bool {
    matches!(judged, Some(Liveness::Released | Liveness::Fenced))
}

// ------------------------------------------------------ registration --

/// What one attempt to register (acquire `nodes/<id>`) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    Acquired,
    /// Another instance holds the node id (an earlier one not yet expired,
    /// or a second process misconfigured with the same id elsewhere).
    Held,
    /// No record where one was expected (a standalone-lease answer; node
    /// leases are created where none is, but the rule stays total).
    Absent,
    /// The store could not be reached, or answered 5xx.
    Transient,
    /// Lost the final conditional write to another registrant.
    Conflict,
    /// Anything else: refused credentials, a corrupt record, a store that
    /// broke its conditions.
    Failed,
}

/// What the node does after an attempt to register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRegister {
    /// Serve with the lease.
    Serve,
    /// Try again after one poll. Never a takeover: a held id is waited out
    /// by observation (two hosts with one id never steal from each other),
    /// and a lost race is the winner's.
    Wait,
    /// Give up: the error is the node's.
    Fail,
}

pub fn after_register(r: Registration) -> AfterRegister {
    match r {
        Registration::Acquired => AfterRegister::Serve,
        Registration::Held
        | Registration::Absent
        | Registration::Transient
        | Registration::Conflict => AfterRegister::Wait,
        Registration::Failed => AfterRegister::Fail,
    }
}

// ----------------------------------------------------------- renewal --

/// A node renews its lease every ttl/3 (DESIGN's default): two renewals may
/// fail in a row before the validity (`ttl − margin` from the last send) is
/// in danger.
pub fn renew_period(ttl: Duration) -> Duration {
    ttl / 3
}

/// What a renewal's write answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    Committed,
    /// Unreachable or 5xx, after the write's own retries.
    Transient,
    /// Rejected (another writer won), deleted, or anything else final.
    Lost,
}

/// What follows a renewal's write. `with_attrs`: the write carried the
/// node's attributes (its load, cordon), which is how every renewal starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRenew {
    /// Renewed: announce the new deadline; `audit`: read this one back.
    Renewed { audit: bool },
    /// The attributes write did not get through: renew plainly at once (a
    /// renewal is worth more than fresh attributes; the plain renew retries
    /// with back-off up to the validity deadline itself).
    RenewPlainly,
    /// The lease is lost: stop every session, re-register.
    Lost,
}

/// One in `audit_sample` renewals is read back (`renewals` counts the
/// successful ones, this one included).
pub fn after_renew(
    outcome: RenewOutcome,
    with_attrs: bool,
    renewals: u64,
    audit_sample: u64,
) -> AfterRenew {
    match outcome {
        RenewOutcome::Committed => AfterRenew::Renewed {
            audit: audit_sample > 0 && renewals.is_multiple_of(audit_sample),
        },
        RenewOutcome::Transient if with_attrs => AfterRenew::RenewPlainly,
        RenewOutcome::Transient | RenewOutcome::Lost => AfterRenew::Lost,
    }
}

/// The deadline every session of this node runs under (announced to the
/// dead-man switches, and the loop's own stop): the node lease's validity,
/// never past the confirmation of its claims (`claim_belief` after the
/// oldest confirming request), and nothing at all once the lease is lost.
/// `None`: no deadline, stop now. Generic over the time type so that the
/// core names no clock.
pub fn session_deadline<T: Ord + Copy>(lease: Option<T>, claims: Option<T>) -> Option<T> {
    match (lease, claims) {
        (None, _) => None,
        (Some(l), None) => Some(l),
        (Some(l), Some(c)) => Some(l.min(c)),
    }
}

// ---------------------------------------------------------- the loop --

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

// --------------------------------------------------------- the watch --

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
    use crate::fleet::claim::ClaimRecord;
    use ClaimState::*;
    use OwnedAction::*;

    const S: Duration = Duration::from_secs(1);

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

    #[rustfmt::skip]
    #[test]
    fn after_exit_follows_the_policy_and_backs_off_a_crash_loop() {
        use AfterExit as A;
        use RestartPolicy::*;
        let restart = |quick_exits, ms| A::Restart { quick_exits, delay: Duration::from_millis(ms) };
        let limited = |policy, attempts, delay_ms, max_ms| Restart {
            policy,
            attempts: Some(attempts),
            window: None,
            delay: Some(Duration::from_millis(delay_ms)),
            max_delay: Some(Duration::from_millis(max_ms)),
        };
        let (a, o, n) = (Restart::from(Always), Restart::from(OnFailure), Restart::from(Never));
        let three = limited(Always, 3, 1000, 5000);
        // (rule, code, deadline, ran for, quick exits, restarts counted, what follows)
        let rows: &[(Restart, i32, bool, Duration, u32, u32, AfterExit)] = &[
            // The deadline kill is the lease's business, whatever the policy.
            (a, 137, true, S, 0, 0, A::LeaseLapsed),
            (n, 0, true, S, 0, 0, A::LeaseLapsed),
            (n, 0, false, S, 0, 0, A::Finish(Succeeded)),
            (n, 3, false, S, 0, 0, A::Finish(Failed)),
            (o, 0, false, S, 0, 0, A::Finish(Succeeded)),
            // First quick exit restarts at once; then 250 ms, 500 ms, ... 30 s.
            (o, 1, false, S, 0, 0, restart(1, 0)),
            (a, 0, false, S, 1, 1, restart(2, 250)),
            (a, 0, false, S, 2, 2, restart(3, 500)),
            (a, 0, false, S, 40, 40, restart(41, 30_000)),
            // A run of QUICK_EXIT or more resets the loop.
            (a, 1, false, QUICK_EXIT, 9, 9, restart(0, 0)),
            // on-failure gives up after its default 6 restarts; always never
            // does unless told.
            (o, 1, false, S, 5, 5, restart(6, 4000)),
            (o, 1, false, S, 6, 6, A::GiveUp { restarts: 6 }),
            (o, 0, false, S, 6, 6, A::Finish(Succeeded)),
            (a, 1, false, S, 6, 1000, restart(7, 8000)),
            // Its own attempts and back-off.
            (three, 0, false, S, 1, 2, restart(2, 1000)),
            (three, 0, false, S, 3, 2, restart(4, 4000)),
            (three, 0, false, S, 4, 2, restart(5, 5000)),
            (three, 0, false, QUICK_EXIT, 4, 3, A::GiveUp { restarts: 3 }),
        ];
        for (i, &(rule, code, deadline, ran, q, r, want)) in rows.iter().enumerate() {
            assert_eq!(after_exit(&rule, code, deadline, ran, q, r), want, "row {i}");
        }
        let max = Duration::from_secs(30);
        assert_eq!(restart_backoff(u32::MAX, Duration::from_millis(250), max), max);
        assert_eq!(restart_backoff(u32::MAX, Duration::MAX, max), max);
    }

    fn owned<'a>(claim: OwnClaim, manifest: OwnManifest<'a>) -> Owned<'a> {
        Owned {
            claim,
            manifest,
            state: Running,
            digest: "d1",
            running: true,
            backoff_pending: false,
            finish_pending: false,
            full: false,
        }
    }

    #[rustfmt::skip]
    #[test]
    fn reconcile_owned_rules() {
        let (d1, d2) = (super::super::plan::Digest::from("d1"), super::super::plan::Digest::from("d2"));
        let spec1 = OwnManifest::Spec { digest: &d1 };
        let spec2 = OwnManifest::Spec { digest: &d2 };
        let base = owned(OwnClaim::Ours, spec1);
        let rows: Vec<(&str, Owned, Vec<OwnedAction>)> = vec![
            ("steady", base, vec![]),
            ("read-back failed: carry on", Owned { claim: OwnClaim::Unreadable, ..base }, vec![]),
            ("another writer", Owned { claim: OwnClaim::Changed, ..base }, vec![Lose("claim changed by another writer")]),
            ("deleted claim", Owned { claim: OwnClaim::Deleted, ..base }, vec![Lose("claim deleted from the bucket"), MarkVanished]),
            ("marked vanished below our epoch", Owned { claim: OwnClaim::Vanished { below_ours: true }, ..base }, vec![Lose("claim deleted from the bucket"), RaiseMarker]),
            ("marked vanished at our epoch", Owned { claim: OwnClaim::Vanished { below_ours: false }, ..base }, vec![Lose("claim deleted from the bucket")]),
            ("corrupt claim", Owned { claim: OwnClaim::Corrupt, ..base }, vec![Lose("claim overwritten with bytes that are not a claim")]),
            ("manifest deleted", Owned { manifest: OwnManifest::Deleted, ..base }, vec![Stop(Some("manifest deleted")), SetState(Released)]),
            ("manifest deleted, finished", Owned { manifest: OwnManifest::Deleted, running: false, state: Succeeded, ..base }, vec![SetState(Released)]),
            ("paused", Owned { manifest: OwnManifest::Paused, ..base }, vec![Stop(None), SetState(Paused)]),
            ("paused already", Owned { manifest: OwnManifest::Paused, running: false, state: Paused, ..base }, vec![]),
            ("resumed", Owned { running: false, state: Paused, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("new spec", Owned { manifest: spec2, ..base }, vec![Stop(Some("manifest changed")), AdoptDigest, SetState(Running), Start]),
            ("restart due", Owned { running: false, ..base }, vec![Start]),
            ("back-off pending", Owned { running: false, backoff_pending: true, ..base }, vec![Wait]),
            ("a new spec does not wait out a back-off", Owned { manifest: spec2, running: false, backoff_pending: true, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("finished, same spec: stays finished", Owned { running: false, state: Failed, ..base }, vec![]),
            ("finished, new spec: runs again", Owned { manifest: spec2, running: false, state: Succeeded, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("finished, new spec, node full: released", Owned { manifest: spec2, running: false, state: Succeeded, full: true, ..base }, vec![SetState(Released)]),
            ("running and full is no reason to release", Owned { manifest: spec2, full: true, ..base }, vec![Stop(Some("manifest changed")), AdoptDigest, SetState(Running), Start]),
            // The end of a finished run not written yet: written, and the
            // session neither started again nor released meanwhile.
            ("finished, end unwritten: write it, start nothing", Owned { running: false, finish_pending: true, ..base }, vec![Finish]),
            ("... even on a full node", Owned { running: false, finish_pending: true, full: true, ..base }, vec![Finish]),
            ("... a new spec is a new run", Owned { manifest: spec2, running: false, finish_pending: true, ..base }, vec![AdoptDigest, SetState(Running), Start]),
            ("... a deleted manifest releases it", Owned { manifest: OwnManifest::Deleted, running: false, finish_pending: true, ..base }, vec![SetState(Released)]),
            ("... a pause waits for it", Owned { manifest: OwnManifest::Paused, running: false, finish_pending: true, ..base }, vec![Finish]),
            ("a finished session is not paused", Owned { manifest: OwnManifest::Paused, running: false, state: Succeeded, ..base }, vec![]),
        ];
        for (what, o, want) in rows {
            assert_eq!(reconcile_owned(&o), want, "{what}");
        }
    }

    fn candidate() -> Candidate {
        Candidate {
            claim_corrupt: false,
            manifest_corrupt: false,
            owner_corrupt: false,
            claimable: Some(Claimable::Orphaned),
            control_read: true,
            cordoned: false,
            draining: false,
            absence_pending: false,
            owner_stale: false,
            claimable_for: Duration::ZERO,
            grace: S,
            predecessor_unproven: false,
        }
    }

    #[rustfmt::skip]
    #[test]
    fn the_claim_gate() {
        let c = candidate();
        let pre = Some(Claimable::Predecessor);
        let at = |position: usize, ahead_idle_for: Duration| Some(Rank { position, ahead_idle_for });
        let r0 = at(0, Duration::MAX);
        let rows: Vec<(&str, Candidate, Option<Rank>, Gate)> = vec![
            ("first rank claims at once", c, r0, Gate::Claim),
            ("corrupt claim: never", Candidate { claim_corrupt: true, ..c }, r0, Gate::Skip),
            ("corrupt owner record: never", Candidate { owner_corrupt: true, ..c }, r0, Gate::Skip),
            ("not claimable", Candidate { claimable: None, ..c }, r0, Gate::NotClaimable),
            ("control not read yet", Candidate { control_read: false, ..c }, r0, Gate::Skip),
            ("cordoned: nothing new", Candidate { cordoned: true, ..c }, r0, Gate::Skip),
            ("cordoned keeps a predecessor's", Candidate { cordoned: true, claimable: pre, ..c }, r0, Gate::Claim),
            ("draining gives even those up", Candidate { cordoned: true, draining: true, claimable: pre, ..c }, r0, Gate::Skip),
            ("a vanished claim waits out its absence", Candidate { absence_pending: true, ..c }, r0, Gate::AbsencePending),
            ("absence first, then the refetch", Candidate { absence_pending: true, owner_stale: true, ..c }, r0, Gate::AbsencePending),
            ("stale owner record: read it again", Candidate { owner_stale: true, ..c }, r0, Gate::RefetchOwner),
            ("a fresh claim needs no owner", Candidate { owner_stale: true, claimable: Some(Claimable::Fresh), ..c }, r0, Gate::Claim),
            ("rank 2 waits two graces", Candidate { claimable_for: S, ..c }, at(2, Duration::MAX), Gate::Grace),
            ("rank 2 after two graces", Candidate { claimable_for: 2 * S, ..c }, at(2, Duration::MAX), Gate::Claim),
            ("rank 2 holds while one ahead is taking sessions", Candidate { claimable_for: 9 * S, ..c }, at(2, S / 2), Gate::Grace),
            ("... for 30 graces past its own wait at most", Candidate { claimable_for: 32 * S, ..c }, at(2, S / 2), Gate::Claim),
            ("a corrupt manifest: never", Candidate { manifest_corrupt: true, ..c }, r0, Gate::Skip),
            ("rank 2 goes once those ahead were idle a grace", Candidate { claimable_for: 2 * S, ..c }, at(2, S), Gate::Claim),
            ("the first rank never waits for others' progress", c, at(0, Duration::ZERO), Gate::Claim),
            ("unranked: not for us", c, None, Gate::Unranked),
            ("a predecessor's: no rank, no grace", Candidate { claimable: pre, ..c }, None, Gate::Claim),
            // Our record was created where none was: the earlier instance
            // may still run until its deadline.
            ("an unproven predecessor's waits", Candidate { claimable: pre, predecessor_unproven: true, ..c }, None, Gate::Grace),
            ("only a predecessor's", Candidate { predecessor_unproven: true, ..c }, r0, Gate::Claim),
        ];
        for (what, c, rank, want) in rows {
            assert_eq!(gate(&c, || rank), want, "{what}");
        }
        // Ranking is asked for only when the verdict needs it.
        let asked = std::cell::Cell::new(0);
        let count = || {
            asked.set(asked.get() + 1);
            r0
        };
        assert_eq!(gate(&Candidate { claimable: None, ..c }, count), Gate::NotClaimable);
        assert_eq!(gate(&Candidate { claimable: pre, ..c }, count), Gate::Claim);
        assert_eq!(asked.get(), 0);
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
            state: Running,
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
    fn each_step_of_the_fence() {
        use Liveness::*;
        let known = |judged, at_listed| OwnerRecord::Known { judged, at_listed };
        // (claim released, owner is me, owner record, step)
        let table = [
            (true, false, OwnerRecord::Unknown, Fence::Go),
            (false, true, known(Live, false), Fence::Go),
            (false, false, OwnerRecord::Unknown, Fence::ReadOwner),
            (false, false, known(Superseded, false), Fence::Go),
            (false, false, known(Released, true), Fence::Go),
            (false, false, known(Fenced, true), Fence::Go),
            // Final in a cache of another version: read it again first.
            (false, false, known(Released, false), Fence::ReadAtListed),
            (false, false, known(Live, true), Fence::Tombstone),
            (false, false, known(Expired, true), Fence::Tombstone),
            (false, false, known(Expired, false), Fence::ReadAtListed),
        ];
        for (released, me, owner, step) in table {
            assert_eq!(
                fence(released, me, owner),
                step,
                "{released} {me} {owner:?}"
            );
        }
        // A read of an owner not in the view.
        assert!(!after_owner_read(true, false, true));
        assert!(!after_owner_read(false, true, true));
        assert!(!after_owner_read(false, false, false));
        assert!(after_owner_read(false, false, true));
        // The fresh read at the watched version.
        let table = [
            (OwnerRead::Missing, FreshRead::Absent),
            (OwnerRead::Other, FreshRead::Changed),
            (OwnerRead::AtListed(Released), FreshRead::Final),
            (OwnerRead::AtListed(Fenced), FreshRead::Final),
            (OwnerRead::AtListed(Superseded), FreshRead::Final),
            (OwnerRead::AtListed(Live), FreshRead::Tombstone),
            (OwnerRead::AtListed(Expired), FreshRead::Tombstone),
        ];
        for (read, step) in table {
            assert_eq!(after_fresh_read(read), step, "{read:?}");
        }
        // A rejected tombstone: another node's fence is as good as ours;
        // a renewal, or nothing readable, is not.
        for (judged, go) in [
            (Some(Released), true),
            (Some(Fenced), true),
            (Some(Live), false),
            (Some(Expired), false),
            (Some(Superseded), false),
            (None, false),
        ] {
            assert_eq!(after_tombstone_rejected(judged), go, "{judged:?}");
        }
    }

    #[test]
    fn registration_waits_out_a_holder_and_fails_only_on_final_errors() {
        use AfterRegister::*;
        use Registration as R;
        for (r, want) in [
            (R::Acquired, Serve),
            // Never a takeover from here: a live holder of our id (another
            // host misconfigured, or our predecessor without the host lock)
            // is waited out by observation inside acquire.
            (R::Held, Wait),
            (R::Absent, Wait),
            (R::Transient, Wait),
            (R::Conflict, Wait),
            (R::Failed, Fail),
        ] {
            assert_eq!(after_register(r), want, "{r:?}");
        }
    }

    #[rustfmt::skip]
    #[test]
    fn renewal_retries_plainly_once_then_is_lost_and_audits_a_sample() {
        use AfterRenew::*;
        use RenewOutcome as O;
        let rows: &[(O, bool, u64, AfterRenew)] = &[
            (O::Committed, true, 1, Renewed { audit: false }),
            (O::Committed, false, 15, Renewed { audit: false }),
            (O::Committed, true, 16, Renewed { audit: true }),
            (O::Committed, false, 32, Renewed { audit: true }),
            // Fresh attributes are worth less than the lease: drop them.
            (O::Transient, true, 3, RenewPlainly),
            // The plain renew has retried up to the deadline already.
            (O::Transient, false, 3, Lost),
            (O::Lost, true, 3, Lost),
            (O::Lost, false, 3, Lost),
        ];
        for (i, &(o, attrs, n, want)) in rows.iter().enumerate() {
            assert_eq!(after_renew(o, attrs, n, 16), want, "row {i}");
        }
        assert_eq!(after_renew(O::Committed, true, 16, 0), Renewed { audit: false });
        assert_eq!(renew_period(S * 9), S * 3);
    }

    #[test]
    fn sessions_never_outlive_the_lease_or_the_claims_confirmation() {
        assert_eq!(session_deadline::<u32>(None, None), None);
        assert_eq!(
            session_deadline(None, Some(5)),
            None,
            "a lost lease ends all"
        );
        assert_eq!(
            session_deadline(Some(9), None),
            Some(9),
            "no claims: the lease's"
        );
        assert_eq!(session_deadline(Some(9), Some(5)), Some(5));
        assert_eq!(session_deadline(Some(5), Some(9)), Some(5));
    }

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

    /// The core stays pure: no runtime, store, clock or randomness in its
    /// source (outside this test module).
    #[test]
    fn the_core_reads_no_clock_and_does_no_io() {
        let src = include_str!("core.rs");
        let body = &src[..src.find("#[cfg(test)]").unwrap()];
        for banned in [
            "async",
            "tokio",
            "Store",
            "Clock",
            "Instant",
            "SystemTime",
            "rand",
            "std::fs",
            "std::net",
            "Entropy",
            "MonoTime",
        ] {
            let uses = body
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .any(|l| l.contains(banned));
            assert!(!uses, "the core mentions {banned}");
        }
    }

    /// The node skips owned sessions for which the rules ask nothing
    /// (`Node::owned_due`, a scan made once per pass with one `full`), then
    /// looks closely at the rest as load changes. That is only sound if
    /// whether anything is asked never depends on `full`: checked here over
    /// every combination of facts.
    #[test]
    fn whether_reconcile_asks_anything_does_not_depend_on_full() {
        let claims = [
            OwnClaim::Ours,
            OwnClaim::Unreadable,
            OwnClaim::Changed,
            OwnClaim::Vanished { below_ours: true },
            OwnClaim::Vanished { below_ours: false },
            OwnClaim::Deleted,
            OwnClaim::Corrupt,
        ];
        let (d1, d2) = (
            super::super::plan::Digest::from("d1"),
            super::super::plan::Digest::from("d2"),
        );
        let manifests = [
            OwnManifest::Deleted,
            OwnManifest::Paused,
            OwnManifest::Spec { digest: &d1 },
            OwnManifest::Spec { digest: &d2 },
        ];
        let mut checked = 0;
        for claim in claims {
            for manifest in manifests {
                for state in [Running, Paused, Succeeded, Failed, Released] {
                    for (running, backoff_pending, finish_pending) in [
                        (false, false, false),
                        (false, true, false),
                        (true, false, false),
                        (true, true, false),
                        (false, false, true),
                        (true, false, true),
                    ] {
                        let facts = |full| Owned {
                            claim,
                            manifest,
                            state,
                            digest: "d1",
                            running,
                            backoff_pending,
                            finish_pending,
                            full,
                        };
                        let (a, b) = (
                            reconcile_owned(&facts(false)),
                            reconcile_owned(&facts(true)),
                        );
                        assert_eq!(
                            a.is_empty(),
                            b.is_empty(),
                            "{:?}: {a:?} / {b:?}",
                            facts(false)
                        );
                        // Nothing asked now stays nothing asked as time
                        // passes (a back-off ending is the only fact that
                        // time changes), so `owned_due` may keep an idle
                        // answer until a map changes: a pending back-off
                        // that holds a restart is itself asked (`Wait`).
                        if backoff_pending && a.is_empty() {
                            let later = Owned {
                                backoff_pending: false,
                                ..facts(false)
                            };
                            assert!(
                                reconcile_owned(&later).is_empty(),
                                "{later:?} asks something once the back-off ends"
                            );
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 7 * 4 * 5 * 6);
    }
}
