//! Reading a Hugging Face safetensors checkpoint: one `model.safetensors` or shards listed in
//! `model.safetensors.index.json`. Only headers are read here; tensor bytes are streamed later
//! with `pread`. Every header is checked as strictly as the safetensors crate checks it
//! (contiguous offsets from 0, exact byte counts, no trailing bytes), and each failure names the
//! shard and, where there is one, the tensor.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use tarfa_format::Dtype;

use crate::error::{ConvertError, SourceFault};

pub use tarfa_format::safetensors::{
    parse_safetensors_header, safetensors_header_len, HeaderFault, HeaderTensor, SafetensorsHeader,
    MAX_HEADER_LEN,
};

/// Largest `model.safetensors.index.json` accepted.
pub const MAX_INDEX_JSON_LEN: u64 = 64 << 20;

/// One tensor of a shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceTensor {
    /// Name in the header.
    pub name: String,
    /// Index of its shard in [`Checkpoint::shards`].
    pub shard: usize,
    /// Element type.
    pub dtype: Dtype,
    /// Row-major shape.
    pub shape: Vec<u64>,
    /// Absolute byte offset of its first byte in the shard file.
    pub begin: u64,
    /// Absolute end offset (exclusive).
    pub end: u64,
}

/// One safetensors file.
#[derive(Debug)]
pub struct Shard {
    /// Name relative to the checkpoint directory.
    pub rel: String,
    /// Full path.
    pub path: PathBuf,
    /// Open file, for `pread`.
    pub file: File,
    /// File length.
    pub len: u64,
    /// SHA-256 of the 8-byte length and the JSON header: identifies the shard's layout.
    pub header_sha256: [u8; 32],
}

/// A checkpoint directory: its shards and every tensor in them.
#[derive(Debug)]
pub struct Checkpoint {
    /// The directory.
    pub dir: PathBuf,
    /// Shards, in name order.
    pub shards: Vec<Shard>,
    /// Every tensor, by name.
    pub tensors: BTreeMap<String, SourceTensor>,
    /// `config.json`, parsed (`Null` if absent).
    pub config: serde_json::Value,
}

const LFS_PREFIX: &[u8] = b"version https://git-lfs.github.com/spec";

/// Read and check one shard's header.
fn read_shard(
    dir: &Path,
    rel: &str,
    shard_index: usize,
    indexed: bool,
) -> Result<(Shard, Vec<SourceTensor>), ConvertError> {
    let path = dir.join(rel);
    let io = |op: &'static str| {
        let path = path.clone();
        move |source| ConvertError::Io { path, op, source }
    };
    let tarfa_format::fsio::RegularFile { file, len } = tarfa_format::fsio::open_regular(&path)
        .map_err(|e| {
            if e.is_not_found() {
                ConvertError::MissingShard {
                    path: path.clone(),
                    indexed,
                }
            } else {
                e.into()
            }
        })?;
    let named = |fault: HeaderFault| ConvertError::BadShard {
        path: path.clone(),
        fault,
    };
    let mut head = [0u8; 64];
    let got = file.read_at(&mut head, 0).map_err(io("read header"))?;
    if head[..got].starts_with(LFS_PREFIX) {
        return Err(ConvertError::LfsPointer { path: path.clone() });
    }
    let n = safetensors_header_len(&head, len).map_err(named)?;
    let mut header = vec![0u8; n as usize];
    file.read_exact_at(&mut header, 8)
        .map_err(io("read header"))?;
    let header_sha256 = {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        h.update(n.to_le_bytes());
        h.update(&header);
        h.finalize().into()
    };
    let tensors = parse_safetensors_header(&header, len)
        .map_err(named)?
        .tensors
        .into_iter()
        .map(|t| SourceTensor {
            name: t.name,
            shard: shard_index,
            dtype: t.dtype,
            shape: t.shape,
            begin: t.begin,
            end: t.end,
        })
        .collect();
    let shard = Shard {
        rel: rel.to_string(),
        path,
        file,
        len,
        header_sha256,
    };
    Ok((shard, tensors))
}

fn read_json(path: &Path, limit: u64) -> Result<serde_json::Value, ConvertError> {
    let bytes = tarfa_format::fsio::read_regular(path, limit)?;
    if bytes.starts_with(LFS_PREFIX) {
        return Err(ConvertError::LfsPointer {
            path: path.to_path_buf(),
        });
    }
    serde_json::from_slice(&bytes).map_err(|e| ConvertError::BadSource {
        path: path.to_path_buf(),
        fault: SourceFault::NotJson {
            detail: e.to_string(),
        },
    })
}

/// Shard names are plain relative names inside the checkpoint directory.
fn check_shard_name(index: &Path, name: &str) -> Result<(), ConvertError> {
    let plain = !name.is_empty()
        && !name.starts_with('/')
        && name
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if plain {
        Ok(())
    } else {
        Err(ConvertError::BadSource {
            path: index.to_path_buf(),
            fault: SourceFault::ShardName {
                name: name.to_string(),
            },
        })
    }
}

