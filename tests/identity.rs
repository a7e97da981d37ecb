//! Who a session runs as, with real node and session processes: a node
//! running as root runs sessions as `nobody` unless the spec says `user:
//! root` and the node was started with `--allow-root-sessions`; a user, a
//! group or a working directory the node does not have is the session's
//! reason for failing there; `apply` refuses what it can know.
//!
//! These need a node running as root (CI runs as root); elsewhere they say
//! so and pass only outside `scripts/test`.

mod common;

use common::procs::*;
use leasehold::fleet::claim::ClaimState;
use std::time::Duration;

fn root_here() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var_os("LEASEHOLD_REQUIRE_SERVERS").is_none(),
            "scripts/test runs as root: these tests need it"
        );
        eprintln!("skipped: not root");
    }
    root
}

/// Whether this host lets us make cgroups (as tests/containment.rs).
fn cgroups_here() -> bool {
    let Some(base) = leasehold::fleet::contain::own_cgroup() else {
        return false;
    };
    let probe = base.join(format!("leasehold-probe-id-{}", std::process::id()));
    let ok = std::fs::create_dir(&probe).is_ok();
    let _ = std::fs::remove_dir(&probe);
    ok
}

/// A session that reports, into `<dir>/<tag>.*`, its uid and whether it
/// can read its node's environment, signal its watchdog or its node, and
/// (with `escape`) move itself out of its cgroup.
fn prober(d: &str, tag: &str, escape: bool) -> String {
    let escape = if escape {
        format!(
            "cg=$(sed -n 's/^0:://p' /proc/self/cgroup); \
             if [ -n \"$cg\" ] && [ \"$cg\" != / ] && echo $$ > /sys/fs/cgroup$(dirname $cg)/cgroup.procs 2>/dev/null; \
             then echo escaped; else echo denied; fi > {d}/{tag}.cgroup; "
        )
    } else {
        String::new()
    };
    format!(
        "id -u > {d}/{tag}.uid; \
         node=$(awk '{{print $4}}' /proc/$PPID/stat); \
         if cat /proc/$node/environ > /dev/null 2>&1; then echo readable; else echo denied; fi > {d}/{tag}.env; \
         if kill -0 $PPID 2>/dev/null; then echo signalled; else echo denied; fi > {d}/{tag}.watchdog; \
         if kill -0 $node 2>/dev/null; then echo signalled; else echo denied; fi > {d}/{tag}.node; \
         {escape}echo $HOME > {d}/{tag}.home; echo ok > {d}/{tag}.done; exec sleep 1000"
    )
}

