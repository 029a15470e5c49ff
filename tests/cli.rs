//! The binary as a user runs it: `--local N`, the listening log line, SIGTERM, and the errors
//! a user can act on.

use redlock_testkit::resp::redis_cli;
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_redlock-proxy");

#[test]
fn local_cluster_serves_locks_and_stops_cleanly_on_sigterm() {
    let mut child = Command::new(BIN)
        .args(["--local", "3", "--port", "0", "--log-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (port, masters) = loop {
        assert!(Instant::now() < deadline, "no listening line");
        let line = lines.next().expect("log output").unwrap();
        if line.contains("listening") {
            let log: serde_json::Value = serde_json::from_str(&line).unwrap();
            let fields = &log["fields"];
            let listen = fields["listen"].as_str().unwrap().to_string();
            let masters: Vec<String> = fields["masters"]
                .as_str()
                .unwrap()
                .split(',')
                .map(String::from)
                .collect();
            break (
                listen.rsplit(':').next().unwrap().parse::<u16>().unwrap(),
                masters,
            );
        }
    };
    assert_eq!(masters.len(), 3);
    assert_eq!(redis_cli(port, &["PING"]), "PONG\n");
    // Give the health monitor one round, then lock, contend, release.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        redis_cli(port, &["SET", "res1", "a", "NX", "PX", "30000"]),
        "OK\n"
    );
    assert_eq!(
        redis_cli(port, &["SET", "res1", "b", "NX", "PX", "30000"]),
        "\n"
    );
    assert_eq!(redis_cli(port, &["DEL", "res1"]), "1\n");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "proxy did not stop within 10 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "{exit:?}");
    // The local masters are gone with it.
    for addr in masters {
        assert!(TcpStream::connect(&addr).is_err(), "{addr} still accepting");
    }
}

#[test]
fn missing_redis_server_names_the_install_command() {
    let out = Command::new(BIN)
        .args(["--local", "1", "--port", "0"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("apt-get install -y redis-server"), "{err}");
}

#[test]
fn no_masters_is_a_usage_error() {
    let out = Command::new(BIN).args(["--port", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--backend HOST:PORT"), "{err}");
}

#[test]
fn example_config_with_flag_overrides() {
    let out = Command::new(BIN)
        .args([
            "--config",
            "configs/five-masters.toml",
            "--drift-factor",
            "7",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("drift factor"), "{err}");
}

/// The example configurations that need no file besides themselves pass `--check-config`
/// (`configs/secure.toml` names certificate files that exist only on a deployed host).
#[test]
fn example_configs_pass_the_check() {
    for config in [
        "configs/five-masters.toml",
        "configs/local.toml",
        "configs/tenants.toml",
        "configs/sentinel.toml",
        "deploy/redlock-proxy.toml",
    ] {
        let out = Command::new(BIN)
            .args(["--check-config", config])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{config}: {err}");
    }
}
