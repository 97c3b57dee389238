//! A loopback TCP proxy in front of a broker that a test can use to cut
//! every connection (as a network failure would) or to stall the
//! broker-to-client direction (acknowledgements withheld).

use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub port: u16,
    /// Generation: bumping it severs every current connection.
    sever: watch::Sender<u64>,
    /// Bytes from the broker that may still pass: `None` for no limit,
    /// `Some(0)` holds everything back.
    stall: Arc<watch::Sender<Option<usize>>>,
}

/// Count `k` bytes against the allowance.
fn st_dec(tx: &watch::Sender<Option<usize>>, k: usize) {
    tx.send_modify(|s| {
        if let Some(a) = s {
            *a = a.saturating_sub(k);
        }
    });
}

impl Proxy {
    pub async fn start(upstream: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = l.local_addr().expect("addr").port();
        let (sever, _) = watch::channel(0u64);
        let stall = Arc::new(watch::channel(None::<usize>).0);
        let sv = sever.clone();
        let st = stall.clone();
        tokio::spawn(async move {
            while let Ok((down, _)) = l.accept().await {
                let Ok(up) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let _ = down.set_nodelay(true);
                let _ = up.set_nodelay(true);
                let mut cut = sv.subscribe();
                let stall = st.subscribe();
                let stall_tx = st.clone();
                tokio::spawn(async move {
                    let (mut dr, mut dw) = down.into_split();
                    let (mut ur, mut uw) = up.into_split();
                    let c2u = async {
                        let mut b = vec![0u8; 64 * 1024];
                        loop {
                            let n = match dr.read(&mut b).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if uw.write_all(&b[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    let u2c = async {
                        let mut stall = stall;
                        let mut b = vec![0u8; 64 * 1024];
                        loop {
                            let n = match ur.read(&mut b).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let mut at = 0;
                            while at < n {
                                let allowed = match stall.wait_for(|s| *s != Some(0)).await {
                                    Ok(s) => *s,
                                    Err(_) => None,
                                };
                                let k = allowed.map_or(n - at, |a| a.min(n - at));
                                if dw.write_all(&b[at..at + k]).await.is_err() {
                                    return;
                                }
                                at += k;
                                if allowed.is_some() {
                                    st_dec(&stall_tx, k);
                                }
                            }
                        }
                    };
                    tokio::select! {
                        biased;
                        _ = cut.changed() => {}
                        _ = c2u => {}
                        _ = u2c => {}
                    }
                });
            }
        });
        Proxy { port, sever, stall }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Close every connection through the proxy (new ones still work).
    pub fn sever(&self) {
        self.sever.send_modify(|g| *g += 1);
    }

    /// Hold back (true) or release (false) bytes from the broker.
    pub fn stall(&self, on: bool) {
        self.stall.send_replace(if on { Some(0) } else { None });
    }

    /// While stalled, let the next `n` bytes from the broker through.
    pub fn release(&self, n: usize) {
        self.stall.send_modify(|s| {
            if let Some(a) = s {
                *a += n;
            }
        });
    }
}
