//! Helpers shared by the integration tests.

/// The URL of a real server started by `scripts/test` (moto for
/// `LEASEHOLD_TEST_S3`, Azurite for `LEASEHOLD_TEST_AZURE`), or None to skip.
/// Under `scripts/test` (LEASEHOLD_REQUIRE_SERVERS set) a missing server
/// fails the test instead of skipping it, so CI cannot pass by skipping.
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
