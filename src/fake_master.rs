//! A scripted in-process master for the deterministic timing tests (tokio's paused clock):
//! it speaks RESP over in-memory pipes instead of TCP, so no real I/O lets time slip, and
//! answers what the proxy sends (the health monitor's `TIME`, marker script, `INFO`, `SET` and
//! `SCRIPT LOAD`; the acquire, its clean-ups, plain key commands) from a small keyspace kept
//! on the paused clock. A test can stall it (it reads requests but answers none until resumed,
//! like a SIGSTOPped Redis, which then still runs what it had read) or take it down (refuse
//! connections, drop the open ones).
//!
//! The real-process suites (`tests/`) keep everything that needs a real `redis-server`.

use crate::live::LiveDuration;
use crate::masters::{Masters, Settings};
use crate::on_master::{
    script_sha, token_key, ARMED_KEY, CLAIM_SCRIPT, COMPARE_AND_DELETE, LIFT_SCRIPT, LOCK_SCRIPT,
    QUARANTINE_KEY, QUARANTINE_SCRIPT, RESTAMP_SCRIPT, STATUS_SCRIPT, UNDO_SCRIPT, WITNESS_KEY,
};
use crate::protocol::{Protocol, Reply, RequestParser};
use crate::transport::{Connect, Driver, Link, ReadHalf, WriteHalf};
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;

/// The fake master's clock at its creation, in ms since the epoch.
const EPOCH_MS: u64 = 1_800_000_000_000;

/// One fake master.
pub struct FakeMaster {
    /// Its own `run_id`, as every redis-server has.
    run_id: String,
    born: Instant,
    state: Mutex<State>,
    connections: AtomicU64,
    /// `true` while stalled; serving tasks wait for `false` before answering.
    stalled: watch::Sender<bool>,
    /// `true` while down: connects are refused and open connections end.
    down: watch::Sender<bool>,
    /// How many replicas acknowledge every write (what `WAIT` answers, at once).
    replicas: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Key → value and expiry (on the paused clock).
    keys: HashMap<Bytes, (Bytes, Option<Instant>)>,
    scripts: HashSet<String>,
    /// Every command run: (connection number, arguments).
    log: Vec<(u64, Vec<Bytes>)>,
}

impl FakeMaster {
    pub fn new() -> Arc<FakeMaster> {
        static MADE: AtomicU64 = AtomicU64::new(0);
        Arc::new(FakeMaster {
            run_id: format!("fake{:036x}", MADE.fetch_add(1, Ordering::Relaxed)),
            born: Instant::now(),
            state: Mutex::default(),
            connections: AtomicU64::new(0),
            stalled: watch::Sender::new(false),
            down: watch::Sender::new(false),
            replicas: AtomicU64::new(0),
        })
    }

    /// A link to this master with the proxy's transport, and its driver (not yet spawned).
    pub fn link(self: &Arc<Self>, name: &str, node_timeout: Duration) -> (Arc<Link>, Driver) {
        Link::new(
            name.into(),
            Box::new(FakeConnector(self.clone())),
            LiveDuration::new(node_timeout),
        )
    }

