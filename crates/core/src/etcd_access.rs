//! How an engine reaches a secured etcd: TLS (a CA to verify the server, a client
//! certificate for etcd's `--client-cert-auth`) and etcd's username/password auth.
//!
//! Both go through etcd-client's own support (rustls with ring, so no system TLS library;
//! the system trust store when no CA is given). This module holds the settings, reads them
//! from files, turns them into etcd-client's `ConnectOptions`, and explains connection
//! failures: a TLS or auth rejection names its cause rather than surfacing as a timeout.

use std::fmt;
use std::path::Path;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

use crate::error::{Error, Result};

/// TLS towards etcd. Set on [`crate::EtcdConfig::tls`], it makes every endpoint `https://`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM certificate(s) of the CA that signed etcd's server certificate; `None` trusts
    /// the system store.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate chain and private key, presented to an etcd started with
    /// `--client-cert-auth`.
    pub identity: Option<EtcdIdentity>,
    /// Name the server certificate must carry; `None` checks the endpoint's host.
    pub server_name: Option<String>,
}

/// A client certificate and its key (PEM). The key never appears in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdIdentity {
    /// PEM certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

/// etcd username/password auth. The password never appears in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// etcd user name.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca", &self.ca_pem.as_ref().map(|_| "<pem>"))
            .field("identity", &self.identity)
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl fmt::Debug for EtcdIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EtcdIdentity(<cert>, <key redacted>)")
    }
}

impl fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Reads `path` for the option named `what`.
///
/// # Errors
/// `InvalidArgument` naming the option and the path when it cannot be read or is empty.
fn read_file(what: &str, path: &Path) -> Result<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) if b.iter().all(u8::is_ascii_whitespace) => Err(Error::InvalidArgument(format!(
            "{what} {} is empty",
            path.display()
        ))),
        Ok(b) => Ok(b),
        Err(e) => Err(Error::InvalidArgument(format!(
            "cannot read {what} {}: {e}",
            path.display()
        ))),
    }
}

impl EtcdTls {
    /// TLS settings from PEM files: `ca` for the server's CA (`None`: the system store),
    /// `cert` and `key` for a client certificate (both or neither).
    ///
    /// # Errors
    /// `InvalidArgument` when a file cannot be read or only one of `cert` and `key` is given.
    pub fn from_files(ca: Option<&Path>, cert: Option<&Path>, key: Option<&Path>) -> Result<Self> {
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some(EtcdIdentity {
                cert_pem: read_file("etcd client certificate", c)?,
                key_pem: read_file("etcd client key", k)?,
            }),
            (None, None) => None,
            _ => {
                return Err(Error::InvalidArgument(
                    "an etcd client certificate needs both its certificate and its key file".into(),
                ))
            }
        };
        Ok(Self {
            ca_pem: ca.map(|p| read_file("etcd CA file", p)).transpose()?,
            identity,
            server_name: None,
        })
    }

    fn options(&self) -> TlsOptions {
        let mut tls = TlsOptions::new();
        tls = match &self.ca_pem {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
            None => tls.with_native_roots(),
        };
        if let Some(id) = &self.identity {
            tls = tls.identity(Identity::from_pem(&id.cert_pem, &id.key_pem));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name.clone());
        }
        tls
    }
}

impl EtcdAuth {
    /// Auth with the password read from `path` (one line; a trailing newline is dropped),
    /// so it never has to appear on a command line.
    ///
    /// # Errors
    /// `InvalidArgument` when the file cannot be read, is empty or is not UTF-8.
    pub fn with_password_file(user: &str, path: &Path) -> Result<Self> {
        let bytes = read_file("etcd password file", path)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            Error::InvalidArgument(format!(
                "etcd password file {} is not UTF-8",
                path.display()
            ))
        })?;
        Self::new(user, text.trim_end_matches(['\r', '\n']))
    }

    /// Auth for `user` with `password`.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty user or password.
    pub fn new(user: &str, password: &str) -> Result<Self> {
        if user.is_empty() || password.is_empty() {
            return Err(Error::InvalidArgument(
                "etcd auth needs a non-empty user and password".into(),
            ));
        }
        Ok(Self {
            user: user.into(),
            password: password.into(),
        })
    }
}

/// The endpoints to dial and the TLS/auth part of the connect options. TLS is on when
/// `tls` is set or any endpoint is `https://` (then with the system store); it then
/// applies to every endpoint, so a plain-text fallback cannot happen.
pub(crate) fn secure(
    endpoints: &[String],
    tls: Option<&EtcdTls>,
    auth: Option<&EtcdAuth>,
    mut options: ConnectOptions,
) -> (Vec<String>, ConnectOptions) {
    let on = tls.is_some() || endpoints.iter().any(|e| e.starts_with("https://"));
    let endpoints = if on {
        let default = EtcdTls::default();
        options = options.with_tls(tls.unwrap_or(&default).options());
        endpoints
            .iter()
            .map(|e| {
                let host = e
                    .strip_prefix("http://")
                    .or_else(|| e.strip_prefix("https://"))
                    .unwrap_or(e);
                format!("https://{host}")
            })
            .collect()
    } else {
        endpoints.to_vec()
    };
    if let Some(a) = auth {
        options = options.with_user(a.user.clone(), a.password.clone());
    }
    (endpoints, options)
}

