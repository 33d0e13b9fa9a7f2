//! The forms of the rate-limit fields that clients in the wild read
//! (`RateLimitLayer::field_forms`), each read back from admitted and refused responses by
//! a general Structured Field parser (sfv) and by two parsers written for clients of
//! rate-limited APIs: the npm package `ratelimit-header-parser` (express-rate-limit's) and
//! the PyPI package `ratelimit-headers`. Which form each reads is the headers guide's
//! table; a form a parser does not read is asserted as such, so the table stays true.
//!
//! The parsers run in node and python from `target/client-parsers/`, where `scripts/test`
//! installs the versions pinned in `tests/client_parsers/` before it runs these tests
//! (ignored in a plain `cargo test`).

use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::Full;
use tollgate::response::FieldForm;
use tollgate::{Caller, Limiter, Policy, Quota, RateLimitLayer};
use tollgate_testkit::http::{get, send};
use tower::{ServiceBuilder, service_fn};

/// Where `scripts/test` installs the parsers.
fn parsers() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/client-parsers");
    assert!(
        dir.join("node_modules/ratelimit-header-parser").is_dir() && dir.join("python").is_dir(),
        "the client parsers are not installed in {}: scripts/test installs them",
        dir.display()
    );
    dir
}

/// `headers` as a JSON object of lowercase names to values (one line each here).
fn json(headers: &HeaderMap) -> String {
    let object: serde_json::Map<String, serde_json::Value> = headers
        .keys()
        .map(|name| {
            let values: Vec<&str> = headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            (name.as_str().to_owned(), values.join(", ").into())
        })
        .collect();
    serde_json::Value::Object(object).to_string()
}

fn run(mut command: Command, input: &str) -> serde_json::Value {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node and python3 are on the PATH");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// What `ratelimit-header-parser` reads: `{limit, remaining, reset}` (reset in Unix ms), or
/// null.
fn read_by_node(headers: &HeaderMap) -> serde_json::Value {
    let dir = parsers();
    let mut command = Command::new("node");
    command.env("NODE_PATH", dir.join("node_modules")).args([
        "-e",
        r#"
const { parseRateLimit } = require('ratelimit-header-parser');
let input = '';
process.stdin.on('data', (chunk) => { input += chunk; });
process.stdin.on('end', () => {
  const parsed = parseRateLimit(JSON.parse(input));
  const read = parsed && parsed.limit !== null && !Number.isNaN(parsed.limit)
    ? { limit: parsed.limit, remaining: parsed.remaining, reset: parsed.reset ? parsed.reset.getTime() : null }
    : null;
  process.stdout.write(JSON.stringify(read));
});
"#,
    ]);
    run(command, &json(headers))
}

/// What `ratelimit-headers` reads: `{limit, remaining, reset}` (reset in Unix ms), or null.
fn read_by_python(headers: &HeaderMap) -> serde_json::Value {
    let dir = parsers();
    let mut command = Command::new("python3");
    command.env("PYTHONPATH", dir.join("python")).args([
        "-c",
        r#"
import json, sys
import ratelimit_headers
state = ratelimit_headers.parse(json.load(sys.stdin))
read = None
if state.limit is not None:
    reset = int(state.reset.timestamp() * 1000) if state.reset else None
    read = {"limit": state.limit, "remaining": state.remaining, "reset": reset}
sys.stdout.write(json.dumps(read))
"#,
    ]);
    run(command, &json(headers))
}

/// An admitted response (49 of 50 left) and a refused one (none), in `forms`.
async fn replies(forms: &[FieldForm]) -> (HeaderMap, HeaderMap) {
    let limiter = Limiter::builder()
        .policy(Policy::sliding_window("per-minute", Quota::per_minute(50)))
        .build();
    let layer = RateLimitLayer::new(limiter)
        .key(Caller::new("acme"))
        .field_forms(forms.iter().copied());
    let mut service =
        ServiceBuilder::new()
            .layer(layer)
            .service(service_fn(|_: Request<Full<Bytes>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"[]"))))
            }));
    let admitted = send(&mut service, get("/orders", &[])).await;
    assert_eq!(admitted.status, 200);
    for _ in 0..49 {
        send(&mut service, get("/orders", &[])).await;
    }
    let refused = send(&mut service, get("/orders", &[])).await;
    assert_eq!(refused.status, 429);
    (admitted.headers, refused.headers)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A parser's reading: the limit and what remains as written, and a reset within two
/// windows from now (a sliding window's refusal waits for the count of this minute to
/// slide out of the next).
fn assert_read(read: &serde_json::Value, remaining: i64, who: &str) {
    assert_eq!(read["limit"], 50, "{who}: {read}");
    assert_eq!(read["remaining"], remaining, "{who}: {read}");
    let reset = read["reset"]
        .as_i64()
        .unwrap_or_else(|| panic!("{who}: {read}"));
    let now = now_ms();
    assert!(
        (now - 2_000..=now + 121_000).contains(&reset),
        "{who}: a reset {} ms from now",
        reset - now
    );
}

