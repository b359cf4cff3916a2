//! Is the model whole? Every layer of its config present, the trunk present, and with a source
//! every byte of every source tensor in some region's provenance. A model directory can pass
//! every hash and still be a part of the model (one `--layers` run, or a manifest re-digested
//! after a file was dropped from it): these checks say so, naming what is missing.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tarfa_format::layout::RegionRecord;
use tarfa_format::manifest::{layer_ranges, FileKind, Manifest, MANIFEST_NAME};

use crate::report::{Fault, FaultKind};

/// How many names a fault lists before it says "and N more".
const NAMES_SHOWN: usize = 8;

/// Layers the model's own config declares and must have: HF `num_hidden_layers` (or
/// `text_config`'s; its MTP layers may be left out), GGUF `{arch}.block_count` (MTP blocks
/// included). `None` when the config does not say (or says something absurd, a fault of its own).
fn declared_layers(m: &Manifest) -> Option<u64> {
    let a = &m.architecture;
    let d = tarfa_format::manifest::declared_layers(&a.source_format, &a.config).ok()??;
    Some(if a.source_format == "gguf" {
        d.main + d.mtp
    } else {
        d.main
    })
}

/// Faults for a model that is not whole by its manifest: layers of the config missing (unless
/// `partial`), no trunk, fewer layers than the config declares.
pub(crate) fn model_faults(m: &Manifest, partial: bool) -> Vec<Fault> {
    let mut faults = Vec::new();
    // The decoder layers: MTP layers after them may be left out of a model.
    let required = m.architecture.required_layers();
    let missing: Vec<u32> = m
        .missing_layers()
        .into_iter()
        .filter(|&l| l < required)
        .collect();
    if !missing.is_empty() && !partial {
        faults.push(Fault::new(
            FaultKind::Incomplete,
            MANIFEST_NAME,
            format!(
                "the model is incomplete: {} of {} layers missing ({}); convert them with `tarfa convert SRC -o DIR --layers A-B`",
                missing.len(),
                m.architecture.num_layers,
                layer_ranges(&missing)
            ),
        ));
    }
    if !m.files.iter().any(|f| f.kind == FileKind::Trunk) {
        faults.push(Fault::new(
            FaultKind::Incomplete,
            MANIFEST_NAME,
            "the model is incomplete: no trunk file (embeddings, final norm, output head)",
        ));
    }
    // Layers the config does not declare (they would never run), or an absurd count.
    if let Err(fault) = m.architecture.check_layer_count() {
        faults.push(Fault::new(
            FaultKind::Manifest,
            MANIFEST_NAME,
            fault.to_string(),
        ));
    }
    if let Some(declared) = declared_layers(m) {
        if declared > u64::from(m.architecture.num_layers) {
            let mut x = Fault::new(
                FaultKind::Incomplete,
                MANIFEST_NAME,
                "the manifest's num_layers is below the layer count its config declares",
            );
            x.expected = Some(format!("at least {declared} layers"));
            x.actual = Some(format!("{} layers", m.architecture.num_layers));
            faults.push(x);
        }
    }
    faults
}

/// A fault when the manifest's config (the one the decoder computes with) is not the model
/// directory's own `config.json` (issue 26, finding 3). A config.json that cannot be read or is
/// not the bytes the manifest lists is a fault of its own (missing file, size, file hash).
pub(crate) fn config_file_faults(m: &Manifest, dir: &Path) -> Vec<Fault> {
    let Some(entry) = m
        .files
        .iter()
        .find(|f| f.kind == FileKind::Aux && f.path == "config.json")
    else {
        return Vec::new();
    };
    let Ok(bytes) = tarfa_format::fsio::read_regular(&dir.join(&entry.path), entry.size) else {
        return Vec::new();
    };
    let keys = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(own) => tarfa_format::manifest::config_differences(&m.architecture.config, &own, 8),
        Err(e) => vec![format!("(config.json is not JSON: {e})")],
    };
    if keys.is_empty() {
        return Vec::new();
    }
    let mut x = Fault::new(
        FaultKind::Config,
        MANIFEST_NAME,
        format!(
            "the manifest's config differs from the model directory's config.json at {}: the model computes with the manifest's",
            keys.join(", ")
        ),
    );
    x.expected = Some("config.json's values".into());
    vec![x]
}

/// The source byte ranges the regions of the model name, by (source file, tensor).
#[derive(Debug, Default)]
pub(crate) struct Provenances(HashMap<(String, String), Vec<(u64, u64)>>);

