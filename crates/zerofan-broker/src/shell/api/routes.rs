//! `/api/v1/` request handling, with no I/O: a parsed request in, a reply
//! out, everything the broker knows asked of [`Admin`]. Errors are JSON
//! objects `{"error": MESSAGE}`.

use super::admin::{self, Admin};
use crate::core::admin::{qos_of, AdminPublishError, ClientQuery, ClientView};
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};

/// Every route: method and path pattern (`{name}` is one path segment,
/// `{name...}` the rest of the path). The OpenAPI document lists exactly
/// these (a test checks it).
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/api/v1/publish"),
    ("GET", "/api/v1/clients"),
    ("GET", "/api/v1/clients/{clientid}"),
    ("DELETE", "/api/v1/clients/{clientid}"),
    ("GET", "/api/v1/subscriptions"),
    ("GET", "/api/v1/retained"),
    ("GET", "/api/v1/retained/{topic...}"),
    ("DELETE", "/api/v1/retained/{topic...}"),
    ("GET", "/api/v1/stats"),
    ("POST", "/api/v1/reload"),
    ("GET", "/api/v1/openapi.json"),
];

/// The OpenAPI 3 document of [`ROUTES`].
pub const OPENAPI: &str = include_str!("openapi.json");

/// Most items one page of a list holds.
pub const MAX_PAGE: usize = 1000;
/// Items a page holds when `limit` is not given.
pub const DEFAULT_PAGE: usize = 100;

/// A request as the router sees it.
#[derive(Debug)]
pub struct Request<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path, still percent-encoded, starting with `/api/`.
    pub path: &'a str,
    /// The query string, without `?`.
    pub query: &'a str,
    /// The `Content-Type` header.
    pub content_type: Option<&'a str>,
    /// The body (already bounded in size).
    pub body: Bytes,
}

/// What to answer.
#[derive(Debug, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: &'static str,
    /// Body.
    pub body: Bytes,
    /// The methods of the path, for a 405's `Allow`.
    pub allow: Option<String>,
}

const JSON: &str = "application/json";

fn reply(status: u16, v: Value) -> Reply {
    Reply {
        status,
        content_type: JSON,
        body: Bytes::from(v.to_string()),
        allow: None,
    }
}

/// A JSON error reply.
pub fn error(status: u16, message: &str) -> Reply {
    reply(status, json!({ "error": message }))
}

/// Percent-decode (and `+` as space in a query); `None` when not UTF-8 or
/// badly escaped.
pub fn decode(s: &str, query: bool) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if query => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The decoded value of query parameter `name`.
fn param(query: &str, name: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| decode(k, true).as_deref() == Some(name))
        .and_then(|(_, v)| decode(v, true))
}

fn flag(query: &str, name: &str) -> bool {
    matches!(param(query, name).as_deref(), Some("true" | "1" | "yes"))
}

/// Match `path` against a [`ROUTES`] pattern; the captured (decoded)
/// parameter, or `Some("")` for a pattern without one.
fn matches(pattern: &str, path: &str) -> Option<String> {
    if let Some(prefix) = pattern.strip_suffix("...}") {
        let prefix = &prefix[..prefix.rfind('{')?];
        let rest = path.strip_prefix(prefix)?;
        return (!rest.is_empty()).then(|| decode(rest, false)).flatten();
    }
    if let Some(open) = pattern.find('{') {
        let rest = path.strip_prefix(&pattern[..open])?;
        return (!rest.is_empty() && !rest.contains('/'))
            .then(|| decode(rest, false))
            .flatten();
    }
    (pattern == path).then(String::new)
}

/// Answer one `/api/` request.
pub fn route(admin: &Admin, req: &Request<'_>) -> Reply {
    let mut allowed: Vec<&str> = Vec::new();
    for (method, pattern) in ROUTES {
        let Some(arg) = matches(pattern, req.path) else {
            continue;
        };
        if *method != req.method && !(req.method == "HEAD" && *method == "GET") {
            allowed.push(method);
            continue;
        }
        return handle(admin, method, pattern, &arg, req);
    }
    if allowed.is_empty() {
        return error(404, "no such route");
    }
    let mut r = error(405, "method not allowed");
    r.allow = Some(allowed.join(", "));
    r
}

