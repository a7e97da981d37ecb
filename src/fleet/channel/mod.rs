//! The session's own channel to its node: how a run asks "am I still the
//! holder?" before it acknowledges an effect.
//!
//! Each node that runs sessions serves one Unix socket in the abstract
//! namespace (no file to own or clean up), named in every session's
//! environment as `LEASEHOLD_NODE_SOCKET`, with a credential of its own run
//! as `LEASEHOLD_RUN_TOKEN`: 32 random bytes, made when the run starts, never
//! the node's token, never in argv. A call names only its own run; the
//! credential of a run that ended (stopped, restarted, taken over) is
//! refused with the reason, and an unknown one as unknown.
//!
//! | route | what |
//! |---|---|
//! | `GET /v1/self` | the run as its node sees it: session, epoch, node, instance, and how long the node's lease stays valid (`valid_for_ms`) |
//! | `POST /v1/self/sleep[?wake_in=10m]` | the run asks to sleep: its node stops it and writes its claim asleep (see [`crate::fleet::sleep`]), then, with `wake_in`, sets an alarm for that time ([`crate::fleet::alarm`]); 202, 400 for a bad `wake_in` |
//! | `POST /v1/self/alarm?in=10m` (or `at_ms=N`) | the run sets an alarm for its session: a node wakes it then if it is asleep; 201 with the alarm's key, 400 for a time unreadable, passed or over a year ahead, 409 without a sleep rule |
//! | `POST /v1/self/ack?margin=1s&epoch=N` | the ack gate: the node reads the claim (one GET, never a cache) and answers yes only if it still names this node, this instance and this epoch, running, and the node's lease stays valid for at least `margin` after the read. `epoch`, when given, must be the credential's |
//!
//! What a yes means: when the claim was read, the run held it, and no other
//! run can hold it until `margin` has passed (a takeover waits out this
//! node's lease). An effect acknowledged within the margin of the answer is
//! a holder's; one sent later must ask again. A no, a refusal or no answer
//! at all (the node frozen or gone) means: do not acknowledge. The node
//! journals every refusal of a known run (`refused` events).
//!
//! Sessions that share a user (every session runs as `nobody` by default)
//! can read each other's environment, credential included: give sessions
//! that must not speak for each other users of their own.
//!
//! [`Registry`] is what the node keeps; [`server`] answers; [`client`] asks
//! (and `leasehold fence check|ack` is a shell's way to ask).

pub mod client;
#[cfg(feature = "node")]
pub mod server;

use sha2::Digest;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// The environment variable naming the node's socket.
pub const ENV_SOCKET: &str = "LEASEHOLD_NODE_SOCKET";
/// The environment variable holding the run's credential.
pub const ENV_TOKEN: &str = "LEASEHOLD_RUN_TOKEN";

/// The default margin of an ack: the least time the node's lease must stay
/// valid after the claim was read.
pub const DEFAULT_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Retired credentials kept to say why they are refused.
const RETIRED_KEPT: usize = 4096;

/// A session sets at most one alarm on its channel per this many ms.
pub const ALARM_GAP_MS: u64 = 1_000;

/// Acks answered at once, node-wide: each is a bucket GET, and a session
/// that floods them must not crowd out the node's own requests.
pub const MAX_ACKS_IN_FLIGHT: usize = 8;

/// One run a credential stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunId {
    pub session: String,
    pub epoch: u64,
    /// The node instance that started it.
    pub instance: String,
    /// Its spec has a `sleep` rule: only then may it ask to sleep.
    pub may_sleep: bool,
}

type Hash = [u8; 32];

/// The socket address a channel address names: `@name` in the abstract
/// namespace, else a path. The node binds it and its sessions connect to
/// it.
pub fn socket_addr(address: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    match address.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        }
        None => std::os::unix::net::SocketAddr::from_pathname(address),
    }
}

/// A new run credential: 32 bytes from the OS's generator, as hex.
pub fn new_token() -> String {
    use rand::TryRngCore;
    let mut b = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut b)
        .expect("the OS random generator");
    hex::encode(b)
}

/// What a run is given to reach its node: set in its environment as
/// [`ENV_SOCKET`] and [`ENV_TOKEN`].
#[derive(Clone, PartialEq, Eq)]
pub struct RunChannel {
    pub address: String,
    pub token: String,
}

impl std::fmt::Debug for RunChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunChannel")
            .field("address", &self.address)
            .field("token", &"<redacted>")
            .finish()
    }
}

fn hash(token: &str) -> Hash {
    sha2::Sha256::digest(token.as_bytes()).into()
}

