//! `masters`: what a granted lock costs each master (issue 27, targets 2 and 5), every cell on a
//! fresh redis-server (and, through the proxy, a fresh proxy over it alone).
//!
//! (a) CPU per granted acquire, `BENCH_ROUNDS` interleaved rounds of: a direct
//! `SET k v NX PX` and the proxy over 1 master, each at `-P 1` and at `-P 16` (redis-benchmark
//! `-c 50`, as `cpu`); then the decomposition on a bare master, `EVALSHA` of a script with 16
//! operations per call (`-c 50 -P 1`): 16 bare `SET NX PX`; 16 × (`SET NX PX` + the counter
//! `SET PX` as the proxy writes it); the proxy's own `lock.lua` with 16 acquires (armed marker
//! set, counters absent, far deadline). Master CPU = utime + stime (/proc) over
//! `BENCH_MASTERS_OPS` measured lock operations (after `BENCH_CPU_WARMUP_REQUESTS` unmeasured
//! ones), divided by the grants counted on the master (`DBSIZE` growth, per key written per
//! grant) or, through the proxy, by its `acquires_granted`. The proxy exposes no merged-call
//! counter: acquires per master script call = grants / the growth of the master's
//! `cmdstat_evalsha` + `cmdstat_eval` calls.
//!
//! (b) Master memory per held lock (`used_memory` growth on a fresh master, after its hash
//! tables stopped rehashing) at each of `BENCH_MASTERS_LOCKS` lock counts: lock keys alone
//! (`lock:%08d`, an 18-byte value, `PX` 1 h, written by a Lua loop); the same keys acquired
//! through a real proxy over the master (lock key + the token counter it writes); the lock keys
//! plus counters written directly with the proxy's record; then the floor variants: a 5-byte
//! counter prefix, a 25-byte record (token + 8-hex instance), a bare token (an integer-encoded
//! value). "Beyond the lock key" = a variant's growth − the lock keys' growth at the same count.
//! The main and expires dicts grow by powers of two, so bytes per lock depend on where the count
//! falls; the default counts are powers of two apart (same load factor), and the slope between
//! the lowest and highest count is the marginal cost.
//!
//! (c) Where the master's time goes (`perf record -e cpu-clock` on redis-server, when `perf` is
//! on `PATH` and `BENCH_MASTERS_PERF` is not 0): self time grouped (kernel, dict, Lua, allocation,
//! other user space) under the four redis-benchmark loads of (a), once each.

use crate::external::{acquire_counters, dbsize, redis_benchmark, GRANTED, RB_CONNS};
use crate::procs::CpuProbe;
use crate::report::{cell, fmt_rate, fmt_ratio, Verdict};
use crate::settings::Settings;
use crate::stats::median;
use redlock_proxy::on_master::{script_sha, ARMED_KEY, LOCK_SCRIPT};
use redlock_proxy::LocalMaster;
use redlock_testkit::launcher::ProxyProcess;
use redlock_testkit::resp::{blocking_cmd, encode, Client, Reply};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Lock operations per script call in the decomposition cells.
pub const PER_CALL: usize = 16;
/// The lock TTL of the CPU cells (as `cpu`'s default).
const TTL_MS: u64 = 30_000;
/// The counter's `PX` the proxy sends by default (the lease bound, 60.6 s).
const COUNTER_PX: &str = "60604";
/// The held locks' TTL of the memory cells (through the proxy: capped at its
/// `--max-lock-ttl-ms`, raised to this for the cell).
const HOLD_MS: u64 = 3_600_000;
/// The lock value of the memory cells.
const VALUE: &str = "v-0123456789abcdef";

/// A CPU cell's load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuKind {
    /// redis-benchmark `SET NX PX` on the master, at this `-P`.
    Direct(usize),
    /// The same through the proxy over the master alone.
    Proxy(usize),
    /// `EVALSHA`: 16 bare `SET NX PX`.
    BareSet,
    /// `EVALSHA`: 16 × (`SET NX PX` + the counter `SET PX`).
    SetCounter,
    /// `EVALSHA` of the proxy's `lock.lua`, 16 acquires.
    LockScript,
}

impl CpuKind {
    pub const ALL: [CpuKind; 7] = [
        CpuKind::Direct(1),
        CpuKind::Proxy(1),
        CpuKind::Direct(16),
        CpuKind::Proxy(16),
        CpuKind::BareSet,
        CpuKind::SetCounter,
        CpuKind::LockScript,
    ];

    pub fn label(self) -> String {
        match self {
            CpuKind::Direct(d) => format!("direct `SET NX PX`, -P {d}"),
            CpuKind::Proxy(d) => format!("proxy over 1 master, -P {d} (fencing token included)"),
            CpuKind::BareSet => format!("script: {PER_CALL} bare `SET NX PX` per call"),
            CpuKind::SetCounter => {
                format!("script: {PER_CALL} × (`SET NX PX` + counter `SET PX`) per call")
            }
            CpuKind::LockScript => format!("script: `lock.lua`, {PER_CALL} acquires per call"),
        }
    }

    /// Keys a grant leaves on the master.
    fn keys_per_grant(self) -> u64 {
        match self {
            CpuKind::Direct(_) | CpuKind::BareSet => 1,
            _ => 2,
        }
    }

    fn is_script(self) -> bool {
        matches!(
            self,
            CpuKind::BareSet | CpuKind::SetCounter | CpuKind::LockScript
        )
    }
}