    /// Stops answering (requests are read and kept) until [`FakeMaster::resume`].
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Runs what it kept, and answers again.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }

    /// Loses every key (a `FLUSHALL`, or a restart without persistence seen only by its
    /// markers).
    pub fn wipe(&self) {
        self.state.lock().unwrap().keys.clear();
    }

    /// Has `n` replicas that acknowledge every write at once (`WAIT` answers `n`).
    pub fn set_replicas(&self, n: u64) {
        self.replicas.store(n, Ordering::Relaxed);
    }

    /// Forgets its scripts (a `SCRIPT FLUSH`).
    pub fn forget_scripts(&self) {
        self.state.lock().unwrap().scripts.clear();
    }

    /// Refuses connections and ends the open ones while `down`.
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }

    /// The commands run so far, as (connection number, command name and first argument).
    pub fn log(&self) -> Vec<(u64, String)> {
        let state = self.state.lock().unwrap();
        state
            .log
            .iter()
            .map(|(conn, args)| {
                let shown: Vec<String> = args
                    .iter()
                    .take(2)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                (*conn, shown.join(" "))
            })
            .collect()
    }

    /// How many acquire scripts it ran.
    pub fn acquires(&self) -> usize {
        let sha = script_sha(LOCK_SCRIPT.text().as_bytes());
        let state = self.state.lock().unwrap();
        state
            .log
            .iter()
            .filter(|(_, args)| {
                args.get(1).is_some_and(|a| {
                    a.as_ref() == sha.as_bytes() || a.as_ref() == LOCK_SCRIPT.text().as_bytes()
                })
            })
            .count()
    }

    /// The value of `key`, if set and not expired.
    pub fn get(&self, key: &str) -> Option<Bytes> {
        let state = self.state.lock().unwrap();
        live(&state.keys, key.as_bytes()).cloned()
    }

    /// Sets `key` to `value` (no expiry), as a client with direct access would.
    pub fn set(&self, key: &str, value: &str) {
        let mut state = self.state.lock().unwrap();
        let (key, value) = (
            Bytes::copy_from_slice(key.as_bytes()),
            Bytes::copy_from_slice(value.as_bytes()),
        );
        set(&mut state.keys, key, value, false, None);
    }

    /// Deletes `key`.
    pub fn wipe_key(&self, key: &str) {
        self.state.lock().unwrap().keys.remove(key.as_bytes());
    }

    /// Runs one command.
    fn run(&self, conn: u64, args: Vec<Bytes>) -> Reply {
        let mut state = self.state.lock().unwrap();
        state.log.push((conn, args.clone()));
        let name = String::from_utf8_lossy(&args[0]).to_ascii_uppercase();
        let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
        match name.as_str() {
            "PING" => Reply::simple("PONG"),
            "TIME" => {
                let us = self.clock_us();
                Reply::Array(vec![
                    Reply::bulk((us / 1_000_000).to_string()),
                    Reply::bulk((us % 1_000_000).to_string()),
                ])
            }
            "INFO" => Reply::bulk(format!(
                "run_id:{}\r\nuptime_in_seconds:{}\r\nrole:master\r\nmaxmemory_policy:noeviction\r\nloading:0\r\nevicted_keys:0\r\naof_enabled:0\r\n",
                self.run_id,
                self.born.elapsed().as_secs()
            )),
            "CONFIG" => Reply::Array(vec![Reply::bulk("appendfsync"), Reply::bulk("everysec")]),
            "WAIT" => Reply::Integer(self.replicas.load(Ordering::Relaxed) as i64),
            "GET" => live(&state.keys, &arg(1)).cloned().map_or(Reply::Null, Reply::Bulk),
            "SET" => {
                let nx = args[3..].iter().any(|a| a.eq_ignore_ascii_case(b"NX"));
                let px = args
                    .iter()
                    .position(|a| a.eq_ignore_ascii_case(b"PX"))
                    .and_then(|i| number(&arg(i + 1)));
                set(&mut state.keys, arg(1), arg(2), nx, px)
            }
            "DEL" => Reply::Integer(args[1..].iter().filter(|k| state.keys.remove(*k).is_some()).count() as i64),
            "SCRIPT" => {
                let sha = script_sha(&arg(2));
                state.scripts.insert(sha.clone());
                Reply::bulk(sha)
            }
            "EVAL" | "EVALSHA" => {
                let body = if name == "EVAL" {
                    state.scripts.insert(script_sha(&arg(1)));
                    String::from_utf8_lossy(&arg(1)).into_owned()
                } else {
                    let sha = String::from_utf8_lossy(&arg(1)).to_ascii_lowercase();
                    if !state.scripts.contains(&sha) {
                        return Reply::error("NOSCRIPT No matching script. Please use EVAL.");
                    }
                    known_script(&sha).unwrap_or_default().to_string()
                };
                let numkeys = number(&arg(2)).unwrap_or(0) as usize;
                let keys: Vec<Bytes> = args[3..3 + numkeys].to_vec();
                let argv: Vec<Bytes> = args[3 + numkeys..].to_vec();
                self.script(&mut state.keys, &body, &keys, &argv)
            }
            _ => Reply::error(format!("ERR fake master does not know '{name}'")),
        }
    }

    /// The scripts the proxy sends, as Redis would run them.
    fn script(&self, keys_db: &mut Db, body: &str, keys: &[Bytes], argv: &[Bytes]) -> Reply {
        let exists = |db: &Db, k: &[u8]| live(db, k).is_some();
        let n = |i: usize| number(&argv[i]).unwrap_or(0);
        let value =
            |db: &Db, k: &Bytes| live(db, k).map_or(Reply::Null, |v| Reply::Bulk(v.clone()));
        let marker_items = |db: &Db| {
            vec![
                value(db, &keys[0]),
                Reply::Integer(pttl(db, &keys[1])),
                value(db, &keys[1]),
            ]
        };
        let markers = |db: &Db| Reply::Array(marker_items(db));
        let one = Bytes::from_static(b"1");
        // What the scripts that arm a master write: the run_id of the process running them.
        let stamp = Bytes::from(self.run_id.clone());
        if body == STATUS_SCRIPT.text() {
            // The status of a single master also reads the write witness.
            let mut items = marker_items(keys_db);
            items.extend(keys.get(2).map(|witness| value(keys_db, witness)));
            Reply::Array(items)
        } else if body == CLAIM_SCRIPT.text() {
            if !exists(keys_db, &keys[0]) {
                set(keys_db, keys[0].clone(), stamp, false, None);
                set(keys_db, keys[1].clone(), argv[0].clone(), false, Some(n(1)));
            } else if let Some((claim, _)) = keys_db.get_mut(&keys[1]) {
                if claim.starts_with(b"founding:") && *claim > argv[0] {
                    *claim = argv[0].clone();
                }
            }
            markers(keys_db)
        } else if body == LIFT_SCRIPT.text() {
            let ours = live(keys_db, &keys[1]) == Some(&argv[0]);
            if ours {
                keys_db.remove(&keys[1]);
            }
            Reply::Integer(ours as i64)
        } else if body == QUARANTINE_SCRIPT.text() {
            let ms = n(0);
            if let Some((claim, _)) = keys_db.get_mut(&keys[1]) {
                *claim = one.clone();
            }
            if pttl(keys_db, &keys[1]) < ms as i64 {
                set(keys_db, keys[1].clone(), one.clone(), false, Some(ms));
            }
            set(keys_db, keys[0].clone(), stamp, false, None);
            Reply::Integer(pttl(keys_db, &keys[1]))
        } else if body == RESTAMP_SCRIPT.text() {
            let judged = live(keys_db, &keys[0]) == Some(&argv[0]) && argv[1] == stamp;
            if judged {
                set(keys_db, keys[0].clone(), stamp, false, None);
            }
            Reply::Integer(judged as i64)
        } else if body == LOCK_SCRIPT.text() {
            // In µs, as the script compares it (ms with the µs as a fraction).
            let now = self.clock_us();
            // It names the proxy's own keys itself; each operation passes its lock key.
            let witness_key = Bytes::from_static(WITNESS_KEY.as_bytes());
            let armed = exists(keys_db, ARMED_KEY.as_bytes())
                && !exists(keys_db, QUARANTINE_KEY.as_bytes());
            // The witness floor leads the arguments: a witness below it takes no key.
            let witness = live(keys_db, &witness_key).map_or(0, |w| number(w).unwrap_or(0));
            let behind = witness < n(0);
            let refuse = |code: i64, seen: u64| {
                Reply::Array(vec![Reply::Integer(code), Reply::Integer(seen as i64)])
            };
            // Then the call's bounds: deadline, earliest clock (ms), counter PX.
            let (late, early, life) = (now > n(1) * 1000, now < n(2) * 1000, n(3));
            let (mut k, mut a, mut answers, mut took) = (0, 4, Vec::new(), false);
            while a < argv.len() {
                if argv[a].as_ref() == b"r" {
                    let (key, value) = (&keys[k], &argv[a + 1]);
                    let ours = live(keys_db, key) == Some(value);
                    if ours {
                        keys_db.remove(key);
                    }
                    answers.push(Reply::Integer(ours as i64));
                    (k, a) = (k + 1, a + 2);
                    continue;
                }
                let (key, counter) = (&keys[k], token_key(&keys[k]));
                let seen = live(keys_db, &counter).map_or(0, |c| counter_token(c));
                answers.push(if behind {
                    Reply::Integer(-1)
                } else if late {
                    Reply::Integer(-2)
                } else if early {
                    refuse(-3, now)
                } else if !armed {
                    Reply::Integer(-1)
                } else if counter_token(&argv[a]) <= seen {
                    refuse(-4, seen)
                } else if exists(keys_db, key) {
                    Reply::Null
                } else {
                    set(
                        keys_db,
                        key.clone(),
                        argv[a + 1].clone(),
                        false,
                        Some(n(a + 2)),
                    );
                    set(keys_db, counter, argv[a].clone(), false, Some(life));
                    took = true;
                    Reply::ok()
                });
                (k, a) = (k + 1, a + 3);
            }
            if took {
                let witness = witness + 1;
                set(
                    keys_db,
                    witness_key,
                    Bytes::from(witness.to_string()),
                    false,
                    None,
                );
                answers.push(Reply::Integer(witness as i64));
            }
            // Last, the clock the call read (µs), as the script answers it.
            answers.push(Reply::Integer(now as i64));
            Reply::Array(answers)
        } else if body == UNDO_SCRIPT.text() {
            let ours = live(keys_db, &keys[0]) == Some(&argv[0])
                && live(keys_db, &keys[1]) == Some(&argv[1]);
            if ours {
                keys_db.remove(&keys[0]);
            }
            Reply::Integer(ours as i64)
        } else if body == COMPARE_AND_DELETE.text() {
            let ours = live(keys_db, &keys[0]) == Some(&argv[0]);
            if ours {
                keys_db.remove(&keys[0]);
            }
            Reply::Integer(ours as i64)
        } else {
            Reply::error("ERR fake master does not know this script")
        }
    }

    fn clock_us(&self) -> u64 {
        EPOCH_MS * 1000 + self.born.elapsed().as_micros() as u64
    }
}

