//! The connections of `pipeline serve`: accepting them, bounding how long a client may hold
//! one, and closing them all at shutdown.
//!
//! axum's own server has no timeout on a request's head and none on an idle keep-alive
//! connection, so a client that trickles a head, or opens connections and sends nothing,
//! held the server (and its shutdown) for as long as it liked. Here each connection is
//! served by hyper's HTTP/1.1 connection directly (axum's `Router` still routes), watched by
//! its own task:
//!
//! - **head**: a request's head (request line and headers) must arrive whole within
//!   `--header-timeout` of its first byte, else the connection is closed;
//! - **idle**: a connection with no request in flight (just opened, or its last answer
//!   sent) is closed after `--idle-timeout` without a byte;
//! - **count**: at most `--max-connections` are open at once; one beyond is answered 503
//!   with a JSON body and closed, so a client is told at once rather than left waiting,
//!   and the server's file descriptors are never all taken ([`connection_budget`]);
//! - **shutdown**: at SIGTERM or SIGINT the listener is closed, idle connections are closed,
//!   requests in flight are answered, and every connection still open `--shutdown-timeout`
//!   later is closed.
//!
//! hyper's own `header_read_timeout` is not used: its clock starts when a connection starts
//! waiting for a head, so it would also be the idle timeout, and the two have different
//! jobs (a head takes milliseconds; a proxy keeps idle connections for a minute).
//! The body and the answer are bounded by `--request-timeout` in the handler.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::{bail, Result};
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, Response};
use axum::Router;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::clock::utc_now;

/// Refused connections being answered at once, at most. Each holds a file descriptor for
/// up to [`REFUSAL_LINGER`]; beyond this many, an excess connection is closed unanswered.
const REFUSAL_SLOTS: usize = 32;

/// How long a refused connection is kept after its 503 is written, reading (and
/// discarding) what the client sent. Closing a socket with unread input makes the kernel
/// send a reset, which can destroy the 503 before the client reads it.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

/// File descriptors the server keeps for itself beside its connections: the standard
/// streams, the runtime's poller and wakers, the listener, the model file, the signal
/// pipes, the refusals in flight ([`REFUSAL_SLOTS`]), and room to spare.
pub const OWN_FILES: usize = 32 + REFUSAL_SLOTS;

/// How long the accept loop pauses when `accept` fails (for example with no file
/// descriptor left), rather than spinning on the error.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// The connections this process can hold: `wanted`, or fewer when the file-descriptor
/// limit (`ulimit -n`) cannot hold `wanted` plus [`OWN_FILES`] even after the soft limit
/// is raised to the hard one. Prints a line when it lowers `wanted`; refuses when not even
/// one connection fits.
pub fn connection_budget(wanted: usize) -> Result<usize> {
    let needed = wanted.saturating_add(OWN_FILES) as u64;
    let mut limit = open_files_limit()?;
    if limit.rlim_cur < needed {
        let raised = libc::rlimit {
            rlim_cur: needed.min(limit.rlim_max),
            ..limit
        };
        // SAFETY: setrlimit reads the struct it is given; nothing else is touched.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    let files = limit.rlim_cur;
    let fits = usize::try_from(files.saturating_sub(OWN_FILES as u64)).unwrap_or(usize::MAX);
    if fits == 0 {
        bail!(
            "this process may open only {files} files (ulimit -n); serving needs more than \
             {OWN_FILES}"
        );
    }
    if fits < wanted {
        eprintln!(
            "--max-connections {wanted} lowered to {fits}: this process may open {files} files \
             (ulimit -n), {OWN_FILES} of them kept for the server itself"
        );
    }
    Ok(wanted.min(fits))
}

fn open_files_limit() -> Result<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives through the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        bail!(
            "reading the open-files limit: {}",
            io::Error::last_os_error()
        );
    }
    Ok(limit)
}

/// What bounds the connections (the server's `--header-timeout`, `--idle-timeout`,
/// `--max-connections` and `--shutdown-timeout`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConnectionLimits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// The budget [`connection_budget`] allowed.
    pub max_connections: usize,
    pub shutdown_timeout: Duration,
}

