//! Compiled in place of tests whose callers' addresses come from tonic's `TcpConnectInfo`,
//! which the client-IP key reads only with the `tonic` feature, when the feature is off: the
//! test output lists them as ignored, with the reason.

#[test]
#[ignore = "needs the tonic feature: cargo test --all-features"]
fn needs_the_tonic_feature() {
    panic!("built without the tonic feature: run cargo test --all-features");
}
