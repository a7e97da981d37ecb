//! [`ExecRunner`]: each session a process under its own dead-man switch
//! (`leasehold __watchdog`), its whole tree contained, its end reported as
//! it happens.

use super::{Exit, Runner, SessionStart, deadline_passed};
use crate::clock::{Clock, MonoTime};
use crate::error::{Error, Result};
use async_trait::async_trait;
use std::collections::HashMap;
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

mod check;
mod monitor;
mod orphans;
mod start;

use monitor::*;
use orphans::*;

/// The environment every session gets besides its spec's `env`: these, when
/// the node has them. Nothing else of the node's environment (credentials,
/// store URLs, telemetry headers) reaches a session unless named with
/// [`ExecRunner::with_pass_env`].
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "TZ"];
/// PATH for a session when the node has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Runs each session as a process under a dead-man switch (see
/// [`crate::fleet::watchdog`]) and contains its whole process tree
/// ([`crate::fleet::contain`]): `<watchdog> __watchdog ... -- <command> <args...>`.
///
/// The session's environment is [`BASE_ENV`], the names passed with
/// [`with_pass_env`](Self::with_pass_env), its spec's `env`, then
/// LEASEHOLD_SESSION, LEASEHOLD_EPOCH (the fencing token), LEASEHOLD_NODE and
/// LEASEHOLD_SPEC (the spec as JSON). Its stdin is `/dev/null`; its output
/// goes to `<log dir>/<session>.log` (rotated by size) when a log directory
/// is set, else nowhere.
///
/// A monitor thread checks every watchdog each 50 ms: one that died without
/// reporting its end was killed from outside, so its session is killed at
/// once (its cgroup, its process group, and the orphan sweep) and reported as
/// an exit with `watchdog_lost`. The node never blocks on a session's pipes:
/// each watchdog's reports are read by a thread of their own.
#[derive(Debug)]
pub struct ExecRunner {
    /// The program that provides `__watchdog` (the leasehold binary).
    watchdog: PathBuf,
    clock: Arc<dyn Clock>,
    grace: Duration,
    launcher: Vec<String>,
    pass_env: Vec<String>,
    log_dir: Option<PathBuf>,
    log_max: u64,
    cgroups: Option<crate::fleet::contain::CgroupRoot>,
    /// Where each limit is enforced; declared after `cgroups` so that its
    /// v1 roots go first at drop.
    limits: crate::fleet::limits::enforce::Enforcer,
    users: crate::fleet::identity::SessionUsers,
    /// Wakes the monitor: each watchdog's reader sends when the watchdog's
    /// output ends (it is exiting), so its end is seen at once.
    wake: Mutex<std::sync::mpsc::Sender<()>>,
    shared: Arc<Shared>,
    runs: AtomicU32,
}

#[derive(Debug, Default)]
struct Shared {
    children: Mutex<HashMap<String, Proc>>,
    exits: Mutex<Vec<Exit>>,
    /// Notified after each push to `exits`: a permit is kept when nobody
    /// waits, so no exit's wake-up is lost between two waits.
    exited: tokio::sync::Notify,
    /// The control pipes of sessions being stopped (`stop`), by name.
    stopping: Mutex<HashMap<String, ChildStdin>>,
    /// Sessions the monitor has taken out of `children` and not yet
    /// reported in `exits` (it reads the watchdog's report and contains
    /// what is left first): a `stop` meanwhile waits for the report rather
    /// than finding nothing, so an end is never lost between the two.
    exiting: Mutex<HashSet<String>>,
    /// Runs being started (by name, their epoch): spawned, or about to be,
    /// and not yet in `children`. A session runs before its watchdog
    /// reports its pid, and may call its node's channel at once, whose
    /// check that the run is current (`running`) must not call it ended.
    starting: Mutex<HashMap<String, u64>>,
    closed: AtomicBool,
}

/// Keeps a run in `Shared::starting` until dropped: on every way out of a
/// start, after the run is in `children` if it got there.
struct Starting<'a> {
    shared: &'a Shared,
    name: String,
}

impl<'a> Starting<'a> {
    fn new(shared: &'a Shared, name: &str, epoch: u64) -> Self {
        shared
            .starting
            .lock()
            .unwrap()
            .insert(name.to_string(), epoch);
        Starting {
            shared,
            name: name.to_string(),
        }
    }
}

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.shared.starting.lock().unwrap().remove(&self.name);
    }
}

