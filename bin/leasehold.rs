//! The `leasehold` binary: everything lives in `leasehold::cli`.
fn main() -> std::process::ExitCode {
    leasehold::cli::main()
}
