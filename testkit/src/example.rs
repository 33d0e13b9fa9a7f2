//! The crate's example programs, as `cargo test` builds them.

use std::path::PathBuf;

/// The example binary `name`, built by `cargo test` next to the running test binary.
pub fn binary(name: &str) -> PathBuf {
    let mut dir = std::env::current_exe().expect("test binary path");
    dir.pop();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run through cargo test, which builds examples",
        path.display()
    );
    path
}
