//! Cron: a manifest's `schedule` runs its job once per tick fleet-wide
//! (issue #39), as a Kubernetes CronJob or a Nomad `periodic` job does.
//!
//! # Contract
//!
//! - **A tick is decided once.** For each tick (an instant the schedule
//!   names), one node writes `ticks/<session>/<tick ms>` create-if-absent
//!   with its decision: start a run, replace the running one, skip it (and
//!   why), or missed (past `starting_deadline`). A write whose reply is
//!   lost is read back by its nonce (`put_checked`), and a node that loses
//!   the create reads the winner's record and follows it. So however many
//!   nodes act, fail over or lose replies, a tick has one decision.
//! - **A started tick runs once, and the claim is the fence.** A `start`
//!   names the epoch and nonce of the very claim it found at rest (the
//!   admission placeholder at 0, a finished run, asleep, a tombstone
//!   applied again). Following it releases that claim (If-Match) only while
//!   it is still that write and has not run this tick; the released claim
//!   carries the tick (`ClaimRecord::tick_ms`), the run that claims it
//!   copies it, and its end keeps it. So a claim that ran tick T is never
//!   released for T again, whatever became of T's record (deleted,
//!   trimmed, unseen by a node whose clock is behind). A node that died
//!   between the record and the release is covered by whoever reads the
//!   record next. A run interrupted by its node's death is taken over and
//!   run again by its restart policy, as any job is (a Kubernetes Job
//!   replaces its lost pod the same way): that is the same tick's run.
//! - **Between ticks a scheduled session rests.** Placement never claims a
//!   scheduled session's admission placeholder, finished claim, or a
//!   released claim with no tick (a tombstone applied again)
//!   (`plan::claimable`); a tick releases it. A new spec does not run a
//!   finished one either (Kubernetes does not start a CronJob's job on an
//!   edit): the next tick runs the new spec.
//! - **Who decides.** While a run holds the claim and its owner is live,
//!   the owner decides the tick (it is the one that can replace its run).
//!   Otherwise the nodes ranked for the session (as alarms are) look at
//!   the tick in turn: the first at its time, the k-th k poll intervals
//!   later, so a dead first node costs ttl/3.
//! - **Which ticks.** A node looks at the latest tick at or before now.
//!   Ticks that passed while no node could act are folded into that one,
//!   as Kubernetes starts only the most recent missed schedule; with a
//!   `starting_deadline`, a tick looked at later than that is recorded
//!   `missed` instead. A session that was never run does not run for a
//!   tick from before its node knew it (the placeholder carries no time).
//! - **Concurrency**, when a tick finds the last run still going:
//!   `allow` (the default, as Kubernetes') waits for it to end and then
//!   starts (a session has one holder, so two runs never overlap: this is
//!   where leasehold differs from Kubernetes, which runs a second Job);
//!   `forbid` skips the tick; `replace` stops the running one (its node
//!   releases it) and the next epoch's run starts.
//! - **Time.** Five fields (minute, hour, day of month, month, day of
//!   week) or `@hourly`, `@daily`, `@weekly`, `@monthly`, `@yearly`, read
//!   by croner with Vixie cron's rules: a day of month and a day of week
//!   both restricted match either. The time zone is an IANA name (`UTC` by
//!   default) from the database built into the binary, so every node of a
//!   build agrees on every tick. Across daylight saving time: a fixed time
//!   in the gap runs just after it, once; in a repeated hour, once.
//!
//! The decisions are [`decide`] and [`follow`]: pure, table-tested. The
//! node's shell is `fleet::node::schedules`.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub use crate::keys::TICKS;

/// The most bytes a tick record may have.
pub const MAX_TICK_BYTES: usize = 4096;

/// Tick records kept per session (older ones are deleted as new ones are
/// written): what `describe` lists.
pub const TICKS_KEPT: usize = 20;

/// What to do when a tick finds the last run still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Concurrency {
    /// Start once the last run ends (runs never overlap).
    #[default]
    Allow,
    /// Skip the tick.
    Forbid,
    /// Stop the last run and start anew.
    Replace,
}

impl Concurrency {
    pub fn as_str(self) -> &'static str {
        match self {
            Concurrency::Allow => "allow",
            Concurrency::Forbid => "forbid",
            Concurrency::Replace => "replace",
        }
    }
}

