//! Why a session is in the state it is in: the reason `ls` and `describe`
//! print beside every status but a plain "running".
//!
//! Pure: the caller reads the manifest, the claim and the node records (one
//! listing each, as `ls` does) and passes the wall clock; nothing here does
//! I/O or reads a clock. The reasons are advisory in the same way as the
//! one-shot liveness judgement they build on ([`crate::liveness`], by wall
//! clock within the skew bound): they explain, and never decide anything.

use super::claim::{ClaimRecord, ClaimState, Status};
use super::manifest::ManifestRecord;
use crate::liveness::{Evidence, Liveness, judge};
use crate::record::LeaseRecord;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// What `ls` knows of a node.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub record: LeaseRecord,
    pub liveness: Liveness,
    pub capacity: u32,
    pub load: u32,
    pub labels: BTreeMap<String, String>,
    pub cordoned: bool,
}

impl NodeFacts {
    /// From a node record, judged by wall clock (see [`crate::liveness`]).
    pub fn from_record(record: LeaseRecord, now_ms: u64, max_skew: Duration) -> NodeFacts {
        let liveness = judge(
            Some(&record),
            None,
            Evidence::WallClock { now_ms, max_skew },
        );
        let a = super::attrs::NodeAttrs::of(&record);
        NodeFacts {
            capacity: a.capacity,
            load: a.load,
            labels: a.labels,
            cordoned: a.cordoned,
            liveness,
            record,
        }
    }
}

/// A session's status and the reason for it ("" for a healthy running
/// session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explained {
    pub status: Status,
    pub reason: String,
}

/// " (next at ...)" for a schedule's next tick after `now_ms`, or "".
fn next_tick(s: &super::cron::Schedule, now_ms: u64) -> String {
    s.compile()
        .ok()
        .and_then(|c| c.next_after(now_ms))
        .map(|t| format!(" (next at {})", super::cron::show(t)))
        .unwrap_or_default()
}

