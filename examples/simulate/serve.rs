//! `--serve ADDR`: the interactive page. `GET /` serves the page (its HTML, script and
//! style are compiled into the binary, so it works offline), `GET /api/scenario` the
//! scenario the flags describe, where the controls start, and `POST /api/simulate` runs a
//! posted scenario with the same engine call as the command line (`run_blocking` on
//! virtual time) and answers the rows, the series and the traced caller's requests.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::Semaphore;
use tollgate_simulator::Scenario;

use crate::api::{self, Answer, BadScenario, ScenarioJson};

const INDEX_HTML: &str = include_str!("page/index.html");
const APP_JS: &str = include_str!("page/app.js");
const STYLE_CSS: &str = include_str!("page/style.css");

/// A scenario is a few hundred bytes; anything much larger is not one.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Runs at once: each takes a core for up to about a second.
const CONCURRENT_RUNS: usize = 2;

#[derive(Clone, Debug)]
struct Page {
    /// Where the controls start: the flags' scenario, as JSON.
    initial: Arc<String>,
    runs: Arc<Semaphore>,
}

/// Serves the page on `addr` until the process is stopped; prints the address it listens
/// on (port 0 picks a free one) on stdout.
pub(crate) fn serve(addr: SocketAddr, initial: Scenario) -> Result<(), String> {
    let initial = serde_json::to_string(&ScenarioJson::from(&initial))
        .map_err(|e| format!("cannot write the scenario as JSON: {e}"))?;
    let page = Page {
        initial: Arc::new(initial),
        runs: Arc::new(Semaphore::new(CONCURRENT_RUNS)),
    };
    let app = Router::new()
        .route("/", get(index))
        .route("/app.js", get(script))
        .route("/style.css", get(style))
        .route("/api/scenario", get(scenario))
        .route("/api/simulate", post(simulate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(page);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a tokio runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local = listener
            .local_addr()
            .map_err(|e| format!("cannot read the address listened on: {e}"))?;
        println!("listening on http://{local}/");
        axum::serve(listener, app)
            .await
            .map_err(|e| format!("the server failed: {e}"))
    })
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

fn json(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response()
}

fn bad_request(bad: &BadScenario) -> Response {
    match serde_json::to_string(bad) {
        Ok(body) => json(StatusCode::BAD_REQUEST, body),
        Err(e) => failed(&e.to_string()),
    }
}

fn failed(message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    json(StatusCode::INTERNAL_SERVER_ERROR, body)
}

async fn scenario(State(page): State<Page>) -> Response {
    json(StatusCode::OK, page.initial.as_str().to_owned())
}

/// Checks the posted scenario, runs it on a thread of its own (the engine starts its own
/// paused-clock runtime, which cannot nest in the server's), and answers the results.
async fn simulate(State(page): State<Page>, body: Bytes) -> Response {
    let posted = match api::parse(&body) {
        Ok(posted) => posted,
        Err(bad) => return bad_request(&bad),
    };
    let scenario = match posted.scenario() {
        Ok(scenario) => scenario,
        Err(bad) => return bad_request(&bad),
    };
    // The permit goes with the run, not the request: a page that gives up on an answer
    // (the next change supersedes it) does not free a core the run still uses.
    let Ok(permit) = page.runs.clone().acquire_owned().await else {
        return failed("the server is shutting down");
    };
    let (answer, answered) = tokio::sync::oneshot::channel();
    let traced = posted
        .traced()
        .map(|(policy, from)| (policy.to_owned(), from));
    std::thread::spawn(move || {
        let result = scenario.run_blocking().map(|report| {
            let traced = traced
                .as_ref()
                .map(|(policy, from)| (policy.as_str(), *from));
            Answer::new(&scenario, &report, traced)
        });
        drop(permit);
        let _ = answer.send(result);
    });
    match answered.await {
        Ok(Ok(answer)) => match serde_json::to_string(&answer) {
            Ok(body) => json(StatusCode::OK, body),
            Err(e) => failed(&e.to_string()),
        },
        Ok(Err(e)) => failed(&format!("the simulation failed: {e}")),
        Err(_) => failed("the simulation stopped before it answered"),
    }
}
