//! Inventory commands: `resolve`, `ls`, `nodes`, `inspect`.
//!
//! These are one-shot readers. They cannot judge expiry by observation (that
//! needs watching a record for a TTL), so liveness here is what one read can
//! prove: a claim's owner is live while its node lease names the claim's
//! instance and is not released. The age columns use wall clocks and are
//! labelled advisory.

mod describe;
mod resolve;
mod table;

use table::Table;

pub use describe::{describe, inspect};
pub use resolve::resolve;

use super::{Failure, LsWhat, StoreArgs, open, print_json};
use futures::StreamExt;
use leasehold::Name;
use leasehold::clock::{Clock, SystemClock};
use leasehold::error::Error;
use leasehold::fleet::attrs::NodeAttrs;
use leasehold::fleet::claim::ClaimRecord;
use leasehold::fleet::explain::{NodeFacts, explain};
use leasehold::fleet::manifest::ManifestRecord;
use leasehold::record::{Kind, LeaseRecord};
use leasehold::store::{Entry, Store};
use leasehold::wake::{Owned, OwnerLease, Resolver, WakeOutcome};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Parallel reads for listings.
const READS: usize = 32;

/// Lists `prefix` and reads every object, `READS` at a time. Listings are
/// paged by the store (1,000 keys a page), so 100,000 keys work.
/// A corrupt object becomes a row of its own (`Err(reason)`); anything else
/// that fails aborts the listing.
pub(crate) type Read = Result<Option<bytes::Bytes>, String>;

/// `s` for a terminal: its control characters escaped (`\n`, `\u{1b}`).
/// A manifest's command and arguments may hold any of them (a script with
/// newlines is legitimate), and printed raw they would forge table rows or
/// drive the reader's terminal. JSON output carries them as they are.
fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return s.into();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// Every node record, judged by wall clock, keyed by node id; and the ids
/// whose record is there but unreadable (corrupt or foreign). Those are
/// not absent: no node takes their sessions over (corruption is never read
/// as absence), so `ls` and `describe` must not say one will.
async fn node_facts(
    store: &Arc<dyn Store>,
    now: u64,
    max_skew: Duration,
) -> Result<(BTreeMap<String, NodeFacts>, BTreeSet<String>), Error> {
    let mut facts = BTreeMap::new();
    let mut unreadable = BTreeSet::new();
    for (e, b) in read_all(store, leasehold::keys::NODES).await? {
        // Keyed by the key, as the nodes read it (`decode_node`): a record
        // under `nodes/ghost` that names `n1` says nothing of n1 (it would
        // have shadowed n1's own record here), and is unreadable as ghost's.
        let id = leasehold::keys::tail(leasehold::keys::NODES, &e.key).to_string();
        match b.map(|b| b.map(|b| decode_node(&e.key, &b))) {
            Ok(None) => {} // gone since the listing
            Ok(Some(Ok(r))) => {
                facts.insert(id, NodeFacts::from_record(r, now, max_skew));
            }
            Ok(Some(Err(_))) | Err(_) => {
                unreadable.insert(id);
            }
        }
    }
    Ok((facts, unreadable))
}

/// A node record as `nodes/<id>`'s: one naming another node than its key's
/// is not that node's (nodes read records by key), so it is corrupt here.
fn decode_node(key: &str, bytes: &[u8]) -> Result<LeaseRecord, Error> {
    let r = LeaseRecord::decode(key, bytes, Kind::Node)?;
    let id = leasehold::keys::tail(leasehold::keys::NODES, key);
    if r.holder.node != id {
        return Err(Error::corrupt(
            key,
            format!("it names node {:?}, not {id:?}", r.holder.node),
        ));
    }
    Ok(r)
}

