//! Compiled in place of tests that need Redis and read callers' addresses from axum's
//! `ConnectInfo` (the `redis` and `axum` features, and redis-server on the PATH) when
//! either feature is off: the test output lists them as ignored, with the reason.

#[test]
#[ignore = "needs the redis and axum features and redis-server: cargo test --all-features"]
fn needs_the_redis_and_axum_features() {
    panic!("built without the redis or the axum feature: run cargo test --all-features");
}
