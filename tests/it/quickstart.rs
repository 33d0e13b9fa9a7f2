//! The quickstart programs of the README and of the guide's Redis page: each is the text of
//! an example (so what a new user copies is what CI builds), and each serves a limited route with ClientIp keyed on the peer
//! address from ConnectInfo, in process and on a real redis-server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

#[cfg(feature = "redis")]
use tollgate_testkit::redis::RedisServer;

#[cfg(not(feature = "redis"))]
#[path = "skipped/redis.rs"]
mod skipped;

/// The fenced Rust blocks of a Markdown page, as text, without the lines rustdoc hides
/// (`# ` and a lone `#`), which a reader never sees.
fn rust_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match current.as_mut() {
            None if line.starts_with("```rust") => current = Some(String::new()),
            None => {}
            Some(_) if line == "```" => blocks.extend(current.take()),
            Some(_) if line == "#" || line.starts_with("# ") => {}
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

#[test]
fn the_docs_show_each_quickstart_example_verbatim() {
    for (page_name, page, example) in [
        (
            "README.md",
            include_str!("../../README.md"),
            include_str!("../../examples/quickstart.rs"),
        ),
        (
            "docs/guide/redis_deployments.md",
            include_str!("../../docs/guide/redis_deployments.md"),
            include_str!("../../examples/quickstart_redis.rs"),
        ),
    ] {
        let blocks = rust_blocks(page);
        // The block is the program without its leading `//!` lines.
        let program: String = example
            .lines()
            .skip_while(|line| line.starts_with("//!") || line.is_empty())
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(
            blocks.contains(&program),
            "{page_name} has no ```rust block equal to this example (copy it again):\n{program}"
        );
    }
}

struct Server {
    child: Child,
    addr: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(name: &str, args: &[&str]) -> Server {
    let mut child = Command::new(tollgate_testkit::example::binary(name))
        .arg("127.0.0.1:0")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the example");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("the listening line");
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    Server { child, addr }
}

/// One HTTP/1.1 GET on a fresh connection: the status and the whole response head.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    (status, response)
}

/// Five requests a second pass, the sixth within the same second is refused with the
/// RateLimit fields; the unlimited route still answers.
fn serves_limited_routes(server: &Server) {
    let statuses: Vec<u16> = (0..6).map(|_| get(&server.addr, "/hello").0).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "{statuses:?}");
    let (status, head) = get(&server.addr, "/hello");
    assert_eq!(status, 429);
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("ratelimit-policy: \"per-second\";q=5;w=1"),
        "{head}"
    );
    assert!(head.contains("retry-after: "), "{head}");
    assert_eq!(get(&server.addr, "/healthz").0, 200);
}

#[test]
fn quickstart_serves_limited_routes_in_process() {
    serves_limited_routes(&start("quickstart", &[]));
}

#[cfg(feature = "redis")]
#[test]
fn quickstart_serves_limited_routes_on_redis() {
    let redis = RedisServer::start();
    let server = start("quickstart_redis", &[&redis.url()]);
    serves_limited_routes(&server);
    // The counts are in Redis: the caller's key is there, under the example's prefix.
    let keys = redis.must(&["--scan", "--pattern", "hello:*"]);
    assert!(
        keys.contains("hello:{127.0.0.1}:hello:per-second"),
        "{keys}"
    );
}
