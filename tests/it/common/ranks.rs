//! Ranks as threads of one process: a [`Comm`] whose collectives go through shared memory,
//! so code written for the ranks of an MPI job can be checked against one process without
//! MPI (the default `cargo test`).

use std::sync::{Arc, Barrier, Mutex};

use anyhow::Result;
use fsgp::comm::Comm;

struct Shared {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<u8>>>,
}

/// Rank `rank` of `size` threads.
pub struct ThreadRanks {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

impl ThreadRanks {
    /// Runs `f` on `size` threads, one per rank, and returns their results in rank order.
    pub fn run<T: Send>(size: usize, f: impl Fn(&ThreadRanks) -> T + Sync) -> Vec<T> {
        let shared = Arc::new(Shared {
            barrier: Barrier::new(size),
            slots: Mutex::new(vec![Vec::new(); size]),
        });
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    let comm = ThreadRanks {
                        rank,
                        size,
                        shared: Arc::clone(&shared),
                    };
                    let f = &f;
                    s.spawn(move || f(&comm))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Every rank's `mine`, in rank order, on every rank.
    fn all_gather(&self, mine: &[u8]) -> Vec<Vec<u8>> {
        self.shared.slots.lock().unwrap()[self.rank] = mine.to_vec();
        self.shared.barrier.wait();
        let all = self.shared.slots.lock().unwrap().clone();
        // No rank may overwrite its slot before every rank has read the round.
        self.shared.barrier.wait();
        all
    }
}

fn to_bytes(values: &[f64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn to_f64(bytes: &[u8]) -> impl Iterator<Item = f64> + '_ {
    bytes
        .chunks_exact(8)
        .map(|w| f64::from_le_bytes(w.try_into().unwrap()))
}

impl Comm for ThreadRanks {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn sum_all(&self, values: &mut [f64]) -> Result<()> {
        let all = self.all_gather(&to_bytes(values));
        values.iter_mut().for_each(|v| *v = 0.0);
        for part in &all {
            for (v, x) in values.iter_mut().zip(to_f64(part)) {
                *v += x;
            }
        }
        Ok(())
    }

    fn broadcast(&self, values: &mut [f64]) -> Result<()> {
        let all = self.all_gather(&to_bytes(values));
        for (v, x) in values.iter_mut().zip(to_f64(&all[0])) {
            *v = x;
        }
        Ok(())
    }

    fn broadcast_bytes(&self, bytes: &mut [u8]) -> Result<()> {
        let all = self.all_gather(bytes);
        bytes.copy_from_slice(&all[0]);
        Ok(())
    }

    fn gather_bytes(&self, part: &[u8]) -> Result<Vec<Vec<u8>>> {
        let all = self.all_gather(part);
        Ok(if self.rank == 0 { all } else { Vec::new() })
    }

    fn barrier(&self) -> Result<()> {
        self.shared.barrier.wait();
        Ok(())
    }
}
