//! The fault proxy itself does what the outage tests rely on.

use std::time::{Duration, Instant};

use tollgate_testkit::proxy::{Fault, FaultProxy, accepts};
use tollgate_testkit::redis::RedisServer;

fn ping(port: u16, timeout: Duration) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream =
        std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.write_all(b"PING\r\n").ok()?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).ok()?;
    Some(String::from_utf8_lossy(&reply).into_owned())
}

#[test]
fn every_fault_does_what_it_says() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    assert_eq!(
        ping(proxy.port(), Duration::from_secs(1)).as_deref(),
        Some("+PONG\r\n")
    );

    proxy.set(Fault::Refuse);
    assert!(!accepts(proxy.port()));

    proxy.set(Fault::Blackhole);
    assert!(accepts(proxy.port()));
    assert_eq!(ping(proxy.port(), Duration::from_millis(300)), None);

    proxy.set(Fault::Delay(Duration::from_millis(200)));
    let start = Instant::now();
    assert_eq!(
        ping(proxy.port(), Duration::from_secs(2)).as_deref(),
        Some("+PONG\r\n")
    );
    assert!(start.elapsed() >= Duration::from_millis(200));

    proxy.set(Fault::Pass);
    assert_eq!(
        ping(proxy.port(), Duration::from_secs(1)).as_deref(),
        Some("+PONG\r\n")
    );
}

#[test]
fn cut_drops_live_connections() {
    use std::io::{Read, Write};
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    stream.write_all(b"PING\r\n").unwrap();
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).unwrap();
    proxy.cut();
    std::thread::sleep(Duration::from_millis(100));
    let _ = stream.write_all(b"PING\r\n");
    let mut buffer = [0u8; 16];
    assert!(
        matches!(stream.read(&mut buffer), Ok(0) | Err(_)),
        "the connection survived the cut"
    );
}

#[test]
fn held_first_bytes_slow_a_new_connection_only() {
    use std::io::{Read, Write};
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let round_trip = |stream: &mut std::net::TcpStream| {
        stream
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let start = Instant::now();
        stream.write_all(b"PING\r\n").unwrap();
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"+PONG\r\n");
        start.elapsed()
    };
    // Served (one exchange) before the delay is set.
    let mut before = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    round_trip(&mut before);
    proxy.delay_first_bytes(Duration::from_millis(100));
    let mut fresh = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    // The first exchange of a new connection waits twice (each way), the next ones do not.
    let first = round_trip(&mut fresh);
    assert!(first >= Duration::from_millis(200), "{first:?}");
    let second = round_trip(&mut fresh);
    assert!(second < Duration::from_millis(100), "{second:?}");
    // A connection accepted before the delay was set is not held at all.
    let earlier = round_trip(&mut before);
    assert!(earlier < Duration::from_millis(100), "{earlier:?}");
}

#[test]
fn a_fault_for_named_clients_leaves_the_others_alone() {
    use std::io::{Read, Write};
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let named = |timeout: Duration| -> Option<Vec<u8>> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).ok()?;
        stream.set_read_timeout(Some(timeout)).ok()?;
        stream
            .write_all(b"CLIENT SETNAME sentinel-1234abcd-cmd\r\nPING\r\n")
            .ok()?;
        let mut reply = [0u8; 12];
        stream.read_exact(&mut reply).ok()?;
        Some(reply.to_vec())
    };
    assert_eq!(
        named(Duration::from_secs(1)).as_deref(),
        Some(&b"+OK\r\n+PONG\r\n"[..])
    );
    proxy.set_for_clients_named("sentinel-", Some(Fault::Blackhole));
    assert_eq!(named(Duration::from_millis(300)), None);
    assert_eq!(
        ping(proxy.port(), Duration::from_secs(1)).as_deref(),
        Some("+PONG\r\n"),
        "a client that did not name itself was held"
    );
    // A connection held by the blackhole is cut when it ends.
    let mut held = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    held.write_all(b"CLIENT SETNAME sentinel-1234abcd-cmd\r\n")
        .unwrap();
    // Held, not answered, before the fault ends: on a busy machine the proxy's thread may
    // read the name later than any fixed pause, so wait until it says it holds the data:
    // this connection's and that of the named client above, whose bytes it read too.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while proxy.held() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy never held the named connection"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    held.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut buffer = [0u8; 16];
    assert!(
        held.read(&mut buffer).is_err(),
        "the named connection was answered during the blackhole"
    );
    held.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    proxy.set_for_clients_named("sentinel-", None);
    assert!(
        matches!(held.read(&mut buffer), Ok(0) | Err(_)),
        "the held connection survived the end of the blackhole"
    );
    assert_eq!(
        named(Duration::from_secs(1)).as_deref(),
        Some(&b"+OK\r\n+PONG\r\n"[..])
    );
}
