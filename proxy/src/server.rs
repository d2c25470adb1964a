//! The proxy itself: one [`Proxy`] per session, serving any number of listeners (one per
//! sandboxed run), each labelled with its [`Caller`].

use std::collections::{BTreeSet, HashSet};
use std::convert::Infallible;
use std::io;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::ext::ReasonPhrase;
use hyper::header::{CONNECTION, CONTENT_TYPE, HeaderValue};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use ollie_policy::domains::DomainRules;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::address::AddressPolicy;
use crate::decide::{self, AskRequest, AskVerdict, Asker, Kind, Refusal, Step, Target};
use crate::event::{Caller, EventSink, Record, Verdict};
use crate::forward::{self, ProxyBody};
use crate::resolve::{self, Resolver};
use crate::tunnel::{self, TunnelJob};

/// The ports the proxy forwards to unless configured otherwise.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// The reason phrase of a CONNECT's success.
const ESTABLISHED: &[u8] = b"Connection established";

/// Everything a [`Proxy`] is made from.
pub struct ProxyConfig {
    /// The session's allow and deny lists (replaceable later with [`Proxy::set_rules`]).
    pub rules: DomainRules,
    /// The target ports CONNECT and plain HTTP may name (by default 80 and 443).
    pub ports: BTreeSet<u16>,
    /// Which resolved addresses may be connected to.
    pub addresses: AddressPolicy,
    /// Pins and the system resolver.
    pub resolver: Resolver,
    /// Who decides on a host no pattern lists; without one such a host is refused.
    pub asker: Option<Arc<dyn Asker>>,
    /// Where each request's event goes.
    pub sink: Arc<dyn EventSink>,
    /// The longest resolution, and separately the longest connection to the origin, may take.
    pub connect_timeout: Duration,
    /// How many client connections may be open at once over all listeners (tunnels
    /// included); one more is answered with 503.
    pub max_connections: usize,
}

impl ProxyConfig {
    /// A configuration with the defaults: ports 80 and 443, public addresses only, the
    /// system resolver, no asker, a 10 s connect timeout and 256 connections.
    pub fn new(rules: DomainRules, sink: Arc<dyn EventSink>) -> ProxyConfig {
        ProxyConfig {
            rules,
            ports: BTreeSet::from(DEFAULT_PORTS),
            addresses: AddressPolicy::default(),
            resolver: Resolver::system(),
            asker: None,
            sink,
            connect_timeout: Duration::from_secs(10),
            max_connections: 256,
        }
    }
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("rules", &self.rules)
            .field("ports", &self.ports)
            .field("addresses", &self.addresses)
            .field("resolver", &self.resolver)
            .field("asker", &self.asker.is_some())
            .field("connect_timeout", &self.connect_timeout)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

/// Why [`Proxy::serve`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener failed with an error that is not about one connection.
    #[error("the proxy's listener failed")]
    Accept(#[source] io::Error),
}

/// A session's egress proxy: HTTP CONNECT tunnels and plain HTTP requests with absolute
/// URIs, each decided by port, domain rules, an asker, and the addresses the name resolves
/// to. Share it in an [`Arc`] and [`serve`](Proxy::serve) each run's listener.
pub struct Proxy {
    rules: RwLock<Arc<DomainRules>>,
    ports: BTreeSet<u16>,
    addresses: AddressPolicy,
    resolver: Resolver,
    asker: Option<Arc<dyn Asker>>,
    sink: Arc<dyn EventSink>,
    connect_timeout: Duration,
    max_connections: usize,
    slots: Arc<Semaphore>,
    approved: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("rules", &self.rules())
            .field("ports", &self.ports)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy from its configuration.
    pub fn new(config: ProxyConfig) -> Proxy {
        Proxy {
            rules: RwLock::new(Arc::new(config.rules)),
            ports: config.ports,
            addresses: config.addresses,
            resolver: config.resolver,
            asker: config.asker,
            sink: config.sink,
            connect_timeout: config.connect_timeout,
            max_connections: config.max_connections,
            slots: Arc::new(Semaphore::new(config.max_connections)),
            approved: Mutex::new(HashSet::new()),
        }
    }

