//! Session claims: `sessions/<name>`.
//!
//! A claim has no TTL of its own. It names its owner `{node, instance}` and is
//! live while `nodes/<node>` is live with that same instance, so a node renews
//! one object however many sessions it runs. Its `epoch` is the session's
//! fencing token: it increases on every takeover and is never reset (release
//! leaves a tombstone).

use crate::error::{Error, Result};
use crate::store::{Store, Version};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Who runs a session.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    pub node: String,
    pub instance: String,
}

/// The state an owner records. `queued` and `interrupted` are not stored:
/// they are what a reader concludes from a missing/released claim or a dead
/// owner (see [`Status`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ClaimState {
    Running,
    Paused,
    Succeeded,
    Failed,
    Released,
    /// Asleep: no process, no owner (the claim names nobody), its epoch
    /// kept. No node claims it until a wake request turns it `released`.
    Sleeping,
}

impl ClaimState {
    /// The word readers print (`ls`, `resolve`, the demo), as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Running => "running",
            ClaimState::Paused => "paused",
            ClaimState::Succeeded => "succeeded",
            ClaimState::Failed => "failed",
            ClaimState::Released => "released",
            ClaimState::Sleeping => "sleeping",
        }
    }

    /// Completed sessions are not run again unless their manifest changes.
    pub fn is_terminal(self) -> bool {
        matches!(self, ClaimState::Succeeded | ClaimState::Failed)
    }

    /// Legal transitions for the owner. Anything else is refused.
    pub fn can_become(self, next: ClaimState) -> bool {
        use ClaimState::*;
        match (self, next) {
            (a, b) if a == b => true,
            (Running, _) => true,
            (Paused, Running | Released) => true,
            (Sleeping, Released) => true, // a wake request
            (Succeeded | Failed, Released | Running) => true, // Running: manifest changed
            (Released, _) => false,       // a released claim is taken over (epoch + 1), not revived
            _ => false,
        }
    }
}

/// The status vocabulary shown to users. It grows (`backoff` came with
/// restart rules): match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Status {
    /// No live claim.
    Queued,
    Running,
    Paused,
    /// The owner was lost without releasing.
    Interrupted,
    /// Running, but between two runs: a crash-loop back-off holds the next
    /// start (no process runs now).
    Backoff,
    /// Running, but its health check has not passed yet.
    Starting,
    /// Its health check failed `threshold` times in a row: it is being
    /// stopped, and its restart policy applies.
    Unhealthy,
    /// Asleep: no process and no owner until a wake request.
    Sleeping,
    /// Scheduled and never run yet: it waits for its first tick.
    Scheduled,
    Succeeded,
    Failed,
}

impl Status {
    /// The word `ls`, `describe`, `resolve` and JSON print, as serialised.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Interrupted => "interrupted",
            Status::Backoff => "backoff",
            Status::Starting => "starting",
            Status::Unhealthy => "unhealthy",
            Status::Sleeping => "sleeping",
            Status::Scheduled => "scheduled",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
        }
    }

    /// The status of a claim in `state` with `health` and a back-off until
    /// `backoff_until_ms` (the owner's wall clock), whose owner is alive or
    /// not (its node lease live with the claim's instance, judged by
    /// observation), at `now_ms` (the reader's wall clock: only the
    /// back-off, which is advisory, reads it). One derivation for every
    /// reader, so `ls`, `describe` and `resolve` say the same word.
    pub fn of(
        state: ClaimState,
        health: Option<super::check::Health>,
        backoff_until_ms: Option<u64>,
        owner_live: bool,
        now_ms: u64,
    ) -> Status {
        match state {
            ClaimState::Released => Status::Queued,
            ClaimState::Succeeded => Status::Succeeded,
            ClaimState::Failed => Status::Failed,
            ClaimState::Paused => Status::Paused,
            ClaimState::Sleeping => Status::Sleeping,
            ClaimState::Running if !owner_live => Status::Interrupted,
            ClaimState::Running if backoff_until_ms.is_some_and(|t| t > now_ms) => Status::Backoff,
            ClaimState::Running => match health {
                Some(super::check::Health::Starting) => Status::Starting,
                Some(super::check::Health::Unhealthy) => Status::Unhealthy,
                None => Status::Running,
            },
        }
    }
}

