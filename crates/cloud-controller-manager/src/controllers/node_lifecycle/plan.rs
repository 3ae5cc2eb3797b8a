//! Pure decisions of the cloud-node-lifecycle controller.

use k8s_openapi::api::core::v1::{Node, Taint};

use crate::{controllers::node::plan::taints, well_known::TAINT_SHUTDOWN};

/// Whether the node's `Ready` condition is `True` (a missing condition counts as `Unknown`).
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The shutdown taint: effect `NoSchedule`, no value.
pub fn shutdown_taint() -> Taint {
    Taint {
        key: TAINT_SHUTDOWN.to_owned(),
        effect: "NoSchedule".to_owned(),
        value: None,
        time_added: None,
    }
}

fn is_shutdown_taint(taint: &Taint) -> bool {
    taint.key == TAINT_SHUTDOWN && taint.effect == "NoSchedule"
}

/// The taints with the shutdown taint added, or `None` when it is already there (matched by key and
/// effect).
pub fn with_shutdown_taint(node: &Node) -> Option<Vec<Taint>> {
    let current = taints(node);
    if current.iter().any(is_shutdown_taint) {
        return None;
    }
    let mut wanted = current.to_vec();
    wanted.push(shutdown_taint());
    Some(wanted)
}

/// The taints without the shutdown taint, or `None` when it is not there.
pub fn without_shutdown_taint(node: &Node) -> Option<Vec<Taint>> {
    let current = taints(node);
    if !current.iter().any(is_shutdown_taint) {
        return None;
    }
    Some(
        current
            .iter()
            .filter(|t| !is_shutdown_taint(t))
            .cloned()
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};

    use super::*;

    fn node(ready: Option<&str>, taints: Vec<Taint>) -> Node {
        Node {
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: ready.map(|status| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: status.into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn other() -> Taint {
        Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            value: Some("gpu".into()),
            time_added: None,
        }
    }

    #[test]
    fn readiness() {
        assert!(is_ready(&node(Some("True"), vec![])));
        assert!(!is_ready(&node(Some("False"), vec![])));
        assert!(!is_ready(&node(Some("Unknown"), vec![])));
        assert!(!is_ready(&node(None, vec![])));
        assert!(!is_ready(&Node::default()));
    }

    #[test]
    fn the_shutdown_taint_is_added_once_and_removed_alone() {
        let plain = node(Some("False"), vec![other()]);
        let added = with_shutdown_taint(&plain).unwrap();
        assert_eq!(added, vec![other(), shutdown_taint()]);
        assert_eq!(added[1].value, None);
        let tainted = node(Some("False"), added);
        assert_eq!(with_shutdown_taint(&tainted), None);
        assert_eq!(without_shutdown_taint(&tainted), Some(vec![other()]));
        assert_eq!(without_shutdown_taint(&plain), None);
        // Same key, other effect: not ours.
        let mut foreign = shutdown_taint();
        foreign.effect = "NoExecute".into();
        assert_eq!(
            without_shutdown_taint(&node(Some("True"), vec![foreign])),
            None
        );
    }
}