#[derive(Debug)]
struct Proc {
    epoch: u64,
    /// Its stop grace (the spec's, else the runner's).
    grace: Duration,
    child: Child,
    stdin: Option<ChildStdin>,
    pgid: i32,
    cgroup: Option<crate::fleet::contain::Cgroup>,
    /// Its v1 limit cgroups (removed by the watchdog; again here, should it
    /// be killed).
    limit_cgroups: crate::fleet::limits::enforce::RunCgroups,
    /// Its spec's limits, to name the one that ended it.
    limits: crate::fleet::limits::Limits,
    /// The watchdog's `limit <oom kills> <forks refused>`, if it sent one.
    events: Arc<Mutex<crate::fleet::limits::enforce::LimitEvents>>,
    /// How its exec health checks run (as the session does).
    check_ctx: Arc<CheckCtx>,
    /// The watchdog's `end <reason> <code>`, once its reader saw it.
    end: Arc<Mutex<Option<(String, i32)>>>,
    /// The last deadline announced (absolute CLOCK_MONOTONIC ns): the
    /// monitor enforces it too, should the watchdog be stopped or stuck.
    deadline_ns: u64,
    reader_done: std::sync::mpsc::Receiver<()>,
}

/// What an exec health check of a run needs to run as the session does:
/// its credentials, working directory, environment and cgroups.
#[derive(Debug)]
struct CheckCtx {
    ids: Option<(u32, u32)>,
    workdir: Option<PathBuf>,
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
    cgroups: Vec<PathBuf>,
}

impl Proc {
    /// After the watchdog exited: its report, waiting briefly for the reader
    /// (the pipe is at its end: the watchdog was its only writer).
    fn report(&self) -> Option<(String, i32)> {
        let _ = self.reader_done.recv_timeout(Duration::from_millis(500));
        self.end.lock().unwrap().clone()
    }

    /// Kills whatever of the session may be left (cgroup, process group).
    fn contain(&self) {
        if let Some(cg) = &self.cgroup {
            cg.kill_and_remove(Duration::from_secs(1));
        }
        if self.pgid > 1 {
            // SAFETY: the session's process group, which we started.
            unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        }
        self.limit_cgroups.remove();
    }

    /// The limit that ended a run with `code`, as the session's reason:
    /// only a failed run has one (a session that met its pids limit and
    /// still exited 0 did its job).
    fn limit_reason(&self, code: i32) -> Option<String> {
        let ev = *self.events.lock().unwrap();
        if code == 0 {
            return None;
        }
        use crate::fleet::limits::format_bytes;
        if ev.oom_kills > 0 {
            let n = format!(
                "{} process{}",
                ev.oom_kills,
                if ev.oom_kills == 1 { "" } else { "es" }
            );
            return Some(match self.limits.memory {
                Some(m) => format!(
                    "memory limit {} reached: the kernel's out-of-memory killer ended {n}",
                    format_bytes(m)
                ),
                // No limit of its own: the host or a parent cgroup ran out.
                None => format!("out of memory: the kernel's out-of-memory killer ended {n}"),
            });
        }
        if ev.forks_refused > 0 {
            return Some(format!(
                "pids limit {} reached: {} fork{} refused",
                self.limits.pids.map(|p| p.to_string()).unwrap_or_default(),
                ev.forks_refused,
                if ev.forks_refused == 1 {
                    " was"
                } else {
                    "s were"
                }
            ));
        }
        None
    }
}

impl ExecRunner {
    /// A runner with subreaper containment and no session logs; see the
    /// `with_*` methods.
    pub fn new(watchdog: PathBuf, clock: Arc<dyn Clock>, grace: Duration) -> Self {
        crate::fleet::contain::become_subreaper();
        let shared = Arc::new(Shared::default());
        let weak = Arc::downgrade(&shared);
        let (wake, woken) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("leasehold-monitor".into())
            .spawn(move || monitor(weak, woken))
            .expect("spawn the session monitor thread");
        ExecRunner {
            watchdog,
            clock,
            grace,
            launcher: Vec::new(),
            pass_env: Vec::new(),
            log_dir: None,
            log_max: 8 << 20,
            cgroups: None,
            limits: crate::fleet::limits::enforce::Enforcer::off(
                "this runner contains sessions by the subreaper sweep alone (--containment subreaper); limits need cgroups",
            ),
            users: crate::fleet::identity::SessionUsers::default(),
            wake: Mutex::new(wake),
            shared,
            runs: AtomicU32::new(0),
        }
    }

    /// A launcher prefixed to every session command (e.g. `nice -n 10`).
    pub fn with_launcher(mut self, launcher: Vec<String>) -> Self {
        self.launcher = launcher;
        self
    }

    /// Names of the node's environment variables that sessions also get.
    pub fn with_pass_env(mut self, names: Vec<String>) -> Self {
        self.pass_env = names;
        self
    }

