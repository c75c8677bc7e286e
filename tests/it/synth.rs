//! Tests of `pipeline synth` (fsgp::synth): determinism, format, statistics, learnability.

use std::path::Path;

use clap::Parser;
use fsgp::cli::args::SynthArgs;
use fsgp::synth::{self, Shape, SynthConfig, SynthOptions};
use xxhash_rust::xxh3::xxh3_64;

fn cfg(rows: u64, test_rows: u64, d: u32, k: u32, nnz: f64, lpr: f64, seed: u64) -> SynthConfig {
    SynthConfig {
        rows,
        test_rows,
        features: d,
        labels: k,
        nnz_per_row: nnz,
        labels_per_row: lpr,
        topics: synth::default_topics(k),
        seed,
    }
}

fn hash(path: &Path) -> u64 {
    xxh3_64(&std::fs::read(path).unwrap())
}

/// One parsed row: sorted labels and sorted (feature, value) pairs.
struct Row {
    labels: Vec<u32>,
    feats: Vec<(u32, f64)>,
}

struct Parsed {
    d: u32,
    k: u32,
    rows: Vec<Row>,
}

/// A deliberately strict, independent parser of the XC repository format.
fn parse_strict(path: &Path) -> Parsed {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.ends_with('\n'), "file must end with a newline");
    let mut lines = text[..text.len() - 1].split('\n');
    let header: Vec<u64> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|t| t.parse().expect("header token"))
        .collect();
    assert_eq!(header.len(), 3, "header must be `N D L`");
    let (n, d, k) = (header[0], header[1] as u32, header[2] as u32);
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        // The labels field comes first and ends at a space, empty or not: a label-less
        // row starts with a space.
        let (label_field, features) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("row {i}: no space after the labels field"));
        assert!(!label_field.contains(':'), "row {i}: no labels field");
        let toks = features.split(' ');
        let mut labels = Vec::new();
        if !label_field.is_empty() {
            for l in label_field.split(',') {
                let l: u32 = l.parse().unwrap_or_else(|_| panic!("row {i}: label {l:?}"));
                assert!(l < k, "row {i}: label {l} out of range");
                if let Some(&prev) = labels.last() {
                    assert!(l > prev, "row {i}: labels not sorted/unique");
                }
                labels.push(l);
            }
        }
        let mut feats: Vec<(u32, f64)> = Vec::new();
        for tok in toks {
            let (f, v) = tok
                .split_once(':')
                .unwrap_or_else(|| panic!("row {i}: token {tok:?}"));
            let f: u32 = f
                .parse()
                .unwrap_or_else(|_| panic!("row {i}: feature {f:?}"));
            assert!(f < d, "row {i}: feature {f} out of range");
            if let Some(&(prev, _)) = feats.last() {
                assert!(f > prev, "row {i}: features not sorted/unique");
            }
            let (int, frac) = v.split_once('.').expect("value needs a decimal point");
            assert!(!int.is_empty() && int.bytes().all(|b| b.is_ascii_digit()));
            assert!(frac.len() == 6 && frac.bytes().all(|b| b.is_ascii_digit()));
            let v: f64 = v.parse().unwrap();
            assert!(v.is_finite() && v > 0.0, "row {i}: value {v}");
            feats.push((f, v));
        }
        assert!(!feats.is_empty(), "row {i}: no features");
        rows.push(Row { labels, feats });
    }
    assert_eq!(rows.len() as u64, n, "row count must match the header");
    Parsed { d, k, rows }
}

#[test]
fn deterministic_for_seed_and_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(3000, 700, 1000, 200, 25.0, 3.0, 7);
    let a = synth::write_dataset(&c, &dir.path().join("a"), Some(1), false).unwrap();
    let b = synth::write_dataset(&c, &dir.path().join("b"), Some(2), false).unwrap();
    let c2 = synth::write_dataset(&c, &dir.path().join("c"), Some(3), false).unwrap();
    for s in [&b, &c2] {
        assert_eq!(hash(&a.train_path), hash(&s.train_path));
        assert_eq!(hash(&a.test_path), hash(&s.test_path));
    }
    assert_eq!(a.train_bytes, b.train_bytes);
    assert_eq!(a.train_nnz, b.train_nnz);
    assert_eq!(a.test_label_nnz, b.test_label_nnz);
    // Train and test differ from each other.
    assert_ne!(hash(&a.train_path), hash(&a.test_path));

    let mut other = c.clone();
    other.seed = 8;
    let o = synth::write_dataset(&other, &dir.path().join("o"), Some(2), false).unwrap();
    assert_ne!(hash(&a.train_path), hash(&o.train_path));
    assert_ne!(hash(&a.test_path), hash(&o.test_path));
}

