//! Waking a session and waiting until it is ready: [`Resolver::wake_ready`]
//! and its typed answer.

use super::*;

/// What [`Resolver::wake_ready`] came to.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Ready {
    /// A live owner runs it, and its health check (if any) passed.
    Ready {
        node: String,
        epoch: u64,
        /// The session's own address, when its spec names a port.
        endpoint: Option<String>,
        /// The owner node's API.
        address: Option<String>,
        /// This call woke it from sleep.
        woken: bool,
    },
    /// No such session: no manifest (nothing was written).
    NotFound,
    /// Not woken, and why: paused, finished (succeeded or failed: nothing
    /// runs until its manifest changes).
    Declined { reason: String },
    /// Claimed at `epoch` by `node`, which is live, but not ready yet
    /// (starting, or its health check not yet passed) when the wait ended;
    /// with no wait (`wait` zero), as soon as the caller's own node
    /// claimed it. The epoch is the run's fencing token: it changes only
    /// if this run ends or is replaced (its manifest changed).
    Starting {
        node: String,
        epoch: u64,
        /// This call woke it from sleep.
        woken: bool,
    },
    /// Nobody runs it yet when the wait ended; `last` says what it was
    /// waiting for (`waiting for a node`, `its owner n2 is not live`).
    TimedOut { last: String },
}

impl Resolver {
    /// Wakes `name` ([`wake`](Self::wake)) and waits up to `wait` until it
    /// is ready: a live owner runs it and its health check passed. One
    /// resolve (a conditional GET) every 50 ms while it waits, and a read
    /// of the owner's node record when the claim names one. With `wait`
    /// zero and the caller's node (see [`Resolver::with_claimer`]) taking
    /// it, the answer is [`Ready::Starting`] as soon as its claim is
    /// written: the wake path's own cost, without the session's start.
    pub async fn wake_ready(&self, name: &Name, wait: Duration) -> Result<Ready> {
        let start = self.clock.now();
        let w = self.wake(name, Duration::from_secs(2)).await?;
        let woken = w.woken;
        match &w.outcome {
            WakeOutcome::NoOwner {
                owner: Owned::NoManifest,
            } => return Ok(Ready::NotFound),
            WakeOutcome::Declined { reason, .. } => {
                return Ok(Ready::Declined {
                    reason: reason.clone(),
                });
            }
            // Claimed by this call: nothing to wait for.
            WakeOutcome::ClaimedHere { node, epoch } if wait.is_zero() && woken => {
                return Ok(Ready::Starting {
                    node: node.clone(),
                    epoch: *epoch,
                    woken,
                });
            }
            _ => {}
        }
        loop {
            // A live owner's run, not ready yet, as the last resolve saw it.
            let mut starting = None;
            let r = self.resolve(name).await?;
            let last = match &r.owner {
                Owned::Claimed {
                    node,
                    instance,
                    address,
                    endpoint,
                    epoch,
                    status,
                    health,
                    ..
                } => {
                    let live = self.owner_lease(node, instance).await? == OwnerLease::Live;
                    match status {
                        ClaimState::Running if live && health.is_none() => {
                            return Ok(Ready::Ready {
                                node: node.clone(),
                                epoch: *epoch,
                                endpoint: endpoint.clone(),
                                address: address.clone(),
                                woken,
                            });
                        }
                        ClaimState::Paused | ClaimState::Succeeded | ClaimState::Failed => {
                            return Ok(Ready::Declined {
                                reason: format!("{} on {node}: nothing to wake", status.as_str()),
                            });
                        }
                        ClaimState::Running if !live => format!("its owner {node} is not live"),
                        ClaimState::Running
                            if *health == Some(crate::fleet::check::Health::Unhealthy) =>
                        {
                            format!("unhealthy on {node}")
                        }
                        ClaimState::Running => {
                            starting = Some((node.clone(), *epoch));
                            format!("starting on {node}")
                        }
                        s => format!("{} on {node}", s.as_str()),
                    }
                }
                Owned::Sleeping { .. } => "asleep".into(),
                Owned::Released { .. } | Owned::Unowned => "waiting for a node".into(),
                Owned::NoManifest => {
                    return Ok(Ready::Declined {
                        reason: "deleted while it was woken".into(),
                    });
                }
            };
            if self.clock.now().saturating_since(start) >= wait {
                return Ok(match starting {
                    Some((node, epoch)) => Ready::Starting { node, epoch, woken },
                    None => Ready::TimedOut { last },
                });
            }
            self.clock.sleep(Duration::from_millis(50)).await;
        }
    }
}
