//! One ServiceAccount's token, kept fresh: upstream's `tokenSourceImpl` behind client-go's
//! `cachingTokenSource` and `ResettableTokenSourceWrapTransport`.
//!
//! A token is used until it is [`Schedule::refresh_after`] old (80 % of its lifetime; a lifetime under
//! 10 minutes, which only clock skew between the manager and the API server explains, counts as 10
//! minutes), then a background task requests a new one. A refresh that fails is logged and retried with
//! back-off ([`retry_delay`]) while requests go on with the old token until it expires. A request the API
//! server answers 401 drops the token it carried (unless a newer one replaced it meanwhile) and has the
//! task request a new one at once; requests wait for it (at most [`TOKEN_WAIT`]).

use parking_lot::Mutex;
use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use cloud_provider::{Supervisor, supervise::Ends};
use http::HeaderValue;
use k8s_openapi::jiff::Timestamp;
use tokio::{
    sync::{Notify, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{CredentialsError, NAMESPACE};

/// The share of a token's lifetime after which it is refreshed (upstream's `defaultLeewayPercent` is
/// the 20 % left).
const REFRESH_AT_PERCENT: u32 = 80;
/// The shortest lifetime assumed for a token (upstream pins a shorter one to this: clock skew).
pub(crate) const MIN_LIFETIME: Duration = Duration::from_secs(10 * 60);
/// The first retry of a failed refresh, doubling up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_secs(1);
const MAX_RETRY: Duration = Duration::from_secs(30);
/// Tries of the first token at start, with [`FIRST_RETRY_AT_START`] doubling in between (upstream's
/// `wait.Backoff{Duration: 500ms, Factor: 2, Steps: 4}` around each token request).
const TRIES_AT_START: u32 = 4;
const FIRST_RETRY_AT_START: Duration = Duration::from_millis(500);
/// How long a request waits for a token when none is valid (after a 401, or once the token expired).
pub(crate) const TOKEN_WAIT: Duration = Duration::from_secs(10);

/// A token the API server issued.
pub(crate) struct IssuedToken {
    /// The bearer token.
    pub token: String,
    /// When it expires, by the API server's clock.
    pub expiration: Timestamp,
}

/// Requests a new token (a TokenRequest, after making sure the ServiceAccount exists).
pub(crate) type Fetch = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<IssuedToken, CredentialsError>> + Send>>
        + Send
        + Sync,
>;

/// When a token is refreshed and how long it is used at most, counted from when it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    /// Refresh it once it is this old.
    pub refresh_after: Duration,
    /// Stop using it once it is this old.
    pub valid_for: Duration,
}

/// The schedule of a token that arrived at `now` and expires at `expiration` (both by the wall clock;
/// the API server's `status.expirationTimestamp`).
pub(crate) fn schedule(now: Timestamp, expiration: Timestamp) -> Schedule {
    let lifetime = Duration::try_from(expiration.duration_since(now))
        .unwrap_or_default()
        .max(MIN_LIFETIME);
    Schedule {
        refresh_after: lifetime * REFRESH_AT_PERCENT / 100,
        valid_for: lifetime,
    }
}

/// The wait before the `failures`-th retry of a failed refresh (1 s, 2 s, 4 s, ... up to 30 s).
pub(crate) fn retry_delay(failures: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1)))
        .min(MAX_RETRY)
}

/// The token requests carry, with what identifies it for [`TokenSource::invalidate`].
#[derive(Clone, Debug)]
pub(crate) struct Current {
    /// `Bearer <token>`, marked sensitive (never logged).
    pub header: HeaderValue,
    /// Which token this is (counting from 1).
    pub generation: u64,
    /// When it stops being used.
    pub expires_at: Instant,
}

impl Current {
    fn usable(&self) -> bool {
        self.expires_at > Instant::now()
    }
}

/// No valid token within [`TOKEN_WAIT`].
#[derive(Debug, thiserror::Error)]
#[error("no valid token for {NAMESPACE}/{service_account}: {last_error}")]
pub(crate) struct NoToken {
    service_account: String,
    last_error: String,
}

/// A ServiceAccount's token, shared by every client that authenticates as it.
#[derive(Clone)]
pub(crate) struct TokenSource {
    shared: Arc<Shared>,
}

struct Shared {
    service_account: String,
    current: watch::Sender<Option<Current>>,
    generation: AtomicU64,
    /// Wakes the refresher at once (a 401).
    refresh_now: Notify,
    last_error: Mutex<Option<String>>,
}

