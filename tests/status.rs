//! The status view (issue 40) over real masters: `/status.json`, `redlock-proxy status`, and
//! the page in a real browser (Debian's chromium, headless), each showing a killed master as
//! down with the reason within a few seconds; `INFO masters` and `/readyz` give that reason
//! too. The browser test writes a screenshot (`status.png` in the tests' temporary
//! directory; README's docs/status.png is one of them).

use redlock_testkit::http::get;
use redlock_testkit::key;
use redlock_testkit::launcher::{ready_for_load, Env};
use redlock_testkit::resp::Client;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_redlock-proxy");

/// Three masters with the metrics endpoint, and a few grants so that the votes show.
async fn proxy_with_grants() -> (Env, Client, SocketAddr) {
    let env = Env::start_with(3, |c| c.metrics = Some("127.0.0.1:0".into())).await;
    ready_for_load(env.proxy.port).await.unwrap();
    let mut c = env.proxy.client().await;
    for i in 0..20 {
        let k = key(&format!("status-{i}"));
        assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "30000"]).await, "+OK");
    }
    let server = c.cmd(&["INFO", "server"]).await;
    let addr = server
        .split("\r\n")
        .find_map(|l| l.strip_prefix("metrics_addr:"))
        .expect("metrics_addr in INFO server")
        .trim()
        .parse()
        .unwrap();
    (env, c, addr)
}

async fn status(addr: SocketAddr) -> Value {
    let (code, body) = get(addr, "/status.json").await.unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Waits (at most 10 s) until master `i` shows down with a reason; returns the status.
async fn wait_down(addr: SocketAddr, i: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = status(addr).await;
        let shown = now["masters"][i]["shown"].as_str().unwrap_or_default();
        if shown.starts_with("down: connection") {
            return now;
        }
        assert!(Instant::now() < deadline, "master{i} not down: {now}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `command`, killed if it takes longer than `limit`.
fn run_within(command: &mut Command, limit: Duration) -> Output {
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kill(2) on the child this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{command:?} did not end within {limit:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_and_the_status_command_show_a_killed_master_down_with_why() {
    let (mut env, mut c, addr) = proxy_with_grants().await;
    let masters = env.masters.addrs();
    let before = status(addr).await;
    assert_eq!(before["ready"], true, "{before}");
    assert_eq!(before["quorum"], 2, "{before}");
    assert_eq!(before["deployment"], "founded_by_this_proxy", "{before}");
    for (i, m) in masters.iter().enumerate() {
        let shown = &before["masters"][i];
        assert_eq!(shown["addr"], m.as_str(), "{before}");
        assert_eq!(shown["shown"], "up", "{before}");
        // Every master's answer counts (late ones too), each within the node timeout.
        assert!(shown["votes"]["ok"].as_u64() >= Some(2), "{before}");
        assert!(shown["latency_ms"].as_f64().is_some(), "{before}");
    }
    assert!(before["grants_per_s"].as_f64() > Some(0.0), "{before}");

    env.masters.masters[1].kill();
    let after = wait_down(addr, 1).await;
    assert_eq!(after["masters"][1]["state"], "down", "{after}");
    assert_eq!(after["ready"], true, "2 of 3 still a quorum: {after}");
    // The same reason in INFO masters and /readyz.
    let info = c.cmd(&["INFO", "masters"]).await;
    assert!(
        info.contains(&format!("addr={},state=down (connection", masters[1])),
        "{info}"
    );
    let (code, ready) = get(addr, "/readyz").await.unwrap();
    assert_eq!(code, 200, "{ready}");
    assert!(
        ready.contains(&format!("master1 {}: down (connection", masters[1])),
        "{ready}"
    );

    let shown = tokio::task::spawn_blocking(move || {
        run_within(
            Command::new(BIN).args(["status", "--metrics", &addr.to_string()]),
            Duration::from_secs(20),
        )
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{shown:?}");
    assert!(
        out.contains("ready; 2 of 3 masters usable, quorum 2"),
        "{out}"
    );
    assert!(out.contains("deployment: founded_by_this_proxy"), "{out}");
    for m in &masters {
        assert!(out.contains(m.as_str()), "{out}");
    }
    let line = out.lines().find(|l| l.contains(&masters[1])).unwrap();
    assert!(line.contains("down: connection"), "{out}");

    // Nothing listening: exit 2, and why.
    let nobody = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = nobody.local_addr().unwrap().to_string();
    drop(nobody);
    let failed = run_within(
        Command::new(BIN).args(["status", "--metrics", &gone]),
        Duration::from_secs(20),
    );
    assert_eq!(failed.status.code(), Some(2), "{failed:?}");
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(err.contains("cannot reach the metrics endpoint"), "{err}");
}

/// Debian's chromium, which this test needs (scripts/test.sh and .ci/run install it).
fn chromium() -> PathBuf {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        let out = Command::new("sh")
            .args(["-c", &format!("command -v {name}")])
            .output()
            .ok()?;
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (!path.is_empty()).then(|| PathBuf::from(path))
    });
    found.unwrap_or_else(|| {
        panic!(
            "chromium is not installed, and the status page's browser test needs it: \
             apt-get install -y chromium (scripts/test.sh and .ci/run install it)"
        )
    })
}

/// Headless chromium on `url` with `args`, in a profile of its own under `dir`.
fn headless(browser: &Path, dir: &Path, args: &[String], url: &str) -> Output {
    let profile = tempdir(dir, "profile");
    let mut command = Command::new(browser);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]);
    command.arg(format!("--user-data-dir={}", profile.display()));
    command.args(args).arg(url);
    let output = run_within(&mut command, Duration::from_secs(90));
    let _ = std::fs::remove_dir_all(&profile);
    output
}

/// A new empty directory `dir/<name>-<pid>-<n>`.
fn tempdir(dir: &Path, name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_in_chromium_and_shows_a_killed_master_down() {
    let browser = chromium();
    let (mut env, _c, addr) = proxy_with_grants().await;
    let masters = env.masters.addrs();
    env.masters.masters[2].kill();
    wait_down(addr, 2).await;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let url = format!("http://{addr}/");

    // The DOM after the page's script ran: a row per master, the killed one down.
    let dom = tokio::task::spawn_blocking({
        let (browser, dir, url) = (browser.clone(), dir.clone(), url.clone());
        move || headless(&browser, &dir, &["--dump-dom".into()], &url)
    })
    .await
    .unwrap();
    let html = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.status.success(), "{dom:?}");
    assert!(
        html.contains("ready: 2 of 3 masters usable, quorum 2"),
        "{html}"
    );
    for m in &masters {
        assert!(html.contains(&format!("<td>{m}</td>")), "{m}: {html}");
    }
    assert!(
        html.contains(r#"<td class="state down">down: connection"#),
        "{html}"
    );
    assert_eq!(html.matches(r#"<td class="state up">up</td>"#).count(), 2);

    let shot = dir.join("status.png");
    let _ = std::fs::remove_file(&shot);
    let taken = tokio::task::spawn_blocking({
        let shot = shot.clone();
        move || {
            let args = [
                format!("--screenshot={}", shot.display()),
                "--window-size=1200,560".into(),
                "--hide-scrollbars".into(),
            ];
            headless(&browser, &dir, &args, &url)
        }
    })
    .await
    .unwrap();
    assert!(taken.status.success(), "{taken:?}");
    let png = std::fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{}",
        png.len()
    );
    eprintln!("the status page's screenshot: {}", shot.display());
}
