//! A TCP proxy for network faults: in front of the broker or PostgreSQL, it forwards bytes both
//! ways until told to **stall** (connections stay open, nothing moves, new connections wait:
//! a network partition that TCP does not notice) or to **cut** (every open connection is
//! closed at once: a reset link). Real sockets, real clients; nothing in our code knows.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// A running proxy; it stops when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// The port it listens on (`127.0.0.1`).
    pub port: u16,
    stalled: watch::Sender<bool>,
    /// Bumped by [`Proxy::cut`]: each connection ends when it changes.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `port` (0: any free port) and forwards to `127.0.0.1:upstream_port`.
    pub async fn start(port: u16, upstream_port: u16) -> Self {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let (stalled, stalled_rx) = watch::channel(false);
        let (generation, generation_rx) = watch::channel(0u64);
        let task = tokio::spawn(accept_loop(
            listener,
            upstream_port,
            stalled_rx,
            generation_rx,
        ));
        Self {
            port,
            stalled,
            generation,
            task,
        }
    }

    /// Stops moving bytes (and holds new connections) until [`Proxy::resume`].
    pub fn stall(&self) {
        let _ = self.stalled.send(true);
    }

    /// Moves bytes again.
    pub fn resume(&self) {
        let _ = self.stalled.send(false);
    }

    /// Closes every open connection; new ones are accepted as before.
    pub fn cut(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream_port: u16,
    stalled: watch::Receiver<bool>,
    generation: watch::Receiver<u64>,
) {
    // Connections live in this set, so dropping the proxy (aborting this task) ends them all.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let _ = client.set_nodelay(true);
                connections.spawn(connection(client, upstream_port, stalled.clone(), generation.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Waits while stalled; false when the connection was cut meanwhile.
async fn wait_unstalled(
    stalled: &mut watch::Receiver<bool>,
    cut: &mut watch::Receiver<u64>,
) -> bool {
    loop {
        if !*stalled.borrow_and_update() {
            return true;
        }
        tokio::select! {
            _ = stalled.changed() => {}
            _ = cut.changed() => return false,
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream_port: u16,
    mut stalled: watch::Receiver<bool>,
    mut cut: watch::Receiver<u64>,
) {
    cut.mark_unchanged();
    if !wait_unstalled(&mut stalled, &mut cut).await {
        return;
    }
    let Ok(upstream) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
        return; // the server is down: the client sees its connection closed
    };
    let _ = upstream.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (ur, uw) = upstream.into_split();
    let up = pump(cr, uw, stalled.clone(), cut.clone());
    let down = pump(ur, cw, stalled, cut);
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Copies `from` to `to`, holding each chunk while stalled, until EOF, an error or a cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
    mut cut: watch::Receiver<u64>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = cut.changed() => return,
        };
        if !wait_unstalled(&mut stalled, &mut cut).await {
            return;
        }
        tokio::select! {
            r = to.write_all(&buf[..n]) => if r.is_err() { return },
            _ = cut.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn forwards_stalls_and_cuts() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_port = echo.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = echo.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut b = [0u8; 16];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy = Proxy::start(0, echo_port).await;
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        let mut b = [0u8; 4];
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");

        proxy.stall();
        c.write_all(b"held").await.unwrap();
        let held =
            tokio::time::timeout(std::time::Duration::from_millis(300), c.read_exact(&mut b)).await;
        assert!(held.is_err(), "nothing moves while stalled");
        proxy.resume();
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"held");

        proxy.cut();
        let n = c.read(&mut b).await.unwrap_or(0);
        assert_eq!(n, 0, "a cut connection is closed");
        let mut again = TcpStream::connect(("127.0.0.1", proxy.port)).await.unwrap();
        again.write_all(b"more").await.unwrap();
        again.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"more");
    }
}
