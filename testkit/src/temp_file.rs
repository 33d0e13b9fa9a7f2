//! A file in the temporary directory for one test, removed when dropped: when the test
//! fails too, and when the process it was written for never started (CI runs on the
//! machine's own disk).

use std::path::{Path, PathBuf};

/// A file written in the temporary directory, removed when dropped.
#[derive(Debug)]
pub struct TempFile {
    path: PathBuf,
}

impl TempFile {
    /// `contents` in `tollgate-<label>-<process>-<thread>.toml`: tests running at once, in
    /// this process or another, each write their own file.
    pub fn write(label: &str, contents: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "tollgate-{label}-{}-{:?}.toml",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::write(&path, contents).unwrap();
        Self { path }
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