fn handle(admin: &Admin, method: &str, pattern: &str, arg: &str, req: &Request<'_>) -> Reply {
    let q = req.query;
    match (method, pattern) {
        ("POST", "/api/v1/publish") => publish(admin, req),
        ("GET", "/api/v1/clients") => clients(admin, q),
        ("GET", "/api/v1/clients/{clientid}") => match admin.client(arg) {
            Some(c) => reply(200, client_json(&c, true)),
            None => error(404, "no such client"),
        },
        ("DELETE", "/api/v1/clients/{clientid}") => {
            let discard = flag(q, "discard");
            if admin.disconnect(arg, discard) {
                reply(
                    200,
                    json!({ "clientid": arg, "disconnected": true, "discarded": discard }),
                )
            } else {
                error(404, "no such client")
            }
        }
        ("GET", "/api/v1/subscriptions") => subscriptions(admin, q),
        ("GET", "/api/v1/retained") => retained(admin, "#", q),
        ("GET", "/api/v1/retained/{topic...}") => retained(admin, arg, q),
        ("DELETE", "/api/v1/retained/{topic...}") => {
            if arg.contains(['+', '#']) {
                error(400, "a topic name, without wildcards")
            } else if admin.clear_retained(arg) {
                reply(200, json!({ "topic": arg, "deleted": true }))
            } else {
                error(404, "no retained message on this topic")
            }
        }
        ("GET", "/api/v1/stats") => reply(200, stats(admin)),
        ("POST", "/api/v1/reload") => match admin.reload() {
            Ok(()) => reply(200, json!({ "reloaded": true })),
            Err(e) => error(500, &e),
        },
        ("GET", "/api/v1/openapi.json") => Reply {
            status: 200,
            content_type: JSON,
            body: Bytes::from_static(OPENAPI.as_bytes()),
            allow: None,
        },
        _ => error(404, "no such route"),
    }
}

/// Page bounds from `page` (from 0) and `limit`.
fn page(q: &str) -> Result<(usize, usize), Reply> {
    let num = |name: &str, default: usize| match param(q, name) {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .map_err(|_| error(400, &format!("{name} must be a number"))),
    };
    let limit = num("limit", DEFAULT_PAGE)?;
    if limit == 0 || limit > MAX_PAGE {
        return Err(error(400, &format!("limit must be 1..={MAX_PAGE}")));
    }
    Ok((num("page", 0)?, limit))
}

/// A client as JSON.
pub fn client_json(c: &ClientView, subs: bool) -> Value {
    let mut v = json!({
        "clientid": c.client_id,
        "connected": c.connected,
        "username": c.username,
        "address": c.peer.map(|p| p.to_string()),
        "listener": c.listener,
        "protocol": c.protocol,
        "keep_alive": c.keep_alive,
        "session_expiry_interval": c.expiry_interval,
        "queued": c.queued,
        "inflight": c.inflight,
        "subscription_count": c.subscription_count,
    });
    if subs {
        v["subscriptions"] = c
            .subscriptions
            .iter()
            .map(|s| {
                json!({
                    "filter": s.filter,
                    "qos": s.qos,
                    "no_local": s.no_local,
                    "retain_as_published": s.retain_as_published,
                })
            })
            .collect();
    }
    v
}

fn clients(admin: &Admin, q: &str) -> Reply {
    let (page, limit) = match page(q) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let listener = match param(q, "listener").map(|l| l.parse::<usize>()) {
        None => None,
        Some(Ok(l)) => Some(l),
        Some(Err(_)) => return error(400, "listener must be a number"),
    };
    let query = ClientQuery {
        prefix: param(q, "clientid"),
        username: param(q, "username"),
        listener,
        address: param(q, "address"),
        connected: param(q, "connected").map(|v| v == "true"),
        offset: page.saturating_mul(limit),
        limit,
        subscriptions: false,
    };
    let (total, views) = admin.clients(&query);
    let items: Vec<Value> = views.iter().map(|c| client_json(c, false)).collect();
    reply(
        200,
        json!({ "total": total, "page": page, "limit": limit, "clients": items }),
    )
}

