//! What runs a session.
//!
//! # Contract
//!
//! - `start` runs the session at `epoch` and must not let it run past the
//!   given deadline unless a later `announce` extends it. The deadline is the
//!   end of the node lease's validity: a session never outlives the lease that
//!   admitted it.
//! - `announce` extends every running session's deadline; the node calls it
//!   after each successful renew.
//! - `stop` ends a session (gracefully where the runner can), idempotently.
//!   A session that had already ended by itself when the stop reached it
//!   (its exit not yet taken) is returned as that [`Exit`], never lost: a
//!   run-to-completion job that finished just before its node stopped is
//!   finished, and must be recorded so, not released to run again.
//! - `take_exits` reports sessions that ended by themselves (or by their
//!   deadline) since the last call.
//! - `exited` resolves when `take_exits` may have something new, so the node
//!   records an end as it happens rather than at its next pass (a pass may
//!   be seconds away on an idle node). A runner that has no way to tell
//!   never resolves it; the node's passes still take every exit.
//!
//! Two runners: [`ExecRunner`] (`exec.rs`: a process per session under a
//! dead-man switch) and, for tests and experiments, `RecordingRunner`
//! (`recording.rs`, feature `testkit`: runs nothing, records everything, on
//! the injected clock).

use super::manifest::Spec;
use crate::clock::MonoTime;
use crate::error::{Error, Result};
use async_trait::async_trait;
use std::fmt::Debug;

mod exec;
#[cfg(any(test, feature = "testkit"))]
mod recording;

pub use exec::{BASE_ENV, ExecRunner};
#[cfg(any(test, feature = "testkit"))]
pub use recording::RecordingRunner;

/// The error `start` returns when the deadline has already passed: the
/// node's lease lapsed, which is not the session's failure.
pub fn deadline_passed(name: &str, epoch: u64) -> Error {
    Error::Lost {
        key: crate::keys::session(name),
        epoch,
        reason: "the node's validity deadline passed before the session could start".into(),
    }
}

/// What `start` is given.
#[derive(Debug, Clone)]
pub struct SessionStart {
    pub name: String,
    /// The node running it; passed to the process as LEASEHOLD_NODE.
    pub node: String,
    /// The fencing token; passed to the process as LEASEHOLD_EPOCH.
    pub epoch: u64,
    pub spec: Spec,
    pub deadline: MonoTime,
    /// The run's channel to its node (its address and credential), when
    /// the node serves one: passed as LEASEHOLD_NODE_SOCKET and
    /// LEASEHOLD_RUN_TOKEN.
    pub channel: Option<crate::fleet::channel::RunChannel>,
}

/// A session that ended without being asked to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub name: String,
    pub epoch: u64,
    pub code: i32,
    /// Killed because the announced deadline passed.
    pub deadline: bool,
    /// Its watchdog died without reporting (killed from outside): the
    /// session's processes were killed when that was seen.
    pub watchdog_lost: bool,
    /// What ended it, where the code alone does not say: `memory limit
    /// 64 MiB reached: ...` (the node records it as the session's reason).
    pub reason: Option<String>,
}

/// Runs sessions. See the module docs for the contract.
#[async_trait]
pub trait Runner: Send + Sync + Debug {
    async fn start(&self, s: SessionStart) -> Result<()>;
    fn announce(&self, deadline: MonoTime);
    /// Ends `name`; its own exit if it had already ended by itself.
    async fn stop(&self, name: &str) -> Option<Exit>;
    fn take_exits(&self) -> Vec<Exit>;
    /// Resolves once an exit may be waiting in `take_exits` (see the
    /// module docs). Never, by default.
    async fn exited(&self) {
        std::future::pending::<()>().await
    }
    /// (name, epoch) of every running session.
    fn running(&self) -> Vec<(String, u64)>;
    /// Runs an exec health check of session `name` (its `check.exec`
    /// command) as the session runs: its user, working directory,
    /// environment and cgroups. Ok on exit 0 within `timeout`; the error
    /// says what happened. A runner without processes cannot.
    async fn exec_check(
        &self,
        name: &str,
        argv: &[String],
        timeout: std::time::Duration,
    ) -> std::result::Result<(), String> {
        let _ = (name, argv, timeout);
        Err("this runner cannot run exec checks".into())
    }
}
/// The runs `runner` reports alive, as the session channel asks for them
/// ([`crate::fleet::channel::server::ChannelState::running`]).
pub fn running_of(runner: std::sync::Arc<dyn Runner>) -> crate::fleet::channel::server::RunningNow {
    std::sync::Arc::new(move || runner.running())
}
