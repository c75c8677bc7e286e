//! Synchronous data-parallel training over the ranks of an MPI job (`docs/scale-out.md`,
//! "train"): each rank evaluates its share of the global minibatch, the shares' bound and
//! flat gradient are summed by one all-reduce (the KL counted once: [`all_reduce`]), and
//! every rank applies the same Adam step;
//! a checksum of the parameters compares the ranks every [`CHECK_EVERY`] steps.
//!
//! Nothing here runs in one process: the step loop calls it only when the job has more than
//! one rank, so a one-process run computes exactly what it computed before.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::comm::Comm;
use crate::model::bound::objective::BoundAndGrads;
use crate::model::optim::AdamState;
use crate::model::params::{flat_len, flat_values, set_flat, Params};

/// Steps between two comparisons of the ranks' parameters (besides the comparisons before
/// every checkpoint and at the start). Hashing the parameters and Adam's moments costs a
/// few milliseconds at AmazonCat's size (≈ 4.3 M doubles), against ≈ 0.5 s per step.
pub const CHECK_EVERY: u64 = 50;

/// The bound and gradient of the whole minibatch on every rank, from this rank's `share`
/// of it: evaluated with its terms weighted K·N/B, it holds K·data_r − KL (the KL is a
/// function of the parameters alone, the same on every rank), so the ranks' sum divided by
/// K is Σ_r data_r − KL: the bound, with the KL counted once. The value and the flat
/// gradient travel in one buffer [1 + flat_len]. With K a power of two the scaling by K and
/// 1/K is exact; the only difference from one process is the order of the sums. Returns
/// the time spent in the all-reduce (including the wait for the slowest rank).
pub fn all_reduce(comm: &dyn Comm, share: &mut BoundAndGrads) -> Result<Duration> {
    let mut buf = Vec::with_capacity(1 + flat_len(&share.grads));
    buf.push(share.value);
    buf.extend(flat_values(&share.grads));
    let t = Instant::now();
    comm.sum_all(&mut buf)?;
    let spent = t.elapsed();
    let ranks = comm.size() as f64;
    for v in &mut buf {
        *v /= ranks;
    }
    share.value = buf[0];
    set_flat(&mut share.grads, &buf[1..])?;
    Ok(spent)
}

/// xxh3 of the parameters, Adam's moments and its step count, as little-endian bytes.
pub fn checksum(params: &Params, adam: &AdamState) -> u64 {
    let values = flat_values(params);
    let mut bytes = Vec::with_capacity(8 * (values.len() + 2 * adam.m.len() + 1));
    for v in values.iter().chain(&adam.m).chain(&adam.v) {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(&adam.t.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// Fails on every rank, naming the step and the ranks, unless every rank holds the same
/// parameters and optimiser state as rank 0 (compared through [`checksum`], gathered to
/// rank 0, whose verdict is broadcast).
pub fn check_identical(
    comm: &dyn Comm,
    step: u64,
    params: &Params,
    adam: &AdamState,
) -> Result<()> {
    let mine = checksum(params, adam);
    let all = comm.gather_bytes(&mine.to_le_bytes())?;
    let verdict = if comm.is_root() {
        divergence(step, &all)
    } else {
        String::new()
    };
    let len = comm.broadcast_u64(verdict.len() as u64)?;
    if len == 0 {
        return Ok(());
    }
    let mut message = verdict.into_bytes();
    message.resize(len as usize, 0);
    comm.broadcast_bytes(&mut message)?;
    bail!("{}", String::from_utf8_lossy(&message))
}

/// The message for checksums (each 8 bytes, in rank order) that are not all rank 0's, or
/// an empty string when they are.
fn divergence(step: u64, sums: &[Vec<u8>]) -> String {
    let sums: Vec<u64> = sums
        .iter()
        .map(|b| u64::from_le_bytes(b[..8].try_into().expect("8 bytes")))
        .collect();
    let differ: Vec<String> = (1..sums.len())
        .filter(|&r| sums[r] != sums[0])
        .map(|r| r.to_string())
        .collect();
    if differ.is_empty() {
        return String::new();
    }
    let listed: Vec<String> = sums
        .iter()
        .enumerate()
        .map(|(r, s)| format!("rank {r} {s:016x}"))
        .collect();
    format!(
        "step {step}: the parameters diverged across the MPI ranks: rank(s) {} differ from \
         rank 0 (xxh3 of the parameters and Adam's moments: {}); the ranks must apply \
         identical steps, so this is a bug or a faulty node; resume from the last \
         checkpoint",
        differ.join(", "),
        listed.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Single;
    use crate::model::params::tests::every_block;

    #[test]
    fn checksums_see_one_bit_and_one_process_always_agrees() {
        let p = every_block();
        let adam = AdamState::new(&p);
        let mut q = p.clone();
        q.q.mu_mut()[(1, 1)] = f64::from_bits(q.q.mu()[(1, 1)].to_bits() ^ 1);
        assert_ne!(checksum(&p, &adam), checksum(&q, &adam));
        assert_eq!(checksum(&p, &adam), checksum(&p.clone(), &adam.clone()));
        check_identical(&Single, 3, &p, &adam).unwrap();
        let same = 5u64.to_le_bytes().to_vec();
        assert_eq!(divergence(9, &[same.clone(), same.clone()]), "");
        let message = divergence(9, &[same.clone(), same, 6u64.to_le_bytes().to_vec()]);
        assert!(message.starts_with("step 9: ") && message.contains("rank(s) 2 differ"));
    }
}
