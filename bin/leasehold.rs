//! The `leasehold` binary. The CLI lives here, not in the library: the
//! library's public surface is the protocol (leases, the fleet, stores, the
//! wake path), and the CLI is one user of it.
mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