/// A spec's `schedule`: written as the cron line alone
/// (`"schedule": "*/5 * * * *"`, in UTC) or as an object
/// (`{"cron": "0 3 * * *", "time_zone": "Europe/Paris", "concurrency":
/// "forbid", "starting_deadline": "10m"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Schedule {
    pub cron: String,
    /// An IANA time zone name; `UTC` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    #[serde(default)]
    pub concurrency: Concurrency,
    /// A tick looked at later than this after its time is `missed`, not
    /// run. Absent: any delay.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::opt_duration"
    )]
    pub starting_deadline: Option<Duration>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduleObject {
    cron: String,
    #[serde(default)]
    time_zone: Option<String>,
    #[serde(default)]
    concurrency: Concurrency,
    #[serde(default, with = "super::opt_duration")]
    starting_deadline: Option<Duration>,
}

impl<'de> Deserialize<'de> for Schedule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Line(String),
            Object(ScheduleObject),
        }
        Ok(match Form::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "schedule: a cron line (\"0 3 * * *\") or {cron, time_zone, concurrency, starting_deadline}",
            )
        })? {
            Form::Line(cron) => Schedule {
                cron,
                time_zone: None,
                concurrency: Concurrency::Allow,
                starting_deadline: None,
            },
            Form::Object(o) => Schedule {
                cron: o.cron,
                time_zone: o.time_zone,
                concurrency: o.concurrency,
                starting_deadline: o.starting_deadline,
            },
        })
    }
}

impl Schedule {
    /// Is tick `tick_ms`, looked at `now_ms`, past its `starting_deadline`?
    pub fn past_deadline(&self, tick_ms: u64, now_ms: u64) -> bool {
        self.starting_deadline.is_some_and(|d| {
            now_ms > tick_ms.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        })
    }

    /// The time zone's name as shown (`UTC` when none is given).
    pub fn zone_name(&self) -> &str {
        self.time_zone.as_deref().unwrap_or("UTC")
    }

    /// Checks every field: the cron line parses as five fields (or an
    /// `@` alias), the time zone is known, the schedule fires at all, the
    /// deadline is from 1 s to a year. The field that is wrong is named.
    pub fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        if let Some(d) = self.starting_deadline
            && !(Duration::from_secs(1)..=Duration::from_secs(366 * 86_400)).contains(&d)
        {
            return Err(("schedule.starting_deadline", "from 1s to 366 days".into()));
        }
        self.compile().map(|_| ())
    }

    /// [`Schedule::validate`], and the restart policy beside it (whether
    /// it is `always`): a scheduled session is a job (a run that never
    /// ended would hold every later tick).
    pub fn validate_for(
        &self,
        restart_always: bool,
    ) -> std::result::Result<(), (&'static str, String)> {
        self.validate()?;
        if restart_always {
            return Err((
                "restart",
                "a scheduled session is a job: restart on-failure or never".into(),
            ));
        }
        Ok(())
    }

    /// The schedule ready to compute ticks.
    #[cfg(feature = "cron")]
    pub fn compile(&self) -> std::result::Result<Compiled, (&'static str, String)> {
        if self.cron.len() > 256 || self.cron.chars().any(char::is_control) {
            return Err((
                "schedule.cron",
                "at most 256 characters, none of them control characters".into(),
            ));
        }
        let trimmed = self.cron.trim();
        if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
            return Err((
                "schedule.cron",
                "five fields (minute hour day-of-month month day-of-week), or @hourly, @daily, @weekly, @monthly, @yearly".into(),
            ));
        }
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .year(croner::parser::Year::Disallowed)
            .build();
        let cron = parser
            .parse(trimmed)
            .map_err(|e| ("schedule.cron", e.to_string()))?;
        let zone = match &self.time_zone {
            None => jiff::tz::TimeZone::UTC,
            Some(z) => jiff::tz::TimeZone::get(z).map_err(|_| {
                (
                    "schedule.time_zone",
                    format!("{z:?} is not a time zone this build knows (an IANA name such as Europe/Paris)"),
                )
            })?,
        };
        let c = Compiled { cron, zone };
        // A pattern that never fires (the 30th of February) is refused: from
        // a fixed instant, so the answer does not depend on today.
        if c.next_after(946_684_800_000).is_none() {
            return Err(("schedule.cron", "it never fires".into()));
        }
        Ok(c)
    }

    /// Without the `cron` feature a schedule cannot be read: refused, so
    /// nothing is stored that this build would misread.
    #[cfg(not(feature = "cron"))]
    pub fn compile(&self) -> std::result::Result<Compiled, (&'static str, String)> {
        Err((
            "schedule",
            "this build of leasehold has no cron support (its `cron` feature)".into(),
        ))
    }
}

