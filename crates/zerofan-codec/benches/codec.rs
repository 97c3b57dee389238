//! Codec benchmarks: decode and encode of CONNECT, SUBSCRIBE and PUBLISH
//! with 16 B, 1 KiB and 64 KiB payloads, and PUBLISH header encode.
//!
//! "Payload" means: for PUBLISH the application payload; for CONNECT the
//! will payload (64 KiB is 65,535 bytes there, the most binary data can
//! hold); for SUBSCRIBE the topic-filter list (16-byte entries).
//!
//! Every group runs twice: timed by the wall clock (`decode/…`), and by the
//! measuring thread's own CPU clock (`cpu/decode/…`), which is what to read
//! on a shared, noisy machine: time the thread spends descheduled is left out.
//!
//! Frames are held as `Bytes::from_owner`, as pooled buffers are, so
//! slicing them costs a reference count and never an allocation. Before
//! the timings, a counting allocator reports allocations per operation.
//!
//! `cargo bench -p zerofan-codec --bench codec -- --warm-up-time 1 --measurement-time 3`

use bytes::{Bytes, BytesMut};
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{black_box, BenchmarkId, Criterion, Throughput};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use zerofan_codec::*;

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const SIZES: [(usize, &str); 3] = [(16, "16B"), (1024, "1KiB"), (65536, "64KiB")];

fn s(v: &str) -> MqttStr {
    MqttStr::try_from(v).unwrap()
}

fn connect(n: usize) -> Packet {
    Packet::Connect(Box::new(Connect {
        bridge: false,
        protocol: Protocol::V5,
        clean_start: true,
        keep_alive: 60,
        properties: Properties {
            session_expiry_interval: Some(3600),
            receive_maximum: Some(100),
            maximum_packet_size: Some(1 << 20),
            topic_alias_maximum: Some(10),
            ..Properties::default()
        }
        .into(),
        client_id: s("bench-client-0001"),
        will: Some(Will {
            topic: s("clients/bench-client-0001/status"),
            payload: Bytes::from(vec![b'w'; n.min(65535)]),
            qos: QoS::AtLeastOnce,
            retain: true,
            properties: Properties {
                will_delay_interval: Some(10),
                ..Properties::default()
            }
            .into(),
        }),
        username: Some(s("user")),
        password: Some(Bytes::from_static(b"password")),
    }))
}

fn subscribe(n: usize) -> Packet {
    // 13-byte filters: with the 2-byte length and the options byte one
    // entry is exactly 16 bytes.
    let filters = (0..(n / 16).max(1))
        .map(|i| {
            (
                s(&format!("s/{:05}/+/abc", i % 100_000)),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..Default::default()
                },
            )
        })
        .collect();
    Packet::Subscribe(Subscribe {
        packet_id: 7,
        properties: Properties {
            subscription_identifiers: vec![42],
            ..Properties::default()
        }
        .into(),
        filters,
    })
}

fn publish(n: usize) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: s("sensors/kitchen/temperature"),
        packet_id: 4242,
        properties: Default::default(),
        payload: Bytes::from(vec![0xA5; n]),
    })
}

fn wire(p: &Packet, protocol: Protocol) -> Bytes {
    let mut out = BytesMut::new();
    encode(p, protocol, &mut out).unwrap();
    Bytes::from_owner(out.to_vec())
}

fn allocs_per_op(mut f: impl FnMut()) -> f64 {
    f();
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..100 {
        f();
    }
    (ALLOCS.load(Ordering::Relaxed) - before) as f64 / 100.0
}

type Make = fn(usize) -> Packet;
const PACKETS: [(&str, Make, Protocol); 4] = [
    ("connect_v5", connect, Protocol::V5),
    ("subscribe_v5", subscribe, Protocol::V5),
    ("publish_v5", publish, Protocol::V5),
    ("publish_v311", publish, Protocol::V311),
];

