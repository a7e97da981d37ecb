//! The CLI end to end, through the built binary: stdout, stderr, exit codes,
//! JSON shape. Exit codes: 0 ok, 1 held, 2 invalid, 3 conflict/lost,
//! 4 unavailable, 5 corrupt, 6 unsupported store, 7 not found.

mod common;

use std::process::{Command, Output};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_leasehold"));
    c.env_remove("LEASEHOLD_STORE")
        .env_remove("LEASEHOLD_NODE")
        .env_remove("LEASEHOLD_LEASE_TOKEN")
        .env_remove("LEASEHOLD_TOKEN_FILE")
        .env_remove("LEASEHOLD_LOG_FORMAT")
        .env_remove("LEASEHOLD_MAX_SKEW")
        // No config file: the default location, under a directory that does
        // not exist (a file named by LEASEHOLD_CONFIG must exist).
        .env_remove("LEASEHOLD_CONFIG")
        .env("XDG_CONFIG_HOME", "/nonexistent/leasehold-test-config");
    c
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn store() -> (tempfile::TempDir, String) {
    let d = common::session_dir();
    let url = format!("file://{}", d.path().display());
    (d, url)
}

/// A fresh prefix on moto (and a scratch directory), or None to skip.
fn moto_store(what: &str) -> Option<(tempfile::TempDir, String)> {
    let base = common::server("LEASEHOLD_TEST_S3")?;
    let d = common::session_dir();
    let id = d
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace('.', "");
    Some((d, format!("{base}/cli-{what}-{id}")))
}

/// A node process (with its HTTP API on a free loopback port) killed on drop.
struct NodeProc(std::process::Child);

