//! The session channel and the ack gate, with real node and session
//! processes: a run asks its node whether it still holds its claim
//! (`leasehold fence check|ack`); a run that ended is refused with why, a
//! forged credential as unknown; and a run whose node was frozen past its
//! lease, while a peer took the session over, is never acknowledged again.

mod common;

use common::procs::*;
use leasehold::fleet::claim::ClaimState;
use std::time::Duration;

const LH: &str = env!("CARGO_BIN_EXE_leasehold");

fn read(env: &Env, f: &str) -> String {
    std::fs::read_to_string(env.path(f))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_asks_its_node_and_an_ended_run_is_refused_with_why() {
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    env.apply_spec(
        "w",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!(
                "e=$LEASEHOLD_EPOCH; echo $LEASEHOLD_RUN_TOKEN > {d}/token.$e; echo $LEASEHOLD_NODE_SOCKET > {d}/socket.$e; \
                 {LH} fence check > {d}/check.$e 2>&1; echo $? > {d}/check.rc.$e; \
                 {LH} fence ack --margin 300ms > {d}/ack.$e 2>&1; echo $? > {d}/ack.rc.$e; exec sleep 1000")],
            "restart": "always"
        }),
    );
    wait_until("the first run asked", Duration::from_secs(20), async || {
        env.path("ack.rc.1").exists()
    })
    .await;
    assert_eq!(
        read(&env, "check.rc.1"),
        "0",
        "{}\n{}",
        read(&env, "check.1"),
        log_of(&n1)
    );
    assert!(
        read(&env, "check.1").starts_with("w epoch 1 on n1: running"),
        "{}",
        read(&env, "check.1")
    );
    assert_eq!(read(&env, "ack.rc.1"), "0", "{}", read(&env, "ack.1"));
    assert!(
        read(&env, "ack.1").contains("acknowledged"),
        "{}",
        read(&env, "ack.1")
    );
    // The credential is not in the run's argv.
    let token = read(&env, "token.1");
    assert_eq!(token.len(), 64, "{token}");
    let socket = read(&env, "socket.1");
    assert!(socket.starts_with('@'), "{socket}");
    // A new run (epoch 2): the old credential is refused with why.
    let o = bin()
        .args(["restart", "w", "--store", &env.url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    wait_until(
        "the second run asked",
        Duration::from_secs(20),
        async || env.path("ack.rc.2").exists(),
    )
    .await;
    assert_eq!(read(&env, "ack.rc.2"), "0", "{}", read(&env, "ack.2"));
    let ask = |token: &str, what: &str| {
        bin()
            .args(["fence", what])
            .env("LEASEHOLD_NODE_SOCKET", &socket)
            .env("LEASEHOLD_RUN_TOKEN", token)
            .output()
            .unwrap()
    };
    for what in ["check", "ack"] {
        let o = ask(&token, what);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "{what}: {err}");
        assert!(
            err.contains("this run of w (epoch 1) has ended"),
            "{what}: {err}"
        );
        let o = ask(&"f".repeat(64), what);
        assert_eq!(
            o.status.code(),
            Some(8),
            "{what}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Outside a session: typed, exit 2.
    let o = bin()
        .args(["fence", "ack"])
        .env_remove("LEASEHOLD_NODE_SOCKET")
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A node that is gone answers nothing: exit 4, never a yes.
    let o = bin()
        .args(["fence", "ack"])
        .env("LEASEHOLD_NODE_SOCKET", "@leasehold-nobody-here")
        .env("LEASEHOLD_RUN_TOKEN", &token)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let c = claim(&s, "w").await.unwrap();
    assert_eq!((c.state, c.epoch), (ClaimState::Running, 2));
}

/// Sends `sig` to each pid (a negative one: a process group) at once.
fn signal(pids: &[i32], sig: i32) {
    for p in pids {
        // SAFETY: plain kill(2) on processes this test started.
        unsafe { libc::kill(*p, sig) };
    }
}

fn ppid(pid: i32) -> i32 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    s.rsplit_once(')')
        .and_then(|x| x.1.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
}

/// The owner, its watchdog and its session frozen past the lease (a VM
/// paused, a process stopped), a peer takes over; the old run resumes
/// before its node and asks again: nothing of it is acknowledged once the
/// new run has been. (Here the dead-man switch ends the old run as its node
/// resumes; the gate's own part is `takeovers_the_node_has_not_seen_...`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_owner_s_run_is_never_acknowledged_after_a_takeover() {
    let env = Env::new();
    let s = env.store().await;
    let mut nodes = [env.node("n1", &[]), env.node("n2", &[])];
    let d = env.dir();
    env.apply_spec(
        "f",
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!(
                "echo $$ > {d}/f.$LEASEHOLD_EPOCH.pid; \
                 while :; do if {LH} fence ack --margin 300ms > /dev/null 2>&1; \
                 then echo \"$LEASEHOLD_EPOCH $(date +%s%N)\" >> {d}/acks; fi; sleep 0.05; done")],
            "restart": "always"
        }),
    );
    wait_until("acks at epoch 1", Duration::from_secs(20), async || {
        read(&env, "acks").lines().any(|l| l.starts_with("1 "))
    })
    .await;
    let c = claim(&s, "f").await.unwrap();
    assert_eq!(c.epoch, 1);
    let owner = if c.owner.node == "n1" { 0 } else { 1 };
    let session = env.pid("f.1.pid").unwrap();
    let watchdog = ppid(session);
    let node = nodes[owner].child.id() as i32;
    assert_eq!(
        ppid(watchdog),
        node,
        "the session's watchdog is its node's child"
    );
    signal(&[-session, watchdog, node], libc::SIGSTOP);
    wait_until(
        "acks at epoch 2 on the peer",
        Duration::from_secs(30),
        async || read(&env, "acks").lines().any(|l| l.starts_with("2 ")),
    )
    .await;
    // The old run first, its node still frozen: it asks, and waits.
    signal(&[-session], libc::SIGCONT);
    pause(500).await;
    signal(&[node, watchdog], libc::SIGCONT);
    pause(2000).await;
    let acks = read(&env, "acks");
    let at = |e: &str| -> Vec<u128> {
        acks.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(ep, _)| *ep == e)
            .filter_map(|(_, t)| t.parse().ok())
            .collect()
    };
    let (old, new) = (at("1"), at("2"));
    let first_new = *new.iter().min().unwrap();
    assert!(
        old.iter().all(|t| *t < first_new),
        "epoch 1 acknowledged after epoch 2 was: {acks}"
    );
    let c = claim(&s, "f").await.unwrap();
    assert!(c.epoch >= 2, "{c:?}");
    for n in &mut nodes {
        let _ = n.child.kill();
    }
}

