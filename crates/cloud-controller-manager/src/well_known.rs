//! The exact label, taint and annotation names upstream uses (k8s.io/api and k8s.io/cloud-provider).

/// The taint a kubelet started with `--cloud-provider=external` registers with; the cloud-node
/// controller removes it once the node is initialized. Matched by key.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The taint the lifecycle controller puts on nodes whose instance is shut down (effect `NoSchedule`,
/// no value).
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// The kubelet's `--node-ip`, for the cloud-node controller to honor.
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// Instance type (GA).
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Instance type (beta).
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
/// Zone (GA).
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Zone (beta).
pub const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// Region (GA).
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Region (beta).
pub const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
