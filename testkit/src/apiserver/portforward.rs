//! The Pod `portforward` subresource as the API server (and the kubelet behind it) serves
//! it to websocket clients such as kube's `Api::<Pod>::portforward`: the `GET` is upgraded
//! to a websocket with the `v4.channel.k8s.io` subprotocol; each forwarded port `i` has
//! a data channel `2i` and an error channel `2i+1`, every binary frame starts with its
//! channel byte, and the first frame of each channel carries the port number (2 bytes,
//! little-endian). The "Pod" side is a TCP address the test registered
//! ([`FakeApiServer::forward_pod_port`](super::FakeApiServer::forward_pod_port)); a port
//! with no address, or one that refuses the connection, gets a message on its error
//! channel and the websocket is closed, as the kubelet does.
//!
//! The response must be one `hyper::upgrade::on` accepts, so the upgrade runs over a real
//! HTTP/1 connection: an in-memory pipe with hyper's client on one end (its response is
//! what the `kube::Client` gets) and hyper's server on the other.

use std::net::SocketAddr;

use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::{Message, handshake::derive_accept_key, protocol::Role};

use super::error::ApiError;

/// The subprotocol the server picks (kube accepts v4 and v5; v4 is what port-forward
/// needs: channels and no close signal).
pub(crate) const PROTOCOL: &str = "v4.channel.k8s.io";

/// One port asked for and where the test said it leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Forward {
    pub(crate) port: u16,
    pub(crate) target: Option<SocketAddr>,
}

/// The `ports` query parameter (`18000` or `80,1234`, the form kube sends).
pub(crate) fn ports(param: Option<&str>) -> Result<Vec<u16>, ApiError> {
    let text = param
        .filter(|p| !p.is_empty())
        .ok_or_else(|| ApiError::bad_request("portforward: the ports parameter is required"))?;
    text.split(',')
        .map(|p| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| {
                    ApiError::bad_request(format!("portforward: invalid port {p:?} in ports"))
                })
        })
        .collect()
}

/// The `Sec-WebSocket-Key` of a websocket upgrade offering [`PROTOCOL`] (`400`
/// otherwise).
pub(crate) fn upgrade_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let offers_v4 = headers
        .get(header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|p| p.trim() == PROTOCOL));
    headers
        .get(header::SEC_WEBSOCKET_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|_| offers_v4)
        .map(str::to_string)
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "portforward needs a websocket upgrade offering {PROTOCOL}"
            ))
        })
}

/// Answers the upgrade request (its `headers`, its `key`: [`upgrade_key`]) with `101
/// Switching Protocols` and serves the forwarded ports behind it: the head of the
/// response, whose extensions carry hyper's pending upgrade (the body is empty).
pub(crate) async fn open(
    headers: &HeaderMap,
    key: String,
    forwards: Vec<Forward>,
) -> Result<http::response::Parts, Box<dyn std::error::Error + Send + Sync>> {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    // The server end: answers 101 and, once upgraded, bridges the ports.
    tokio::spawn(async move {
        let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
            let forwards = forwards.clone();
            let accept = derive_accept_key(key.as_bytes());
            async move {
                tokio::spawn(async move {
                    if let Ok(upgraded) = hyper::upgrade::on(request).await {
                        let socket = WebSocketStream::from_raw_socket(
                            TokioIo::new(upgraded),
                            Role::Server,
                            None,
                        )
                        .await;
                        bridge(socket, &forwards).await;
                    }
                });
                Response::builder()
                    .status(StatusCode::SWITCHING_PROTOCOLS)
                    .header(header::CONNECTION, "Upgrade")
                    .header(header::UPGRADE, "websocket")
                    .header(header::SEC_WEBSOCKET_ACCEPT, accept)
                    .header(header::SEC_WEBSOCKET_PROTOCOL, PROTOCOL)
                    .body(Empty::<Bytes>::new())
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server_io), service)
            .with_upgrades()
            .await;
    });
    // The client end: the same request again, so the response carries hyper's upgrade.
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(client_io)).await?;
    tokio::spawn(async move {
        let _ = connection.with_upgrades().await;
    });
    let mut request = Request::get("/portforward").body(Empty::<Bytes>::new())?;
    *request.headers_mut() = headers.clone();
    let response = sender.send_request(request).await?;
    Ok(response.into_parts().0)
}

