//! Enforcing a session's limits on this host, through cgroups.
//!
//! Each controller (memory, cpu, pids) is taken from the first place that
//! works, found once when the runner is made:
//!
//! - **cgroup v2**: the session's own cgroup (the one that contains it, see
//!   [`crate::fleet::contain`]), when the controller can be enabled in the
//!   runner's cgroup root (`+memory` in its `cgroup.subtree_control`: the
//!   node's cgroup must delegate it);
//! - **cgroup v1**: a hierarchy mounted with that controller (hybrid hosts,
//!   where the controllers stay bound to v1 and the v2 tree has none), in a
//!   cgroup per run under `<the node's cgroup there>/leasehold-<pid>-<n>`,
//!   which the session's first process joins before exec as it joins its
//!   v2 cgroup.
//!
//! A controller found nowhere is a limit this node cannot enforce: the
//! session is not started here, and its reason says so ([`Enforcer::admit`]).
//! A node that contains sessions by the subreaper sweep alone
//! (`--containment subreaper`) enforces no limit.
//!
//! After a run, the watchdog reads what the kernel counted (an out-of-memory
//! kill, forks refused at the pids limit) before it removes the cgroups, and
//! reports it: the session's reason then says `memory limit` or
//! `pids limit` ([`limit_events`]).

use super::{Limits, format_bytes, format_cpu};
use std::path::{Path, PathBuf};

/// A controller a limit needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    Memory,
    Cpu,
    Pids,
}

impl Controller {
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Pids => "pids",
        }
    }
}

/// Where one controller is enforced.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Place {
    /// In the session's v2 cgroup.
    V2,
    /// In a per-run cgroup under this directory of a v1 hierarchy.
    V1(PathBuf),
}

/// What this host can enforce, and how big it is.
#[derive(Debug, Default)]
pub struct Enforcer {
    memory: Option<Place>,
    cpu: Option<Place>,
    pids: Option<Place>,
    /// Why nothing is enforced, when that is the node's choice
    /// (`--containment subreaper`).
    off: Option<&'static str>,
    host: Host,
}

/// The host's size, which a limit must not exceed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Host {
    pub memory: Option<u64>,
    pub cpus: u32,
    pub pid_max: Option<u32>,
}

impl Host {
    pub fn read() -> Host {
        let memory = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kib| kib * 1024)
        });
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1);
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse().ok());
        Host {
            memory,
            cpus,
            pid_max,
        }
    }
}

impl Enforcer {
    /// Enforces nothing: every limit is refused with `why`.
    pub fn off(why: &'static str) -> Enforcer {
        Enforcer {
            memory: None,
            cpu: None,
            pids: None,
            off: Some(why),
            host: Host::read(),
        }
    }

    /// Finds where each controller can be enforced. `v2_root` is the
    /// runner's v2 cgroup root (its session cgroups are made under it),
    /// when it has one; `n` tells this runner's v1 roots from another's in
    /// the same process.
    pub fn discover(v2_root: Option<&Path>, n: u32) -> Enforcer {
        let mut e = Enforcer {
            memory: None,
            cpu: None,
            pids: None,
            off: None,
            host: Host::read(),
        };
        let v1 = V1Hierarchies::read();
        for c in [Controller::Memory, Controller::Cpu, Controller::Pids] {
            let place = v2_root
                .filter(|r| enable_v2(r, c))
                .map(|_| Place::V2)
                .or_else(|| v1.runner_root(c, n).map(Place::V1));
            match c {
                Controller::Memory => e.memory = place,
                Controller::Cpu => e.cpu = place,
                Controller::Pids => e.pids = place,
            }
        }
        e
    }

    fn place(&self, c: Controller) -> Option<&Place> {
        match c {
            Controller::Memory => self.memory.as_ref(),
            Controller::Cpu => self.cpu.as_ref(),
            Controller::Pids => self.pids.as_ref(),
        }
    }

