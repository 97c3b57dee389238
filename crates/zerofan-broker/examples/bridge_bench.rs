//! Bridge throughput: publish COUNT messages of SIZE bytes at QoS Q to one
//! broker (the bridge's edge) and count them on another (the far side),
//! from the first publish to the last message received. Run by
//! `bench/bridge.sh`, which starts the brokers.
//!
//! `cargo run --release -p zerofan-broker --example bridge_bench -- PUB_ADDR SUB_ADDR QOS COUNT SIZE`

use std::time::{Duration, Instant};
use zerofan_client::{Client, ClientOptions, Protocol, QoS};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, pub_addr, sub_addr, qos, count, size] = args.as_slice() else {
        return Err("usage: bridge_bench PUB_ADDR SUB_ADDR QOS COUNT SIZE".into());
    };
    let qos = match qos.as_str() {
        "0" => QoS::AtMostOnce,
        "1" => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    };
    let count: usize = count.parse()?;
    let size: usize = size.parse()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let opts = |addr: &str| {
            ClientOptions::new(addr)
                .protocol(Protocol::V311)
                .incoming_capacity(65536)
                .max_inflight(1000)
        };
        let (sub, mut inc) = Client::connect(opts(sub_addr)).await?;
        sub.subscribe("bench/#", qos).await?;
        let (publisher, _) = Client::connect(opts(pub_addr)).await?;
        // Until a probe crosses, the bridge is not up yet.
        let probe_deadline = Instant::now() + Duration::from_secs(30);
        loop {
            publisher
                .publish("bench/probe", QoS::AtLeastOnce, "p")
                .await?
                .await?;
            match tokio::time::timeout(Duration::from_millis(500), inc.recv()).await {
                Ok(Some(_)) => break,
                _ if Instant::now() > probe_deadline => return Err("bridge not up".into()),
                _ => {}
            }
        }
        // Probes that crossed late.
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(300), inc.recv()).await {
        }
        let payload = bytes::Bytes::from(vec![7u8; size]);
        let start = Instant::now();
        let reader = tokio::spawn(async move {
            let mut n = 0usize;
            let mut last = Instant::now();
            let mut buf = Vec::new();
            while n < count {
                match tokio::time::timeout(Duration::from_secs(5), inc.recv_many(&mut buf, 4096))
                    .await
                {
                    Ok(0) | Err(_) => break,
                    Ok(k) => {
                        n += k;
                        buf.clear();
                        last = Instant::now();
                    }
                }
            }
            (n, last)
        });
        let mut deliveries = Vec::new();
        for i in 0..count {
            let d = publisher
                .publish(&format!("bench/{}", i % 16), qos, payload.clone())
                .await?;
            if qos != QoS::AtMostOnce {
                deliveries.push(d);
            }
        }
        for d in deliveries {
            d.await?;
        }
        let (n, last) = reader.await?;
        let secs = last.duration_since(start).as_secs_f64().max(1e-9);
        println!(
            "received {n}/{count} in {secs:.3}s: {:.0} msg/s, {:.1} MB/s",
            n as f64 / secs,
            (n * size) as f64 / secs / 1e6
        );
        Ok(())
    })
}
