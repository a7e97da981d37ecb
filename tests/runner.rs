//! The exec runner's side of the node's contract, with real processes: a
//! session is never started while a run of it is still going on the same
//! node. The node keeps that by stopping a run before it forgets the claim
//! (so that it may take back a claim in its own name at the next epoch);
//! the runner refuses if that ever fails. (Its own binary: `ExecRunner`
//! makes the test process a subreaper, which the containment tests, whose
//! nodes' orphans must go to init, must not share.)

use leasehold::clock::{Clock, SystemClock};
use leasehold::fleet::manifest::Spec;
use leasehold::fleet::runner::{ExecRunner, Runner, SessionStart};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exec_runner_refuses_a_second_start_of_a_running_session() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let runner = ExecRunner::new(
        env!("CARGO_BIN_EXE_leasehold").into(),
        clock.clone(),
        Duration::from_secs(1),
    );
    let start = |epoch| SessionStart {
        name: "web".into(),
        node: "n1".into(),
        epoch,
        spec: Spec::new("sleep", &["30"]),
        deadline: clock.now() + Duration::from_secs(60),
        channel: None,
    };
    runner.start(start(1)).await.unwrap();
    let err = runner.start(start(2)).await.unwrap_err();
    assert!(
        err.to_string().contains("still running here at epoch 1"),
        "{err}"
    );
    assert_eq!(runner.running(), vec![("web".to_string(), 1)]);
    // Stopped first, the next run starts.
    runner.stop("web").await;
    assert!(runner.running().is_empty());
    runner.start(start(2)).await.unwrap();
    assert_eq!(runner.running(), vec![("web".to_string(), 2)]);
    runner.stop("web").await;
    assert!(runner.running().is_empty());
}

/// A grace as long as a library caller likes (`Duration::MAX`): the
/// watchdog once overflowed turning it into nanoseconds and died on the
/// stop, so the session was killed at once instead of being let finish.
/// Now it is let finish, and the stop returns when it has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_with_the_longest_grace_lets_the_session_finish() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let runner = ExecRunner::new(
        env!("CARGO_BIN_EXE_leasehold").into(),
        clock.clone(),
        Duration::MAX,
    );
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    let script = format!(
        "trap 'sleep 0.3; echo done > {}; exit 0' TERM; echo up > {}.up; while :; do sleep 0.05; done",
        done.display(),
        done.display()
    );
    runner
        .start(SessionStart {
            name: "web".into(),
            node: "n1".into(),
            epoch: 1,
            spec: Spec::new("sh", &["-c", &script]),
            deadline: clock.now() + Duration::from_secs(60),
            channel: None,
        })
        .await
        .unwrap();
    let up = dir.path().join("done.up");
    for _ in 0..500 {
        if up.exists() {
            break;
        }
        clock.sleep(Duration::from_millis(10)).await;
    }
    assert!(up.exists(), "the session never started");
    runner.stop("web").await;
    assert!(runner.running().is_empty());
    assert_eq!(
        std::fs::read_to_string(&done).ok().as_deref(),
        Some("done\n"),
        "the session was not let finish its stop"
    );
}