    /// What `node status` shows: `memory (v1), cpu (v1), pids (v1)`, or
    /// `none`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = [Controller::Memory, Controller::Cpu, Controller::Pids]
            .into_iter()
            .filter_map(|c| {
                self.place(c).map(|p| {
                    format!(
                        "{} ({})",
                        c.name(),
                        if *p == Place::V2 { "v2" } else { "v1" }
                    )
                })
            })
            .collect();
        if parts.is_empty() {
            "none".into()
        } else {
            parts.join(", ")
        }
    }

    /// Whether this node can run a session with these limits: every limit
    /// it sets has a controller here, and none exceeds the host. The error
    /// is the session's reason (the node adds its own name).
    pub fn admit(&self, l: &Limits) -> std::result::Result<(), String> {
        let wanted = [
            (Controller::Memory, l.memory.is_some()),
            (Controller::Cpu, l.cpu.is_some()),
            (Controller::Pids, l.pids.is_some()),
        ];
        for (c, set) in wanted {
            if !set {
                continue;
            }
            if let Some(why) = self.off {
                return Err(format!("cannot enforce its {} limit: {why}", c.name()));
            }
            if self.place(c).is_none() {
                return Err(format!(
                    "cannot enforce its {} limit: no cgroup {} controller is delegated to this node \
                     (cgroup v2: enable it in the node's cgroup; or a v1 hierarchy with it)",
                    c.name(),
                    c.name()
                ));
            }
        }
        if let (Some(m), Some(host)) = (l.memory, self.host.memory)
            && m > host
        {
            return Err(format!(
                "memory limit {} is above this host's {}",
                format_bytes(m),
                format_bytes(host)
            ));
        }
        if let Some(c) = l.cpu
            && c > self.host.cpus * 1000
        {
            return Err(format!(
                "cpu limit {} is above this host's {} CPUs",
                format_cpu(c),
                self.host.cpus
            ));
        }
        if let (Some(p), Some(max)) = (l.pids, self.host.pid_max)
            && p > max
        {
            return Err(format!("pids limit {p} is above this host's pid_max {max}"));
        }
        Ok(())
    }

    /// Applies `l` to one run: writes each limit into the session's v2
    /// cgroup (`v2_session`) or a new v1 cgroup named `tag`. Returns the v1
    /// cgroups the session must join. `admit` must have passed.
    pub fn apply(
        &self,
        l: &Limits,
        v2_session: Option<&Path>,
        tag: &str,
    ) -> std::io::Result<RunCgroups> {
        let mut run = RunCgroups::default();
        let mut dir_for = |c: Controller| -> std::io::Result<PathBuf> {
            match self.place(c) {
                Some(Place::V2) => v2_session.map(Path::to_path_buf).ok_or_else(|| {
                    std::io::Error::other("the session has no v2 cgroup for its limits")
                }),
                Some(Place::V1(root)) => {
                    // Controllers mounted together share one hierarchy,
                    // and so one cgroup for the run.
                    let d = root.join(tag);
                    if !run.v1.contains(&d) {
                        std::fs::create_dir(&d)?;
                        run.v1.push(d.clone());
                    }
                    Ok(d)
                }
                None => Err(std::io::Error::other(format!(
                    "no {} controller here",
                    c.name()
                ))),
            }
        };
        let result = (|| {
            if let Some(m) = l.memory {
                let d = dir_for(Controller::Memory)?;
                if self.memory == Some(Place::V2) {
                    write(&d, "memory.max", &m.to_string())?;
                    // No swap beyond the limit, where swap is accounted.
                    let _ = std::fs::write(d.join("memory.swap.max"), "0");
                } else {
                    write(&d, "memory.limit_in_bytes", &m.to_string())?;
                    // memsw (memory + swap) must be at least the limit;
                    // equal to it means no swap. Absent without swap
                    // accounting.
                    if d.join("memory.memsw.limit_in_bytes").exists() {
                        write(&d, "memory.memsw.limit_in_bytes", &m.to_string())?;
                    }
                }
            }
            if let Some(c) = l.cpu {
                let d = dir_for(Controller::Cpu)?;
                // A quota per 100 ms period: 1000 millicores = 100 ms.
                let quota = u64::from(c) * 100;
                if self.cpu == Some(Place::V2) {
                    write(&d, "cpu.max", &format!("{quota} 100000"))?;
                } else {
                    write(&d, "cpu.cfs_period_us", "100000")?;
                    write(&d, "cpu.cfs_quota_us", &quota.to_string())?;
                }
            }
            if let Some(p) = l.pids {
                let d = dir_for(Controller::Pids)?;
                write(&d, "pids.max", &p.to_string())?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => Ok(run),
            Err(e) => {
                run.remove();
                Err(e)
            }
        }
    }
}

fn write(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{file}: {e}")))
}

/// Tries to enable controller `c` for the cgroups under `root` (v2).
fn enable_v2(root: &Path, c: Controller) -> bool {
    let available = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
    if !available.split_whitespace().any(|x| x == c.name()) {
        return false;
    }
    std::fs::write(
        root.join("cgroup.subtree_control"),
        format!("+{}", c.name()),
    )
    .is_ok()
}

/// The v1 cgroups of one run, made by [`Enforcer::apply`].
#[derive(Debug, Default, Clone)]
pub struct RunCgroups {
    /// The v1 cgroups the session joins (none where everything is v2).
    pub v1: Vec<PathBuf>,
}

impl RunCgroups {
    /// Kills what is left in them and removes them (best effort: a
    /// leftover is swept when the node starts again).
    pub fn remove(&self) {
        for d in &self.v1 {
            remove_v1(d);
        }
    }
}

/// Kills every process in v1 cgroup `d` and removes it, trying for up to
/// about a second (a killed process leaves its cgroup when it is reaped).
pub fn remove_v1(d: &Path) {
    for _ in 0..500 {
        if !d.exists() || std::fs::remove_dir(d).is_ok() {
            return;
        }
        if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                if pid > 1 {
                    // SAFETY: plain syscall on a process of a session's
                    // cgroup, which only sessions join.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// What the kernel counted in a run's cgroups, read by the watchdog before
/// it removes them: whether the out-of-memory killer struck, and how many
/// forks the pids limit refused.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LimitEvents {
    pub oom_kills: u64,
    pub forks_refused: u64,
}

/// Reads the counters of `dirs` (a v2 session cgroup and any v1 ones):
/// `memory.events` (v2) or `memory.oom_control` (v1) `oom_kill N`, and
/// `pids.events` `max N` (both).
pub fn limit_events(dirs: &[&Path]) -> LimitEvents {
    let mut ev = LimitEvents::default();
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == name).then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0)
    };
    for d in dirs {
        for f in ["memory.events", "memory.oom_control"] {
            if let Ok(t) = std::fs::read_to_string(d.join(f)) {
                ev.oom_kills += field(&t, "oom_kill");
            }
        }
        if let Ok(t) = std::fs::read_to_string(d.join("pids.events")) {
            ev.forks_refused += field(&t, "max");
        }
    }
    ev
}

