//! A master as configured ([`Backend`]): `host:port`, `redis://[user:password@]host:port`,
//! `rediss://…` (TLS), `sentinel://[user:password@]host:port[,host:port…]/name` (the primary
//! of a Sentinel-managed group, found by asking the sentinels), or
//! `cluster://[user:password@]host:port[,host:port…]` (`clusters://` with TLS: a Redis Cluster
//! found from these seed nodes, issue 26), from the configuration file or the `--backend`
//! flags. Pure: no I/O; [`crate::dial`] connects to it.
//!
//! Invariant: a password never leaves this module in text: [`Backend`]'s `Display` and `Debug`
//! show `***` in its place ([`Secret`] itself prints as `<redacted>`), and so do the config's
//! `Debug`, logs and `INFO` (which print it); so does a [`BackendError`], which quotes the
//! address.

use crate::secret::Secret;
use percent_encoding::percent_decode_str;
use serde::Deserialize;
use std::fmt;
use std::str::FromStr;

/// One master as configured.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Backend {
    /// The master's address; for a Sentinel group, its first sentinel's.
    pub host: String,
    pub port: u16,
    /// `rediss://`: TLS to the master.
    pub tls: bool,
    pub user: Option<String>,
    pub password: Option<Secret>,
    /// `sentinel://`: the master is whichever server these sentinels name the primary of.
    pub sentinel: Option<SentinelGroup>,
    /// `cluster://`: the master is the Redis Cluster these seed nodes belong to (the first is
    /// also `host`/`port`).
    pub cluster: Option<Vec<(String, u16)>>,
}

/// A master group watched by Redis Sentinel: the sentinels to ask, in order, and the group's
/// name (`sentinel monitor <name> …`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelGroup {
    pub sentinels: Vec<(String, u16)>,
    pub name: String,
}

/// An address that is not `host:port` or a `redis://`/`rediss://` URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid master address '{shown}': {reason} (expected HOST:PORT, redis://[USER:PASSWORD@]HOST:PORT, rediss://… or sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]/NAME)")]
pub struct BackendError {
    /// The address with any password blanked out.
    shown: String,
    reason: &'static str,
}

impl FromStr for Backend {
    type Err = BackendError;

    fn from_str(text: &str) -> Result<Backend, BackendError> {
        let fail = |reason| BackendError {
            shown: blank_password(text),
            reason,
        };
        let (tls, sentinel, cluster, rest) = match text.split_once("://") {
            None => (false, false, false, text),
            Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
                "redis" => (false, false, false, rest),
                "rediss" => (true, false, false, rest),
                "sentinel" => (false, true, false, rest),
                "cluster" => (false, false, true, rest),
                "clusters" => (true, false, true, rest),
                _ => {
                    return Err(fail(
                        "the scheme must be redis://, rediss://, sentinel://, cluster:// or clusters://",
                    ))
                }
            },
        };
        let (rest, group) = match (sentinel, rest.split_once('/')) {
            (true, Some((authority, name))) if !name.is_empty() && !name.contains('/') => {
                (authority, Some(name))
            }
            (true, _) => return Err(fail("a sentinel:// address ends with /NAME, the group")),
            // A trailing `/` or `/0` (the database) is accepted: the proxy only uses db 0.
            (false, Some((authority, "" | "0"))) => (authority, None),
            (false, Some(_)) => return Err(fail("only database 0 can be used")),
            (false, None) => (rest, None),
        };
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((userinfo, hostport)) => (Some(userinfo), hostport),
            None => (None, rest),
        };
        let decode = |s: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| fail("user and password must be UTF-8 once percent-decoded"))
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => match userinfo.split_once(':') {
                // `redis://:password@host` (no user) is the `AUTH password` form.
                Some((user, password)) => (
                    Some(decode(user)?).filter(|u| !u.is_empty()),
                    Some(Secret::new(decode(password)?)),
                ),
                None => (Some(decode(userinfo)?).filter(|u| !u.is_empty()), None),
            },
        };
        let parse_address = |address: &str| {
            let (host, port) = address
                .rsplit_once(':')
                .ok_or_else(|| fail("the port is missing"))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(fail("the host is missing"));
            }
            let port: u16 = port.parse().map_err(|_| fail("the port is not a number"))?;
            Ok((host.to_string(), port))
        };
        let addresses = match group.is_some() || cluster {
            true => hostport.split(',').map(parse_address).collect(),
            false => parse_address(hostport).map(|address| vec![address]),
        }?;
        let (host, port) = addresses[0].clone();
        Ok(Backend {
            host,
            port,
            tls,
            user,
            password,
            sentinel: group.map(|name| SentinelGroup {
                sentinels: addresses.clone(),
                name: name.to_string(),
            }),
            cluster: cluster.then_some(addresses),
        })
    }
}

impl Backend {
    /// A master at `host:port` over plain TCP without credentials (`--local` masters).
    pub fn plain(host: &str, port: u16) -> Backend {
        Backend {
            host: host.to_string(),
            port,
            tls: false,
            user: None,
            password: None,
            sentinel: None,
            cluster: None,
        }
    }
}

