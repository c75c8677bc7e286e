//! Prediction over the ranks of an MPI job: in round j every rank ranks its chunk
//! j·K + rank (chunk i is rank i mod K's) and rank 0 gathers the ranks' blocks in rank
//! order, which is the chunks' order, and writes them as one process would: the same
//! blocks, the same row groups, the same file byte for byte. Rank 0 holds at most one
//! round's K chunks of predictions at a time.
//!
//! The blocks travel as a flat little-endian byte string (this module's private wire
//! format, never on disk): a u64 block count, then per block each column as a u64 length
//! followed by its values (row ids u64, offsets i32, labels u32, scores f32), a u8 that
//! says whether a probabilities column (f32, with its length) follows, and a u8 that says
//! whether the true classes' probabilities follow: then a column of u8 (1 where the row has
//! a value) and a column of f32 (the value, 0 where it has none).

use anyhow::{bail, Result};

use crate::comm::Comm;
use crate::store::predictions::PredictionBlock;

/// Runs `rank_chunk(i)` on this rank's chunks of `n_chunks` and hands every block, in the
/// chunks' order, to `write` on rank 0. Every rank must call it.
pub fn rank_over_ranks(
    comm: &dyn Comm,
    n_chunks: usize,
    rank_chunk: &mut dyn FnMut(usize) -> Result<Vec<PredictionBlock>>,
    write: &mut dyn FnMut(&PredictionBlock) -> Result<()>,
) -> Result<()> {
    let k = comm.size();
    for round in 0..n_chunks.div_ceil(k) {
        let index = round * k + comm.rank();
        let part = match index < n_chunks {
            true => encode(&rank_chunk(index)?),
            false => Vec::new(),
        };
        for bytes in comm.gather_bytes(&part)? {
            if bytes.is_empty() {
                continue;
            }
            for block in decode(&bytes)? {
                write(&block)?;
            }
        }
    }
    Ok(())
}

fn put_column<T: Copy, const N: usize>(out: &mut Vec<u8>, values: &[T], le: fn(T) -> [u8; N]) {
    out.extend((values.len() as u64).to_le_bytes());
    for &v in values {
        out.extend(le(v));
    }
}

/// `blocks` as the wire format above.
pub fn encode(blocks: &[PredictionBlock]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend((blocks.len() as u64).to_le_bytes());
    for b in blocks {
        put_column(&mut out, &b.row_ids, u64::to_le_bytes);
        put_column(&mut out, &b.offsets, i32::to_le_bytes);
        put_column(&mut out, &b.labels, u32::to_le_bytes);
        put_column(&mut out, &b.scores, f32::to_le_bytes);
        match &b.probabilities {
            Some(p) => {
                out.push(1);
                put_column(&mut out, p, f32::to_le_bytes);
            }
            None => out.push(0),
        }
        match &b.true_class {
            Some(t) => {
                out.push(1);
                let present: Vec<u8> = t.iter().map(|v| u8::from(v.is_some())).collect();
                let values: Vec<f32> = t.iter().map(|v| v.unwrap_or(0.0)).collect();
                put_column(&mut out, &present, u8::to_le_bytes);
                put_column(&mut out, &values, f32::to_le_bytes);
            }
            None => out.push(0),
        }
    }
    out
}

/// Reads the wire format above.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if self.bytes.len() < n {
            bail!("a rank sent a truncated block of predictions");
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
    }

    fn column<T, const N: usize>(&mut self, from: fn([u8; N]) -> T) -> Result<Vec<T>> {
        let len = usize::try_from(self.u64()?)?;
        let bytes = self.take(len.saturating_mul(N))?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| from(c.try_into().expect("N bytes")))
            .collect())
    }
}

/// The blocks [`encode`] wrote.
pub fn decode(bytes: &[u8]) -> Result<Vec<PredictionBlock>> {
    let mut r = Reader { bytes };
    let n = r.u64()?;
    let mut blocks = Vec::new();
    for _ in 0..n {
        let mut block = PredictionBlock {
            row_ids: r.column(u64::from_le_bytes)?,
            offsets: r.column(i32::from_le_bytes)?,
            labels: r.column(u32::from_le_bytes)?,
            scores: r.column(f32::from_le_bytes)?,
            probabilities: None,
            true_class: None,
        };
        if r.take(1)?[0] == 1 {
            block.probabilities = Some(r.column(f32::from_le_bytes)?);
        }
        if r.take(1)?[0] == 1 {
            let present = r.column(u8::from_le_bytes)?;
            let values = r.column(f32::from_le_bytes)?;
            if present.len() != values.len() {
                bail!("a rank sent true-class probabilities with a malformed validity column");
            }
            let t = present
                .iter()
                .zip(values)
                .map(|(&p, v)| (p == 1).then_some(v));
            block.true_class = Some(t.collect());
        }
        blocks.push(block);
    }
    if !r.bytes.is_empty() {
        bail!(
            "a rank sent {} bytes after its blocks of predictions",
            r.bytes.len()
        );
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_survive_the_wire_format_bit_for_bit() {
        let mut plain = PredictionBlock::new();
        plain.push(7, &[3, 1], &[0.5, -0.0]);
        plain.push(9, &[], &[]);
        let mut probs = PredictionBlock::with_probabilities();
        probs.push_with_probabilities(11, &[2], &[f32::MIN_POSITIVE], &[0.25]);
        let mut classes = PredictionBlock::new();
        classes.push(12, &[1, 0], &[0.75, 0.125]);
        classes.push(13, &[0, 1], &[0.5, 0.25]);
        classes.true_class = Some(vec![None, Some(0.25)]);
        let mut both = probs.clone();
        both.true_class = Some(vec![Some(0.0)]);
        let blocks = vec![plain, probs, classes, both];
        let back = decode(&encode(&blocks)).unwrap();
        assert_eq!(format!("{back:?}"), format!("{blocks:?}"));
        assert_eq!(encode(&back), encode(&blocks));
        assert!(decode(&encode(&blocks)[..20]).is_err());
    }
}