/// One round: session `name` asks its node twice every 50 ms, from memory
/// (`fence check`) and through the gate (`fence ack`), each answer logged
/// with the time its question was asked; its claim is then taken over in
/// the bucket behind its node's back (a higher epoch naming another node,
/// as a takeover or an operator's hand would leave it; the node notices at
/// its next full listing). Returns (yes from memory, yes from the gate)
/// among questions asked after the takeover, and the gate's yes before it.
async fn takeover_round(
    env: &Env,
    s: &std::sync::Arc<dyn leasehold::store::Store>,
    name: &str,
) -> (usize, usize, usize) {
    use leasehold::store::Cond;
    let d = env.dir();
    env.apply_spec(
        name,
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!(
                "while :; do t=$(date +%s%N); \
                 if {LH} fence check > /dev/null 2>&1; then echo \"check $LEASEHOLD_EPOCH $t\" >> {d}/{name}.log; fi; \
                 t=$(date +%s%N); \
                 if {LH} fence ack --margin 100ms > /dev/null 2>&1; then echo \"ack $LEASEHOLD_EPOCH $t\" >> {d}/{name}.log; fi; \
                 sleep 0.05; done")],
            "restart": "never"
        }),
    );
    wait_until("acks", Duration::from_secs(20), async || {
        read(env, &format!("{name}.log"))
            .lines()
            .any(|l| l.starts_with("ack 1 "))
    })
    .await;
    let key = format!("sessions/{name}");
    let o = s.get(&key).await.unwrap().unwrap();
    let mut c = leasehold::fleet::claim::ClaimRecord::decode(&key, &o.bytes).unwrap();
    let old = c.epoch.to_string();
    c.owner.node = "n9".into();
    c.owner.instance = "feedface".into();
    c.epoch += 1;
    #[allow(clippy::disallowed_methods)] // the session's clock, to compare with its log
    let taken = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    s.put(&key, bytes::Bytes::from(c.encode()), Cond::Match(o.version))
        .await
        .unwrap();
    pause(3000).await;
    let log = read(env, &format!("{name}.log"));
    // Answers to the old run only (a later run of it, at a higher epoch,
    // is a legitimate holder: the node takes over the absent n9's claim).
    let after = |kind: &str| {
        log.lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .filter(|f| {
                f.len() == 3
                    && f[0] == kind
                    && f[1] == old
                    && f[2].parse::<u128>().is_ok_and(|t| t > taken)
            })
            .count()
    };
    let _ = bin().args(["delete", name, "--store", &env.url]).output();
    let acked_before = log
        .lines()
        .filter(|l| l.starts_with(&format!("ack {old} ")))
        .count()
        - after("ack");
    (after("check"), after("ack"), acked_before)
}

