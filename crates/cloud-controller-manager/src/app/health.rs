//! Health checks behind `/healthz`, `/livez` and `/readyz` (upstream's healthz handler format).

use parking_lot::Mutex;
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use super::leader_election::LeaderElector;
use crate::controllers::controller_health::ControllerHealth;

/// What the health endpoints report.
#[derive(Default)]
pub struct Health {
    leader: Mutex<Option<Arc<LeaderElector>>>,
    controllers: Mutex<Vec<(&'static str, ControllerHealth)>>,
    tasks: Mutex<Option<cloud_provider::Supervisor>>,
    shutting_down: AtomicBool,
}

/// A rendered answer: HTTP status code and body.
pub type Answer = (u16, String);

impl Health {
    /// Adds the `leaderElection` watchdog check.
    pub fn watch_leader(&self, leader: Arc<LeaderElector>) {
        *self.leader.lock() = Some(leader);
    }

    /// Adds a check named after a started controller (upstream adds them once controllers run): it
    /// fails while the controller's reconciles keep panicking.
    pub fn controller_started(&self, name: &'static str, health: ControllerHealth) {
        self.controllers.lock().push((name, health));
    }

    /// Adds the `supervisedTasks` check: it fails for good once one of `supervisor`'s tasks (the
    /// caches, the provider's background work) has failed.
    pub fn watch_tasks(&self, supervisor: cloud_provider::Supervisor) {
        *self.tasks.lock() = Some(supervisor);
    }

    /// From now on `/readyz` fails, so load balancers in front of replicas stop sending traffic here.
    pub fn shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }

    fn checks(&self, readiness: bool) -> Vec<(String, Result<(), String>)> {
        let mut checks = vec![("ping".to_owned(), Ok(()))];
        if let Some(leader) = self.leader.lock().as_ref() {
            checks.push(("leaderElection".to_owned(), leader.check()));
        }
        if let Some(tasks) = self.tasks.lock().as_ref() {
            checks.push(("supervisedTasks".to_owned(), tasks.check()));
        }
        for (name, health) in self.controllers.lock().iter() {
            checks.push(((*name).to_owned(), health.check()));
        }
        if readiness {
            let result = if self.shutting_down.load(Ordering::Relaxed) {
                Err("the manager is shutting down".to_owned())
            } else {
                Ok(())
            };
            checks.push(("shutdown".to_owned(), result));
        }
        checks
    }

    /// Answers `/<endpoint>` (`subpath` empty) or `/<endpoint>/<check>`, with `?verbose` and
    /// `?exclude=<check>` as upstream's handler takes them.
    pub fn answer(
        &self,
        endpoint: &str,
        subpath: &str,
        verbose: bool,
        exclude: &[String],
    ) -> Option<Answer> {
        let checks = self.checks(endpoint == "readyz");
        if !subpath.is_empty() {
            let (_, result) = checks.into_iter().find(|(name, _)| name == subpath)?;
            return Some(match result {
                Ok(()) => (200, "ok".to_owned()),
                Err(err) => (500, format!("internal server error: {err}")),
            });
        }
        let mut body = String::new();
        let mut failed = false;
        for (name, result) in checks {
            if exclude.contains(&name) {
                body.push_str(&format!("[+]{name} excluded: ok\n"));
                continue;
            }
            match result {
                Ok(()) => body.push_str(&format!("[+]{name} ok\n")),
                Err(_) => {
                    failed = true;
                    body.push_str(&format!("[-]{name} failed: reason withheld\n"));
                }
            }
        }
        Some(if failed {
            (500, format!("{body}{endpoint} check failed"))
        } else if verbose {
            (200, format!("{body}{endpoint} check passed"))
        } else {
            (200, "ok".to_owned())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_in_upstream_format() {
        let health = Health::default();
        health.controller_started("cloud-node-controller", ControllerHealth::default());
        assert_eq!(
            health.answer("healthz", "", false, &[]),
            Some((200, "ok".into()))
        );
        assert_eq!(
            health.answer("healthz", "", true, &[]),
            Some((
                200,
                "[+]ping ok\n[+]cloud-node-controller ok\nhealthz check passed".into()
            ))
        );
        assert_eq!(
            health.answer("healthz", "cloud-node-controller", false, &[]),
            Some((200, "ok".into()))
        );
        assert_eq!(health.answer("healthz", "nope", false, &[]), None);
    }

    #[test]
    fn readyz_fails_while_shutting_down_but_healthz_does_not() {
        let health = Health::default();
        assert_eq!(health.answer("readyz", "", false, &[]).unwrap().0, 200);
        health.shutting_down();
        let (code, body) = health.answer("readyz", "", false, &[]).unwrap();
        assert_eq!(code, 500);
        assert!(
            body.contains("[-]shutdown failed: reason withheld"),
            "{body}"
        );
        assert_eq!(
            health
                .answer("readyz", "", false, &["shutdown".into()])
                .unwrap()
                .0,
            200
        );
        assert_eq!(health.answer("healthz", "", false, &[]).unwrap().0, 200);
        assert_eq!(health.answer("livez", "", false, &[]).unwrap().0, 200);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_supervised_task_fails_healthz_for_good() {
        let health = Health::default();
        let supervisor = cloud_provider::Supervisor::new(
            Default::default(),
            tokio_util::sync::CancellationToken::new(),
        );
        health.watch_tasks(supervisor.clone());
        assert_eq!(
            health.answer("healthz", "", true, &[]),
            Some((
                200,
                "[+]ping ok\n[+]supervisedTasks ok\nhealthz check passed".into()
            ))
        );
        let ends = cloud_provider::supervise::Ends::AtShutdown;
        supervisor.spawn_once("the Node cache", ends, async { panic!("a bug") });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let (code, body) = health.answer("healthz", "", false, &[]).unwrap();
        assert_eq!(code, 500, "{body}");
        assert!(body.contains("[-]supervisedTasks failed"), "{body}");
        assert_eq!(
            health.answer("livez", "supervisedTasks", false, &[]),
            Some((
                500,
                "internal server error: the task \"the Node cache\" panicked (a bug): a bug".into()
            ))
        );
    }
}
