//! A session's `limits: {memory, cpu, pids}`, with real node and session
//! processes: enforced through the session's cgroups where the node can
//! (cgroup v2 controllers, or v1 hierarchies on a hybrid host as CI's), the
//! limit that ended a run named in its reason; refused with a reason where
//! the node cannot enforce them (`--containment subreaper`) or its host
//! cannot hold them; refused by `apply` where no host could.
//!
//! They need a node running as root that can make cgroups with these
//! controllers (CI can); elsewhere they say so and pass only outside
//! `scripts/test`.

mod common;

use common::procs::*;
use leasehold::fleet::claim::ClaimState;
use std::time::Duration;

/// Whether this host gives a root node the memory, cpu and pids
/// controllers: asks a runner made as `node run` makes it.
fn limits_here() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let all = root
        && leasehold::fleet::runner::ExecRunner::new(
            "/bin/true".into(),
            std::sync::Arc::new(leasehold::clock::SystemClock::new()),
            Duration::from_secs(1),
        )
        .with_containment(leasehold::fleet::contain::Mode::Auto)
        .is_ok_and(|r| r.enforced_limits().matches('(').count() == 3);
    if !all {
        assert!(
            std::env::var_os("LEASEHOLD_REQUIRE_SERVERS").is_none(),
            "scripts/test runs as root on a host with cgroup controllers: these tests need them"
        );
        eprintln!("skipped: not root, or no cgroup memory/cpu/pids controllers");
        return false;
    }
    true
}

/// The most times the kernel throttled the CPU of `pid`'s cgroups (v1 cpu
/// hierarchy or v2), if any of them has a CPU limit's counters.
fn throttled(pid: i32) -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount_of = |want: &dyn Fn(&str, &str) -> bool| {
        info.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split_whitespace();
            let fstype = post.next()?;
            let opts = post.nth(1)?;
            want(fstype, opts).then(|| pre.split_whitespace().nth(4).map(str::to_string))?
        })
    };
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    cg.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
            let mount = if ctrl.is_empty() {
                mount_of(&|t, _| t == "cgroup2")?
            } else if ctrl.split(',').any(|c| c == "cpu") {
                mount_of(&|t, o| t == "cgroup" && o.split(',').any(|c| c == "cpu"))?
            } else {
                return None;
            };
            let stat = std::fs::read_to_string(format!("{mount}{path}/cpu.stat")).ok()?;
            stat.lines()
                .find_map(|l| l.strip_prefix("nr_throttled "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .max()
}

fn processes_named(pattern: &str) -> usize {
    let o = std::process::Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).lines().count()
}

