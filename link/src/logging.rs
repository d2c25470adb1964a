//! Log output for olliesrv and toolsrv: plain `tracing` lines on a terminal, and, when stderr
//! is the journal's stream (`JOURNAL_STREAM` names it, as systemd sets it for a service),
//! lines without timestamps or colour that start with a `<N>` syslog priority, which journald
//! turns into the entry's priority (`journalctl -p warning` then works).
//!
//! Repeats are bounded: one log statement (one call site) writes at most
//! [`REPEATS_PER_SECOND`] lines per second; the rest are counted and summarised as one line
//! ("… repeated K times") when that statement next logs after its second, or when any other
//! statement logs after it. The first occurrences are always written in full.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

/// Whether stderr is the journal: `JOURNAL_STREAM` is `DEV:INODE` of stderr. A process whose
/// stderr was redirected elsewhere keeps logging normally even if it inherited the variable.
pub fn stderr_is_journal() -> bool {
    std::env::var("JOURNAL_STREAM").is_ok_and(|v| names_stderr(&v))
}

fn names_stderr(journal_stream: &str) -> bool {
    let Some((dev, ino)) = journal_stream.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    nix::sys::stat::fstat(2).is_ok_and(|st| st.st_dev == dev && st.st_ino == ino)
}

/// The syslog priority of a level, as sd-daemon(3) prefixes use it.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Wraps a formatter so each event starts with its `<N>` priority.
#[derive(Debug)]
pub struct JournalPrefix<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for JournalPrefix<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(writer, "<{}>", priority(event.metadata().level()))?;
        self.0.format_event(ctx, writer, event)
    }
}

/// Lines one call site may write per second before it is summarised.
pub const REPEATS_PER_SECOND: u32 = 10;

/// One call site's current second.
#[derive(Debug)]
struct Window {
    start: Instant,
    written: u32,
    held: u64,
    level: Level,
    target: &'static str,
    file: Option<&'static str>,
    line: Option<u32>,
}

/// The bookkeeping of [`RateLimited`]: per call site, what was written and held back in its
/// current window.
#[derive(Debug)]
pub struct Repeats {
    per_window: u32,
    window: Duration,
    sites: HashMap<Identifier, Window>,
    /// Sites with held-back lines not yet summarised.
    pending: usize,
}

/// A summary line to write: what was held back, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub held: u64,
    pub level: Level,
    pub target: &'static str,
    pub site: String,
}

impl Repeats {
    pub fn new(per_window: u32, window: Duration) -> Repeats {
        Repeats {
            per_window: per_window.max(1),
            window,
            sites: HashMap::new(),
            pending: 0,
        }
    }

    /// Records an event from `meta`'s call site at `now`: whether to write it, and the
    /// summaries due (every site whose window ended with lines held back), to write first.
    pub fn check(
        &mut self,
        meta: &'static tracing::Metadata<'static>,
        now: Instant,
    ) -> (bool, Vec<Summary>) {
        let mut due = Vec::new();
        if self.pending > 0 {
            for w in self.sites.values_mut() {
                if w.held > 0 && now.duration_since(w.start) >= self.window {
                    due.push(summary(w));
                    w.held = 0;
                    w.start = now;
                    w.written = 0;
                    self.pending -= 1;
                }
            }
        }
        let w = self.sites.entry(meta.callsite()).or_insert_with(|| Window {
            start: now,
            written: 0,
            held: 0,
            level: *meta.level(),
            target: meta.target(),
            file: meta.file(),
            line: meta.line(),
        });
        if now.duration_since(w.start) >= self.window {
            w.start = now;
            w.written = 0;
        }
        if w.written < self.per_window {
            w.written += 1;
            return (true, due);
        }
        if w.held == 0 {
            self.pending += 1;
        }
        w.held += 1;
        (false, due)
    }
}

fn summary(w: &Window) -> Summary {
    let site = match (w.file, w.line) {
        (Some(f), Some(l)) => format!("{f}:{l}"),
        (Some(f), None) => f.to_owned(),
        _ => w.target.to_owned(),
    };
    Summary {
        held: w.held,
        level: w.level,
        target: w.target,
        site,
    }
}

/// Wraps a formatter so that a call site writing more than its share per second is summarised
/// (see the module documentation). `journal` prefixes summary lines with their priority.
#[derive(Debug)]
pub struct RateLimited<F> {
    inner: F,
    journal: bool,
    repeats: Mutex<Repeats>,
}

