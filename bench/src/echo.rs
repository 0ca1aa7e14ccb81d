//! The baseline: a bare rustls HTTPS echo server with the webhook's rustls
//! `ServerConfig` (`marin3r_certs::server_config`: ring, TLS 1.2 + 1.3, the same reloading
//! certificate resolver; ALPN http/1.1, which is also all the load generator offers),
//! HTTP/1.1 keep-alive (hyper), answering every request with its body. What is left
//! between it and the webhook is the admission work itself (and axum's routing).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// An echo server on 127.0.0.1 (port 0); stops accepting when dropped.
pub struct EchoServer {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn echo(req: hyper::Request<Incoming>) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let mut resp = hyper::Response::new(Full::new(body));
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

impl EchoServer {
    /// Serves on the current runtime with the certificate and key files.
    pub async fn start(cert: &Path, key: &Path) -> Result<Self> {
        let tls = marin3r_certs::server_config(cert, key, &[b"http/1.1"])
            .context("echo server TLS config")?;
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let _ = tcp.set_nodelay(true);
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service_fn(echo))
                        .await;
                });
            }
        });
        Ok(Self { addr, task })
    }
}
