//! The access log's line, written straight into the log's queue.
//!
//! One line per request is the log's hottest path: formatted by the tracing subscriber,
//! with a visitor per field and a formatter per value, it cost about a tenth of a small
//! request's handling. Here it is written in one pass, in exactly the text or JSON the
//! subscriber gives every other line (`tests` below checks this against the subscriber
//! itself), behind the same filter: the caller asks `tracing::enabled!` at the access
//! log's target first. Where no log of foldgate's is installed (a library user, tests),
//! [`write`] says so and the caller logs through `tracing`.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use super::log_writer::QueueWriter;
use crate::config::LogFormat;

/// The target access lines are logged at (the access log layer's module).
pub const TARGET: &str = "foldgate::http::layers::access_log";

/// One request as the access log tells it.
#[derive(Debug, Clone, Copy)]
pub struct AccessLine<'a> {
    /// The request method.
    pub method: &'a str,
    /// The request path, without its query.
    pub path: &'a str,
    /// The response status.
    pub status: u16,
    /// From the request to the end of its answer, in microseconds (logged as
    /// milliseconds: `duration_ms`).
    pub duration_us: u64,
    /// The request id (`-` when none).
    pub request_id: &'a str,
    /// How the answer's body ended: `complete`, `body_error` or `aborted`.
    pub outcome: &'static str,
}

struct Sink {
    writer: QueueWriter,
    format: LogFormat,
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// Sends access lines to `writer` in `format` from now on (the log foldgate installed).
pub(super) fn install(writer: QueueWriter, format: LogFormat) {
    let _ = SINK.set(Sink { writer, format });
}

/// Writes `line` to foldgate's log; false when foldgate installed no log here (the
/// caller then logs through `tracing`).
pub fn write(line: &AccessLine<'_>) -> bool {
    let Some(sink) = SINK.get() else { return false };
    let mut text = String::with_capacity(256);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format(&mut text, sink.format, now.as_secs(), now.subsec_micros(), line);
    sink.writer.append(text.as_bytes());
    true
}

/// `line` as the log's formatter writes it at `secs`.`micros` past the epoch.
fn format(out: &mut String, format: LogFormat, secs: u64, micros: u32, line: &AccessLine<'_>) {
    match format {
        LogFormat::Text => {
            timestamp(out, secs, micros);
            out.push_str("  INFO ");
            out.push_str(TARGET);
            out.push_str(": request method=");
            out.push_str(line.method);
            out.push_str(" path=");
            out.push_str(line.path);
            out.push_str(" status=");
            out.push_str(itoa::Buffer::new().format(line.status));
            out.push_str(" duration_ms=");
            millis(out, line.duration_us);
            out.push_str(" request_id=");
            out.push_str(line.request_id);
            // As `{:?}` writes it: the outcomes are plain words, nothing to escape.
            out.push_str(" outcome=\"");
            out.push_str(line.outcome);
            out.push('"');
        }
        LogFormat::Json => {
            out.push_str("{\"timestamp\":\"");
            timestamp(out, secs, micros);
            out.push_str("\",\"level\":\"INFO\",\"message\":\"request\",\"method\":");
            json_string(out, line.method);
            out.push_str(",\"path\":");
            json_string(out, line.path);
            out.push_str(",\"status\":");
            out.push_str(itoa::Buffer::new().format(line.status));
            out.push_str(",\"duration_ms\":");
            millis(out, line.duration_us);
            out.push_str(",\"request_id\":");
            json_string(out, line.request_id);
            out.push_str(",\"outcome\":");
            json_string(out, line.outcome);
            out.push_str(",\"target\":\"");
            out.push_str(TARGET);
            out.push_str("\"}");
        }
    }
    out.push('\n');
}

impl AccessLine<'_> {
    /// The duration in milliseconds, as the line states it.
    pub fn duration_ms(&self) -> f64 {
        self.duration_us as f64 / 1000.0
    }
}

/// `micros` as milliseconds, written as the formatter writes the `f64`
/// `micros / 1000.0` (its shortest form, `1.0` for a whole number): with at most three
/// decimals and far below 2^53, the decimal is that number's shortest form. Integers
/// instead of the float formatter: it cost a tenth of the line.
fn millis(out: &mut String, micros: u64) {
    out.push_str(itoa::Buffer::new().format(micros / 1000));
    out.push('.');
    let fraction = micros % 1000;
    if fraction == 0 {
        out.push('0');
        return;
    }
    let (mut fraction, mut width) = (fraction, 3);
    while fraction % 10 == 0 {
        fraction /= 10;
        width -= 1;
    }
    digits(out, fraction, width);
}

fn json_string(out: &mut String, text: &str) {
    match serde_json::to_string(text) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC), as the log's formatter writes its timestamps.
