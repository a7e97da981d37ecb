//! The lease record: the JSON object at `leases/<name>` and `nodes/<id>`.
//!
//! Decoding is strict. An unknown schema version, a malformed or truncated
//! object, an unknown field, or a field that breaks an invariant is
//! [`Error::Corrupt`]: never treated as absent and never overwritten, because
//! a record we do not understand may be a lease someone else holds.

use crate::error::Error;
use crate::name::Name;
use serde::{Deserialize, Serialize};

/// The one schema this build reads and writes.
pub const SCHEMA: &str = "leasehold/v1";
/// Largest encoded record, in bytes. Attributes and addresses are small
/// metadata, not a data channel.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;
/// Longest TTL accepted in a record: one day.
pub const MAX_TTL_MS: u64 = 24 * 3600 * 1000;
/// Highest epoch (fencing token) a record may carry: 2^63 − 1.
///
/// Why a bound: epochs come from the bucket, and the bucket may hold
/// foreign bytes. Every writer makes its next token as one more than the
/// highest it saw, so a record at `u64::MAX` would have no successor (a
/// panic, or a token that wraps to 1 and is no longer higher). Records
/// above this bound are corrupt on decode, so `seen + 1` always fits, and
/// [`next_epoch`] refuses to make a token above it. 2^63 − 1 also reads
/// as itself in JSON parsers that hold integers as signed 64 bits. A
/// generation's epochs start at `(g − 1) · 2^40` with g ≤ 2^22, so no
/// honest fleet comes near it.
pub const MAX_EPOCH: u64 = i64::MAX as u64;

/// The latest wall-clock time an alarm or a tick may name: the end of the
/// year 9999 (every such time prints as RFC 3339).
pub const MAX_AT_MS: u64 = 253_402_300_799_999;

/// The token after `seen`, or `None` when none higher may exist
/// ([`MAX_EPOCH`]): the key is then stuck, and reported, never wrapped.
pub fn next_epoch(seen: u64) -> Option<u64> {
    seen.checked_add(1).filter(|e| *e <= MAX_EPOCH)
}

/// What a lease object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Kind {
    /// A standalone lease (`leases/<name>`): leader election, locks.
    Lease,
    /// A node lease (`nodes/<id>`).
    Node,
}

/// Who holds a lease: the node id, the machine, and the process instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    pub node: String,
    /// Identifies the machine. An immediate takeover from an earlier instance
    /// of the same node is allowed only on the same host, under its host lock.
    pub host: String,
    /// Fresh random id per process start.
    pub instance: String,
}

/// `node/instance on host`: how logs and messages name a holder.
impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} on {}", self.node, self.instance, self.host)
    }
}

/// The record stored in a lease object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRecord {
    pub schema: String,
    pub kind: Kind,
    pub holder: Holder,
    /// The fencing token: strictly increases across holders of this key.
    pub epoch: u64,
    pub ttl_ms: u64,
    /// Holder's wall clock at the write. For humans only; never for safety.
    pub renewed_at_ms: u64,
    pub released: bool,
    /// The writer held the host lock for (node, store) on `holder.host`. Only
    /// then does a later instance's host lock prove this one dead: a process
    /// that never took the lock (a one-shot CLI holder) proves nothing.
    #[serde(default)]
    pub host_locked: bool,
    /// Which host lock the writer held ([`crate::hostlock::HostLock::id`]):
    /// an immediate takeover of a predecessor needs this very lock, so two
    /// instances that locked different files (another lock directory, a
    /// recreated file) can never take each other over at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub attrs: serde_json::Map<String, serde_json::Value>,
    /// Fresh per write, so every write changes the bytes (and so the ETag on
    /// stores that use the body's MD5) and a read-back can tell whether an
    /// ambiguous write of ours landed.
    pub nonce: String,
}

