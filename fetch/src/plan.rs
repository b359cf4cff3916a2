//! From SOURCE and a [`Selection`] to a [`Plan`]: every header read (by range), the tensors
//! chosen, the output's header bytes, and for each tensor where its bytes come from and where
//! they go. Building a plan reads headers only; [`crate::transfer`] moves the data.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use tarfa_gguf::header::read_header_from;
use tarfa_gguf::reader::{check_part_keys, parse_split_name, split_keys, split_name};
use tarfa_gguf::{GgufWriter, Header, SplitFault, Value, Violation};

use crate::error::{FetchError, IndexFault, Result, SelectFault, SourceArgFault};
use crate::http::HttpClient;
use crate::location::{Location, Opened};
use crate::safetensors::{self, StHeader};
use crate::select::{gguf_block, hf_layer, is_mtp_prefixed, Selection};

/// First window of a GGUF header read by range; it doubles until the header parses.
pub const GGUF_PROBE: u64 = 16 * 1024;
/// First window of a safetensors shard: the length and, usually, the whole JSON header.
pub const SAFETENSORS_PROBE: u64 = 64 * 1024;
/// Largest `config.json` or `model.safetensors.index.json` read.
pub const MAX_JSON: u64 = 64 << 20;

/// What the output file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// A GGUF v3 file.
    Gguf,
    /// A safetensors file.
    Safetensors,
}

/// One tensor of the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedTensor {
    /// Name (as in the source).
    pub name: String,
    /// Type name (ggml or safetensors).
    pub dtype: String,
    /// Row-major shape.
    pub shape: Vec<u64>,
    /// Index into [`Plan::sources`].
    pub source: usize,
    /// Byte range in that source.
    pub src: Range<u64>,
    /// Absolute offset in the output.
    pub dst: u64,
}

/// Everything a fetch needs, with the headers already read.
#[derive(Debug)]
pub struct Plan {
    /// GGUF or safetensors out.
    pub format: OutputFormat,
    /// The files tensors come from (every part of a split set; the shards holding a chosen tensor).
    pub sources: Vec<Opened>,
    /// The output's bytes before its first tensor (header and padding).
    pub header: Vec<u8>,
    /// Length of the output file.
    pub total_len: u64,
    /// The chosen tensors, in output order.
    pub tensors: Vec<PlannedTensor>,
    /// Sum over the sources read of their true header lengths (GGUF: up to the data section;
    /// safetensors: `8 + n`).
    pub source_header_bytes: u64,
    /// Decisions worth telling the user (kept keys, MTP blocks found).
    pub notes: Vec<String>,
    /// Every local file of the source checkpoint: the files read, and for safetensors every
    /// shard the index names, the index and `config.json`. The output must never be one of
    /// them ([`crate::transfer::run`] refuses it). Empty for a remote source.
    pub inputs: Vec<PathBuf>,
}

impl Plan {
    /// Exact bytes of the chosen tensors.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.src.end - t.src.start).sum()
    }

    /// Build the plan for `source`.
    pub fn build(source: &Location, sel: &Selection, client: &Arc<HttpClient>) -> Result<Plan> {
        if sel.is_empty() {
            return Err(FetchError::NothingSelected {
                source_arg: source.display(),
                why: SelectFault::NothingAsked,
            });
        }
        let name = source.file_name();
        let local_dir = matches!(source, Location::Local(p) if p.is_dir());
        if name.ends_with(".gguf") && !local_dir {
            plan_gguf(source, sel, client)
        } else if local_dir || name.ends_with(".safetensors") || name.ends_with(".json") {
            plan_safetensors(source, sel, client)
        } else {
            Err(FetchError::BadSource {
                source_arg: source.display(),
                fault: SourceArgFault::UnknownKind,
            })
        }
    }
}

fn invalid(file: &str, violation: Violation) -> FetchError {
    FetchError::Gguf(tarfa_gguf::Error::Invalid {
        file: file.to_string(),
        violation,
    })
}

fn open_gguf(loc: &Location, client: &Arc<HttpClient>) -> Result<(Opened, Header)> {
    let opened = loc.open(client, GGUF_PROBE)?;
    let header =
        read_header_from(opened.source.as_ref(), GGUF_PROBE).map_err(FetchError::from_gguf)?;
    opened.seal();
    Ok((opened, header))
}

