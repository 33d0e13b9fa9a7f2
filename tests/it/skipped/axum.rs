//! Compiled in place of tests whose callers' addresses come from axum's `ConnectInfo`, which
//! the client-IP key reads only with the `axum` feature, when the feature is off: the test
//! output lists them as ignored, with the reason.

#[test]
#[ignore = "needs the axum feature (on by default): cargo test --all-features"]
fn needs_the_axum_feature() {
    panic!("built without the axum feature: run cargo test --all-features");
}
