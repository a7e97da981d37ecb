//! Cron as a node acts on it: each scheduled session's latest tick looked
//! at by the node whose turn it is, decided once (`ticks/<session>/<ms>`,
//! create-if-absent) and followed. The contract is in `fleet::cron`; the
//! decisions are `cron::decide` and `cron::follow`.

use super::*;
use crate::fleet::cron::{self, ClaimAt, Decision, Follow, TickRecord, Verdict};

/// The most ticks acted on in one pass.
const TICKS_PER_PASS: usize = 32;

/// A scheduled session as this node follows its ticks.
#[derive(Debug)]
struct Entry {
    schedule: Arc<ScheduleOf>,
    /// The latest tick settled here: decided and followed (or found so).
    settled: u64,
    /// Not looked at again before this (wall ms): a failed read or write,
    /// or a tick waiting for its run to end, is looked at once a poll
    /// interval, never in a loop.
    look_at: u64,
    /// The first tick after `settled` (or after the first look), cached:
    /// nothing is computed for the session before then.
    next_tick: Option<u64>,
    /// When this node first knew the session (wall ms): a session that
    /// never ran (its claim the admission placeholder, which carries no
    /// time) is not run for a tick before then, so an apply at 15:00 of a
    /// schedule at 03:00 does not run at once for this morning's tick.
    known_since: u64,
    /// Its tick waits for the last run to end (`allow`), as this node saw
    /// the claim: no pause is shortened for it (the run's end is a claim
    /// change, which brings a pass).
    waiting: bool,
}

/// A manifest's schedule, read and compiled.
#[derive(Debug)]
pub(super) struct ScheduleOf {
    pub(super) rule: cron::Schedule,
    pub(super) compiled: cron::Compiled,
}

impl ScheduleOf {
    /// The schedule of `spec`, compiled (`None` if it has none, or one
    /// this build cannot read: such a session is never ticked here).
    pub(super) fn of(spec: &Spec) -> Option<Arc<ScheduleOf>> {
        let rule = spec.schedule.clone()?;
        let compiled = rule.compile().ok()?;
        Some(Arc::new(ScheduleOf { rule, compiled }))
    }
}

/// The scheduled sessions, rebuilt from the manifests only when they
/// change (`Tracked::generation`). A steady pass costs, per scheduled
/// session, a comparison with its next tick and a look at its claim and
/// its rank for the next wake; nothing per other session.
#[derive(Debug, Default)]
pub(super) struct TickBook {
    generation: Option<u64>,
    entries: BTreeMap<String, Entry>,
    /// When this node next looks at a tick (wall ms), as of the last pass.
    wake_at: Option<u64>,
}

impl TickBook {
    /// How long until this node next looks at a tick (`None` if it has
    /// none to look at): the pause between passes ends there.
    pub(super) fn wait(&self, now_ms: u64) -> Option<Duration> {
        self.wake_at
            .map(|t| Duration::from_millis(t.saturating_sub(now_ms)))
    }
}

impl Node {
    fn sync_tick_book(&mut self) {
        let now_ms = self.deps.clock.wall_ms();
        let generation = self.manifests.generation();
        if self.ticks.generation == Some(generation) {
            return;
        }
        let mut entries = std::mem::take(&mut self.ticks.entries);
        let mut next = BTreeMap::new();
        for (key, (_, m)) in self.manifests.iter() {
            let Some(s) = &m.schedule else { continue };
            let name = name_of(key).to_string();
            let e = match entries.remove(&name) {
                Some(mut e) => {
                    if !Arc::ptr_eq(&e.schedule, s) {
                        e.schedule = s.clone();
                        e.next_tick = None;
                    }
                    e
                }
                None => Entry {
                    schedule: s.clone(),
                    settled: 0,
                    look_at: 0,
                    next_tick: None,
                    known_since: now_ms,
                    waiting: false,
                },
            };
            next.insert(name, e);
        }
        self.ticks.entries = next;
        self.ticks.generation = Some(generation);
    }

    /// The claim of `name` as a tick sees it, from what this node knows:
    /// where it stands, the tick it carries, and whether its run is ours.
    fn claim_at(&self, name: &str, views: &[NodeView]) -> Option<(ClaimAt, Option<u64>, bool)> {
        let (_, c) = self.claims.get(&crate::keys::session(name))?;
        let live = plan::owner_live(&c.owner, views);
        // A run of ours between restarts (a back-off) is ours too.
        let mine = self
            .owned
            .get(name)
            .is_some_and(|o| o.record.epoch == c.epoch);
        Some((ClaimAt::of(c, live), c.tick, mine))
    }