    /// Where session logs go (created if missing), and the most bytes one
    /// session's log (current file plus one rotated) may hold.
    pub fn with_log_dir(mut self, dir: PathBuf, max_bytes: u64) -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::invalid("log directory", format!("{}: {e}", dir.display())))?;
        self.log_dir = Some(dir);
        self.log_max = max_bytes.max(1024);
        Ok(self)
    }

    /// Who sessions run as (see [`crate::fleet::identity`]). Default: this
    /// process's own user, as `std::process::Command` would; the daemon
    /// (`leasehold node run`) passes `nobody` when it runs as root.
    pub fn with_session_users(mut self, users: crate::fleet::identity::SessionUsers) -> Self {
        self.users = users;
        self
    }

    /// Chooses how sessions are contained: `Auto` uses a cgroup v2 per
    /// session where this host allows one; `Cgroup` refuses to run without.
    pub fn with_containment(mut self, mode: crate::fleet::contain::Mode) -> Result<Self> {
        use crate::fleet::contain::{CgroupRoot, Mode};
        static ROOTS: AtomicU32 = AtomicU32::new(0);
        self.cgroups = match mode {
            Mode::Subreaper => None,
            Mode::Auto | Mode::Cgroup => {
                let n = ROOTS.fetch_add(1, Ordering::Relaxed);
                let root = CgroupRoot::new(n);
                if root.is_none() && mode == Mode::Cgroup {
                    return Err(Error::invalid(
                        "--containment",
                        "cgroup: no writable cgroup v2 hierarchy here (use auto or subreaper)",
                    ));
                }
                self.limits = crate::fleet::limits::enforce::Enforcer::discover(
                    root.as_ref().map(|r| r.dir()),
                    n,
                );
                root
            }
        };
        Ok(self)
    }

    /// The containment in force: "cgroup" or "subreaper".
    pub fn containment(&self) -> &'static str {
        if self.cgroups.is_some() {
            "cgroup"
        } else {
            "subreaper"
        }
    }

    /// The limits this runner can enforce, and where: `memory (v1), cpu
    /// (v1), pids (v1)`, or `none`.
    pub fn enforced_limits(&self) -> String {
        self.limits.describe()
    }

    /// The log file of session `name` (when logs are kept).
    pub fn log_path(&self, name: &str) -> Option<PathBuf> {
        self.log_dir.as_ref().map(|d| d.join(format!("{name}.log")))
    }

    /// A deadline on our clock as absolute CLOCK_MONOTONIC nanoseconds.
    fn absolute(&self, deadline: MonoTime) -> u64 {
        // CLOCK_MONOTONIC first: a pause between the two reads then
        // shortens the deadline, never stretches it.
        let mono = crate::fleet::watchdog::monotonic_ns();
        let remaining = deadline.saturating_since(self.clock.now());
        mono + remaining.as_nanos() as u64
    }

    fn command(
        &self,
        s: &SessionStart,
        args: &crate::fleet::watchdog::Args,
        run_as: Option<&crate::fleet::identity::RunAs>,
    ) -> Command {
        let mut cmd = Command::new(&self.watchdog);
        cmd.arg("__watchdog").args(args.to_argv()).env_clear();
        for k in BASE_ENV
            .iter()
            .copied()
            .chain(self.pass_env.iter().map(String::as_str))
        {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        if std::env::var_os("PATH").is_none() {
            cmd.env("PATH", DEFAULT_PATH);
        }
        // A session run as another user gets that user's home and name,
        // not the node's.
        if let Some(r) = run_as {
            match &r.home {
                Some(h) => cmd.env("HOME", h),
                None => cmd.env_remove("HOME"),
            };
            if let Some(n) = &r.name {
                cmd.env("USER", n).env("LOGNAME", n);
            }
        }
        cmd.envs(&s.spec.env)
            .env("LEASEHOLD_SESSION", &s.name)
            .env("LEASEHOLD_EPOCH", s.epoch.to_string())
            .env("LEASEHOLD_NODE", &s.node)
            .envs(s.spec.port.map(|p| ("LEASEHOLD_PORT", p.to_string())))
            .envs(s.channel.iter().flat_map(|c| {
                [
                    (crate::fleet::channel::ENV_SOCKET, c.address.clone()),
                    (crate::fleet::channel::ENV_TOKEN, c.token.clone()),
                ]
            }))
            .env(
                "LEASEHOLD_SPEC",
                serde_json::to_string(&s.spec).expect("spec serialises"),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        cmd
    }
}

#[async_trait]
impl Runner for ExecRunner {
    async fn start(&self, s: SessionStart) -> Result<()> {
        self.start_session(s).await
    }

    fn announce(&self, deadline: MonoTime) {
        let abs = self.absolute(deadline);
        // A session being stopped hears it too; a write that fails means
        // its watchdog is gone or not reading, which its stop's limit
        // handles.
        for stdin in self.shared.stopping.lock().unwrap().values_mut() {
            let _ = writeln!(stdin, "deadline {abs}").and_then(|_| stdin.flush());
        }
        let mut children = self.shared.children.lock().unwrap();
        for p in children.values_mut() {
            if let Some(stdin) = p.stdin.as_mut() {
                // A few bytes into a non-blocking pipe only the watchdog
                // reads. It refuses them only if the watchdog stopped
                // reading (stopped, stuck) or is gone: kill it, and the
                // monitor handles a lost watchdog.
                if writeln!(stdin, "deadline {abs}")
                    .and_then(|_| stdin.flush())
                    .is_err()
                {
                    let _ = p.child.kill();
                } else {
                    p.deadline_ns = abs;
                }
            }
        }
    }

    async fn stop(&self, name: &str) -> Option<Exit> {
        let proc = self.shared.children.lock().unwrap().remove(name);
        let Some(mut p) = proc else {
            // The monitor may be reporting its end right now: wait for the
            // report to reach `exits` (it reads the watchdog's last line
            // and contains the rest: at most a few seconds), so a caller
            // that takes the exits next finds it there.
            let limit = self.clock.now() + Duration::from_secs(5);
            while self.shared.exiting.lock().unwrap().contains(name) && self.clock.now() < limit {
                self.clock.sleep(Duration::from_millis(5)).await;
            }
            return None;
        };
        if let Some(stdin) = p.stdin.as_mut()
            && writeln!(stdin, "stop").and_then(|_| stdin.flush()).is_err()
        {
            let _ = p.child.kill(); // not reading: the limit below is moot
        }
        // It goes on hearing the lease's deadlines while it stops (`announce`):
        // its grace is cut by the lease, not by the last deadline it heard
        // before the stop (under a second at a ttl of 1 s).
        if let Some(stdin) = p.stdin.take() {
            self.shared
                .stopping
                .lock()
                .unwrap()
                .insert(name.to_string(), stdin);
        }
        let limit = self.clock.now() + p.grace + Duration::from_secs(1);
        loop {
            if let Ok(Some(_)) = p.child.try_wait() {
                break;
            }
            if self.clock.now() >= limit {
                // The watchdog did not finish: kill it; contain() below
                // kills what it leaves.
                let _ = p.child.kill();
                let _ = p.child.wait();
                break;
            }
            self.clock.sleep(Duration::from_millis(10)).await;
        }
        self.shared.stopping.lock().unwrap().remove(name);
        watchdogs().lock().unwrap().remove(&(p.child.id() as i32));
        p.contain();
        // `exited`: the session's first process ended before the watchdog
        // read our `stop` (anything else is our stop, a deadline or a lost
        // watchdog, none of which is the session's own end).
        match p.report() {
            Some((reason, code)) if reason == "exited" => Some(Exit {
                name: name.to_string(),
                epoch: p.epoch,
                code,
                deadline: false,
                watchdog_lost: false,
                reason: p.limit_reason(code),
            }),
            _ => None,
        }
    }

    fn take_exits(&self) -> Vec<Exit> {
        std::mem::take(&mut self.shared.exits.lock().unwrap())
    }

    async fn exited(&self) {
        self.shared.exited.notified().await
    }

    async fn exec_check(
        &self,
        name: &str,
        argv: &[String],
        timeout: Duration,
    ) -> std::result::Result<(), String> {
        self.run_exec_check(name, argv, timeout).await
    }

    /// The runs in `children`, and those being started (see
    /// `Shared::starting`).
    fn running(&self) -> Vec<(String, u64)> {
        let mut runs: Vec<(String, u64)> = self
            .shared
            .children
            .lock()
            .unwrap()
            .iter()
            .map(|(n, p)| (n.clone(), p.epoch))
            .collect();
        runs.extend(
            self.shared
                .starting
                .lock()
                .unwrap()
                .iter()
                .map(|(n, e)| (n.clone(), *e)),
        );
        runs
    }
}

impl Drop for ExecRunner {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        // Closing the watchdogs' stdin tells them the node is gone: they kill
        // their sessions at once.
        for p in self.shared.children.lock().unwrap().values_mut() {
            p.stdin = None;
        }
        self.shared.stopping.lock().unwrap().clear();
    }
}
