//! Table-driven tests: every case runs, each failure is named, and the test fails once at the end.
//!
//! A suite turns a run of near-identical test bodies into a table of cases and one runner; the
//! runner hands each case's problems (none when it passed) to [`Cases::check`], and
//! [`Cases::finish`] fails listing every failed case by name with all of its problems.

/// The outcome of a table of cases so far.
#[derive(Debug, Default)]
pub struct Cases {
    ran: usize,
    failed: Vec<String>,
}

impl Cases {
    /// No case has run yet.
    pub fn new() -> Cases {
        Cases::default()
    }

    /// Records the case `name` (with `detail`, e.g. its input, to show on failure) and what was
    /// wrong with it: it failed if `problems` is not empty.
    pub fn check(&mut self, name: &str, detail: &str, problems: Vec<String>) {
        self.ran += 1;
        if !problems.is_empty() {
            let detail = if detail.is_empty() {
                String::new()
            } else {
                format!(" ({detail})")
            };
            self.failed.push(format!(
                "case {name:?}{detail}:\n  {}",
                problems.join("\n  ")
            ));
        }
    }

    /// Fails naming every failed case, if any failed; returns how many cases ran.
    pub fn finish(self) -> usize {
        assert!(
            self.failed.is_empty(),
            "{} of {} cases failed:\n{}",
            self.failed.len(),
            self.ran,
            self.failed.join("\n")
        );
        self.ran
    }
}
