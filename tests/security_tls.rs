//! TLS and authentication between the proxy and its masters and clients, with real processes
//! on loopback: masters started with `--requirepass`, an ACL user and `--tls-port`; clients
//! redis-cli, redis-py and ioredis over TLS (installed by tests/clients/install.sh). The
//! certificates (a CA, a server certificate for localhost/127.0.0.1, a client certificate)
//! are made here with rcgen.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use redlock_proxy::{ClientCerts, Config, LocalCluster, LocalMaster};
use redlock_testkit::launcher::{master_state, wait_for_info, Proxy};
use redlock_testkit::resp::Client;
use redlock_testkit::{eventually, key};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA and the certificates it signed, as PEM files in a directory of their own.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("redlock-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "redlock-proxy test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca_cert.pem()).unwrap();
        for (name, usage) in [
            ("server", ExtendedKeyUsagePurpose::ServerAuth),
            ("client", ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let mut params =
                CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                    .unwrap();
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
            std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), key.serialize_pem()).unwrap();
        }
        Pki { dir }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn arg(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// [`wait_for_info`] on a fresh connection to the proxy on `port`.
async fn wait_for_masters(port: u16, needle: &str, count: usize) -> String {
    wait_for_info(&mut Client::connect(port).await, needle, count).await
}

/// A command on a master that wants a password.
async fn authed_cmd(port: u16, password: &str, args: &[&str]) -> String {
    let mut c = Client::connect(port).await;
    assert_eq!(c.cmd(&["AUTH", password]).await, "+OK");
    c.cmd(args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticated_masters_vote_and_a_refused_password_is_auth_failed_until_fixed() {
    const PASSWORD: &str = "s3cret";
    let masters: Vec<LocalMaster> = (0..3)
        .map(|_| {
            LocalMaster::start(
                None,
                &[
                    "--requirepass",
                    PASSWORD,
                    "--user",
                    "locker",
                    "on",
                    ">p@ss:w",
                    "~*",
                    "&*",
                    "+@all",
                ],
            )
            .unwrap()
        })
        .collect();
    let port = |i: usize| masters[i].port;
    let backends = vec![
        format!("redis://:{PASSWORD}@127.0.0.1:{}", port(0)),
        // An ACL user, its password percent-encoded as URLs do.
        format!("redis://locker:p%40ss%3Aw@127.0.0.1:{}", port(1)),
        format!("redis://:hunter2@127.0.0.1:{}", port(2)),
    ];
    // A deployment in use: every master armed by a proxy with the right credentials (a
    // brand-new set of masters waits until it has seen every one of them: docs/SAFETY.md).
    let right = Proxy::start(
        vec![
            backends[0].clone(),
            backends[1].clone(),
            format!("redis://:{PASSWORD}@127.0.0.1:{}", port(2)),
        ],
        |_| {},
    )
    .await;
    wait_for_masters(right.port, "state=up", 3).await;
    right.stop().await;
    let proxy = Proxy::start(backends.clone(), |_| {}).await;
    let info = wait_for_masters(proxy.port, "state=up", 2).await;
    assert!(
        info.contains(&format!(
            "addr=redis://:***@127.0.0.1:{},state=auth_failed (WRONGPASS",
            port(2)
        )),
        "{info}"
    );
    assert!(info.contains(&format!("addr=redis://locker:***@127.0.0.1:{}", port(1))));
    assert!(
        !info.contains("hunter2") && !info.contains(PASSWORD),
        "{info}"
    );
    // Two of three vote: granted, and held on exactly those two.
    let mut c = proxy.client().await;
    let k = key("auth");
    assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "+OK");
    for (i, held) in [(0, "$v"), (1, "$v"), (2, "$nil")] {
        assert_eq!(
            authed_cmd(port(i), PASSWORD, &["GET", &k]).await,
            held,
            "master {i}"
        );
    }
    // Nothing shows a password: not the config's Debug, not CLIENT LIST.
    let config = Config {
        backends: backends.iter().map(|b| b.parse().unwrap()).collect(),
        ..Config::default()
    };
    let debug = format!("{config:?}");
    assert!(
        !debug.contains("hunter2") && !debug.contains(PASSWORD),
        "{debug}"
    );
    assert!(
        !debug.contains("p%40ss") && !debug.contains("p@ss"),
        "{debug}"
    );
    let clients = c.cmd(&["CLIENT", "LIST"]).await;
    assert!(!clients.contains(PASSWORD), "{clients}");

    // Only one master accepts this proxy's credentials: no quorum, no grant, nothing left.
    let wrong = vec![
        backends[0].clone(),
        format!("redis://locker:nope@127.0.0.1:{}", port(1)),
        backends[2].clone(),
    ];
    let lonely = Proxy::start(wrong, |_| {}).await;
    wait_for_masters(lonely.port, "state=auth_failed", 2).await;
    let k2 = key("auth-no-quorum");
    let mut c2 = lonely.client().await;
    assert_eq!(
        c2.cmd(&["SET", &k2, "v", "NX", "PX", "10000"]).await,
        "$nil"
    );
    assert_eq!(authed_cmd(port(0), PASSWORD, &["GET", &k2]).await, "$nil");

    // The master's password changed to what the first proxy sends: it recovers by itself.
    assert_eq!(
        authed_cmd(
            port(2),
            PASSWORD,
            &["CONFIG", "SET", "requirepass", "hunter2"]
        )
        .await,
        "+OK"
    );
    wait_for_masters(proxy.port, "state=up", 3).await;
    let k3 = key("auth-fixed");
    assert_eq!(c.cmd(&["SET", &k3, "v", "NX", "PX", "10000"]).await, "+OK");
    // The OK leaves at the second vote; the recovered master's write may land just after.
    let deadline = Instant::now() + Duration::from_secs(5);
    while authed_cmd(port(2), "hunter2", &["GET", &k3]).await != "$v" {
        assert!(
            Instant::now() < deadline,
            "the recovered master never took the write"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lonely.stop().await;
    proxy.stop().await;
}

/// Connections a master with a password has accepted so far (`INFO stats`).
async fn connections_received(port: u16, password: &str) -> u64 {
    let stats = authed_cmd(port, password, &["INFO", "stats"]).await;
    stats
        .split("total_connections_received:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no total_connections_received in {stats}"))
}

/// A master that wants a password the proxy was not given is `auth_failed`, like one that
/// refuses the password given, and every link to it (the voting one, the subscriber) retries
/// on its backoff. Issue 40: `state=connecting` for ever, and 445 connections in 10 s (the
/// subscriber link reconnecting on every `NOAUTH`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_wants_a_password_the_proxy_lacks_is_auth_failed_with_backoff() {
    const PASSWORD: &str = "s3cret";
    const WATCHED: Duration = Duration::from_secs(3);
    let masters = LocalCluster::start(2).expect("redis-server must be installed");
    let locked = LocalMaster::start(None, &["--requirepass", PASSWORD]).unwrap();
    let mut backends = masters.addrs();
    backends.push(locked.addr());
    let proxy = Proxy::start(backends, |_| {}).await;
    // Past the first attempts, whose backoff is short.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = connections_received(locked.port, PASSWORD).await;
    tokio::time::sleep(WATCHED).await;
    // Less the connection that asked.
    let made = connections_received(locked.port, PASSWORD).await - before - 1;
    let info = Client::connect(proxy.port)
        .await
        .cmd(&["INFO", "masters"])
        .await;
    let state = master_state(&info, 2).map(str::to_string);
    eprintln!("{made} connections in {WATCHED:?}; master2 {state:?}");
    // Two links, each retrying at most every second once backed off (and a margin).
    assert!(made <= 12, "{made} connections in {WATCHED:?}");
    assert_eq!(
        state.as_deref(),
        Some("auth_failed (NOAUTH Authentication required.)"),
        "{info}"
    );
    // The two other masters serve.
    let mut c = proxy.client().await;
    assert_eq!(
        c.cmd(&["SET", &key("noauth"), "v", "NX", "PX", "10000"])
            .await,
        "+OK"
    );
}

/// A master with a plain port (for direct checks) and a TLS port.
fn tls_master(pki: &Pki, auth_clients: &str) -> (LocalMaster, u16) {
    let tls_port = free_port().to_string();
    let (cert, key, ca) = (
        pki.arg("server.pem"),
        pki.arg("server.key"),
        pki.arg("ca.pem"),
    );
    let master = LocalMaster::start(
        None,
        &[
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            auth_clients,
        ],
    )
    .unwrap();
    (master, tls_port.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_masters_with_a_ca_file_and_with_mutual_tls() {
    let pki = Pki::new("masters");
    for auth_clients in ["no", "yes"] {
        let masters: Vec<(LocalMaster, u16)> =
            (0..3).map(|_| tls_master(&pki, auth_clients)).collect();
        let backends: Vec<String> = masters
            .iter()
            .map(|(_, tls)| format!("rediss://127.0.0.1:{tls}"))
            .collect();
        let with_client_cert = auth_clients == "yes";
        let proxy = Proxy::start(backends.clone(), |c| {
            c.backend_tls_ca_cert_file = Some(pki.file("ca.pem"));
            if with_client_cert {
                c.backend_tls_cert_file = Some(pki.file("client.pem"));
                c.backend_tls_key_file = Some(pki.file("client.key"));
            }
        })
        .await;
        wait_for_masters(proxy.port, "state=up", 3).await;
        let k = key(&format!("rediss-{auth_clients}"));
        let mut c = proxy.client().await;
        assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "+OK");
        // Granted on a majority; the third master's write may still be on its way.
        let on_every_master = eventually(Duration::from_secs(5), async || {
            for (master, _) in &masters {
                if Client::connect(master.port).await.cmd(&["GET", &k]).await != "$v" {
                    return false;
                }
            }
            true
        })
        .await;
        assert!(on_every_master, "the grant never reached every master");
        if with_client_cert {
            // The same masters refuse a proxy without a certificate: no vote, no grant.
            let anonymous = Proxy::start(backends, |c| {
                c.backend_tls_ca_cert_file = Some(pki.file("ca.pem"));
            })
            .await;
            wait_for_masters(anonymous.port, "state=down", 3).await;
            let mut c = anonymous.client().await;
            let k = key("rediss-anonymous");
            assert_eq!(c.cmd(&["SET", &k, "v", "NX", "PX", "10000"]).await, "$nil");
            anonymous.stop().await;
        }
        proxy.stop().await;
    }
}

/// Where tests/clients/install.sh put the real clients.
fn client_deps() -> PathBuf {
    std::env::var_os("CLIENT_DEPS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/.deps"))
}

/// Runs a client program to completion (at most 60 s); its stdout, or its failure.
fn run_client(program: &Path, args: &[&str]) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .env("NODE_PATH", client_deps().join("node/node_modules"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|err| {
            format!(
                "cannot run {}: {err} (run tests/clients/install.sh)",
                program.display()
            )
        })?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!("{} did not finish within 60 s", program.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

const REDIS_PY: &str = r#"
import sys, redis
port, ca, cert, key, lock = sys.argv[1:6]
r = redis.Redis(host="localhost", port=int(port), ssl=True, ssl_ca_certs=ca,
                ssl_certfile=cert or None, ssl_keyfile=key or None, socket_timeout=10)
print(r.set(lock, "py", nx=True, px=10000), r.get(lock).decode(), r.delete(lock))
"#;

const IOREDIS: &str = r#"
const fs = require("fs");
const Redis = require("ioredis");
const [port, ca, cert, key, lock] = process.argv.slice(1);
const tls = { ca: fs.readFileSync(ca), servername: "localhost" };
if (cert) { tls.cert = fs.readFileSync(cert); tls.key = fs.readFileSync(key); }
const r = new Redis({ host: "127.0.0.1", port: Number(port), tls, maxRetriesPerRequest: 0,
                      retryStrategy: () => null, enableOfflineQueue: true });
r.on("error", () => {});
(async () => {
  const set = await r.set(lock, "node", "PX", 10000, "NX");
  const got = await r.get(lock);
  const del = await r.del(lock);
  console.log(set, got, del);
  r.disconnect();
})().catch((e) => { console.error(String(e)); process.exit(1); });
"#;

/// One lock taken, read and released through the proxy's TLS port by each real client, with
/// or without a client certificate; the output of each, or why it failed.
fn tls_clients(
    pki: &Pki,
    tls_port: u16,
    with_cert: bool,
    lock: &str,
) -> Vec<Result<String, String>> {
    let port = tls_port.to_string();
    let (ca, cert, key) = (
        pki.arg("ca.pem"),
        pki.arg("client.pem"),
        pki.arg("client.key"),
    );
    let (cert, key) = if with_cert {
        (cert, key)
    } else {
        (String::new(), String::new())
    };
    let mut cli = vec!["-p", &port, "--tls", "--cacert", &ca];
    if with_cert {
        cli.extend(["--cert", &cert, "--key", &key]);
    }
    let redis_cli = |args: &[&str]| {
        let mut all = cli.clone();
        all.extend(args);
        run_client(Path::new("redis-cli"), &all)
    };
    let cli_run = redis_cli(&["SET", lock, "cli", "NX", "PX", "10000"]).and_then(|set| {
        Ok(format!(
            "{set} {} {}",
            redis_cli(&["GET", lock])?,
            redis_cli(&["DEL", lock])?
        ))
    });
    let python = client_deps().join("venv/bin/python");
    let py = run_client(&python, &["-c", REDIS_PY, &port, &ca, &cert, &key, lock]);
    let node = run_client(
        Path::new("node"),
        &["-e", IOREDIS, &port, &ca, &cert, &key, lock],
    );
    vec![cli_run, py, node]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_over_tls_with_and_without_client_certificates() {
    let pki = Pki::new("clients");
    let masters = redlock_proxy::LocalCluster::start(3).unwrap();
    let with_tls = |mode: ClientCerts| {
        let pki = &pki;
        move |c: &mut Config| {
            c.tls_port = Some(0);
            c.tls_cert_file = Some(pki.file("server.pem"));
            c.tls_key_file = Some(pki.file("server.key"));
            c.tls_ca_cert_file = Some(pki.file("ca.pem"));
            c.tls_auth_clients = mode;
        }
    };
    let expected = ["OK cli 1", "True py 1", "OK node 1"];
    let strict = Proxy::start(masters.addrs(), with_tls(ClientCerts::Yes)).await;
    let tls_port = strict.tls_port.unwrap();
    let lock = key("tls-clients");
    let outputs = tls_clients(&pki, tls_port, true, &lock);
    let outputs: Vec<String> = outputs.into_iter().map(Result::unwrap).collect();
    assert_eq!(outputs, expected);
    // Without a certificate every client is refused by the handshake: nothing is served.
    for (refused, served) in tls_clients(&pki, tls_port, false, &lock)
        .iter()
        .zip(expected)
    {
        assert!(
            refused.as_ref().is_err() || refused.as_deref() != Ok(served),
            "served without a certificate: {refused:?}"
        );
    }
    let mut plain = strict.client().await;
    assert_eq!(plain.cmd(&["GET", &lock]).await, "$nil");
    strict.stop().await;

    // Optional: asked for, not required.
    let optional = Proxy::start(masters.addrs(), with_tls(ClientCerts::Optional)).await;
    let port = optional.tls_port.unwrap().to_string();
    let (ca, cert, key) = (
        pki.arg("ca.pem"),
        pki.arg("client.pem"),
        pki.arg("client.key"),
    );
    let anonymous = ["-p", &port, "--tls", "--cacert", &ca, "PING"];
    let with_cert = [
        "-p", &port, "--tls", "--cacert", &ca, "--cert", &cert, "--key", &key, "PING",
    ];
    for args in [&anonymous[..], &with_cert[..]] {
        assert_eq!(
            run_client(Path::new("redis-cli"), args).as_deref(),
            Ok("PONG")
        );
    }
    optional.stop().await;

    let open = Proxy::start(masters.addrs(), with_tls(ClientCerts::No)).await;
    let outputs = tls_clients(&pki, open.tls_port.unwrap(), false, &lock);
    let outputs: Vec<String> = outputs.into_iter().map(Result::unwrap).collect();
    assert_eq!(outputs, expected);
    open.stop().await;
}

/// `PING` through redis-cli over TLS to `port`, trusting `ca`: its output, or why it failed.
fn tls_ping(port: u16, ca: &str) -> Result<String, String> {
    let port = port.to_string();
    run_client(
        Path::new("redis-cli"),
        &["-p", &port, "--tls", "--cacert", ca, "PING"],
    )
}

/// Waits (at most 10 s) until `tls_ping` gives `PONG`.
fn wait_for_pong(port: u16, ca: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = tls_ping(port, ca);
        if got.as_deref() == Ok("PONG") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "PING over TLS trusting {ca}: {got:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_only_binary_reloads_its_certificate_on_sighup_and_keeps_it_on_a_bad_file() {
    let (first, second) = (Pki::new("reload-first"), Pki::new("reload-second"));
    let masters = redlock_proxy::LocalCluster::start(3).unwrap();
    let tls_args: Vec<String> = [
        "--tls-port",
        "0",
        "--tls-cert-file",
        &first.arg("server.pem"),
        "--tls-key-file",
        &first.arg("server.key"),
        "--tls-auth-clients",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // `--port 0` with `--tls-port`: TLS only; the port in the log line is the TLS one.
    let bin = Path::new(env!("CARGO_BIN_EXE_redlock-proxy"));
    let mut proxy =
        redlock_testkit::launcher::ProxyProcess::start(bin, &masters.addrs(), &tls_args).unwrap();
    let (ca_first, ca_second) = (first.arg("ca.pem"), second.arg("ca.pem"));
    wait_for_pong(proxy.port, &ca_first);
    // A plain client on that port gets no RESP reply (at most a TLS alert).
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", proxy.port))
        .await
        .unwrap();
    plain.write_all(b"PING\r\n").await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(2), plain.read_to_end(&mut answer)).await;
    assert!(!answer.starts_with(b"+PONG"), "{read:?} {answer:?}");

    // New files in place, then SIGHUP: new handshakes show the new certificate.
    for name in ["server.pem", "server.key"] {
        std::fs::copy(second.file(name), first.file(name)).unwrap();
    }
    redlock_testkit::masters::signal(proxy.pid(), "HUP");
    wait_for_pong(proxy.port, &ca_second);
    assert!(tls_ping(proxy.port, &ca_first).is_err());
    assert_eq!(proxy.warnings.load(std::sync::atomic::Ordering::Relaxed), 0);

    // A file that cannot be used: logged, and the certificate in use stays.
    std::fs::write(first.file("server.pem"), "not a certificate").unwrap();
    redlock_testkit::masters::signal(proxy.pid(), "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.warnings.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "no error logged for a bad certificate file"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(tls_ping(proxy.port, &ca_second).as_deref(), Ok("PONG"));
    assert_eq!(proxy.exited(), None);
}