    /// The pass's cron phase: each scheduled session whose latest tick is
    /// unsettled and whose turn (for this node) has come is looked at.
    /// Returns whether anything was written.
    pub(super) async fn keep_schedules(&mut self, views: &[NodeView]) -> bool {
        self.sync_tick_book();
        let now_ms = self.deps.clock.wall_ms();
        let mut due = Vec::new();
        for (name, e) in self.ticks.entries.iter_mut() {
            if e.next_tick.is_some_and(|t| now_ms < t) || now_ms < e.look_at {
                continue;
            }
            let Some(tick) = e.schedule.compiled.latest_at_or_before(now_ms) else {
                e.next_tick = e.schedule.compiled.next_after(now_ms);
                continue;
            };
            if tick <= e.settled {
                e.next_tick = e.schedule.compiled.next_after(now_ms);
                continue;
            }
            due.push((name.clone(), tick));
        }
        let mut changed = false;
        let poll = u64::try_from(self.cfg.poll.as_millis()).unwrap_or(u64::MAX);
        let mut acted = 0;
        for (name, tick) in due {
            let Some((at, carried, mine)) = self.claim_at(&name, views) else {
                continue;
            };
            // The claim already carries this tick (released for it, its run
            // going or done): settled, with no request. This is how the
            // nodes ranked after the first usually learn it.
            if carried.is_some_and(|t| t >= tick) {
                self.settle_tick(&name, tick);
                continue;
            }
            let delay = self.rank_delay_ms(&name);
            let Some(after) = cron::looks_after(at, mine, delay) else {
                continue; // its live owner decides
            };
            if now_ms < tick.saturating_add(after) {
                continue;
            }
            // A tick that waits for its run to end (`allow`), as far as
            // this node knows, costs no request: every node would decide
            // the same, so nobody has recorded it.
            let paused = self.paused(&name);
            if let Some(e) = self.ticks.entries.get_mut(&name) {
                e.waiting =
                    cron::decide(&e.schedule.rule, tick, now_ms, paused, at, "") == Verdict::Wait;
                if e.waiting {
                    e.look_at = now_ms.saturating_add(poll);
                    continue;
                }
            }
            // At most so many a pass (the rest at the next, which comes at
            // once): a thousand sessions on one schedule do not hold one
            // pass, and placement, for minutes.
            if acted == TICKS_PER_PASS {
                changed = true;
                break;
            }
            acted += 1;
            changed |= self.act_on_tick(&name, tick, views).await;
        }
        self.ticks.wake_at = self.tick_wake_at(views);
        changed
    }

    /// When this node next looks at a tick: the soonest of each scheduled
    /// session's next tick (or its unsettled one) plus this node's delay
    /// for it, not before its next look. Sessions whose live owner decides
    /// are left out (a change of their claim runs a pass anyway).
    fn tick_wake_at(&self, views: &[NodeView]) -> Option<u64> {
        let now_ms = self.deps.clock.wall_ms();
        self.ticks
            .entries
            .iter()
            .filter(|(_, e)| !e.waiting)
            .filter_map(|(name, e)| {
                let tick = match e.next_tick {
                    Some(t) => t,
                    None => e
                        .schedule
                        .compiled
                        .latest_at_or_before(now_ms)
                        .filter(|&t| t > e.settled)?,
                };
                let (at, _, mine) = self.claim_at(name, views)?;
                let after = cron::looks_after(at, mine, self.rank_delay_ms(name))?;
                Some(tick.saturating_add(after).max(e.look_at))
            })
            .min()
    }

    /// Is `name`'s manifest paused, as this node knows it?
    fn paused(&self, name: &str) -> bool {
        self.manifests
            .get(&crate::keys::manifest(name))
            .is_some_and(|(_, m)| m.view.paused)
    }

    fn settle_tick(&mut self, name: &str, tick: u64) {
        if let Some(e) = self.ticks.entries.get_mut(name) {
            e.waiting = false;
            e.settled = e.settled.max(tick);
            e.next_tick = e.schedule.compiled.next_after(tick);
        }
    }

