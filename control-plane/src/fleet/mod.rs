//! A discovery service with several replicas (`docs/ha.md`): every replica serves,
//! one leader writes, NACKs are judged over the whole fleet. The pure parts:
//!
//! - [`judge`]: the fleet-wide NACK judgement over every replica's report, plugged into
//!   the publisher as its [`NackView`](crate::nacks::NackView);
//! - [`report`]: what a replica reports (a digest per node) and when it writes it;
//! - [`expected`]: which replicas the leader expects a report from (the Service's
//!   EndpointSlices).
//!
//! The Kubernetes shell that reads and writes the `DiscoveryServiceReplica` objects,
//! elects the leader and gates writes on it is `crate::kubernetes::ha`.

pub mod expected;
pub mod judge;
pub mod report;

pub use judge::{FRESHNESS, Fleet, FleetView, Judged, NoVerdict, Report, Verdict, Veto};
pub use report::{COALESCE, HEARTBEAT, MAX_REPORT_BYTES, Next, Schedule, Served};
