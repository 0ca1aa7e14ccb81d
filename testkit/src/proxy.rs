//! A TCP load balancer for tests, standing in for a Kubernetes Service: it listens on
//! 127.0.0.1 (port 0), and each accepted connection is piped to one of the current
//! backends, round-robin, skipping a backend that refuses the connection (as kube-proxy
//! stops routing to a pod once its endpoint is gone). Backends can be replaced while it
//! runs; open connections are left alone. Bytes are copied as they are (TLS passes
//! through). The listener and every piped connection stop when the [`TcpBalancer`] is
//! dropped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running balancer; see the module docs.
#[derive(Debug)]
pub struct TcpBalancer {
    addr: SocketAddr,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl TcpBalancer {
    /// Starts a balancer over `backends`.
    pub async fn start(backends: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let backends = Arc::new(Mutex::new(backends));
        let accepted = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(serve(listener, backends.clone(), accepted.clone()));
        Self {
            addr,
            backends,
            accepted,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the backends (new connections only).
    pub fn set_backends(&self, backends: Vec<SocketAddr>) {
        *self.backends.lock().unwrap() = backends;
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for TcpBalancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    listener: TcpListener,
    backends: Arc<Mutex<Vec<SocketAddr>>>,
    accepted: Arc<AtomicUsize>,
) {
    let mut next = 0usize;
    let mut pipes = tokio::task::JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        accepted.fetch_add(1, Ordering::Relaxed);
        let candidates: Vec<SocketAddr> = backends.lock().unwrap().clone();
        let start = next;
        next = next.wrapping_add(1);
        pipes.spawn(async move {
            for i in 0..candidates.len() {
                let backend = candidates[(start + i) % candidates.len()];
                if let Ok(upstream) = TcpStream::connect(backend).await {
                    pipe(client, upstream).await;
                    return;
                }
            }
        });
        // Reap finished pipes so the set does not grow.
        while pipes.try_join_next().is_some() {}
    }
}

async fn pipe(mut client: TcpStream, mut upstream: TcpStream) {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    async fn echo_server(tag: u8) -> (SocketAddr, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1];
                    while s.read_exact(&mut buf).await.is_ok() {
                        if s.write_all(&[tag]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, task)
    }

    async fn ask(addr: SocketAddr) -> u8 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"?").await.unwrap();
        let mut buf = [0u8; 1];
        s.read_exact(&mut buf).await.unwrap();
        buf[0]
    }

    #[tokio::test]
    async fn connections_go_round_robin_and_skip_a_dead_backend() {
        let (a, _ta) = echo_server(b'a').await;
        let (b, tb) = echo_server(b'b').await;
        let lb = TcpBalancer::start(vec![a, b]).await;
        let mut seen = vec![ask(lb.addr()).await, ask(lb.addr()).await];
        seen.sort_unstable();
        assert_eq!(seen, b"ab");
        tb.abort();
        // b's listener is gone once its task is dropped; wait for the port to refuse.
        crate::wait_until_async("b refuses", std::time::Duration::from_secs(5), || async {
            TcpStream::connect(b).await.is_err()
        })
        .await;
        for _ in 0..4 {
            assert_eq!(
                ask(lb.addr()).await,
                b'a',
                "b refuses: a takes every connection"
            );
        }
        assert_eq!(lb.accepted(), 6);
        lb.set_backends(vec![]);
        let mut s = TcpStream::connect(lb.addr()).await.unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(s.read(&mut buf).await.unwrap(), 0, "no backend: closed");
    }
}