fn subscriptions(admin: &Admin, q: &str) -> Reply {
    let (page, limit) = match page(q) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let views = match param(q, "clientid") {
        Some(id) => admin.client(&id).into_iter().collect(),
        None => {
            let all = ClientQuery {
                limit: usize::MAX,
                subscriptions: true,
                ..ClientQuery::default()
            };
            admin.clients(&all).1
        }
    };
    let rows = views.iter().flat_map(|c| {
        c.subscriptions
            .iter()
            .map(move |s| (c.client_id.as_str(), s))
    });
    let total = rows.clone().count();
    let items: Vec<Value> = rows
        .skip(page.saturating_mul(limit))
        .take(limit)
        .map(|(id, s)| json!({ "clientid": id, "filter": s.filter, "qos": s.qos }))
        .collect();
    reply(
        200,
        json!({ "total": total, "page": page, "limit": limit, "subscriptions": items }),
    )
}

fn retained(admin: &Admin, filter: &str, q: &str) -> Reply {
    let (_, limit) = match page(q) {
        Ok(p) => p,
        Err(e) => return e,
    };
    if zerofan_codec::topic::validate_topic_filter(filter).is_err() {
        return error(400, "not a valid topic or filter");
    }
    let found = admin.retained(filter, limit);
    if found.is_empty() && !filter.contains(['+', '#']) {
        return error(404, "no retained message on this topic");
    }
    let items: Vec<Value> = found
        .iter()
        .map(|m| {
            json!({
                "topic": m.topic,
                "qos": m.qos,
                "payload": std::str::from_utf8(&m.payload).ok(),
                "payload_base64": base64::engine::general_purpose::STANDARD.encode(&m.payload),
            })
        })
        .collect();
    reply(200, json!({ "messages": items }))
}

fn stats(admin: &Admin) -> Value {
    let s = admin.stats();
    let (m, g) = (&s.metrics, &s.gauges);
    json!({
        "uptime_seconds": s.uptime_seconds,
        "connections": g.connections,
        "sessions_online": g.sessions_online,
        "sessions_offline": g.sessions_offline,
        "subscriptions": g.subscriptions,
        "retained": g.retained,
        "queued_messages": g.queued_messages,
        "inflight": g.inflight,
        "messages_received": m.messages_received,
        "messages_sent": m.messages_sent,
        "messages_dropped": m.dropped_total(),
        "bytes_received": s.shell.bytes_received,
        "bytes_sent": s.shell.bytes_sent,
        "pool_hit_rate": s.shell.pool_hit_rate,
        "store_size_bytes": s.store.size_bytes,
        "store_durable": s.store.durable,
    })
}

fn publish(admin: &Admin, req: &Request<'_>) -> Reply {
    let is_json = req
        .content_type
        .is_some_and(|c| c.trim_start().starts_with("application/json"));
    let built = if is_json {
        publish_json(&req.body)
    } else {
        publish_raw(req.query, req.body.clone())
    };
    let p = match built {
        Ok(p) => p,
        Err(e) => return error(400, &e),
    };
    let topic = p.topic.to_string();
    match admin.publish(p) {
        Ok(n) => reply(200, json!({ "topic": topic, "delivered_to": n })),
        Err(AdminPublishError::BadTopic) => error(400, "not a valid topic name for publishing"),
        Err(AdminPublishError::RetainUnavailable) => error(400, "retain is not available"),
    }
}

fn qos_param(n: u64) -> Result<zerofan_codec::QoS, String> {
    u8::try_from(n)
        .ok()
        .and_then(qos_of)
        .ok_or_else(|| "qos must be 0, 1 or 2".to_string())
}

/// A raw body published to the query's `topic` (`qos`, `retain`).
fn publish_raw(q: &str, body: Bytes) -> Result<zerofan_codec::Publish, String> {
    let topic = param(q, "topic").ok_or("a raw body needs ?topic=")?;
    let qos = match param(q, "qos") {
        None => zerofan_codec::QoS::AtMostOnce,
        Some(v) => qos_param(v.parse().map_err(|_| "qos must be 0, 1 or 2")?)?,
    };
    admin::publish(&topic, body, qos, flag(q, "retain")).ok_or_else(|| "bad topic".into())
}

