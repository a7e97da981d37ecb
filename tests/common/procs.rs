//! Real `leasehold` processes on a local directory store, for tests that
//! play the adversary (a session, an operator, the bucket): a node per
//! process, manifests applied with the CLI, sessions that write their pids.
#![allow(dead_code)] // each test binary uses a part

use leasehold::fleet::claim::ClaimRecord;
use leasehold::record::{Kind, LeaseRecord};
use leasehold::store::{OpenOptions, Store, open_store};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

pub const TOKEN: &str = "0123456789abcdef-containment";

pub struct Node {
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub url: String,
}

pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    c.env_remove("LEASEHOLD_STORE");
    c
}

impl Env {
    pub fn new() -> Env {
        let dir = crate::common::session_dir();
        let url = format!("file://{}/bucket", dir.path().display());
        std::fs::write(dir.path().join("token"), TOKEN).unwrap();
        let o = bin().args(["init", "--store", &url]).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Env { dir, url }
    }

    pub fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }

    pub fn dir(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// `leasehold node run` with a 1 s TTL and `extra` arguments; its stderr
    /// goes to `<id>-<n>.log`. The change feed is on, as by default, with
    /// full listings every 2 s instead of 60 ttls: what only a full listing
    /// notices (a claim or manifest deleted by hand) is then seen within the
    /// tests' limits, and every other pass is light.
    pub fn node(&self, id: &str, extra: &[&str]) -> Node {
        self.node_in(id, &self.url, "locks", extra, |_| {})
    }

    pub fn node_in(
        &self,
        id: &str,
        url: &str,
        lock_dir: &str,
        extra: &[&str],
        tweak: impl FnOnce(&mut Command),
    ) -> Node {
        let n = std::fs::read_dir(self.dir.path()).unwrap().count();
        let log = self.path(&format!("{id}-{n}.log"));
        let mut cmd = bin();
        cmd.args([
            "node",
            "run",
            "--store",
            url,
            "--id",
            id,
            "--ttl",
            "1s",
            "--full-every",
            "2s",
            "--stop-grace",
            "500ms",
        ])
        .args(extra)
        .env("LEASEHOLD_LOCK_DIR", self.path(lock_dir))
        .env("LEASEHOLD_STATE_DIR", self.path("state"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
        tweak(&mut cmd);
        Node {
            child: cmd.spawn().unwrap(),
            log,
        }
    }

    pub fn apply(&self, name: &str, script: &str, restart: &str) {
        self.apply_spec(
            name,
            serde_json::json!({"command": "sh", "args": ["-c", script], "restart": restart}),
        );
    }

    /// Applies `spec` (JSON) as session `name`.
    pub fn apply_spec(&self, name: &str, spec: serde_json::Value) {
        let o = self.apply_output(name, spec);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    /// `leasehold apply` of the manifest `{name, spec}` (written to
    /// `<name>.json`), however it ends.
    pub fn apply_output(&self, name: &str, spec: serde_json::Value) -> std::process::Output {
        let m = serde_json::json!({"name": name, "spec": spec});
        let f = self.path(&format!("{name}.json"));
        std::fs::write(&f, m.to_string()).unwrap();
        bin()
            .args(["apply", f.to_str().unwrap(), "--store", &self.url])
            .output()
            .unwrap()
    }

    pub fn pid(&self, file: &str) -> Option<i32> {
        std::fs::read_to_string(self.path(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    pub async fn store(&self) -> Arc<dyn Store> {
        open_store(&self.url, &OpenOptions::default())
            .await
            .unwrap()
    }
}

pub async fn claim(s: &Arc<dyn Store>, name: &str) -> Option<ClaimRecord> {
    let key = format!("sessions/{name}");
    let o = s.get(&key).await.ok()??;
    ClaimRecord::decode(&key, &o.bytes).ok()
}

pub async fn node_record(s: &Arc<dyn Store>, id: &str) -> Option<(LeaseRecord, String)> {
    let key = format!("nodes/{id}");
    let o = s.get(&key).await.ok()??;
    let r = LeaseRecord::decode(&key, &o.bytes, Kind::Node).ok()?;
    Some((r, format!("{:?}", o.version)))
}

pub fn alive(pid: i32) -> bool {
    // A zombie is dead for our purposes: it runs nothing.
    leasehold::fleet::contain::stat(pid).is_some_and(|p| !p.zombie)
}

#[allow(clippy::disallowed_methods)] // waiting in tests is on the real clock; nothing here is timed
pub async fn wait_until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out after {limit:?} waiting for {what}");
}

#[allow(clippy::disallowed_methods)]
pub async fn pause(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

pub fn log_of(n: &Node) -> String {
    std::fs::read_to_string(&n.log).unwrap_or_default()
}
