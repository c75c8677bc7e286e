//! How the library's progress events ([`crate::progress`]) look on the command line
//! (`--log-format`, `--quiet`; `docs/progress.md`): today's lines of text, JSON lines, or
//! progress bars on a terminal.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::choice::choice_enum;
use crate::progress::{CutReason, EpochFigures, Event, Installed, Level, Scores, Sink, Validation};

choice_enum! {
    /// How progress is shown (`--log-format`).
    #[derive(Default)]
    pub enum LogFormat("log format") {
        /// Bars when standard error is a terminal, text lines otherwise.
        #[default]
        Auto = "auto" => "bars when standard error is a terminal, text otherwise",
        /// One line per epoch, validation score and note.
        Text = "text" => "a line per epoch, validation score and note",
        /// One JSON object per event.
        Jsonl = "jsonl" => "one JSON object per event, for programs (docs/progress.md)",
        /// A bar per running task, notes above the bars.
        Bars = "bars" => "a progress bar per running stage or run, notes above the bars",
    }
}

/// Installs the sink `format` and `quiet` ask for, for as long as the guard lives.
pub fn install(format: LogFormat, quiet: bool) -> Installed {
    let format = match format {
        LogFormat::Auto if std::io::stderr().is_terminal() => LogFormat::Bars,
        LogFormat::Auto => LogFormat::Text,
        chosen => chosen,
    };
    let sink: Arc<dyn Sink> = match format {
        LogFormat::Jsonl => Arc::new(JsonLines::new(std::io::stderr())),
        LogFormat::Bars if !quiet => Arc::new(Bars::new()),
        _ => Arc::new(TextLines::new(std::io::stderr())),
    };
    let sink = match quiet {
        true => Arc::new(Quiet(sink)),
        false => sink,
    };
    crate::progress::install(sink)
}

/// `--quiet`: passes on only warnings (and nothing of progress), so what a command prints is
/// its result.
struct Quiet(Arc<dyn Sink>);

impl Sink for Quiet {
    fn event(&self, event: &Event) {
        if let Event::Note {
            level: Level::Warning,
            ..
        } = event
        {
            self.0.event(event);
        }
    }
}

/// `--log-format text`: the lines the stages have always printed, one per epoch, validation
/// score and note; steps are not shown.
struct TextLines<W: Write + Send> {
    out: Mutex<W>,
}

impl<W: Write + Send> TextLines<W> {
    fn new(out: W) -> Self {
        TextLines {
            out: Mutex::new(out),
        }
    }
}

impl<W: Write + Send> Sink for TextLines<W> {
    fn event(&self, event: &Event) {
        if let Some(line) = text_line(event) {
            let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
            // Progress that cannot be written (a closed pipe) must not stop the work.
            let _ = writeln!(out, "{line}");
        }
    }
}

/// The line of text an event prints, if any.
pub fn text_line(event: &Event) -> Option<String> {
    match event {
        Event::Epoch { figures, .. } => Some(epoch_line(figures)),
        Event::Validation { score, .. } => Some(validation_line(score)),
        Event::Note { level, message, .. } => Some(match level {
            Level::Info => message.clone(),
            Level::Warning => format!("warning: {message}"),
        }),
        Event::Started { .. } | Event::Steps { .. } | Event::Finished { .. } => None,
    }
}

/// "epoch 3/10: mean minibatch ELBO -1.234560e3, 0.5 s, queue wait 1.0 %".
fn epoch_line(f: &EpochFigures) -> String {
    let cut = match &f.cut {
        None => String::new(),
        Some(cut) => {
            let why = match cut.reason {
                CutReason::StoppedEarly => "stopped early".to_string(),
                CutReason::Steps { steps } => format!("the end of --steps {steps}"),
                CutReason::MaxSteps => "stopped by --max-steps".to_string(),
            };
            format!(
                " ({why} after {} of {} minibatches)",
                cut.batches_done, cut.batches_in_epoch
            )
        }
    };
    format!(
        "epoch {}/{}: mean minibatch ELBO {:.6e}, {:.1} s, queue wait {:.1} %{cut}",
        f.epoch,
        f.epochs,
        f.mean_elbo,
        f.seconds,
        100.0 * f.queue_wait
    )
}

/// A held-out evaluation's line (by epoch) or early stopping's (by step).
/// A bar's last score: a ranking's P@1 and an accuracy in percent, as their lines print
/// them; early stopping's watched figure as it is.
fn bar_score(v: &Validation) -> String {
    let (metric, value) = v.scores.headline();
    match v.scores {
        Scores::Ranking { .. } | Scores::Classes { .. } => {
            format!("'{}' {metric} {:.2}", v.split, 100.0 * value)
        }
        Scores::EarlyStopping { .. } => format!("'{}' {metric} {value:.4}", v.split),
    }
}

