//! The docker-compose stack, checked without a container engine: the compose file parses,
//! every service has an image or a build, every mounted host path exists, the pieces
//! point at each other (Prometheus → foldgate, Grafana → Prometheus and dashboards/), the
//! Dockerfile runs as a non-root user, and foldgate accepts the environment compose gives
//! it. `docker compose config` runs too where the compose plugin is installed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_yaml_ng::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The compose file with its `<<:` merge keys applied, as compose reads it.
fn compose() -> Value {
    let mut compose = yaml("docker-compose.yml");
    compose.apply_merge().unwrap();
    compose
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    compose["services"].get(name).unwrap_or_else(|| panic!("no service {name}"))
}

fn strings(value: &Value) -> Vec<String> {
    value.as_sequence().into_iter().flatten().map(|v| v.as_str().unwrap().to_owned()).collect()
}

/// `${VAR:-default}` as compose resolves it with `VAR` unset.
fn default_of(value: &str) -> String {
    match value.strip_prefix("${").and_then(|v| v.strip_suffix('}')) {
        Some(inner) => inner.split_once(":-").map(|(_, d)| d.to_owned()).unwrap_or_default(),
        None => value.to_owned(),
    }
}

#[test]
fn every_service_has_an_image_or_a_build_and_every_mount_exists() {
    let compose = compose();
    let services = compose["services"].as_mapping().unwrap();
    let names: Vec<&str> = services.keys().map(|k| k.as_str().unwrap()).collect();
    for expected in
        ["foldgate", "redis", "prometheus", "grafana", "foldgate-a", "foldgate-b", "balancer"]
    {
        assert!(names.contains(&expected), "no {expected} service in {names:?}");
    }
    for (name, service) in services {
        let name = name.as_str().unwrap();
        assert!(
            service.get("image").is_some() || service.get("build").is_some(),
            "{name}: neither image nor build"
        );
        if let Some(build) = service.get("build") {
            let context = build.as_str().or_else(|| build["context"].as_str()).unwrap();
            assert!(repo(context).join("Dockerfile").is_file(), "{name}: no Dockerfile");
        }
        for volume in strings(&service["volumes"]) {
            let host = volume.split(':').next().unwrap();
            assert!(host.starts_with("./"), "{name}: {volume} is not a repository path");
            assert!(repo(host).exists(), "{name}: mounted {host} does not exist");
        }
        for dependency in strings(&service["depends_on"]) {
            assert!(names.contains(&dependency.as_str()), "{name}: depends on {dependency}");
        }
    }
    let ports = |name| strings(&service(&compose, name)["ports"]);
    assert_eq!(ports("foldgate"), ["8080:8080"]);
    assert_eq!(ports("prometheus"), ["9090:9090"]);
    assert_eq!(ports("grafana"), ["3000:3000"]);
    assert_eq!(ports("balancer"), ["8081:8081"]);
}

#[test]
fn replicas_share_the_one_redis_behind_a_round_robin_balancer() {
    let compose = compose();
    for name in ["foldgate", "foldgate-a", "foldgate-b"] {
        let env = &service(&compose, name)["environment"];
        assert_eq!(env["FOLDGATE_SESSION__STORE"].as_str(), Some("redis"), "{name}");
        let url = default_of(env["FOLDGATE_SESSION__REDIS_URL"].as_str().unwrap());
        assert_eq!(url, "redis://redis:6379", "{name}");
        assert!(strings(&service(&compose, name)["depends_on"]).contains(&"redis".to_owned()));
    }
    for name in ["foldgate-a", "foldgate-b", "balancer"] {
        assert_eq!(strings(&service(&compose, name)["profiles"]), ["replicas"], "{name}");
    }
    let nginx = std::fs::read_to_string(repo("config/nginx-replicas.conf")).unwrap();
    for line in ["server foldgate-a:8080;", "server foldgate-b:8080;", "listen 8081;"] {
        assert!(nginx.contains(line), "config/nginx-replicas.conf lacks `{line}`");
    }
    let prometheus = yaml("config/prometheus.yml");
    let targets = strings(&prometheus["scrape_configs"][0]["static_configs"][0]["targets"]);
    assert_eq!(targets, ["foldgate:8080", "foldgate-a:8080", "foldgate-b:8080"]);
}

