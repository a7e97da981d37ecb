//! Peers asking peers to look at the bucket now (issue #14, failover).
//!
//! A node that fences a dead peer (its tombstone landed) knows at once that
//! the peer's sessions are free; the nodes placement ranks first for them
//! would otherwise learn it at their next pass, up to a whole idle pause
//! (`max_poll`, the ttl by default) later. So the fencer nudges those
//! ranked takers: each runs a pass within `NUDGE_MIN_GAP`, sees the
//! tombstone in its own listing, and claims by the usual rules.
//!
//! # Contract
//!
//! - **A nudge only hastens.** It carries no claim, no verdict and no
//!   session name: the nudged node judges everything from its own reads of
//!   the bucket, exactly as at any other pass. A lost, late, doubled or
//!   forged nudge costs at most one pass (at most one per `NUDGE_MIN_GAP`
//!   however many arrive), never a decision.
//! - **Best effort, bounded.** A node nudges at most [`MAX_NUDGED`] peers
//!   per fence, each with short timeouts, from a task beside its passes:
//!   an unreachable peer never slows the fencer's own takeover.
//! - **Secrets.** [`HttpNudge`] sends the fleet's bearer token in the
//!   `Authorization` header only; it never appears in a log line, an error
//!   or a debug print.

use async_trait::async_trait;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::status::NodeStatus;

/// The most peers one fence nudges: the ranked takers of a dead node's
/// sessions, at most this many (the rest notice at their own pace).
pub const MAX_NUDGED: usize = 32;

/// Asks a peer to look at the bucket now.
#[async_trait]
pub trait Nudge: Send + Sync + fmt::Debug {
    /// Nudges node `node`, whose record publishes `address` (if any).
    /// Returns whether it answered; never an error (see the module docs).
    async fn nudge(&self, node: &str, address: Option<&str>) -> bool;
}

/// `POST {address}/v1/nudge` with the fleet's bearer token: what `node run
/// --token-file` uses (peers accept the same token, the fleet's).
pub struct HttpNudge {
    client: reqwest::Client,
    token: String,
}

impl fmt::Debug for HttpNudge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpNudge").finish_non_exhaustive()
    }
}

impl HttpNudge {
    /// Short timeouts: a nudge is worth something only if it arrives well
    /// within a pause; a peer that does not answer in time notices at its
    /// own pace.
    pub fn new(token: &[u8]) -> crate::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| crate::Error::Internal(format!("building the HTTP client: {e}")))?;
        Ok(HttpNudge {
            client,
            token: String::from_utf8_lossy(token).into_owned(),
        })
    }
}

/// What one [`HttpNudge::send`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NudgeAnswer {
    /// The node answered 2xx: it runs a pass soon.
    Answered,
    /// It answered with this HTTP status: 401 or 403 is our token refused,
    /// which an operator wants to hear of (the node itself never does).
    Refused(u16),
    /// No answer: not reachable, or too slow.
    Unreachable,
    /// Its record publishes no plain-HTTP address.
    NoAddress,
}

impl HttpNudge {
    /// Nudges node `node` at `address` and says how it went (the trait's
    /// `nudge` keeps only whether it answered).
    pub async fn send(&self, node: &str, address: Option<&str>) -> NudgeAnswer {
        // Only plain-HTTP addresses (the node API's); anything else a
        // record may hold is not ours to call.
        let Some(a) = address.filter(|a| a.starts_with("http://")) else {
            return NudgeAnswer::NoAddress;
        };
        let url = format!("{}/v1/nudge", a.trim_end_matches('/'));
        match self.client.post(url).bearer_auth(&self.token).send().await {
            Ok(r) if r.status().is_success() => NudgeAnswer::Answered,
            Ok(r) => {
                tracing::debug!(peer = node, status = %r.status(), "nudge refused");
                NudgeAnswer::Refused(r.status().as_u16())
            }
            Err(e) => {
                // reqwest's error names the URL, never the header.
                tracing::debug!(peer = node, error = %crate::error::Chain(&e), "nudge failed");
                NudgeAnswer::Unreachable
            }
        }
    }
}

#[async_trait]
impl Nudge for HttpNudge {
    async fn nudge(&self, node: &str, address: Option<&str>) -> bool {
        self.send(node, address).await == NudgeAnswer::Answered
    }
}

/// Nodes in one process (tests, the spike, an embedder running several):
/// a nudge is a call to the peer's [`NodeStatus::nudge`], by node id.
#[derive(Debug, Default, Clone)]
pub struct LocalNudge {
    peers: Arc<Mutex<HashMap<String, Arc<NodeStatus>>>>,
}

impl LocalNudge {
    pub fn new() -> Self {
        LocalNudge::default()
    }

    /// Makes node `id` reachable through this handle (a later registration
    /// of the same id replaces it: a restarted node).
    pub fn register(&self, id: &str, status: Arc<NodeStatus>) {
        self.peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.to_string(), status);
    }
}

#[async_trait]
impl Nudge for LocalNudge {
    async fn nudge(&self, node: &str, _address: Option<&str>) -> bool {
        let peer = self
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .cloned();
        match peer {
            Some(s) => {
                s.nudge();
                true
            }
            None => false,
        }
    }
}