fn report_allocations() {
    eprintln!("allocations per operation (counting global allocator):");
    for (name, make, protocol) in PACKETS {
        for (n, label) in SIZES {
            let p = make(n);
            let w = wire(&p, protocol);
            let d = allocs_per_op(|| {
                black_box(decode(w.clone(), protocol).unwrap());
            });
            let mut buf = BytesMut::with_capacity(w.len() + 64);
            let e = allocs_per_op(|| {
                buf.clear();
                encode(&p, protocol, &mut buf).unwrap();
            });
            eprintln!("  {name}/{label}: decode {d}, encode {e}");
        }
    }
    let props = Properties::default();
    let h = header(&props);
    let mut buf = BytesMut::with_capacity(128);
    let e = allocs_per_op(|| {
        buf.clear();
        encode_publish_header(&h, Protocol::V5, &mut buf).unwrap();
    });
    eprintln!("  publish_header_v5: encode {e}");
}

fn header(props: &Properties) -> PublishHeader<'_> {
    PublishHeader {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        packet_id: 4242,
        topic: "sensors/kitchen/temperature",
        topic_alias: None,
        properties: props,
        message_expiry_interval: None,
        subscription_identifiers: &[],
        payload_len: 1024,
    }
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
}

/// `CLOCK_THREAD_CPUTIME_ID` on Linux.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// CPU time consumed by the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: on x86-64/aarch64 Linux (glibc) `struct timespec` is two
    // 64-bit fields, as `Timespec`; the call writes one through a valid,
    // exclusive pointer and touches nothing else.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Criterion measurement: CPU time of the measuring thread.
struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        thread_cpu_time()
    }
    fn end(&self, start: Duration) -> Duration {
        thread_cpu_time() - start
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        static WALL: WallTime = WallTime;
        WALL.formatter()
    }
}

fn benches<M: Measurement>(c: &mut Criterion<M>, prefix: &str) {
    for (name, make, protocol) in PACKETS {
        let mut g = c.benchmark_group(format!("{prefix}decode/{name}"));
        for (n, label) in SIZES {
            let w = wire(&make(n), protocol);
            g.throughput(Throughput::Bytes(w.len() as u64));
            g.bench_with_input(BenchmarkId::from_parameter(label), &w, |b, w| {
                // Decode, look at the result, drop it: the packet is used in
                // place rather than copied out through `black_box`.
                b.iter(|| match decode(black_box(w.clone()), protocol) {
                    Ok(Packet::Publish(p)) => p.payload.len(),
                    Ok(_) => 1,
                    Err(_) => 0,
                })
            });
        }
        g.finish();
        let mut g = c.benchmark_group(format!("{prefix}encode/{name}"));
        for (n, label) in SIZES {
            let p = make(n);
            let mut buf = BytesMut::with_capacity(encoded_len(&p, protocol).unwrap() + 64);
            g.throughput(Throughput::Bytes(encoded_len(&p, protocol).unwrap() as u64));
            g.bench_with_input(BenchmarkId::from_parameter(label), &p, |b, p| {
                b.iter(|| {
                    buf.clear();
                    encode(black_box(p), protocol, &mut buf).unwrap();
                })
            });
        }
        g.finish();
    }

    let mut g = c.benchmark_group(format!("{prefix}publish_header"));
    let empty = Properties::default();
    let rich = Properties {
        payload_format_indicator: Some(1),
        content_type: Some(s("application/json")),
        user_properties: vec![(s("trace"), s("abc123"))],
        ..Properties::default()
    };
    let sids = [7u32, 300];
    for (label, protocol, props, alias, expiry, ids) in [
        ("v311", Protocol::V311, &empty, None, None, &[][..]),
        ("v5", Protocol::V5, &empty, None, None, &[][..]),
        (
            "v5_alias_expiry_subids_props",
            Protocol::V5,
            &rich,
            Some(3),
            Some(60),
            &sids[..],
        ),
    ] {
        let mut h = header(props);
        h.topic_alias = alias;
        h.message_expiry_interval = expiry;
        h.subscription_identifiers = ids;
        let mut buf = BytesMut::with_capacity(256);
        g.bench_function(label, |b| {
            b.iter(|| {
                buf.clear();
                encode_publish_header(black_box(&h), protocol, &mut buf).unwrap();
            })
        });
    }
    g.finish();
}

fn main() {
    report_allocations();
    let mut wall = Criterion::default().configure_from_args();
    benches(&mut wall, "");
    let mut cpu = Criterion::default()
        .with_measurement(ThreadCpuTime)
        .configure_from_args();
    benches(&mut cpu, "cpu/");
    wall.final_summary();
}