impl Checkpoint {
    /// Open `dir`: `model.safetensors.index.json` if present, else every `*.safetensors` file.
    pub fn open(dir: &Path) -> Result<Checkpoint, ConvertError> {
        if !dir.is_dir() {
            return Err(ConvertError::BadSource {
                path: dir.to_path_buf(),
                fault: SourceFault::NotADirectory,
            });
        }
        let index_path = dir.join("model.safetensors.index.json");
        let (names, weight_map): (Vec<String>, Option<HashMap<String, String>>) =
            if index_path.exists() {
                let index = read_json(&index_path, MAX_INDEX_JSON_LEN)?;
                let map = index
                    .get("weight_map")
                    .and_then(|m| m.as_object())
                    .ok_or_else(|| ConvertError::BadSource {
                        path: index_path.clone(),
                        fault: SourceFault::NoWeightMap,
                    })?;
                let mut wm = HashMap::with_capacity(map.len());
                for (tensor, shard) in map {
                    let shard = shard.as_str().ok_or_else(|| ConvertError::BadSource {
                        path: index_path.clone(),
                        fault: SourceFault::WeightMapValue {
                            tensor: tensor.clone(),
                        },
                    })?;
                    check_shard_name(&index_path, shard)?;
                    wm.insert(tensor.clone(), shard.to_string());
                }
                let mut names: Vec<String> = wm.values().cloned().collect();
                names.sort();
                names.dedup();
                (names, Some(wm))
            } else {
                let mut names = Vec::new();
                let rd = std::fs::read_dir(dir).map_err(|source| ConvertError::Io {
                    path: dir.to_path_buf(),
                    op: "list",
                    source,
                })?;
                for e in rd {
                    let e = e.map_err(|source| ConvertError::Io {
                        path: dir.to_path_buf(),
                        op: "list",
                        source,
                    })?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.ends_with(".safetensors") && !name.starts_with('.') {
                        names.push(name);
                    }
                }
                names.sort();
                if names.is_empty() {
                    return Err(ConvertError::BadSource {
                        path: dir.to_path_buf(),
                        fault: SourceFault::NoWeights,
                    });
                }
                (names, None)
            };
        let mut shards = Vec::with_capacity(names.len());
        let mut tensors = BTreeMap::new();
        for (i, rel) in names.iter().enumerate() {
            let (shard, ts) = read_shard(dir, rel, i, weight_map.is_some())?;
            for t in ts {
                if let Some(wm) = &weight_map {
                    if wm.get(&t.name) != Some(rel) {
                        return Err(ConvertError::BadSource {
                            path: shard.path.clone(),
                            fault: SourceFault::IndexedElsewhere {
                                tensor: t.name.clone(),
                                indexed: wm
                                    .get(&t.name)
                                    .map_or("no shard", String::as_str)
                                    .to_string(),
                            },
                        });
                    }
                }
                if let Some(prev) = tensors.get(&t.name) {
                    let prev: &SourceTensor = prev;
                    return Err(ConvertError::BadSource {
                        path: shard.path.clone(),
                        fault: SourceFault::TensorInTwoShards {
                            tensor: t.name.clone(),
                            other: shards_rel(&shards, prev.shard).to_string(),
                        },
                    });
                }
                tensors.insert(t.name.clone(), t);
            }
            shards.push(shard);
        }
        if let Some(wm) = &weight_map {
            if let Some((t, s)) = wm.iter().find(|(t, _)| !tensors.contains_key(*t)) {
                return Err(ConvertError::BadSource {
                    path: dir.join(s),
                    fault: SourceFault::IndexedTensorMissing { tensor: t.clone() },
                });
            }
        }
        let config_path = dir.join("config.json");
        let config = if config_path.exists() {
            read_json(&config_path, MAX_INDEX_JSON_LEN)?
        } else {
            serde_json::Value::Null
        };
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            shards,
            tensors,
            config,
        })
    }

    /// A reader of bytes `begin..end` of a shard, by `pread`.
    pub fn reader(&self, shard: usize, begin: u64, end: u64) -> RangeReader<'_> {
        RangeReader {
            file: &self.shards[shard].file,
            pos: begin,
            end,
            advised: begin,
        }
    }
}

fn shards_rel(shards: &[Shard], i: usize) -> &str {
    shards.get(i).map_or("an earlier shard", |s| s.rel.as_str())
}

/// `Read` over a byte range of a file, by `pread`; it ends at `end`. It asks the kernel to read
/// ahead (`POSIX_FADV_WILLNEED`) a window past the current position, so the disk works while the
/// writer hashes: with a cold cache, reading and hashing overlap instead of taking turns.
#[derive(Debug)]
pub struct RangeReader<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
    advised: u64,
}

/// How far ahead of the read position the kernel is asked to read.
const READAHEAD: u64 = 64 << 20;

impl Read for RangeReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.end.saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        if self.advised < self.end && self.advised < self.pos + READAHEAD / 2 {
            let from = self.advised.max(self.pos);
            let to = (self.pos + READAHEAD).min(self.end);
            // A failure only loses the hint, so its result is ignored.
            let _ = rustix::fs::fadvise(
                self.file,
                from,
                std::num::NonZeroU64::new(to - from),
                rustix::fs::Advice::WillNeed,
            );
            self.advised = to;
        }
        let got = self.file.read_at(&mut buf[..n], self.pos)?;
        if got == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "source file ended at byte {} (it shrank while being read)",
                    self.pos
                ),
            ));
        }
        self.pos += got as u64;
        Ok(got)
    }
}
