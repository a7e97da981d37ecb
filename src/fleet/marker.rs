//! The fleet marker: the bucket's identity, and the generation of its
//! fencing tokens.
//!
//! `fleet` (under the store's prefix) is created once, by `leasehold init`
//! with create-if-absent, and holds a random fleet id and a generation.
//! Once it exists its absence is not a fresh bucket but a wiped or replaced
//! one:
//!
//! - a node refuses to serve without it (`leasehold init` makes it);
//! - a serving node checks it every pass (a conditional GET: 304 when
//!   nothing changed) and, when it vanishes or changes, stops every session
//!   and exits, reporting "bucket wiped or replaced"; it never writes a new
//!   one;
//! - every epoch (fencing token) made in generation `g` starts above
//!   `(g - 1) × 2^40` ([`epoch_base`]): after a wipe, `leasehold init
//!   --generation g+1` makes every new token higher than any of the last
//!   generation, so a downstream system that keeps the highest token it has
//!   seen refuses every holder from before the wipe (docs/protocol.md).

use crate::clock::Entropy;
use crate::error::{Error, Result};
use crate::record::SCHEMA;
use crate::store::{Cond, Conditional, Store, StoreError, Version};
use bytes::Bytes;
use std::sync::Arc;

/// The marker's key.
pub const KEY: &str = crate::keys::MARKER;
/// Largest generation accepted: epochs stay below 2^63 with room for 2^40
/// takeovers per key in each.
pub const MAX_GENERATION: u64 = 1 << 22;

/// The marker record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetMarker {
    pub schema: String,
    pub kind: String,
    pub fleet_id: String,
    pub generation: u64,
    /// For humans only.
    pub created_at_ms: u64,
    /// gc's epoch floor: every epoch gc ever deleted is at most this, and
    /// every record created where none is starts above it (`fleet::gc`).
    /// Kept in the marker so that losing it is losing the marker: a wipe,
    /// which stops every node, never a silent reset to 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch_floor: u64,
    pub nonce: String,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// The first epoch of generation `g` is `epoch_base(g) + 1`.
pub fn epoch_base(generation: u64) -> u64 {
    generation.saturating_sub(1) << 40
}

impl FleetMarker {
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let m: FleetMarker =
            serde_json::from_slice(bytes).map_err(|e| Error::corrupt(KEY, e.to_string()))?;
        if m.schema != SCHEMA || m.kind != "fleet" {
            return Err(Error::corrupt(
                KEY,
                format!(
                    "not a fleet marker of this version ({} {})",
                    m.schema, m.kind
                ),
            ));
        }
        if m.generation == 0 || m.generation > MAX_GENERATION || m.fleet_id.is_empty() {
            return Err(Error::corrupt(KEY, "generation or fleet id out of range"));
        }
        if m.epoch_floor > crate::record::MAX_EPOCH {
            return Err(Error::corrupt(
                KEY,
                format!("epoch_floor above {}", crate::record::MAX_EPOCH),
            ));
        }
        Ok(m)
    }

    /// What a node names in messages.
    pub fn describe(&self) -> String {
        format!("fleet {} generation {}", self.fleet_id, self.generation)
    }
}

/// Reads the marker: None when there is none.
pub async fn read(store: &Arc<dyn Store>) -> Result<Option<(FleetMarker, Version)>> {
    match store.get(KEY).await {
        Ok(Some(o)) => Ok(Some((FleetMarker::decode(&o.bytes)?, o.version))),
        Ok(None) => Ok(None),
        Err(e) => Err(Error::from_store("get", KEY, e)),
    }
}

/// The marker a node needs before it serves, or the error that says why
/// not: none there (`init` it; if it was there, the bucket was wiped).
pub async fn require(store: &Arc<dyn Store>) -> Result<(FleetMarker, Version)> {
    read(store).await?.ok_or_else(|| Error::NoFleet {
        store: store.to_string(),
    })
}

/// Has the marker a node started with changed? A conditional GET: not
/// modified is the usual answer. Err(Corrupt) when it vanished or names
/// another fleet or generation.
pub async fn check(store: &Arc<dyn Store>, known: &FleetMarker, version: &Version) -> Result<()> {
    let wiped = |what: String| {
        Error::corrupt(
            KEY,
            format!(
                "bucket wiped or replaced: {what} (this node served {})",
                known.describe()
            ),
        )
    };
    match store.get_if_changed(KEY, version).await {
        Ok(Conditional::NotModified) => Ok(()),
        Ok(Conditional::Missing) => Err(wiped("the fleet marker is gone".into())),
        Ok(Conditional::Changed(o)) => match FleetMarker::decode(&o.bytes) {
            Ok(m) if m.fleet_id == known.fleet_id && m.generation == known.generation => Ok(()),
            Ok(m) => Err(wiped(format!("the marker now names {}", m.describe()))),
            Err(e) => Err(wiped(format!("the marker is unreadable ({e})"))),
        },
        Err(e) => Err(Error::from_store("get", KEY, e)),
    }
}

/// `leasehold init`: creates the marker with `generation` if there is none
/// (returns it and true), or returns the one there (and false) if it has
/// that generation. Another generation there is a Conflict: generations are
/// chosen once per bucket life, never changed in place.
pub async fn init(
    store: &Arc<dyn Store>,
    entropy: &dyn Entropy,
    wall_ms: u64,
    generation: u64,
) -> Result<(FleetMarker, bool)> {
    if generation == 0 || generation > MAX_GENERATION {
        return Err(Error::invalid(
            "--generation",
            format!("must be 1..={MAX_GENERATION}"),
        ));
    }
    let m = FleetMarker {
        schema: SCHEMA.into(),
        kind: "fleet".into(),
        fleet_id: entropy.hex_id(),
        generation,
        created_at_ms: wall_ms,
        epoch_floor: 0,
        nonce: entropy.hex_id(),
    };
    let bytes = Bytes::from(serde_json::to_vec(&m).expect("marker serialises"));
    let created = match store.put(KEY, bytes, Cond::Create).await {
        Ok(_) => true,
        Err(StoreError::AlreadyExists | StoreError::Ambiguous { .. }) => false,
        Err(e) => return Err(Error::from_store("put", KEY, e)),
    };
    let (there, _) = read(store).await?.ok_or_else(|| Error::Unavailable {
        op: "put",
        key: KEY.into(),
        source: StoreError::Unavailable {
            message: "the marker did not land; try again".into(),
        },
    })?;
    if there.nonce != m.nonce && there.generation != generation {
        return Err(Error::Conflict {
            key: format!(
                "{KEY}: this bucket is already {}; a new generation is for a wiped bucket only",
                there.describe()
            ),
        });
    }
    // The fleet's bell (`feed::ring_bell`), once the marker is ours or the
    // same generation's, so that nodes read it with conditional GETs from
    // the start rather than plain GETs until the first ring. Best effort:
    // a ring creates it too; running `init` again creates it where missing.
    let _ = store
        .put(
            crate::keys::BELL,
            Bytes::from(entropy.hex_id()),
            Cond::Create,
        )
        .await;
    let _ = created;
    let ours = there.nonce == m.nonce;
    Ok((there, ours))
}
