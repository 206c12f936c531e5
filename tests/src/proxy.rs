//! A TCP proxy for network faults: in front of the broker or PostgreSQL, it forwards bytes both
//! ways until told to **stall** (connections stay open, nothing moves, new connections wait:
//! a network partition that TCP does not notice) or to **cut** (every open connection is
//! closed at once: a reset link). Real sockets, real clients; nothing in our code knows.
//!
//! It can also **limit the rate** at which the server's bytes reach the clients
//! ([`Proxy::limit_rate`]: a slow link).
//!
//! In front of a Kafka broker it can also **swallow requests** of one API
//! ([`Proxy::start_kafka`], [`Proxy::swallow`]): the request frame is read and dropped, so
//! the broker never answers it while the connection and every other request carry on (a
//! coordinator that hangs on one JoinGroup, say).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    swallow: Arc<Swallow>,
    /// Bytes per second from the server to the clients (0: no limit).
    rate: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// Which Kafka requests to swallow; only a proxy started with [`Proxy::start_kafka`] reads
/// the request frames.
#[derive(Debug, Default)]
struct Swallow {
    kafka: bool,
    /// The API key (`i16`) to swallow, as `u64` (`u64::MAX`: none).
    api_key: AtomicU64,
    /// How many more to swallow.
    remaining: AtomicU64,
    /// How many were swallowed.
    swallowed: AtomicU64,
}

impl Swallow {
    /// True when this request frame is to be dropped (and counts it).
    fn takes(&self, frame: &[u8]) -> bool {
        let Some(key) = frame.get(4..6) else {
            return false;
        };
        let key = u64::from(u16::from_be_bytes([key[0], key[1]]));
        if key != self.api_key.load(Ordering::SeqCst) {
            return false;
        }
        let took = self
            .remaining
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if took {
            self.swallowed.fetch_add(1, Ordering::SeqCst);
        }
        took
    }
}

/// Kafka's JoinGroup API key.
pub const JOIN_GROUP: i16 = 11;

impl Proxy {
    /// Listens on `port` (0: any free port) and forwards to `127.0.0.1:upstream_port`.
    pub async fn start(port: u16, upstream_port: u16) -> Self {
        Self::start_with(port, upstream_port, Swallow::default()).await
    }

    /// A proxy in front of the PostgreSQL server of `database_url` (on this machine), and the
    /// URL that reaches the same database through it.
    pub async fn in_front_of_database(database_url: &str) -> (Self, String) {
        let pg_port: u16 = database_url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .expect("the database URL names a port");
        let proxy = Self::start(0, pg_port).await;
        let url = database_url.replacen(&format!(":{pg_port}/"), &format!(":{}/", proxy.port), 1);
        (proxy, url)
    }

    /// [`Proxy::start`] in front of a Kafka broker: it reads the clients' request frames, so
    /// that it can [`Proxy::swallow`] some.
    pub async fn start_kafka(port: u16, upstream_port: u16) -> Self {
        let swallow = Swallow {
            kafka: true,
            api_key: AtomicU64::new(u64::MAX),
            ..Swallow::default()
        };
        Self::start_with(port, upstream_port, swallow).await
    }

    /// Drops the next `count` requests of Kafka API `api_key` (e.g. [`JOIN_GROUP`]) that any
    /// client sends: the broker never sees them, the client never gets an answer.
    ///
    /// # Panics
    /// When the proxy was not started with [`Proxy::start_kafka`].
    pub fn swallow(&self, api_key: i16, count: u64) {
        assert!(
            self.swallow.kafka,
            "only a Kafka proxy reads request frames"
        );
        self.swallow.remaining.store(count, Ordering::SeqCst);
        self.swallow
            .api_key
            .store(u64::from(api_key as u16), Ordering::SeqCst);
    }

    /// How many requests were swallowed so far.
    pub fn swallowed(&self) -> u64 {
        self.swallow.swallowed.load(Ordering::SeqCst)
    }

    async fn start_with(port: u16, upstream_port: u16, swallow: Swallow) -> Self {
        let swallow = Arc::new(swallow);
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let (stalled, stalled_rx) = watch::channel(false);
        let (generation, generation_rx) = watch::channel(0u64);
        let rate = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(accept_loop(
            listener,
            upstream_port,
            stalled_rx,
            generation_rx,
            swallow.clone(),
            rate.clone(),
        ));
        Self {
            port,
            stalled,
            generation,
            swallow,
            rate,
            task,
        }
    }

