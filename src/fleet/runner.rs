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
//! - `take_exits` reports sessions that ended by themselves (or by their
//!   deadline) since the last call.

use super::manifest::Spec;
use crate::clock::{Clock, MonoTime};
use crate::error::{Error, Result};
use async_trait::async_trait;
use std::collections::HashMap;
use std::fmt::Debug;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The error `start` returns when the deadline has already passed: the
/// node's lease lapsed, which is not the session's failure.
pub fn deadline_passed(name: &str, epoch: u64) -> Error {
    Error::Lost {
        key: format!("sessions/{name}"),
        epoch,
        reason: "the node's validity deadline passed before the session could start".into(),
    }
}

/// What `start` is given.
#[derive(Debug, Clone)]
pub struct SessionStart {
    pub name: String,
    /// The fencing token; passed to the process as LEASEHOLD_EPOCH.
    pub epoch: u64,
    pub spec: Spec,
    pub deadline: MonoTime,
}

/// A session that ended without being asked to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    pub name: String,
    pub epoch: u64,
    pub code: i32,
    /// Killed because the announced deadline passed.
    pub deadline: bool,
}

/// Runs sessions. See the module docs for the contract.
#[async_trait]
pub trait Runner: Send + Sync + Debug {
    async fn start(&self, s: SessionStart) -> Result<()>;
    fn announce(&self, deadline: MonoTime);
    async fn stop(&self, name: &str);
    fn take_exits(&self) -> Vec<Exit>;
    /// (name, epoch) of every running session.
    fn running(&self) -> Vec<(String, u64)>;
}

/// An in-process runner that runs nothing but records what it was told,
/// enforcing deadlines on the injected clock exactly as the watchdog does.
/// For tests and for embedding experiments.
#[derive(Debug)]
pub struct RecordingRunner {
    clock: Arc<dyn Clock>,
    state: Mutex<RecState>,
}

#[derive(Debug, Default)]
struct RecState {
    running: HashMap<String, (u64, MonoTime, MonoTime)>, // epoch, started, deadline
    /// (name, epoch, started, ended): every completed run.
    history: Vec<(String, u64, MonoTime, MonoTime)>,
    exits: Vec<Exit>,
    pending_exit: HashMap<String, i32>,
}

impl RecordingRunner {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        RecordingRunner {
            clock,
            state: Mutex::new(RecState::default()),
        }
    }

    /// Makes session `name` exit with `code` at the next check.
    pub fn exit(&self, name: &str, code: i32) {
        self.state
            .lock()
            .unwrap()
            .pending_exit
            .insert(name.to_string(), code);
    }

    /// Every run so far, including the ones still going (ended = now):
    /// (name, epoch, started, ended).
    pub fn history(&self) -> Vec<(String, u64, MonoTime, MonoTime)> {
        let now = self.clock.now();
        let mut s = self.state.lock().unwrap();
        Self::expire(&mut s, now);
        let mut h = s.history.clone();
        for (n, (e, start, deadline)) in &s.running {
            h.push((n.clone(), *e, *start, now.min(*deadline)));
        }
        h
    }

    fn expire(s: &mut RecState, now: MonoTime) {
        let expired: Vec<String> = s
            .running
            .iter()
            .filter(|(_, (_, _, d))| now >= *d)
            .map(|(n, _)| n.clone())
            .collect();
        for n in expired {
            let (e, start, d) = s.running.remove(&n).expect("present");
            s.history.push((n.clone(), e, start, d));
            s.exits.push(Exit {
                name: n,
                epoch: e,
                code: 137,
                deadline: true,
            });
        }
    }
}

#[async_trait]
impl Runner for RecordingRunner {
    async fn start(&self, s: SessionStart) -> Result<()> {
        let now = self.clock.now();
        let mut st = self.state.lock().unwrap();
        Self::expire(&mut st, now);
        if now >= s.deadline {
            return Err(deadline_passed(&s.name, s.epoch));
        }
        st.running.insert(s.name, (s.epoch, now, s.deadline));
        Ok(())
    }