pub(crate) async fn read_all(
    store: &Arc<dyn Store>,
    prefix: &str,
) -> Result<Vec<(Entry, Read)>, Error> {
    let mut entries = Vec::new();
    let mut list = store.list(prefix);
    while let Some(e) = list.next().await {
        entries.push(e.map_err(|e| Error::from_store("list", prefix, e))?);
    }
    let out: Vec<_> = futures::stream::iter(entries)
        .map(|e| {
            let store = store.clone();
            async move {
                let got = store.get(&e.key).await;
                (e, got)
            }
        })
        .buffered(READS)
        .collect()
        .await;
    out.into_iter()
        .map(|(e, got)| match got {
            Ok(o) => Ok((e, Ok(o.map(|o| o.bytes)))),
            Err(leasehold::store::StoreError::Corrupt { reason }) => Ok((e, Err(reason))),
            Err(err) => {
                let key = e.key.clone();
                Err(Error::from_store("get", &key, err))
            }
        })
        .collect()
}

/// Decodes one listed object for a row: None when it vanished since the
/// listing, `Some(Err(reason))` when it is corrupt (the row says so).
fn decode_row<T>(
    key: &str,
    read: &Read,
    decode: impl Fn(&str, &[u8]) -> Result<T, Error>,
) -> Option<Result<T, String>> {
    match read {
        Ok(Some(b)) => Some(decode(key, b).map_err(|e| e.to_string())),
        Ok(None) => None,
        Err(reason) => Some(Err(reason.clone())),
    }
}