/// CPU time (user + system, in clock ticks) of a process.
fn cpu_ticks(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14, stime 15 (1-based).
    let n = |i: usize| {
        f.get(i - 3)
            .and_then(|x| x.parse::<u64>().ok())
            .unwrap_or(0)
    };
    n(14) + n(15)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_enforced_and_the_limit_that_ended_a_run_is_its_reason() {
    if !limits_here() {
        return;
    }
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    // Memory: a string that doubles until it cannot.
    env.apply_spec(
        "hog",
        serde_json::json!({
            "command": "awk", "args": ["BEGIN { s = \"x\"; while (1) s = s s }"],
            "restart": "never", "limits": {"memory": "32Mi"}
        }),
    );
    // Pids: a fork loop that goes on forking (bash retries a refused
    // fork, then carries on).
    env.apply_spec(
        "forker",
        serde_json::json!({
            "command": "bash", "args": ["-c", format!("echo $$ > {d}/forker.pid; while :; do sleep 3131 & done")],
            "restart": "never", "limits": {"pids": 8}
        }),
    );
    // CPU: a busy loop held to a tenth of a core.
    env.apply_spec(
        "spinner",
        serde_json::json!({
            "command": "sh", "args": ["-c", format!("echo $$ > {d}/spinner.pid; while :; do :; done")],
            "restart": "never", "limits": {"cpu": "100m"}
        }),
    );
    wait_until("hog ended", Duration::from_secs(30), async || {
        claim(&s, "hog")
            .await
            .is_some_and(|c| c.state == ClaimState::Failed)
    })
    .await;
    let c = claim(&s, "hog").await.unwrap();
    let reason = c.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("memory limit 32 MiB reached"),
        "{c:?}\n{}",
        log_of(&n1)
    );
    assert_eq!(c.exit_code, Some(137), "killed by the kernel");

    wait_until(
        "the fork loop and the spinner run",
        Duration::from_secs(30),
        async || env.pid("forker.pid").is_some() && env.pid("spinner.pid").is_some(),
    )
    .await;
    let spinner = env.pid("spinner.pid").unwrap();
    let (lease_before, v_before) = node_record(&s, "n1").await.unwrap();
    let before = cpu_ticks(spinner);
    let mut most = 0;
    for _ in 0..30 {
        pause(100).await;
        most = most.max(processes_named("^sleep 3131"));
    }
    let used = cpu_ticks(spinner) - before;
    // 3 s at a tenth of a core is 30 ticks (at 100 Hz); unlimited it
    // would be up to 300. The kernel's own count says it was throttled.
    assert!(used < 120, "the spinner used {used} ticks in 3 s");
    let t = throttled(spinner);
    assert!(
        t.is_some_and(|t| t > 0),
        "the spinner's cgroup was never throttled: {t:?}"
    );
    // The fork loop is held at its limit (the shell counts as one of the
    // 8), and the node keeps its lease all along.
    assert!(most > 0, "the fork loop started nothing");
    assert!(most <= 7, "{most} sleeps at once under a pids limit of 8");
    for name in ["forker", "spinner"] {
        let c = claim(&s, name).await.unwrap();
        assert_eq!(c.state, ClaimState::Running, "{name}: {c:?}");
    }
    let (lease_after, v_after) = node_record(&s, "n1").await.unwrap();
    assert_eq!(
        lease_after.holder.instance, lease_before.holder.instance,
        "n1 keeps its lease"
    );
    assert_ne!(v_after, v_before, "n1 renewed its lease meanwhile");
    assert!(
        !log_of(&n1).contains("lost"),
        "the node lost something: {}",
        log_of(&n1)
    );
    // `describe` shows the limits as the spec meant them.
    let o = bin()
        .args(["describe", "hog", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Limits:   memory 32 MiB"), "{out}");
    assert!(out.contains("memory limit 32 MiB reached"), "{out}");
    drop(n1);
    wait_until(
        "the fork loop is gone",
        Duration::from_secs(10),
        async || processes_named("^sleep 3131") == 0,
    )
    .await;
}

/// Where a node cannot enforce a limit (it contains sessions by the
/// subreaper sweep alone) or its host cannot hold one, the session is not
/// started there: it fails with the reason, and nothing of it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_a_node_cannot_keep_are_refused_with_a_reason() {
    if !limits_here() {
        return;
    }
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node(
        "n1",
        &["--containment", "subreaper", "--labels", "mode=subreaper"],
    );
    let n2 = env.node("n2", &["--labels", "mode=auto"]);
    let d = env.dir();
    let spec = |mode: &str, limits: serde_json::Value, tag: &str| {
        serde_json::json!({
            "command": "sh", "args": ["-c", format!("touch {d}/{tag}.ran; exec sleep 1000")],
            "restart": "always", "limits": limits, "selector": {"mode": mode}
        })
    };
    env.apply_spec(
        "sub-mem",
        spec(
            "subreaper",
            serde_json::json!({"memory": "64Mi"}),
            "sub-mem",
        ),
    );
    env.apply_spec(
        "sub-pids",
        spec("subreaper", serde_json::json!({"pids": 10}), "sub-pids"),
    );
    env.apply_spec(
        "huge-mem",
        spec("auto", serde_json::json!({"memory": "512Ti"}), "huge-mem"),
    );
    env.apply_spec(
        "huge-cpu",
        spec("auto", serde_json::json!({"cpu": 900}), "huge-cpu"),
    );
    env.apply_spec("fits", spec("subreaper", serde_json::json!({}), "fits"));
    for (name, node, words) in [
        ("sub-mem", "n1", "cannot enforce its memory limit"),
        ("sub-pids", "n1", "cannot enforce its pids limit"),
        (
            "huge-mem",
            "n2",
            "memory limit 512 TiB is above this host's",
        ),
        ("huge-cpu", "n2", "cpu limit 900 is above this host's"),
    ] {
        wait_until(name, Duration::from_secs(20), async || {
            claim(&s, name)
                .await
                .is_some_and(|c| c.state == ClaimState::Failed)
        })
        .await;
        let c = claim(&s, name).await.unwrap();
        let reason = c.reason.clone().unwrap_or_default();
        assert!(
            reason.starts_with(&format!("could not start on {node}: ")) && reason.contains(words),
            "{name}: {reason}\n{}\n{}",
            log_of(&n1),
            log_of(&n2)
        );
        assert_eq!(c.restarts, 0, "{name} is not a crash loop");
        assert!(!env.path(&format!("{name}.ran")).exists(), "{name} ran");
    }
    wait_until(
        "a session without limits runs there",
        Duration::from_secs(20),
        async || env.path("fits.ran").exists(),
    )
    .await;
}

/// `apply` refuses limits no host could keep, with the field named (exit 2,
/// nothing written).
#[test]
fn impossible_limits_are_refused_by_apply() {
    let env = Env::new();
    for (limits, field) in [
        (serde_json::json!({"memory": 0}), "spec.limits.memory"),
        (serde_json::json!({"memory": -1}), "spec.limits.memory"),
        (serde_json::json!({"memory": "lots"}), "spec.limits.memory"),
        (serde_json::json!({"cpu": 0}), "spec.limits.cpu"),
        (serde_json::json!({"cpu": "-2"}), "spec.limits.cpu"),
        (serde_json::json!({"pids": 0}), "spec.limits.pids"),
        (serde_json::json!({"pids": -4}), "spec.limits.pids"),
        (serde_json::json!({"disk": "1G"}), "spec.limits"),
    ] {
        let m = serde_json::json!({"name": "bad", "spec": {"command": "true", "limits": limits}});
        let f = env.path("bad.json");
        std::fs::write(&f, m.to_string()).unwrap();
        let o = bin()
            .args(["apply", f.to_str().unwrap(), "--store", &env.url])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{limits}: {err}");
        assert!(err.contains(field), "{limits}: {err}");
    }
    let o = bin().args(["ls", "--store", &env.url]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("bad"),
        "nothing was written"
    );
}
