//! The HTTP API of the real `zerofan` binary: every `/api/v1/` route over a
//! socket, bearer-token auth and its failures, anonymous access on
//! loopback, tokens reloaded on SIGHUP. Listens on 127.0.0.1 only.
#![cfg(unix)]

mod common;

use common::{disconnect_reason, lines, Client, Scratch};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};
use zerofan_codec::ReasonCode;

const WAIT: Duration = Duration::from_secs(20);
const TOKEN: &str = "t0ken-for-tests";

struct Broker {
    child: Child,
    mqtt: SocketAddr,
    http: SocketAddr,
    _stderr: Receiver<String>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start the binary with `toml` as its configuration and an HTTP listener.
fn spawn(dir: &Scratch, toml: &str) -> Broker {
    let conf = dir.path("zerofan.toml");
    std::fs::write(&conf, toml).expect("write config");
    let mut child = Command::new(env!("CARGO_BIN_EXE_zerofan"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--memory",
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--config")
        .arg(&conf)
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start zerofan");
    let stdout = lines(child.stdout.take().expect("piped"));
    let stderr = lines(child.stderr.take().expect("piped"));
    let (mut mqtt, mut http) = (None, None);
    let deadline = Instant::now() + WAIT;
    while mqtt.is_none() || http.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = stdout.recv_timeout(left).expect("startup lines");
        if let Some(rest) = line.strip_prefix("zerofan listening on ") {
            mqtt = rest.split_whitespace().next().and_then(|a| a.parse().ok());
        }
        if let Some(rest) = line
            .strip_prefix("zerofan http on http://")
            .or_else(|| line.strip_prefix("zerofan http on https://"))
        {
            http = rest.trim_end_matches('/').parse().ok();
        }
    }
    Broker {
        child,
        mqtt: mqtt.expect("mqtt address"),
        http: http.expect("http address"),
        _stderr: stderr,
    }
}

/// One HTTP/1.1 exchange (`Connection: close`): status, head, body.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<(&str, &[u8])>,
) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect http");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
    if let Some(t) = token {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    let (ctype, bytes) = body.unwrap_or(("text/plain", b""));
    req.push_str(&format!(
        "Content-Type: {ctype}\r\nContent-Length: {}\r\n\r\n",
        bytes.len()
    ));
    s.write_all(req.as_bytes()).expect("write");
    // A refused body may be cut off by the server before it is all written.
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&out[..end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head, out[end + 4..].to_vec())
}

fn json(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
    let (status, _, b) = http(
        addr,
        method,
        path,
        Some(TOKEN),
        body.map(|b| ("application/json", b.as_bytes())),
    );
    let v = serde_json::from_slice(&b).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: not JSON ({e}): {}",
            String::from_utf8_lossy(&b)
        )
    });
    (status, v)
}

fn tokens_config(dir: &Scratch, tokens: &str) -> String {
    let file = dir.path("tokens");
    std::fs::write(&file, tokens).expect("write tokens");
    format!("http_tokens_file = {:?}\n", file.display().to_string())
}

#[test]
fn auth_refuses_missing_and_wrong_tokens_then_throttles() {
    let dir = Scratch::new("auth");
    let b = spawn(&dir, &tokens_config(&dir, &format!("# ops\n{TOKEN}\n")));
    // Health and metrics stay open; the API does not.
    assert_eq!(http(b.http, "GET", "/healthz", None, None).0, 200);
    let (status, head, body) = http(b.http, "GET", "/api/v1/stats", None, None);
    assert_eq!(status, 401);
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{head}"
    );
    let v: Value = serde_json::from_slice(&body).expect("JSON error");
    assert!(v["error"].is_string(), "{v}");
    assert_eq!(json(b.http, "GET", "/api/v1/stats", None).0, 200);
    // Wrong tokens: 401 up to the free allowance, then 429 for this peer,
    // even with the right token.
    for _ in 0..4 {
        let (status, _, _) = http(b.http, "GET", "/api/v1/stats", Some("nope"), None);
        assert_eq!(status, 401);
    }
    let (status, head, _) = http(b.http, "GET", "/api/v1/stats", Some(TOKEN), None);
    assert_eq!(status, 429, "{head}");
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 60"),
        "{head}"
    );
    let (_, _, metrics) = http(b.http, "GET", "/metrics", None, None);
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("zerofan_http_api_refused_total{reason=\"unauthorized\"} 5"),
        "{metrics}"
    );
}

#[test]
fn anonymous_access_only_where_allowed() {
    let dir = Scratch::new("anon");
    let b = spawn(&dir, "http_allow_anonymous = true\n");
    let (status, _, _) = http(b.http, "GET", "/api/v1/stats", None, None);
    assert_eq!(status, 200, "anonymous on a loopback listener");
    let (status, _, _) = http(b.http, "GET", "/api/v1/stats", Some("wrong"), None);
    assert_eq!(status, 401, "a wrong token is still wrong");
    drop(b);
    let b = spawn(&Scratch::new("noanon"), "");
    assert_eq!(http(b.http, "GET", "/api/v1/stats", None, None).0, 401);
    // Not on an address others can reach: the configuration is refused.
    let conf = dir.path("open.toml");
    std::fs::write(&conf, "http = \"0.0.0.0:0\"\nhttp_allow_anonymous = true\n").expect("w");
    let out = Command::new(env!("CARGO_BIN_EXE_zerofan"))
        .arg("--test-config")
        .arg("--config")
        .arg(&conf)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("http_allow_anonymous"),
        "{out:?}"
    );
}

