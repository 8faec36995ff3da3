//! The example service (`examples/ecommerce`) as a program the tests run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The `ecommerce` binary, built once per test run with `cargo build -p
/// ecommerce` (a binary of another package is not built for a package's
/// tests).
///
/// # Panics
/// When the build fails or reports no executable.
pub fn example_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let output = Command::new(env!("CARGO"))
            .args([
                "build",
                "-p",
                "ecommerce",
                "--message-format=json-render-diagnostics",
            ])
            .current_dir(&workspace)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("run cargo build -p ecommerce: {e}"));
        assert!(output.status.success(), "cargo build -p ecommerce failed");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|message| {
                message["reason"] == "compiler-artifact" && message["target"]["name"] == "ecommerce"
            })
            .find_map(|message| message["executable"].as_str().map(PathBuf::from))
            .unwrap_or_else(|| panic!("cargo build -p ecommerce reported no executable"))
    })
}