/// The status a reader shows for a session, from its claim (if any) and
/// whether the claim's owner is alive, at `now_ms` (see [`Status::of`]).
pub fn status(claim: Option<&ClaimRecord>, owner_live: bool, now_ms: u64) -> Status {
    match claim {
        None => Status::Queued,
        Some(c) => Status::of(c.state, c.health, c.backoff_until_ms, owner_live, now_ms),
    }
}

/// The stored claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRecord {
    pub schema: String,
    pub kind: String,
    pub owner: Owner,
    pub epoch: u64,
    pub state: ClaimState,
    /// Digest of the manifest spec this claim runs.
    pub digest: String,
    /// The owner node's API (`http://host:port`), for logs and events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The session's own address (`host:port`, from its spec's `port` and
    /// its node's host), for whoever routes to it. Absent when the spec
    /// names no port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why the run ended where its exit code does not say (a session that
    /// could not start on its node: "user web does not exist on n2"). Kept
    /// in the claim so that `ls` and `describe` show it from the bucket
    /// alone. Absent from every claim that has none, so a claim without it
    /// reads the same to a build that does not know the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default)]
    pub restarts: u32,
    /// A scheduled session's tick this claim's run is for (`fleet::cron`):
    /// set where a tick releases the claim, carried by the run that claims
    /// it and by its end. So a claim that ran tick T is never released for
    /// T again, whatever became of T's record; and a scheduled session's
    /// released claim is placed only if it carries one (a tombstone or a
    /// vanished marker does not). Absent on every other claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_ms: Option<u64>,
    /// While a crash-loop back-off holds the next start: until when, by the
    /// owner's wall clock (for readers, who show `backoff`; never a
    /// safety decision). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_until_ms: Option<u64>,
    /// A checked run's health while it is not simply running: `starting`
    /// (its check has not passed yet) or `unhealthy` (being stopped after
    /// failing it). Absent otherwise, and on every unchecked session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<super::check::Health>,
    /// Owner's wall clock; for humans.
    pub updated_at_ms: u64,
    pub nonce: String,
}

impl ClaimRecord {
    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self> {
        let corrupt = |r: String| Error::corrupt(key, r);
        let r: ClaimRecord = crate::record::decode_as(key, bytes, "session", 64 * 1024, "claim")?;
        if r.epoch == 0 && r.state != ClaimState::Released {
            return Err(corrupt(
                "epoch must be at least 1 (0 only for the queued placeholder)".into(),
            ));
        }
        if r.epoch > crate::record::MAX_EPOCH {
            return Err(corrupt(format!(
                "epoch {} above {}",
                r.epoch,
                crate::record::MAX_EPOCH
            )));
        }
        crate::Name::new(r.owner.node.clone()).map_err(|e| corrupt(format!("owner.node: {e}")))?;
        // As a node record's holder and address: what `ls`, `describe` and
        // `resolve` print must not carry a terminal's control sequences.
        if !crate::record::id_like(&r.owner.instance) {
            return Err(corrupt(
                "owner.instance must be 1-64 of [A-Za-z0-9-]".into(),
            ));
        }
        if let Some(a) = &r.reason
            && !crate::record::printable(a, 1024)
        {
            return Err(corrupt("reason must be 1-1024 printable characters".into()));
        }
        if let Some(a) = &r.address
            && !crate::record::printable(a, 1024)
        {
            return Err(corrupt(
                "address must be 1-1024 printable characters".into(),
            ));
        }
        if let Some(a) = &r.endpoint
            && !crate::record::printable(a, 1024)
        {
            return Err(corrupt(
                "endpoint must be 1-1024 printable characters".into(),
            ));
        }
        Ok(r)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("claim serialises")
    }

