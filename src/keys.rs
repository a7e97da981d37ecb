//! The key scheme: every object key leasehold reads or writes, defined once.
//!
//! The bucket is the addressing table, so a key is protocol: a node and a
//! one-shot reader that spelled `sessions/` differently would not see each
//! other's claims. Everything that builds or parses a key goes through
//! here. Names are validated ([`crate::Name`]) before they reach a key; the
//! helpers take anything that displays so that a listing prefix ("every
//! node whose id starts with `web`") is built the same way as a key.
//!
//! | prefix | object | written by |
//! |---|---|---|
//! | `fleet` | the fleet marker (bucket identity, generation, epoch floor) | `init`, `gc` |
//! | `nodes/<id>` | a node's lease (its registration) | the node; a peer fencing it |
//! | `manifests/<name>` | a session's desired state | `apply`, `delete` |
//! | `sessions/<name>` | a session's claim (owner, epoch, state) | the owning node; a peer taking over |
//! | `leases/<name>` | a standalone lease | `lease acquire/renew/release`, the library |
//! | `control/<id>` | an operator's cordon / drain of a node | `node cordon/drain/uncordon` |
//! | `changes/<ms/10,000>/<ms>-<nonce>-<m\|s\|n>-<name>` (or, while a node of an older build is live, `changes/<ms>-…`) | a hint that a manifest (`m`), a claim (`s`) or a node record's attributes (`n`) were written | every writer of those ([`crate::fleet::feed`]); deleted by retention |
//! | `alarms/<minute>/<session>/<nonce>` | an alarm: wake the session at a time, at most once ([`crate::fleet::alarm`]) | `wake --at`; the node that fires it (taken, then deleted) |
//! | `ticks/<session>/<tick ms>` | a cron tick's decision, once per tick ([`crate::fleet::cron`]) | the node that decides it; trimmed to the newest 20 |
//! | `bell` | a nonce; each new version asks every node to run a pass now | `init`; a node that fenced a peer or released its claims; every manifest write through `HintingStore` ([`crate::fleet::feed::ring_bell`]) |

use std::fmt::Display;

/// The fleet marker's key.
pub const MARKER: &str = "fleet";
/// Node leases.
pub const NODES: &str = "nodes/";
/// Manifests (desired state).
pub const MANIFESTS: &str = "manifests/";
/// Claims (who runs a session, at which epoch).
pub const SESSIONS: &str = "sessions/";
/// Standalone leases.
pub const LEASES: &str = "leases/";
/// Operator control objects, one per node.
pub const CONTROL: &str = "control/";
/// The change feed: hints, never authority (see `crate::fleet::feed`).
pub const CHANGES: &str = "changes/";
/// Alarms: `alarms/<minute>/<session>/<nonce>` (see `crate::fleet::alarm`).
pub const ALARMS: &str = "alarms/";
/// Cron ticks: `ticks/<session>/<tick ms>` (see `crate::fleet::cron`).
pub const TICKS: &str = "ticks/";
/// The fleet's bell: one object whose every new version asks each node to
/// run a pass now (a hint, never authority; see `crate::fleet::feed`).
pub const BELL: &str = "bell";

/// What a hint says was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hinted {
    Manifest,
    Claim,
    /// A node record whose attributes other than its load changed
    /// (cordoned, the unproven mark): written by the node itself, since
    /// every renewal writes its record and only these are news.
    Node,
}

impl Hinted {
    fn letter(self) -> char {
        match self {
            Hinted::Manifest => 'm',
            Hinted::Claim => 's',
            Hinted::Node => 'n',
        }
    }

    /// The key a hint of this kind names.
    pub fn key(self, name: impl Display) -> String {
        match self {
            Hinted::Manifest => manifest(name),
            Hinted::Claim => session(name),
            Hinted::Node => node(name),
        }
    }

    /// The kind and name of a written key, if every write of it is hinted
    /// (manifests and claims; node records are hinted by their node when
    /// news, see [`Hinted::Node`]).
    pub fn of_key(key: &str) -> Option<(Hinted, &str)> {
        name_in(MANIFESTS, key)
            .map(|n| (Hinted::Manifest, n))
            .or_else(|| name_in(SESSIONS, key).map(|n| (Hinted::Claim, n)))
            .filter(|(_, n)| !n.is_empty() && !n.contains('/'))
    }
}