/// The gate's own part: while a node has not yet seen that its session was
/// taken over, its memory says "running" (`fence check`) but the gate,
/// which reads the claim, never says yes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeovers_the_node_has_not_seen_are_never_acknowledged() {
    let env = Env::new();
    let s = env.store().await;
    let _n1 = env.node("n1", &[]);
    let (_, acked, before) = takeover_round(&env, &s, "t0").await;
    assert!(
        before > 0,
        "the gate acknowledged nothing before the takeover"
    );
    assert_eq!(acked, 0, "the gate acknowledged a run after its takeover");
}

/// The same, many rounds: `LEASEHOLD_FENCE_ROUNDS=100 cargo test --release
/// --test fence -- --ignored --nocapture fence_soak` (docs/evidence.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn fence_soak() {
    let rounds: usize = std::env::var("LEASEHOLD_FENCE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    let env = Env::new();
    let s = env.store().await;
    let _n1 = env.node("n1", &[]);
    let (mut from_memory, mut from_gate, mut rounds_memory_wrong) = (0, 0, 0);
    for i in 0..rounds {
        let (m, g, _) = takeover_round(&env, &s, &format!("t{i}")).await;
        from_memory += m;
        from_gate += g;
        rounds_memory_wrong += usize::from(m > 0);
    }
    println!(
        "fence-soak rounds={rounds} yes_after_takeover: memory={from_memory} (in {rounds_memory_wrong} rounds) gate={from_gate}"
    );
    assert_eq!(from_gate, 0);
}

