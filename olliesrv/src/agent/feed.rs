//! An agent's `feed` is its input: each new distinct value becomes a turn.
//!
//! The seed pipes `git diff` into "an observer's feed" and wires a coder's state changes into
//! it; the observer is the agent that reads it. So every value written to an agent's feed
//! (whole, as [`crate::tree`]'s feed rule publishes it, and only when it differs from the
//! value before) is offered to the agent's worker as a turn whose prompt is the value, or the
//! agent's `feed_prompt` template with `{feed}` replaced by it. The offer waits behind the
//! queued prompts, and a newer value replaces one still waiting: while a turn runs, only the
//! newest value is kept, so a fast producer never builds a queue. `cfg` `feed=off` stops it
//! (the values are still published to readers).

use std::sync::Arc;

use crate::state::Agent;
use crate::state::session::MAX_PROMPT;
use crate::state::settings::FEED_PLACEHOLDER;

/// Starts delivering `a`'s new feed values as turns (until it is killed).
pub fn start(a: Arc<Agent>) {
    tokio::spawn(async move {
        let mut values = a.feed.subscribe();
        let mut killed = a.killed_signal();
        // The value there already (none after a restart) is not a new one.
        values.borrow_and_update();
        loop {
            tokio::select! {
                r = values.changed() => if r.is_err() { return; },
                _ = killed.changed() => {}
            }
            if a.is_killed() {
                return;
            }
            let v = values.borrow_and_update().clone();
            if let Some(p) = v.and_then(|v| feed_prompt(&a, &v)) {
                a.offer_feed_turn(p);
            }
        }
    });
}

/// The prompt for feed value `v`, if `a` takes its feed as turns and the value is not blank.
fn feed_prompt(a: &Agent, v: &[u8]) -> Option<String> {
    let st = a.settings();
    if st.cfg.get("feed").is_some_and(|m| m == "off") {
        return None;
    }
    let value = String::from_utf8_lossy(v);
    if value.trim().is_empty() {
        return None;
    }
    let template = st.cfg.get("feed_prompt").map(|t| t.replace("\\n", "\n"));
    Some(render(template.as_deref(), &value))
}

/// `template` (default: the value alone) with the value in place of `{feed}`, within
/// [`MAX_PROMPT`] (a longer value is cut at a character boundary, and says so).
fn render(template: Option<&str>, value: &str) -> String {
    let template = template.unwrap_or(FEED_PLACEHOLDER);
    let room = MAX_PROMPT.saturating_sub(template.len() + CUT_NOTE.len());
    let value = if value.len() > room {
        format!("{}{CUT_NOTE}", ollie_link::text::prefix_bytes(value, room))
    } else {
        value.to_owned()
    };
    template.replacen(FEED_PLACEHOLDER, &value, 1)
}

/// Ends a feed value cut to fit a prompt.
const CUT_NOTE: &str = "\n[the feed value was cut here to fit the prompt limit]\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_frames_the_value() {
        assert_eq!(render(None, "diff --git a b\n"), "diff --git a b\n");
        assert_eq!(
            render(
                Some("Review this change:\n{feed}\nSay if it is wrong."),
                "x"
            ),
            "Review this change:\nx\nSay if it is wrong."
        );
        // Only the first placeholder is the value; a value containing one stays as it is.
        assert_eq!(render(Some("{feed} {feed}"), "{feed}"), "{feed} {feed}");
    }

    #[test]
    fn a_value_too_long_for_a_prompt_is_cut_and_says_so() {
        let big = "é".repeat(MAX_PROMPT);
        let p = render(Some("look: {feed}"), &big);
        assert!(p.len() <= MAX_PROMPT, "{}", p.len());
        assert!(p.starts_with("look: éé"));
        assert!(p.ends_with(CUT_NOTE));
    }
}