impl TokenSource {
    /// Gets the first token of `service_account` with `fetch` (tried [`TRIES_AT_START`] times), then
    /// keeps it fresh in a task of `supervisor` until its shutdown: a refresh that panics is started
    /// again (and refreshes at once), one that keeps panicking fails the manager's health check (every
    /// request of the controllers would fail once the token expired).
    pub(crate) async fn start(
        service_account: &str,
        fetch: Fetch,
        supervisor: &Supervisor,
    ) -> Result<Self, CredentialsError> {
        let span = tracing::info_span!("service_account_token", service_account = %format!("{NAMESPACE}/{service_account}"));
        let mut delay = FIRST_RETRY_AT_START;
        let mut attempt = 1;
        let (first, schedule) = loop {
            match fetch().instrument(span.clone()).await {
                Ok(issued) => break received(issued),
                Err(err) if attempt < TRIES_AT_START => {
                    span.in_scope(|| tracing::warn!(error = %err, attempt, "cannot get a token yet; retrying"));
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                }
                Err(err) => return Err(err),
            }
        };
        let source = Self {
            shared: Arc::new(Shared {
                service_account: service_account.to_owned(),
                current: watch::Sender::new(None),
                generation: AtomicU64::new(0),
                refresh_now: Notify::new(),
                last_error: Mutex::new(None),
            }),
        };
        source.install(first, schedule)?;
        span.in_scope(|| {
            tracing::info!(
                refresh_in = ?schedule.refresh_after,
                "got a token for the ServiceAccount"
            );
        });
        let first_refresh = Mutex::new(Some(Instant::now() + schedule.refresh_after));
        let (shared, stop) = (source.shared.clone(), supervisor.shutdown().clone());
        let name = format!("the token of {NAMESPACE}/{service_account}");
        supervisor.spawn(name, Ends::AtShutdown, move || {
            // A restart (after a panic) refreshes at once.
            let refresh_at = first_refresh.lock().take().unwrap_or_else(Instant::now);
            refresh(shared.clone(), fetch.clone(), refresh_at, stop.clone())
                .instrument(span.clone())
        });
        Ok(source)
    }

    /// The ServiceAccount's name.
    pub(crate) fn service_account(&self) -> &str {
        &self.shared.service_account
    }

    /// The current token, waiting at most `wait` when there is no valid one.
    pub(crate) async fn current(self, wait: Duration) -> Result<Current, NoToken> {
        let mut current = self.shared.current.subscribe();
        let usable = |c: &Option<Current>| c.as_ref().is_some_and(Current::usable);
        if let Some(c) = current.borrow().as_ref().filter(|c| c.usable()) {
            return Ok(c.clone());
        }
        match tokio::time::timeout(wait, current.wait_for(usable)).await {
            Ok(Ok(c)) => Ok(c.clone().expect("wait_for returned a usable token")),
            _ => Err(NoToken {
                service_account: self.shared.service_account.clone(),
                last_error: self
                    .shared
                    .lock_error()
                    .clone()
                    .unwrap_or_else(|| "the token expired".to_owned()),
            }),
        }
    }

    /// The API server refused token `generation` (401): drop it, unless a newer one replaced it, and
    /// request a new one at once (upstream resets its token cache on a 401).
    pub(crate) fn invalidate(&self, generation: u64) {
        let dropped = self.shared.current.send_if_modified(|current| {
            if current.as_ref().is_some_and(|c| c.generation == generation) {
                *current = None;
                true
            } else {
                false
            }
        });
        if dropped {
            tracing::warn!(
                service_account = %format!("{NAMESPACE}/{}", self.shared.service_account),
                "the API server refused the ServiceAccount's token (401); requesting a new one"
            );
            self.shared.refresh_now.notify_one();
        }
    }

    fn install(&self, token: String, schedule: Schedule) -> Result<(), CredentialsError> {
        self.shared.install(token, schedule)
    }
}

impl Shared {
    fn install(&self, token: String, schedule: Schedule) -> Result<(), CredentialsError> {
        let mut header = HeaderValue::try_from(format!("Bearer {token}")).map_err(|_| {
            CredentialsError::BadToken {
                service_account: self.service_account.clone(),
            }
        })?;
        header.set_sensitive(true);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.current.send_replace(Some(Current {
            header,
            generation,
            expires_at: Instant::now() + schedule.valid_for,
        }));
        *self.lock_error() = None;
        Ok(())
    }

    fn lock_error(&self) -> parking_lot::MutexGuard<'_, Option<String>> {
        self.last_error.lock()
    }
}

/// The token of `issued` and its schedule from now.
fn received(issued: IssuedToken) -> (String, Schedule) {
    let schedule = schedule(Timestamp::now(), issued.expiration);
    (issued.token, schedule)
}

