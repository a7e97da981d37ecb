//! The dead-man switch that every exec session runs under.
//!
//! A node whose main process is frozen (SIGSTOP, a debugger, a long pause)
//! cannot stop its children, yet its lease lapses and a peer takes over. So
//! each session is owned by a separate small process, this watchdog
//! (`leasehold __watchdog`), which:
//!
//! - becomes a child subreaper and calls `setsid`, then starts the session
//!   command in a new process group, with stdin `/dev/null`, stdout and
//!   stderr into a pipe it copies to the session's bounded log, and (where
//!   the node made one) inside the session's own cgroup, joined before exec;
//!   the session's first process gets `PR_SET_PDEATHSIG`, so it dies with
//!   the watchdog;
//! - reads deadlines on its stdin, the node's control pipe, as absolute
//!   `CLOCK_MONOTONIC` nanoseconds (one clock for every process on the
//!   machine, so no transit delay stretches the deadline), sent by the node
//!   after every successful renew. The session never sees this pipe: its
//!   stdin is `/dev/null` and every other descriptor is close-on-exec;
//! - kills the session's whole tree ([`super::contain`]: `cgroup.kill` and
//!   the descendant sweep) the moment the last announced deadline passes, at
//!   once when its stdin closes (the node is gone), and when the session's
//!   first process exits (a leftover `setsid` child dies with it);
//! - on `stop`, sends SIGTERM to every descendant, then kills the tree after
//!   the grace period (never later than the deadline);
//! - reports on stdout `pid <pid>` at start and `end <reason> <code>` at the
//!   end, and exits.
//!
//! It acts only on what the node tells it or on the node's disappearance:
//! its own session keeps a terminal's Ctrl-C aimed at the node away from it.

use super::contain;
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// `CLOCK_MONOTONIC` now, in nanoseconds: shared by every process on the host.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reports a line to the node. The node may be gone (that is often why we
/// are finishing), so a closed pipe is ignored, never a panic.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|_| out.flush());
}

enum Msg {
    Deadline(u64),
    Stop,
    Gone,
    /// The session's first process has exited (not yet reaped).
    Exited,
}

/// What the runner passes on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub grace_ms: u64,
    pub deadline_ns: u64,
    pub cgroup: Option<PathBuf>,
    /// Further cgroups the session joins before exec: the v1 cgroups that
    /// hold its limits (see [`super::limits::enforce`]).
    pub joins: Vec<PathBuf>,
    /// Cgroups the session joins before exec that are not its own: never
    /// killed, read or removed here (an exec health check runs in its
    /// session's cgroups, which outlive it).
    pub members: Vec<PathBuf>,
    pub log: Option<PathBuf>,
    pub log_max: u64,
    /// The credentials the session takes before its command runs (both or
    /// neither; see [`super::identity`]).
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The session's working directory.
    pub workdir: Option<PathBuf>,
    /// The signal `stop` sends (SIGTERM when not given).
    pub stop_signal: Option<i32>,
    pub program: String,
    pub args: Vec<String>,
}

impl Args {
    /// The argv after `__watchdog`.
    pub fn to_argv(&self) -> Vec<String> {
        let mut v = vec![
            "--grace-ms".into(),
            self.grace_ms.to_string(),
            "--deadline-ns".into(),
            self.deadline_ns.to_string(),
        ];
        if let Some(c) = &self.cgroup {
            v.extend(["--cgroup".into(), c.display().to_string()]);
        }
        for j in &self.joins {
            v.extend(["--join".into(), j.display().to_string()]);
        }
        for m in &self.members {
            v.extend(["--member".into(), m.display().to_string()]);
        }
        if let Some(l) = &self.log {
            v.extend(["--log".into(), l.display().to_string()]);
            v.extend(["--log-max".into(), self.log_max.to_string()]);
        }
        if let (Some(u), Some(g)) = (self.uid, self.gid) {
            v.extend(["--uid".into(), u.to_string(), "--gid".into(), g.to_string()]);
        }
        if let Some(w) = &self.workdir {
            v.extend(["--workdir".into(), w.display().to_string()]);
        }
        if let Some(sig) = self.stop_signal {
            v.extend(["--stop-signal".into(), sig.to_string()]);
        }
        v.push("--".into());
        v.push(self.program.clone());
        v.extend(self.args.iter().cloned());
        v
    }