/// Serves `app` on `listener`'s connections until `stop` resolves, then closes the
/// listener and drains (see the module's documentation).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stop: impl std::future::Future<Output = ()>,
) {
    let timeouts = Timeouts {
        header: limits.header_timeout,
        idle: limits.idle_timeout,
    };
    let app = TowerToHyperService::new(app);
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let refusal = Arc::new(Refusal::new(limits.max_connections));
    let (stopping, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            () = &mut stop => break,
            Some(_) = connections.join_next() => {}
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(_) => {
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                        continue;
                    }
                };
                match Arc::clone(&open).try_acquire_owned() {
                    Ok(permit) => {
                        let connection = Connection {
                            peer,
                            app: app.clone(),
                            timeouts,
                            stopped: stopped.clone(),
                            _permit: permit,
                        };
                        connections.spawn(connection.serve(stream));
                    }
                    Err(_) => refusal.answer(stream, peer, &mut connections),
                }
            }
        }
    }
    drop(listener);
    let _ = stopping.send(true);
    drain(connections, limits.shutdown_timeout).await;
}

/// Waits for every connection to end, at most `deadline`; then closes those still open.
async fn drain(mut connections: JoinSet<()>, deadline: Duration) {
    let all_ended = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(deadline, all_ended).await.is_err() {
        eprintln!(
            "closing {} connections still open at the shutdown deadline ({} s, \
             --shutdown-timeout)",
            connections.len(),
            deadline.as_secs_f64()
        );
        connections.shutdown().await;
    }
}

/// The two timeouts of a connection.
#[derive(Clone, Copy)]
struct Timeouts {
    header: Duration,
    idle: Duration,
}

/// One accepted connection, within the limit.
struct Connection {
    peer: SocketAddr,
    app: TowerToHyperService<Router>,
    timeouts: Timeouts,
    /// Turns true at shutdown.
    stopped: watch::Receiver<bool>,
    /// Its place under `--max-connections`, given back when the connection ends.
    _permit: OwnedSemaphorePermit,
}

impl Connection {
    /// Serves the connection's requests until the client closes it, a timeout closes it,
    /// or shutdown ends it.
    async fn serve(mut self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let cycle = Arc::new(Cycle::new());
        let io = TokioIo::new(Watched {
            stream,
            cycle: Arc::clone(&cycle),
        });
        let (app, peer, requests) = (self.app.clone(), self.peer, Arc::clone(&cycle));
        let service = service_fn(move |mut request: Request<Incoming>| {
            requests.request_started();
            request.extensions_mut().insert(ConnectInfo(peer));
            let answered = app.call(request);
            let cycle = Arc::clone(&requests);
            async move {
                let response: Response<Body> = answered.await?;
                Ok::<_, Infallible>(response.map(|body| Answer { body, cycle }))
            }
        });
        let connection = http1::Builder::new().serve_connection(io, service);
        tokio::pin!(connection);
        let mut stopping = false;
        loop {
            let deadline = cycle.deadline(self.timeouts);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = self.stopped.changed(), if !stopping => {
                    stopping = true;
                    // Closes an idle connection now, a busy one after its answer.
                    connection.as_mut().graceful_shutdown();
                }
                () = cycle.changed.notified() => {}
                () = sleep_until(deadline) => match cycle.expired(self.timeouts) {
                    Some(Phase::Head { .. }) => {
                        eprintln!(
                            "{} {peer} closed: no whole request head within {} s \
                             (--header-timeout)",
                            utc_now(),
                            self.timeouts.header.as_secs_f64()
                        );
                        return;
                    }
                    Some(_) => return,
                    // The phase moved on while this task slept.
                    None => {}
                },
            }
        }
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Where a connection is between requests, for its timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in flight since `since` (the connection opened or its last answer went).
    Idle { since: Instant },
    /// A request's head began arriving at `since`.
    Head { since: Instant },
    /// A request is being read, handled or answered (bounded by the handler's own limit).
    Busy,
}

/// A connection's [`Phase`], told by its reads ([`Watched`]), its service and its answers'
/// bodies ([`Answer`]), and watched by the connection's task.
struct Cycle {
    phase: Mutex<Phase>,
    /// Wakes the connection's task when its deadline moves earlier or appears.
    changed: Notify,
}

impl Cycle {
    fn new() -> Self {
        Cycle {
            phase: Mutex::new(Phase::Idle {
                since: Instant::now(),
            }),
            changed: Notify::new(),
        }
    }

