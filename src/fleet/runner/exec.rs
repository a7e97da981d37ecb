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

/// The environment every session gets besides its spec's `env`: these, when
/// the node has them. Nothing else of the node's environment (credentials,
/// store URLs, telemetry headers) reaches a session unless named with
/// [`ExecRunner::with_pass_env`].
pub const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "TZ"];
/// PATH for a session when the node has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Process-wide: the watchdogs every [`ExecRunner`] in this process started,
/// so the orphan sweep never mistakes one for an orphan (a process may hold
/// several runners: the demo runs three nodes). Spawns happen under this
/// lock, so a watchdog is registered before a sweep can see it.
fn watchdogs() -> &'static Mutex<HashSet<i32>> {
    static W: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
    W.get_or_init(Default::default)
}

/// Kills what re-parented to this process (a subreaper) from a session whose
/// watchdog died: every child that is not in this process's own session and
/// is not a watchdog we started. Session processes can never be in the
/// node's session (the watchdog called `setsid`; a session cannot be
/// joined), and the node's own helpers (a credentials process) are.
fn sweep_orphans() -> usize {
    let me = std::process::id() as i32;
    // SAFETY: getsid(0) has no preconditions.
    let my_sid = unsafe { libc::getsid(0) };
    let registered = watchdogs().lock().unwrap();
    let mut n = 0;
    for p in crate::fleet::contain::scan() {
        if p.ppid != me || p.sid == my_sid || registered.contains(&p.pid) {
            continue;
        }
        if !p.zombie {
            // SAFETY: a child of ours that we did not start as a watchdog.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
            n += 1;
        }
        let mut st = 0;
        // SAFETY: reaps that one child only (never -1: std's Child handles
        // of our watchdogs must keep their statuses).
        unsafe { libc::waitpid(p.pid, &mut st, libc::WNOHANG) };
    }
    n
}

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
    closed: AtomicBool,
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

/// Whether `pid` is stopped (state T or t in `/proc/<pid>/stat`).
fn process_stopped(pid: i32) -> bool {
    crate::fleet::contain::stat(pid).is_some_and(|p| p.stopped)
}

