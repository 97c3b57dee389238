//! Webhooks of the real `zerofan` binary: a receiver in this test sees
//! every event type with its fields, and a dead receiver neither loses nor
//! holds up messages (its failures are counted). Listens on 127.0.0.1 only.
#![cfg(unix)]

mod common;

use bytes::Bytes;
use common::{http_get, Client, Scratch};
use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};
use zerofan_codec::{Packet, Publish, QoS, ReasonCode, Unsubscribe};

const WAIT: Duration = Duration::from_secs(20);

struct Broker {
    child: Child,
    mqtt: SocketAddr,
    http: SocketAddr,
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start zerofan");
    let out = BufReader::new(child.stdout.take().expect("piped"));
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in out.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let (mut mqtt, mut http) = (None, None);
    let deadline = Instant::now() + WAIT;
    while mqtt.is_none() || http.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line: String = rx.recv_timeout(left).expect("startup lines");
        if let Some(rest) = line.strip_prefix("zerofan listening on ") {
            mqtt = rest.split_whitespace().next().and_then(|a| a.parse().ok());
        }
        if let Some(rest) = line.strip_prefix("zerofan http on http://") {
            http = rest.trim_end_matches('/').parse().ok();
        }
    }
    Broker {
        child,
        mqtt: mqtt.expect("mqtt"),
        http: http.expect("http"),
    }
}

/// A webhook receiver: answers 200 to every POST and sends each event of
/// each JSON array, with the request's headers, to the channel.
fn receiver() -> (SocketAddr, Receiver<(Value, String)>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    let addr = l.local_addr().expect("addr");
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { break };
            let tx = tx.clone();
            std::thread::spawn(move || serve(s, tx));
        }
    });
    (addr, rx)
}

fn serve(s: TcpStream, tx: Sender<(Value, String)>) {
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    let mut w = s;
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            match r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let len = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        if w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
        let Ok(Value::Array(events)) = serde_json::from_slice(&body) else {
            panic!("not a JSON array: {}", String::from_utf8_lossy(&body));
        };
        for e in events {
            if tx.send((e, head.clone())).is_err() {
                return;
            }
        }
    }
}

fn publish_qos1(c: &mut Client, topic: &str, id: u16) {
    c.send(&Packet::Publish(Publish {
        qos: QoS::AtLeastOnce,
        topic: topic.try_into().expect("topic"),
        packet_id: id,
        payload: Bytes::from_static(b"q1"),
        ..Publish::default()
    }));
    assert!(matches!(c.recv(), Some(Packet::PubAck(_))));
}

