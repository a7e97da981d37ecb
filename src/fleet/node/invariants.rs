//! What must hold of a node's state after every pass, checked in debug
//! builds (the tests and the simulations) after each one, as celld's logic
//! validates its state after every event. A failure is a bug in the shell:
//! the rules in `core` cannot see these fields.

use super::*;

impl Node {
    /// Panics (debug builds only) if the state after a pass breaks one of
    /// the invariants below.
    #[cfg(debug_assertions)]
    pub(super) fn check_invariants(&self) {
        // Every session we run is under a claim in this very instance's
        // name, at an epoch a fencing token can be (1..=MAX_EPOCH).
        for (name, o) in self.owned.iter() {
            assert!(
                o.record.owner.node == self.me.node && o.record.owner.instance == self.me.instance,
                "owned session {name} is claimed by {:?}, not by this instance",
                o.record.owner
            );
            assert!(
                (1..=crate::record::MAX_EPOCH).contains(&o.record.epoch),
                "owned session {name} at epoch {}",
                o.record.epoch
            );
        }
        // The deadline every session runs under is measured from a lower
        // bound of the earliest confirmation: never above any of them
        // (a bound too high would stretch a claim's belief past its
        // confirmation, `confirmed_until`).
        if let Some(earliest) = self.owned.values().map(|o| o.confirmed).min() {
            assert!(
                self.confirmed_floor.is_some_and(|f| f <= earliest),
                "confirmed_floor {:?} above the earliest confirmation {earliest:?}",
                self.confirmed_floor
            );
        }
        // Each group of fields checks what it owns.
        self.pace.check();
        // No more unfinished sessions than the node's capacity.
        assert!(
            self.load() <= self.cfg.capacity,
            "{} sessions on a node of capacity {}",
            self.load(),
            self.cfg.capacity
        );
        // The marker was last checked at a pass that has happened.
        assert!(
            self.bucket
                .checked
                .is_none_or(|(pass, _)| pass <= self.pass)
        );
    }
}