/// Digits of a hint's time: ms since the Unix epoch, zero-padded so that
/// lexicographic order (the listing's) is time order until the year 2286.
pub const HINT_MS_DIGITS: usize = 13;

/// Width of a hint's time bucket (see [`HintForm::Bucketed`]): ten seconds.
pub const HINT_BUCKET_MS: u64 = 10_000;

/// Digits of a hint's bucket: the time's first nine ([`HINT_MS_DIGITS`]
/// less the four of [`HINT_BUCKET_MS`]).
const HINT_BUCKET_DIGITS: usize = 9;

/// How a hint's key is spelt. Both forms sort by time and both are read
/// by this build ([`parse_hint`]); a writer picks the one every live
/// reader understands (`crate::fleet::feed::HintingStore`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HintForm {
    /// `changes/<ms>-<nonce>-<kind>-<name>`: what builds before the
    /// bucketed form read (they ignore the other form), so written while
    /// such a node is live.
    Flat,
    /// `changes/<ms / 10,000>/<ms>-<nonce>-<kind>-<name>`: under a
    /// ten-second bucket, so a store that walks directories (the local
    /// store) lists from a cursor by reading the buckets from the cursor's
    /// on, not every hint within the retention (issue #14: 200,000 names
    /// a pass after placing 100,000 sessions). The bucket is the time's
    /// first nine digits, so key order is still time order, and a
    /// flat-form hint sorts after every bucketed one of its own bucket:
    /// a listing from a bucketed cursor includes every flat hint from the
    /// cursor's time on (and some of the ten seconds before it).
    Bucketed,
}

/// A hint's key: written at wall time `ms` by a writer that drew `nonce`
/// (hex, no `-`), naming a `kind` write of session `name`, spelt `form`.
pub fn hint(ms: u64, nonce: &str, kind: Hinted, name: impl Display, form: HintForm) -> String {
    match form {
        HintForm::Flat => format!("{CHANGES}{ms:013}-{nonce}-{}-{name}", kind.letter()),
        HintForm::Bucketed => format!(
            "{CHANGES}{:09}/{ms:013}-{nonce}-{}-{name}",
            ms / HINT_BUCKET_MS,
            kind.letter()
        ),
    }
}

/// The cursor key for "every hint from `ms` on": it sorts just before every
/// hint written at `ms` in either form (see [`HintForm::Bucketed`]), so
/// `list_after` from it includes them.
pub fn hint_cursor(ms: u64) -> String {
    format!("{CHANGES}{:09}/{ms:013}", ms / HINT_BUCKET_MS)
}

/// Parses a hint key, in either form, into (ms, kind, name); None for
/// anything else (a foreign object under `changes/`, or a bucketed key
/// whose bucket is not its time's, is ignored: hints only ever hasten).
pub fn parse_hint(key: &str) -> Option<(u64, Hinted, &str)> {
    let mut rest = name_in(CHANGES, key)?;
    let mut bucket = None;
    if let Some((b, r)) = rest.split_once('/') {
        if b.len() != HINT_BUCKET_DIGITS || !b.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        bucket = Some(b.parse::<u64>().ok()?);
        rest = r;
    }
    let (ms, rest) = rest.split_once('-')?;
    if ms.len() != HINT_MS_DIGITS || !ms.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let ms: u64 = ms.parse().ok()?;
    if bucket.is_some_and(|b| b != ms / HINT_BUCKET_MS) {
        return None;
    }
    let (_nonce, rest) = rest.split_once('-')?;
    let (kind, name) = rest.split_once('-')?;
    let kind = match kind {
        "m" => Hinted::Manifest,
        "s" => Hinted::Claim,
        "n" => Hinted::Node,
        _ => return None,
    };
    crate::Name::new(name).ok()?;
    Some((ms, kind, name))
}

/// Node `id`'s lease (or, for a prefix, the listing of ids that start with it).
pub fn node(id: impl Display) -> String {
    format!("{NODES}{id}")
}

/// Session `name`'s manifest.
pub fn manifest(name: impl Display) -> String {
    format!("{MANIFESTS}{name}")
}

