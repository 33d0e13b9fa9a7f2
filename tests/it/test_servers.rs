//! The harness's redis-servers are the tests' own: a test is never handed a server that
//! another test started, whose counters it would share.

use tollgate_testkit::redis::RedisServer;

#[test]
fn a_port_another_server_answers_on_is_not_taken_for_a_new_one() {
    let first = RedisServer::start();
    first.must(&["SET", "owner", "first"]);
    // The new server fails to bind while the first one answers on the port.
    assert!(
        RedisServer::try_start_on(first.port()).is_none(),
        "a server that never bound was taken for started"
    );
    assert_eq!(first.must(&["GET", "owner"]).trim(), "first");
}