    /// Replaces the rules; requests decided from now on use the new ones (open tunnels
    /// stay open). Approvals for the session are kept, but a deny pattern wins over them.
    pub fn set_rules(&self, rules: DomainRules) {
        *self.rules.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<DomainRules> {
        self.rules
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The domains the asker approved for the rest of this proxy's life, sorted.
    pub fn approved_for_session(&self) -> Vec<String> {
        let set = self.approved.lock().unwrap_or_else(PoisonError::into_inner);
        let mut v: Vec<String> = set.iter().cloned().collect();
        v.sort();
        v
    }

    /// Serves `listener` until accepting fails for good. Every connection is served in a
    /// task owned by this future: dropping it (the run ended) closes every connection and
    /// tunnel of the listener, each reporting its event. Errors about one connection
    /// (aborted, reset) are skipped, a lack of descriptors or memory waits a little.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        caller: Caller,
    ) -> Result<Infallible, ServeError> {
        let mut tasks = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tasks.spawn(self.clone().serve_connection(stream, caller.clone()));
                    }
                    Err(e) => match accept_error(&e) {
                        AcceptError::Skip => {}
                        AcceptError::Wait => tokio::time::sleep(Duration::from_millis(50)).await,
                        AcceptError::Fatal => return Err(ServeError::Accept(e)),
                    },
                },
                Some(done) = tasks.join_next() => {
                    if let Err(e) = done {
                        tracing::warn!("proxy connection task failed: {e}");
                    }
                }
            }
        }
    }

    /// Serves one accepted client connection (HTTP/1.1, one request after another, until a
    /// CONNECT turns it into a tunnel or either side closes).
    pub async fn serve_connection<S>(self: Arc<Self>, stream: S, caller: Caller)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let permit = self.slots.clone().try_acquire_owned().ok();
        let conn = Arc::new(Conn {
            proxy: self,
            caller,
            overloaded: permit.is_none(),
            tunnel: Mutex::new(None),
        });
        let service = {
            let conn = conn.clone();
            service_fn(move |req| {
                let conn = conn.clone();
                async move { Ok::<_, Infallible>(conn.handle(req).await) }
            })
        };
        let served = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await;
        if let Err(e) = served {
            tracing::debug!("proxy client connection ended: {e}");
            if e.is_parse() || e.is_parse_too_large() {
                // hyper answered 400 (or 431) itself; the audit still hears of it.
                let mut record = Record::new(conn.proxy.sink.clone(), &conn.caller, "-");
                record.decide(
                    Verdict::Refused,
                    Some(format!("the request is not valid http/1.1: {e}")),
                );
            }
        }
        let job = conn
            .tunnel
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(job) = job {
            tunnel::run(job).await;
        }
        drop::<Option<OwnedSemaphorePermit>>(permit);
    }

    /// Port, rules, session approvals and the asker, in that order; the record gets the
    /// verdict.
    async fn authorize(
        &self,
        target: &Target,
        caller: &Caller,
        record: &mut Record,
    ) -> Result<(), Refusal> {
        let step = {
            let approved = self.approved.lock().unwrap_or_else(PoisonError::into_inner);
            let rules = self.rules();
            decide::decide(&self.ports, &rules, &approved, &target.host, target.port)
        };
        let asker = match step {
            Step::Refuse(r) => return Err(r),
            Step::Go(verdict, reason) => {
                record.decide(verdict, Some(reason));
                return Ok(());
            }
            Step::Ask => match &self.asker {
                Some(a) => a,
                None => return Err(Refusal::NotListed),
            },
        };
        let domain = target.host.to_string();
        let request = AskRequest {
            domain: domain.clone(),
            port: target.port,
            caller: caller.clone(),
        };
        match asker.ask(request).await {
            AskVerdict::Allow { for_session } => {
                let how = if for_session {
                    self.approved
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(domain);
                    "approved, and remembered by this proxy"
                } else {
                    "approved once"
                };
                record.decide(Verdict::Approved, Some(how.into()));
                Ok(())
            }
            AskVerdict::Deny { reason } => Err(Refusal::HumanDenied { reason }),
        }
    }

    /// Resolves an authorised target, vets its addresses and connects to one.
    async fn open(&self, target: &Target) -> Result<(TcpStream, std::net::SocketAddr), Refusal> {
        let lookup = self.resolver.resolve(&target.host, target.port);
        let addrs = match tokio::time::timeout(self.connect_timeout, lookup).await {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => return Err(Refusal::Resolve(error_chain(&e))),
            Err(_) => return Err(Refusal::Resolve("timed out".into())),
        };
        let vetted = self.addresses.vet(&addrs).map_err(|r| Refusal::Address {
            class: r.class,
            address: r.address.to_string(),
        })?;
        resolve::connect(&vetted, target.port, self.connect_timeout)
            .await
            .map_err(Refusal::Upstream)
    }
}