/// The v1 hierarchies mounted here: (controllers, mount point, mount root).
struct V1Hierarchies {
    mounts: Vec<(Vec<String>, PathBuf, String)>,
    /// `/proc/self/cgroup`: (controllers, path) per hierarchy.
    own: Vec<(Vec<String>, String)>,
}

impl V1Hierarchies {
    fn read() -> V1Hierarchies {
        Self::parse(
            &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
            &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
        )
    }

    fn parse(mountinfo: &str, cgroup: &str) -> V1Hierarchies {
        let mounts = mountinfo
            .lines()
            .filter_map(|l| {
                let (pre, post) = l.split_once(" - ")?;
                let mut post = post.split_whitespace();
                if post.next()? != "cgroup" {
                    return None;
                }
                let opts = post.nth(1)?;
                let mut pre = pre.split_whitespace();
                let root = pre.nth(3)?.to_string();
                let point = PathBuf::from(pre.next()?);
                Some((opts.split(',').map(str::to_string).collect(), point, root))
            })
            .collect();
        let own = cgroup
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ':');
                let _id = f.next()?;
                let ctrls = f.next()?;
                let path = f.next()?;
                (!ctrls.is_empty()).then(|| {
                    (
                        ctrls.split(',').map(str::to_string).collect(),
                        path.to_string(),
                    )
                })
            })
            .collect();
        V1Hierarchies { mounts, own }
    }

    /// The node's own cgroup in the v1 hierarchy of `c`, as a directory.
    fn own_dir(&self, c: Controller) -> Option<PathBuf> {
        let (_, point, root) = self
            .mounts
            .iter()
            .find(|(opts, _, _)| opts.iter().any(|o| o == c.name()))?;
        let (_, path) = self
            .own
            .iter()
            .find(|(ctrls, _)| ctrls.iter().any(|x| x == c.name()))?;
        // The mount may show only part of the hierarchy (a container's
        // namespace): our path is relative to its root.
        let rel = path.strip_prefix(root.as_str()).unwrap_or(path);
        Some(point.join(rel.trim_start_matches('/')))
    }

    /// Makes (or reuses) `<own dir>/leasehold-<pid>-<n>` for `c`, after
    /// sweeping the roots of dead nodes there. None where it cannot.
    fn runner_root(&self, c: Controller, n: u32) -> Option<PathBuf> {
        let base = self.own_dir(c)?;
        sweep_stale_in(&base);
        let dir = base.join(format!("leasehold-{}-{n}", std::process::id()));
        if std::fs::create_dir(&dir).is_err() && !dir.is_dir() {
            return None;
        }
        // Proves it usable: a v1 cgroup's limit files appear on creation.
        let probe = match c {
            Controller::Memory => "memory.limit_in_bytes",
            Controller::Cpu => "cpu.cfs_quota_us",
            Controller::Pids => "pids.max",
        };
        let trial = dir.join("trial");
        let ok = std::fs::create_dir(&trial).is_ok() && trial.join(probe).exists();
        let _ = std::fs::remove_dir(&trial);
        if !ok {
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(dir)
    }
}