#[derive(Clone, Debug)]
pub struct CpuCell {
    pub kind: CpuKind,
    pub round: usize,
    /// Lock operations sent (measured).
    pub ops: u64,
    pub grants: u64,
    /// Lock operations per second of the measured run.
    pub ops_per_sec: f64,
    /// The master's CPU µs per grant.
    pub master_us: f64,
    /// The proxy's CPU µs per grant.
    pub proxy_us: Option<f64>,
    /// Master `EVALSHA` + `EVAL` calls over the measured run (through the proxy: its merged
    /// calls, plus the health monitor's few).
    pub script_calls: Option<u64>,
    /// The master's calls per grant by command (`INFO commandstats`, calls from scripts
    /// included), above 0.005.
    pub calls_per_grant: Vec<(String, f64)>,
    pub note: Option<String>,
}

impl CpuCell {
    pub fn grants_per_call(&self) -> Option<f64> {
        self.script_calls
            .filter(|&c| c > 0)
            .map(|c| self.grants as f64 / c as f64)
    }
}

/// A memory cell's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemKind {
    LocksOnly,
    ViaProxy,
    /// Lock + counter written directly, the proxy's prefix and record.
    Counter,
    ShortPrefix,
    ShortRecord,
    IntRecord,
}

impl MemKind {
    pub const ALL: [MemKind; 6] = [
        MemKind::LocksOnly,
        MemKind::ViaProxy,
        MemKind::Counter,
        MemKind::ShortPrefix,
        MemKind::ShortRecord,
        MemKind::IntRecord,
    ];

    pub fn label(self) -> &'static str {
        match self {
            MemKind::LocksOnly => "lock keys alone (the reference)",
            MemKind::ViaProxy => "acquired through the proxy (lock + token counter)",
            MemKind::Counter => "lock + counter written directly, as the proxy does",
            MemKind::ShortPrefix => "counter prefix `rp:t:` (5 bytes)",
            MemKind::ShortRecord => "prefix `rp:t:`, record token + 8 hex (25 bytes)",
            MemKind::IntRecord => "prefix `rp:t:`, record = the token (integer-encoded)",
        }
    }

    /// Counter prefix and record of a directly written variant (`None`: no counter).
    fn counter(self, proxy_record: &str) -> Option<(&'static str, String)> {
        let token = &proxy_record[..16.min(proxy_record.len())];
        match self {
            MemKind::LocksOnly | MemKind::ViaProxy => None,
            MemKind::Counter => Some(("redlock-proxy:token:", proxy_record.to_string())),
            MemKind::ShortPrefix => Some(("rp:t:", proxy_record.to_string())),
            MemKind::ShortRecord => Some(("rp:t:", format!("{token}:7a3f9c21"))),
            MemKind::IntRecord => Some(("rp:t:", token.to_string())),
        }
    }
}

#[derive(Clone, Debug)]
pub struct MemCell {
    pub kind: MemKind,
    pub locks: u64,
    /// `used_memory` after − before.
    pub grew: i64,
    /// Keys added (`DBSIZE`).
    pub keys: u64,
    pub counter_key_len: Option<usize>,
    pub record_len: Option<usize>,
    pub note: Option<String>,
}

impl MemCell {
    pub fn per_lock(&self) -> f64 {
        self.grew as f64 / self.locks.max(1) as f64
    }
}

#[derive(Clone, Debug, Default)]
pub struct PerfProfile {
    pub load: String,
    pub samples: u64,
    /// Share (%) of the master's samples by group.
    pub groups: Vec<(&'static str, f64)>,
    /// The top symbols (%, `[k]` marks kernel ones).
    pub top: Vec<(String, f64)>,
}

#[derive(Default)]
pub struct MastersRun {
    pub cpu: Vec<CpuCell>,
    pub memory: Vec<MemCell>,
    /// A counter record the proxy wrote (`<token>:<instance>`).
    pub proxy_record: Option<String>,
    pub perf: Vec<PerfProfile>,
    pub perf_note: Option<String>,
    pub notes: Vec<String>,
    pub secs: f64,
}

/// One command on a fresh connection, within 30 s.
fn cmd(port: u16, args: &[&[u8]]) -> Result<Reply, String> {
    blocking_cmd(port, args, Duration::from_secs(30)).map_err(|e| format!("{port}: {e}"))
}

fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let text = cmd(port, &[b"INFO", section.as_bytes()]).ok()?.text()?;
    let prefix = format!("{field}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_string()))
}

/// Calls of a command so far (`INFO commandstats`), 0 if never called.
fn command_calls(port: u16, name: &str) -> Option<u64> {
    let text = cmd(port, &[b"INFO", b"commandstats"]).ok()?.text()?;
    let prefix = format!("cmdstat_{name}:calls=");
    Some(
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0),
    )
}

fn script_calls(port: u16) -> Option<u64> {
    Some(command_calls(port, "evalsha")? + command_calls(port, "eval")?)
}

/// Every command's calls so far (`INFO commandstats`; calls from scripts included).
fn all_calls(port: u16) -> BTreeMap<String, u64> {
    let Some(text) = cmd(port, &[b"INFO", b"commandstats"])
        .ok()
        .and_then(|r| r.text())
    else {
        return BTreeMap::new();
    };
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_string(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

fn used_memory(port: u16) -> Option<i64> {
    info_field(port, "memory", "used_memory")?.parse().ok()
}

/// `used_memory` once two readings 200 ms apart agree (the dicts done rehashing), at most 5 s.
fn settled_memory(port: u16) -> Option<i64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = used_memory(port)?;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = used_memory(port)?;
        if now == last {
            return Some(now);
        }
        last = now;
    }
    Some(last)
}

fn arm(port: u16) -> Result<(), String> {
    match cmd(port, &[b"SET", ARMED_KEY.as_bytes(), b"1"])? {
        r if r.is_ok() => Ok(()),
        other => Err(format!("arming answered {other}")),
    }
}

