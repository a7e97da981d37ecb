//! The bucket as an adversary, with real node processes on the local store:
//! objects deleted under a running fleet, stray and oversized objects,
//! corrupt and newer-schema manifests. None may let two nodes run one
//! session, reissue a fencing token a node has seen, or stall the fleet.
//!
//! Each session appends `<epoch> <pid>` to `<name>.runs` when it starts, so a
//! test sees every run of it and whether it is alive.

mod common;

use common::procs::*;
use leasehold::fleet::claim::ClaimState;
use leasehold::store::{Cond, Store};
use std::sync::Arc;
use std::time::Duration;

/// A session that records its runs and sleeps.
fn recorder(env: &Env, name: &str) -> String {
    format!(
        "echo \"$LEASEHOLD_EPOCH $$\" >> {}/{name}.runs; exec sleep 1000",
        env.dir()
    )
}

/// (epoch, pid) of every run so far.
fn runs(env: &Env, name: &str) -> Vec<(u64, i32)> {
    std::fs::read_to_string(env.path(&format!("{name}.runs")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (e, p) = l.split_once(' ')?;
            Some((e.parse().ok()?, p.parse().ok()?))
        })
        .collect()
}

/// Watches `name`'s runs for `dur`: every time a run starts, no earlier run
/// may still be alive (two holders at once). Returns the runs seen.
async fn never_two_alive(env: &Env, name: &str, dur: Duration) -> Vec<(u64, i32)> {
    let steps = dur.as_millis() / 10;
    for _ in 0..steps {
        let r = runs(env, name);
        let live: Vec<_> = r.iter().filter(|(_, p)| alive(*p)).collect();
        assert!(live.len() <= 1, "{name} runs twice at once: {r:?}");
        pause(10).await;
    }
    runs(env, name)
}

/// Two nodes with the session on n1 (n2, listening, has seen its claim).
async fn fleet_of_two(env: &Env, name: &str) -> (Node, Node, Arc<dyn Store>) {
    let s = env.store().await;
    let token = env.path("token");
    let n1 = env.node("n1", &[]);
    env.apply(name, &recorder(env, name), "always");
    wait_until("the session on n1", Duration::from_secs(20), async || {
        runs(env, name).len() == 1
    })
    .await;
    let n2 = env.node(
        "n2",
        &["--listen", "0", "--token-file", token.to_str().unwrap()],
    );
    wait_until("n2 registered", Duration::from_secs(10), async || {
        node_record(&s, "n2").await.is_some()
    })
    .await;
    pause(500).await; // a few passes of n2: it has seen the claim
    (n1, n2, s)
}

/// The owner's run `pid` ends within 3 s, and its log says `why` within 2 s
/// more.
async fn owner_stops_saying(owner: &Node, pid: i32, why: &str) {
    wait_until("the owner stops", Duration::from_secs(3), async || {
        !alive(pid)
    })
    .await;
    wait_until("the owner says why", Duration::from_secs(2), async || {
        log_of(owner).contains(why)
    })
    .await;
}

/// `leasehold ls` reports a CORRUPT row.
fn ls_shows_corrupt(env: &Env) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["ls", "--store", &env.url])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.to_lowercase().contains("corrupt"), "{out}");
}

fn api_port(n: &Node) -> Option<u16> {
    log_of(n)
        .split("bound=127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
}

/// `POST /v1/sessions/{name}/claim` on a node's API; (status, body).
fn post_claim(port: u16, name: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "POST /v1/sessions/{name}/claim HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, out)
}

/// Case 1: `nodes/n1` deleted while n1 runs. A peer's claim endpoint once
/// took the session over 6 ms later. Absence is an observation: the peer
/// declines, n1 finds its record gone at its next renewal and stops, and
/// the session never runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_record_is_not_a_death_certificate() {
    let env = Env::new();
    let (n1, n2, s) = fleet_of_two(&env, "web").await;
    let port = api_port(&n2).unwrap();
    s.delete("nodes/n1").await.unwrap();
    let (code, body) = tokio::task::spawn_blocking(move || post_claim(port, "web"))
        .await
        .unwrap();
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("declined"), "{body}");
    let seen = never_two_alive(&env, "web", Duration::from_secs(5)).await;
    // Someone runs it again in the end (n1's new instance, or n2), at a
    // higher epoch, after the first run died.
    assert!(seen.len() >= 2, "{seen:?}\nn1:\n{}", log_of(&n1));
    assert!(seen[1].0 > seen[0].0, "{seen:?}");
    assert!(!alive(seen[0].1));
    drop((n1, n2));
}