    pub fn parse(argv: &[String]) -> Result<Args, String> {
        let mut a = Args {
            grace_ms: 0,
            deadline_ns: 0,
            cgroup: None,
            joins: Vec::new(),
            members: Vec::new(),
            log: None,
            log_max: 8 << 20,
            uid: None,
            gid: None,
            workdir: None,
            stop_signal: None,
            program: String::new(),
            args: Vec::new(),
        };
        let mut it = argv.iter();
        let num = |v: Option<&String>, f: &str| {
            v.and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| format!("{f} needs an integer"))
        };
        let id = |v: Option<&String>, f: &str| {
            v.and_then(|s| s.parse::<u32>().ok())
                .filter(|n| *n < u32::MAX)
                .ok_or_else(|| format!("{f} needs an id"))
        };
        let mut deadline = false;
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--grace-ms" => a.grace_ms = num(it.next(), arg)?,
                "--deadline-ns" => {
                    a.deadline_ns = num(it.next(), arg)?;
                    deadline = true;
                }
                "--log-max" => a.log_max = num(it.next(), arg)?,
                "--cgroup" => a.cgroup = it.next().map(PathBuf::from),
                "--join" => a
                    .joins
                    .push(PathBuf::from(it.next().ok_or("--join needs a cgroup")?)),
                "--member" => a
                    .members
                    .push(PathBuf::from(it.next().ok_or("--member needs a cgroup")?)),
                "--log" => a.log = it.next().map(PathBuf::from),
                "--uid" => a.uid = Some(id(it.next(), arg)?),
                "--gid" => a.gid = Some(id(it.next(), arg)?),
                "--workdir" => a.workdir = it.next().map(PathBuf::from),
                "--stop-signal" => {
                    let n = num(it.next(), arg)?;
                    a.stop_signal = Some(
                        i32::try_from(n)
                            .ok()
                            .filter(|n| {
                                (1..=64).contains(n) && *n != libc::SIGKILL && *n != libc::SIGSTOP
                            })
                            .ok_or("--stop-signal needs a signal number")?,
                    );
                }
                "--" => {
                    a.program = it.next().ok_or("no program after --")?.clone();
                    a.args = it.cloned().collect();
                    break;
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        if !deadline || a.program.is_empty() || a.uid.is_some() != a.gid.is_some() {
            return Err("usage: leasehold __watchdog --grace-ms N --deadline-ns N [--cgroup DIR] [--join DIR]... [--member DIR]... [--log FILE --log-max BYTES] [--uid N --gid N] [--workdir DIR] [--stop-signal N] -- PROGRAM [ARGS...]".into());
        }
        Ok(a)
    }
}

/// Copies the session's output into its log, rotating at half of `max`
/// (`<log>` becomes `<log>.1`), so the two files never hold more than `max`.
/// It keeps reading whatever happens to the file, so the session never
/// blocks on a full pipe.
fn copy_log(mut from: std::io::PipeReader, path: PathBuf, max: u64) {
    let open = |p: &PathBuf| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .ok()
    };
    let mut file = open(&path);
    let mut size = file
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map_or(0, |m| m.len());
    let half = (max / 2).max(1);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(f) = file.as_mut()
            && f.write_all(&buf[..n]).is_ok()
        {
            size += n as u64;
        }
        if size >= half {
            let mut rotated = path.clone().into_os_string();
            rotated.push(".1");
            let _ = std::fs::rename(&path, rotated);
            file = open(&path);
            size = 0;
        }
    }
}

struct Session {
    me: i32,
    leader: i32,
    pgid: i32,
    leader_status: Option<i32>,
    cgroup: Option<contain::Cgroup>,
    /// The v1 cgroups holding its limits.
    joins: Vec<PathBuf>,
    /// What the kernel counted against its limits, read when it ended.
    events: crate::fleet::limits::enforce::LimitEvents,
}