/// Explains one session. `nodes` is every node record listed, keyed by node
/// id, and `unreadable` the ids whose record is there but corrupt: an owner
/// among them is not absent (nobody takes its sessions over while its
/// record cannot be read), and the reason says so. None for a session with
/// neither manifest nor claim (nothing to say).
pub fn explain(
    manifest: Option<&ManifestRecord>,
    claim: Option<&ClaimRecord>,
    nodes: &BTreeMap<String, NodeFacts>,
    unreadable: &BTreeSet<String>,
    now_ms: u64,
    max_skew: Duration,
) -> Option<Explained> {
    let owned = claim.filter(|c| c.state != ClaimState::Released && !c.is_placeholder());
    let Some(m) = manifest else {
        // No manifest: the session was deleted. Its claim is a tombstone
        // (gc removes it), or its owner is stopping it.
        let c = owned?;
        if unreadable.contains(&c.owner.node) {
            return Some(Explained {
                status: Status::Interrupted,
                reason: format!("manifest deleted; {}", unreadable_owner(c)),
            });
        }
        let (owner, live) = owner_of(c, nodes, now_ms, max_skew);
        return Some(Explained {
            status: if live {
                Status::Running
            } else {
                Status::Interrupted
            },
            reason: if live {
                format!("manifest deleted; {} is stopping it", c.owner.node)
            } else {
                format!(
                    "manifest deleted and its owner {} is {}; `leasehold gc` removes the claim",
                    c.owner.node,
                    owner.describe()
                )
            },
        });
    };
    let Some(c) = owned else {
        if m.spec.paused {
            return Some(Explained {
                status: Status::Paused,
                reason: "paused by its manifest".into(),
            });
        }
        if claim.is_some_and(ClaimRecord::is_vanished) {
            return Some(Explained {
                status: Status::Queued,
                reason: "its claim vanished from the bucket; a node makes it again once it has \
                         watched the marker left in its place for the hold period"
                    .into(),
            });
        }
        if let Some(s) = &m.spec.schedule
            && claim.is_none_or(ClaimRecord::is_placeholder)
        {
            return Some(Explained {
                status: Status::Scheduled,
                reason: format!("waits for its first tick{}", next_tick(s, now_ms)),
            });
        }
        return Some(Explained {
            status: Status::Queued,
            reason: queued_reason(m, nodes),
        });
    };
    let (owner, live) = owner_of(c, nodes, now_ms, max_skew);
    // A scheduled session at rest says when it runs next.
    let rest = |e: Explained| match &m.spec.schedule {
        Some(s) if !m.spec.paused => Explained {
            reason: format!(
                "{}; waits for its next tick{}",
                e.reason,
                next_tick(s, now_ms)
            ),
            ..e
        },
        _ => e,
    };
    let restarts = if c.restarts > 0 {
        format!(
            "{} restart{}{}",
            c.restarts,
            if c.restarts == 1 { "" } else { "s" },
            c.exit_code
                .map(|e| format!(", last exit {e}"))
                .unwrap_or_default()
                // Why the last run ended, where its code does not say (a
                // memory limit, a failed health check).
                + &c.reason
                    .as_ref()
                    .filter(|_| c.state == ClaimState::Running)
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
        )
    } else {
        String::new()
    };
    let e = match c.state {
        ClaimState::Succeeded => rest(Explained {
            status: Status::Succeeded,
            reason: format!("exit {}", c.exit_code.unwrap_or(0)),
        }),
        ClaimState::Failed if c.reason.is_some() => rest(Explained {
            status: Status::Failed,
            reason: c.reason.clone().unwrap_or_default(),
        }),
        ClaimState::Failed => rest(Explained {
            status: Status::Failed,
            reason: join(
                &format!("exit {}", c.exit_code.map_or("?".into(), |e| e.to_string())),
                &if c.restarts > 0 {
                    format!("after {} restarts", c.restarts)
                } else {
                    String::new()
                },
            ),
        }),
        ClaimState::Paused => Explained {
            status: Status::Paused,
            reason: "paused by its manifest".into(),
        },
        ClaimState::Sleeping => Explained {
            status: Status::Sleeping,
            reason: join(
                &format!(
                    "asleep for {}",
                    humantime::format_duration(Duration::from_secs(
                        now_ms.saturating_sub(c.updated_at_ms) / 1000
                    ))
                ),
                &c.reason
                    .as_ref()
                    .map(|r| format!("({r}); a wake runs it at epoch {}", c.epoch + 1))
                    .unwrap_or_else(|| format!("; a wake runs it at epoch {}", c.epoch + 1)),
            ),
        },
        ClaimState::Running if live && c.backoff_until_ms.is_some_and(|t| t > now_ms) => {
            Explained {
                status: Status::Backoff,
                reason: join(
                    &format!(
                        "restarting in {:.1}s",
                        c.backoff_until_ms.unwrap_or(now_ms).saturating_sub(now_ms) as f64 / 1000.0
                    ),
                    &format!("({restarts})"),
                ),
            }
        }
        ClaimState::Running if live && c.health == Some(crate::fleet::check::Health::Starting) => {
            Explained {
                status: Status::Starting,
                reason: join(
                    "its health check has not passed yet",
                    &if restarts.is_empty() {
                        String::new()
                    } else {
                        format!("({restarts})")
                    },
                ),
            }
        }
        ClaimState::Running if live && c.health == Some(crate::fleet::check::Health::Unhealthy) => {
            Explained {
                status: Status::Unhealthy,
                reason: c
                    .reason
                    .clone()
                    .unwrap_or_else(|| "its health check failed".into()),
            }
        }
        ClaimState::Running if live => Explained {
            status: Status::Running,
            reason: join(&restarts, &overdue(c, nodes, now_ms)),
        },
        ClaimState::Running | ClaimState::Released if unreadable.contains(&c.owner.node) => {
            Explained {
                status: Status::Interrupted,
                reason: unreadable_owner(c),
            }
        }
        ClaimState::Running | ClaimState::Released => Explained {
            status: Status::Interrupted,
            reason: interrupted_reason(c, m, owner, nodes, now_ms),
        },
    };
    Some(e)
}

