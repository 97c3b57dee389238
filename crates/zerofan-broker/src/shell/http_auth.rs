//! Sends the core's HTTP authentication requests (`auth_http`) and hands
//! the answers back, never blocking the event loop: one task per request,
//! each bounded by the request's time-out; the core bounds how many wait.

use super::state::Shared;
use crate::core::{AuthRequest, HttpAnswer};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::rc::Rc;
use std::time::Instant;

/// Largest answer body read; a longer one is a failure.
const MAX_ANSWER: usize = 64 * 1024;

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Wait for requests (`Shared::dispatch` wakes it) and send each.
pub(super) async fn auth_loop(shared: Rc<Shared>) {
    // One pooled client: keep-alive connections to the service are reused.
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut batch = Vec::new();
    loop {
        shared.auth_wake.notified().await;
        shared.broker.borrow_mut().take_auth_requests(&mut batch);
        for req in batch.drain(..) {
            tokio::task::spawn_local(ask(shared.clone(), client.clone(), req));
        }
    }
}

async fn ask(shared: Rc<Shared>, client: HttpClient, mut req: AuthRequest) {
    let body = Bytes::from(std::mem::take(&mut req.body));
    let answer = match tokio::time::timeout(req.timeout, call(&client, &req.url, body)).await {
        Ok(a) => a,
        Err(_) => HttpAnswer::TimedOut,
    };
    shared
        .broker
        .borrow_mut()
        .auth_answered(Instant::now(), req.id, answer);
    shared.dispatch();
}

async fn call(client: &HttpClient, url: &str, body: Bytes) -> HttpAnswer {
    let request = hyper::Request::post(url)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body));
    let Ok(request) = request else {
        return HttpAnswer::Failed;
    };
    let response = match client.request(request).await {
        Ok(r) => r,
        Err(error) => {
            tracing::debug!(%error, "HTTP authentication request failed");
            return HttpAnswer::Failed;
        }
    };
    if response.status() != hyper::StatusCode::OK {
        tracing::debug!(status = %response.status(), "HTTP authentication refused to answer");
        return HttpAnswer::Failed;
    }
    match Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
    {
        Ok(b) => HttpAnswer::from_body(&b.to_bytes()),
        Err(_) => HttpAnswer::Failed,
    }
}
