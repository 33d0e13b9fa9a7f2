//! Real redis-server processes on free ports, started and torn down by the tests.
//!
//! A single server, a Redis Cluster with replicas, or a Sentinel deployment (a master, a
//! replica and three Sentinels). Never the machine's own Redis on 6379: every server here
//! runs in its own temporary directory on a port the OS just handed out, and dies with the
//! test (even a failing one) when its handle is dropped.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::proxy::{Fault, FaultProxy};

const INSTALL_HINT: &str = "redis-server and redis-cli are needed for the Redis tests: \
    install them with `apt-get install -y redis-server redis-tools` (scripts/test does it for you)";

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// The ports this process's servers were given, until their handles drop: a server that is
/// killed to be restarted keeps its port, which the OS would hand to the next test.
static GIVEN_PORTS: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// One redis-server process.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra_args: Vec<String>,
    paused: bool,
    /// Whether `port` came from [`free_port`], to be given back on drop.
    port_given: bool,
}

impl RedisServer {
    /// Starts a fresh server on a free port; panics with an install hint when redis-server
    /// is missing.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line options.
    pub fn start_with(extra_args: &[&str]) -> Self {
        let mut server = Self::unstarted(extra_args);
        // A port that was free a moment ago may be taken by the time redis binds it: retry.
        for _ in 0..20 {
            server.port = free_port(extra_args.contains(&"--cluster-enabled"));
            server.port_given = true;
            if server.spawn() {
                return server;
            }
            give_back_port(server.port);
            server.port_given = false;
        }
        panic!("could not start redis-server on a free port");
    }

    /// Starts a server on `port`, or `None` when the port is taken (by another server, too)
    /// or the server does not come up.
    pub fn try_start_on(port: u16) -> Option<Self> {
        let mut server = Self::unstarted(&[]);
        server.port = port;
        server.spawn().then_some(server)
    }