/// The instance named by a placeholder record (a vanished lease's marker or a
/// declared lease; see [`LeaseRecord::vanished`]). No process is ever this
/// instance: instances are random hex, and [`crate::lease::LeaseClient`]
/// refuses to act as it. (The claims' placeholders use the same word.)
pub const PLACEHOLDER_INSTANCE: &str = "queued";
/// The host named by placeholder records.
pub const PLACEHOLDER_HOST: &str = "-";
/// The node named by a vanished lease's marker.
pub const VANISHED_NODE: &str = "vanished";
/// The node named by a declared lease's placeholder (`leasehold lease create`).
pub const DECLARED_NODE: &str = "declared";

pub(crate) fn printable(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.chars().any(|c| c.is_control())
}

pub(crate) fn id_like(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

impl LeaseRecord {
    fn placeholder(node: &str, epoch: u64, ttl_ms: u64, nonce: String, wall_ms: u64) -> Self {
        LeaseRecord {
            schema: SCHEMA.into(),
            kind: Kind::Lease,
            holder: Holder {
                node: node.into(),
                host: PLACEHOLDER_HOST.into(),
                instance: PLACEHOLDER_INSTANCE.into(),
            },
            epoch,
            ttl_ms,
            renewed_at_ms: wall_ms,
            released: true,
            host_locked: false,
            lock_id: None,
            address: None,
            attrs: Default::default(),
            nonce,
        }
    }

    /// The marker written where a standalone lease's record was found
    /// missing: released, at the highest epoch its writer knew, with the
    /// longest ttl it knew. A missing lease may have been deleted under a
    /// holder that still believes in it, so it is taken again only by an
    /// If-Match takeover of this marker after watching *this version*
    /// unchanged for its ttl + margin (see docs/protocol.md, "Standalone
    /// leases"): absence is an observation, never a death certificate.
    pub fn vanished(epoch: u64, ttl_ms: u64, nonce: String, wall_ms: u64) -> Self {
        Self::placeholder(VANISHED_NODE, epoch, ttl_ms, nonce, wall_ms)
    }

    /// The placeholder of a declared lease (`leasehold lease create`): a
    /// released record at the generation's base epoch (0 in generation 1),
    /// taken over at once by the first acquire, at the base + 1. Declaring
    /// asserts that the name is new: a missing record is otherwise treated
    /// as a deletion.
    pub fn declared(epoch: u64, nonce: String, wall_ms: u64) -> Self {
        Self::placeholder(DECLARED_NODE, epoch, 1, nonce, wall_ms)
    }

    /// Is this a placeholder (a vanished marker or a declared lease)?
    pub fn is_placeholder(&self) -> bool {
        self.holder.instance == PLACEHOLDER_INSTANCE
    }

    /// Is this a vanished lease's marker (see [`LeaseRecord::vanished`])?
    pub fn is_vanished(&self) -> bool {
        self.is_placeholder() && self.holder.node == VANISHED_NODE
    }

    /// Advisory, for one-shot readers (`ls`, `resolve`, `wake`) that cannot
    /// watch a record for a TTL: has the holder's last renew, stamped by the
    /// holder's wall clock, fallen more than `ttl + max_skew` behind
    /// `now_wall_ms` (the reader's wall clock)?
    ///
    /// Correct only while the two clocks differ by less than `max_skew`; the
    /// design allows wall clocks to one-shot commands only with such an
    /// explicit bound. Nothing that takes a claim or a lease over uses this:
    /// nodes judge expiry by observation.
    pub fn expired_by_wall_clock(&self, now_wall_ms: u64, max_skew: std::time::Duration) -> bool {
        !self.released
            && now_wall_ms
                > self
                    .renewed_at_ms
                    .saturating_add(self.ttl_ms)
                    .saturating_add(u64::try_from(max_skew.as_millis()).unwrap_or(u64::MAX))
    }

    /// Checks the invariants every record must satisfy.
    pub fn validate(&self) -> Result<(), String> {
        if self.schema != SCHEMA {
            return Err(format!(
                "unknown schema {:?} (this build reads {SCHEMA})",
                self.schema
            ));
        }
        if self.is_placeholder() {
            // Placeholders are released standalone leases, nothing else: a
            // held record naming no process would be taken for a live one.
            if !self.released || self.kind != Kind::Lease || self.holder.host != PLACEHOLDER_HOST {
                return Err(format!(
                    "instance {PLACEHOLDER_INSTANCE:?} names no process: only a released lease placeholder may carry it"
                ));
            }
            if self.holder.node != VANISHED_NODE && self.holder.node != DECLARED_NODE {
                return Err(format!(
                    "a placeholder's node is {VANISHED_NODE:?} or {DECLARED_NODE:?}"
                ));
            }
        } else if self.epoch == 0 {
            return Err("epoch must be at least 1".into());
        }
        if self.epoch > MAX_EPOCH {
            return Err(format!("epoch {} above {MAX_EPOCH}", self.epoch));
        }
        if self.ttl_ms == 0 || self.ttl_ms > MAX_TTL_MS {
            return Err(format!("ttl_ms {} outside 1..={MAX_TTL_MS}", self.ttl_ms));
        }
        if let Err(e) = Name::new(self.holder.node.clone()) {
            return Err(format!("holder.node: {e}"));
        }
        if !printable(&self.holder.host, 253) {
            return Err("holder.host must be 1-253 printable characters".into());
        }
        if !id_like(&self.holder.instance) {
            return Err("holder.instance must be 1-64 of [A-Za-z0-9-]".into());
        }
        if !id_like(&self.nonce) {
            return Err("nonce must be 1-64 of [A-Za-z0-9-]".into());
        }
        if let Some(l) = &self.lock_id
            && !id_like(l)
        {
            return Err("lock_id must be 1-64 of [A-Za-z0-9-]".into());
        }
        if let Some(a) = &self.address
            && !printable(a, 1024)
        {
            return Err("address must be 1-1024 printable characters".into());
        }
        Ok(())
    }

    /// Encodes, refusing records that break an invariant or the size bound.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        self.validate()
            .map_err(|reason| Error::invalid("lease record", reason))?;
        let bytes = serde_json::to_vec(self)
            .map_err(|e| Error::Internal(format!("encoding lease record: {e}")))?;
        if bytes.len() > MAX_RECORD_BYTES {
            return Err(Error::TooLarge {
                what: "lease record".into(),
                size: bytes.len(),
                limit: MAX_RECORD_BYTES,
            });
        }
        Ok(bytes)
    }

    /// Decodes the object at `key`, expecting `kind`.
    pub fn decode(key: &str, bytes: &[u8], kind: Kind) -> Result<Self, Error> {
        let corrupt = |reason: String| Error::corrupt(key, reason);
        let want = serde_json::to_value(kind).expect("kind serialises");
        let rec: LeaseRecord = decode_as(
            key,
            bytes,
            want.as_str().expect("kinds are strings"),
            MAX_RECORD_BYTES,
            "record",
        )?;
        rec.validate().map_err(corrupt)?;
        Ok(rec)
    }
}

