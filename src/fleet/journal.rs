//! The node's journal: what it did (claimed, started, exited, lost, released,
//! ...), with a contiguous sequence per instance, bounded by count and bytes.
//! Eviction is never silent: a reader whose cursor is older than retention is
//! told so (`Page::gap`). The HTTP surface over it is issue #4's.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::sync::Mutex;

macro_rules! event_kinds {
    ($($(#[$doc:meta])* $v:ident = $s:literal,)*) => {
        /// What happened: the vocabulary of the journal, its SSE stream,
        /// `watch` and the `leasehold_events_total` metric. On the wire, the
        /// kebab-case word. A reader keeps a word it does not know (from a
        /// newer node) as [`EventKind::Unknown`] rather than failing.
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[non_exhaustive]
        pub enum EventKind {
            $($(#[$doc])* $v,)*
            /// A kind this build does not know (read from a newer node).
            Unknown(String),
        }

        impl EventKind {
            /// Every kind this build records, in declaration order.
            pub const ALL: &[EventKind] = &[$(EventKind::$v,)*];

            /// The word on the wire and in tables.
            pub fn as_str(&self) -> &str {
                match self {
                    $(EventKind::$v => $s,)*
                    EventKind::Unknown(s) => s,
                }
            }

            /// The kind a word names (`Unknown` for any other word).
            pub fn parse(s: &str) -> EventKind {
                match s {
                    $($s => EventKind::$v,)*
                    other => EventKind::Unknown(other.to_string()),
                }
            }
        }
    };
}

event_kinds! {
    /// The node's lease was acquired (at start, or again after a loss).
    Registered = "registered",
    /// The node's lease was lost; it registers again.
    ReRegistering = "re-registering",
    /// The renew task lost the node lease.
    LeaseLost = "lease-lost",
    /// The bucket's fleet marker is gone or another: every session stopped.
    BucketWiped = "bucket-wiped",
    /// An audit found the store broke its conditional-write contract.
    StoreViolation = "store-violation",
    /// This node released a dead peer's node lease before taking over.
    Fenced = "fenced",
    /// A claim vanished from the bucket and its marker was written.
    Vanished = "vanished",
    /// This node claimed a session.
    Claimed = "claimed",
    /// This node lost a claim race.
    Conflict = "conflict",
    /// A session process started.
    Started = "started",
    /// A session's claim state was written: running, paused, succeeded,
    /// failed (also: a process that could not start), released.
    Running = "running",
    Paused = "paused",
    Succeeded = "succeeded",
    Failed = "failed",
    Released = "released",
    /// A session process exited.
    Exited = "exited",
    /// A crash-looping session waits before its restart.
    Backoff = "backoff",
    /// A session fell asleep (no process, no owner until a wake).
    Sleeping = "sleeping",
    /// An alarm woke a sleeping session: this node released its claim, at
    /// the epoch in the event, to be placed again (`fleet::alarm`).
    AlarmFired = "alarm-fired",
    /// This node decided a tick of a session's schedule (the detail says
    /// what: started, replaced, skipped and why, missed).
    Tick = "tick",
    /// A session's call on its node's channel was refused: its run ended,
    /// or the ack gate said no (the reason says which).
    Refused = "refused",
    /// A checked session's health check passed (it was `starting`).
    Healthy = "healthy",
    /// A checked session failed its health check `threshold` times in a
    /// row: it is stopped, and its restart policy applies.
    Unhealthy = "unhealthy",
    /// A session (or, with no session, every session) was stopped.
    Stopped = "stopped",
    /// A claim was lost to another writer or a deletion.
    Lost = "lost",
    /// The node's control object changed.
    Cordoned = "cordoned",
    Uncordoned = "uncordoned",
    Draining = "draining",
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(EventKind::parse(&s))
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    /// Wall clock, for humans.
    pub at_ms: u64,
    pub kind: EventKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl Event {
    fn size(&self) -> usize {
        64 + self.kind.as_str().len()
            + self.session.as_ref().map_or(0, |s| s.len())
            + self.detail.len()
    }
}

/// A page of events after a cursor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Page {
    /// Events from `gap.0` to `gap.1` (inclusive) were evicted before this
    /// reader saw them.
    pub gap: Option<(u64, u64)>,
    pub events: Vec<Event>,
    /// The latest sequence number written (0: none yet).
    pub latest: u64,
}

/// The cursor is beyond the latest event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cursor {cursor} is beyond the latest event {latest}")]
pub struct BeyondLatest {
    pub cursor: u64,
    pub latest: u64,
}

#[derive(Debug, Default)]
struct Inner {
    events: VecDeque<Event>,
    next: u64,
    bytes: usize,
    /// Events recorded so far by kind, never evicted (for metrics).
    totals: std::collections::BTreeMap<EventKind, u64>,
}

/// A bounded, sequenced journal.
#[derive(Debug)]
pub struct Journal {
    inner: Mutex<Inner>,
    max_events: usize,
    max_bytes: usize,
    /// Wakes followers (SSE streams) when an event is appended.
    appended: tokio::sync::Notify,
}

impl Journal {
    pub fn new(max_events: usize, max_bytes: usize) -> Self {
        Journal {
            inner: Mutex::new(Inner {
                next: 1,
                ..Default::default()
            }),
            max_events: max_events.max(1),
            max_bytes: max_bytes.max(1),
            appended: tokio::sync::Notify::new(),
        }
    }

    /// Appends an event; returns its sequence number.
    pub fn record(
        &self,
        at_ms: u64,
        kind: EventKind,
        session: Option<&str>,
        epoch: Option<u64>,
        detail: impl Into<String>,
    ) -> u64 {
        let mut i = self.inner.lock().unwrap();
        let e = Event {
            seq: i.next,
            at_ms,
            kind,
            session: session.map(str::to_string),
            epoch,
            detail: detail.into(),
        };
        i.next += 1;
        i.bytes += e.size();
        *i.totals.entry(e.kind.clone()).or_default() += 1;
        // Absent fields print as "-", not as Rust's `None` / `Some("web")`.
        let session = e.session.as_deref().unwrap_or("-");
        let epoch = e.epoch.map_or_else(|| "-".to_string(), |x| x.to_string());
        tracing::info!(seq = e.seq, kind = e.kind.as_str(), session, epoch = %epoch, detail = %e.detail, "event");
        i.events.push_back(e);
        while i.events.len() > self.max_events || (i.bytes > self.max_bytes && i.events.len() > 1) {
            let old = i.events.pop_front().expect("non-empty");
            i.bytes -= old.size();
        }
        let seq = i.next - 1;
        drop(i);
        self.appended.notify_waiters();
        seq
    }

    /// Completes when an event is appended after this call. Followers call it
    /// only after reading up to the latest, and re-check after waking.
    pub fn appended(&self) -> tokio::sync::futures::Notified<'_> {
        self.appended.notified()
    }

    /// How many events of each kind were ever recorded.
    pub fn totals(&self) -> std::collections::BTreeMap<EventKind, u64> {
        self.inner.lock().unwrap().totals.clone()
    }

    /// The latest sequence number (0: none yet).
    pub fn latest(&self) -> u64 {
        self.inner.lock().unwrap().next - 1
    }

    /// Events after `cursor` (0 = from the beginning), at most `limit`.
    pub fn after(&self, cursor: u64, limit: usize) -> Result<Page, BeyondLatest> {
        let i = self.inner.lock().unwrap();
        let latest = i.next - 1;
        if cursor > latest {
            return Err(BeyondLatest { cursor, latest });
        }
        let oldest = i.events.front().map_or(i.next, |e| e.seq);
        let gap = (cursor + 1 < oldest).then(|| (cursor + 1, oldest - 1));
        let events = i
            .events
            .iter()
            .filter(|e| e.seq > cursor)
            .take(limit)
            .cloned()
            .collect();
        Ok(Page {
            gap,
            events,
            latest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_with_explicit_gap_and_typed_beyond_latest() {
        let j = Journal::new(3, 1 << 20);
        for n in 0..5 {
            assert_eq!(
                j.record(0, EventKind::Claimed, Some("s"), Some(n), ""),
                n + 1
            );
        }
        let p = j.after(0, 10).unwrap();
        assert_eq!(p.gap, Some((1, 2)), "evicted 1..=2, said so");
        assert_eq!(
            p.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        let p = j.after(3, 1).unwrap();
        assert_eq!((p.gap, p.events[0].seq, p.latest), (None, 4, 5));
        assert!(j.after(5, 10).unwrap().events.is_empty());
        assert_eq!(
            j.after(6, 10).unwrap_err(),
            BeyondLatest {
                cursor: 6,
                latest: 5
            }
        );
        // Byte bound.
        let j = Journal::new(1000, 300);
        for _ in 0..10 {
            j.record(0, EventKind::Stopped, None, None, "y".repeat(100));
        }
        assert!(j.after(0, 100).unwrap().events.len() <= 2);
    }

    /// Every kind is one word on the wire, read back as itself; a word
    /// from a newer node is kept, not refused.
    #[test]
    fn event_kinds_round_trip_and_unknown_words_survive() {
        let mut words = std::collections::HashSet::new();
        for k in EventKind::ALL {
            assert!(words.insert(k.as_str()), "{k:?} repeats a word");
            assert_eq!(&EventKind::parse(k.as_str()), k);
            let json = serde_json::to_string(k).unwrap();
            assert_eq!(&serde_json::from_str::<EventKind>(&json).unwrap(), k);
        }
        assert_eq!(EventKind::ALL.len(), 28);
        let e: Event =
            serde_json::from_str(r#"{"seq":3,"at_ms":1,"kind":"teleported","detail":"x"}"#)
                .unwrap();
        assert_eq!(e.kind, EventKind::Unknown("teleported".into()));
        assert_eq!(e.kind.to_string(), "teleported");
        assert_eq!((e.session, e.epoch), (None, None));
        let j = Journal::new(10, 1 << 20);
        j.record(7, EventKind::ReRegistering, Some("web"), Some(2), "why");
        let page = serde_json::to_value(j.after(0, 10).unwrap()).unwrap();
        assert_eq!(page["events"][0]["kind"], "re-registering");
        let back: Event = serde_json::from_value(page["events"][0].clone()).unwrap();
        assert_eq!(back, j.after(0, 10).unwrap().events[0]);
    }
}
