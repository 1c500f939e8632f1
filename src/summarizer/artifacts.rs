//! Error lines: how a tool result or command output says that something failed. The
//! extractive digest and the work trail (`crate::compaction::trail`) read results with
//! it.

const ERROR_CUES: &[&str] = &[
    "Error: ",
    "error: ",
    "Exception: ",
    "FAILED",
    "panicked at",
    "No such file",
    "command not found",
    "Permission denied",
    "not found",
];

/// True for a line that reports an error (a failing test, an exception, a shell error),
/// and not for code or file listings that merely mention one (`errors.py`,
/// `except ValueError:`).
pub fn is_error_line(line: &str) -> bool {
    let t = line.trim_start();
    ["Traceback", "Error:", "Error ", "error:", "error[", "ERROR", "E   ", "fatal:"]
        .iter()
        .any(|p| t.starts_with(p))
        || ERROR_CUES.iter().any(|cue| line.contains(cue))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines() {
        for yes in [
            "Traceback (most recent call last):",
            "ValueError: bad input",
            "E   assert 1 == 2",
            "FAILED tests/a.py::t",
            "bash: foo: command not found",
        ] {
            assert!(is_error_line(yes), "{yes}");
        }
        for no in [
            "errors.py  solar_system.py",
            "    except ValueError:",
            "raise ModelDefinitionError(",
            "all good",
        ] {
            assert!(!is_error_line(no), "{no}");
        }
    }
}