/// Session `name`'s claim.
pub fn session(name: impl Display) -> String {
    format!("{SESSIONS}{name}")
}

/// `prefix` then `name`, written into `buf` (cleared first): the keys
/// [`session`] and [`manifest`] make, for a loop over every session that
/// would otherwise allocate one key per session per pass.
pub fn key_in<'a>(buf: &'a mut String, prefix: &str, name: &str) -> &'a str {
    buf.clear();
    buf.push_str(prefix);
    buf.push_str(name);
    buf
}

/// An alarm's key: `alarms/<minute of at_ms, 12 digits>/<session>/<nonce>`,
/// time-bucketed so the index reads in time order.
pub fn alarm(at_ms: u64, session: &str, nonce: &str) -> String {
    format!("{ALARMS}{:012}/{session}/{nonce}", at_ms / 60_000)
}

/// The minute and the session of an alarm's key (`None` for anything else).
pub fn parse_alarm(key: &str) -> Option<(u64, &str)> {
    let rest = key.strip_prefix(ALARMS)?;
    let mut parts = rest.split('/');
    let minute = parts.next()?.parse().ok()?;
    let session = parts.next()?;
    let _nonce = parts.next()?;
    parts.next().is_none().then_some((minute, session))
}

/// Tick `tick_ms` of `session`'s schedule: the milliseconds zero-padded
/// to 15 digits (the year 9999), so keys sort by time.
pub fn tick(session: &str, tick_ms: u64) -> String {
    format!("{TICKS}{session}/{tick_ms:015}")
}

/// The session and the tick of a tick's key (`None` for anything else).
pub fn parse_tick(key: &str) -> Option<(&str, u64)> {
    let rest = key.strip_prefix(TICKS)?;
    let (session, ms) = rest.split_once('/')?;
    if ms.len() != 15
        || !ms.bytes().all(|b| b.is_ascii_digit())
        || crate::Name::new(session).is_err()
    {
        return None;
    }
    Some((session, ms.parse().ok()?))
}

/// Standalone lease `name`.
pub fn lease(name: impl Display) -> String {
    format!("{LEASES}{name}")
}

/// Node `id`'s control object.
pub fn control(id: impl Display) -> String {
    format!("{CONTROL}{id}")
}

/// The name part of `key` under `prefix`, or None when the key is not under it.
pub fn name_in<'a>(prefix: &str, key: &'a str) -> Option<&'a str> {
    key.strip_prefix(prefix)
}

/// The name part of a key from a listing of `prefix`. A listing returns only
/// keys under its prefix; a key that is not (a broken store) is returned
/// whole, which no valid name equals, so it matches nothing.
pub fn tail<'a>(prefix: &str, key: &'a str) -> &'a str {
    key.strip_prefix(prefix).unwrap_or(key)
}

/// The claim key for a manifest key, or None when `key` is not a manifest's.
pub fn session_of_manifest(key: &str) -> Option<String> {
    name_in(MANIFESTS, key).map(session)
}

