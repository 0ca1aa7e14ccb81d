//! One stream's view as an answer shows it: the wall clock of the query, the status of
//! each resource (the pure rule: [`resource_config`], [`absent_config`]) and the trait
//! the state machines implement ([`ClientView`]).

use std::time::{Instant, SystemTime};

use envoy_types::pb::envoy::admin::v3::{ClientResourceStatus, UpdateFailureState};
use envoy_types::pb::envoy::service::status::v3::ConfigStatus;
use envoy_types::pb::envoy::service::status::v3::client_config::GenericXdsConfig;
use envoy_types::pb::google::protobuf::Timestamp;

use crate::snapshot::Snapshot;
use marin3r_envoyconfig::resource::{Resource, ResourceType};

use super::log::{Pending, ResourceState};

/// Wall time of the query with the `Instant` taken at the same moment: the state
/// machines keep `Instant`s, the answer carries wall-clock timestamps.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    pub system: SystemTime,
    pub instant: Instant,
}

impl Clock {
    pub fn now() -> Self {
        Self {
            system: SystemTime::now(),
            instant: Instant::now(),
        }
    }

    /// The wall time of `at`.
    pub fn timestamp(&self, at: Instant) -> Option<Timestamp> {
        let ago = self.instant.saturating_duration_since(at);
        let wall = self.system.checked_sub(ago)?;
        let since = wall.duration_since(SystemTime::UNIX_EPOCH).ok()?;
        Some(Timestamp {
            seconds: i64::try_from(since.as_secs()).ok()?,
            nanos: i32::try_from(since.subsec_nanos()).ok()?,
        })
    }
}

/// What a view needs besides the state machine: the query's clock, and the node's
/// current snapshot when the resources themselves are asked for.
#[derive(Debug, Clone, Copy)]
pub struct ViewInput<'a> {
    pub clock: Clock,
    pub contents: Option<&'a Snapshot>,
}

/// The message of a NACK event, as stored.
pub(crate) fn nack_message(event: &crate::events::StreamEvent) -> Option<&str> {
    match event {
        crate::events::StreamEvent::Nack { message, .. } => Some(message),
        _ => None,
    }
}

/// The status a resource has, as the pure rule of this module.
pub(crate) fn resource_config(
    t: ResourceType,
    name: &str,
    state: &ResourceState,
    input: &ViewInput<'_>,
) -> GenericXdsConfig {
    let client_status = if state.nacked.is_some() {
        ClientResourceStatus::Nacked
    } else if state.acked.is_some() {
        ClientResourceStatus::Acked
    } else {
        ClientResourceStatus::Requested
    };
    let config_status = match (state.pending, &state.nacked, &state.acked) {
        (Pending::Update(_) | Pending::Removal, _, _) => ConfigStatus::Stale,
        (_, Some(_), _) => ConfigStatus::Error,
        (_, None, Some(_)) => ConfigStatus::Synced,
        (_, None, None) => ConfigStatus::NotSent,
    };
    let xds_config = state.acked.as_ref().and_then(|a| {
        input
            .contents
            .filter(|_| t != ResourceType::Secret)
            .and_then(|s| s.resource(t, name))
            .filter(|r| r.digest == a.digest)
            .and_then(shown_content)
    });
    GenericXdsConfig {
        type_url: t.type_url().to_string(),
        name: name.to_string(),
        version_info: state
            .acked
            .as_ref()
            .map(|a| a.version.to_string())
            .unwrap_or_default(),
        xds_config,
        last_updated: state
            .acked
            .as_ref()
            .and_then(|a| input.clock.timestamp(a.at)),
        config_status: config_status as i32,
        client_status: client_status as i32,
        error_state: state.nacked.as_ref().map(|n| UpdateFailureState {
            failed_configuration: None,
            last_update_attempt: input.clock.timestamp(n.at),
            details: n.message.to_string(),
            version_info: n.version.to_string(),
        }),
        is_static_resource: false,
    }
}

/// A resource's content as an answer shows it: with what Envoy marks sensitive
/// redacted as its `/config_dump` does (`[redacted]`,
/// [`marin3r_envoyconfig::redact`]); no content when it cannot be read.
fn shown_content(r: &Resource) -> Option<envoy_types::pb::google::protobuf::Any> {
    let value =
        marin3r_envoyconfig::redact::redact_encoded(&r.body.type_url, &r.body.value).ok()?;
    Some(envoy_types::pb::google::protobuf::Any {
        type_url: r.body.type_url.clone(),
        value: value.into_owned(),
    })
}

/// A name the client subscribed to that it holds no status for: not answered yet
/// (`REQUESTED`, `NOT_SENT`), or answered as absent (`DOES_NOT_EXIST`; `SYNCED` once
/// that answer was answered, `STALE` before).
pub(crate) fn absent_config(
    t: ResourceType,
    name: &str,
    told_absent: Option<bool>,
) -> GenericXdsConfig {
    let (client_status, config_status) = match told_absent {
        None => (ClientResourceStatus::Requested, ConfigStatus::NotSent),
        Some(true) => (ClientResourceStatus::DoesNotExist, ConfigStatus::Synced),
        Some(false) => (ClientResourceStatus::DoesNotExist, ConfigStatus::Stale),
    };
    GenericXdsConfig {
        type_url: t.type_url().to_string(),
        name: name.to_string(),
        config_status: config_status as i32,
        client_status: client_status as i32,
        ..Default::default()
    }
}

/// A stream state machine as the client status service reads it.
pub trait ClientView: Send {
    /// One entry per resource the stream's client holds, was sent or subscribed to,
    /// in push order of the types, then by name.
    fn generic_xds_configs(&self, input: &ViewInput<'_>) -> Vec<GenericXdsConfig>;
}