/// The error of a failed connect (TLS handshake, authentication), with its cause chain and,
/// where the cause is only that etcd hung up, what usually explains it.
pub(crate) fn connect_failed(
    endpoints: &[String],
    tls_config: Option<&EtcdTls>,
    e: &etcd_client::Error,
) -> Error {
    let mut why = describe(e);
    let tls = endpoints.iter().any(|e| e.starts_with("https://"));
    // How hyper and the OS word a peer that hung up; which one depends on timing, and
    // some arrive as Debug text (`Kind(ConnectionReset)`).
    let text = why.to_lowercase().replace(' ', "");
    let closed = [
        "connectionclosed",
        "canceled",
        "brokenpipe",
        "connectionreset",
    ]
    .iter()
    .any(|w| text.contains(w));
    if closed && !tls {
        why.push_str(
            " (etcd closed the connection: if it serves TLS, set a CA file or use https:// endpoints)",
        );
    } else if closed && tls_config.is_none_or(|t| t.identity.is_none()) {
        why.push_str(
            " (etcd closed the connection after the TLS handshake: if it requires client \
             certificates (--client-cert-auth), set a client certificate and key)",
        );
    }
    Error::Metadata(format!(
        "cannot connect to etcd at {}: {why}",
        endpoints.join(",")
    ))
}

/// The full cause chain of an etcd-client error: tonic's top level says only "transport
/// error", the reason (unknown CA, certificate required, bad password) is in its sources.
pub(crate) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_makes_every_endpoint_https() {
        let eps = ["http://a:1".to_string(), "http://b:2".to_string()];
        let (plain, _) = secure(&eps, None, None, ConnectOptions::new());
        assert_eq!(plain, eps);
        let tls = EtcdTls::default();
        let (secured, _) = secure(&eps, Some(&tls), None, ConnectOptions::new());
        assert_eq!(secured, ["https://a:1", "https://b:2"]);
        let mixed = ["http://a:1".to_string(), "https://b:2".to_string()];
        let (secured, _) = secure(&mixed, None, None, ConnectOptions::new());
        assert_eq!(secured, ["https://a:1", "https://b:2"]);
    }

    #[test]
    fn a_hang_up_in_any_wording_gets_the_hint() {
        let plain = ["http://127.0.0.1:1".to_string()];
        for why in [
            "hyper::Error(Canceled, \"connection closed\")",
            "hyper::Error(Io, Kind(ConnectionReset))",
            "Custom { kind: BrokenPipe, error: \"stream closed because of a broken pipe\" }",
        ] {
            let e = etcd_client::Error::InvalidArgs(why.into());
            let text = connect_failed(&plain, None, &e).to_string();
            assert!(text.contains("set a CA file"), "{text}");
        }
        let e = etcd_client::Error::InvalidArgs("invalid user ID or password".into());
        let text = connect_failed(&plain, None, &e).to_string();
        assert!(!text.contains("set a CA file"), "{text}");
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let auth = EtcdAuth::new("ferry", "hunter2-secret").expect("auth");
        let tls = EtcdTls {
            identity: Some(EtcdIdentity {
                cert_pem: b"CERT".to_vec(),
                key_pem: b"PRIVATE-KEY-BYTES".to_vec(),
            }),
            ..EtcdTls::default()
        };
        let text = format!("{auth:?} {tls:?}");
        assert!(text.contains("ferry"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!text.contains("PRIVATE-KEY"), "{text}");
    }

    #[test]
    fn files_are_checked() {
        let dir = std::env::temp_dir().join(format!("ferry-etcd-access-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let pw = dir.join("pw");
        std::fs::write(&pw, "s3cret\n").expect("write");
        let auth = EtcdAuth::with_password_file("u", &pw).expect("password file");
        assert_eq!(auth.password, "s3cret");
        std::fs::write(&pw, "\n").expect("write");
        let e = EtcdAuth::with_password_file("u", &pw).expect_err("empty");
        assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT");
        let missing = dir.join("missing.pem");
        let e = EtcdTls::from_files(Some(&missing), None, None).expect_err("missing CA");
        assert!(e.to_string().contains("missing.pem"), "{e}");
        let e = EtcdTls::from_files(None, Some(&pw), None).expect_err("cert without key");
        assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
