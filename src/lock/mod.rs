//! Lock operations over the masters: the Redlock acquire with its per-key single flight
//! ([`Acquirer`]), release, extend, the rollback of refused attempts, the guard after writes
//! ([`guard`]), and the scripts they run on the masters. Every spelling of an operation (a
//! command, a client library's script) calls down into the one operation here; this module
//! knows nothing of connections or the command table.
//!
//! [`Acquirer`]'s whole API is one `impl` ([`acquirer`]); each method calls the free functions
//! of its concern: [`flights`] (the per-key single flight), [`acquire`] (one attempt's Redlock
//! rounds and its tokens), [`extend`], and [`rollback`] (the clean-up of a refused attempt, a
//! `SET NX` acquire's or a hash-lock acquire's that a client's script ran).
//! [`stats`] counts them.

mod acquire;
mod acquirer;
mod extend;
mod flights;
pub mod guard;
mod rollback;
mod stats;

pub use acquire::{lock_script, Attempt, UNARMED};
pub use acquirer::{Acquirer, Options};
pub use flights::Started;
pub use rollback::HashGrant;
pub use stats::{AcquireResult, LockStats};

#[cfg(test)]
mod tests {
    //! Deterministic: scripted in-process masters and tokio's paused clock.
    use super::*;
    use crate::fake_master::{self, until, FakeMaster};
    use crate::lease::Outcome;
    use crate::masters::Masters;
    use crate::protocol::Reply;
    use crate::redlock::Policy;
    use bytes::Bytes;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;

    const NODE_TIMEOUT: Duration = Duration::from_millis(500);
    const LIMIT: Duration = Duration::from_secs(10);
    const POLICY: Policy = Policy {
        drift_factor: 0.01,
        max_lock_ttl_ms: 60_000,
    };

    /// An acquirer over `n` fake masters, once every master may vote.
    async fn ready(n: usize) -> (Vec<Arc<FakeMaster>>, Arc<Masters>, Arc<Acquirer>) {
        let fakes: Vec<_> = (0..n).map(|_| FakeMaster::new()).collect();
        let masters = fake_master::masters(&fakes, NODE_TIMEOUT);
        until(LIMIT, || masters.voters().iter().all(|v| v.usable())).await;
        let acquirer = Acquirer::new(masters.clone(), POLICY, Options::default(), Arc::default());
        (fakes, masters, acquirer)
    }

    fn attempt(value: &str) -> Attempt {
        Attempt {
            key: Bytes::from_static(b"k"),
            value: Bytes::copy_from_slice(value.as_bytes()),
            ttl_ms: 10_000,
            received_at: Instant::now(),
            with_token: false,
        }
    }

    /// A `LOCK.ACQUIRE`: its token if granted.
    async fn token(acquirer: &Arc<Acquirer>, value: &str) -> Option<i64> {
        let attempt = Attempt {
            with_token: true,
            ..attempt(value)
        };
        match run(acquirer.acquire(attempt)).await {
            Reply::Array(items) => match items.as_slice() {
                [Reply::Integer(token), Reply::Integer(validity)] => {
                    assert!(*validity > 9_000 && *validity <= 10_000, "{validity}");
                    Some(*token)
                }
                other => panic!("{other:?}"),
            },
            Reply::Null => None,
            other => panic!("{other:?}"),
        }
    }

