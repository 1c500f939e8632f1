//! External programs the tests start (redis-server, prometheus).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

/// True when `tool` runs here (`tool --version`). A missing tool fails under CI, where
/// `.ci/run` installs the Debian `package`, and skips elsewhere, saying why.
#[allow(clippy::print_stderr)] // the skip reason is the output
pub fn tool_available(tool: &str, package: &str) -> bool {
    let found = std::process::Command::new(tool)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "`{tool}` is not on PATH under CI (.ci/run installs the Debian package {package})"
        );
        eprintln!("SKIPPED: `{tool}` is not on PATH (apt-get install {package})");
    }
    found
}

/// True when python3 imports `module` (an official SDK the client tests drive). Missing,
/// it fails under CI, where `.ci/run` installs it with pip, and skips elsewhere, saying
/// why.
#[allow(clippy::print_stderr)] // the skip reason is the output
pub fn python_module_available(module: &str) -> bool {
    let found = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "the python package {module} is missing under CI (.ci/run installs it)"
        );
        eprintln!(
            "SKIPPED: python3 with the `{module}` package is not installed (pip install {module})"
        );
    }
    found
}
