//! [`KillingProxy`]: a TCP proxy in front of RabbitMQ that cuts a client's
//! connection when the client sends a marker, like a broker plugin or a
//! proxy that drops the connection on one particular message.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// Forwards `127.0.0.1:<ephemeral port>` to an upstream address, byte for
/// byte, until a client sends `marker` (anywhere in its stream, e.g. in a
/// message body): then it shuts that client's connection down both ways
/// without forwarding the chunk that held it, and counts a kill. Stops
/// (every connection with it) on drop.
#[derive(Debug)]
pub struct KillingProxy {
    addr: SocketAddr,
    kills: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl KillingProxy {
    /// Starts a proxy to `upstream` (`host:port`) that cuts on `marker`.
    ///
    /// # Panics
    /// If it cannot listen on loopback.
    pub async fn start(upstream: &str, marker: &[u8]) -> KillingProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("proxy cannot listen on loopback: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy has no address: {e}"));
        let kills = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let upstream = upstream.to_owned();
        let marker = marker.to_vec();
        let task = tokio::spawn({
            let kills = Arc::clone(&kills);
            let connections = Arc::clone(&connections);
            async move {
                // Owned here, so aborting the accept loop ends every
                // connection too.
                let mut served = JoinSet::new();
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    connections.fetch_add(1, Ordering::SeqCst);
                    served.spawn(serve(
                        client,
                        upstream.clone(),
                        marker.clone(),
                        Arc::clone(&kills),
                    ));
                    while served.try_join_next().is_some() {}
                }
            }
        });
        KillingProxy {
            addr,
            kills,
            connections,
            task,
        }
    }

    /// Starts a proxy in front of the broker of `amqp_url`; returns it and
    /// the URL to reach the broker through it.
    pub async fn amqp(amqp_url: &str, marker: &[u8]) -> (KillingProxy, String) {
        // amqp://user:pass@host:port/vhost
        let (prefix, rest) = amqp_url.split_once('@').unwrap_or(("amqp://", amqp_url));
        let (host, vhost) = rest.split_once('/').unwrap_or((rest, "%2f"));
        let upstream = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:5672")
        };
        let proxy = KillingProxy::start(&upstream, marker).await;
        let url = format!("{prefix}@{}/{vhost}", proxy.addr);
        (proxy, url)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many client connections it cut on the marker.
    pub fn kills(&self) -> usize {
        self.kills.load(Ordering::SeqCst)
    }

    /// How many client connections it accepted.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for KillingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(client: TcpStream, upstream: String, marker: Vec<u8>, kills: Arc<AtomicUsize>) {
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let upward = async {
        let mut buf = vec![0u8; 64 * 1024];
        // The end of the previous chunk, so a marker split across two
        // reads is still seen.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            let mut window = std::mem::take(&mut tail);
            window.extend_from_slice(&buf[..n]);
            if window.windows(marker.len()).any(|w| w == marker.as_slice()) {
                return true;
            }
            let keep = marker.len().saturating_sub(1).min(window.len());
            tail = window.split_off(window.len() - keep);
            if server_write.write_all(&buf[..n]).await.is_err() {
                return false;
            }
        }
    };
    let downward = tokio::io::copy(&mut server_read, &mut client_write);
    let cut = tokio::select! {
        cut = upward => cut,
        _ = downward => false,
    };
    if cut {
        kills.fetch_add(1, Ordering::SeqCst);
    }
    let _ = client_write.shutdown().await;
    let _ = server_write.shutdown().await;
}
