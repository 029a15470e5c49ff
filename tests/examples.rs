//! The fencing examples (`examples/fencing.py` with redis-py, `examples/fencing.js` with
//! node-redis) run unchanged against the proxy over 3 real masters: the stalled holder's write
//! is rejected, the new holder's accepted. The client libraries come from
//! `tests/clients/install.sh` (run by `scripts/test.sh`).

use redlock_testkit::launcher::Env;
use std::time::Duration;

async fn run_example(program: &str, script: &str, env: &Env) {
    let deps = std::path::Path::new("tests/clients/.deps");
    let run = tokio::process::Command::new(program)
        .arg(script)
        .env("PROXY_PORT", env.proxy.port.to_string())
        .env("NODE_PATH", deps.join("node/node_modules"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the example finishes within a minute")
        .unwrap_or_else(|err| panic!("cannot run {program} (run tests/clients/install.sh): {err}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("rejected (stale token"), "{stdout}");
    assert!(stdout.trim_end().ends_with("OK"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_examples_reject_the_stalled_holder() {
    let env = Env::start(3).await;
    run_example(
        "tests/clients/.deps/venv/bin/python",
        "examples/fencing.py",
        &env,
    )
    .await;
    run_example("node", "examples/fencing.js", &env).await;
}
