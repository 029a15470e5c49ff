//! The peer proxies of `cpu` (issue 27) and `overload` (issue 38): twemproxy (`nutcracker`), in
//! front of one master or sharding over several, and haproxy in TCP mode in front of one master,
//! as a new user would run them (Debian's packages, a minimal config, every other setting at its
//! default). Each cell starts its own peer as a child process on a
//! loopback ephemeral port, with a config file generated in a fresh temporary directory, and
//! stops it (and removes the directory) when the cell ends.

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A peer proxy measured beside redlock-proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    Twemproxy,
    Haproxy,
}

impl Peer {
    pub const ALL: [Peer; 2] = [Peer::Twemproxy, Peer::Haproxy];

    pub fn label(self) -> &'static str {
        match self {
            Peer::Twemproxy => "twemproxy",
            Peer::Haproxy => "haproxy (tcp)",
        }
    }

    /// The Debian package that provides the binary.
    pub fn package(self) -> &'static str {
        match self {
            Peer::Twemproxy => "nutcracker",
            Peer::Haproxy => "haproxy",
        }
    }
}

/// `bin` itself if it names a path, else the first match on `PATH`.
pub fn resolve(bin: &str) -> Option<PathBuf> {
    if bin.contains('/') {
        let path = PathBuf::from(bin);
        return path.is_file().then_some(path);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(bin))
            .find(|p| p.is_file())
    })
}

/// The peer's version line, for the report (`unknown` if it prints none).
pub fn version(peer: Peer, bin: &Path) -> String {
    let flag = match peer {
        Peer::Twemproxy => "-V",
        Peer::Haproxy => "-v",
    };
    Command::new(bin)
        .arg(flag)
        .output()
        .ok()
        .and_then(|o| {
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            text.lines()
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|err| format!("no free loopback port: {err}"))
}

/// A running peer proxy; stopped and its directory removed on drop.
pub struct PeerProcess {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl PeerProcess {
    /// Starts `peer` (binary `bin`) in front of the redis-servers on `master_ports` and waits
    /// (up to 10 s) until it accepts connections. twemproxy shards the keys over all of them
    /// (ketama, equal weights); haproxy forwards to the first (a TCP balancer cannot route by
    /// key).
    pub fn start(peer: Peer, bin: &Path, master_ports: &[u16]) -> Result<PeerProcess, String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lockbench-{}-{}-{}",
            peer.package(),
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|err| format!("{}: {err}", dir.display()))?;
        let port = free_port()?;
        let write = |name: &str, text: &str| -> Result<PathBuf, String> {
            let path = dir.join(name);
            std::fs::File::create(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(|err| format!("{}: {err}", path.display()))?;
            Ok(path)
        };
        let args: Vec<String> = match peer {
            Peer::Twemproxy => {
                let servers: String = master_ports
                    .iter()
                    .map(|p| format!("   - 127.0.0.1:{p}:1\n"))
                    .collect();
                let config = write(
                    "nutcracker.yml",
                    &format!(
                        "lockbench:\n  listen: 127.0.0.1:{port}\n  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n  auto_eject_hosts: false\n  servers:\n{servers}"
                    ),
                )?;
                // Its stats server would otherwise take the fixed port 22222.
                let stats = free_port()?;
                vec![
                    "-c".into(),
                    config.display().to_string(),
                    "-s".into(),
                    stats.to_string(),
                    "-a".into(),
                    "127.0.0.1".into(),
                    "-o".into(),
                    dir.join("nutcracker.log").display().to_string(),
                ]
            }
            Peer::Haproxy => {
                let master_port = master_ports[0];
                let config = write(
                    "haproxy.cfg",
                    &format!(
                        "global\n  maxconn 4096\n\ndefaults\n  mode tcp\n  timeout connect 5s\n  timeout client 120s\n  timeout server 120s\n\nfrontend lockbench\n  bind 127.0.0.1:{port}\n  default_backend masters\n\nbackend masters\n  server m1 127.0.0.1:{master_port}\n"
                    ),
                )?;
                vec!["-f".into(), config.display().to_string(), "-db".into()]
            }
        };
        let log = |name: &str| {
            std::fs::File::create(dir.join(name))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null())
        };
        let child = Command::new(bin)
            .args(&args)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(log("stdout.log"))
            .stderr(log("stderr.log"))
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", bin.display()))?;
        let mut peer_process = PeerProcess { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(note) = peer_process.health_note() {
                return Err(format!("{} {note}", peer.label()));
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(peer_process);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not accept connections on port {port} within 10 s",
                    peer.label()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some` if the process has exited (with the tail of its stderr).
    pub fn health_note(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        let stderr = std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default();
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        Some(format!(
            "exited ({status}): {}",
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ))
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