/// Refreshes the token at `refresh_at`, then on its schedule, until `stop`; a failure is retried with
/// back-off while the old token stays in use.
async fn refresh(
    shared: Arc<Shared>,
    fetch: Fetch,
    mut refresh_at: Instant,
    stop: CancellationToken,
) {
    let mut failures = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(refresh_at) => {}
            () = shared.refresh_now.notified() => {}
        }
        let result = tokio::select! {
            () = stop.cancelled() => return,
            result = fetch() => result,
        };
        let err = match result {
            Ok(issued) => {
                let (token, schedule) = received(issued);
                match shared.install(token, schedule) {
                    Ok(()) => {
                        failures = 0;
                        refresh_at = Instant::now() + schedule.refresh_after;
                        tracing::debug!(refresh_in = ?schedule.refresh_after, "refreshed the ServiceAccount's token");
                        continue;
                    }
                    Err(err) => err,
                }
            }
            Err(err) => err,
        };
        failures += 1;
        let retry_in = retry_delay(failures);
        let expires_in = shared
            .current
            .borrow()
            .as_ref()
            .map(|c| c.expires_at.saturating_duration_since(Instant::now()));
        tracing::warn!(
            error = %err,
            failures,
            ?retry_in,
            current_token_valid_for = ?expires_in.unwrap_or_default(),
            "cannot refresh the ServiceAccount's token; requests keep the current one until it expires"
        );
        *shared.lock_error() = Some(err.to_string());
        refresh_at = Instant::now() + retry_in;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    /// A supervisor whose tasks stop with `stop`.
    fn supervised(stop: &CancellationToken) -> Supervisor {
        Supervisor::new(Default::default(), stop.clone())
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn a_token_is_refreshed_after_80_percent_of_its_lifetime() {
        // An hour, as requested: refreshed after 48 minutes, used for the hour at most.
        assert_eq!(
            schedule(at(0), at(3600)),
            Schedule {
                refresh_after: Duration::from_secs(2880),
                valid_for: Duration::from_secs(3600),
            }
        );
        // A server that grants less (or more) than asked: 80 % of what it granted.
        assert_eq!(
            schedule(at(0), at(1200)).refresh_after,
            Duration::from_secs(960)
        );
        assert_eq!(
            schedule(at(0), at(86_400)).refresh_after,
            Duration::from_secs(69_120)
        );
        // Fractions of a second are kept.
        assert_eq!(
            schedule(at(0), at(3600) + SignedDuration::from_millis(500)).refresh_after,
            Duration::from_millis(2_880_400)
        );
    }

    #[test]
    fn clock_skew_pins_the_lifetime_to_ten_minutes() {
        let pinned = Schedule {
            refresh_after: Duration::from_secs(480),
            valid_for: MIN_LIFETIME,
        };
        // Our clock runs ahead of the API server's: the token looks short-lived, expired, or even
        // expired long ago.
        assert_eq!(schedule(at(0), at(300)), pinned);
        assert_eq!(schedule(at(0), at(0)), pinned);
        assert_eq!(schedule(at(0), at(-7200)), pinned);
        // Just at the minimum: not pinned, and the same.
        assert_eq!(schedule(at(0), at(600)), pinned);
        assert_eq!(schedule(at(0), at(601)).valid_for, Duration::from_secs(601));
    }

    #[test]
    fn failed_refreshes_back_off_to_30_seconds() {
        let delays: Vec<u64> = (1..=8).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(retry_delay(u32::MAX), MAX_RETRY, "no overflow");
        // 20 % of an hour's token leaves 12 minutes for retries: many of them.
        let slack = Duration::from_secs(3600) - schedule(at(0), at(3600)).refresh_after;
        assert!(slack / MAX_RETRY.as_secs() as u32 > Duration::from_secs(20));
    }

    /// A fetch that hands out `token-1`, `token-2`, ... valid for `lifetime`, failing while `failing`.
    fn counting_fetch(
        lifetime: Duration,
        failing: Arc<std::sync::atomic::AtomicBool>,
    ) -> (Fetch, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let fetch: Fetch = Arc::new(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            let failing = failing.load(Ordering::SeqCst);
            Box::pin(async move {
                if failing {
                    return Err(CredentialsError::Token {
                        service_account: "sa".to_owned(),
                        source: kube::Error::Api(
                            kube::core::Status {
                                code: 503,
                                message: "etcd is down".to_owned(),
                                reason: "ServiceUnavailable".to_owned(),
                                ..Default::default()
                            }
                            .boxed(),
                        ),
                    });
                }
                Ok(IssuedToken {
                    token: format!("token-{n}"),
                    expiration: Timestamp::now() + SignedDuration::try_from(lifetime).unwrap(),
                })
            })
        });
        (fetch, calls)
    }

    fn bearer(current: &Current) -> &str {
        current.header.to_str().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_refresher_follows_the_schedule_and_keeps_the_old_token_through_failures() {
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (fetch, calls) = counting_fetch(Duration::from_secs(3600), failing.clone());
        let stop = CancellationToken::new();
        let source = TokenSource::start("sa", fetch, &supervised(&stop))
            .await
            .unwrap();
        let current = source.clone().current(TOKEN_WAIT).await.unwrap();
        assert_eq!(bearer(&current), "Bearer token-1");
        assert!(current.header.is_sensitive());

        // Not before 80 % of the hour.
        tokio::time::sleep(Duration::from_secs(2870)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let current = source.clone().current(TOKEN_WAIT).await.unwrap();
        assert_eq!(bearer(&current), "Bearer token-2");

        // The next refresh (due at 2880 + 2880 s) fails: retried after 1, 2, 4 ... s, the old token
        // still in use meanwhile.
        failing.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2_870_500)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4, "retried after 1 s");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 4, "not yet");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 5, "then after 2 s");
        assert_eq!(
            bearer(&source.clone().current(TOKEN_WAIT).await.unwrap()),
            "Bearer token-2"
        );
        // The refresh succeeds again: the new token, and the schedule starts over.
        failing.store(false, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 6, "then after 4 s");
        assert_eq!(
            bearer(&source.clone().current(TOKEN_WAIT).await.unwrap()),
            "Bearer token-6"
        );
        stop.cancel();
    }

    /// A refresh that panics (a bug) is started again a second later and refreshes at once: the
    /// token does not run out unrefreshed.
    #[tokio::test(start_paused = true)]
    async fn a_refresh_that_panics_is_started_again_and_refreshes_at_once() {
        let calls = Arc::new(AtomicU32::new(0));
        let counted = calls.clone();
        let fetch: Fetch = Arc::new(move || {
            let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
            Box::pin(async move {
                assert_ne!(n, 2, "a bug in the second fetch");
                Ok(IssuedToken {
                    token: format!("token-{n}"),
                    expiration: Timestamp::now() + SignedDuration::from_hours(1),
                })
            })
        });
        let stop = CancellationToken::new();
        let supervisor = supervised(&stop);
        let source = TokenSource::start("sa", fetch, &supervisor).await.unwrap();
        // The refresh at 80 % of the hour panics; 1 s later the restarted refresher fetches again.
        tokio::time::sleep(Duration::from_secs(2881)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            3,
            "started again, refreshed at once"
        );
        assert_eq!(
            bearer(&source.clone().current(TOKEN_WAIT).await.unwrap()),
            "Bearer token-3"
        );
        assert_eq!(supervisor.check(), Ok(()), "one panic is not a failure");
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_token_is_not_used_and_the_error_says_why() {
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (fetch, _) = counting_fetch(Duration::from_secs(3600), failing.clone());
        let stop = CancellationToken::new();
        let source = TokenSource::start("sa", fetch, &supervised(&stop))
            .await
            .unwrap();
        failing.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3601)).await;
        let err = source.clone().current(TOKEN_WAIT).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "no valid token for kube-system/sa: --use-service-account-credentials: cannot get a token for kube-system/sa: etcd is down (503 ServiceUnavailable)"
        );
        // Once a refresh succeeds, requests go on.
        failing.store(false, Ordering::SeqCst);
        let current = source
            .clone()
            .current(Duration::from_secs(60))
            .await
            .unwrap();
        assert!(bearer(&current).starts_with("Bearer token-"));
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_401_drops_the_token_and_gets_a_new_one_at_once() {
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (fetch, calls) = counting_fetch(Duration::from_secs(3600), failing);
        let stop = CancellationToken::new();
        let source = TokenSource::start("sa", fetch, &supervised(&stop))
            .await
            .unwrap();
        let first = source.clone().current(TOKEN_WAIT).await.unwrap();
        source.invalidate(first.generation);
        let second = source.clone().current(TOKEN_WAIT).await.unwrap();
        assert_eq!(bearer(&second), "Bearer token-2");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // A late 401 for the old token does not drop the new one.
        source.invalidate(first.generation);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(
            bearer(&source.clone().current(TOKEN_WAIT).await.unwrap()),
            "Bearer token-2"
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_token_is_tried_four_times_then_its_error_returned() {
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (fetch, calls) = counting_fetch(Duration::from_secs(3600), failing);
        let started = Instant::now();
        let err = TokenSource::start("sa", fetch, &supervised(&CancellationToken::new()))
            .await
            .err()
            .unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 4);
        // 0.5 + 1 + 2 s between the tries, as upstream's back-off.
        assert_eq!(started.elapsed(), Duration::from_millis(3500));
        assert!(err.to_string().contains("kube-system/sa"), "{err}");
    }
}
