//! The server's side of a test connection, when the server runs in the test's process:
//! found among the process's file descriptors by its addresses and duplicated with
//! `pidfd_getfd(2)` (Linux 5.6), so a test can read the options the server set on the
//! socket it accepted — whatever server, acceptor or TLS layer sits on top. On the real
//! clock only (the paused clock would run its polls' deadline out at once).
#![allow(clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};

/// The socket of this process whose local address is `server` and peer `client` (the
/// client's local address): the server's side of that connection, as a duplicate
/// (dropping it leaves the server's socket open). `None` while there is none (not
/// accepted yet, or already closed).
pub fn accepted_socket(
    server: SocketAddr,
    client: SocketAddr,
) -> std::io::Result<Option<std::net::TcpStream>> {
    let pidfd = pidfd_open(getpid(), PidfdFlags::empty())?;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // Closed meanwhile (another test's socket): not ours.
        let Ok(duplicate) = pidfd_getfd(&pidfd, fd, PidfdGetfdFlags::empty()) else {
            continue;
        };
        let socket = std::net::TcpStream::from(duplicate);
        if socket.local_addr().ok() == Some(server) && socket.peer_addr().ok() == Some(client) {
            return Ok(Some(socket));
        }
    }
    Ok(None)
}

/// Whether the server at `server` (in this process) set `TCP_NODELAY` on the socket it
/// accepted for the connection from `client`: polls (the server sets it right after
/// `accept`) until it is set, or for at most 10 s; `false` if it never was.
///
/// # Panics
/// If the server never accepted the connection within those 10 s, or the process's
/// descriptors cannot be read.
pub async fn server_side_nodelay(server: SocketAddr, client: SocketAddr) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = None;
    loop {
        let socket = accepted_socket(server, client).expect("reading this process's sockets");
        if let Some(socket) = socket {
            let nodelay = socket.nodelay().expect("reading TCP_NODELAY");
            if nodelay {
                return true;
            }
            seen = Some(nodelay);
        }
        if tokio::time::Instant::now() >= deadline {
            return seen.unwrap_or_else(|| {
                panic!("{server} accepted no connection from {client} within 10 s")
            });
        }
        tokio::time::sleep(crate::wait::POLL).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[tokio::test]
    async fn finds_the_server_side_of_a_connection_and_its_nodelay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = listener.local_addr().unwrap();
        let client = tokio::net::TcpStream::connect(server).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let from = client.local_addr().unwrap();
        let found = super::accepted_socket(server, from).unwrap().unwrap();
        assert_eq!(found.peer_addr().unwrap(), from);
        assert!(!found.nodelay().unwrap(), "the OS default is Nagle on");
        accepted.set_nodelay(true).unwrap();
        assert!(super::server_side_nodelay(server, from).await);
        // The client's own socket is not taken for the server's.
        assert!(super::accepted_socket(from, server).unwrap().is_some());
        drop((found, accepted));
        assert!(super::accepted_socket(server, from).unwrap().is_none());
    }
}