fn load_script(port: u16, body: &str) -> Result<String, String> {
    match cmd(port, &[b"SCRIPT", b"LOAD", body.as_bytes()])? {
        Reply::Bulk(sha) => Ok(String::from_utf8_lossy(&sha).into_owned()),
        other => Err(format!("SCRIPT LOAD answered {other}")),
    }
}

/// A record shaped like the proxy's: the token (µs, 16 digits) and an instance name in
/// `health::instance_name`'s form (pid, start ns, shard, in hex).
fn sample_record() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{:016}:{:x}.{:x}.0",
        now.as_micros(),
        std::process::id(),
        now.as_nanos() as u64
    )
}

const BARE_SET: &str =
    "for i = 1, #KEYS do redis.call('set', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) end return 1";
const SET_AND_COUNTER: &str = "for i = 1, #KEYS, 2 do if redis.call('set', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) then redis.call('set', KEYS[i + 1], ARGV[3], 'PX', ARGV[4]) end end return 1";

/// The redis-benchmark arguments of a script cell's call (`tag` keeps the warm-up's keys apart
/// from the measured run's).
fn script_command(kind: CpuKind, sha: &str, tag: &str) -> Vec<String> {
    let record = sample_record();
    let lock = |i: usize| format!("lb:m:{tag}{i}:__rand_int__");
    let counter = |i: usize| format!("redlock-proxy:token:lb:m:{tag}{i}:__rand_int__");
    let mut args = vec!["EVALSHA".to_string(), sha.to_string()];
    match kind {
        CpuKind::BareSet => {
            args.push(PER_CALL.to_string());
            args.extend((0..PER_CALL).map(lock));
            args.extend(["v".to_string(), TTL_MS.to_string()]);
        }
        CpuKind::SetCounter => {
            args.push((2 * PER_CALL).to_string());
            args.extend((0..PER_CALL).flat_map(|i| [lock(i), counter(i)]));
            args.extend([
                "v".to_string(),
                TTL_MS.to_string(),
                record,
                COUNTER_PX.into(),
            ]);
        }
        CpuKind::LockScript => {
            // Each acquire passes its lock key; the script names the markers, the witness and
            // the counters itself.
            args.push(PER_CALL.to_string());
            args.extend((0..PER_CALL).map(lock));
            // The write witness floor: 0, which every witness passes (the check still runs);
            // the call's bounds: a far deadline, no earliest clock, the counter's PX.
            args.extend(["0", "99999999999999", "0", COUNTER_PX].map(String::from));
            for _ in 0..PER_CALL {
                // record, value, PX
                args.extend([record.clone(), "v".to_string(), TTL_MS.to_string()]);
            }
        }
        CpuKind::Direct(_) | CpuKind::Proxy(_) => unreachable!("not a script cell"),
    }
    args
}

