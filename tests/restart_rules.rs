//! Restart rules with real node and session processes: a crash loop shows
//! `backoff` while no process runs, restarts when its back-off ends, and an
//! `on-failure` session whose attempts are spent is `failed` with the reason
//! "gave up after N restarts", with nothing run after it.

mod common;

use common::procs::*;
use leasehold::fleet::claim::ClaimState;
use std::time::Duration;

fn ls(env: &Env) -> String {
    let o = bin().args(["ls", "--store", &env.url]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_shows_backoff_then_gives_up() {
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    env.apply_spec(
        "flaky",
        serde_json::json!({
            "command": "sh", "args": ["-c", format!("echo $LEASEHOLD_EPOCH >> {d}/flaky.runs; exit 3")],
            "restart": {"policy": "on-failure", "attempts": 2, "delay": "2s"}
        }),
    );
    // Run 1 exits, restarts at once; run 2 exits, and a 2 s back-off holds
    // run 3: `ls` says so, with no process running.
    let mut seen = String::new();
    wait_until("ls shows backoff", Duration::from_secs(20), async || {
        seen = ls(&env);
        seen.lines()
            .any(|l| l.starts_with("flaky") && l.contains("backoff") && l.contains("restarting in"))
    })
    .await;
    let runs = || {
        std::fs::read_to_string(env.path("flaky.runs"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    assert_eq!(runs(), 2, "{seen}");
    wait_until("flaky gave up", Duration::from_secs(20), async || {
        claim(&s, "flaky")
            .await
            .is_some_and(|c| c.state == ClaimState::Failed)
    })
    .await;
    let c = claim(&s, "flaky").await.unwrap();
    assert_eq!(
        c.reason.as_deref(),
        Some("gave up after 2 restarts (last exit 3)"),
        "{}",
        log_of(&n1)
    );
    let out = ls(&env);
    let row = out.lines().find(|l| l.starts_with("flaky")).unwrap_or("");
    assert!(
        row.contains("failed") && row.contains("gave up after 2 restarts"),
        "{out}"
    );
    pause(1500).await;
    assert_eq!(runs(), 3, "nothing ran after it gave up");
    let o = bin()
        .args(["describe", "flaky", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Restart:  on-failure (2 attempts, back-off 2s to 30s)"),
        "{out}"
    );
}