impl Provenances {
    /// Add a region (its strings in `table`), if it names a source.
    pub(crate) fn add_record(&mut self, rec: &RegionRecord, table: &[u8]) {
        let file = rec.src_file.get(table);
        if file.is_empty() {
            return;
        }
        let tensor = rec.src_tensor.get(table);
        let range = (rec.src_begin, rec.src_end);
        self.0
            .entry((file.to_string(), tensor.to_string()))
            .or_default()
            .push(range);
    }

    /// Take in the ranges of `other` (one file's regions, once the file checked).
    pub(crate) fn merge(&mut self, other: Provenances) {
        for (k, mut v) in other.0 {
            self.0.entry(k).or_default().append(&mut v);
        }
    }

    /// The parts of `begin..end` no range covers; `None` when no region names the tensor at all.
    fn gaps(&self, file: &str, tensor: &str, begin: u64, end: u64) -> Option<Vec<(u64, u64)>> {
        let mut ranges = self.0.get(&(file.to_string(), tensor.to_string()))?.clone();
        ranges.sort_unstable();
        let mut gaps = Vec::new();
        let mut at = begin;
        for (b, e) in ranges {
            if b > at {
                gaps.push((at, b.min(end)));
            }
            at = at.max(e);
            if at >= end {
                break;
            }
        }
        if at < end {
            gaps.push((at, end));
        }
        Some(gaps)
    }
}

/// Faults for source tensors (of the checkpoint in `source_dir`) that no region of the model
/// holds, whole or in part. The checkpoint is read as the converter reads it.
pub(crate) fn source_faults(m: &Manifest, source_dir: &Path, held: &Provenances) -> Vec<Fault> {
    let opened = if m.architecture.source_format == "gguf" {
        match m.conversion.sources.first() {
            Some(first) => tarfa_converter::gguf_source::open(&source_dir.join(&first.path)),
            None => return Vec::new(),
        }
    } else {
        tarfa_converter::source::Checkpoint::open(source_dir)
    };
    let ck = match opened {
        Ok(ck) => ck,
        Err(e) => {
            return vec![Fault::new(
                FaultKind::Source,
                source_dir.display().to_string(),
                format!(
                "cannot read the source checkpoint to check that the model holds all of it: {e}"
            ),
            )]
        }
    };
    let mut faults = Vec::new();
    // The config computed with is the source's (issue 26, finding 3).
    let keys = tarfa_format::manifest::config_differences(&m.architecture.config, &ck.config, 8);
    if !keys.is_empty() {
        let what = if m.architecture.source_format == "gguf" {
            "key/values"
        } else {
            "config.json"
        };
        let mut x = Fault::new(
            FaultKind::Config,
            MANIFEST_NAME,
            format!(
                "the manifest's config differs from the source's {what} at {}: the model computes with the manifest's",
                keys.join(", ")
            ),
        );
        x.expected = Some(format!("the source's {what}"));
        faults.push(x);
    }
    let mut absent: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for t in ck.tensors.values() {
        let file = ck.shards[t.shard].rel.as_str();
        match held.gaps(file, &t.name, t.begin, t.end) {
            None => absent.entry(file).or_default().push(&t.name),
            Some(gaps) => {
                if let Some(&(b, e)) = gaps.first() {
                    let mut x = Fault::new(
                        FaultKind::Incomplete,
                        file,
                        format!(
                            "{} byte(s) of this source tensor are in no region of the model",
                            gaps.iter().map(|(b, e)| e - b).sum::<u64>()
                        ),
                    );
                    x.tensor = Some(t.name.clone());
                    x.source_offset = Some(b);
                    x.expected = Some(format!("bytes {}..{}", t.begin, t.end));
                    x.actual = Some(format!("first missing {b}..{e}"));
                    faults.push(x);
                }
            }
        }
    }
    for (file, names) in absent {
        let shown: Vec<&str> = names.iter().take(NAMES_SHOWN).copied().collect();
        let more = names.len() - shown.len();
        faults.push(Fault::new(
            FaultKind::Incomplete,
            file,
            format!(
                "the model is incomplete: {} tensor(s) of this source file are in no region: {}{}",
                names.len(),
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ),
        ));
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_the_bytes_no_range_covers() {
        let mut p = Provenances::default();
        let key = ("s".to_string(), "t".to_string());
        p.0.insert(key, vec![(30, 40), (10, 20), (15, 25)]);
        assert_eq!(p.gaps("s", "t", 10, 40), Some(vec![(25, 30)]));
        assert_eq!(
            p.gaps("s", "t", 0, 50),
            Some(vec![(0, 10), (25, 30), (40, 50)])
        );
        assert_eq!(p.gaps("s", "t", 12, 18), Some(vec![]));
        assert_eq!(p.gaps("s", "u", 0, 1), None);
    }

    #[test]
    fn missing_layers_are_named_as_ranges() {
        assert_eq!(layer_ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(layer_ranges(&[]), "");
    }
}
