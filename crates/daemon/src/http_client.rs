//! A small HTTP/1.1 client for talking to a drover daemon (`drover mcp-proxy`, `drover daemon
//! status`, the tests): GET, and POST of JSON, with extra headers, each answer read whole
//! (hyper de-chunks it, so a chunk boundary inside a UTF-8 character is harmless) within a
//! timeout. A request opens its own connection, so any number may run at once.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{CONTENT_TYPE, HOST, HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Answers larger than this are refused rather than held in memory.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("`{url}` is not an http:// URL with a host: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("invalid header `{name}` for {url}")]
    InvalidHeader { url: String, name: String },
    #[error("cannot connect to {authority}: {source}")]
    Connect {
        authority: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no answer from {url} within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("HTTP exchange with {url} failed: {reason}")]
    Exchange { url: String, reason: String },
}

/// An answer, its body read whole.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl HttpResponse {
    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The header's value, if it is there and readable as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_slice(&self.body)
    }
}

/// The client: a timeout and nothing else, so it is cheap to copy into every task.
#[derive(Debug, Clone, Copy)]
pub struct HttpClient {
    /// For the whole exchange: connecting, sending, and reading the answer to its end.
    pub timeout: Duration,
}

impl HttpClient {
    pub fn new(timeout: Duration) -> HttpClient {
        HttpClient { timeout }
    }

    /// `GET url` with `headers`.
    pub async fn get(
        &self,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<HttpResponse, HttpError> {
        self.send(Method::GET, url, headers, None).await
    }

    /// `POST url` with `body` as `application/json` (already encoded) and `headers`.
    pub async fn post_json(
        &self,
        url: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Result<HttpResponse, HttpError> {
        self.send(Method::POST, url, headers, Some(body.into()))
            .await
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        json: Option<Bytes>,
    ) -> Result<HttpResponse, HttpError> {
        let invalid = |reason: &str| HttpError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let uri: Uri = url
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| invalid(&e.to_string()))?;
        if uri.scheme_str() != Some("http") {
            return Err(invalid("only http:// is served"));
        }
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?.clone();
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let mut request = Request::builder().method(method).uri(path);
        let map = request
            .headers_mut()
            .ok_or_else(|| invalid("cannot build a request"))?;
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| invalid("a bad host"))?;
        map.insert(HOST, host);
        if json.is_some() {
            map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
        for (name, value) in headers {
            let bad = || HttpError::InvalidHeader {
                url: url.to_string(),
                name: name.to_string(),
            };
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
            let value = HeaderValue::from_str(value).map_err(|_| bad())?;
            map.insert(name, value);
        }
        let request = request
            .body(Full::new(json.unwrap_or_default()))
            .map_err(|e| invalid(&e.to_string()))?;
        let address = match authority.port_u16() {
            Some(_) => authority.as_str().to_string(),
            None => format!("{}:80", authority.host()),
        };
        let exchange = exchange(url, &address, request);
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| HttpError::Timeout {
                url: url.to_string(),
                after: self.timeout,
            })?
    }
}