#[test]
fn receiver_sees_every_event_type() {
    let dir = Scratch::new("events");
    let passwd = dir.path("passwd");
    let made = Command::new(env!("CARGO_BIN_EXE_zerofan"))
        .args(["passwd", "-c", "-b", "right"])
        .arg(&passwd)
        .arg("bob")
        .output()
        .expect("zerofan passwd");
    assert!(made.status.success(), "{made:?}");
    let (hook, events) = receiver();
    let b = spawn(
        &dir,
        &format!(
            "password_file = {:?}\nmax_queued_messages = 1\n\
             [[webhook]]\nurl = \"http://{hook}/events\"\ninclude_payload = true\n\
             headers = {{ Authorization = \"Bearer hook-secret\" }}\n",
            passwd.display().to_string()
        ),
    );

    let mut w1 = Client::connect_with(b.mqtt, "w1", |c| {
        c.properties.session_expiry_interval = Some(1);
        c.username = Some("bob".try_into().expect("user"));
        c.password = Some(Bytes::from_static(b"right"));
    });
    w1.subscribe("t/#");
    w1.publish("t/x", b"hi", false);
    assert_eq!(&w1.expect_publish().payload[..], b"hi");
    w1.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 2,
        properties: Default::default(),
        filters: vec!["t/#".try_into().expect("filter")],
    }));
    assert!(matches!(w1.recv(), Some(Packet::UnsubAck(_))));
    // An offline session with room for one message: the second is dropped.
    let mut slow = Client::connect_with(b.mqtt, "slow", |c| {
        c.properties.session_expiry_interval = Some(60);
    });
    slow.send(&Packet::Subscribe(zerofan_codec::Subscribe {
        packet_id: 1,
        properties: Default::default(),
        filters: vec![(
            "d/#".try_into().expect("filter"),
            zerofan_codec::SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                ..Default::default()
            },
        )],
    }));
    assert!(matches!(slow.recv(), Some(Packet::SubAck(_))));
    slow.send(&Packet::Disconnect(Default::default()));
    drop(slow);
    let mut publisher = Client::connect(b.mqtt, "pub");
    // The broker handles the DISCONNECT before this client's packets only
    // if it has read it: wait until the session is offline.
    let deadline = Instant::now() + WAIT;
    while !http_get(b.http, "/metrics").contains("zerofan_sessions{state=\"offline\"} 1") {
        assert!(Instant::now() < deadline, "slow never went offline");
        std::thread::sleep(Duration::from_millis(10));
    }
    publish_qos1(&mut publisher, "d/1", 1);
    publish_qos1(&mut publisher, "d/2", 2);
    // Normal DISCONNECT; the 1 s session then expires.
    w1.send(&Packet::Disconnect(Default::default()));
    // A wrong password.
    let mut bad = TcpStream::connect(b.mqtt).expect("connect");
    let mut buf = bytes::BytesMut::new();
    let mut connect = common::connect_packet(zerofan_codec::Protocol::V5, "intruder");
    connect.username = Some("bob".try_into().expect("user"));
    connect.password = Some(Bytes::from_static(b"wrong"));
    zerofan_codec::encode(
        &Packet::Connect(Box::new(connect)),
        zerofan_codec::Protocol::V5,
        &mut buf,
    )
    .expect("encode");
    bad.write_all(&buf).expect("write");

    let want = [
        "client.connected",
        "client.disconnected",
        "session.created",
        "session.expired",
        "subscription.created",
        "subscription.removed",
        "message.published",
        "message.dropped",
        "auth.failed",
    ];
    let mut seen: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let deadline = Instant::now() + WAIT;
    while want.iter().any(|w| !seen.contains_key(*w)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let (e, head) = events.recv_timeout(left).unwrap_or_else(|_| {
            panic!("missing events; saw {:?}", seen.keys().collect::<Vec<_>>())
        });
        assert!(head.contains("Bearer hook-secret"), "{head}");
        let ts = e["timestamp"].as_str().expect("timestamp");
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
        assert!(
            e.get("clientid").is_some() && e.get("username").is_some(),
            "{e}"
        );
        let name = e["event"].as_str().expect("event name").to_string();
        seen.entry(name).or_default().push(e);
    }
    let first = |name: &str, id: &str| -> Value {
        seen[name]
            .iter()
            .find(|e| e["clientid"] == id)
            .unwrap_or_else(|| panic!("{name} for {id}: {:?}", seen[name]))
            .clone()
    };
    assert_eq!(first("client.connected", "w1")["username"], "bob");
    assert_eq!(first("session.created", "w1")["clientid"], "w1");
    assert_eq!(first("subscription.created", "w1")["topic"], "t/#");
    assert_eq!(first("subscription.removed", "w1")["topic"], "t/#");
    let p = first("message.published", "w1");
    assert_eq!(
        (p["topic"].as_str(), p["qos"].as_u64()),
        (Some("t/x"), Some(0))
    );
    assert_eq!(
        (p["retain"].as_bool(), p["payload_base64"].as_str()),
        (Some(false), Some("aGk="))
    );
    assert_eq!(first("client.disconnected", "w1")["clientid"], "w1");
    assert_eq!(first("session.expired", "w1")["clientid"], "w1");
    let a = first("auth.failed", "intruder");
    assert_eq!(
        (a["username"].as_str(), a["reason"].as_u64()),
        (
            Some("bob"),
            Some(u64::from(ReasonCode::BAD_USER_NAME_OR_PASSWORD.0))
        )
    );
    assert!(seen["message.dropped"][0]["count"].as_u64() >= Some(1));
    let metrics = http_get(b.http, "/metrics");
    assert!(
        metrics.contains(&format!(
            "zerofan_webhook_posts_total{{webhook=\"http://{hook}/events\",result=\"ok\"}}"
        )),
        "{metrics}"
    );
}

