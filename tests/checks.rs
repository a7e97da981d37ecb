//! A session's address and health, with real node and session processes:
//! a spec's `port` is the session's endpoint in its claim (what `resolve`
//! prints beside the node's API) and its LEASEHOLD_PORT; a checked session
//! is `starting` until its check passes, then `running`; a run that fails
//! its check `threshold` times in a row is `unhealthy`, stopped, and
//! restarted (or failed) by its policy, with the check's words as reason;
//! an exec check runs as the session's user.

mod common;

use common::procs::*;
use leasehold::fleet::check::Health;
use leasehold::fleet::claim::ClaimState;
use std::time::Duration;

const PY: &str = "/usr/bin/python3";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn tools_here() -> bool {
    let ok = std::path::Path::new(PY).exists();
    if !ok {
        assert!(
            std::env::var_os("LEASEHOLD_REQUIRE_SERVERS").is_none(),
            "scripts/test needs {PY} for these tests"
        );
        eprintln!("skipped: no {PY}");
    }
    ok
}

/// An HTTP session on its own port, checked by a path on it: `starting`
/// while it warms up (failures within its grace do not count), `running`
/// once it answers; its claim and `resolve` name its endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checked_session_is_starting_until_it_answers_and_names_its_endpoint() {
    if !tools_here() {
        return;
    }
    let env = Env::new();
    let s = env.store().await;
    let token = env.path("token");
    let n1 = env.node(
        "n1",
        &["--listen", "0", "--token-file", token.to_str().unwrap()],
    );
    let port = free_port();
    let d = env.dir();
    env.apply_spec(
        "web",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!("echo $LEASEHOLD_PORT > {d}/web.port; sleep 3; cd {d} && exec {PY} -m http.server --bind 127.0.0.1 $LEASEHOLD_PORT")],
            "restart": "always", "port": port,
            "check": {"http": "/", "interval": "200ms", "threshold": 2, "grace": "10s"}
        }),
    );
    wait_until("web is starting", Duration::from_secs(20), async || {
        claim(&s, "web")
            .await
            .is_some_and(|c| c.health == Some(Health::Starting))
    })
    .await;
    let o = bin().args(["ls", "--store", &env.url]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out.lines().find(|l| l.starts_with("web")).unwrap_or("");
    assert!(row.contains("starting"), "{out}");
    // `resolve` says the same word, in text and JSON.
    let o = bin()
        .args(["resolve", "web", "--json", "--store", &env.url])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], "starting", "{v}");
    wait_until(
        "web answers its check",
        Duration::from_secs(20),
        async || {
            claim(&s, "web")
                .await
                .is_some_and(|c| c.state == ClaimState::Running && c.health.is_none())
        },
    )
    .await;
    let c = claim(&s, "web").await.unwrap();
    assert_eq!(c.restarts, 0, "no failure counted within the grace");
    assert_eq!(
        c.endpoint.as_deref(),
        Some(format!("127.0.0.1:{port}").as_str())
    );
    assert_eq!(
        std::fs::read_to_string(env.path("web.port"))
            .unwrap()
            .trim(),
        port.to_string(),
        "LEASEHOLD_PORT"
    );
    let o = bin().args(["ls", "--store", &env.url]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out.lines().find(|l| l.starts_with("web")).unwrap_or("");
    assert!(row.contains("running"), "{out}");
    let o = bin()
        .args(["resolve", "web", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains(&format!(
            "epoch 1 running at 127.0.0.1:{port} (node API http://127.0.0.1:"
        )),
        "{out}"
    );
    let o = bin()
        .args(["resolve", "web", "--wake", "--json", "--store", &env.url])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"]["endpoint"], format!("127.0.0.1:{port}"), "{v}");
    // `describe` shows the check, and when each event happened.
    let o = bin()
        .args([
            "describe",
            "web",
            "--store",
            &env.url,
            "--token-file",
            token.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Check:    http / every 200ms (timeout 200ms, 2 failures, grace 10s)"),
        "{out}"
    );
    assert!(
        out.contains(&format!("Endpoint:   127.0.0.1:{port}")),
        "{out}"
    );
    let healthy = out.lines().find(|l| l.contains("healthy ")).unwrap_or("");
    assert!(
        healthy.contains("Z (") && healthy.contains(" ago)"),
        "events carry their times: {out}\n{}",
        log_of(&n1)
    );
}

/// A run that fails its check `threshold` times in a row is unhealthy: with
/// `never` it is failed with the check's words, and its process is gone;
/// with `always` it is restarted until its check passes, and an exec check
/// runs as the session's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_run_is_stopped_and_its_policy_applies() {
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    let dead = free_port();
    env.apply_spec(
        "deaf",
        serde_json::json!({
            "command": "sh", "args": ["-c", format!("echo $$ > {d}/deaf.pid; exec sleep 1000")],
            "restart": "never",
            "check": {"tcp": dead, "interval": "200ms", "threshold": 2}
        }),
    );
    env.apply_spec(
        "flaky",
        serde_json::json!({
            "command": "sh", "args": ["-c", "exec sleep 1000"],
            "restart": {"policy": "always", "delay": "100ms"},
            "check": {"exec": ["sh", "-c", format!("id -u > {d}/check.uid; test -f {d}/ok")],
                      "interval": "200ms", "threshold": 2}
        }),
    );
    wait_until("deaf failed", Duration::from_secs(20), async || {
        claim(&s, "deaf")
            .await
            .is_some_and(|c| c.state == ClaimState::Failed)
    })
    .await;
    let c = claim(&s, "deaf").await.unwrap();
    assert_eq!(
        c.reason.as_deref(),
        Some(
            format!("unhealthy: check failed 2 times in a row (tcp {dead}: connection refused)")
                .as_str()
        ),
        "{}",
        log_of(&n1)
    );
    assert_eq!(c.health, None, "a finished run has no health");
    let pid = env.pid("deaf.pid").unwrap();
    wait_until(
        "deaf's process is gone",
        Duration::from_secs(10),
        async || !alive(pid),
    )
    .await;

    wait_until("flaky was restarted", Duration::from_secs(20), async || {
        claim(&s, "flaky").await.is_some_and(|c| c.restarts >= 1)
    })
    .await;
    let c = claim(&s, "flaky").await.unwrap();
    assert!(
        c.reason.as_deref().is_some_and(
            |r| r.starts_with("unhealthy: check failed 2 times in a row (exec sh: exit 1)")
        ),
        "{c:?}"
    );
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        let uid = std::fs::read_to_string(env.path("check.uid")).unwrap_or_default();
        assert_eq!(
            uid.trim(),
            "65534",
            "the exec check runs as the session's user"
        );
    }
    // An exec check that times out and leaves a child behind: each check
    // runs under a watchdog of its own that kills its whole tree at the
    // timeout, so nothing of it piles up (no process, no zombie left to
    // the node, which adopts orphans).
    env.apply_spec(
        "hung",
        serde_json::json!({
            "command": "sh", "args": ["-c", "exec sleep 1000"],
            "restart": "always",
            "check": {"exec": ["sh", "-c", "sleep 4242 & exec sleep 4243"],
                      "interval": "300ms", "timeout": "200ms", "threshold": 100}
        }),
    );
    let node_pid = n1.child.id() as i32;
    let zombies = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|s| {
                let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
                let f: Vec<&str> = rest.split_whitespace().collect();
                f.first() == Some(&"Z") && f.get(1) == Some(&node_pid.to_string().as_str())
            })
            .count()
    };
    let mut most = 0;
    for _ in 0..30 {
        pause(100).await;
        most = most.max(
            std::process::Command::new("pgrep")
                .args(["-f", "^sleep 424[23]"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
                .unwrap_or(0),
        );
    }
    assert!(most > 0, "the hung check never ran");
    assert!(most <= 2, "{most} processes of timed-out checks at once");
    // Ten timed-out checks so far: none left a zombie that stays (one may
    // be caught in the instant before it is reaped).
    let mut least = usize::MAX;
    for _ in 0..5 {
        least = least.min(zombies());
        pause(50).await;
    }
    assert_eq!(least, 0, "zombies left to the node");
    std::fs::write(env.path("ok"), "").unwrap();
    wait_until(
        "flaky passes its check",
        Duration::from_secs(20),
        async || {
            claim(&s, "flaky")
                .await
                .is_some_and(|c| c.state == ClaimState::Running && c.health.is_none())
        },
    )
    .await;
}

/// `apply` refuses checks no node could run (exit 2, the field named).
#[test]
fn bad_checks_and_ports_are_refused_by_apply() {
    let env = Env::new();
    for (extra, field) in [
        (serde_json::json!({"check": {"tcp": 70000}}), "spec.check"),
        (serde_json::json!({"check": {"tcp": 0}}), "spec.check.tcp"),
        (
            serde_json::json!({"check": {"exec": []}}),
            "spec.check.exec",
        ),
        (
            serde_json::json!({"check": {"http": "/h"}}),
            "spec.check.http",
        ),
        (
            serde_json::json!({"check": {"tcp": 1, "http": "http://h/"}}),
            "spec.check",
        ),
        (
            serde_json::json!({"check": {"tcp": 1, "interval": "1ms"}}),
            "spec.check.interval",
        ),
        (serde_json::json!({"port": 0}), "spec.port"),
        (serde_json::json!({"port": 65536}), "spec.port"),
    ] {
        let mut spec = serde_json::json!({"command": "true"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let m = serde_json::json!({"name": "bad", "spec": spec});
        let f = env.path("bad.json");
        std::fs::write(&f, m.to_string()).unwrap();
        let o = bin()
            .args(["apply", f.to_str().unwrap(), "--store", &env.url])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra}: {err}");
        assert!(err.contains(field), "{extra}: {err}");
    }
}
