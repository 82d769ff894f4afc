//! flowd's HTTP connections: accepted and served here rather than by
//! `axum::serve`, which sets no limit a hostile client cannot outlast.
//!
//! * At most `MAX_CONNECTIONS` are open at once; one more takes the place
//!   of the connection that has gone the longest without a request
//!   (between requests, or trickling a header it never finishes, past
//!   `EVICTABLE_AFTER`), or is closed as soon as it is accepted when every
//!   one is answering, so that a flood neither grows memory nor fills the
//!   kernel's backlog, and one client's idle or trickling connections
//!   cannot shut out the clients that play fair.
//! * A request's header must arrive whole within `HEADER_READ_TIMEOUT`
//!   (hyper's own timer): a client that trickles it a byte at a time, or
//!   that connects and says nothing, is cut off.
//! * A request's body must arrive whole within `BODY_READ_TIMEOUT` of its
//!   header, and a second more for each `BODY_BYTES_PER_SECOND` of it that
//!   has arrived: past it, reading the body fails and the request is
//!   answered 408 (`TimedBody`). A body trickled a byte every few seconds
//!   held its connection for good, and one that stalled was dropped
//!   without an answer (an audit); a large body on a slow link keeps
//!   coming, and is not cut for it.
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
/// How long a request's body may take to arrive, from its header ...
pub(crate) const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// ... and a second more for each this many of its bytes that arrived
/// (128 kbit/s): a body of the largest size (`server::BODY_LIMIT`, 2 MiB)
/// has 2 min 38 s at most, and one trickled has its 30 s.
pub(crate) const BODY_BYTES_PER_SECOND: u64 = 16 * 1024;
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
    let open = Arc::new(Open::default());
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
        let connection = Connection {
            app: app.clone(),
            open: Arc::clone(&open),
            graceful: graceful.watcher(),
        };
        match Arc::clone(&places).try_acquire_owned() {
            Ok(place) => connection.serve(stream, place),
            // Full: the connection idle the longest makes room, if one is
            // idle (regression: one client holding every place with
            // keep-alive connections, a request each every few seconds,
            // shut every other client out). Its place comes back when its
            // task ends; one not idle keeps it, and this one is closed.
            Err(_) => match open.take_longest_idle() {
                Some(idle) => {
                    idle.close.notify_one();
                    let places = Arc::clone(&places);
                    tokio::spawn(async move {
                        let place =
                            tokio::time::timeout(EVICTION_WAIT, places.acquire_owned()).await;
                        if let Ok(Ok(place)) = place {
                            connection.serve(stream, place);
                        }
                    });
                }
                None => drop(stream),
            },
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

/// How long a connection must have been without a request to make room
/// for a new one when every place is taken: a keep-alive connection
/// between requests, or one whose header is still arriving (a client that
/// trickled headers on 1,100 connections, a byte each in turn, held every
/// place, and fair clients were refused: an audit); never one whose
/// request is being answered.
const EVICTABLE_AFTER: Duration = Duration::from_secs(1);
/// How long a new connection waits for the place an idle one gives up.
const EVICTION_WAIT: Duration = Duration::from_secs(1);

/// What serving one connection needs.
struct Connection {
    app: Router,
    open: Arc<Open>,
    graceful: hyper_util::server::graceful::Watcher,
}

impl Connection {
    fn serve(self, stream: TcpStream, place: tokio::sync::OwnedSemaphorePermit) {
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let io = TokioIo::new(Watched {
            inner: stream,
            activity: Arc::clone(&activity),
        });
        let inner = TowerToHyperService::new(self.app);
        let counted = Arc::clone(&activity);
        // Counts the requests being answered, so that a connection is made
        // to give up its place only between requests.
        let service =
            hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let answering = Answering::start(&counted);
                let request = request.map(TimedBody::new);
                let response = hyper::service::Service::call(&inner, request);
                async move {
                    let response = response.await;
                    drop(answering);
                    response
                }
            });
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT);
        let connection = self.graceful.watch(http.serve_connection(io, service));
        let registered = self.open.register(Arc::clone(&activity));
        tokio::spawn(async move {
            let _place = place;
            let _registered = registered;
            let mut connection = std::pin::pin!(connection);
            loop {
                let check = IDLE_TIMEOUT.saturating_sub(activity.idle_for());
                tokio::select! {
                    _ = &mut connection => return,
                    // Dropping the connection closes its socket.
                    () = activity.close.notified() => return,
                    () = tokio::time::sleep(check) => {
                        if activity.idle_for() >= IDLE_TIMEOUT {
                            return;
                        }
                    }
                }
            }
        });
    }
}

