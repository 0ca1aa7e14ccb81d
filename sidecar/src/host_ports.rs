//! The one rule on host ports: a hostPort/protocol pair is declared at most once in a
//! Pod, whoever declared it first (an app container, an init container or the injected
//! Envoy). The API server rejects a Pod with two ports of the same hostPort and protocol
//! in its containers; an injected Envoy that takes a hostPort an app container already
//! has would make it reject the injected Pod, so injection denies it up front.
//!
//! The injected Envoy binds every host address (it declares no `hostIP`), so it clashes
//! with an app port of the same hostPort and protocol whatever that port's `hostIP`.

use std::fmt;

use marin3r_wire::quote::quoted;
use serde_json::Value;

/// One port of the Pod that takes a host port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPortUse {
    /// The host port.
    pub host_port: u16,
    /// The Kubernetes protocol (`TCP` when the port does not say).
    pub protocol: String,
    /// Who declares it, for the message (`container "app" (spec.containers[0].ports[1])`).
    pub declarer: String,
}

impl fmt::Display for HostPortUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "hostPort {}/{}", self.host_port, self.protocol)
    }
}

/// Every use that repeats the hostPort/protocol pair of an earlier one, with that
/// earlier (first) use: `(first, again)` indices into `uses`, in the order of `uses`.
pub fn clashes(uses: &[HostPortUse]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for (i, again) in uses.iter().enumerate() {
        if let Some(first) = uses[..i]
            .iter()
            .position(|u| u.host_port == again.host_port && u.protocol == again.protocol)
        {
            out.push((first, i));
        }
    }
    out
}

/// The message of one clash, naming the pair and both declarers.
pub fn clash_message(first: &HostPortUse, again: &HostPortUse) -> String {
    format!(
        "{again} is used by both {} and {}",
        first.declarer, again.declarer
    )
}

/// The host ports a container of `spec[list]` (at `index`) declares: each port's
/// `hostPort`, or with `hostNetwork` its `containerPort` when it has none (Kubernetes
/// defaults the one to the other there). A port the API server would reject by itself
/// (a number out of range) is left to it.
pub(crate) fn container_host_ports(
    list: &str,
    index: usize,
    container: &Value,
    host_network: bool,
) -> Vec<HostPortUse> {
    let name = container
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let number = |port: &Value, key: &str| {
        port.get(key)
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
    };
    container
        .get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(j, port)| {
            let host_port = number(port, "hostPort")
                .or_else(|| number(port, "containerPort").filter(|_| host_network))?;
            Some(HostPortUse {
                host_port,
                protocol: port
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_string(),
                declarer: format!(
                    "container {} (spec.{list}[{index}].ports[{j}])",
                    quoted(name)
                ),
            })
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    fn at(host_port: u16, protocol: &str, declarer: &str) -> HostPortUse {
        HostPortUse {
            host_port,
            protocol: protocol.into(),
            declarer: declarer.into(),
        }
    }

    #[test]
    fn a_pair_is_a_clash_only_with_the_same_port_and_protocol() {
        let uses = [
            at(30000, "TCP", "a"),
            at(30000, "UDP", "b"),
            at(30001, "TCP", "c"),
            at(30000, "TCP", "d"),
            at(30000, "TCP", "e"),
        ];
        let found: Vec<String> = clashes(&uses)
            .into_iter()
            .map(|(f, a)| clash_message(&uses[f], &uses[a]))
            .collect();
        assert_eq!(
            found,
            [
                "hostPort 30000/TCP is used by both a and d",
                "hostPort 30000/TCP is used by both a and e"
            ]
        );
    }
}
