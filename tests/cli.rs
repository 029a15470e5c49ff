//! The binary as a user runs it: `--local N`, the listening log line, SIGTERM, the errors
//! and warnings a user can act on, `--help`; and the licence file the package names.

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

/// The lines the binary logs (JSON) until its listening line, within 20 s; then it is stopped.
fn log_until_listening(args: &[&str]) -> Vec<String> {
    let mut child = Command::new(BIN)
        .args(args)
        .args(["--port", "0", "--log-format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut logged = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no listening line in {logged:?}");
        let line = lines.next().expect("log output").unwrap();
        let listening = line.contains("listening on");
        logged.push(line);
        if listening {
            break;
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    logged
}

/// `n` distinct free loopback ports (bound together, then released): master addresses nothing
/// answers on. Bound one at a time and released at once, two could be the same port (the
/// kernel hands a released ephemeral port out again), which the configuration refuses as a
/// master listed twice.
fn dead_masters<const N: usize>() -> [String; N] {
    let listeners: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| format!("127.0.0.1:{}", listeners[i].local_addr().unwrap().port()))
}

/// An even number of masters tolerates no more failures than one master fewer (4 masters:
/// quorum 3, one may fail, as with 3): said at start-up and by `--check-config`, which still
/// passes.
#[test]
fn an_even_number_of_masters_is_warned_about() {
    const WARNING: &str = "no fault tolerance over";
    let logged = log_until_listening(&["--local", "4"]);
    let warned: Vec<&String> = logged.iter().filter(|l| l.contains(WARNING)).collect();
    assert_eq!(warned.len(), 1, "{logged:#?}");
    assert!(warned[0].contains("\"level\":\"WARN\""), "{}", warned[0]);
    assert!(warned[0].contains("4 masters"), "{}", warned[0]);
    // Three masters: nothing to say.
    let logged = log_until_listening(&["--local", "3"]);
    assert!(!logged.iter().any(|l| l.contains(WARNING)), "{logged:#?}");

    let dir = std::env::temp_dir().join(format!("redlock-cli-even-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("two.toml");
    let [first, second, third, fourth] = dead_masters::<4>();
    let two = [first.clone(), second.clone()];
    std::fs::write(
        &file,
        format!("backends = [\"{}\", \"{}\"]\n", two[0], two[1]),
    )
    .unwrap();
    let check = |extra: &[&str]| {
        let out = Command::new(BIN)
            .arg("--check-config")
            .arg(&file)
            .args(extra)
            .output()
            .unwrap();
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), printed)
    };
    let (code, printed) = check(&[]);
    assert_eq!(code, Some(0), "{printed}");
    assert!(printed.contains("test is successful"), "{printed}");
    assert!(
        printed.contains("2 masters") && printed.contains(&format!("{WARNING} 1")),
        "{printed}"
    );
    // Flags override the file: three `--backend`s are odd, four are even again.
    let three = [first, second, third];
    let mut args: Vec<&str> = three
        .iter()
        .flat_map(|b| ["--backend", b.as_str()])
        .collect();
    let (code, printed) = check(&args);
    assert_eq!(code, Some(0), "{printed}");
    assert!(!printed.contains(WARNING), "{printed}");
    args.extend(["--backend", fourth.as_str()]);
    let (code, printed) = check(&args);
    assert_eq!(code, Some(0), "{printed}");
    assert!(printed.contains(&format!("{WARNING} 3")), "{printed}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_names_every_kind_of_master_address() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for scheme in [
        "redis://",
        "rediss://",
        "sentinel://",
        "cluster://",
        "clusters://",
    ] {
        assert!(
            help.contains(scheme),
            "--help does not name {scheme}:\n{help}"
        );
    }
}

/// The licence Cargo.toml declares is in the repository, in full.
#[test]
fn the_license_file_is_the_one_cargo_toml_names() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    assert!(
        manifest.lines().any(|l| l.trim() == "license = \"MIT\""),
        "Cargo.toml's license changed: update LICENSE and this test"
    );
    let license = std::fs::read_to_string(root.join("LICENSE"))
        .expect("a LICENSE file at the root of the repository");
    assert!(license.starts_with("MIT License\n"), "{license}");
    // The whole standard text (https://opensource.org/license/mit), whitespace aside.
    let words = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    let body = "Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated documentation files (the \"Software\"), to deal in the Software without restriction, including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so, subject to the following conditions: The above copyright notice and this permission notice shall be included in all copies or substantial portions of the Software. THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.";
    assert!(words(&license).ends_with(body), "{license}");
    assert!(license.contains("Copyright (c)"), "{license}");
}
