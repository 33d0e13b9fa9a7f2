//! A TCP proxy in front of redis-server that injects real faults while traffic runs:
//! pass, refuse connections, blackhole (accept and never answer, live connections
//! included), delay, cut live connections, and hold each new connection's first bytes (a
//! slow handshake: TLS, another zone). A fault can also be applied to some clients only,
//! told apart by the name they give themselves (`CLIENT SETNAME`): a partition between
//! those clients and the server while everyone else's traffic passes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward both ways.
    Pass,
    /// Nothing listens: connections are refused, live ones are cut.
    Refuse,
    /// Accept, read and never answer. Held connections are cut when the blackhole ends, as
    /// a connection that lived through a long partition would be.
    Blackhole,
    /// Forward each request this much later.
    Delay(Duration),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    fault: Fault,
    /// Bumped to cut every live connection.
    generation: u64,
    /// How long the first bytes each way of a new connection are held.
    first_bytes_delay: Duration,
    /// A fault for the connections whose client names itself with this prefix, in place
    /// of `fault`.
    named: Option<(&'static str, Fault)>,
}

impl State {
    /// The fault set for the clients named like `name`, if one is.
    fn named_fault_for(&self, name: Option<&str>) -> Option<Fault> {
        match (self.named, name) {
            (Some((prefix, fault)), Some(name)) if name.starts_with(prefix) => Some(fault),
            _ => None,
        }
    }

    /// The fault that applies to a connection whose client named itself `name`.
    fn fault_for(&self, name: Option<&str>) -> Fault {
        self.named_fault_for(name).unwrap_or(self.fault)
    }
}

