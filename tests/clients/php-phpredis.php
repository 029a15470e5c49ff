<?php
// phpredis + the user's `Lock` class, through the proxy.
//
//   PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] php tests/clients/php-phpredis.php
//
// The class below is copied VERBATIM from shared/seeds/000_8d4ae75f2ff77038.txt
// (lines 29-72); the only change is the port in connect(): 6379 -> LOCK_PROXY_PORT
// (the host was already 127.0.0.1). The driver after the class is ours.
// Flow: setLock() acquires (SET k v ex 30 nx), a second Lock instance contends
// (its setLock() must return false within its poll deadline), delLock() releases
// (EVAL of the class's script). The class has no extend. Every step is checked on
// each master in MASTER_PORTS directly (plain phpredis connections).
// Exit 0 and one `RESULT {...}` line on stdout on success; non-zero otherwise.

function fail($msg) {
    global $KEY;
    fwrite(STDERR, "FAIL [php-phpredis key=$KEY]: $msg\n");
    exit(1);
}
$port = getenv("PROXY_PORT");
$masterPorts = getenv("MASTER_PORTS");
if ($port === false || $port === "" || $masterPorts === false || $masterPorts === "") {
    fwrite(STDERR, "set PROXY_PORT and MASTER_PORTS (ports on 127.0.0.1)\n");
    exit(2);
}
define("LOCK_PROXY_PORT", (int)$port);
set_exception_handler(function ($e) { fail("uncaught " . get_class($e) . ": " . $e->getMessage()); });
$KEY = getenv("KEY") ?: ("rlp-test:php-phpredis:" . getmypid() . ":" . bin2hex(random_bytes(4)));
if (!extension_loaded("redis")) fail("the phpredis extension is not loaded (run tests/clients/install.sh)");
// Bound every wait: the whole script gets 90 s, socket connects/reads 10 s.
ini_set("default_socket_timeout", "10");
if (function_exists("pcntl_alarm")) {
    pcntl_async_signals(true);
    pcntl_signal(SIGALRM, function () { fail("timed out after 90 s"); });
    pcntl_alarm(90);
}

// ---------------- the user's class, verbatim except the port ----------------
class Lock
{
     public $redis = null;
     public $key   ="";
     public $timeOut = 0;
     public $lockOut = 0;
     public function __construct($key,$timeOut,$lockOut)
     {
         $this->redis = new Redis();
         $this->redis->connect("127.0.0.1",LOCK_PROXY_PORT);
         $this->key   = $key;
         $this->timeOut = $timeOut;
         $this->lockOut = $lockOut;
     }
     public function setLock()
     {
          $time = time();
          $endTime = $time + $this->timeOut;
          $value = mt_rand(1000,10000);
          do {
              $isLock = $this->redis->set($this->key,$value,['nx','ex'=>$this->lockOut]);
              if ($isLock) {
                  return $value;
              } else {
                  usleep(5000);///睡眠,降低抢锁频率,缓解redis压力,针对问题2
              }
          } while(time()<$endTime);
          return false;
     }
     //采用lua 脚本解锁
     public function delLock($value)
     {
          $script=<<<EOT
          if redis.call("GET",KEYS[1]) == ARGV[1]
          then
              return redis.call("DEL",KEYS[1])
          else
              return 0
          end
EOT;
        return  $this->redis->eval($script,[$this->key,$value],1);
     }
    
}
// ----------------------------- end of the class -----------------------------

$CHECKS = 0;
function check($cond, $msg) { global $CHECKS; if (!$cond) fail($msg); $CHECKS++; }
function show($v) { return var_export($v, true); }

$masters = [];
foreach (explode(",", $masterPorts) as $p) {
    $m = new Redis();
    try {
        $m->connect("127.0.0.1", (int)$p, 5.0);
        $m->setOption(Redis::OPT_READ_TIMEOUT, 10);
        check($m->ping() !== false, "master $p: PING failed");
    } catch (RedisException $e) {
        fail("master $p: cannot connect: " . $e->getMessage());
    }
    $masters[(int)$p] = $m;
}
$N = count($masters);
$QUORUM = intdiv($N, 2) + 1;

// A proxy may reply once a quorum agreed and finish the other masters a moment
// later: "gone" / "no foreign value" get up to MASTER_SETTLE_MS (default 1000) to hold.
$SETTLE = (int)(getenv("MASTER_SETTLE_MS") ?: 1000) / 1000.0;
function warn($msg) { global $KEY; fwrite(STDERR, "WARN [php-phpredis key=$KEY]: $msg\n"); }