/// A schedule compiled: its ticks, as wall-clock milliseconds.
#[derive(Debug, Clone)]
pub struct Compiled {
    #[cfg(feature = "cron")]
    cron: croner::Cron,
    #[cfg(feature = "cron")]
    zone: jiff::tz::TimeZone,
}

#[cfg(feature = "cron")]
impl Compiled {
    fn zoned(&self, ms: u64) -> Option<jiff::Zoned> {
        let ms = i64::try_from(ms).ok()?;
        let t = jiff::Timestamp::from_millisecond(ms).ok()?;
        Some(t.to_zoned(self.zone.clone()))
    }

    fn ms(z: &jiff::Zoned) -> Option<u64> {
        u64::try_from(z.timestamp().as_millisecond()).ok()
    }

    /// The latest tick at or before `ms` (`None` if there is none since
    /// 1970 or the search fails).
    pub fn latest_at_or_before(&self, ms: u64) -> Option<u64> {
        let z = self.zoned(ms)?;
        let t = self.cron.find_previous_occurrence(&z, true).ok()?;
        Self::ms(&t)
    }

    /// The first tick strictly after `ms`.
    pub fn next_after(&self, ms: u64) -> Option<u64> {
        let z = self.zoned(ms)?;
        let t = self.cron.find_next_occurrence(&z, false).ok()?;
        Self::ms(&t).filter(|&t| t > ms && t <= crate::record::MAX_AT_MS)
    }
}

#[cfg(not(feature = "cron"))]
impl Compiled {
    pub fn latest_at_or_before(&self, _ms: u64) -> Option<u64> {
        None
    }
    pub fn next_after(&self, _ms: u64) -> Option<u64> {
        None
    }
}

/// A tick's time as logs and journals show it (RFC 3339, UTC, seconds).
pub fn show(ms: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// A tick's decision, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "what", rename_all = "lowercase", deny_unknown_fields)]
pub enum Decision {
    /// Release the claim found at rest at `from_epoch` with nonce
    /// `from_nonce` (that very write: a placeholder made again by a
    /// re-apply has another), for a run above it.
    Start { from_epoch: u64, from_nonce: String },
    /// Stop the run at `epoch` (its owner releases it) and start anew.
    Replace { epoch: u64 },
    /// Not run, and why.
    Skip { reason: String },
    /// Looked at past its `starting_deadline`.
    Missed,
}

impl Decision {
    /// How `describe` shows it.
    pub fn describe(&self) -> String {
        match self {
            Decision::Start { from_epoch, .. } => {
                format!("started (from epoch {from_epoch})")
            }
            Decision::Replace { epoch } => {
                format!("replaced the run at epoch {epoch}")
            }
            Decision::Skip { reason } => format!("skipped: {reason}"),
            Decision::Missed => "missed its starting deadline".into(),
        }
    }
}

/// A tick as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TickRecord {
    pub schema: String,
    pub kind: String,
    pub session: String,
    pub tick_ms: u64,
    pub decision: Decision,
    /// The node that decided, and when by its wall clock (for humans).
    pub node: String,
    pub decided_at_ms: u64,
    pub nonce: String,
}