    /// Ends the hold of `value` on every master (the release a holder sends).
    fn release(fakes: &[Arc<FakeMaster>]) {
        for fake in fakes {
            fake.wipe_key("k");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_of_successive_grants_increase_whichever_proxy_grants() {
        let (fakes, masters, first) = ready(3).await;
        let second = Acquirer::new(masters.clone(), POLICY, Options::default(), Arc::default());
        let mut tokens = Vec::new();
        for round in 0..6 {
            let acquirer = if round % 2 == 0 { &first } else { &second };
            tokens.push(
                token(acquirer, &format!("v{round}"))
                    .await
                    .expect("granted"),
            );
            assert_eq!(token(acquirer, "other").await, None, "held");
            release(&fakes);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_token_is_proposed_again_above_what_the_masters_saw() {
        let (fakes, _masters, acquirer) = ready(3).await;
        let first = token(&acquirer, "a").await.expect("granted");
        release(&fakes);
        // Another proxy granted the key a moment ago with a higher token (its reading of the
        // masters' clocks was later): every master refuses this proxy's next proposal once.
        let higher = first + 5_000_000;
        for fake in &fakes {
            fake.set("redlock-proxy:token:k", &higher.to_string());
        }
        let retried = token(&acquirer, "b").await.expect("granted on the retry");
        assert!(retried > higher, "{retried} <= {higher}");
        assert!(fakes.iter().all(|f| f.acquires() == 3));
    }

    /// The reply the client would be written now.
    async fn reply(outcome: Outcome) -> Reply {
        match outcome {
            Outcome::Reply(reply) => reply,
            Outcome::Lease(lease) => lease.settle().await,
        }
    }

    async fn run(started: Started) -> Reply {
        match started {
            Started::Leading(acquire) | Started::Queued(acquire) => reply(acquire.await).await,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_acquires_of_one_key_cost_two_fan_outs_and_one_grant() {
        let (fakes, _masters, acquirer) = ready(3).await;
        let started: Vec<Started> = (0..10)
            .map(|i| acquirer.acquire(attempt(&format!("v{i}"))))
            .collect();
        assert!(matches!(started[0], Started::Leading(_)));
        assert!(started[1..].iter().all(|s| matches!(s, Started::Queued(_))));
        let replies = futures::future::join_all(started.into_iter().map(run)).await;
        assert_eq!(replies[0], Reply::ok());
        assert!(
            replies[1..].iter().all(|r| *r == Reply::Null),
            "{replies:?}"
        );
        for fake in &fakes {
            // The leader's acquire, then one batch for the nine queued behind it.
            assert_eq!(fake.acquires(), 2);
            assert_eq!(fake.get("k").as_deref(), Some(&b"v0"[..]));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acquires_of_many_keys_leave_as_one_script_call_per_master_each_with_its_answer() {
        let (fakes, _masters, acquirer) = ready(3).await;
        fakes[0].set("k3", "someone else");
        let keyed = |i: usize| Attempt {
            key: Bytes::from(format!("k{i}")),
            ..attempt(&format!("v{i}"))
        };
        let started: Vec<Started> = (0..8).map(|i| acquirer.acquire(keyed(i))).collect();
        let replies = futures::future::join_all(started.into_iter().map(run)).await;
        // k3 is held on one master of three: still granted.
        assert!(replies.iter().all(|r| *r == Reply::ok()), "{replies:?}");
        for fake in &fakes {
            assert_eq!(fake.acquires(), 1, "{:?}", fake.log());
        }
        // A master that lost the script answers NOSCRIPT to the whole call: every acquire in
        // it is asked again with the body, merged again, and answered.
        for fake in &fakes {
            fake.forget_scripts();
        }
        let started: Vec<Started> = (8..16).map(|i| acquirer.acquire(keyed(i))).collect();
        let replies = futures::future::join_all(started.into_iter().map(run)).await;
        assert!(replies.iter().all(|r| *r == Reply::ok()), "{replies:?}");
        for fake in &fakes {
            assert_eq!(fake.acquires(), 3, "{:?}", fake.log());
            assert_eq!(fake.get("k15").as_deref(), Some(&b"v15"[..]));
        }
        assert_eq!(fakes[0].get("k3").as_deref(), Some(&b"someone else"[..]));
    }

    #[tokio::test(start_paused = true)]
    async fn releases_merge_into_one_call_per_master_and_delete_only_their_own_value() {
        let (fakes, _masters, acquirer) = ready(3).await;
        let keyed = |i: usize| Attempt {
            key: Bytes::from(format!("k{i}")),
            ..attempt(&format!("v{i}"))
        };
        let started: Vec<Started> = (0..4).map(|i| acquirer.acquire(keyed(i))).collect();
        futures::future::join_all(started.into_iter().map(run)).await;
        let calls = |fake: &FakeMaster| {
            let log = fake.log();
            log.iter().filter(|(_, c)| c.starts_with("EVALSHA")).count()
        };
        let before: Vec<usize> = fakes.iter().map(|f| calls(f)).collect();
        let releases = (0..4).map(|i| {
            // k3 is released with a value it does not hold.
            let value = if i == 3 {
                "not v3".into()
            } else {
                format!("v{i}")
            };
            let key = format!("k{i}");
            let acquirer = acquirer.clone();
            async move { acquirer.release(key.as_bytes(), value.as_bytes()).await }
        });
        let replies = futures::future::join_all(releases).await;
        let expected = [1, 1, 1, 0].map(Reply::Integer);
        assert_eq!(replies, expected);
        for (fake, before) in fakes.iter().zip(before) {
            assert_eq!(calls(fake) - before, 1, "{:?}", fake.log());
            assert_eq!(fake.get("k0"), None);
            assert_eq!(fake.get("k3").as_deref(), Some(&b"v3"[..]));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_reaches_a_master_that_lost_the_script_after_the_quorum_answered() {
        let (fakes, _masters, acquirer) = ready(3).await;
        assert_eq!(run(acquirer.acquire(attempt("v"))).await, Reply::ok());
        // The third master lost its scripts and answers late: the release's quorum is reached
        // without it, and its NOSCRIPT reaches nobody waiting.
        fakes[2].forget_scripts();
        fakes[2].stall();
        assert_eq!(acquirer.release(b"k", b"v").await, Reply::Integer(1));
        fakes[2].resume();
        until(LIMIT, || fakes[2].get("k").is_none()).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_acquire_reaches_the_masters_only_from_its_own_clients_future() {
        let (fakes, _masters, acquirer) = ready(3).await;
        let leader = acquirer.acquire(attempt("a"));
        let queued = acquirer.acquire(attempt("b"));
        assert_eq!(run(leader).await, Reply::ok());
        // Its connection has not polled it (earlier requests of that client may not have been
        // sent yet): nothing of it may reach the masters.
        tokio::time::sleep(NODE_TIMEOUT * 4).await;
        assert!(fakes.iter().all(|f| f.acquires() == 1));
        assert_eq!(run(queued).await, Reply::Null);
        assert!(fakes.iter().all(|f| f.acquires() == 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_never_waits_on_a_client_that_left_the_queue() {
        let (fakes, _masters, acquirer) = ready(3).await;
        let leader = acquirer.acquire(attempt("a"));
        let gone = acquirer.acquire(attempt("b"));
        let next = acquirer.acquire(attempt("c"));
        drop(gone);
        assert_eq!(run(leader).await, Reply::ok());
        // The first queued client is gone: the next one leads the batch.
        assert_eq!(run(next).await, Reply::Null);
        assert!(fakes.iter().all(|f| f.acquires() == 2));
        // And the key is idle again: a new acquire leads at once.
        assert!(matches!(
            acquirer.acquire(attempt("d")),
            Started::Leading(_)
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn an_acquire_not_admitted_within_a_quarter_of_its_ttl_is_told_to_retry_not_null() {
        let (fakes, masters, acquirer) = ready(3).await;
        // Every place taken by fan-outs in progress.
        let busy: Vec<_> = futures::future::join_all(
            (0..crate::admission::MAX_FANOUTS).map(|_| masters.admission.admit()),
        )
        .await;
        let asked = Instant::now();
        let reply = run(acquirer.acquire(attempt("v"))).await;
        assert_eq!(asked.elapsed(), Duration::from_secs(1), "min(TTL / 4, 1 s)");
        assert!(
            matches!(&reply, Reply::Error(text) if text.starts_with(b"TRYAGAIN redlock-proxy is over its admission limit")),
            "{reply:?}"
        );
        assert!(
            fakes.iter().all(|f| f.acquires() == 0),
            "a master was asked"
        );
        // A place frees: the next acquire is admitted and granted.
        drop(busy);
        assert_eq!(run(acquirer.acquire(attempt("w"))).await, Reply::ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_majority_refuses_after_one_node_timeout_and_leaves_nothing() {
        let (fakes, masters, acquirer) = ready(3).await;
        fakes[1].stall();
        fakes[2].stall();
        let asked = Instant::now();
        assert_eq!(run(acquirer.acquire(attempt("v"))).await, Reply::Null);
        let waited = asked.elapsed();
        // One node timeout for the votes, then at most half of one for the confirmation of
        // the clean-up on the master that said OK.
        assert!(
            waited >= NODE_TIMEOUT - Duration::from_millis(1),
            "{waited:?}"
        );
        assert!(waited <= NODE_TIMEOUT * 3 / 2, "{waited:?}");
        assert_eq!(
            fakes[0].get("k"),
            None,
            "the partial grant was not rolled back"
        );
        for voter in &masters.voters()[1..] {
            assert_eq!(voter.stats.timeout.load(Ordering::Relaxed), 1);
        }
        // The stalled masters run the acquire they had read once they resume: too late, it
        // writes nothing (its deadline passed), and the clean-up after the deadline removes
        // whatever could have been written.
        fakes[1].resume();
        fakes[2].resume();
        tokio::time::sleep(NODE_TIMEOUT * 4).await;
        for fake in &fakes {
            assert_eq!(fake.get("k"), None);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_minority_does_not_delay_a_grant() {
        let (fakes, _masters, acquirer) = ready(3).await;
        fakes[2].stall();
        let asked = Instant::now();
        assert_eq!(run(acquirer.acquire(attempt("v"))).await, Reply::ok());
        assert!(asked.elapsed() < NODE_TIMEOUT, "{:?}", asked.elapsed());
    }
}