#[test]
fn output_is_well_formed_and_summary_matches() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("nested").join("out");
    let c = cfg(2500, 600, 777, 123, 30.0, 2.5, 1);
    let s = synth::write_dataset(&c, &out, None, false).unwrap();
    assert_eq!(s.train_path, out.join("train.txt"));
    assert_eq!(s.test_path, out.join("test.txt"));
    for (path, rows, bytes, nnz, lnnz) in [
        (
            &s.train_path,
            c.rows,
            s.train_bytes,
            s.train_nnz,
            s.train_label_nnz,
        ),
        (
            &s.test_path,
            c.test_rows,
            s.test_bytes,
            s.test_nnz,
            s.test_label_nnz,
        ),
    ] {
        assert_eq!(std::fs::metadata(path).unwrap().len(), bytes);
        let p = parse_strict(path);
        assert_eq!((p.d, p.k), (c.features, c.labels));
        assert_eq!(p.rows.len() as u64, rows);
        let f: usize = p.rows.iter().map(|r| r.feats.len()).sum();
        let l: usize = p.rows.iter().map(|r| r.labels.len()).sum();
        assert_eq!(f as u64, nnz);
        assert_eq!(l as u64, lnnz);
    }
    // Written atomically: nothing but the two files remains.
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["test.txt", "train.txt"]);
}

#[test]
fn statistics_match_request() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(12_000, 1000, 4000, 500, 45.0, 4.0, 3);
    let s = synth::write_dataset(&c, dir.path(), None, false).unwrap();
    let p = parse_strict(&s.train_path);
    let n = p.rows.len() as f64;
    let avg_nnz = p.rows.iter().map(|r| r.feats.len()).sum::<usize>() as f64 / n;
    let avg_lab = p.rows.iter().map(|r| r.labels.len()).sum::<usize>() as f64 / n;
    assert!((avg_nnz / 45.0 - 1.0).abs() < 0.10, "avg nnz/row {avg_nnz}");
    assert!(
        (avg_lab / 4.0 - 1.0).abs() < 0.10,
        "avg labels/row {avg_lab}"
    );

    // Spread: per-row counts vary around the mean.
    let max_nnz = p.rows.iter().map(|r| r.feats.len()).max().unwrap();
    let min_nnz = p.rows.iter().map(|r| r.feats.len()).min().unwrap();
    assert!(max_nnz as f64 > 1.5 * 45.0 && (min_nnz as f64) < 0.6 * 45.0);

    // A tiny fraction of label-less rows, but only a tiny one.
    let empty = p.rows.iter().filter(|r| r.labels.is_empty()).count() as f64 / n;
    assert!(empty > 0.0 && empty < 0.02, "label-less fraction {empty}");

    // Skewed label frequencies: the top 1% of labels hold > 10% of positives.
    let mut lf = vec![0u64; c.labels as usize];
    let mut ff = vec![0u64; c.features as usize];
    for r in &p.rows {
        r.labels.iter().for_each(|&l| lf[l as usize] += 1);
        r.feats.iter().for_each(|&(f, _)| ff[f as usize] += 1);
    }
    let top_share = |freq: &mut Vec<u64>, frac: f64| {
        freq.sort_unstable_by(|a, b| b.cmp(a));
        let top = ((freq.len() as f64 * frac).ceil() as usize).max(1);
        freq[..top].iter().sum::<u64>() as f64 / freq.iter().sum::<u64>() as f64
    };
    let label_top = top_share(&mut lf.clone(), 0.01);
    assert!(label_top > 0.10, "top 1% of labels hold {label_top}");
    let feature_top = top_share(&mut ff.clone(), 0.01);
    eprintln!(
        "avg nnz/row {avg_nnz:.2}, labels/row {avg_lab:.2}, label-less {empty:.4}, \
         top-1% label share {label_top:.3}, top-1% feature share {feature_top:.3}"
    );
    assert!(feature_top > 0.10, "top 1% of features hold {feature_top}");
    // Popular ids are not simply the smallest ids.
    let first_share: u64 = lf[..5].iter().sum();
    assert!((first_share as f64) < 0.5 * label_top * lf.iter().sum::<u64>() as f64);
    // Most labels are used at least once.
    let used = lf.iter().filter(|&&x| x > 0).count();
    assert!(
        used as f64 > 0.8 * c.labels as f64,
        "only {used} labels used"
    );

    // tf-idf-like values: rare features weigh more on average than frequent ones.
    let mut sum_v = vec![0f64; c.features as usize];
    for r in &p.rows {
        r.feats.iter().for_each(|&(f, v)| sum_v[f as usize] += v);
    }
    let mut by_freq: Vec<usize> = (0..c.features as usize).filter(|&f| ff[f] > 0).collect();
    by_freq.sort_unstable_by_key(|&f| std::cmp::Reverse(ff[f]));
    let mean_v = |ids: &[usize]| {
        ids.iter().map(|&f| sum_v[f]).sum::<f64>() / ids.iter().map(|&f| ff[f] as f64).sum::<f64>()
    };
    let frequent = mean_v(&by_freq[..20]);
    let rare = mean_v(&by_freq[by_freq.len() / 2..]);
    assert!(rare > frequent, "rare {rare} vs frequent {frequent}");
}