impl TickRecord {
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        let r: TickRecord = crate::record::decode_as(key, bytes, "tick", MAX_TICK_BYTES, "tick")?;
        if crate::keys::parse_tick(key) != Some((r.session.as_str(), r.tick_ms)) {
            return Err(Error::corrupt(
                key,
                "the session or tick does not match the key",
            ));
        }
        match &r.decision {
            Decision::Skip { reason } if !crate::record::printable(reason, 1024) => {
                return Err(Error::corrupt(
                    key,
                    "reason must be 1-1024 printable characters",
                ));
            }
            Decision::Start { from_epoch: e, .. } | Decision::Replace { epoch: e }
                if *e > crate::record::MAX_EPOCH =>
            {
                return Err(Error::corrupt(key, "an epoch above the highest"));
            }
            Decision::Start { from_nonce, .. } if !crate::record::id_like(from_nonce) => {
                return Err(Error::corrupt(
                    key,
                    "from_nonce must be 1-64 of [A-Za-z0-9-]",
                ));
            }
            _ => {}
        }
        // Year 9999 at most: every tick shown is a valid time.
        if r.tick_ms > crate::record::MAX_AT_MS {
            return Err(Error::corrupt(key, "a tick past the year 9999"));
        }
        if crate::Name::new(r.node.as_str()).is_err() {
            return Err(Error::corrupt(key, "not a node name"));
        }
        Ok(r)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("tick serialises")
    }
}

pub use crate::keys::{parse_tick as parse_key, tick as key};

/// The session's recorded ticks, newest first: one listing of its ticks
/// and a read of each (at most [`TICKS_KEPT`] are kept). A record that
/// cannot be read or decoded is left out.
pub async fn recent(
    store: &std::sync::Arc<dyn crate::store::Store>,
    session: &crate::Name,
) -> Result<Vec<TickRecord>> {
    use futures::StreamExt;
    let prefix = format!("{TICKS}{session}/");
    let mut keys = Vec::new();
    let mut entries = store.list(&prefix);
    while let Some(e) = entries.next().await {
        let e = e.map_err(|e| Error::from_store("list", &prefix, e))?;
        if parse_key(&e.key).is_some_and(|(s, _)| s == session.as_str()) {
            keys.push(e.key);
        }
    }
    drop(entries);
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::new();
    for k in keys.into_iter().take(TICKS_KEPT) {
        if let Ok(Some(o)) = store.get(&k).await
            && let Ok(r) = TickRecord::decode(&k, &o.bytes)
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// A scheduled session's claim, as a tick sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAt {
    /// At rest at this epoch: the admission placeholder (0), a finished
    /// run, asleep, or a deleted session's tombstone applied again; `tick`
    /// is the last tick it ran for.
    Rest { epoch: u64, tick: Option<u64> },
    /// Released to placement for a tick's run (or a vanished claim's
    /// marker, which the absence rules place): a run is about to start.
    Queued,
    /// A run holds it (running or paused); its owner live or not.
    Held { epoch: u64, owner_live: bool },
}

impl ClaimAt {
    /// From a claim's view, and whether its owner is live.
    pub fn of(c: &super::plan::ClaimView, owner_live: bool) -> ClaimAt {
        use super::claim::ClaimState::*;
        match c.state {
            _ if c.is_placeholder() => ClaimAt::Rest {
                epoch: 0,
                tick: None,
            },
            Succeeded | Failed | Sleeping => ClaimAt::Rest {
                epoch: c.epoch,
                tick: c.tick,
            },
            Released if c.is_vanished() => ClaimAt::Queued,
            Released if c.tick.is_none() => ClaimAt::Rest {
                epoch: c.epoch,
                tick: None,
            },
            Released => ClaimAt::Queued,
            Running | Paused => ClaimAt::Held {
                epoch: c.epoch,
                owner_live,
            },
        }
    }
}

/// What a node does about a tick now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not yet (a run is still going under `allow`): looked at again.
    Wait,
    /// Its claim ran this tick (or a later one) already: nothing to
    /// record, whatever became of the tick's record.
    Done,
    /// Record this decision (create-if-absent), then [`follow`] it.
    Decide(Decision),
}