type Db = HashMap<Bytes, (Bytes, Option<Instant>)>;

fn live<'a>(db: &'a Db, key: &[u8]) -> Option<&'a Bytes> {
    match db.get(key) {
        Some((value, expiry)) if expiry.is_none_or(|t| Instant::now() < t) => Some(value),
        _ => None,
    }
}

fn pttl(db: &Db, key: &[u8]) -> i64 {
    match db.get(key) {
        Some((_, None)) if live(db, key).is_some() => -1,
        Some((_, Some(t))) if live(db, key).is_some() => {
            t.saturating_duration_since(Instant::now()).as_millis() as i64
        }
        _ => -2,
    }
}

fn set(db: &mut Db, key: Bytes, value: Bytes, nx: bool, px: Option<u64>) -> Reply {
    if nx && live(db, &key).is_some() {
        return Reply::Null;
    }
    let expiry = px.map(|ms| Instant::now() + Duration::from_millis(ms));
    db.insert(key, (value, expiry));
    Reply::ok()
}

/// The token of a counter record `<16-digit token>:<proxy instance>`.
fn counter_token(record: &[u8]) -> u64 {
    number(&record[..record.len().min(16)]).unwrap_or(0)
}

fn number(arg: &[u8]) -> Option<u64> {
    std::str::from_utf8(arg).ok()?.parse().ok()
}

