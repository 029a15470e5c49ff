//! Who a client is and which keys it may touch: the users (Redis' ACL users, the part a lock
//! service needs) built from the configuration's `[[users]]` tables ([`UserConfig`]) and
//! `requirepass`, password checks and key patterns. Pure: no I/O.
//!
//! Invariants:
//! - Passwords are kept only as SHA-256 digests, and a candidate is compared digest to digest
//!   in constant time ([`subtle`]), as Redis' `ACLCheckUserCredentials` does
//!   (`time_independent_strcmp` on hashes): neither the stored secret nor the time a check
//!   takes says how much of a guess was right.
//! - The `default` user is what a connection is before any `AUTH`, as in Redis: with no
//!   password (no `requirepass`, no `[[users]]` entry named `default` with a password) it is
//!   `nopass` and every connection starts authenticated as it; otherwise no connection is
//!   authenticated until `AUTH` or `HELLO … AUTH` succeeds.
//! - A disabled user never authenticates, whatever the password.
//! - Key patterns are Redis' glob (`stringmatchlen` of `util.c`): a user may touch a key only
//!   if one of its patterns matches it. `*` alone means every key (Redis `allkeys`).

use crate::secret::Secret;
use bytes::Bytes;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The user every connection starts as (Redis' `default`).
pub const DEFAULT_USER: &str = "default";

type PasswordDigest = [u8; 32];

/// One `[[users]]` table: a Redis ACL user reduced to what a lock service needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub name: String,
    /// A disabled user cannot authenticate (Redis `off`).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// The password in clear (Redis `>password`).
    #[serde(default)]
    pub password: Option<Secret>,
    /// Passwords as SHA-256 hex digests (Redis `#hash`), e.g. from `echo -n pw | sha256sum`.
    #[serde(default)]
    pub password_sha256: Vec<String>,
    /// Key patterns, Redis ACL glob syntax with or without the `~` (`"app:*"`, `"~jobs:?"`);
    /// `"*"` is every key. None: no key at all. A user with neither password is `nopass`.
    #[serde(default)]
    pub keys: Vec<String>,
}

fn enabled() -> bool {
    true
}

/// Users that cannot be built, and why (the configuration reports it as invalid).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidUsers(String);

fn digest(password: &[u8]) -> PasswordDigest {
    Sha256::digest(password).into()
}

/// The keys a user may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPatterns {
    /// Every key (`*`, Redis' `allkeys`).
    All,
    /// Only keys matching one of these globs (none: no key at all, Redis' `resetkeys`).
    Some(Vec<Bytes>),
}

impl KeyPatterns {
    /// From the configured patterns; a leading `~` (Redis ACL syntax) is accepted and dropped.
    fn new(patterns: &[String]) -> KeyPatterns {
        let patterns: Vec<&str> = patterns
            .iter()
            .map(|p| p.strip_prefix('~').unwrap_or(p))
            .collect();
        if patterns.contains(&"*") {
            return KeyPatterns::All;
        }
        KeyPatterns::Some(
            patterns
                .into_iter()
                .map(|p| Bytes::copy_from_slice(p.as_bytes()))
                .collect(),
        )
    }

    pub fn allows(&self, key: &[u8]) -> bool {
        match self {
            KeyPatterns::All => true,
            KeyPatterns::Some(patterns) => patterns.iter().any(|p| glob_match(p, key)),
        }
    }
}

/// One user.
#[derive(Debug)]
pub struct User {
    pub name: String,
    enabled: bool,
    /// No password needed (Redis' `nopass`): any password is accepted.
    nopass: bool,
    passwords: Vec<PasswordDigest>,
    pub keys: KeyPatterns,
}

impl User {
    fn accepts(&self, password: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let candidate = digest(password);
        // Every stored digest is compared, so the time does not tell which one matched.
        self.passwords
            .iter()
            .fold(subtle::Choice::from(0), |found, stored| {
                found | stored.ct_eq(&candidate)
            })
            .into()
    }

    fn from_config(user: &UserConfig) -> Result<User, InvalidUsers> {
        let invalid = |why: String| InvalidUsers(format!("user '{}': {why}", user.name));
        if user.name.is_empty() || !user.name.bytes().all(|c| c.is_ascii_graphic()) {
            return Err(invalid(
                "a user name must be printable ASCII without spaces".into(),
            ));
        }
        let mut passwords: Vec<PasswordDigest> = user
            .password
            .iter()
            .map(|p| digest(p.expose().as_bytes()))
            .collect();
        for hex_digest in &user.password_sha256 {
            let mut stored = [0u8; 32];
            hex::decode_to_slice(hex_digest.trim(), &mut stored).map_err(|_| {
                invalid("password_sha256 must be 64 hexadecimal digits (a SHA-256)".into())
            })?;
            passwords.push(stored);
        }
        Ok(User {
            name: user.name.clone(),
            enabled: user.enabled,
            nopass: passwords.is_empty(),
            passwords,
            keys: KeyPatterns::new(&user.keys),
        })
    }
}