fn join(a: &str, b: &str) -> String {
    match (a.is_empty(), b.is_empty()) {
        (true, _) => b.to_string(),
        (_, true) => a.to_string(),
        _ => format!("{a} {b}"),
    }
}

/// The owner's liveness (by wall clock) and whether it still runs `c`.
fn owner_of(
    c: &ClaimRecord,
    nodes: &BTreeMap<String, NodeFacts>,
    now_ms: u64,
    max_skew: Duration,
) -> (Liveness, bool) {
    let l = judge(
        nodes.get(&c.owner.node).map(|n| &n.record),
        Some(&c.owner.instance),
        Evidence::WallClock { now_ms, max_skew },
    );
    (l, l == Liveness::Live)
}

/// The owner's record is there and corrupt: its own renewals fail (their
/// If-Match no longer holds), and peers leave its sessions alone.
fn unreadable_owner(c: &ClaimRecord) -> String {
    let who = &c.owner.node;
    format!(
        "owner {who}'s node record is unreadable; nobody takes its sessions over until it is \
         repaired or deleted (`leasehold inspect nodes/{who}`)"
    )
}

fn interrupted_reason(
    c: &ClaimRecord,
    m: &ManifestRecord,
    owner: Liveness,
    nodes: &BTreeMap<String, NodeFacts>,
    now_ms: u64,
) -> String {
    let who = &c.owner.node;
    // "A peer is taking it over" only when one can: else what a queued
    // session would be told, asked of the nodes other than the owner.
    let blocked = || {
        let why = queued_reason_except(m, nodes, Some(who));
        (why != WAITING).then(|| format!("no other node can take it over: {why}"))
    };
    let taker = || blocked().unwrap_or_else(|| "a peer is taking it over".to_string());
    // For the waits below: said only when nobody could take it after them.
    let then = || blocked().map(|b| format!("; {b}")).unwrap_or_default();
    match owner {
        Liveness::Expired => {
            // Peers take over once they have *observed* the lease unchanged
            // for ttl + margin (from when they first saw that version); the
            // wall clocks only say how stale it looks from here.
            let r = &nodes[who].record;
            format!(
                "waiting for a peer to observe {who}'s lease expired (not renewed for {} s by wall clock; ttl {} s){}",
                now_ms.saturating_sub(r.renewed_at_ms) / 1000,
                r.ttl_ms / 1000,
                then()
            )
        }
        Liveness::Fenced => format!("owner {who} was fenced; {}", taker()),
        Liveness::Released => format!("owner {who} shut down; {}", taker()),
        Liveness::Superseded => format!("owner {who} restarted; its new instance reclaims it"),
        Liveness::Absent => {
            format!(
                "owner {who} has no node record; taken over once that is observed{}",
                then()
            )
        }
        Liveness::Live => String::new(),
    }
}

/// A live-looking owner that is late with its renewal: dead, partitioned or
/// skewed; the wall clocks cannot tell which, so this only says what is seen.
fn overdue(c: &ClaimRecord, nodes: &BTreeMap<String, NodeFacts>, now_ms: u64) -> String {
    let Some(n) = nodes.get(&c.owner.node) else {
        return String::new();
    };
    let age = now_ms.saturating_sub(n.record.renewed_at_ms);
    if age <= n.record.ttl_ms {
        return String::new();
    }
    let ttl = Duration::from_millis(n.record.ttl_ms);
    format!(
        "(owner {} not renewed for {} s by wall clock, ttl {} s: if it is dead, peers take over {} s after they last saw its lease change)",
        c.owner.node,
        age / 1000,
        ttl.as_secs(),
        (ttl + crate::lease::default_margin(ttl)).as_secs_f64()
    )
}

/// What `queued_reason` says when some node can claim the session.
const WAITING: &str = "waiting for a node to claim it (next pass)";

fn queued_reason(m: &ManifestRecord, nodes: &BTreeMap<String, NodeFacts>) -> String {
    queued_reason_except(m, nodes, None)
}

