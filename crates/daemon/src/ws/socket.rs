//! The WebSocket connection under the protocol: the upgrade of `/ws` (RFC 6455 §4.2) and the
//! writing of messages, a big one in fragments (§5.4).
//!
//! The daemon drives tokio-tungstenite itself rather than through axum's `WebSocket`, because
//! axum's `Message` cannot say "a fragment". tungstenite copies each frame whole into the
//! connection's write buffer, never shrinks that buffer, and removes what the socket took from
//! its front: a 4.6 MB `session_state` left every connection it was sent to holding 4.6 MB
//! until it closed, and to a slow reader each partial write moved the rest of the message
//! (quadratic in its size). A message longer than [`FRAGMENT`] goes out as a text frame
//! without FIN and continuation frames of at most [`FRAGMENT`] bytes each, the last with FIN;
//! every client (browsers, tungstenite) hands its reader the message whole. The write buffer
//! then holds at most [`WRITE_BUFFER`] and one fragment (its allocation stays under 256 KiB),
//! and a partial write moves at most that much. No setting of `WebSocketConfig` does this:
//! `max_write_buffer_size` refuses a frame larger than itself (`WriteBufferFull`) rather than
//! splitting it, and nothing shrinks the buffer.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use futures_util::{Sink, SinkExt};
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Bytes, Message, Utf8Bytes};

/// One client's connection.
pub(crate) type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// The longest frame the daemon writes: a longer message goes out in fragments this size.
pub(crate) const FRAGMENT: usize = 64 * 1024;

/// How much the write buffer gathers before it writes to the socket (tungstenite's default,
/// what axum used): small messages ready together leave in few segments.
pub(crate) const WRITE_BUFFER: usize = 128 * 1024;

/// The connection's limits: a client's message or frame at most `MAX_CLIENT_FRAME` (1009
/// past it), reads of [`super::READ_BUFFER`].
pub(crate) fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .read_buffer_size(super::READ_BUFFER)
        .write_buffer_size(WRITE_BUFFER)
        .max_message_size(Some(drover_protocol::MAX_CLIENT_FRAME))
        .max_frame_size(Some(drover_protocol::MAX_CLIENT_FRAME))
}

/// Why an upgrade request was refused: its status and what the answer says.
#[derive(Debug)]
pub(crate) struct Refused(StatusCode, &'static str);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        (
            self.0,
            Json(json!({"error": {"code": "bad_upgrade", "message": self.1}})),
        )
            .into_response()
    }
}

/// Checks an upgrade request (HTTP/1.1: `GET`, `Connection: upgrade`, `Upgrade: websocket`,
/// `Sec-WebSocket-Version: 13`, a key) and takes its connection: the `101` to answer with and
/// what yields the connection once it is sent, or the refusal.
pub(crate) fn accept(request: &mut Request) -> Result<(Response, OnUpgrade), Refused> {
    let headers = request.headers();
    if request.method() != axum::http::Method::GET {
        return Err(Refused(
            StatusCode::METHOD_NOT_ALLOWED,
            "a WebSocket upgrade is a `GET`",
        ));
    }
    if !has_token(headers, header::CONNECTION, "upgrade") {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            "`/ws` is a WebSocket: `Connection: upgrade` is missing",
        ));
    }
    if !has_token(headers, header::UPGRADE, "websocket") {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            "`/ws` is a WebSocket: `Upgrade: websocket` is missing",
        ));
    }
    if !has_token(headers, header::SEC_WEBSOCKET_VERSION, "13") {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            "this daemon speaks WebSocket version 13 (`Sec-WebSocket-Version: 13`)",
        ));
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err(Refused(
            StatusCode::BAD_REQUEST,
            "`Sec-WebSocket-Key` is missing",
        ));
    };
    let accept_key = derive_accept_key(key.as_bytes());
    let Some(on_upgrade) = request.extensions_mut().remove::<OnUpgrade>() else {
        return Err(Refused(
            StatusCode::UPGRADE_REQUIRED,
            "this connection cannot be upgraded",
        ));
    };
    let response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, HeaderValue::from_static("upgrade"))
        .header(header::UPGRADE, HeaderValue::from_static("websocket"))
        .header(header::SEC_WEBSOCKET_ACCEPT, accept_key)
        .body(Body::empty())
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    Ok((response, on_upgrade))
}

/// Whether one of the `name` headers lists `token` (case-insensitive, comma-separated).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|value| {
        value
            .to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// The connection, once the `101` has gone out.
pub(crate) async fn open(on_upgrade: OnUpgrade) -> Option<Socket> {
    let upgraded = on_upgrade.await.ok()?;
    Some(
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config()))
            .await,
    )
}

/// Writes `text` into the socket's buffer (which writes to the socket past [`WRITE_BUFFER`]),
/// in fragments when it is longer than [`FRAGMENT`]; `flush` sends the rest.
pub(crate) async fn feed<S>(socket: &mut S, text: Utf8Bytes) -> Result<(), tungstenite::Error>
where
    S: Sink<Message, Error = tungstenite::Error> + Unpin,
{
    if text.len() <= FRAGMENT {
        return socket.feed(Message::Text(text)).await;
    }
    for frame in fragments(text) {
        // Each waits for the buffer to be written out if the socket was full at the last.
        socket.feed(Message::Frame(frame)).await?;
    }
    Ok(())
}