    /// Reads tick `tick` of `name` and its claim, decides it if nobody has
    /// (create-if-absent) and follows the decision. Returns whether it
    /// wrote anything.
    async fn act_on_tick(&mut self, name: &str, tick: u64, views: &[NodeView]) -> bool {
        let poll = u64::try_from(self.cfg.poll.as_millis()).unwrap_or(u64::MAX);
        // Read now, not at the pass's start: the acts before this one took
        // their round trips, and a deadline is judged on the time it is.
        let now_ms = self.deps.clock.wall_ms();
        let Some(e) = self.ticks.entries.get_mut(name) else {
            return false;
        };
        // Looked at again a poll interval from now unless settled below.
        e.look_at = now_ms.saturating_add(poll);
        let schedule = e.schedule.clone();
        let known_since = e.known_since;
        let store = self.deps.store.clone();
        let tkey = cron::key(name, tick);
        let recorded = match store.get(&tkey).await {
            Ok(Some(o)) => match TickRecord::decode(&tkey, &o.bytes) {
                Ok(r) => Some(r.decision),
                Err(e) => {
                    // Foreign bytes are never overwritten or deleted: the
                    // tick is left undecided, once.
                    tracing::warn!(key = tkey, error = %crate::error::Chain(&e), "leaving an object in ticks/ that is not a tick: the tick is not run");
                    self.settle_tick(name, tick);
                    return false;
                }
            },
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(key = tkey, error = %crate::error::Chain(&e), "reading a tick");
                return false;
            }
        };
        let Ok(Some((claim, version))) = crate::fleet::claim::get(&store, name).await else {
            // Unreadable, corrupt or absent (deleted: its absence is
            // handled by the claim rules first): looked at again later.
            return false;
        };
        let view = ClaimView::from(&claim);
        let live = plan::owner_live(&claim.owner, views);
        let at = ClaimAt::of(&view, live);
        let my_run = self
            .owned
            .get(name)
            .filter(|o| o.record.epoch == claim.epoch)
            .map(|o| o.record.epoch);
        let paused = self.paused(name);
        let mut wrote = false;
        let decision = match recorded {
            Some(d) => d,
            None => {
                // A session never run has no tick from before this node
                // knew it (see `Entry::known_since`).
                if claim.is_placeholder() && tick <= known_since {
                    self.settle_tick(name, tick);
                    return false;
                }
                if cron::looks_after(at, my_run.is_some(), 0).is_none() {
                    return false; // its live owner decides
                }
                // A node stopped (SIGSTOP) past its lease decides nothing.
                if self.deps.clock.now() >= self.valid_until() {
                    return false;
                }
                let d = match cron::decide(&schedule.rule, tick, now_ms, paused, at, &claim.nonce) {
                    Verdict::Wait => return false,
                    Verdict::Done => {
                        self.settle_tick(name, tick);
                        return false;
                    }
                    Verdict::Decide(d) => d,
                };
                match self.record_tick(name, tick, &d).await {
                    Ok(true) => {
                        wrote = true;
                        self.event(
                            EventKind::Tick,
                            Some(name),
                            Some(claim.epoch),
                            format!("tick {}: {}", cron::show(tick), d.describe()),
                        );
                        self.trim_ticks(name, tick).await;
                        d
                    }
                    Ok(false) => match store.get(&tkey).await {
                        // Another node decided first: follow its decision.
                        Ok(Some(o)) => match TickRecord::decode(&tkey, &o.bytes) {
                            Ok(r) => r.decision,
                            Err(_) => return false,
                        },
                        _ => return false,
                    },
                    Err(e) => {
                        tracing::debug!(key = tkey, error = %crate::error::Chain(&e), "recording a tick");
                        return false;
                    }
                }
            }
        };
        match cron::follow(&decision, tick, at, &claim.nonce, my_run) {
            Follow::Done => {
                self.settle_tick(name, tick);
            }
            // Paused since the record, or past the deadline by now: the
            // start is not carried out (the tick is not run).
            Follow::Release { .. } if paused || schedule.rule.past_deadline(tick, now_ms) => {
                self.settle_tick(name, tick);
            }
            Follow::Release { epoch } => {
                if self.deps.clock.now() >= self.valid_until() {
                    return wrote;
                }
                match crate::fleet::claim::release_at_rest(
                    &store,
                    name,
                    claim,
                    version,
                    &self.me,
                    tick,
                    format!("released for its tick at {}", cron::show(tick)),
                    self.deps.clock.wall_ms(),
                    self.deps.entropy.hex_id(),
                )
                .await
                {
                    Ok(Some((v, next))) => {
                        wrote = true;
                        let ckey = crate::keys::session(name);
                        // A finished run of ours is no longer ours.
                        self.owned.remove(name);
                        self.claims.insert(ckey, (v, ClaimView::from(&next)));
                        // Looked at at the next passes, as an alarm's
                        // session is: the hint and the bell may be lost.
                        self.gate.revisit.insert(name.to_string());
                        self.event(
                            EventKind::Released,
                            Some(name),
                            Some(epoch),
                            format!("for its tick at {}", cron::show(tick)),
                        );
                        crate::fleet::feed::ring_bell(&self.deps.store, self.deps.entropy.as_ref())
                            .await;
                        self.settle_tick(name, tick);
                    }
                    // The claim moved: read again at the next look.
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(session = name, error = %crate::error::Chain(&e), "releasing a claim for its tick")
                    }
                }
            }
            Follow::StopAndRelease { epoch } => {
                if self.replace_run(name, epoch, tick).await {
                    wrote = true;
                    self.settle_tick(name, tick);
                }
            }
        }
        wrote
    }

    /// Writes the tick's record (create-if-absent, read back by its nonce
    /// when the reply is lost): `true` if this node's write is the one
    /// stored, `false` if another node's is.
    async fn record_tick(&mut self, name: &str, tick: u64, d: &Decision) -> Result<bool> {
        let rec = TickRecord {
            schema: crate::record::SCHEMA.into(),
            kind: "tick".into(),
            session: name.to_string(),
            tick_ms: tick,
            decision: d.clone(),
            node: self.me.node.to_string(),
            decided_at_ms: self.deps.clock.wall_ms(),
            nonce: self.deps.entropy.hex_id(),
        };
        match put_checked(
            &self.deps.store,
            &cron::key(name, tick),
            Bytes::from(rec.encode()),
            Cond::Create,
            &rec.nonce,
            json_nonce,
        )
        .await?
        {
            Put::Committed(_) => Ok(true),
            Put::Rejected(_) => Ok(false),
        }
    }

    /// Stops this node's run of `name` at `epoch` and releases its claim,
    /// for a `replace` tick: the next epoch's run starts where placement
    /// puts it. Whether the release landed.
    async fn replace_run(&mut self, name: &str, epoch: u64, tick: u64) -> bool {
        let Some(running) = self
            .owned
            .get(name)
            .filter(|o| o.record.epoch == epoch)
            .map(|o| o.running)
        else {
            return false;
        };
        self.checks.stop(name);
        if running {
            self.deps.runner.stop(name).await;
            if let Some(x) = self.owned.get_mut(name) {
                x.running = false;
            }
        }
        if let Some(reg) = &self.deps.channel {
            reg.retire(name, epoch, "its schedule replaced the run");
        }
        // Released for this tick: the next run is the tick's, and carries it.
        let released = match self.state_change(name, ClaimState::Released, None) {
            Ok(Some((version, mut next))) => {
                next.tick_ms = Some(tick);
                next.reason = Some(format!("replaced by its tick at {}", cron::show(tick)));
                let w = ClaimWrite::send(ClaimIo::of(&self.deps), name, version, next).await;
                self.apply_state_change(name, w).await
            }
            Ok(None) => return false,
            Err(e) => Err(e),
        };
        match released {
            Ok(()) => {
                self.gate.revisit.insert(name.to_string());
                crate::fleet::feed::ring_bell(&self.deps.store, self.deps.entropy.as_ref()).await;
                true
            }
            Err(e) => {
                tracing::warn!(session = name, error = %crate::error::Chain(&e), "releasing a run its tick replaces");
                false
            }
        }
    }

    /// Deletes the session's tick records older than `written` (the one
    /// just written) beyond the newest [`cron::TICKS_KEPT`]: one listing of
    /// its ticks, and a read of each before its delete, so an object that
    /// is not a tick record of ours is never deleted. A tick's record is
    /// never what stops a second run of it (the claim carries its tick).
    async fn trim_ticks(&mut self, name: &str, written: u64) {
        let prefix = format!("{}{name}/", cron::TICKS);
        let mut keys = Vec::new();
        let mut entries = self.deps.store.list(&prefix);
        while let Some(e) = entries.next().await {
            match e {
                Ok(e)
                    if cron::parse_key(&e.key).is_some_and(|(s, t)| s == name && t <= written) =>
                {
                    keys.push(e.key)
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
        drop(entries);
        keys.sort();
        let old = keys.len().saturating_sub(cron::TICKS_KEPT);
        for key in keys.into_iter().take(old) {
            let ours = match self.deps.store.get(&key).await {
                Ok(Some(o)) => TickRecord::decode(&key, &o.bytes).is_ok(),
                _ => false,
            };
            if !ours {
                continue;
            }
            if let Err(e) = self.deps.store.delete(&key).await
                && !matches!(e, crate::store::StoreError::NotFound)
            {
                tracing::debug!(key, error = %crate::error::Chain(&e), "deleting an old tick");
            }
        }
    }
}
