//! `leasehold doctor`: the probe, the clock offset and where credentials come from.

use super::*;

/// Estimates the store's clock offset from ours: write a scratch object,
/// note our wall clock before sending and after the answer, and read the
/// store's last-modified time from a listing. The store stamped the write in
/// between, so offset = stamp − midpoint, within ± half the round trip plus
/// the store's timestamp resolution. Advisory: leasehold never uses it.
pub(super) async fn clock_offset(store: &Arc<dyn Store>) -> Result<Option<(i64, u64)>, Error> {
    use futures::StreamExt;
    let clock = SystemClock::new();
    let dir = format!(
        "_probe/{}",
        leasehold::clock::Entropy::hex_id(&OsEntropy::new())
    );
    let key = format!("{dir}/clock");
    let w0 = clock.wall_ms();
    store
        .put(
            &key,
            bytes::Bytes::from_static(b"{}"),
            leasehold::store::Cond::Create,
        )
        .await
        .map_err(|e| Error::from_store("put", &key, e))?;
    let w1 = clock.wall_ms();
    let mut list = store.list(&format!("{dir}/"));
    let mut stamp = None;
    while let Some(e) = list.next().await {
        if let Ok(e) = e
            && e.key == key
        {
            stamp = e.last_modified_ms;
        }
    }
    let _ = store.delete(&key).await;
    Ok(stamp.map(|s| {
        let mid = (w0 + w1) / 2;
        // Object stores stamp to the second; allow that on top of the RTT.
        (s as i64 - mid as i64, (w1 - w0) / 2 + 1000)
    }))
}

pub(super) async fn doctor(args: &StoreArgs, json: bool) -> Result<(), Failure> {
    let store = open(args).await?;
    // Named before the probe: when the probe fails for want of credentials,
    // where they were looked for is the first thing an operator needs.
    let credentials = leasehold::store::open::credentials_source(args.url()?).await;
    let clock = leasehold::clock::SystemClock::new();
    let started = clock.now();
    let (report, result) = leasehold::probe::probe_report(&store, &OsEntropy::new(), &clock).await;
    let total_ms = clock.now().saturating_since(started).as_millis() as u64;
    if result.is_ok() {
        // A passing probe clears an audit's refusal on this host.
        let marker = leasehold::fleet::refusal_marker(
            &leasehold::hostlock::default_lock_dir(),
            &store.identity(),
        );
        if std::fs::remove_file(&marker).is_ok() {
            eprintln!(
                "cleared the audit's refusal of this store ({})",
                marker.display()
            );
        }
    }
    // The rest is shown on failure as on success: it is what an operator
    // needs to find out why.
    let offset = clock_offset(&store).await.ok().flatten();
    let config = config_path();
    let config_found = config.as_ref().is_some_and(|p| p.exists());
    let lock_dir = leasehold::hostlock::default_lock_dir();
    let endpoint = args
        .endpoint
        .clone()
        .or_else(|| std::env::var("AWS_ENDPOINT_URL_S3").ok())
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .map(|e| leasehold::store::objstore::redact(&e));
    let dialect = report.etag_dialect.map(|d| d.as_str());
    // A local directory's lock files: an older build's scheme keeps one
    // for every key ever written (docs/stores.md, "Its lock files").
    let lock_files = args
        .url()?
        .split_once("://")
        .filter(|(scheme, p)| scheme.eq_ignore_ascii_case("file") && p.starts_with('/'))
        .and_then(|(_, p)| leasehold::store::local::lock_files(std::path::Path::new(p)).ok());
    if json {
        let mut v = serde_json::json!({
            "store": report.store, "ok": result.is_ok(), "steps": report.steps,
            "probe_ms": total_ms, "etag_dialect": dialect,
            "clock_offset_ms": offset.map(|o| o.0), "clock_offset_uncertainty_ms": offset.map(|o| o.1),
            "config_file": config.as_ref().map(|p| p.display().to_string()), "config_file_found": config_found,
            "lock_dir": lock_dir.display().to_string(),
            "endpoint": endpoint,
            "credentials": credentials,
        });
        if let Some(l) = &lock_files {
            v["lock_files"] = serde_json::json!({
                "dir": l.dir.display().to_string(),
                "removed_with_keys": l.removed_with_keys,
                "count": l.count,
            });
        }
        if let Err(e) = &result {
            v["error"] = leasehold::store::objstore::redact(&error_text(e)).into();
        }
        print_json(&v);
    } else {
        println!("store {}", report.store);
        for s in &report.steps {
            println!(
                "  {:<22} {:<4} {:>6} ms  {}",
                s.name,
                if s.ok { "ok" } else { "FAIL" },
                s.ms,
                s.detail
            );
        }
        match &result {
            Ok(()) => {
                println!("verdict: conditional writes honoured; safe for leasehold ({total_ms} ms)")
            }
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                println!("verdict: REFUSED; nothing leasehold promises holds on this store")
            }
            Err(_) => println!("verdict: the probe could not complete (see the error below)"),
        }
        if let Some(d) = dialect {
            println!("etag dialect {d} (If-Match)");
        }
        match offset {
            Some((o, u)) => println!(
                "clock offset to the store: {:+.1} s (± {:.1} s); advisory, leasehold never relies on it",
                o as f64 / 1000.0,
                u as f64 / 1000.0
            ),
            None => {
                println!("clock offset to the store: unknown (no timestamps, or unreachable)")
            }
        }
        if let Some(e) = &endpoint {
            println!("endpoint {e}");
        }
        println!("credentials {credentials}");
        println!(
            "config file {} ({})",
            config
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "-".into()),
            if config_found { "found" } else { "absent" }
        );
        println!("host locks in {}", lock_dir.display());
        if let Some(l) = &lock_files {
            if l.removed_with_keys {
                println!(
                    "store lock files: {} in {} (removed with their keys)",
                    l.count,
                    l.dir.display()
                );
            } else {
                println!(
                    "store lock files: {} in {}, an older build's scheme: one is kept for every key ever written; to end it, stop every process using the directory and remove that directory",
                    l.count,
                    l.dir.display()
                );
            }
        }
    }
    result.map_err(Failure::Error)
}

/// An error with its `Caused by` chain on one line, for JSON output.
pub(super) fn error_text(e: &Error) -> String {
    leasehold::error::Chain(e).to_string()
}