/// Checks the envelope every leasehold object shares, before its own fields:
/// a bounded size, a JSON object, `"schema": "leasehold/v1"` and the expected
/// `kind`. An object from a newer version or another tool is reported as
/// such, rather than as a parse error, and always as `Corrupt`.
pub(crate) fn envelope(
    key: &str,
    bytes: &[u8],
    kind: &str,
    max: usize,
) -> Result<serde_json::Value, Error> {
    let corrupt = |reason: String| Error::corrupt(key, reason);
    if bytes.len() > max {
        return Err(corrupt(format!(
            "{} bytes, larger than any {kind} object ({max})",
            bytes.len()
        )));
    }
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("not valid JSON ({e})")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| corrupt("not a JSON object".into()))?;
    match obj.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(other) => {
            return Err(corrupt(format!(
                "unknown schema {other:?} (this build reads {SCHEMA})"
            )));
        }
        None => {
            return Err(corrupt(
                "no \"schema\" field: not a leasehold object".into(),
            ));
        }
    }
    match obj.get("kind") {
        Some(serde_json::Value::String(k)) if k == kind => Ok(value),
        Some(k) => Err(corrupt(format!("kind is {k}, expected \"{kind}\""))),
        None => Err(corrupt("no \"kind\" field".into())),
    }
}

