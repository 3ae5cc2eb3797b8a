//! Shadow mode (`--dry-run`): every controller runs, without leader election, beside the manager that
//! acts (the incumbent); nothing is written to the API server or the cloud, and every write the
//! controllers would have made is reported: in the log, as metrics, and as JSON at `/dry-run` on the
//! secure endpoint (behind the same authorization as `/metrics`).
//!
//! - API writes ([`api_layer`]): a layer on every client adds `dryRun=All` to each POST, PUT, PATCH and
//!   DELETE, so the API server validates the write and answers as if it applied it, and stores nothing;
//!   the controllers carry on with the answer. Each write is recorded (events apart: they are no
//!   difference in what the managers do to the cluster).
//! - Cloud writes ([`cloud`]): the provider is wrapped in one that forwards reads and turns
//!   `ensure`/`update`/`delete` of load balancers and `create`/`delete` of routes into previews
//!   ([`cloud_provider::LoadBalancer::preview_load_balancer`]).
//! - The report ([`report`]) keeps, per object, the latest would-be write, and classifies it when asked
//!   against the object as it is now: a write that would change it is a difference, one whose dry-run
//!   answer equals the object is a no-op, one made before the object changed is superseded (the
//!   controller re-evaluates an object when it changes, and records again if it still differs).

pub mod api_layer;
pub mod cloud;
pub mod metrics;
pub mod report;

pub use api_layer::DryRunLayer;
pub use cloud::ShadowCloud;
pub use metrics::DryRunMetrics;
pub use report::{ShadowReport, ShadowView};