/// The monitor thread: see [`ExecRunner`]. Ends when the runner is dropped.
///
/// It looks every 50 ms, and at once when a watchdog's output ends (it is
/// exiting): then, since the watchdog may not have finished exiting yet,
/// again every 2 ms a few times, until the round finds it.
fn monitor(shared: std::sync::Weak<Shared>, woken: std::sync::mpsc::Receiver<()>) {
    let mut soon = 0u32;
    loop {
        let wait = if soon > 0 {
            soon -= 1;
            Duration::from_millis(2)
        } else {
            Duration::from_millis(50)
        };
        if woken.recv_timeout(wait).is_ok() {
            soon = 10;
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut done = Vec::new();
        {
            let mut children = shared.children.lock().unwrap();
            // A watchdog that is stopped (a session can SIGSTOP its own
            // watchdog) or has let its deadline pass is not a dead-man
            // switch any more: kill it; the lost-watchdog path below then
            // kills the session's tree.
            let now_ns = crate::fleet::watchdog::monotonic_ns();
            for p in children.values_mut() {
                let stopped = process_stopped(p.child.id() as i32);
                if stopped || now_ns > p.deadline_ns.saturating_add(200_000_000) {
                    let _ = p.child.kill();
                }
            }
            let exited: Vec<String> = children
                .iter_mut()
                .filter_map(|(n, p)| matches!(p.child.try_wait(), Ok(Some(_))).then(|| n.clone()))
                .collect();
            if !exited.is_empty() {
                soon = 0;
            }
            for name in exited {
                let p = children.remove(&name).expect("present");
                shared.exiting.lock().unwrap().insert(name.clone());
                watchdogs().lock().unwrap().remove(&(p.child.id() as i32));
                done.push((name, p));
            }
        }
        for (name, p) in done {
            let report = p.report();
            p.contain();
            let lost = report.is_none();
            if lost {
                tracing::warn!(session = %name, "the session's watchdog died; its processes were killed");
            }
            let (reason, code) = report.unwrap_or(("watchdog-lost".into(), 137));
            let p_name = name.clone();
            shared.exits.lock().unwrap().push(Exit {
                name,
                epoch: p.epoch,
                code,
                deadline: reason == "deadline",
                watchdog_lost: lost,
                reason: p.limit_reason(code),
            });
            shared.exiting.lock().unwrap().remove(&p_name);
            shared.exited.notify_one();
        }
        sweep_orphans();
    }
}

#[async_trait]
impl Runner for ExecRunner {
    async fn start(&self, s: SessionStart) -> Result<()> {
        if self.clock.now() >= s.deadline {
            return Err(deadline_passed(&s.name, s.epoch));
        }
        // Never two process trees of one session on one node: the node stops
        // a run before it starts another, and this refuses if it did not.
        if let Some(p) = self.shared.children.lock().unwrap().get(&s.name) {
            return Err(Error::Internal(format!(
                "session {} (epoch {}) is still running here at epoch {}",
                s.name, s.epoch, p.epoch
            )));
        }
        // What only this node can know, before anything is made: who the
        // session runs as, and its working directory. Each refusal is the
        // session's reason (it fails here, with that reason, rather than
        // crash-looping on an error nobody sees).
        let (uid, gid) = crate::fleet::identity::own_ids();
        let run_as = crate::fleet::identity::resolve(
            &self.users,
            s.spec.user.as_deref(),
            s.spec.group.as_deref(),
            uid,
            gid,
        )
        .map_err(|reason| Error::invalid(format!("spec.user of session {}", s.name), reason))?;
        if let Some(w) = &s.spec.workdir {
            match std::fs::metadata(w) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    return Err(Error::invalid(
                        format!("spec.workdir of session {}", s.name),
                        format!("workdir {w} is not a directory"),
                    ));
                }
                Err(e) => {
                    return Err(Error::invalid(
                        format!("spec.workdir of session {}", s.name),
                        if e.kind() == std::io::ErrorKind::NotFound {
                            format!("workdir {w} does not exist")
                        } else {
                            format!("workdir {w}: {e}")
                        },
                    ));
                }
            }
        }
        // Limits this node cannot enforce, or its host cannot hold: not
        // started here (never run without them).
        self.limits.admit(&s.spec.limits).map_err(|reason| {
            Error::invalid(format!("spec.limits of session {}", s.name), reason)
        })?;
        // A session running as the node's own user owns the cgroup files
        // that hold its limits, and could raise them: that is no limit.
        let session_uid = run_as.as_ref().map_or(uid, |r| r.uid);
        if !s.spec.limits.is_empty() && session_uid == uid {
            return Err(Error::invalid(
                format!("spec.limits of session {}", s.name),
                format!(
                    "cannot enforce its limits: it would run as uid {uid}, the node's own user, \
                     who may rewrite its cgroup's limits (a node running as root runs sessions \
                     as another user)"
                ),
            ));
        }
        // The spec's own stop grace, else the node's.
        let grace = s.spec.stop_grace.unwrap_or(self.grace);
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{}-e{}-{n}", s.name, s.epoch);
        let cgroup = match &self.cgroups {
            Some(root) => Some(
                crate::fleet::contain::Cgroup::create(root.dir().join(&tag))
                    .map_err(|e| Error::Internal(format!("session cgroup: {e}")))?,
            ),
            None => None,
        };
        let limit_cgroups = if s.spec.limits.is_empty() {
            Default::default()
        } else {
            match self
                .limits
                .apply(&s.spec.limits, cgroup.as_ref().map(|c| c.path()), &tag)
            {
                Ok(r) => r,
                Err(e) => {
                    if let Some(cg) = &cgroup {
                        cg.kill_and_remove(Duration::from_secs(1));
                    }
                    return Err(Error::invalid(
                        format!("spec.limits of session {}", s.name),
                        format!("its limits could not be set: {e}"),
                    ));
                }
            }
        };
        let args = crate::fleet::watchdog::Args {
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            deadline_ns: self.absolute(s.deadline),
            cgroup: cgroup.as_ref().map(|c| c.path().to_path_buf()),
            joins: limit_cgroups.v1.clone(),
            members: Vec::new(),
            log: self.log_path(&s.name),
            log_max: self.log_max,
            uid: run_as.as_ref().map(|r| r.uid),
            gid: run_as.as_ref().map(|r| r.gid),
            workdir: s.spec.workdir.as_ref().map(PathBuf::from),
            stop_signal: s
                .spec
                .stop_signal
                .as_deref()
                .and_then(crate::fleet::manifest::stop_signal_number),
            program: self.launcher.first().unwrap_or(&s.spec.command).clone(),
            args: self
                .launcher
                .iter()
                .skip(1)
                .chain(if self.launcher.is_empty() {
                    None
                } else {
                    Some(&s.spec.command)
                })
                .chain(&s.spec.args)
                .cloned()
                .collect(),
        };
        let mut cmd = self.command(&s, &args, run_as.as_ref());
        let check_ctx = Arc::new(CheckCtx {
            ids: run_as.as_ref().map(|r| (r.uid, r.gid)),
            workdir: args.workdir.clone(),
            env: cmd
                .get_envs()
                .filter_map(|(k, v)| Some((k.to_os_string(), v?.to_os_string())))
                .collect(),
            cgroups: args.cgroup.iter().chain(&args.joins).cloned().collect(),
        });
        let mut child = {
            let mut registry = watchdogs().lock().unwrap();
            let child = cmd.spawn().map_err(|e| {
                Error::Internal(format!(
                    "cannot start the watchdog {}: {e}",
                    self.watchdog.display()
                ))
            })?;
            registry.insert(child.id() as i32);
            child
        };
        let stdin = child.stdin.take();
        if let Some(w) = &stdin {
            use std::os::fd::AsRawFd;
            // Never block on a watchdog that stopped reading (a session
            // can SIGSTOP its watchdog): a full pipe is a lost watchdog.
            // SAFETY: fcntl on a descriptor we own.
            unsafe {
                let fd = w.as_raw_fd();
                let fl = libc::fcntl(fd, libc::F_GETFL);
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
        }
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let end = Arc::new(Mutex::new(None));
        let events = Arc::new(Mutex::new(Default::default()));
        let (first_tx, first) = tokio::sync::oneshot::channel::<String>();
        let (done_tx, reader_done) = std::sync::mpsc::channel();
        let end2 = end.clone();
        let events2 = events.clone();
        let wake = self.wake.lock().unwrap().clone();
        std::thread::spawn(move || {
            let mut first_tx = Some(first_tx);
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("end ") {
                    let mut parts = rest.split_whitespace();
                    let reason = parts.next().unwrap_or("unknown").to_string();
                    let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(137);
                    *end2.lock().unwrap() = Some((reason, code));
                }
                if let Some(rest) = line.strip_prefix("limit ") {
                    let mut n = rest.split_whitespace().map(|x| x.parse().unwrap_or(0));
                    *events2.lock().unwrap() = crate::fleet::limits::enforce::LimitEvents {
                        oom_kills: n.next().unwrap_or(0),
                        forks_refused: n.next().unwrap_or(0),
                    };
                    continue; // not the first line: that is `pid` or `end`
                }
                if let Some(tx) = first_tx.take() {
                    let _ = tx.send(line);
                }
            }
            let _ = done_tx.send(());
            let _ = wake.send(());
        });
        // The first line is `pid <pid>` (or `end ...` if it could not start).
        // The session runs before that line is written, and may already
        // have stopped its watchdog: a stopped watchdog is a failed start,
        // not a 10 s wait.
        let wd = child.id() as i32;
        let mut first = first;
        let mut waited = Duration::ZERO;
        let line = loop {
            tokio::select! {
                l = &mut first => break l.unwrap_or_default(),
                _ = self.clock.sleep(Duration::from_millis(50)) => {}
            }
            waited += Duration::from_millis(50);
            if waited >= Duration::from_secs(10) || process_stopped(wd) {
                break String::new();
            }
        };
        let pgid = match line.strip_prefix("pid ") {
            Some(p) => p.trim().parse().unwrap_or(0),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                watchdogs().lock().unwrap().remove(&(child.id() as i32));
                if let Some(cg) = &cgroup {
                    cg.kill_and_remove(Duration::from_secs(1));
                }
                limit_cgroups.remove();
                return Err(Error::invalid(
                    format!("spec.command of session {}", s.name),
                    if line.is_empty() {
                        "its watchdog never reported (stopped, or stuck for 10 s): killed, \
                         with every process of the session"
                            .to_string()
                    } else {
                        format!("could not start {:?} ({})", s.spec.command, line.trim())
                    },
                ));
            }
        };
        self.shared.children.lock().unwrap().insert(
            s.name,
            Proc {
                epoch: s.epoch,
                grace,
                child,
                stdin,
                pgid,
                cgroup,
                limit_cgroups,
                limits: s.spec.limits,
                events,
                check_ctx,
                end,
                reader_done,
                deadline_ns: args.deadline_ns,
            },
        );
        Ok(())
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

    #[allow(clippy::disallowed_methods)] // an I/O bound on a probe, not protocol time
    async fn exec_check(
        &self,
        name: &str,
        argv: &[String],
        timeout: Duration,
    ) -> std::result::Result<(), String> {
        let ctx = self
            .shared
            .children
            .lock()
            .unwrap()
            .get(name)
            .map(|p| p.check_ctx.clone())
            .ok_or("the session is not running here")?;
        let program = argv.first().ok_or("no command")?;
        // Under a watchdog of its own, as the session runs: its launcher,
        // user, working directory, environment and cgroups (joined, never
        // owned: the check's end kills only its own tree), in a session of
        // its own that the watchdog kills whole at the deadline, with every
        // descriptor closed and every signal reset.
        let args = crate::fleet::watchdog::Args {
            grace_ms: 0,
            deadline_ns: crate::fleet::watchdog::monotonic_ns()
                .saturating_add(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX)),
            cgroup: None,
            joins: Vec::new(),
            members: ctx.cgroups.clone(),
            log: None,
            log_max: 0,
            uid: ctx.ids.map(|i| i.0),
            gid: ctx.ids.map(|i| i.1),
            workdir: ctx.workdir.clone(),
            stop_signal: None,
            program: self.launcher.first().unwrap_or(program).clone(),
            args: self
                .launcher
                .iter()
                .skip(1)
                .chain(if self.launcher.is_empty() {
                    None
                } else {
                    Some(program)
                })
                .chain(&argv[1..])
                .cloned()
                .collect(),
        };
        let mut std_cmd = Command::new(&self.watchdog);
        std_cmd
            .arg("__watchdog")
            .args(args.to_argv())
            .env_clear()
            .envs(ctx.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut cmd = tokio::process::Command::from(std_cmd);
        cmd.kill_on_drop(true);
        // Registered as a watchdog while it runs: the node's orphan sweep
        // kills children of ours it does not know.
        let mut child = {
            let mut registry = watchdogs().lock().unwrap();
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot start its watchdog: {}", e.kind()))?;
            if let Some(pid) = child.id() {
                registry.insert(pid as i32);
            }
            child
        };
        let wd = child.id().map(|p| p as i32);
        // Its stdin stays open until it ends: a closed one means the node
        // is gone, and it kills the check.
        let _stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let report = async {
            use tokio::io::AsyncBufReadExt;
            let mut end = None;
            if let Some(out) = stdout {
                let mut lines = tokio::io::BufReader::new(out).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    if let Some(rest) = l.strip_prefix("end ") {
                        let mut p = rest.split_whitespace();
                        let reason = p.next().unwrap_or("").to_string();
                        let code: i32 = p.next().and_then(|c| c.parse().ok()).unwrap_or(137);
                        end = Some((reason, code));
                    }
                }
            }
            end
        };
        // The watchdog ends the check at its deadline; a second more for
        // it to report, then it is killed.
        let limit = timeout + Duration::from_secs(1);
        let end = tokio::time::timeout(limit, report).await.ok().flatten();
        if end.is_none() {
            let _ = child.start_kill();
        }
        let _ = child.wait().await;
        if let Some(pid) = wd {
            watchdogs().lock().unwrap().remove(&pid);
        }
        match end {
            Some((r, 0)) if r == "exited" => Ok(()),
            Some((r, 127)) if r == "spawn-failed" => Err(format!("cannot start {program:?}")),
            Some((r, _)) if r == "deadline" => Err(format!(
                "no exit within {}",
                humantime::format_duration(timeout)
            )),
            Some((_, c)) => Err(format!("exit {c}")),
            None => Err("its watchdog did not report".into()),
        }
    }

    fn running(&self) -> Vec<(String, u64)> {
        self.shared
            .children
            .lock()
            .unwrap()
            .iter()
            .map(|(n, p)| (n.clone(), p.epoch))
            .collect()
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