/// The runs this node has handed credentials to, by the credential's hash,
/// one per session (a new run replaces its session's last), and the last
/// few thousand retired ones with why.
#[derive(Debug)]
pub struct Registry {
    address: String,
    inner: Mutex<Inner>,
    sleep: tokio::sync::Notify,
    /// Acks answered at once, node-wide (each is a bucket GET).
    #[cfg_attr(not(feature = "node"), allow(dead_code))] // the server takes them
    pub(crate) acks: tokio::sync::Semaphore,
}

#[derive(Debug, Default)]
struct Inner {
    /// Runs that asked to sleep (`POST /v1/self/sleep`), for the node.
    /// Runs that asked to sleep, each with the alarm it asked for (when, by
    /// wall clock), written once it is asleep.
    sleep_requests: Vec<(RunId, Option<u64>)>,
    /// The last refusal journalled per session, and when (ms of the
    /// node's wall clock): the same one is journalled at most every 10 s,
    /// so a session that floods refusals cannot evict the journal.
    journaled: HashMap<String, (String, u64)>,
    /// When each session last set an alarm on its channel (ms of the
    /// node's wall clock): one per [`ALARM_GAP_MS`].
    alarmed: HashMap<String, u64>,
    by_hash: HashMap<Hash, RunId>,
    by_session: HashMap<String, Hash>,
    retired: HashMap<Hash, String>,
    retired_order: VecDeque<Hash>,
}

/// What a credential is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The current credential of a run.
    Run(RunId),
    /// A credential of a run that was replaced, with why.
    Retired(String),
    Unknown,
}

impl Registry {
    /// A registry whose sessions reach it at `address` (the socket's name,
    /// `@...` for the abstract namespace).
    pub fn new(address: impl Into<String>) -> Registry {
        Registry {
            address: address.into(),
            inner: Mutex::default(),
            sleep: tokio::sync::Notify::new(),
            acks: tokio::sync::Semaphore::new(MAX_ACKS_IN_FLIGHT),
        }
    }

    /// Where sessions reach the node.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Records the credential of a new run (retiring the session's last).
    pub fn register(&self, token: &str, run: RunId) {
        let mut i = self.inner.lock().unwrap();
        let h = hash(token);
        if let Some(old) = i.by_session.insert(run.session.clone(), h)
            && let Some(was) = i.by_hash.remove(&old)
        {
            let why = if was.epoch == run.epoch {
                format!(
                    "this run of {} (epoch {}) has ended: the session was started again",
                    was.session, was.epoch
                )
            } else {
                format!(
                    "this run of {} (epoch {}) has ended: the session now runs at epoch {}",
                    was.session, was.epoch, run.epoch
                )
            };
            retire(&mut i, old, why);
        }
        i.by_hash.insert(h, run);
    }

    /// Forgets the credential of `session`'s run at `epoch`, if it is the
    /// current one, with why.
    pub fn retire(&self, session: &str, epoch: u64, why: &str) {
        let mut i = self.inner.lock().unwrap();
        let Some(h) = i.by_session.get(session).copied() else {
            return;
        };
        if i.by_hash.get(&h).is_some_and(|r| r.epoch == epoch) {
            i.by_session.remove(session);
            i.by_hash.remove(&h);
            retire(
                &mut i,
                h,
                format!("this run of {session} (epoch {epoch}) has ended: {why}"),
            );
        }
    }

    /// A run asks to sleep, and to be woken at `wake_at_ms` (wall clock)
    /// if given: the node's loop hears of it at once
    /// ([`sleep_requested`](Self::sleep_requested)) and writes the alarm
    /// once the session is asleep (an alarm that came due while it was
    /// still awake would be consumed).
    pub fn request_sleep(&self, run: RunId, wake_at_ms: Option<u64>) {
        let mut i = self.inner.lock().unwrap();
        match i.sleep_requests.iter_mut().find(|(r, _)| *r == run) {
            Some(r) => r.1 = wake_at_ms.or(r.1),
            None => i.sleep_requests.push((run, wake_at_ms)),
        }
        drop(i);
        self.sleep.notify_one();
    }

    /// Whether `session` may set an alarm on its channel at `now_ms`: one
    /// per [`ALARM_GAP_MS`], so a session that loops cannot fill the index
    /// (each alarm is an object, and rings every node's bell).
    pub fn may_set_alarm(&self, session: &str, now_ms: u64) -> bool {
        let mut i = self.inner.lock().unwrap();
        if i.alarmed
            .get(session)
            .is_some_and(|at| now_ms.saturating_sub(*at) < ALARM_GAP_MS)
        {
            return false;
        }
        if i.alarmed.len() > 10_000 {
            i.alarmed.clear();
        }
        i.alarmed.insert(session.to_string(), now_ms);
        true
    }