fn read(env: &Env, f: &str) -> String {
    std::fs::read_to_string(env.path(f))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_session_runs_as_nobody_and_cannot_reach_its_node() {
    if !root_here() {
        return;
    }
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    env.apply("low", &prober(&d, "low", true), "never");
    wait_until("the prober reported", Duration::from_secs(20), async || {
        env.path("low.done").exists()
    })
    .await;
    assert_eq!(read(&env, "low.uid"), "65534", "{}", log_of(&n1));
    assert_eq!(
        read(&env, "low.env"),
        "denied",
        "read its node's environment"
    );
    assert_eq!(
        read(&env, "low.watchdog"),
        "denied",
        "signalled its watchdog"
    );
    assert_eq!(read(&env, "low.node"), "denied", "signalled its node");
    assert_eq!(
        read(&env, "low.home"),
        "/nonexistent",
        "nobody's home, not root's"
    );
    if cgroups_here() {
        assert_eq!(read(&env, "low.cgroup"), "denied", "left its cgroup");
    }
    let c = claim(&s, "low").await.unwrap();
    assert_eq!(c.state, ClaimState::Running);
    // The same checks can fail: as root, which the operator allowed, the
    // session reads its node's environment and may signal both.
    let n2 = env.node("n2", &["--allow-root-sessions", "--labels", "root=yes"]);
    env.apply_spec(
        "high",
        serde_json::json!({
            "command": "sh", "args": ["-c", prober(&d, "high", false)],
            "restart": "never", "user": "root", "selector": {"root": "yes"}
        }),
    );
    wait_until(
        "the root prober reported",
        Duration::from_secs(20),
        async || env.path("high.done").exists(),
    )
    .await;
    assert_eq!(read(&env, "high.uid"), "0", "{}", log_of(&n2));
    assert_eq!(read(&env, "high.env"), "readable");
    assert_eq!(read(&env, "high.watchdog"), "signalled");
    assert_eq!(read(&env, "high.node"), "signalled");
}

/// What only the node can know becomes the session's reason, with the
/// node's name, in the claim (so `ls` shows it from the bucket alone):
/// never a crash loop without explanation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_the_node_cannot_run_as_asked_fails_with_its_reason() {
    if !root_here() {
        return;
    }
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    let sh = |extra: serde_json::Value| {
        let mut spec = serde_json::json!({
            "command": "sh", "args": ["-c", format!("pwd > {d}/$LEASEHOLD_SESSION.pwd; exec sleep 1000")],
            "restart": "always"
        });
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        spec
    };
    env.apply_spec("as-root", sh(serde_json::json!({"user": "root"})));
    env.apply_spec(
        "ghost-user",
        sh(serde_json::json!({"user": "no-such-user"})),
    );
    env.apply_spec(
        "ghost-group",
        sh(serde_json::json!({"group": "no-such-group"})),
    );
    env.apply_spec(
        "ghost-dir",
        sh(serde_json::json!({"workdir": "/nonexistent/leasehold"})),
    );
    env.apply_spec(
        "file-dir",
        sh(serde_json::json!({"workdir": "/etc/hostname"})),
    );
    let wd = env.path("wd");
    std::fs::create_dir(&wd).unwrap();
    env.apply_spec(
        "in-dir",
        sh(serde_json::json!({"workdir": wd.display().to_string()})),
    );
    let want = [
        (
            "as-root",
            "could not start on n1: sessions run as root only on a node started with --allow-root-sessions",
        ),
        (
            "ghost-user",
            "could not start on n1: user no-such-user does not exist",
        ),
        (
            "ghost-group",
            "could not start on n1: group no-such-group does not exist",
        ),
        (
            "ghost-dir",
            "could not start on n1: workdir /nonexistent/leasehold does not exist",
        ),
        (
            "file-dir",
            "could not start on n1: workdir /etc/hostname is not a directory",
        ),
    ];
    for (name, reason) in want {
        wait_until(name, Duration::from_secs(20), async || {
            claim(&s, name)
                .await
                .is_some_and(|c| c.state == ClaimState::Failed)
        })
        .await;
        let c = claim(&s, name).await.unwrap();
        assert_eq!(c.reason.as_deref(), Some(reason), "{}", log_of(&n1));
        assert_eq!(c.restarts, 0, "{name} is not a crash loop");
    }
    // Written, not only created: the shell creates the file for its
    // redirection before `pwd` writes into it.
    wait_until("in-dir ran", Duration::from_secs(20), async || {
        read(&env, "in-dir.pwd").ends_with("/wd")
    })
    .await;
    assert_eq!(read(&env, "in-dir.pwd"), wd.display().to_string());
    // `ls` shows each reason, from the bucket.
    let o = bin().args(["ls", "--store", &env.url]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    for (name, reason) in want {
        let row = out.lines().find(|l| l.starts_with(name)).unwrap_or("");
        assert!(
            row.contains("failed") && row.contains(reason),
            "{name}: {out}"
        );
    }
    // `describe` names the spec's user and its restart policy as manifests
    // spell it (it printed `Restart: OnFailure`).
    let o = bin()
        .args(["describe", "ghost-user", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("User:     no-such-user"), "{out}");
    assert!(out.contains("Restart:  always"), "{out}");
    assert!(out.contains("user no-such-user does not exist"), "{out}");
}

/// `apply` refuses what it can know (the field named, exit 2, nothing
/// written); `node run` refuses a --session-user it cannot use.
#[test]
fn bad_users_and_workdirs_are_refused_up_front() {
    let env = Env::new();
    for (spec, field) in [
        (
            serde_json::json!({"command": "true", "user": "Root"}),
            "spec.user",
        ),
        (
            serde_json::json!({"command": "true", "group": "a b"}),
            "spec.group",
        ),
        (
            serde_json::json!({"command": "true", "user": "4294967296"}),
            "spec.user",
        ),
        (
            serde_json::json!({"command": "true", "workdir": "relative/dir"}),
            "spec.workdir",
        ),
        (
            serde_json::json!({"command": "true", "workdir": "/a\u{1b}[31m"}),
            "spec.workdir",
        ),
    ] {
        let o = env.apply_output("bad", spec.clone());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{spec}: {err}");
        assert!(err.contains(field), "{spec}: {err}");
    }
    let o = bin()
        .args(["ls", "manifests", "--store", &env.url])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("bad"),
        "nothing written"
    );
    for (flag, why) in [
        (vec!["--session-user", "no-such-user"], "does not exist"),
        (vec!["--session-user", "Bad Name"], "--session-user"),
    ] {
        let mut n = env.node("n9", &flag);
        let st = n.child.wait().unwrap();
        let log = log_of(&n);
        assert_eq!(st.code(), Some(2), "{flag:?}: {log}");
        assert!(log.contains(why), "{flag:?}: {log}");
    }
    if unsafe { libc::geteuid() } == 0 {
        let mut n = env.node("n9", &["--session-user", "root"]);
        let st = n.child.wait().unwrap();
        let log = log_of(&n);
        assert_eq!(st.code(), Some(2), "{log}");
        assert!(log.contains("--allow-root-sessions"), "{log}");
    }
}

/// A session (running as nobody) can write in the shared host-lock
/// directory. A lock file it made is one it may unlink while a node holds
/// it, so a node refuses a lock file that is not its own user's, rather
/// than trusting it as proof that no other instance runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_file_a_session_made_is_refused() {
    if !root_here() {
        return;
    }
    let env = Env::new();
    // n7 runs once, to learn its lock file's name, and stops.
    let mut n7 = env.node("n7", &[]);
    let s = env.store().await;
    wait_until("n7 registered", Duration::from_secs(20), async || {
        node_record(&s, "n7").await.is_some()
    })
    .await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(n7.child.id() as i32, libc::SIGTERM) };
    n7.child.wait().unwrap();
    let lock = std::fs::read_dir(env.path("locks"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("n7-"))
        .expect("n7's lock file");
    std::fs::remove_file(&lock).unwrap();
    // A session of n1 (as nobody) makes n7's lock file.
    let _n1 = env.node("n1", &[]);
    env.apply(
        "squatter",
        &format!("touch {}; exec sleep 1000", lock.display()),
        "never",
    );
    wait_until("the squatter's file", Duration::from_secs(20), async || {
        lock.exists()
    })
    .await;
    let mut again = env.node("n7", &[]);
    let st = again.child.wait().unwrap();
    let log = log_of(&again);
    assert_eq!(st.code(), Some(2), "{log}");
    assert!(log.contains("belongs to uid 65534"), "{log}");
}