/// The rule: what tick `tick_ms` of a session with schedule `s` becomes,
/// looked at at `now_ms`, its manifest paused or not, its claim `claim`.
pub fn decide(
    s: &Schedule,
    tick_ms: u64,
    now_ms: u64,
    paused: bool,
    claim: ClaimAt,
    nonce: &str,
) -> Verdict {
    let skip = |r: &str| Verdict::Decide(Decision::Skip { reason: r.into() });
    if let ClaimAt::Rest { tick: Some(t), .. } = claim
        && t >= tick_ms
    {
        return Verdict::Done;
    }
    if paused {
        return skip("the session is paused");
    }
    if s.past_deadline(tick_ms, now_ms) {
        return Verdict::Decide(Decision::Missed);
    }
    match (claim, s.concurrency) {
        (ClaimAt::Rest { epoch, .. }, _) => Verdict::Decide(Decision::Start {
            from_epoch: epoch,
            from_nonce: nonce.to_string(),
        }),
        (ClaimAt::Queued | ClaimAt::Held { .. }, Concurrency::Allow) => Verdict::Wait,
        (ClaimAt::Queued, _) => skip("a run is queued and has not started yet"),
        (
            ClaimAt::Held {
                owner_live: false, ..
            },
            _,
        ) => skip("its last run was interrupted and is being taken over"),
        (ClaimAt::Held { .. }, Concurrency::Forbid) => {
            skip("its last run is still going (concurrency: forbid)")
        }
        (ClaimAt::Held { epoch, .. }, Concurrency::Replace) => {
            Verdict::Decide(Decision::Replace { epoch })
        }
    }
}

/// Who looks at a tick: `Some(delay)` after its time, or `None` for a node
/// that leaves it to the claim's live owner.
pub fn looks_after(claim: ClaimAt, i_own_it: bool, rank_delay_ms: u64) -> Option<u64> {
    match claim {
        ClaimAt::Held {
            owner_live: true, ..
        } => i_own_it.then_some(0),
        _ => Some(rank_delay_ms),
    }
}

/// What following a recorded decision takes now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// Release the claim at rest at `epoch` (If-Match on the version read).
    Release { epoch: u64 },
    /// This node owns the run at `epoch`: stop it and release its claim.
    StopAndRelease { epoch: u64 },
    /// Nothing (done, or not this node's to do).
    Done,
}