impl Session {
    fn reap(&mut self) {
        let leader = self.leader;
        let mut got = None;
        contain::reap_all(|pid, st| {
            if pid == leader {
                got = Some(st);
            }
        });
        if got.is_some() {
            self.leader_status = got;
        }
    }

    /// Ends every process of the session: the cgroup first (atomic), then
    /// the sweep of our descendants (whatever left the cgroup, or all of it
    /// without one).
    fn contain(&mut self) {
        if let Some(cg) = &self.cgroup {
            let _ = std::fs::write(cg.path().join("cgroup.kill"), b"1");
        }
        // SAFETY: plain syscall; a negative pid addresses the process group.
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        let leader = self.leader;
        let mut got = None;
        contain::kill_descendants(self.me, 200, |pid, st| {
            if pid == leader {
                got = Some(st);
            }
        });
        if got.is_some() {
            self.leader_status = got;
        }
        // Read before the cgroups go: an out-of-memory kill, forks refused.
        let mut dirs: Vec<&std::path::Path> = self.joins.iter().map(PathBuf::as_path).collect();
        if let Some(cg) = &self.cgroup {
            dirs.push(cg.path());
        }
        self.events = crate::fleet::limits::enforce::limit_events(&dirs);
        if let Some(cg) = &self.cgroup {
            cg.kill_and_remove(Duration::from_secs(2));
        }
        for j in &self.joins {
            crate::fleet::limits::enforce::remove_v1(j);
        }
    }

    fn terminate(&self, signal: i32) {
        // SAFETY: plain syscalls on our own descendants.
        unsafe { libc::kill(-self.pgid, signal) };
        // And whatever left the group (a `setsid` child): once each. A
        // process of the group asked twice would run its handler twice (a
        // shell's trap does).
        for p in contain::descendants(self.me, &contain::scan()) {
            if p.pgid != self.pgid {
                unsafe { libc::kill(p.pid, signal) };
            }
        }
    }
}

/// The watchdog's main: `__watchdog` followed by [`Args::to_argv`].
/// Sets close-on-exec on every descriptor above stderr this process holds
/// (read from /proc/self/fd; best effort: a descriptor that closes meanwhile
/// is skipped). Runs before any thread of ours starts.
fn mark_inherited_cloexec() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for e in dir.flatten() {
        if let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok())
            && fd > 2
        {
            // SAFETY: fcntl on a descriptor number; at worst EBADF.
            unsafe {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 {
                    libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                }
            }
        }
    }
}

