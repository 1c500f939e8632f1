//! The environment overlay: `FOLDGATE_<SECTION>__<KEY>=value` sets `section.key`.

use super::ConfigError;

/// One key set from the environment.
#[derive(Debug, Clone)]
pub(super) struct Override {
    /// Dotted key, e.g. `server.listen`.
    pub key: String,
    /// The variable that set it.
    pub var: String,
}

impl Override {
    /// True when an error at `path` concerns this override.
    pub fn covers(&self, path: &str) -> bool {
        path == self.key
            || path.starts_with(&format!("{}.", self.key))
            || self.key.starts_with(&format!("{path}."))
    }
}

const PREFIX: &str = "FOLDGATE_";

/// Short forms every user reaches for first.
const SHORT_FORMS: [(&str, &str); 2] =
    [("FOLDGATE_LISTEN", "server.listen"), ("FOLDGATE_UPSTREAM_URL", "upstream.url")];

/// Variables that are read elsewhere and are not configuration keys.
const NOT_KEYS: [&str; 1] = ["FOLDGATE_CONFIG"];

/// Applies every `FOLDGATE_` variable of `env` to `table`; returns what was set.
pub(super) fn apply(
    table: &mut toml::Table,
    env: &[(String, String)],
) -> Result<Vec<Override>, ConfigError> {
    let mut vars: Vec<&(String, String)> = env
        .iter()
        .filter(|(k, _)| k.starts_with(PREFIX) && !NOT_KEYS.contains(&k.as_str()))
        .collect();
    // Nested keys first, short forms last: the short form wins when both are set.
    vars.sort_by_key(|(k, _)| SHORT_FORMS.iter().any(|(s, _)| s == k));
    let mut applied = Vec::new();
    for (var, raw) in vars {
        let key = match SHORT_FORMS.iter().find(|(s, _)| s == var) {
            Some((_, key)) => (*key).to_owned(),
            None => key_of(var).ok_or_else(|| ConfigError::Invalid {
                origin: format!("environment variable {var}"),
                key: var.clone(),
                message: "unknown variable; use FOLDGATE_<SECTION>__<KEY>, FOLDGATE_LISTEN \
                          or FOLDGATE_UPSTREAM_URL"
                    .to_owned(),
            })?,
        };
        set(table, &key, parse_value(raw)).map_err(|message| ConfigError::Invalid {
            origin: format!("environment variable {var}"),
            key: key.clone(),
            message,
        })?;
        applied.push(Override { key, var: var.clone() });
    }
    Ok(applied)
}

/// `FOLDGATE_SERVER__MAX_BODY_SIZE` → `server.max_body_size`.
fn key_of(var: &str) -> Option<String> {
    let rest = var.strip_prefix(PREFIX)?;
    if !rest.contains("__") {
        return None;
    }
    let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
    if parts.iter().any(String::is_empty) {
        return None;
    }
    Some(parts.join("."))
}

/// A TOML literal when the text is one (`0.8`, `true`, `[1, 2]`), else a string.
fn parse_value(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

fn set(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<(), String> {
    let mut parts = key.split('.').peekable();
    let mut current = table;
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            current.insert(part.to_owned(), value);
            return Ok(());
        }
        let entry = current
            .entry(part.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = entry.as_table_mut().ok_or_else(|| format!("`{part}` is not a section"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_lowercased_and_split() {
        assert_eq!(
            key_of("FOLDGATE_SERVER__MAX_BODY_SIZE").as_deref(),
            Some("server.max_body_size")
        );
        assert_eq!(key_of("FOLDGATE_A__B__C").as_deref(), Some("a.b.c"));
        assert_eq!(key_of("FOLDGATE_NOSECTION"), None);
        assert_eq!(key_of("FOLDGATE_A____B"), None);
    }

    #[test]
    fn values_are_typed_when_they_are_toml_literals() {
        assert_eq!(parse_value("0.5"), toml::Value::Float(0.5));
        assert_eq!(parse_value("true"), toml::Value::Boolean(true));
        assert_eq!(parse_value("127.0.0.1:80"), toml::Value::String("127.0.0.1:80".into()));
        assert_eq!(parse_value("30s"), toml::Value::String("30s".into()));
    }

    #[test]
    fn short_form_wins_over_nested() {
        let mut t = toml::Table::new();
        let env = vec![
            ("FOLDGATE_LISTEN".to_owned(), "1.1.1.1:1".to_owned()),
            ("FOLDGATE_SERVER__LISTEN".to_owned(), "2.2.2.2:2".to_owned()),
        ];
        apply(&mut t, &env).unwrap();
        assert_eq!(t["server"]["listen"].as_str(), Some("1.1.1.1:1"));
    }
}
