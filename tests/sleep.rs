//! Sleep and wake, with real node and session processes: a session falls
//! asleep on its sleep code, when it asks, or when idle; asleep it has no
//! process and no owner; a wake runs it again at a higher epoch, once
//! however many wake it at once; and a frozen owner is never "reachable".

mod common;

use common::procs::*;
use leasehold::fleet::claim::ClaimState;
use std::time::Duration;

const LH: &str = env!("CARGO_BIN_EXE_leasehold");

fn lines(env: &Env, f: &str) -> Vec<String> {
    std::fs::read_to_string(env.path(f))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

async fn asleep(s: &std::sync::Arc<dyn leasehold::store::Store>, name: &str) -> bool {
    claim(s, name)
        .await
        .is_some_and(|c| c.state == ClaimState::Sleeping)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sleeps_on_its_exit_code_and_concurrent_wakes_run_it_once() {
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let _n2 = env.node("n2", &[]);
    let d = env.dir();
    env.apply_spec(
        "nap",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!(
                "echo $LEASEHOLD_EPOCH >> {d}/nap.runs; [ -f {d}/stay ] || exit 75; exec sleep 1000")],
            "restart": "always",
            "sleep": {"on_exit": 75}
        }),
    );
    wait_until("asleep", Duration::from_secs(20), async || {
        asleep(&s, "nap").await
    })
    .await;
    let c = claim(&s, "nap").await.unwrap();
    assert_eq!(c.epoch, 1);
    assert_eq!(c.owner.node, "queued", "no node holds a sleeping session");
    assert_eq!(c.address, None);
    assert!(
        c.reason
            .as_deref()
            .is_some_and(|r| r.contains("sleep code 75")),
        "{c:?}"
    );
    assert_eq!(lines(&env, "nap.runs"), ["1"], "{}", log_of(&n1));
    let o = bin().args(["ls", "--store", &env.url]).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let row = out.lines().find(|l| l.starts_with("nap")).unwrap_or("");
    assert!(
        row.contains("sleeping") && row.contains("asleep for"),
        "{out}"
    );
    // Still asleep a while later: no node claims it on its own.
    pause(2500).await;
    assert!(asleep(&s, "nap").await);
    assert_eq!(lines(&env, "nap.runs").len(), 1);
    // Eight wakes at once: one run, and every caller the same epoch.
    std::fs::write(env.path("stay"), "").unwrap();
    let wakes: Vec<_> = (0..8)
        .map(|_| {
            bin()
                .args([
                    "wake", "nap", "--wait", "20s", "--json", "--store", &env.url,
                ])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut epochs = Vec::new();
    for w in wakes {
        let o = w.wait_with_output().unwrap();
        assert!(
            o.status.success(),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["ready"], true);
        epochs.push(v["epoch"].as_u64().unwrap());
    }
    assert!(epochs.iter().all(|e| *e == 2), "{epochs:?}");
    pause(1500).await;
    assert_eq!(lines(&env, "nap.runs"), ["1", "2"], "one new run");
    let c = claim(&s, "nap").await.unwrap();
    assert_eq!((c.state, c.epoch), (ClaimState::Running, 2));
    // Waking a running session wakes nothing: the same run answers.
    let o = bin()
        .args(["wake", "nap", "--json", "--store", &env.url])
        .output()
        .unwrap();
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["epoch"].as_u64(), v["woken"].as_bool()),
        (Some(2), Some(false))
    );
    // A name with no manifest: typed, nothing written.
    let o = bin()
        .args(["wake", "ghost", "--store", &env.url])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(claim(&s, "ghost").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_asks_or_idles_falls_asleep_and_wakes_at_a_higher_epoch() {
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    env.apply_spec(
        "asks",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!("echo $LEASEHOLD_EPOCH >> {d}/asks.runs; sleep 0.3; {LH} sleep; exec sleep 1000")],
            "restart": "always",
            "sleep": {"on_exit": 99}
        }),
    );
    env.apply_spec(
        "nosleep",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!("{LH} sleep 2> {d}/nosleep.err; echo $? > {d}/nosleep.rc; exec sleep 1000")],
            "restart": "always"
        }),
    );
    env.apply_spec(
        "idle",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!("echo $$ > {d}/idle.pid; exec sleep 1000")],
            "restart": "always",
            "sleep": {"after_idle": "2s"}
        }),
    );
    wait_until("asks is asleep", Duration::from_secs(20), async || {
        asleep(&s, "asks").await
    })
    .await;
    let c = claim(&s, "asks").await.unwrap();
    assert_eq!(
        c.reason.as_deref(),
        Some("it asked to sleep"),
        "{}",
        log_of(&n1)
    );
    wait_until("idle is asleep", Duration::from_secs(20), async || {
        asleep(&s, "idle").await
    })
    .await;
    let c = claim(&s, "idle").await.unwrap();
    assert_eq!(c.reason.as_deref(), Some("idle for 2s"));
    // A session whose spec has no sleep rule cannot put itself to sleep.
    wait_until("nosleep asked", Duration::from_secs(20), async || {
        env.path("nosleep.rc").exists()
    })
    .await;
    assert_eq!(
        lines(&env, "nosleep.rc"),
        ["2"],
        "{:?}",
        lines(&env, "nosleep.err")
    );
    assert!(
        lines(&env, "nosleep.err")
            .concat()
            .contains("no sleep rule")
    );
    assert_eq!(
        claim(&s, "nosleep").await.unwrap().state,
        ClaimState::Running
    );
    let pid = env.pid("idle.pid").unwrap();
    wait_until("its process is gone", Duration::from_secs(10), async || {
        !alive(pid)
    })
    .await;
    // Woken: a new run at a higher epoch (which asks again, and sleeps).
    let o = bin()
        .args(["wake", "idle", "--wait", "20s", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("running on n1, epoch 2, woken"), "{out}");
    let o = bin()
        .args(["wake", "asks", "--wait", "20s", "--store", &env.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    wait_until("asks ran at epoch 2", Duration::from_secs(20), async || {
        lines(&env, "asks.runs") == ["1", "2"]
    })
    .await;
}

/// A frozen owner is not "reachable": the kernel accepts a TCP connection
/// for a stopped process, but its API does not answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_owner_is_never_reachable() {
    let env = Env::new();
    let s = env.store().await;
    let token = env.path("token");
    let n1 = env.node(
        "n1",
        &["--listen", "0", "--token-file", token.to_str().unwrap()],
    );
    env.apply("z", "exec sleep 1000", "always");
    wait_until("running", Duration::from_secs(20), async || {
        claim(&s, "z")
            .await
            .is_some_and(|c| c.state == ClaimState::Running)
    })
    .await;
    let wake = || {
        bin()
            .args(["resolve", "z", "--wake", "--store", &env.url])
            .output()
            .unwrap()
    };
    let o = wake();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(String::from_utf8_lossy(&o.stdout).contains("(reachable)"));
    let pid = n1.child.id() as i32;
    // SAFETY: plain kill(2) on the node this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let o = wake();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(!out.contains("(reachable)"), "{out}");
}

/// A session with `sleep.after_idle` stays awake while callers wake it
/// (with the fleet's token, each wake reaches its owner), and falls asleep
/// once they stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakes_that_reach_the_owner_keep_a_session_awake() {
    let env = Env::new();
    let s = env.store().await;
    let token = env.path("token");
    let _n1 = env.node(
        "n1",
        &["--listen", "0", "--token-file", token.to_str().unwrap()],
    );
    env.apply_spec(
        "busy",
        serde_json::json!({
            "command": "sh", "args": ["-c", "exec sleep 1000"],
            "restart": "always", "sleep": {"after_idle": "2s"}
        }),
    );
    wait_until("running", Duration::from_secs(20), async || {
        claim(&s, "busy")
            .await
            .is_some_and(|c| c.state == ClaimState::Running)
    })
    .await;
    for _ in 0..10 {
        let o = bin()
            .args([
                "wake",
                "busy",
                "--token-file",
                token.to_str().unwrap(),
                "--store",
                &env.url,
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
        pause(500).await;
    }
    let c = claim(&s, "busy").await.unwrap();
    assert_eq!(
        (c.state, c.epoch),
        (ClaimState::Running, 1),
        "woken every 0.5 s for 5 s: {c:?}"
    );
    wait_until(
        "asleep once left alone",
        Duration::from_secs(15),
        async || asleep(&s, "busy").await,
    )
    .await;
}

/// `POST /v1/sessions/{name}/wake` on any node: a sleeping session is
/// claimed there and the answer comes once it is ready, with the new
/// epoch; a name with no manifest is a 404 with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_wakes_a_session_and_answers_when_ready() {
    let env = Env::new();
    let s = env.store().await;
    let token = env.path("token");
    let _n1 = env.node(
        "n1",
        &["--listen", "0", "--token-file", token.to_str().unwrap()],
    );
    env.apply_spec(
        "nap",
        serde_json::json!({
            "command": "sh", "args": ["-c", "exec sleep 1000"],
            "restart": "always", "sleep": {"after_idle": "2s"}
        }),
    );
    wait_until("asleep", Duration::from_secs(20), async || {
        asleep(&s, "nap").await
    })
    .await;
    let address = wait_for_address(&s, "n1").await;
    let tok = std::fs::read_to_string(&token).unwrap();
    let client = reqwest::Client::new();
    // `POST {path}` on n1 with the fleet's token: the status and the body.
    let post = async |path: &str| {
        let r = client
            .post(format!("{address}{path}"))
            .bearer_auth(tok.trim())
            .send()
            .await
            .unwrap();
        let code = r.status().as_u16();
        let body = r.bytes().await.unwrap();
        (
            code,
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        )
    };
    let (code, v) = post("/v1/sessions/nap/wake?wait=15s").await;
    assert_eq!(code, 200);
    assert_eq!(v["outcome"], "ready", "{v}");
    assert_eq!(
        (
            v["node"].as_str(),
            v["epoch"].as_u64(),
            v["woken"].as_bool()
        ),
        (Some("n1"), Some(2), Some(true)),
        "{v}"
    );
    assert_eq!(post("/v1/sessions/ghost/wake").await.0, 404);
    assert!(claim(&s, "ghost").await.is_none());
    let r = client
        .post(format!("{address}/v1/sessions/nap/wake"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "the bearer token is required");
    // Asleep again (idle 2 s), then woken with no wait: 202 `starting`, with
    // the run's epoch, as soon as its claim is written; the same run is
    // then ready at that epoch.
    wait_until("asleep again", Duration::from_secs(20), async || {
        asleep(&s, "nap").await
    })
    .await;
    let (code, v) = post("/v1/sessions/nap/wake?wait=0s").await;
    assert_eq!(code, 202);
    assert_eq!(
        (
            v["outcome"].as_str(),
            v["node"].as_str(),
            v["epoch"].as_u64(),
            v["woken"].as_bool()
        ),
        (Some("starting"), Some("n1"), Some(3), Some(true)),
        "{v}"
    );
    let (_, v) = post("/v1/sessions/nap/wake?wait=15s").await;
    assert_eq!(
        (
            v["outcome"].as_str(),
            v["epoch"].as_u64(),
            v["woken"].as_bool()
        ),
        (Some("ready"), Some(3), Some(false)),
        "{v}"
    );
}

/// The address node `id` publishes in its record.
async fn wait_for_address(s: &std::sync::Arc<dyn leasehold::store::Store>, id: &str) -> String {
    for _ in 0..200 {
        if let Some((r, _)) = node_record(s, id).await
            && let Some(a) = r.address
        {
            return a;
        }
        pause(50).await;
    }
    panic!("{id} publishes no address");
}

/// The alarm objects left in the bucket.
async fn alarms(s: &std::sync::Arc<dyn leasehold::store::Store>) -> Vec<String> {
    use futures::StreamExt;
    s.list(leasehold::fleet::alarm::ALARMS)
        .map(|e| e.unwrap().key)
        .collect()
        .await
}

/// Issue #39, alarms with real processes: `wake NAME --at +2s` wakes a
/// sleeping session once at its time (a new run, one epoch higher), and
/// never again for the same alarm; with the node ranked first for it
/// killed (-9) as the alarm is set, the survivor fires it (ttl + margin
/// later); an alarm that comes due while the session runs is consumed with
/// no new run; a time passed or unreadable is exit 2 and a name with no
/// manifest exit 7, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alarm_wakes_a_sleeping_session_once_even_across_a_kill() {
    let env = Env::new();
    let s = env.store().await;
    let mut n1 = Some(env.node("n1", &[]));
    let mut n2 = Some(env.node("n2", &[]));
    let d = env.dir();
    env.apply_spec(
        "nap",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!(
                "echo $LEASEHOLD_EPOCH >> {d}/nap.runs; [ -f {d}/stay ] || exit 75; exec sleep 1000")],
            "restart": "always",
            "sleep": {"on_exit": 75}
        }),
    );
    let asleep_at = async |epoch: u64| {
        claim(&s, "nap")
            .await
            .is_some_and(|c| c.state == ClaimState::Sleeping && c.epoch == epoch)
    };
    wait_until("asleep at 1", Duration::from_secs(20), async || {
        asleep_at(1).await
    })
    .await;
    let set = |at: &str| {
        bin()
            .args(["wake", "nap", "--at", at, "--json", "--store", &env.url])
            .output()
            .unwrap()
    };
    // Bad input first: nothing written.
    for (at, code) in [
        ("+0s", 2),
        ("2001-01-01T00:00:00Z", 2),
        ("soon", 2),
        ("+2y", 2),
    ] {
        let o = set(at);
        assert_eq!(
            o.status.code(),
            Some(code),
            "{at}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(String::from_utf8_lossy(&o.stderr).contains("--at"), "{at}");
    }
    let o = bin()
        .args(["wake", "ghost", "--at", "+1m", "--store", &env.url])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(alarms(&s).await.is_empty());
    // One alarm: one run, at its time, not before.
    let o = set("+2s");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["alarm"].as_str().unwrap().starts_with("alarms/"), "{v}");
    assert_eq!(alarms(&s).await.len(), 1);
    // describe shows it, in text and JSON.
    let o = bin()
        .args(["describe", "nap", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("Alarms:") && out.contains("(in "), "{out}");
    let o = bin()
        .args(["describe", "nap", "--json", "--store", &env.url])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["alarms"].as_array().map(Vec::len), Some(1), "{v}");
    pause(500).await;
    assert!(asleep_at(1).await, "woken before its time");
    wait_until(
        "woken and asleep again at 2",
        Duration::from_secs(20),
        async || asleep_at(2).await,
    )
    .await;
    assert_eq!(lines(&env, "nap.runs"), ["1", "2"]);
    wait_until("the alarm deleted", Duration::from_secs(10), async || {
        alarms(&s).await.is_empty()
    })
    .await;
    pause(2500).await;
    assert_eq!(lines(&env, "nap.runs"), ["1", "2"], "fired twice");
    // The node ranked first for it dies as the alarm is set: the other
    // fires it.
    let first = if leasehold::fleet::plan::score("nap", "n1", 1.0)
        > leasehold::fleet::plan::score("nap", "n2", 1.0)
    {
        n1.take()
    } else {
        n2.take()
    };
    let o = set("+2s");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut first = first.unwrap();
    first.child.kill().unwrap();
    let _ = first.child.wait();
    wait_until(
        "woken by the survivor",
        Duration::from_secs(30),
        async || asleep_at(3).await,
    )
    .await;
    assert_eq!(lines(&env, "nap.runs"), ["1", "2", "3"]);
    // Due while it runs: consumed, no new run.
    std::fs::write(env.path("stay"), "").unwrap();
    let o = bin()
        .args(["wake", "nap", "--wait", "20s", "--store", &env.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = set("+1s");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until("the alarm consumed", Duration::from_secs(20), async || {
        alarms(&s).await.is_empty()
    })
    .await;
    assert_eq!(lines(&env, "nap.runs"), ["1", "2", "3", "4"]);
    let c = claim(&s, "nap").await.unwrap();
    assert_eq!((c.state, c.epoch), (ClaimState::Running, 4));
    drop((n1, n2));
}

/// Issue #39: a session sets its own alarm on its node's channel before it
/// sleeps (`leasehold sleep --wake-in 1s`, as a Durable Object sets an
/// alarm and is evicted): it is woken by it, at the next epoch, twice in a
/// row, then stays up. A session without a sleep rule is refused (exit 2)
/// and no alarm is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sets_its_own_alarm_and_is_woken_by_it() {
    let env = Env::new();
    let s = env.store().await;
    let _n1 = env.node("n1", &[]);
    let d = env.dir();
    env.apply_spec(
        "naps",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!(
                "echo $LEASEHOLD_EPOCH >> {d}/naps.runs; \
                 if [ $(wc -l < {d}/naps.runs) -lt 3 ]; then {LH} sleep --wake-in 1s; fi; exec sleep 1000")],
            "restart": "always",
            "sleep": {"on_exit": 99}
        }),
    );
    env.apply_spec(
        "nosleep",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!("{LH} sleep --wake-in 1s 2> {d}/nosleep.err; echo $? > {d}/nosleep.rc; exec sleep 1000")],
            "restart": "always"
        }),
    );
    let mut woken = false;
    for _ in 0..300 {
        if lines(&env, "naps.runs").len() == 3
            && claim(&s, "naps")
                .await
                .is_some_and(|c| c.state == ClaimState::Running && c.epoch == 3)
        {
            woken = true;
            break;
        }
        pause(100).await;
    }
    assert!(
        woken,
        "not woken twice: runs {:?}, claim {:?}, alarms {:?}\n{}",
        lines(&env, "naps.runs"),
        claim(&s, "naps").await,
        alarms(&s).await,
        log_of(&_n1)
    );
    assert_eq!(lines(&env, "naps.runs"), ["1", "2", "3"]);
    wait_until("nosleep refused", Duration::from_secs(20), async || {
        !lines(&env, "nosleep.rc").is_empty()
    })
    .await;
    assert_eq!(lines(&env, "nosleep.rc"), ["2"]);
    let err = std::fs::read_to_string(env.path("nosleep.err")).unwrap();
    assert!(err.contains("no sleep rule"), "{err}");
    wait_until(
        "every alarm consumed",
        Duration::from_secs(10),
        async || alarms(&s).await.is_empty(),
    )
    .await;
    pause(1500).await;
    assert_eq!(
        lines(&env, "naps.runs").len(),
        3,
        "woken again with no alarm"
    );
}

