//! `pipeline serve --model MODEL`: predictions over HTTP/1.1 (`docs/serve.md`).
//!
//! - `POST /v1/predict`: `{"rows": [...], "top_k": k, "probabilities": bool}` → `{"rows":
//!   [...]}`, each row the JSON line `predict --input` prints for it ([`request`] reads the
//!   body; [`JsonRow`] is the one definition of a row).
//! - `GET /healthz`: `{"status": "ok"}` once the model is opened.
//! - `GET /v1/model`: the configuration, sizes, provenance, defaults and limits.
//!
//! The HTTP side is axum on a tokio runtime of two workers; parsing a request happens there.
//! Scoring happens on one scorer thread that owns the opened model and a rayon pool
//! ([`batch`]: concurrent requests are scored together in blocks). The two meet at a
//! bounded queue: a full queue answers 503 at once rather than letting latency grow
//! without bound. Limits: the body's size (413), rows per request (413), and the time a
//! request may take from its first byte to its answer (408 while the body is still
//! arriving, 503 once it waits for the scorer). Every refusal is a JSON `{"error": …}`
//! naming what was wrong, 404 and 405 included; none stops the server. [`connections`]
//! bounds what a client can hold: a request head's time, an idle connection's time, the
//! connections open at once. SIGTERM or SIGINT stops accepting connections, lets the
//! requests in flight finish, closes what is still open at `--shutdown-timeout`, then
//! exits 0.
//!
//! One access-log line per request on standard error: time, peer, method and path, status,
//! rows scored, milliseconds; a request whose client went away before its answer is logged
//! with status 499.

pub mod batch;
pub mod clock;
pub mod connections;
pub mod request;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use crossbeam_channel::{Sender, TrySendError};
use serde_json::{json, Value};
use tokio::sync::oneshot;

use crate::portable::PortableModel;
use crate::scoring::ranking::{default_top_k, resolved_top_k, with_serving_ranking};
use crate::stage::{thread_pool, threads_or_all};
use crate::store::classes::ClassMap;
use crate::store::predictions::JsonRow;
use crate::text::new_rows::{line_syntax, row_rules};
use crate::text::parse::UnknownFeatures;
use batch::{score_queue, Job};
use clock::utc_now;
use connections::ConnectionLimits;
use request::{Refusal, RequestRules};

/// What `pipeline serve` serves and how.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    /// The model file (`pipeline export`).
    pub model: PathBuf,
    /// Where to listen (port 0: any free port, printed when listening).
    pub addr: SocketAddr,
    /// Scoring threads (None: every core).
    pub threads: Option<usize>,
    pub limits: Limits,
    /// What a feature id ≥ the dataset's D is.
    pub unknown_features: UnknownFeatures,
}

/// The server's limits and batching.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes of a request body.
    pub max_body_bytes: usize,
    /// Rows of one request.
    pub max_rows: usize,
    /// From a request's arrival to its answer.
    pub timeout: Duration,
    /// Rows scored together at most ([`batch`]).
    pub max_block_rows: usize,
    /// Requests waiting for the scorer at most; more are answered 503.
    pub queue: usize,
    /// From a request head's first byte to its last; a connection slower is closed.
    pub header_timeout: Duration,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// After SIGTERM or SIGINT, connections still open this long are closed.
    pub shutdown_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 16 << 20,
            max_rows: 10_000,
            timeout: Duration::from_secs(30),
            max_block_rows: 1024,
            queue: 1024,
            header_timeout: Duration::from_secs(10),
            // Longer than nginx's upstream keep-alive (60 s): a proxy in front closes its
            // idle connections first, rather than reusing one the server is closing.
            idle_timeout: Duration::from_secs(75),
            // Each connection holds a file descriptor: 256 plus the server's own
            // (`connections::OWN_FILES`) stay well below the usual `ulimit -n` of 1024.
            max_connections: 256,
            // Below the 30 s Kubernetes gives between SIGTERM and SIGKILL (systemd gives
            // 90 s), so the server closes its connections itself.
            shutdown_timeout: Duration::from_secs(25),
        }
    }
}

/// The largest values the options of [`Limits`] take: what a server on one machine can
/// use. Nothing is allocated in proportion to a value before it is checked against these
/// (`--queue` sizes the scorer's queue up front, 16 bytes a place).
impl Limits {
    /// 1 GiB.
    pub const MOST_BODY_BYTES: usize = 1 << 30;
    pub const MOST_ROWS: usize = 1_000_000;
    pub const MOST_BLOCK_ROWS: usize = 65_536;
    pub const MOST_QUEUED: usize = 1_000_000;
    pub const MOST_CONNECTIONS: usize = 65_536;
    /// The shortest time limit: 1 ms.
    pub const SHORTEST_WAIT: Duration = Duration::from_millis(1);
    /// The longest time limit: 1 day.
    pub const LONGEST_WAIT: Duration = Duration::from_secs(86_400);
}