impl TryFrom<String> for Backend {
    type Error = BackendError;
    fn try_from(text: String) -> Result<Backend, BackendError> {
        text.parse()
    }
}

/// `text` with the password of a `scheme://user:password@…` address replaced by `***`.
fn blank_password(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_string();
    };
    match rest.rsplit_once('@') {
        Some((userinfo, hostport)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{hostport}"),
            None => text.to_string(),
        },
        None => text.to_string(),
    }
}

/// `host:port` for a plain master without credentials (as always); otherwise the URL with the
/// password as `***`.
impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let address = |host: &str, port: u16| match host.contains(':') {
            true => format!("[{host}]:{port}"),
            false => format!("{host}:{port}"),
        };
        let plain = !self.tls && self.sentinel.is_none() && self.cluster.is_none();
        if plain && self.user.is_none() && self.password.is_none() {
            return f.write_str(&address(&self.host, self.port));
        }
        let scheme = match (&self.sentinel, &self.cluster, self.tls) {
            (Some(_), _, _) => "sentinel",
            (None, Some(_), true) => "clusters",
            (None, Some(_), false) => "cluster",
            (None, None, true) => "rediss",
            (None, None, false) => "redis",
        };
        write!(f, "{scheme}://")?;
        match (&self.user, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, Some(_)) => write!(f, ":***@")?,
            (None, None) => {}
        }
        let list = |addresses: &[(String, u16)]| {
            let shown: Vec<String> = addresses.iter().map(|(h, p)| address(h, *p)).collect();
            shown.join(",")
        };
        match (&self.sentinel, &self.cluster) {
            (Some(group), _) => write!(f, "{}/{}", list(&group.sentinels), group.name),
            (None, Some(seeds)) => f.write_str(&list(seeds)),
            (None, None) => f.write_str(&address(&self.host, self.port)),
        }
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Backend {
        text.parse().unwrap()
    }

    #[test]
    fn addresses_and_urls_parse_with_percent_decoding() {
        let plain = parse("127.0.0.1:6379");
        assert_eq!(
            (plain.host.as_str(), plain.port, plain.tls),
            ("127.0.0.1", 6379, false)
        );
        assert!(plain.user.is_none() && plain.password.is_none());
        let url = parse("rediss://locker:p%40ss%3Aw0rd@redis.example:6380/0");
        assert_eq!(url.host, "redis.example");
        assert_eq!((url.port, url.tls), (6380, true));
        assert_eq!(url.user.as_deref(), Some("locker"));
        assert_eq!(url.password.as_ref().map(Secret::expose), Some("p@ss:w0rd"));
        let no_user = parse("redis://:secret@[::1]:7000");
        assert_eq!((no_user.host.as_str(), no_user.user), ("::1", None));
        assert_eq!(no_user.password, Some(Secret::new("secret".into())));
        let group = parse("sentinel://:pw@s1:26379,[::1]:26380/locks");
        let sentinels = vec![("s1".to_string(), 26379), ("::1".to_string(), 26380)];
        assert_eq!(
            group.sentinel,
            Some(SentinelGroup {
                sentinels,
                name: "locks".into()
            })
        );
        assert_eq!(group.password, Some(Secret::new("pw".into())));
        assert_eq!(
            group.to_string(),
            "sentinel://:***@s1:26379,[::1]:26380/locks"
        );
        let cluster = parse("cluster://locker:pw@10.0.0.1:7000,10.0.0.2:7000");
        let seeds = vec![
            ("10.0.0.1".to_string(), 7000),
            ("10.0.0.2".to_string(), 7000),
        ];
        assert_eq!(cluster.cluster.as_ref(), Some(&seeds));
        assert_eq!((cluster.host.as_str(), cluster.port), ("10.0.0.1", 7000));
        assert_eq!(
            cluster.to_string(),
            "cluster://locker:***@10.0.0.1:7000,10.0.0.2:7000"
        );
        let tls = parse("clusters://h:7000");
        assert!(tls.tls && tls.cluster.is_some());
        assert_eq!(tls.to_string(), "clusters://h:7000");
        for bad in [
            "cluster://h",
            "cluster://h:1,",
            "cluster://h:1/2",
            "localhost",
            "http://h:1",
            "redis://h:port",
            "redis://:1",
            "redis://h:1/3",
            "sentinel://h:1",
            "sentinel://h:1/",
            "sentinel://h:1,h/g",
            "sentinel://h:1/a/b",
        ] {
            assert!(bad.parse::<Backend>().is_err(), "{bad}");
        }
    }

    #[test]
    fn passwords_never_print() {
        let url = parse("redis://locker:hunter2@h:1");
        for shown in [
            url.to_string(),
            format!("{url:?}"),
            format!("{:?}", vec![url.clone()]),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("locker:***@h:1"), "{shown}");
        }
        assert_eq!(parse("h:1").to_string(), "h:1");
        assert_eq!(parse("rediss://h:1").to_string(), "rediss://h:1");
        let err = "redis://u:hunter2@h:x".parse::<Backend>().unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.to_string().contains("u:***@h:x"), "{err}");
    }
}