/// The kubelet's side: the port frames, then bytes both ways per port until either end
/// closes; an unreachable port is reported on its error channel and ends the stream
/// (the server then waits for the client to go).
async fn bridge<S>(socket: WebSocketStream<S>, forwards: &[Forward])
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut stream) = socket.split();
    let mut tcp = Vec::with_capacity(forwards.len());
    for (i, forward) in forwards.iter().enumerate() {
        let data = channel(i, false);
        let port = forward.port.to_le_bytes();
        for ch in [data, data + 1] {
            if sink
                .send(Message::binary(vec![ch, port[0], port[1]]))
                .await
                .is_err()
            {
                return;
            }
        }
        let connected = match forward.target {
            Some(addr) => tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string()),
            None => Err("no address registered for this pod port".to_string()),
        };
        match connected {
            Ok(stream) => tcp.push(stream),
            Err(reason) => {
                let mut frame = vec![data + 1];
                frame.extend_from_slice(
                    format!("error forwarding port {} to pod: {reason}", forward.port).as_bytes(),
                );
                let _ = sink.send(Message::binary(frame)).await;
                let _ = sink.send(Message::Close(None)).await;
                // Read on until the client goes: closing first could fail its pending
                // writes before it has read the error.
                while stream.next().await.is_some_and(|m| m.is_ok()) {}
                return;
            }
        }
    }
    let (to_ws, mut from_tcp) = tokio::sync::mpsc::channel::<Message>(16);
    let mut writers = Vec::with_capacity(tcp.len());
    for (i, stream) in tcp.into_iter().enumerate() {
        let (mut read, write) = stream.into_split();
        writers.push(Some(write));
        let to_ws = to_ws.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut frame = Vec::with_capacity(n + 1);
                        frame.push(channel(i, false));
                        frame.extend_from_slice(&buf[..n]);
                        if to_ws.send(Message::binary(frame)).await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = to_ws.send(Message::Close(None)).await;
        });
    }
    drop(to_ws);
    loop {
        tokio::select! {
            out = from_tcp.recv() => match out {
                Some(message) => {
                    let close = message.is_close();
                    if sink.send(message).await.is_err() || close {
                        return;
                    }
                }
                None => return,
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Binary(bytes))) => {
                    let Some((&ch, data)) = bytes.split_first() else { continue };
                    let writer = (ch % 2 == 0)
                        .then(|| writers.get_mut(usize::from(ch / 2)))
                        .flatten()
                        .and_then(Option::as_mut);
                    if let Some(writer) = writer
                        && writer.write_all(data).await.is_err()
                    {
                        return;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => {
                    for writer in writers.iter_mut().filter_map(Option::take) {
                        let mut writer = writer;
                        let _ = writer.shutdown().await;
                    }
                    return;
                }
                Some(Ok(_)) => {}
            },
        }
    }
}

/// The data (or error) channel of the `i`th port.
fn channel(i: usize, error: bool) -> u8 {
    let data = u8::try_from(2 * i).unwrap_or(u8::MAX - 1);
    data + u8::from(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_a_comma_separated_list_of_nonzero_numbers() {
        assert_eq!(ports(Some("18000")).unwrap(), [18000]);
        assert_eq!(ports(Some("80,1234")).unwrap(), [80, 1234]);
        for bad in [
            None,
            Some(""),
            Some("0"),
            Some("x"),
            Some("70000"),
            Some("80,"),
        ] {
            assert_eq!(ports(bad).unwrap_err().code, 400, "{bad:?}");
        }
    }

    #[test]
    fn each_port_has_a_data_and_an_error_channel() {
        assert_eq!((channel(0, false), channel(0, true)), (0, 1));
        assert_eq!((channel(2, false), channel(2, true)), (4, 5));
    }
}
