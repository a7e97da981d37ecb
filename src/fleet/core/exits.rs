//! What a session's exit leads to: the restart policy and the crash-loop back-off.

use super::*;

/// A run shorter than this counts as a quick exit (a crash loop).
pub const QUICK_EXIT: Duration = Duration::from_secs(10);

/// The wait before restart number `n` of a crash loop: none for the first
/// quick exit, then `delay` doubling to `max` (as Kubernetes'
/// CrashLoopBackOff, on a shorter scale by default: 250 ms to 30 s). A run
/// that lasted QUICK_EXIT resets it.
pub fn restart_backoff(quick_exits: u32, delay: Duration, max: Duration) -> Duration {
    if quick_exits <= 1 {
        return Duration::ZERO;
    }
    let factor = 1u32 << (quick_exits - 2).min(16);
    delay.saturating_mul(factor).min(max)
}

/// What a session's exit leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterExit {
    /// Killed at the node's deadline: the lease lapsed, and the loop's
    /// lease-loss path stops everything. Nothing to do for the session.
    LeaseLapsed,
    /// Run again (its policy says so): persist the restart, then start it
    /// after `delay` (zero: at once). `quick_exits` is the new count.
    Restart { quick_exits: u32, delay: Duration },
    /// Done: the claim becomes this terminal state.
    Finish(ClaimState),
    /// Its policy would restart it, but it has had `restarts` restarts
    /// (in its window, when it has one), its `attempts`: failed, with
    /// reason "gave up after N restarts".
    GiveUp { restarts: u32 },
}

/// The restart rule applied to one exit. `ran_for` is how long the run
/// lasted; `quick_exits` the count before this exit; `restarts` the
/// restarts its `attempts` count (in its window, or over the run's life).
pub fn after_exit(
    rule: &Restart,
    code: i32,
    deadline: bool,
    ran_for: Duration,
    quick_exits: u32,
    restarts: u32,
) -> AfterExit {
    if deadline {
        return AfterExit::LeaseLapsed;
    }
    let restart = match rule.policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => code != 0,
        RestartPolicy::Never => false,
    };
    if !restart {
        return AfterExit::Finish(if code == 0 {
            ClaimState::Succeeded
        } else {
            ClaimState::Failed
        });
    }
    if rule.attempts().is_some_and(|a| restarts >= a) {
        return AfterExit::GiveUp { restarts };
    }
    let quick_exits = if ran_for < QUICK_EXIT {
        quick_exits.saturating_add(1)
    } else {
        0
    };
    AfterExit::Restart {
        quick_exits,
        delay: restart_backoff(quick_exits, rule.delay(), rule.max_delay()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ClaimState::*;

    const S: Duration = Duration::from_secs(1);

    #[rustfmt::skip]
    #[test]
    fn after_exit_follows_the_policy_and_backs_off_a_crash_loop() {
        use AfterExit as A;
        use RestartPolicy::*;
        let restart = |quick_exits, ms| A::Restart { quick_exits, delay: Duration::from_millis(ms) };
        let limited = |policy, attempts, delay_ms, max_ms| Restart {
            policy,
            attempts: Some(attempts),
            window: None,
            delay: Some(Duration::from_millis(delay_ms)),
            max_delay: Some(Duration::from_millis(max_ms)),
        };
        let (a, o, n) = (Restart::from(Always), Restart::from(OnFailure), Restart::from(Never));
        let three = limited(Always, 3, 1000, 5000);
        // (rule, code, deadline, ran for, quick exits, restarts counted, what follows)
        let rows: &[(Restart, i32, bool, Duration, u32, u32, AfterExit)] = &[
            // The deadline kill is the lease's business, whatever the policy.
            (a, 137, true, S, 0, 0, A::LeaseLapsed),
            (n, 0, true, S, 0, 0, A::LeaseLapsed),
            (n, 0, false, S, 0, 0, A::Finish(Succeeded)),
            (n, 3, false, S, 0, 0, A::Finish(Failed)),
            (o, 0, false, S, 0, 0, A::Finish(Succeeded)),
            // First quick exit restarts at once; then 250 ms, 500 ms, ... 30 s.
            (o, 1, false, S, 0, 0, restart(1, 0)),
            (a, 0, false, S, 1, 1, restart(2, 250)),
            (a, 0, false, S, 2, 2, restart(3, 500)),
            (a, 0, false, S, 40, 40, restart(41, 30_000)),
            // A run of QUICK_EXIT or more resets the loop.
            (a, 1, false, QUICK_EXIT, 9, 9, restart(0, 0)),
            // on-failure gives up after its default 6 restarts; always never
            // does unless told.
            (o, 1, false, S, 5, 5, restart(6, 4000)),
            (o, 1, false, S, 6, 6, A::GiveUp { restarts: 6 }),
            (o, 0, false, S, 6, 6, A::Finish(Succeeded)),
            (a, 1, false, S, 6, 1000, restart(7, 8000)),
            // Its own attempts and back-off.
            (three, 0, false, S, 1, 2, restart(2, 1000)),
            (three, 0, false, S, 3, 2, restart(4, 4000)),
            (three, 0, false, S, 4, 2, restart(5, 5000)),
            (three, 0, false, QUICK_EXIT, 4, 3, A::GiveUp { restarts: 3 }),
        ];
        for (i, &(rule, code, deadline, ran, q, r, want)) in rows.iter().enumerate() {
            assert_eq!(after_exit(&rule, code, deadline, ran, q, r), want, "row {i}");
        }
        let max = Duration::from_secs(30);
        assert_eq!(restart_backoff(u32::MAX, Duration::from_millis(250), max), max);
        assert_eq!(restart_backoff(u32::MAX, Duration::MAX, max), max);
    }
}
