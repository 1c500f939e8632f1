//! `[telemetry]`: OpenTelemetry trace export over OTLP, off by default. The standard
//! `OTEL_*` variables fill what the configuration leaves unset (a value set in the file or
//! by a `FOLDGATE_TELEMETRY__*` variable wins over them, and they win over the defaults),
//! as OpenTelemetry users expect of any instrumented program.

use serde::{Deserialize, Serialize};

use super::SecretUrl;
use super::env::Override;

/// `[telemetry]`: where and how foldgate's spans are exported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Where spans are exported. For `grpc`, the collector's address
    /// (`http://collector:4317`); for `http/protobuf`, the URL spans are posted to, a URL
    /// without a path getting `/v1/traces` (`http://collector:4318`). Empty:
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT` (a base
    /// URL, `/v1/traces` appended for `http/protobuf`), else export is off. Printed with a
    /// password masked.
    pub otlp_endpoint: SecretUrl,
    /// `grpc` or `http/protobuf`; unset: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else `http/protobuf`.
    pub otlp_protocol: Option<OtlpProtocol>,
    /// The `service.name` of the spans; unset: `OTEL_SERVICE_NAME`, else `foldgate`.
    pub service_name: Option<String>,
    /// Share of the traces foldgate starts that are recorded, 0.0 to 1.0; a request whose
    /// client sent a `traceparent` follows the client's sampling decision instead.
    pub sampling_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: SecretUrl::default(),
            otlp_protocol: None,
            service_name: None,
            sampling_ratio: 1.0,
        }
    }
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (a collector's port 4317).
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP protobuf over HTTP POST (a collector's port 4318), OpenTelemetry's default.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl OtlpProtocol {
    /// The name, as in the configuration and `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpProtobuf => "http/protobuf",
        }
    }
}

/// The service name when neither the configuration nor `OTEL_SERVICE_NAME` gives one.
pub const DEFAULT_SERVICE_NAME: &str = "foldgate";

/// The path of the HTTP/protobuf trace receiver under a collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

impl TelemetryConfig {
    /// True when spans are exported.
    pub fn enabled(&self) -> bool {
        !self.otlp_endpoint.is_empty()
    }

    /// The transport, `http/protobuf` unless set.
    pub fn protocol(&self) -> OtlpProtocol {
        self.otlp_protocol.unwrap_or_default()
    }

    /// The `service.name` of the spans.
    pub fn service(&self) -> &str {
        self.service_name.as_deref().unwrap_or(DEFAULT_SERVICE_NAME)
    }

    /// The URL the exporter sends to: the endpoint, with `/v1/traces` for
    /// `http/protobuf` when it has no path.
    pub fn export_url(&self) -> String {
        let endpoint = self.otlp_endpoint.expose().trim();
        match self.protocol() {
            OtlpProtocol::Grpc => endpoint.to_owned(),
            OtlpProtocol::HttpProtobuf => match url::Url::parse(endpoint) {
                Ok(url) if matches!(url.path(), "" | "/") => {
                    format!("{}{TRACES_PATH}", endpoint.trim_end_matches('/'))
                }
                _ => endpoint.to_owned(),
            },
        }
    }

    /// Fills what the configuration left unset from the standard `OTEL_*` variables of
    /// `env`; returns the keys set and the variables that set them, or the variable whose
    /// value foldgate cannot use and why. `OTEL_SDK_DISABLED=true` and
    /// `OTEL_TRACES_EXPORTER=none` turn export off whatever else is set.
    pub(super) fn adopt_standard_env(
        &mut self,
        env: &[(String, String)],
    ) -> Result<Vec<Override>, (Override, String)> {
        let var = |name: &str| {
            env.iter().find(|(k, v)| k == name && !v.trim().is_empty()).map(|(_, v)| v.trim())
        };
        let mut adopted = Vec::new();
        let mut note = |key: &str, var: &str| {
            adopted.push(Override { key: format!("telemetry.{key}"), var: var.to_owned() });
        };
        if self.otlp_protocol.is_none() {
            let named = ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"]
                .into_iter()
                .find_map(|name| var(name).map(|value| (name, value)));
            if let Some((name, value)) = named {
                let Some(protocol) = protocol_named(value) else {
                    let var = Override {
                        key: "telemetry.otlp_protocol".to_owned(),
                        var: name.to_owned(),
                    };
                    return Err((
                        var,
                        format!("`{value}` is not supported: use grpc or http/protobuf"),
                    ));
                };
                self.otlp_protocol = Some(protocol);
                note("otlp_protocol", name);
            }
        }
        if self.otlp_endpoint.is_empty() {
            if let Some(traces) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
                self.otlp_endpoint = SecretUrl::new(traces);
                note("otlp_endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
            } else if let Some(base) = var("OTEL_EXPORTER_OTLP_ENDPOINT") {
                let endpoint = match self.protocol() {
                    OtlpProtocol::Grpc => base.to_owned(),
                    OtlpProtocol::HttpProtobuf => {
                        format!("{}{TRACES_PATH}", base.trim_end_matches('/'))
                    }
                };
                self.otlp_endpoint = SecretUrl::new(endpoint);
                note("otlp_endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT");
            }
        }
        if self.service_name.is_none() {
            if let Some(name) = var("OTEL_SERVICE_NAME") {
                self.service_name = Some(name.to_owned());
                note("service_name", "OTEL_SERVICE_NAME");
            }
        }
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let no_exporter =
            var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        if disabled || no_exporter {
            self.otlp_endpoint = SecretUrl::default();
        }
        Ok(adopted)
    }

