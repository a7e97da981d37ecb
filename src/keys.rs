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