/// One frozen-owner round (as `a_frozen_owner_s_run_is_never_...`): the
/// session asks from memory and through the gate every 50 ms, logging the
/// epoch and the time each question was asked; its owner, watchdog and
/// session are frozen until a peer's run has been acknowledged, then the
/// old run is resumed first. Returns the old run's yes (memory, gate) to
/// questions asked after the new run's first acknowledgement.
async fn frozen_round(
    env: &Env,
    s: &std::sync::Arc<dyn leasehold::store::Store>,
    name: &str,
    nodes: &mut [Node; 2],
) -> (usize, usize) {
    let d = env.dir();
    env.apply_spec(
        name,
        serde_json::json!({
            "command": "sh",
            "args": ["-c", format!(
                "echo $$ > {d}/{name}.$LEASEHOLD_EPOCH.pid; \
                 while :; do t=$(date +%s%N); \
                 if {LH} fence check > /dev/null 2>&1; then echo \"check $LEASEHOLD_EPOCH $t\" >> {d}/{name}.log; fi; \
                 t=$(date +%s%N); \
                 if {LH} fence ack --margin 300ms > /dev/null 2>&1; then echo \"ack $LEASEHOLD_EPOCH $t\" >> {d}/{name}.log; fi; \
                 sleep 0.05; done")],
            "restart": "always"
        }),
    );
    let log = format!("{name}.log");
    wait_until("acks", Duration::from_secs(30), async || {
        read(env, &log).lines().any(|l| l.starts_with("ack "))
    })
    .await;
    let c = claim(s, name).await.unwrap();
    let old = c.epoch;
    let owner = usize::from(c.owner.node != "n1");
    let session = env.pid(&format!("{name}.{old}.pid")).unwrap();
    let watchdog = ppid(session);
    let node = nodes[owner].child.id() as i32;
    eprintln!("{name}: epoch {old} on {}", c.owner.node);
    signal(&[-session, watchdog, node], libc::SIGSTOP);
    let newer = |l: &str| {
        l.starts_with("ack ")
            && l.split(' ')
                .nth(1)
                .and_then(|e| e.parse::<u64>().ok())
                .is_some_and(|e| e > old)
    };
    let mut taken = false;
    for _ in 0..600 {
        if read(env, &log).lines().any(newer) {
            taken = true;
            break;
        }
        pause(50).await;
    }
    if !taken {
        signal(&[-session, watchdog, node], libc::SIGCONT);
        let tail = |n: &Node| {
            let l = log_of(n);
            let v: Vec<&str> = l.lines().collect();
            v[v.len().saturating_sub(30)..].join("\n")
        };
        panic!(
            "no acknowledged run of {name} above epoch {old} within 30 s: {:?}\n--- n1\n{}\n--- n2\n{}\n--- log\n{}",
            claim(s, name).await,
            tail(&nodes[0]),
            tail(&nodes[1]),
            read(env, &log),
        );
    }
    signal(&[-session], libc::SIGCONT);
    pause(500).await;
    signal(&[node, watchdog], libc::SIGCONT);
    pause(1500).await;
    let text = read(env, &log);
    let first_new: u128 = text
        .lines()
        .filter(|l| newer(l))
        .filter_map(|l| l.split(' ').nth(2)?.parse().ok())
        .min()
        .unwrap();
    let stale = |kind: &str| {
        text.lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .filter(|f| {
                f.len() == 3
                    && f[0] == kind
                    && f[1] == old.to_string()
                    && f[2].parse::<u128>().is_ok_and(|t| t > first_new)
            })
            .count()
    };
    let _ = bin().args(["delete", name, "--store", &env.url]).output();
    (stale("check"), stale("ack"))
}

/// Frozen owners, many rounds: `LEASEHOLD_FENCE_ROUNDS=100 cargo test
/// --test fence -- --ignored --nocapture fence_soak_frozen`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn fence_soak_frozen() {
    let rounds: usize = std::env::var("LEASEHOLD_FENCE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(10);
    let env = Env::new();
    let s = env.store().await;
    let mut nodes = [env.node("n1", &[]), env.node("n2", &[])];
    let (mut memory, mut gate) = (0, 0);
    for i in 0..rounds {
        let (m, g) = frozen_round(&env, &s, &format!("f{i}"), &mut nodes).await;
        memory += m;
        gate += g;
    }
    println!(
        "fence-soak-frozen rounds={rounds} stale_yes_after_new_ack: memory={memory} gate={gate}"
    );
    assert_eq!(gate, 0);
}

/// A run may call its node's channel before its watchdog has reported its
/// pid (the runner records the run only then): such a call is the current
/// run's, never "ended" (exit 3). Sixteen sessions call `fence check` as
/// their first act, while three threads here keep the CPUs busy (which
/// widens the window between a run's start and its record: with the runner
/// not counting runs being started, 4 of 4 attempts failed, 2026-12-06);
/// each is answered running. (Seen once in eight runs of the test command
/// before: `leasehold sleep` refused at a run's start, exit 3 for exit 2.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_calls_its_node_at_once_is_current() {
    let env = Env::new();
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let spinners: Vec<_> = (0..3)
        .map(|_| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                while busy.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let n1 = env.node("n1", &[]);
    let d = env.dir();
    let names: Vec<String> = (0..16).map(|i| format!("quick{i:02}")).collect();
    for n in &names {
        env.apply_spec(
            n,
            serde_json::json!({
                "command": "sh",
                "args": ["-c", format!(
                    "{LH} fence check > {d}/{n}.out 2>&1; echo $? > {d}/{n}.rc; exec sleep 1000")],
                "restart": "always"
            }),
        );
    }
    wait_until("every run asked", Duration::from_secs(60), async || {
        names
            .iter()
            .all(|n| !read(&env, &format!("{n}.rc")).is_empty())
    })
    .await;
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    for n in &names {
        assert_eq!(
            read(&env, &format!("{n}.rc")),
            "0",
            "{n}: {}\n{}",
            read(&env, &format!("{n}.out")),
            log_of(&n1)
        );
    }
}