/// Centroid classifier vs. the label-frequency baseline, P@1 on the test split: each label's
/// score is the dot product of the (L2-normalised) test row with the sum of the normalised
/// training rows having that label.
#[test]
fn planted_structure_is_learnable() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(8000, 2000, 3000, 400, 40.0, 4.0, 11);
    let s = synth::write_dataset(&c, dir.path(), None, false).unwrap();
    let train = parse_strict(&s.train_path);
    let test = parse_strict(&s.test_path);
    let (d, k) = (c.features as usize, c.labels as usize);

    let normalized = |r: &Row| {
        let norm = r.feats.iter().map(|&(_, v)| v * v).sum::<f64>().sqrt();
        r.feats
            .iter()
            .map(move |&(f, v)| (f as usize, v / norm))
            .collect::<Vec<_>>()
    };
    let mut centroid = vec![0f64; k * d];
    let mut freq = vec![0u64; k];
    for r in &train.rows {
        let x = normalized(r);
        for &l in &r.labels {
            freq[l as usize] += 1;
            let c = &mut centroid[l as usize * d..(l as usize + 1) * d];
            x.iter().for_each(|&(f, v)| c[f] += v);
        }
    }
    let top_label = (0..k).max_by_key(|&l| freq[l]).unwrap() as u32;

    let (mut hits, mut base_hits) = (0usize, 0usize);
    for r in &test.rows {
        let x = normalized(r);
        let best = (0..k)
            .map(|l| {
                let c = &centroid[l * d..(l + 1) * d];
                (x.iter().map(|&(f, v)| v * c[f]).sum::<f64>(), l)
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .unwrap()
            .1 as u32;
        hits += usize::from(r.labels.binary_search(&best).is_ok());
        base_hits += usize::from(r.labels.binary_search(&top_label).is_ok());
    }
    let n = test.rows.len() as f64;
    let (p1, base) = (hits as f64 / n, base_hits as f64 / n);
    eprintln!("centroid P@1 {p1:.3} vs label-frequency baseline {base:.3}");
    assert!(p1 > 2.0 * base, "P@1 {p1} vs baseline {base}");
    assert!(p1 > 0.3, "P@1 {p1}");
}

#[test]
fn large_file_streams() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(200_000, 10, 64, 16, 6.0, 2.0, 5);
    let s = synth::write_dataset(&c, dir.path(), Some(2), false).unwrap();
    let bytes = std::fs::read(&s.train_path).unwrap();
    assert_eq!(bytes.len() as u64, s.train_bytes);
    assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 200_001);
    assert!(bytes.starts_with(b"200000 64 16\n"));
    assert_eq!(*bytes.last().unwrap(), b'\n');
    let avg = s.train_nnz as f64 / 200_000.0;
    assert!((avg / 6.0 - 1.0).abs() < 0.1, "avg nnz {avg}");
}

