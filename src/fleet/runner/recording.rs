//! [`RecordingRunner`]: a runner that runs nothing and records what it was
//! told, enforcing deadlines on the injected clock exactly as the watchdog
//! does. For tests, the simulations and embedding experiments.

use super::{Exit, Runner, SessionStart, deadline_passed};
use crate::clock::{Clock, MonoTime};
use crate::error::Result;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// An in-process runner that runs nothing but records what it was told,
/// enforcing deadlines on the injected clock exactly as the watchdog does.
/// For tests and for embedding experiments.
#[derive(Debug)]
pub struct RecordingRunner {
    clock: Arc<dyn Clock>,
    state: Mutex<RecState>,
    /// With [`with_exit_wakeups`](Self::with_exit_wakeups): `exit` wakes
    /// the node (`Runner::exited`), as the exec runner does.
    wake: Option<tokio::sync::Notify>,
}

#[derive(Debug, Default)]
struct RecState {
    running: HashMap<String, (u64, MonoTime, MonoTime)>, // epoch, started, deadline
    /// (name, epoch, started, ended): every completed run.
    history: Vec<(String, u64, MonoTime, MonoTime)>,
    exits: Vec<Exit>,
    pending_exit: HashMap<String, i32>,
    /// No running session's deadline is earlier (a lower bound: a removal
    /// leaves it as it was). `expire` walks `running` only once `now`
    /// reaches it: it is called on every start, and walking 10,000 sessions
    /// per start made placing them quadratic in this double (a spike at
    /// 100,000 sessions charged it to the node).
    earliest: Option<MonoTime>,
}

impl RecordingRunner {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        RecordingRunner {
            clock,
            state: Mutex::new(RecState::default()),
            wake: None,
        }
    }

    /// `exit` wakes the node at once, as the exec runner's exits do; by
    /// default the node takes exits at its next pass (the simulations'
    /// histories depend on that).
    pub fn with_exit_wakeups(mut self) -> Self {
        self.wake = Some(tokio::sync::Notify::new());
        self
    }

    /// Makes session `name` exit with `code` at the next check.
    pub fn exit(&self, name: &str, code: i32) {
        self.state
            .lock()
            .unwrap()
            .pending_exit
            .insert(name.to_string(), code);
        if let Some(w) = &self.wake {
            w.notify_one();
        }
    }

    /// Ends session `name` with `code` as the exec runner's monitor ends a
    /// run: its exit is queued for `take_exits` at once, and a `stop` that
    /// comes before the node takes it finds nothing running (and returns
    /// no exit). The node must still apply that exit once, to that run.
    pub fn exit_taken(&self, name: &str, code: i32) {
        let now = self.clock.now();
        let mut s = self.state.lock().unwrap();
        if let Some((e, start, _)) = s.running.remove(name) {
            s.history.push((name.to_string(), e, start, now));
            s.exits.push(Exit {
                name: name.to_string(),
                epoch: e,
                code,
                deadline: false,
                watchdog_lost: false,
                reason: None,
            });
        }
        if let Some(w) = &self.wake {
            w.notify_one();
        }
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
        if s.earliest.is_none_or(|t| now < t) {
            return;
        }
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
                watchdog_lost: false,
                reason: None,
            });
        }
        s.earliest = s.running.values().map(|(_, _, d)| *d).min();
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
        // A test double that checks the node's side of the contract: a
        // session is never started while a run of it is still going here
        // (the node stops it first). Panics, so no test can miss it.
        if let Some((epoch, ..)) = st.running.get(&s.name) {
            panic!(
                "session {} started at epoch {} while its run at epoch {epoch} goes on",
                s.name, s.epoch
            );
        }
        st.earliest = Some(st.earliest.map_or(s.deadline, |t| t.min(s.deadline)));
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
        st.earliest = (!st.running.is_empty()).then_some(deadline);
    }

    async fn stop(&self, name: &str) -> Option<Exit> {
        let now = self.clock.now();
        let mut st = self.state.lock().unwrap();
        Self::expire(&mut st, now);
        // An exit set with `exit` and not yet taken: the session ended by
        // itself before the stop reached it.
        let own = st.pending_exit.remove(name);
        let (e, start, _) = st.running.remove(name)?;
        st.history.push((name.to_string(), e, start, now));
        own.map(|code| Exit {
            name: name.to_string(),
            epoch: e,
            code,
            deadline: false,
            watchdog_lost: false,
            reason: None,
        })
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
                    watchdog_lost: false,
                    reason: None,
                });
            }
        }
        std::mem::take(&mut st.exits)
    }

    async fn exited(&self) {
        match &self.wake {
            Some(w) => w.notified().await,
            None => std::future::pending::<()>().await,
        }
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
