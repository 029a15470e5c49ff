//! How the proxy reaches one master: the [`Connect`] that opens a TCP or TLS stream to a
//! [`Backend`] and authenticates before anything else goes on it ([`Dial`]).
//!
//! Invariants:
//! - A password goes on the wire in `AUTH` only, and is printed nowhere ([`Backend`] and
//!   [`Secret`] print it as `***` and `<redacted>`).
//! - Every connection, first or re-made, sends `AUTH` first when the master has credentials,
//!   and is handed to the transport only once the master said `OK`. A refusal is a
//!   connection failure carrying the master's own error text ([`AuthRefused`]), which the
//!   transport keeps for `INFO` (`state=auth_failed`): the master is unreachable, so it takes
//!   no part in any quorum, and is tried again on the transport's backoff (it recovers as
//!   soon as the master accepts the credentials again).
//! - A password that is not in the address comes from the environment variable
//!   [`PASSWORD_ENV`], read when the proxy starts.

use crate::backend::Backend;
use crate::protocol::{decode_reply, encode_command, Reply};
use crate::secret::Secret;
use crate::transport::{AuthRefused, Connect, ReadHalf, WriteHalf};
use bytes::BytesMut;
use futures::future::BoxFuture;
use rustls_pki_types::ServerName;
use std::io;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// The environment variable that gives the masters' password when their address has none.
pub const PASSWORD_ENV: &str = "REDLOCK_PROXY_BACKEND_PASSWORD";

/// Most bytes of a master's answer to `AUTH` read before giving up on it.
const AUTH_REPLY_MAX: usize = 4096;

/// What to send before anything else on every connection: `AUTH [user] password`.
#[derive(Clone)]
struct Credentials {
    user: Option<String>,
    password: Secret,
}

/// TLS to a master: the connector and the name its certificate must carry, or why there is
/// none (TLS material that could not be loaded).
type MasterTls = Result<(TlsConnector, ServerName<'static>), String>;

/// Opens connections to one master: TCP (Nagle off), TLS for `rediss://`, then `AUTH`.
pub struct Dial {
    host: String,
    port: u16,
    tls: Option<MasterTls>,
    credentials: Option<Credentials>,
}

impl Dial {
    /// How to reach `backend`: `tls` is the connector for `rediss://` masters (or why it could
    /// not be built), `env_password` the password for addresses without one.
    pub fn new(
        backend: &Backend,
        tls: Option<&Result<TlsConnector, String>>,
        env_password: Option<&Secret>,
    ) -> Dial {
        let tls = backend.tls.then(|| {
            let connector = match tls {
                Some(Ok(connector)) => connector.clone(),
                Some(Err(why)) => return Err(why.clone()),
                None => return Err("rediss:// needs backend-tls-ca-cert-file".to_string()),
            };
            let name = ServerName::try_from(backend.host.clone())
                .map_err(|_| format!("'{}' is not a valid TLS server name", backend.host))?;
            Ok((connector, name))
        });
        let password = backend.password.as_ref().or(env_password).cloned();
        Dial {
            host: backend.host.clone(),
            port: backend.port,
            tls,
            credentials: password.map(|password| Credentials {
                user: backend.user.clone(),
                password,
            }),
        }
    }
}

impl Connect for Dial {
    fn connect(&self) -> BoxFuture<'static, io::Result<(ReadHalf, WriteHalf)>> {
        let (host, port) = (self.host.clone(), self.port);
        let tls = self.tls.clone();
        let credentials = self.credentials.clone();
        Box::pin(async move {
            let tls = tls.transpose().map_err(io::Error::other)?;
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            match tls {
                None => {
                    let (mut rd, mut wr) = stream.into_split();
                    authenticate(&mut rd, &mut wr, credentials.as_ref()).await?;
                    Ok((Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf))
                }
                Some((connector, name)) => {
                    let stream = connector.connect(name, stream).await?;
                    let (mut rd, mut wr) = tokio::io::split(stream);
                    authenticate(&mut rd, &mut wr, credentials.as_ref()).await?;
                    Ok((Box::new(rd) as ReadHalf, Box::new(wr) as WriteHalf))
                }
            }
        })
    }
}

/// Sends `AUTH` and waits for `OK`; a refusal is an [`AuthRefused`] error.
async fn authenticate(
    rd: &mut (impl AsyncRead + Unpin),
    wr: &mut (impl AsyncWrite + Unpin),
    credentials: Option<&Credentials>,
) -> io::Result<()> {
    let Some(credentials) = credentials else {
        return Ok(());
    };
    let password = credentials.password.expose();
    let command = match &credentials.user {
        Some(user) => encode_command(&["AUTH", user, password]),
        None => encode_command(&["AUTH", password]),
    };
    wr.write_all(&command).await?;
    let mut buf = BytesMut::with_capacity(256);
    let reply = loop {
        if let Some(reply) = decode_reply(&mut buf).map_err(io::Error::other)? {
            break reply;
        }
        if buf.len() > AUTH_REPLY_MAX || rd.read_buf(&mut buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    };
    match reply {
        Reply::Simple(ok) if ok.as_ref() == b"OK" => Ok(()),
        Reply::Error(text) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            AuthRefused(String::from_utf8_lossy(&text).replace(',', ";")),
        )),
        other => Err(io::Error::other(format!(
            "unexpected answer to AUTH: {other:?}"
        ))),
    }
}