/// Case 2: `sessions/web` deleted while n1 runs it. The owner once kept
/// running and a peer made the claim again at epoch 1. Now the owner stops
/// at its next pass, the peer waits out the absence, and the claim comes
/// back above the epoch it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_claim_stops_its_owner_and_is_not_reissued_at_epoch_1() {
    let env = Env::new();
    let (n1, n2, s) = fleet_of_two(&env, "web").await;
    let first = runs(&env, "web")[0];
    s.delete("sessions/web").await.unwrap();
    owner_stops_saying(&n1, first.1, "claim deleted").await;
    let seen = never_two_alive(&env, "web", Duration::from_secs(6)).await;
    assert!(seen.len() >= 2, "never ran again: {seen:?}");
    assert!(
        seen[1..].iter().all(|(e, _)| *e >= 2),
        "epoch reissued: {seen:?}"
    );
    let c = claim(&s, "web").await.unwrap();
    assert!(c.epoch >= 2 && c.state == ClaimState::Running, "{c:?}");
    drop((n1, n2));
}

/// Case 4 for a claim that is held: `sessions/web` overwritten with bytes
/// that are not a claim while n1 runs it. The owner cannot show it holds the
/// session any more (and its next fenced write would fail), so it stops at
/// its next pass; no peer takes over a claim it cannot read, so the session
/// stays down and the key is reported, until an operator repairs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_claim_overwritten_with_garbage_stops_its_owner_and_nobody_takes_it() {
    let env = Env::new();
    let (n1, n2, s) = fleet_of_two(&env, "web").await;
    let first = runs(&env, "web")[0];
    let cur = s.get("sessions/web").await.unwrap().unwrap();
    s.put(
        "sessions/web",
        bytes::Bytes::from_static(b"{ not a claim"),
        Cond::Match(cur.version),
    )
    .await
    .unwrap();
    owner_stops_saying(
        &n1,
        first.1,
        "claim overwritten with bytes that are not a claim",
    )
    .await;
    // Nobody runs it while the claim is unreadable, for well over a ttl.
    let seen = never_two_alive(&env, "web", Duration::from_secs(4)).await;
    assert_eq!(seen.len(), 1, "a corrupt claim was taken over: {seen:?}");
    ls_shows_corrupt(&env);
    drop((n1, n2));
}

/// Case 4: stray and oversized objects under every prefix. Once, one such
/// object made every pass of every node fail, and a killed node's sessions
/// stayed down. Now each affects its own key: failover goes on, and `ls`
/// shows the objects as corrupt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stray_and_oversized_objects_do_not_stop_failover() {
    let env = Env::new();
    let s = env.store().await;
    let mut n1 = env.node("n1", &[]);
    for i in 0..4 {
        env.apply(
            &format!("s{i}"),
            &recorder(&env, &format!("s{i}")),
            "always",
        );
    }
    wait_until("all four on n1", Duration::from_secs(20), async || {
        (0..4).all(|i| runs(&env, &format!("s{i}")).len() == 1)
    })
    .await;
    let n2 = env.node("n2", &[]);
    pause(500).await;
    // Foreign files (no local-store header) and a 2 MiB object under each
    // prefix, written behind the store's back, as another tool would.
    let root = env.path("bucket");
    for prefix in ["sessions", "manifests", "nodes"] {
        std::fs::write(root.join(prefix).join("notes.txt"), "hello\n").unwrap();
        std::fs::write(root.join(prefix).join("big"), vec![b'x'; 2 << 20]).unwrap();
        // Names the store cannot address: listed, each stopped `ls`,
        // `describe`, `watch` and `gc` (exit 2, "invalid request").
        for name in ["a:b", "bad name", "UPPER~tilde"] {
            std::fs::write(root.join(prefix).join(name), "hello\n").unwrap();
        }
    }
    n1.child.kill().unwrap();
    n1.child.wait().unwrap();
    wait_until(
        "all four moved to n2",
        Duration::from_secs(20),
        async || (0..4).all(|i| runs(&env, &format!("s{i}")).len() == 2),
    )
    .await;
    for i in 0..4 {
        let c = claim(&s, &format!("s{i}")).await.unwrap();
        assert_eq!((c.owner.node.as_str(), c.epoch), ("n2", 2));
    }
    ls_shows_corrupt(&env);
    drop(n2);
}

