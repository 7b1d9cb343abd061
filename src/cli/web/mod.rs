//! The HTTP listener of `cairn run --listen` and `cairn serve`: Prometheus metrics, the health
//! endpoints and the dashboard, with actions when allowed (`docs/web.md`).
//!
//! It runs on the runtime it is started on (the daemon's own, for `cairn run`). `/metrics`,
//! `/healthz` and `/readyz` of a daemon answer from its memory ([`crate::observe`]); the
//! dashboard's JSON is what `cairn status --json` and `cairn show --json` print, kept up to
//! date by one reader thread and shared by every request ([`reader`]), so that no request
//! reads the queue's files, and the first screen carries one page of the table ([`page`]).

mod actions;
mod assets;
mod error;
mod page;
mod queue_metrics;
mod reader;
pub(super) mod serve;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::observe::{Liveness, Observer};
use error::WebError;

pub(super) use actions::Token;
pub(super) use reader::ReadSource;

/// What the listener serves from.
pub(super) struct WebConfig {
    pub listen: SocketAddr,
    /// A running daemon's metrics and health (`cairn run`); `None` for `cairn serve`, whose
    /// metrics are the queue's counts.
    pub observer: Option<Arc<Observer>>,
    /// Where the dashboard reads the queue.
    pub source: ReadSource,
    /// Actions are allowed with this token (`--allow-actions`); `None`: read-only.
    pub token: Option<Token>,
}

#[derive(Clone)]
struct App {
    observer: Option<Arc<Observer>>,
    reader: reader::Reader,
    source: ReadSource,
    token: Option<Token>,
}

/// Bind the listener now (so that an address in use is an error at start), and return the
/// future that serves it, with the address it bound.
pub(super) async fn bind(
    config: WebConfig,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let bound = listener.local_addr()?;
    let app = App {
        observer: config.observer,
        reader: reader::Reader::start(config.source.clone()),
        source: config.source,
        token: config.token,
    };
    let router = router(app);
    let serve = async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!("the HTTP listener stopped: {e}");
        }
    };
    Ok((bound, serve))
}

/// What the start message says about who can reach the address.
pub(super) fn reach(addr: SocketAddr) -> &'static str {
    if addr.ip().is_loopback() {
        "loopback only: this host's users"
    } else {
        "NOT loopback: every host that can reach this address"
    }
}

fn router(app: App) -> Router {
    Router::new()
        .route("/", get(assets::index))
        .route("/task/{id}", get(assets::task_page))
        .route("/assets/app.js", get(assets::script))
        .route("/assets/app.css", get(assets::style))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/info", get(api_info))
        .route("/api/status", get(api_status))
        .route("/api/task/{id}", get(api_task))
        .route("/api/actions/{action}", post(actions::act))
        .with_state(app)
}

/// The OpenMetrics text format (a strict superset Prometheus reads as its text format).
const METRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn metrics(State(app): State<App>) -> Response {
    let text = match &app.observer {
        Some(observer) => observer.metrics.encode(),
        None => match from_snapshot(&app, |snapshot| {
            let document = snapshot.document.as_ref().map_err(Clone::clone)?;
            Ok(queue_metrics::render(document))
        })
        .await
        {
            Ok(text) => text,
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        },
    };
    ([(header::CONTENT_TYPE, METRICS_TYPE)], text).into_response()
}

/// What `make` gives of the latest status document, made on the blocking pool: a page of a
/// large queue is cut and encoded off the daemon's thread.
async fn from_snapshot(
    app: &App,
    make: impl FnOnce(&reader::Snapshot) -> Result<String, WebError> + Send + 'static,
) -> Result<String, WebError> {
    let snapshot = app.reader.snapshot().await?;
    tokio::task::spawn_blocking(move || make(&snapshot))
        .await
        .map_err(|e| WebError::Blocking(e.to_string()))?
}

/// 200 while the main loop turns (and while it starts), 503 once it has not turned for longer
/// than the watchdog allows. `cairn serve` runs no loop: it is alive while it answers.
async fn healthz(State(app): State<App>) -> Response {
    let Some(observer) = &app.observer else {
        return (
            StatusCode::OK,
            "ok: serving the queue (no daemon loop here)\n",
        )
            .into_response();
    };
    let limit = observer.health.stall_limit();
    match observer.health.liveness() {
        Liveness::Starting => (
            StatusCode::OK,
            "ok: starting (recovering the queue)\n".to_string(),
        ),
        Liveness::Turning(since) => (
            StatusCode::OK,
            format!("ok: the main loop turned {} ms ago\n", since.as_millis()),
        ),
        Liveness::Stalled(since) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stalled: the main loop has not turned for {} s (the limit is {} s)\n",
                since.as_secs(),
                limit.as_secs()
            ),
        ),
    }
    .into_response()
}