    /// Checks what serde cannot.
    pub(super) fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(0.0..=1.0).contains(&self.sampling_ratio) {
            return Err(("telemetry.sampling_ratio", "must be between 0.0 and 1.0".to_owned()));
        }
        if self.service_name.as_deref().is_some_and(|s| s.trim().is_empty()) {
            return Err(("telemetry.service_name", "must not be empty".to_owned()));
        }
        if !self.enabled() {
            return Ok(());
        }
        let endpoint = self.otlp_endpoint.expose().trim();
        let masked = self.otlp_endpoint.masked();
        let parsed = url::Url::parse(endpoint)
            .map_err(|e| ("telemetry.otlp_endpoint", format!("`{masked}` is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err((
                "telemetry.otlp_endpoint",
                format!("`{masked}` must be an http:// or https:// URL with a host"),
            ));
        }
        Ok(())
    }
}

/// The protocol an `OTEL_EXPORTER_OTLP_*PROTOCOL` value names, if foldgate supports it.
fn protocol_named(value: &str) -> Option<OtlpProtocol> {
    match value {
        "grpc" => Some(OtlpProtocol::Grpc),
        "http/protobuf" => Some(OtlpProtocol::HttpProtobuf),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn load(text: &str, pairs: &[(&str, &str)]) -> Result<TelemetryConfig, String> {
        Config::from_toml_str(text, "f.toml", &env(pairs))
            .map(|c| c.telemetry)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn off_by_default_and_with_no_otel_variable() {
        let t = load("", &[("PATH", "/bin")]).unwrap();
        assert!(!t.enabled());
        assert_eq!(t.protocol(), OtlpProtocol::HttpProtobuf);
        assert_eq!(t.service(), "foldgate");
    }

    #[test]
    fn the_standard_variables_fill_what_the_file_leaves_unset() {
        let t = load(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "gateway"),
            ],
        )
        .unwrap();
        assert_eq!(t.export_url(), "http://collector:4318/v1/traces");
        assert_eq!(t.service(), "gateway");
        // gRPC takes the base URL as it is; the traces variable wins over the base one.
        let t = load(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ],
        )
        .unwrap();
        assert_eq!(
            (t.protocol(), t.export_url().as_str()),
            (OtlpProtocol::Grpc, "http://collector:4317")
        );
        let t = load(
            "",
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4318/custom"),
            ],
        )
        .unwrap();
        assert_eq!(t.export_url(), "http://traces:4318/custom");
    }

    #[test]
    fn an_explicit_value_wins_over_the_standard_variables() {
        let file = "[telemetry]\notlp_endpoint = \"http://file:4317\"\notlp_protocol = \"grpc\"\nservice_name = \"from-file\"\n";
        let otel = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "from-otel"),
        ];
        let t = load(file, &otel).unwrap();
        assert_eq!(t.export_url(), "http://file:4317");
        assert_eq!((t.protocol(), t.service()), (OtlpProtocol::Grpc, "from-file"));
        let mut both = otel.to_vec();
        both.push(("FOLDGATE_TELEMETRY__OTLP_ENDPOINT", "http://foldgate-env:4318"));
        let t = load(file, &both).unwrap();
        assert_eq!(t.export_url(), "http://foldgate-env:4318");
    }

    #[test]
    fn the_off_switches_and_bad_values_are_reported() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
        assert!(!load("", &[on, ("OTEL_SDK_DISABLED", "true")]).unwrap().enabled());
        assert!(!load("", &[on, ("OTEL_TRACES_EXPORTER", "none")]).unwrap().enabled());
        let err = load("", &[on, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]).unwrap_err();
        assert!(err.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && err.contains("http/json"), "{err}");
        let err = load("", &[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318")]).unwrap_err();
        assert!(err.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{err}");
        let err = load("[telemetry]\nsampling_ratio = 2.0\n", &[]).unwrap_err();
        assert!(err.contains("telemetry.sampling_ratio") && err.contains("f.toml"), "{err}");
        let err = load("[telemetry]\notlp_protocol = \"http/json\"\n", &[]).unwrap_err();
        assert!(err.contains("telemetry.otlp_protocol"), "{err}");
    }

    #[test]
    fn a_password_in_the_endpoint_is_never_printed() {
        let c = Config::from_toml_str(
            "[telemetry]\notlp_endpoint = \"https://u:hunter2@collector:4318\"\n",
            "f",
            &[],
        )
        .unwrap();
        assert!(!c.to_toml_masked().contains("hunter2"));
        assert_eq!(c.telemetry.export_url(), "https://u:hunter2@collector:4318/v1/traces");
    }
}
