//! External programs the tests start (redis-server, prometheus).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

/// True when `tool` runs here (`tool --version`). A missing tool fails under CI, where
/// `.ci/run` installs the Debian `package`, and skips elsewhere, saying why.
pub fn tool_available(tool: &str, package: &str) -> bool {
    available(
        std::process::Command::new(tool).arg("--version"),
        &format!(
            "`{tool}` is not on PATH under CI (.ci/run installs the Debian package {package})"
        ),
        &format!("`{tool}` is not on PATH (apt-get install {package})"),
    )
}

/// True when python3 imports `module` (an official SDK the client tests drive). Missing,
/// it fails under CI, where `.ci/run` installs it with pip, and skips elsewhere, saying
/// why.
pub fn python_module_available(module: &str) -> bool {
    available(
        std::process::Command::new("python3").args(["-c", &format!("import {module}")]),
        &format!("the python package {module} is missing under CI (.ci/run installs it)"),
        &format!("python3 with the `{module}` package is not installed (pip install {module})"),
    )
}

/// True when `check` runs and succeeds; otherwise fails under CI with `under_ci`, and
/// elsewhere prints why the test is skipped (`skipped`).
#[allow(clippy::print_stderr)] // the skip reason is the output
fn available(check: &mut std::process::Command, under_ci: &str, skipped: &str) -> bool {
    let found = check
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "{under_ci}");
        eprintln!("SKIPPED: {skipped}");
    }
    found
}