    fn set(&self, update: impl FnOnce(Phase) -> Option<Phase>) {
        let mut phase = self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(next) = update(*phase) {
            *phase = next;
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// Bytes arrived: an idle connection's next head has begun.
    fn bytes_arrived(&self) {
        self.set(|phase| match phase {
            Phase::Idle { .. } => Some(Phase::Head {
                since: Instant::now(),
            }),
            _ => None,
        });
    }

    /// A whole head was read: the request is in flight.
    fn request_started(&self) {
        self.set(|_| Some(Phase::Busy));
    }

    /// The answer was sent (its body is done): idle until the next head.
    fn answer_sent(&self) {
        self.set(|_| {
            Some(Phase::Idle {
                since: Instant::now(),
            })
        });
    }

    fn deadline(&self, timeouts: Timeouts) -> Option<Instant> {
        match *self.phase.lock().unwrap_or_else(PoisonError::into_inner) {
            Phase::Idle { since } => Some(since + timeouts.idle),
            Phase::Head { since } => Some(since + timeouts.header),
            Phase::Busy => None,
        }
    }

    /// The phase, if its deadline has passed.
    fn expired(&self, timeouts: Timeouts) -> Option<Phase> {
        let phase = *self.phase.lock().unwrap_or_else(PoisonError::into_inner);
        let passed = self
            .deadline(timeouts)
            .is_some_and(|at| at <= Instant::now());
        passed.then_some(phase)
    }
}

/// A connection's socket, telling its [`Cycle`] when bytes arrive.
struct Watched {
    stream: TcpStream,
    cycle: Arc<Cycle>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.cycle.bytes_arrived();
        }
        read
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// An answer's body, telling its connection's [`Cycle`] when it is done (hyper drops a
/// body once it has written all of it).
struct Answer {
    body: Body,
    cycle: Arc<Cycle>,
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.cycle.answer_sent();
    }
}

impl HttpBody for Answer {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// How connections beyond `--max-connections` are answered.
struct Refusal {
    /// The whole 503 response.
    response: Vec<u8>,
    /// At most [`REFUSAL_SLOTS`] answered at once.
    slots: Arc<Semaphore>,
    limit: usize,
}

impl Refusal {
    fn new(limit: usize) -> Self {
        let message =
            format!("too many open connections (limit {limit}, --max-connections); retry later");
        let body = serde_json::json!({ "error": message }).to_string();
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        Refusal {
            response: response.into_bytes(),
            slots: Arc::new(Semaphore::new(REFUSAL_SLOTS)),
            limit,
        }
    }

    /// Answers `stream` 503 and closes it, on a task of `tasks` (so that shutdown ends it
    /// too); closes it unanswered when [`REFUSAL_SLOTS`] refusals are already under way.
    fn answer(&self, stream: TcpStream, peer: SocketAddr, tasks: &mut JoinSet<()>) {
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            return;
        };
        eprintln!(
            "{} {peer} refused: too many open connections (limit {}, --max-connections)",
            utc_now(),
            self.limit
        );
        let response = self.response.clone();
        tasks.spawn(async move {
            let _slot = slot;
            let _ = tokio::time::timeout(REFUSAL_LINGER, refuse(stream, &response)).await;
        });
    }
}

/// Writes `response`, ends the sending side, then reads what the client sent until it
/// closes (the caller bounds the time).
async fn refuse(mut stream: TcpStream, response: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < response.len() {
        stream.writable().await?;
        match stream.try_write(&response[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await?;
    let mut sink = [0u8; 4096];
    loop {
        stream.readable().await?;
        match stream.try_read(&mut sink) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        header: Duration::from_secs(2),
        idle: Duration::from_secs(60),
    };

    /// The deadline follows the phase: idle, then a head's first byte (the head's shorter
    /// limit, counted from that byte), none while busy, idle again after the answer.
    #[test]
    fn the_deadline_follows_the_request_cycle() {
        let opened = Instant::now();
        let cycle = Cycle::new();
        let idle = cycle.deadline(TIMEOUTS).unwrap();
        assert!(idle >= opened + TIMEOUTS.idle);
        cycle.bytes_arrived();
        let head = cycle.deadline(TIMEOUTS).unwrap();
        assert!(head < idle && head >= opened + TIMEOUTS.header);
        // More bytes of the same head do not move its deadline.
        cycle.bytes_arrived();
        assert_eq!(cycle.deadline(TIMEOUTS), Some(head));
        cycle.request_started();
        assert_eq!(cycle.deadline(TIMEOUTS), None);
        cycle.bytes_arrived(); // the body
        assert_eq!(cycle.deadline(TIMEOUTS), None);
        cycle.answer_sent();
        assert!(cycle.deadline(TIMEOUTS).unwrap() >= opened + TIMEOUTS.idle);
        assert_eq!(cycle.expired(TIMEOUTS), None);
    }

    #[test]
    fn the_budget_keeps_files_for_the_server() {
        let limit = open_files_limit().unwrap();
        let budget = connection_budget(usize::MAX - OWN_FILES).unwrap();
        let files = open_files_limit().unwrap().rlim_cur;
        assert!(files >= limit.rlim_cur);
        assert!((budget + OWN_FILES) as u64 <= files, "{budget} of {files}");
        assert_eq!(connection_budget(1).unwrap(), 1);
    }
}
