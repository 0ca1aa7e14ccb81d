//! The client of a local-mode discovery service's `GET /status` and
//! `DELETE /status/revisions/{namespace}/{name}/{version}` (hyper). The report itself
//! (its JSON and how it is computed) is `marin3r_control_plane::status`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use marin3r_control_plane::status::{EnvoyConfigReport, StatusReport};

/// Errors of [`fetch`] and [`delete_revision`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "{url:?} is not a URL like http://127.0.0.1:{port} ({reason})",
        port = marin3r_wire::ports::METRICS
    )]
    InvalidUrl { url: String, reason: &'static str },
    #[error("{method} {url}: cannot talk to the discovery service")]
    Request {
        method: Method,
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{method} {url}: cannot read the answer")]
    Body {
        method: Method,
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("{method} {url}: no answer within {timeout:?}")]
    Timeout {
        method: Method,
        url: String,
        timeout: Duration,
    },
    #[error("{method} {path}: HTTP {status}: {body}")]
    Status {
        method: Method,
        path: String,
        status: u16,
        body: String,
    },
    #[error("{path}: the answer is not the status JSON")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// An `http://host[:port][/prefix]` URL split into authority and path prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    authority: String,
    prefix: String,
}

fn parse_url(url: &str) -> Result<Url, ClientError> {
    let invalid = |reason| ClientError::InvalidUrl {
        url: url.to_string(),
        reason,
    };
    if !url.starts_with("http://") {
        return Err(invalid("only http:// is supported"));
    }
    let uri: Uri = url.parse().map_err(|_| invalid("not a URL"))?;
    let authority = uri
        .authority()
        .filter(|a| !a.host().is_empty())
        .ok_or_else(|| invalid("no host"))?;
    if uri.query().is_some() {
        return Err(invalid("a query is not allowed"));
    }
    Ok(Url {
        authority: authority.to_string(),
        prefix: uri.path().trim_end_matches('/').to_string(),
    })
}

/// The CSDS address of the discovery service whose status is at `url`: its host and the
/// ADS port (`127.0.0.1:18000` for the default URL). `None` when `url` is not valid (its
/// error comes from [`fetch`]).
pub fn csds_address_of(url: &str) -> Option<String> {
    let base = parse_url(url).ok()?;
    let authority: hyper::http::uri::Authority = base.authority.parse().ok()?;
    Some(format!(
        "{}:{}",
        authority.host(),
        marin3r_wire::ports::XDSS
    ))
}

/// One request on a fresh client: the body of a 2xx answer. `timeout` bounds connecting,
/// sending and reading the whole answer.
async fn request(
    url: &str,
    method: Method,
    path: &str,
    timeout: Duration,
) -> Result<Bytes, ClientError> {
    let base = parse_url(url)?;
    let path = format!("{}{path}", base.prefix);
    let full = format!("http://{}{path}", base.authority);
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(timeout));
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let request = Request::builder()
        .method(method.clone())
        .uri(&full)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::new())
        .map_err(|_| ClientError::InvalidUrl {
            url: url.to_string(),
            reason: "not a URL",
        })?;
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|source| ClientError::Request {
                method: method.clone(),
                url: full.clone(),
                source,
            })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|source| ClientError::Body {
                method: method.clone(),
                url: full.clone(),
                source,
            })?
            .to_bytes();
        Ok((status, body))
    };
    let (status, body) = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ClientError::Timeout {
            method: method.clone(),
            url: full.clone(),
            timeout,
        })??;
    if status.is_success() {
        Ok(body)
    } else {
        Err(ClientError::Status {
            method: method.clone(),
            path,
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).trim().to_string(),
        })
    }
}

/// `GET {url}/status` of a local-mode discovery service.
pub async fn fetch(url: &str, timeout: Duration) -> Result<StatusReport, ClientError> {
    let body = request(url, Method::GET, "/status", timeout).await?;
    serde_json::from_slice(&body).map_err(|source| ClientError::Json {
        path: "/status".to_string(),
        source,
    })
}

/// `DELETE {url}/status/revisions/{namespace}/{name}/{version}`: the EnvoyConfig after
/// the deletion.
pub async fn delete_revision(
    url: &str,
    namespace: &str,
    name: &str,
    version: &str,
    timeout: Duration,
) -> Result<EnvoyConfigReport, ClientError> {
    let path = format!("/status/revisions/{namespace}/{name}/{version}");
    let body = request(url, Method::DELETE, &path, timeout).await?;
    serde_json::from_slice(&body).map_err(|source| ClientError::Json { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csds_address_is_the_status_host_on_the_ads_port() {
        assert_eq!(
            csds_address_of("http://127.0.0.1:8383").as_deref(),
            Some("127.0.0.1:18000")
        );
        assert_eq!(
            csds_address_of("http://ds.example:9/x").as_deref(),
            Some("ds.example:18000")
        );
        assert_eq!(
            csds_address_of("http://[::1]:8383").as_deref(),
            Some("[::1]:18000")
        );
        assert_eq!(csds_address_of("https://x"), None);
    }

    #[test]
    fn urls() {
        let u = parse_url("http://127.0.0.1:8383").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.prefix.as_str()),
            ("127.0.0.1:8383", "")
        );
        let u = parse_url("http://localhost/x/").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.prefix.as_str()),
            ("localhost", "/x")
        );
        let u = parse_url("http://[::1]").unwrap();
        assert_eq!(u.authority, "[::1]");
        let u = parse_url("http://[::1]:9/").unwrap();
        assert_eq!(u.authority, "[::1]:9");
        assert!(parse_url("https://x").is_err());
        assert!(parse_url("http://").is_err());
        assert!(
            parse_url("https://127.0.0.1:1")
                .unwrap_err()
                .to_string()
                .contains("only http://")
        );
    }

    /// A server that answers every connection with `answer` (raw bytes), once.
    async fn raw_server(answer: &'static [u8]) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).await.unwrap();
                if n == 0 {
                    return;
                }
                head.extend_from_slice(&buf[..n]);
            }
            stream.write_all(answer).await.unwrap();
            stream.shutdown().await.unwrap();
        });
        url
    }

    #[tokio::test]
    async fn chunked_answers_and_errors_are_decoded() {
        let url = raw_server(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n\
              3\r\n{\"e\r\n11;x=y\r\nnvoyConfigs\": []}\r\n0\r\n\r\n",
        )
        .await;
        let report = fetch(&url, Duration::from_secs(5)).await.unwrap();
        assert_eq!(report, StatusReport::default());

        let url = raw_server(
            b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nno re\r\n9\r\nvision x\n\r\n0\r\n\r\n",
        )
        .await;
        let err = delete_revision(&url, "default", "kuard", "x", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "DELETE /status/revisions/default/kuard/x: HTTP 404: no revision x"
        );

        let url = raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{]").await;
        let err = fetch(&url, Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, ClientError::Json { .. }), "{err}");
    }

    #[tokio::test]
    async fn a_silent_server_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let err = fetch(&url, Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, ClientError::Timeout { .. }), "{err}");
        drop(listener);
    }
}
