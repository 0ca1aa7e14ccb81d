//! Free TCP ports.

use std::net::TcpListener;

/// A free TCP port on 127.0.0.1: bound, then released. Another bind may take it before
/// the caller does; prefer binding port 0 and reading the address wherever the code
/// under test accepts a listener.
pub fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
