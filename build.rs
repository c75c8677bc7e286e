//! Intentionally empty: it exists so that the `[build-dependencies]` entry of Cargo.toml
//! (which unifies `syn`'s features between the default build and `--features mpi`) is
//! part of the build graph. It emits nothing and reruns only when it changes itself.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
}