    fn announce(&self, deadline: MonoTime) {
        let now = self.clock.now();
        let mut st = self.state.lock().unwrap();
        Self::expire(&mut st, now);
        for (_, _, d) in st.running.values_mut() {
            *d = deadline;
        }
    }

    async fn stop(&self, name: &str) {
        let now = self.clock.now();
        let mut st = self.state.lock().unwrap();
        Self::expire(&mut st, now);
        if let Some((e, start, _)) = st.running.remove(name) {
            st.history.push((name.to_string(), e, start, now));
        }
    }

    fn take_exits(&self) -> Vec<Exit> {
        let now = self.clock.now();
        let mut st = self.state.lock().unwrap();
        Self::expire(&mut st, now);
        let pending: Vec<(String, i32)> = st.pending_exit.drain().collect();
        for (n, code) in pending {
            if let Some((e, start, _)) = st.running.remove(&n) {
                st.history.push((n.clone(), e, start, now));
                st.exits.push(Exit {
                    name: n,
                    epoch: e,
                    code,
                    deadline: false,
                });
            }
        }
        std::mem::take(&mut st.exits)
    }

    fn running(&self) -> Vec<(String, u64)> {
        let now = self.clock.now();
        let mut st = self.state.lock().unwrap();
        Self::expire(&mut st, now);
        st.running
            .iter()
            .map(|(n, (e, _, _))| (n.clone(), *e))
            .collect()
    }
}

/// Runs each session as a process under a dead-man switch (see
/// [`super::watchdog`]): `<watchdog> __watchdog <grace_ms> <deadline_ns>
/// <command> <args...>`, with LEASEHOLD_SESSION, LEASEHOLD_EPOCH (the fencing
/// token) and LEASEHOLD_SPEC (the spec as JSON) in its environment.
#[derive(Debug)]
pub struct ExecRunner {
    /// The program that provides `__watchdog` (the leasehold binary).
    watchdog: PathBuf,
    clock: Arc<dyn Clock>,
    grace: Duration,
    children: Mutex<HashMap<String, Proc>>,
    exits: Mutex<Vec<Exit>>,
    launcher: Vec<String>,
}

#[derive(Debug)]
struct Proc {
    epoch: u64,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    pgid: i32,
}

impl ExecRunner {
    pub fn new(watchdog: PathBuf, clock: Arc<dyn Clock>, grace: Duration) -> Self {
        ExecRunner {
            watchdog,
            clock,
            grace,
            children: Mutex::new(HashMap::new()),
            exits: Mutex::new(Vec::new()),
            launcher: Vec::new(),
        }
    }

    /// A launcher prefixed to every session command (e.g. `nice -n 10`).
    pub fn with_launcher(mut self, launcher: Vec<String>) -> Self {
        self.launcher = launcher;
        self
    }

    /// A deadline on our clock as absolute CLOCK_MONOTONIC nanoseconds.
    fn absolute(&self, deadline: MonoTime) -> u64 {
        let remaining = deadline.saturating_since(self.clock.now());
        super::watchdog::monotonic_ns() + remaining.as_nanos() as u64
    }

    fn reap(&self) {
        let mut children = self.children.lock().unwrap();
        let mut done = Vec::new();
        for (name, p) in children.iter_mut() {
            if let Ok(Some(status)) = p.child.try_wait() {
                let mut last = String::new();
                let mut line = String::new();
                while p.stdout.read_line(&mut line).unwrap_or(0) > 0 {
                    last = std::mem::take(&mut line);
                }
                let mut parts = last.split_whitespace().skip(1);
                let reason = parts.next().unwrap_or("unknown").to_string();
                let code = parts
                    .next()
                    .and_then(|c| c.parse().ok())
                    .or(status.code())
                    .unwrap_or(137);
                done.push((name.clone(), p.epoch, code, reason == "deadline"));
            }
        }
        let mut exits = self.exits.lock().unwrap();
        for (name, epoch, code, deadline) in done {
            children.remove(&name);
            exits.push(Exit {
                name,
                epoch,
                code,
                deadline,
            });
        }
    }
}

