//! What a client's script may touch, over real `redis-server` masters (docs/PROTOCOL.md §5):
//! only its declared `KEYS`, none of the proxy's own keys, only keys its user may access, and
//! every key it writes ends with a TTL within the lease bound. The prelude that checks this on
//! the masters is also run directly on a redis-server: its key table is Redis' own `COMMAND
//! INFO`, its glob is Redis' ACL match, and the body keeps its lines, flags and `redis` members.

use redlock_proxy::on_master::{script_sha, ARMED_KEY, QUARANTINE_KEY, TOKEN_KEY_PREFIX};
use redlock_proxy::script_checks::{checked_body, SCRIPT_COMMANDS, SCRIPT_NOPERM};
use redlock_proxy::{backend_ttl_ms, Config, LocalMaster};
use redlock_testkit::key;
use redlock_testkit::launcher::Env;
use redlock_testkit::masters::master_cmd;
use redlock_testkit::resp::{Client, Reply};
use redlock_testkit::workload::wait_grantable;
use std::time::Duration;

/// The lease bound of the default configuration (60 s + drift).
fn bound() -> i64 {
    backend_ttl_ms(60_000, 0.01) as i64
}

/// The token counters' prefix the proxy gives the prelude on a single master.
const COUNTERS: &str = TOKEN_KEY_PREFIX;
const RESERVED: &str = "-ERR keys starting with 'redlock-proxy:' are refused by redlock-proxy: they hold its own state on the masters";

fn undeclared(key: &str) -> String {
    format!("-ERR key '{key}' is not in the script's KEYS and is refused by redlock-proxy: scripts may touch only the keys they declare")
}

/// The default user (every key), and two tenants.
fn tenants(config: &mut Config) {
    config.users = toml::from_str::<Config>(
        r#"
        [[users]]
        name = "billing"
        password = "b-pw"
        keys = ["billing:*"]
        [[users]]
        name = "orders"
        password = "o-pw"
        keys = ["orders:*"]
        "#,
    )
    .unwrap()
    .users;
}

async fn ready(env: &Env) {
    let probe = key("probe");
    assert!(
        wait_grantable(env.proxy.port, &probe, 1000, Duration::from_secs(10))
            .await
            .is_some(),
        "proxy never ready"
    );
    // Every master votes (a grant needs only a quorum: the last one may lag by a poll).
    redlock_testkit::launcher::ready_for_load(env.proxy.port)
        .await
        .expect("every master up");
}

/// The PTTL of `key` on every master.
async fn pttls(env: &Env, key: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for port in env.ports() {
        let pttl = master_cmd(port, &["PTTL", key]).await;
        out.push(pttl[1..].parse().unwrap());
    }
    out
}

