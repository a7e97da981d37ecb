//! Containment of a session's whole process tree: the pieces the watchdog
//! and the node share.
//!
//! A session may fork, double-fork, `setsid`, or kill its own watchdog. None
//! of that may let a process of it outlive its lease. Two mechanisms, used
//! together where the host allows:
//!
//! - **cgroup v2** (where a writable cgroup2 hierarchy is found): the node
//!   makes one cgroup per session run and the session's first process joins
//!   it before `exec`; every descendant is born inside it, whatever it does
//!   with sessions or process groups, and `cgroup.kill` ends them all at once.
//! - **subreaper and sweep** (always): the watchdog is a child subreaper, so
//!   orphans of the session re-parent to it instead of init, and the sweep
//!   SIGSTOPs then SIGKILLs every descendant, round after round, until none is
//!   left. The node is a subreaper too: if a watchdog is killed, what it
//!   leaves re-parents to the node, which kills every adopted child that is
//!   not in its own session (every session process is: the watchdog calls
//!   `setsid`, and nothing can join the node's session again).
//!
//! Limits (docs/fleet.md): without cgroups a fork bomb races the sweep (it
//! stops when no descendant is left, bounded in rounds), and a process that
//! was handed to another subreaper by a sibling (or ptrace tricks) is out of
//! reach; with cgroups a root session can move itself to another cgroup.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One line of `/proc/<pid>/stat`, the fields the sweep needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    pub zombie: bool,
    /// Stopped by a signal (state T) or a tracer (t).
    pub stopped: bool,
}

/// Parses `/proc/<pid>/stat`. The command name is in parentheses and may
/// itself contain spaces and parentheses, so fields are read after the last
/// `)`.
pub fn parse_stat(s: &str) -> Option<ProcInfo> {
    let open = s.find(" (")?;
    let pid = s[..open].trim().parse().ok()?;
    let close = s.rfind(')')?;
    let mut f = s.get(close + 1..)?.split_whitespace();
    let state = f.next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok()?;
    let sid = f.next()?.parse().ok()?;
    Some(ProcInfo {
        pid,
        ppid,
        pgid,
        sid,
        zombie: state == "Z" || state == "X",
        stopped: state == "T" || state == "t",
    })
}

/// `/proc/<pid>/stat` of one process, if it exists.
pub fn stat(pid: i32) -> Option<ProcInfo> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process visible in `/proc`. Processes that vanish while being read
/// are skipped.
pub fn scan() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let name = e.file_name();
        let name = name.to_str()?;
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let s = std::fs::read_to_string(format!("/proc/{name}/stat")).ok()?;
        parse_stat(&s)
    })
    .collect()
}

/// The descendants of `root` in `procs` (not `root` itself), parents first.
pub fn descendants(root: i32, procs: &[ProcInfo]) -> Vec<ProcInfo> {
    let mut kids: HashMap<i32, Vec<ProcInfo>> = HashMap::new();
    for p in procs {
        kids.entry(p.ppid).or_default().push(*p);
    }
    let mut out = Vec::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        if let Some(ks) = kids.get(&p) {
            for k in ks {
                if k.pid != root && !out.iter().any(|o: &ProcInfo| o.pid == k.pid) {
                    out.push(*k);
                    todo.push(k.pid);
                }
            }
        }
    }
    out
}

fn kill(pid: i32, sig: i32) {
    if pid > 1 {
        // SAFETY: plain syscall on a pid we found as our descendant.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Reaps every exited child of this process without blocking, passing each
/// (pid, wait status) to `seen`. Only for a process that owns all of its
/// children's statuses (the watchdog): the node reaps by pid instead.
pub fn reap_all(mut seen: impl FnMut(i32, i32)) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid pointer; WNOHANG never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        seen(pid, status);
    }
}

/// Kills every descendant of `root` (this process, a subreaper): each round
/// stops them all first (so none can fork while its siblings die), then
/// kills them, reaps what re-parented to us, and looks again, until a scan
/// finds none alive or `max_rounds` passed. Returns how many it signalled.
pub fn kill_descendants(root: i32, max_rounds: u32, mut reaped: impl FnMut(i32, i32)) -> usize {
    let mut signalled = 0;
    for round in 0..max_rounds {
        let live: Vec<ProcInfo> = descendants(root, &scan())
            .into_iter()
            .filter(|p| !p.zombie)
            .collect();
        if live.is_empty() {
            reap_all(&mut reaped);
            return signalled;
        }
        for p in &live {
            kill(p.pid, libc::SIGSTOP);
        }
        for p in &live {
            kill(p.pid, libc::SIGKILL);
        }
        signalled += live.len();
        reap_all(&mut reaped);
        if round > 2 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    signalled
}

/// The exit code a wait status stands for (128 + signal when killed).
pub fn code_of_status(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        137
    }
}

/// How a node contains its sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A cgroup v2 where one can be made, else the subreaper sweep.
    #[default]
    Auto,
    /// Refuse to run without a writable cgroup v2 hierarchy.
    Cgroup,
    /// The subreaper sweep only.
    Subreaper,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "cgroup" => Ok(Mode::Cgroup),
            "subreaper" => Ok(Mode::Subreaper),
            _ => Err(format!("{s:?} is not one of auto, cgroup, subreaper")),
        }
    }
}

/// The cgroup v2 directory this process runs in, if a cgroup2 hierarchy is
/// mounted: the cgroup2 mount point (from `/proc/self/mountinfo`) joined
/// with our path in it (the `0::` line of `/proc/self/cgroup`).
pub fn own_cgroup() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
    })?;
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

