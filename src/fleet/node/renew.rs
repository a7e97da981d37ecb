//! The renew task: renews the node lease every ttl/3 on its own task (or
//! runtime), publishes the validity deadline to the loop and the runner, and
//! declares the lease lost on a rejection or once validity passes.

use super::*;

/// What the renew task shares with the pull loop.
pub(super) struct RenewLinks {
    /// Out: the lease's validity after each renewal.
    pub(super) valid: watch::Sender<Validity>,
    /// In: the node's load, published in its attributes.
    pub(super) load: watch::Receiver<u32>,
    /// In: the pull loop's confirmation of its claims (`confirmed_until`).
    pub(super) confirmed: watch::Receiver<MonoTime>,
    /// Out: a store violation the audit of a renewal found.
    pub(super) violation: Arc<std::sync::Mutex<Option<String>>>,
    pub(super) stop: CancellationToken,
    /// Until then, the node record says `unproven` (see `NodeAttrs`).
    pub(super) unproven_until: Option<MonoTime>,
    /// In: the anti-entropy interval to publish (`Node::note_fleet_size`).
    pub(super) pace: watch::Receiver<Duration>,
    /// Out: the interval the last renewal that landed with attributes
    /// carried; the node lists no less often than that
    /// (`Node::take_published_pace`).
    pub(super) pace_landed: watch::Sender<Duration>,
}

/// Renews the node lease every ttl/3 (publishing the node's load in its
/// attributes), announces each new deadline to the runner, and publishes the
/// validity. Returns the lease when stopped, for release.
pub(super) async fn renew_task(
    mut lease: Lease,
    cfg: NodeConfig,
    deps: NodeDeps,
    links: RenewLinks,
) -> Option<Lease> {
    let RenewLinks {
        valid,
        load,
        confirmed,
        violation,
        stop,
        unproven_until,
        pace,
        pace_landed,
    } = links;
    let period = core::renew_period(cfg.ttl);
    let mut renewals: u64 = 0;
    // The attributes peers need fresh (cordoned, unproven, the interval) as
    // last written; a change is hinted in the feed (`NodeConfig::peer_refresh`).
    let mut published: Option<(bool, bool, Duration)> = None;
    loop {
        let due = deps.clock.now() + period;
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Some(lease),
            _ = deps.clock.sleep(period) => {}
        }
        let unproven = unproven_until.is_some_and(|t| deps.clock.now() < t);
        let news = (deps.status.cordoned(), unproven, *pace.borrow());
        let attrs = node_attrs(&cfg, news.2, *load.borrow(), news.0, news.1);
        // A shorter interval counts from its sending: the record may show
        // either until the outcome is known (the node shortened its belief
        // already; only a growth waits for `pace_landed`).
        pace_landed.send_if_modified(|v| {
            let lower = news.2 < *v;
            if lower {
                *v = news.2;
            }
            lower
        });
        let t0 = deps.clock.now();
        deps.status.record_renew_late(t0.saturating_since(due));
        let mut with_attrs = true;
        let mut r = lease.set_attrs(attrs).await;
        let step = loop {
            let outcome = match &r {
                Ok(()) => core::RenewOutcome::Committed,
                Err(e) if e.is_transient() => core::RenewOutcome::Transient,
                Err(_) => core::RenewOutcome::Lost,
            };
            match &r {
                Ok(()) => deps
                    .status
                    .record_renew(deps.clock.now().saturating_since(t0)),
                Err(_) => deps.status.record_renew_failure(),
            }
            let step = core::after_renew(
                outcome,
                with_attrs,
                renewals.saturating_add(1),
                AUDIT_SAMPLE,
            );
            if step != core::AfterRenew::RenewPlainly {
                break step;
            }
            with_attrs = false;
            r = lease.renew().await;
        };
        match (step, r) {
            (core::AfterRenew::Renewed { audit: due }, Ok(())) => {
                renewals += 1;
                // What our record now carries (with attributes or not: a
                // plain renewal keeps the record's): the node may list this
                // seldom (a peer reading the record sees it).
                let carried = Duration::from_millis(NodeAttrs::of(lease.record()).max_poll_ms);
                pace_landed.send_if_modified(|v| {
                    let changed = *v != carried;
                    *v = carried;
                    changed
                });
                if with_attrs && published != Some(news) {
                    published = Some(news);
                    if cfg.feed_on() {
                        // Beside the renewals, never before the deadline is
                        // announced: a slow PUT must not hold up the lease.
                        let (store, entropy) = (deps.store.clone(), deps.entropy.clone());
                        let (wall, id) = (deps.clock.wall_ms(), cfg.id.to_string());
                        let forms = deps.hint_forms.clone();
                        tokio::spawn(async move {
                            let form = forms.decide(&store, wall).await;
                            crate::fleet::feed::write_hint(
                                &store,
                                form,
                                wall,
                                entropy.as_ref(),
                                crate::keys::Hinted::Node,
                                &id,
                            )
                            .await;
                        });
                    }
                }
                if due {
                    let r = audit(
                        &deps.store,
                        lease.key(),
                        &lease.record().nonce,
                        lease.epoch(),
                    )
                    .await;
                    if let Err(e) = r
                        && e.kind() == crate::ErrorKind::Unsupported
                    {
                        deps.journal.record(
                            deps.clock.wall_ms(),
                            EventKind::StoreViolation,
                            None,
                            Some(lease.epoch()),
                            e.to_string(),
                        );
                        *violation.lock().unwrap() = Some(match e {
                            Error::Unsupported { detail, .. } => detail,
                            other => other.to_string(),
                        });
                        let _ = valid.send(Validity {
                            until: lease.valid_until(),
                            lost: true,
                        });
                        return None;
                    }
                }
                // Never past the pull loop's confirmation of our claims.
                let c = *confirmed.borrow();
                let until = core::session_deadline(
                    Some(lease.valid_until()),
                    (c != MonoTime::ZERO).then_some(c),
                )
                .unwrap_or(MonoTime::ZERO);
                deps.runner.announce(until);
                deps.status
                    .set_valid_until(&deps.clock, Some(lease.valid_until()));
                let _ = valid.send(Validity {
                    until: lease.valid_until(),
                    lost: false,
                });
            }
            (_, r) => {
                let why = match r {
                    Err(e) => e.to_string(),
                    Ok(()) => "renewal".to_string(),
                };
                deps.status.set_valid_until(&deps.clock, None);
                deps.journal.record(
                    deps.clock.wall_ms(),
                    EventKind::LeaseLost,
                    None,
                    Some(lease.epoch()),
                    why,
                );
                let _ = valid.send(Validity {
                    until: lease.valid_until(),
                    lost: true,
                });
                return None;
            }
        }
    }
}