#[test]
fn rows_are_prefix_stable() {
    // Blocks are seeded by index: more rows extend the file without changing earlier rows.
    let dir = tempfile::tempdir().unwrap();
    let small = cfg(1000, 10, 300, 50, 10.0, 2.0, 2);
    let mut big = small.clone();
    big.rows = 5000;
    let a = synth::write_dataset(&small, &dir.path().join("a"), Some(1), false).unwrap();
    let b = synth::write_dataset(&big, &dir.path().join("b"), Some(2), false).unwrap();
    let ta = std::fs::read_to_string(a.train_path).unwrap();
    let tb = std::fs::read_to_string(b.train_path).unwrap();
    let body_a = ta.split_once('\n').unwrap().1;
    let body_b = tb.split_once('\n').unwrap().1;
    assert!(body_b.starts_with(body_a));
}

#[test]
fn dense_mediamill_shape() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Shape::Mediamill.preset();
    c.rows = 1500;
    c.test_rows = 200;
    let s = synth::write_dataset(&c, dir.path(), None, false).unwrap();
    let p = parse_strict(&s.train_path);
    assert!(
        p.rows.iter().all(|r| r.feats.len() == 120),
        "mediamill rows are dense"
    );
    let avg_lab = s.train_label_nnz as f64 / 1500.0;
    assert!(
        (avg_lab / 4.38 - 1.0).abs() < 0.1,
        "avg labels/row {avg_lab}"
    );
}

#[test]
fn delicious_shape_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let args = SynthOptions {
        out: dir.path().to_path_buf(),
        force: false,
        rows: Some(3000),
        test_rows: None,
        features: None,
        labels: None,
        nnz_per_row: None,
        labels_per_row: None,
        topics: None,
        shape: Some(Shape::Delicious),
        seed: 4,
        threads: Some(2),
    };
    let c = SynthConfig::from_options(&args).unwrap();
    assert_eq!(c.test_rows, (3000.0f64 * 3185.0 / 12920.0).round() as u64);
    let s = synth::write_dataset(&c, dir.path(), args.threads, false).unwrap();
    let avg_nnz = s.train_nnz as f64 / 3000.0;
    let avg_lab = s.train_label_nnz as f64 / 3000.0;
    assert!((avg_nnz / 18.0 - 1.0).abs() < 0.1, "avg nnz/row {avg_nnz}");
    assert!(
        (avg_lab / 19.03 - 1.0).abs() < 0.1,
        "avg labels/row {avg_lab}"
    );
    parse_strict(&s.test_path);
}

#[test]
fn presets_follow_table_1() {
    let table = [
        (Shape::Bibtex, 4880, 2515, 1836, 159, 2.40),
        (Shape::Delicious, 12920, 3185, 500, 983, 19.03),
        (Shape::Mediamill, 30993, 12914, 120, 101, 4.38),
        (Shape::Eurlex, 15539, 3809, 5000, 3993, 5.31),
        (Shape::Rcv1, 623847, 155962, 47236, 2456, 4.79),
        (Shape::Amazoncat, 1186239, 306782, 203882, 13330, 5.04),
    ];
    for (shape, n, nt, d, k, lpr) in table {
        let p = shape.preset();
        assert_eq!((p.rows, p.test_rows, p.features, p.labels), (n, nt, d, k));
        assert_eq!(p.labels_per_row, lpr);
        assert_eq!(p.seed, 0);
        assert!(p.nnz_per_row >= 1.0 && p.nnz_per_row <= f64::from(d));
        assert!((8..=256).contains(&p.topics));
        p.validate().unwrap();
    }
    assert_eq!(Shape::Mediamill.preset().nnz_per_row, 120.0);
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    synth: SynthArgs,
}

fn resolve(argv: &[&str]) -> anyhow::Result<SynthConfig> {
    let mut full = vec!["synth", "--out", "/nonexistent"];
    full.extend_from_slice(argv);
    SynthConfig::from_options(&Cli::try_parse_from(full)?.synth.options())
}