fn known_script(sha: &str) -> Option<&'static str> {
    [
        STATUS_SCRIPT.text(),
        CLAIM_SCRIPT.text(),
        LIFT_SCRIPT.text(),
        QUARANTINE_SCRIPT.text(),
        LOCK_SCRIPT.text(),
        UNDO_SCRIPT.text(),
        COMPARE_AND_DELETE.text(),
    ]
    .into_iter()
    .find(|body| script_sha(body.as_bytes()) == sha)
}

struct FakeConnector(Arc<FakeMaster>);

impl Connect for FakeConnector {
    fn connect(&self) -> BoxFuture<'static, io::Result<(ReadHalf, WriteHalf)>> {
        let master = self.0.clone();
        Box::pin(async move {
            if *master.down.borrow() {
                return Err(io::ErrorKind::ConnectionRefused.into());
            }
            let conn = master.connections.fetch_add(1, Ordering::Relaxed) + 1;
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            tokio::spawn(serve(master, theirs, conn));
            let (rd, wr) = tokio::io::split(ours);
            Ok((Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf))
        })
    }
}

/// Serves one connection: requests in order; while stalled, it keeps reading but answers
/// nothing; once resumed it runs what it read, even if the proxy has gone (as Redis runs the
/// bytes left in its socket buffer).
async fn serve(master: Arc<FakeMaster>, stream: tokio::io::DuplexStream, conn: u64) {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut parser = RequestParser::new(1 << 20);
    let mut buf = BytesMut::new();
    let mut down = master.down.subscribe();
    let mut stalled = master.stalled.subscribe();
    let mut peer_gone = false;
    loop {
        if !peer_gone {
            tokio::select! {
                read = rd.read_buf(&mut buf) => peer_gone = !matches!(read, Ok(n) if n > 0),
                _ = down.wait_for(|d| *d) => return,
            }
        }
        while let Ok(Some(request)) = parser.next(&mut buf) {
            if stalled.wait_for(|s| !*s).await.is_err() {
                return;
            }
            if *down.borrow() {
                return;
            }
            let mut out = BytesMut::new();
            master
                .run(conn, request.args)
                .encode(Protocol::Resp2, &mut out);
            // A reply the proxy is no longer there to read is lost, but what it wrote before
            // it went is still run, to the end of the stream, as Redis runs its socket buffer.
            let _ = wr.write_all(&out).await;
        }
        if peer_gone {
            return;
        }
    }
}