impl<F> RateLimited<F> {
    pub fn new(inner: F, journal: bool) -> RateLimited<F> {
        RateLimited {
            inner,
            journal,
            repeats: Mutex::new(Repeats::new(REPEATS_PER_SECOND, Duration::from_secs(1))),
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for RateLimited<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let (write, due) = self
            .repeats
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .check(event.metadata(), Instant::now());
        for s in due {
            if self.journal {
                write!(writer, "<{}>", priority(&s.level))?;
            }
            writeln!(
                writer,
                "{:>5} {}: the previous message ({}) repeated {} more times",
                s.level, s.target, s.site, s.held
            )?;
        }
        if write {
            self.inner.format_event(ctx, writer, event)
        } else {
            Ok(())
        }
    }
}

/// Installs the global subscriber writing to stderr: journal format when stderr is the
/// journal, the usual format otherwise. `target` shows the module path of each event.
///
/// `filter` is any filter layer: olliesrv passes an `EnvFilter` (`OLLIE_LOG` directives),
/// toolsrv a `LevelFilter`, which keeps `EnvFilter`'s directive parser (a regex engine, about
/// 300 KB of code) out of the process started for every session.
pub fn init<F>(filter: F, target: bool)
where
    F: Layer<Registry> + Send + Sync + 'static,
{
    let filtered = tracing_subscriber::registry().with(filter);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(target);
    if stderr_is_journal() {
        let format = tracing_subscriber::fmt::format()
            .without_time()
            .with_ansi(false)
            .with_target(target);
        filtered
            .with(
                layer
                    .with_ansi(false)
                    .event_format(RateLimited::new(JournalPrefix(format), true)),
            )
            .init();
    } else {
        // Colour only for a person at a terminal: not in a file, a pipe or a test's capture.
        use std::io::IsTerminal;
        let ansi = std::io::stderr().is_terminal();
        let format = tracing_subscriber::fmt::format()
            .with_target(target)
            .with_ansi(ansi);
        filtered
            .with(
                layer
                    .with_ansi(ansi)
                    .event_format(RateLimited::new(format, false)),
            )
            .init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn journal_lines_carry_the_priority_and_no_timestamp() {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .event_format(JournalPrefix(
                tracing_subscriber::fmt::format()
                    .without_time()
                    .with_ansi(false)
                    .with_target(false),
            ))
            .finish();
        tracing::subscriber::with_default(sub, || {
            tracing::error!(session = "s1", "toolsrv died");
            tracing::warn!("slow");
            tracing::info!("serving");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("<3>"), "{}", lines[0]);
        assert!(lines[0].contains("toolsrv died") && lines[0].contains("session=\"s1\""));
        assert!(lines[1].starts_with("<4>"), "{}", lines[1]);
        assert!(lines[2].starts_with("<6>"), "{}", lines[2]);
        // No timestamp: the level comes right after the prefix.
        assert!(
            lines[2]["<6>".len()..].trim_start().starts_with("INFO"),
            "{}",
            lines[2]
        );
    }

    fn meta_of(f: impl FnOnce()) -> &'static tracing::Metadata<'static> {
        // The metadata of the first event `f` logs.
        struct Grab(Arc<Mutex<Option<&'static tracing::Metadata<'static>>>>);
        impl<S: Subscriber> tracing_subscriber::Layer<S> for Grab {
            fn on_event(&self, e: &Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
                self.0.lock().unwrap().get_or_insert(e.metadata());
            }
        }
        use tracing_subscriber::layer::SubscriberExt;
        let slot = Arc::new(Mutex::new(None));
        let sub = tracing_subscriber::registry().with(Grab(Arc::clone(&slot)));
        tracing::subscriber::with_default(sub, f);
        slot.lock().unwrap().expect("an event")
    }

    #[test]
    fn repeats_are_counted_and_summarised_once_their_window_ends() {
        let a = meta_of(|| tracing::warn!("accept failed"));
        let b = meta_of(|| tracing::info!("other"));
        let mut r = Repeats::new(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // The first three are written, the next ones held back.
        for i in 0..3 {
            assert_eq!(r.check(a, ms(i)), (true, vec![]), "{i}");
        }
        for i in 3..1000 {
            assert_eq!(r.check(a, ms(i / 10)), (false, vec![]), "{i}");
        }
        // Another site is not affected, and nothing is due within the second.
        assert_eq!(r.check(b, ms(500)), (true, vec![]));
        // After the second: the summary comes with whichever event is next.
        let (write, due) = r.check(b, ms(1001));
        assert!(write);
        assert_eq!(due.len(), 1, "{due:?}");
        assert_eq!(due[0].held, 997);
        assert_eq!(due[0].level, Level::WARN);
        assert!(due[0].site.contains("logging.rs"), "{:?}", due[0]);
        // Only once; and the site writes again in its new window.
        assert_eq!(r.check(a, ms(1002)), (true, vec![]));
        assert_eq!(r.check(b, ms(1003)), (true, vec![]));
    }

    #[test]
    fn a_flood_from_one_statement_writes_a_bounded_number_of_lines() {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .with_ansi(false)
            .event_format(RateLimited::new(
                tracing_subscriber::fmt::format().with_ansi(false),
                false,
            ))
            .finish();
        let n = 100_000;
        tracing::subscriber::with_default(sub, || {
            for i in 0..n {
                tracing::warn!(i, "accept failed");
            }
            tracing::error!("after the flood");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // The first occurrence in full; at most REPEATS_PER_SECOND lines per second of the
        // run (plus summaries), which is far below n on any machine.
        assert!(
            lines[0].contains("accept failed") && lines[0].contains("i=0"),
            "{}",
            lines[0]
        );
        assert!(lines.len() < n / 10, "{} lines", lines.len());
        assert!(lines.last().unwrap().contains("after the flood"), "{text}");
        let written = lines.iter().filter(|l| l.contains("accept failed")).count() as u64;
        let held: u64 = lines
            .iter()
            .filter_map(|l| {
                let (_, rest) = l.split_once(" repeated ")?;
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum();
        // Nothing is lost from the count but what is still inside the current second.
        assert!(written + held <= n as u64, "{written} + {held}");
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(!names_stderr("garbage"));
        assert!(!names_stderr("1:2"));
        let st = nix::sys::stat::fstat(2).unwrap();
        assert!(names_stderr(&format!("{}:{}", st.st_dev, st.st_ino)));
    }
}
