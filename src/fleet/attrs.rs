//! The attributes a node publishes in its node record (`nodes/<id>`,
//! `LeaseRecord::attrs`): one definition for the writer (the node's
//! registration and every renewal) and every reader (placement, the absence
//! rules, `ls nodes`, `describe`, `explain`).
//!
//! Reading is lenient field by field, as it was when each reader picked
//! fields out of the JSON map itself: a record that decodes as a lease
//! record (strictly, see `record.rs`) but carries an attribute of the wrong
//! type, or none, reads that attribute as its default (capacity 0, no
//! labels, not cordoned), which places nothing on it. A record written by a
//! newer node with attributes this build does not know keeps them in the
//! map; they are not read here.

use crate::record::LeaseRecord;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The attribute a peer sets when it fences a node lease (its node id):
/// the tenure ended by takeover, not by its holder (`Liveness::Fenced`).
pub const RELEASED_BY: &str = "released_by";
/// See [`NodeAttrs::unproven`].
pub const UNPROVEN: &str = "unproven";
/// See [`NodeAttrs::proto`].
pub const PROTO: &str = "proto";
/// The protocol level this build's nodes publish ([`NodeAttrs::proto`]).
pub const PROTO_LEVEL: u32 = PROTO_BUCKETED_HINTS;
/// The level from which a node reads every node record before it makes a
/// vanished claim again (`Node::read_holds`), and so waits out a holder's
/// full-listing interval however it grew (`node run
/// --full-every-objects`). A node grows its interval only while no live
/// peer publishes less: the upgrade order docs/fleet.md asks for, kept by
/// the nodes instead of the operator.
pub const PROTO_READS_HOLDS: u32 = 1;
/// The level from which a node reads change hints in both key forms
/// (`keys::HintForm`): writers spell hints bucketed only while no live
/// node publishes less (`feed::HintForms`), since an older reader lists
/// the feed from a flat cursor and ignores bucketed keys.
pub const PROTO_BUCKETED_HINTS: u32 = 2;

/// A node's published attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAttrs {
    /// Sessions it will run at once.
    pub capacity: u32,
    /// Sessions it ran at its last renewal (lags by up to one renewal).
    pub load: u32,
    /// Its longest pause between the listings that confirm its claims (the
    /// longer of its `max_poll` and its anti-entropy `full_every`): a peer
    /// waiting out one of its vanished claims waits its hold
    /// (`core::claim_hold`).
    pub max_poll_ms: u64,
    /// Cordoned by the operator: takes nothing new.
    pub cordoned: bool,
    pub labels: BTreeMap<String, String>,
    /// Set by the peer that fenced this record.
    pub released_by: Option<String>,
    /// This record was created where none was (or taken over from one so
    /// marked), and its holder's wait has not ended: nothing proves that an
    /// earlier instance of this node id, whose record was deleted, has
    /// stopped. Readers must not take this record as that instance's end
    /// (`plan::owner_live`, `liveness::judge`).
    pub unproven: bool,
    /// The protocol level of the build that wrote it ([`PROTO_LEVEL`]);
    /// 0, absent, for builds before levels were published. A peer reads it
    /// to keep to what the oldest live node understands
    /// ([`PROTO_READS_HOLDS`]).
    pub proto: u32,
}

impl NodeAttrs {
    /// The attributes of `record` (lenient per field; see the module docs).
    pub fn of(record: &LeaseRecord) -> NodeAttrs {
        let a = &record.attrs;
        let num = |k: &str| a.get(k).and_then(Value::as_u64).unwrap_or(0);
        NodeAttrs {
            capacity: u32::try_from(num("capacity")).unwrap_or(u32::MAX),
            load: u32::try_from(num("load")).unwrap_or(u32::MAX),
            max_poll_ms: num("max_poll_ms"),
            cordoned: a.get("cordoned").and_then(Value::as_bool) == Some(true),
            labels: a
                .get("labels")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
                .unwrap_or_default(),
            released_by: a
                .get(RELEASED_BY)
                .and_then(Value::as_str)
                .map(str::to_string),
            unproven: a.get(UNPROVEN).and_then(Value::as_bool) == Some(true),
            proto: u32::try_from(num(PROTO)).unwrap_or(u32::MAX),
        }
    }

    /// The map written in the record. `cordoned` and `released_by` only
    /// when set, as before.
    pub fn to_map(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("capacity".into(), self.capacity.into());
        if self.cordoned {
            m.insert("cordoned".into(), true.into());
        }
        m.insert("max_poll_ms".into(), self.max_poll_ms.into());
        m.insert("load".into(), self.load.into());
        m.insert(
            "labels".into(),
            Value::Object(
                self.labels
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect(),
            ),
        );
        if let Some(by) = &self.released_by {
            m.insert(RELEASED_BY.into(), by.clone().into());
        }
        if self.unproven {
            m.insert(UNPROVEN.into(), true.into());
        }
        if self.proto > 0 {
            m.insert(PROTO.into(), self.proto.into());
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(attrs: Value) -> LeaseRecord {
        let mut r = LeaseRecord::vanished(1, 1000, "n".into(), 0);
        r.attrs = attrs.as_object().unwrap().clone();
        r
    }

    #[test]
    fn attributes_round_trip_and_read_leniently() {
        let a = NodeAttrs {
            capacity: 8,
            load: 3,
            max_poll_ms: 10_000,
            cordoned: true,
            labels: [("zone".to_string(), "a".to_string())].into(),
            released_by: Some("n2".into()),
            unproven: true,
            proto: PROTO_LEVEL,
        };
        let mut r = record(serde_json::json!({}));
        r.attrs = a.to_map();
        assert_eq!(NodeAttrs::of(&r), a);
        // The bytes as nodes wrote them before this type existed.
        let r = record(serde_json::json!({
            "capacity": 4, "max_poll_ms": 100, "load": 1, "labels": {"zone": "b"}
        }));
        let a = NodeAttrs::of(&r);
        assert_eq!((a.capacity, a.load, a.max_poll_ms), (4, 1, 100));
        assert!(!a.cordoned && a.released_by.is_none());
        assert_eq!(a.proto, 0, "an older build's record");
        assert_eq!(r.attrs, a.to_map(), "written as before");
        // Wrong types, out of range, or missing: the default, field by field.
        let r = record(serde_json::json!({
            "capacity": "eight", "load": u64::MAX, "cordoned": "yes",
            "labels": ["zone"], "released_by": 7, "extra": {"from": "a newer node"}
        }));
        let a = NodeAttrs::of(&r);
        assert_eq!(
            a,
            NodeAttrs {
                load: u32::MAX,
                ..NodeAttrs::default()
            }
        );
    }
}
