//! TLS material, both ways (rustls with the `ring` provider, no OpenSSL): the server side for
//! clients ([`TlsAcceptorHandle`]: certificate, key and client-certificate policy, rebuilt
//! from the files on demand, e.g. on SIGHUP) and the client side for `rediss://` masters
//! ([`master_client_config`]: the CA that signs them, and our certificate for mutual TLS).
//!
//! Invariants:
//! - Files are read only here, PEM only, and every failure names the file and what is wrong
//!   with it (never its contents: a key file's bytes never reach a log).
//! - A reload that fails keeps the acceptor in use: a bad file on SIGHUP never stops the
//!   proxy from accepting TLS clients, it is logged and the old certificate stays.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use tokio_rustls::rustls::crypto::{ring, CryptoProvider};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Whether TLS clients must present a certificate signed by the CA (Redis' `tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClientCerts {
    /// A client without a valid certificate is refused (Redis' default).
    #[default]
    Yes,
    /// Certificates are not asked for.
    No,
    /// Asked for; a client without one is accepted, one with an invalid one is refused.
    Optional,
}

/// TLS material that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {reason}")]
    File {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("{what} {path} holds no PEM {expected}")]
    Empty {
        what: &'static str,
        path: String,
        expected: &'static str,
    },
    #[error("TLS configuration refused: {0}")]
    Rustls(String),
}

fn file_error(what: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn rustls_error(err: impl std::fmt::Display) -> TlsError {
    TlsError::Rustls(err.to_string())
}

/// Every certificate in a PEM file (a chain: leaf first).
fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|err| file_error(what, path, err))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| file_error(what, path, err))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.display().to_string(),
            expected: "certificate",
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
fn load_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|err| match err {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what,
            path: path.display().to_string(),
            expected: "private key",
        },
        err => file_error(what, path, err),
    })
}

/// The CA certificates of a PEM file as a trust store.
fn load_roots(what: &'static str, path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(what, path)? {
        roots.add(cert).map_err(|err| file_error(what, path, err))?;
    }
    Ok(Arc::new(roots))
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Where the listener's TLS material comes from (Redis' `tls-*` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA of the client certificates; needed unless `client_certs` is [`ClientCerts::No`].
    pub ca: Option<PathBuf>,
    pub client_certs: ClientCerts,
}

impl ServerTlsFiles {
    /// Reads the files and builds the server configuration.
    fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let certs = load_certs("tls_cert_file (--tls-cert-file)", &self.cert)?;
        let key = load_key("tls_key_file (--tls-key-file)", &self.key)?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(rustls_error)?;
        let builder = match (self.client_certs, &self.ca) {
            (ClientCerts::No, _) => builder.with_no_client_auth(),
            (_, None) => {
                return Err(TlsError::Rustls(
                    "tls-auth-clients yes|optional needs tls-ca-cert-file".into(),
                ))
            }
            (mode, Some(ca)) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(
                    load_roots("tls_ca_cert_file (--tls-ca-cert-file)", ca)?,
                    provider(),
                );
                let verifier = if mode == ClientCerts::Optional {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(verifier.build().map_err(rustls_error)?)
            }
        };
        let config = builder.with_single_cert(certs, key).map_err(rustls_error)?;
        Ok(Arc::new(config))
    }
}

/// The acceptor of the TLS listener, shared by the accept loop and whoever reloads it.
/// Cloning shares it: a [`TlsAcceptorHandle::reload`] is seen by every clone.
#[derive(Clone)]
pub struct TlsAcceptorHandle {
    files: Arc<ServerTlsFiles>,
    current: Arc<RwLock<TlsAcceptor>>,
}

impl std::fmt::Debug for TlsAcceptorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptorHandle")
            .field("files", &self.files)
            .finish()
    }
}

impl TlsAcceptorHandle {
    /// Reads the files once; an error here is a configuration error (the proxy does not start).
    pub fn load(files: ServerTlsFiles) -> Result<TlsAcceptorHandle, TlsError> {
        let acceptor = TlsAcceptor::from(files.server_config()?);
        Ok(TlsAcceptorHandle {
            files: Arc::new(files),
            current: Arc::new(RwLock::new(acceptor)),
        })
    }

    /// Reads the files again and uses what they hold for every handshake from now on (those
    /// in progress finish with the old material). On error the old acceptor stays, and the
    /// reason is logged and returned.
    pub fn reload(&self) -> Result<(), TlsError> {
        match self.files.server_config() {
            Ok(config) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) =
                    TlsAcceptor::from(config);
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
                Ok(())
            }
            Err(err) => {
                tracing::error!(error = %err, "TLS reload failed; keeping the certificate in use");
                Err(err)
            }
        }
    }

    /// The acceptor for the next handshake.
    pub fn acceptor(&self) -> TlsAcceptor {
        // A poisoned lock still holds a whole acceptor: replacing it is one assignment.
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Where the TLS material for `rediss://` masters comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MasterTlsFiles {
    /// CA that signs the masters' certificates.
    pub ca: Option<PathBuf>,
    /// Our certificate and key, for masters that ask for one (mutual TLS).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// The connector for `rediss://` masters.
pub fn master_client_config(files: &MasterTlsFiles) -> Result<TlsConnector, TlsError> {
    let Some(ca) = &files.ca else {
        return Err(TlsError::Rustls(
            "rediss:// masters need backend-tls-ca-cert-file (the CA that signs their certificates)"
                .into(),
        ));
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(rustls_error)?
        .with_root_certificates(load_roots(
            "backend_tls_ca_cert_file (--backend-tls-ca-cert-file)",
            ca,
        )?);
    let config = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => builder
            .with_client_auth_cert(
                load_certs("backend_tls_cert_file (--backend-tls-cert-file)", cert)?,
                load_key("backend_tls_key_file (--backend-tls-key-file)", key)?,
            )
            .map_err(rustls_error)?,
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(TlsError::Rustls(
                "backend-tls-cert-file and backend-tls-key-file go together".into(),
            ))
        }
    };
    Ok(TlsConnector::from(Arc::new(config)))
}