/// A request's body that fails once its time has passed since its header
/// was read (`body_time`), whatever still arrives.
struct TimedBody {
    inner: hyper::body::Incoming,
    header_at: tokio::time::Instant,
    arrived: u64,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl TimedBody {
    fn new(inner: hyper::body::Incoming) -> TimedBody {
        let header_at = tokio::time::Instant::now();
        TimedBody {
            inner,
            header_at,
            arrived: 0,
            deadline: Box::pin(tokio::time::sleep_until(header_at + body_time(0))),
        }
    }
}

/// How long a body may take from its header once `arrived` bytes of it
/// have: [`BODY_READ_TIMEOUT`], and a second for each
/// [`BODY_BYTES_PER_SECOND`] of them.
fn body_time(arrived: u64) -> Duration {
    BODY_READ_TIMEOUT + Duration::from_secs_f64(arrived as f64 / BODY_BYTES_PER_SECOND as f64)
}

/// The error of a body that did not arrive in time: its words are how a
/// handler tells it from others (`api::json_bytes`).
#[derive(Debug)]
pub(crate) struct BodyTimedOut;

impl BodyTimedOut {
    pub(crate) const MESSAGE: &'static str = "the request's body did not arrive whole within 30 s of its header, and a second more for each 16 KiB that arrived";
}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(BodyTimedOut::MESSAGE)
    }
}

impl std::error::Error for BodyTimedOut {}

impl http_body::Body for TimedBody {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        // What has arrived is taken first: a body read late (a busy
        // runtime) is no late body.
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if let Some(Ok(frame)) = &frame
                && let Some(data) = frame.data_ref()
            {
                self.arrived += data.len() as u64;
                let deadline = self.header_at + body_time(self.arrived);
                self.deadline.as_mut().reset(deadline);
            }
            return Poll::Ready(
                frame.map(|frame| frame.map_err(|error| Box::new(error) as Self::Error)),
            );
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimedOut)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The connections open now, so that one idle can be found to make room.
#[derive(Default)]
struct Open {
    by_id: std::sync::Mutex<(u64, std::collections::HashMap<u64, Arc<Activity>>)>,
}

impl Open {
    fn register(self: &Arc<Open>, activity: Arc<Activity>) -> Registered {
        let mut open = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let id = open.0;
        open.0 += 1;
        open.1.insert(id, activity);
        Registered {
            open: Arc::clone(self),
            id,
        }
    }

    /// The connection that has gone without a request for the longest,
    /// past [`EVICTABLE_AFTER`], taken out of the open ones as it is to
    /// close: each new connection takes the place of another, so that a
    /// flood waits on as many sockets as it closes, never more.
    fn take_longest_idle(&self) -> Option<Arc<Activity>> {
        let mut open = self.by_id.lock().unwrap_or_else(|p| p.into_inner());
        let id = open
            .1
            .iter()
            .filter(|(_, activity)| activity.answering.load(Ordering::Relaxed) == 0)
            .map(|(id, activity)| (activity.without_request_for(), *id))
            .filter(|(idle, _)| *idle >= EVICTABLE_AFTER)
            .max_by_key(|(idle, _)| *idle)
            .map(|(_, id)| id)?;
        open.1.remove(&id)
    }
}

/// A connection in [`Open`] while it lives.
struct Registered {
    open: Arc<Open>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.open.by_id.lock().unwrap_or_else(|p| p.into_inner());
        open.1.remove(&self.id);
    }
}

/// One request being answered on a connection.
struct Answering(Arc<Activity>);

impl Answering {
    fn start(activity: &Arc<Activity>) -> Answering {
        activity.answering.fetch_add(1, Ordering::Relaxed);
        activity.requested();
        Answering(Arc::clone(activity))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
        self.0.requested();
    }
}

/// When a connection last read or wrote a byte (or ended a request),
/// how many requests it is answering, and its call to close.
struct Activity {
    since: Instant,
    last_ms: AtomicU64,
    /// When a request last began or ended (from `since`; 0 before any).
    request_ms: AtomicU64,
    answering: std::sync::atomic::AtomicU32,
    /// Notified when the connection is to give up its place.
    close: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            since: Instant::now(),
            last_ms: AtomicU64::new(0),
            request_ms: AtomicU64::new(0),
            answering: std::sync::atomic::AtomicU32::new(0),
            close: tokio::sync::Notify::new(),
        }
    }

    /// Notes now in `stamp`, in milliseconds from `since`.
    fn stamp(&self, stamp: &AtomicU64) {
        stamp.store(self.since.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since `stamp` was noted, or since the connection opened.
    fn since_stamp(&self, stamp: &AtomicU64) -> Duration {
        let last = Duration::from_millis(stamp.load(Ordering::Relaxed));
        self.since.elapsed().saturating_sub(last)
    }

    fn touch(&self) {
        self.stamp(&self.last_ms);
    }

    fn idle_for(&self) -> Duration {
        self.since_stamp(&self.last_ms)
    }

    fn requested(&self) {
        self.stamp(&self.request_ms);
    }

    /// How long since a request began or ended here, or since the
    /// connection opened: bytes of a header that never ends do not count.
    fn without_request_for(&self) -> Duration {
        self.since_stamp(&self.request_ms)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A body has its 30 s, and a second more for each 16 KiB that
    /// arrived: the largest takes at most 2 min 38 s, and a large body on
    /// a slow link is not cut for its size (a review: 30 s in all asked a
    /// 2 MiB deploy for 70 KB/s).
    #[test]
    fn a_body_has_more_time_as_it_arrives() {
        assert_eq!(body_time(0), Duration::from_secs(30));
        assert_eq!(body_time(16 * 1024), Duration::from_secs(31));
        assert_eq!(
            body_time(crate::server::BODY_LIMIT as u64),
            Duration::from_secs(158)
        );
    }
}
