//! The processes a stage runs on: one (the default), or the ranks of an MPI job
//! (`mpirun -n K pipeline …` with the `mpi` cargo feature; docs/scale-out.md).
//!
//! A stage that runs data-parallel maps over its share of the row chunks
//! ([`Comm::owns_chunk`]) and combines the partial results with the collectives below. The
//! single-process [`Single`] is a true no-op: one rank, every chunk its own, every
//! collective returns its input untouched, so a build without MPI (and a run without
//! `mpirun`) computes exactly what it computed before this module existed.
//!
//! Rank 0 owns the catalog and the published outputs (see [`crate::stage`]).

use anyhow::Result;

/// A group of processes running one stage together.
///
/// Every collective must be called by every rank, in the same order, with the same
/// lengths (the stage code is written so that each rank walks the same control flow).
pub trait Comm: Sync {
    /// This process's rank, 0..size.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn size(&self) -> usize;

    /// `values` ← the element-wise sum of every rank's `values`, on every rank.
    fn sum_all(&self, values: &mut [f64]) -> Result<()>;

    /// `values` ← rank 0's `values`, on every rank (same length everywhere).
    fn broadcast(&self, values: &mut [f64]) -> Result<()>;

    /// `bytes` ← rank 0's `bytes`, on every rank (same length everywhere).
    fn broadcast_bytes(&self, bytes: &mut [u8]) -> Result<()>;

