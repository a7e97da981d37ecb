//! The loop that serves one node lease: a pass, then the wait until the
//! next one (a pause, a nudge, a claim request, a session's exit, the ring
//! watch), until shutdown, a lost lease or a store violation ends it.

use super::*;

impl Node {
    pub(super) async fn serve(
        &mut self,
        lease: Lease,
        shutdown: &CancellationToken,
    ) -> Result<Ended> {
        let took_unproven = lease.replaced().is_some_and(|r| NodeAttrs::of(r).unproven);
        self.predecessor.proven = lease.replaced().map(|r| r.holder.instance.clone());
        if lease.created() || took_unproven {
            // Our ttl, or a longer one this process has read in a node
            // record before. A fresh process knows only its own, and the
            // earlier instance's ttl went with its record: with a longer
            // ttl there, the wait falls short by the difference (a known
            // gap, docs/fleet.md "Known gaps": use one ttl per node id).
            let ttl = self.cfg.ttl.max(self.memory.longest.0);
            self.predecessor.unproven_until =
                Some(self.deps.clock.now() + ttl + default_margin(ttl));
        }
        let (valid_tx, valid_rx) = watch::channel(Validity {
            until: lease.valid_until(),
            lost: false,
        });
        let (load_tx, load_rx) = watch::channel(0u32);
        // The registration published `cfg.full_every` (`node_attrs`).
        let (pace_landed_tx, pace_landed_rx) = watch::channel(self.cfg.full_every);
        self.pace.landed = Some(pace_landed_rx);
        let stop_renew = CancellationToken::new();
        let task = renew_task(
            lease,
            self.cfg.clone(),
            self.deps.clone(),
            RenewLinks {
                valid: valid_tx,
                load: load_rx,
                confirmed: self.confirmed_tx.subscribe(),
                violation: self.audit.violation.clone(),
                stop: stop_renew.clone(),
                unproven_until: self.predecessor.unproven_until,
                pace: self.pace.tx.subscribe(),
                pace_landed: pace_landed_tx,
            },
        );
        // Aborted with this future: a node whose task dies must not leave its
        // lease renewing behind it (on whichever runtime it runs).
        let mut renew = AbortOnDrop(match &self.deps.renew_on {
            Some(rt) => rt.spawn(task),
            None => tokio::spawn(task),
        });
        self.validity = Some(valid_rx.clone());
        self.deps
            .status
            .set_valid_until(&self.deps.clock, Some(valid_rx.borrow().until));
        let mut valid_rx = valid_rx;
        // Held for this instance's lifetime; the next instance takes it over.
        let mut inbox = match &self.deps.claims {
            Some(i) => Some(i.0.clone().lock_owned().await),
            None => None,
        };
        let mut request: Option<ClaimRequest> = None;
        // This instance is published before its first pass starts any
        // session: the session channel checks a caller's run against it,
        // and a run that called at once was refused as "started by an
        // earlier instance" until the pass ended.
        self.publish_status(false);
        let ended = loop {
            let violation = self.audit.violation.lock().unwrap().clone();
            // Marks the value seen, so `changed()` below waits for the next one.
            let v = *valid_rx.borrow_and_update();
            // The renew task publishes until it is stopped below; a closed
            // channel means it is gone (its runtime shut down under it, see
            // `RenewThread`): nothing renews the lease any more, so it is
            // lost now, rather than passes running back to back until it
            // lapses (every pause ends at once on a closed channel).
            let renewer_gone = valid_rx.has_changed().is_err();
            match core::between_passes(core::Between {
                violation: violation.is_some(),
                lease_lost: v.lost || renewer_gone,
                lease_expired: self.deps.clock.now() >= v.until,
                shutdown: shutdown.is_cancelled(),
            }) {
                core::LoopVerdict::Refuse => {
                    self.stop_all("the store broke its conditional writes")
                        .await;
                    self.owned.clear();
                    break Ended::Fatal(Error::Unsupported {
                        store: self.deps.store.to_string(),
                        step: "audit".into(),
                        detail: violation.unwrap_or_default(),
                    });
                }
                core::LoopVerdict::LeaseLost => {
                    self.stop_all("node lease lost").await;
                    // Our claims died with the lease: nothing left to release.
                    self.owned.clear();
                    break Ended::LeaseLost;
                }
                core::LoopVerdict::Shutdown => break Ended::Shutdown,
                core::LoopVerdict::Pass => {}
            }
            if let Some(req) = request.take() {
                let answer = match req.asleep {
                    Some((version, claim)) => {
                        self.wake_now(&req.name, version, claim, &req.reply).await
                    }
                    None => self.claim_now(&req.name).await,
                };
                // A wiped or replaced bucket, found by the claim's marker
                // check, stops the node as a pass that found it does (the
                // next pass might not look again for MARKER_EVERY ttls).
                let wiped = match answer {
                    Err(e) if marker_gone(&e) => {
                        let told = Error::corrupt(crate::keys::MARKER, e.to_string());
                        crate::fleet::endpoint::answer(&req.reply, Err(told));
                        Some(e)
                    }
                    a => {
                        crate::fleet::endpoint::answer(&req.reply, a);
                        None
                    }
                };
                if let Some(e) = wiped {
                    tracing::error!(error = %crate::error::Chain(&e), "stopping every session");
                    self.event(EventKind::BucketWiped, None, None, e.to_string());
                    self.stop_all("the bucket was wiped or replaced").await;
                    self.owned.clear();
                    break Ended::Fatal(e);
                }
            }
            let mut ticked = true;
            let changed = match self.tick().await {
                Ok(changed) => changed,
                // A wiped or replaced bucket stops the node for good; any
                // other failed pass is retried next pass, at the brisk pace.
                Err(e) if marker_gone(&e) => {
                    tracing::error!(error = %crate::error::Chain(&e), "stopping every session");
                    self.event(EventKind::BucketWiped, None, None, e.to_string());
                    self.stop_all("the bucket was wiped or replaced").await;
                    self.owned.clear();
                    break Ended::Fatal(e);
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error::Chain(&e), cause = crate::error::cause_of(&e).unwrap_or("-"), "pull loop tick failed");
                    ticked = false;
                    true
                }
            };
            // Sessions idle past their `sleep.after_idle`, or that asked.
            let changed = self.sleep_due().await || changed;
            let _ = load_tx.send(self.load());
            self.publish_status(self.deps.clock.now() < valid_rx.borrow().until);
            self.deps.status.pass_completed(
                self.deps.clock.now(),
                core::pass_bound(self.cfg.poll, self.cfg.max_poll, self.cfg.ttl),
            );
            self.idle_ticks = core::idle_after(self.idle_ticks, changed);
            // An alarm due ends the pause (at most the paced one); not after
            // a failed pass, which may not have reached the alarms (the
            // brisk pace retries it).
            let alarm = if ticked {
                match (
                    self.alarm_wait(),
                    self.ticks.wait(self.deps.clock.wall_ms()),
                ) {
                    (Some(a), Some(t)) => Some(a.min(t)),
                    (a, t) => a.or(t),
                }
            } else {
                None
            };
            let pause = core::pace(self.cfg.poll, self.cfg.max_poll, self.idle_ticks)
                .min(alarm.map_or(Duration::MAX, |w| w.max(NUDGE_MIN_GAP)));
            // Wait for the next tick; wake early only for shutdown or a lost
            // lease (a renewal is not a reason to list again).
            let sleep = self.deps.clock.sleep(pause);
            tokio::pin!(sleep);
            let status = self.deps.status.clone();
            let nudge = &status.nudge;
            let runner = self.deps.runner.clone();
            let mut shortened = false;
            // Between passes, the ring successors' records are read on the
            // watch's schedule (`core::watch_wait`: the first as each of its
            // renewals lands, the second every ttl/2, each once more at its
            // deadline), and the bell every ttl/6: a dead peer is noticed
            // about ttl + margin after its last renewal, and its sessions'
            // takers hear of it within about ttl/6 more, not at the end of
            // an idle pause.
            let period = core::watch_period(self.cfg.ttl, 0);
            let watching = core::watch_during(pause, self.cfg.ttl);
            // Too brisk to watch: the next pass lists `nodes/` instead.
            if !watching {
                self.next.list_nodes(Why::TooBriskToWatch);
            }
            let watch = self.deps.clock.sleep(self.watch_wait());
            tokio::pin!(watch);
            // The next crash-loop back-off to end (see `next_restart`).
            let mut restart_due = self.next_restart.is_some();
            let restart = self.deps.clock.sleep(
                self.next_restart
                    .map_or(pause, |t| t.saturating_since(self.deps.clock.now())),
            );
            tokio::pin!(restart);
            // Health check results (`checks.rs`), held while we wait.
            let mut probed = self.checks.rx.take();
            let channel = self.deps.channel.clone();
            loop {
                // `biased`: branches are tried in this order, not tokio's
                // per-process random one, so a seeded simulation replays the
                // same history in any process. Losses and shutdown first.
                tokio::select! {
                    biased;
                    r = valid_rx.changed() => {
                        if r.is_err() || valid_rx.borrow().lost {
                            break;
                        }
                    }
                    _ = shutdown.cancelled() => break,
                    Some(req) = recv(&mut inbox) => {
                        request = Some(req);
                        break;
                    }
                    // A nudge brings the next pass forward, at most to
                    // NUDGE_MIN_GAP after this one: a flood of nudges costs
                    // no more than a pass every NUDGE_MIN_GAP.
                    _ = nudge.notified(), if !shortened => {
                        shortened = true;
                        if let Some(gap) = core::nudged_pause(pause, NUDGE_MIN_GAP) {
                            sleep.set(self.deps.clock.sleep(gap));
                        }
                        self.idle_ticks = 0;
                    }
                    _ = &mut sleep => break,
                    // A back-off ended: the pass starts the session
                    // (`reconcile_owned`). The next one to end is found
                    // among those still waiting.
                    _ = &mut restart, if restart_due => {
                        let now = self.deps.clock.now();
                        self.next_restart = self
                            .owned
                            .values()
                            .filter_map(|o| o.restart_at)
                            .filter(|t| *t > now)
                            .min();
                        self.idle_ticks = 0;
                        break;
                    }
                    // A session ended: its end is recorded now (one fenced
                    // write of its claim; a restart starts at once or is
                    // scheduled), not at the next pass, which may be
                    // seconds away on an idle node.
                    _ = runner.exited() => {
                        if self.handle_exits().await {
                            self.idle_ticks = 0;
                            let _ = load_tx.send(self.load());
                            self.publish_status(self.deps.clock.now() < valid_rx.borrow().until);
                            // A back-off it scheduled ends this wait too.
                            if let Some(t) = self.next_restart {
                                restart.set(self.deps.clock.sleep(
                                    t.saturating_since(self.deps.clock.now()),
                                ));
                                restart_due = true;
                            }
                        }
                    }
                    // A session asked to sleep on the channel: at once.
                    _ = async { channel.as_ref()?.sleep_requested().await; Some(()) }, if channel.is_some() => {
                        if self.sleep_due().await {
                            let _ = load_tx.send(self.load());
                            self.publish_status(self.deps.clock.now() < valid_rx.borrow().until);
                        }
                    }
                    Some(p) = async { probed.as_mut()?.recv().await }, if probed.is_some() => {
                        self.on_check(p).await;
                        self.publish_status(self.deps.clock.now() < valid_rx.borrow().until);
                        // An unhealthy run's back-off ends this wait too.
                        if let Some(t) = self.next_restart {
                            restart.set(self.deps.clock.sleep(
                                t.saturating_since(self.deps.clock.now()),
                            ));
                            restart_due = true;
                        }
                    }
                    _ = &mut watch, if watching => {
                        // The reads race what the pause waits for: a lost
                        // lease or a shutdown is not held up by a slow store,
                        // and a round never outlasts its period.
                        let clock = self.deps.clock.clone();
                        // (A renewal of our own lease interrupts a round
                        // too: its reads are simply done again at once.)
                        let (w, cut_off) = tokio::select! {
                            biased;
                            r = valid_rx.changed() => {
                                if r.is_err() || valid_rx.borrow().lost {
                                    break;
                                }
                                (None, false)
                            }
                            _ = shutdown.cancelled() => break,
                            _ = clock.sleep(period) => (None, true),
                            w = self.watch_peers() => (Some(w), false),
                        };
                        if let Some(w) = w {
                            self.ring.missing.extend(w.missing);
                            for (key, read_at, expected) in w.read {
                                let prior = self.ring.read.get(&key).and_then(|p| p.expect_at);
                                let expect_at = expected.unwrap_or(prior);
                                self.ring.read.insert(key, WatchedPeer { read_at, expect_at });
                            }
                            if w.bell.is_some() {
                                self.ring.bell = w.bell;
                            }
                            // A ring may be a new alarm: list the index
                            // (at most once a poll interval; `keep_alarms`).
                            self.alarms.ring |= w.rang;
                            let nodes = &self.peers.nodes;
                            self.ring.read.retain(|k, _| nodes.contains_key(k));
                            if w.pass {
                                // A watched peer stood still, or the bell
                                // rang (a fence, a release, an apply): the
                                // pass judges on a fresh `nodes/` listing.
                                self.next.list_nodes(Why::WatchOrBell);
                                self.idle_ticks = 0;
                                break;
                            }
                        }
                        // At least a tenth of the closest period between
                        // rounds: a round that failed, or a store that
                        // answers at once, never spins; a round cut off by
                        // a store slower than the period waits a period.
                        let next = if cut_off {
                            period
                        } else {
                            self.watch_wait().max(period / 10)
                        };
                        watch.set(self.deps.clock.sleep(next));
                    }
                }
            }
            self.checks.rx = probed;
        };
        self.publish_status(false);
        self.deps.status.set_valid_until(&self.deps.clock, None);
        stop_renew.cancel();
        let lease = (&mut renew.0)
            .await
            .map_err(|e| Error::Internal(format!("renew task: {e}")))?;
        if let Ended::Shutdown = ended {
            let ended = self.stop_all("shutting down").await;
            self.finish_exits(ended).await;
            let held = !self.owned.is_empty();
            self.release_claims(true).await;
            let mut released = false;
            if let Some(l) = lease {
                let epoch = l.epoch();
                match l.release().await {
                    Ok(()) => {
                        released = true;
                        self.event(EventKind::Released, None, Some(epoch), "node lease")
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error::Chain(&e), "releasing the node lease")
                    }
                }
            }
            // Peers hear of the end now: the released record is hinted (a
            // light pass reads a peer's record only on a hint, and lists
            // `nodes/` only at the slow pace, so placement would rank this
            // node for up to two of those), and the bell sends every node
            // to look, the released sessions' ranked takers among them
            // (their claims were hinted as written).
            if released && self.cfg.feed_on() {
                crate::fleet::feed::write_hint_retried(
                    &self.deps.store,
                    &self.deps.hint_forms,
                    self.deps.clock.as_ref(),
                    self.deps.clock.wall_ms(),
                    self.deps.entropy.as_ref(),
                    crate::keys::Hinted::Node,
                    self.me.node.as_str(),
                )
                .await;
            }
            if held || released {
                crate::fleet::feed::ring_bell(&self.deps.store, self.deps.entropy.as_ref()).await;
            }
        }
        Ok(ended)
    }
}
