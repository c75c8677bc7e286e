//! Every on-disk format the pipeline reads or writes, and the catalog that records them.

pub mod catalog;
pub mod checkpoint;
pub mod chunks;
pub mod classes;
pub mod footer;
pub mod identity;
pub mod integrity;
pub mod kinds;
pub mod model_file;
pub mod npy;
pub mod owned;
pub mod predictions;
pub mod rebuild;
pub mod scaling;
pub mod space;
pub mod tensors;
pub mod user_file;
pub mod verify;
pub mod workspace;