    /// Whether to journal refusal `reason` of `session` at `now_ms`: not
    /// if the same was journalled in the last 10 s.
    pub fn journal_once(&self, session: &str, reason: &str, now_ms: u64) -> bool {
        let mut i = self.inner.lock().unwrap();
        if let Some((r, at)) = i.journaled.get(session)
            && r == reason
            && now_ms.saturating_sub(*at) < 10_000
        {
            return false;
        }
        if i.journaled.len() > 10_000 {
            i.journaled.clear();
        }
        i.journaled
            .insert(session.to_string(), (reason.to_string(), now_ms));
        true
    }

    /// The runs that asked to sleep since the last call.
    pub fn take_sleep_requests(&self) -> Vec<(RunId, Option<u64>)> {
        std::mem::take(&mut self.inner.lock().unwrap().sleep_requests)
    }

    /// Resolves when a run may have asked to sleep (a permit is kept).
    pub async fn sleep_requested(&self) {
        self.sleep.notified().await
    }

    /// What `token` stands for.
    pub fn lookup(&self, token: &str) -> Lookup {
        let i = self.inner.lock().unwrap();
        let h = hash(token);
        if let Some(r) = i.by_hash.get(&h) {
            return Lookup::Run(r.clone());
        }
        match i.retired.get(&h) {
            Some(why) => Lookup::Retired(why.clone()),
            None => Lookup::Unknown,
        }
    }
}

fn retire(i: &mut Inner, h: Hash, why: String) {
    if i.retired.insert(h, why).is_none() {
        i.retired_order.push_back(h);
    }
    while i.retired_order.len() > RETIRED_KEPT {
        if let Some(old) = i.retired_order.pop_front() {
            i.retired.remove(&old);
        }
    }
}

/// `GET /v1/self`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SelfView {
    pub session: String,
    pub epoch: u64,
    pub node: String,
    pub instance: String,
    /// How long the node's lease stays valid from the answer (its own
    /// clock).
    pub valid_for_ms: u64,
}

/// `POST /v1/self/ack`'s answer (200 for yes; 409 for no, with the reason).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AckAnswer {
    pub ack: bool,
    pub session: String,
    pub epoch: u64,
    /// With a yes: how long the lease stays valid after the claim's read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_for_ms: Option<u64>,
    /// With a no: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str, epoch: u64) -> RunId {
        RunId {
            session: s.into(),
            epoch,
            instance: "i1".into(),
            may_sleep: false,
        }
    }

    /// One alarm per session per ALARM_GAP_MS on the channel; sessions
    /// apart. And a sleep request keeps the alarm asked for.
    #[test]
    fn alarms_are_paced_per_session_and_sleep_requests_keep_theirs() {
        let r = Registry::new("@x");
        assert!(r.may_set_alarm("s", 10_000));
        assert!(!r.may_set_alarm("s", 10_000 + ALARM_GAP_MS - 1));
        assert!(r.may_set_alarm("t", 10_000));
        assert!(r.may_set_alarm("s", 10_000 + ALARM_GAP_MS));
        r.request_sleep(run("web", 3), Some(99));
        r.request_sleep(run("web", 3), None);
        assert_eq!(r.take_sleep_requests(), vec![(run("web", 3), Some(99))]);
        assert!(r.take_sleep_requests().is_empty());
    }

    #[test]
    fn a_new_run_retires_the_last_credential_with_why() {
        let r = Registry::new("@x");
        r.register("t1", run("web", 3));
        assert_eq!(r.lookup("t1"), Lookup::Run(run("web", 3)));
        r.register("t2", run("web", 3));
        assert_eq!(r.lookup("t2"), Lookup::Run(run("web", 3)));
        assert!(matches!(r.lookup("t1"), Lookup::Retired(w) if w.contains("started again")));
        r.register("t3", run("web", 4));
        assert!(matches!(r.lookup("t2"), Lookup::Retired(w) if w.contains("now runs at epoch 4")));
        r.retire("web", 3, "stale"); // not the current run: nothing
        assert_eq!(r.lookup("t3"), Lookup::Run(run("web", 4)));
        r.retire("web", 4, "stopped");
        assert!(matches!(r.lookup("t3"), Lookup::Retired(w) if w.contains("stopped")));
        assert_eq!(r.lookup("forged"), Lookup::Unknown);
        r.register("a", run("api", 1));
        assert_eq!(r.lookup("a"), Lookup::Run(run("api", 1)));
    }

    #[test]
    fn retired_credentials_are_bounded() {
        let r = Registry::new("@x");
        for i in 0..(RETIRED_KEPT + 10) {
            r.register(&format!("t{i}"), run("web", i as u64 + 1));
        }
        let i = r.inner.lock().unwrap();
        assert_eq!(i.retired.len(), RETIRED_KEPT);
        assert_eq!(i.retired_order.len(), RETIRED_KEPT);
    }
}
