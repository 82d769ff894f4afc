//! flowd's HTTP connections: accepted and served here rather than by
//! `axum::serve`, which sets no limit a hostile client cannot outlast.
//!
//! * At most `MAX_CONNECTIONS` are open at once; one more is closed as soon
//!   as it is accepted, so that a flood neither grows memory nor fills the
//!   kernel's backlog for the clients that play fair.
//! * A request's header must arrive whole within `HEADER_READ_TIMEOUT`
//!   (hyper's own timer): a client that trickles it a byte at a time, or
//!   that connects and says nothing, is cut off.
//! * A connection with no byte read or written for `IDLE_TIMEOUT` is
//!   closed (an idle keep-alive connection, a client that stopped reading).
//! * On shutdown, accepting stops and open connections finish the request
//!   they serve, for at most `SHUTDOWN_GRACE`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Connections open at once.
pub(crate) const MAX_CONNECTIONS: usize = 1024;
/// How long a request's header may take to arrive.
pub(crate) const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may stay without a byte either way.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long open connections get to finish on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Serves `app` on `listener` until `shutdown` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, most likely: wait, as a
                    // busy server does, rather than spin.
                    tracing::warn!("cannot accept a connection: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(place) = Arc::clone(&places).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Watched {
            inner: stream,
            activity: Arc::clone(&activity),
        });
        let service = TowerToHyperService::new(app.clone());
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            let _place = place;
            let mut connection = std::pin::pin!(connection);
            loop {
                let check = IDLE_TIMEOUT.saturating_sub(activity.idle_for());
                tokio::select! {
                    _ = &mut connection => return,
                    () = tokio::time::sleep(check) => {
                        if activity.idle_for() >= IDLE_TIMEOUT {
                            // Dropping the connection closes its socket.
                            return;
                        }
                    }
                }
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

/// When a connection last read or wrote a byte.
struct Activity {
    since: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            since: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let now = self.since.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.since.elapsed().saturating_sub(last)
    }
}

/// A connection's socket, noting each byte that moves.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, data);
        if matches!(polled, Poll::Ready(Ok(written)) if written > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
