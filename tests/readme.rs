//! The README's quick start, run as written (issue #44): the first `sh`
//! block under "## Using it", with the `leasehold` this build made first on
//! the PATH, in an empty directory, under `bash -euo pipefail`, so that any
//! command failing fails the test. What it must show is checked on its
//! output: where the session runs, its output through `logs`, a lease
//! acquired, renewed and released with the token each step gave.

mod common;

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

/// The first ```sh block after `heading`.
fn block_after(readme: &str, heading: &str) -> String {
    let from = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no {heading:?}"));
    let rest = &readme[from..];
    let start = rest.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let end = rest[start..].find("\n```").expect("the block's end");
    rest[start..start + end].to_string()
}

#[test]
fn the_readme_quick_start_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let script = block_after(&readme, "## Using it");
    assert!(
        script.contains("leasehold logs web") && script.contains("lease release"),
        "the quick start lost its logs or its lease: {script}"
    );
    // Sessions run as nobody under a root node: a directory they may enter.
    let dir = common::session_dir();
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_leasehold"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    // In a process group of its own, so that whatever it leaves running
    // when a command fails (the nodes it started in the background) is
    // killed with it; its output to files, which no leftover holds open.
    let mut child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_NODE")
        // Each node's state (session logs) in the test's directory.
        .env("LEASEHOLD_STATE_DIR", dir.path().join("state"))
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .process_group(0)
        .spawn()
        .expect("bash");
    let group = child.id() as i32;
    // Bounded (the block waits at most 30 s for its session): 90 s in
    // steps of 50 ms.
    let mut status = None;
    for _ in 0..1800 {
        if let Some(s) = child.try_wait().unwrap() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child's process group.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let logs = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();
    let status = status.unwrap_or_else(|| {
        panic!(
            "the quick start did not finish in 90 s:\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        )
    });
    assert!(
        status.success(),
        "the quick start failed ({status}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- n1.log\n{}\n--- n2.log\n{}",
        logs("n1.log"),
        logs("n2.log")
    );
    let lease = std::fs::read_to_string(dir.path().join("lease.txt")).unwrap();
    for (what, shown) in [
        ("where it runs", stdout.contains("web: running on n")),
        (
            "the table",
            stdout.contains("NAME")
                && stdout.contains("STATUS")
                && stdout
                    .lines()
                    .any(|l| l.starts_with("web ") && l.contains("running")),
        ),
        (
            "its output through logs",
            stdout.contains("hello from web at epoch 1"),
        ),
        ("the renewal", lease.contains("renewed leases/web-leader")),
        ("the release", stdout.contains("released leases/web-leader")),
        ("the delete", stdout.contains("deleted manifests/web")),
    ] {
        assert!(shown, "the quick start did not show {what}:\n{stdout}");
    }
}