/// `redis-benchmark -c 50 -P 1 -n calls -r 1e8 --csv <args>`; the run's seconds.
fn bench_script(port: u16, calls: u64, args: &[String]) -> Result<f64, String> {
    let started = Instant::now();
    let output = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-c", &RB_CONNS.to_string(), "-P", "1"])
        .args(["-n", &calls.to_string(), "-r", "100000000", "--csv"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "redis-benchmark: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(started.elapsed().as_secs_f64())
}

/// A fresh master, and for a proxy cell a fresh proxy over it (ready for load).
struct Stand {
    master: LocalMaster,
    proxy: Option<ProxyProcess>,
}

impl Stand {
    fn start(
        settings: &Settings,
        proxy_args: &[&str],
        prepare: &dyn Fn(u16),
    ) -> Result<Stand, String> {
        let master = LocalMaster::start(None, &[]).map_err(|e| e.to_string())?;
        let mut with = settings.clone();
        with.proxy_args
            .extend(proxy_args.iter().map(|a| a.to_string()));
        let proxy = if proxy_args.is_empty() {
            None
        } else {
            let proxy = with
                .start_proxy(&[master.addr()])
                .map_err(|e| e.to_string())?;
            prepare(proxy.port);
            Some(proxy)
        };
        Ok(Stand { master, proxy })
    }

    fn master_pid(&self) -> u32 {
        self.master.pid().unwrap_or(0)
    }

    fn port(&self) -> u16 {
        self.proxy.as_ref().map_or(self.master.port, |p| p.port)
    }

    /// The proxy's health note and, if it logged at WARN or ERROR, its first such line.
    fn note(&mut self) -> Option<String> {
        let proxy = self.proxy.as_mut()?;
        let mut note = proxy.health_note()?;
        let mut logged = proxy.logged(&["\"level\":\"WARN\""]);
        logged.extend(proxy.logged(&["\"level\":\"ERROR\""]));
        if let Some(first) = logged.first() {
            let first: String = first.chars().take(240).collect();
            let _ = write!(note, "; first: {first}");
        }
        Some(note)
    }
}

/// The proxy flags of a proxy cell: `--threads 1` (the default, stated).
const PROXY_FLAGS: [&str; 2] = ["--threads", "1"];

/// One CPU cell.
fn cpu_cell(
    settings: &Settings,
    kind: CpuKind,
    round: usize,
    hz: f64,
    prepare: &dyn Fn(u16),
) -> Result<CpuCell, String> {
    let proxied = matches!(kind, CpuKind::Proxy(_));
    let flags: &[&str] = if proxied { &PROXY_FLAGS } else { &[] };
    let mut stand = Stand::start(settings, flags, prepare)?;
    let (port, master) = (stand.port(), stand.master.port);
    let ops = settings.masters_ops;
    let warmup = settings.cpu_warmup_requests;
    let mut script = None;
    if kind.is_script() {
        arm(master)?;
        let body = match kind {
            CpuKind::BareSet => BARE_SET,
            CpuKind::SetCounter => SET_AND_COUNTER,
            _ => LOCK_SCRIPT.text(),
        };
        let sha = load_script(master, body)?;
        if kind == CpuKind::LockScript && sha != script_sha(LOCK_SCRIPT.text().as_bytes()) {
            return Err(format!("lock.lua loaded as {sha}, not its SHA1"));
        }
        script = Some(sha);
    }
    let per_call = if kind.is_script() { PER_CALL as u64 } else { 1 };
    let calls = ops.div_ceil(per_call);
    if warmup > 0 {
        match (&script, kind) {
            (Some(sha), _) => {
                bench_script(
                    port,
                    warmup.div_ceil(per_call),
                    &script_command(kind, sha, "w"),
                )?;
            }
            (None, CpuKind::Direct(d) | CpuKind::Proxy(d)) => {
                redis_benchmark(port, d, warmup, TTL_MS)?;
            }
            _ => {}
        }
    }
    let proxy_pid = stand.proxy.as_ref().map(ProxyProcess::pid);
    let probe = CpuProbe::new(proxy_pid, &[stand.master_pid()], hz);
    let outcomes = || match proxied {
        true => acquire_counters(port),
        false => dbsize(master).map(|n| BTreeMap::from([(GRANTED.to_string(), n)])),
    };
    let granted = |o: &Option<BTreeMap<String, u64>>| o.as_ref()?.get(GRANTED).copied();
    let o0 = outcomes();
    let (g0, c0, all0) = (granted(&o0), script_calls(master), all_calls(master));
    let before = probe.snap();
    let secs = match (&script, kind) {
        (Some(sha), _) => bench_script(port, calls, &script_command(kind, sha, "m"))?,
        (None, CpuKind::Direct(d) | CpuKind::Proxy(d)) => {
            let run = redis_benchmark(port, d, ops, TTL_MS)?;
            run.requests as f64 / run.rps.max(f64::EPSILON)
        }
        _ => unreachable!("a script cell has its SHA1"),
    };
    let after = probe.snap();
    let o1 = outcomes();
    let (g1, c1, all1) = (granted(&o1), script_calls(master), all_calls(master));
    let grew = g0
        .zip(g1)
        .map(|(a, b)| b.saturating_sub(a))
        .ok_or("cannot count the grants")?;
    let grants = if proxied {
        grew
    } else {
        grew / kind.keys_per_grant()
    };
    let used = probe.seconds(before, after);
    let per = 1e6 / grants.max(1) as f64;
    let sent = calls * per_call;
    let mut notes: Vec<String> = stand.note().into_iter().collect();
    if grants < sent * 99 / 100 {
        let mut text = format!("{grants} of {sent} operations granted");
        if let (Some(a), Some(b)) = (&o0, &o1) {
            for (name, n) in b {
                let grew = n.saturating_sub(a.get(name).copied().unwrap_or(0));
                if name != GRANTED && grew > 0 {
                    let _ = write!(text, ", {name} {grew}");
                }
            }
        }
        notes.push(text);
    }
    Ok(CpuCell {
        kind,
        round,
        ops: sent,
        grants,
        ops_per_sec: sent as f64 / secs.max(f64::EPSILON),
        master_us: used.masters * per,
        proxy_us: used.proxy.map(|p| p * per),
        script_calls: c0.zip(c1).map(|(a, b)| b.saturating_sub(a)),
        calls_per_grant: all1
            .iter()
            .filter(|(name, _)| name.as_str() != "info")
            .map(|(name, n)| {
                let grew = n.saturating_sub(all0.get(name).copied().unwrap_or(0));
                (name.clone(), grew as f64 / grants.max(1) as f64)
            })
            .filter(|(_, per)| *per >= 0.005)
            .collect(),
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// Writes locks `0..n` (and their counters) on `port` by a Lua loop, 20,000 per call.
fn write_directly(port: u16, n: u64, counter: Option<(&str, String)>) -> Result<(), String> {
    const FILL: &str = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do local k = string.format('lock:%08d', i) redis.call('set', k, ARGV[3], 'PX', ARGV[4]) if ARGV[5] ~= '' then redis.call('set', ARGV[5] .. k, ARGV[6], 'PX', ARGV[4]) end end return 1";
    let (prefix, record) = counter.unwrap_or(("", String::new()));
    let hold = HOLD_MS.to_string();
    let mut from = 0;
    while from < n {
        let to = (from + 20_000).min(n) - 1;
        let (a, b) = (from.to_string(), to.to_string());
        let args: [&[u8]; 9] = [
            b"EVAL",
            FILL.as_bytes(),
            b"0",
            a.as_bytes(),
            b.as_bytes(),
            VALUE.as_bytes(),
            hold.as_bytes(),
            prefix.as_bytes(),
            record.as_bytes(),
        ];
        match cmd(port, &args)? {
            Reply::Int(1) => {}
            other => return Err(format!("fill answered {other}")),
        }
        from = to + 1;
    }
    Ok(())
}

/// Acquires locks `0..n` through the proxy at `port`: 16 connections, 64 pipelined each;
/// the acquires granted.
pub async fn acquire_through(port: u16, n: u64) -> Result<u64, String> {
    const CONNS: u64 = 16;
    const DEPTH: u64 = 64;
    let per = n.div_ceil(CONNS);
    let tasks = (0..CONNS).map(|c| async move {
        let mut client = Client::open(port, Duration::from_secs(10))
            .await
            .map_err(|e| e.to_string())?;
        let (start, end) = ((c * per).min(n), ((c + 1) * per).min(n));
        let hold = HOLD_MS.to_string();
        let mut granted = 0u64;
        let mut i = start;
        while i < end {
            let batch_end = (i + DEPTH).min(end);
            let mut bytes = Vec::new();
            for j in i..batch_end {
                let key = format!("lock:{j:08}");
                bytes.extend(encode(&[
                    b"SET",
                    key.as_bytes(),
                    VALUE.as_bytes(),
                    b"NX",
                    b"PX",
                    hold.as_bytes(),
                ]));
            }
            client.write(&bytes).await.map_err(|e| e.to_string())?;
            for _ in i..batch_end {
                let reply = client
                    .read_reply(Instant::now() + Duration::from_secs(30))
                    .await
                    .map_err(|e| e.to_string())?;
                granted += u64::from(reply.is_ok());
            }
            i = batch_end;
        }
        Ok::<u64, String>(granted)
    });
    let results = futures::future::join_all(tasks).await;
    results.into_iter().sum()
}

/// One memory cell at `locks` locks.
fn mem_cell(
    settings: &Settings,
    kind: MemKind,
    locks: u64,
    record: &mut Option<String>,
    prepare: &dyn Fn(u16),
    block_on: &dyn Fn(u16, u64) -> Result<u64, String>,
) -> Result<MemCell, String> {
    let hold = HOLD_MS.to_string();
    let flags = ["--threads", "1", "--max-lock-ttl-ms", hold.as_str()];
    let via_proxy = kind == MemKind::ViaProxy;
    let flags: &[&str] = if via_proxy { &flags } else { &[] };
    let mut stand = Stand::start(settings, flags, prepare)?;
    let master = stand.master.port;
    if !via_proxy {
        arm(master)?;
    }
    let keys_before = dbsize(master).unwrap_or(0);
    let before = settled_memory(master).ok_or("no used_memory")?;
    let mut notes = Vec::new();
    let counter = match kind {
        MemKind::ViaProxy => {
            let granted = block_on(stand.port(), locks)?;
            if granted != locks {
                notes.push(format!("{granted} of {locks} acquires granted"));
            }
            let name = format!("redlock-proxy:token:lock:{:08}", 0);
            match cmd(master, &[b"GET", name.as_bytes()])? {
                Reply::Bulk(r) => {
                    *record = Some(String::from_utf8_lossy(&r).into_owned());
                    Some(("redlock-proxy:token:", record.clone().unwrap_or_default()))
                }
                other => return Err(format!("no counter record after the acquires: {other}")),
            }
        }
        _ => {
            let record = record.clone().unwrap_or_else(sample_record);
            let counter = kind.counter(&record);
            write_directly(master, locks, counter.clone())?;
            counter
        }
    };
    let after = settled_memory(master).ok_or("no used_memory")?;
    let keys = dbsize(master).unwrap_or(0).saturating_sub(keys_before);
    notes.extend(stand.note());
    Ok(MemCell {
        kind,
        locks,
        grew: after - before,
        keys,
        counter_key_len: counter
            .as_ref()
            .map(|(p, _)| p.len() + "lock:00000000".len()),
        record_len: counter.as_ref().map(|(_, r)| r.len()),
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// Symbol groups of the perf summary, in the order shown.
const GROUPS: [&str; 5] = [
    "kernel",
    "dict (hash tables, key hashing)",
    "Lua (interpreter, script calls)",
    "allocation (zmalloc, jemalloc)",
    "other user space",
];

fn group_of(symbol: &str, kernel: bool) -> &'static str {
    let s = symbol.to_ascii_lowercase();
    if kernel {
        GROUPS[0]
    } else if s.starts_with("dict") || s.starts_with("_dict") || s.contains("siphash") {
        GROUPS[1]
    } else if s.contains("lua") || s.starts_with("script") || s.starts_with("eval") {
        GROUPS[2]
    } else if s.starts_with("zmalloc")
        || s.starts_with("zfree")
        || s.starts_with("zcalloc")
        || s.starts_with("zrealloc")
        || s.starts_with("ztry")
        || s.starts_with("je_")
        || s.starts_with("malloc")
        || s.starts_with("free")
        || s.starts_with("realloc")
        || s.starts_with("calloc")
        || s.starts_with("arena_")
        || s.starts_with("tcache_")
        || s.starts_with("extent_")
    {
        GROUPS[3]
    } else {
        GROUPS[4]
    }
}

/// The exported text symbols of `exe` (`nm -D --defined-only`), sorted by address: an address
/// perf cannot name (a static function; redis-server ships only its dynamic symbols) is
/// attributed to the exported symbol before it, which is in the same source file as a rule
/// (Lua's internals, hidden, follow its `lua_*` API).
fn exported_symbols(exe: &std::path::Path) -> Vec<(u64, String)> {
    let Ok(out) = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(exe)
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let mut syms: Vec<(u64, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let addr = u64::from_str_radix(f.next()?, 16).ok()?;
            let kind = f.next()?;
            let name = f.next()?;
            kind.eq_ignore_ascii_case("t")
                .then(|| (addr, name.to_string()))
        })
        .collect();
    syms.sort();
    syms
}

/// `symbol` as perf printed it, or for a bare address the exported symbol before it (`~name`).
fn resolve(symbol: &str, syms: &[(u64, String)]) -> String {
    let Some(addr) = symbol
        .strip_prefix("0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
    else {
        return symbol.to_string();
    };
    match syms.partition_point(|(a, _)| *a <= addr) {
        0 => symbol.to_string(),
        i => format!("~{}", syms[i - 1].1),
    }
}

fn perf_present() -> bool {
    Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `perf record -e cpu-clock` on a fresh master (and proxy) under one of the four loads.
fn perf_cell(
    settings: &Settings,
    kind: CpuKind,
    prepare: &dyn Fn(u16),
) -> Result<PerfProfile, String> {
    let (CpuKind::Direct(depth) | CpuKind::Proxy(depth)) = kind else {
        return Err("perf runs only under redis-benchmark SET loads".into());
    };
    let proxied = matches!(kind, CpuKind::Proxy(_));
    let flags: &[&str] = if proxied { &PROXY_FLAGS } else { &[] };
    let stand = Stand::start(settings, flags, prepare)?;
    let port = stand.port();
    if settings.cpu_warmup_requests > 0 {
        redis_benchmark(port, depth, settings.cpu_warmup_requests, TTL_MS)?;
    }
    let dir = std::env::temp_dir().join(format!("lockbench-perf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let data = dir.join(format!("master-{}.data", stand.master.port));
    let syms = std::fs::read_link(format!("/proc/{}/exe", stand.master_pid()))
        .map(|exe| exported_symbols(&exe))
        .unwrap_or_default();
    let mut perf = Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-F", "999", "-q", "-o"])
        .arg(&data)
        .args(["-p", &stand.master_pid().to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run perf: {e}"))?;
    // perf attaches within a few ms; give it a moment before the load.
    std::thread::sleep(Duration::from_millis(300));
    let run = redis_benchmark(port, depth, settings.masters_ops, TTL_MS);
    let _ = Command::new("kill")
        .args(["-INT", &perf.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    while perf.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if perf.try_wait().ok().flatten().is_none() {
        let _ = perf.kill();
        let _ = perf.wait();
    }
    run?;
    let report = Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "-q",
            "-n",
            "--sort",
            "sym",
            "-i",
        ])
        .arg(&data)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run perf report: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&report.stdout);
    let mut groups: Vec<(&'static str, f64)> = GROUPS.iter().map(|g| (*g, 0.0)).collect();
    let mut top = Vec::new();
    let mut samples = 0;
    for line in text.lines() {
        // `    12.34%  123  [k] symbol` or `     5.67%  45  [.] symbol`
        let mut parts = line.split_whitespace();
        let Some(pct) = parts
            .next()
            .and_then(|p| p.strip_suffix('%'))
            .and_then(|p| p.parse::<f64>().ok())
        else {
            continue;
        };
        samples += parts
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let marker = parts.next().unwrap_or("");
        let symbol: Vec<&str> = parts.collect();
        let symbol = resolve(&symbol.join(" "), &syms);
        let kernel = marker == "[k]";
        let group = group_of(symbol.trim_start_matches('~'), kernel);
        if let Some(g) = groups.iter_mut().find(|(name, _)| *name == group) {
            g.1 += pct;
        }
        let name = format!("{symbol}{}", if kernel { " [k]" } else { "" });
        match top.iter_mut().find(|(n, _)| *n == name) {
            Some(t) => t.1 += pct,
            None => top.push((name, pct)),
        }
    }
    if top.is_empty() {
        return Err("perf report printed no samples".into());
    }
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(10);
    Ok(PerfProfile {
        load: kind.label(),
        samples,
        groups,
        top,
    })
}

/// The whole section. `prepare` waits until a fresh proxy is ready; `acquire` runs
/// [`acquire_through`] on the load generator's runtime.
pub fn run(
    settings: &Settings,
    hz: f64,
    prepare: &dyn Fn(u16),
    acquire: &dyn Fn(u16, u64) -> Result<u64, String>,
    progress: &dyn Fn(&str),
) -> MastersRun {
    let began = Instant::now();
    let mut out = MastersRun::default();
    for round in 1..=settings.rounds {
        for kind in CpuKind::ALL {
            match cpu_cell(settings, kind, round, hz, prepare) {
                Ok(c) => {
                    progress(&format!(
                        "masters round {round} {}: master {:.2} µs per grant{}, {} of {} granted, {} ops/s{}{}",
                        kind.label(),
                        c.master_us,
                        c.proxy_us.map_or(String::new(), |p| format!(" (proxy {p:.2})")),
                        c.grants,
                        c.ops,
                        fmt_rate(c.ops_per_sec),
                        c.grants_per_call()
                            .map_or(String::new(), |g| format!(", {g:.2} grants per script call")),
                        c.note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
                    ));
                    out.cpu.push(c);
                }
                Err(err) => out
                    .notes
                    .push(format!("cpu {} round {round}: {err}", kind.label())),
            }
        }
    }
    let mut record = None;
    for &locks in &settings.masters_locks {
        for kind in MemKind::ALL {
            match mem_cell(settings, kind, locks, &mut record, prepare, acquire) {
                Ok(m) => {
                    progress(&format!(
                        "masters memory {} at {locks} locks: {:.1} B per lock, {} keys{}",
                        kind.label(),
                        m.per_lock(),
                        m.keys,
                        m.note
                            .as_deref()
                            .map(|n| format!(" ({n})"))
                            .unwrap_or_default()
                    ));
                    out.memory.push(m);
                }
                Err(err) => out
                    .notes
                    .push(format!("memory {} at {locks}: {err}", kind.label())),
            }
        }
    }
    out.proxy_record = record;
    if !settings.masters_perf {
        out.perf_note = Some("perf summary off (BENCH_MASTERS_PERF=0)".into());
    } else if !perf_present() {
        out.perf_note = Some("perf summary skipped: `perf` not found on PATH".into());
    } else {
        for kind in [
            CpuKind::Direct(1),
            CpuKind::Proxy(1),
            CpuKind::Direct(16),
            CpuKind::Proxy(16),
        ] {
            match perf_cell(settings, kind, prepare) {
                Ok(p) => {
                    progress(&format!(
                        "masters perf {}: {}",
                        p.load,
                        p.groups
                            .iter()
                            .map(|(g, pct)| format!("{g} {pct:.1} %"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                    out.perf.push(p);
                }
                Err(err) => out.notes.push(format!("perf {}: {err}", kind.label())),
            }
        }
    }
    out.secs = began.elapsed().as_secs_f64();
    out
}

fn cells(run: &MastersRun, kind: CpuKind) -> Vec<&CpuCell> {
    run.cpu.iter().filter(|c| c.kind == kind).collect()
}

/// Per round: a cell's master µs per grant / `base`'s in the same round.
fn ratios(run: &MastersRun, kind: CpuKind, base: CpuKind) -> Vec<f64> {
    cells(run, kind)
        .iter()
        .filter_map(|c| {
            let b = run
                .cpu
                .iter()
                .find(|b| b.kind == base && b.round == c.round)?;
            (b.master_us > 0.0).then(|| c.master_us / b.master_us)
        })
        .collect()
}

/// Beyond the lock key per lock: a cell's growth − the lock keys' growth at its count.
fn beyond(run: &MastersRun, m: &MemCell) -> Option<f64> {
    let base = run
        .memory
        .iter()
        .find(|b| b.kind == MemKind::LocksOnly && b.locks == m.locks)?;
    Some((m.grew - base.grew) as f64 / m.locks.max(1) as f64)
}

/// The marginal bytes per lock beyond the lock key between the lowest and highest count.
fn slope(run: &MastersRun, kind: MemKind) -> Option<f64> {
    let at = |pick: fn(u64, u64) -> bool| {
        run.memory
            .iter()
            .filter(|m| m.kind == kind)
            .filter(|m| beyond(run, m).is_some())
            .reduce(|a, b| if pick(b.locks, a.locks) { b } else { a })
    };
    let (lo, hi) = (at(|a, b| a < b)?, at(|a, b| a > b)?);
    if hi.locks == lo.locks {
        return None;
    }
    let base = |n: u64| {
        run.memory
            .iter()
            .find(|b| b.kind == MemKind::LocksOnly && b.locks == n)
            .map(|b| b.grew)
    };
    let extra = |m: &MemCell| Some(m.grew - base(m.locks)?);
    Some((extra(hi)? - extra(lo)?) as f64 / (hi.locks - lo.locks) as f64)
}

pub fn render(md: &mut String, settings: &Settings, run: &MastersRun) {
    let _ = writeln!(
        md,
        "## 11. The masters' cost per granted lock (issue 27, targets 2 and 5)\n"
    );
    let _ = writeln!(
        md,
        "Every cell on a fresh redis-server; {} rounds, interleaved; {} measured lock operations per CPU cell after {} unmeasured; redis-benchmark `-c {RB_CONNS}`, keys `__rand_int__` of 10⁸, lock PX {TTL_MS} ms. Master CPU (utime + stime) per **granted** acquire. The script cells call `EVALSHA` with {PER_CALL} operations per call at `-P 1` on a master with the armed marker set. Section time {:.0} s.\n",
        settings.rounds, settings.masters_ops, settings.cpu_warmup_requests, run.secs
    );
    let _ = writeln!(
        md,
        "| load | master µs per grant (median) | × direct -P 1 | × direct -P 16 | per round | grants per master script call | proxy µs per grant | ops/s |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---|---:|---:|---:|");
    for kind in CpuKind::ALL {
        let cs = cells(run, kind);
        if cs.is_empty() {
            continue;
        }
        let med = median(cs.iter().map(|c| c.master_us).collect());
        let r1 = median(ratios(run, kind, CpuKind::Direct(1)));
        let r16 = median(ratios(run, kind, CpuKind::Direct(16)));
        let per_round: Vec<String> = cs.iter().map(|c| format!("{:.2}", c.master_us)).collect();
        let per_call = median(cs.iter().filter_map(|c| c.grants_per_call()).collect());
        let proxy = median(cs.iter().filter_map(|c| c.proxy_us).collect());
        let notes: Vec<String> = cs.iter().filter_map(|c| c.note.clone()).collect();
        let _ = writeln!(
            md,
            "| {}{} | {med:.2} | {} | {} | {} | {} | {} | {} |",
            kind.label(),
            if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", cell(&notes.join("; ")))
            },
            fmt_ratio(r1),
            fmt_ratio(r16),
            per_round.join(", "),
            if per_call.is_finite() {
                format!("{per_call:.2}")
            } else {
                "–".into()
            },
            if proxy.is_finite() {
                format!("{proxy:.2}")
            } else {
                "–".into()
            },
            fmt_rate(median(cs.iter().map(|c| c.ops_per_sec).collect()))
        );
    }
    let p1 = ratios(run, CpuKind::Proxy(1), CpuKind::Direct(1));
    let p16 = ratios(run, CpuKind::Proxy(16), CpuKind::Direct(16));
    let fmt_all = |v: &[f64]| {
        v.iter()
            .map(|r| fmt_ratio(*r))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        md,
        "\nThrough the proxy / direct at the same depth, per round: -P 1 {}; -P 16 {}.\n",
        fmt_all(&p1),
        fmt_all(&p16)
    );
    for kind in [CpuKind::Proxy(1), CpuKind::Proxy(16), CpuKind::LockScript] {
        let Some(c) = cells(run, kind).into_iter().next() else {
            continue;
        };
        let calls: Vec<String> = c
            .calls_per_grant
            .iter()
            .map(|(name, per)| format!("{name} {per:.3}"))
            .collect();
        let _ = writeln!(
            md,
            "- master calls per grant, {} (round {}; calls from scripts included): {}",
            kind.label(),
            c.round,
            calls.join(", ")
        );
    }
    md.push('\n');

    if !run.memory.is_empty() {
        let counts: Vec<u64> = settings.masters_locks.clone();
        let _ = writeln!(
            md,
            "Master memory per held lock: `used_memory` growth on a fresh master (read once it stops changing), lock keys `lock:%08d` with an {}-byte value, PX 1 h; the proxy's record here: `{}`. \"Beyond\" = the growth − the lock keys' growth at the same count, per lock; the slope is the marginal beyond-the-lock cost between the lowest and highest count.\n",
            VALUE.len(),
            run.proxy_record.as_deref().unwrap_or("?")
        );
        let mut head = String::from("| writes | counter key / record bytes |");
        let mut rule = String::from("|---|---|");
        for n in &counts {
            let _ = write!(
                head,
                " per lock at {} | beyond at {} |",
                fmt_rate(*n as f64),
                fmt_rate(*n as f64)
            );
            rule.push_str("---:|---:|");
        }
        head.push_str(" beyond, slope |");
        rule.push_str("---:|");
        let _ = writeln!(md, "{head}\n{rule}");
        for kind in MemKind::ALL {
            let ms: Vec<&MemCell> = run.memory.iter().filter(|m| m.kind == kind).collect();
            let Some(first) = ms.first() else { continue };
            let mut row = format!(
                "| {} | {} |",
                kind.label(),
                match (first.counter_key_len, first.record_len) {
                    (Some(k), Some(r)) => format!("{k} / {r}"),
                    _ => "–".into(),
                }
            );
            for n in &counts {
                match ms.iter().find(|m| m.locks == *n) {
                    Some(m) => {
                        let _ = write!(
                            row,
                            " {:.1} | {} |",
                            m.per_lock(),
                            beyond(run, m)
                                .filter(|_| kind != MemKind::LocksOnly)
                                .map_or("–".into(), |b| format!("{b:.1}"))
                        );
                    }
                    None => row.push_str(" – | – |"),
                }
            }
            let _ = write!(
                row,
                " {} |",
                slope(run, kind)
                    .filter(|_| kind != MemKind::LocksOnly)
                    .map_or("–".into(), |s| format!("{s:.1}"))
            );
            let notes: Vec<String> = ms.iter().filter_map(|m| m.note.clone()).collect();
            if !notes.is_empty() {
                let _ = write!(row, " {}", cell(&notes.join("; ")));
            }
            let _ = writeln!(md, "{row}");
        }
        md.push('\n');
    }

    if !run.perf.is_empty() {
        let _ = writeln!(
            md,
            "Where the master's time goes (`perf record -e cpu-clock -F 999 -p <redis-server>`, self time, one run per load, {} requests):\n",
            settings.masters_ops
        );
        let mut head = String::from("| load | samples |");
        let mut rule = String::from("|---|---:|");
        for g in GROUPS {
            let _ = write!(head, " {g} |");
            rule.push_str("---:|");
        }
        head.push_str(" top symbols |");
        rule.push_str("---|");
        let _ = writeln!(md, "{head}\n{rule}");
        for p in &run.perf {
            let mut row = format!("| {} | {} |", p.load, fmt_rate(p.samples as f64));
            for (_, pct) in &p.groups {
                let _ = write!(row, " {pct:.1} % |");
            }
            let top: Vec<String> = p
                .top
                .iter()
                .take(6)
                .map(|(s, pct)| format!("{s} {pct:.1}"))
                .collect();
            let _ = writeln!(md, "{row} {} |", cell(&top.join(", ")));
        }
        md.push('\n');
    }
    if let Some(note) = &run.perf_note {
        let _ = writeln!(md, "{note}.\n");
    }
    for note in &run.notes {
        let _ = writeln!(md, "- not measured: {}", cell(note));
    }
    if !run.notes.is_empty() {
        md.push('\n');
    }
}

/// Issue 27's targets 2 and 5 (second half).
pub fn verdicts(out: &mut Vec<Verdict>, run: Option<&MastersRun>) {
    let Some(run) = run else { return };
    let p1 = median(ratios(run, CpuKind::Proxy(1), CpuKind::Direct(1)));
    let p16 = median(ratios(run, CpuKind::Proxy(16), CpuKind::Direct(16)));
    out.push(Verdict {
        target: "masters' CPU per granted acquire (proxy over 1, fencing tokens included) ≤ 1.0× a direct SET NX PX, at -P 1 and -P 16 (issue 27, target 2)",
        measured: format!(
            "median per-round ratio at -P 1 **{}**, at -P 16 **{}**",
            fmt_ratio(p1),
            fmt_ratio(p16)
        ),
        met: (p1.is_finite() && p16.is_finite()).then_some(p1 <= 1.0 && p16 <= 1.0),
    });
    let slope = slope(run, MemKind::ViaProxy);
    let at: Vec<String> = run
        .memory
        .iter()
        .filter(|m| m.kind == MemKind::ViaProxy)
        .filter_map(|m| {
            Some(format!(
                "{:.0} at {}",
                beyond(run, m)?,
                fmt_rate(m.locks as f64)
            ))
        })
        .collect();
    out.push(Verdict {
        target: "≤ 150 bytes of master memory per held lock beyond the lock key, token record included (issue 27, target 5)",
        measured: match slope {
            Some(s) => format!("**{s:.0} B** per lock (slope); per count {}", at.join(", ")),
            None => "masters section's memory cells not run".into(),
        },
        met: slope.map(|s| s <= 150.0),
    });
}
