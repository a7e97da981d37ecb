//! The node's rules, as pure functions of what the node has observed.
//!
//! No async, no `Store`, no clock reads, no randomness: every input is a
//! value the shell (`node/`) gathered (a listing, a read, a runner exit,
//! the time it read once), and every output is a decision the shell carries
//! out. That is what lets each rule be a table test here, and what keeps the
//! shell's job to I/O and bookkeeping. The module imports nothing from the
//! runtime; `tests::the_core_reads_no_clock_and_does_no_io` checks its
//! source for the ambient ones.
//!
//! What it decides (issue #13; docs/fleet.md has the table): registration,
//! renewal and the sessions' deadline, the loop between passes (a store
//! violation, a lost or lapsed lease, shutdown; never re-registering into a
//! wiped bucket), each pass's schedules and pacing, what a session's exit
//! leads to, what an owned session's claim and manifest require, whether a
//! claimable session may be claimed this pass (the pull loop and the claim
//! endpoint alike), the absence rules of a vanished claim (the hold, the
//! wait, markers) and each step of the fence before a takeover. The order of
//! the I/O stays in the shell: one async method per step, not one
//! `step(state, input) -> actions` machine (docs/fleet.md says why).

use super::claim::ClaimState;
use super::manifest::{Restart, RestartPolicy};
use super::plan::{ClaimView, Claimable, ManifestView, NodeView};
use crate::lease::default_margin;
use crate::liveness::Liveness;
use std::time::Duration;

mod absence;
mod between;
mod exits;
mod fence;
mod gate;
mod lease_life;
mod owned;
mod pace;
mod watch;

pub use absence::*;
pub use between::*;
pub use exits::*;
pub use fence::*;
pub use gate::*;
pub use lease_life::*;
pub use owned::*;
pub use pace::*;
pub use watch::*;

#[cfg(test)]
mod tests {
    /// The core stays pure: no runtime, store, clock or randomness in its
    /// source (outside this test module).
    #[test]
    fn the_core_reads_no_clock_and_does_no_io() {
        // Every file of the directory (a new file must be added here: the
        // count below fails until it is).
        let files = [
            include_str!("mod.rs"),
            include_str!("absence.rs"),
            include_str!("between.rs"),
            include_str!("exits.rs"),
            include_str!("fence.rs"),
            include_str!("gate.rs"),
            include_str!("lease_life.rs"),
            include_str!("owned.rs"),
            include_str!("pace.rs"),
            include_str!("watch.rs"),
        ];
        let on_disk = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/src/fleet/core"))
            .unwrap()
            .count();
        assert_eq!(files.len(), on_disk, "a file of core/ is not checked");
        for src in files {
            let body = src.find("#[cfg(test)]").map_or(src, |at| &src[..at]);
            for banned in [
                "async",
                "tokio",
                "Store",
                "Clock",
                "Instant",
                "SystemTime",
                "rand",
                "std::fs",
                "std::net",
                "Entropy",
                "MonoTime",
            ] {
                let uses = body
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .any(|l| l.contains(banned));
                assert!(!uses, "the core mentions {banned}");
            }
        }
    }
}
