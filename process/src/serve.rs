//! The one runner of every long-running process: probe and metrics servers around the
//! process's main work, and a shutdown bounded by the process's grace.

use std::future::Future;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::{Error, HttpLimits, Readiness, Stopping, probe_router, serve_http};

/// How long the probe and metrics servers may take to close their connections once the
/// main work has ended; a client still connected after that is cut off. Their answers
/// are small, so this only ever matters for a client that stopped reading or writing.
pub const HTTP_STOP_GRACE: Duration = Duration::from_secs(1);

/// A long-running process (webhook, discovery service, operator): its probe and metrics
/// listeners, its readiness and how long it may take to stop. [`Process::serve`] runs
/// it.
#[derive(Debug)]
pub struct Process {
    /// Names the process in logs.
    pub name: &'static str,
    /// `/healthz` and `/readyz` ([`probe_router`] over [`Process::readiness`]).
    pub health: TcpListener,
    /// The metrics listener.
    pub metrics: TcpListener,
    /// What the metrics listener serves: [`crate::metrics_router`], plus any extra routes
    /// (local mode's `/status`).
    pub metrics_routes: Router,
    /// The process's readiness; the process sets it synced, [`Process::serve`] sets it
    /// stopping.
    pub readiness: Readiness,
    /// How long the main work may take to stop after the shutdown signal.
    pub grace: Duration,
}

impl Process {
    /// Serves the probes and metrics, and runs `main` until it ends or `shutdown`
    /// completes.
    ///
    /// On `shutdown`: not ready at once (`/readyz` 503, and whatever follows
    /// [`Readiness::subscribe`]), then `main`'s [`Stopping`] completes, and `main` gets
    /// [`grace`](Process::grace) to end; past it, it is dropped (every future it awaits
    /// is cancelled) with a warning. Then the probe and metrics servers stop (at most
    /// [`HTTP_STOP_GRACE`]), so the whole shutdown takes at most `grace` +
    /// `HTTP_STOP_GRACE`, whatever `main` waits on (an API server that never answers, a
    /// client that never sends).
    ///
    /// If `main` ends by itself (an error, or its work is done), the servers stop too
    /// and its result is returned. Errors: `main`'s first, then the probe server's, then
    /// the metrics server's ([`Error::Serve`]).
    pub async fn serve<E, Main, Fut>(
        self,
        shutdown: impl Future<Output = ()>,
        main: Main,
    ) -> Result<(), E>
    where
        Main: FnOnce(Stopping) -> Fut,
        Fut: Future<Output = Result<(), E>>,
        E: From<Error>,
    {
        let Process {
            name,
            health,
            metrics,
            metrics_routes,
            readiness,
            grace,
        } = self;
        let (stop_servers, servers_stopping) = tokio::sync::watch::channel(false);
        let stopped = || {
            let mut servers_stopping = servers_stopping.clone();
            async move {
                let _ = servers_stopping.wait_for(|stop| *stop).await;
            }
        };
        // Both bounded like every plain-HTTP listener (`serve_http`).
        let health = tokio::spawn(serve_http(
            health,
            probe_router(readiness.clone()),
            HttpLimits::DEFAULT,
            stopped(),
        ));
        let metrics = tokio::spawn(serve_http(
            metrics,
            metrics_routes,
            HttpLimits::DEFAULT,
            stopped(),
        ));

        let result = run_main(
            name,
            &readiness,
            grace,
            shutdown,
            main(readiness.stopping()),
        )
        .await;
        readiness.set_stopping();
        let _ = stop_servers.send(true);
        let (health, metrics) = tokio::join!(
            stop_server("health probe", health),
            stop_server("metrics", metrics)
        );
        result?;
        health?;
        metrics?;
        Ok(())
    }
}

/// Runs `main` until it ends, or until `shutdown` and then at most `grace`. `main` is
/// dropped when this returns.
async fn run_main<E>(
    name: &'static str,
    readiness: &Readiness,
    grace: Duration,
    shutdown: impl Future<Output = ()>,
    main: impl Future<Output = Result<(), E>>,
) -> Result<(), E> {
    let mut main = std::pin::pin!(main);
    tokio::select! {
        result = &mut main => {
            tracing::info!(process = name, ok = result.is_ok(), "stopped by itself");
            result
        }
        () = shutdown => {
            readiness.set_stopping();
            tracing::info!(process = name, ?grace, "shutting down");
            match tokio::time::timeout(grace, main).await {
                Ok(result) => {
                    tracing::info!(process = name, "stopped");
                    result
                }
                Err(_) => {
                    tracing::warn!(process = name, ?grace, "did not stop within its grace; aborted");
                    Ok(())
                }
            }
        }
    }
}