/// The manifest key for a claim key, or None when `key` is not a claim's.
pub fn manifest_of_session(key: &str) -> Option<String> {
    name_in(SESSIONS, key).map(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hint keys, in either form, parse back to what they name whatever
    /// the name holds (`-` and `.` included), sort by time, and anything
    /// else under `changes/` is not a hint.
    #[test]
    fn hint_keys_round_trip_and_sort_by_time() {
        use HintForm::{Bucketed, Flat};
        let k = hint(1_764_700_000_123, "9f3a", Hinted::Claim, "web-1.a", Flat);
        assert_eq!(k, "changes/1764700000123-9f3a-s-web-1.a");
        let b = hint(
            1_764_700_000_123,
            "9f3a",
            Hinted::Claim,
            "web-1.a",
            Bucketed,
        );
        assert_eq!(b, "changes/176470000/1764700000123-9f3a-s-web-1.a");
        for k in [&k, &b] {
            assert_eq!(
                parse_hint(k),
                Some((1_764_700_000_123, Hinted::Claim, "web-1.a"))
            );
        }
        for form in [Flat, Bucketed] {
            let m = hint(7, "00", Hinted::Manifest, "x", form);
            assert_eq!(parse_hint(&m), Some((7, Hinted::Manifest, "x")));
            let n = hint(7, "00", Hinted::Node, "n1", form);
            assert_eq!(
                parse_hint(&n).map(|(_, k, x)| k.key(x)),
                Some("nodes/n1".into())
            );
        }
        // Key order is time order within either form and across them, and
        // the cursor for `ms` sorts before every hint from `ms` on and
        // after every bucketed one before it; a flat hint up to one
        // bucket earlier may sort after it (read, and dropped by time).
        let times = [
            0u64,
            9_999,
            10_000,
            1_764_700_009_999,
            1_764_700_010_000,
            1_764_700_010_001,
            1_764_700_019_999,
            1_764_700_020_000,
        ];
        for &t in &times {
            for &u in &times {
                for (f, g) in [(Flat, Flat), (Bucketed, Bucketed), (Bucketed, Flat)] {
                    let (x, y) = (
                        hint(t, "ff", Hinted::Claim, "zz", f),
                        hint(u, "00", Hinted::Manifest, "a", g),
                    );
                    if t < u && (f == g || t / HINT_BUCKET_MS < u / HINT_BUCKET_MS) {
                        assert!(x < y, "{x} < {y}");
                    }
                }
                for form in [Flat, Bucketed] {
                    let h = hint(u, "00", Hinted::Manifest, "a", form);
                    if u >= t {
                        assert!(hint_cursor(t) < h, "cursor {t} before {h}");
                    } else if form == Bucketed || u / HINT_BUCKET_MS < t / HINT_BUCKET_MS {
                        assert!(hint_cursor(t) > h, "cursor {t} after {h}");
                    }
                }
            }
        }
        for bad in [
            "changes/",
            "changes/123-ab-m-x",
            "changes/176470000012x-ab-m-x",
            "changes/1764700000123-ab-q-x",
            "changes/1764700000123-ab-m-",
            "changes/1764700000123-ab-m-..",
            "changes/1764700000123-ab-m-a/b",
            "manifests/1764700000123-ab-m-x",
            // Bucketed: the bucket must be the time's first nine digits.
            "changes/176470001/1764700000123-ab-m-x",
            "changes/17647000/1764700000123-ab-m-x",
            "changes/17647000x/1764700000123-ab-m-x",
            "changes/176470000/1764700000123-ab-m-a/b",
            "changes/176470000/",
            "changes/176470000/x/1764700000123-ab-m-x",
        ] {
            assert_eq!(parse_hint(bad), None, "{bad}");
        }
        assert_eq!(Hinted::of_key("manifests/a"), Some((Hinted::Manifest, "a")));
        assert_eq!(Hinted::of_key("sessions/a"), Some((Hinted::Claim, "a")));
        assert_eq!(Hinted::of_key("nodes/a"), None);
        assert_eq!(Hinted::of_key("sessions/"), None);
    }

    #[test]
    fn keys_round_trip_through_their_prefixes() {
        assert_eq!(node("n1"), "nodes/n1");
        assert_eq!(manifest("web"), "manifests/web");
        assert_eq!(session("web"), "sessions/web");
        assert_eq!(lease("job"), "leases/job");
        assert_eq!(control("n1"), "control/n1");
        assert_eq!(name_in(SESSIONS, &session("a-b")), Some("a-b"));
        assert_eq!(name_in(SESSIONS, &manifest("a")), None);
        assert_eq!(tail(NODES, "nodes/x"), "x");
        assert_eq!(tail(NODES, "elsewhere/x"), "elsewhere/x");
        assert_eq!(
            session_of_manifest("manifests/a").as_deref(),
            Some("sessions/a")
        );
        assert_eq!(
            manifest_of_session("sessions/a").as_deref(),
            Some("manifests/a")
        );
        assert_eq!(session_of_manifest("sessions/a"), None);
        // Prefixes never nest: no key is under two of them.
        let all = [NODES, MANIFESTS, SESSIONS, LEASES, CONTROL, MARKER];
        for a in all {
            for b in all {
                if a != b {
                    assert!(!a.starts_with(b), "{a} under {b}");
                }
            }
        }
    }
}