/// Case 5: a manifest overwritten with garbage, truncated, emptied, or
/// written by a newer version. The owner once logged "manifest deleted"
/// and released the claim. Now the session runs on as last known, and the
/// key is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_or_newer_manifest_leaves_its_session_running() {
    let env = Env::new();
    let s = env.store().await;
    let n1 = env.node("n1", &[]);
    env.apply("web", &recorder(&env, "web"), "always");
    wait_until("web running", Duration::from_secs(20), async || {
        runs(&env, "web").len() == 1
    })
    .await;
    let good = s.get("manifests/web").await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&good.bytes).into_owned();
    let newer = text.replace("leasehold/v1", "leasehold/v9");
    let truncated = text[..text.len() / 2].to_string();
    let mut version = good.version.clone();
    for bad in ["garbage", truncated.as_str(), "", newer.as_str()] {
        version = s
            .put(
                "manifests/web",
                bytes::Bytes::from(bad.to_string()),
                Cond::Match(version),
            )
            .await
            .unwrap();
        pause(1500).await; // several passes
        let r = runs(&env, "web");
        assert_eq!(r.len(), 1, "restarted after {bad:?}: {r:?}");
        assert!(alive(r[0].1), "stopped after {bad:?}");
        let c = claim(&s, "web").await.unwrap();
        assert_eq!(c.state, ClaimState::Running, "after {bad:?}: {c:?}");
    }
    let log = log_of(&n1);
    assert!(!log.contains("manifest deleted"), "{log}");
    assert!(log.contains("corrupt"), "{log}");
    // Repaired: the same spec again, the session untouched.
    s.put("manifests/web", good.bytes.clone(), Cond::Match(version))
        .await
        .unwrap();
    pause(1000).await;
    assert_eq!(runs(&env, "web").len(), 1);
    drop(n1);
}

/// Case 2, with an owner that cannot notice: n1 is frozen (SIGSTOP) when its
/// claim is deleted. Its session lives on until n1's deadline (its lease's
/// validity, at most ttl − margin); n2 has seen the claim, so it waits out
/// the absence (max(max_poll, ttl) + ttl + margin) before making it again,
/// by which time the frozen owner's session is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_claim_of_a_frozen_owner_waits_out_its_absence() {
    let env = Env::new();
    let (n1, n2, s) = fleet_of_two(&env, "web").await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(n1.child.id() as i32, libc::SIGSTOP) };
    s.delete("sessions/web").await.unwrap();
    let seen = never_two_alive(&env, "web", Duration::from_secs(6)).await;
    assert!(
        seen.len() >= 2,
        "never ran again: {seen:?}\n{}",
        log_of(&n2)
    );
    assert!(
        seen[1..].iter().all(|(e, _)| *e >= 2),
        "epoch reissued: {seen:?}"
    );
    drop((n1, n2));
}