/// As `queued_reason`, leaving node `except` out (the owner of an
/// interrupted session, which is not taking it back).
fn queued_reason_except(
    m: &ManifestRecord,
    nodes: &BTreeMap<String, NodeFacts>,
    except: Option<&str>,
) -> String {
    let live: Vec<&NodeFacts> = nodes
        .values()
        .filter(|n| n.liveness == Liveness::Live)
        .filter(|n| Some(n.record.holder.node.as_str()) != except)
        .collect();
    if live.is_empty() {
        return "no live node".into();
    }
    let matching: Vec<&&NodeFacts> = live
        .iter()
        .filter(|n| crate::fleet::plan::selects(&m.spec.selector, &n.labels))
        .collect();
    if matching.is_empty() {
        return format!("no node matches {}", m.spec.selector_text());
    }
    let open: Vec<&&&NodeFacts> = matching.iter().filter(|n| !n.cordoned).collect();
    if open.is_empty() {
        return format!(
            "every matching node is cordoned ({})",
            matching
                .iter()
                .map(|n| n.record.holder.node.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if open.iter().all(|n| n.load >= n.capacity) {
        return format!(
            "all {} matching node{} full",
            open.len(),
            if open.len() == 1 { " is" } else { "s are" }
        );
    }
    WAITING.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::claim::Owner;
    use crate::fleet::manifest::Spec;
    use crate::record::{Holder, Kind};

    fn node(id: &str, renewed_at_ms: u64, cap: u32, load: u32, zone: &str) -> (String, NodeFacts) {
        let mut attrs = serde_json::Map::new();
        attrs.insert("capacity".into(), cap.into());
        attrs.insert("load".into(), load.into());
        attrs.insert("labels".into(), serde_json::json!({ "zone": zone }));
        let record = LeaseRecord {
            schema: crate::record::SCHEMA.into(),
            kind: Kind::Node,
            holder: Holder {
                node: id.into(),
                host: "h".into(),
                instance: format!("{id}-i"),
            },
            epoch: 1,
            ttl_ms: 10_000,
            renewed_at_ms,
            released: false,
            host_locked: false,
            lock_id: None,
            address: None,
            attrs,
            nonce: "n".into(),
        };
        (
            id.to_string(),
            NodeFacts::from_record(record, NOW, Duration::from_secs(5)),
        )
    }

    const NOW: u64 = 1_000_000;

    fn manifest(selector: &[(&str, &str)], paused: bool) -> ManifestRecord {
        let mut spec = Spec::new("sleep", &["1"]);
        spec.paused = paused;
        spec.selector = selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ManifestRecord {
            schema: "leasehold/v1".into(),
            kind: "manifest".into(),
            name: "web".into(),
            digest: spec.digest(),
            spec,
            labels: Default::default(),
            nonce: "n".into(),
        }
    }

    fn claim(owner: &str, state: ClaimState, restarts: u32, exit: Option<i32>) -> ClaimRecord {
        ClaimRecord {
            schema: "leasehold/v1".into(),
            kind: "claim".into(),
            owner: Owner {
                node: owner.into(),
                instance: format!("{owner}-i"),
            },
            epoch: 3,
            state,
            digest: "d".into(),
            address: None,
            exit_code: exit,
            reason: None,
            backoff_until_ms: None,
            health: None,
            endpoint: None,
            restarts,
            updated_at_ms: NOW,
            tick_ms: None,
            nonce: "n".into(),
        }
    }

    fn says(e: Option<Explained>, status: Status, reason: &str) {
        let e = e.expect("explained");
        assert_eq!(e.status, status, "{e:?}");
        assert!(e.reason.contains(reason), "{e:?} should say {reason:?}");
    }

    #[test]
    fn every_status_but_running_says_why() {
        let skew = Duration::from_secs(5);
        let fleet: BTreeMap<String, NodeFacts> = [
            node("n1", NOW - 1_000, 2, 2, "a"),  // live, full
            node("n2", NOW - 20_000, 4, 0, "b"), // expired by wall clock
        ]
        .into_iter()
        .collect();
        let m = manifest(&[], false);
        let x = |m: Option<&ManifestRecord>, c: Option<&ClaimRecord>, n: &BTreeMap<_, _>| {
            explain(m, c, n, &BTreeSet::new(), NOW, skew)
        };
        says(
            x(Some(&m), None, &BTreeMap::new()),
            Status::Queued,
            "no live node",
        );
        says(
            x(
                Some(&m),
                Some(&ClaimRecord::vanished(3, "n".into(), NOW)),
                &fleet,
            ),
            Status::Queued,
            "its claim vanished from the bucket",
        );
        says(
            x(Some(&manifest(&[("zone", "z")], false)), None, &fleet),
            Status::Queued,
            "no node matches zone=z",
        );
        says(
            x(Some(&m), None, &fleet),
            Status::Queued,
            "all 1 matching node is full",
        );
        let roomy: BTreeMap<_, _> = [node("n3", NOW, 2, 1, "a")].into_iter().collect();
        says(
            x(Some(&m), None, &roomy),
            Status::Queued,
            "waiting for a node",
        );
        says(
            x(Some(&manifest(&[], true)), None, &fleet),
            Status::Paused,
            "paused",
        );
        let run = claim("n1", ClaimState::Running, 0, None);
        assert_eq!(x(Some(&m), Some(&run), &fleet).unwrap().reason, "");
        let looping = claim("n1", ClaimState::Running, 5, Some(1));
        says(
            x(Some(&m), Some(&looping), &fleet),
            Status::Running,
            "5 restarts, last exit 1",
        );
        let on_dead = claim("n2", ClaimState::Running, 0, None);
        // Renewed 20 s ago, ttl 10 s + skew 5 s: expired by wall clock.
        says(
            x(Some(&m), Some(&on_dead), &fleet),
            Status::Interrupted,
            "waiting for a peer to observe n2's lease expired (not renewed for 20 s",
        );
        // 12 s: live within the skew bound, but late, and said so.
        let late: BTreeMap<_, _> = [node("n2", NOW - 12_000, 4, 0, "b")].into_iter().collect();
        says(
            x(Some(&m), Some(&on_dead), &late),
            Status::Running,
            "not renewed for 12 s",
        );
        let fresh: BTreeMap<_, _> = [node("n2", NOW - 3_000, 4, 0, "b")].into_iter().collect();
        assert_eq!(x(Some(&m), Some(&on_dead), &fresh).unwrap().reason, "");
        let gone = claim("n9", ClaimState::Running, 0, None);
        says(
            x(Some(&m), Some(&gone), &fleet),
            Status::Interrupted,
            "no node record",
        );
        // A record there but corrupt is not absent: nobody takes over.
        let corrupt: BTreeSet<String> = ["n9".to_string()].into();
        for manifest in [Some(&m), None] {
            let e = explain(manifest, Some(&gone), &fleet, &corrupt, NOW, skew);
            says(
                e.clone(),
                Status::Interrupted,
                "n9's node record is unreadable",
            );
            assert!(!e.unwrap().reason.contains("taken over once"));
        }
        says(
            x(
                Some(&m),
                Some(&claim("n1", ClaimState::Succeeded, 0, Some(0))),
                &fleet,
            ),
            Status::Succeeded,
            "exit 0",
        );
        says(
            x(
                Some(&m),
                Some(&claim("n1", ClaimState::Failed, 2, Some(3))),
                &fleet,
            ),
            Status::Failed,
            "exit 3 after 2 restarts",
        );
        // A reason the owner recorded is the reason.
        let gave_up = ClaimRecord {
            reason: Some("gave up after 2 restarts (last exit 3)".into()),
            ..claim("n1", ClaimState::Failed, 2, Some(3))
        };
        says(
            x(Some(&m), Some(&gave_up), &fleet),
            Status::Failed,
            "gave up after 2 restarts (last exit 3)",
        );
        // A back-off not yet over is `backoff` (no process runs); one that
        // ended is `running` again, whatever the field still says.
        let waiting = ClaimRecord {
            backoff_until_ms: Some(NOW + 2_500),
            ..claim("n1", ClaimState::Running, 3, Some(7))
        };
        says(
            x(Some(&m), Some(&waiting), &fleet),
            Status::Backoff,
            "restarting in 2.5s (3 restarts, last exit 7)",
        );
        let over = ClaimRecord {
            backoff_until_ms: Some(NOW - 1),
            ..waiting.clone()
        };
        says(
            x(Some(&m), Some(&over), &fleet),
            Status::Running,
            "3 restarts",
        );
        // A checked run: `starting` until its check passes, `unhealthy`
        // with the check's words while it is stopped; a dead owner's is
        // interrupted, whatever its health. Each is the word `Status::of`
        // gives (what `resolve` prints).
        use crate::fleet::check::Health;
        let starting = ClaimRecord {
            health: Some(Health::Starting),
            reason: Some("unhealthy: check failed 3 times in a row (tcp 1: refused)".into()),
            ..claim("n1", ClaimState::Running, 1, Some(137))
        };
        says(
            x(Some(&m), Some(&starting), &fleet),
            Status::Starting,
            "its health check has not passed yet (1 restart, last exit 137: unhealthy: check failed",
        );
        let sick = ClaimRecord {
            health: Some(Health::Unhealthy),
            reason: Some("unhealthy: check failed 3 times in a row (tcp 1: refused)".into()),
            ..claim("n1", ClaimState::Running, 0, None)
        };
        says(
            x(Some(&m), Some(&sick), &fleet),
            Status::Unhealthy,
            "unhealthy: check failed 3 times",
        );
        let sick_dead = ClaimRecord {
            health: Some(Health::Unhealthy),
            ..claim("n2", ClaimState::Running, 0, None)
        };
        says(
            x(Some(&m), Some(&sick_dead), &fleet),
            Status::Interrupted,
            "n2",
        );
        for (c, live) in [
            (&starting, true),
            (&sick, true),
            (&sick_dead, false),
            (&waiting, true),
            (&over, true),
        ] {
            assert_eq!(
                x(Some(&m), Some(c), &fleet).unwrap().status,
                Status::of(c.state, c.health, c.backoff_until_ms, live, NOW),
                "{c:?}"
            );
        }
        // Deleted: a tombstone says nothing; a live owner is stopping it; a
        // dead owner's leftover is gc's.
        assert!(
            x(
                None,
                Some(&claim("n1", ClaimState::Released, 0, None)),
                &fleet
            )
            .is_none()
        );
        says(
            x(None, Some(&run), &fleet),
            Status::Running,
            "manifest deleted; n1 is stopping it",
        );
        says(x(None, Some(&on_dead), &fleet), Status::Interrupted, "gc");
        // Cordoned nodes take nothing new.
        let mut cordoned = roomy.clone();
        cordoned.get_mut("n3").unwrap().cordoned = true;
        says(
            x(Some(&m), None, &cordoned),
            Status::Queued,
            "cordoned (n3)",
        );
    }

    /// "A peer is taking it over" only when one can (issue #44: a session
    /// whose selector matched only its fenced owner said so).
    #[test]
    fn an_interrupted_session_says_a_peer_takes_it_only_when_one_can() {
        let skew = Duration::from_secs(5);
        let (id, owner) = node("n1", NOW - 1_000, 2, 1, "a");
        let mut record = owner.record.clone();
        record.released = true;
        let fleet: BTreeMap<String, NodeFacts> = [
            (id, NodeFacts::from_record(record, NOW, skew)),
            node("n2", NOW - 1_000, 4, 0, "b"),
        ]
        .into_iter()
        .collect();
        let c = claim("n1", ClaimState::Running, 0, None);
        let x =
            |m: &ManifestRecord| explain(Some(m), Some(&c), &fleet, &BTreeSet::new(), NOW, skew);
        says(
            x(&manifest(&[("zone", "b")], false)),
            Status::Interrupted,
            "owner n1 shut down; a peer is taking it over",
        );
        says(
            x(&manifest(&[("zone", "a")], false)),
            Status::Interrupted,
            "owner n1 shut down; no other node can take it over: no node matches zone=a",
        );
    }
}