/// An error and its sources, `: `-separated, one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let chain: Vec<String> = std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect();
    chain.join(": ")
}

/// What to do about a failed `accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptError {
    /// About one connection: go on.
    Skip,
    /// Out of descriptors or memory: wait, then go on.
    Wait,
    /// The listener is broken.
    Fatal,
}

fn accept_error(e: &io::Error) -> AcceptError {
    use io::ErrorKind::*;
    // EMFILE, ENFILE, ENOBUFS, ENOMEM (Linux numbers).
    const RESOURCE: [i32; 4] = [24, 23, 105, 12];
    match e.kind() {
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut => {
            AcceptError::Skip
        }
        _ if e.raw_os_error().is_some_and(|n| RESOURCE.contains(&n)) => AcceptError::Wait,
        _ => AcceptError::Fatal,
    }
}

/// One client connection's state.
struct Conn {
    proxy: Arc<Proxy>,
    caller: Caller,
    overloaded: bool,
    /// The tunnel a CONNECT set up, run once hyper hands the connection over.
    tunnel: Mutex<Option<TunnelJob>>,
}

impl Conn {
    /// Decides on one request and answers it.
    async fn handle(&self, mut req: Request<Incoming>) -> Response<ProxyBody> {
        let proxy = &self.proxy;
        let mut record = Record::new(proxy.sink.clone(), &self.caller, req.method().as_str());
        let target = match decide::parse_target(req.method(), req.uri(), req.headers()) {
            Ok(t) => t,
            Err((domain, port, refusal)) => {
                record.target(domain, port);
                return refuse(record, &refusal);
            }
        };
        record.target(target.host.to_string(), target.port);
        if self.overloaded {
            let max = proxy.max_connections;
            return refuse(record, &Refusal::Overloaded { max });
        }
        if let Err(r) = proxy.authorize(&target, &self.caller, &mut record).await {
            return refuse(record, &r);
        }
        let (upstream, addr) = match proxy.open(&target).await {
            Ok(pair) => pair,
            Err(r) => return refuse(record, &r),
        };
        record.address(addr.to_string());
        match target.kind {
            Kind::Connect => {
                let on_upgrade = hyper::upgrade::on(&mut req);
                let job = TunnelJob {
                    on_upgrade,
                    upstream,
                    host: target.host,
                    record,
                };
                *self.tunnel.lock().unwrap_or_else(PoisonError::into_inner) = Some(job);
                let mut response = Response::new(empty());
                response
                    .extensions_mut()
                    .insert(ReasonPhrase::from_static(ESTABLISHED));
                response
            }
            Kind::Http => match forward::forward(req, &target, upstream, record).await {
                Ok(response) => response,
                Err((record, r)) => refuse(record, &r),
            },
        }
    }
}

fn empty() -> ProxyBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed()
}

/// The response to a refused request; the record reports at once.
fn refuse(mut record: Record, refusal: &Refusal) -> Response<ProxyBody> {
    match refusal.verdict() {
        Some(verdict) => record.decide(verdict, Some(refusal.reason())),
        None => record.note(&refusal.reason()),
    }
    let (domain, port) = record.shown_target();
    let body = refusal.body(&domain, port);
    tracing::debug!("{}", body.trim_end());
    let body = Full::new(Bytes::from(body)).map_err(|never| match never {});
    let mut response = Response::new(body.boxed());
    *response.status_mut() = refusal.status();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_about_one_connection_are_skipped() {
        let e = |k| io::Error::from(k);
        assert_eq!(
            accept_error(&e(io::ErrorKind::ConnectionAborted)),
            AcceptError::Skip
        );
        assert_eq!(
            accept_error(&io::Error::from_raw_os_error(24)),
            AcceptError::Wait
        );
        assert_eq!(
            accept_error(&io::Error::from_raw_os_error(9)),
            AcceptError::Fatal
        );
    }
}
