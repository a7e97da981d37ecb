//! Alarms as a node acts on them: the index listed at least once a minute
//! and after each ring of the bell, and each alarm whose time has come
//! taken and fired by [`crate::fleet::alarm::step`]'s rule. The contract
//! (at most once, at least once within a bound, the cost) is in
//! `fleet::alarm`.

use super::*;
use crate::fleet::alarm::{self, AlarmRecord, Step};

/// How often the index is listed when nothing rings.
pub(super) const ALARM_LIST_EVERY: Duration = Duration::from_secs(60);

/// The most alarms read in one pass (the rest at the next, which comes at
/// once: the pass reports a change).
const ALARMS_PER_PASS: usize = 64;

/// The alarm index as this node last listed it.
#[derive(Debug, Default)]
pub(super) struct AlarmBook {
    /// When the index was last listed (the listing's send).
    listed_at: Option<MonoTime>,
    /// A ring of the bell asks for a listing at the next pass.
    pub(super) ring: bool,
    /// Listed alarm keys: their minute, and once read, the wall-clock
    /// instant this node acts on them (their time, plus `ttl + margin`
    /// unless this node is ranked first for the session).
    pending: BTreeMap<String, (u64, Option<u64>)>,
    /// Keys whose object is not an alarm of ours: left alone (foreign
    /// bytes are never deleted), logged once.
    foreign: std::collections::BTreeSet<String>,
    /// Alarms sessions asked for with their sleep (`sleep --wake-in`), by
    /// session: the epoch that asked, and when. Each is written once the
    /// claim is seen asleep at that epoch (set before, it could come due
    /// while the session was still awake and be consumed), retried at each
    /// pass while that write fails, and dropped if the claim moved on.
    pub(super) after_sleep: BTreeMap<String, (u64, u64)>,
}

impl Node {
    /// The pass's alarm phase: list the index when due, then act on the
    /// alarms whose time (for this node) has come. Returns whether anything
    /// was written or remains to do now.
    pub(super) async fn keep_alarms(&mut self) -> bool {
        let now = self.deps.clock.now();
        // Every ring (applies, fences, fired alarms) asks for a listing: at
        // most one per poll interval, so a busy fleet's rings cost at most
        // one LIST per node per ttl/3, not one per bell read.
        let since = self.alarms.listed_at.map(|t| now.saturating_since(t));
        if since.is_none_or(|d| d >= ALARM_LIST_EVERY || (self.alarms.ring && d >= self.cfg.poll)) {
            self.list_alarms(now).await;
        }
        let mut changed = self.settle_sleep_alarms().await;
        let now_ms = self.deps.clock.wall_ms();
        let due: Vec<String> = self
            .alarms
            .pending
            .iter()
            .filter(|(k, p)| !self.alarms.foreign.contains(*k) && self.first_look(k, p) <= now_ms)
            .map(|(k, _)| k.clone())
            .collect();
        let more = due.len() > ALARMS_PER_PASS;
        for key in due.into_iter().take(ALARMS_PER_PASS) {
            changed |= self.act_on_alarm(&key, now_ms).await;
        }
        changed || more
    }

    /// When this node next looks at alarm `key`: the instant learned at its
    /// last read, else its minute's start plus this node's rank's delay for
    /// the session (from the key alone), so only the first-ranked node reads
    /// an alarm as its minute begins.
    fn first_look(&self, key: &str, (minute, act_at): &(u64, Option<u64>)) -> u64 {
        act_at.unwrap_or_else(|| {
            let session = alarm::parse_key(key).map_or("", |(_, s)| s);
            minute
                .saturating_mul(60_000)
                .saturating_add(self.rank_delay_ms(session))
        })
    }

    /// How long after an alarm's time this node acts on it: its rank for
    /// the session times the poll interval.
    pub(super) fn rank_delay_ms(&self, session: &str) -> u64 {
        let rank = u32::try_from(self.alarm_rank(session)).unwrap_or(u32::MAX);
        u64::try_from(self.cfg.poll.saturating_mul(rank).as_millis()).unwrap_or(u64::MAX)
    }

    /// How long until the next alarm is due for this node (`None` if none
    /// is pending): the pause between passes ends there. Every look moves
    /// its alarm's next look ahead (`act_on_alarm`), so an alarm that
    /// cannot be settled is looked at once a poll interval, never in a loop.
    pub(super) fn alarm_wait(&self) -> Option<Duration> {
        let now_ms = self.deps.clock.wall_ms();
        self.alarms
            .pending
            .iter()
            .filter(|(k, _)| !self.alarms.foreign.contains(*k))
            .map(|(k, p)| self.first_look(k, p))
            .min()
            .map(|t| Duration::from_millis(t.saturating_sub(now_ms)))
    }

