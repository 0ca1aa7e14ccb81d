//! The fake API server ([`FakeApiServer`], in this process) on a TCP socket, plain
//! HTTP/1.1 on 127.0.0.1, and a kubeconfig naming it: what a `marin3r discovery-service`
//! child process in Kubernetes mode needs to talk to it (`KUBECONFIG`). Every request is
//! handed to the server's `tower::Service` as it came; watches stream.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context as _, Result};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use marin3r_testkit::apiserver::{FakeApiServer, ResponseBody};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::Service as _;

/// The listening server; the accept loop (and with it every connection task) stops on
/// drop.
pub struct HttpApiServer {
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
}

impl Drop for HttpApiServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl HttpApiServer {
    /// Serves `api` on 127.0.0.1 (a free port) from tasks of `runtime`.
    pub async fn start(api: FakeApiServer, runtime: &tokio::runtime::Handle) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the fake API server's HTTP port")?;
        let addr = listener.local_addr()?;
        let spawner = runtime.clone();
        let accept = runtime.spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let api = api.clone();
                let service =
                    hyper::service::service_fn(move |request| handle(api.clone(), request));
                connections.spawn_on(
                    async move {
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tcp), service)
                            .await;
                    },
                    &spawner,
                );
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self { addr, accept })
    }

    /// A kubeconfig whose current context is this server (namespace `namespace`).
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            self.addr
        )
    }

    /// Writes [`HttpApiServer::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path, namespace: &str) -> Result<()> {
        std::fs::write(path, self.kubeconfig(namespace))
            .with_context(|| format!("write {}", path.display()))
    }
}

/// Hands `request` (its body read) to the fake server's service.
async fn handle(
    api: FakeApiServer,
    request: hyper::Request<Incoming>,
) -> Result<hyper::Response<ResponseBody>, std::io::Error> {
    let (parts, body) = request.into_parts();
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Err(std::io::Error::other(e)),
    };
    let request = hyper::Request::from_parts(parts, kube::client::Body::from(bytes));
    api.service()
        .call(request)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
}