#[tokio::test]
#[ignore = "needs node and python3 with the client parsers: scripts/test installs them and runs these"]
async fn draft_7_is_read_by_sfv_and_node() {
    let (admitted, refused) = replies(&[FieldForm::Draft7]).await;
    for (headers, remaining) in [(&admitted, 49), (&refused, 0)] {
        assert!(
            !headers["ratelimit"].to_str().unwrap().contains('"'),
            "draft 11 replaced"
        );
        let combined = sfv::Parser::new(headers["ratelimit"].as_bytes())
            .parse::<sfv::Dictionary>()
            .expect("a Structured Field dictionary");
        let number = |key: &str| match &combined[key] {
            sfv::ListEntry::Item(item) => item.bare_item.as_integer().map(i64::from),
            _ => None,
        };
        assert_eq!(number("limit"), Some(50));
        assert_eq!(number("remaining"), Some(remaining));
        assert!(number("reset").is_some_and(|t| (1..=120).contains(&t)));
        let policy = sfv::Parser::new(headers["ratelimit-policy"].as_bytes())
            .parse::<sfv::List>()
            .expect("a Structured Field list");
        assert_eq!(policy.len(), 1);
        assert_read(&read_by_node(headers), remaining, "node");
        // The python package reads draft 6's fields, not draft 7's combined one.
        assert_eq!(read_by_python(headers), serde_json::Value::Null);
    }
}

#[tokio::test]
#[ignore = "needs node and python3 with the client parsers: scripts/test installs them and runs these"]
async fn draft_6_is_read_by_sfv_node_and_python() {
    let (admitted, refused) = replies(&[FieldForm::Draft6]).await;
    for (headers, remaining) in [(&admitted, 49), (&refused, 0)] {
        for (name, expected) in [
            ("ratelimit-limit", Some(50)),
            ("ratelimit-remaining", Some(remaining)),
        ] {
            let item = sfv::Parser::new(headers[name].as_bytes())
                .parse::<sfv::Item>()
                .expect("a Structured Field item");
            assert_eq!(
                item.bare_item.as_integer().map(i64::from),
                expected,
                "{name}"
            );
        }
        assert!(
            !headers.contains_key("ratelimit"),
            "draft 11's field is left out"
        );
        assert_read(&read_by_node(headers), remaining, "node");
        assert_read(&read_by_python(headers), remaining, "python");
    }
}

#[tokio::test]
#[ignore = "needs node and python3 with the client parsers: scripts/test installs them and runs these"]
async fn x_ratelimit_is_read_by_node_and_python() {
    let (admitted, refused) = replies(&[FieldForm::XRateLimit]).await;
    for (headers, remaining) in [(&admitted, 49), (&refused, 0)] {
        let reset: i64 = headers["x-ratelimit-reset"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let now = now_ms() / 1_000;
        assert!(
            (now - 1..=now + 121).contains(&reset),
            "Unix seconds: {reset} at {now}"
        );
        assert_read(&read_by_node(headers), remaining, "node");
        assert_read(&read_by_python(headers), remaining, "python");
    }
}

/// Beside draft 11's fields, neither client parser reads the `X-RateLimit-*` ones: each
/// takes the draft's `RateLimit` and `RateLimit-Policy` for its own forms and gives up.
/// A service whose clients use them writes the forms they read without draft 11's.
#[tokio::test]
#[ignore = "needs node and python3 with the client parsers: scripts/test installs them and runs these"]
async fn beside_draft_11_the_client_parsers_read_nothing() {
    let (admitted, refused) = replies(&[FieldForm::Draft11, FieldForm::XRateLimit]).await;
    for headers in [&admitted, &refused] {
        assert!(headers.contains_key("x-ratelimit-limit"));
        let state = sfv::Parser::new(headers["ratelimit"].as_bytes())
            .parse::<sfv::List>()
            .expect("draft 11's RateLimit");
        assert_eq!(state.len(), 1);
        assert_eq!(read_by_node(headers), serde_json::Value::Null);
        assert_eq!(read_by_python(headers), serde_json::Value::Null);
    }
}

/// Draft 11 alone, the default: neither client parser reads it, which is why the other
/// forms exist.
#[tokio::test]
#[ignore = "needs node and python3 with the client parsers: scripts/test installs them and runs these"]
async fn draft_11_alone_is_read_by_neither_client_parser() {
    let (admitted, refused) = replies(&[FieldForm::Draft11]).await;
    for headers in [&admitted, &refused] {
        assert_eq!(read_by_node(headers), serde_json::Value::Null);
        assert_eq!(read_by_python(headers), serde_json::Value::Null);
    }
}

/// tollgate's own readers read every form it writes: `SingleLimit` (and so the
/// `HoldBackLayer`) the single-limit ones, `RateLimitHeader` draft 11's.
#[tokio::test]
async fn tollgate_reads_back_every_form_it_writes() {
    use tollgate::headers::{RateLimitHeader, SingleLimit};
    for form in [FieldForm::Draft7, FieldForm::Draft6, FieldForm::XRateLimit] {
        let (admitted, refused) = replies(&[form]).await;
        let now = now_ms() as u64;
        let read = SingleLimit::read(&admitted, now).expect("the admitted response's limit");
        assert_eq!((read.limit(), read.remaining()), (Some(50), 49), "{form:?}");
        assert_eq!(read.exhausted_for(), None);
        let read = SingleLimit::read(&refused, now).expect("the refusal's limit");
        assert_eq!(read.remaining(), 0, "{form:?}");
        let wait = read.exhausted_for().expect("a wait");
        assert!(
            wait <= std::time::Duration::from_secs(121),
            "{form:?}: {wait:?}"
        );
    }
    let (_, refused) = replies(&[FieldForm::Draft11]).await;
    let state: RateLimitHeader = headers::HeaderMapExt::typed_get(&refused).expect("draft 11");
    assert!(state.exhausted_for().is_some());
}