/// 200 once the queue is locked and recovered (when READY=1 is sent), 503 before.
async fn readyz(State(app): State<App>) -> Response {
    match &app.observer {
        Some(observer) if observer.health.is_ready() => (StatusCode::OK, "ready\n").into_response(),
        Some(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: locking the queue and recovering what was in flight\n",
        )
            .into_response(),
        None => (StatusCode::OK, "ready\n").into_response(),
    }
}

/// What the page needs to know of the listener: whether actions are allowed, and whether a
/// daemon runs here.
async fn api_info(State(app): State<App>) -> Response {
    let info = serde_json::json!({
        "actions": app.token.is_some(),
        "daemon": app.observer.is_some(),
        "version": env!("CARGO_PKG_VERSION"),
    });
    json_response(&info.to_string())
}

/// The status document; with `limit`, one page of its table ([`page`]).
async fn api_status(State(app): State<App>, Query(query): Query<page::PageQuery>) -> Response {
    let answer = from_snapshot(&app, move |snapshot| {
        if query.is_page() {
            let document = snapshot.document.as_ref().map_err(Clone::clone)?;
            Ok(page::page(document, &query).to_string())
        } else {
            snapshot.text().map(str::to_string)
        }
    })
    .await;
    match answer {
        Ok(json) => json_response(&json),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn api_task(State(app): State<App>, UrlPath(id): UrlPath<String>) -> Response {
    match app.reader.task(id).await {
        Ok(Some(json)) => json_response(&json),
        Ok(None) => (StatusCode::NOT_FOUND, "no such task\n").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

fn json_response(json: &str) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
    headers.insert(header::CACHE_CONTROL, "no-store".parse().unwrap());
    (headers, json.to_string()).into_response()
}

/// `--listen`, `--allow-actions` and `--token-file`, of `cairn run` and `cairn serve`.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct ListenArgs {
    /// Serve Prometheus metrics (/metrics), health (/healthz, /readyz) and the dashboard on
    /// this address, e.g. 127.0.0.1:9464 (off by default). A non-loopback address lets every
    /// host that reaches it read the queue: see docs/web.md.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,

    /// Let the dashboard pause, resume, cancel, retry and fork tasks, as the user running
    /// this cairn; each action needs the token printed at start (or --token-file's).
    #[arg(long, requires = "listen")]
    pub allow_actions: bool,

    /// With --allow-actions: the token actions need, from this file's first line (not
    /// readable by every user) instead of a fresh one printed at start.
    #[arg(long, value_name = "PATH", requires = "allow_actions")]
    pub token_file: Option<std::path::PathBuf>,
}

/// A listener configured and not bound yet.
pub(super) struct Listener {
    pub observer: Arc<Observer>,
    config: WebConfig,
}

impl ListenArgs {
    /// The listener `--listen` asks for with a daemon, if any; `db`: the shared queue's URL.
    pub(super) fn config(
        &self,
        queue: &std::path::Path,
        db: Option<String>,
    ) -> crate::cli::error::CliResult<Option<Listener>> {
        let Some(listen) = self.listen else {
            return Ok(None);
        };
        let observer = Arc::new(Observer::new(crate::observe::Health::new()));
        Ok(Some(Listener {
            observer: Arc::clone(&observer),
            config: WebConfig {
                listen,
                observer: Some(observer),
                source: ReadSource {
                    queue: queue.to_path_buf(),
                    db,
                },
                token: self.token()?,
            },
        }))
    }

    /// The action token: none without --allow-actions, else --token-file's or a fresh one.
    pub(super) fn token(&self) -> crate::cli::error::CliResult<Option<Token>> {
        if !self.allow_actions {
            return Ok(None);
        }
        match &self.token_file {
            Some(file) => actions::token_from_file(file).map(Some),
            None => actions::fresh_token().map(Some),
        }
    }
}

impl Listener {
    /// Bind, say where and who can reach it, and return the serving future.
    pub(super) async fn bind(
        self,
    ) -> crate::cli::error::CliResult<impl std::future::Future<Output = ()>> {
        start(self.config).await
    }
}

/// Bind the configured listener and announce it on stderr.
pub(super) async fn start(
    config: WebConfig,
) -> crate::cli::error::CliResult<impl std::future::Future<Output = ()>> {
    let listen = config.listen;
    let generated = config.token.as_ref().is_some_and(|t| t.generated);
    let token = config.token.as_ref().map(|t| t.secret.clone());
    let (bound, serve) = bind(config).await.map_err(|e| {
        crate::cli::error::CliError::failure(format_args!("--listen {listen}: {e}"))
    })?;
    let actions = match (&token, generated) {
        (None, _) => "read-only (start with --allow-actions to act from the page)".to_string(),
        (Some(token), true) => {
            format!("actions allowed with the token {token} (open http://{bound}/#token={token})")
        }
        (Some(_), false) => "actions allowed with the token of --token-file".to_string(),
    };
    eprintln!(
        "cairn: listening on http://{bound}/ ({}); {actions}",
        reach(bound)
    );
    Ok(serve)
}
