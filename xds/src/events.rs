//! What an ADS stream reports to the stats: the [`StreamEvent`]s (requests, ACKs and
//! NACKs) the sans-I/O SotW and Delta state machines return, and which ADS flavour
//! ([`Api`]) the stream speaks.

use marin3r_envoyconfig::resource::ResourceType;

/// Which ADS flavour a stream speaks (label of the stream gauge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Api {
    Sotw,
    Delta,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Sotw => "sotw",
            Api::Delta => "delta",
        }
    }
}

/// Something a stream observed. Node id and pod name are empty if the stream has not
/// learned its node yet (a client that omits `node` on its first message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// A discovery request arrived; `resource_type` is `None` for type URLs we do not
    /// serve.
    Request {
        node_id: String,
        pod_name: String,
        resource_type: Option<ResourceType>,
    },
    /// The client accepted `version` of `resource_type`.
    Ack {
        node_id: String,
        pod_name: String,
        resource_type: ResourceType,
        version: String,
    },
    /// The client rejected `version` (the version of the response it answers, not the
    /// `version_info` of the request, which is the last version it accepted).
    Nack {
        node_id: String,
        pod_name: String,
        resource_type: ResourceType,
        version: String,
        message: String,
    },
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Pod `pod` of node `n` accepted version `v` of `t`.
    pub(crate) fn ack(pod: &str, t: ResourceType, v: &str) -> StreamEvent {
        StreamEvent::Ack {
            node_id: "n".into(),
            pod_name: pod.into(),
            resource_type: t,
            version: v.into(),
        }
    }

    /// Pod `pod` of node `n` rejected version `v` of `t` with `msg`.
    pub(crate) fn nack(pod: &str, t: ResourceType, v: &str, msg: &str) -> StreamEvent {
        StreamEvent::Nack {
            node_id: "n".into(),
            pod_name: pod.into(),
            resource_type: t,
            version: v.into(),
            message: msg.into(),
        }
    }
}