/// Decodes a leasehold object of `kind` as `T` (`what` names it in errors):
/// the checks of [`envelope`], then `T`'s own.
///
/// Every node decodes every claim and manifest of the fleet as it changes
/// (100,000 each while a fleet of that size is placed), and building a
/// `serde_json::Value` tree first cost half of each decode. So the envelope's
/// two fields are read without a tree and `T` straight from the bytes. Any
/// doubt (a parse error, a field missing or different, a duplicate key) falls
/// back to the tree, whose errors say what is wrong and which accepts
/// exactly what it always accepted: the fast path only answers where both
/// agree.
pub(crate) fn decode_as<T: serde::de::DeserializeOwned>(
    key: &str,
    bytes: &[u8],
    kind: &str,
    max: usize,
    what: &str,
) -> Result<T, Error> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(borrow, default)]
        schema: Option<std::borrow::Cow<'a, str>>,
        #[serde(borrow, default)]
        kind: Option<std::borrow::Cow<'a, str>>,
    }
    if bytes.len() <= max
        && let Ok(h) = serde_json::from_slice::<Head>(bytes)
        && h.schema.as_deref() == Some(SCHEMA)
        && h.kind.as_deref() == Some(kind)
        && let Ok(t) = serde_json::from_slice::<T>(bytes)
    {
        return Ok(t);
    }
    let value = envelope(key, bytes, kind, max)?;
    serde_json::from_value(value).map_err(|e| Error::corrupt(key, format!("malformed {what}: {e}")))
}

