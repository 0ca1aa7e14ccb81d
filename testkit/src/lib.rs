//! The one test kit of the workspace: the plumbing every crate's tests (and `bench`)
//! need, written once.
//!
//! - [`http`]: an HTTP/1.1 client on hyper (any method, optional body; status, headers,
//!   body back), async and blocking.
//! - [`golden`]: the one golden-file runner (compare, or rewrite with `UPDATE_GOLDEN=1`).
//! - [`wait`]: the one polling helper: a condition (or a fallible probe) under a
//!   deadline; the async forms panic with a description on timeout ([`wait::poll_ok`]
//!   reports it instead).
//! - [`admission`]: AdmissionReview v1 bodies as the API server sends them (Pod for the
//!   mutating path, EnvoyConfig for the validating one).
//! - [`tls`]: a rustls client config trusting one CA PEM.
//! - [`rbac`]: the RBAC permissions an API request needs (to check Role tables against
//!   recorded requests).
//! - [`pod_security`]: the Pod Security Standards `restricted` profile, checked on a
//!   container (every container marin3r generates must pass it).
//! - [`scc`]: OpenShift's SecurityContextConstraints admission (restricted-v2, anyuid,
//!   …) modelled on a Pod as JSON, with the webhook between its two passes.
//! - [`kube`] (feature `kube`): kube-rs' mock API server pattern (a scripted
//!   `tower-test` service behind a `kube::Client`).
//! - [`unix_time`]: fixed points in time for code that takes `now` as an input.
//! - [`proxy`]: a TCP load balancer standing in for a Kubernetes Service (several
//!   discovery-service replicas behind one address).
//! - [`sockets`] (Linux): the options of a server's side of a test connection (did the
//!   server set `TCP_NODELAY` on the socket it accepted?).
//! - [`batches`]: many runs of a slow external program, a few at a time.
//! - [`envoy`]: where the tests find Envoy 1.40 (`ENVOY_BIN`, else `.venv`); never
//!   optional.
//! - [`special_files`]: every kind of entry that is not a usable regular file (FIFO,
//!   `/dev/zero`, socket, dangling symlink, directory, huge sparse file), made on demand.
//! - [`free_port`].
//!
//! It depends on no marin3r crate, so every crate can take it as a dev-dependency.
#![forbid(unsafe_code)]

pub mod admission;
#[cfg(feature = "apiserver")]
pub mod apiserver;
pub mod batches;
pub mod envoy;
pub mod golden;
pub mod http;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "observability")]
pub mod observability;
pub mod pod_security;
pub mod proxy;
pub mod rbac;
pub mod scc;
#[cfg(target_os = "linux")]
pub mod sockets;
pub mod special_files;
pub mod time;
pub mod tls;
pub mod wait;

mod ports;

pub use ports::free_port;
pub use time::unix_time;
pub use wait::{poll_ok, wait_for, wait_ok, wait_until, wait_until_async, wait_until_some};
