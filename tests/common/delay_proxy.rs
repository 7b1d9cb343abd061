//! A small delaying TCP proxy in front of a throwaway PostgreSQL (which listens only on its
//! Unix socket): every chunk of bytes, in each direction, is passed on `one_way` after it
//! arrived, in order. It stands for a slow link between a daemon and its database; the
//! kernel here has no netem. It can also cut the link silently ([`DelayProxy::cut`]): bytes
//! are taken in but passed on to neither side, and no connection is closed, as with a
//! partition. It runs on its own runtime and stops when dropped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A running proxy; dropping it stops it (and every connection through it).
pub(crate) struct DelayProxy {
    port: u16,
    /// While true, nothing is passed on (a silent partition).
    cut: Arc<tokio::sync::watch::Sender<bool>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl DelayProxy {
    /// Listen on a free port of 127.0.0.1 and relay each connection to the Unix socket in
    /// `socket_dir` (PostgreSQL's `.s.PGSQL.5432`), `one_way` late in each direction.
    pub(crate) fn start(socket_dir: &std::path::Path, one_way: Duration) -> DelayProxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("starting the proxy's runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("binding the proxy's port");
        let port = listener.local_addr().expect("the proxy's address").port();
        let socket = socket_dir.join(".s.PGSQL.5432");
        let cut = Arc::new(tokio::sync::watch::channel(false).0);
        runtime.spawn(accept(listener, socket, one_way, Arc::clone(&cut)));
        DelayProxy {
            port,
            cut,
            runtime: Some(runtime),
        }
    }

    /// Cut the link silently (`true`) or heal it (`false`): what was held back is passed on
    /// once it heals, in order.
    pub(crate) fn cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }

    /// A connection string for `user` to database `postgres` through the proxy.
    pub(crate) fn url(&self, user: &str) -> String {
        format!(
            "postgresql://{user}@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

type Cut = Arc<tokio::sync::watch::Sender<bool>>;

async fn accept(listener: TcpListener, socket: PathBuf, one_way: Duration, cut: Cut) {
    while let Ok((client, _)) = listener.accept().await {
        let _ = client.set_nodelay(true);
        let socket = socket.clone();
        let cut = Arc::clone(&cut);
        tokio::spawn(async move {
            if let Ok(server) = UnixStream::connect(&socket).await {
                relay(client, server, one_way, cut).await;
            }
        });
    }
}

async fn relay(client: TcpStream, server: UnixStream, one_way: Duration, cut: Cut) {
    let (from_client, to_client) = client.into_split();
    let (from_server, to_server) = server.into_split();
    tokio::join!(
        delayed(from_client, to_server, one_way, cut.subscribe()),
        delayed(from_server, to_client, one_way, cut.subscribe())
    );
}

/// Pass what `from` sends on to `to`, each chunk `delay` after it arrived.
async fn delayed(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    delay: Duration,
    mut cut: tokio::sync::watch::Receiver<bool>,
) {
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0
                || chunks
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if cut.wait_for(|cut| !cut).await.is_err() {
                break;
            }
            if to.write_all(&bytes).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}
