//! The integration tests, one binary: each module below was a test binary of its own,
//! and every one linked arrow, parquet, faer and the bundled SQLite again (46 links on two
//! cores). `tests/architecture.rs` (the layering check CI runs first) and
//! `tests/mpi_ranks.rs` (built only with `--features mpi`) stay binaries of their own.
//! Run one module with `cargo test --test it MODULE::`.

mod common;

mod augment_reduce;
mod binary_task;
mod class_map_train;
mod classification_metrics;
mod concurrent_runs;
mod data_sizes;
mod decision_boundary;
mod disk_full;
mod early_stopping;
mod elbo_gradients;
mod evaluate_tasks;
mod export;
mod feature_ard;
mod fit;
mod inducing_axes;
mod inducing_identity;
mod inducing_inputs;
mod ingest_data;
mod ingest_errors;
mod ingest_libsvm;
mod integrity;
mod kernel_gradients;
mod kmeans;
mod likelihood;
mod lr_decay;
mod metrics;
mod multiclass_gradients;
mod multiclass_nlp;
mod multiclass_task;
mod multiclass_values;
mod natural_step;
mod option_ranges;
mod options_doc;
mod parse_props;
mod pipeline_run;
mod predict_input;
mod probit_likelihood;
mod progress;
mod q_form_combinations;
mod q_form_train;
mod q_forms;
mod serve;
mod shipped_specs;
mod size_checks;
mod spec_validation;
mod stage_kill;
mod status;
mod stop_request;
mod svd_accuracy;
mod svd_stage;
mod synth;
mod synth_learnable;
mod train_budget;
mod train_feature_ard;
mod train_kernels;
mod train_resume_rules;
mod train_stage;
mod transforms;
mod user_outputs;
mod validation_split;
mod warm_start;
