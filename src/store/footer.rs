//! The key–value metadata of any Parquet file the pipeline writes (chunks, checkpoints,
//! predictions), read from the footer alone: no column is decoded, so it is cheap on files
//! of any size. `pipeline status --run N` shows it.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};
use parquet::file::metadata::{FileMetaData, ParquetMetaDataReader};

/// Key–value pairs of a Parquet file's footer, in the order written (`fsgp.format` first in
/// every fsgp file, the Arrow writer's `ARROW:schema` last). A key written without a value
/// reads as the empty string.
pub fn parquet_key_values(path: &Path) -> Result<Vec<(String, String)>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let metadata = ParquetMetaDataReader::new()
        .parse_and_finish(&file)
        .with_context(|| format!("reading the Parquet footer of {}", path.display()))?;
    Ok(key_values(metadata.file_metadata()))
}

/// The key–value pairs of a decoded footer, as [`parquet_key_values`] reads them.
pub fn key_values(meta: &FileMetaData) -> Vec<(String, String)> {
    meta.key_value_metadata()
        .into_iter()
        .flatten()
        .map(|kv| (kv.key.clone(), kv.value.clone().unwrap_or_default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::predictions::{PredictionBlock, PredictionWriter, PREDICTIONS_FORMAT};

    #[test]
    fn reads_what_the_writer_put_in_the_footer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.parquet");
        let meta = [("fsgp.split".to_string(), "test".to_string())];
        let mut w = PredictionWriter::create(&path, &meta, Default::default()).unwrap();
        let mut block = PredictionBlock::new();
        block.push(0, &[1], &[0.5]);
        w.write(&block).unwrap();
        w.finish().unwrap();
        let kv = parquet_key_values(&path).unwrap();
        assert_eq!(
            kv[..2],
            [
                ("fsgp.format".to_string(), PREDICTIONS_FORMAT.to_string()),
                ("fsgp.split".to_string(), "test".to_string()),
            ]
        );
        // The Arrow writer adds its own copy of the schema after ours.
        assert_eq!(kv.len(), 3);
        assert_eq!(kv[2].0, "ARROW:schema");
        std::fs::write(&path, b"not parquet").unwrap();
        let err = parquet_key_values(&path).unwrap_err();
        assert!(format!("{err:#}").contains("p.parquet"), "{err:#}");
    }
}