    /// The claim `apply` writes (create-if-absent) before a new manifest:
    /// released at epoch 0, owned by nobody (`queued`). So a session has a
    /// claim object from admission on, and a missing claim is always an
    /// absence to observe (deleted), never mistaken for a new session; the
    /// first node takes it over at epoch 1 like any released claim.
    pub fn placeholder(nonce: String, wall_ms: u64) -> ClaimRecord {
        ClaimRecord {
            schema: crate::record::SCHEMA.into(),
            kind: "session".into(),
            owner: Owner {
                node: QUEUED.into(),
                instance: QUEUED.into(),
            },
            epoch: 0,
            state: ClaimState::Released,
            digest: String::new(),
            address: None,
            endpoint: None,
            exit_code: None,
            reason: None,
            backoff_until_ms: None,
            health: None,
            restarts: 0,
            updated_at_ms: wall_ms,
            tick_ms: None,
            nonce,
        }
    }

    /// Is this the placeholder no node has claimed yet?
    pub fn is_placeholder(&self) -> bool {
        self.epoch == 0 && self.owner.instance == QUEUED && self.owner.node == QUEUED
    }

    /// The claim a node writes (create-if-absent) where a claim has
    /// vanished: released, owned by nobody, at the highest epoch the writer
    /// saw for it. Its version is the absence's witness: a vanished claim is
    /// made again only after this version has been observed unchanged for
    /// the hold period, never on the strength of listings that showed
    /// nothing (a claim deleted, made again and deleted again between two
    /// listings reads to a node as one long absence; a version cannot be
    /// made again). See docs/protocol.md, "Absence".
    pub fn vanished(epoch: u64, nonce: String, wall_ms: u64) -> ClaimRecord {
        ClaimRecord {
            owner: Owner {
                node: VANISHED.into(),
                instance: QUEUED.into(),
            },
            epoch,
            tick_ms: None,
            ..ClaimRecord::placeholder(nonce, wall_ms)
        }
    }

    /// Is this a vanished claim's marker (see [`ClaimRecord::vanished`])?
    pub fn is_vanished(&self) -> bool {
        self.owner.instance == QUEUED && self.owner.node == VANISHED
    }
}