#[test]
fn the_cluster_profile_runs_two_replicas_on_a_redis_cluster() {
    let compose = compose();
    let nodes: Vec<String> = (1..=6).map(|i| format!("redis-c{i}")).collect();
    for name in nodes.iter().map(String::as_str).chain(["redis-init", "foldgate-c1", "foldgate-c2"])
    {
        assert_eq!(strings(&service(&compose, name)["profiles"]), ["cluster"], "{name}");
    }
    let init = service(&compose, "redis-init")["command"][2].as_str().unwrap().to_owned();
    assert!(init.contains("--cluster create") && init.contains("--cluster-replicas 1"), "{init}");
    for node in &nodes {
        assert!(init.contains(node.as_str()), "redis-init joins {node}");
    }
    for name in ["foldgate-c1", "foldgate-c2"] {
        let env = &service(&compose, name)["environment"];
        assert_eq!(env["FOLDGATE_SESSION__REDIS_MODE"].as_str(), Some("cluster"), "{name}");
        let urls = env["FOLDGATE_SESSION__REDIS_URL"].as_str().unwrap();
        assert_eq!(urls.split(',').count(), 3, "{name}: seed URLs");
        assert_eq!(env["FOLDGATE_SESSION__STORE"].as_str(), Some("redis"), "{name}");
    }
}

#[test]
fn the_dockerfile_is_multi_stage_and_runs_as_a_non_root_user() {
    let text = std::fs::read_to_string(repo("Dockerfile")).unwrap();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let from: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert!(from.len() >= 2, "multi-stage: {from:?}");
    // A pinned toolchain (`rust:1.NN-bookworm`): the linker's list of the request path's
    // functions names them as that compiler mangles them (build.rs).
    let minor = from[0].strip_prefix("FROM rust:1.").and_then(|rest| rest.split_once("-bookworm"));
    assert!(minor.is_some_and(|(minor, _)| minor.parse::<u32>().is_ok()), "{from:?}");
    assert_eq!(from.last().unwrap(), &&"FROM debian:bookworm-slim");
    assert!(text.contains("cargo build --release --locked"));
    let user = lines.iter().rev().find_map(|l| l.strip_prefix("USER ")).expect("a USER");
    assert!(!["root", "0", "0:0"].contains(&user.trim()), "USER {user}");
    for line in [
        "ENV FOLDGATE_LISTEN=0.0.0.0:8080",
        "EXPOSE 8080",
        r#"ENTRYPOINT ["foldgate"]"#,
        r#"CMD ["serve"]"#,
    ] {
        assert!(lines.contains(&line), "no `{line}` in the Dockerfile");
    }
    let ignored = std::fs::read_to_string(repo(".dockerignore")).unwrap();
    for entry in ["target/", ".git/"] {
        assert!(ignored.lines().any(|l| l.trim() == entry), ".dockerignore lacks {entry}");
    }
}

#[test]
fn foldgate_accepts_the_environment_compose_and_the_dockerfile_give_it() {
    let compose = compose();
    let environment = service(&compose, "foldgate")["environment"].as_mapping().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_foldgate"));
    command.arg("check-config").env_clear().env("FOLDGATE_LISTEN", "0.0.0.0:8080");
    let mut keys = Vec::new();
    for (key, value) in environment {
        let key = key.as_str().unwrap();
        keys.push(key);
        command.env(key, default_of(value.as_str().unwrap()));
    }
    assert!(keys.contains(&"FOLDGATE_UPSTREAM_URL"));
    assert!(keys.contains(&"FOLDGATE_SUMMARIZER__API_KEY"));
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "check-config: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("0.0.0.0:8080"), "{stdout}");
    assert!(stdout.contains("https://api.openai.com/v1"), "{stdout}");
}

