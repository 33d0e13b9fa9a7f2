//! End to end: `orders_api --config FILE`, its limits rewritten and reloaded on SIGHUP
//! under traffic, and a broken file refused with the limits in force kept; and
//! `orders_api --plans FILE`, each customer's own quota looked up at request time and
//! reloaded on SIGHUP, beside an organisation's budget (`x-org-id`) and the field forms
//! chosen by `--fields`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::MissedTickBehavior;
use tollgate_testkit::temp_file::TempFile;

/// acme's traffic: between the limit before the reload and the one after.
const RATE: f64 = 80.0;
/// How long each side of the reload is measured.
const PHASE: Duration = Duration::from_secs(3);
/// How long after the SIGHUP a refusal under the old limits may still come.
const GRACE: Duration = Duration::from_secs(1);

fn config(enterprise_per_second: &str) -> String {
    format!(
        r#"# acme is on the enterprise plan
[plans]
acme = "enterprise"

[[orders.policies]]
name = "per-second"
algorithm = "sliding_window"
limit = 20
window = "1s"

[[orders.tiers.enterprise]]
name = "per-second"
algorithm = "sliding_window"
limit = {enterprise_per_second}
window = "1s"
"#
    )
}

/// The enterprise limit's line in [`config`].
const LIMIT_LINE: usize = 14;

struct Server {
    child: Child,
    base: String,
    stderr: Arc<Mutex<Vec<String>>>,
    file: TempFile,
}

impl Server {
    fn start(file: TempFile) -> Self {
        Self::spawn("--config", file, &[])
    }

    /// orders_api with `file` given to `flag` (read again on SIGHUP) and `extra` flags.
    fn spawn(flag: &str, file: TempFile, extra: &[&str]) -> Self {
        let mut child = Command::new(tollgate_testkit::example::binary("orders_api"))
            .args(["--listen", "127.0.0.1:0", flag])
            .arg(file.path())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start orders_api");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let collected = stderr.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                collected.lock().unwrap().push(line);
            }
        });
        let base = tollgate_testkit::orders_api::listening(&mut child);
        Server {
            child,
            base,
            stderr,
            file,
        }
    }

    /// Rewrites the file and sends SIGHUP; returns when the server has logged the
    /// outcome, with that line and the ones after it.
    fn reload(&self, text: &str) -> (Instant, Vec<String>) {
        std::fs::write(self.file.path(), text).unwrap();
        let logged = self.stderr.lock().unwrap().len();
        let hangup = Instant::now();
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = hangup + Duration::from_secs(10);
        loop {
            // Let the error's lines after the first arrive too.
            std::thread::sleep(Duration::from_millis(50));
            let lines = self.stderr.lock().unwrap()[logged..].to_vec();
            if lines.iter().any(|l| l.contains("reloaded")) {
                return (hangup, lines);
            }
            assert!(Instant::now() < deadline, "no reload logged: {lines:?}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// One request as acme: the status, or the error that stood for it, and the quota of the
/// RateLimit-Policy field.
async fn order(client: &HttpClient, base: &str) -> Result<(u16, Option<String>), String> {
    let request = hyper::Request::get(format!("{base}/orders"))
        .header("x-customer-id", "acme")
        .body(Empty::new())
        .unwrap();
    let response = client.request(request).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let policy = response
        .headers()
        .get("ratelimit-policy")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, policy))
}

/// acme's requests at [`RATE`] for `span`, each sent on time whatever the others take:
/// when each was sent, and its outcome.
async fn traffic(
    client: &HttpClient,
    base: &str,
    span: Duration,
) -> Vec<(Instant, Result<(u16, Option<String>), String>)> {
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / RATE));
    // A late tick is not made up for with a burst.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let start = Instant::now();
    let mut sent = Vec::new();
    while start.elapsed() < span {
        ticks.tick().await;
        let (client, base) = (client.clone(), base.to_owned());
        let at = Instant::now();
        sent.push((at, tokio::spawn(async move { order(&client, &base).await })));
    }
    let mut outcomes = Vec::new();
    for (at, request) in sent {
        outcomes.push((at, request.await.unwrap()));
    }
    outcomes
}

