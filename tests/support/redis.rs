//! Real redis-server processes on free ports, started and torn down by the tests.
//!
//! Never the machine's own Redis on 6379: every server here runs in its own temporary
//! directory on a port the OS just handed out, and dies with the test (even a failing one)
//! when its handle is dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const INSTALL_HINT: &str = "redis-server and redis-cli are needed for the Redis tests: \
    install them with `apt-get install -y redis-server redis-tools` (scripts/test does it for you)";

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// One redis-server process.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra_args: Vec<String>,
    paused: bool,
}

impl RedisServer {
    /// Starts a fresh server on a free port; panics with an install hint when redis-server
    /// is missing.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line options.
    pub fn start_with(extra_args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-redis-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir for redis-server");
        let mut server = Self {
            port: 0,
            dir,
            child: None,
            extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
            paused: false,
        };
        // A port that was free a moment ago may be taken by the time redis binds it: retry.
        for _ in 0..20 {
            server.port = free_port(extra_args.contains(&"--cluster-enabled"));
            if server.spawn() {
                return server;
            }
        }
        panic!("could not start redis-server on a free port");
    }

    fn spawn(&mut self) -> bool {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(e) => panic!("cannot run redis-server: {e}"),
        };
        self.child = Some(child);
        self.paused = false;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            if self
                .cli(&["PING"])
                .map(|o| o.trim() == "PONG")
                .unwrap_or(false)
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Runs a command through redis-cli and returns its raw output.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output();
        match output {
            Ok(output) if output.status.success() => {
                Some(String::from_utf8_lossy(&output.stdout).into_owned())
            }
            Ok(_) => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
            Err(_) => None,
        }
    }

    /// Runs a command and panics unless it succeeds.
    pub fn must(&self, args: &[&str]) -> String {
        self.cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed on port {}", self.port))
    }

    /// The pid of the running process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&mut self) {
        self.signal("-STOP");
        self.paused = true;
    }

    /// Thaws a paused process (SIGCONT).
    pub fn resume(&mut self) {
        self.signal("-CONT");
        self.paused = false;
    }

    /// Kills the process (SIGKILL): every counter is lost.
    pub fn kill(&mut self) {
        if self.paused {
            self.resume();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills and starts again on the same port with an empty dataset, as a failover that
    /// lost its counters would look.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not come back on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
            assert!(
                status.map(|s| s.success()).unwrap_or(false),
                "kill {signal} {pid} failed"
            );
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A port nothing listens on; for cluster nodes, one whose bus port (+10000) is free too.
fn free_port(with_bus: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local addr").port();
        if port == 6379 {
            continue;
        }
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// A 3-master Redis Cluster made with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes and joins them into a cluster with every slot covered.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{INSTALL_HINT} ({e})"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Self { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.is_ok() {
            assert!(
                Instant::now() < deadline,
                "the cluster did not reach cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    fn is_ok(&self) -> bool {
        self.nodes.iter().all(|node| {
            node.cli(&["CLUSTER", "INFO"])
                .map(|info| info.contains("cluster_state:ok"))
                .unwrap_or(false)
        })
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The slot of a key, as the cluster computes it.
    pub fn keyslot(&self, key: &[u8]) -> u16 {
        let output = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.nodes[0].port().to_string(),
                "-x",
                "CLUSTER",
                "KEYSLOT",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().expect("stdin").write_all(key)?;
                child.wait_with_output()
            })
            .expect("redis-cli CLUSTER KEYSLOT");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("a slot number")
    }

    /// Which node (index into `nodes`) serves `slot`.
    pub fn node_for_slot(&self, slot: u16) -> usize {
        let slots = self.nodes[0].must(&["CLUSTER", "SLOTS"]);
        // redis-cli prints each range as: start, end, then the master's ip and port.
        let lines: Vec<&str> = slots.lines().map(str::trim).collect();
        let mut i = 0;
        while i + 3 < lines.len() {
            if let (Ok(start), Ok(end)) = (lines[i].parse::<u16>(), lines[i + 1].parse::<u16>())
                && lines[i + 2] == "127.0.0.1"
                && let Ok(port) = lines[i + 3].parse::<u16>()
            {
                if (start..=end).contains(&slot) {
                    return self
                        .nodes
                        .iter()
                        .position(|n| n.port() == port)
                        .expect("a known node");
                }
                i += 4;
                continue;
            }
            i += 1;
        }
        panic!("no node serves slot {slot}: {slots}");
    }
}