/// The text up to the second is made once a second per thread.
fn timestamp(out: &mut String, secs: u64, micros: u32) {
    thread_local! {
        static SECOND: RefCell<(u64, String)> = const { RefCell::new((0, String::new())) };
    }
    SECOND.with(|second| {
        let mut second = second.borrow_mut();
        let (at, text) = &mut *second;
        if *at != secs || text.is_empty() {
            text.clear();
            to_the_second(text, secs);
            *at = secs;
        }
        out.push_str(text);
    });
    out.push('.');
    digits(out, u64::from(micros), 6);
    out.push('Z');
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC).
fn to_the_second(out: &mut String, secs: u64) {
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (of_day / 3600, of_day / 60 % 60, of_day % 60);
    match u64::try_from(year) {
        Ok(year) if year <= 9999 => digits(out, year, 4),
        // Years the layout below does not hold, written as the formatter writes them.
        _ => drop(write!(out, "{year:04}")),
    }
    out.push('-');
    digits(out, u64::from(month), 2);
    out.push('-');
    digits(out, u64::from(day), 2);
    out.push('T');
    digits(out, hour, 2);
    out.push(':');
    digits(out, minute, 2);
    out.push(':');
    digits(out, second, 2);
}

/// The last `width` decimal digits of `value`, zero-padded.
fn digits(out: &mut String, value: u64, width: u32) {
    let mut place = 10u64.pow(width.saturating_sub(1));
    for _ in 0..width {
        out.push(char::from(b'0' + (value / place % 10) as u8));
        place = (place / 10).max(1);
    }
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, u32::try_from(month).unwrap_or(1), u32::try_from(day).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    const LINE: AccessLine<'static> = AccessLine {
        method: "POST",
        path: "/v1/chat/completions",
        status: 200,
        duration_us: 523_417,
        request_id: "4bf92f3577b34da6",
        outcome: "complete",
    };

    /// The line the tracing subscriber writes for the access log's event, configured as
    /// `telemetry::init` configures it.
    fn by_the_subscriber(format: LogFormat) -> String {
        let captured = Captured::default();
        let builder = tracing_subscriber::fmt().with_writer(captured.clone());
        let dispatch = match format {
            LogFormat::Text => tracing::Dispatch::new(builder.with_ansi(false).finish()),
            LogFormat::Json => tracing::Dispatch::new(builder.json().flatten_event(true).finish()),
        };
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::info!(
                target: "foldgate::http::layers::access_log",
                method = %LINE.method,
                path = %LINE.path,
                status = LINE.status,
                duration_ms = LINE.duration_ms(),
                request_id = %LINE.request_id,
                outcome = LINE.outcome,
                "request"
            );
        });
        let bytes = captured.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn text_lines_are_the_subscriber_s() {
        let expected = by_the_subscriber(LogFormat::Text);
        let mut ours = String::new();
        format(&mut ours, LogFormat::Text, 1_795_000_000, 123_456, &LINE);
        // The timestamps differ (the subscriber reads the clock); the rest is the same.
        let (_, expected_rest) = expected.split_once(' ').unwrap();
        let (stamp, ours_rest) = ours.split_once(' ').unwrap();
        assert_eq!(ours_rest, expected_rest);
        assert_eq!(stamp, "2026-11-18T11:06:40.123456Z");
    }

    #[test]
    fn json_lines_are_the_subscriber_s() {
        let expected = by_the_subscriber(LogFormat::Json);
        let mut ours = String::new();
        format(&mut ours, LogFormat::Json, 1_795_000_000, 123_456, &LINE);
        let mut expected: serde_json::Value = serde_json::from_str(&expected).unwrap();
        let ours: serde_json::Value = serde_json::from_str(&ours).unwrap();
        expected["timestamp"] = ours["timestamp"].clone();
        assert_eq!(ours, expected);
        assert!(ours.to_string().len() > 100);
    }

    #[test]
    fn milliseconds_are_the_float_formatters() {
        let mut samples: Vec<u64> = vec![0, 1, 7, 10, 100, 999, 1000, 1001, 1010, 1100, 523_417];
        samples.extend([86_400_000_000, 123_456_789_012, (1 << 52) - 1]);
        // A spread of magnitudes, with and without trailing zeros.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            samples.push(x >> (x % 50 + 14));
        }
        for micros in samples {
            let mut ours = String::new();
            millis(&mut ours, micros);
            let value = micros as f64 / 1000.0;
            assert_eq!(ours, format!("{value:?}"), "text, {micros} us");
            assert_eq!(ours, serde_json::to_string(&value).unwrap(), "json, {micros} us");
        }
    }

    #[test]
    fn dates_are_the_calendar_s() {
        let mut out = String::new();
        timestamp(&mut out, 0, 0);
        assert_eq!(out, "1970-01-01T00:00:00.000000Z");
        out.clear();
        // 2024-02-29 (a leap day) 23:59:59.
        timestamp(&mut out, 1_709_251_199, 999_999);
        assert_eq!(out, "2024-02-29T23:59:59.999999Z");
        out.clear();
        timestamp(&mut out, 4_102_444_800, 7);
        assert_eq!(out, "2100-01-01T00:00:00.000007Z");
    }
}