/// A reason as a claim may hold it: control characters dropped, at most
/// 1,000 bytes (cut at a character boundary, marked with `...`), never
/// empty. See [`ClaimRecord::decode`].
pub fn clean_reason(s: &str) -> String {
    let mut out: String = s.chars().filter(|c| !c.is_control()).collect();
    if out.len() > 1000 {
        let mut cut = 997;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    if out.trim().is_empty() {
        out = "(no reason given)".into();
    }
    out
}

/// The owner of a placeholder claim. No node instance is ever named so
/// (instances are random hex), so it is never taken for a live owner.
pub const QUEUED: &str = "queued";

/// The owner node named by a vanished claim's marker (its instance is
/// [`QUEUED`], which no node instance is).
pub const VANISHED: &str = "vanished";

/// Wakes a sleeping claim: `claim` (read at `version`, asleep) written
/// `released` by one conditional write on that version, its epoch kept, so
/// a node claims it above that epoch. Every waker goes through here (a wake
/// request, an alarm firing). Returns the version and record written, or
/// `None` if something changed the claim first (another wake: N concurrent
/// wakes write once).
pub(crate) async fn release_sleeping(
    store: &Arc<dyn Store>,
    name: &str,
    claim: ClaimRecord,
    version: Version,
    wall_ms: u64,
    nonce: String,
) -> Result<Option<(Version, ClaimRecord)>> {
    debug_assert_eq!(claim.state, ClaimState::Sleeping);
    let mut next = claim;
    next.state = ClaimState::Released;
    next.reason = None;
    next.updated_at_ms = wall_ms;
    next.nonce = nonce;
    write_over(store, name, next, version).await
}

/// Releases `claim` of `name` from rest (the admission placeholder, a
/// finished run, asleep, a tombstone applied again) for a tick of its
/// schedule (`fleet::cron`): one If-Match write on the version read, its
/// epoch kept, so a node claims it at the next. Named for `by` (never the placeholder's nobody, which
/// placement would take for the placeholder again), with `why` as its
/// reason. `None` if the claim changed since it was read.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn release_at_rest(
    store: &Arc<dyn Store>,
    name: &str,
    claim: ClaimRecord,
    version: Version,
    by: &Owner,
    tick_ms: u64,
    why: String,
    wall_ms: u64,
    nonce: String,
) -> Result<Option<(Version, ClaimRecord)>> {
    // At rest (`cron::ClaimAt::of`): a tombstone applied again included.
    debug_assert!(
        claim.is_placeholder()
            || claim.state.is_terminal()
            || claim.state == ClaimState::Sleeping
            || (claim.state == ClaimState::Released
                && claim.tick_ms.is_none()
                && !claim.is_vanished())
    );
    let mut next = claim;
    next.state = ClaimState::Released;
    next.owner = by.clone();
    next.tick_ms = Some(tick_ms);
    next.address = None;
    next.endpoint = None;
    next.health = None;
    next.backoff_until_ms = None;
    next.reason = Some(clean_reason(&why));
    next.updated_at_ms = wall_ms;
    next.nonce = nonce;
    write_over(store, name, next, version).await
}

/// Writes `next` over claim `name` If-Match `version` (read back by its
/// nonce when the reply is lost): the version and record written, or
/// `None` if the claim changed since it was read. The one write of both
/// releases above.
async fn write_over(
    store: &Arc<dyn Store>,
    name: &str,
    next: ClaimRecord,
    version: Version,
) -> Result<Option<(Version, ClaimRecord)>> {
    let key = crate::keys::session(name);
    match super::put_checked(
        store,
        &key,
        bytes::Bytes::from(next.encode()),
        crate::store::Cond::Match(version),
        &next.nonce,
        super::json_nonce,
    )
    .await?
    {
        super::Put::Committed(v) => Ok(Some((v, next))),
        super::Put::Rejected(_) => Ok(None),
    }
}