async fn assert_bounded(env: &Env, key: &str) {
    // A reply needs a quorum: the last master may run the script just after it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut pttls = pttls(env, key).await;
    while pttls.contains(&-2) && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        pttls = self::pttls(env, key).await;
    }
    assert!(
        pttls.iter().all(|&t| t > 0 && t <= bound()),
        "{key}: PTTL {pttls:?}, bound {}",
        bound()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_cannot_touch_the_proxy_s_own_keys() {
    let env = Env::start_with(3, tenants).await;
    ready(&env).await;
    // A quarantine on master 0, as a proxy that saw it lose data leaves it.
    let m0 = env.ports()[0];
    assert_eq!(
        master_cmd(m0, &["SET", QUARANTINE_KEY, "1", "PX", "60000"]).await,
        "+OK"
    );
    let mut c = env.proxy.client().await;
    let del_quarantine = format!("return redis.call('del','{QUARANTINE_KEY}')");
    assert_eq!(
        c.cmd(&["EVAL", &del_quarantine, "0"]).await,
        format!(
            "{RESERVED} script: {}, on @user_script:1.",
            script_sha(del_quarantine.as_bytes())
        )
    );
    let pttl = master_cmd(m0, &["PTTL", QUARANTINE_KEY]).await;
    assert!(
        pttl[1..].parse::<i64>().unwrap() > 0,
        "quarantine ended: {pttl}"
    );
    // Declared or not, and with pcall too (the error comes back as a value).
    let k = key("own");
    let token = format!("redlock-proxy:token:{k}");
    for attempt in [
        vec!["EVAL", "return redis.call('del', ARGV[1])", "0", ARMED_KEY],
        vec![
            "EVAL",
            "return redis.call('get', KEYS[1] .. ARGV[1])",
            "1",
            "redlock-proxy:",
            "armed",
        ],
        vec![
            "EVAL",
            "return redis.call('set', 'redlock-proxy:' .. ARGV[1], '0')",
            "0",
            &token,
        ],
        vec![
            "EVAL",
            "return redis.pcall('del', KEYS[1], ARGV[1])['err']",
            "1",
            &k,
            QUARANTINE_KEY,
        ],
    ] {
        let reply = c.cmd(&attempt).await;
        assert!(reply.contains(&RESERVED[1..]), "{attempt:?}: {reply}");
    }
    for port in env.ports() {
        assert_eq!(master_cmd(port, &["EXISTS", ARMED_KEY]).await, ":1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_script_cannot_reach_another_tenant_s_lock() {
    let env = Env::start_with(3, tenants).await;
    ready(&env).await;
    // The same users on a plain redis-server: the errors must be its own, byte for byte.
    let reference = LocalMaster::start(None, &[]).unwrap();
    let mut admin = Client::connect(reference.port).await;
    for user in [
        ["billing", ">b-pw", "~billing:*"],
        ["orders", ">o-pw", "~orders:*"],
    ] {
        let acl = ["ACL", "SETUSER", user[0], "on", user[1], user[2], "+@all"];
        assert_eq!(admin.cmd(&acl).await, "+OK");
    }
    let lock = format!("orders:{}", key("lock1"));
    let (mut orders, mut billing) = (env.proxy.client().await, env.proxy.client().await);
    let mut billing_on_redis = Client::connect(reference.port).await;
    assert_eq!(orders.cmd(&["AUTH", "orders", "o-pw"]).await, "+OK");
    assert_eq!(billing.cmd(&["AUTH", "billing", "b-pw"]).await, "+OK");
    assert_eq!(
        billing_on_redis.cmd(&["AUTH", "billing", "b-pw"]).await,
        "+OK"
    );
    assert_eq!(
        orders
            .cmd(&["SET", &lock, "mine", "NX", "PX", "30000"])
            .await,
        "+OK"
    );
    assert_eq!(
        admin.cmd(&["SET", &lock, "mine", "PX", "30000"]).await,
        "+OK"
    );
    let own = format!("billing:{}", key("own"));
    for attempt in [
        vec![
            "EVAL".to_string(),
            format!("return redis.call('get','{lock}')"),
            "0".into(),
        ],
        vec![
            "EVAL".into(),
            format!("return redis.call('del','{lock}')"),
            "0".into(),
        ],
        vec![
            "EVAL".into(),
            "redis.call('get', KEYS[1]) return redis.call('pexpire', ARGV[1], 1)".into(),
            "1".into(),
            own.clone(),
            lock.clone(),
        ],
        vec![
            "EVAL".into(),
            "return redis.pcall('unlink', ARGV[1])['err']".into(),
            "0".into(),
            lock.clone(),
        ],
    ] {
        let attempt: Vec<&str> = attempt.iter().map(String::as_str).collect();
        let ours = billing.cmd(&attempt).await;
        assert!(ours.contains(SCRIPT_NOPERM), "{attempt:?}: {ours}");
        assert_eq!(ours, billing_on_redis.cmd(&attempt).await, "{attempt:?}");
    }
    assert!(env.holders(&lock, "mine").await >= 2);
    assert_eq!(
        orders
            .cmd(&["EVAL", "return redis.call('get', KEYS[1])", "1", &lock])
            .await,
        "$mine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_keys_and_unchecked_commands_are_refused() {
    let env = Env::start_with(3, tenants).await;
    ready(&env).await;
    let reference = LocalMaster::start(None, &[]).unwrap();
    let mut redis = Client::connect(reference.port).await;
    let mut c = env.proxy.client().await;
    let (k, other) = (key("declared"), key("undeclared"));
    let at_line_1 = |text: String, body: &str| {
        format!(
            "{text} script: {}, on @user_script:1.",
            script_sha(body.as_bytes())
        )
    };
    let set_other = "return redis.call('set', ARGV[1], 'v', 'PX', 1000)";
    assert_eq!(
        c.cmd(&["EVAL", set_other, "0", &other]).await,
        at_line_1(undeclared(&other), set_other)
    );
    assert_eq!(env.values(&other).await, vec![None, None, None]);
    let reads_other = "redis.call('get', KEYS[1]) return redis.pcall('get', ARGV[1])['err']";
    assert_eq!(
        c.cmd(&["EVAL", reads_other, "1", &k, &other]).await,
        format!("${}", &undeclared(&other)[1..])
    );
    // Commands whose keys cannot be checked, or that reach beyond the keys.
    for (body, name) in [
        ("return redis.call('flushall')", "flushall"),
        ("return redis.call('SELECT', 1)", "select"),
        ("return redis.call('keys', '*')", "keys"),
        ("return redis.call('eval', 'return 1', 0)", "eval"),
        ("return redis.call('sort', KEYS[1], 'BY', 'x*')", "sort"),
    ] {
        let refused = format!("-ERR '{name}' in a script is refused by redlock-proxy: only commands whose keys it can check may run in scripts");
        assert_eq!(
            c.cmd(&["EVAL", body, "1", &k]).await,
            at_line_1(refused, body)
        );
    }
    // Around the shadow: refused before it runs.
    for body in [
        "return rawget(_G, 'redis').call('del', 'x')",
        "return loadstring('return redis')().call('del', 'x')",
        "return debug.getupvalue(redis.call, 1)",
    ] {
        assert!(
            c.cmd(&["EVAL", body, "0"])
                .await
                .starts_with("-ERR scripts using _G"),
            "{body}"
        );
    }
    // What the body sees is Redis' own: declared keys work, errors keep their lines and name
    // the client's script, the rest of `redis` is there.
    for attempt in [
        vec![
            "EVAL",
            "redis.call('set', KEYS[1], 'v', 'PX', 5000) return redis.call('get', KEYS[1])",
            "1",
            &k,
        ],
        vec!["EVAL", "return {#KEYS, #ARGV, ARGV[2]}", "1", &k, "a", "b"],
        vec!["EVAL", "return nosuch()", "0"],
        vec!["EVAL", "\n\nreturn nosuch()", "0"],
        vec!["EVAL", "return redis.sha1hex('x')", "0"],
        vec!["EVAL", "return redis.status_reply('FINE')", "0"],
        vec!["EVAL", "return redis.error_reply('MINE text')", "0"],
        vec![
            "EVAL",
            "redis.setresp(3) return redis.call('time')[1] ~= nil",
            "0",
        ],
        vec!["EVAL", "return type(getmetatable(redis))", "0"],
        vec!["EVAL", "return redis.call('get')", "0"],
        vec![
            "EVAL",
            "#!lua flags=no-writes\nreturn redis.call('set', KEYS[1], 'v')",
            "1",
            &k,
        ],
    ] {
        let ours = c.cmd(&attempt).await;
        let theirs = redis.cmd(&attempt).await;
        if attempt[1].contains("getmetatable") {
            // The shadow's metatable is protected (`false`); the real table has none (`nil`).
            assert_eq!((ours.as_str(), theirs.as_str()), ("$boolean", "$nil"));
        } else {
            assert_eq!(ours, theirs, "{attempt:?}");
        }
    }
}

/// Every way a script could change or get around the shadow `redis` fails with an error, and
/// another tenant's lock is still held on every master afterwards (docs/PROTOCOL.md §5, "The
/// shadow cannot be changed"). The negative control: the same payload without the shadow,
/// run directly on a master, deletes the lock there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_script_can_change_or_get_around_the_shadow() {
    let env = Env::start_with(3, tenants).await;
    ready(&env).await;
    let victim = format!("orders:{}", key("victim"));
    let mut orders = env.proxy.client().await;
    assert_eq!(orders.cmd(&["AUTH", "orders", "o-pw"]).await, "+OK");
    assert_eq!(
        orders
            .cmd(&["SET", &victim, "held", "NX", "PX", "30000"])
            .await,
        "+OK"
    );
    let mut c = env.proxy.client().await;
    let own = key("own");
    let del = format!("redis.call('del', '{victim}')");
    let readonly = "-ERR user_script:1: Attempt to modify a readonly table";
    let refused_member =
        |name: &str| format!("-ERR redis.{name} in a script is refused by redlock-proxy");
    let (set_repl, breakpoint, acl) = (
        refused_member("set_repl"),
        refused_member("breakpoint"),
        refused_member("acl_check_cmd"),
    );
    let (undeclared, globals) = (undeclared(&victim), "-ERR scripts using _G".to_string());
    // (escape attempt, how its reply starts)
    let attempts = [
        (format!("redis.call = nil return {del}"), readonly),
        (format!("redis.pcall = nil return {del}"), readonly),
        (format!("redis['call'] = nil return {del}"), readonly),
        (format!("redis.call = redis.pcall return {del}"), readonly),
        (
            format!("local r = redis r.call = nil return {del}"),
            readonly,
        ),
        (
            format!("coroutine.wrap(function() redis.call = nil end)() return {del}"),
            "-ERR",
        ),
        (
            format!("pcall(function() redis.call = nil end) return {del}"),
            &undeclared[..],
        ),
        (
            format!("pcall(setmetatable, redis, {{}}) return {del}"),
            &undeclared[..],
        ),
        (
            format!("setmetatable(redis, nil) return {del}"),
            "-ERR user_script:1: cannot change a protected metatable",
        ),
        (
            format!("return getmetatable(redis).__index.call('del', '{victim}')"),
            "-ERR user_script:1: attempt to index a boolean value",
        ),
        (
            format!("rawset(redis, 'call', nil) return {del}"),
            &globals[..],
        ),
        (
            format!("return rawget(redis, 'call')('del', '{victim}')"),
            &globals[..],
        ),
        (
            format!("return _G.redis.call('del', '{victim}')"),
            &globals[..],
        ),
        (
            format!("return getfenv(0).redis.call('del', '{victim}')"),
            &globals[..],
        ),
        (format!("setfenv(1, {{}}) return {del}"), &globals[..]),
        (
            "return debug.getupvalue(redis.call, 1)".to_string(),
            &globals[..],
        ),
        (
            format!("return loadstring(string.dump(function() return {del} end))()"),
            &globals[..],
        ),
        (
            format!("__done = function(r) return r end return {del}"),
            &globals[..],
        ),
        (
            format!("redis.set_repl(redis.REPL_NONE) return {del}"),
            &set_repl[..],
        ),
        (format!("redis.breakpoint() return {del}"), &breakpoint[..]),
        (
            format!("return redis.acl_check_cmd('del', '{victim}')"),
            &acl[..],
        ),
        (
            format!("for k, v in pairs(redis) do v('del', '{victim}') end return {del}"),
            &undeclared[..],
        ),
    ];
    for (body, expected) in &attempts {
        let reply = c.cmd(&["EVAL", body, "1", &own]).await;
        assert!(reply.starts_with(expected), "{body}: {reply}");
        assert_eq!(env.holders(&victim, "held").await, 3, "{body}: {reply}");
    }
    // Read-only forms, and a body loaded first.
    let sha = c
        .cmd(&[
            "SCRIPT",
            "LOAD",
            &format!("redis.call = nil return redis.call('get', '{victim}')"),
        ])
        .await;
    for attempt in [
        vec!["EVALSHA_RO", &sha[1..], "1", &own],
        vec!["EVALSHA", &sha[1..], "1", &own],
    ] {
        let reply = c.cmd(&attempt).await;
        assert!(reply.starts_with(readonly), "{attempt:?}: {reply}");
    }
    let ro = format!("redis.call = nil return redis.call('get', '{victim}')");
    assert!(c
        .cmd(&["EVAL_RO", &ro, "1", &own])
        .await
        .starts_with(readonly));
    assert_eq!(env.holders(&victim, "held").await, 3);
    // Negative control: the payload reaching the real redis.call deletes the lock.
    let port = env.ports()[0];
    assert_eq!(
        master_cmd(port, &["EVAL", &format!("return {del}"), "0"]).await,
        ":1"
    );
    assert_eq!(env.holders(&victim, "held").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evalsha_runs_the_checked_body_even_on_masters_that_lost_their_cache() {
    let env = Env::start_with(3, tenants).await;
    ready(&env).await;
    let mut c = env.proxy.client().await;
    let k = key("sha");
    let body = "return redis.call('set', KEYS[1], ARGV[1], 'PX', 5000)";
    let sha = c.cmd(&["SCRIPT", "LOAD", body]).await;
    assert_eq!(sha, format!("${}", script_sha(body.as_bytes())));
    let sha = &sha[1..];
    assert_eq!(c.cmd(&["EVALSHA", sha, "1", &k, "v1"]).await, "+OK");
    for port in env.ports() {
        assert_eq!(master_cmd(port, &["SCRIPT", "FLUSH"]).await, "+OK");
    }
    assert_eq!(c.cmd(&["EVALSHA", sha, "1", &k, "v2"]).await, "+OK");
    // The reply needs a quorum; the last master's retry with the body may come just after.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while env.holders(&k, "v2").await != 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "not every master ran it"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // A loaded script that names a key it did not declare is refused when run by its SHA1.
    let other = key("sha-other");
    let undeclared_body = "return redis.call('set', ARGV[1], 'v', 'PX', 5000)";
    let loaded = c.cmd(&["SCRIPT", "LOAD", undeclared_body]).await;
    assert_eq!(
        c.cmd(&["EVALSHA", &loaded[1..], "0", &other]).await,
        format!(
            "{} script: {}, on @user_script:1.",
            undeclared(&other),
            &loaded[1..]
        )
    );
    assert_eq!(env.values(&other).await, vec![None, None, None]);
    assert_eq!(
        c.cmd(&["EVALSHA", &"0".repeat(40), "0"]).await,
        "-NOSCRIPT No matching script. Please use EVAL."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_a_script_writes_outlives_the_bound() {
    let env = Env::start_with(3, tenants).await;
    ready(&env).await;
    let mut c = env.proxy.client().await;
    let no_expiry = "-ERR script left a key without expiry, which redlock-proxy does not keep: its TTL was set to max_lock_ttl_ms (60000 ms); set PX or PEXPIRE in the script";
    // PERSIST is refused in scripts as outside them: the lock keeps its TTL.
    let lock = key("persist");
    assert_eq!(
        c.cmd(&["SET", &lock, "tok", "NX", "PX", "30000"]).await,
        "+OK"
    );
    let persist = "return redis.call('persist', KEYS[1])";
    assert_eq!(
        c.cmd(&["EVAL", persist, "1", &lock]).await,
        format!("-ERR 'PERSIST' is refused by redlock-proxy: a lock without expiry cannot be made safe; use PEXPIRE script: {}, on @user_script:1.", script_sha(persist.as_bytes()))
    );
    assert_bounded(&env, &lock).await;
    // Writes that leave no expiry get the bound, and the client is told.
    for (name, body) in [
        ("set", "return redis.call('set', KEYS[1], 'v')"),
        ("hset", "return redis.call('hset', KEYS[1], 'f', 'v')"),
        ("incr", "return redis.call('incr', KEYS[1])"),
        ("getex-persist", "redis.call('set', KEYS[1], 'v', 'PX', 1000) return redis.call('getex', KEYS[1], 'PERSIST')"),
    ] {
        let k = key(name);
        assert_eq!(c.cmd(&["EVAL", body, "1", &k]).await, no_expiry, "{name}");
        assert_bounded(&env, &k).await;
    }
    // The lock kept by a plain SET is capped too when a script overwrites it without expiry.
    assert_eq!(
        c.cmd(&["EVAL", "return redis.call('set', KEYS[1], 'x')", "1", &lock])
            .await,
        no_expiry
    );
    assert_bounded(&env, &lock).await;
    // A write followed by its expiry is a lease: answered as the script answers.
    let leased = key("leased");
    assert_eq!(
        c.cmd(&[
            "EVAL",
            "redis.call('hset', KEYS[1], 'f', 'v') return redis.call('pexpire', KEYS[1], ARGV[1])",
            "1",
            &leased,
            "10000"
        ])
        .await,
        ":1"
    );
    assert_bounded(&env, &leased).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_table_is_redis_own() {
    let redis = LocalMaster::start(None, &[]).unwrap();
    let mut c = Client::connect(redis.port).await;
    for command in SCRIPT_COMMANDS {
        let info = c
            .request(&[b"COMMAND", b"INFO", command.name.as_bytes()])
            .await
            .unwrap();
        let Reply::Array(rows) = info else {
            panic!("{info}")
        };
        let Some(Reply::Array(row)) = rows.first() else {
            panic!("{}: {rows:?}", command.name)
        };
        let int = |i: usize| match &row[i] {
            Reply::Int(n) => *n,
            other => panic!("{}: {other}", command.name),
        };
        assert_eq!(
            (int(3), int(4), int(5)),
            (command.first, command.last, command.step),
            "{}",
            command.name
        );
        let Reply::Array(flags) = &row[2] else {
            panic!()
        };
        let write = flags.iter().any(|f| f.text().as_deref() == Some("write"));
        assert_eq!(write, command.write, "{}", command.name);
    }
}

/// The prelude's glob against Redis' own ACL key match (`ACL DRYRUN`), on the pattern table of
/// `src/auth.rs` and hostile ones; and the patterns leave `ARGV` before the body runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prelude_matches_keys_as_redis_acl_does() {
    let redis = LocalMaster::start(None, &[]).unwrap();
    let mut c = Client::connect(redis.port).await;
    let probe = checked_body(b"return {#ARGV, redis.pcall('get', ARGV[1])['err']}", false);
    let probe = std::str::from_utf8(&probe).unwrap();
    let cases: &[(&str, &str)] = &[
        ("app:*", "app:lock"),
        ("app:*", "other:lock"),
        ("a?c", "abc"),
        ("a?c", "ac"),
        ("*:lock", "x:y:lock"),
        ("*:lock", "x:y:locks"),
        ("a*b*c", "aXXbYYc"),
        ("a*b*c", "aXXbYY"),
        ("[abc]x", "bx"),
        ("[abc]x", "dx"),
        ("[^abc]x", "dx"),
        ("[^abc]x", "ax"),
        ("[a-c]x", "bx"),
        ("[c-a]x", "bx"),
        ("[a-c]x", "dx"),
        ("a\\*", "a*"),
        ("a\\*", "ab"),
        ("[\\]]", "]"),
        ("tenant\\?", "tenant?"),
        ("tenant\\?", "tenantx"),
        ("a**", "a"),
        ("[abc", "b"),
        ("ab\\", "ab\\"),
        ("*", "anything"),
    ];
    for (i, (pattern, key)) in cases.iter().enumerate() {
        let user = format!("u{i}");
        let acl = [
            "ACL",
            "SETUSER",
            &user,
            "on",
            "nopass",
            &format!("~{pattern}"),
            "+@all",
        ];
        assert_eq!(c.cmd(&acl).await, "+OK");
        let redis_allows = c.cmd(&["ACL", "DRYRUN", &user, "GET", key]).await == "+OK";
        // ARGV: the key, then the token counters' prefix, no token offer, no padding, no
        // write deadline, the pattern (tagged as a glob) and its count, which the prelude
        // removes.
        let glob = format!("*{pattern}");
        let reply = c
            .cmd(&[
                "EVAL", probe, "0", key, COUNTERS, "0", "0", "0", "0", "0", "0", &glob, "1",
            ])
            .await;
        let expected = if redis_allows {
            format!("*[:1,${}]", &undeclared(key)[1..])
        } else {
            format!("*[:1,${SCRIPT_NOPERM}]")
        };
        assert_eq!(reply, expected, "{pattern} vs {key}");
    }
    // The proxy's shortcuts for a pattern without wildcards, and a trailing `*`.
    for (tagged, key, allowed) in [
        ("=app:lock", "app:lock", true),
        ("=app:lock", "app:locks", false),
        ("=app:lock", "app:loc", false),
        ("^app:", "app:x", true),
        ("^app:", "app:", true),
        ("^app:", "ap", false),
        ("^", "anything", true),
    ] {
        let reply = c
            .cmd(&[
                "EVAL", probe, "0", key, COUNTERS, "0", "0", "0", "0", "0", "0", tagged, "1",
            ])
            .await;
        assert_eq!(
            reply.contains("not in the script's KEYS"),
            allowed,
            "{tagged} vs {key}: {reply}"
        );
    }
    // No pattern at all: no key; -1: every key.
    assert_eq!(
        c.cmd(&["EVAL", probe, "0", "k", COUNTERS, "0", "0", "0", "0", "0", "0", "0"])
            .await,
        format!("*[:1,${SCRIPT_NOPERM}]")
    );
    assert_eq!(
        c.cmd(&["EVAL", probe, "0", "k", COUNTERS, "0", "0", "0", "0", "0", "0", "-1"])
            .await,
        format!("*[:1,${}]", &undeclared("k")[1..])
    );
}
