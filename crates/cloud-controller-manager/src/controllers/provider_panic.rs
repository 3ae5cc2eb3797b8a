//! A cloud provider's call that panics (a bug in the provider) met as that call's error, in the loops
//! that call the provider for one object at a time beside their own work (the service controller's
//! node sync and drift check): that object's call fails and is retried as a failure would be, and the
//! loop goes on with the others. Unlike a panic of the loop's own, which fails the controller's health
//! check for good ([`super::background_loop`]), a provider's panic about one object says nothing about
//! the loop.

use std::{future::Future, panic::AssertUnwindSafe};

use cloud_provider::{CloudError, CloudResult};
use futures::FutureExt;

/// `work` (the provider's `call`), with a panic turned into its error and said at error level.
pub(crate) async fn caught<T>(
    call: &'static str,
    work: impl Future<Output = CloudResult<T>>,
) -> CloudResult<T> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            let message = cloud_provider::panic_message(panic.as_ref());
            tracing::error!(call, "the cloud provider panicked (a bug): {message}");
            Err(CloudError::other(format!(
                "the cloud provider panicked in {call}: {message}"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_is_the_call_s_error_and_a_result_passes_through() {
        let panicked = caught("update_load_balancer", async {
            if true {
                panic!("index out of bounds");
            }
            Ok::<(), CloudError>(())
        })
        .await;
        let err = panicked.unwrap_err().to_string();
        assert!(
            err.contains("panicked in update_load_balancer: index out of bounds"),
            "{err}"
        );
        assert_eq!(
            caught("get_zone", async { Ok::<_, CloudError>(7) })
                .await
                .unwrap(),
            7
        );
    }
}