/// Every user of the configuration.
#[derive(Debug)]
pub struct Users {
    by_name: HashMap<String, Arc<User>>,
    default: Arc<User>,
}

impl Users {
    /// The users of `entries`, and the default user: `requirepass` is its password, and an
    /// entry named `default` replaces it (to disable it, or limit its keys).
    pub fn new(
        requirepass: Option<&Secret>,
        entries: &[UserConfig],
    ) -> Result<Users, InvalidUsers> {
        let mut by_name = HashMap::new();
        for entry in entries {
            let user = User::from_config(entry)?;
            if user.name == DEFAULT_USER && requirepass.is_some() {
                return Err(InvalidUsers(
                    "requirepass and a [[users]] entry named 'default' both set the default user's password: keep one"
                        .into(),
                ));
            }
            if by_name.insert(user.name.clone(), Arc::new(user)).is_some() {
                return Err(InvalidUsers(format!(
                    "user '{}' is defined twice",
                    entry.name
                )));
            }
        }
        let default = by_name
            .entry(DEFAULT_USER.to_string())
            .or_insert_with(|| {
                Arc::new(User {
                    name: DEFAULT_USER.into(),
                    enabled: true,
                    nopass: requirepass.is_none(),
                    passwords: requirepass
                        .map(|p| digest(p.expose().as_bytes()))
                        .into_iter()
                        .collect(),
                    keys: KeyPatterns::All,
                })
            })
            .clone();
        Ok(Users { by_name, default })
    }

    /// No usable user: the default user is disabled and there is no other.
    pub fn nobody() -> Users {
        let default = Arc::new(User {
            name: DEFAULT_USER.into(),
            enabled: false,
            nopass: false,
            passwords: Vec::new(),
            keys: KeyPatterns::Some(Vec::new()),
        });
        Users {
            by_name: HashMap::from([(DEFAULT_USER.to_string(), default.clone())]),
            default,
        }
    }

    /// The user a new connection is authenticated as, or `None` if it must authenticate first
    /// (Redis' `authRequired`).
    pub fn initial(&self) -> Option<Arc<User>> {
        (self.default.enabled && self.default.nopass).then(|| self.default.clone())
    }

    /// Whether `AUTH <password>` means anything: the default user has a password.
    pub fn default_has_password(&self) -> bool {
        !self.default.nopass
    }

    /// `AUTH [user] password`: the user, if the pair is valid and the user enabled.
    pub fn authenticate(&self, name: &[u8], password: &[u8]) -> Option<Arc<User>> {
        let user = self.by_name.get(std::str::from_utf8(name).ok()?)?;
        user.accepts(password).then(|| user.clone())
    }

    /// `name` as the table has it now (after a reload): `None` if it is gone or disabled.
    pub fn current(&self, name: &str) -> Option<Arc<User>> {
        self.by_name.get(name).filter(|u| u.enabled).cloned()
    }
}

