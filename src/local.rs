//! Local `redis-server` masters started as child processes (`--local N`, and the test
//! harness): each on a free loopback port, no persistence, stopped when dropped, with an RDB
//! file name of its own ([`rdb_file`]): a replica's full sync writes the RDB it receives to its
//! directory, and a server started later in the same directory would load that file (a shared
//! `/tmp/dump.rdb` once gave fresh masters another server's data). The binary's
//! masters are also tied to its life by the kernel ([`LocalCluster::start_tied`]): they die
//! with it even when it is killed with SIGKILL, which no `Drop` can cover.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why local masters could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("redis-server was not found on PATH; install it with `sudo apt-get install -y redis-server` (Debian/Ubuntu)")]
    NotInstalled,
    #[error("cannot start redis-server: {0}")]
    Spawn(std::io::Error),
    #[error("redis-server on port {0} did not answer PING within 5 s")]
    NotReady(u16),
}

/// One local master.
#[derive(Debug)]
pub struct LocalMaster {
    pub port: u16,
    child: Option<Child>,
    /// Its RDB file in the default directory, removed when it stops.
    rdb: PathBuf,
    /// Environment variables it runs with beyond the proxy's (a test's clock shim), kept for
    /// its restarts.
    env: Vec<(String, String)>,
}

impl LocalMaster {
    /// Starts a master on `port` (or on a free port when `None`) and waits until it answers.
    pub fn start(port: Option<u16>, extra_args: &[&str]) -> Result<LocalMaster, LocalError> {
        LocalMaster::start_as(port, extra_args, Lifetime::UntilDropped, Vec::new())
    }

    /// [`LocalMaster::start`] with environment variables of its own (for its restarts too).
    pub fn start_with_env(
        port: Option<u16>,
        extra_args: &[&str],
        env: Vec<(String, String)>,
    ) -> Result<LocalMaster, LocalError> {
        LocalMaster::start_as(port, extra_args, Lifetime::UntilDropped, env)
    }

    fn start_as(
        port: Option<u16>,
        extra_args: &[&str],
        lifetime: Lifetime,
        env: Vec<(String, String)>,
    ) -> Result<LocalMaster, LocalError> {
        let mut last = LocalError::NotReady(0);
        for _ in 0..5 {
            let port = match port {
                Some(p) => p,
                None => free_port().map_err(LocalError::Spawn)?,
            };
            let rdb = rdb_file(port);
            let child = spawn_server(port, &rdb, extra_args, lifetime, &env)?;
            let mut master = LocalMaster {
                port,
                child: Some(child),
                rdb,
                env: env.clone(),
            };
            match master.wait_ready() {
                Ok(()) => return Ok(master),
                Err(err) => {
                    master.kill();
                    last = err;
                }
            }
        }
        Err(last)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn wait_ready(&mut self) -> Result<(), LocalError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return Err(LocalError::NotReady(self.port));
                }
            }
            if ping(self.port) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(LocalError::NotReady(self.port))
    }

    /// SIGKILL (a crash), and reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&self.rdb);
        }
    }

    /// Starts the master again on the same port, empty (no persistence): a crash-restart.
    pub fn restart(&mut self, extra_args: &[&str]) -> Result<(), LocalError> {
        self.kill();
        let env = std::mem::take(&mut self.env);
        let fresh = LocalMaster::start_with_env(Some(self.port), extra_args, env)?;
        *self = fresh;
        Ok(())
    }
}

impl Drop for LocalMaster {
    fn drop(&mut self) {
        self.kill();
    }
}

/// N local masters.
#[derive(Debug)]
pub struct LocalCluster {
    pub masters: Vec<LocalMaster>,
}

impl LocalCluster {
    pub fn start(n: usize) -> Result<LocalCluster, LocalError> {
        LocalCluster::start_with(n, &[])
    }

    /// N masters, each started with `extra_args` (`--requirepass`, `--tls-port`, …).
    pub fn start_with(n: usize, extra_args: &[&str]) -> Result<LocalCluster, LocalError> {
        LocalCluster::start_as(n, extra_args, Lifetime::UntilDropped)
    }

    /// N masters that the kernel kills when the calling thread ends (`PR_SET_PDEATHSIG` on
    /// Linux), even if the process is killed with SIGKILL: for the binary's `--local`, called
    /// from its main thread (which lives as long as the process). Not for threads that end
    /// before the masters should (a test's worker threads).
    pub fn start_tied(n: usize) -> Result<LocalCluster, LocalError> {
        LocalCluster::start_as(n, &[], Lifetime::TiedToThisThread)
    }

    fn start_as(
        n: usize,
        extra_args: &[&str],
        lifetime: Lifetime,
    ) -> Result<LocalCluster, LocalError> {
        let masters = (0..n)
            .map(|_| LocalMaster::start_as(None, extra_args, lifetime, Vec::new()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(LocalCluster { masters })
    }

    pub fn addrs(&self) -> Vec<String> {
        self.masters.iter().map(LocalMaster::addr).collect()
    }
}

/// How long a local master may live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifetime {
    /// Until its [`LocalMaster`] is dropped (or killed).
    UntilDropped,
    /// Also no longer than the thread that started it ([`LocalCluster::start_tied`]).
    TiedToThisThread,
}

/// Where the RDB file of a server started now on `port` goes (in `/tmp`, its directory unless
/// the caller gives another): a name no other server uses, however ports are reused.
fn rdb_file(port: u16) -> PathBuf {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    PathBuf::from(format!(
        "/tmp/redlock-local-{}-{port}-{started:x}.rdb",
        std::process::id()
    ))
}

fn spawn_server(
    port: u16,
    rdb: &std::path::Path,
    extra_args: &[&str],
    lifetime: Lifetime,
    env: &[(String, String)],
) -> Result<Child, LocalError> {
    let port_text = port.to_string();
    let rdb_name = rdb
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("dump.rdb");
    let mut args = vec![
        "--port",
        &port_text,
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--maxmemory-policy",
        "noeviction",
        "--dir",
        "/tmp",
        "--dbfilename",
        rdb_name,
        "--loglevel",
        "warning",
    ];
    args.extend_from_slice(extra_args);
    let mut command = Command::new("redis-server");
    command
        .args(&args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    #[cfg(target_os = "linux")]
    if lifetime == Lifetime::TiedToThisThread {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe, touches no memory of the parent, and is all the
        // child runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = lifetime;
    command.spawn().map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => LocalError::NotInstalled,
        _ => LocalError::Spawn(err),
    })
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether the server on `port` answers; `NOAUTH` (a master with a password) counts.
fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut buf).is_ok()
        && (&buf == b"+PONG\r\n" || &buf == b"-NOAUTH")
}