/// A valid record for unit tests elsewhere in the crate.
#[cfg(test)]
pub(crate) fn sample(instance: &str, released: bool) -> LeaseRecord {
    LeaseRecord {
        schema: SCHEMA.into(),
        kind: Kind::Lease,
        holder: Holder {
            node: "n1".into(),
            host: "h1".into(),
            instance: instance.into(),
        },
        epoch: 1,
        ttl_ms: 1000,
        renewed_at_ms: 0,
        released,
        host_locked: false,
        lock_id: None,
        address: None,
        attrs: Default::default(),
        nonce: "n".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> LeaseRecord {
        sample("abc", false)
    }

    /// `decode_as` answers exactly as the tree it short-cuts: the same
    /// record, or the same error, on good, foreign and malformed bytes.
    #[test]
    fn decode_as_agrees_with_the_tree() {
        let slow = |b: &[u8]| -> Result<LeaseRecord, String> {
            let v = envelope("k", b, "lease", MAX_RECORD_BYTES).map_err(|e| e.to_string())?;
            serde_json::from_value(v)
                .map_err(|e| Error::corrupt("k", format!("malformed record: {e}")).to_string())
        };
        let fast = |b: &[u8]| -> Result<LeaseRecord, String> {
            decode_as("k", b, "lease", MAX_RECORD_BYTES, "record").map_err(|e| e.to_string())
        };
        let good = String::from_utf8(rec().encode().unwrap()).unwrap();
        let body = good.trim_start_matches('{');
        let cases = [
            good.clone(),
            // Escapes in the envelope's strings (not borrowable).
            good.replace("\"lease\"", "\"le\\u0061se\""),
            // A duplicate envelope field: the tree keeps the last one.
            format!("{{\"schema\":\"other\",{body}"),
            format!("{{\"kind\":\"lease\",{body}"),
            // A duplicate record field.
            format!("{{\"epoch\":7,{body}"),
            good.replace("leasehold/v1", "leasehold/v2"),
            good.replace("\"lease\"", "\"session\""),
            good.replace("\"epoch\":1", "\"epoch\":\"1\""),
            good.replace("\"epoch\":1,", ""),
            good.replace("\"epoch\":1", "\"epoch\":1,\"extra\":true"),
            "[1,2]".into(),
            "{\"kind\":\"lease\"}".into(),
            "not json".into(),
            String::new(),
        ];
        for c in &cases {
            assert_eq!(fast(c.as_bytes()), slow(c.as_bytes()), "{c}");
        }
        // Both paths are exercised: these decode (the fast path answers).
        assert!(fast(cases[0].as_bytes()).is_ok() && fast(cases[1].as_bytes()).is_ok());
        assert!(
            fast(cases[4].as_bytes()).is_ok(),
            "the tree keeps the last epoch"
        );
    }

    #[test]
    fn round_trip() {
        let r = rec();
        let b = r.encode().unwrap();
        assert_eq!(LeaseRecord::decode("k", &b, Kind::Lease).unwrap(), r);
    }

    #[test]
    fn corrupt_inputs_are_typed() {
        let good = rec().encode().unwrap();
        let mut cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..good.len() / 2].to_vec(), "not valid JSON"),
            (b"[]".to_vec(), "not a JSON object"),
            (b"{}".to_vec(), "no \"schema\""),
            (
                br#"{"schema":"leasehold/v2","kind":"lease"}"#.to_vec(),
                "unknown schema",
            ),
            (
                br#"{"schema":"leasehold/v1","kind":"node"}"#.to_vec(),
                "expected",
            ),
            (
                br#"{"schema":"leasehold/v1","kind":"lease"}"#.to_vec(),
                "malformed",
            ),
            (vec![b' '; MAX_RECORD_BYTES + 1], "larger"),
        ];
        let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
        v["epoch"] = 0.into();
        cases.push((serde_json::to_vec(&v).unwrap(), "epoch"));
        let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
        v["epoch"] = (MAX_EPOCH + 1).into();
        cases.push((serde_json::to_vec(&v).unwrap(), "above"));
        let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
        v["surprise"] = 1.into();
        cases.push((serde_json::to_vec(&v).unwrap(), "unknown field"));
        let mut v: serde_json::Value = serde_json::from_slice(&good).unwrap();
        v["holder"]["node"] = "../etc".into();
        cases.push((serde_json::to_vec(&v).unwrap(), "holder.node"));
        for (bytes, why) in cases {
            let e = LeaseRecord::decode("leases/x", &bytes, Kind::Lease).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Data, "{e}");
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
    }

    #[test]
    fn the_highest_epoch_has_no_successor_and_decodes() {
        assert_eq!(next_epoch(MAX_EPOCH - 1), Some(MAX_EPOCH));
        assert_eq!(next_epoch(MAX_EPOCH), None);
        assert_eq!(next_epoch(u64::MAX), None);
        let mut r = LeaseRecord::declared(MAX_EPOCH, "n".into(), 0);
        assert_eq!(r.validate(), Ok(()));
        r.epoch = MAX_EPOCH + 1;
        assert!(r.validate().is_err());
    }

    #[test]
    fn wall_clock_expiry_is_bounded_by_ttl_plus_skew() {
        use std::time::Duration;
        let mut r = rec();
        r.renewed_at_ms = 10_000; // ttl 1 s
        let skew = Duration::from_secs(5);
        assert!(!r.expired_by_wall_clock(16_000, skew), "exactly ttl + skew");
        assert!(r.expired_by_wall_clock(16_001, skew));
        assert!(!r.expired_by_wall_clock(0, skew), "renewed in our future");
        r.released = true;
        assert!(
            !r.expired_by_wall_clock(100_000, skew),
            "released, not expired"
        );
        r.released = false;
        r.renewed_at_ms = u64::MAX - 10;
        assert!(!r.expired_by_wall_clock(u64::MAX, skew), "no overflow");
    }

    #[test]
    fn encode_refuses_oversized_attrs() {
        let mut r = rec();
        r.attrs
            .insert("blob".into(), "x".repeat(MAX_RECORD_BYTES).into());
        assert!(matches!(r.encode(), Err(Error::TooLarge { .. })));
    }
}