    /// Lists `alarms/`, keeping what was learned of alarms still there. A
    /// failed listing keeps the last one (tried again at the next pass).
    async fn list_alarms(&mut self, now: MonoTime) {
        let mut entries = self.deps.store.list(alarm::ALARMS);
        let mut listed = BTreeMap::new();
        while let Some(e) = entries.next().await {
            match e {
                Ok(e) => {
                    if let Some((minute, _)) = alarm::parse_key(&e.key) {
                        listed.insert(e.key, minute);
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %crate::error::Chain(&e), "listing alarms");
                    return;
                }
            }
        }
        let before = std::mem::take(&mut self.alarms.pending);
        self.alarms.pending = listed
            .into_iter()
            .map(|(k, minute)| {
                let act_at = before.get(&k).and_then(|(_, t)| *t);
                (k, (minute, act_at))
            })
            .collect();
        let pending = &self.alarms.pending;
        self.alarms.foreign.retain(|k| pending.contains_key(k));
        self.alarms.listed_at = Some(now);
        self.alarms.ring = false;
    }

    /// This node's place for `session` among the live nodes (rendezvous
    /// of ids, 0 = first). The node in place k acts k poll intervals
    /// (ttl/3 each) after the alarm's time, so one node usually writes, and
    /// the next covers a dead first within ttl/3.
    fn alarm_rank(&self, session: &str) -> usize {
        let mine = plan::score(session, self.me.node.as_str(), 1.0);
        self.peers
            .seen
            .iter()
            .filter(|(id, _, live, _, _)| *live && id != self.me.node.as_str())
            .filter(|(id, _, _, _, _)| plan::score(session, id, 1.0) > mine)
            .count()
    }