    /// Rank 0 receives every rank's `part` (lengths may differ), in rank order; other ranks
    /// receive an empty vector.
    fn gather_bytes(&self, part: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// True on the rank that writes the catalog and publishes outputs.
    fn is_root(&self) -> bool {
        self.rank() == 0
    }

    /// Whether chunk `index` (0-based, in the split's order) is this rank's: chunk i goes to
    /// rank i mod K, a disjoint, deterministic cover of the chunks.
    fn owns_chunk(&self, index: usize) -> bool {
        index % self.size() == self.rank()
    }

    /// `values` gathered to rank 0 as f64 (the parts in rank order); other ranks receive an
    /// empty vector.
    fn gather_f64(&self, part: &[f64]) -> Result<Vec<Vec<f64>>> {
        let bytes: Vec<u8> = part.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(self
            .gather_bytes(&bytes)?
            .into_iter()
            .map(|b| {
                b.chunks_exact(8)
                    .map(|w| f64::from_le_bytes(w.try_into().expect("8 bytes")))
                    .collect()
            })
            .collect())
    }

    /// Rank 0's `value` on every rank.
    fn broadcast_u64(&self, value: u64) -> Result<u64> {
        let mut bytes = value.to_le_bytes();
        self.broadcast_bytes(&mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }
}

/// One process: rank 0 of 1. Every collective leaves its input as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct Single;

impl Comm for Single {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn sum_all(&self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }

    fn broadcast(&self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }

    fn broadcast_bytes(&self, _bytes: &mut [u8]) -> Result<()> {
        Ok(())
    }

    fn gather_bytes(&self, part: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![part.to_vec()])
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(feature = "mpi")]
pub use with_mpi::{Mpi, MpiJob};

#[cfg(feature = "mpi")]
mod with_mpi {
    use std::sync::{Mutex, MutexGuard};

    use anyhow::{bail, Context, Result};
    use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
    use mpi::datatype::PartitionMut;
    use mpi::environment::Universe;
    use mpi::topology::{Communicator, SimpleCommunicator};
    use mpi::Threading;

    use super::Comm;

    /// MPI for the life of the process: initialised once by [`MpiJob::start`] (in the
    /// command line, before any stage), finalised when it is dropped.
    pub struct MpiJob {
        comm: Mpi,
        // Dropped last: MPI_Finalize after the communicator's last use.
        _universe: Universe,
    }

    impl MpiJob {
        /// Initialises MPI with `MPI_THREAD_SERIALIZED`: the stages call collectives from
        /// a worker thread of their rayon pool, never from two threads at once.
        pub fn start() -> Result<MpiJob> {
            let (universe, level) = mpi::initialize_with_threading(Threading::Serialized)
                .context("initialising MPI (was it initialised twice?)")?;
            if level < Threading::Serialized {
                bail!("the MPI library offers thread level {level:?}; fsgp needs Serialized");
            }
            let world = universe.world();
            Ok(MpiJob {
                comm: Mpi {
                    rank: world.rank() as usize,
                    size: world.size() as usize,
                    world: Mutex::new(World(world)),
                },
                _universe: universe,
            })
        }

        pub fn comm(&self) -> &Mpi {
            &self.comm
        }

        /// Ends every rank of the job with `code` (MPI_Abort): a rank that fails must not
        /// leave the others waiting in a collective.
        pub fn abort(&self, code: i32) -> ! {
            self.comm.lock().0.abort(code)
        }
    }

    /// The world communicator as a [`Comm`].
    pub struct Mpi {
        rank: usize,
        size: usize,
        world: Mutex<World>,
    }

    struct World(SimpleCommunicator);

    // SAFETY: MPI runs with MPI_THREAD_SERIALIZED (checked in `MpiJob::start`), which allows
    // calls from any thread as long as no two are concurrent; `Mpi` only reaches the
    // communicator through its mutex, which serialises them.
    unsafe impl Send for World {}

    impl Mpi {
        /// The communicator, for one collective at a time.
        fn lock(&self) -> MutexGuard<'_, World> {
            // A poisoned lock means a rank panicked inside a collective: nothing to recover.
            self.world.lock().expect("MPI communicator lock")
        }
    }

    impl Comm for Mpi {
        fn rank(&self) -> usize {
            self.rank
        }

        fn size(&self) -> usize {
            self.size
        }

        fn sum_all(&self, values: &mut [f64]) -> Result<()> {
            let send = values.to_vec();
            self.lock()
                .0
                .all_reduce_into(&send[..], values, SystemOperation::sum());
            Ok(())
        }

        fn broadcast(&self, values: &mut [f64]) -> Result<()> {
            self.lock().0.process_at_rank(0).broadcast_into(values);
            Ok(())
        }

        fn broadcast_bytes(&self, bytes: &mut [u8]) -> Result<()> {
            self.lock().0.process_at_rank(0).broadcast_into(bytes);
            Ok(())
        }

        fn gather_bytes(&self, part: &[u8]) -> Result<Vec<Vec<u8>>> {
            // Every part goes out behind one byte: OpenMPI refuses an empty buffer (Rust's
            // dangling pointer) in MPI_Gatherv.
            let framed: Vec<u8> = std::iter::once(0u8).chain(part.iter().copied()).collect();
            let world = self.lock();
            let root = world.0.process_at_rank(0);
            let len = i32::try_from(framed.len())
                .context("a gathered part exceeds 2 GiB (MPI counts are 32-bit)")?;
            if self.rank != 0 {
                root.gather_into(&len);
                root.gather_varcount_into(&framed[..]);
                return Ok(Vec::new());
            }
            let mut lens = vec![0i32; self.size];
            root.gather_into_root(&len, &mut lens[..]);
            let total: usize = lens.iter().map(|&l| l as usize).sum();
            if i32::try_from(total).is_err() {
                // The other ranks are already inside the gather: end the job, not just
                // this call (the command line aborts on this error).
                bail!(
                    "one gather of {total} bytes from {} ranks exceeds MPI's 2 GiB offsets; \
                     ingest smaller chunks (--chunk-mb) or use fewer ranks",
                    self.size
                );
            }
            let displs: Vec<i32> = lens
                .iter()
                .scan(0i32, |at, &l| {
                    let start = *at;
                    *at += l;
                    Some(start)
                })
                .collect();
            let mut all = vec![0u8; total];
            let mut partition = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
            root.gather_varcount_into_root(&framed[..], &mut partition);
            Ok(lens
                .iter()
                .zip(&displs)
                .map(|(&l, &d)| all[d as usize + 1..(d + l) as usize].to_vec())
                .collect())
        }

        fn barrier(&self) -> Result<()> {
            self.lock().0.barrier();
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_process_collectives_leave_their_input() {
        let c = Single;
        let mut v = vec![1.5, -2.0, f64::MIN_POSITIVE];
        let before = v.clone();
        c.sum_all(&mut v).unwrap();
        c.broadcast(&mut v).unwrap();
        assert_eq!(v, before);
        assert_eq!(c.gather_f64(&v).unwrap(), vec![before]);
        assert_eq!(c.broadcast_u64(7).unwrap(), 7);
        assert!((0..10).all(|i| c.owns_chunk(i)));
    }
}
