//! A provider's background task, supervised: the one way a provider starts work of its own from
//! [`CloudProvider::initialize`](crate::CloudProvider::initialize), so nothing it spawns ends unseen.

use std::{future::Future, time::Duration};

use tokio_util::sync::CancellationToken;

/// Runs the task `make` builds until `shutdown` is cancelled: a run that panics (a bug) is logged as an
/// error naming `name` and started again after a second, so that it neither ends unseen nor takes the
/// manager down; a run that returns is done. The supervisor itself only waits, and cannot panic.
///
/// Must be called within a Tokio runtime (as [`CloudProvider::initialize`](crate::CloudProvider::initialize) is).
pub fn supervise<F, Fut>(name: &'static str, shutdown: CancellationToken, make: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let mut run = tokio::spawn(make());
            tokio::select! {
                result = &mut run => match result {
                    Err(err) if err.is_panic() => {
                        tracing::error!(task = name, error = %err, "a provider's background task panicked (a bug); starting it again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    _ => return,
                },
                () = shutdown.cancelled() => {
                    run.abort();
                    return;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_started_again_and_stops_with_shutdown() {
        let runs = Arc::new(AtomicU32::new(0));
        let shutdown = CancellationToken::new();
        let counted = runs.clone();
        supervise("test", shutdown.clone(), move || {
            let runs = counted.clone();
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("a bug");
                }
                std::future::pending::<()>().await;
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "two panics, then a run that lasts"
        );
        shutdown.cancel();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "nothing starts after shutdown"
        );
    }
}