#[test]
fn sighup_reloads_tokens() {
    let dir = Scratch::new("reload-tokens");
    let b = spawn(&dir, &tokens_config(&dir, "old-token\n"));
    assert_eq!(
        http(b.http, "GET", "/api/v1/stats", Some("old-token"), None).0,
        200
    );
    std::fs::write(dir.path("tokens"), format!("{TOKEN}\n")).expect("rewrite tokens");
    let ok = Command::new("kill")
        .args(["-HUP", &b.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(ok.success());
    let deadline = Instant::now() + WAIT;
    while http(b.http, "GET", "/api/v1/stats", Some(TOKEN), None).0 != 200 {
        assert!(Instant::now() < deadline, "new token never accepted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        http(b.http, "GET", "/api/v1/stats", Some("old-token"), None).0,
        401
    );
    // A tokens file that cannot be read refuses the reload; the tokens in
    // force stay.
    std::fs::write(dir.path("tokens"), "two words\n").expect("break tokens");
    let (status, v) = json(b.http, "POST", "/api/v1/reload", None);
    assert_eq!(status, 500, "{v}");
    assert!(v["error"].is_string(), "{v}");
    assert_eq!(
        http(b.http, "GET", "/api/v1/stats", Some(TOKEN), None).0,
        200
    );
}

#[test]
fn every_route_over_a_socket() {
    let dir = Scratch::new("routes");
    let b = spawn(&dir, &tokens_config(&dir, &format!("{TOKEN}\n")));
    let mut alpha = Client::connect(b.mqtt, "alpha");
    alpha.subscribe("t/#");
    let mut beta = Client::connect(b.mqtt, "beta");
    beta.ping();

    // clients: list, filters, paging, detail.
    let (s, v) = json(b.http, "GET", "/api/v1/clients", None);
    assert_eq!(s, 200);
    assert_eq!(v["total"], 2, "{v}");
    let ids: Vec<&str> = v["clients"]
        .as_array()
        .expect("clients")
        .iter()
        .filter_map(|c| c["clientid"].as_str())
        .collect();
    assert_eq!(ids, ["alpha", "beta"]);
    assert_eq!(v["clients"][0]["connected"], true);
    assert_eq!(v["clients"][0]["protocol"], "5.0");
    let (_, v) = json(b.http, "GET", "/api/v1/clients?clientid=al", None);
    assert_eq!(v["total"], 1, "{v}");
    assert_eq!(v["clients"][0]["clientid"], "alpha");
    let (_, v) = json(
        b.http,
        "GET",
        "/api/v1/clients?address=127.0.0.1&limit=1&page=1",
        None,
    );
    assert_eq!(
        (v["total"].as_u64(), v["clients"][0]["clientid"].as_str()),
        (Some(2), Some("beta"))
    );
    assert_eq!(json(b.http, "GET", "/api/v1/clients?limit=0", None).0, 400);
    let (s, v) = json(b.http, "GET", "/api/v1/clients/alpha", None);
    assert_eq!(s, 200);
    assert_eq!(v["subscriptions"][0]["filter"], "t/#", "{v}");
    assert_eq!(v["queued"], 0);
    assert_eq!(v["inflight"], 0);
    assert_eq!(json(b.http, "GET", "/api/v1/clients/nobody", None).0, 404);

    // subscriptions.
    let (_, v) = json(b.http, "GET", "/api/v1/subscriptions", None);
    assert_eq!(v["total"], 1, "{v}");
    assert_eq!(v["subscriptions"][0]["clientid"], "alpha");

    // publish: JSON, base64, raw body with the topic in the query.
    let (s, v) = json(
        b.http,
        "POST",
        "/api/v1/publish",
        Some(r#"{"topic":"t/1","payload":"hello"}"#),
    );
    assert_eq!((s, v["delivered_to"].as_u64()), (200, Some(1)), "{v}");
    let p = alpha.expect_publish();
    assert_eq!((p.topic.as_str(), &p.payload[..]), ("t/1", &b"hello"[..]));
    json(
        b.http,
        "POST",
        "/api/v1/publish",
        Some(r#"{"topic":"t/2","payload_base64":"AAE="}"#),
    );
    assert_eq!(&alpha.expect_publish().payload[..], &[0, 1]);
    let (s, _, _) = http(
        b.http,
        "POST",
        "/api/v1/publish?topic=t%2F3&retain=true",
        Some(TOKEN),
        Some(("application/octet-stream", b"raw")),
    );
    assert_eq!(s, 200);
    let p = alpha.expect_publish();
    assert_eq!((p.topic.as_str(), &p.payload[..]), ("t/3", &b"raw"[..]));
    let (s, v) = json(
        b.http,
        "POST",
        "/api/v1/publish",
        Some(r#"{"topic":"t/#"}"#),
    );
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].is_string());

    // retained: get, list, delete.
    let (s, v) = json(b.http, "GET", "/api/v1/retained/t/3", None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["messages"][0]["payload"], "raw");
    let (_, v) = json(b.http, "GET", "/api/v1/retained", None);
    assert_eq!(v["messages"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(json(b.http, "DELETE", "/api/v1/retained/t/3", None).0, 200);
    assert_eq!(json(b.http, "GET", "/api/v1/retained/t/3", None).0, 404);
    assert_eq!(json(b.http, "DELETE", "/api/v1/retained/t/3", None).0, 404);

    // stats.
    let (s, v) = json(b.http, "GET", "/api/v1/stats", None);
    assert_eq!(s, 200);
    assert_eq!(v["connections"], 2, "{v}");
    assert_eq!(v["subscriptions"], 1, "{v}");
    assert!(v["messages_sent"].as_u64() >= Some(3), "{v}");

    // Kick: DISCONNECT 0x98, and the clean session is gone.
    let (s, v) = json(b.http, "DELETE", "/api/v1/clients/beta", None);
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        disconnect_reason(beta.recv()),
        Some(ReasonCode::ADMINISTRATIVE_ACTION)
    );
    assert_eq!(json(b.http, "GET", "/api/v1/clients/beta", None).0, 404);
    assert_eq!(json(b.http, "DELETE", "/api/v1/clients/beta", None).0, 404);

    // reload, openapi, errors.
    let (s, v) = json(b.http, "POST", "/api/v1/reload", None);
    assert_eq!(s, 200, "{v}");
    let (s, v) = json(b.http, "GET", "/api/v1/openapi.json", None);
    assert_eq!(s, 200);
    assert_eq!(v["openapi"], "3.0.3");
    let (s, v) = json(b.http, "GET", "/api/v1/nope", None);
    assert_eq!(s, 404);
    assert!(v["error"].is_string());
    let (s, head, _) = http(b.http, "PUT", "/api/v1/stats", Some(TOKEN), None);
    assert_eq!(s, 405);
    assert!(
        head.contains("allow: GET") || head.contains("Allow: GET"),
        "{head}"
    );
    let big = vec![b'x'; 2 * 1024 * 1024];
    let (s, _, _) = http(
        b.http,
        "POST",
        "/api/v1/publish?topic=t/big",
        Some(TOKEN),
        Some(("application/octet-stream", &big)),
    );
    assert_eq!(s, 413);
}

#[test]
fn tls_listener_serves_the_api_to_a_verifying_client() {
    let dir = Scratch::new("tls");
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".into()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    std::fs::write(dir.path("cert.pem"), cert.pem()).expect("w");
    std::fs::write(dir.path("key.pem"), key.serialize_pem()).expect("w");
    let toml = format!(
        "{}http_tls = {{ cert = {:?}, key = {:?} }}\n",
        tokens_config(&dir, &format!("{TOKEN}\n")),
        dir.path("cert.pem").display().to_string(),
        dir.path("key.pem").display().to_string(),
    );
    let b = spawn(&dir, &toml);
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der().clone()).expect("root");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).expect("tls");
    let sock = TcpStream::connect(b.http).expect("connect");
    sock.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut tls = rustls::StreamOwned::new(conn, sock);
    write!(
        tls,
        "GET /api/v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("\"connections\""), "{text}");
    // Plain HTTP on the TLS port gets no answer.
    let mut plain = TcpStream::connect(b.http).expect("connect");
    plain.set_read_timeout(Some(WAIT)).expect("timeout");
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut reply = Vec::new();
    let _ = plain.read_to_end(&mut reply);
    assert!(
        !reply.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
}

#[test]
fn connections_past_the_bound_get_503_and_are_counted() {
    let dir = Scratch::new("bound");
    let b = spawn(&dir, "");
    // Idle connections hold their slots (until the head timeout).
    let held: Vec<TcpStream> = (0..32)
        .map(|_| TcpStream::connect(b.http).expect("connect"))
        .collect();
    // The broker accepts them in order: one more is past the bound once
    // all of those are in. Bounded retries: the accept loop may lag.
    let deadline = Instant::now() + WAIT;
    loop {
        let mut s = TcpStream::connect(b.http).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        if reply.starts_with(b"HTTP/1.1 503") {
            break;
        }
        assert!(Instant::now() < deadline, "never refused: {reply:?}");
    }
    drop(held);
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, _, body) = http(b.http, "GET", "/metrics", None, None);
        if status == 200 {
            let text = String::from_utf8_lossy(&body);
            let refused = text
                .lines()
                .find_map(|l| l.strip_prefix("zerofan_http_refused_total "))
                .and_then(|v| v.parse::<u64>().ok());
            assert!(refused >= Some(1), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "slots never freed");
    }
}