// no master holds another value than $value; >= QUORUM hold it with PTTL > $minPttl
// (a minority holding it with a lower PTTL is only a WARN: Redlock is per majority)
function checkMajority($key, $value, $minPttl, $label) {
    global $masters, $N, $QUORUM, $SETTLE, $CHECKS;
    $deadline = microtime(true) + $SETTLE;
    for (;;) {
        $pttls = []; $foreign = [];
        foreach ($masters as $p => $m) {
            $v = $m->get($key);
            if ($v === (string)$value) $pttls[$p] = $m->pttl($key);
            elseif ($v !== false) $foreign[$p] = $v;
        }
        if (!$foreign) break;
        if (microtime(true) > $deadline) fail("$label: foreign value(s) under $key (expected '$value' or nothing): " . json_encode($foreign));
        usleep(50000);
    }
    $CHECKS += $N;
    $good = array_filter($pttls, function ($t) use ($minPttl) { return is_int($t) && $t > $minPttl; });
    check(count($good) >= $QUORUM, "$label: value with PTTL > $minPttl on " . count($good) . " of $N masters (quorum $QUORUM); holders' PTTL: " . json_encode($pttls));
    $bad = array_diff_key($pttls, $good);
    if ($bad) warn("$label: a minority holds the value with PTTL <= $minPttl: " . json_encode($bad));
}
function checkAbsent($key, $label) {
    global $masters, $N, $SETTLE, $CHECKS;
    $deadline = microtime(true) + $SETTLE;
    for (;;) {
        $left = [];
        foreach ($masters as $p => $m) {
            $e = $m->exists($key);
            if ($e !== 0 && $e !== false) $left[$p] = $m->get($key);
        }
        if (!$left) break;
        if (microtime(true) > $deadline) fail("$label: key $key still on master(s) after " . ($SETTLE * 1000) . " ms: " . json_encode($left));
        usleep(50000);
    }
    $CHECKS += $N;
}
function setTimeouts($lock) {  // driver-side bound on the proxy connection's reads
    $lock->redis->setOption(Redis::OPT_READ_TIMEOUT, 10);
}

checkAbsent($KEY, "precondition");

// acquire: waits up to 5 s, lock TTL 30 s (SET key value ex 30 nx)
$a = new Lock($KEY, 5, 30);
setTimeouts($a);
$value = $a->setLock();
check(is_int($value) && $value >= 1000 && $value <= 10000, "A setLock(): expected an int token in 1000..10000, got " . show($value));
checkMajority($KEY, $value, 29000, "after A setLock()");

// contention 1: timeOut 0 -> one SET NX attempt, then false
$b = new Lock($KEY, 0, 30);
setTimeouts($b);
$t0 = microtime(true);
$r = $b->setLock();
check($r === false, "B setLock() timeOut=0 while A holds the lock: expected false, got " . show($r));
check(microtime(true) - $t0 < 2.0, "B setLock() timeOut=0 took " . round(microtime(true) - $t0, 2) . " s");
checkMajority($KEY, $value, 28000, "after B contention (timeOut=0)");

// contention 2: timeOut 1 -> busy-polls SET NX every ~5 ms until time() passes the end (0-1 s)
$c = new Lock($KEY, 1, 30);
setTimeouts($c);
$t0 = microtime(true);
$r = $c->setLock();
$elapsed = microtime(true) - $t0;
check($r === false, "C setLock() timeOut=1 while A holds the lock: expected false, got " . show($r));
check($elapsed < 3.0, "C setLock() timeOut=1 returned after " . round($elapsed, 2) . " s (deadline is 1 s, whole seconds)");
checkMajority($KEY, $value, 27000, "after C contention (timeOut=1, " . round($elapsed, 2) . " s of polling)");

// release with a value that is not the holder's: 0, lock untouched
$wrong = $value == 10000 ? 9999 : $value + 1;
$r = $b->delLock($wrong);
check($r === 0, "B delLock(wrong value): expected int 0, got " . show($r) . " lastError=" . show($b->redis->getLastError()));
checkMajority($KEY, $value, 27000, "after B delLock(wrong value)");

// release
$r = $a->delLock($value);
check($r === 1, "A delLock(value): expected int 1, got " . show($r) . " lastError=" . show($a->redis->getLastError()));
checkAbsent($KEY, "after A delLock()");
$r = $a->delLock($value);
check($r === 0, "A delLock(value) again: expected int 0, got " . show($r));

// after release, the other instance can take it, and release it
$v2 = $b->setLock();
check(is_int($v2), "B setLock() after release: expected an int token, got " . show($v2));
checkMajority($KEY, $v2, 29000, "after B setLock() post-release");
$r = $b->delLock($v2);
check($r === 1, "B delLock(): expected int 1, got " . show($r));
checkAbsent($KEY, "after B delLock()");

echo 'RESULT {"client":"php-phpredis","version":"' . phpversion("redis") . '","protocol":"RESP2","status":"pass","checks":' . $CHECKS . ',"api":"the seed\'s Lock class: setLock() (SET EX NX, polled), delLock() (EVAL); no extend"}' . "\n";