/// Issue #39's cron on real node processes: a manifest whose `schedule`
/// is every minute waits for its first tick (`scheduled`), runs once at
/// it, and runs once at the next though the node ranked first for it is
/// killed (-9) in between; `describe` shows the schedule and both ticks. A
/// schedule that cannot be read, names an unknown time zone, never fires,
/// or comes with `restart: always` is exit 2 naming the field, and nothing
/// is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_runs_once_per_tick_across_a_kill() {
    let env = Env::new();
    let s = env.store().await;
    let d = env.dir();
    for (spec, field) in [
        (
            serde_json::json!({"command": "true", "schedule": "61 * * * *"}),
            "spec.schedule.cron",
        ),
        (
            serde_json::json!({"command": "true", "schedule": "0 0 30 2 *"}),
            "spec.schedule.cron",
        ),
        (
            serde_json::json!({"command": "true", "schedule": {"cron": "0 3 * * *", "time_zone": "Mars/Base"}}),
            "spec.schedule.time_zone",
        ),
        (
            serde_json::json!({"command": "true", "schedule": "@daily", "restart": "always"}),
            "spec.restart",
        ),
    ] {
        let o = env.apply_output("bad", spec.clone());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{spec}: {err}");
        assert!(err.contains(field), "{spec}: {err}");
    }
    assert!(s.get("manifests/bad").await.unwrap().is_none());
    let mut n1 = Some(env.node("n1", &[]));
    let mut n2 = Some(env.node("n2", &[]));
    env.apply_spec(
        "tick",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!("echo $LEASEHOLD_EPOCH >> {d}/tick.runs")],
            "restart": "never",
            "schedule": {"cron": "* * * * *", "concurrency": "forbid"}
        }),
    );
    let status = || {
        let o = bin()
            .args(["describe", "tick", "--json", "--store", &env.url])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["status"].as_str().unwrap_or_default().to_string()
    };
    let first = status();
    // Unless the minute turned since the apply, it waits for its tick.
    assert!(
        first == "scheduled" || lines(&env, "tick.runs").len() == 1,
        "{first}"
    );
    wait_until("the first tick ran", Duration::from_secs(75), async || {
        lines(&env, "tick.runs").len() == 1
    })
    .await;
    wait_until("succeeded", Duration::from_secs(10), async || {
        claim(&s, "tick")
            .await
            .is_some_and(|c| c.state == ClaimState::Succeeded)
    })
    .await;
    // The node ranked first for it dies between two ticks.
    let ranked_first = if leasehold::fleet::plan::score("tick", "n1", 1.0)
        > leasehold::fleet::plan::score("tick", "n2", 1.0)
    {
        n1.take()
    } else {
        n2.take()
    };
    let mut ranked_first = ranked_first.unwrap();
    ranked_first.child.kill().unwrap();
    let _ = ranked_first.child.wait();
    wait_until("the next tick ran", Duration::from_secs(75), async || {
        lines(&env, "tick.runs").len() == 2
    })
    .await;
    pause(3000).await;
    let runs = lines(&env, "tick.runs");
    assert_eq!(runs.len(), 2, "{runs:?}");
    let o = bin()
        .args(["describe", "tick", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Schedule: * * * * * (UTC), concurrency forbid"),
        "{out}"
    );
    assert!(out.contains("Next tick:"), "{out}");
    assert!(out.contains("Ticks:"), "{out}");
    assert_eq!(out.matches("started (from epoch").count(), 2, "{out}");
    // Each tick's run is the epoch above the one its start found at rest.
    assert!(
        out.contains("started (from epoch 0)") && out.contains("started (from epoch 1)"),
        "{out}"
    );
    assert_eq!(runs, ["1", "2"]);
    drop((n1, n2));
}
