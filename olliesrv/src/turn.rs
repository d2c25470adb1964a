//! The per-agent worker: takes queued prompts in order (not while the session is paused),
//! runs a turn for each, and records it in the chat.
//!
//! A turn needs a model backend; until the agent loop exists every turn ends with the
//! one-line error that no backend is configured, shown in the chat as an `error` block and
//! returned to a waiting `agent/new … prompt=`.

use std::sync::Arc;

use crate::model::{Agent, AgentState, Registry};

/// The error every turn and `generate` give until model calls exist.
pub const NO_BACKEND: &str = "no backend configured: this olliesrv cannot call a model yet";

/// Starts the worker of `a` (it ends when the agent is killed).
pub fn start_worker(a: Arc<Agent>, reg: Arc<Registry>) {
    tokio::spawn(async move {
        while reg.next_prompt(&a).await.is_some() {
            let Some(prompt) = reg.take_prompt(&a) else {
                continue;
            };
            reg.state_changed(&a, AgentState::Running);
            let result = run_turn(&a, &prompt).await;
            if let Err(e) = &result
                && let Err(w) = a.say("error", "", e)
            {
                tracing::warn!(agent = %a.id, error = %w, "cannot record the turn's error");
            }
            {
                let mut st = crate::model::lock(&a.stats);
                st.turns += 1;
                if result.is_err() {
                    st.errors += 1;
                }
            }
            reg.turn_ended(&a, result);
            reg.finish_turn(&a);
            if a.is_killed() {
                break;
            }
            let paused = a.session.upgrade().is_none_or(|s| s.paused());
            reg.state_changed(
                &a,
                if paused {
                    AgentState::Paused
                } else {
                    AgentState::Idle
                },
            );
        }
    });
}

/// One turn: the prompt goes into the chat (durably), then to the model.
async fn run_turn(a: &Agent, prompt: &str) -> Result<String, String> {
    a.say("user", "", prompt)?;
    Err(NO_BACKEND.to_owned())
}