/// Redis' glob match (`stringmatchlen` in `util.c`), case-sensitive: `*`, `?`, `[abc]`,
/// `[^abc]`, `[a-z]`, and `\` to escape. Iterative with one backtrack point per `*`, so a
/// hostile pattern costs O(pattern × key), never exponential time (Redis CVE-2022-36021).
pub fn glob_match(pattern: &[u8], key: &[u8]) -> bool {
    let (mut p, mut k) = (0, 0);
    // Where to resume after the last `*`: the pattern position after it, and the key
    // position it has swallowed up to.
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p + 1, k));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    k += 1;
                    continue;
                }
                b'[' => {
                    let (matched, next) = match_class(pattern, p, key[k]);
                    if matched {
                        p = next;
                        k += 1;
                        continue;
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == key[k] {
                        p += 2;
                        k += 1;
                        continue;
                    }
                }
                c => {
                    if c == key[k] {
                        p += 1;
                        k += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((after, swallowed)) => {
                p = after;
                k = swallowed + 1;
                star = Some((after, swallowed + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The class `[…]` starting at `pattern[open]` against `c`: whether it matches, and where the
/// pattern goes on. An unterminated class runs to the end of the pattern, as in Redis.
fn match_class(pattern: &[u8], open: usize, c: u8) -> (bool, usize) {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    while i < pattern.len() && pattern[i] != b']' {
        if pattern[i] == b'\\' && i + 1 < pattern.len() {
            matched |= pattern[i + 1] == c;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' {
            let (lo, hi) = (
                pattern[i].min(pattern[i + 2]),
                pattern[i].max(pattern[i + 2]),
            );
            matched |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            matched |= pattern[i] == c;
            i += 1;
        }
    }
    // Past the closing `]` (or at the end of an unterminated class).
    let next = (i + 1).min(pattern.len());
    (matched != negate, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_redis_does() {
        let table: &[(&str, &str, bool)] = &[
            ("*", "", true),
            ("*", "anything", true),
            ("app:*", "app:lock", true),
            ("app:*", "app:", true),
            ("app:*", "other:lock", false),
            ("app:*", "ap", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*:lock", "x:y:lock", true),
            ("*:lock", "x:y:locks", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("[abc]x", "bx", true),
            ("[abc]x", "dx", false),
            ("[^abc]x", "dx", true),
            ("[^abc]x", "ax", false),
            ("[a-c]x", "bx", true),
            ("[c-a]x", "bx", true),
            ("[a-c]x", "dx", false),
            ("a\\*", "a*", true),
            ("a\\*", "ab", false),
            ("[\\]]", "]", true),
            ("tenant\\?", "tenant?", true),
            ("tenant\\?", "tenantx", false),
            ("", "", true),
            ("", "a", false),
            ("a**", "a", true),
        ];
        for (pattern, key, expected) in table {
            assert_eq!(
                glob_match(pattern.as_bytes(), key.as_bytes()),
                *expected,
                "{pattern} vs {key}"
            );
        }
    }

    #[test]
    fn a_hostile_glob_is_not_exponential() {
        let pattern = "a*".repeat(40) + "b";
        let key = "a".repeat(4000);
        let started = std::time::Instant::now();
        assert!(!glob_match(pattern.as_bytes(), key.as_bytes()));
        // Not a speed assertion: a backtracking matcher would not finish at all.
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
    }

    fn user(name: &str, password: Option<&str>, keys: &[&str], enabled: bool) -> UserConfig {
        UserConfig {
            name: name.into(),
            enabled,
            password: password.map(|p| Secret::new(p.into())),
            password_sha256: Vec::new(),
            keys: keys.iter().map(|k| k.to_string()).collect(),
        }
    }

    fn users(requirepass: Option<&str>, entries: Vec<UserConfig>) -> Users {
        let requirepass = requirepass.map(|p| Secret::new(p.into()));
        Users::new(requirepass.as_ref(), &entries).unwrap()
    }

    #[test]
    fn without_a_password_every_connection_is_the_default_user() {
        let users = users(None, vec![user("alice", Some("pw"), &["app:*"], true)]);
        let initial = users.initial().expect("no AUTH needed");
        assert_eq!(initial.name, DEFAULT_USER);
        assert!(initial.keys.allows(b"anything"));
        assert!(!users.default_has_password());
        // nopass: any password authenticates as default, as in Redis.
        assert!(users.authenticate(b"default", b"whatever").is_some());
        assert!(users.authenticate(b"alice", b"pw").is_some());
        assert!(users.authenticate(b"alice", b"PW").is_none());
    }

    #[test]
    fn requirepass_makes_every_connection_authenticate() {
        let users = users(Some("secret"), vec![]);
        assert!(users.initial().is_none());
        assert!(users.default_has_password());
        assert!(users.authenticate(b"default", b"secret").is_some());
        assert!(users.authenticate(b"default", b"secreT").is_none());
        assert!(users.authenticate(b"nobody", b"secret").is_none());
    }

    #[test]
    fn disabled_users_and_hashed_passwords() {
        let mut hashed = user("bob", None, &["~jobs:*"], true);
        hashed.password_sha256 = vec![hex::encode(digest(b"hunter2"))];
        let users = users(
            None,
            vec![
                hashed,
                user("carol", Some("pw"), &[], false),
                user("default", None, &[], false),
            ],
        );
        // The default user is disabled: nobody is authenticated before AUTH.
        assert!(users.initial().is_none());
        let bob = users.authenticate(b"bob", b"hunter2").unwrap();
        assert!(bob.keys.allows(b"jobs:1") && !bob.keys.allows(b"app:1"));
        assert!(users.authenticate(b"carol", b"pw").is_none());
        assert!(users.current("carol").is_none());
        assert!(users.current("bob").is_some());
    }

    #[test]
    fn conflicting_or_malformed_users_are_refused() {
        let default = [user("default", Some("y"), &["*"], true)];
        assert!(Users::new(Some(&Secret::new("x".into())), &default).is_err());
        let twice = [user("a", None, &[], true), user("a", None, &[], true)];
        assert!(Users::new(None, &twice).is_err());
        let mut bad_hash = user("a", None, &[], true);
        bad_hash.password_sha256 = vec!["xyz".into()];
        assert!(Users::new(None, &[bad_hash]).is_err());
    }
}