#[test]
fn dead_receiver_loses_nothing_and_is_counted() {
    let dir = Scratch::new("dead");
    // A port with nothing listening.
    let dead = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr");
    let b = spawn(
        &dir,
        &format!(
            "[[webhook]]\nurl = \"http://{dead}/\"\nevents = [\"message.published\"]\n\
             queue_size = 100\nbatch_size = 10\ntimeout_ms = 200\n"
        ),
    );
    let mut sub = Client::connect(b.mqtt, "sub");
    sub.subscribe("x/#");
    let mut publisher = Client::connect(b.mqtt, "pub");
    const N: usize = 5000;
    let started = Instant::now();
    for i in 0..N {
        publisher.publish("x/y", format!("{i}").as_bytes(), false);
    }
    for i in 0..N {
        let p = sub.expect_publish();
        assert_eq!(p.payload, format!("{i}").as_bytes(), "message {i}");
    }
    let took = started.elapsed();
    // Every message arrived while the receiver was dead; the queue bound
    // dropped the events that did not fit, and the failures are counted.
    assert!(took < Duration::from_secs(10), "{took:?}");
    let deadline = Instant::now() + WAIT;
    loop {
        let m = http_get(b.http, "/metrics");
        let failed = m.contains(&format!(
            "zerofan_webhook_posts_total{{webhook=\"http://{dead}/\",result=\"failed\"}} "
        )) && !m.contains(&format!(
            "zerofan_webhook_posts_total{{webhook=\"http://{dead}/\",result=\"failed\"}} 0\n"
        ));
        let dropped = m
            .lines()
            .find(|l| {
                l.starts_with("zerofan_webhook_events_dropped_total") && l.contains("queue_full")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        if failed && dropped > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "failures never counted:\n{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_shard_posts_the_events_of_its_clients() {
    let dir = Scratch::new("shard-events");
    let (hook, events) = receiver();
    let b = spawn(
        &dir,
        &format!(
            "threads = 4\n[[webhook]]\nurl = \"http://{hook}/events\"\n\
             events = [\"client.connected\"]\n"
        ),
    );
    // Two client ids owned by each shard.
    let mut ids = std::collections::BTreeSet::new();
    let mut per_shard = [0usize; 4];
    for i in 0.. {
        let id = format!("hooked-{i}");
        let s = zerofan_broker::core::shard_of(id.as_bytes(), 4);
        if per_shard[s] < 2 {
            per_shard[s] += 1;
            ids.insert(id);
        }
        if ids.len() == 8 {
            break;
        }
    }
    let _clients: Vec<Client> = ids.iter().map(|id| Client::connect(b.mqtt, id)).collect();
    let mut seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + WAIT;
    while seen.len() < ids.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let (e, _) = events
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("events of {seen:?} only"));
        assert_eq!(e["event"], "client.connected");
        if let Some(id) = e["clientid"].as_str() {
            seen.insert(id.to_string());
        }
    }
    assert_eq!(seen, ids);
    // `/metrics` adds up every shard's webhook figures.
    let line = format!("zerofan_webhook_events_sent_total{{webhook=\"http://{hook}/events\"}} 8");
    let deadline = Instant::now() + WAIT;
    while !http_get(b.http, "/metrics").contains(&line) {
        assert!(Instant::now() < deadline, "never counted 8 events sent");
        std::thread::sleep(Duration::from_millis(10));
    }
}