/// One request on a fresh connection, its answer read to the end.
async fn exchange(
    url: &str,
    address: &str,
    request: Request<Full<Bytes>>,
) -> Result<HttpResponse, HttpError> {
    let failed = |e: &dyn std::fmt::Display| HttpError::Exchange {
        url: url.to_string(),
        reason: e.to_string(),
    };
    let stream = TcpStream::connect(address)
        .await
        .map_err(|source| HttpError::Connect {
            authority: address.to_string(),
            source,
        })?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| failed(&e))?;
    let answer = async {
        let response = sender.send_request(request).await.map_err(|e| failed(&e))?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_BODY)
            .collect()
            .await
            .map_err(|e| failed(&e))?
            .to_bytes();
        Ok(HttpResponse {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    };
    // The connection is driven here, beside the answer, rather than in a spawned task: the
    // client then needs no particular runtime, and nothing outlives the request.
    tokio::pin!(answer);
    tokio::pin!(connection);
    tokio::select! {
        biased;
        result = &mut answer => result,
        ended = &mut connection => {
            // It may end (the server closed) with the answer still buffered: finish reading.
            ended.map_err(|e| failed(&e))?;
            answer.await
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A server that answers each connection with `response` after `delay`, and hands back
    /// the requests it read.
    async fn serve(
        response: &'static [u8],
        delay: Duration,
    ) -> (String, tokio::sync::mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    // Headers, then the body its Content-Length announces.
                    loop {
                        let n = socket.read(&mut buf).await.expect("read");
                        request.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&request).to_string();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let length = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length: "))
                                .and_then(|l| l.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            if body.len() >= length {
                                break;
                            }
                        }
                        if n == 0 {
                            break;
                        }
                    }
                    let _ = tx.send(String::from_utf8_lossy(&request).to_string()).await;
                    tokio::time::sleep(delay).await;
                    socket.write_all(response).await.expect("write");
                    let _ = socket.shutdown().await;
                });
            }
        });
        (url, rx)
    }

    /// "é" is two bytes; the first chunk ends between them.
    const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
        Transfer-Encoding: chunked\r\n\r\n\
        a\r\n{\"name\":\"\xc3\r\n\
        6\r\n\xa9t\xc3\xa9\"}\r\n\
        0\r\n\r\n";

    #[tokio::test]
    async fn chunked_answers_come_back_whole_across_a_split_character() {
        let (url, mut requests) = serve(CHUNKED, Duration::ZERO).await;
        let client = HttpClient::new(Duration::from_secs(5));
        let answer = client
            .post_json(
                &format!("{url}/mcp/t?x=1"),
                &[("accept", "a/b")],
                "{\"a\":1}",
            )
            .await
            .expect("answer");
        assert_eq!(answer.status, 200);
        assert!(answer.is_success());
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(answer.text(), "{\"name\":\"été\"}");
        let value: serde_json::Value = answer.json().expect("json");
        assert_eq!(value["name"], "été");
        let request = requests.recv().await.expect("a request");
        assert!(
            request.starts_with("POST /mcp/t?x=1 HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("content-type: application/json\r\n"),
            "{request}"
        );
        assert!(request.contains("accept: a/b\r\n"), "{request}");
        assert!(request.ends_with("\r\n\r\n{\"a\":1}"), "{request}");
    }

    #[tokio::test]
    async fn requests_overlap_and_time_out() {
        const OK: &[u8] = b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno";
        let (slow, _slow_requests) = serve(OK, Duration::from_millis(800)).await;
        let (quick, _quick_requests) = serve(OK, Duration::ZERO).await;
        let client = HttpClient::new(Duration::from_secs(5));
        let started = Instant::now();
        let slow_answer = tokio::spawn(async move { client.get(&slow, &[]).await });
        let quick_answer = client.get(&quick, &[]).await.expect("quick");
        assert!(started.elapsed() < Duration::from_millis(600));
        assert_eq!(
            (quick_answer.status, quick_answer.text().as_str()),
            (404, "no")
        );
        assert!(!quick_answer.is_success());
        let slow_answer = slow_answer.await.expect("join").expect("slow");
        assert_eq!(slow_answer.status, 404);

        let (never, _never_requests) = serve(OK, Duration::from_secs(30)).await;
        let impatient = HttpClient::new(Duration::from_millis(100));
        let late = impatient.get(&never, &[]).await;
        assert!(matches!(late, Err(HttpError::Timeout { .. })), "{late:?}");
    }

    #[tokio::test]
    async fn bad_urls_and_closed_ports_are_errors() {
        let client = HttpClient::new(Duration::from_secs(5));
        for url in ["https://127.0.0.1:1/", "127.0.0.1:1", "http:///x"] {
            let answer = client.get(url, &[]).await;
            assert!(
                matches!(answer, Err(HttpError::InvalidUrl { .. })),
                "{url}: {answer:?}"
            );
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("addr");
        drop(listener);
        let answer = client.get(&format!("http://{address}/health"), &[]).await;
        assert!(
            matches!(answer, Err(HttpError::Connect { .. })),
            "{answer:?}"
        );
    }
}
