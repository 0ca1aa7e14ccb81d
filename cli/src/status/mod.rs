//! `marin3r status`: the EnvoyConfigs like `kubectl get ec` (local mode: `GET /status` of
//! the discovery service, [`local`]; Kubernetes mode: the API server, [`kubernetes`]),
//! one table renderer for both ([`table`]), and the Envoys each discovery service
//! replica reports over CSDS ([`csds`], [`envoys`]; one node's full configuration:
//! [`node`]; Kubernetes mode reaches each replica through a port-forward: [`forward`]). [`run`] puts them together.

pub mod csds;
pub mod envoys;
pub mod forward;
pub mod kubernetes;
pub mod local;
pub mod node;
pub mod run;
pub mod table;

pub use local::{ClientError, delete_revision, fetch};
pub use table::render_table;