#[async_trait]
impl Runner for ExecRunner {
    async fn start(&self, s: SessionStart) -> Result<()> {
        if self.clock.now() >= s.deadline {
            return Err(deadline_passed(&s.name, s.epoch));
        }
        let abs = self.absolute(s.deadline);
        let mut cmd = Command::new(&self.watchdog);
        cmd.arg("__watchdog")
            .arg(self.grace.as_millis().to_string())
            .arg(abs.to_string())
            .args(&self.launcher)
            .arg(&s.spec.command)
            .args(&s.spec.args)
            .envs(&s.spec.env)
            .env("LEASEHOLD_SESSION", &s.name)
            .env("LEASEHOLD_EPOCH", s.epoch.to_string())
            .env(
                "LEASEHOLD_SPEC",
                serde_json::to_string(&s.spec).expect("spec serialises"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| {
            Error::Internal(format!(
                "cannot start the watchdog {}: {e}",
                self.watchdog.display()
            ))
        })?;
        let stdin = child.stdin.take();
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        // The first line is `pid <pid>` (or `end ...` if it could not start).
        let line = tokio::task::block_in_place(|| {
            let mut l = String::new();
            stdout.read_line(&mut l).map(|_| l)
        })
        .map_err(|e| Error::Internal(format!("watchdog: {e}")))?;
        let pgid = match line.strip_prefix("pid ") {
            Some(p) => p.trim().parse().unwrap_or(0),
            None => {
                let _ = child.wait();
                return Err(Error::invalid(
                    format!("spec.command of session {}", s.name),
                    format!("could not start {:?} ({})", s.spec.command, line.trim()),
                ));
            }
        };
        self.children.lock().unwrap().insert(
            s.name,
            Proc {
                epoch: s.epoch,
                child,
                stdin,
                stdout,
                pgid,
            },
        );
        Ok(())
    }

    fn announce(&self, deadline: MonoTime) {
        let abs = self.absolute(deadline);
        let mut children = self.children.lock().unwrap();
        for p in children.values_mut() {
            if let Some(stdin) = p.stdin.as_mut() {
                // A few bytes into a pipe: does not block in practice. A
                // failure means the watchdog is gone; reap() will see it.
                let _ = writeln!(stdin, "deadline {abs}").and_then(|_| stdin.flush());
            }
        }
    }

    async fn stop(&self, name: &str) {
        let proc = self.children.lock().unwrap().remove(name);
        let Some(mut p) = proc else { return };
        if let Some(stdin) = p.stdin.as_mut() {
            let _ = writeln!(stdin, "stop").and_then(|_| stdin.flush());
        }
        let limit = self.clock.now() + self.grace + Duration::from_secs(1);
        loop {
            if let Ok(Some(_)) = p.child.try_wait() {
                return;
            }
            if self.clock.now() >= limit {
                // The watchdog did not finish: kill both.
                // SAFETY: plain syscalls on ids we started.
                unsafe { libc::kill(-p.pgid, libc::SIGKILL) };
                let _ = p.child.kill();
                let _ = p.child.wait();
                return;
            }
            self.clock.sleep(Duration::from_millis(10)).await;
        }
    }

    fn take_exits(&self) -> Vec<Exit> {
        self.reap();
        std::mem::take(&mut self.exits.lock().unwrap())
    }

    fn running(&self) -> Vec<(String, u64)> {
        self.reap();
        self.children
            .lock()
            .unwrap()
            .iter()
            .map(|(n, p)| (n.clone(), p.epoch))
            .collect()
    }
}

impl Drop for ExecRunner {
    fn drop(&mut self) {
        // Closing the watchdogs' stdin tells them the node is gone: they kill
        // their sessions at once.
        for p in self.children.get_mut().unwrap().values_mut() {
            p.stdin = None;
        }
    }
}