fn validation_line(v: &Validation) -> String {
    let (split, secs) = (&v.split, v.seconds);
    let epoch = v.epoch.unwrap_or(0);
    match v.scores {
        Scores::Ranking {
            p_at_1,
            p_at_3,
            p_at_5,
            psp_at_5,
        } => format!(
            "epoch {epoch}: '{split}' P@1 {:.2} P@3 {:.2} P@5 {:.2} PSP@5 {:.2} ({secs:.1} s)",
            100.0 * p_at_1,
            100.0 * p_at_3,
            100.0 * p_at_5,
            100.0 * psp_at_5,
        ),
        Scores::Classes { accuracy, nlp } => format!(
            "epoch {epoch}: '{split}' accuracy {:.2} %, mean NLP {nlp:.4} ({secs:.1} s)",
            100.0 * accuracy
        ),
        Scores::EarlyStopping {
            metric,
            value,
            best_value,
            best_step,
            since_best,
            patience,
            improved,
            stopping,
        } => {
            let standing = match (improved, stopping) {
                (true, _) => "the best so far".to_string(),
                (false, false) => format!(
                    "best {best_value:.6} at step {best_step}, {since_best} of {patience} \
                     scores without improvement"
                ),
                (false, true) => format!(
                    "best {best_value:.6} at step {best_step}, {patience} scores without \
                     improvement: stopping"
                ),
            };
            format!(
                "step {}: '{split}' {metric} {value:.6}, {standing} ({secs:.1} s)",
                v.step.unwrap_or(0)
            )
        }
    }
}

/// `--log-format jsonl`: every event as one JSON object on its line. Steps events come at
/// most once per [`STEPS_EVERY`] per task (and always the last before a task's end), so a
/// program can follow a run without reading a line per optimiser step.
struct JsonLines<W: Write + Send> {
    state: Mutex<JsonState<W>>,
}

/// How often a task's steps are reported in JSON lines.
const STEPS_EVERY: Duration = Duration::from_secs(1);

struct JsonState<W> {
    out: W,
    /// Per task: when its steps were last written, and a steps event held back since.
    steps: HashMap<u64, (Instant, Option<Event>)>,
}

impl<W: Write + Send> JsonLines<W> {
    fn new(out: W) -> Self {
        JsonLines {
            state: Mutex::new(JsonState {
                out,
                steps: HashMap::new(),
            }),
        }
    }
}

impl<W: Write> JsonState<W> {
    fn write(&mut self, event: &Event) {
        if let Ok(line) = serde_json::to_string(event) {
            let _ = writeln!(self.out, "{line}");
        }
    }
}

impl<W: Write + Send> Sink for JsonLines<W> {
    fn event(&self, event: &Event) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match *event {
            Event::Steps { task, .. } => {
                let due = match state.steps.get(&task) {
                    Some((last, _)) => now.duration_since(*last) >= STEPS_EVERY,
                    None => true,
                };
                let held = match due {
                    true => {
                        state.write(event);
                        None
                    }
                    false => Some(event.clone()),
                };
                let last = match due {
                    true => now,
                    false => state.steps[&task].0,
                };
                state.steps.insert(task, (last, held));
            }
            Event::Finished { task } => {
                if let Some((_, Some(held))) = state.steps.remove(&task) {
                    state.write(&held);
                }
                state.write(event);
            }
            _ => state.write(event),
        }
    }
}

/// `--log-format bars`: a bar per running task with its steps, rate, time left and its last
/// epoch and validation score; notes are printed above the bars, epochs and scores only
/// change their bar.
struct Bars {
    bars: MultiProgress,
    running: Mutex<HashMap<u64, Running>>,
}

/// A running task's bar and what its message shows.
struct Running {
    bar: ProgressBar,
    epoch: Option<String>,
    score: Option<String>,
}

impl Bars {
    fn new() -> Self {
        Bars {
            bars: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            running: Mutex::new(HashMap::new()),
        }
    }

    fn bar(&self, kind: &str, name: &str, total: Option<u64>, unit: &str) -> ProgressBar {
        let template = match (total, unit) {
            (None, _) => format!("{kind} {name} {{spinner}} {{pos}} {unit} {{elapsed}} {{msg}}"),
            (Some(_), "bytes") => format!(
                "{kind} {name} {{bar:30}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} ETA \
                 {{eta}} {{msg}}"
            ),
            (Some(_), _) => format!(
                "{kind} {name} {{bar:30}} {{pos}}/{{len}} {unit} {{per_sec:.1}} ETA {{eta}} {{msg}}"
            ),
        };
        let bar = match total {
            Some(total) => ProgressBar::new(total),
            None => ProgressBar::new_spinner(),
        };
        if let Ok(style) = ProgressStyle::with_template(&template) {
            bar.set_style(style);
        }
        self.bars.add(bar)
    }
}