/// `{topic, payload | payload_base64, qos, retain, properties}`.
fn publish_json(body: &[u8]) -> Result<zerofan_codec::Publish, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("bad JSON: {e}"))?;
    let topic = v["topic"].as_str().ok_or("topic (a string) is required")?;
    let payload = match (&v["payload"], &v["payload_base64"]) {
        (Value::String(s), Value::Null) => Bytes::from(s.clone().into_bytes()),
        (Value::Null, Value::String(b)) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map(Bytes::from)
            .map_err(|_| "payload_base64 is not base64")?,
        (Value::Null, Value::Null) => Bytes::new(),
        _ => return Err("one of payload (a string) or payload_base64".into()),
    };
    let qos = match &v["qos"] {
        Value::Null => zerofan_codec::QoS::AtMostOnce,
        q => qos_param(q.as_u64().ok_or("qos must be 0, 1 or 2")?)?,
    };
    let retain = match &v["retain"] {
        Value::Null => false,
        r => r.as_bool().ok_or("retain must be true or false")?,
    };
    let mut p = admin::publish(topic, payload, qos, retain).ok_or("bad topic")?;
    if let Some(props) = v.get("properties").filter(|p| !p.is_null()) {
        properties(props, &mut p)?;
    }
    Ok(p)
}

fn mqtt_str(v: &Value, what: &str) -> Result<zerofan_codec::MqttStr, String> {
    v.as_str()
        .and_then(|s| zerofan_codec::MqttStr::try_from(s).ok())
        .ok_or_else(|| format!("{what} must be a string"))
}