/// Waits (at most [`HTTP_STOP_GRACE`]) for a probe or metrics server told to stop.
async fn stop_server(server: &'static str, mut task: JoinHandle<()>) -> Result<(), Error> {
    match tokio::time::timeout(HTTP_STOP_GRACE, &mut task).await {
        Ok(joined) => joined.map_err(|e| Error::Serve {
            server,
            source: std::io::Error::other(e),
        }),
        Err(_) => {
            task.abort();
            tracing::warn!(server, grace = ?HTTP_STOP_GRACE, "connections still open; closed");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::time::Instant;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum TestError {
        #[error(transparent)]
        Process(#[from] Error),
        #[error("the main work failed")]
        Failed,
    }

    async fn process(readiness: &Readiness, grace: Duration) -> (Process, SocketAddr) {
        let health = crate::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = health.local_addr().unwrap();
        let process = Process {
            name: "test",
            health,
            metrics: crate::bind("127.0.0.1:0".parse().unwrap()).await.unwrap(),
            metrics_routes: Router::new(),
            readiness: readiness.clone(),
            grace,
        };
        (process, addr)
    }

    /// Sets its flag when dropped (the main work was cancelled or ended).
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_main_work_is_told_to_stop_once_not_ready() {
        let readiness = Readiness::new();
        readiness.set_synced();
        let (process, _) = process(&readiness, Duration::from_secs(30)).await;
        let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
        let seen = readiness.clone();
        let task = tokio::spawn(process.serve(
            async move {
                let _ = signalled.await;
            },
            |stopping| async move {
                assert!(!stopping.is_stopping());
                stopping.wait().await;
                assert!(!seen.is_ready(), "told to stop while still ready");
                Ok::<(), TestError>(())
            },
        ));
        tokio::task::yield_now().await;
        assert!(readiness.is_ready());
        let start = Instant::now();
        signal.send(()).unwrap();
        task.await.unwrap().unwrap();
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "nothing waited for a timer"
        );
        assert!(!readiness.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_main_work_that_does_not_stop_is_dropped_after_its_grace() {
        let readiness = Readiness::new();
        let grace = Duration::from_secs(7);
        let (process, _) = process(&readiness, grace).await;
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let start = Instant::now();
        let result = process
            .serve(std::future::ready(()), |_stopping| async move {
                let _flag = flag;
                // Like a request to an API server that never answers.
                std::future::pending::<Result<(), TestError>>().await
            })
            .await;
        result.unwrap();
        assert_eq!(start.elapsed(), grace);
        assert!(
            dropped.load(Ordering::Acquire),
            "the main work was not cancelled"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_main_work_that_fails_stops_the_servers_and_returns_its_error() {
        let readiness = Readiness::new();
        readiness.set_synced();
        let (process, _) = process(&readiness, Duration::from_secs(30)).await;
        let result = process
            .serve(std::future::pending(), |_stopping| async {
                Err::<(), _>(TestError::Failed)
            })
            .await;
        assert!(matches!(result, Err(TestError::Failed)), "{result:?}");
        assert!(!readiness.is_ready(), "a process that ended is not ready");
    }

    /// A running [`Process`] whose main work waits for the shutdown: the signal, the
    /// health and metrics addresses, the task.
    async fn running() -> (
        tokio::sync::oneshot::Sender<()>,
        [SocketAddr; 2],
        JoinHandle<Result<(), TestError>>,
    ) {
        let readiness = Readiness::new();
        let (process, health) = process(&readiness, Duration::from_secs(30)).await;
        let metrics = process.metrics.local_addr().unwrap();
        let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(process.serve(
            async move {
                let _ = signalled.await;
            },
            |stopping| async move {
                stopping.wait().await;
                Ok::<(), TestError>(())
            },
        ));
        (signal, [health, metrics], task)
    }

    /// The probe and metrics listeners of every process (webhook, discovery service,
    /// operator): each accepted socket has `TCP_NODELAY`, seen from the server's side.
    #[tokio::test]
    async fn probe_and_metrics_connections_have_tcp_nodelay() {
        let (signal, addrs, task) = running().await;
        for addr in addrs {
            let conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            let from = conn.local_addr().unwrap();
            assert!(
                marin3r_testkit::sockets::server_side_nodelay(addr, from).await,
                "{addr}"
            );
        }
        signal.send(()).unwrap();
        task.await.unwrap().unwrap();
    }

    /// Both are bounded like every plain-HTTP listener: a connection that sends no
    /// headers is closed after [`crate::HTTP_HEADER_READ_TIMEOUT`].
    #[tokio::test(start_paused = true)]
    async fn probe_and_metrics_connections_without_headers_are_closed() {
        use tokio::io::AsyncReadExt as _;
        let (signal, addrs, task) = running().await;
        for addr in addrs {
            let started = Instant::now();
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            let read = tokio::time::timeout(Duration::from_secs(60), conn.read(&mut [0; 1]))
                .await
                .expect("a connection without headers was kept");
            assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
            assert_eq!(started.elapsed(), crate::HTTP_HEADER_READ_TIMEOUT, "{addr}");
        }
        signal.send(()).unwrap();
        task.await.unwrap().unwrap();
    }

    /// Real sockets: `/readyz` answers 503 while the main work stops, `/healthz` 200;
    /// once the process returned, the probe port is closed.
    #[tokio::test]
    async fn probes_answer_not_ready_while_the_main_work_stops() {
        use marin3r_testkit::http::get;
        let readiness = Readiness::new();
        let (process, health) = process(&readiness, Duration::from_secs(3600)).await;
        let (signal, signalled) = tokio::sync::oneshot::channel::<()>();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let synced = readiness.clone();
        let task = tokio::spawn(process.serve(
            async move {
                let _ = signalled.await;
            },
            |stopping| async move {
                synced.set_synced();
                stopping.wait().await;
                let _ = stopping_tx.send(());
                // Still stopping (draining) until the test lets it end.
                let _ = released.await;
                Ok::<(), TestError>(())
            },
        ));
        marin3r_testkit::wait_until_async("ready", Duration::from_secs(10), || async {
            get(health, "/readyz").await.is_ok_and(|r| r.status == 200)
        })
        .await;

        signal.send(()).unwrap();
        stopping_rx.await.unwrap();
        let readyz = get(health, "/readyz").await.unwrap();
        assert_eq!((readyz.status, readyz.body.as_str()), (503, "not ready"));
        assert_eq!(get(health, "/healthz").await.unwrap().status, 200);

        release.send(()).unwrap();
        task.await.unwrap().unwrap();
        assert!(
            get(health, "/healthz").await.is_err(),
            "the probe port is closed"
        );
    }
}