impl Limits {
    /// The limits [`connections`] applies.
    fn connections(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
            shutdown_timeout: self.shutdown_timeout,
        }
    }
}

/// What the handlers share.
struct Served {
    rules: RequestRules,
    classes: Option<ClassMap>,
    task: crate::trained::Task,
    n_labels: u64,
    limits: Limits,
    jobs: Sender<Box<Job>>,
    /// `GET /v1/model`'s body.
    info: Vec<u8>,
}

/// `POST /v1/predict`'s answer.
#[derive(serde::Serialize)]
struct Answer<'a> {
    rows: Vec<JsonRow<'a>>,
}

/// Rows a response carries, for the access log.
#[derive(Clone, Copy)]
struct RowsServed(usize);

/// Opens the model, starts the scorer, listens on `opts.addr` and serves until SIGTERM or
/// SIGINT. Prints `listening on http://ADDR` on standard error once requests are taken.
pub fn run(opts: &ServeOptions) -> Result<()> {
    let mut opts = opts.clone();
    opts.limits.max_connections = connections::connection_budget(opts.limits.max_connections)?;
    let model = PortableModel::open(&opts.model)?;
    let facts = model.dataset().clone();
    let rules = RequestRules {
        rows: row_rules(&facts, model.transform.clone(), opts.unknown_features)?,
        syntax: line_syntax(&facts),
        max_rows: opts.limits.max_rows,
        n_labels: facts.n_labels as usize,
    };
    let threads = threads_or_all(opts.threads);
    let info = serde_json::to_vec(&model_info(&model, &opts, threads))?;
    // Boxed: the channel allocates its places up front, so each is one pointer.
    let (jobs, queue) = crossbeam_channel::bounded::<Box<Job>>(opts.limits.queue);
    let scorer = start_scorer(model, threads, opts.limits.max_block_rows, queue)?;
    let served = Arc::new(Served {
        rules,
        classes: facts.class_map.clone(),
        task: scorer.task,
        n_labels: facts.n_labels,
        limits: opts.limits,
        jobs,
        info,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    runtime.block_on(listen(opts.addr, served))?;
    // Every sender is gone with the router: the scorer finishes its queue (skipping the
    // requests whose connection was closed) and stops.
    let blocks = scorer
        .thread
        .join()
        .map_err(|_| anyhow!("the scorer thread panicked"))??;
    eprintln!("stopped ({blocks} blocks scored)");
    Ok(())
}

/// The scorer thread, once its model is open.
struct Scorer {
    thread: std::thread::JoinHandle<Result<u64>>,
    task: crate::trained::Task,
}

/// Opens the ranking on a new thread (with `threads` rayon workers) and scores `queue`
/// there; returns once the model is open, or with the reason it could not be.
fn start_scorer(
    model: PortableModel,
    threads: usize,
    max_block_rows: usize,
    queue: crossbeam_channel::Receiver<Box<Job>>,
) -> Result<Scorer> {
    let pool = thread_pool(threads)?;
    let task = model.config.task;
    let (opened, ready) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("fsgp-scorer".into())
        .spawn(move || {
            let what = || format!("opening the model of {}", model.path.display());
            // Each job names its own top-k (`Ranking::rank_as`); this one is not used.
            let k = default_top_k(model.config.task, model.dataset().n_labels);
            pool.install(|| {
                // As for predict: blocks of one size, reused (`crate::alloc`).
                crate::alloc::for_recurring_steps();
                with_serving_ranking(&model.scoring_model(), (k, max_block_rows), &what, |r| {
                    let _ = opened.send(());
                    Ok(score_queue(r, &queue, max_block_rows))
                })
            })
        })
        .context("starting the scorer thread")?;
    if ready.recv().is_err() {
        // The thread ended before the model was open: its error says why.
        return Err(match thread.join() {
            Ok(Err(e)) => e,
            _ => anyhow!("the scorer thread stopped while opening the model"),
        });
    }
    Ok(Scorer { thread, task })
}

/// Binds `addr` and serves the routes until a signal, then drains.
async fn listen(addr: SocketAddr, served: Arc<Served>) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let bound = listener.local_addr()?;
    let limits = served.limits;
    let app = Router::new()
        .route("/v1/predict", post(predict))
        .route("/v1/model", get(model))
        .route("/healthz", get(healthz))
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
        .with_state(served)
        .layer(middleware::from_fn(access_log));
    let stop = shutdown_signal(limits.shutdown_timeout)?;
    eprintln!("listening on http://{bound}");
    connections::serve(listener, app, limits.connections(), stop).await;
    Ok(())
}

/// Resolves at SIGTERM or SIGINT. Both are caught from the call on (before the port is
/// announced), so a signal right after `listening on` is a shutdown, not a kill.
fn shutdown_signal(deadline: Duration) -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("catching SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("catching SIGINT")?;
    Ok(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        eprintln!(
            "{name}: not accepting connections; finishing the requests in flight (at most {} s, \
             --shutdown-timeout)",
            deadline.as_secs_f64()
        );
    })
}

