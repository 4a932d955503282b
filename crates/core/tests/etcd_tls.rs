//! Cluster mode against a real etcd started with TLS, client-certificate auth and
//! username/password auth, with certificates made here: the right CA, certificate and
//! password work; a wrong CA, no client certificate, no TLS or a wrong password each fail
//! engine start with `ERR_FERRY_METADATA` naming the cause.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Identity, Permission, TlsOptions};
use ferry_core::{Engine, EngineConfig, EtcdAuth, EtcdConfig, EtcdTls, TransportKind};
use ferry_testkit::{etcd_healthy, skip_without_etcd, spawn_etcd, within};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

const USER: &str = "ferry";
const PASSWORD: &str = "correct horse battery staple";

/// A CA and what it signed, as PEM.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let pem = params.self_signed(&key).expect("CA cert").pem();
    (params, key, pem)
}

fn leaf(issuer: &Issuer<'_, KeyPair>, sans: &[&str], cn: &str) -> (String, String) {
    let key = KeyPair::generate().expect("leaf key");
    let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(sans).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, cn);
    let cert = params.signed_by(&key, issuer).expect("leaf cert");
    (cert.pem(), key.serialize_pem())
}

fn pki() -> Pki {
    let (params, key, ca) = ca("ferry test CA");
    let issuer = Issuer::new(params, key);
    Pki {
        ca,
        server: leaf(&issuer, &["127.0.0.1", "localhost"], "etcd"),
        // Not an etcd user: with auth on, etcd would take a certificate's CN as the user
        // when no password token is sent.
        client: leaf(&issuer, &[], "ferry-client"),
    }
}

/// A single-member etcd serving clients over TLS with `--client-cert-auth`; health is read
/// over plain http on a separate metrics port. Killed by pid and its directory removed on
/// drop.
struct TlsEtcd {
    child: Child,
    dir: PathBuf,
    client_port: u16,
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write pem");
    p
}

