//! Compiled in place of the tests that run the orders_api example, which is built only with
//! its required features (`axum`, `redis` and `serde`), when one is off: the test output
//! lists them as ignored, with the reason.

#[test]
#[ignore = "runs the orders_api example, which needs the axum, redis and serde features: cargo test --all-features"]
fn needs_the_orders_api_example() {
    panic!("built without the orders_api example's features: run cargo test --all-features");
}
