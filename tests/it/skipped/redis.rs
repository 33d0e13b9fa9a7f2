//! Compiled in place of tests that need Redis (the `redis` feature, and redis-server on the
//! PATH) when the feature is off: the test output lists them as ignored, with the reason.

#[test]
#[ignore = "needs the redis feature and redis-server: cargo test --all-features"]
fn needs_the_redis_feature() {
    panic!("built without the redis feature: run cargo test --all-features");
}
