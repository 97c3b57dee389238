//! A minimal HTTP/1.1 server for operators: `GET`/`HEAD` of `/metrics`
//! (Prometheus), `/healthz` (200 while the process runs) and `/readyz` (200
//! once listeners are bound and the store is open, 503 while shutting
//! down). One request per connection (`Connection: close`), requests of at
//! most [`MAX_REQUEST`] bytes read within [`REQUEST_TIMEOUT`], at most
//! [`MAX_CONCURRENT`] at once (more get a 503 and are closed).

use super::ops::Ops;
use super::prometheus;
use super::state::Shared;
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Largest request head accepted, bytes.
pub const MAX_REQUEST: usize = 8 * 1024;
/// Requests served at once.
pub const MAX_CONCURRENT: usize = 8;
/// Time a client has to send its request and read the answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Serve until the task is aborted.
pub async fn serve(listener: TcpListener, shared: Rc<Shared>) {
    let active = Rc::new(Cell::new(0usize));
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if active.get() >= MAX_CONCURRENT {
            shared
                .ops
                .http_refused
                .set(shared.ops.http_refused.get() + 1);
            let busy = response(503, "text/plain; charset=utf-8", b"busy\n", false, &[]);
            let _ = stream.try_write(&busy);
            continue;
        }
        active.set(active.get() + 1);
        let (shared, active) = (shared.clone(), active.clone());
        tokio::task::spawn_local(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, handle(stream, &shared)).await;
            active.set(active.get() - 1);
        });
    }
}

async fn handle(mut stream: TcpStream, shared: &Shared) {
    let mut buf = Vec::with_capacity(1024);
    let head_len = loop {
        if let Some(end) = find_head_end(&buf) {
            break end;
        }
        if buf.len() >= MAX_REQUEST {
            let r = response(
                431,
                "text/plain; charset=utf-8",
                b"request too large\n",
                false,
                &[],
            );
            let _ = stream.write_all(&r).await;
            return;
        }
        let mut chunk = [0u8; 1024];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let answer = answer(&buf[..head_len], shared);
    let _ = stream.write_all(&answer).await;
    let _ = stream.shutdown().await;
}

/// Where the blank line ending the head is (index after it).
fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The whole response to a request head.
fn answer(head: &[u8], shared: &Shared) -> Vec<u8> {
    let Some((method, path)) = request_line(head) else {
        return response(
            400,
            "text/plain; charset=utf-8",
            b"bad request\n",
            false,
            &[],
        );
    };
    let head_only = method == "HEAD";
    if !matches!(path, "/metrics" | "/healthz" | "/readyz") {
        return response(
            404,
            "text/plain; charset=utf-8",
            b"not found\n",
            head_only,
            &[],
        );
    }
    if method != "GET" && method != "HEAD" {
        return response(
            405,
            "text/plain; charset=utf-8",
            b"method not allowed\n",
            false,
            &[("Allow", "GET, HEAD")],
        );
    }
    match path {
        "/metrics" => {
            let page = prometheus::render(&Ops::snapshot(shared));
            response(
                200,
                prometheus::CONTENT_TYPE,
                page.as_bytes(),
                head_only,
                &[],
            )
        }
        "/healthz" => response(200, "text/plain; charset=utf-8", b"ok\n", head_only, &[]),
        _ => {
            if Ops::is_ready(shared) {
                response(200, "text/plain; charset=utf-8", b"ready\n", head_only, &[])
            } else if shared.ops.shutting_down.get() {
                response(
                    503,
                    "text/plain; charset=utf-8",
                    b"shutting down\n",
                    head_only,
                    &[],
                )
            } else {
                response(
                    503,
                    "text/plain; charset=utf-8",
                    b"not ready\n",
                    head_only,
                    &[],
                )
            }
        }
    }
}

/// Method and path (without a query string) of `METHOD SP TARGET SP HTTP/1.x`.
fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line_end = head.iter().position(|&b| b == b'\r')?;
    let line = std::str::from_utf8(&head[..line_end]).ok()?;
    let mut parts = line.split(' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || method.is_empty() {
        return None;
    }
    let path = target.split('?').next().unwrap_or(target);
    Some((method, path))
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    }
}

/// A complete `Connection: close` response; `head_only` leaves the body
/// out (HEAD) but keeps its Content-Length.
fn response(
    code: u16,
    content_type: &str,
    body: &[u8],
    head_only: bool,
    extra: &[(&str, &str)],
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(code),
        body.len()
    );
    for (k, v) in extra {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some(("GET", "/metrics"))
        );
        assert_eq!(
            request_line(b"HEAD /readyz?x=1 HTTP/1.0\r\n\r\n"),
            Some(("HEAD", "/readyz"))
        );
        assert_eq!(request_line(b"GET /metrics\r\n\r\n"), None);
        assert_eq!(request_line(b"GET /a b HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_line(b"\xff\xfe / HTTP/1.1\r\n\r\n"), None);
    }

    #[test]
    fn head_keeps_length_drops_body() {
        let r = response(200, "text/plain", b"hello", true, &[]);
        let text = String::from_utf8(r).unwrap();
        assert!(text.contains("Content-Length: 5\r\n"));
        assert!(text.ends_with("\r\n\r\n"));
    }

    #[test]
    fn head_end() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n"), None);
    }
}
