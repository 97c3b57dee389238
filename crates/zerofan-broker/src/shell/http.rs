//! The HTTP listener (`--http`, `http`; `--metrics` is an older name), on
//! hyper: `/metrics` (Prometheus), `/healthz`, `/readyz`, the dashboard
//! page at `/`, and the `/api/v1/` API behind bearer tokens (see `api`).
//!
//! Bounded: at most [`MAX_CONCURRENT`] connections (more get a 503 and are
//! closed), request heads of at most [`MAX_HEAD`] bytes (431) read within
//! [`REQUEST_TIMEOUT`], bodies of at most [`MAX_BODY`] bytes (413) read
//! within the same time, and a connection lives at most
//! [`CONNECTION_LIFETIME`] (a browser's kept-alive connection reconnects).

use super::api::admin::Admin;
use super::api::auth::Verdict;
use super::api::routes;
use super::ops::Ops;
use super::prometheus;
use super::state::Shared;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::cell::Cell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

/// Largest request head accepted, bytes.
pub const MAX_HEAD: usize = 16 * 1024;
/// Largest request body accepted (a publish's payload), bytes.
pub const MAX_BODY: usize = 1024 * 1024;
/// Connections served at once.
pub const MAX_CONCURRENT: usize = 32;
/// Time a client has to send a request's head, and its body.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one connection.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

const TEXT: &str = "text/plain; charset=utf-8";

/// Serve until the task is aborted.
pub async fn serve(
    listener: TcpListener,
    shared: Rc<Shared>,
    admin: Rc<Admin>,
    tls: Option<std::sync::Arc<rustls::ServerConfig>>,
) {
    let tls = tls.map(tokio_rustls::TlsAcceptor::from);
    let active = Rc::new(Cell::new(0usize));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "http listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if active.get() >= MAX_CONCURRENT {
            shared
                .ops
                .http_refused
                .set(shared.ops.http_refused.get() + 1);
            let busy = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n";
            let _ = stream.try_write(busy);
            continue;
        }
        active.set(active.get() + 1);
        let (shared, admin, active) = (shared.clone(), admin.clone(), active.clone());
        let tls = tls.clone();
        tokio::task::spawn_local(async move {
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, async {
                match tls {
                    None => connection(stream, shared, admin, peer).await,
                    Some(acceptor) => {
                        // The handshake counts against the request time.
                        let accepted =
                            tokio::time::timeout(REQUEST_TIMEOUT, acceptor.accept(stream)).await;
                        if let Ok(Ok(stream)) = accepted {
                            connection(stream, shared, admin, peer).await;
                        }
                    }
                }
            })
            .await;
            active.set(active.get() - 1);
        });
    }
}

/// Serve HTTP/1.1 requests on one (plain or TLS) connection.
async fn connection<S>(stream: S, shared: Rc<Shared>, admin: Rc<Admin>, peer: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let (shared, admin) = (shared.clone(), admin.clone());
        async move { Ok::<_, Infallible>(respond(&shared, &admin, peer, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .max_buf_size(MAX_HEAD)
        // Clients that read headers into a plain dict expect the usual
        // capitals.
        .title_case_headers(true)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

type Reply = Response<Full<Bytes>>;

fn reply(status: u16, content_type: &str, body: impl Into<Bytes>) -> Reply {
    let body: Bytes = body.into();
    let mut r = Response::new(Full::new(body.clone()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    r
}

fn with_header(mut r: Reply, name: &'static str, value: &str) -> Reply {
    if let Ok(v) = HeaderValue::from_str(value) {
        r.headers_mut().insert(name, v);
    }
    r
}

fn from_api(r: routes::Reply) -> Reply {
    let allow = r.allow.clone();
    let out = reply(r.status, r.content_type, r.body);
    match allow {
        Some(a) => with_header(out, ALLOW.as_str(), &a),
        None => out,
    }
}

async fn respond(
    shared: &Shared,
    admin: &Admin,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Reply {
    let path = req.uri().path().to_string();
    let read_only = req.method() == "GET" || req.method() == "HEAD";
    if path == "/metrics" || path.starts_with("/api/") {
        // Every shard's figures as of now, not of the last timer tick.
        super::shards::refresh_figures(shared).await;
    }
    if path.starts_with("/api/v1/clients") || path.starts_with("/api/v1/subscriptions") {
        admin.gather().await;
    }
    if path.starts_with("/api/") {
        return api(shared, admin, peer, req).await;
    }
    let page = match path.as_str() {
        "/metrics" => Some(reply(
            200,
            prometheus::CONTENT_TYPE,
            prometheus::render(&Ops::snapshot(shared)),
        )),
        "/healthz" => Some(reply(200, TEXT, "ok\n")),
        "/readyz" => Some(if Ops::is_ready(shared) {
            reply(200, TEXT, "ready\n")
        } else if shared.ops.shutting_down.get() {
            reply(503, TEXT, "shutting down\n")
        } else {
            reply(503, TEXT, "not ready\n")
        }),
        "/" | "/index.html" => Some(with_header(
            reply(200, "text/html; charset=utf-8", super::api::DASHBOARD),
            "content-security-policy",
            "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline' 'self'",
        )),
        _ => None,
    };
    match page {
        None => reply(404, TEXT, "not found\n"),
        Some(_) if !read_only => with_header(
            reply(405, TEXT, "method not allowed\n"),
            ALLOW.as_str(),
            "GET, HEAD",
        ),
        Some(p) => p,
    }
}

async fn api(shared: &Shared, admin: &Admin, peer: SocketAddr, req: Request<Incoming>) -> Reply {
    let verdict = {
        let authorization = req.headers().get("authorization").map(|v| v.as_bytes());
        shared
            .ops
            .api_auth
            .borrow_mut()
            .check(Instant::now(), peer.ip(), authorization)
    };
    match verdict {
        Verdict::Allowed => {}
        Verdict::Unauthorized => {
            return with_header(
                from_api(routes::error(
                    401,
                    "a valid Authorization: Bearer token is needed",
                )),
                "www-authenticate",
                "Bearer",
            )
        }
        Verdict::Throttled => {
            return with_header(
                from_api(routes::error(429, "too many failed attempts; try later")),
                "retry-after",
                &super::api::auth::WINDOW.as_secs().to_string(),
            )
        }
    }
    let (parts, body) = req.into_parts();
    let body =
        match tokio::time::timeout(REQUEST_TIMEOUT, Limited::new(body, MAX_BODY).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => return from_api(routes::error(413, "request body too large")),
            Err(_) => return from_api(routes::error(408, "request body too slow")),
        };
    let request = routes::Request {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query().unwrap_or(""),
        content_type: parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        body,
    };
    from_api(routes::route(admin, &request))
}
