//! Where every expert of a model directory lies: its layer file, the extent (one 4096-aligned
//! contiguous byte range, one read), and the regions inside it with their recorded hashes.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarfa_format::manifest::Manifest;
use tarfa_format::JnfReader;

use crate::error::StreamError;

/// One region of an expert, relative to the start of its extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionSpan {
    /// Index of the region in its file.
    pub region: u32,
    /// Role code (`tarfa_format::Role::code`).
    pub role: u32,
    /// Offset from the start of the extent.
    pub start: usize,
    /// Exact length, padding excluded.
    pub len: usize,
    /// Recorded BLAKE3 of the region bytes.
    pub blake3: [u8; 32],
}

/// Where one expert lies and what its bytes must hash to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertExtent {
    /// Layer.
    pub layer: u32,
    /// Expert within the layer.
    pub expert: u32,
    /// Index of its file in [`ModelExperts::paths`].
    pub file: u32,
    /// Absolute file offset of the extent (a multiple of 4096).
    pub offset: u64,
    /// Extent length (a multiple of 4096; padding of the last region included).
    pub len: usize,
    /// Its regions, in file order.
    pub regions: Vec<RegionSpan>,
    /// Recorded expert digest, BLAKE3 flavour.
    pub blake3: [u8; 32],
}

/// The experts of a model directory, indexed by `(layer, expert)`.
#[derive(Debug)]
pub struct ModelExperts {
    dir: PathBuf,
    readers: Vec<JnfReader>,
    experts: HashMap<(u32, u32), Arc<ExpertExtent>>,
    per_layer: BTreeMap<u32, u32>,
    max_extent: usize,
    top_k: Option<u32>,
}

impl ModelExperts {
    /// Load `DIR/manifest.json` and open (and structurally check) every layer file it lists.
    pub fn open(dir: &Path) -> Result<ModelExperts, StreamError> {
        let manifest = Manifest::load(dir)?;
        let mut readers = Vec::new();
        let mut experts = HashMap::new();
        let mut per_layer = BTreeMap::new();
        let mut max_extent = 0usize;
        for &layer in &manifest.layers {
            let Some(entry) = manifest.layer_file(layer) else {
                continue;
            };
            let reader = JnfReader::open(dir.join(&entry.path))?;
            // The checks as experts land prove a file agrees with itself; this proves it is the
            // file the conversion recorded (root digest over header, footer, index hashes).
            let root = reader.root();
            let h = reader.header();
            let path = || dir.join(&entry.path).display().to_string();
            if hex::encode(root.sha256) != entry.sha256 || hex::encode(root.blake3) != entry.blake3
            {
                return Err(StreamError::RootDigestMismatch {
                    path: path(),
                    found: hex::encode(root.sha256),
                    recorded: entry.sha256.clone(),
                });
            }
            if (h.layer_first, h.layer_count) != (layer, 1) {
                return Err(StreamError::WrongLayers {
                    path: path(),
                    first: h.layer_first,
                    count: h.layer_count,
                    layer,
                });
            }
            let file = readers.len() as u32;
            for rec in reader.experts() {
                let len = usize::try_from(rec.extent_len).map_err(|_| StreamError::TooLarge {
                    what: format!("expert ({}, {}) extent", rec.layer, rec.expert),
                    len: rec.extent_len,
                })?;
                let regions = (rec.first_region..rec.first_region + rec.region_count)
                    .map(|i| {
                        let r = &reader.regions()[i as usize];
                        RegionSpan {
                            region: i,
                            role: r.role,
                            // The reader checked each region lies inside its expert's extent.
                            start: (r.offset - rec.extent_offset) as usize,
                            len: r.length as usize,
                            blake3: r.blake3,
                        }
                    })
                    .collect();
                max_extent = max_extent.max(len);
                *per_layer.entry(rec.layer).or_insert(0) += 1;
                experts.insert(
                    (rec.layer, rec.expert),
                    Arc::new(ExpertExtent {
                        layer: rec.layer,
                        expert: rec.expert,
                        file,
                        offset: rec.extent_offset,
                        len,
                        regions,
                        blake3: rec.blake3,
                    }),
                );
            }
            readers.push(reader);
        }
        let top_k = manifest
            .architecture
            .config
            .get("num_experts_per_tok")
            .and_then(|v| v.as_u64())
            .and_then(|k| u32::try_from(k).ok());
        Ok(ModelExperts {
            dir: dir.to_path_buf(),
            readers,
            experts,
            per_layer,
            max_extent,
            top_k,
        })
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The extent of `(layer, expert)`.
    pub fn get(&self, layer: u32, expert: u32) -> Option<&Arc<ExpertExtent>> {
        self.experts.get(&(layer, expert))
    }

    /// Number of experts in the model.
    pub fn len(&self) -> usize {
        self.experts.len()
    }

    /// Whether the model has no experts at all.
    pub fn is_empty(&self) -> bool {
        self.experts.is_empty()
    }

    /// Layers that have experts, ascending, with their expert counts.
    pub fn layers(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.per_layer.iter().map(|(&l, &n)| (l, n))
    }

    /// The largest extent: the ring's slot size.
    pub fn max_extent(&self) -> usize {
        self.max_extent
    }

    /// `num_experts_per_tok` from the architecture config, if it has one.
    pub fn top_k(&self) -> Option<u32> {
        self.top_k
    }

    /// Paths of the layer files, by file index.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.readers.iter().map(|r| r.path())
    }

    /// The path of file `file`.
    pub fn path(&self, file: u32) -> &Path {
        self.readers[file as usize].path()
    }

    /// The reader of file `file` (structure already checked).
    pub fn reader(&self, file: u32) -> &JnfReader {
        &self.readers[file as usize]
    }

    /// Number of layer files.
    pub fn file_count(&self) -> usize {
        self.readers.len()
    }

    /// Every expert, in (layer, expert) order.
    pub fn all(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self.experts.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Open every layer file for reading, with `O_DIRECT` when `direct` and the filesystem
    /// allows it. Returns the files and whether all of them are direct.
    pub fn open_files(&self, direct: bool) -> Result<(Vec<File>, bool), StreamError> {
        let mut all_direct = direct;
        let mut files = Vec::with_capacity(self.readers.len());
        for r in &self.readers {
            let p = r.path();
            use tarfa_format::fsio::{open_regular, open_regular_with, FsError};
            let opened = if direct {
                match open_regular_with(p, libc::O_DIRECT) {
                    Err(FsError::Io { source, .. })
                        if source.raw_os_error() == Some(libc::EINVAL) =>
                    {
                        // tmpfs and some FUSE filesystems refuse O_DIRECT.
                        all_direct = false;
                        open_regular(p)
                    }
                    other => other,
                }
            } else {
                open_regular(p)
            };
            files.push(opened.map_err(tarfa_format::Error::from)?.file);
        }
        Ok((files, all_direct))
    }
}

pub(crate) fn io_err(path: &Path, op: &'static str, source: io::Error) -> StreamError {
    StreamError::Io {
        path: path.to_path_buf(),
        op,
        source,
    }
}