async fn healthz() -> Response {
    json_response(StatusCode::OK, br#"{"status":"ok"}"#.to_vec())
}

async fn model(State(served): State<Arc<Served>>) -> Response {
    json_response(StatusCode::OK, served.info.clone())
}

/// 404 for a path no route has, 405 for a route's path with another method.
async fn no_route(request: Request) -> Response {
    let path = request.uri().path();
    let status = match ROUTES.iter().any(|(_, route)| *route == path) {
        true => StatusCode::METHOD_NOT_ALLOWED,
        false => StatusCode::NOT_FOUND,
    };
    let routes: Vec<String> = ROUTES.iter().map(|(m, p)| format!("{m} {p}")).collect();
    let message = format!(
        "no route {} {path}; the routes are {}",
        request.method(),
        routes.join(", ")
    );
    error_response(status, &message)
}

/// The routes, for [`no_route`]'s message.
const ROUTES: [(&str, &str); 3] = [
    ("POST", "/v1/predict"),
    ("GET", "/v1/model"),
    ("GET", "/healthz"),
];

/// `POST /v1/predict`.
async fn predict(State(served): State<Arc<Served>>, body: Body) -> Response {
    let deadline = tokio::time::Instant::now() + served.limits.timeout;
    let bytes = match read_body(body, &served.limits, deadline).await {
        Ok(bytes) => bytes,
        Err(refusal) => return refused(&refusal),
    };
    let parsed = match parse_off_the_runtime(&served, bytes).await {
        Ok(parsed) => parsed,
        Err(refusal) => return refused(&refusal),
    };
    let n = parsed.rows.len();
    let (reply, answer) = oneshot::channel();
    let job = Job {
        rows: parsed.rows,
        top_k: resolved_top_k(served.task, served.n_labels, parsed.top_k),
        probabilities: parsed.probabilities,
        reply,
    };
    match served.jobs.try_send(Box::new(job)) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            let message = format!(
                "busy: {} requests are waiting to be scored (the queue's limit); retry later",
                served.limits.queue
            );
            return error_response(StatusCode::SERVICE_UNAVAILABLE, &message);
        }
        Err(TrySendError::Disconnected(_)) => {
            return error_response(StatusCode::SERVICE_UNAVAILABLE, "the scorer has stopped")
        }
    }
    let block = match tokio::time::timeout_at(deadline, answer).await {
        Ok(Ok(Ok(block))) => block,
        Ok(Ok(Err(e))) => return error_response(StatusCode::INTERNAL_SERVER_ERROR, &e),
        Ok(Err(_)) => {
            return error_response(StatusCode::INTERNAL_SERVER_ERROR, "the scorer has stopped")
        }
        Err(_) => {
            let message = format!(
                "not scored within the {} s limit (--request-timeout)",
                served.limits.timeout.as_secs_f64()
            );
            return error_response(StatusCode::SERVICE_UNAVAILABLE, &message);
        }
    };
    let rows: Vec<JsonRow<'_>> = (0..block.len())
        .map(|i| JsonRow::of(&block, i, served.classes.as_ref()))
        .collect();
    // Serialised as the file's lines are (f32 scores at their shortest), not through a
    // `Value`, which would widen them to f64.
    match serde_json::to_vec(&Answer { rows }) {
        Ok(body) => {
            let mut response = json_response(StatusCode::OK, body);
            response.extensions_mut().insert(RowsServed(n));
            response
        }
        Err(e) => error_response(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

/// Bodies up to this size are parsed on the HTTP runtime's thread; larger ones (up to
/// `--max-body`, milliseconds of work) on tokio's blocking pool, so that a large request
/// does not hold up the small ones behind it on the runtime's two workers.
const INLINE_PARSE_BYTES: usize = 64 << 10;

async fn parse_off_the_runtime(
    served: &Arc<Served>,
    bytes: axum::body::Bytes,
) -> Result<request::Parsed, Refusal> {
    if bytes.len() <= INLINE_PARSE_BYTES {
        return served.rules.parse(&bytes);
    }
    let served = Arc::clone(served);
    tokio::task::spawn_blocking(move || served.rules.parse(&bytes))
        .await
        .unwrap_or_else(|e| {
            Err(Refusal {
                status: 500,
                message: format!("parsing the request failed: {e}"),
            })
        })
}

/// The whole body, at most `limits.max_body_bytes` (else 413), arrived before `deadline`
/// (else 408).
async fn read_body(
    body: Body,
    limits: &Limits,
    deadline: tokio::time::Instant,
) -> Result<axum::body::Bytes, Refusal> {
    let max = limits.max_body_bytes;
    let too_large = || {
        Refusal::too_large(format!(
            "the request body exceeds the limit of {max} bytes (--max-body)"
        ))
    };
    match tokio::time::timeout_at(deadline, axum::body::to_bytes(body, max)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => {
            let limit = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            match limit {
                true => Err(too_large()),
                false => Err(Refusal::malformed(format!("reading the request body: {e}"))),
            }
        }
        Err(_) => Err(Refusal {
            status: 408,
            message: format!(
                "the request body did not arrive within {} s (--request-timeout)",
                limits.timeout.as_secs_f64()
            ),
        }),
    }
}

fn refused(refusal: &Refusal) -> Response {
    let status = StatusCode::from_u16(refusal.status).unwrap_or(StatusCode::BAD_REQUEST);
    error_response(status, &refusal.message)
}

fn error_response(status: StatusCode, message: &str) -> Response {
    let body = serde_json::to_vec(&json!({ "error": message })).unwrap_or_default();
    json_response(status, body)
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// One line per request on standard error, also for a request dropped before its answer
/// (the client went away): status 499 then.
async fn access_log(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let mut line = LogLine {
        peer,
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        started: Instant::now(),
        outcome: None,
    };
    let response = next.run(request).await;
    let rows = response.extensions().get::<RowsServed>().map_or(0, |r| r.0);
    line.outcome = Some((response.status().as_u16(), rows));
    response
}

/// An access-log line, printed when the request ends, however it ends.
struct LogLine {
    peer: SocketAddr,
    method: String,
    path: String,
    started: Instant,
    /// Status and rows; None: dropped before an answer.
    outcome: Option<(u16, usize)>,
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let (status, rows) = self.outcome.unwrap_or((499, 0));
        eprintln!(
            "{} {} \"{} {}\" {status} rows={rows} {:.3}ms",
            utc_now(),
            self.peer,
            self.method,
            self.path,
            self.started.elapsed().as_secs_f64() * 1e3
        );
    }
}

/// `GET /v1/model`'s body.
fn model_info(model: &PortableModel, opts: &ServeOptions, threads: usize) -> Value {
    let params = model.params();
    let facts = model.dataset();
    let task = model.config.task;
    json!({
        "model_file": model.path.display().to_string(),
        "task": task,
        "sizes": {
            "features": facts.n_features,
            "labels": facts.n_labels,
            "inducing": params.q.mu().nrows(),
            // 0 when the model never reads X̃.
            "rank": model.basis.view2::<f32>().map_or(0, |b| b.nrows()),
            "factors": params.phi.ncols(),
        },
        "dataset": {
            "name": facts.name,
            "format": facts.format,
            "index_base": facts.index_base,
            "label_kind": facts.label_kind,
            "transform": facts.transform,
            "first_label": facts.first_label,
        },
        "provenance": model.provenance(),
        "config": model.file.config,
        "defaults": {
            "top_k": default_top_k(task, facts.n_labels),
            "probabilities": false,
        },
        "limits": {
            "max_body_bytes": opts.limits.max_body_bytes,
            "max_rows": opts.limits.max_rows,
            "request_timeout_seconds": opts.limits.timeout.as_secs_f64(),
            "queue": opts.limits.queue,
            "header_timeout_seconds": opts.limits.header_timeout.as_secs_f64(),
            "idle_timeout_seconds": opts.limits.idle_timeout.as_secs_f64(),
            "max_connections": opts.limits.max_connections,
            "shutdown_timeout_seconds": opts.limits.shutdown_timeout.as_secs_f64(),
        },
        "batching": {
            "max_block_rows": opts.limits.max_block_rows,
            "max_wait_ms": 0,
            "scoring_threads": threads,
        },
        "unknown_features": opts.unknown_features.name(),
    })
}
