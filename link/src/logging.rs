//! Log output for olliesrv and toolsrv: plain `tracing` lines on a terminal, and, when stderr
//! is the journal's stream (`JOURNAL_STREAM` names it, as systemd sets it for a service),
//! lines without timestamps or colour that start with a `<N>` syslog priority, which journald
//! turns into the entry's priority (`journalctl -p warning` then works).

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

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

/// Installs the global subscriber writing to stderr: journal format when stderr is the
/// journal, the usual format otherwise. `target` shows the module path of each event.
pub fn init(filter: tracing_subscriber::EnvFilter, target: bool) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(target);
    if stderr_is_journal() {
        let format = tracing_subscriber::fmt::format()
            .without_time()
            .with_ansi(false)
            .with_target(target);
        builder
            .with_ansi(false)
            .event_format(JournalPrefix(format))
            .init();
    } else {
        builder.init();
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

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(!names_stderr("garbage"));
        assert!(!names_stderr("1:2"));
        let st = nix::sys::stat::fstat(2).unwrap();
        assert!(names_stderr(&format!("{}:{}", st.st_dev, st.st_ino)));
    }
}