/// Case 3: the bucket wiped under a running fleet (every object deleted, as
/// an S3 server restarted empty). Once, claims started again at epoch 1 and
/// nothing noticed. Now the node sees its fleet marker gone, stops every
/// session and exits (5: "bucket wiped or replaced"); a node started on the
/// wiped bucket refuses (7: init it); `init` will not silently change the
/// generation of a live marker; and after `init --generation 2` every token
/// is above every token of generation 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_bucket_stops_the_fleet_and_tokens_are_never_reissued() {
    use futures::StreamExt;
    let env = Env::new();
    let s = env.store().await;
    let bin = || std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"));
    let o = bin()
        .args(["init", "--store", &env.url, "--generation", "2"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut n1 = env.node("n1", &[]);
    env.apply("web", &recorder(&env, "web"), "always");
    wait_until("web running", Duration::from_secs(20), async || {
        runs(&env, "web").len() == 1
    })
    .await;
    let first = runs(&env, "web")[0];
    assert_eq!(first.0, 1);
    // Wipe: every object goes.
    let keys: Vec<String> = s
        .list("")
        .filter_map(|e| async move { e.ok().map(|e| e.key) })
        .collect()
        .await;
    assert!(keys.iter().any(|k| k == "fleet"), "{keys:?}");
    for k in &keys {
        s.delete(k).await.unwrap();
    }
    let mut status = None;
    wait_until("n1 stops", Duration::from_secs(10), async || {
        status = n1.child.try_wait().unwrap();
        status.is_some()
    })
    .await;
    assert_eq!(status.unwrap().code(), Some(5), "{}", log_of(&n1));
    assert!(
        log_of(&n1).contains("bucket wiped or replaced"),
        "{}",
        log_of(&n1)
    );
    assert!(!alive(first.1), "the session outlived the wipe");
    // A node started on the wiped bucket refuses; nothing is written.
    let mut n2 = env.node("n2", &[]);
    let mut status = None;
    wait_until("n2 refuses", Duration::from_secs(10), async || {
        status = n2.child.try_wait().unwrap();
        status.is_some()
    })
    .await;
    assert_eq!(status.unwrap().code(), Some(7), "{}", log_of(&n2));
    assert!(log_of(&n2).contains("leasehold init"), "{}", log_of(&n2));
    assert!(s.get("nodes/n2").await.unwrap().is_none());
    // A new generation: tokens start above 2^40.
    let o = bin()
        .args(["init", "--store", &env.url, "--generation", "2", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["first_epoch"], (1u64 << 40) + 1);
    let _n3 = env.node("n3", &[]);
    env.apply("web", &recorder(&env, "web"), "always");
    wait_until("web running again", Duration::from_secs(20), async || {
        runs(&env, "web").len() == 2
    })
    .await;
    let again = runs(&env, "web")[1];
    assert_eq!(again.0, (1 << 40) + 1, "{again:?}");
    let c = claim(&s, "web").await.unwrap();
    assert!(c.epoch > first.0);
    let (rec, _) = node_record(&s, "n3").await.unwrap();
    assert_eq!(rec.epoch, (1 << 40) + 1);
}

/// A claim deleted and its manifest applied again at once (a GitOps loop):
/// `apply` writes no placeholder over an existing manifest, and the claim
/// endpoint declines a claim that vanished moments ago; the session comes
/// back above its old epoch, never beside its owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_claim_reapplied_at_once_is_still_an_absence() {
    let env = Env::new();
    let (n1, n2, s) = fleet_of_two(&env, "web").await;
    let port = api_port(&n2).unwrap();
    s.delete("sessions/web").await.unwrap();
    env.apply("web", &recorder(&env, "web"), "always");
    assert!(
        s.get("sessions/web").await.unwrap().is_none(),
        "apply wrote a placeholder"
    );
    let (code, body) = tokio::task::spawn_blocking(move || post_claim(port, "web"))
        .await
        .unwrap();
    assert_eq!(code, 409, "{body}");
    let seen = never_two_alive(&env, "web", Duration::from_secs(6)).await;
    assert!(seen.len() >= 2, "never ran again: {seen:?}");
    assert!(
        seen[1..].iter().all(|(e, _)| *e >= 2),
        "epoch reissued: {seen:?}"
    );
    drop((n1, n2));
}

/// Claims at the top of the epoch range, written by someone else: one at
/// `MAX_EPOCH` (it decodes, and has no successor) and one above it (foreign
/// bytes). A node once panicked on `epoch + 1` for the first (a release
/// build would have wrapped to a token below the last one) and panicked
/// again at every restart, so one object stopped every node ranked for
/// it. Now neither is claimed, the node keeps its sessions and places the
/// next one, and `ls` reports the one above the bound as corrupt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_at_the_highest_epoch_stop_no_node() {
    use leasehold::record::MAX_EPOCH;
    let env = Env::new();
    let s = env.store().await;
    let token = env.path("token");
    let mut n1 = env.node(
        "n1",
        &["--listen", "0", "--token-file", token.to_str().unwrap()],
    );
    env.apply("before", &recorder(&env, "before"), "always");
    wait_until("before on n1", Duration::from_secs(20), async || {
        runs(&env, "before").len() == 1
    })
    .await;
    for (name, epoch) in [("top", MAX_EPOCH), ("over", u64::MAX)] {
        let c = serde_json::json!({
            "schema": leasehold::record::SCHEMA, "kind": "session",
            "owner": {"node": "queued", "instance": "queued"},
            "epoch": epoch, "state": "released", "digest": "", "restarts": 0,
            "updated_at_ms": 0, "nonce": "0000000000000001",
        });
        let key = format!("sessions/{name}");
        s.put(&key, c.to_string().into(), Cond::Create)
            .await
            .unwrap();
        env.apply(name, &recorder(&env, name), "always");
    }
    env.apply("after", &recorder(&env, "after"), "always");
    wait_until("after on n1", Duration::from_secs(20), async || {
        runs(&env, "after").len() == 1
    })
    .await;
    wait_until("n1 says why", Duration::from_secs(10), async || {
        log_of(&n1).contains("no fencing token above it")
    })
    .await;
    pause(1500).await; // more passes, each looking at both
    assert!(n1.child.try_wait().unwrap().is_none(), "{}", log_of(&n1));
    assert!(!log_of(&n1).contains("panicked"), "{}", log_of(&n1));
    assert_eq!(runs(&env, "before").len(), 1);
    assert!(runs(&env, "top").is_empty() && runs(&env, "over").is_empty());
    assert_eq!(claim(&s, "top").await.unwrap().epoch, MAX_EPOCH);
    // The claim endpoint declines it, and says why.
    let port = api_port(&n1).unwrap();
    let (code, body) = tokio::task::spawn_blocking(move || post_claim(port, "top"))
        .await
        .unwrap();
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("highest epoch"), "{body}");
    // Said once, not at every pass (nor is its owner read every pass).
    assert_eq!(
        log_of(&n1)
            .matches("no fencing token above it exists; not claimed")
            .count(),
        1,
        "{}",
        log_of(&n1)
    );
    ls_shows_corrupt(&env);
    // The operator's clean-up: delete it, then gc. gc once raised the
    // floor past what a marker may hold, and every node stopped on a
    // marker it could not read. It leaves the stuck claim; the fleet serves.
    for args in [vec!["delete", "top"], vec!["gc", "--older-than", "0s"]] {
        let o = bin()
            .args(&args)
            .args(["--store", &env.url])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    leasehold::fleet::marker::require(&s).await.unwrap();
    assert_eq!(claim(&s, "top").await.unwrap().epoch, MAX_EPOCH);
    env.apply("again", &recorder(&env, "again"), "always");
    wait_until("again on n1", Duration::from_secs(20), async || {
        runs(&env, "again").len() == 1
    })
    .await;
    assert!(n1.child.try_wait().unwrap().is_none(), "{}", log_of(&n1));
}