/// A wall-clock age in milliseconds, for humans.
fn ago(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else if ms < 600_000 {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

/// `k=v,k2=v2` from a JSON object of strings (labels, a selector).
fn kv_list(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One-shot readers judge by wall clock, and say so.
fn lease_text(l: OwnerLease) -> &'static str {
    match l {
        OwnerLease::Expired => "expired by wall clock",
        other => other.describe(),
    }
}

pub async fn ls(
    what: LsWhat,
    store: &StoreArgs,
    prefix: &str,
    view: &super::ListView,
    max_skew: Duration,
) -> Result<(), Failure> {
    let json = view.json();
    let wide = view.wide();
    if !prefix.is_empty()
        && (prefix.starts_with('.')
            || !prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(Error::invalid(
            "--prefix",
            "names are [A-Za-z0-9._-], not starting with '.'",
        )
        .into());
    }
    let store = open(store).await?;
    // An empty answer from a store that is no fleet is most often the wrong
    // --store (a typo'd path that exists, another bucket): say so, as the
    // answer alone would look like an idle fleet.
    // (A marker that cannot be read is the nodes' concern, not the listing's.)
    if let Ok(None) = leasehold::fleet::marker::read(&store).await {
        eprintln!(
            "warning: {store} holds no fleet marker: not a fleet (`leasehold init` makes one), or the wrong --store"
        );
    }
    let now = SystemClock::new().wall_ms();
    match what {
        LsWhat::Nodes => {
            let mut rows = Vec::new();
            for (e, bytes) in read_all(&store, &leasehold::keys::node(prefix)).await? {
                let Some(decoded) = decode_row(&e.key, &bytes, decode_node) else {
                    continue;
                };
                rows.push(match decoded {
                    Ok(r) => NodeLine::Node(NodeRow::of(r, now, max_skew)),
                    Err(corrupt) => NodeLine::Corrupt {
                        node: leasehold::keys::tail(leasehold::keys::NODES, &e.key).to_string(),
                        corrupt,
                    },
                });
            }
            // -l: a corrupt row has no labels to match, so a selector hides it.
            rows.retain(|r| match r {
                NodeLine::Node(n) => view.matches(&n.labels),
                NodeLine::Corrupt { .. } => view.selector.is_empty(),
            });
            if json {
                view.print(&serde_json::to_value(&rows).expect("rows serialise"));
            } else {
                let mut header = vec![
                    "NODE", "INSTANCE", "EPOCH", "LOAD", "STATE", "ADDRESS", "RENEWED",
                ];
                if wide {
                    header.extend(["HOST", "LISTS", "PROTO", "LABELS"]);
                }
                let mut table = Table::new(&header);
                for r in rows {
                    let r = match r {
                        NodeLine::Node(r) => r,
                        NodeLine::Corrupt { node, corrupt } => {
                            table.spanning(&node, format!("CORRUPT: {corrupt}"));
                            continue;
                        }
                    };
                    let mut cells = vec![
                        r.node.clone(),
                        r.instance.clone(),
                        r.epoch.to_string(),
                        // A released record's load is its last renewal's:
                        // it runs nothing now (issue #44 showed 6/16).
                        if r.released {
                            format!("-/{}", r.capacity)
                        } else {
                            format!("{}/{}", r.load, r.capacity)
                        },
                        format!(
                            "{}{}",
                            r.state.as_str(),
                            if r.cordoned { ",cordoned" } else { "" }
                        ),
                        r.address.clone().unwrap_or_else(|| "-".into()),
                        format!("{} ago", ago(r.renewed_ms_ago_wall)),
                    ];
                    if wide {
                        cells.extend([
                            r.host.clone(),
                            ago(r.max_poll_ms),
                            r.proto.to_string(),
                            kv_list(&r.labels),
                        ]);
                    }
                    table.row(cells);
                }
                table.print();
            }
        }
        LsWhat::Manifests => {
            let mut rows = Vec::new();
            for (e, bytes) in read_all(&store, &leasehold::keys::manifest(prefix)).await? {
                let Some(decoded) = decode_row(&e.key, &bytes, ManifestRecord::decode) else {
                    continue;
                };
                rows.push(match decoded {
                    Ok(m) => ManifestLine::Manifest(ManifestRow {
                        name: m.name,
                        digest: m.digest,
                        command: m.spec.command,
                        args: m.spec.args,
                        restart: m.spec.restart,
                        paused: m.spec.paused,
                        selector: m.spec.selector,
                        labels: m.labels,
                    }),
                    Err(corrupt) => ManifestLine::Corrupt {
                        name: leasehold::keys::tail(leasehold::keys::MANIFESTS, &e.key).to_string(),
                        corrupt,
                    },
                });
            }
            rows.retain(|r| match r {
                ManifestLine::Manifest(m) => view.matches(&m.labels),
                ManifestLine::Corrupt { .. } => view.selector.is_empty(),
            });
            if json {
                view.print(&serde_json::to_value(&rows).expect("rows serialise"));
            } else {
                let mut header = vec!["NAME", "DIGEST", "RESTART", "PAUSED"];
                if wide {
                    header.extend(["LABELS", "SELECTOR"]);
                }
                header.push("COMMAND");
                let mut table = Table::new(&header);
                for r in rows {
                    let r = match r {
                        ManifestLine::Manifest(r) => r,
                        ManifestLine::Corrupt { name, corrupt } => {
                            table.spanning(&name, format!("CORRUPT: {corrupt}"));
                            continue;
                        }
                    };
                    let mut cells = vec![
                        r.name.clone(),
                        r.digest.get(..12).unwrap_or(&r.digest).to_string(),
                        r.restart.policy.as_str().to_string(),
                        r.paused.to_string(),
                    ];
                    if wide {
                        for kv in [&r.labels, &r.selector] {
                            let s = kv_list(kv);
                            cells.push(if s.is_empty() { "-".into() } else { s });
                        }
                    }
                    cells.push(format!(
                        "{} {}",
                        shown(&r.command),
                        shown(&r.args.join(" "))
                    ));
                    table.row(cells);
                }
                table.print();
            }
        }
        LsWhat::Sessions => {
            // Sessions are the union of manifests and claims; their status
            // and its reason need the node records (`fleet::explain`).
            let manifests = read_all(&store, &leasehold::keys::manifest(prefix)).await?;
            let claims = read_all(&store, &leasehold::keys::session(prefix)).await?;
            let (facts, unreadable) = node_facts(&store, now, max_skew).await?;
            let mut rows: BTreeMap<String, SessionLine> = BTreeMap::new();
            let mut decoded_manifests: BTreeMap<String, ManifestRecord> = BTreeMap::new();
            let mut decoded_claims: BTreeMap<String, ClaimRecord> = BTreeMap::new();
            for (e, b) in &manifests {
                let name = leasehold::keys::tail(leasehold::keys::MANIFESTS, &e.key).to_string();
                match decode_row(&e.key, b, ManifestRecord::decode) {
                    None => {}
                    Some(Ok(m)) => {
                        decoded_manifests.insert(name, m);
                    }
                    Some(Err(corrupt)) => {
                        rows.insert(
                            name.clone(),
                            SessionLine::Corrupt {
                                name,
                                manifest: Some(true),
                                corrupt,
                            },
                        );
                    }
                }
            }
            for (e, b) in &claims {
                let name = leasehold::keys::tail(leasehold::keys::SESSIONS, &e.key).to_string();
                match decode_row(&e.key, b, ClaimRecord::decode) {
                    None => {}
                    Some(Ok(c)) => {
                        decoded_claims.insert(name, c);
                    }
                    Some(Err(corrupt)) => {
                        rows.insert(
                            name.clone(),
                            SessionLine::Corrupt {
                                name,
                                manifest: None,
                                corrupt,
                            },
                        );
                    }
                }
            }
            let names: std::collections::BTreeSet<&String> = decoded_manifests
                .keys()
                .chain(decoded_claims.keys())
                .collect();
            for name in names {
                if rows.contains_key(name) {
                    continue; // a corrupt manifest or claim: its own row
                }
                let m = decoded_manifests.get(name);
                let c = decoded_claims.get(name);
                if !view.selector.is_empty() && !m.is_some_and(|m| view.matches(&m.labels)) {
                    continue;
                }
                let Some(x) = explain(m, c, &facts, &unreadable, now, max_skew) else {
                    continue; // a tombstone of a deleted session: gc's
                };
                let claim = c.filter(|c| !c.is_placeholder()).map(|c| ClaimCols {
                    // Asleep, it names no node.
                    owner: if c.state == leasehold::fleet::claim::ClaimState::Sleeping {
                        "-".into()
                    } else {
                        c.owner.node.clone()
                    },
                    instance: c.owner.instance.clone(),
                    epoch: c.epoch,
                    let_go: matches!(
                        c.state,
                        leasehold::fleet::claim::ClaimState::Released
                            | leasehold::fleet::claim::ClaimState::Sleeping
                    ),
                    address: c.address.clone(),
                    restarts: c.restarts,
                    exit_code: c.exit_code,
                    updated_ms_ago_wall: now.saturating_sub(c.updated_at_ms),
                });
                rows.insert(
                    name.clone(),
                    SessionLine::Session(SessionRow {
                        name: name.clone(),
                        status: x.status,
                        reason: x.reason,
                        manifest: m.is_some(),
                        labels: m.map(|m| m.labels.clone()).unwrap_or_default(),
                        claim,
                    }),
                );
            }
            if json {
                let rows: Vec<&SessionLine> = rows.values().collect();
                view.print(&serde_json::to_value(&rows).expect("rows serialise"));
            } else {
                let mut header = vec!["NAME", "STATUS", "OWNER", "EPOCH", "AGE"];
                if wide {
                    header.extend(["INSTANCE", "RESTARTS", "EXIT", "ADDRESS", "LABELS"]);
                }
                header.push("REASON");
                let mut table = Table::new(&header);
                for r in rows.into_values() {
                    let r = match r {
                        SessionLine::Session(r) => r,
                        SessionLine::Corrupt { name, corrupt, .. } => {
                            table.spanning(&name, format!("CORRUPT: {corrupt}"));
                            continue;
                        }
                    };
                    let c = r.claim.as_ref();
                    let dash = || "-".to_string();
                    // Queued or asleep: nobody owns it, whatever node let it
                    // go (a drained one, say); its epoch is the one it left
                    // at, shown as such.
                    let owned = !c.is_some_and(|c| c.let_go);
                    let mut cells = vec![
                        r.name.clone(),
                        word(&r.status),
                        c.filter(|_| owned).map_or_else(dash, |c| c.owner.clone()),
                        c.map_or_else(dash, |c| {
                            if owned {
                                c.epoch.to_string()
                            } else {
                                format!("({})", c.epoch)
                            }
                        }),
                        c.map_or_else(dash, |c| ago(c.updated_ms_ago_wall)),
                    ];
                    if wide {
                        cells.extend([
                            c.map_or_else(dash, |c| c.instance.clone()),
                            c.map_or_else(dash, |c| c.restarts.to_string()),
                            c.and_then(|c| c.exit_code)
                                .map_or_else(dash, |x| x.to_string()),
                            c.and_then(|c| c.address.clone()).unwrap_or_else(dash),
                            Some(kv_list(&r.labels))
                                .filter(|s| !s.is_empty())
                                .unwrap_or_else(dash),
                        ]);
                    }
                    cells.push(r.reason.clone());
                    table.row(cells);
                }
                table.print();
            }
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ rows --
//
// One type per row of `ls`, serialised as the JSON output and printed as the
// table from the same fields. A record that cannot be read is a row of its
// own, named, with the reason.

/// A row of `ls nodes`.
#[derive(Debug, serde::Serialize)]
struct NodeRow {
    node: String,
    instance: String,
    host: String,
    epoch: u64,
    released: bool,
    address: Option<String>,
    capacity: u32,
    load: u32,
    labels: BTreeMap<String, String>,
    renewed_ms_ago_wall: u64,
    /// One vocabulary (leasehold::liveness): live, expired (by wall clock,
    /// within the skew bound), released, fenced (released by a peer that
    /// took over).
    state: leasehold::liveness::Liveness,
    released_by: Option<String>,
    cordoned: bool,
    /// Its longest pause between the listings that confirm its claims, as
    /// published: at least its full-listing interval, grown with the fleet
    /// (docs/fleet.md, "The interval grows with the fleet").
    max_poll_ms: u64,
    /// The protocol level its build publishes (0: older than levels); a
    /// node grows its interval only while no live peer shows less.
    proto: u32,
}

impl NodeRow {
    fn of(r: LeaseRecord, now: u64, max_skew: Duration) -> NodeRow {
        let a = NodeAttrs::of(&r);
        let state = leasehold::liveness::judge(
            Some(&r),
            None,
            leasehold::liveness::Evidence::WallClock {
                now_ms: now,
                max_skew,
            },
        );
        NodeRow {
            renewed_ms_ago_wall: now.saturating_sub(r.renewed_at_ms),
            node: r.holder.node,
            instance: r.holder.instance,
            host: r.holder.host,
            epoch: r.epoch,
            released: r.released,
            address: r.address,
            capacity: a.capacity,
            load: a.load,
            labels: a.labels,
            state,
            released_by: a.released_by,
            cordoned: a.cordoned,
            max_poll_ms: a.max_poll_ms,
            proto: a.proto,
        }
    }
}

#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
enum NodeLine {
    Node(NodeRow),
    Corrupt { node: String, corrupt: String },
}

/// A row of `ls manifests`.
#[derive(Debug, serde::Serialize)]
struct ManifestRow {
    name: String,
    digest: String,
    command: String,
    args: Vec<String>,
    restart: leasehold::fleet::manifest::Restart,
    paused: bool,
    selector: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
}

#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
enum ManifestLine {
    Manifest(ManifestRow),
    Corrupt { name: String, corrupt: String },
}

/// A row of `ls` (sessions).
#[derive(Debug, serde::Serialize)]
struct SessionRow {
    name: String,
    status: leasehold::fleet::claim::Status,
    reason: String,
    /// Has a manifest (a claim without one is being stopped).
    manifest: bool,
    /// Its manifest's labels.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: BTreeMap<String, String>,
    /// The claim's columns, once a node has claimed it.
    #[serde(flatten)]
    claim: Option<ClaimCols>,
}

#[derive(Debug, serde::Serialize)]
struct ClaimCols {
    owner: String,
    instance: String,
    epoch: u64,
    /// Released or asleep: the node named let it go (the table shows no
    /// owner); by the claim's state, whatever the status word says (a
    /// paused manifest's released claim reads `paused`).
    #[serde(skip)]
    let_go: bool,
    address: Option<String>,
    restarts: u32,
    exit_code: Option<i32>,
    updated_ms_ago_wall: u64,
}

#[derive(Debug, serde::Serialize)]
#[serde(untagged)]
enum SessionLine {
    Session(SessionRow),
    Corrupt {
        name: String,
        /// Set when it is the manifest that cannot be read.
        #[serde(skip_serializing_if = "Option::is_none")]
        manifest: Option<bool>,
        corrupt: String,
    },
}

/// The word a unit enum serialises as (its JSON string).
fn word(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}