impl TlsEtcd {
    fn start(pki: &Pki) -> Self {
        let dir = std::env::temp_dir().join(format!("ferry-etcd-tls-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd temp dir");
        let ca = write(&dir, "ca.pem", &pki.ca);
        let cert = write(&dir, "server.pem", &pki.server.0);
        let key = write(&dir, "server.key", &pki.server.1);
        let (client_port, peer_port, metrics_port) = (
            ferry_testkit::unused_port(),
            ferry_testkit::unused_port(),
            ferry_testkit::unused_port(),
        );
        let client = format!("https://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
        let tls = [
            format!("--listen-metrics-urls=http://127.0.0.1:{metrics_port}"),
            format!("--cert-file={}", cert.display()),
            format!("--key-file={}", key.display()),
            format!("--trusted-ca-file={}", ca.display()),
            "--client-cert-auth".to_string(),
        ];
        let data = dir.join("data");
        let child = spawn_etcd("ferry-tls", &data, &client, &peer, &tls, log);
        let mut etcd = Self {
            child,
            dir,
            client_port,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !etcd_healthy(metrics_port) {
            if let Ok(Some(status)) = etcd.child.try_wait() {
                panic!(
                    "etcd exited with {status}; log:\n{}",
                    std::fs::read_to_string(etcd.dir.join("etcd.log")).unwrap_or_default()
                );
            }
            assert!(Instant::now() < deadline, "etcd not ready within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.client_port)
    }
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Turns on etcd auth: a root user, and a `ferry` user that may only read and write the
/// segment records' prefix (what an operator would grant an engine).
fn enable_auth(pki: &Pki, port: u16) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tls = TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&pki.ca))
            .identity(Identity::from_pem(&pki.client.0, &pki.client.1));
        let opts = ConnectOptions::new()
            .with_tls(tls)
            .with_timeout(Duration::from_secs(5));
        let mut c = Client::connect([format!("https://127.0.0.1:{port}")], Some(opts))
            .await
            .expect("admin connect");
        c.user_add("root", "root-password", None)
            .await
            .expect("root");
        c.user_grant_role("root", "root").await.expect("root role");
        c.user_add(USER, PASSWORD, None).await.expect("user");
        c.role_add("ferry-engine").await.expect("role");
        c.role_grant_permission(
            "ferry-engine",
            Permission::read_write("/ferry/").with_prefix(),
        )
        .await
        .expect("permission");
        c.user_grant_role(USER, "ferry-engine")
            .await
            .expect("grant");
        c.auth_enable().await.expect("auth enable");
    });
}

fn config(
    url: &str,
    name: Option<&str>,
    tls: Option<EtcdTls>,
    auth: Option<EtcdAuth>,
) -> EngineConfig {
    EngineConfig {
        transports: vec![TransportKind::Tcp],
        metadata: Some(EtcdConfig {
            segment_name: name.map(str::to_string),
            connect_timeout: Duration::from_secs(2),
            tls,
            auth,
            ..EtcdConfig::from_url(url).expect("url")
        }),
        ..EngineConfig::default()
    }
}

fn tls(ca: &str, client: Option<&(String, String)>) -> EtcdTls {
    EtcdTls {
        ca_pem: Some(ca.as_bytes().to_vec()),
        identity: client.map(|(cert, key)| ferry_core::EtcdIdentity {
            cert_pem: cert.as_bytes().to_vec(),
            key_pem: key.as_bytes().to_vec(),
        }),
        server_name: None,
    }
}

fn auth(password: &str) -> Option<EtcdAuth> {
    Some(EtcdAuth::new(USER, password).expect("auth"))
}

/// Engine start fails with `ERR_FERRY_METADATA`, the message containing one of `causes`.
fn refused(cfg: EngineConfig, causes: &[&str]) {
    let err = Engine::new(cfg).expect_err("engine start must fail");
    assert_eq!(err.code(), "ERR_FERRY_METADATA", "{err}");
    let text = err.to_string().to_lowercase();
    assert!(
        causes.iter().any(|c| text.contains(c)),
        "message names none of {causes:?}: {err}"
    );
}

#[test]
fn tls_and_password_auth_against_a_real_etcd() {
    skip_without_etcd!();
    let pki = pki();
    let etcd = TlsEtcd::start(&pki);
    enable_auth(&pki, etcd.client_port);
    let url = etcd.url();
    within(Duration::from_secs(60), "tls etcd cases", move || {
        let good = || tls(&pki.ca, Some(&pki.client));
        // Right CA, certificate and password: publish, then open by name over the TLS link.
        let target = Engine::new(config(
            &url,
            Some("tls-target"),
            Some(good()),
            auth(PASSWORD),
        ))
        .expect("target with the right CA, certificate and password");
        let initiator =
            Engine::new(config(&url, None, Some(good()), auth(PASSWORD))).expect("initiator");
        let seg = initiator
            .open_segment_blocking("tls-target")
            .expect("open by name through the secured etcd");
        assert_eq!(seg.engine_id, target.engine_id());

        // A CA that did not sign etcd's certificate.
        let (_, _, other_ca) = ca("some other CA");
        refused(
            config(
                &url,
                None,
                Some(tls(&other_ca, Some(&pki.client))),
                auth(PASSWORD),
            ),
            &["invalid peer certificate: unknownissuer"],
        );
        // No client certificate while etcd requires one. Under TLS 1.3 the server's alert
        // races its close: the client sees the alert or a closed connection (with a hint).
        refused(
            config(&url, None, Some(tls(&pki.ca, None)), auth(PASSWORD)),
            &[
                "badcertificate",
                "certificaterequired",
                "set a client certificate and key",
            ],
        );
        // The right TLS settings, a wrong password.
        refused(
            config(&url, None, Some(good()), auth("wrong password")),
            &["authentication failed", "invalid user id or password"],
        );
        // Plain text against the TLS port.
        refused(
            config(&url, None, None, auth(PASSWORD)),
            &["if it serves tls, set a ca file"],
        );

        initiator.close();
        target.close();
    });
}