impl Drop for NodeProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn node_with_api(
    store: &str,
    id: &str,
    token_file: &std::path::Path,
    lock_dir: &std::path::Path,
) -> NodeProc {
    // The fleet marker a node needs (idempotent).
    let o = run(&["init", "--store", store]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    NodeProc(
        bin()
            .args([
                "node",
                "run",
                "--store",
                store,
                "--id",
                id,
                "--ttl",
                "2s",
                "--listen",
                "127.0.0.1:0",
            ])
            .arg("--token-file")
            .arg(token_file)
            .env("LEASEHOLD_LOCK_DIR", lock_dir)
            .env("LEASEHOLD_STATE_DIR", lock_dir.join("state"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn lease_lifecycle_with_exit_codes_and_json() {
    let (_d, s) = store();
    let c = run(&["lease", "create", "job", "--store", &s, "--json"]);
    assert_eq!(code(&c), 0, "{}", stderr(&c));
    assert_eq!(json(&c)["created"], true);
    let c = run(&["lease", "create", "job", "--store", &s]);
    assert_eq!(code(&c), 0, "{}", stderr(&c));
    assert!(stdout(&c).contains("exists leases/job"), "{}", stdout(&c));
    let a = run(&[
        "lease", "acquire", "job", "--store", &s, "--ttl", "30s", "--node", "n1", "--json",
    ]);
    assert_eq!(code(&a), 0, "{}", stderr(&a));
    let a = json(&a);
    assert_eq!(a["acquired"], true);
    assert_eq!(a["epoch"], 1);
    assert_eq!(a["key"], "leases/job");
    assert_eq!(a["holder"]["node"], "n1");
    let token = a["token"].as_str().unwrap().to_string();

    let h = run(&[
        "lease",
        "acquire",
        "job",
        "--store",
        &s,
        "--node",
        "n2",
        "--json",
        "--no-probe",
    ]);
    assert_eq!(code(&h), 1, "held is exit 1");
    assert_eq!(json(&h)["acquired"], false);
    assert_eq!(json(&h)["holder"]["node"], "n1");

    let sh = run(&["lease", "show", "job", "--store", &s, "--json"]);
    assert_eq!(code(&sh), 0);
    let sh = json(&sh);
    assert_eq!(sh["record"]["epoch"], 1);
    assert_eq!(sh["record"]["schema"], "leasehold/v1");

    let r = run(&[
        "lease", "renew", "job", "--store", &s, "--token", &token, "--json",
    ]);
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let new_token = json(&r)["token"].as_str().unwrap().to_string();
    assert_ne!(new_token, token);

    // The old token is stale now (our own renew superseded it): fenced,
    // exit 3, saying so (not "held by" ourselves); nothing changed.
    let before = json(&run(&["lease", "show", "job", "--store", &s, "--json"]));
    let stale = run(&["lease", "renew", "job", "--store", &s, "--token", &token]);
    assert_eq!(code(&stale), 3, "{}", stderr(&stale));
    assert!(
        stderr(&stale).contains("this token is stale: the same holder renewed since"),
        "{}",
        stderr(&stale)
    );
    assert_eq!(
        json(&run(&["lease", "show", "job", "--store", &s, "--json"]))["version"],
        before["version"]
    );

    let rel = run(&[
        "lease", "release", "job", "--store", &s, "--token", &new_token,
    ]);
    assert_eq!(code(&rel), 0, "{}", stderr(&rel));
    let sh = json(&run(&["lease", "show", "job", "--store", &s, "--json"]));
    assert_eq!(sh["record"]["released"], true);
    assert_eq!(sh["record"]["epoch"], 1);

    let again = run(&[
        "lease", "acquire", "job", "--store", &s, "--node", "n2", "--json",
    ]);
    assert_eq!(code(&again), 0);
    assert_eq!(json(&again)["epoch"], 2, "after release, the next epoch");
}

#[test]
fn bad_input_is_exit_2_with_a_clear_message_and_writes_nothing() {
    let (d, s) = store();
    for (args, needle) in [
        (
            vec!["lease", "acquire", "a/b", "--store", &s],
            "invalid name \"a/b\"",
        ),
        (
            vec!["lease", "acquire", "..", "--store", &s],
            "invalid name",
        ),
        (
            vec!["lease", "acquire", "ok", "--store", &s, "--ttl", "5ms"],
            "invalid ttl",
        ),
        (
            vec!["lease", "acquire", "ok", "--store", &s, "--ttl", "soon"],
            "invalid value 'soon'",
        ),
        (
            vec!["lease", "acquire", "ok", "--store", "ftp://x"],
            "unknown scheme",
        ),
        (
            vec!["lease", "acquire", "ok", "--store", "file://relative"],
            "absolute path",
        ),
        (
            vec!["lease", "acquire", "ok", "--store", "s3://b?secret=1"],
            "do not belong in the URL",
        ),
        (
            vec!["lease", "renew", "ok", "--store", &s, "--token", "!!"],
            "invalid lease token",
        ),
        (vec!["lease", "acquire", "ok"], "--store"),
    ] {
        let o = run(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    let leftovers: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(
        leftovers.iter().all(|n| n == "_probe"),
        "nothing but probe directories: {leftovers:?}"
    );
    assert!(!d.path().join("leases").exists());
}

#[test]
fn corrupt_objects_are_exit_5_and_left_untouched() {
    let (d, s) = store();
    // A foreign file in laptop mode (no object header), and a valid object
    // file whose JSON is from an unknown schema version.
    std::fs::create_dir_all(d.path().join("leases")).unwrap();
    std::fs::write(d.path().join("leases/foreign"), b"hello").unwrap();
    assert_eq!(code(&run(&["lease", "create", "ok", "--store", &s])), 0);
    let o = run(&["lease", "acquire", "ok", "--store", &s, "--node", "w"]);
    assert_eq!(code(&o), 0);
    let store_path = d.path().join("leases/ok");
    let text = std::fs::read(&store_path).unwrap();
    for (name, expect) in [("foreign", "not a leasehold object file")] {
        for args in [
            vec!["lease", "show", name, "--store", &s],
            vec!["lease", "acquire", name, "--store", &s, "--no-probe"],
        ] {
            let o = run(&args);
            assert_eq!(code(&o), 5, "{args:?}: {}", stderr(&o));
            assert!(stderr(&o).contains(expect), "{}", stderr(&o));
            assert!(
                stderr(&o).contains("corrupt object leases/foreign"),
                "{}",
                stderr(&o)
            );
        }
    }
    assert_eq!(
        std::fs::read(d.path().join("leases/foreign")).unwrap(),
        b"hello"
    );
    assert_eq!(std::fs::read(&store_path).unwrap(), text);
}

#[test]
fn doctor_reports_and_refuses() {
    let (_d, s) = store();
    let o = run(&["doctor", "--store", &s]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for step in [
        "create",
        "rejected create",
        "update",
        "rejected stale update",
        "listing versions",
        "create race",
        "update race",
        "conditional get",
    ] {
        assert!(stdout(&o).contains(step), "{}", stdout(&o));
    }
    let j = json(&run(&["doctor", "--store", &s, "--json"]));
    assert_eq!(j["ok"], true);
    assert_eq!(j["steps"].as_array().unwrap().len(), 8);
    // The same machine's clock: the estimate must contain zero.
    let (off, unc) = (
        j["clock_offset_ms"].as_i64().unwrap(),
        j["clock_offset_uncertainty_ms"].as_i64().unwrap(),
    );
    assert!(off.abs() <= unc, "offset {off} ± {unc}");
    assert_eq!(j["config_file_found"], false);
    assert!(j["lock_dir"].is_string());
    assert_eq!(j["credentials"], "none needed");
    // The probe's keys are gone, and so are their lock files.
    assert_eq!(j["lock_files"]["removed_with_keys"], true, "{j}");
    assert!(
        j["lock_files"]["dir"]
            .as_str()
            .unwrap()
            .ends_with(".leasehold/keylocks"),
        "{j}"
    );
}

/// A directory an older build wrote keeps its lock scheme (docs/stores.md):
/// doctor says so, and how to end it.
#[test]
fn doctor_names_an_older_builds_lock_scheme() {
    let (d, s) = store();
    std::fs::create_dir_all(d.path().join(".leasehold/locks")).unwrap();
    let o = run(&["doctor", "--store", &s]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("an older build's scheme"),
        "{}",
        stdout(&o)
    );
    let j = json(&run(&["doctor", "--store", &s, "--json"]));
    assert_eq!(j["lock_files"]["removed_with_keys"], false, "{j}");
    // The probe's own keys, each written and removed, left theirs.
    assert!(j["lock_files"]["count"].as_u64().unwrap() > 0, "{j}");
}

/// `doctor` against an S3 endpoint where nothing listens (the discard port).
fn doctor_on_unreachable_s3() -> Command {
    let mut c = bin();
    c.args([
        "doctor",
        "--store",
        "s3://bucket",
        "--endpoint",
        "http://127.0.0.1:9",
        "--request-timeout",
        "500ms",
    ]);
    c
}

#[test]
fn store_errors_never_print_secrets() {
    // An unreachable S3 endpoint with a recognisable secret in the
    // environment: the error names the store, never the secret.
    let o = doctor_on_unreachable_s3()
        .env("AWS_ACCESS_KEY_ID", "AKIDLEASEHOLDTEST")
        .env("AWS_SECRET_ACCESS_KEY", "SECRETLEASEHOLDMARKER")
        .env("AWS_SESSION_TOKEN", "TOKENLEASEHOLDMARKER")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("LEASEHOLD_LOG", "debug")
        .output()
        .unwrap();
    assert_eq!(code(&o), 4, "unavailable: {}", stderr(&o));
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(all.contains("error: store unavailable"), "{all}");
    for secret in ["SECRETLEASEHOLDMARKER", "TOKENLEASEHOLDMARKER"] {
        assert!(!all.contains(secret), "secret leaked: {all}");
    }
    // Even when the probe fails, doctor names where the credentials came from.
    assert!(
        all.contains("credentials environment variables (AWS_ACCESS_KEY_ID"),
        "{all}"
    );
}

#[test]
fn doctor_names_a_profile_credentials_source_without_the_keys() {
    let d = common::session_dir();
    let creds = d.path().join("credentials");
    std::fs::write(
        &creds,
        "[ops]\naws_access_key_id = AKIDPROFILEMARKER\naws_secret_access_key = SECRETPROFILEMARKER\n",
    )
    .unwrap();
    let o = doctor_on_unreachable_s3()
        .arg("--json")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_WEB_IDENTITY_TOKEN_FILE")
        .env("AWS_SHARED_CREDENTIALS_FILE", &creds)
        .env("AWS_CONFIG_FILE", d.path().join("config"))
        .env("AWS_PROFILE", "ops")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap();
    assert_eq!(code(&o), 4, "unreachable endpoint: {}", stderr(&o));
    let j = json(&o);
    assert_eq!(j["ok"], false);
    assert_eq!(
        j["credentials"],
        "profile: static keys in the shared config/credentials files (ops)"
    );
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!all.contains("SECRETPROFILEMARKER"), "secret leaked: {all}");
    assert!(!all.contains("AKIDPROFILEMARKER"), "key id printed: {all}");
}

#[test]
fn doctor_on_moto_through_the_binary() {
    let Some(url) = common::server("LEASEHOLD_TEST_S3") else {
        return;
    };
    let o = run(&["doctor", "--store", &format!("{url}/cli-doctor"), "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["ok"], true);
    assert!(
        json(&o)["credentials"]
            .as_str()
            .unwrap()
            .starts_with("environment variables"),
        "{}",
        stdout(&o)
    );
    // moto runs on this machine, so its clock agrees with ours.
    let (off, unc) = (
        json(&o)["clock_offset_ms"].as_i64().unwrap(),
        json(&o)["clock_offset_uncertainty_ms"].as_i64().unwrap(),
    );
    assert!(off.abs() <= unc, "offset {off} ± {unc}");
    let o = run(&[
        "lease",
        "create",
        "cli",
        "--store",
        &format!("{url}/cli-doctor"),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&[
        "lease",
        "acquire",
        "cli",
        "--store",
        &format!("{url}/cli-doctor"),
        "--json",
        "--no-probe",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // A bucket that does not exist is named as such (not "<key> not found"),
    // as a configuration error.
    let o = run(&["doctor", "--store", "s3://leasehold-no-such-bucket"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("bucket or container of s3://leasehold-no-such-bucket does not exist"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn concurrent_processes_elect_exactly_one() {
    let (_d, s) = store();
    for round in 0..3 {
        let name = format!("race{round}");
        assert_eq!(code(&run(&["lease", "create", &name, "--store", &s])), 0);
        let children: Vec<_> = (0..6)
            .map(|i| {
                bin()
                    .args([
                        "lease",
                        "acquire",
                        &name,
                        "--store",
                        &s,
                        "--node",
                        &format!("p{i}"),
                        "--no-probe",
                        "--json",
                    ])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let codes: Vec<i32> = children
            .into_iter()
            .map(|c| code(&c.wait_with_output().unwrap()))
            .collect();
        assert_eq!(codes.iter().filter(|&&c| c == 0).count(), 1, "{codes:?}");
        assert_eq!(codes.iter().filter(|&&c| c == 1).count(), 5, "{codes:?}");
    }
}

#[test]
fn demo_runs_on_the_embedded_default() {
    let o = run(&["demo", "--ttl", "500ms", "--sessions", "4"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("applied 4 manifests"), "{out}");
    assert!(out.contains("killed"), "{out}");
    let moved: usize = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("sessions moved"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert!(moved >= 1, "{out}");
    // After the kill, every session runs, and at least the moved ones at a
    // later epoch (a starved machine may move more; never fewer).
    let last_table = out.rsplit("session    node").next().unwrap();
    let rows: Vec<&str> = last_table
        .lines()
        .filter(|l| l.contains("running"))
        .collect();
    assert_eq!(rows.len(), 4, "{out}");
    let later = rows
        .iter()
        .filter(|l| l.split_whitespace().nth(2).is_some_and(|e| e != "1"))
        .count();
    assert!(later >= moved, "{out}");
}

#[test]
fn lease_demo_runs_on_the_embedded_default() {
    let o = run(&["demo", "--lease", "--ttl", "300ms"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("took over leases/leader, epoch 2"), "{out}");
    assert!(
        out.contains("epochs (fencing tokens)     1 -> 2 -> 3"),
        "{out}"
    );
}

#[test]
fn node_run_refuses_bad_http_flags_before_starting() {
    let (d, s) = store();
    let short = d.path().join("short");
    std::fs::write(&short, "tooshort").unwrap();
    for (args, needle) in [
        (
            vec![
                "node", "run", "--store", &s, "--id", "n1", "--listen", "7401",
            ],
            "needs --token-file",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--token-file",
                "/nonexistent",
            ],
            "needs --listen",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--listen",
                "7401",
                "--token-file",
                short.to_str().unwrap(),
            ],
            "at least 16 bytes",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--listen",
                "nowhere",
                "--token-file",
                short.to_str().unwrap(),
            ],
            "16 bytes",
        ),
        (
            vec!["node", "run", "--store", &s, "--id", "bad/id"],
            "invalid name",
        ),
        (
            vec![
                "node", "run", "--store", &s, "--id", "n1", "--labels", "novalue",
            ],
            "is not k=v",
        ),
        (
            vec!["node", "run", "--store", &s, "--id", "n1", "--ttl", "1ms"],
            "between 100ms and 24h",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--max-poll",
                "1s",
            ],
            "between ttl/3 (3333ms) and 1h",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--full-every",
                "1s",
            ],
            "between the ttl and 24h",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--full-every-objects",
                "10",
            ],
            "0 (fixed) or at least 1000",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--nodes-every",
                "25h",
            ],
            "invalid --nodes-every: between the ttl and 24h",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--stop-grace",
                "99999999999d",
            ],
            "invalid --stop-grace: at most 1h",
        ),
        (
            vec!["node", "run", "--store", &s, "--id", "n1", "--ttl", "0s"],
            "invalid --ttl: between 100ms and 24h for a node",
        ),
        (
            vec!["node", "run", "--store", &s, "--id", "n1", "--ttl", "25h"],
            "invalid --ttl: between 100ms and 24h for a node",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "n1",
                "--max-poll",
                "2h",
            ],
            "between ttl/3",
        ),
        (
            vec!["node", "run", "--store", &s, "--id", "n1", "--nudge-peers"],
            "invalid --nudge-peers: needs --listen and --token-file",
        ),
    ] {
        let o = run(&args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("tooshort"), "the token never appears");
    }
    assert!(!d.path().join("nodes").exists(), "nothing registered");
}

/// A manifest's command and arguments may hold newlines and escapes (a
/// script is legitimate): `ls manifests` and `describe` print them escaped,
/// so they can neither forge a table row nor drive the terminal; JSON keeps
/// them as they are.
#[test]
fn control_characters_in_a_spec_are_printed_escaped() {
    let (d, s) = store();
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let f = d.path().join("m.json");
    let m = serde_json::json!({"name": "nl1", "spec": {"command": "sh\u{1b}]0;title\u{7}",
        "args": ["1\nfake-session  e5912172b200  on-failure  false  rm -rf /", "\u{1b}[2J"]}});
    std::fs::write(&f, m.to_string()).unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    for args in [vec!["ls", "manifests"], vec!["describe", "nl1"]] {
        let o = run(&[&args[..], &["--store", &s]].concat());
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let out = stdout(&o);
        assert!(!out.chars().any(|c| c.is_control() && c != '\n'), "{out:?}");
        assert!(!out.lines().any(|l| l.starts_with("fake-session")), "{out}");
        assert!(
            out.contains("1\\nfake-session") && out.contains("\\u{1b}[2J"),
            "{out}"
        );
    }
    let j = json(&run(&["ls", "manifests", "--store", &s, "--json"]));
    assert_eq!(j[0]["args"][1], "\u{1b}[2J", "{j}");
}

/// `inspect` reads every object leasehold writes, the fleet marker, the
/// bell, a node's control object and a change hint among them (it refused
/// `fleet` and `bell` as "not under leases/, ..."), and a key too long for
/// the filesystem is the caller's error (2), not the store unavailable (4).
#[test]
fn inspect_reads_every_kind_of_object() {
    let (d, s) = store();
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let f = d.path().join("m.json");
    std::fs::write(&f, r#"{"name": "web", "spec": {"command": "true"}}"#).unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    let o = run(&["inspect", "fleet", "--store", &s, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["decoded"]["generation"], 1);
    let o = run(&["inspect", "bell", "--store", &s, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(json(&o)["decoded"]["bell"].is_string());
    // apply hints the manifest and its queued claim: the manifest's.
    let hint = walk_files(&d.path().join("changes"))
        .into_iter()
        .find(|p| p.to_string_lossy().ends_with("-m-web"))
        .expect("apply hinted the manifest");
    let key = hint
        .strip_prefix(d.path())
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let o = run(&["inspect", &key, "--store", &s, "--json"]);
    assert_eq!(code(&o), 0, "{key}: {}", stderr(&o));
    assert_eq!(json(&o)["decoded"]["hint"]["names"], "manifests/web");
    let long = "a".repeat(300);
    let o = run(&["inspect", &long, "--store", &s]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let o = run(&["inspect", "elsewhere/x", "--store", &s]);
    assert_eq!(code(&o), 7, "{}", stderr(&o));
}

/// A refused `init --generation` makes nothing: the directory it names
/// (perhaps a typo) was created before the flag was checked, and `ls` on
/// it then answered as an empty fleet.
#[test]
fn a_refused_init_creates_no_directory() {
    let d = common::session_dir();
    let typo = d.path().join("typo");
    let url = format!("file://{}", typo.display());
    for g in ["0", "4194305"] {
        let o = run(&["init", "--store", &url, "--generation", g]);
        assert_eq!(code(&o), 2, "{}", stderr(&o));
        assert!(stderr(&o).contains("--generation"), "{}", stderr(&o));
    }
    assert!(!typo.exists());
}

/// A token file others on the host can read is said to be so, as ssh says
/// of a key (not refused), with the fix; the token never appears.
#[test]
fn a_token_file_readable_by_others_is_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    let (d, s) = store();
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let tok = d.path().join("tok");
    std::fs::write(&tok, "open-token-0123456789abcdef\n").unwrap();
    for (mode, warned) in [(0o644, true), (0o600, false)] {
        std::fs::set_permissions(&tok, std::fs::Permissions::from_mode(mode)).unwrap();
        let o = run(&[
            "logs",
            "x",
            "--store",
            &s,
            "--token-file",
            tok.to_str().unwrap(),
        ]);
        assert_eq!(code(&o), 7, "{}", stderr(&o));
        assert_eq!(
            stderr(&o).contains("chmod 600"),
            warned,
            "{mode:o}: {}",
            stderr(&o)
        );
        assert!(!stderr(&o).contains("open-token"), "{}", stderr(&o));
    }
}

/// `ls` on a directory that exists but holds no fleet answers (an empty
/// table) and warns that it is no fleet: a typo'd path or another bucket
/// looked like an idle fleet. Once `init` made it one, no warning.
#[test]
fn ls_on_a_store_that_is_no_fleet_says_so() {
    let (_d, s) = store();
    let o = run(&["ls", "--store", &s]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds no fleet marker"),
        "{}",
        stderr(&o)
    );
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let o = run(&["ls", "--store", &s]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("fleet marker"), "{}", stderr(&o));
    let o = run(&["ls", "--store", &s, "--prefix", ".."]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("invalid --prefix"), "{}", stderr(&o));
}

/// A ttl too long for milliseconds in a u64 is refused, not wrapped: it
/// passed as 384 ms and a lease "held for 584542046 years" was open to
/// takeover within a second.
#[test]
fn a_lease_ttl_beyond_a_day_is_refused_not_wrapped() {
    let (_d, s) = store();
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    for ttl in ["18446744073709552s", "25h"] {
        let o = run(&["lease", "acquire", "x", "--ttl", ttl, "--store", &s]);
        assert_eq!(code(&o), 2, "{ttl}: {}{}", stdout(&o), stderr(&o));
        assert!(stderr(&o).contains("24h"), "{}", stderr(&o));
    }
}

/// Every regular file under `dir`, at any depth.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else if !p.file_name().unwrap().to_string_lossy().starts_with('.') {
            out.push(p);
        }
    }
    out
}

#[test]
fn apply_and_delete_manifests() {
    let (d, s) = store();
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    let o = run(&["apply", f.to_str().unwrap(), "--store", &s, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["result"], "created");
    // On a local directory where no node of an older build is live, the
    // manifest's hint is under its ten-second bucket (keys::HintForm).
    let hints: Vec<String> = std::fs::read_dir(d.path().join("changes"))
        .unwrap()
        .flat_map(|b| {
            let b = b.unwrap();
            assert!(
                b.file_type().unwrap().is_dir(),
                "{:?} is flat",
                b.file_name()
            );
            std::fs::read_dir(b.path())
                .unwrap()
                .map(|h| h.unwrap().path().display().to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(hints.iter().any(|h| h.ends_with("-m-web")), "{hints:?}");
    let bell = std::fs::read(d.path().join("bell")).ok();
    let o = run(&["apply", f.to_str().unwrap(), "--store", &s, "--json"]);
    assert_eq!(json(&o)["result"], "unchanged");
    // Nothing written: no hint (a refused create would have been hinted)
    // and no ring, so an apply loop wakes no node.
    assert_eq!(walk_files(&d.path().join("changes")).len(), hints.len());
    assert_eq!(std::fs::read(d.path().join("bell")).ok(), bell);
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["2"]}}"#,
    )
    .unwrap();
    let o = run(&["apply", f.to_str().unwrap(), "--store", &s]);
    assert_eq!(
        code(&o),
        3,
        "a different spec is a conflict: {}",
        stderr(&o)
    );
    let o = run(&[
        "apply",
        f.to_str().unwrap(),
        "--store",
        &s,
        "--replace",
        "--json",
    ]);
    assert_eq!(json(&o)["result"], "replaced");
    // The same spec again with --replace: unchanged, and nothing written
    // (issue #44: it said "replaced" and wrote a new version).
    let before = json(&run(&["inspect", "manifests/web", "--store", &s, "--json"]));
    let o = run(&[
        "apply",
        f.to_str().unwrap(),
        "--store",
        &s,
        "--replace",
        "--json",
    ]);
    assert_eq!(json(&o)["result"], "unchanged", "{}", stdout(&o));
    let after = json(&run(&["inspect", "manifests/web", "--store", &s, "--json"]));
    assert_eq!(before["version"], after["version"], "{before} / {after}");
    assert!(!before["version"].is_null(), "{before}");
    for (body, needle) in [
        (
            r#"{"name": "web", "spec": {"command": ""}}"#,
            "spec.command",
        ),
        (
            r#"{"name": "w/b", "spec": {"command": "x"}}"#,
            "invalid name",
        ),
        (
            r#"{"name": "web", "spec": {"command": "x", "restart": "sometimes"}}"#,
            "spec.restart",
        ),
        (
            r#"{"name": "web", "spec": {"command": "x"}, "extra": 1}"#,
            "unknown field",
        ),
        (r#"not json"#, "manifest file"),
    ] {
        std::fs::write(&f, body).unwrap();
        let o = run(&["apply", f.to_str().unwrap(), "--store", &s]);
        assert_eq!(code(&o), 2, "{body}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{body}: {}", stderr(&o));
    }
    let o = run(&["delete", "web", "--store", &s]);
    assert_eq!(code(&o), 0);
    let o = run(&["delete", "web", "--store", &s]);
    assert_eq!(code(&o), 7, "not found");
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The inventory commands against a live node process, on store `s`, with
/// scratch files in `dir`.
fn inventory_scenario(s: &str, dir: &std::path::Path) {
    let tok = dir.join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let _node = node_with_api(s, "n1", &tok, &dir.join("locks"));
    let f = dir.join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["100"]}}"#,
    )
    .unwrap();
    assert_eq!(code(&run(&["apply", f.to_str().unwrap(), "--store", s])), 0);
    std::fs::write(
        &f,
        r#"{"name": "later", "spec": {"command": "sleep", "args": ["1"], "paused": true}}"#,
    )
    .unwrap();
    assert_eq!(code(&run(&["apply", f.to_str().unwrap(), "--store", s])), 0);
    // Wait (bounded) until the node runs web.
    let mut live = false;
    for _ in 0..200 {
        if code(&run(&["resolve", "web", "--store", s])) == 0 {
            live = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(live, "web never got a live owner");
    let r = json(&run(&["resolve", "web", "--store", s, "--json"]));
    assert_eq!(
        (
            r["owner"]["state"].as_str(),
            r["owner"]["node"].as_str(),
            r["live"].as_bool()
        ),
        (Some("claimed"), Some("n1"), Some(true))
    );
    assert_eq!(r["round_trips"], 1, "resolve is one GET");
    let w = run(&["resolve", "web", "--store", s, "--wake", "--json"]);
    assert_eq!(code(&w), 0, "{}", stderr(&w));
    assert_eq!(
        json(&w)["outcome"]["outcome"],
        "reachable",
        "the node serves HTTP at its address"
    );
    assert_eq!(json(&w)["outcome"]["status"], "running");
    // A session that ran and succeeded: its owner is reachable, and runs
    // nothing of it: 1, with or without --wake.
    std::fs::write(
        &f,
        r#"{"name": "done", "spec": {"command": "true", "restart": "never"}}"#,
    )
    .unwrap();
    assert_eq!(code(&run(&["apply", f.to_str().unwrap(), "--store", s])), 0);
    let mut ended = false;
    for _ in 0..200 {
        let r = json(&run(&["resolve", "done", "--store", s, "--json"]));
        if r["owner"]["status"] == "succeeded" {
            ended = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(ended, "done never succeeded");
    assert_eq!(code(&run(&["resolve", "done", "--store", s])), 1);
    let w = run(&["resolve", "done", "--store", s, "--wake", "--json"]);
    assert_eq!(code(&w), 1, "{}", stdout(&w));
    assert_eq!(
        (
            &json(&w)["outcome"]["outcome"],
            &json(&w)["outcome"]["status"]
        ),
        (&"reachable".into(), &"succeeded".into())
    );
    assert_eq!(
        code(&run(&["resolve", "later", "--store", s])),
        1,
        "queued: no owner"
    );
    assert_eq!(code(&run(&["resolve", "nothing", "--store", s])), 1);
    assert_eq!(
        code(&run(&["resolve", "bad/name", "--store", s])),
        2,
        "errors are 2 for resolve"
    );

    let ls = json(&run(&["ls", "--store", s, "--json"]));
    let rows = ls.as_array().unwrap();
    let web = rows.iter().find(|r| r["name"] == "web").unwrap();
    assert_eq!(
        (
            web["status"].as_str(),
            web["owner"].as_str(),
            web["epoch"].as_u64()
        ),
        (Some("running"), Some("n1"), Some(1))
    );
    // A paused manifest nobody has claimed is paused, and says why.
    let later = rows.iter().find(|r| r["name"] == "later").unwrap();
    assert_eq!(later["status"], "paused");
    assert_eq!(later["reason"], "paused by its manifest");
    assert_eq!(
        web["reason"], "",
        "a healthy running session needs no reason"
    );
    let nodes = json(&run(&["nodes", "--store", s, "--json"]));
    assert_eq!(nodes[0]["node"], "n1");
    assert!(
        nodes[0]["address"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:")
    );
    let m = json(&run(&["ls", "manifests", "--store", s, "--json"]));
    assert_eq!(m.as_array().unwrap().len(), 3, "web, later and done");

    let i = run(&["inspect", "sessions/web", "--store", s, "--json"]);
    assert_eq!(code(&i), 0);
    assert_eq!(json(&i)["decoded"]["owner"]["node"], "n1");
    // A foreign object: reported as corrupt by inspect (exit 5) and as a
    // CORRUPT row by ls, which still lists the rest.
    let store = rt()
        .block_on(leasehold::store::open_store(s, &Default::default()))
        .unwrap();
    rt().block_on(store.put(
        "sessions/zzz",
        bytes::Bytes::from_static(b"garbage"),
        leasehold::store::Cond::Create,
    ))
    .unwrap();
    let i = run(&["inspect", "sessions/zzz", "--store", s]);
    assert_eq!(code(&i), 5, "{}", stderr(&i));
    let ls = json(&run(&["ls", "--store", s, "--json"]));
    let z = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "zzz")
        .unwrap();
    assert!(z["corrupt"].as_str().unwrap().contains("not valid JSON"));
    assert!(
        ls.as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "web" && r["status"] == "running")
    );
    assert_eq!(code(&run(&["inspect", "../etc/passwd", "--store", s])), 2);
    let left = rt().block_on(store.get("sessions/zzz")).unwrap().unwrap();
    assert_eq!(&left.bytes[..], b"garbage", "left untouched");
    // The same for a node record and a manifest: a named CORRUPT row in
    // the table and in JSON, beside the readable rows (typed, as before).
    for key in ["nodes/zzz", "manifests/zzz"] {
        rt().block_on(store.put(
            key,
            bytes::Bytes::from_static(b"garbage"),
            leasehold::store::Cond::Create,
        ))
        .unwrap();
    }
    let nodes = json(&run(&["ls", "nodes", "--store", s, "--json"]));
    let rows = nodes.as_array().unwrap();
    assert!(
        rows.iter()
            .any(|r| r["node"] == "zzz" && r["corrupt"].as_str().is_some()),
        "{nodes}"
    );
    let n1 = rows.iter().find(|r| r["node"] == "n1").unwrap();
    assert!(
        n1["capacity"].as_u64().is_some() && n1["labels"].is_object(),
        "{n1}"
    );
    assert_eq!(n1["state"], "live", "{n1}");
    // What a peer's growth gate and a vanished claim's wait read of it.
    assert_eq!(
        n1["proto"].as_u64(),
        Some(leasehold::fleet::attrs::PROTO_LEVEL.into()),
        "{n1}"
    );
    assert!(n1["max_poll_ms"].as_u64().is_some_and(|m| m > 0), "{n1}");
    let table = stdout(&run(&["ls", "nodes", "--store", s]));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("zzz") && l.contains("CORRUPT:")),
        "{table}"
    );
    let m = json(&run(&["ls", "manifests", "--store", s, "--json"]));
    assert!(
        m.as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "zzz" && r["corrupt"].as_str().is_some()),
        "{m}"
    );
    let table = stdout(&run(&["ls", "manifests", "--store", s]));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("zzz") && l.contains("CORRUPT:")),
        "{table}"
    );
}

#[test]
fn inventory_ls_resolve_inspect_against_a_live_node() {
    let (d, s) = store();
    inventory_scenario(&s, d.path());
}

#[test]
fn inventory_ls_resolve_inspect_against_a_live_node_on_moto() {
    let Some(base) = common::server("LEASEHOLD_TEST_S3") else {
        return;
    };
    let d = common::session_dir();
    let run_id = d
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace('.', "");
    inventory_scenario(&format!("{base}/cli-inventory-{run_id}"), d.path());
}

/// `watch` merges the streams of every live node, tagged by node, and picks
/// up a node that joins while it runs.
#[test]
fn watch_merges_the_fleet_and_follows_joiners() {
    let (d, s) = store();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let node = |id: &str| node_with_api(&s, id, &tok, &d.path().join("locks"));
    let _n1 = node("n1");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let watch = bin()
        .args([
            "watch",
            "--store",
            &s,
            "--from-start",
            "--duration",
            "6s",
            "--json",
        ])
        .arg("--token-file")
        .arg(&tok)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let _n2 = node("n2");
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let f = d.path().join("m.json");
    for i in 0..4 {
        std::fs::write(
            &f,
            format!(r#"{{"name": "w{i}", "spec": {{"command": "sleep", "args": ["100"]}}}}"#),
        )
        .unwrap();
        assert_eq!(
            code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
            0
        );
    }
    let out = watch.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let events = |node: &str, kind: &str| {
        lines
            .iter()
            .filter(|l| l["node"] == node && l["event"]["kind"] == kind)
            .count()
    };
    assert_eq!(events("n1", "registered"), 1, "{lines:?}");
    assert_eq!(
        events("n2", "registered"),
        1,
        "the joiner was followed: {lines:?}"
    );
    let started = events("n1", "started") + events("n2", "started");
    assert_eq!(started, 4, "every session's start was seen once: {lines:?}");
    // Per node, sequences arrive in order without holes.
    for n in ["n1", "n2"] {
        let seqs: Vec<u64> = lines
            .iter()
            .filter(|l| l["node"] == n)
            .filter_map(|l| l["event"]["seq"].as_u64())
            .collect();
        assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{n}: {seqs:?}");
    }
}

#[test]
fn completions_config_file_precedence_json_logs_and_request_spans() {
    let o = run(&["completions", "bash"]);
    assert_eq!(code(&o), 0);
    assert!(
        stdout(&o).contains("leasehold") && stdout(&o).contains("complete"),
        "bash completion script"
    );

    // Config file < environment < flag.
    let (d1, s1) = store();
    let (_d2, s2) = store();
    let (_d3, s3) = store();
    let cfg = d1.path().join("config.json");
    std::fs::write(&cfg, format!(r#"{{"store": "{s1}"}}"#)).unwrap();
    let with_cfg = |env_store: Option<&str>, args: &[&str]| {
        let mut c = bin();
        c.env("LEASEHOLD_CONFIG", &cfg).args(args);
        if let Some(e) = env_store {
            c.env("LEASEHOLD_STORE", e);
        }
        c.output().unwrap()
    };
    assert_eq!(code(&with_cfg(None, &["lease", "create", "a"])), 0);
    assert_eq!(
        code(&with_cfg(None, &["lease", "acquire", "a", "--no-probe"])),
        0
    );
    assert!(
        d1.path().join("leases/a").exists(),
        "the file's store was used"
    );
    assert_eq!(code(&with_cfg(Some(&s2), &["lease", "create", "b"])), 0);
    let o = with_cfg(
        Some(&s2),
        &["lease", "acquire", "b", "--no-probe", "--json"],
    );
    assert_eq!(code(&o), 0);
    assert_eq!(
        code(&run(&["lease", "show", "b", "--store", &s2])),
        0,
        "the environment beat the file"
    );
    assert_eq!(
        code(&with_cfg(
            Some(&s2),
            &["lease", "create", "c", "--store", &s3]
        )),
        0
    );
    let o = with_cfg(
        Some(&s2),
        &["lease", "acquire", "c", "--no-probe", "--store", &s3],
    );
    assert_eq!(code(&o), 0);
    assert_eq!(
        code(&run(&["lease", "show", "c", "--store", &s3])),
        0,
        "the flag beat both"
    );
    std::fs::write(&cfg, r#"{"stor": "typo"}"#).unwrap();
    let o = with_cfg(None, &["lease", "show", "x"]);
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("config file") && stderr(&o).contains("unknown field"),
        "{}",
        stderr(&o)
    );

    // JSON logs, with a span around every bucket request (op, key, outcome,
    // latency).
    let o = bin()
        .args(["--log-format", "json", "lease", "show", "a", "--store", &s1])
        .env("LEASEHOLD_LOG", "leasehold::store=debug")
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stderr(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let req = lines
        .iter()
        .find(|l| l["fields"]["message"] == "bucket request" && l["span"]["op"] == "get")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert_eq!(req["span"]["key"], "leases/a");
    assert_eq!(req["fields"]["outcome"], "ok");
    assert!(req["fields"]["latency_ms"].is_number());
}

/// A minimal OTLP/HTTP collector on a free loopback port: it records every
/// request (method, path, lower-cased headers, body) and answers 200.
struct Collector {
    addr: std::net::SocketAddr,
    seen: std::sync::Arc<std::sync::Mutex<Vec<Request>>>,
}

/// Request line, lower-cased headers, body.
type Request = (String, Vec<(String, String)>, Vec<u8>);

impl Collector {
    fn start() -> Collector {
        use std::io::{BufRead, BufReader, Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let record = record.clone();
                std::thread::spawn(move || {
                    let mut w = conn.try_clone().unwrap();
                    let mut r = BufReader::new(conn);
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let request = line.trim().to_string();
                        let mut headers = Vec::new();
                        loop {
                            let mut h = String::new();
                            r.read_line(&mut h).unwrap();
                            let h = h.trim_end();
                            if h.is_empty() {
                                break;
                            }
                            let (k, v) = h.split_once(':').unwrap();
                            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                        }
                        let len: usize = headers
                            .iter()
                            .find(|(k, _)| k == "content-length")
                            .map(|(_, v)| v.parse().unwrap())
                            .unwrap_or(0);
                        let mut body = vec![0; len];
                        r.read_exact(&mut body).unwrap();
                        record.lock().unwrap().push((request, headers, body));
                        w.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                            .unwrap();
                    }
                });
            }
        });
        Collector { addr, seen }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn spans_are_exported_over_otlp_http_without_secrets_in_logs() {
    let collector = Collector::start();
    let (_d, s) = store();
    assert_eq!(
        code(&run(&["lease", "create", "otel-demo", "--store", &s])),
        0
    );
    let o = bin()
        .args(["lease", "acquire", "otel-demo", "--store", &s, "--json"])
        .env(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("http://{}", collector.addr),
        )
        .env("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=OTELSECRETMARKER")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .env_remove("OTEL_SERVICE_NAME")
        .env("LEASEHOLD_LOG", "trace")
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        !all.contains("OTELSECRETMARKER"),
        "header value logged: {all}"
    );
    // The exporter flushed before the process exited.
    let seen = collector.seen.lock().unwrap();
    let traces: Vec<_> = seen
        .iter()
        .filter(|(req, _, _)| req.starts_with("POST /v1/traces "))
        .collect();
    assert!(
        !traces.is_empty(),
        "no export: {:?}",
        seen.iter().map(|r| &r.0).collect::<Vec<_>>()
    );
    let (_, headers, _) = traces[0];
    let header = |k: &str| {
        headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("content-type"), Some("application/x-protobuf"));
    assert_eq!(header("x-api-key"), Some("OTELSECRETMARKER"));
    // Protobuf carries strings as raw bytes: the service name, the span of
    // the create-if-absent write, and its attributes are all in the body.
    let body: Vec<u8> = traces.iter().flat_map(|(_, _, b)| b.clone()).collect();
    for needle in [
        &b"leasehold"[..],
        b"bucket put_create",
        b"lease acquire",
        b"otel-demo",
        b"outcome",
        b"latency_ms",
    ] {
        assert!(
            contains(&body, needle),
            "{:?} not in the exported spans",
            String::from_utf8_lossy(needle)
        );
    }
}

#[test]
fn otlp_refuses_grpc_and_survives_a_missing_collector() {
    let (_d, s) = store();
    let o = bin()
        .args(["lease", "show", "x", "--store", &s])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("OTEL_EXPORTER_OTLP_PROTOCOL") && stderr(&o).contains("http/protobuf"),
        "{}",
        stderr(&o)
    );
    // An endpoint that is not an http(s) URL is refused, and names itself.
    let o = bin()
        .args(["lease", "show", "x", "--store", &s])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("OTEL_EXPORTER_OTLP_ENDPOINT") && stderr(&o).contains("http://"),
        "{}",
        stderr(&o)
    );
    // Nobody listens on the discard port: the command still does its job
    // and exits with its own status.
    assert_eq!(code(&run(&["lease", "create", "y", "--store", &s])), 0);
    let o = bin()
        .args(["lease", "acquire", "y", "--store", &s, "--json"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
        .env_remove("OTEL_EXPORTER_OTLP_PROTOCOL")
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["epoch"], 1, "{}", stdout(&o));
}

/// One-shot readers judge a silent owner by wall clock within an explicit
/// skew bound (`--max-skew`, default 5 s): a node not renewed for ttl + bound
/// shows as expired, its running sessions as interrupted, and `resolve` says
/// no live owner (exit 1). A peer's clock running 3 s ahead stays within the
/// bound and is live.
#[test]
fn one_shot_readers_call_a_silent_owner_expired_within_the_skew_bound() {
    use leasehold::clock::{Clock, SystemClock};
    use leasehold::fleet::claim::{ClaimRecord, ClaimState, Owner};
    use leasehold::record::{Holder, Kind, LeaseRecord, SCHEMA};
    let (_d, s) = store();
    let store = rt()
        .block_on(leasehold::store::open_store(&s, &Default::default()))
        .unwrap();
    let now = SystemClock::new().wall_ms();
    let put = |key: &str, bytes: Vec<u8>| {
        rt().block_on(store.put(
            key,
            bytes::Bytes::from(bytes),
            leasehold::store::Cond::Create,
        ))
        .unwrap();
    };
    for (node, renewed) in [
        ("dead", now - 60_000),
        ("ahead", now + 3_000),
        ("gone", now - 60_000),
    ] {
        let mut attrs = serde_json::Map::new();
        if node == "gone" {
            attrs.insert("released_by".into(), "ahead".into());
        }
        let r = LeaseRecord {
            schema: SCHEMA.into(),
            kind: Kind::Node,
            holder: Holder {
                node: node.into(),
                host: "h".into(),
                instance: format!("i-{node}"),
            },
            epoch: 1,
            ttl_ms: 2_000,
            renewed_at_ms: renewed,
            released: node == "gone",
            host_locked: true,
            lock_id: None,
            address: None,
            attrs,
            nonce: format!("n-{node}"),
        };
        put(&format!("nodes/{node}"), r.encode().unwrap());
        let c = ClaimRecord {
            schema: SCHEMA.into(),
            kind: "session".into(),
            owner: Owner {
                node: node.into(),
                instance: format!("i-{node}"),
            },
            epoch: 4,
            state: ClaimState::Running,
            digest: "d".into(),
            address: None,
            exit_code: None,
            reason: None,
            backoff_until_ms: None,
            health: None,
            endpoint: None,
            restarts: 0,
            updated_at_ms: renewed,
            tick_ms: None,
            nonce: format!("c-{node}"),
        };
        put(&format!("sessions/on-{node}"), c.encode());
        if node == "dead" {
            // A forged record under another key, naming dead's instance and
            // renewed now: it once replaced dead's own record in `ls`
            // (keyed by the holder it names), making on-dead look running.
            let mut forged = r.clone();
            forged.renewed_at_ms = now;
            put("nodes/zz-forged", forged.encode().unwrap());
        }
    }
    let nodes = json(&run(&["nodes", "--store", &s, "--json"]));
    let state = |n: &str| {
        nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["node"] == n)
            .map(|r| r["state"].clone())
    };
    assert_eq!(state("dead"), Some("expired".into()), "{nodes}");
    assert_eq!(state("ahead"), Some("live".into()), "{nodes}");
    assert_eq!(state("gone"), Some("fenced".into()), "{nodes}");
    let forged = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == "zz-forged")
        .expect("the forged record's row");
    assert!(
        forged["corrupt"].as_str().unwrap().contains("names node"),
        "{nodes}"
    );
    let gone = run(&["nodes", "--store", &s]);
    assert!(
        stdout(&gone)
            .lines()
            .any(|l| l.starts_with("gone") && l.contains("fenced")),
        "{}",
        stdout(&gone)
    );
    let ls = json(&run(&["ls", "--store", &s, "--json"]));
    let status = |n: &str| {
        ls.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .map(|r| r["status"].clone())
    };
    assert_eq!(status("on-dead"), Some("interrupted".into()), "{ls}");
    assert_eq!(status("on-ahead"), Some("running".into()), "{ls}");
    // A session whose owner was fenced (its lease released by a peer that
    // is taking it over) is interrupted, not running.
    assert_eq!(status("on-gone"), Some("interrupted".into()), "{ls}");
    let d = run(&["resolve", "on-dead", "--store", &s, "--json"]);
    assert_eq!(code(&d), 1, "{}", stdout(&d));
    assert_eq!(json(&d)["owner_lease"], "expired");
    assert_eq!(json(&d)["live"], false);
    assert_eq!(json(&d)["status"], "interrupted", "the word `ls` says");
    let o = run(&["resolve", "on-ahead", "--store", &s, "--json"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert_eq!(json(&o)["owner_lease"], "live");
    let o = run(&["resolve", "on-dead", "--store", &s]);
    assert!(
        stdout(&o)
            .contains("epoch 4 interrupted (owner expired by wall clock; its claim says running)"),
        "{}",
        stdout(&o)
    );
    // A wider bound (clocks trusted less) calls the same owner live; a
    // malformed bound is refused.
    let o = run(&["resolve", "on-dead", "--store", &s, "--max-skew", "2m"]);
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let o = run(&["ls", "--store", &s, "--max-skew", "soon"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    // wake: the dial fails (no address) and the owner is expired: gone.
    let o = run(&["resolve", "on-dead", "--store", &s, "--wake", "--json"]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    assert_eq!(json(&o)["outcome"]["outcome"], "owner_gone");
    assert_eq!(json(&o)["outcome"]["lease"], "expired");
    // wake: the owner is live by its lease but cannot be reached (it
    // publishes no address): exit 1, where plain resolve says 0 above.
    let o = run(&["resolve", "on-ahead", "--store", &s, "--wake", "--json"]);
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    assert_eq!(json(&o)["outcome"]["outcome"], "unreachable");
}

/// URLs are never echoed with what they should not hold: a refused URL's
/// userinfo and query, and `doctor --json`'s endpoint userinfo.
#[test]
fn refused_urls_and_doctor_json_redact_userinfo_and_queries() {
    for url in [
        "s3://AKIAMARKER:SECRETMARKER@bucket/p",
        "az://user:SECRETMARKER@container",
        "gs://bucket/p?token=SECRETMARKER",
    ] {
        let o = run(&["ls", "--store", url]);
        assert_eq!(code(&o), 2, "{url}: {}", stderr(&o));
        let all = stdout(&o) + &stderr(&o);
        assert!(
            !all.contains("SECRETMARKER") && !all.contains("AKIAMARKER"),
            "{all}"
        );
        assert!(all.contains("do not belong in the URL"), "{all}");
    }
    let (_d, s) = store();
    let o = bin()
        .args(["doctor", "--store", &s, "--json"])
        .env("AWS_ENDPOINT_URL", "http://user:SECRETMARKER@127.0.0.1:9/")
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let all = stdout(&o) + &stderr(&o);
    assert!(!all.contains("SECRETMARKER"), "{all}");
    assert_eq!(json(&o)["endpoint"], "http://127.0.0.1:9/");
}

/// Dependency logs at trace level (hyper's pool logs the bare authority,
/// userinfo included) go through the same redaction.
#[test]
fn trace_logs_of_dependencies_are_redacted() {
    let o = bin()
        .args(["ls", "--store", "s3://bucket"])
        .env("AWS_ENDPOINT_URL", "http://user:SECRETMARKER@127.0.0.1:9")
        .env("AWS_ACCESS_KEY_ID", "a")
        .env("AWS_SECRET_ACCESS_KEY", "b")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("LEASEHOLD_LOG", "trace")
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("TRACE"), "no trace output: {err}");
    assert!(err.contains("<redacted>@127.0.0.1:9"), "{err}");
    assert!(!err.contains("SECRETMARKER"), "secret leaked");
}

/// A store the audit refused stays refused on this host (exit 6, saying
/// why and how to clear it) until `doctor` passes on it.
#[test]
fn an_audit_refusal_holds_until_doctor_passes() {
    let (d, s) = store();
    let locks = d.path().join("locks");
    std::fs::create_dir_all(&locks).unwrap();
    // What `node run` writes when its audit catches the store (keyed by the
    // store's identity: the directory's device and inode).
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(d.path()).unwrap();
    let identity = format!("file-inode:{}:{}", md.dev(), md.ino());
    let marker = leasehold::fleet::refusal_marker(&locks, &identity);
    std::fs::write(&marker, "sessions/web: two writers won\n").unwrap();
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let node = || {
        bin()
            .args(["node", "run", "--store", &s, "--id", "n1", "--ttl", "1s"])
            .env("LEASEHOLD_LOCK_DIR", &locks)
            .env("LEASEHOLD_STATE_DIR", d.path().join("state"))
            .spawn()
            .unwrap()
    };
    let o = node().wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(6));
    let o = bin()
        .args(["node", "run", "--store", &s, "--id", "n1", "--ttl", "1s"])
        .env("LEASEHOLD_LOCK_DIR", &locks)
        .env("LEASEHOLD_STATE_DIR", d.path().join("state"))
        .output()
        .unwrap();
    assert_eq!(code(&o), 6);
    let err = stderr(&o);
    assert!(
        err.contains("two writers won") && err.contains("leasehold doctor"),
        "{err}"
    );
    let o = bin()
        .args(["doctor", "--store", &s])
        .env("LEASEHOLD_LOCK_DIR", &locks)
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("cleared"), "{}", stderr(&o));
    assert!(!marker.exists());
    // Serving again: it registers.
    let mut n = node();
    let lease = d.path().join("nodes").join("n1");
    for _ in 0..200 {
        if lease.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let _ = n.kill();
    let _ = n.wait();
    assert!(
        lease.exists(),
        "the node did not register after doctor passed"
    );
}

/// The GCS emulator in reach (PyPI `gcp-storage-emulator`) does not
/// implement the writes leasehold needs: reached over plain http (the GCS
/// builder's allow-http survives our client options), it is refused at the
/// probe's first step with exit 6, never "outcome unknown" (4), and doctor
/// shows its full table, credentials and lock directory on that failure too.
#[test]
fn doctor_refuses_the_gcs_emulator_at_its_step_with_the_full_table() {
    let Some(url) = common::server("LEASEHOLD_TEST_GCS") else {
        return;
    };
    let o = run(&["doctor", "--store", &url, "--json"]);
    assert_eq!(code(&o), 6, "{}{}", stdout(&o), stderr(&o));
    let j = json(&o);
    assert_eq!(j["ok"], false);
    let steps = j["steps"].as_array().unwrap();
    let last = steps.last().expect("the failed step is in the table");
    assert_eq!(
        (last["name"].as_str(), last["ok"].as_bool()),
        (Some("create"), Some(false)),
        "{j}"
    );
    assert!(last["ms"].is_u64(), "{j}");
    assert!(
        j["error"]
            .as_str()
            .unwrap()
            .contains("refused at step \"create\""),
        "{j}"
    );
    assert!(
        j["credentials"]
            .as_str()
            .unwrap()
            .contains("GOOGLE_SERVICE_ACCOUNT"),
        "{j}"
    );
    assert!(j["lock_dir"].is_string() && j["probe_ms"].is_u64(), "{j}");
    let o = run(&["doctor", "--store", &url]);
    assert_eq!(code(&o), 6, "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "create",
        "FAIL",
        "verdict: REFUSED",
        "credentials ",
        "host locks in ",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    assert!(
        stderr(&o).contains("refused at step \"create\""),
        "{}",
        stderr(&o)
    );
}

/// Ceph RGW through the binary: doctor names the dialect it learned, and the
/// one-shot commands that write with If-Match (renew, release, apply
/// --replace) learn it too (a few requests), so they work there as on moto.
/// An upper-case scheme is the same URL.
#[test]
fn doctor_lease_and_apply_on_ceph_rgw_through_the_binary() {
    let Some((base, endpoint)) = common::rgw() else {
        return;
    };
    let d = common::session_dir();
    let id = d
        .path()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .replace('.', "");
    let url = format!("{base}/cli-rgw-{id}");
    let rgw = |args: &[&str]| {
        bin()
            .args(args)
            .args(["--endpoint", &endpoint])
            .output()
            .unwrap()
    };
    let o = rgw(&["doctor", "--store", &url, "--json"]);
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let j = json(&o);
    assert_eq!(j["etag_dialect"], "unquoted", "{j}");
    assert_eq!(j["endpoint"], endpoint.as_str(), "{j}");
    let o = rgw(&["lease", "create", "job", "--store", &url]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = rgw(&["lease", "acquire", "job", "--store", &url, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = json(&o)["token"].as_str().unwrap().to_string();
    let o = rgw(&[
        "lease", "renew", "job", "--store", &url, "--token", &token, "--json",
    ]);
    assert_eq!(code(&o), 0, "renew on RGW: {}", stderr(&o));
    let token = json(&o)["token"].as_str().unwrap().to_string();
    let o = rgw(&[
        "lease", "release", "job", "--store", &url, "--token", &token,
    ]);
    assert_eq!(code(&o), 0, "release on RGW: {}", stderr(&o));
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "w", "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    let o = rgw(&["apply", f.to_str().unwrap(), "--store", &url]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    std::fs::write(
        &f,
        r#"{"name": "w", "spec": {"command": "sleep", "args": ["2"]}}"#,
    )
    .unwrap();
    let o = rgw(&["apply", f.to_str().unwrap(), "--store", &url, "--replace"]);
    assert_eq!(code(&o), 0, "apply --replace on RGW: {}", stderr(&o));
    assert!(stdout(&o).contains("replaced"), "{}", stdout(&o));
    let upper = url.replacen("s3://", "S3://", 1);
    let o = rgw(&["ls", "manifests", "--store", &upper]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains('w'), "{}", stdout(&o));
}

/// A real S3 API that checks conditions without a lock (moto with its race
/// window widened, `scripts/moto-server.py --racy-window-ms`): doctor, node
/// run and lease acquire all refuse it at a race step, before anything is
/// held (issue #10 case 6 on a real server; moto's narrow window is how the
/// probe refused plain moto once in CI).
#[test]
fn a_lock_free_s3_server_is_refused_by_doctor_node_run_and_acquire() {
    let Some(endpoint) = common::server("LEASEHOLD_TEST_S3_RACY_ENDPOINT") else {
        return;
    };
    let d = common::session_dir();
    let token = d.path().join("token");
    std::fs::write(&token, "racy-store-test-token-0123456789").unwrap();
    let racy = |args: &[&str]| {
        bin()
            .args(args)
            .env("AWS_ENDPOINT_URL", &endpoint)
            .output()
            .unwrap()
    };
    let url = "s3://leasehold-test/racy";
    let o = racy(&["doctor", "--store", url, "--json"]);
    assert_eq!(code(&o), 6, "{}{}", stdout(&o), stderr(&o));
    let j = json(&o);
    assert_eq!(j["ok"], false, "{j}");
    let e = stderr(&o);
    assert!(
        e.contains("refused at step \"create race\"") && e.contains("concurrent creates succeeded"),
        "{e}"
    );
    let o = racy(&[
        "node",
        "run",
        "--store",
        url,
        "--id",
        "racy1",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert_eq!(
        code(&o),
        6,
        "node run served a lock-free store: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("race"), "{}", stderr(&o));
    let o = racy(&["lease", "acquire", "job", "--store", url, "--json"]);
    assert_eq!(code(&o), 6, "{}{}", stdout(&o), stderr(&o));
    // `init` probes first too (issue #44: on a store ignoring conditions,
    // three inits printed three fleet ids, each replacing the marker).
    let o = racy(&["init", "--store", url]);
    assert_eq!(
        code(&o),
        6,
        "init on a lock-free store: {}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(stderr(&o).contains("race"), "{}", stderr(&o));
    // Nothing was held: the refused runs wrote no node record and no lease.
    let o = racy(&["nodes", "--store", url, "-o", "json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o).as_array().map(Vec::len), Some(0), "{}", stdout(&o));
}

/// A pipe whose reader is already gone, as `leasehold ls | head` leaves it.
fn closed_pipe() -> std::process::Stdio {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills two descriptors we own from here on.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: closing our own read end.
    unsafe { libc::close(fds[0]) };
    // SAFETY: the write end is ours and handed over exactly once.
    std::process::Stdio::from(unsafe { std::os::fd::OwnedFd::from_raw_fd(fds[1]) })
}

/// Every subcommand whose reader has gone ends as Unix tools do (killed by
/// SIGPIPE, or its own exit code), never with a panic (exit 101).
#[test]
fn every_command_into_a_closed_pipe_ends_without_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    let (d, s) = store();
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    assert_eq!(code(&run(&["lease", "create", "l", "--store", &s])), 0);
    let o = run(&["lease", "acquire", "l", "--store", &s, "--json"]);
    let token = json(&o)["token"].as_str().unwrap().to_string();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let tok = tok.to_str().unwrap();
    let m = f.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["ls", "--store", &s],
        vec!["ls", "--store", &s, "--json"],
        vec!["ls", "nodes", "--store", &s],
        vec!["ls", "manifests", "--store", &s, "--json"],
        vec!["nodes", "--store", &s],
        vec!["inspect", "manifests/web", "--store", &s],
        vec!["inspect", "manifests/web", "--store", &s, "--json"],
        vec!["resolve", "web", "--store", &s],
        vec!["resolve", "web", "--store", &s, "--json"],
        vec!["resolve", "web", "--wake", "--store", &s],
        vec!["lease", "show", "l", "--store", &s],
        vec!["lease", "show", "l", "--store", &s, "--json"],
        vec!["lease", "renew", "l", "--store", &s, "--token", &token],
        vec!["lease", "acquire", "l2", "--store", &s, "--no-probe"],
        vec!["lease", "create", "l3", "--store", &s, "--json"],
        vec!["apply", m, "--store", &s],
        vec!["apply", m, "--store", &s, "--json"],
        vec!["init", "--store", &s],
        vec!["doctor", "--store", &s],
        vec!["doctor", "--store", &s, "--json"],
        vec![
            "watch",
            "--store",
            &s,
            "--token-file",
            tok,
            "--duration",
            "1s",
        ],
        vec!["logs", "web", "--store", &s, "--token-file", tok],
        vec!["completions", "bash"],
        vec!["completions", "zsh"],
        vec!["--help"],
        vec!["ls", "--help"],
        vec!["--version"],
        vec!["delete", "nope", "--store", &s, "--ignore-not-found"],
        vec!["describe", "web", "--store", &s],
        vec!["describe", "web", "--store", &s, "--json"],
        vec!["gc", "--store", &s, "--dry-run"],
        vec!["gc", "--store", &s, "--json"],
        vec!["ls", "--store", &s, "-o", "wide"],
        vec!["nodes", "--store", &s, "-o", "wide"],
        vec!["node", "cordon", "nobody", "--store", &s],
        vec!["node", "uncordon", "nobody", "--store", &s],
        vec!["demo", "--ttl", "200ms", "--sessions", "1"],
    ];
    for args in cases {
        let o = bin()
            .args(&args)
            .stdout(closed_pipe())
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert_ne!(o.status.code(), Some(101), "{args:?}: {err}");
        assert!(
            o.status.signal() == Some(libc::SIGPIPE) || o.status.code().is_some(),
            "{args:?}: {:?} {err}",
            o.status
        );
    }
}

/// Inputs an operator gets wrong: each is a typed error that names the
/// field or limit, and changes nothing.
#[test]
fn operator_mistakes_get_typed_errors_that_name_the_fix() {
    let (d, s) = store();
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let missing = format!("{s}/no-such-dir");
    let big = d.path().join("big.json");
    std::fs::write(
        &big,
        format!(
            r#"{{"name": "big", "spec": {{"command": "x", "args": ["{}"]}}}}"#,
            "a".repeat(70_000)
        ),
    )
    .unwrap();
    let spec_err = d.path().join("bad.json");
    std::fs::write(&spec_err, "{\n  \"name\": \"web\",\n  \"spec\": {\"command\": \"x\",\n    \"restart\": \"sometimes\"}\n}\n").unwrap();
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec![
                "doctor",
                "--store",
                "s3://b",
                "--endpoint",
                "127.0.0.1:9150",
            ],
            2,
            "not an http:// or https:// URL",
        ),
        (
            vec!["doctor", "--store", "s3://b", "--endpoint", "http://"],
            2,
            "invalid endpoint",
        ),
        (
            vec!["ls", "--store", "memory://"],
            2,
            "memory:// lives inside one process",
        ),
        (vec!["ls", "--store", &missing], 2, "does not exist"),
        (
            vec!["lease", "acquire", "日本", "--store", &s],
            2,
            "must be ASCII",
        ),
        (
            vec!["lease", "renew", "x", "--store", &s, "--token", "a!b"],
            2,
            "not a token printed by",
        ),
        (
            vec!["lease", "renew", "x", "--store", &s, "--token", "e30"],
            2,
            "not a leasehold lease token",
        ),
        (
            vec!["apply", big.to_str().unwrap(), "--store", &s],
            2,
            "limit of 64 KiB",
        ),
        (
            vec!["apply", spec_err.to_str().unwrap(), "--store", &s],
            2,
            "spec.restart",
        ),
        (
            vec!["node", "run", "--store", &s, "--id", "a", "--capacity", "0"],
            2,
            "0 is not in 1..=100000",
        ),
        (
            vec![
                "node",
                "run",
                "--store",
                &s,
                "--id",
                "a",
                "--capacity",
                "-1",
            ],
            2,
            "-1 is not in 1..=100000",
        ),
        (
            vec!["node", "run", "--store", &s, "--id", "a", "--ttl", "-5s"],
            2,
            "cannot be negative",
        ),
        (vec!["demo", "--sessions", "0"], 2, "0 is not in 1..=100"),
        (vec!["demo", "--store", &s], 2, "is not empty"),
        (vec!["demo", "--lease", "--store", &s], 2, "is not empty"),
    ];
    for (args, want, needle) in cases {
        let o = run(&args);
        assert_eq!(code(&o), want, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
    }
    // The spec error's line is the file's own (line 4), not a re-serialised one.
    let o = run(&["apply", spec_err.to_str().unwrap(), "--store", &s]);
    assert!(stderr(&o).contains("line 4"), "{}", stderr(&o));
    // The mistyped directory was not created; the demo wrote nothing.
    assert!(!d.path().join("no-such-dir").exists());
    let o = run(&["ls", "manifests", "--store", &s, "--json"]);
    assert_eq!(json(&o).as_array().map(Vec::len), Some(0), "{}", stdout(&o));
    // A file named by LEASEHOLD_CONFIG must exist; a log filter must parse.
    let o = bin()
        .args(["ls", "--store", &s])
        .env("LEASEHOLD_CONFIG", d.path().join("nope.json"))
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("nope.json"), "{}", stderr(&o));
    let o = bin()
        .args(["ls", "--store", &s])
        .env("LEASEHOLD_LOG", "leasehold=loud")
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("LEASEHOLD_LOG"), "{}", stderr(&o));
    // init creates a missing root, saying so; the one-shot readers then work.
    let o = run(&["init", "--store", &missing]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("creating"), "{}", stderr(&o));
    assert_eq!(code(&run(&["ls", "--store", &missing])), 0);
}

/// apply and delete as kubectl users expect: a changed spec names
/// `--replace`; a second delete is exit 7, or 0 with --ignore-not-found;
/// `inspect NAME` suggests the prefixed key; lease tokens explain staleness.
#[test]
fn apply_delete_inspect_and_lease_messages_say_what_to_do() {
    let (d, s) = store();
    apply_delete_messages(&d, &s);
}

#[test]
fn apply_delete_inspect_and_lease_messages_say_what_to_do_on_moto() {
    if let Some((d, s)) = moto_store("messages") {
        apply_delete_messages(&d, &s);
    }
}

fn apply_delete_messages(d: &tempfile::TempDir, s: &str) {
    let s = s.to_string();
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["2"]}}"#,
    )
    .unwrap();
    let o = run(&["apply", f.to_str().unwrap(), "--store", &s]);
    assert_eq!(code(&o), 3);
    assert!(
        stderr(&o).contains("use `apply --replace`"),
        "{}",
        stderr(&o)
    );
    let o = run(&["inspect", "web", "--store", &s]);
    assert_eq!(code(&o), 7);
    assert!(
        stderr(&o).contains("did you mean sessions/web or manifests/web"),
        "{}",
        stderr(&o)
    );
    assert_eq!(code(&run(&["delete", "web", "--store", &s])), 0);
    assert_eq!(code(&run(&["delete", "web", "--store", &s])), 7);
    assert_eq!(
        code(&run(&[
            "delete",
            "web",
            "--store",
            &s,
            "--ignore-not-found"
        ])),
        0
    );
    // A token made stale by our own renew is stale, not "held by" us.
    assert_eq!(code(&run(&["lease", "create", "l", "--store", &s])), 0);
    let o = run(&["lease", "acquire", "l", "--store", &s, "--json"]);
    let t1 = json(&o)["token"].as_str().unwrap().to_string();
    let o = run(&[
        "lease", "renew", "l", "--store", &s, "--token", &t1, "--json",
    ]);
    let t2 = json(&o)["token"].as_str().unwrap().to_string();
    let o = run(&["lease", "renew", "l", "--store", &s, "--token", &t1]);
    assert_eq!(code(&o), 3, "fenced: this token must not be acted on");
    assert!(stderr(&o).contains("this token is stale"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("held by"), "{}", stderr(&o));
    assert_eq!(
        code(&run(&[
            "lease", "release", "l", "--store", &s, "--token", &t2
        ])),
        0
    );
    let o = run(&["lease", "release", "l", "--store", &s, "--token", &t2]);
    assert_eq!(code(&o), 3);
    assert!(stderr(&o).contains("already released"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("held by"), "{}", stderr(&o));
}

/// `watch` with a token the nodes refuse stops at once with exit 8 instead
/// of printing "HTTP 401" forever and exiting 0.
#[test]
fn watch_with_a_refused_token_exits_8() {
    let (d, s) = store();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let _n1 = node_with_api(&s, "n1", &tok, &d.path().join("locks"));
    let wrong = d.path().join("wrong");
    std::fs::write(&wrong, "wrong-token-0123456789abcdef\n").unwrap();
    // Wait for the node to register its address.
    for _ in 0..100 {
        let o = run(&["nodes", "--store", &s, "--json"]);
        if stdout(&o).contains("http://") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let o = bin()
        .args(["watch", "--store", &s, "--duration", "20s", "--token-file"])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(code(&o), 8, "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("permission denied: bearer token"),
        "{}",
        stderr(&o)
    );
}

/// `ls` gives every status but a healthy `running` a reason, and `describe`
/// puts manifest, claim, owner liveness, reason, restarts and the owner's
/// recent events for the session in one place.
#[test]
fn ls_reasons_and_describe() {
    let (d, s) = store();
    reasons_and_describe(&d, &s);
}

#[test]
fn ls_reasons_and_describe_on_moto() {
    if let Some((d, s)) = moto_store("reasons") {
        reasons_and_describe(&d, &s);
    }
}

fn reasons_and_describe(d: &tempfile::TempDir, s: &str) {
    let s = s.to_string();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let mut n1 = node_with_api(&s, "n1", &tok, &d.path().join("locks"));
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "labels": {"team": "b"}, "spec": {"command": "sleep", "args": ["100"]}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    std::fs::write(
        &f,
        r#"{"name": "picky", "labels": {"team": "a"}, "spec": {"command": "sleep", "args": ["1"], "selector": {"zone": "nowhere"}}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    let mut running = false;
    for _ in 0..200 {
        if code(&run(&["resolve", "web", "--store", &s])) == 0 {
            running = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(running, "web never ran");
    let ls = json(&run(&["ls", "--store", &s, "--json"]));
    let row = |n: &str| {
        ls.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(row("picky")["status"], "queued");
    assert_eq!(row("picky")["reason"], "no node matches zone=nowhere");
    assert_eq!(row("web")["reason"], "");
    let o = run(&["ls", "--store", &s]);
    assert!(
        stdout(&o).contains("REASON") && stdout(&o).contains("no node matches zone=nowhere"),
        "{}",
        stdout(&o)
    );
    // -l and -o, as kubectl's: sessions by their manifest's labels (not
    // its selector, which names nodes).
    let names_of = |o: &std::process::Output| -> Vec<String> {
        json(o)
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    let o = run(&["ls", "--store", &s, "-l", "team=a", "-o", "json"]);
    assert_eq!(names_of(&o), ["picky"]);
    assert_eq!(json(&o)[0]["labels"]["team"], "a");
    let o = run(&["ls", "--store", &s, "-l", "zone=nowhere", "-o", "json"]);
    assert_eq!(names_of(&o), Vec::<String>::new());
    let o = run(&["ls", "manifests", "--store", &s, "-l", "team=b", "--json"]);
    assert_eq!(names_of(&o), ["web"]);
    // -o jsonpath=, over the same rows as -o json.
    let o = run(&[
        "ls",
        "--store",
        &s,
        "-o",
        r#"jsonpath={[?@.status=='queued'].name} {[*].name}{"\n"}"#,
    ]);
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "picky picky web\n".into()),
        "{}",
        stderr(&o)
    );
    let o = run(&["nodes", "--store", &s, "-o", "jsonpath={[*].node}"]);
    assert_eq!(stdout(&o), "n1", "{}", stderr(&o));
    let o = run(&["ls", "--store", &s, "-o", "jsonpath={[*].name"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("never closed"), "{}", stderr(&o));
    let o = run(&["ls", "--store", &s, "-o", "xml"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("jsonpath=TEMPLATE"), "{}", stderr(&o));
    let o = run(&["ls", "--store", &s, "-o", "wide"]);
    assert!(
        stdout(&o).contains("INSTANCE")
            && stdout(&o).contains("RESTARTS")
            && stdout(&o).contains("team=b"),
        "{}",
        stdout(&o)
    );
    // Relabelled: a new version of the manifest, the same digest, and the
    // session is not run again.
    let epoch_of_web = || {
        json(&run(&["ls", "--store", &s, "-l", "team=b", "--json"]))
            .as_array()
            .and_then(|a| a.first().cloned())
            .map(|r| r["epoch"].clone())
    };
    let before = epoch_of_web();
    let web = d.path().join("web.json");
    std::fs::write(
        &web,
        r#"{"name": "web", "labels": {"team": "b", "tier": "front"}, "spec": {"command": "sleep", "args": ["100"]}}"#,
    )
    .unwrap();
    let o = run(&["apply", web.to_str().unwrap(), "--store", &s, "--json"]);
    assert_eq!(code(&o), 3, "without --replace: {}", stderr(&o));
    let o = run(&[
        "apply",
        "--replace",
        web.to_str().unwrap(),
        "--store",
        &s,
        "--json",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["result"], "replaced");
    let o = run(&[
        "apply",
        "--replace",
        web.to_str().unwrap(),
        "--store",
        &s,
        "--json",
    ]);
    assert_eq!(json(&o)["result"], "unchanged");
    // Two passes of the node (ttl 2 s) see the new version.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let o = run(&["ls", "--store", &s, "-l", "tier=front", "--json"]);
    assert_eq!(names_of(&o), ["web"]);
    assert_eq!(json(&o)[0]["status"], "running");
    assert_eq!(epoch_of_web(), before, "relabelling ran the session again");
    // A bad label: refused at apply, exit 2, nothing written.
    std::fs::write(
        &web,
        r#"{"name": "web2", "labels": {"team": "has space"}, "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    let o = run(&["apply", web.to_str().unwrap(), "--store", &s]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("labels.team"), "{}", stderr(&o));
    let o = run(&["ls", "--store", &s, "--json"]);
    assert!(!names_of(&o).contains(&"web2".to_string()));
    let o = run(&["nodes", "--store", &s, "-l", "zone=x", "--json"]);
    assert_eq!(json(&o).as_array().map(Vec::len), Some(0), "{}", stdout(&o));
    let o = run(&["nodes", "--store", &s, "-o", "wide"]);
    assert!(
        stdout(&o).contains("LABELS") && stdout(&o).contains("n1"),
        "{}",
        stdout(&o)
    );
    let o = run(&["ls", "--store", &s, "-l", "bad label"]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    // describe, with the owner's journal.
    let o = bin()
        .args(["describe", "web", "--store", &s, "--token-file"])
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    for want in [
        "Name:       web",
        "Status:     running",
        "Command:  sleep 100",
        "Owner:      n1",
        "(live,",
        "Restarts:   0",
        "started",
    ] {
        assert!(out.contains(want), "{want:?} missing:\n{out}");
    }
    let o = run(&["describe", "web", "--store", &s, "--json"]);
    let j = json(&o);
    assert_eq!(
        (j["status"].as_str(), j["owner_liveness"].as_str()),
        (Some("running"), Some("live")),
        "{j}"
    );
    assert!(
        j["events_note"].as_str().unwrap().contains("--token-file"),
        "{j}"
    );
    assert_eq!(code(&run(&["describe", "nothing", "--store", &s])), 7);
    // The owner dies: by wall clock (skew bound 0 s) the session is
    // interrupted, and the reason says what the fleet is waiting for.
    let _ = n1.0.kill();
    let _ = n1.0.wait();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let o = run(&[
        "describe",
        "web",
        "--store",
        &s,
        "--max-skew",
        "0s",
        "--json",
    ]);
    let j = json(&o);
    assert_eq!(j["status"], "interrupted", "{j}");
    assert!(
        j["reason"]
            .as_str()
            .unwrap()
            .contains("waiting for a peer to observe n1's lease expired"),
        "{j}"
    );
}

/// `node drain` hands a node's sessions over gracefully and waits until it
/// holds none; the cordoned node takes nothing new (a new session goes to
/// its peer) and says so in `nodes`; `uncordon` lets it take sessions
/// again. With the token, the node is nudged and acts at once.
#[test]
fn drain_cordon_and_uncordon_a_node() {
    let (d, s) = store();
    drain_cordon_uncordon(&d, &s);
}

#[test]
fn drain_cordon_and_uncordon_a_node_on_moto() {
    if let Some((d, s)) = moto_store("drain") {
        drain_cordon_uncordon(&d, &s);
    }
}

fn drain_cordon_uncordon(d: &tempfile::TempDir, s: &str) {
    let s = s.to_string();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let locks = d.path().join("locks");
    let _n1 = node_with_api(&s, "n1", &tok, &locks);
    let _n2 = node_with_api(&s, "n2", &tok, &locks);
    let f = d.path().join("m.json");
    for i in 0..4 {
        std::fs::write(
            &f,
            format!(r#"{{"name": "s{i}", "spec": {{"command": "sleep", "args": ["100"]}}}}"#),
        )
        .unwrap();
        assert_eq!(
            code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
            0
        );
    }
    let owners = || -> Vec<String> {
        let ls = json(&run(&["ls", "--store", &s, "--json"]));
        ls.as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "running")
            .map(|r| r["owner"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let mut placed = false;
    for _ in 0..300 {
        if owners().len() == 4 {
            placed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(placed, "{:?}", owners());
    let o = bin()
        .args([
            "node",
            "drain",
            "n1",
            "--store",
            &s,
            "--timeout",
            "60s",
            "--token-file",
        ])
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("n1 drained"), "{}", stdout(&o));
    let mut moved = false;
    for _ in 0..300 {
        let w = owners();
        if w.len() == 4 && w.iter().all(|o| o == "n2") {
            moved = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(moved, "every session on n2: {:?}", owners());
    // A new session goes to n2: n1 is cordoned.
    std::fs::write(
        &f,
        r#"{"name": "s9", "spec": {"command": "sleep", "args": ["100"]}}"#,
    )
    .unwrap();
    let o = bin()
        .args(["apply", f.to_str().unwrap(), "--store", &s, "--token-file"])
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut s9 = None;
    for _ in 0..300 {
        let ls = json(&run(&["ls", "--store", &s, "--json"]));
        s9 = ls
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "s9" && r["status"] == "running")
            .map(|r| r["owner"].clone());
        if s9.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(s9, Some("n2".into()));
    let mut shown = false;
    for _ in 0..100 {
        let nodes = json(&run(&["nodes", "--store", &s, "--json"]));
        if nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["node"] == "n1" && n["cordoned"] == true)
        {
            shown = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(shown, "n1 publishes cordoned");
    let o = bin()
        .args(["node", "uncordon", "n1", "--store", &s, "--token-file"])
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("now (nudged)"), "{}", stdout(&o));
    let mut cleared = false;
    for _ in 0..100 {
        let nodes = json(&run(&["nodes", "--store", &s, "--json"]));
        if nodes
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["node"] == "n1" && n["cordoned"] == false)
        {
            cleared = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(cleared, "n1 uncordoned");
    // A token the node refuses: the write still lands (exit 0), and the
    // operator is told the nudge was refused, not "pass --token-file".
    let wrong = d.path().join("wrong");
    std::fs::write(&wrong, "wrong-token-0123456789abcdef\n").unwrap();
    let o = bin()
        .args(["node", "cordon", "n1", "--store", &s, "--token-file"])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("node n1 refused the token") && stderr(&o).contains("HTTP 401"),
        "{}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("wrong-token"), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("did not answer the nudge"),
        "{}",
        stdout(&o)
    );
}

/// `gc` shows its plan with --dry-run and removes nothing then; it removes
/// only what is old enough (the default retention is a day), and records
/// the epoch floor it raised.
#[test]
fn gc_dry_run_then_removal_of_old_tombstones_only() {
    let (d, s) = store();
    gc_scenario(&d, &s);
}

#[test]
fn gc_dry_run_then_removal_of_old_tombstones_only_on_moto() {
    if let Some((d, s)) = moto_store("gc") {
        gc_scenario(&d, &s);
    }
}

fn gc_scenario(d: &tempfile::TempDir, s: &str) {
    let s = s.to_string();
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    assert_eq!(code(&run(&["delete", "web", "--store", &s])), 0);
    // gc keeps its epoch floor in the fleet marker: no fleet, no removal.
    let o = run(&["gc", "--store", &s, "--older-than", "0s"]);
    assert_eq!(code(&o), 7, "{}", stderr(&o));
    assert_eq!(code(&run(&["inspect", "sessions/web", "--store", &s])), 0);
    assert_eq!(code(&run(&["init", "--store", &s])), 0);
    let o = run(&["gc", "--store", &s, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        json(&o)["candidates"].as_array().map(Vec::len),
        Some(0),
        "a day's retention"
    );
    let o = run(&["gc", "--store", &s, "--older-than", "0s", "--dry-run"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("would remove sessions/web"),
        "{}",
        stdout(&o)
    );
    assert_eq!(
        code(&run(&["inspect", "sessions/web", "--store", &s])),
        0,
        "dry run removed nothing"
    );
    let o = run(&["gc", "--store", &s, "--older-than", "0s", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(json(&o)["removed"], 1, "{}", stdout(&o));
    let o = run(&["inspect", "sessions/web", "--store", &s]);
    assert_eq!(code(&o), 7, "{}", stdout(&o));
}

/// Job semantics through real processes: on a capacity-1 node the second
/// job runs once the first has succeeded (finished sessions free their
/// slot), and a crash-looping session shows its restarts and last exit in
/// `ls` while it backs off.
fn job_semantics(d: &tempfile::TempDir, s: &str) {
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    assert_eq!(code(&run(&["init", "--store", s])), 0);
    let _n = NodeProc(
        bin()
            .args([
                "node",
                "run",
                "--store",
                s,
                "--id",
                "solo",
                "--ttl",
                "2s",
                "--capacity",
                "1",
            ])
            .env("LEASEHOLD_LOCK_DIR", d.path().join("locks"))
            .env("LEASEHOLD_STATE_DIR", d.path().join("state"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let f = d.path().join("m.json");
    for (name, cmd) in [("one", "exit 0"), ("two", "exit 0")] {
        std::fs::write(
            &f,
            format!(r#"{{"name": "{name}", "spec": {{"command": "sh", "args": ["-c", "{cmd}"], "restart": "never"}}}}"#),
        )
        .unwrap();
        assert_eq!(code(&run(&["apply", f.to_str().unwrap(), "--store", s])), 0);
    }
    let status = |n: &str| -> serde_json::Value {
        let ls = json(&run(&["ls", "--store", s, "--json"]));
        ls.as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == n)
            .cloned()
            .unwrap_or_default()
    };
    let mut done = false;
    for _ in 0..300 {
        if status("one")["status"] == "succeeded" && status("two")["status"] == "succeeded" {
            done = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        done,
        "both jobs succeeded on one slot: {} {}",
        status("one"),
        status("two")
    );
    assert_eq!(status("two")["reason"], "exit 0");
    std::fs::write(
        &f,
        r#"{"name": "loop", "spec": {"command": "sh", "args": ["-c", "exit 3"], "restart": "always"}}"#,
    )
    .unwrap();
    assert_eq!(code(&run(&["apply", f.to_str().unwrap(), "--store", s])), 0);
    let mut seen = false;
    for _ in 0..300 {
        let r = status("loop");
        if r["restarts"].as_u64().unwrap_or(0) >= 3 {
            assert!(
                r["reason"].as_str().unwrap_or("").contains("last exit 3"),
                "{r}"
            );
            seen = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(seen, "the crash loop shows: {}", status("loop"));
}

#[test]
fn job_semantics_capacity_and_crash_loop() {
    let (d, s) = store();
    job_semantics(&d, &s);
}

#[test]
fn job_semantics_capacity_and_crash_loop_on_moto() {
    if let Some((d, s)) = moto_store("jobs") {
        job_semantics(&d, &s);
    }
}

/// Real processes: a session deleted, its tombstone removed by `gc`, and the
/// session applied again under the same name runs at a higher epoch than
/// before: no fencing token is issued twice across a gc.
fn gc_then_reapply(d: &tempfile::TempDir, s: &str) {
    assert_eq!(code(&run(&["init", "--store", s])), 0);
    let _n = NodeProc(
        bin()
            .args(["node", "run", "--store", s, "--id", "solo", "--ttl", "2s"])
            .env("LEASEHOLD_LOCK_DIR", d.path().join("locks"))
            .env("LEASEHOLD_STATE_DIR", d.path().join("state"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["100"]}}"#,
    )
    .unwrap();
    let epoch = || -> Option<u64> {
        let ls = json(&run(&["ls", "--store", s, "--json"]));
        ls.as_array()?
            .iter()
            .find(|r| r["name"] == "web" && r["status"] == "running")
            .and_then(|r| r["epoch"].as_u64())
    };
    let wait_epoch = || -> u64 {
        for _ in 0..300 {
            if let Some(e) = epoch() {
                return e;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("web never ran");
    };
    assert_eq!(code(&run(&["apply", f.to_str().unwrap(), "--store", s])), 0);
    let first = wait_epoch();
    assert_eq!(code(&run(&["delete", "web", "--store", s])), 0);
    let mut released = false;
    for _ in 0..300 {
        let o = run(&["inspect", "sessions/web", "--store", s, "--json"]);
        if stdout(&o).contains("\"released\"") {
            released = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(released, "the owner released the deleted session");
    let o = run(&["gc", "--store", s, "--older-than", "0s", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        json(&o)["removed_keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "sessions/web"),
        "{}",
        stdout(&o)
    );
    assert_eq!(code(&run(&["apply", f.to_str().unwrap(), "--store", s])), 0);
    let again = wait_epoch();
    assert!(again > first, "epoch {again} after gc, was {first}");
}

#[test]
fn gc_then_reapply_never_reuses_an_epoch() {
    let (d, s) = store();
    gc_then_reapply(&d, &s);
}

#[test]
fn gc_then_reapply_never_reuses_an_epoch_on_moto() {
    if let Some((d, s)) = moto_store("gc-reapply") {
        gc_then_reapply(&d, &s);
    }
}

/// #10 for standalone leases, with real processes: a lease deleted under its
/// holder is not taken while the holder may still believe in it (its epoch
/// is not handed out again either), and an undeclared name is waited out.
#[test]
fn a_deleted_standalone_lease_is_never_taken_beside_its_holder() {
    let (d, s) = store();
    assert_eq!(code(&run(&["lease", "create", "job", "--store", &s])), 0);
    let a = run(&[
        "lease", "acquire", "job", "--store", &s, "--ttl", "1s", "--node", "n1", "--json",
    ]);
    assert_eq!(code(&a), 0, "{}", stderr(&a));
    assert_eq!(json(&a)["epoch"], 1);
    let token = json(&a)["token"].as_str().unwrap().to_string();
    // An operator (or a lifecycle rule) deletes the record while n1 holds it.
    std::fs::remove_file(d.path().join("leases/job")).unwrap();
    let b = run(&[
        "lease", "acquire", "job", "--store", &s, "--ttl", "1s", "--node", "n2", "--json",
    ]);
    assert_eq!(
        code(&b),
        1,
        "a missing record is no licence: {}",
        stdout(&b)
    );
    assert_eq!(json(&b)["state"], "absent", "{}", stdout(&b));
    let b = run(&["lease", "acquire", "job", "--store", &s, "--node", "n2"]);
    assert_eq!(code(&b), 1);
    assert!(
        stdout(&b).contains("absent: leases/job has no record") && stdout(&b).contains("--wait"),
        "{}",
        stdout(&b)
    );
    let show = run(&["lease", "show", "job", "--store", &s, "--json"]);
    assert_eq!(code(&show), 0, "{}", stderr(&show));
    assert_eq!(json(&show)["state"], "absent", "{}", stdout(&show));
    // The holder's next renewal is fenced, and puts its epoch on the marker.
    let r = run(&["lease", "renew", "job", "--store", &s, "--token", &token]);
    assert_eq!(code(&r), 3, "{}", stderr(&r));
    assert!(
        stderr(&r).contains("the record was deleted"),
        "{}",
        stderr(&r)
    );
    let show = json(&run(&["lease", "show", "job", "--store", &s, "--json"]));
    assert_eq!(show["record"]["epoch"], 1, "{show}");
    assert_eq!(show["record"]["holder"]["node"], "vanished", "{show}");
    // Watched for ttl + margin, it is taken, above the deleted epoch.
    let b = run(&[
        "lease", "acquire", "job", "--store", &s, "--ttl", "1s", "--node", "n2", "--wait", "5s",
        "--json",
    ]);
    assert_eq!(code(&b), 0, "{}{}", stdout(&b), stderr(&b));
    assert_eq!(json(&b)["epoch"], 2, "no token handed out twice");
    // Deleted, and no acquirer came by to write a marker: the holder's
    // renewal writes it, at its epoch.
    let token = json(&b)["token"].as_str().unwrap().to_string();
    std::fs::remove_file(d.path().join("leases/job")).unwrap();
    let r = run(&["lease", "renew", "job", "--store", &s, "--token", &token]);
    assert_eq!(code(&r), 3, "{}", stderr(&r));
    let show = json(&run(&["lease", "show", "job", "--store", &s, "--json"]));
    assert_eq!(show["record"]["epoch"], 2, "{show}");
    assert_eq!(show["record"]["holder"]["node"], "vanished", "{show}");
    // Declaring it again changes nothing, and says what stands.
    let c = run(&["lease", "create", "job", "--store", &s]);
    assert_eq!(code(&c), 0, "{}", stderr(&c));
    assert!(
        stdout(&c).contains("marker of a deleted record"),
        "{}",
        stdout(&c)
    );
    let c = run(&[
        "lease", "acquire", "job", "--store", &s, "--ttl", "1s", "--node", "n3", "--wait", "5s",
        "--json",
    ]);
    assert_eq!(code(&c), 0, "{}{}", stdout(&c), stderr(&c));
    assert_eq!(json(&c)["epoch"], 3, "no token handed out twice");
    // An undeclared name is acquired too, after the same wait.
    let u = run(&[
        "lease", "acquire", "new", "--store", &s, "--ttl", "200ms", "--wait", "3s", "--json",
    ]);
    assert_eq!(code(&u), 0, "{}{}", stdout(&u), stderr(&u));
    assert_eq!(json(&u)["epoch"], 1);
}

/// `watch` reads each node's stream as typed events: a kind this build does
/// not know (from a newer node) is printed as its word, and a frame it
/// cannot read is said, not dropped unseen. The "node" is a fake that
/// answers every request with the same three frames.
#[test]
fn watch_prints_unknown_kinds_and_says_what_it_skipped() {
    use std::io::{Read, Write};
    let (d, s) = store();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let body = concat!(
                "event: journal\nid: 1\ndata: {\"seq\":1,\"at_ms\":5,\"kind\":\"teleported\",\"session\":\"web\",\"detail\":\"far\"}\n\n",
                "event: journal\nid: 2\ndata: {\"seq\":2,\"kind\":\n\n",
                "event: journal\nid: 3\ndata: {\"seq\":3,\"at_ms\":6,\"kind\":\"claimed\",\"session\":\"api\",\"epoch\":4}\n\n",
            );
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    // Its node record, with the fake's address.
    rt().block_on(async {
        let store = leasehold::store::open_store(&s, &Default::default())
            .await
            .unwrap();
        let client =
            leasehold::lease::LeaseClient::builder(store, leasehold::Name::new("fake").unwrap())
                .build()
                .unwrap();
        let mut opts = leasehold::lease::AcquireOptions::ttl(std::time::Duration::from_secs(60));
        opts.address = Some(format!("http://{addr}"));
        let got = client
            .acquire_kind(
                leasehold::record::Kind::Node,
                &leasehold::Name::new("fake").unwrap(),
                &opts,
            )
            .await
            .unwrap();
        assert!(matches!(got, leasehold::lease::Acquire::Acquired(_)));
    });
    let o = bin()
        .args(["watch", "--store", &s, "--from-start", "--duration", "1s"])
        .arg("--token-file")
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    let line = |needle: &str| out.lines().find(|l| l.contains(needle)).map(str::to_string);
    let unknown = line("teleported").unwrap_or_else(|| panic!("{out}"));
    assert!(
        unknown.contains("web") && unknown.contains("far"),
        "{unknown}"
    );
    let known = line("claimed").unwrap_or_else(|| panic!("{out}"));
    assert!(
        known.contains("api") && known.contains("epoch 4"),
        "{known}"
    );
    assert!(line("skipped a malformed journal frame").is_some(), "{out}");
}

/// With no store anywhere, every command that needs one says each place it
/// may come from (issue #44: clap's message named only `--store`).
#[test]
fn a_missing_store_names_the_flag_the_variable_and_the_config_file() {
    for args in [
        &["ls"][..],
        &["describe", "web"],
        &["lease", "show", "x"],
        &["doctor"],
    ] {
        let o = run(args);
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        for needed in [
            "--store",
            "LEASEHOLD_STORE",
            "/nonexistent/leasehold-test-config/leasehold/config.json",
        ] {
            assert!(e.contains(needed), "{args:?} does not name {needed}: {e}");
        }
    }
}

/// `get` is `ls`, as in kubectl; `-o yaml` holds what `-o json` does.
#[test]
fn get_is_ls_and_yaml_is_json() {
    let (d, url) = store();
    let f = d.path().join("web.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &url])),
        0
    );
    for what in ["sessions", "manifests", "nodes"] {
        let ls = run(&["ls", what, "--store", &url, "-o", "json"]);
        let get = run(&["get", what, "--store", &url, "-o", "json"]);
        assert_eq!(code(&ls), 0, "{}", stderr(&ls));
        assert_eq!(code(&get), 0, "{}", stderr(&get));
        let yaml = run(&["get", what, "--store", &url, "-o", "yaml"]);
        assert_eq!(code(&yaml), 0, "{}", stderr(&yaml));
        let from_yaml: serde_json::Value = serde_saphyr::from_str(&stdout(&yaml)).unwrap();
        // Ages move between the runs; the rest must agree.
        let strip = |mut v: serde_json::Value| {
            for r in v.as_array_mut().into_iter().flatten() {
                if let Some(o) = r.as_object_mut() {
                    o.retain(|k, _| !k.contains("ago") && k != "claim");
                }
            }
            v
        };
        assert_eq!(strip(json(&ls)), strip(json(&get)), "{what}");
        assert_eq!(strip(json(&ls)), strip(from_yaml), "{what}");
        if what == "manifests" {
            assert!(stdout(&yaml).contains("name: web"), "{}", stdout(&yaml));
        }
    }
}

/// `node run` before `init` (issue #44): a missing local root is refused,
/// not created, and the message says what to run; an empty one says there
/// is no fleet there and how to make one, in one sentence.
#[test]
fn node_run_before_init_says_to_init_and_creates_nothing() {
    let d = common::session_dir();
    let root = d.path().join("fleet");
    let url = format!("file://{}", root.display());
    let o = run(&["node", "run", "--id", "n1", "--store", &url]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("`leasehold init --store {url}`")),
        "{}",
        stderr(&o)
    );
    assert!(!root.exists(), "node run created {}", root.display());
    std::fs::create_dir(&root).unwrap();
    let o = run(&["node", "run", "--id", "n1", "--store", &url]);
    assert_eq!(code(&o), 7, "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(&format!("no fleet at {url}")) && e.contains("run `leasehold init` once"),
        "{e}"
    );
    assert!(!e.contains("was not found"), "{e}");
}

/// `apply -f` as kubectl users type it (issue #44): files, a directory,
/// stdin; YAML documents and JSON arrays; one bad document writes nothing
/// and its error names the file, the document and the field.
#[test]
fn apply_takes_files_directories_stdin_yaml_and_json_arrays() {
    let (d, url) = store();
    let m = d.path().join("m");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(
        m.join("a.yaml"),
        "name: web\nspec:\n  command: sh\n  args: [\"-c\", \"sleep 100\"]\n  restart: always\n---\nname: worker\nspec:\n  command: sleep\n  args: [\"60\"]\n",
    )
    .unwrap();
    std::fs::write(
        m.join("b.json"),
        r#"[{"name": "j1", "spec": {"command": "true"}}, {"name": "j2", "spec": {"command": "true"}}]"#,
    )
    .unwrap();
    std::fs::write(m.join("notes.txt"), "not a manifest").unwrap();
    let o = run(&[
        "apply",
        "-f",
        m.to_str().unwrap(),
        "--store",
        &url,
        "--json",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let answers = json(&o);
    let keys: Vec<&str> = answers
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "manifests/web",
            "manifests/worker",
            "manifests/j1",
            "manifests/j2"
        ]
    );
    assert!(
        answers
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["result"] == "created")
    );
    // stdin, YAML: the same specs are unchanged.
    let mut child = bin()
        .args(["apply", "-f", "-", "--store", &url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(m.join("a.yaml")).unwrap())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("manifests/web unchanged"),
        "{}",
        stdout(&o)
    );
    // One bad document among good ones: nothing written, and said where.
    let two = d.path().join("two.yaml");
    std::fs::write(
        &two,
        "name: ok1\nspec: {command: \"true\"}\n---\nname: bad\nspec:\n  command: sh\n  restart: sometimes\n",
    )
    .unwrap();
    let o = run(&["apply", "-f", two.to_str().unwrap(), "--store", &url]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("two.yaml: line 7 column") && e.contains("unknown variant `sometimes`"),
        "{e}"
    );
    let o = run(&["inspect", "manifests/ok1", "--store", &url]);
    assert_eq!(code(&o), 7, "ok1 was written: {}", stdout(&o));
    // A JSON array's bad element is named by its index.
    let arr = d.path().join("arr.json");
    std::fs::write(
        &arr,
        r#"[{"name": "x1", "spec": {"command": "true"}}, {"name": "x2", "spec": {"command": ""}}]"#,
    )
    .unwrap();
    let o = run(&["apply", arr.to_str().unwrap(), "--store", &url]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("arr.json at [1]"), "{}", stderr(&o));
    // Aliases (a YAML bomb's means) are refused before anything expands.
    let bomb = d.path().join("bomb.yaml");
    std::fs::write(
        &bomb,
        "name: b\nspec:\n  command: &c sh\n  args: [*c, *c, *c]\n",
    )
    .unwrap();
    let o = run(&["apply", bomb.to_str().unwrap(), "--store", &url]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("aliases"), "{}", stderr(&o));
    // JSON: nothing after the value, and an empty array is no manifest.
    for (body, says) in [
        (
            r#"{"name": "c1", "spec": {"command": "true"}}{"name": "c2", "spec": {"command": "true"}}"#,
            "trailing characters",
        ),
        ("[]", "holds no manifest"),
    ] {
        let f = d.path().join("odd.json");
        std::fs::write(&f, body).unwrap();
        let o = run(&["apply", f.to_str().unwrap(), "--store", &url]);
        assert_eq!(code(&o), 2, "{body}: {}", stderr(&o));
        assert!(stderr(&o).contains(says), "{body}: {}", stderr(&o));
    }
    let o = run(&["inspect", "manifests/c1", "--store", &url]);
    assert_eq!(code(&o), 7, "c1 was written: {}", stdout(&o));
    // A manifest the store refuses (another spec there) does not stop the
    // others; the command fails with it.
    let refused = d.path().join("refused.json");
    std::fs::write(
        &refused,
        r#"[{"name": "web", "spec": {"command": "other"}}, {"name": "later", "spec": {"command": "true"}}]"#,
    )
    .unwrap();
    let o = run(&[
        "apply",
        refused.to_str().unwrap(),
        "--store",
        &url,
        "--json",
    ]);
    assert_eq!(code(&o), 3, "{}", stderr(&o));
    let answers = json(&o);
    assert_eq!(answers[0]["result"], "error", "{answers}");
    assert_eq!(answers[1]["result"], "created", "{answers}");
    // Nothing given.
    let o = run(&["apply", "--store", &url]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("-f FILE|DIR|-"), "{}", stderr(&o));
    // A directory with a manifest name that is not a regular file (a FIFO
    // would block the read, a dangling link fail it): refused with its
    // name, nothing written, never skipped in silence.
    let odd = d.path().join("odd");
    std::fs::create_dir(&odd).unwrap();
    std::fs::write(
        odd.join("a.json"),
        r#"{"name": "odd1", "spec": {"command": "true"}}"#,
    )
    .unwrap();
    let fifo = odd.join("b.yaml");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::os::unix::fs::symlink(d.path().join("missing.json"), odd.join("c.json")).unwrap();
    let o = run(&["apply", "-f", odd.to_str().unwrap(), "--store", &url]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("b.yaml is not a regular file"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(&fifo).unwrap();
    let o = run(&["apply", "-f", odd.to_str().unwrap(), "--store", &url]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("c.json"), "{}", stderr(&o));
    let o = run(&["inspect", "manifests/odd1", "--store", &url]);
    assert_eq!(code(&o), 7, "odd1 was written: {}", stdout(&o));
}

/// One vocabulary (issue #44): a paused manifest never claimed is `paused`
/// in `resolve` (text and JSON) as in `ls`, not "queued".
#[test]
fn a_paused_session_never_claimed_is_paused_everywhere() {
    let (d, url) = store();
    let f = d.path().join("web.json");
    std::fs::write(
        &f,
        r#"{"name": "web", "spec": {"command": "sleep", "args": ["1"]}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &url])),
        0
    );
    let o = run(&["resolve", "web", "--store", &url]);
    assert!(
        stdout(&o).contains("web: queued (never claimed)"),
        "{}",
        stdout(&o)
    );
    let o = run(&["pause", "web", "--store", &url]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(&["resolve", "web", "--store", &url]);
    assert_eq!(code(&o), 1);
    assert!(
        stdout(&o).contains("web: paused (never claimed)"),
        "{}",
        stdout(&o)
    );
    let o = run(&["resolve", "web", "--store", &url, "--json"]);
    assert_eq!(json(&o)["status"], "paused", "{}", stdout(&o));
    let o = run(&["ls", "--store", &url, "-o", "json"]);
    assert_eq!(json(&o)[0]["status"], "paused", "{}", stdout(&o));
}

/// A queued session is nobody's (issue #44): after its node released it,
/// the table shows no owner and the epoch it left at in parentheses, not
/// the node that let it go.
#[test]
fn a_released_session_shows_no_owner_in_the_table() {
    let (d, s) = store();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let mut n1 = node_with_api(&s, "n1", &tok, &d.path().join("locks"));
    let f = d.path().join("m.json");
    std::fs::write(
        &f,
        r#"{"name": "s0", "spec": {"command": "sleep", "args": ["100"], "restart": "always"}}"#,
    )
    .unwrap();
    assert_eq!(
        code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
        0
    );
    let status = || json(&run(&["ls", "--store", &s, "--json"]))[0]["status"].clone();
    let mut running = false;
    for _ in 0..300 {
        if status() == "running" {
            running = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(running, "{}", status());
    // SIGTERM: the node stops its session and releases the claim.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(n1.0.id() as i32, libc::SIGTERM) };
    let _ = n1.0.wait();
    assert_eq!(status(), "queued");
    let table = stdout(&run(&["ls", "--store", &s]));
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("s0"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..4], ["s0", "queued", "-", "(1)"], "{table}");
    // JSON keeps what the claim says.
    let j = json(&run(&["ls", "--store", &s, "--json"]));
    assert_eq!(j[0]["owner"], "n1", "{j}");
    // The released node runs nothing: no load from its last renewal.
    let nodes = stdout(&run(&["nodes", "--store", &s]));
    let row: Vec<&str> = nodes
        .lines()
        .find(|l| l.starts_with("n1"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert!(row[3].starts_with("-/"), "{nodes}");
}

/// Issue #44: completion offers session and node names from the store, as
/// kubectl completes pod names. The shell's side (`source <(COMPLETE=bash
/// leasehold)`) calls the binary back with the words typed so far; here
/// that call is made as bash makes it. Without a store, or with one that
/// cannot be read, nothing is offered and nothing is printed in the shell.
#[test]
fn session_and_node_names_complete_from_the_store() {
    let (d, s) = store();
    let tok = d.path().join("tok");
    std::fs::write(&tok, "test-token-0123456789abcdef\n").unwrap();
    let _n1 = node_with_api(&s, "n1", &tok, &d.path().join("locks"));
    for name in ["web", "worker", "batch"] {
        let f = d.path().join(format!("{name}.json"));
        std::fs::write(
            &f,
            format!(r#"{{"name": "{name}", "spec": {{"command": "sleep", "args": ["100"]}}}}"#),
        )
        .unwrap();
        assert_eq!(
            code(&run(&["apply", f.to_str().unwrap(), "--store", &s])),
            0
        );
    }
    let complete = |store: Option<&str>, words: &[&str]| {
        let mut c = bin();
        if let Some(s) = store {
            c.env("LEASEHOLD_STORE", s);
        }
        let o = c
            .env("COMPLETE", "bash")
            .env("_CLAP_COMPLETE_INDEX", (words.len() - 1).to_string())
            .env("_CLAP_COMPLETE_COMP_TYPE", "9")
            .env("_CLAP_COMPLETE_SPACE", "true")
            .env("_CLAP_IFS", "\n")
            .arg("--")
            .args(words)
            .output()
            .unwrap();
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        // Names only (an empty word is offered the flags too).
        let mut got: Vec<String> = stdout(&o)
            .lines()
            .filter(|l| !l.starts_with('-'))
            .map(str::to_string)
            .collect();
        got.sort();
        (got, stderr(&o))
    };
    let (got, _) = complete(Some(&s), &["leasehold", "describe", "w"]);
    assert_eq!(got, ["web", "worker"]);
    let (got, _) = complete(Some(&s), &["leasehold", "logs", ""]);
    assert_eq!(got, ["batch", "web", "worker"]);
    let (got, _) = complete(Some(&s), &["leasehold", "pause", "b"]);
    assert_eq!(got, ["batch"]);
    let mut registered = false;
    for _ in 0..100 {
        if complete(Some(&s), &["leasehold", "node", "drain", "n"]).0 == ["n1"] {
            registered = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(registered, "n1 never offered");
    // No store, or a store that is not there: nothing, quietly.
    let (got, err) = complete(None, &["leasehold", "describe", "w"]);
    assert!(got.is_empty() && err.is_empty(), "{got:?} {err}");
    let gone = format!("{s}/nowhere");
    let (got, err) = complete(Some(&gone), &["leasehold", "describe", "w"]);
    assert!(got.is_empty() && err.is_empty(), "{got:?} {err}");
}