pub fn main(argv: &[String]) -> ExitCode {
    let a = match Args::parse(argv) {
        Ok(a) => a,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: __watchdog: {e}");
            return ExitCode::from(2);
        }
    };
    // SAFETY: setsid has no memory-safety preconditions; failure (already a
    // group leader) is harmless.
    unsafe { libc::setsid() };
    contain::become_subreaper();
    let mut deadline = a.deadline_ns;
    if monotonic_ns() >= deadline {
        say("end deadline -1");
        return ExitCode::from(137);
    }
    let cgroup = a.cgroup.clone().map(contain::Cgroup);
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        say("end spawn-failed 127");
        let _ = writeln!(std::io::stderr(), "error: {what}: {e}");
        ExitCode::from(127)
    };
    // Only stdin, stdout and stderr cross into the session. Everything we
    // open is close-on-exec, but what the node's launcher left open
    // without it (a script's `exec 9<secrets`, a supervisor's pipe) passed
    // through the node and here, and would reach the session: mark it so.
    mark_inherited_cloexec();
    let (out_r, out_w) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return fail("session output pipe", &e),
    };
    let leader = {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(&a.program);
        cmd.args(&a.args).stdin(Stdio::null()).process_group(0);
        match (&a.log, out_w.try_clone()) {
            (Some(_), Ok(w2)) => {
                cmd.stdout(out_w).stderr(w2);
            }
            _ => {
                cmd.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        if let Some(cg) = &cgroup
            && let Err(e) = contain::join_before_exec(&mut cmd, cg)
        {
            return fail("session cgroup", &e);
        }
        for j in a.joins.iter().chain(&a.members) {
            if let Err(e) = contain::join_before_exec(&mut cmd, &contain::Cgroup(j.clone())) {
                return fail("session limits cgroup", &e);
            }
        }
        if let Some(w) = &a.workdir {
            cmd.current_dir(w);
        }
        // The session's credentials, after it joined its cgroup (which
        // only root may do) and before the death signal below (a change of
        // credentials clears it). std's own uid/gid run before every
        // pre_exec closure, so they would come before the cgroup; these do
        // the same calls in the order we need. Supplementary groups go
        // first: after setuid they could no longer be dropped.
        if let (Some(uid), Some(gid)) = (a.uid, a.gid) {
            // SAFETY: setgroups, setgid and setuid are async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    let groups = [gid as libc::gid_t];
                    if libc::setgroups(1, groups.as_ptr()) != 0
                        || libc::setgid(gid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // SAFETY: getpid and prctl only; the pid is read before the fork.
        let me = unsafe { libc::getpid() };
        unsafe {
            cmd.pre_exec(move || {
                // Dies with the watchdog, whoever kills it. If it is already
                // gone (between fork and here), go too.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != me {
                    libc::_exit(137);
                }
                // Every signal at its default action: an ignored one
                // survives exec, so a node started by `nohup` or `&` in a
                // script would pass on SIGHUP, SIGINT or SIGQUIT ignored
                // (std resets SIGPIPE alone). signal(2) is async-signal-
                // safe; the numbers it refuses (KILL, STOP, the C
                // library's own) are left as they are.
                for sig in 1..=64 {
                    if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                        libc::signal(sig, libc::SIG_DFL);
                    }
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(c) => c.id() as i32,
            Err(e) => return fail(&format!("cannot start {:?}", a.program), &e),
        }
        // `cmd` (and with it our copies of the pipe's write end) is dropped
        // here, so the copier sees end-of-file once the session's last
        // process closes it.
    };
    // Signalled when the copier has drained the pipe, so the last lines of
    // a session that just ended reach its log before we report the end.
    let (copied_tx, copied) = mpsc::channel::<()>();
    if let Some(log) = a.log.clone() {
        let max = a.log_max;
        std::thread::spawn(move || {
            copy_log(out_r, log, max);
            let _ = copied_tx.send(());
        });
    } else {
        drop(out_r);
        drop(copied_tx);
    }
    say(&format!("pid {leader}"));
    let mut s = Session {
        // SAFETY: getpid cannot fail.
        me: unsafe { libc::getpid() },
        leader,
        pgid: leader,
        leader_status: None,
        cgroup,
        joins: a.joins.clone(),
        events: Default::default(),
    };

    let (tx, rx) = mpsc::channel();
    // The leader's exit wakes the loop at once (its end is the session's,
    // and the node records it as it happens) rather than at the loop's next
    // round. `WNOWAIT` leaves it to `reap`; if `reap` took it first, or
    // anything else fails, the wake is simply early.
    let exited = tx.clone();
    std::thread::spawn(move || {
        loop {
            // SAFETY: a zeroed siginfo_t is a valid out-parameter.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: waitid on our own child, not reaping it.
            let rc = unsafe {
                libc::waitid(
                    libc::P_PID,
                    leader as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            if rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                break;
            }
        }
        let _ = exited.send(Msg::Exited);
    });
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let msg = match line.split_once(' ') {
                Some(("deadline", n)) => n.trim().parse().ok().map(Msg::Deadline),
                _ if line.trim() == "stop" => Some(Msg::Stop),
                _ => None,
            };
            if let Some(m) = msg
                && tx.send(m).is_err()
            {
                return;
            }
        }
        let _ = tx.send(Msg::Gone);
    });

    let finish = |reason: &str, code: i32, ev: crate::fleet::limits::enforce::LimitEvents| {
        // Every process of the session is dead, so the pipe is at its end
        // (bounded: a process we could not kill must not hold us here).
        let _ = copied.recv_timeout(Duration::from_millis(500));
        if ev != Default::default() {
            say(&format!("limit {} {}", ev.oom_kills, ev.forks_refused));
        }
        say(&format!("end {reason} {code}"));
        ExitCode::from(code.clamp(0, 255) as u8)
    };
    loop {
        s.reap();
        if let Some(st) = s.leader_status {
            // The leader exited; the rest of its tree goes with it.
            s.contain();
            return finish("exited", contain::code_of_status(st), s.events);
        }
        let now = monotonic_ns();
        if now >= deadline {
            s.contain();
            return finish("deadline", 137, s.events);
        }
        let wait = Duration::from_nanos((deadline - now).min(20_000_000));
        match rx.recv_timeout(wait) {
            Ok(Msg::Deadline(d)) => deadline = d,
            Ok(Msg::Stop) => {
                s.terminate(a.stop_signal.unwrap_or(libc::SIGTERM));
                // Saturating: a library caller's grace may be any length (the
                // CLI caps it), and the lease deadline bounds the wait anyway.
                let until = monotonic_ns().saturating_add(a.grace_ms.saturating_mul(1_000_000));
                loop {
                    s.reap();
                    // The lease deadline still binds during a graceful stop,
                    // as the node goes on announcing it: a grace longer
                    // than one renewal's validity is cut only if the lease
                    // is (it read no announcement here, so every grace
                    // ended at the validity announced before the stop).
                    let now = monotonic_ns();
                    if s.leader_status.is_some() || now >= until || now >= deadline {
                        s.contain();
                        let code = s.leader_status.map_or(137, contain::code_of_status);
                        return finish("stopped", code, s.events);
                    }
                    match rx.recv_timeout(Duration::from_millis(10)) {
                        Ok(Msg::Deadline(d)) => deadline = d,
                        Ok(Msg::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                            s.contain();
                            return finish("node-gone", 137, s.events);
                        }
                        Ok(Msg::Stop | Msg::Exited) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                    }
                }
            }
            Ok(Msg::Exited) => {} // reaped at the top of the loop
            Ok(Msg::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                s.contain();
                return finish("node-gone", 137, s.events);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_round_trips_and_bad_argv_is_refused() {
        let a = Args {
            grace_ms: 500,
            deadline_ns: 42,
            cgroup: Some("/sys/fs/cgroup/x".into()),
            joins: vec![
                "/sys/fs/cgroup/memory/a".into(),
                "/sys/fs/cgroup/pids/a".into(),
            ],
            members: vec!["/sys/fs/cgroup/x/y".into()],
            log: Some("/tmp/web.log".into()),
            log_max: 1024,
            uid: Some(65534),
            gid: Some(65534),
            workdir: Some("/srv/web".into()),
            stop_signal: Some(libc::SIGINT),
            program: "sh".into(),
            args: vec!["-c".into(), "--grace-ms".into()],
        };
        assert_eq!(Args::parse(&a.to_argv()).unwrap(), a);
        assert!(Args::parse(&["--grace-ms".into(), "x".into()]).is_err());
        assert!(Args::parse(&["--grace-ms".into(), "1".into()]).is_err());
        assert!(Args::parse(&["--bogus".into()]).is_err());
        // A uid without its gid (or the other way round) is refused.
        let mut half: Vec<String> = ["--deadline-ns", "42", "--uid", "65534", "--", "sh"]
            .map(String::from)
            .to_vec();
        assert!(Args::parse(&half).is_err());
        half[2] = "--gid".into();
        assert!(Args::parse(&half).is_err());
        // A grace too long for nanoseconds in a u64 parses (the stop's
        // deadline saturates: see `run`), rather than failing the session.
        let long = Args {
            grace_ms: u64::MAX,
            ..a.clone()
        };
        assert_eq!(Args::parse(&long.to_argv()).unwrap(), long);
    }
}
