//! The simulator page (`simulate --serve ADDR`, examples/simulate/serve.rs): its endpoint
//! runs the same engine call as the command line and answers the same rows, a bad
//! scenario gets a 400 naming the field instead of a run, and the page is served from the
//! binary. `a_browser_reads_the_outage_from_the_page` drives the page in headless Chromium;
//! it needs Chromium, its driver and Selenium, so plain `cargo test` skips it and
//! scripts/test installs them and runs it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};
use tollgate_testkit::http::{Reply, parse_response};

use crate::simulate::simulator;

/// A running `simulate --serve 127.0.0.1:0`, stopped when dropped.
struct Page {
    child: Child,
    /// `127.0.0.1:PORT`.
    addr: String,
}

impl Drop for Page {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the page on a free port, with `flags` setting its initial scenario, and reads
/// the address it prints.
fn serve(flags: &[&str]) -> Page {
    let mut child = Command::new(simulator())
        .args(["--serve", "127.0.0.1:0"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start simulate --serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the listening line");
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    Page { child, addr }
}

/// One request on a fresh connection, read to the end.
fn request(page: &Page, method: &str, path: &str, body: &str) -> Reply {
    let mut stream = TcpStream::connect(&page.addr).expect("connect to the page");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        page.addr,
        body.len()
    )
    .expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read the answer");
    parse_response(&raw)
}

fn post(page: &Page, scenario: &Value) -> Reply {
    request(page, "POST", "/api/simulate", &scenario.to_string())
}

/// `simulate --json FLAGS`, parsed.
fn cli_rows(flags: &[&str]) -> Value {
    let output = Command::new(simulator())
        .arg("--json")
        .args(flags)
        .output()
        .expect("run simulate --json");
    assert!(
        output.status.success(),
        "simulate --json {flags:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("simulate --json prints JSON")
}

/// The page's rows for `scenario`, checked to be a 200.
fn page_answer(page: &Page, scenario: &Value) -> Value {
    let reply = post(page, scenario);
    assert_eq!(
        reply.status,
        200,
        "POST {scenario}: {}",
        String::from_utf8_lossy(&reply.body)
    );
    reply.json()
}

fn admitted(rows: &Value, policy: &str, phase: &str, customer: &str) -> f64 {
    rows.as_array()
        .expect("rows")
        .iter()
        .find(|r| r["policy"] == policy && r["phase"] == phase && r["customer"] == customer)
        .and_then(|r| r["admitted_per_sec"].as_f64())
        .unwrap_or_else(|| panic!("no row {policy}/{phase}/{customer}"))
}

/// The running example posted as the page posts it (every field given), and an empty
/// object (every field the command line's default), answer exactly the rows of
/// `simulate --json`; so does a scenario that changes every setting the page has.
#[test]
fn the_page_answers_the_rows_of_the_command_line() {
    let page = serve(&[]);
    let initial = request(&page, "GET", "/api/scenario", "").json();
    let expected = cli_rows(&[]);
    let answer = page_answer(&page, &initial);
    assert_eq!(answer["rows"], expected);
    assert_eq!(page_answer(&page, &json!({}))["rows"], expected);
    // The tables' worst-window column is labelled by the quota's window, and every row
    // carries its count: at least the phase's average second.
    assert_eq!(answer["worst_heading"], "worst 1 s");
    for row in expected.as_array().expect("rows") {
        let worst = row["worst_window_admitted"]
            .as_f64()
            .expect("a worst window");
        let average = row["admitted_per_sec"].as_f64().expect("a rate");
        assert!(worst >= average.floor(), "{row}");
    }
    // One series per policy and customer, a second long each.
    let groups = answer["groups"].as_array().expect("groups");
    assert_eq!(groups.len(), 9);
    assert_eq!(groups[1]["policy"], "closed");
    let acme_closed = groups[1]["admitted_each_second"][0]
        .as_array()
        .expect("acme's seconds");
    assert_eq!(acme_closed.len(), 90);
    assert!(
        acme_closed[30..60].iter().all(|v| v == 0),
        "{acme_closed:?}"
    );

    // The question the page is for: a 2-minute outage on 6 instances, token bucket this
    // time, a blackholed store, two callers.
    let scenario = json!({
        "algorithm": "token-bucket",
        "limit": 50,
        "window_secs": 1,
        "burst": 80,
        "instances": 6,
        "traffic": [{"name": "acme", "rate": 120}, {"name": "globex", "rate": 20}],
        "normal_secs": 10,
        "outage_secs": 120,
        "recovery_secs": 10,
        "fault": "blackhole",
        "store_timeout_ms": 30,
        "policies": ["local-share", "closed"],
        "trace": {"customer": "acme", "policy": "local-share"},
    });
    let answer = page_answer(&page, &scenario);
    let expected = cli_rows(&[
        "--algorithm",
        "token-bucket",
        "--limit",
        "50",
        "--window-secs",
        "1",
        "--burst",
        "80",
        "--instances",
        "6",
        "--traffic",
        "acme=120",
        "--traffic",
        "globex=20",
        "--normal-secs",
        "10",
        "--outage-secs",
        "120",
        "--recovery-secs",
        "10",
        "--fault",
        "blackhole",
        "--store-timeout-ms",
        "30",
        "--policy",
        "closed",
        "--policy",
        "local-share",
    ]);
    assert_eq!(answer["rows"], expected);
    assert_eq!(admitted(&expected, "closed", "outage", "acme"), 0.0);
    let mut minute = json!({"window_secs": 60, "limit": 3000, "policies": ["closed"]});
    minute["normal_secs"] = json!(2);
    assert_eq!(page_answer(&page, &minute)["worst_heading"], "worst 60 s");
    let shared = admitted(&expected, "local-share", "outage", "acme");
    assert!((40.0..=52.0).contains(&shared), "local share: {shared}");

    // The traced caller: acme's requests of the first minute under the local share, in
    // order, with the bucket's tokens after each decision; during the outage the local
    // share decides.
    let trace = &answer["trace"];
    assert_eq!(
        (&trace["customer"], &trace["policy"]),
        (&json!("acme"), &json!("local-share"))
    );
    assert_eq!(trace["algorithm"], "token-bucket");
    assert_eq!(
        (&trace["from_ms"], &trace["to_ms"]),
        (&json!(0.0), &json!(60_000.0))
    );
    assert_eq!(trace["truncated"], false);
    let points = trace["points"].as_array().expect("points");
    assert_eq!(points.len(), 120 * 60);
    let sent_at = |p: &Value| p[0].as_f64().expect("sent at");
    assert!(points.windows(2).all(|w| sent_at(&w[0]) < sent_at(&w[1])));
    let first = &points[0];
    assert_eq!(first.as_array().expect("a point").len(), 6);
    assert_eq!(
        (&first[2], &first[3], &first[4]),
        (&json!(200), &json!(80), &json!(79))
    );
    assert_eq!(first[5], "store");
    let in_outage: Vec<&Value> = points
        .iter()
        .filter(|p| (20_000.0..60_000.0).contains(&sent_at(p)))
        .collect();
    assert!(
        in_outage.iter().all(|p| p[5] == "local_share"),
        "{:?}",
        in_outage[0]
    );
    let admitted_in_outage = in_outage.iter().filter(|p| p[2] == 200).count();
    let refused_in_outage = in_outage.iter().filter(|p| p[2] == 429).count();
    assert_eq!(admitted_in_outage + refused_in_outage, in_outage.len());
    assert!(refused_in_outage > 0 && admitted_in_outage > 0);

    // Another stretch: the last 40 s, where the store is back from 130 s on.
    let mut later = scenario.clone();
    later["trace"]["from_secs"] = json!(100);
    let trace = page_answer(&page, &later)["trace"].clone();
    assert_eq!(
        (&trace["from_ms"], &trace["to_ms"]),
        (&json!(100_000.0), &json!(140_000.0))
    );
    let points = trace["points"].as_array().expect("points");
    assert_eq!(points.len(), 120 * 40);
    assert!(sent_at(&points[0]) >= 100_000.0);
    let last = points.last().expect("a last point");
    assert_eq!(last[5], "store", "{last}");
}

/// Every bound names its field, and nothing runs: too many callers, instances or
/// seconds, a rate that would burn the CPU, more simulated requests than a second's
/// work, malformed JSON, unknown fields and wrong types.
#[test]
fn bad_scenarios_get_a_400_naming_the_field() {
    let page = serve(&[]);
    let many_callers: Vec<Value> = (0..9)
        .map(|i| json!({"name": format!("c{i}"), "rate": 1}))
        .collect();
    let cases: Vec<(String, &str)> = vec![
        (json!({"traffic": many_callers}).to_string(), "traffic"),
        (json!({"traffic": []}).to_string(), "traffic"),
        (json!({"instances": 65}).to_string(), "instances"),
        (json!({"instances": 0}).to_string(), "instances"),
        (json!({"outage_secs": 601}).to_string(), "outage_secs"),
        (json!({"normal_secs": 0}).to_string(), "normal_secs"),
        (
            json!({"recovery_secs": 100000}).to_string(),
            "recovery_secs",
        ),
        (
            json!({"traffic": [{"name": "acme", "rate": 5}, {"name": "hog", "rate": 1e7}]})
                .to_string(),
            "traffic[1].rate",
        ),
        (
            json!({"traffic": [{"name": "acme", "rate": 0}]}).to_string(),
            "traffic[0].rate",
        ),
        // 5,000 req/s for 90 s under every policy: 3.6 million requests.
        (
            json!({"traffic": [{"name": "acme", "rate": 5000}]}).to_string(),
            "traffic",
        ),
        (
            json!({"traffic": [{"name": "a b", "rate": 5}]}).to_string(),
            "traffic[0].name",
        ),
        (
            json!({"traffic": [{"name": "a", "rate": 5}, {"name": "a", "rate": 6}]}).to_string(),
            "traffic[1].name",
        ),
        (json!({"limit": 0}).to_string(), "limit"),
        (json!({"window_secs": 100000}).to_string(), "window_secs"),
        (
            json!({"store_timeout_ms": 0}).to_string(),
            "store_timeout_ms",
        ),
        (json!({"burst": 10}).to_string(), "burst"),
        (json!({"algorithm": "leaky"}).to_string(), "algorithm"),
        (json!({"fault": "fire"}).to_string(), "fault"),
        (json!({"policies": []}).to_string(), "policies"),
        (
            json!({"policies": ["closed", "sideways"]}).to_string(),
            "policies[1]",
        ),
        (
            json!({"policies": ["closed", "closed"]}).to_string(),
            "policies[1]",
        ),
        (
            json!({"breaker_base_open_ms": 2000, "breaker_max_open_ms": 1000}).to_string(),
            "breaker_base_open_ms",
        ),
        (
            json!({"trace": {"customer": "umbrella", "policy": "closed"}}).to_string(),
            "trace.customer",
        ),
        (
            json!({"policies": ["open"], "trace": {"customer": "acme", "policy": "closed"}})
                .to_string(),
            "trace.policy",
        ),
        (
            json!({"trace": {"customer": "acme", "policy": "closed", "from_secs": 90}}).to_string(),
            "trace.from_secs",
        ),
        (json!({"instances": "four"}).to_string(), "instances"),
        (json!({"instances": -1}).to_string(), "instances"),
        (
            json!({"traffic": [{"name": "acme"}]}).to_string(),
            "traffic[0]",
        ),
        (json!({"outage": 10}).to_string(), "outage"),
        ("{\"limit\": 50".to_owned(), "body"),
        ("not json".to_owned(), "body"),
        ("[]".to_owned(), "body"),
        ("{} {}".to_owned(), "body"),
        (String::new(), "body"),
    ];
    for (body, field) in cases {
        let reply = request(&page, "POST", "/api/simulate", &body);
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        assert_eq!(reply.status, 400, "{body} -> {text}");
        let error = reply.json();
        assert_eq!(error["field"], field, "{body} -> {text}");
        assert!(
            error["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{body} -> {text}"
        );
    }
    // Just over the cap of 150,000 simulated requests (301 req/s for 500 s under one
    // policy) is refused before anything runs.
    let over = json!({
        "traffic": [{"name": "acme", "rate": 301}],
        "normal_secs": 300, "outage_secs": 100, "recovery_secs": 100,
        "policies": ["closed"],
    });
    let reply = post(&page, &over);
    assert_eq!(reply.status, 400);
    assert!(reply.json()["error"].as_str().unwrap().contains("150500"));
    // The server still answers after all that.
    let small =
        json!({"normal_secs": 1, "outage_secs": 1, "recovery_secs": 1, "policies": ["open"]});
    assert_eq!(post(&page, &small).status, 200);
}

/// The page, its script and style come from the binary; its controls start at the
/// scenario of the flags it was started with.
#[test]
fn the_page_is_served_from_the_binary_and_starts_at_the_flags() {
    let page = serve(&[
        "--instances",
        "6",
        "--outage-secs",
        "120",
        "--policy",
        "closed",
    ]);
    let index = request(&page, "GET", "/", "");
    assert_eq!(index.status, 200);
    assert_eq!(index.headers["content-type"], "text/html; charset=utf-8");
    let html = String::from_utf8_lossy(&index.body).into_owned();
    assert!(
        html.contains("<script src=\"/app.js\" defer></script>"),
        "{html}"
    );
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from elsewhere"
    );
    for (path, kind) in [("/app.js", "text/javascript"), ("/style.css", "text/css")] {
        let asset = request(&page, "GET", path, "");
        assert_eq!(asset.status, 200, "{path}");
        let content_type = asset.headers["content-type"].to_str().unwrap();
        assert!(content_type.starts_with(kind), "{path}: {content_type}");
        assert!(asset.body.len() > 1_000, "{path}");
    }
    let initial = request(&page, "GET", "/api/scenario", "").json();
    assert_eq!(initial["instances"], 6);
    assert_eq!(initial["outage_secs"], 120);
    assert_eq!(initial["policies"], json!(["closed"]));
    assert_eq!(
        initial["traffic"][0],
        json!({"name": "acme", "rate": 120.0})
    );
    assert_eq!(request(&page, "GET", "/nothing-here", "").status, 404);
}

/// `--serve` takes an address, and cannot be combined with what only a single run prints.
#[test]
fn serve_flags_that_cannot_work_exit_with_2() {
    for flags in [
        &["--serve", "localhost"][..],
        &["--serve", "127.0.0.1:0", "--json"],
        &["--serve", "127.0.0.1:0", "--chart", "out.svg"],
        &["--serve", "127.0.0.1:0", "--instances", "0"],
    ] {
        let output = Command::new(simulator())
            .args(flags)
            .output()
            .expect("run simulate");
        assert_eq!(output.status.code(), Some(2), "{flags:?}");
        assert!(output.stdout.is_empty(), "{flags:?}");
        assert!(!output.stderr.is_empty(), "{flags:?}");
    }
}

/// The page in headless Chromium, as a person uses it: pick "fail closed", set a 10 s
/// outage, read acme's rates from the table, switch to the local share, and save a
/// screenshot (`tests/browser/simulator_page.py` says how).
#[test]
#[ignore = "needs chromium, chromium-driver and python3-selenium: scripts/test installs them and runs it"]
fn a_browser_reads_the_outage_from_the_page() {
    let page = serve(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/simulator_page.py");
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("simulator-page.png");
    let _ = std::fs::remove_file(&screenshot);
    let output = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(format!("http://{}/", page.addr))
        .arg(&screenshot)
        .output()
        .expect("run the browser test with the system python3 (python3-selenium)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the browser test failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    println!("{stdout}");
    let png = std::fs::read(&screenshot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "{}",
        screenshot.display()
    );
}
