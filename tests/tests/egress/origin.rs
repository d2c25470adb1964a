//! The egress suite's origins: static files over HTTPS (a test CA's certificate for the test
//! names, served with rustls) and over plain HTTP, on `127.0.0.1` and a port of the kernel's
//! choosing, each recording every connection and request it saw; and bare canary listeners
//! that only count connections. Everything runs on the test's tokio runtime and stops when
//! dropped.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A test CA and a server certificate it signed for some names.
pub struct Tls {
    /// The CA's certificate, PEM (what the tools are told to trust).
    pub ca_pem: String,
    /// The server's configuration: the certificate chain and its key.
    pub config: Arc<ServerConfig>,
}

impl Tls {
    /// A fresh CA and a certificate for `names` (every name in the subject alternative names).
    pub fn new(names: &[&str]) -> Tls {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "ollie egress test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate().unwrap();
        let mut leaf =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        leaf.distinguished_name.push(DnType::CommonName, names[0]);
        leaf.use_authority_key_identifier_extension = true;
        leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = leaf.signed_by(&key, &issuer).unwrap();

        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone(), ca_cert.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Tls {
            ca_pem: ca_cert.pem(),
            config: Arc::new(config),
        }
    }
}

/// One request an origin answered.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The TLS server name of its connection (`None` over plain HTTP).
    pub sni: Option<String>,
    /// Its `Host` header, without the port.
    pub host: String,
    pub method: String,
    pub path: String,
    pub status: u16,
}

#[derive(Debug, Default)]
struct Log {
    /// Connections accepted.
    connections: usize,
    /// TLS handshakes that completed.
    handshakes: usize,
    /// The server name of each TLS handshake that completed.
    names: Vec<String>,
    requests: Vec<Seen>,
}

/// A static file server on `127.0.0.1`: HTTPS when made with [`Origin::https`], else HTTP.
/// A directory's path answers its `index.html` or `index.json`; the query is ignored (git's
/// dumb protocol asks `info/refs?service=…` and must get the file).
pub struct Origin {
    pub port: u16,
    log: Arc<Mutex<Log>>,
    task: JoinHandle<()>,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Origin {
    /// Serves `root` over HTTPS with `tls`.
    pub async fn https(root: &Path, tls: &Tls) -> Origin {
        Origin::start(root, Some(TlsAcceptor::from(tls.config.clone()))).await
    }

    /// Serves `root` over plain HTTP.
    pub async fn http(root: &Path) -> Origin {
        Origin::start(root, None).await
    }

    async fn start(root: &Path, tls: Option<TlsAcceptor>) -> Origin {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Log::default()));
        let root = root.to_path_buf();
        let l = log.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                l.lock().unwrap().connections += 1;
                let (l, root, tls) = (l.clone(), root.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        None => serve(stream, None, root, l).await,
                        Some(acceptor) => {
                            let Ok(s) = acceptor.accept(stream).await else {
                                return;
                            };
                            let sni = s.get_ref().1.server_name().map(str::to_owned);
                            {
                                let mut log = l.lock().unwrap();
                                log.handshakes += 1;
                                log.names.extend(sni.clone());
                            }
                            serve(s, sni, root, l).await;
                        }
                    }
                });
            }
        });
        Origin { port, log, task }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.log.lock().unwrap().connections
    }

    /// TLS handshakes that completed so far.
    pub fn handshakes(&self) -> usize {
        self.log.lock().unwrap().handshakes
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.log.lock().unwrap().requests.clone()
    }

    /// How many TLS handshakes (by server name) and plain requests (by `Host` header) named
    /// `name`.
    pub fn saw_name(&self, name: &str) -> usize {
        let log = self.log.lock().unwrap();
        log.names.iter().filter(|n| *n == name).count()
            + log
                .requests
                .iter()
                .filter(|r| r.sni.is_none() && r.host == name)
                .count()
    }

    /// What the origin saw, for failure messages.
    pub fn report(&self) -> String {
        let log = self.log.lock().unwrap();
        format!(
            "{} connections, names {:?}, requests {:?}",
            log.connections, log.names, log.requests
        )
    }
}

async fn serve<S>(stream: S, sni: Option<String>, root: PathBuf, log: Arc<Mutex<Log>>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let (sni, root, log) = (sni.clone(), root.clone(), log.clone());
        async move {
            let host = req
                .headers()
                .get(hyper::header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let host = match host.rsplit_once(':') {
                Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h.to_owned(),
                _ => host,
            };
            let path = req.uri().path().to_owned();
            let resp = answer(&root, req.method(), &path);
            log.lock().unwrap().requests.push(Seen {
                sni,
                host,
                method: req.method().to_string(),
                path,
                status: resp.status().as_u16(),
            });
            Ok::<_, Infallible>(resp)
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

/// The file `path` names under `root` (a directory: its index), or 404.
fn answer(root: &Path, method: &hyper::Method, path: &str) -> Response<Full<Bytes>> {
    let not_found = || {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"not found\n")))
            .unwrap()
    };
    if method != hyper::Method::GET && method != hyper::Method::HEAD {
        return not_found();
    }
    let rel = Path::new(path.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return not_found();
    }
    let mut file = root.join(rel);
    if file.is_dir() {
        file = ["index.html", "index.json"]
            .iter()
            .map(|i| file.join(i))
            .find(|f| f.is_file())
            .unwrap_or(file);
    }
    let Ok(data) = std::fs::read(&file) else {
        return not_found();
    };
    let ctype = match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html",
        Some("json") => "application/json",
        Some("txt") => "text/plain",
        _ => "application/octet-stream",
    };
    let body = if method == hyper::Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from(data)
    };
    Response::builder()
        .header(hyper::header::CONTENT_TYPE, ctype)
        .body(Full::new(body))
        .unwrap()
}

/// A listener that accepts and counts connections, and closes them.
pub struct Canary {
    pub addr: SocketAddr,
    count: Arc<Mutex<usize>>,
    task: JoinHandle<()>,
}

impl Drop for Canary {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Canary {
    /// Listens on `addr` (port 0: the kernel's choice); `None` if it cannot bind.
    pub async fn bind(addr: &str) -> Option<Canary> {
        let listener = TcpListener::bind(addr).await.ok()?;
        let addr = listener.local_addr().ok()?;
        let count = Arc::new(Mutex::new(0));
        let c = count.clone();
        let task = tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                *c.lock().unwrap() += 1;
                drop(s);
            }
        });
        Some(Canary { addr, count, task })
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        *self.count.lock().unwrap()
    }
}