    /// From now on the server's bytes reach each client at most `bytes_per_second` (0: no
    /// limit), on open and new connections: a slow link, in one direction.
    pub fn limit_rate(&self, bytes_per_second: u64) {
        self.rate.store(bytes_per_second, Ordering::SeqCst);
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
    swallow: Arc<Swallow>,
    rate: Arc<AtomicU64>,
) {
    // Connections live in this set, so dropping the proxy (aborting this task) ends them all.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let _ = client.set_nodelay(true);
                connections.spawn(connection(client, upstream_port, stalled.clone(), generation.clone(), swallow.clone(), rate.clone()));
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
    swallow: Arc<Swallow>,
    rate: Arc<AtomicU64>,
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
    let frames = swallow.kafka.then_some(swallow);
    let up = pump(cr, uw, stalled.clone(), cut.clone(), frames, None);
    let down = pump(ur, cw, stalled, cut, None, Some(rate));
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Copies `from` to `to`, holding each chunk while stalled, until EOF, an error or a cut.
/// With `frames`, what it copies are Kafka request frames (a 4-byte length, then the request)
/// and the ones `frames` takes are dropped. With `rate` (bytes per second, 0: none), each chunk
/// waits until the link would have carried it.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
    mut cut: watch::Receiver<u64>,
    frames: Option<Arc<Swallow>>,
    rate: Option<Arc<AtomicU64>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
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
        let limit = rate.as_ref().map_or(0, |r| r.load(Ordering::SeqCst));
        if limit > 0 {
            let carried = std::time::Duration::from_secs_f64(n as f64 / limit as f64);
            tokio::select! {
                _ = tokio::time::sleep(carried) => {}
                _ = cut.changed() => return,
            }
        }
        let out: std::borrow::Cow<'_, [u8]> = match &frames {
            None => (&buf[..n]).into(),
            Some(swallow) => {
                pending.extend_from_slice(&buf[..n]);
                take_frames(&mut pending, swallow).into()
            }
        };
        tokio::select! {
            r = to.write_all(&out) => if r.is_err() { return },
            _ = cut.changed() => return,
        }
    }
}

/// The whole request frames at the start of `pending` that `swallow` does not take (removed
/// from `pending`; a partial frame stays).
fn take_frames(pending: &mut Vec<u8>, swallow: &Swallow) -> Vec<u8> {
    let mut forward = Vec::new();
    let mut at = 0;
    while let Some(len) = pending.get(at..at + 4) {
        let end = at + 4 + u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let Some(frame) = pending.get(at..end) else {
            break;
        };
        if !swallow.takes(frame) {
            forward.extend_from_slice(frame);
        }
        at = end;
    }
    pending.drain(..at);
    forward
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(api_key: i16, body: &[u8]) -> Vec<u8> {
        let mut f = ((2 + body.len()) as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&api_key.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    #[test]
    fn swallows_only_the_requests_asked_for_across_partial_frames() {
        let swallow = Swallow {
            kafka: true,
            api_key: AtomicU64::new(u64::from(JOIN_GROUP as u16)),
            remaining: AtomicU64::new(1),
            swallowed: AtomicU64::new(0),
        };
        let (fetch, join, heartbeat) = (
            frame(1, b"fetch"),
            frame(JOIN_GROUP, b"j1"),
            frame(12, b"hb"),
        );
        let mut stream = [fetch.clone(), join.clone(), heartbeat.clone(), join.clone()].concat();
        let tail = stream.split_off(stream.len() - 3);
        let mut pending = stream;
        let first = take_frames(&mut pending, &swallow);
        assert_eq!(
            first,
            [fetch, heartbeat].concat(),
            "the first JoinGroup is dropped"
        );
        assert_eq!(pending.len(), join.len() - 3, "a partial frame waits");
        pending.extend_from_slice(&tail);
        assert_eq!(
            take_frames(&mut pending, &swallow),
            join,
            "only one was asked for"
        );
        assert!(pending.is_empty());
        assert_eq!(swallow.swallowed.load(Ordering::SeqCst), 1);
    }

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
