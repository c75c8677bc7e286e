//! What a long command is doing, as typed events: a task (a stage's pass, a training run)
//! started, its steps done, an epoch's figures, a validation score, a note, its end. The
//! library emits events and never prints them; how they look (lines, JSON lines, progress
//! bars, nothing) is its caller's choice (`src/cli/progress.rs` for the `pipeline` binary,
//! `docs/progress.md`).
//!
//! # How events reach a sink
//!
//! One process-wide sink, installed by the caller with [`install`], as the `log` crate's
//! logger is: the stages are deep call trees (the training loop, the ingest readers on their
//! threads) that would otherwise all take a sink argument for a concern none of them
//! decides, and an embedding host (the Python package) can install its own without any
//! stage's signature changing. [`install`] returns a guard that puts the previous sink back,
//! so a host that runs several commands in turn gets each one's sink for its duration.
//!
//! **Without a sink** (library use, unit tests) every event is dropped: the library prints
//! nothing on its own. `fsgp::cli::run` installs the sink its command line asks for.
//!
//! Only the writing process of an MPI job emits a run's events ([`Progress::silent`] for the
//! others), so a job of K ranks reports each line once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;

/// Where events go: a renderer chosen by the caller. Called from any thread, in the order
/// the library emits them (one thread's events in order).
pub trait Sink: Send + Sync {
    fn event(&self, event: &Event);
}

/// One thing that happened. Serialised (for `--log-format jsonl`) as one JSON object whose
/// `"event"` field names the variant in snake case (`docs/progress.md` lists the fields).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A task began: `kind` is the stage (`train`, `svd`, `ingest`, …), `name` what it works
    /// on; `total` counts its `unit`s when known in advance.
    Started {
        task: u64,
        kind: &'static str,
        name: String,
        total: Option<u64>,
        unit: &'static str,
    },
    /// `done` of the task's `total` units are done.
    Steps { task: u64, done: u64 },
    /// A training epoch ended.
    Epoch {
        task: u64,
        #[serde(flatten)]
        figures: EpochFigures,
    },
    /// Scores on a held-out split.
    Validation {
        task: u64,
        #[serde(flatten)]
        score: Validation,
    },
    /// A line of text for a person: what a stage found, decided or wrote.
    Note {
        task: Option<u64>,
        level: Level,
        message: String,
    },
    /// The task ended (done, failed or stopped: its other events and the command's result
    /// say which).
    Finished { task: u64 },
}

/// How much a note matters: warnings are kept when progress is switched off (`--quiet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Info,
    Warning,
}

/// A training epoch's figures: the same ones the catalog records for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochFigures {
    /// The epoch just ended, from 1.
    pub epoch: u64,
    /// The epochs of the run's configuration.
    pub epochs: u64,
    /// The mean minibatch ELBO over the epoch's steps.
    pub mean_elbo: f64,
    /// The epoch's wall-clock seconds.
    pub seconds: f64,
    /// The fraction of those seconds spent waiting for minibatches.
    pub queue_wait: f64,
    /// Set when the epoch ended before its last minibatch.
    pub cut: Option<EpochCut>,
}

/// An epoch that ended early: why, after how many of its minibatches.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochCut {
    pub reason: CutReason,
    pub batches_done: u64,
    pub batches_in_epoch: u64,
}

/// Why a run ended inside an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "why")]
pub enum CutReason {
    /// Early stopping ran out of patience.
    StoppedEarly,
    /// The end of a `--steps` budget.
    Steps { steps: u64 },
    /// `--max-steps` came first.
    MaxSteps,
}

/// Scores on a split, with when and how long they took.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Validation {
    /// The split scored (`validation`, `test`, …).
    pub split: String,
    /// The epoch after which it was scored (held-out evaluations).
    pub epoch: Option<u64>,
    /// The optimiser step after which it was scored (early stopping).
    pub step: Option<u64>,
    /// The seconds scoring took.
    pub seconds: f64,
    #[serde(flatten)]
    pub scores: Scores,
}

/// The figures of one scoring, by task. Fractions in [0, 1], not percentages.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Scores {
    /// A multi-label run's ranking figures.
    Ranking {
        p_at_1: f64,
        p_at_3: f64,
        p_at_5: f64,
        psp_at_5: f64,
    },
    /// A binary or multi-class run's accuracy and mean negative log predictive probability.
    Classes { accuracy: f64, nlp: f64 },
    /// Early stopping's score and where its search stands.
    EarlyStopping {
        metric: &'static str,
        value: f64,
        best_value: f64,
        best_step: u64,
        /// Scores since the best one (0: this one is the best so far).
        since_best: u64,
        patience: u64,
        /// Whether this score is the best so far.
        improved: bool,
        /// Whether the run stops here, out of patience.
        stopping: bool,
    },
}

impl Scores {
    /// The one figure a short display shows: P@1, accuracy, or early stopping's metric.
    pub fn headline(&self) -> (&'static str, f64) {
        match *self {
            Scores::Ranking { p_at_1, .. } => ("P@1", p_at_1),
            Scores::Classes { accuracy, .. } => ("accuracy", accuracy),
            Scores::EarlyStopping { metric, value, .. } => (metric, value),
        }
    }
}

/// The installed sink, if any.
static SINK: RwLock<Option<Arc<dyn Sink>>> = RwLock::new(None);

/// The next task's id: ids are unique in the process.
static NEXT_TASK: AtomicU64 = AtomicU64::new(1);

/// Sends `event` to the installed sink (dropped when there is none).
pub fn emit(event: &Event) {
    // A sink that panicked poisons the lock; the events still have a sink to go to.
    let sink = SINK.read().unwrap_or_else(|e| e.into_inner());
    if let Some(sink) = sink.as_ref() {
        sink.event(event);
    }
}

