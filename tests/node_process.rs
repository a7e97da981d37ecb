//! Nodes as separate OS processes (the built binary), with real session
//! processes under the dead-man switch: kill -9 of a node, SIGSTOP of a node
//! past its TTL followed by SIGCONT, and SIGTERM. On the local directory store
//! always, and on moto when scripts/test provides it.
//!
//! Each session writes its pid to `pid.<epoch>` so the test can see which
//! process runs at which epoch and whether it is still alive.

mod common;

use leasehold::fleet::claim::{ClaimRecord, ClaimState};
use leasehold::store::{OpenOptions, Store, open_store};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

struct Node {
    child: Child,
    log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Env {
    dir: tempfile::TempDir,
    url: String,
    /// An S3 endpoint other than the environment's (Ceph RGW beside moto).
    endpoint: Option<String>,
}

/// `leasehold init`: the fleet marker nodes need.
fn init(url: &str, endpoint: Option<&str>) {
    let mut c = bin();
    if let Some(e) = endpoint {
        c.env("AWS_ENDPOINT_URL", e);
    }
    let o = c.args(["init", "--store", url]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    c.env_remove("LEASEHOLD_STORE");
    c
}

impl Env {
    fn local() -> Env {
        let dir = crate::common::session_dir();
        let url = format!("file://{}/bucket", dir.path().display());
        init(&url, None);
        Env {
            dir,
            url,
            endpoint: None,
        }
    }

    fn moto() -> Option<Env> {
        let base = common::server("LEASEHOLD_TEST_S3")?;
        Some(Self::on_s3(base, None))
    }

    /// Ceph RGW: a node learns its ETag dialect from its start-up probe.
    fn rgw() -> Option<Env> {
        let (base, endpoint) = common::rgw()?;
        Some(Self::on_s3(base, Some(endpoint)))
    }

    fn on_s3(base: String, endpoint: Option<String>) -> Env {
        let dir = crate::common::session_dir();
        let url = format!(
            "{base}/proc-{}",
            dir.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .replace('.', "")
        );
        init(&url, endpoint.as_deref());
        Env { dir, url, endpoint }
    }

    fn cmd(&self) -> Command {
        let mut c = bin();
        if let Some(e) = &self.endpoint {
            c.env("AWS_ENDPOINT_URL", e);
        }
        c
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }

    fn node(&self, id: &str) -> Node {
        self.node_with_ttl(id, "1s")
    }

    fn node_with_ttl(&self, id: &str, ttl: &str) -> Node {
        self.node_on_host(id, ttl, "")
    }

    /// As `node_with_ttl`, as if on another host `host` (its own lock and
    /// state directories): a second instance of one node id is not stopped
    /// by the first one's host lock.
    fn node_on_host(&self, id: &str, ttl: &str, host: &str) -> Node {
        self.node_with_args(id, ttl, host, &[])
    }

    /// As `node_on_host`, with `extra` arguments to `node run`.
    fn node_with_args(&self, id: &str, ttl: &str, host: &str, extra: &[&str]) -> Node {
        let log = self.path(&format!("{id}-{ttl}{host}.log"));
        let child = self
            .cmd()
            .args([
                "node",
                "run",
                "--store",
                &self.url,
                "--id",
                id,
                "--ttl",
                ttl,
                "--stop-grace",
                "500ms",
            ])
            .args(extra)
            .env("LEASEHOLD_LOCK_DIR", self.path(&format!("locks{host}")))
            .env("LEASEHOLD_STATE_DIR", self.path(&format!("state{host}")))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Node { child, log }
    }

    fn apply_sleeper(&self) {
        let m = serde_json::json!({
            "name": "sleeper",
            "spec": {
                "command": "sh",
                "args": ["-c", format!("echo $$ > {}/pid.$LEASEHOLD_EPOCH; exec sleep 1000", self.dir.path().display())],
                "restart": "always",
            }
        });
        let f = self.path("m.json");
        std::fs::write(&f, m.to_string()).unwrap();
        let o = self
            .cmd()
            .args(["apply", f.to_str().unwrap(), "--store", &self.url])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    fn pid(&self, epoch: u64) -> Option<i32> {
        std::fs::read_to_string(self.path(&format!("pid.{epoch}")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    async fn claim(&self, store: &Arc<dyn Store>) -> Option<ClaimRecord> {
        let o = store.get("sessions/sleeper").await.ok()??;
        ClaimRecord::decode("sessions/sleeper", &o.bytes).ok()
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[allow(clippy::disallowed_methods)] // waiting in tests is on the real clock; nothing here is timed
async fn wait_until(what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[allow(clippy::disallowed_methods)]
async fn pause(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

fn log_of(n: &Node) -> String {
    std::fs::read_to_string(&n.log).unwrap_or_default()
}

async fn store(env: &Env) -> Arc<dyn Store> {
    let opts = OpenOptions {
        endpoint: env.endpoint.clone(),
        ..Default::default()
    };
    open_store(&env.url, &opts).await.unwrap()
}

/// Starts n1, places the session there, then starts n2.
async fn two_nodes_session_on_n1(env: &Env) -> (Node, Node, Arc<dyn Store>, i32) {
    let s = store(env).await;
    let n1 = env.node("n1");
    env.apply_sleeper();
    wait_until("epoch 1 running", 20, async || env.pid(1).is_some()).await;
    let n2 = env.node("n2");
    let c = env.claim(&s).await.unwrap();
    assert_eq!((c.owner.node.as_str(), c.epoch), ("n1", 1));
    let pid1 = env.pid(1).unwrap();
    assert!(alive(pid1));
    (n1, n2, s, pid1)
}

async fn kill_9(env: Env) {
    let (mut n1, n2, s, pid1) = two_nodes_session_on_n1(&env).await;
    n1.child.kill().unwrap(); // SIGKILL
    n1.child.wait().unwrap();
    // The watchdog sees its node vanish and kills the session at once.
    wait_until("epoch 1 killed", 5, async || !alive(pid1)).await;
    // After the node lease is observed unchanged for ttl + margin, n2 claims.
    wait_until("epoch 2 on n2", 20, async || env.pid(2).is_some_and(alive)).await;
    let c = env.claim(&s).await.unwrap();
    assert_eq!(
        (c.owner.node.as_str(), c.epoch, c.state),
        ("n2", 2, ClaimState::Running)
    );
    assert!(log_of(&n2).contains("claimed"), "{}", log_of(&n2));
    drop(n2);
    wait_until("no sessions left", 5, async || {
        !env.pid(2).is_some_and(alive)
    })
    .await;
}

async fn sigstop(env: Env) {
    let (n1, n2, s, pid1) = two_nodes_session_on_n1(&env).await;
    let p1 = n1.child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(p1, libc::SIGSTOP) };
    // Frozen, n1 cannot stop its session; its watchdog kills it when the last
    // announced deadline passes, before any peer can take over.
    wait_until("epoch 2 started", 20, async || env.pid(2).is_some()).await;
    assert!(!alive(pid1), "epoch 1 must be dead before epoch 2 starts");
    let c = env.claim(&s).await.unwrap();
    assert_eq!((c.owner.node.as_str(), c.epoch), ("n2", 2));
    // SAFETY: as above.
    unsafe { libc::kill(p1, libc::SIGCONT) };
    // Awake, n1 finds its lease lost, drops the session and re-registers; it
    // does not run epoch 1 again and does not take the session back.
    wait_until("n1 re-registers", 20, async || {
        log_of(&n1).contains("re-registering")
    })
    .await;
    pause(1500).await;
    assert!(!alive(pid1));
    let c = env.claim(&s).await.unwrap();
    assert_eq!(
        (c.owner.node.as_str(), c.epoch),
        ("n2", 2),
        "n1 log:\n{}",
        log_of(&n1)
    );
    assert!(env.pid(2).is_some_and(alive));
    assert!(env.pid(3).is_none());
    drop((n1, n2));
}

async fn sigterm(env: Env) {
    let (n1, n2, s, pid1) = two_nodes_session_on_n1(&env).await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(n1.child.id() as i32, libc::SIGTERM) };
    let mut n1 = n1;
    let status = n1.child.wait().unwrap();
    assert!(
        status.success(),
        "graceful exit: {status:?}\n{}",
        log_of(&n1)
    );
    assert!(!alive(pid1), "session stopped");
    let c = env.claim(&s).await.unwrap();
    assert!(
        c.state == ClaimState::Released || (c.owner.node == "n2" && c.epoch == 2),
        "released on shutdown: {c:?}"
    );
    // Released claims move without waiting for a TTL.
    wait_until("epoch 2 on n2", 10, async || env.pid(2).is_some_and(alive)).await;
    drop(n2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_moves_sessions_local() {
    kill_9(Env::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_past_ttl_local() {
    sigstop(Env::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_local() {
    sigterm(Env::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_moves_sessions_moto() {
    if let Some(env) = Env::moto() {
        kill_9(env).await;
    }
}

/// On Ceph RGW (If-Match in its bare-ETag dialect), through real node
/// processes: registration, renewals, the takeover's fence and the new claim
/// all write with If-Match.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_moves_sessions_rgw() {
    if let Some(env) = Env::rgw() {
        kill_9(env).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_rgw() {
    if let Some(env) = Env::rgw() {
        sigterm(env).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_past_ttl_moto() {
    if let Some(env) = Env::moto() {
        sigstop(env).await;
    }
}

/// A restarted node reclaims its previous instance's sessions at once: its
/// host lock proves the old instance dead. With a 30 s TTL, a reclaim within
/// 15 s cannot have come from expiry (that takes at least 33 s), so this is a
/// proof by construction, not a timing assertion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reclaims_at_once_with_the_host_lock() {
    let env = Env::local();
    let s = store(&env).await;
    let mut n1 = env.node_with_ttl("n1", "30s");
    env.apply_sleeper();
    wait_until("epoch 1 running", 20, async || env.pid(1).is_some()).await;
    let pid1 = env.pid(1).unwrap();
    n1.child.kill().unwrap();
    n1.child.wait().unwrap();
    wait_until("epoch 1 killed by its watchdog", 5, async || !alive(pid1)).await;
    let _n1b = env.node_with_ttl("n1", "30s");
    wait_until("epoch 2 by the new instance", 15, async || {
        env.pid(2).is_some_and(alive)
    })
    .await;
    let c = env.claim(&s).await.unwrap();
    assert_eq!((c.owner.node.as_str(), c.epoch), ("n1", 2));
    // The node lease itself was taken over at once too (epoch 2).
    let node = s.get("nodes/n1").await.unwrap().unwrap();
    let rec = leasehold::record::LeaseRecord::decode(
        "nodes/n1",
        &node.bytes,
        leasehold::record::Kind::Node,
    )
    .unwrap();
    assert_eq!(rec.epoch, 2);
    assert!(rec.host_locked);
}

/// Real processes: n1 runs the session and is frozen (SIGSTOP: it can
/// neither renew nor stop its session; the session's watchdog kills it at
/// n1's last announced deadline). An operator deletes `nodes/n1`, and a
/// second instance of n1 on another host registers (creating the record,
/// so marked unproven) and is stopped at once with SIGTERM, leaving the
/// record released and still marked. That ends the twin, not the frozen
/// first instance: n2 must not start epoch 2 while epoch 1 runs. (It did
/// when a released record of another, unproven instance read as final:
/// n2 took the session as soon as the twin's release was hinted and rang
/// the bell, seconds before the frozen instance's deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_that_registers_and_leaves_proves_nothing_about_a_frozen_node_local() {
    let env = Env::local();
    let s = store(&env).await;
    let n1 = env.node_with_ttl("n1", "5s");
    env.apply_sleeper();
    wait_until("epoch 1 running", 30, async || env.pid(1).is_some()).await;
    let pid1 = env.pid(1).unwrap();
    let n2 = env.node_with_ttl("n2", "5s");
    wait_until("n2 registered", 20, async || {
        s.get("nodes/n2").await.ok().flatten().is_some()
    })
    .await;
    // n2 lists n1's record (its first pass is a full one).
    pause(1000).await;
    let p1 = n1.child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(p1, libc::SIGSTOP) };
    let first = s.get("nodes/n1").await.unwrap().unwrap().version;
    s.delete("nodes/n1").await.unwrap();
    let mut twin = env.node_on_host("n1", "5s", "-b");
    wait_until("the twin registered", 20, async || {
        s.get("nodes/n1")
            .await
            .ok()
            .flatten()
            .is_some_and(|o| o.version != first)
    })
    .await;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(twin.child.id() as i32, libc::SIGTERM) };
    let status = twin.child.wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", log_of(&twin));
    let o = s.get("nodes/n1").await.unwrap().unwrap();
    let r =
        leasehold::record::LeaseRecord::decode("nodes/n1", &o.bytes, leasehold::record::Kind::Node)
            .unwrap();
    assert!(
        r.released && leasehold::fleet::attrs::NodeAttrs::of(&r).unproven,
        "the twin left its record released and unproven: {r:?}"
    );
    wait_until("epoch 2 started", 40, async || env.pid(2).is_some()).await;
    assert!(
        !alive(pid1),
        "epoch 1 must be dead before epoch 2 starts\nn2 log:\n{}",
        log_of(&n2)
    );
    let c = env.claim(&s).await.unwrap();
    assert_eq!((c.owner.node.as_str(), c.epoch), ("n2", 2));
    drop((n1, n2));
}

/// Hints under `changes/` in the local store at `root`: (flat, bucketed)
/// key tails, read from the directory (flat ones are files in `changes/`,
/// bucketed ones files in its subdirectories).
fn hints_on_disk(root: &std::path::Path) -> (Vec<String>, Vec<String>) {
    let (mut flat, mut bucketed) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(root.join("changes")) else {
        return (flat, bucketed);
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        if e.path().is_dir() {
            for h in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let n = h.file_name().to_string_lossy().into_owned();
                if !n.starts_with('.') {
                    bucketed.push(n);
                }
            }
        } else {
            flat.push(name);
        }
    }
    (flat, bucketed)
}

/// A node process beside a live node of an older build (a node record
/// without `proto`, renewed by the test) spells its hints flat, the only
/// form that build reads, and so does `apply`; once the older node has
/// released its record, the node moves to the bucketed form by itself
/// (`feed::HintForms`, decided at each of its passes from its peers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_process_spells_hints_flat_while_an_older_node_lives() {
    use leasehold::lease::{Acquire, AcquireOptions, LeaseClient};
    let env = Env::local();
    let s = store(&env).await;
    let root = env.dir.path().join("bucket");
    // The older node: its record carries attributes, no protocol level.
    let client = LeaseClient::builder(s.clone(), leasehold::Name::new("old").unwrap())
        .build()
        .unwrap();
    // A ttl well above its renewal pace: a loaded machine must not make
    // it expire (and so stop counting as live) while it should be.
    let mut opts = AcquireOptions::ttl(Duration::from_secs(5));
    opts.attrs = serde_json::json!({"capacity": 0, "max_poll_ms": 1000, "load": 0, "labels": {}})
        .as_object()
        .unwrap()
        .clone();
    let Acquire::Acquired(mut old) = client
        .acquire_kind(
            leasehold::record::Kind::Node,
            &leasehold::Name::new("old").unwrap(),
            &opts,
        )
        .await
        .unwrap()
    else {
        panic!("a fresh node id")
    };
    let renewing = tokio::spawn(async move {
        loop {
            pause(250).await;
            if RELEASE_OLD.load(std::sync::atomic::Ordering::SeqCst) {
                return old;
            }
            // A failed renewal is tried again at the next turn.
            let _ = old.renew_once().await;
        }
    });
    // Its `nodes/` listings at the slow pace set by hand (logged at start).
    let n1 = env.node_with_args("n1", "1s", "", &["--nodes-every", "4s"]);
    env.apply_sleeper();
    wait_until("epoch 1 running", 20, async || env.pid(1).is_some()).await;
    assert!(log_of(&n1).contains("nodes_every=4s"), "{}", log_of(&n1));
    // Two: `apply`'s (it writes the session's placeholder claim) and n1's claim,
    // written (and hinted) before the session started.
    wait_until("n1's claim hint", 10, async || {
        hints_on_disk(&root)
            .0
            .iter()
            .filter(|h| h.ends_with("-s-sleeper"))
            .count()
            >= 2
    })
    .await;
    let (flat, bucketed) = hints_on_disk(&root);
    assert!(
        bucketed.is_empty(),
        "bucketed hints beside a live older node: {bucketed:?} (flat: {flat:?})"
    );
    assert!(flat.iter().any(|h| h.ends_with("-m-sleeper")), "{flat:?}");
    // The older node stops.
    RELEASE_OLD.store(true, std::sync::atomic::Ordering::SeqCst);
    let old = renewing.await.unwrap();
    old.release().await.unwrap();
    // Sessions applied from now on: n1's claims of them are hinted
    // bucketed once n1 has seen the release (its next listing of `nodes/`:
    // six ttls at most).
    let mut i = 0;
    wait_until("a bucketed claim hint from n1", 30, async || {
        i += 1;
        let name = format!("later{i}");
        let m = serde_json::json!({
            "name": name,
            "spec": {"command": "sleep", "args": ["1000"]}
        });
        let f = env.path(&format!("{name}.json"));
        std::fs::write(&f, m.to_string()).unwrap();
        let o = env
            .cmd()
            .args(["apply", f.to_str().unwrap(), "--store", &env.url])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        pause(1000).await;
        hints_on_disk(&root)
            .1
            .iter()
            .any(|h| h.contains("-s-later"))
    })
    .await;
    assert!(log_of(&n1).contains("claimed"), "{}", log_of(&n1));
}

/// Tells the test's older node to stop renewing.
static RELEASE_OLD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