/// The follow-through of tick `tick_ms`'s decision `d`, given the claim
/// now (and its nonce: which write it is) and the epoch of this node's own
/// run of the session, if it has one. A start releases only the very claim
/// it found at rest, and only if that claim has not run this tick.
pub fn follow(
    d: &Decision,
    tick_ms: u64,
    claim: ClaimAt,
    nonce: &str,
    my_run: Option<u64>,
) -> Follow {
    match (d, claim) {
        (
            Decision::Start {
                from_epoch,
                from_nonce,
            },
            ClaimAt::Rest { epoch, tick },
        ) if epoch == *from_epoch && nonce == from_nonce && tick.is_none_or(|t| t < tick_ms) => {
            Follow::Release { epoch }
        }
        (Decision::Replace { epoch }, ClaimAt::Held { epoch: e, .. })
            if e == *epoch && my_run == Some(e) =>
        {
            Follow::StopAndRelease { epoch: e }
        }
        _ => Follow::Done,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(c: Concurrency, deadline: Option<u64>) -> Schedule {
        Schedule {
            cron: "* * * * *".into(),
            time_zone: None,
            concurrency: c,
            starting_deadline: deadline.map(Duration::from_secs),
        }
    }

    const T: u64 = 1_800_000_000_000;

    fn rest(epoch: u64) -> ClaimAt {
        ClaimAt::Rest { epoch, tick: None }
    }

    #[test]
    fn the_rule_table() {
        use ClaimAt::*;
        use Concurrency::*;
        let live = Held {
            epoch: 4,
            owner_live: true,
        };
        let lost = Held {
            epoch: 4,
            owner_live: false,
        };
        let start = |e: u64| {
            Verdict::Decide(Decision::Start {
                from_epoch: e,
                from_nonce: "n1".into(),
            })
        };
        for c in [Allow, Forbid, Replace] {
            let s = sched(c, None);
            // At rest: start from its epoch and that very write.
            assert_eq!(decide(&s, T, T, false, rest(0), "n1"), start(0));
            assert_eq!(decide(&s, T, T + 5, false, rest(7), "n1"), start(7));
            // At rest after a run of this tick or a later one: done.
            for t in [T, T + 60_000] {
                let ran = Rest {
                    epoch: 7,
                    tick: Some(t),
                };
                assert_eq!(decide(&s, T, T, false, ran, "n1"), Verdict::Done);
                assert_eq!(decide(&s, T, T, true, ran, "n1"), Verdict::Done);
            }
            let earlier = Rest {
                epoch: 7,
                tick: Some(T - 60_000),
            };
            assert_eq!(decide(&s, T, T, false, earlier, "n1"), start(7));
            // Paused: skipped, even at rest.
            assert!(matches!(
                decide(&s, T, T, true, rest(3), "n1"),
                Verdict::Decide(Decision::Skip { .. })
            ));
        }
        let d = |c, claim| decide(&sched(c, None), T, T, false, claim, "n1");
        assert_eq!(d(Allow, live), Verdict::Wait);
        assert_eq!(d(Allow, lost), Verdict::Wait);
        assert_eq!(d(Allow, Queued), Verdict::Wait);
        assert_eq!(
            d(Replace, live),
            Verdict::Decide(Decision::Replace { epoch: 4 })
        );
        for (c, claim) in [
            (Forbid, live),
            (Forbid, lost),
            (Forbid, Queued),
            (Replace, lost),
            (Replace, Queued),
        ] {
            assert!(
                matches!(d(c, claim), Verdict::Decide(Decision::Skip { .. })),
                "{c:?} {claim:?}"
            );
        }
        // The deadline: on time runs, late is missed (even a waiting allow).
        let s = sched(Allow, Some(60));
        assert_eq!(decide(&s, T, T + 60_000, false, rest(1), "n1"), start(1));
        assert_eq!(
            decide(&s, T, T + 60_001, false, rest(1), "n1"),
            Verdict::Decide(Decision::Missed)
        );
        assert_eq!(
            decide(&s, T, T + 60_001, false, live, "n1"),
            Verdict::Decide(Decision::Missed)
        );
    }

    #[test]
    fn claims_at_rest_and_queued() {
        use super::super::claim::{ClaimRecord, ClaimState};
        use super::super::plan::ClaimView;
        let view = |state, epoch, tick| {
            let mut c = ClaimRecord::placeholder("x".into(), 0);
            c.owner.node = "n1".into();
            c.owner.instance = "i1".into();
            c.state = state;
            c.epoch = epoch;
            c.tick_ms = tick;
            ClaimView::from(&c)
        };
        let placeholder = ClaimView::from(&ClaimRecord::placeholder("x".into(), 0));
        assert_eq!(ClaimAt::of(&placeholder, false), rest(0));
        // Released for a tick: queued. A tombstone (no tick): at rest. A
        // vanished marker: the absence rules place it.
        assert_eq!(
            ClaimAt::of(&view(ClaimState::Released, 3, Some(T)), false),
            ClaimAt::Queued
        );
        assert_eq!(
            ClaimAt::of(&view(ClaimState::Released, 3, None), false),
            rest(3)
        );
        let marker = ClaimView::from(&ClaimRecord::vanished(3, "x".into(), 0));
        assert_eq!(ClaimAt::of(&marker, false), ClaimAt::Queued);
        assert_eq!(
            ClaimAt::of(&view(ClaimState::Succeeded, 3, Some(T)), false),
            ClaimAt::Rest {
                epoch: 3,
                tick: Some(T)
            }
        );
        assert_eq!(
            ClaimAt::of(&view(ClaimState::Running, 3, Some(T)), true),
            ClaimAt::Held {
                epoch: 3,
                owner_live: true
            }
        );
    }

    #[test]
    fn a_start_releases_only_the_claim_it_found_at_rest() {
        use ClaimAt::*;
        let d = Decision::Start {
            from_epoch: 3,
            from_nonce: "n1".into(),
        };
        assert_eq!(
            follow(&d, T, rest(3), "n1", None),
            Follow::Release { epoch: 3 }
        );
        // Another write at the same epoch (a placeholder made again by a
        // re-apply, a tombstone): not the claim it found.
        assert_eq!(follow(&d, T, rest(3), "n2", None), Follow::Done);
        // At rest at that epoch but already run for this tick: done.
        let ran = Rest {
            epoch: 3,
            tick: Some(T),
        };
        assert_eq!(follow(&d, T, ran, "n1", None), Follow::Done);
        // Released, run, and at rest above: done, never a second run.
        assert_eq!(follow(&d, T, Queued, "n1", None), Follow::Done);
        assert_eq!(
            follow(
                &d,
                T,
                Held {
                    epoch: 4,
                    owner_live: true
                },
                "n1",
                None
            ),
            Follow::Done
        );
        assert_eq!(follow(&d, T, rest(4), "n1", None), Follow::Done);
        // Skips and misses take nothing.
        let s = Decision::Skip { reason: "x".into() };
        assert_eq!(follow(&s, T, rest(3), "n1", None), Follow::Done);
        assert_eq!(
            follow(&Decision::Missed, T, rest(3), "n1", None),
            Follow::Done
        );
    }

    #[test]
    fn only_the_owner_of_that_run_replaces_it() {
        use ClaimAt::*;
        let d = Decision::Replace { epoch: 4 };
        let held = Held {
            epoch: 4,
            owner_live: true,
        };
        assert_eq!(
            follow(&d, T, held, "n", Some(4)),
            Follow::StopAndRelease { epoch: 4 }
        );
        assert_eq!(follow(&d, T, held, "n", None), Follow::Done);
        assert_eq!(follow(&d, T, held, "n", Some(3)), Follow::Done);
        // Already replaced (a later run) or released: done.
        let later = Held {
            epoch: 5,
            owner_live: true,
        };
        assert_eq!(follow(&d, T, later, "n", Some(5)), Follow::Done);
        assert_eq!(follow(&d, T, Queued, "n", Some(4)), Follow::Done);
    }

    #[test]
    fn the_live_owner_alone_looks_at_its_runs_ticks() {
        use ClaimAt::*;
        let held = Held {
            epoch: 2,
            owner_live: true,
        };
        assert_eq!(looks_after(held, true, 5000), Some(0));
        assert_eq!(looks_after(held, false, 5000), None);
        assert_eq!(looks_after(rest(2), false, 5000), Some(5000));
        assert_eq!(
            looks_after(
                Held {
                    epoch: 2,
                    owner_live: false
                },
                false,
                0
            ),
            Some(0)
        );
    }

    #[cfg(feature = "cron")]
    #[test]
    fn ticks_in_utc_and_in_a_zone() {
        let s = Schedule {
            cron: "30 3 * * *".into(),
            time_zone: Some("Europe/Paris".into()),
            concurrency: Concurrency::Allow,
            starting_deadline: None,
        };
        let c = s.compile().unwrap();
        // 2026-12-06T00:00:00Z: the next 03:30 in Paris (UTC+1) is 02:30Z.
        let midnight = 1_796_515_200_000;
        assert_eq!(
            c.next_after(midnight),
            Some(midnight + 2 * 3_600_000 + 1_800_000)
        );
        assert_eq!(
            c.latest_at_or_before(midnight + 2 * 3_600_000 + 1_800_000),
            Some(midnight + 2 * 3_600_000 + 1_800_000)
        );
        assert_eq!(
            c.latest_at_or_before(midnight),
            Some(midnight - 86_400_000 + 2 * 3_600_000 + 1_800_000)
        );
        let every5 = Schedule {
            cron: "*/5 * * * *".into(),
            time_zone: None,
            concurrency: Concurrency::Allow,
            starting_deadline: None,
        }
        .compile()
        .unwrap();
        assert_eq!(every5.next_after(midnight), Some(midnight + 300_000));
        assert_eq!(every5.next_after(midnight + 1), Some(midnight + 300_000));
        assert_eq!(
            every5.latest_at_or_before(midnight + 299_999),
            Some(midnight)
        );
    }

    /// Daylight saving time in Europe/Paris, 2026: a fixed time in the
    /// spring gap runs once, just after it; in the autumn's repeated hour,
    /// once, at its first pass; a search back from each tick finds it.
    #[cfg(feature = "cron")]
    #[test]
    fn a_fixed_time_runs_once_across_daylight_saving_time() {
        let c = Schedule {
            cron: "30 2 * * *".into(),
            time_zone: Some("Europe/Paris".into()),
            concurrency: Concurrency::Allow,
            starting_deadline: None,
        }
        .compile()
        .unwrap();
        let ticks_in = |from: u64, to: u64| {
            let mut out = Vec::new();
            let mut t = from;
            while let Some(n) = c.next_after(t).filter(|&n| n < to) {
                out.push(n);
                t = n;
            }
            out
        };
        let hour = 3_600_000;
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00Z); 02:30 does
        // not exist: once, at the gap's end.
        let spring = 1_774_742_400_000;
        let t = ticks_in(spring, spring + 24 * hour);
        assert_eq!(t.len(), 1, "{t:?}");
        assert!(t[0] >= spring + hour && t[0] < spring + 2 * hour, "{t:?}");
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00Z); 02:30
        // comes twice (00:30Z, 01:30Z): once, the first.
        let autumn = 1_792_886_400_000;
        let t = ticks_in(autumn, autumn + 24 * hour);
        assert_eq!(t, [autumn + hour / 2], "{t:?}");
        // Each tick is what a search back from it finds, so every node
        // names a tick by the same key.
        for day in [spring, autumn] {
            for t in ticks_in(day - 3 * 24 * hour, day + 3 * 24 * hour) {
                assert_eq!(c.latest_at_or_before(t), Some(t));
                assert_eq!(c.latest_at_or_before(t + 59_999), Some(t));
            }
        }
    }

    #[cfg(feature = "cron")]
    #[test]
    fn bad_schedules_name_their_field() {
        let bad = |cron: &str, tz: Option<&str>| {
            Schedule {
                cron: cron.into(),
                time_zone: tz.map(Into::into),
                concurrency: Concurrency::Allow,
                starting_deadline: None,
            }
            .validate()
            .unwrap_err()
            .0
        };
        assert_eq!(bad("* * * *", None), "schedule.cron");
        assert_eq!(bad("0 * * * * *", None), "schedule.cron"); // seconds
        assert_eq!(bad("61 * * * *", None), "schedule.cron");
        assert_eq!(bad("0 0 30 2 *", None), "schedule.cron"); // never fires
        assert_eq!(bad("", None), "schedule.cron");
        assert_eq!(bad("0 3 * * *", Some("Mars/Olympus")), "schedule.time_zone");
        let mut s = sched(Concurrency::Allow, Some(0));
        assert_eq!(s.validate().unwrap_err().0, "schedule.starting_deadline");
        s.starting_deadline = None;
        s.validate().unwrap();
        for ok in ["@daily", "@hourly", "0 3 * * 1-5", "*/15 9-17 * * MON-FRI"] {
            Schedule {
                cron: ok.into(),
                ..sched(Concurrency::Allow, None)
            }
            .validate()
            .unwrap_or_else(|e| panic!("{ok}: {e:?}"));
        }
    }

    #[test]
    fn both_forms_read_and_unknown_fields_are_refused() {
        let s: Schedule = serde_json::from_str(r#""0 3 * * *""#).unwrap();
        assert_eq!(s.cron, "0 3 * * *");
        assert_eq!(s.concurrency, Concurrency::Allow);
        let s: Schedule = serde_json::from_str(
            r#"{"cron":"0 3 * * *","time_zone":"Europe/Paris","concurrency":"forbid","starting_deadline":"10m"}"#,
        )
        .unwrap();
        assert_eq!(s.concurrency, Concurrency::Forbid);
        assert_eq!(s.starting_deadline, Some(Duration::from_secs(600)));
        assert!(serde_json::from_str::<Schedule>(r#"{"cron":"0 3 * * *","every":"1h"}"#).is_err());
        assert!(
            serde_json::from_str::<Schedule>(r#"{"cron":"0 3 * * *","concurrency":"queue"}"#)
                .is_err()
        );
    }

    #[test]
    fn records_round_trip_and_a_mismatched_key_is_corrupt() {
        let r = TickRecord {
            schema: crate::record::SCHEMA.into(),
            kind: "tick".into(),
            session: "nightly".into(),
            tick_ms: T,
            decision: Decision::Start {
                from_epoch: 2,
                from_nonce: "abc".into(),
            },
            node: "n1".into(),
            decided_at_ms: T + 5,
            nonce: "abc".into(),
        };
        let k = key("nightly", T);
        assert_eq!(TickRecord::decode(&k, &r.encode()).unwrap(), r);
        assert!(TickRecord::decode(&key("other", T), &r.encode()).is_err());
        assert!(TickRecord::decode(&key("nightly", T + 1), &r.encode()).is_err());
        assert_eq!(parse_key(&k), Some(("nightly", T)));
        assert_eq!(parse_key("ticks/nightly/x"), None);
    }
}