/// The lease bound of [`masters`] (the default one).
pub const LEASE_BOUND: Duration = Duration::from_secs(61);

/// Masters over `fakes`, watched by the health monitor as in production (quarantine on, a
/// 100 ms poll interval, the default lease bound).
pub fn masters(fakes: &[Arc<FakeMaster>], node_timeout: Duration) -> Arc<Masters> {
    let links = fakes
        .iter()
        .enumerate()
        .map(|(i, fake)| fake.link(&format!("fake{i}"), node_timeout))
        .collect();
    Masters::start(
        links,
        Settings {
            node_timeout: LiveDuration::new(node_timeout),
            health: crate::health::MonitorConfig {
                interval: LiveDuration::new(Duration::from_millis(100)),
                quarantine: true,
                lease_bound: LEASE_BOUND,
                preload: vec![LOCK_SCRIPT.text()],
                wait_replicas: 0,
                drift_factor: 0.01,
                allow_debug_command: false,
                clock_per_call: true,
            },
        },
        fakes.iter().map(|_| Arc::default()).collect(),
    )
}

/// Waits (on the paused clock, so instantly in real time) until `ready`, at most `limit`.
pub async fn until(limit: Duration, ready: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !ready() {
        assert!(
            Instant::now() < end,
            "condition not reached within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A command for a master.
pub fn command(list: &[&str]) -> Bytes {
    crate::protocol::encode_command(list)
}