/// Installs `sink` for the whole process until the guard is dropped, which puts back the
/// sink that was there before.
#[must_use = "the sink is uninstalled when the guard is dropped"]
pub fn install(sink: Arc<dyn Sink>) -> Installed {
    let mut slot = SINK.write().unwrap_or_else(|e| e.into_inner());
    Installed {
        previous: slot.replace(sink),
    }
}

/// Keeps a sink installed ([`install`]).
pub struct Installed {
    previous: Option<Arc<dyn Sink>>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let mut slot = SINK.write().unwrap_or_else(|e| e.into_inner());
        *slot = self.previous.take();
    }
}

/// A note of no task: a line for a person.
pub fn note(message: impl Into<String>) {
    emit(&Event::Note {
        task: None,
        level: Level::Info,
        message: message.into(),
    });
}

/// A warning of no task (rendered as `warning: MESSAGE`; kept by `--quiet`).
pub fn warning(message: impl Into<String>) {
    emit(&Event::Note {
        task: None,
        level: Level::Warning,
        message: message.into(),
    });
}

/// A running task: emits its `Started` event when made and its `Finished` event when
/// dropped, so an error that unwinds the stage still ends it (a bar is cleared).
pub struct Progress {
    /// None for a task whose events are not emitted ([`Progress::silent`]).
    id: Option<u64>,
    done: AtomicU64,
}

impl Progress {
    /// Starts a task of `kind` on `name`, `done` of `total` `unit`s already done (a resumed
    /// run).
    pub fn start(
        kind: &'static str,
        name: impl Into<String>,
        total: Option<u64>,
        unit: &'static str,
        done: u64,
    ) -> Progress {
        let id = NEXT_TASK.fetch_add(1, Ordering::Relaxed);
        emit(&Event::Started {
            task: id,
            kind,
            name: name.into(),
            total,
            unit,
        });
        let task = Progress {
            id: Some(id),
            done: AtomicU64::new(done),
        };
        if done > 0 {
            task.set(done);
        }
        task
    }

    /// A task that emits nothing: another process of an MPI job reports the run.
    pub fn silent() -> Progress {
        Progress {
            id: None,
            done: AtomicU64::new(0),
        }
    }

    fn emit_with(&self, event: impl FnOnce(u64) -> Event) {
        if let Some(id) = self.id {
            emit(&event(id));
        }
    }

    /// The units done so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// `done` units are done in all.
    pub fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.emit_with(|task| Event::Steps { task, done });
    }

    /// `n` more units are done (from any thread).
    pub fn advance(&self, n: u64) {
        let done = self.done.fetch_add(n, Ordering::Relaxed) + n;
        self.emit_with(|task| Event::Steps { task, done });
    }

    /// An epoch of this (training) task ended.
    pub fn epoch(&self, figures: EpochFigures) {
        self.emit_with(|task| Event::Epoch { task, figures });
    }

    /// This task scored a held-out split.
    pub fn validation(&self, score: Validation) {
        self.emit_with(|task| Event::Validation { task, score });
    }

    /// A note of this task.
    pub fn note(&self, message: impl Into<String>) {
        self.emit_with(|task| Event::Note {
            task: Some(task),
            level: Level::Info,
            message: message.into(),
        });
    }

    /// A warning of this task.
    pub fn warning(&self, message: impl Into<String>) {
        self.emit_with(|task| Event::Note {
            task: Some(task),
            level: Level::Warning,
            message: message.into(),
        });
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.emit_with(|task| Event::Finished { task });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Keeps every event it is given.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<Event>>);

    impl Sink for Recorder {
        fn event(&self, event: &Event) {
            self.0.lock().unwrap().push(event.clone());
        }
    }

    /// Other tests of the crate may emit while the recorder is installed: only this test's
    /// events are looked at.
    #[test]
    fn a_task_reports_to_the_installed_sink_and_ends_when_dropped() {
        let recorder = Arc::new(Recorder::default());
        let id;
        {
            let _installed = install(recorder.clone());
            let task = Progress::start("train", "progress test", Some(10), "steps", 0);
            id = task.id.unwrap();
            task.advance(3);
            task.advance(2);
            Progress::silent().note("progress test: silent");
            drop(task);
            note("progress test: plain");
        }
        note("progress test: after the guard");
        let events = recorder.0.lock().unwrap().clone();
        let ours: Vec<&Event> = events
            .iter()
            .filter(|e| match e {
                Event::Started { task, .. }
                | Event::Steps { task, .. }
                | Event::Epoch { task, .. }
                | Event::Validation { task, .. }
                | Event::Finished { task } => *task == id,
                Event::Note { message, .. } => message.starts_with("progress test"),
            })
            .collect();
        assert_eq!(
            ours,
            [
                &Event::Started {
                    task: id,
                    kind: "train",
                    name: "progress test".into(),
                    total: Some(10),
                    unit: "steps"
                },
                &Event::Steps { task: id, done: 3 },
                &Event::Steps { task: id, done: 5 },
                &Event::Finished { task: id },
                &Event::Note {
                    task: None,
                    level: Level::Info,
                    message: "progress test: plain".into()
                },
            ]
        );
    }

    #[test]
    fn events_serialise_flat_with_their_event_name() {
        let event = Event::Validation {
            task: 4,
            score: Validation {
                split: "validation".into(),
                epoch: None,
                step: Some(12),
                seconds: 0.5,
                scores: Scores::Classes {
                    accuracy: 0.75,
                    nlp: 0.6,
                },
            },
        };
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"event": "validation", "task": 4, "split": "validation",
                "epoch": null, "step": 12, "seconds": 0.5, "kind": "classes",
                "accuracy": 0.75, "nlp": 0.6})
        );
    }
}