#[test]
fn cli_arguments_resolve_and_validate() {
    let c = resolve(&["--shape", "amazoncat", "--rows", "200000", "--seed", "9"]).unwrap();
    assert_eq!(
        (c.rows, c.features, c.labels, c.seed),
        (200_000, 203_882, 13_330, 9)
    );
    assert_eq!(
        c.test_rows,
        (200_000.0f64 * 306_782.0 / 1_186_239.0).round() as u64
    );

    let c = resolve(&["--shape", "eurlex", "--features", "100", "--topics", "17"]).unwrap();
    assert_eq!(
        (c.rows, c.test_rows, c.features, c.topics),
        (15539, 3809, 100, 17)
    );
    assert_eq!(
        c.nnz_per_row, 100.0,
        "preset nnz is capped at an overridden D"
    );

    let c = resolve(&["--rows", "100", "--features", "50", "--labels", "10"]).unwrap();
    assert_eq!(
        (c.test_rows, c.nnz_per_row, c.labels_per_row),
        (25, 20.0, 3.0)
    );
    assert_eq!(c.topics, synth::default_topics(10));

    let c = resolve(&[
        "--rows",
        "8",
        "--features",
        "5",
        "--labels",
        "2",
        "--test-rows",
        "0",
    ]);
    let c = c.unwrap();
    assert_eq!(
        (c.nnz_per_row, c.labels_per_row, c.test_rows),
        (5.0, 2.0, 0)
    );

    for (argv, needle) in [
        (&["--features", "5", "--labels", "2"][..], "--rows"),
        (&["--rows", "5", "--labels", "2"][..], "--features"),
        (&["--rows", "5", "--features", "2"][..], "--labels"),
        (&["--shape", "bibtex", "--rows", "0"][..], "--rows"),
        (&["--shape", "bibtex", "--labels", "0"][..], "--labels"),
        (
            &["--shape", "bibtex", "--nnz-per-row", "5000"][..],
            "--nnz-per-row",
        ),
        (
            &["--shape", "bibtex", "--nnz-per-row", "0.5"][..],
            "--nnz-per-row",
        ),
        (
            &["--shape", "bibtex", "--labels-per-row", "200"][..],
            "--labels-per-row",
        ),
        (
            &["--shape", "bibtex", "--labels-per-row", "NaN"][..],
            "--labels-per-row",
        ),
        (&["--shape", "bibtex", "--topics", "0"][..], "--topics"),
    ] {
        let err = resolve(argv).unwrap_err().to_string();
        assert!(err.contains(needle), "{argv:?}: {err}");
    }
    assert!(resolve(&["--shape", "nope"]).is_err());
}

#[test]
fn edge_configurations() {
    let dir = tempfile::tempdir().unwrap();
    // No test rows, a single feature, a single label, no labels at all.
    let c = cfg(300, 0, 1, 1, 1.0, 1.0, 0);
    let s = synth::write_dataset(&c, &dir.path().join("a"), Some(2), false).unwrap();
    assert_eq!(std::fs::read_to_string(&s.test_path).unwrap(), "0 1 1\n");
    let p = parse_strict(&s.train_path);
    assert!(p
        .rows
        .iter()
        .all(|r| r.feats.len() == 1 && r.labels.len() <= 1));

    let c = cfg(200, 20, 30, 5, 3.0, 0.0, 0);
    let s = synth::write_dataset(&c, &dir.path().join("b"), Some(1), false).unwrap();
    assert_eq!(s.train_label_nnz, 0);
    let p = parse_strict(&s.train_path);
    assert!(p.rows.iter().all(|r| r.labels.is_empty()));

    // Fewer than one label per row on average; every label; every feature.
    let c = cfg(2000, 20, 12, 6, 12.0, 0.5, 0);
    let s = synth::write_dataset(&c, &dir.path().join("c"), Some(2), false).unwrap();
    let avg = s.train_label_nnz as f64 / 2000.0;
    assert!((avg / 0.5 - 1.0).abs() < 0.1, "avg labels {avg}");
    assert_eq!(s.train_nnz, 2000 * 12);
    let c = cfg(500, 20, 12, 6, 4.0, 6.0, 0);
    let s = synth::write_dataset(&c, &dir.path().join("d"), Some(2), false).unwrap();
    assert!(s.train_label_nnz >= 500 * 6 * 97 / 100);

    // Invalid: zero threads.
    assert!(synth::write_dataset(&c, &dir.path().join("e"), Some(0), false).is_err());
}

#[test]
fn run_writes_files() {
    let dir = tempfile::tempdir().unwrap();
    let cli = Cli::try_parse_from([
        "synth",
        "--out",
        dir.path().to_str().unwrap(),
        "--shape",
        "bibtex",
        "--rows",
        "500",
        "--threads",
        "2",
    ])
    .unwrap();
    synth::run(&cli.synth.options()).unwrap();
    let p = parse_strict(&dir.path().join("train.txt"));
    assert_eq!((p.rows.len(), p.d, p.k), (500, 1836, 159));
    assert!(dir.path().join("test.txt").exists());
}