/// The MQTT 5 properties a publisher may set.
fn properties(v: &Value, p: &mut zerofan_codec::Publish) -> Result<(), String> {
    let obj = v.as_object().ok_or("properties must be an object")?;
    let mut props = zerofan_codec::Properties::default();
    for (k, val) in obj {
        match k.as_str() {
            "content_type" => props.content_type = Some(mqtt_str(val, k)?),
            "response_topic" => props.response_topic = Some(mqtt_str(val, k)?),
            "correlation_data" => {
                props.correlation_data = Some(Bytes::from(mqtt_str(val, k)?.to_string()))
            }
            "message_expiry_interval" => {
                let n = val.as_u64().and_then(|n| u32::try_from(n).ok());
                props.message_expiry_interval = Some(n.ok_or("message_expiry_interval: u32")?);
            }
            "payload_format_indicator" => {
                let n = val.as_u64().filter(|n| *n <= 1);
                props.payload_format_indicator = n.map(|n| n as u8);
            }
            "user_properties" => {
                let m = val.as_object().ok_or("user_properties must be an object")?;
                for (uk, uv) in m {
                    let key = zerofan_codec::MqttStr::try_from(uk.as_str())
                        .map_err(|_| "bad user property")?;
                    props
                        .user_properties
                        .push((key, mqtt_str(uv, "a user property")?));
                }
            }
            other => return Err(format!("unknown property {other}")),
        }
    }
    p.properties = props.into();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_capture_and_decode() {
        assert_eq!(
            matches("/api/v1/stats", "/api/v1/stats").as_deref(),
            Some("")
        );
        assert_eq!(
            matches("/api/v1/clients/{clientid}", "/api/v1/clients/a%20b").as_deref(),
            Some("a b")
        );
        assert_eq!(
            matches("/api/v1/clients/{clientid}", "/api/v1/clients/a/b"),
            None
        );
        assert_eq!(
            matches("/api/v1/clients/{clientid}", "/api/v1/clients/"),
            None
        );
        assert_eq!(
            matches("/api/v1/retained/{topic...}", "/api/v1/retained/a/b%2Bc").as_deref(),
            Some("a/b+c")
        );
        assert_eq!(
            matches("/api/v1/retained/{topic...}", "/api/v1/retained/"),
            None
        );
    }

    #[test]
    fn query_params() {
        assert_eq!(
            param("a=1&topic=x%2Fy+z", "topic").as_deref(),
            Some("x/y z")
        );
        assert_eq!(param("retain", "retain").as_deref(), Some(""));
        assert!(flag("discard=true", "discard"));
        assert!(!flag("discard=0", "discard"));
        assert_eq!(decode("%zz", false), None);
    }

    #[test]
    fn json_publish_bodies() {
        let p = publish_json(
            br#"{"topic":"a/b","payload":"hi","qos":1,"retain":true,
            "properties":{"content_type":"text/plain","user_properties":{"k":"v"}}}"#,
        )
        .unwrap();
        assert_eq!((p.topic.as_str(), &p.payload[..]), ("a/b", &b"hi"[..]));
        assert_eq!(p.qos, zerofan_codec::QoS::AtLeastOnce);
        assert!(p.retain);
        assert_eq!(p.properties.user_properties.len(), 1);
        let p = publish_json(br#"{"topic":"t","payload_base64":"AAEC"}"#).unwrap();
        assert_eq!(&p.payload[..], &[0, 1, 2]);
        assert!(publish_json(br#"{"payload":"x"}"#).is_err());
        assert!(publish_json(br#"{"topic":"t","qos":3}"#).is_err());
        assert!(publish_json(br#"{"topic":"t","payload":"a","payload_base64":"YQ=="}"#).is_err());
        assert!(publish_json(br#"{"topic":"t","properties":{"nope":1}}"#).is_err());
        assert!(publish_json(b"not json").is_err());
    }
}

/// The OpenAPI document against the router: the same operations, and each
/// operation's answer to a sample request is one the document lists.
#[cfg(test)]
mod openapi {
    use super::*;
    use crate::shell::state::Shared;
    use std::collections::BTreeSet;
    use std::rc::Rc;

    fn doc() -> Value {
        serde_json::from_str(OPENAPI).expect("openapi.json is JSON")
    }

    fn admin() -> Admin {
        let broker =
            crate::core::Broker::new(crate::config::Config::default(), std::time::Instant::now());
        let (shared, _poll) = Shared::new(broker);
        Admin::new(Rc::new(shared), None)
    }

    /// A route's path as OpenAPI writes it (`{topic...}` is `{topic}`).
    fn doc_path(pattern: &str) -> String {
        pattern.replace("...}", "}")
    }

    #[test]
    fn every_route_is_documented_and_nothing_else() {
        let d = doc();
        let mut documented = BTreeSet::new();
        for (path, ops) in d["paths"].as_object().expect("paths") {
            for method in ops.as_object().expect("operations").keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let routed: BTreeSet<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), doc_path(p)))
            .collect();
        assert_eq!(documented, routed);
    }

    #[test]
    fn sample_answers_are_documented() {
        let d = doc();
        let admin = admin();
        for (method, pattern) in ROUTES {
            let path = pattern
                .replace("{clientid}", "nobody")
                .replace("{topic...}", "a/b");
            let (body, content_type) = match *pattern {
                "/api/v1/publish" => (
                    Bytes::from_static(br#"{"topic":"a/b","payload":"x","retain":true}"#),
                    Some(JSON),
                ),
                _ => (Bytes::new(), None),
            };
            let req = Request {
                method,
                path: &path,
                query: "",
                content_type,
                body,
            };
            let r = route(&admin, &req);
            let op = &d["paths"][doc_path(pattern)][method.to_lowercase()];
            let status = r.status.to_string();
            assert!(
                op["responses"].get(&status).is_some(),
                "{method} {pattern} answered {status}, not in the document: {}",
                String::from_utf8_lossy(&r.body)
            );
            let v: Value = serde_json::from_slice(&r.body).expect("JSON body");
            if r.status >= 400 {
                assert!(v["error"].is_string(), "{method} {pattern}: {v}");
            }
        }
    }

    /// The fields the schemas name are the fields the API writes.
    #[test]
    fn schemas_match_answers() {
        let d = doc();
        let keys = |v: &Value| -> BTreeSet<String> {
            v.as_object().expect("object").keys().cloned().collect()
        };
        let admin = admin();
        let stats = super::stats(&admin);
        assert_eq!(
            keys(&stats),
            keys(&d["components"]["schemas"]["Stats"]["properties"])
        );
        let view = crate::core::admin::ClientView {
            client_id: "c".into(),
            connected: false,
            username: None,
            peer: None,
            listener: None,
            protocol: "5.0",
            keep_alive: 0,
            expiry_interval: 0,
            queued: 0,
            inflight: 0,
            subscriptions: Vec::new(),
            subscription_count: 0,
        };
        assert_eq!(
            keys(&client_json(&view, false)),
            keys(&d["components"]["schemas"]["Client"]["properties"])
        );
    }
}
