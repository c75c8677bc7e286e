//! A user's request to stop (Ctrl-C, `SIGTERM`, Python's `KeyboardInterrupt`), honoured at
//! the next point where stopping leaves the workspace whole.
//!
//! Killing a stage is already safe (a dead run is found and resumed or redone,
//! `crate::stage`), but it loses the work since the last checkpoint, and an embedding
//! process (the Python package) cannot be killed at all. So the request is a flag the caller
//! sets and the stages poll between units of work: training after a step (it writes a
//! checkpoint at that step first, so nothing is lost), ingest between chunks, the svd
//! between passes. A stage that sees it returns [`StoppedOnRequest`]; the run is recorded as failed
//! with that message, and the same command later takes it up as it takes up any failed run.
//!
//! The flag is an `Arc<AtomicBool>` the caller owns (a signal handler, or the Python
//! binding's polling thread) and the workspace carries to every stage it opens: no
//! process-global state.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A stop request shared between whoever may ask (a signal handler, another thread) and
/// the stage that honours it. Clones share one flag.
#[derive(Debug, Clone, Default)]
pub struct StopToken(Arc<AtomicBool>);

impl StopToken {
    /// A token nobody has asked to stop yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The flag itself, for a signal handler to set (`signal_hook::flag::register`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }

    /// Asks the stage that polls this token to stop at its next safe point.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// `Err(StoppedOnRequest)` once a stop was asked for; `at` says where the work stopped and what
    /// it kept (called only then).
    pub fn check(&self, at: impl FnOnce() -> String) -> Result<(), StoppedOnRequest> {
        match self.requested() {
            true => Err(StoppedOnRequest { at: at() }),
            false => Ok(()),
        }
    }
}

/// A stage ended early because a stop was asked for: not a fault. Its run is recorded as
/// failed with this message and is taken up again by the same command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stopped on request {at}")]
pub struct StoppedOnRequest {
    /// Where, and what was kept: "after step 120 (checkpoint at step 120)".
    pub at: String,
}

/// Whether `error` (anywhere in its chain) is a [`StoppedOnRequest`]: a request honoured, not a
/// failure.
pub fn is_stopped(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.is::<StoppedOnRequest>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_seen_by_every_clone_and_becomes_a_located_error() {
        let token = StopToken::new();
        let stage = token.clone();
        assert_eq!(stage.check(|| unreachable!("not asked yet")), Ok(()));
        token.request();
        let err = stage.check(|| "after step 3".into()).unwrap_err();
        assert_eq!(err.to_string(), "stopped on request after step 3");
        let chained = anyhow::Error::new(err).context("train run 4");
        assert!(is_stopped(&chained));
        assert!(!is_stopped(&anyhow::anyhow!("disk full")));
    }

    #[test]
    fn a_signal_handlers_flag_is_the_tokens() {
        let token = StopToken::new();
        token.flag().store(true, Ordering::SeqCst);
        assert!(token.requested());
    }
}
