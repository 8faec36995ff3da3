//! [`TestSqliteFile`]: a SQLite database file of one test, removed with its
//! `-wal`, `-shm` and `-journal` companions when the test ends (also when it
//! panics).

use std::path::{Path, PathBuf};

use crate::names;

/// A SQLite file of a test: a unique path (nothing is created: SQLite
/// creates the file on the first connection), deleted on drop with the
/// files SQLite keeps beside it.
#[derive(Debug)]
pub struct TestSqliteFile {
    path: PathBuf,
}

impl TestSqliteFile {
    /// `<dir>/<prefix>_<test>_<pid>_<n>.db`.
    pub fn new(dir: impl AsRef<Path>, prefix: &str, test: &str) -> TestSqliteFile {
        TestSqliteFile {
            path: dir
                .as_ref()
                .join(format!("{}.db", names::unique(prefix, test))),
        }
    }

    /// Exactly `path` (unique already, e.g. in a directory of the test's own).
    pub fn at(path: impl Into<PathBuf>) -> TestSqliteFile {
        TestSqliteFile { path: path.into() }
    }

    /// [`new`](Self::new) in the system's temporary directory.
    pub fn temp(prefix: &str, test: &str) -> TestSqliteFile {
        TestSqliteFile::new(std::env::temp_dir(), prefix, test)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `sqlite://<path>`.
    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }
}

impl Drop for TestSqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut file = self.path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
}