/// gc's epoch floor in the fleet marker at or above the highest epoch
/// (foreign bytes): a node once panicked on `floor + 1` at start. Now it
/// stops with a typed error naming the cause (exit 2 for a floor with no
/// token above it, 5 for one beyond the bound, which is corruption).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_floor_at_the_highest_epoch_stops_a_node_with_an_error() {
    use leasehold::fleet::marker;
    for (floor, code, says) in [
        (leasehold::record::MAX_EPOCH, 2, "no fencing token above it"),
        (u64::MAX, 5, "epoch_floor above"),
    ] {
        let env = Env::new();
        let s = env.store().await;
        let (mut m, v) = marker::require(&s).await.unwrap();
        m.epoch_floor = floor;
        s.put(
            marker::KEY,
            serde_json::to_vec(&m).unwrap().into(),
            Cond::Match(v),
        )
        .await
        .unwrap();
        let mut n = env.node("n1", &[]);
        let mut status = None;
        wait_until("the node stops", Duration::from_secs(10), async || {
            status = n.child.try_wait().unwrap();
            status.is_some()
        })
        .await;
        let log = log_of(&n);
        assert_eq!(status.unwrap().code(), Some(code), "{log}");
        assert!(log.contains(says) && !log.contains("panicked"), "{log}");
        assert!(s.get("nodes/n1").await.unwrap().is_none());
    }
}

/// An owner whose node record is there but corrupt is not absent: nodes
/// leave its sessions alone (corruption is never read as absence), so `ls`
/// and `describe` must not promise a takeover. They once listed only the
/// records that decoded, and said "owner ghost has no node record; taken
/// over once that is observed" and "absent".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_with_a_corrupt_record_is_not_called_absent() {
    let env = Env::new();
    let s = env.store().await;
    env.apply("web", &recorder(&env, "web"), "always");
    let digest = leasehold::fleet::manifest::get(&s, &leasehold::Name::new("web").unwrap())
        .await
        .unwrap()
        .unwrap()
        .0
        .digest;
    let c = serde_json::json!({
        "schema": leasehold::record::SCHEMA, "kind": "session",
        "owner": {"node": "ghost", "instance": "g1"},
        "epoch": 5, "state": "running", "digest": digest, "restarts": 0,
        "updated_at_ms": 1000, "nonce": "0000000000000002",
    });
    let current = s.get("sessions/web").await.unwrap().unwrap().version;
    s.put("sessions/web", c.to_string().into(), Cond::Match(current))
        .await
        .unwrap();
    s.put("nodes/ghost", "garbage".into(), Cond::Create)
        .await
        .unwrap();
    let cli = |args: &[&str]| {
        let o = bin()
            .args(args)
            .args(["--store", &env.url])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    for out in [cli(&["ls"]), cli(&["describe", "web"])] {
        assert!(out.contains("ghost's node record is unreadable"), "{out}");
        assert!(
            !out.contains("taken over once") && !out.contains("absent"),
            "{out}"
        );
    }
    let j: serde_json::Value = serde_json::from_str(&cli(&["describe", "web", "--json"])).unwrap();
    assert_eq!(j["owner_liveness"], "unreadable", "{j}");
    assert_eq!(j["status"], "interrupted", "{j}");
}
