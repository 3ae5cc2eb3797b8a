//! Which `type: LoadBalancer` Services this manager serves, by `spec.loadBalancerClass`
//! (`--load-balancer-class`, `--serve-classless-load-balancers`).
//!
//! Upstream's framework serves classless Services only, so a cloud controller manager can never serve a
//! class of its own, nor run beside MetalLB, Cilium or a second manager that serve classes. Here:
//! - without `--load-balancer-class`: classless Services only (upstream's behaviour);
//! - with `--load-balancer-class=CLASS` (repeatable): Services of those classes only;
//! - `--serve-classless-load-balancers=true` with classes: those classes and classless Services too (the
//!   way Cilium serves its own classes beside classless Services); `=false` without classes serves
//!   nothing, and is refused.
//!
//! A Service this manager does not serve is never touched: no cloud call, no finalizer, no status, no
//! event, even when it carries the shared `service.kubernetes.io/load-balancer-cleanup` finalizer another
//! manager added.

use std::collections::BTreeSet;

/// The classes of Services a manager serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedClasses {
    classes: BTreeSet<String>,
    classless: bool,
}

impl Default for ServedClasses {
    /// Upstream's: classless Services only.
    fn default() -> Self {
        Self {
            classes: BTreeSet::new(),
            classless: true,
        }
    }
}

impl ServedClasses {
    /// From the flags: `classes` (`--load-balancer-class`, each a qualified name as the API server
    /// requires of `loadBalancerClass`) and `classless` (`--serve-classless-load-balancers`; unset: only
    /// when no class is given). An error names the flag and the value at fault.
    pub fn new(classes: &[String], classless: Option<bool>) -> Result<Self, String> {
        for class in classes {
            if let Err(why) = cloud_provider::labels::check_qualified_name(class) {
                return Err(format!(
                    "--load-balancer-class={class:?} is not a load-balancer class: {why}"
                ));
            }
        }
        let served = Self {
            classes: classes.iter().cloned().collect(),
            classless: classless.unwrap_or(classes.is_empty()),
        };
        if served.classes.is_empty() && !served.classless {
            return Err(
                "--serve-classless-load-balancers=false without --load-balancer-class serves no Service; give the classes to serve, or leave the service controller out of --controllers".into(),
            );
        }
        Ok(served)
    }

    /// Whether a `type: LoadBalancer` Service of `class` (`None`: classless) is this manager's.
    pub fn serves(&self, class: Option<&str>) -> bool {
        match class {
            None => self.classless,
            Some(class) => self.classes.contains(class),
        }
    }

    /// Whether this is upstream's choice (classless only).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// For logs: `classless`, the classes, or both.
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = self.classes.iter().cloned().collect();
        if self.classless {
            parts.insert(0, "classless".into());
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(c: &[&str]) -> Vec<String> {
        c.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn the_flags_choose_classless_classes_or_both() {
        let upstream = ServedClasses::new(&[], None).unwrap();
        assert!(upstream.is_default());
        assert!(upstream.serves(None));
        assert!(!upstream.serves(Some("ccm.rs/local")));

        let local = ServedClasses::new(&classes(&["ccm.rs/local"]), None).unwrap();
        assert!(!local.serves(None));
        assert!(local.serves(Some("ccm.rs/local")));
        assert!(!local.serves(Some("ccm.rs/other")));
        assert_eq!(local.describe(), "ccm.rs/local");

        let both = ServedClasses::new(&classes(&["ccm.rs/local", "internal"]), Some(true)).unwrap();
        assert!(both.serves(None));
        assert!(both.serves(Some("internal")));
        assert_eq!(both.describe(), "classless, ccm.rs/local, internal");

        let err = ServedClasses::new(&[], Some(false)).unwrap_err();
        assert!(err.contains("serves no Service"), "{err}");
    }

    #[test]
    fn classes_are_qualified_names() {
        for ok in [
            "local",
            "ccm.rs/local",
            "example.com/Lb_1.x",
            "a/b",
            "service.k8s.aws/nlb",
        ] {
            assert!(ServedClasses::new(&classes(&[ok]), None).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("", "1 to 63"),
            ("ccm.rs/", "1 to 63"),
            ("/local", "DNS subdomain"),
            ("CCM.rs/local", "DNS subdomain"),
            ("ccm.rs/local ", "begin and end"),
            ("-local", "begin and end"),
            ("lo cal", "only letters"),
            ("a/b/c", "only letters"),
        ] {
            let err = ServedClasses::new(&classes(&[bad]), None).unwrap_err();
            assert!(
                err.starts_with(&format!("--load-balancer-class={bad:?}")) && err.contains(why),
                "{bad:?}: {err}"
            );
        }
        let long = "x".repeat(64);
        assert!(ServedClasses::new(&classes(&[&long]), None).is_err());
    }
}
