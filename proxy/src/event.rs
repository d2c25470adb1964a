//! What the proxy reports: one [`Event`] per request, handed to an [`EventSink`] when the
//! request ends (the tunnel closed, the response finished, or at once for a refusal).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Who a listener serves: every decision of that listener is labelled with it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Caller {
    /// The agent whose tool runs behind the listener.
    pub agent: String,
    /// The tool call (its session-local id).
    pub call: String,
    /// The command line of the run, for the audit log.
    pub command: String,
}

/// How a request was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// A pattern of the session's allow list matched.
    Allowed,
    /// The proxy refused it (port, host, deny list, not listed with no asker, address, TLS
    /// server name, Host header, limits), or the request ended before it was decided.
    Refused,
    /// The asker approved it (once, or for the session).
    Approved,
    /// The asker denied it.
    Denied,
}

/// One request through the proxy, as reported when it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Event {
    /// When the request arrived, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The caller's agent.
    pub agent: String,
    /// The caller's tool call.
    pub call: String,
    /// The caller's command line.
    pub command: String,
    /// `CONNECT`, or the HTTP method of a plain request; `-` for bytes that did not parse
    /// as a request (hyper answered them with 400, and `domain` is empty).
    pub method: String,
    /// The normalised host (`[…]` around an IPv6 literal), or, when it did not normalise, the
    /// host as sent with unprintable characters escaped (at most 256 characters).
    pub domain: String,
    /// The target port (0 when the request named none).
    pub port: u16,
    /// The address connected to (`ip:port`), once connected.
    pub address: Option<String>,
    /// The decision.
    pub verdict: Verdict,
    /// Why: the matching pattern, the refusal, the asker's reason, or how a connection ended
    /// early.
    pub reason: Option<String>,
    /// Bytes from the client to the origin: the whole tunnel, or a request's body.
    pub bytes_up: u64,
    /// Bytes from the origin to the client: the whole tunnel, or a response's body.
    pub bytes_down: u64,
    /// How long the request lasted, in milliseconds.
    pub duration_ms: u64,
}

/// Where events go (the session's audit log). Called once per request, from the task that
/// served it: it should not block.
pub trait EventSink: Send + Sync {
    /// Takes one event.
    fn event(&self, e: &Event);
}

/// A sink writing each event as one JSON line to the `audit` tracing target.
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingSink;

impl EventSink for TracingSink {
    fn event(&self, e: &Event) {
        match serde_json::to_string(e) {
            Ok(line) => tracing::info!(target: "audit", "proxy {line}"),
            Err(err) => tracing::warn!(target: "audit", "proxy event not encoded: {err}"),
        }
    }
}

/// The event of one request being served: filled in as the request goes, handed to the
/// sink exactly once, when dropped (so a request cut short by a dropped task still reports).
pub(crate) struct Record {
    sink: Arc<dyn EventSink>,
    event: Event,
    start: Instant,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
}

impl Record {
    /// A record of a request by `caller`, refused until decided otherwise.
    pub(crate) fn new(sink: Arc<dyn EventSink>, caller: &Caller, method: &str) -> Record {
        let time_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Record {
            sink,
            event: Event {
                time_ms,
                agent: caller.agent.clone(),
                call: caller.call.clone(),
                command: caller.command.clone(),
                method: method.to_string(),
                domain: String::new(),
                port: 0,
                address: None,
                verdict: Verdict::Refused,
                reason: Some("the connection ended before the request was decided".into()),
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
            },
            start: Instant::now(),
            up: Arc::default(),
            down: Arc::default(),
        }
    }

    /// Names the target.
    pub(crate) fn target(&mut self, domain: String, port: u16) {
        self.event.domain = domain;
        self.event.port = port;
    }

    /// Sets the verdict and its reason.
    pub(crate) fn decide(&mut self, verdict: Verdict, reason: Option<String>) {
        self.event.verdict = verdict;
        self.event.reason = reason;
    }

    /// Adds to the reason, keeping the verdict (how a request that went on ended).
    pub(crate) fn note(&mut self, note: &str) {
        self.event.reason = Some(match self.event.reason.take() {
            Some(r) => format!("{r}; {note}"),
            None => note.to_string(),
        });
    }

    /// The target as reported (domain, port).
    pub(crate) fn shown_target(&self) -> (String, u16) {
        (self.event.domain.clone(), self.event.port)
    }

    /// Names the address connected to.
    pub(crate) fn address(&mut self, address: String) {
        self.event.address = Some(address);
    }

    /// The counters of bytes up and down, for the copying code to add to.
    pub(crate) fn counters(&self) -> (Arc<AtomicU64>, Arc<AtomicU64>) {
        (self.up.clone(), self.down.clone())
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        self.event.bytes_up = self.up.load(Ordering::Relaxed);
        self.event.bytes_down = self.down.load(Ordering::Relaxed);
        self.event.duration_ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(0);
        self.sink.event(&self.event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Collect(Mutex<Vec<Event>>);

    impl EventSink for Collect {
        fn event(&self, e: &Event) {
            self.0.lock().unwrap().push(e.clone());
        }
    }

    #[test]
    fn a_record_reports_once_when_dropped_and_serialises_as_documented() {
        let sink = Arc::new(Collect::default());
        let caller = Caller {
            agent: "a".into(),
            call: "7".into(),
            command: "pip install x".into(),
        };
        let mut r = Record::new(sink.clone(), &caller, "CONNECT");
        r.target("pypi.org".into(), 443);
        r.decide(Verdict::Allowed, Some("allowed by pypi.org".into()));
        r.address("151.101.0.223:443".into());
        let (up, down) = r.counters();
        up.fetch_add(10, Ordering::Relaxed);
        down.fetch_add(20, Ordering::Relaxed);
        assert!(sink.0.lock().unwrap().is_empty());
        drop(r);
        let events = sink.0.lock().unwrap();
        assert_eq!(events.len(), 1);
        let v = serde_json::to_value(&events[0]).unwrap();
        assert_eq!(v["verdict"], "allowed");
        assert_eq!(v["bytes_up"], 10);
        assert_eq!(v["bytes_down"], 20);
        assert_eq!(v["agent"], "a");
        assert_eq!(v["method"], "CONNECT");
        assert_eq!(v["address"], "151.101.0.223:443");
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys.len(), 13, "{keys:?}");
    }

    #[test]
    fn an_undecided_record_reports_a_refusal() {
        let sink = Arc::new(Collect::default());
        drop(Record::new(sink.clone(), &Caller::default(), "GET"));
        let e = sink.0.lock().unwrap()[0].clone();
        assert_eq!(e.verdict, Verdict::Refused);
        assert!(e.reason.unwrap().contains("before the request was decided"));
    }
}
