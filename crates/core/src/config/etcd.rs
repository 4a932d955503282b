//! Where the etcd metadata service is and how this engine is published there
//! (`EngineConfig::metadata`); `metadata` carries it out, `etcd_access` turns the TLS and
//! password settings into etcd-client's options.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::etcd_access::{EtcdAuth, EtcdTls};

/// Default key prefix of segment records.
pub const DEFAULT_PREFIX: &str = "/ferry/segments/";
/// Default lease TTL. etcd counts leases in whole seconds and enforces a minimum of about
/// 2 s with its default election timeout.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// Settings of the etcd metadata service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// etcd client endpoints, as `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// Prefix of the record keys. Default [`DEFAULT_PREFIX`].
    pub prefix: String,
    /// Lease TTL of this engine's record (whole seconds, at least 1 s; etcd may raise it
    /// to its minimum). Once it expired, peers check this engine directly and declare it
    /// lost only if it does not answer, so it bounds how soon a hung engine is lost.
    /// Default [`DEFAULT_LEASE_TTL`].
    pub lease_ttl: Duration,
    /// Deadline of each etcd request and of connecting. Default 3 s.
    pub connect_timeout: Duration,
    /// This engine's logical segment name; `None` publishes it as `host:port`.
    pub segment_name: Option<String>,
    /// TLS towards etcd; when set every endpoint is dialled as `https://`. An `https://`
    /// endpoint without it uses TLS with the system trust store. Default `None`.
    pub tls: Option<EtcdTls>,
    /// etcd username/password auth. Default `None`.
    pub auth: Option<EtcdAuth>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: DEFAULT_PREFIX.into(),
            lease_ttl: DEFAULT_LEASE_TTL,
            connect_timeout: Duration::from_secs(3),
            segment_name: None,
            tls: None,
            auth: None,
        }
    }
}

impl EtcdConfig {
    /// Settings with the endpoints of `url` and defaults for the rest.
    ///
    /// `url` is `etcd://host:port[,host:port…]`; a plain comma list of `host:port` or
    /// `http://host:port` entries is accepted too (tebench's `--metadata_url_list`).
    ///
    /// # Errors
    /// `InvalidArgument` naming the entry that is not `host:port`.
    pub fn from_url(url: &str) -> Result<Self> {
        Ok(Self {
            endpoints: parse_endpoints(url)?,
            ..Self::default()
        })
    }

    /// The key of segment `name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

/// Parses an etcd endpoint list into `http://host:port` entries (`https://` ones kept).
///
/// # Errors
/// `InvalidArgument` when the list is empty or an entry is not `host:port`.
pub fn parse_endpoints(url: &str) -> Result<Vec<String>> {
    let bad = |why: String| {
        Error::InvalidArgument(format!(
            "metadata URL must be etcd://host:port[,host:port...], got {url:?}: {why}"
        ))
    };
    let list = url.trim();
    let list = list.strip_prefix("etcd://").unwrap_or(list);
    let mut out = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let (scheme, rest) = match entry.strip_prefix("https://") {
            Some(rest) => ("https", rest),
            None => ("http", entry.strip_prefix("http://").unwrap_or(entry)),
        };
        let hostport = rest.trim_end_matches('/');
        if hostport.contains("://") {
            return Err(bad(format!("unsupported scheme in {entry:?}")));
        }
        let Some((host, port)) = hostport.rsplit_once(':') else {
            return Err(bad(format!("{entry:?} has no port")));
        };
        let host_ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._[]:".contains(c));
        if !host_ok {
            return Err(bad(format!("bad host in {entry:?}")));
        }
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(bad(format!("bad port in {entry:?}"))),
        }
        out.push(format!("{scheme}://{hostport}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        assert_eq!(
            parse_endpoints("etcd://127.0.0.1:2379").expect("one"),
            ["http://127.0.0.1:2379"]
        );
        assert_eq!(
            parse_endpoints("etcd://a:1,b.example:2").expect("two"),
            ["http://a:1", "http://b.example:2"]
        );
        assert_eq!(
            parse_endpoints("http://h:5,h2:6").expect("tebench list"),
            ["http://h:5", "http://h2:6"]
        );
        assert_eq!(
            parse_endpoints("https://h:5,h2:6").expect("tls list"),
            ["https://h:5", "http://h2:6"]
        );
        for bad in [
            "",
            "etcd://",
            "etcd://host",
            "etcd://host:0",
            "etcd://host:99999",
            "etcd://:1",
            "ftp://h:1",
            "etcd://a:1,,b:2",
            "etcd://a b:1",
        ] {
            let e = parse_endpoints(bad).expect_err(bad);
            assert_eq!(e.code(), "ERR_FERRY_INVALID_ARGUMENT", "{bad}");
        }
    }
}
