//! A small plain-HTTP client for the two Envoy admin calls the drain needs:
//! `POST /healthcheck/fail` and `GET /stats?filter=…`. Every call has a timeout.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::ShutdownManagerError;
use crate::stats::{STATS_PATH, open_connections};

/// Largest admin response body read (filtered stats are a few hundred bytes per listener).
const MAX_BODY: usize = 8 * 1024 * 1024;

/// A boxed admin call.
pub(crate) type AdminCall<'a, T> =
    Pin<Box<dyn Future<Output = Result<T, ShutdownManagerError>> + Send + 'a>>;

/// The two admin calls the drain makes; [`AdminClient`] in production, an in-memory fake
/// in the tests (which then run on tokio's paused clock, with no socket).
pub(crate) trait Admin: Send + Sync {
    /// The admin's base URL, for logs.
    fn base(&self) -> &str;
    /// `POST /healthcheck/fail`.
    fn fail_healthcheck(&self) -> AdminCall<'_, ()>;
    /// Open downstream connections on all non-admin listeners.
    fn open_connections(&self) -> AdminCall<'_, u64>;
}

impl Admin for AdminClient {
    fn base(&self) -> &str {
        AdminClient::base(self)
    }
    fn fail_healthcheck(&self) -> AdminCall<'_, ()> {
        Box::pin(AdminClient::fail_healthcheck(self))
    }
    fn open_connections(&self) -> AdminCall<'_, u64> {
        Box::pin(AdminClient::open_connections(self))
    }
}

/// Client for Envoy's admin API at one base address.
#[derive(Clone, Debug)]
pub struct AdminClient {
    base: String,
    timeout: Duration,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl AdminClient {
    /// A client for `address`, e.g. `http://localhost:9901` (the scheme may be omitted;
    /// only `http` is supported, as Envoy's admin listener is plain HTTP). `timeout` bounds
    /// each call, connect and body included.
    pub fn new(address: &str, timeout: Duration) -> Result<Self, ShutdownManagerError> {
        let base = normalize_base(address)?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1)
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            base,
            timeout,
            client,
        })
    }

    /// The normalised base URL (`http://host:port`, no trailing slash).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `POST /healthcheck/fail`: Envoy starts failing health checks, `/ready` answers 503
    /// and HTTP connections are closed after their current request (`connection: close`).
    pub async fn fail_healthcheck(&self) -> Result<(), ShutdownManagerError> {
        self.call(Method::POST, "/healthcheck/fail").await.map(drop)
    }

    /// Open downstream connections on all non-admin listeners, see
    /// [`crate::open_connections`].
    pub async fn open_connections(&self) -> Result<u64, ShutdownManagerError> {
        let body = self.call(Method::GET, STATS_PATH).await?;
        let text = std::str::from_utf8(&body).map_err(|_| ShutdownManagerError::InvalidStats {
            line: 0,
            content: String::new(),
            reason: "response is not UTF-8".to_string(),
        })?;
        open_connections(text)
    }

    async fn call(&self, method: Method, path: &str) -> Result<Bytes, ShutdownManagerError> {
        let url = format!("{}{}", self.base, path);
        match tokio::time::timeout(self.timeout, self.call_inner(method, &url)).await {
            Ok(result) => result,
            Err(_) => Err(ShutdownManagerError::AdminTimeout {
                url,
                timeout: self.timeout,
            }),
        }
    }

    async fn call_inner(&self, method: Method, url: &str) -> Result<Bytes, ShutdownManagerError> {
        let request = Request::builder()
            .method(method)
            .uri(url)
            .body(Empty::<Bytes>::new())
            .map_err(|e| ShutdownManagerError::InvalidAdminAddress {
                address: url.to_string(),
                reason: e.to_string(),
            })?;
        let response = self.client.request(request).await.map_err(|source| {
            ShutdownManagerError::AdminRequest {
                url: url.to_string(),
                source: Box::new(source),
            }
        })?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|source| ShutdownManagerError::AdminRequest {
                url: url.to_string(),
                source,
            })?
            .to_bytes();
        if !status.is_success() {
            return Err(ShutdownManagerError::AdminStatus {
                url: url.to_string(),
                status: status.as_u16(),
                body: String::from_utf8_lossy(&body).chars().take(200).collect(),
            });
        }
        Ok(body)
    }
}

/// `localhost:9901`, `http://localhost:9901/` → `http://localhost:9901`.
fn normalize_base(address: &str) -> Result<String, ShutdownManagerError> {
    let invalid = |reason: &str| ShutdownManagerError::InvalidAdminAddress {
        address: address.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = address.trim();
    let with_scheme = if trimmed.contains("://") {
        trimmed.to_string()
    } else {
        format!("http://{trimmed}")
    };
    let uri: Uri = with_scheme
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| invalid(&format!("not a URL: {e}")))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(invalid(&format!(
                "unsupported scheme {other:?}: Envoy's admin is plain http"
            )));
        }
        None => return Err(invalid("missing scheme")),
    }
    let Some(authority) = uri.authority() else {
        return Err(invalid("missing host"));
    };
    if authority.host().is_empty() {
        return Err(invalid("missing host"));
    }
    // The port as written (`Authority::port` drops one that does not fit in a u16).
    let text = authority.as_str();
    let after_host = text.rsplit_once(']').map_or(text, |(_, rest)| rest);
    if let Some((_, port)) = after_host.rsplit_once(':')
        && !port.parse::<u16>().is_ok_and(|p| p > 0)
    {
        return Err(invalid(&format!("port {port} is out of range (1-65535)")));
    }
    if uri.query().is_some() {
        return Err(invalid("a query is not allowed"));
    }
    let path = uri.path().trim_end_matches('/');
    Ok(format!("http://{authority}{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_ports_out_of_range_are_refused() {
        for address in ["127.0.0.1:99999", "http://127.0.0.1:0", "localhost:65536"] {
            let err = normalize_base(address).unwrap_err().to_string();
            assert!(err.contains("out of range"), "{address}: {err}");
        }
        assert_eq!(
            normalize_base("127.0.0.1:65535").unwrap(),
            "http://127.0.0.1:65535"
        );
    }

    #[test]
    fn normalizes_admin_addresses() {
        for (input, want) in [
            ("http://localhost:9901", "http://localhost:9901"),
            ("http://localhost:9901/", "http://localhost:9901"),
            ("localhost:9901", "http://localhost:9901"),
            (" 127.0.0.1:19000 ", "http://127.0.0.1:19000"),
            ("http://[::1]:9901", "http://[::1]:9901"),
            ("http://envoy/admin/", "http://envoy/admin"),
        ] {
            assert_eq!(normalize_base(input).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn rejects_bad_admin_addresses() {
        for bad in [
            "",
            "https://localhost:9901",
            "http://",
            "http://localhost:9901/?x=1",
            "not a url",
        ] {
            assert!(normalize_base(bad).is_err(), "{bad:?}");
        }
    }
}
