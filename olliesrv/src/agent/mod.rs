//! The agent floor: what runs an agent's turns. [`turn`] is the loop (prompt, model call,
//! tool calls, repeat), [`feed`] turns new feed values into turns, [`compact`] shrinks its history, [`hooks`] runs a profile's lifecycle
//! commands, [`nstools`] answers file tools inside the bead namespace, [`history`] holds the
//! message helpers they share. Below it: the state, the toolsrv link, the backends.
//!
//! [`turn`]: crate::agent::turn
//! [`feed`]: crate::agent::feed
//! [`compact`]: crate::agent::compact
//! [`hooks`]: crate::agent::hooks
//! [`nstools`]: crate::agent::nstools
//! [`history`]: crate::agent::history

pub(crate) mod compact;
pub(crate) mod feed;
pub(crate) mod history;
pub(crate) mod hooks;
pub(crate) mod instructions;
pub(crate) mod nstools;
pub(crate) mod outcome;
pub(crate) mod sandbox;
pub(crate) mod turn;

/// Retries of a rate-limited or transiently failed model call.
pub const RETRIES: u32 = 3;