impl Sink for Bars {
    fn event(&self, event: &Event) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Started {
                task,
                kind,
                name,
                total,
                unit,
            } => {
                let bar = self.bar(kind, name, *total, unit);
                running.insert(
                    *task,
                    Running {
                        bar,
                        epoch: None,
                        score: None,
                    },
                );
            }
            Event::Steps { task, done } => {
                if let Some(r) = running.get(task) {
                    r.bar.set_position(*done);
                }
            }
            Event::Epoch { task, figures } => {
                if let Some(r) = running.get_mut(task) {
                    r.epoch = Some(format!(
                        "epoch {}/{} ELBO {:.4e}",
                        figures.epoch, figures.epochs, figures.mean_elbo
                    ));
                    r.show();
                }
            }
            Event::Validation { task, score } => {
                if let Some(r) = running.get_mut(task) {
                    r.score = Some(bar_score(score));
                    r.show();
                }
            }
            Event::Note { .. } => {
                if let Some(line) = text_line(event) {
                    self.bars.suspend(|| eprintln!("{line}"));
                }
            }
            Event::Finished { task } => {
                if let Some(r) = running.remove(task) {
                    r.bar.finish_and_clear();
                    self.bars.remove(&r.bar);
                }
            }
        }
    }
}

impl Running {
    fn show(&self) {
        let parts: Vec<&str> = [&self.epoch, &self.score]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        self.bar.set_message(parts.join(", "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::EpochCut;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn epoch(cut: Option<EpochCut>) -> Event {
        Event::Epoch {
            task: 1,
            figures: EpochFigures {
                epoch: 3,
                epochs: 10,
                mean_elbo: -1234.56,
                seconds: 0.54,
                queue_wait: 0.012,
                cut,
            },
        }
    }

    #[test]
    fn text_prints_the_stages_lines() {
        let out = Shared::default();
        let sink = TextLines::new(out.clone());
        sink.event(&Event::Steps { task: 1, done: 4 });
        sink.event(&epoch(None));
        sink.event(&epoch(Some(EpochCut {
            reason: CutReason::Steps { steps: 25 },
            batches_done: 5,
            batches_in_epoch: 8,
        })));
        sink.event(&Event::Validation {
            task: 1,
            score: Validation {
                split: "validation".into(),
                epoch: None,
                step: Some(40),
                seconds: 0.25,
                scores: Scores::EarlyStopping {
                    metric: "accuracy",
                    value: 0.5,
                    best_value: 0.75,
                    best_step: 20,
                    since_best: 1,
                    patience: 3,
                    improved: false,
                    stopping: false,
                },
            },
        });
        sink.event(&Event::Note {
            task: None,
            level: Level::Warning,
            message: "low disk".into(),
        });
        assert_eq!(
            out.text(),
            "epoch 3/10: mean minibatch ELBO -1.234560e3, 0.5 s, queue wait 1.2 %\n\
             epoch 3/10: mean minibatch ELBO -1.234560e3, 0.5 s, queue wait 1.2 % (the end \
             of --steps 25 after 5 of 8 minibatches)\n\
             step 40: 'validation' accuracy 0.500000, best 0.750000 at step 20, 1 of 3 scores \
             without improvement (0.2 s)\n\
             warning: low disk\n"
        );
    }

    #[test]
    fn jsonl_writes_an_object_per_event_and_throttles_steps() {
        let out = Shared::default();
        let sink = JsonLines::new(out.clone());
        for done in 1..=100 {
            sink.event(&Event::Steps { task: 7, done });
        }
        sink.event(&epoch(None));
        sink.event(&Event::Finished { task: 7 });
        let lines: Vec<serde_json::Value> = out
            .text()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        let names: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
        // The first steps event, the epoch, the last steps event held back, the end.
        assert_eq!(names, ["steps", "epoch", "steps", "finished"]);
        assert_eq!(lines[0]["done"], 1);
        assert_eq!(lines[1]["mean_elbo"], -1234.56);
        assert_eq!(lines[2]["done"], 100);
    }

    #[test]
    fn quiet_passes_only_warnings() {
        let out = Shared::default();
        let sink = Quiet(Arc::new(TextLines::new(out.clone())));
        sink.event(&epoch(None));
        sink.event(&Event::Note {
            task: None,
            level: Level::Info,
            message: "a note".into(),
        });
        sink.event(&Event::Note {
            task: None,
            level: Level::Warning,
            message: "a warning".into(),
        });
        assert_eq!(out.text(), "warning: a warning\n");
    }
}
