//! Helpers shared by the integration tests.

pub mod procs;

/// The URL of a real server started by `scripts/test` (moto for
/// `LEASEHOLD_TEST_S3`, Azurite for `LEASEHOLD_TEST_AZURE`), or None to skip.
/// Under `scripts/test` (LEASEHOLD_REQUIRE_SERVERS set) a missing server
/// fails the test instead of skipping it, so CI cannot pass by skipping.
#[allow(dead_code)]
pub fn server(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(u) if !u.is_empty() => Some(u),
        _ if std::env::var("LEASEHOLD_REQUIRE_SERVERS").is_ok() => {
            panic!(
                "{var} is not set but LEASEHOLD_REQUIRE_SERVERS is: scripts/test starts the servers"
            )
        }
        _ => {
            eprintln!("SKIPPED: {var} not set; run scripts/test to start the real servers");
            None
        }
    }
}

/// Ceph RGW started by `scripts/test`: (store URL, S3 endpoint), or None to
/// skip (a failure under LEASEHOLD_REQUIRE_SERVERS, as [`server`]).
#[allow(dead_code)]
pub fn rgw() -> Option<(String, String)> {
    let url = server("LEASEHOLD_TEST_RGW")?;
    let endpoint = server("LEASEHOLD_TEST_RGW_ENDPOINT")?;
    Some((url, endpoint))
}

/// One run of a session, as a recording runner saw it:
/// (session, epoch, node, started, ended).
#[allow(dead_code)]
pub type Run<T> = (String, u64, String, T, T);

/// The fleet's safety property over recorded runs: no session ran on two
/// nodes at overlapping times, and no epoch ran on two nodes. `label` goes
/// in front of a failure (a seed, a scenario).
#[allow(dead_code)]
pub fn assert_never_twice<T: PartialOrd + std::fmt::Debug>(label: &str, runs: &[Run<T>]) {
    assert_never_at_once(label, runs);
    assert_eq!(
        epochs_reused(runs),
        Vec::<(String, u64)>::new(),
        "{label}an epoch ran on two nodes"
    );
}

/// The first half alone: no session ran on two nodes at overlapping times.
#[allow(dead_code)]
pub fn assert_never_at_once<T: PartialOrd + std::fmt::Debug>(label: &str, runs: &[Run<T>]) {
    for (i, x) in runs.iter().enumerate() {
        for y in &runs[i + 1..] {
            if x.0 == y.0 && x.2 != y.2 {
                assert!(
                    x.4 <= y.3 || y.4 <= x.3,
                    "{label}{} ran on {} and {} at once: {x:?} {y:?}",
                    x.0,
                    x.2,
                    y.2
                );
            }
        }
    }
}

/// (session, epoch) pairs that ran on two nodes (at different times).
#[allow(dead_code)]
pub fn epochs_reused<T>(runs: &[Run<T>]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for (i, x) in runs.iter().enumerate() {
        for y in &runs[i + 1..] {
            if x.0 == y.0 && x.1 == y.1 && x.2 != y.2 && !out.contains(&(x.0.clone(), x.1)) {
                out.push((x.0.clone(), x.1));
            }
        }
    }
    out
}

/// Every pair of runs of one session on two nodes that overlapped in time:
/// (session, how long they overlapped).
#[allow(dead_code)]
pub fn overlaps(runs: &[Run<leasehold::clock::MonoTime>]) -> Vec<(String, std::time::Duration)> {
    let mut out = Vec::new();
    for (i, x) in runs.iter().enumerate() {
        for y in &runs[i + 1..] {
            if x.0 == y.0 && x.2 != y.2 && !(x.4 <= y.3 || y.4 <= x.3) {
                let start = if x.3 > y.3 { x.3 } else { y.3 };
                let end = if x.4 < y.4 { x.4 } else { y.4 };
                out.push((x.0.clone(), end.saturating_since(start)));
            }
        }
    }
    out
}

/// A temporary directory sessions may write in: nodes that run as root run
/// sessions as `nobody` by default (`leasehold node run --session-user`),
/// and a session writes its pid and its side effects here.
#[allow(dead_code)] // each test binary uses a part
pub fn session_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}