/// Every part of the GGUF model `loc` names, checked against each other as
/// [`tarfa_gguf::GgufModel`] checks local split sets.
fn open_gguf_parts(
    loc: &Location,
    client: &Arc<HttpClient>,
    inputs: &mut Vec<PathBuf>,
) -> Result<Vec<(Opened, Header)>> {
    inputs.extend(loc.local_path().map(PathBuf::from));
    let shown = loc.display();
    let (first, h) = open_gguf(loc, client)?;
    let keys = split_keys(&h).map_err(|v| invalid(&shown, v))?;
    let file_name = loc.file_name();
    let named = parse_split_name(&file_name);
    let mismatch = |fault: SplitFault| invalid(&shown, Violation::SplitMismatch(fault));
    let Some(keys) = keys.filter(|k| k.count > 1) else {
        if let Some((_, _, n)) = named.filter(|&(_, _, n)| n > 1) {
            return Err(mismatch(SplitFault::NameWithoutKeys { count: n }));
        }
        return Ok(vec![(first, h)]);
    };
    let Some((prefix, k, n)) = named else {
        return Err(mismatch(SplitFault::KeysWithoutName { count: keys.count }));
    };
    if u32::from(keys.no) + 1 != k || u32::from(keys.count) != n {
        return Err(mismatch(SplitFault::NameDisagrees {
            name_part: k,
            name_count: n,
            key_part: u32::from(keys.no) + 1,
            key_count: keys.count,
        }));
    }
    let mut parts = Vec::with_capacity(n as usize);
    let mut given = Some((first, h));
    for i in 1..=n {
        match given.take_if(|_| i == k) {
            Some(p) => parts.push(p),
            None => {
                let part = loc.sibling(&split_name(prefix, i, n));
                inputs.extend(part.local_path().map(PathBuf::from));
                parts.push(open_gguf(&part, client)?)
            }
        }
    }
    let mut seen = std::collections::HashMap::new();
    let mut total = 0u64;
    for (i, (o, h)) in parts.iter().enumerate() {
        let name = o.source.name();
        let kk = split_keys(h).map_err(|v| invalid(&name, v))?;
        let part = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let checked = kk
            .ok_or(SplitFault::PartWithoutKeys { part, count: n })
            .and_then(|kk| check_part_keys(kk, part, n, keys.tensors_count));
        if let Err(fault) = checked {
            return Err(invalid(&name, Violation::SplitMismatch(fault)));
        }
        for t in &h.tensors {
            if let Some(prev) = seen.insert(t.name.clone(), i) {
                return Err(invalid(
                    &name,
                    Violation::DuplicateTensor {
                        tensor: format!("{} (also in part {})", t.name, prev + 1),
                        offset: t.info_offset,
                    },
                ));
            }
        }
        total += h.tensors.len() as u64;
    }
    if u64::try_from(keys.tensors_count).ok() != Some(total) {
        return Err(mismatch(SplitFault::TensorCountSum {
            declared: keys.tensors_count,
            held: total,
        }));
    }
    Ok(parts)
}