    fn unstarted(extra_args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-redis-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir for redis-server");
        Self {
            port: 0,
            dir,
            child: None,
            extra_args: extra_args.iter().map(|s| (*s).to_owned()).collect(),
            paused: false,
            port_given: false,
        }
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
            match answering_process(self.port) {
                Some(pid) if Some(pid) == self.pid() => return true,
                // Another test's server holds the port and answered for ours, which is
                // failing to bind: a test given that one would share its counters.
                Some(_) => break,
                None => std::thread::sleep(Duration::from_millis(20)),
            }
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
        cli(self.port, args)
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
        if self.port_given {
            give_back_port(self.port);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs a command through redis-cli against `port` and returns its raw output.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
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

/// The process id of the redis-server (or Sentinel) answering on `port`, if one does.
fn answering_process(port: u16) -> Option<u32> {
    cli(port, &["INFO", "server"])?
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// A port nothing listens on and no other server of this process was given; for cluster
/// nodes, one whose bus port (+10000) is free too. Given until [`give_back_port`].
fn free_port(with_bus: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local addr").port();
        if port == 6379 {
            continue;
        }
        let bus_free =
            !with_bus || (port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok());
        if bus_free && given_ports().insert(port) {
            return port;
        }
    }
}

fn give_back_port(port: u16) {
    given_ports().remove(&port);
}

fn given_ports() -> std::sync::MutexGuard<'static, BTreeSet<u16>> {
    // A test that panicked while holding the lock left the set whole.
    GIVEN_PORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A Redis Cluster of 3 masters and 3 replicas made with
/// `redis-cli --cluster create ... --cluster-replicas 1`.
///
/// Nodes run with a short `cluster-node-timeout` (1 s) so a failover in a test takes a
/// couple of seconds, and with `cluster-require-full-coverage no` so that the masters that
/// are up keep serving their slots while a lost master's replica takes over (as the guide's
/// Redis page advises for a limiter's own cluster).
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`: a node as the cluster sees it.
#[derive(Clone, Debug)]
pub struct ClusterNode {
    /// The node id.
    pub id: String,
    /// The client port.
    pub port: u16,
    /// A master (else a replica).
    pub master: bool,
    /// Flagged `fail` (or `fail?`) by the node that was asked.
    pub failing: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// The slot ranges it serves (masters).
    pub slots: Vec<(u16, u16)>,
}

const NODE_TIMEOUT_MS: &str = "1000";

impl RedisCluster {
    /// Starts six nodes, joins them into a cluster with every slot covered and one replica
    /// per master, and waits until every replica is in sync and every node agrees.
    pub fn start() -> Self {
        Self::start_with_coverage("no")
    }

    /// The same cluster with Redis's default `cluster-require-full-coverage yes`: every node
    /// stops serving every slot while any slot has no live master.
    pub fn start_requiring_full_coverage() -> Self {
        Self::start_with_coverage("yes")
    }

    fn start_with_coverage(require_full_coverage: &str) -> Self {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    NODE_TIMEOUT_MS,
                    "--cluster-require-full-coverage",
                    require_full_coverage,
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
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{INSTALL_HINT} ({e})"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Self { nodes };
        cluster.wait_until(
            "every node sees 3 masters with a synced replica each",
            |c| c.is_settled(),
        );
        cluster
    }

    /// Polls `ready` every 50 ms for up to 30 s; panics with `what` if it never holds.
    pub fn wait_until(&self, what: &str, mut ready: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(self) {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The nodes that are running.
    fn live(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|n| n.pid().is_some())
    }

    /// Every live node reports `cluster_state:ok`, sees the same 3 masters serving all
    /// 16384 slots with no node failing, and every live replica's link to its master is up.
    pub fn is_settled(&self) -> bool {
        let mut views = Vec::new();
        for node in self.live() {
            let Some(info) = node.cli(&["CLUSTER", "INFO"]) else {
                return false;
            };
            if !info.contains("cluster_state:ok") {
                return false;
            }
            let Some(view) = self.view_from(node) else {
                return false;
            };
            let masters: Vec<&ClusterNode> =
                view.iter().filter(|n| n.master && !n.failing).collect();
            let covered: u32 = masters
                .iter()
                .flat_map(|n| &n.slots)
                .map(|(a, b)| u32::from(b - a) + 1)
                .sum();
            if masters.len() != 3 || covered != 16384 {
                return false;
            }
            let mut owners: Vec<(u16, u16, u16)> = masters
                .iter()
                .flat_map(|n| n.slots.iter().map(|&(a, b)| (a, b, n.port)))
                .collect();
            owners.sort_unstable();
            views.push(owners);
            if let Some(replication) = node.cli(&["INFO", "replication"])
                && replication.contains("role:slave")
                && !replication.contains("master_link_status:up")
            {
                return false;
            }
        }
        views.windows(2).all(|w| w[0] == w[1])
    }

    /// `CLUSTER NODES` as `node` sees the cluster, or `None` if it does not answer.
    pub fn view_from(&self, node: &RedisServer) -> Option<Vec<ClusterNode>> {
        let text = node.cli(&["CLUSTER", "NODES"])?;
        let mut nodes = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                continue;
            }
            // <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
            let port = fields[1]
                .split('@')
                .next()
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| p.parse().ok())?;
            let flags: Vec<&str> = fields[2].split(',').collect();
            let slots = fields[8..]
                .iter()
                .filter(|f| !f.starts_with('['))
                .filter_map(|f| match f.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => f.parse().ok().map(|s| (s, s)),
                })
                .collect();
            nodes.push(ClusterNode {
                id: fields[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                failing: flags.contains(&"fail") || flags.contains(&"fail?"),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            });
        }
        Some(nodes)
    }

    /// The cluster as the first live node that answers sees it.
    pub fn view(&self) -> Vec<ClusterNode> {
        self.live()
            .find_map(|node| self.view_from(node))
            .expect("no live node answers CLUSTER NODES")
    }

    /// Runs a command on `nodes[index]` and panics unless it answers `OK`.
    pub fn ok(&self, index: usize, args: &[&str]) {
        let reply = self.nodes[index].must(args);
        assert_eq!(reply.trim(), "OK", "{args:?} on node {index}");
    }

    /// The index into `nodes` of the node on `port`.
    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// The node id of `nodes[index]`, as it reports it.
    pub fn id(&self, index: usize) -> String {
        self.nodes[index]
            .must(&["CLUSTER", "MYID"])
            .trim()
            .to_owned()
    }

    /// `master` or `slave`, as `nodes[index]` reports its own role (`ROLE`).
    pub fn role(&self, index: usize) -> String {
        self.nodes[index]
            .must(&["ROLE"])
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    /// The indices of the masters, in `nodes` order.
    pub fn masters(&self) -> Vec<usize> {
        let view = self.view();
        (0..self.nodes.len())
            .filter(|&i| {
                view.iter()
                    .any(|n| n.port == self.nodes[i].port() && n.master && !n.failing)
            })
            .collect()
    }

    /// The index of the replica of `nodes[master]`.
    pub fn replica_of(&self, master: usize) -> usize {
        let id = self.id(master);
        let view = self.view();
        let replica = view
            .iter()
            .find(|n| n.master_id.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("node {master} has no replica"));
        self.index_of_port(replica.port)
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The URLs of the masters only (a client started from them finds the replicas).
    pub fn master_urls(&self) -> Vec<String> {
        self.masters()
            .into_iter()
            .map(|i| self.nodes[i].url())
            .collect()
    }

    /// The slot of a key, as the cluster computes it.
    pub fn keyslot(&self, key: &[u8]) -> u16 {
        let node = self.live().next().expect("a live node");
        let output = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &node.port().to_string(),
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

    /// Which node (index into `nodes`) is the master serving `slot`.
    pub fn node_for_slot(&self, slot: u16) -> usize {
        let view = self.view();
        let owner = view
            .iter()
            .find(|n| {
                n.master && !n.failing && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {view:?}"));
        self.index_of_port(owner.port)
    }

    /// Moves `slot` live from its master to the master `nodes[to]`, the way
    /// `redis-cli --cluster reshard` does: `IMPORTING` on the target, `MIGRATING` on the
    /// source, `MIGRATE` of its keys in batches, then `SETSLOT NODE` on the target, the
    /// source and the other masters. `dwell` is slept in each intermediate state, so
    /// traffic meets the slot migrating (ASK) and migrated but not yet reassigned.
    pub fn move_slot(&self, slot: u16, to: usize, dwell: Duration) {
        let from = self.begin_migration(slot, to);
        std::thread::sleep(dwell);
        loop {
            let keys =
                self.nodes[from].must(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100"]);
            let keys: Vec<&str> = keys
                .lines()
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .collect();
            if keys.is_empty() {
                break;
            }
            self.migrate_keys(from, to, &keys);
        }
        std::thread::sleep(dwell);
        self.finish_migration(slot, from, to);
    }

    /// Marks `slot` importing on `nodes[to]` and migrating on its master; returns the
    /// master's index.
    pub fn begin_migration(&self, slot: u16, to: usize) -> usize {
        let from = self.node_for_slot(slot);
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let slot_arg = slot.to_string();
        let (from_id, to_id) = (self.id(from), self.id(to));
        self.ok(
            to,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id],
        );
        self.ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id],
        );
        from
    }

    /// Moves `keys` (one `MIGRATE`, atomically) from `nodes[from]` to `nodes[to]`.
    pub fn migrate_keys(&self, from: usize, to: usize, keys: &[&str]) {
        let port = self.nodes[to].port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().copied());
        let reply = self.nodes[from].must(&args);
        assert!(
            reply.trim() == "OK" || reply.trim() == "NOKEY",
            "MIGRATE answered {reply}"
        );
    }

    /// Gives `slot` to `nodes[to]` on the target, the source and the other masters, and
    /// waits until every node agrees.
    pub fn finish_migration(&self, slot: u16, from: usize, to: usize) {
        let slot_arg = slot.to_string();
        let to_id = self.id(to);
        let owner = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id];
        self.ok(to, &owner);
        self.ok(from, &owner);
        for other in self.masters() {
            if other != to && other != from {
                self.ok(other, &owner);
            }
        }
        self.wait_until("every node agrees on the moved slot", |c| {
            c.live().all(|node| {
                c.view_from(node).is_some_and(|view| {
                    view.iter().any(|n| {
                        n.port == c.nodes[to].port()
                            && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
                    })
                })
            })
        });
    }

    /// `CLUSTER FAILOVER` on the replica `nodes[replica]`; returns once every node sees it
    /// as a master and the cluster is settled again.
    pub fn failover(&self, replica: usize) {
        self.ok(replica, &["CLUSTER", "FAILOVER"]);
        self.wait_until("the replica is promoted", |c| c.role(replica) == "master");
        self.wait_until("the cluster settles after the failover", Self::is_settled);
    }

    /// Kills the master `nodes[master]` (SIGKILL) and returns once its replica reports
    /// itself a master; the caller may then wait for `is_settled`.
    pub fn kill_master_and_wait_for_promotion(&mut self, master: usize) -> usize {
        let replica = self.replica_of(master);
        self.nodes[master].kill();
        self.wait_until("the replica of the killed master is promoted", |c| {
            c.role(replica) == "master"
        });
        replica
    }
}

/// A Redis Sentinel deployment: a master, its replica and three `redis-server --sentinel`
/// processes monitoring it as [`RedisSentinels::NAME`] (quorum 2), each on a free port in
/// its own temporary directory.
///
/// The Sentinels run with `down-after-milliseconds 1000`, so a killed master is flagged
/// down after about a second and its replica promoted a second or two later.
#[derive(Debug)]
pub struct RedisSentinels {
    /// The two data nodes: the master, then its replica (roles change with a failover).
    pub nodes: Vec<RedisServer>,
    /// The three Sentinels.
    pub sentinels: Vec<SentinelServer>,
    /// The proxy in front of the first master, for a deployment started with
    /// [`start_behind_a_proxy`](Self::start_behind_a_proxy).
    pub master_proxy: Option<FaultProxy>,
}

/// One `redis-server --sentinel` process.
#[derive(Debug)]
pub struct SentinelServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl SentinelServer {
    /// Starts a Sentinel monitoring the master on `master_port` as `name`.
    fn start(name: &str, master_port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tollgate-sentinel-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        for _ in 0..20 {
            // A failed try's handle removes the directory when it drops.
            std::fs::create_dir_all(&dir).expect("temp dir for a sentinel");
            let port = free_port(false);
            // The Sentinel rewrites its configuration file as it learns the deployment.
            let config = dir.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {dir}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {name} 1000\n\
                 sentinel failover-timeout {name} 5000\n\
                 sentinel parallel-syncs {name} 1\n",
                dir = dir.display()
            );
            std::fs::write(&config, text).expect("write sentinel.conf");
            let child = match Command::new("redis-server")
                .arg(&config)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            {
                Ok(child) => child,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL_HINT}"),
                Err(e) => panic!("cannot run redis-server --sentinel: {e}"),
            };
            let mut sentinel = Self {
                port,
                dir: dir.clone(),
                child: Some(child),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Some(child) = sentinel.child.as_mut()
                    && let Ok(Some(_)) = child.try_wait()
                {
                    sentinel.child = None;
                    break;
                }
                match answering_process(port) {
                    Some(pid) if sentinel.child.as_ref().map(Child::id) == Some(pid) => {
                        return sentinel;
                    }
                    // Another process holds the port: try another.
                    Some(_) => break,
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            sentinel.kill();
        }
        panic!("could not start a sentinel on a free port");
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
        cli(self.port, args)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SentinelServer {
    fn drop(&mut self) {
        self.kill();
        give_back_port(self.port);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl RedisSentinels {
    /// The name the Sentinels monitor the master under.
    pub const NAME: &'static str = "tollgate";

    /// Starts the master, its replica (and waits until it is in sync), then the three
    /// Sentinels, and waits until every Sentinel knows the replica and the two others, so
    /// that a failover can be authorized.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// The same deployment, with the master reached through a [`FaultProxy`]
    /// ([`master_proxy`](Self::master_proxy)): the Sentinels monitor it at the proxy's
    /// address (so their clients are told that address too), and the replica replicates
    /// through it. [`cut_master_off_from_the_sentinels`](Self::cut_master_off_from_the_sentinels)
    /// then partitions the Sentinels from the master while every other client still
    /// reaches it.
    pub fn start_behind_a_proxy() -> Self {
        Self::start_with(true)
    }

    fn start_with(behind_a_proxy: bool) -> Self {
        let master = RedisServer::start();
        let master_proxy = behind_a_proxy.then(|| FaultProxy::start(master.port()));
        let master_port = master_proxy
            .as_ref()
            .map_or(master.port(), FaultProxy::port);
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master_port.to_string()]);
        let deployment = Self {
            nodes: vec![master, replica],
            sentinels: Vec::new(),
            master_proxy,
        };
        deployment.wait_until("the replica is in sync", |d| {
            d.nodes[1]
                .cli(&["INFO", "replication"])
                .is_some_and(|info| info.contains("master_link_status:up"))
        });
        let mut deployment = deployment;
        deployment.sentinels = (0..3)
            .map(|_| SentinelServer::start(Self::NAME, master_port))
            .collect();
        deployment.wait_until(
            "every Sentinel knows the replica and the other Sentinels",
            |d| {
                d.sentinels.iter().all(|s| {
                    s.cli(&["SENTINEL", "CKQUORUM", Self::NAME])
                        .is_some_and(|reply| reply.contains("3 usable Sentinels"))
                        && s.cli(&["SENTINEL", "REPLICAS", Self::NAME])
                            .is_some_and(|reply| reply.contains(&d.nodes[1].port().to_string()))
                })
            },
        );
        deployment
    }

    /// Blackholes the Sentinels' links to the master (a deployment started
    /// [`behind a proxy`](Self::start_behind_a_proxy)): the Sentinels name their
    /// connections `sentinel-<id>-...`, and the proxy holds what those send, so the
    /// Sentinels find the master down while it goes on answering every other client as a
    /// master.
    pub fn cut_master_off_from_the_sentinels(&self) {
        self.master_proxy
            .as_ref()
            .expect("a deployment started behind a proxy")
            .set_for_clients_named("sentinel-", Some(Fault::Blackhole));
    }

    /// Polls `ready` every 50 ms for up to 30 s; panics with `what` if it never holds.
    pub fn wait_until(&self, what: &str, mut ready: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready(self) {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The Sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelServer::url).collect()
    }

    /// `master` or `slave`, as `nodes[index]` reports its own role (`ROLE`); `None` if it
    /// does not answer.
    pub fn role(&self, index: usize) -> Option<String> {
        self.nodes[index]
            .cli(&["ROLE"])
            .and_then(|reply| reply.lines().next().map(|line| line.trim().to_owned()))
    }

    /// The port of the master as every Sentinel that answers reports it, if they agree.
    pub fn announced_master_port(&self) -> Option<u16> {
        let ports: Vec<u16> = self
            .sentinels
            .iter()
            .filter_map(|s| s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::NAME]))
            .filter_map(|reply| reply.lines().nth(1).and_then(|p| p.trim().parse().ok()))
            .collect();
        let first = *ports.first()?;
        ports.iter().all(|&p| p == first).then_some(first)
    }

    /// The port of the master as any Sentinel reports it.
    pub fn any_announced_master_port(&self) -> Option<u16> {
        self.sentinels
            .iter()
            .filter_map(|s| s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", Self::NAME]))
            .find_map(|reply| reply.lines().nth(1).and_then(|p| p.trim().parse().ok()))
    }

    /// Kills the master (SIGKILL) and returns when that was, when its replica first
    /// reported itself master (`ROLE`), and when a Sentinel first named the replica as the
    /// master (what a Sentinel client can learn).
    pub fn kill_master_and_wait_for_promotion(&mut self) -> Failover {
        let master = 0;
        assert_eq!(self.role(master).as_deref(), Some("master"));
        let killed = Instant::now();
        self.nodes[master].kill();
        let Promotion {
            promoted,
            announced,
        } = self.wait_for_promotion();
        Failover {
            killed,
            promoted,
            announced,
        }
    }

    /// Waits until the replica (`nodes[1]`) reports itself master (`ROLE`) and a Sentinel
    /// names it as the master, polling every 10 ms for up to 30 s; returns when each was
    /// first seen.
    pub fn wait_for_promotion(&self) -> Promotion {
        let replica = 1;
        let replica_port = self.nodes[replica].port();
        let mut promoted = None;
        let mut announced = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        while promoted.is_none() || announced.is_none() {
            assert!(
                Instant::now() < deadline,
                "the replica was not promoted (promoted {promoted:?}, announced {announced:?})"
            );
            if promoted.is_none() && self.role(replica).as_deref() == Some("master") {
                promoted = Some(Instant::now());
            }
            if announced.is_none() && self.any_announced_master_port() == Some(replica_port) {
                announced = Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Promotion {
            promoted: promoted.unwrap(),
            announced: announced.unwrap(),
        }
    }
}

/// When a replica was promoted, as [`RedisSentinels::wait_for_promotion`] saw it.
#[derive(Clone, Copy, Debug)]
pub struct Promotion {
    /// The replica first reported itself master.
    pub promoted: Instant,
    /// A Sentinel first named the replica as the master.
    pub announced: Instant,
}

/// When a Sentinel failover's steps happened.
#[derive(Clone, Copy, Debug)]
pub struct Failover {
    /// The master was killed.
    pub killed: Instant,
    /// Its replica first reported itself master.
    pub promoted: Instant,
    /// A Sentinel first named the replica as the master.
    pub announced: Instant,
}