/// `text` as a text frame without FIN and continuation frames, the last with FIN, each of at
/// most [`FRAGMENT`] bytes and cut between characters (the protocol allows a cut inside one,
/// but a client that checks each frame's UTF-8 on its own then never errs). The frames share
/// `text`'s bytes.
fn fragments(text: Utf8Bytes) -> Vec<tungstenite::protocol::frame::Frame> {
    let mut cuts = Vec::new();
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + FRAGMENT).min(text.len());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        cuts.push((start, end));
        start = end;
    }
    let bytes = Bytes::from(text);
    let last = cuts.len().saturating_sub(1);
    cuts.into_iter()
        .enumerate()
        .map(|(i, (start, end))| {
            let opcode = if i == 0 { Data::Text } else { Data::Continue };
            tungstenite::protocol::frame::Frame::message(
                bytes.slice(start..end),
                OpCode::Data(opcode),
                i == last,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

    use super::*;

    /// A message of `len` bytes of multi-byte characters, cut mid-character at every
    /// [`FRAGMENT`] boundary if cut by bytes.
    fn big_text(len: usize) -> String {
        let mut text = String::with_capacity(len + 4);
        let mut i = 0u32;
        while text.len() < len {
            text.push(['a', 'é', '€', '𝄞'][(i % 4) as usize]);
            i += 1;
        }
        text
    }

    async fn server<S: AsyncRead + AsyncWrite + Unpin>(io: S) -> WebSocketStream<S> {
        WebSocketStream::from_raw_socket(io, Role::Server, Some(config())).await
    }

    /// What the wire carries: each frame's FIN bit, opcode and payload, read slowly (a
    /// phone): 1 KiB at a time from a 4 KiB pipe.
    async fn frames_on_the_wire(
        mut wire: impl AsyncRead + Unpin,
        expected: usize,
    ) -> Vec<(bool, u8, Vec<u8>)> {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 1024];
        let mut frames = Vec::new();
        let mut received = 0;
        while received < expected {
            let n = wire.read(&mut chunk).await.expect("read");
            assert!(n > 0, "the connection ended after {received} bytes");
            bytes.extend_from_slice(&chunk[..n]);
            while bytes.len() >= 2 {
                let (fin, opcode) = (bytes[0] & 0x80 != 0, bytes[0] & 0x0f);
                let (header, len) = match bytes[1] & 0x7f {
                    126 if bytes.len() >= 4 => {
                        (4, usize::from(u16::from_be_bytes([bytes[2], bytes[3]])))
                    }
                    127 if bytes.len() >= 10 => (
                        10,
                        usize::try_from(u64::from_be_bytes(bytes[2..10].try_into().expect("8")))
                            .expect("len"),
                    ),
                    126 | 127 => break,
                    n => (2, usize::from(n)),
                };
                if bytes.len() < header + len {
                    break;
                }
                let payload = bytes[header..header + len].to_vec();
                bytes.drain(..header + len);
                received += payload.len();
                frames.push((fin, opcode, payload));
            }
        }
        frames
    }

    #[tokio::test]
    async fn a_big_message_leaves_in_fragments_a_slow_reader_gets_whole() {
        let text = big_text(3 * FRAGMENT + 1234);
        let (ours, theirs) = tokio::io::duplex(4 * 1024);
        let mut socket = server(ours).await;
        let sent = Utf8Bytes::from(text.clone());
        let writer = tokio::spawn(async move {
            feed(&mut socket, sent).await.expect("feed");
            socket.flush().await.expect("flush");
            socket
        });
        let frames = frames_on_the_wire(theirs, text.len()).await;
        let _socket = writer.await.expect("writer");
        assert!(frames.len() >= 4, "{} frames", frames.len());
        for (i, (fin, opcode, payload)) in frames.iter().enumerate() {
            let first = i == 0;
            let last = i + 1 == frames.len();
            assert_eq!(*opcode, u8::from(first), "frame {i}'s opcode");
            assert_eq!(*fin, last, "frame {i}'s FIN");
            assert!(
                payload.len() <= FRAGMENT,
                "frame {i}: {} bytes",
                payload.len()
            );
            assert!(
                std::str::from_utf8(payload).is_ok(),
                "frame {i} is cut between characters"
            );
        }
        let whole: Vec<u8> = frames.into_iter().flat_map(|(_, _, p)| p).collect();
        assert!(
            whole == text.as_bytes(),
            "the message arrives byte for byte"
        );
    }

    #[tokio::test]
    async fn a_tungstenite_client_reads_the_fragments_as_one_message() {
        let text = big_text(5 * FRAGMENT);
        let small = "{\"type\":\"welcome\"}".to_string();
        let (ours, theirs) = tokio::io::duplex(16 * 1024);
        let mut socket = server(ours).await;
        let mut client = WebSocketStream::from_raw_socket(theirs, Role::Client, None).await;
        let sent = [small.clone(), text.clone(), small.clone()];
        let writer = tokio::spawn(async move {
            for text in sent {
                feed(&mut socket, Utf8Bytes::from(text))
                    .await
                    .expect("feed");
            }
            socket.flush().await.expect("flush");
            socket
        });
        for expected in [&small, &text, &small] {
            match client.next().await {
                Some(Ok(Message::Text(got))) => {
                    assert!(got.as_str() == expected.as_str(), "a message arrives whole");
                }
                other => panic!("expected a text message, got {other:?}"),
            }
        }
        let _socket = writer.await.expect("writer");
    }

    #[test]
    fn a_message_up_to_the_fragment_size_is_one_frame() {
        assert_eq!(
            fragments(Utf8Bytes::from("x".repeat(FRAGMENT + 1))).len(),
            2
        );
        let cut = fragments(Utf8Bytes::from(big_text(2 * FRAGMENT)));
        assert!(cut.iter().all(|f| f.payload().len() <= FRAGMENT));
    }
}