/// Reads and decodes `sessions/<name>` (one GET): the claim and its version.
pub async fn get(store: &Arc<dyn Store>, name: &str) -> Result<Option<(ClaimRecord, Version)>> {
    let key = crate::keys::session(name);
    match store
        .get(&key)
        .await
        .map_err(|e| Error::from_store("get", &key, e))?
    {
        None => Ok(None),
        Some(o) => Ok(Some((ClaimRecord::decode(&key, &o.bytes)?, o.version))),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::ClaimState::*;
    use super::{ClaimRecord, ClaimState, Owner};

    /// A valid running claim for unit tests elsewhere in the crate.
    pub(crate) fn sample_claim() -> ClaimRecord {
        claim_in(Running)
    }

    fn claim_in(state: ClaimState) -> ClaimRecord {
        ClaimRecord {
            schema: crate::record::SCHEMA.into(),
            kind: "session".into(),
            owner: Owner {
                node: "n".into(),
                instance: "i".into(),
            },
            epoch: 1,
            state,
            digest: "d".into(),
            address: None,
            endpoint: None,
            exit_code: None,
            reason: None,
            backoff_until_ms: None,
            health: None,
            restarts: 0,
            updated_at_ms: 0,
            tick_ms: None,
            nonce: "x".into(),
        }
    }

    #[test]
    fn derived_status() {
        use super::{Status, status};
        let c = claim_in;
        assert_eq!(status(None, false, 0), Status::Queued);
        assert_eq!(status(Some(&c(Released)), true, 0), Status::Queued);
        assert_eq!(status(Some(&c(Running)), true, 0), Status::Running);
        assert_eq!(status(Some(&c(Running)), false, 0), Status::Interrupted);
        assert_eq!(status(Some(&c(Paused)), false, 0), Status::Paused);
        assert_eq!(status(Some(&c(Succeeded)), false, 0), Status::Succeeded);
        assert_eq!(status(Some(&c(Failed)), true, 0), Status::Failed);
        use crate::fleet::check::Health;
        let mut r = c(Running);
        r.health = Some(Health::Starting);
        assert_eq!(status(Some(&r), true, 0), Status::Starting);
        assert_eq!(
            status(Some(&r), false, 0),
            Status::Interrupted,
            "a dead owner first"
        );
        r.health = Some(Health::Unhealthy);
        assert_eq!(status(Some(&r), true, 0), Status::Unhealthy);
        r.backoff_until_ms = Some(100);
        assert_eq!(status(Some(&r), true, 99), Status::Backoff);
        r.health = None;
        assert_eq!(
            status(Some(&r), true, 100),
            Status::Running,
            "the back-off is over"
        );
        // The word each prints is the one serde writes.
        for s in [
            Status::Queued,
            Status::Running,
            Status::Paused,
            Status::Interrupted,
            Status::Backoff,
            Status::Starting,
            Status::Unhealthy,
            Status::Succeeded,
            Status::Failed,
            Status::Sleeping,
            Status::Scheduled,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
    }

    /// Fields `ls`, `describe` and `resolve` print are checked as a node
    /// record's are: a forged instance or address with a terminal's
    /// control sequences (or a line break that forges a table row) is
    /// corruption, not text to print.
    #[test]
    fn printed_fields_refuse_control_characters() {
        let key = "sessions/web";
        let good = sample_claim();
        ClaimRecord::decode(key, &good.encode()).unwrap();
        let mut bad = Vec::new();
        let mut c = good.clone();
        c.owner.instance = "g1\u{1b}[31m".into();
        bad.push((c, "owner.instance"));
        let mut c = good.clone();
        c.address = Some("http://h:1\r\nfake row".into());
        bad.push((c, "address"));
        let mut c = good.clone();
        c.endpoint = Some("h:1\u{1b}[2J".into());
        bad.push((c, "endpoint"));
        let mut c = good.clone();
        c.reason = Some("could not start\u{1b}]0;owned\u{7}".into());
        bad.push((c, "reason"));
        for (c, why) in bad {
            let e = ClaimRecord::decode(key, &c.encode()).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn reasons_are_kept_to_what_a_claim_may_hold() {
        let key = "sessions/web";
        for raw in [
            "sh\tx".to_string(),
            "é".repeat(900),
            format!("unhealthy: {}", "u".repeat(5000)),
            "\u{1b}[2J".into(),
            String::new(),
        ] {
            let mut c = sample_claim();
            c.reason = Some(super::clean_reason(&raw));
            ClaimRecord::decode(key, &c.encode()).unwrap_or_else(|e| panic!("{raw:?}: {e}"));
        }
        assert_eq!(super::clean_reason("a\nb"), "ab");
    }

    #[test]
    fn transitions() {
        assert!(Running.can_become(Paused));
        assert!(Running.can_become(Succeeded));
        assert!(Paused.can_become(Running));
        assert!(!Paused.can_become(Succeeded));
        assert!(
            !Released.can_become(Running),
            "released claims are taken over, not revived"
        );
        assert!(Succeeded.can_become(Running));
        assert!(Running.can_become(Sleeping));
        assert!(Sleeping.can_become(Released), "a wake request");
        assert!(
            !Sleeping.can_become(Running),
            "woken through released, at a higher epoch"
        );
        assert!(!Sleeping.is_terminal());
        assert!(Succeeded.is_terminal() && Failed.is_terminal() && !Running.is_terminal());
    }
}
