//! An HTTP/1.1 client on hyper for tests: one request on a fresh connection (plain TCP, or
//! any stream such as a TLS one), the whole answer read. Errors are `String`s meant for a
//! human (a harness can report them; a test unwraps them).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
pub use http::{HeaderMap, Method};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Default bound of one exchange (connect, request, whole body).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// An answer, body decoded as (lossy) UTF-8.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Response {
    /// The value of header `name` (case-insensitive), if present and visible ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// True when the server announced it closes the connection (`connection: close`).
    pub fn connection_close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    /// Reads a hyper response whole (for callers that use their own hyper client, e.g. a
    /// keep-alive pool).
    pub async fn read(response: hyper::Response<hyper::body::Incoming>) -> Result<Self, String> {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("read the body: {e}"))?
            .to_bytes();
        Ok(Self {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }
}

/// One request: method, path, headers, optional body, timeout.
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    path: String,
    host: Option<String>,
    headers: Vec<(String, String)>,
    body: Bytes,
    timeout: Duration,
}

impl Request {
    /// `method path`, no body, [`TIMEOUT`].
    pub fn new(method: Method, path: &str) -> Self {
        Self {
            method,
            path: path.to_string(),
            host: None,
            headers: Vec::new(),
            body: Bytes::new(),
            timeout: TIMEOUT,
        }
    }

    /// `GET path`.
    pub fn get(path: &str) -> Self {
        Self::new(Method::GET, path)
    }

    /// `POST path` with `body` as `application/json`.
    pub fn post_json(path: &str, body: impl Into<Bytes>) -> Self {
        Self::new(Method::POST, path)
            .header("content-type", "application/json")
            .body(body)
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// The body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// The `host` header (default: the address connected to).
    pub fn host(mut self, host: &str) -> Self {
        self.host = Some(host.to_string());
        self
    }

    /// Bound of the whole exchange (default [`TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends the request on a fresh TCP connection to `addr`.
    pub async fn send(self, addr: SocketAddr) -> Result<Response, String> {
        let what = self.describe(&addr.to_string());
        let timeout = self.timeout;
        let exchange = async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connect {addr}: {e}"))?;
            self.exchange(stream, &addr.to_string()).await
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("{what}: no answer within {timeout:?}"))?
    }

    /// Sends the request over an established stream (e.g. after a TLS handshake).
    pub async fn send_over<I>(self, io: I) -> Result<Response, String>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let what = self.describe("stream");
        let timeout = self.timeout;
        tokio::time::timeout(timeout, self.exchange(io, "localhost"))
            .await
            .map_err(|_| format!("{what}: no answer within {timeout:?}"))?
    }

    /// [`Request::send`] for synchronous callers, on a runtime of its own. Not from
    /// inside a tokio runtime.
    pub fn send_blocking(self, addr: SocketAddr) -> Result<Response, String> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("tokio runtime: {e}"))?
            .block_on(self.send(addr))
    }

    fn describe(&self, target: &str) -> String {
        format!("{} {target}{}", self.method, self.path)
    }

    async fn exchange<I>(self, io: I, default_host: &str) -> Result<Response, String>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let what = self.describe(default_host);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("{what}: handshake: {e}"))?;
        tokio::spawn(conn);
        let mut builder = hyper::Request::builder()
            .method(self.method)
            .uri(self.path.as_str())
            .header("host", self.host.as_deref().unwrap_or(default_host));
        for (name, value) in &self.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let request = builder
            .body(Full::new(self.body))
            .map_err(|e| format!("{what}: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        Response::read(response).await
    }
}

/// `GET path` on a fresh TCP connection to `addr`.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Response, String> {
    Request::get(path).send(addr).await
}

/// `GET path` for synchronous callers, see [`Request::send_blocking`].
pub fn get_blocking(addr: SocketAddr, path: &str) -> Result<Response, String> {
    Request::get(path).send_blocking(addr)
}

/// Splits `http://host:port/path` into the socket address and the path (`/` if none).
pub fn split_url(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: not an http:// URL"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr = authority
        .parse()
        .map_err(|e| format!("{url}: {authority} is not ip:port: {e}"))?;
    let path = if path.is_empty() { "/" } else { path };
    Ok((addr, path.to_string()))
}

/// `GET url` (`http://ip:port/path`) on a fresh connection.
pub async fn get_url(url: &str) -> Result<Response, String> {
    let (addr, path) = split_url(url)?;
    get(addr, &path).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A one-shot server that records the request head and answers `answer`.
    async fn serve_once(answer: &'static str) -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let mut seen = Vec::new();
            while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                seen.extend_from_slice(&buf[..n]);
            }
            s.write_all(answer.as_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
            String::from_utf8_lossy(&seen).into_owned()
        });
        (addr, task)
    }

    #[tokio::test]
    async fn get_reads_status_headers_and_a_chunked_body() {
        let (addr, server) = serve_once(
            "HTTP/1.1 503 Service Unavailable\r\nx-a: b\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .await;
        let r = get(addr, "/ready").await.unwrap();
        assert_eq!((r.status, r.body.as_str()), (503, "abcde"));
        assert_eq!(r.header("x-a"), Some("b"));
        assert!(r.connection_close());
        let head = server.await.unwrap();
        assert!(head.starts_with("GET /ready HTTP/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: {addr}")), "{head}");
    }

    #[tokio::test]
    async fn requests_carry_method_headers_and_body() {
        let (addr, server) = serve_once("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        let r = Request::post_json("/x", "{}")
            .host("example")
            .send(addr)
            .await
            .unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
        let head = server.await.unwrap();
        assert!(head.starts_with("POST /x HTTP/1.1\r\n"), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains("host: example"), "{head}");
    }

    #[test]
    fn blocking_get() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            use std::io::{Read as _, Write as _};
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
                .unwrap();
        });
        let r = get_blocking(addr, "/").unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hi"));
        server.join().unwrap();
    }

    #[test]
    fn urls() {
        assert_eq!(
            split_url("http://127.0.0.1:8090/drain").unwrap(),
            ("127.0.0.1:8090".parse().unwrap(), "/drain".to_string())
        );
        assert_eq!(split_url("http://127.0.0.1:1").unwrap().1, "/");
        assert!(split_url("https://x").is_err());
    }

    #[tokio::test]
    async fn refused_connections_are_errors() {
        let port = crate::free_port().unwrap();
        let e = get(SocketAddr::from(([127, 0, 0, 1], port)), "/")
            .await
            .unwrap_err();
        assert!(e.starts_with("connect "), "{e}");
    }
}