/// Removes `leasehold-<pid>-*` roots under `base` whose process is dead,
/// killing what is left in their run cgroups.
fn sweep_stale_in(base: &Path) {
    crate::fleet::contain::sweep_dead_roots(base, remove_v1);
}

/// Removes a runner's v1 roots (at drop; empty by then unless runs are
/// still being torn down, which the next start sweeps).
impl Drop for Enforcer {
    fn drop(&mut self) {
        for p in [&self.memory, &self.cpu, &self.pids].into_iter().flatten() {
            if let Place::V1(d) = p {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 /outer /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    const CGROUP: &str = "\
8:pids:/
4:memory:/outer/api/x
1:cpu:/
0::/";

    #[test]
    fn finds_each_controller_in_its_v1_hierarchy() {
        let h = V1Hierarchies::parse(MOUNTINFO, CGROUP);
        assert_eq!(
            h.own_dir(Controller::Memory),
            Some(PathBuf::from("/sys/fs/cgroup/memory/api/x")),
            "the mount's root is stripped from our path"
        );
        assert_eq!(
            h.own_dir(Controller::Cpu),
            Some(PathBuf::from("/sys/fs/cgroup/cpu"))
        );
        assert_eq!(
            h.own_dir(Controller::Pids),
            Some(PathBuf::from("/sys/fs/cgroup/pids"))
        );
        // cgroup2 is not a v1 hierarchy, and cpuacct is not cpu.
        let only_v2 = V1Hierarchies::parse(
            "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n33 31 0:30 / /a rw - cgroup cgroup rw,cpuacct",
            "0::/x\n2:cpuacct:/",
        );
        assert_eq!(only_v2.own_dir(Controller::Memory), None);
        assert_eq!(only_v2.own_dir(Controller::Cpu), None);
    }

    #[test]
    fn a_node_refuses_limits_it_cannot_enforce_or_its_host_cannot_hold() {
        let off = Enforcer::off("this node runs --containment subreaper");
        let l = Limits {
            memory: Some(64 << 20),
            ..Limits::default()
        };
        let e = off.admit(&l).unwrap_err();
        assert!(e.contains("memory limit") && e.contains("subreaper"), "{e}");
        assert!(
            off.admit(&Limits::default()).is_ok(),
            "no limit, nothing to enforce"
        );

        let none = Enforcer {
            memory: None,
            cpu: None,
            pids: None,
            off: None,
            host: Host {
                memory: Some(1 << 30),
                cpus: 2,
                pid_max: Some(1000),
            },
        };
        let e = none
            .admit(&Limits {
                pids: Some(5),
                ..Limits::default()
            })
            .unwrap_err();
        assert!(e.contains("pids limit") && e.contains("controller"), "{e}");

        let all = Enforcer {
            memory: Some(Place::V2),
            cpu: Some(Place::V2),
            pids: Some(Place::V2),
            off: None,
            host: none.host,
        };
        assert!(
            all.admit(&Limits {
                memory: Some(1 << 30),
                cpu: Some(2000),
                pids: Some(1000)
            })
            .is_ok()
        );
        for (l, words) in [
            (
                Limits {
                    memory: Some(2 << 30),
                    ..Limits::default()
                },
                "memory limit 2 GiB is above this host's 1 GiB",
            ),
            (
                Limits {
                    cpu: Some(2500),
                    ..Limits::default()
                },
                "cpu limit 2500m is above this host's 2 CPUs",
            ),
            (
                Limits {
                    pids: Some(1001),
                    ..Limits::default()
                },
                "pids limit 1001 is above this host's pid_max 1000",
            ),
        ] {
            assert_eq!(all.admit(&l).unwrap_err(), words);
        }
        assert_eq!(all.describe(), "memory (v2), cpu (v2), pids (v2)");
        assert_eq!(none.describe(), "none");
    }

    #[test]
    fn counters_are_read_from_either_version() {
        let d = tempfile::tempdir().unwrap();
        let v2 = d.path().join("v2");
        let v1 = d.path().join("v1");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(
            v2.join("memory.events"),
            "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n",
        )
        .unwrap();
        std::fs::write(
            v1.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        std::fs::write(v1.join("pids.events"), "max 7\n").unwrap();
        let ev = limit_events(&[&v2, &v1]);
        assert_eq!(
            ev,
            LimitEvents {
                oom_kills: 3,
                forks_refused: 7
            }
        );
        assert_eq!(limit_events(&[d.path()]), LimitEvents::default());
    }
}