/// A proxy on a free loopback port, running on its own thread and runtime so that it keeps
/// working whatever the test's runtime does. Stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    state: Arc<watch::Sender<State>>,
    /// How many connections have data held by a blackhole now.
    held: Arc<AtomicUsize>,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Proxies a free port to `upstream_port` on loopback, passing traffic.
    pub fn start(upstream_port: u16) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        let (state, _) = watch::channel(State {
            fault: Fault::Pass,
            generation: 0,
            first_bytes_delay: Duration::ZERO,
            named: None,
        });
        let state = Arc::new(state);
        let held = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = {
            let state = state.clone();
            let held = held.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let upstream = Upstream {
                    port: upstream_port,
                    held,
                };
                runtime.block_on(run(port, upstream, state, listener, stopped));
            })
        };
        Self {
            port,
            state,
            held,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// How many connections have data the proxy read and holds now, under a blackhole (its
    /// own or one for named clients). A test waits for this before it ends the fault, so
    /// that the connection it checks was held, however late the proxy's thread ran.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Switches the fault; takes effect at once, on live connections too.
    pub fn set(&self, fault: Fault) {
        let leaving_blackhole =
            self.state.borrow().fault == Fault::Blackhole && fault != Fault::Blackhole;
        self.state.send_modify(|state| {
            state.fault = fault;
            if fault == Fault::Refuse || leaving_blackhole {
                state.generation += 1;
            }
        });
        // Wait until the proxy thread has closed or rebound its listening socket, so the
        // fault is in force when this returns.
        let listening = fault != Fault::Refuse;
        for _ in 0..200 {
            if accepts(self.port) == listening {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "the proxy on port {} did not switch to {fault:?}",
            self.port
        );
    }

    /// Cuts every live connection; new ones are handled as the current fault says.
    pub fn cut(&self) {
        self.state.send_modify(|state| state.generation += 1);
    }

    /// Applies `fault` to the connections whose client names itself with a name starting
    /// with `prefix` (`CLIENT SETNAME` in the first bytes it sends, as a Sentinel names its
    /// links to the instances it watches: `sentinel-<id>-cmd`), live ones included, and the
    /// proxy's own fault to the others; `None` ends it. Refused, such a connection is cut
    /// (the proxy still listens for the others); when a blackhole of them ends, the
    /// connections it held are cut.
    pub fn set_for_clients_named(&self, prefix: &'static str, fault: Option<Fault>) {
        self.state
            .send_modify(|state| state.named = fault.map(|fault| (prefix, fault)));
    }

    /// Holds the first bytes each way of every connection accepted from now on for
    /// `delay` (zero: none), as a slow handshake would: a client's connection setup takes
    /// two of these delays longer, the connection's later traffic none.
    pub fn delay_first_bytes(&self, delay: Duration) {
        self.state
            .send_modify(|state| state.first_bytes_delay = delay);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.take();
        self.state.send_modify(|state| state.generation += 1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Where the proxy forwards to, and its count of held connections.
#[derive(Clone)]
struct Upstream {
    port: u16,
    held: Arc<AtomicUsize>,
}

async fn run(
    port: u16,
    upstream: Upstream,
    state: Arc<watch::Sender<State>>,
    initial: std::net::TcpListener,
    stopped: std::sync::mpsc::Receiver<()>,
) {
    let mut changes = state.subscribe();
    initial
        .set_nonblocking(true)
        .expect("a non-blocking listener");
    let mut listener = Some(TcpListener::from_std(initial).expect("a tokio listener"));
    loop {
        if matches!(
            stopped.try_recv(),
            Err(std::sync::mpsc::TryRecvError::Disconnected)
        ) {
            return;
        }
        let fault = changes.borrow_and_update().fault;
        if fault == Fault::Refuse {
            listener = None;
        } else if listener.is_none() {
            listener = TcpListener::bind(("127.0.0.1", port)).await.ok();
        }
        tokio::select! {
            accepted = accept(listener.as_ref()) => {
                if let Some((client, _)) = accepted {
                    tokio::spawn(serve(client, upstream.clone(), state.subscribe()));
                }
            }
            _ = changes.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> Option<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await.ok(),
        None => std::future::pending().await,
    }
}

async fn serve(client: TcpStream, upstream: Upstream, mut state: watch::Receiver<State>) {
    let (generation, first_bytes_delay) = {
        let state = state.borrow();
        (state.generation, state.first_bytes_delay)
    };
    let _ = client.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    // A client speaks first: its first bytes say who it is, before anything is forwarded.
    let mut first = vec![0u8; 16 * 1024];
    let Ok(read @ 1..) = client_read.read(&mut first).await else {
        return;
    };
    first.truncate(read);
    let name = client_name(&first);
    // The fault as of the first bytes: a blackhole that ends while the upstream connection
    // is made still cuts this connection.
    let (first_fault, refused) = {
        let state = state.borrow_and_update();
        let name = name.as_deref();
        (
            state.fault_for(name),
            state.named_fault_for(name) == Some(Fault::Refuse),
        )
    };
    if refused {
        return;
    }
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream.port)).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (mut upstream_read, mut upstream_write) = server.into_split();
    let requests = pump(
        &mut client_read,
        &mut upstream_write,
        Pumped {
            state: state.clone(),
            name: name.clone(),
            requests: true,
            first_delay: first_bytes_delay,
            first: Some(first),
            held: upstream.held.clone(),
        },
    );
    let replies = pump(
        &mut upstream_read,
        &mut client_write,
        Pumped {
            state: state.clone(),
            name: name.clone(),
            requests: false,
            first_delay: first_bytes_delay,
            first: None,
            held: upstream.held.clone(),
        },
    );
    let cut = async {
        let mut was = first_fault;
        while state.changed().await.is_ok() {
            let state = state.borrow();
            if state.generation != generation {
                return;
            }
            // The proxy's own faults cut by a new generation; a fault for named clients cuts
            // their connections here, as the proxy's own would.
            let now = state.fault_for(name.as_deref());
            let refused = state.named_fault_for(name.as_deref()) == Some(Fault::Refuse);
            if refused || (was == Fault::Blackhole && now != Fault::Blackhole) {
                return;
            }
            was = now;
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = replies => {}
        _ = cut => {}
    }
}

/// The name a client gives itself with `CLIENT SETNAME` in `bytes` (RESP or inline), if it
/// does.
fn client_name(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let words: Vec<&str> = text
        .split(['\r', '\n', ' '])
        .filter(|word| !word.is_empty() && !word.starts_with(['*', '$']))
        .collect();
    words
        .windows(3)
        .find(|w| w[0].eq_ignore_ascii_case("CLIENT") && w[1].eq_ignore_ascii_case("SETNAME"))
        .map(|w| w[2].to_owned())
}

/// One direction of a connection, as [`pump`] copies it.
struct Pumped {
    state: watch::Receiver<State>,
    /// The name the client gave itself, if any.
    name: Option<String>,
    requests: bool,
    /// How long the first chunk waits more.
    first_delay: Duration,
    /// A first chunk already read.
    first: Option<Vec<u8>>,
    /// The proxy's count of connections held now.
    held: Arc<AtomicUsize>,
}

/// Copies one direction, obeying the fault before each chunk is forwarded; the first
/// chunk waits `first_delay` more. A delay holds each chunk that long after it arrived,
/// while the chunks behind it keep arriving: latency, as a long link has, not a narrow one
/// (a large command read in several chunks takes the delay once, not once per chunk).
async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    pumped: Pumped,
) {
    let Pumped {
        mut state,
        name,
        requests,
        mut first_delay,
        mut first,
        held,
    } = pumped;
    let (forward, mut forwarded) =
        tokio::sync::mpsc::unbounded_channel::<(Option<tokio::time::Instant>, Vec<u8>)>();
    let reader = async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = match first.take() {
                Some(chunk) => {
                    buffer[..chunk.len()].copy_from_slice(&chunk);
                    chunk.len()
                }
                None => match from.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(read) => read,
                },
            };
            if !first_delay.is_zero() {
                tokio::time::sleep(std::mem::take(&mut first_delay)).await;
            }
            let mut holding = None;
            let due = loop {
                let fault = state.borrow_and_update().fault_for(name.as_deref());
                match fault {
                    Fault::Pass => break None,
                    Fault::Delay(delay) if requests => {
                        break Some(tokio::time::Instant::now() + delay);
                    }
                    Fault::Delay(_) => break None,
                    // Hold the data; the connection is cut when the fault changes.
                    Fault::Blackhole | Fault::Refuse => {
                        holding.get_or_insert_with(|| Holding::new(&held));
                        if state.changed().await.is_err() {
                            return;
                        }
                        // Cut here too, before the held data goes on: the watcher in
                        // `serve` may be polled after this direction and the other have
                        // already forwarded the data and its answer.
                        let now = state.borrow().fault_for(name.as_deref());
                        if fault == Fault::Blackhole && now != Fault::Blackhole {
                            return;
                        }
                    }
                }
            };
            drop(holding);
            if forward.send((due, buffer[..read].to_vec())).is_err() {
                return;
            }
        }
    };
    let writer = async {
        while let Some((due, chunk)) = forwarded.recv().await {
            if let Some(due) = due {
                tokio::time::sleep_until(due).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(reader, writer);
}

/// One connection counted as held while this lives (the connection may be dropped while
/// held: the count goes down then too).
struct Holding(Arc<AtomicUsize>);

impl Holding {
    fn new(held: &Arc<AtomicUsize>) -> Self {
        held.fetch_add(1, Ordering::SeqCst);
        Self(held.clone())
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether a TCP connection to `port` on loopback succeeds now.
pub fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
        .is_ok()
}