/// The MTP blocks `first..end` a GGUF declares, from its first part's key/values.
fn gguf_mtp_blocks(h: &Header) -> (String, Option<Range<u64>>) {
    let arch = h
        .get("general.architecture")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let n = h
        .get(&format!("{arch}.block_count"))
        .and_then(Value::as_u64);
    let k = h
        .get(&format!("{arch}.nextn_predict_layers"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let blocks = n.filter(|&n| k > 0 && k < n).map(|n| n - k..n);
    (arch, blocks)
}

fn plan_gguf(loc: &Location, sel: &Selection, client: &Arc<HttpClient>) -> Result<Plan> {
    let mut inputs = Vec::new();
    let parts = open_gguf_parts(loc, client, &mut inputs)?;
    let h0 = &parts[0].1;
    let (arch, blocks) = gguf_mtp_blocks(h0);
    let mut notes = Vec::new();
    let take_mtp = |name: &str| {
        is_mtp_prefixed(name)
            || blocks
                .as_ref()
                .is_some_and(|b| gguf_block(name).is_some_and(|n| b.contains(&n)))
    };
    let mut chosen = Vec::new();
    for (p, (_, h)) in parts.iter().enumerate() {
        for t in &h.tensors {
            if (sel.mtp && take_mtp(&t.name)) || sel.glob_matches(&t.name) {
                chosen.push((p, t.clone()));
            }
        }
    }
    let all = || parts.iter().flat_map(|(_, h)| h.tensors.iter());
    if sel.mtp {
        let nextn_key = format!("{arch}.nextn_predict_layers");
        match &blocks {
            Some(b) => {
                for blk in b.clone() {
                    if !all().any(|t| gguf_block(&t.name) == Some(blk)) {
                        return Err(FetchError::NothingSelected {
                            source_arg: loc.display(),
                            why: SelectFault::MtpBlockEmpty {
                                key: nextn_key.clone(),
                                first: b.start,
                                last: b.end - 1,
                                block: blk,
                            },
                        });
                    }
                }
                notes.push(format!(
                    "MTP blocks {}..{} of {}; {arch}.block_count and {nextn_key} kept as in the source, as llama.cpp's MTP loaders expect",
                    b.start,
                    b.end - 1,
                    b.end
                ));
            }
            None if all().any(|t| is_mtp_prefixed(&t.name)) => {}
            None => {
                return Err(FetchError::NothingSelected {
                    source_arg: loc.display(),
                    why: SelectFault::NoGgufMtp {
                        key: nextn_key.clone(),
                        arch: arch.to_string(),
                    },
                })
            }
        }
    }
    for g in &sel.globs {
        if !all().any(|t| crate::select::glob_match(g, &t.name)) {
            return Err(FetchError::NothingSelected {
                source_arg: loc.display(),
                why: SelectFault::GlobMatchesNone { glob: g.clone() },
            });
        }
    }
    let mut w = GgufWriter::new(h0.alignment);
    for (k, v) in &h0.metadata {
        if !k.starts_with("split.") {
            w.add_kv(k.clone(), v.clone());
        }
    }
    for (_, t) in &chosen {
        w.add_tensor(t.name.clone(), t.dtype, t.ne.clone());
    }
    let shown = "the draft GGUF";
    let (header, out) = w.header().map_err(|v| invalid(shown, v))?;
    let mut tensors = Vec::with_capacity(chosen.len());
    for ((p, t), o) in chosen.iter().zip(&out.tensors) {
        debug_assert_eq!(t.byte_len, o.byte_len);
        tensors.push(PlannedTensor {
            name: t.name.clone(),
            dtype: t.dtype.name().to_string(),
            shape: t.shape(),
            source: *p,
            src: t.data_range(),
            dst: o.data_offset,
        });
    }
    Ok(Plan {
        format: OutputFormat::Gguf,
        source_header_bytes: parts.iter().map(|(_, h)| h.data_start).sum(),
        sources: parts.into_iter().map(|(o, _)| o).collect(),
        total_len: out.file_len,
        header,
        tensors,
        notes,
        inputs,
    })
}

/// A shard name from an index is a plain relative path.
fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains(['?', '#', '\\']))
}

fn json_of(bytes: &[u8], file: &str) -> Result<serde_json::Value> {
    serde_json::from_slice(bytes).map_err(|e| FetchError::BadIndex {
        file: file.to_string(),
        fault: IndexFault::NotJson {
            detail: e.to_string(),
        },
    })
}