#[test]
fn prometheus_scrapes_foldgate_and_grafana_reads_prometheus_and_the_dashboards() {
    let compose = compose();
    let prometheus = yaml("config/prometheus.yml");
    let job = &prometheus["scrape_configs"][0];
    assert_eq!(job["job_name"].as_str(), Some("foldgate"));
    assert_eq!(job["scrape_interval"].as_str(), Some("15s"));
    assert!(strings(&job["static_configs"][0]["targets"]).contains(&"foldgate:8080".to_owned()));
    assert!(
        strings(&service(&compose, "prometheus")["volumes"])
            .contains(&"./config/prometheus.yml:/etc/prometheus/prometheus.yml:ro".to_owned())
    );

    let datasources = yaml("config/grafana/provisioning/datasources/prometheus.yml");
    let datasource = &datasources["datasources"][0];
    assert_eq!(datasource["type"].as_str(), Some("prometheus"));
    assert_eq!(datasource["url"].as_str(), Some("http://prometheus:9090"));
    assert!(datasource["uid"].as_str().is_some_and(|u| !u.is_empty()), "a fixed uid");

    let providers = yaml("config/grafana/provisioning/dashboards/foldgate.yml");
    let path = providers["providers"][0]["options"]["path"].as_str().unwrap();
    let grafana_volumes = strings(&service(&compose, "grafana")["volumes"]);
    assert!(grafana_volumes.contains(&format!("./dashboards:{path}:ro")), "{grafana_volumes:?}");
    assert!(
        grafana_volumes
            .contains(&"./config/grafana/provisioning:/etc/grafana/provisioning:ro".to_owned())
    );
}

#[test]
fn the_dashboard_uses_its_datasource_variable_and_only_defined_metrics() {
    let text = std::fs::read_to_string(repo("dashboards/foldgate.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).unwrap();
    let variable = &dashboard["templating"]["list"][0];
    assert_eq!(
        (variable["name"].as_str(), variable["type"].as_str()),
        (Some("datasource"), Some("datasource"))
    );
    assert_eq!(variable["query"], "prometheus");
    assert_eq!(dashboard["schemaVersion"], 39);
    assert_eq!(dashboard["uid"], "foldgate", "a stable uid for links");
    let ids: Vec<u64> =
        dashboard["panels"].as_array().unwrap().iter().map(|p| p["id"].as_u64().unwrap()).collect();
    let unique: std::collections::BTreeSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "panel ids are unique: {ids:?}");
    let source = std::fs::read_to_string(repo("src/metrics.rs")).unwrap();
    let expected_ds = serde_json::json!({"type": "prometheus", "uid": "${datasource}"});
    let panels = dashboard["panels"].as_array().unwrap();
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(panel["datasource"], expected_ds, "{}", panel["title"]);
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{}", panel["title"]);
        for target in targets {
            assert_eq!(target["datasource"], expected_ds, "{}", panel["title"]);
            let expr = target["expr"].as_str().unwrap();
            for name in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                let Some(short) = name.strip_prefix("foldgate_") else { continue };
                let short = ["_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| short.strip_suffix(s))
                    .unwrap_or(short);
                assert!(
                    source.contains(&format!("\"{short}\""))
                        || source.contains(&format!("\"foldgate_{short}\"")),
                    "{name} (in {expr}) is not defined in src/metrics.rs"
                );
            }
        }
    }
}

#[test]
#[allow(clippy::print_stderr)] // the skip reason is the output
fn docker_compose_config_validates_where_the_plugin_exists() {
    let available = Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        eprintln!("SKIPPED: `docker compose` is not installed; the structural checks above apply");
        return;
    }
    let output = Command::new("docker")
        .args(["compose", "-f"])
        .arg(repo("docker-compose.yml"))
        .args(["config", "--quiet"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// Metric names defined in `src/metrics.rs` (each `Spec { name: "name", ... }`, and the
/// gauge made directly).
fn defined_metrics() -> Vec<String> {
    let source = std::fs::read_to_string(repo("src/metrics.rs")).unwrap();
    let mut names: Vec<String> = source
        .match_indices("= Spec {")
        .filter_map(|(i, m)| {
            let rest = source[i + m.len()..].trim_start().strip_prefix("name:")?;
            rest.trim_start().strip_prefix('"')?.split('"').next()
        })
        .map(|name| format!("foldgate_{name}"))
        .collect();
    names.extend(source.match_indices("IntGauge::new(").filter_map(|(i, m)| {
        let rest = source[i + m.len()..].trim_start().strip_prefix('"')?;
        rest.split('"').next().map(str::to_owned)
    }));
    names.sort();
    names
}

#[test]
fn the_readme_metrics_table_lists_exactly_the_defined_metrics() {
    let defined = defined_metrics();
    assert!(defined.len() >= 16, "{defined:?}");
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let section = readme.split("## Metrics and dashboards").nth(1).expect("the section");
    let mut listed: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| `foldgate_"))
        .map(|rest| format!("foldgate_{}", rest.split('`').next().unwrap()))
        .collect();
    listed.sort();
    assert_eq!(listed, defined);
}
