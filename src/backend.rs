//! A master as configured ([`Backend`]): `host:port`, `redis://[user:password@]host:port` or
//! `rediss://…` (TLS), from the configuration file or the `--backend` flags. Pure: no I/O;
//! [`crate::dial`] connects to it.
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
    pub host: String,
    pub port: u16,
    /// `rediss://`: TLS to the master.
    pub tls: bool,
    pub user: Option<String>,
    pub password: Option<Secret>,
}

/// An address that is not `host:port` or a `redis://`/`rediss://` URL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid master address '{shown}': {reason} (expected HOST:PORT, redis://[USER:PASSWORD@]HOST:PORT or rediss://…)")]
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
        let (tls, rest) = match text.split_once("://") {
            None => (false, text),
            Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
                "redis" => (false, rest),
                "rediss" => (true, rest),
                _ => return Err(fail("the scheme must be redis:// or rediss://")),
            },
        };
        // A trailing `/` or `/0` (the database) is accepted: the proxy only uses db 0.
        let rest = match rest.split_once('/') {
            Some((authority, "" | "0")) => authority,
            Some(_) => return Err(fail("only database 0 can be used")),
            None => rest,
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
        let (host, port) = hostport
            .rsplit_once(':')
            .ok_or_else(|| fail("the port is missing"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(fail("the host is missing"));
        }
        let port = port.parse().map_err(|_| fail("the port is not a number"))?;
        Ok(Backend {
            host: host.to_string(),
            port,
            tls,
            user,
            password,
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
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if !self.tls && self.user.is_none() && self.password.is_none() {
            return write!(f, "{host}:{}", self.port);
        }
        let scheme = if self.tls { "rediss" } else { "redis" };
        write!(f, "{scheme}://")?;
        match (&self.user, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, Some(_)) => write!(f, ":***@")?,
            (None, None) => {}
        }
        write!(f, "{host}:{}", self.port)
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
        for bad in [
            "localhost",
            "http://h:1",
            "redis://h:port",
            "redis://:1",
            "redis://h:1/3",
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