fn quota_of(policy: &Option<String>) -> Option<&str> {
    policy
        .as_deref()?
        .split(';')
        .find_map(|p| p.strip_prefix("q="))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_reload_on_sighup_under_traffic() {
    let server = Server::start(temp_file_with(&config("50")));
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    let base = server.base.clone();

    // Traffic on both sides of the reload, without a pause: the SIGHUP lands mid-stream.
    let sender = {
        let (client, base) = (client.clone(), base.clone());
        tokio::spawn(async move { traffic(&client, &base, PHASE * 2).await })
    };
    tokio::time::sleep(PHASE).await;
    let (hangup, logged) = tokio::task::block_in_place(|| server.reload(&config("100")));
    assert!(
        logged
            .iter()
            .any(|l| l.contains("reloaded: /orders") && l.contains("q=100")),
        "{logged:?}"
    );
    let outcomes = sender.await.unwrap();

    let mut refused_before = 0;
    for (at, outcome) in &outcomes {
        let (status, policy) = outcome
            .as_ref()
            .unwrap_or_else(|e| panic!("a request failed: {e}"));
        assert!(
            *status == 200 || *status == 429,
            "status {status} at {:?} from the start",
            at.duration_since(outcomes[0].0)
        );
        if *at < hangup {
            refused_before += usize::from(*status == 429);
        } else if *at > hangup + GRACE {
            assert_eq!(
                *status,
                200,
                "refused {:?} after the SIGHUP",
                at.duration_since(hangup)
            );
            assert_eq!(quota_of(policy), Some("100"), "{policy:?}");
        }
    }
    // 80 a second against 50: about 30 of each second's requests were refused.
    assert!(
        refused_before >= 10,
        "only {refused_before} refused before the reload"
    );
    let after = outcomes
        .iter()
        .filter(|(at, _)| *at > hangup + GRACE)
        .count();
    assert!(
        after >= 40,
        "only {after} requests measured after the reload"
    );

    // A file that does not parse: refused with its line, the limits in force kept.
    let broken = config("100").replace("limit = 100", "limit = \"a hundred\" x");
    let (_, logged) = tokio::task::block_in_place(|| server.reload(&broken));
    let refusal = logged.join("\n");
    assert!(refusal.contains("not reloaded"), "{refusal}");
    assert!(refusal.contains(&format!("line {LIMIT_LINE}")), "{refusal}");
    let (status, policy) = order(&client, &base).await.unwrap();
    assert_eq!((status, quota_of(&policy)), (200, Some("100")));

    // One that parses but cannot make limits: refused, naming the policy.
    let (_, logged) = tokio::task::block_in_place(|| server.reload(&config("0")));
    let refusal = logged.join("\n");
    assert!(
        refusal.contains("not reloaded") && refusal.contains("tier \"enterprise\""),
        "{refusal}"
    );
    let (status, policy) = order(&client, &base).await.unwrap();
    assert_eq!((status, quota_of(&policy)), (200, Some("100")));
}

fn temp_file_with(text: &str) -> TempFile {
    TempFile::write("orders-reload", text)
}

/// `GET /orders` as `customer` (of `org`, when given): the status and the response's
/// headers.
async fn order_of(
    client: &HttpClient,
    base: &str,
    customer: &str,
    org: Option<&str>,
) -> (u16, http::HeaderMap) {
    let mut request =
        hyper::Request::get(format!("{base}/orders")).header("x-customer-id", customer);
    if let Some(org) = org {
        request = request.header("x-org-id", org);
    }
    let response = client
        .request(request.body(Empty::new()).unwrap())
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let _ = response.into_body().collect().await;
    (status, headers)
}

/// `--plans`: acme's own 5 a minute, globex unlisted (no per-minute limit), then acme
/// raised to 8 by a reload: the count kept, 3 more. The fields of `--fields draft-6`
/// carry the per-minute limit, the one closest to refusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_come_from_a_file_looked_up_at_request_time() {
    let file = temp_file_with(r#"{"acme": 5}"#);
    let server = Server::spawn("--plans", file, &["--limit", "1000", "--fields", "draft-6"]);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let admitted = |customer: &'static str, n: usize| {
        let (client, base) = (client.clone(), server.base.clone());
        async move {
            let mut admitted = 0;
            let mut last = None;
            for _ in 0..n {
                let (status, headers) = order_of(&client, &base, customer, None).await;
                admitted += usize::from(status == 200);
                last = Some(headers);
            }
            (admitted, last.unwrap())
        }
    };
    // Within one minute's window.
    while tollgate_testkit::rates::unix_millis() % 60_000 > 40_000 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (n, headers) = admitted("acme", 7).await;
    assert_eq!(n, 5, "acme's own 5 a minute");
    assert_eq!(headers["ratelimit-limit"], "5");
    assert_eq!(headers["ratelimit-remaining"], "0");
    let (n, headers) = admitted("globex", 7).await;
    assert_eq!(n, 7, "globex has no per-minute limit");
    assert_eq!(headers["ratelimit-limit"], "1000");

    let (_, logged) = tokio::task::block_in_place(|| server.reload(r#"{"acme": 8}"#));
    assert!(
        logged.iter().any(|l| l.contains("reloaded: 1 plans")),
        "{logged:?}"
    );
    let (n, _) = admitted("acme", 5).await;
    assert_eq!(n, 3, "raised to 8: the 3 acme had not used");
}

/// `x-org-id`: three customers of one organisation, 15 requests each at once, share its
/// 30 a second, each keeping its own 1,000; the refusals name the organisation's policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_organisation_shares_its_budget() {
    let file = temp_file_with("{}");
    let server = Server::spawn("--plans", file, &["--limit", "1000", "--org-limit", "30"]);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // At the start of a second: the burst lands in one window.
    let now = tollgate_testkit::rates::unix_millis();
    tokio::time::sleep(Duration::from_millis(1_000 - now % 1_000 + 5)).await;
    let mut tasks = Vec::new();
    for customer in ["c1", "c2", "c3"] {
        for _ in 0..15 {
            let (client, base) = (client.clone(), server.base.clone());
            tasks.push(tokio::spawn(async move {
                order_of(&client, &base, customer, Some("o1")).await
            }));
        }
    }
    let mut admitted = 0;
    for task in tasks {
        let (status, headers) = task.await.unwrap();
        if status == 200 {
            admitted += 1;
        } else {
            assert_eq!(status, 429);
            let state = headers["ratelimit"].to_str().unwrap();
            assert!(state.contains("\"org:per-second\";r=0"), "{state}");
        }
    }
    assert_eq!(admitted, 30);
}