/// A cgroup v2 directory that holds one session run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup(pub PathBuf);

impl Cgroup {
    pub fn create(path: PathBuf) -> std::io::Result<Cgroup> {
        std::fs::create_dir(&path)?;
        Ok(Cgroup(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Whether any process is still in it (`populated 1` in cgroup.events).
    /// An unreadable file counts as empty: the cgroup is gone.
    pub fn populated(&self) -> bool {
        std::fs::read_to_string(self.0.join("cgroup.events"))
            .map(|s| s.lines().any(|l| l.trim() == "populated 1"))
            .unwrap_or(false)
    }

    /// SIGKILLs every process in it (`cgroup.kill`, Linux 5.14+), waits up
    /// to `wait` for it to empty, and removes it. Returns whether it is gone.
    pub fn kill_and_remove(&self, wait: Duration) -> bool {
        if !self.0.exists() {
            return true;
        }
        let _ = std::fs::write(self.0.join("cgroup.kill"), b"1");
        let step = Duration::from_millis(2);
        let mut waited = Duration::ZERO;
        while self.populated() && waited < wait {
            std::thread::sleep(step);
            waited += step;
        }
        std::fs::remove_dir(&self.0).is_ok() || !self.0.exists()
    }
}

/// Where a runner makes its per-session cgroups: `<own cgroup>/leasehold-
/// <pid>-<n>`. Made by [`CgroupRoot::new`]; stale ones of dead processes are
/// swept first (their sessions killed), so a node SIGKILLed together with a
/// watchdog leaves nothing running past the next start.
#[derive(Debug)]
pub struct CgroupRoot {
    dir: PathBuf,
}

impl CgroupRoot {
    /// Makes the root and proves a process can be moved into a cgroup under
    /// it (spawns `true` into a trial cgroup). None where this host does not
    /// allow it (no cgroup2 mount, no write access, or a delegation that
    /// refuses moves).
    pub fn new(n: u32) -> Option<CgroupRoot> {
        let base = own_cgroup()?;
        sweep_stale(&base);
        let dir = base.join(format!("leasehold-{}-{n}", std::process::id()));
        if std::fs::create_dir(&dir).is_err() && !dir.is_dir() {
            return None;
        }
        let root = CgroupRoot { dir };
        let trial = Cgroup::create(root.dir.join("trial")).ok()?;
        let ok = spawn_into(&trial, "true").is_ok();
        trial.kill_and_remove(Duration::from_secs(1));
        if !ok {
            let _ = std::fs::remove_dir(&root.dir);
            return None;
        }
        Some(root)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        // Empty by now unless sessions are still being torn down; a leftover
        // is swept at the next start.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn spawn_into(cg: &Cgroup, program: &str) -> std::io::Result<()> {
    let mut cmd = std::process::Command::new(program);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    join_before_exec(&mut cmd, cg)?;
    cmd.spawn()?.wait()?;
    Ok(())
}

/// Makes the command's process join `cg` between fork and exec, so it and
/// everything it ever starts is inside it. Fails the spawn if the move is
/// refused.
pub fn join_before_exec(cmd: &mut std::process::Command, cg: &Cgroup) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let procs: OwnedFd = std::fs::OpenOptions::new()
        .write(true)
        .open(cg.0.join("cgroup.procs"))?
        .into();
    // SAFETY: the closure only calls write(2) on an fd opened above (kept
    // alive by the closure) and reads errno: async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let fd = procs.as_raw_fd();
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Removes `leasehold-<pid>-*` roots under `base` whose process is dead,
/// killing whatever is left in their session cgroups.
fn sweep_stale(base: &Path) {
    sweep_dead_roots(base, |run| {
        Cgroup(run.to_path_buf()).kill_and_remove(Duration::from_secs(1));
    });
}

/// For each `leasehold-<pid>-*` directory under `base` whose process is
/// dead (a node that left its cgroup roots behind): `remove` each run
/// directory in it, then the root itself. The v2 roots (here) and the v1
/// limit roots (`limits::enforce`) are swept by it.
pub(crate) fn sweep_dead_roots(base: &Path, mut remove: impl FnMut(&Path)) {
    let Ok(dir) = std::fs::read_dir(base) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("leasehold-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(runs) = std::fs::read_dir(e.path()) {
            for r in runs.flatten() {
                if r.path().is_dir() {
                    remove(&r.path());
                }
            }
        }
        let _ = std::fs::remove_dir(e.path());
    }
}

/// Makes this process a child subreaper: orphaned descendants re-parent to
/// it, not to init, so a sweep can still find them.
pub fn become_subreaper() -> bool {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_hostile_command_names() {
        let p = parse_stat("123 (a) b (c) S 1 5 6 0 -1").unwrap();
        assert_eq!(
            p,
            ProcInfo {
                pid: 123,
                ppid: 1,
                pgid: 5,
                sid: 6,
                zombie: false,
                stopped: false
            }
        );
        assert!(parse_stat("9 (x) Z 2 3 4").unwrap().zombie);
        assert!(parse_stat("9 (x) T 2 3 4").unwrap().stopped);
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x)"), None);
    }

    #[test]
    fn descendants_follow_the_tree_only() {
        let p = |pid, ppid| ProcInfo {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            zombie: false,
            stopped: false,
        };
        let procs = [p(10, 1), p(11, 10), p(12, 11), p(13, 1), p(14, 12)];
        let mut d: Vec<i32> = descendants(10, &procs).iter().map(|p| p.pid).collect();
        d.sort();
        assert_eq!(d, vec![11, 12, 14]);
        assert!(descendants(13, &procs).is_empty());
    }
}