fn plan_safetensors(loc: &Location, sel: &Selection, client: &Arc<HttpClient>) -> Result<Plan> {
    // A directory stands for its index (or its single model.safetensors).
    let loc = match loc {
        Location::Local(p) if p.is_dir() => {
            let index = p.join("model.safetensors.index.json");
            Location::Local(if index.exists() {
                index
            } else {
                p.join("model.safetensors")
            })
        }
        // One shard of a sharded checkpoint stands for the checkpoint: the MTP layers are
        // usually in another shard.
        l if l.file_name().ends_with(".safetensors") && l.file_name().contains("-of-") => {
            let index = l.sibling("model.safetensors.index.json");
            match index.read_small(client, MAX_JSON)? {
                Some(_) => index,
                None => l.clone(),
            }
        }
        l => l.clone(),
    };
    let shown = loc.display();
    let mut inputs: Vec<PathBuf> = loc.local_path().map(PathBuf::from).into_iter().collect();
    // name -> shard file name, in shard order.
    let mut shard_of: Vec<(String, String)> = Vec::new();
    let mut single: Option<(Opened, StHeader)> = None;
    if loc.file_name().ends_with(".json") {
        let bytes = loc
            .read_small(client, MAX_JSON)?
            .ok_or_else(|| FetchError::BadSource {
                source_arg: shown.clone(),
                fault: SourceArgFault::NotFound,
            })?;
        let index = json_of(&bytes, &shown)?;
        let map = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| FetchError::BadIndex {
                file: shown.clone(),
                fault: IndexFault::NoWeightMap,
            })?;
        for (name, shard) in map {
            let shard =
                shard
                    .as_str()
                    .filter(|s| plain_name(s))
                    .ok_or_else(|| FetchError::BadIndex {
                        file: shown.clone(),
                        fault: IndexFault::ShardName {
                            tensor: name.clone(),
                            shard: shard.to_string(),
                        },
                    })?;
            shard_of.push((name.clone(), shard.to_string()));
        }
    } else {
        let opened = loc.open(client, SAFETENSORS_PROBE)?;
        let h = safetensors::read_header(opened.source.as_ref())?;
        opened.seal();
        let f = loc.file_name();
        shard_of = h
            .tensors
            .iter()
            .map(|t| (t.name.clone(), f.clone()))
            .collect();
        single = Some((opened, h));
    }
    let mut shard_files: Vec<&str> = shard_of.iter().map(|e| e.1.as_str()).collect();
    shard_files.sort_unstable();
    shard_files.dedup();
    for s in shard_files.into_iter().chain(["config.json"]) {
        inputs.extend(loc.sibling(s).local_path().map(PathBuf::from));
    }
    let config = match loc.sibling("config.json").read_small(client, MAX_JSON)? {
        Some(b) => Some(json_of(&b, &loc.sibling("config.json").display())?),
        None => None,
    };
    let mut notes = Vec::new();
    let n_layers = config.as_ref().and_then(|c| {
        c.get("num_hidden_layers")
            .or_else(|| {
                c.get("text_config")
                    .and_then(|t| t.get("num_hidden_layers"))
            })
            .and_then(|v| v.as_u64())
    });
    let mut chosen: Vec<&(String, String)> = Vec::new();
    for e in &shard_of {
        let mtp = sel.mtp
            && (is_mtp_prefixed(&e.0)
                || n_layers.is_some_and(|n| hf_layer(&e.0).is_some_and(|l| l >= n)));
        if mtp || sel.glob_matches(&e.0) {
            chosen.push(e);
        }
    }
    if sel.mtp
        && !shard_of.iter().any(|e| {
            is_mtp_prefixed(&e.0)
                || n_layers.is_some_and(|n| hf_layer(&e.0).is_some_and(|l| l >= n))
        })
    {
        let why = match n_layers {
            Some(layers) => SelectFault::NoMtpLayers { layers },
            None => SelectFault::NoMtpNoConfig,
        };
        return Err(FetchError::NothingSelected {
            source_arg: shown,
            why,
        });
    }
    if let Some(n) = n_layers.filter(|_| sel.mtp) {
        notes.push(format!(
            "MTP: model.layers.{n}.* and above (num_hidden_layers = {n}), and mtp.*"
        ));
    }
    for g in &sel.globs {
        if !shard_of.iter().any(|e| crate::select::glob_match(g, &e.0)) {
            return Err(FetchError::NothingSelected {
                source_arg: shown,
                why: SelectFault::GlobMatchesNone { glob: g.clone() },
            });
        }
    }
    // Shards holding a chosen tensor, in name order; their headers read by range.
    let mut shard_names: Vec<&str> = chosen.iter().map(|e| e.1.as_str()).collect();
    shard_names.sort_unstable();
    shard_names.dedup();
    let mut sources = Vec::new();
    let mut headers = Vec::new();
    for s in &shard_names {
        let (o, h) = match single.take() {
            Some(x) => x,
            None => {
                let o = loc.sibling(s).open(client, SAFETENSORS_PROBE)?;
                let h = safetensors::read_header(o.source.as_ref())?;
                o.seal();
                (o, h)
            }
        };
        sources.push(o);
        headers.push(h);
    }
    let mut out = Vec::new();
    let mut src = Vec::new();
    let mut metadata = None;
    for (i, h) in headers.iter().enumerate() {
        let shard = shard_names[i];
        let wanted: std::collections::HashSet<&str> = chosen
            .iter()
            .filter(|e| e.1 == shard)
            .map(|e| e.0.as_str())
            .collect();
        for name in &wanted {
            if !h.tensors.iter().any(|t| t.name == *name) {
                return Err(FetchError::BadIndex {
                    file: sources[i].source.name(),
                    fault: IndexFault::TensorMissing {
                        tensor: name.to_string(),
                    },
                });
            }
        }
        for t in h
            .tensors
            .iter()
            .filter(|t| wanted.contains(t.name.as_str()))
        {
            if metadata.is_none() {
                metadata = h.metadata.clone();
            }
            out.push((
                t.name.clone(),
                t.dtype_name.clone(),
                t.shape.clone(),
                t.end - t.begin,
            ));
            src.push((i, t.begin..t.end));
        }
    }
    let (header, dsts, total_len) =
        safetensors::write_header(&out, metadata.as_ref(), "the output")?;
    let data_start = header.len() as u64;
    let tensors = out
        .into_iter()
        .zip(src)
        .zip(dsts)
        .map(
            |(((name, dtype, shape, _), (source, src)), dst)| PlannedTensor {
                name,
                dtype,
                shape,
                source,
                src,
                dst,
            },
        )
        .collect();
    debug_assert!(data_start <= total_len);
    Ok(Plan {
        format: OutputFormat::Safetensors,
        source_header_bytes: headers.iter().map(|h| h.data_start).sum(),
        sources,
        header,
        total_len,
        tensors,
        notes,
        inputs,
    })
}