    /// Reads alarm `key` and its session's claim, and does what
    /// [`alarm::step`] says. Returns whether it wrote anything.
    async fn act_on_alarm(&mut self, key: &str, now_ms: u64) -> bool {
        // Looked at again a poll interval from now unless what follows
        // settles it (deleted) or knows better (its time, for a Wait): a
        // failed read or write is never retried in a loop.
        self.alarm_later(key, now_ms);
        let store = self.deps.store.clone();
        let o = match store.get(key).await {
            Ok(Some(o)) => o,
            Ok(None) => {
                self.alarms.pending.remove(key);
                return false;
            }
            Err(e) => {
                tracing::debug!(key, error = %crate::error::Chain(&e), "reading an alarm");
                return false;
            }
        };
        let a = match AlarmRecord::decode(key, &o.bytes) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(key, error = %crate::error::Chain(&e), "leaving an object in alarms/ that is not an alarm");
                self.alarms.foreign.insert(key.to_string());
                return false;
            }
        };
        let ckey = crate::keys::session(&a.session);
        let claim = match store.get(&ckey).await {
            Ok(Some(c)) => match ClaimRecord::decode(&ckey, &c.bytes) {
                Ok(r) => Some((r, c.version)),
                // A corrupt claim is never acted on (its alarm waits).
                Err(_) => return false,
            },
            Ok(None) => None,
            Err(_) => return false,
        };
        let manifest = match &claim {
            Some(_) => true,
            None => match store.get(&crate::keys::manifest(&a.session)).await {
                Ok(m) => m.is_some(),
                Err(_) => return false,
            },
        };
        let session = alarm::session_of(claim.as_ref().map(|(c, _)| c), manifest);
        let after = self.rank_delay_ms(&a.session);
        match alarm::step(&a, session, now_ms, after) {
            Step::Wait => {
                if let Some(p) = self.alarms.pending.get_mut(key) {
                    p.1 = Some(a.at_ms.saturating_add(after));
                }
                false
            }
            Step::Take { epoch } => {
                let mut taken = a.clone();
                taken.fired_at_epoch = Some(epoch);
                taken.nonce = self.deps.entropy.hex_id();
                match put_checked(
                    &store,
                    key,
                    Bytes::from(taken.encode()),
                    Cond::Match(o.version),
                    &taken.nonce,
                    json_nonce,
                )
                .await
                {
                    Ok(Put::Committed(_)) => {
                        let Some((c, v)) = claim else { return true };
                        self.release_for_alarm(key, &taken, c, v).await;
                        true
                    }
                    // Another node took or deleted it first: it fires it
                    // (or, if it dies, this node finishes it later).
                    Ok(Put::Rejected(_)) => false,
                    Err(e) => {
                        tracing::debug!(key, error = %crate::error::Chain(&e), "taking an alarm");
                        false
                    }
                }
            }
            Step::Release { .. } => {
                let Some((c, v)) = claim else { return false };
                self.release_for_alarm(key, &a, c, v).await;
                true
            }
            Step::Delete => {
                self.delete_alarm(key).await;
                true
            }
        }
    }

    /// Releases `claim` (sleeping at the epoch `alarm` was taken for), as a
    /// wake request does: one write, If-Match on the version read, epoch
    /// kept, so a node claims it above. Then the alarm is deleted and the
    /// bell rung (the nodes ranked for the session look now). A lost race
    /// (a wake came first) leaves the alarm to be deleted at its next read.
    async fn release_for_alarm(
        &mut self,
        key: &str,
        alarm: &AlarmRecord,
        claim: ClaimRecord,
        version: Version,
    ) {
        let epoch = claim.epoch;
        debug_assert_eq!(alarm.fired_at_epoch, Some(epoch));
        let ckey = crate::keys::session(&alarm.session);
        match crate::fleet::claim::release_sleeping(
            &self.deps.store,
            &alarm.session,
            claim,
            version,
            self.deps.clock.wall_ms(),
            self.deps.entropy.hex_id(),
        )
        .await
        {
            Ok(Some((v, next))) => {
                // This node knows at once, and looks at it at its next
                // passes (claiming it after the rank's grace if nobody
                // ranked above does): the write's hint and the bell may
                // both be lost, and a full listing is minutes away.
                self.claims
                    .insert(ckey.clone(), (v, ClaimView::from(&next)));
                self.gate.revisit.insert(alarm.session.clone());
                self.event(
                    EventKind::AlarmFired,
                    Some(&alarm.session),
                    Some(epoch),
                    format!("the alarm set for {} ms", alarm.at_ms),
                );
                self.delete_alarm(key).await;
                crate::fleet::feed::ring_bell(&self.deps.store, self.deps.entropy.as_ref()).await;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(key, error = %crate::error::Chain(&e), "releasing a claim for an alarm")
            }
        }
    }

    /// An alarm that could not be settled now (a read failed, a claim is
    /// corrupt, another node took it): read again a poll interval later,
    /// not at every pass.
    fn alarm_later(&mut self, key: &str, now_ms: u64) {
        let poll = u64::try_from(self.cfg.poll.as_millis()).unwrap_or(u64::MAX);
        if let Some(p) = self.alarms.pending.get_mut(key) {
            p.1 = Some(now_ms.saturating_add(poll));
        }
    }

    async fn delete_alarm(&mut self, key: &str) {
        match self.deps.store.delete(key).await {
            Ok(()) | Err(crate::store::StoreError::NotFound) => {
                self.alarms.pending.remove(key);
            }
            Err(e) => {
                tracing::debug!(key, error = %crate::error::Chain(&e), "deleting an alarm")
            }
        }
    }

    /// Writes the alarms sessions asked for with their sleep
    /// (`after_sleep`): each once its claim is asleep at the epoch that
    /// asked (read now), at its time or at once if that passed. Kept while
    /// the claim still shows that run (its sleep write is pending) or the
    /// alarm's write fails; dropped when the claim moved on (another node
    /// took it, it was woken or deleted). Returns whether one was written.
    pub(super) async fn settle_sleep_alarms(&mut self) -> bool {
        let mut written = false;
        let asked: Vec<(String, (u64, u64))> = self
            .alarms
            .after_sleep
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for (name, (epoch, at_ms)) in asked {
            let Ok(n) = Name::new(name.as_str()) else {
                self.alarms.after_sleep.remove(&name);
                continue;
            };
            let claim = match crate::fleet::claim::get(&self.deps.store, &name).await {
                Ok(c) => c.map(|(c, _)| c),
                // Read again at the next pass.
                Err(_) => continue,
            };
            match claim {
                Some(c) if c.epoch == epoch && c.state == ClaimState::Sleeping => {
                    let now = self.deps.clock.wall_ms();
                    let at = at_ms.max(now.saturating_add(1));
                    match crate::fleet::alarm::set(
                        &self.deps.store,
                        self.deps.entropy.as_ref(),
                        &n,
                        at,
                        now,
                    )
                    .await
                    {
                        Ok(_) => {
                            self.alarms.after_sleep.remove(&name);
                            self.alarms.ring = true;
                            written = true;
                        }
                        Err(e) => {
                            tracing::warn!(session = name, error = %crate::error::Chain(&e), "setting the alarm it asked for with its sleep: retried at the next pass");
                        }
                    }
                }
                // Its sleep is still being written (this node owns it at
                // that epoch): wait.
                Some(c)
                    if c.epoch == epoch
                        && self
                            .owned
                            .get(&name)
                            .is_some_and(|o| o.record.epoch == epoch) => {}
                _ => {
                    tracing::info!(
                        session = name,
                        epoch,
                        "the alarm asked for with its sleep is dropped: the session's claim moved on"
                    );
                    self.alarms.after_sleep.remove(&name);
                }
            }
        }
        written
    }
}
