//! Converter errors: each names the file, and the tensor, layer or expert where there is one.

use std::path::PathBuf;

/// Why a conversion stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A shard named by the index, or a `*.safetensors` name listed in the directory without an
    /// index, does not exist (the second: a dangling symbolic link, or removed while listed).
    #[error("{}: missing shard ({})", path.display(), if *indexed {
        "listed in model.safetensors.index.json, not on disk"
    } else {
        "its name is in the checkpoint directory, but the file it names is not there: a dangling symbolic link?"
    })]
    MissingShard {
        /// The shard's path.
        path: PathBuf,
        /// Whether `model.safetensors.index.json` listed it (else the directory's listing did).
        indexed: bool,
    },
    /// Reading a source tensor's bytes failed while its JNF file was being written: the source
    /// file is unreadable (a media error) or shrank since its header was read. Nothing of the
    /// JNF file was published.
    #[error("{}: reading tensor '{tensor}' failed: {source}", path.display())]
    SourceRead {
        /// The source file (shard or GGUF part).
        path: PathBuf,
        /// The tensor being read.
        tensor: String,
        /// What failed.
        source: std::io::Error,
    },
    /// A Git LFS pointer where weights should be.
    #[error("{}: this is a Git LFS pointer file, not the weights; fetch the real file (git lfs pull) and retry", path.display())]
    LfsPointer {
        /// The pointer file.
        path: PathBuf,
    },
    /// A shard whose header or length breaks a rule of `tarfa_format::safetensors`.
    #[error("{}: {fault}", path.display())]
    BadShard {
        /// The shard.
        path: PathBuf,
        /// The rule broken, naming the tensor where there is one (not a `source`: its text is
        /// already in this one).
        fault: tarfa_format::safetensors::HeaderFault,
    },
    /// The checkpoint's layers and its config disagree (layers it does not declare, which
    /// would never run, or a block called an MTP layer that is not one), or a layer count is
    /// beyond any model's: nothing is written.
    #[error("{}: {fault}", path.display())]
    LayerCount {
        /// The config (HF) or the GGUF.
        path: PathBuf,
        /// What disagrees.
        fault: tarfa_format::manifest::LayerCountFault,
    },
    /// A GGUF's `nextn_predict_layers` makes an ordinary block an MTP layer.
    #[error("{}: {nextn_key} {nextn} makes blk.{block} an MTP (nextn) layer, but it holds no blk.{block}.nextn.* tensor: it is an ordinary block, which would never run", path.display())]
    NotAnMtpBlock {
        /// The GGUF.
        path: PathBuf,
        /// `{arch}.nextn_predict_layers`.
        nextn_key: String,
        /// Its value.
        nextn: u64,
        /// The block.
        block: u64,
    },
    /// The checkpoint as a whole cannot be converted (layout, names, index).
    #[error("{}: {fault}", path.display())]
    BadSource {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        fault: SourceFault,
    },
    /// The experts of a layer do not form a complete, uniform grid.
    #[error("layer {layer}: {fault}")]
    BadExperts {
        /// The layer.
        layer: u32,
        /// What is wrong.
        fault: ExpertFault,
    },
    /// A layer's experts need more index records than a JNF file can hold (spec §6:
    /// `MAX_REGIONS`, and `288·R + 96·E ≤ MAX_INDEX_LEN`); refused before anything is allocated
    /// for them or written.
    #[error("{file}: tensor '{tensor}' and the rest: {experts} experts, {regions} regions, {bytes} bytes of index records; a JNF file holds at most {} regions and {} index bytes", tarfa_format::validate::MAX_REGIONS, tarfa_format::validate::MAX_INDEX_LEN)]
    IndexTooLarge {
        /// The JNF file that would hold them (`trunk.jnf`, `layer-00007.jnf`).
        file: String,
        /// The first expert tensor of the layer (the first tensor of a file without experts).
        tensor: String,
        /// Experts claimed.
        experts: u64,
        /// Regions the layer's file would hold.
        regions: u64,
        /// Bytes of region and expert records, strings not counted.
        bytes: u64,
    },
    /// Not enough free space for the next file.
    #[error("{}: not enough free space for {what}: needs {needed} bytes ({file} for the file at most, {held} promised to files being written beside it, and {margin} kept free so that the filesystem is never filled to its last byte), {available} available; nothing of it was written (free space, or convert fewer layers with --layers)", dir.display())]
    NoSpace {
        /// The output directory.
        dir: PathBuf,
        /// What was about to be written.
        what: String,
        /// Bytes needed: `file + held + margin`.
        needed: u64,
        /// The file's own size, at most.
        file: u64,
        /// Bytes promised to files being written at the same time.
        held: u64,
        /// Bytes kept free beyond those.
        margin: u64,
        /// Bytes available.
        available: u64,
    },
    /// The output directory cannot be used.
    #[error("{}: {fault}", path.display())]
    BadOutput {
        /// The output directory, or the file in it that is in the way.
        path: PathBuf,
        /// What is wrong.
        fault: OutputFault,
    },
    /// Layers an earlier run converted hold bytes the source no longer has (spec §8.2): the
    /// source changed under the same headers since. A model directory never mixes two versions
    /// of a source, so the run stops before writing anything.
    #[error("{}: its bytes changed since an earlier run converted layer {layer} from it: {file} holds tensor '{tensor}' as it was, and the source now has other bytes there (its header is the same, so only data changed: a fine-tune, a re-download). Layers in this directory made from the earlier bytes: {layers}. A model directory never mixes two versions of a source, so nothing was written: reconvert those layers too (include them in --layers, or convert without --layers), or convert into a new directory", shard.display())]
    SourceChanged {
        /// The source file whose bytes changed.
        shard: PathBuf,
        /// The earliest layer made from its earlier bytes.
        layer: u32,
        /// That layer's file.
        file: String,
        /// The first source tensor of it whose bytes differ now.
        tensor: String,
        /// Every layer found made from earlier bytes, as ranges (`0-3, 7`).
        layers: String,
    },
    /// Arguments that make no sense.
    #[error("{0}")]
    Usage(String),
    /// A file to read is not a regular file (a FIFO, a device, a directory), is over its size
    /// limit, or cannot be opened.
    #[error(transparent)]
    File(#[from] tarfa_format::fsio::FsError),
    /// A GGUF source breaks a GGUF rule, or reading it failed.
    #[error(transparent)]
    Gguf(#[from] tarfa_gguf::Error),
    /// Writing or reading JNF failed.
    #[error(transparent)]
    Format(#[from] tarfa_format::Error),
    /// An I/O call failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What we were doing.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Why a checkpoint (its directory, index or files) cannot be converted: one variant per rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceFault {
    /// The source is not a directory.
    #[error("not a directory")]
    NotADirectory,
    /// Neither an index nor any `*.safetensors` file.
    #[error("no model.safetensors.index.json and no *.safetensors files")]
    NoWeights,
    /// Shards whose headers hold no tensor at all: nothing to convert.
    #[error("the checkpoint holds no tensors; there is no model to convert")]
    NoTensors,
    /// Tensors, but none of a layer (`model.layers.N.*`, `blk.N.*`): a model without its layers.
    #[error("the checkpoint holds no layer tensors (model.layers.N.* or GGUF blk.N.*); there is no model to convert")]
    NoLayers,
    /// A JSON file of the checkpoint does not parse.
    #[error("not valid JSON: {detail}")]
    NotJson {
        /// The JSON parser's message (line and column).
        detail: String,
    },
    /// The index has no `weight_map` object.
    #[error("no weight_map object")]
    NoWeightMap,
    /// A `weight_map` value is not a string.
    #[error("weight_map entry for {tensor:?} is not a file name")]
    WeightMapValue {
        /// The tensor.
        tensor: String,
    },
    /// A shard name that leaves the checkpoint directory (or is empty).
    #[error("shard name {name:?} is not a relative path inside the checkpoint")]
    ShardName {
        /// The name as the index gives it.
        name: String,
    },
    /// A shard holds a tensor the index puts in another shard.
    #[error("tensor '{tensor}': the index puts this tensor in {indexed:?}")]
    IndexedElsewhere {
        /// The tensor.
        tensor: String,
        /// The shard the index names.
        indexed: String,
    },
    /// Two shards hold a tensor of the same name.
    #[error("tensor '{tensor}': also in {other}")]
    TensorInTwoShards {
        /// The tensor.
        tensor: String,
        /// The other shard.
        other: String,
    },
    /// The index lists a tensor its shard's header does not hold.
    #[error(
        "tensor '{tensor}': listed in model.safetensors.index.json but not in the shard's header"
    )]
    IndexedTensorMissing {
        /// The tensor.
        tensor: String,
    },
    /// A name a JNF file cannot hold: over the string limit of spec §5.1.
    #[error(
        "tensor '{prefix}…' ({len} bytes): a name of over {} bytes cannot be written to a JNF file",
        tarfa_format::validate::MAX_STRING_LEN
    )]
    NameTooLong {
        /// The name's first 64 bytes (at a character boundary).
        prefix: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A tensor name a JNF file cannot hold: empty, or with a NUL (spec §5.1).
    #[error("tensor {name:?}: a name that is empty or holds NUL cannot be written to a JNF file")]
    BadName {
        /// The name.
        name: String,
    },
    /// A source file name a JNF file cannot record as a region's source (spec §5.1: a plain
    /// relative path of at most 4096 bytes, no NUL, and no empty, `.`, `..` or `:` component
    /// split at `/` and `\`).
    #[error("source file name {name:?} cannot be recorded in a JNF file (spec §5.1: no empty, '.', '..' or ':' component, no NUL, at most 4096 bytes)")]
    UnrecordableFileName {
        /// The name, relative to the source directory.
        name: String,
    },
    /// A split GGUF whose parts do not match the count its file names give.
    #[error("{opened} parts opened but the file names give {named}")]
    GgufPartCount {
        /// Parts opened.
        opened: usize,
        /// Parts the names give.
        named: usize,
    },
    /// A GGUF header that cannot be held in memory.
    #[error("header larger than memory")]
    GgufHeaderTooLarge,
    /// A file changed between its header's parse and its hash.
    #[error("the file changed while it was being opened")]
    ChangedWhileOpening,
    /// A file changed while the conversion read it.
    #[error("changed while it was being converted ({was} when opened, {now} now): the files written may mix its old and new bytes, so the manifest was not updated; convert again once the file no longer changes")]
    ChangedWhileConverting {
        /// Its identity when opened.
        was: String,
        /// Its identity now.
        now: String,
    },
}

/// Why a layer's experts do not form a complete, uniform grid: one variant per rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpertFault {
    /// Per-expert tensors and fused stacks in one layer.
    #[error("both per-expert and fused (3-D) expert tensors")]
    MixedLayouts,
    /// An expert index below the highest has no tensors.
    #[error("expert {expert} is missing (experts 0..{count} expected)")]
    Missing {
        /// The missing expert.
        expert: u32,
        /// Experts the highest index implies.
        count: u32,
    },
    /// More experts than a JNF file has regions for.
    #[error("{count} experts; a JNF file holds at most {max} regions")]
    TooMany {
        /// Experts claimed.
        count: u64,
        /// `MAX_REGIONS`.
        max: u64,
    },
    /// A fused (stacked) expert tensor of the wrong rank, or with another expert count than the
    /// layer's.
    #[error("fused expert tensor '{tensor}' has shape {shape:?}; expected rank {rank} with {count} experts first")]
    StackShape {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
        /// The rank wanted.
        rank: usize,
        /// The layer's expert count.
        count: u64,
    },
    /// A GGUF expert stack of the wrong rank.
    #[error("expert tensor '{tensor}' has shape {shape:?}; expected {rank} dimensions with experts first")]
    GgufStackRank {
        /// The tensor.
        tensor: String,
        /// Its shape (outermost first).
        shape: Vec<u64>,
        /// The rank wanted.
        rank: usize,
    },
    /// A GGUF expert stack whose expert slices break a GGUF rule.
    #[error("{0}")]
    GgufSlice(tarfa_gguf::Violation),
    /// A GGUF expert stack whose expert `expert` is not expert 0's bytes moved by `expert`
    /// strides (the plan holds a stack as one begin and one stride).
    #[error("expert tensor '{tensor}': expert {expert}'s bytes are not expert 0's moved by {expert} strides")]
    GgufStackStride {
        /// The tensor.
        tensor: String,
        /// The first expert off the stride.
        expert: u64,
    },
    /// Two GGUF expert stacks of one layer with different expert counts.
    #[error("'{tensor}' stacks {} experts but '{first}' stacks {first_count}", count.map_or_else(|| "no".to_string(), |c| c.to_string()))]
    StackCounts {
        /// The tensor.
        tensor: String,
        /// Its expert count (none for a rank-0 tensor).
        count: Option<u64>,
        /// The layer's first stack.
        first: String,
        /// Its expert count.
        first_count: u64,
    },
    /// One expert with two tensors for one projection.
    #[error("expert {expert} has two tensors for one projection (e.g. both w1 and gate_proj)")]
    TwoForOneProjection {
        /// The expert.
        expert: usize,
    },
    /// Experts with different projections.
    #[error("expert {expert} has projections {has:?} but expert 0 has {first:?}")]
    ProjectionsDiffer {
        /// The expert.
        expert: usize,
        /// Its projections.
        has: Vec<&'static str>,
        /// Expert 0's.
        first: Vec<&'static str>,
    },
    /// A fused gate_up beside a separate gate or up.
    #[error("expert {expert} has a fused gate_up beside a separate gate or up")]
    FusedBesideSeparate {
        /// The expert.
        expert: usize,
    },
}

/// Why the output directory (or a file in it) cannot be written: one variant per rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutputFault {
    /// Its manifest lists other source shards.
    #[error("it holds a conversion of another checkpoint (its manifest lists other source shards); use a new directory")]
    OtherCheckpoint,
    /// A file in the way that tarfa would not touch.
    #[error("{why}; tarfa convert writes only into an empty directory or its own output of this source, and touches no other file: move it away or choose a new directory")]
    Foreign {
        /// What the file is.
        why: ForeignFile,
    },
    /// Another `tarfa convert` holds the directory's lock.
    #[error("another tarfa convert is writing into this directory")]
    Locked,
    /// A layer file whose index is not what this checkpoint gives.
    #[error("this layer file was not made from this checkpoint; remove it or use a new directory")]
    NotFromThisSource,
    /// A JNF file holding tensors of a file the source does not have.
    #[error("it holds tensors of {file:?}, which is no file of this source; remove it or use a new directory")]
    TensorsOfOtherFile {
        /// The source file it names.
        file: String,
    },
    /// The output is a file of the source.
    #[error("the output is the source file {rel}; give a directory to write into")]
    IsSourceFile {
        /// The source file.
        rel: String,
    },
    /// The output directory is the source directory.
    #[error("the output directory is the source directory; tarfa never writes into its input")]
    IsSourceDir,
    /// The output directory is inside the source checkpoint's directory.
    #[error("the output directory is inside the source directory {}; tarfa never writes into its input: choose a directory outside it", src.display())]
    InsideSourceDir {
        /// The source directory.
        src: PathBuf,
    },
    /// `-o` names something that is there and is not a directory (a regular file, a device).
    #[error("it is a file, not a directory: give the directory to write the model into (new, empty, or an earlier output of this source)")]
    NotADirectory,
    /// The output directory holds a file of the source.
    #[error("the output directory holds the source {rel}; a model directory holds only the files its manifest lists, so the model could never verify: give another directory (e.g. a new subdirectory)")]
    HoldsSource {
        /// The source file.
        rel: String,
    },
}

/// What a file in the output directory is that `tarfa convert` would not touch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForeignFile {
    /// A directory, a link or a device.
    #[error("not a regular file (a directory, a link or a device)")]
    NotRegular,
    /// `manifest.json` that is no JNF model manifest.
    #[error("not a JNF model manifest")]
    NotAManifest,
    /// A layer file of a layer the checkpoint lacks.
    #[error("this checkpoint has no layer {layer}")]
    NoSuchLayer {
        /// The layer.
        layer: u32,
    },
    /// A `trunk.jnf` or layer file that is not JNF.
    #[error("not a JNF file")]
    NotJnf,
    /// An auxiliary file (config.json, tokenizer) that is not the source's.
    #[error("neither a copy of the source's file of that name nor the copy this directory's manifest lists")]
    OtherAux,
    /// A temporary file `.NAME.tmp-PID` whose PID is a running process: tarfa never removes a
    /// file another program may be writing.
    #[error("a temporary file of process {pid}, which is running (tarfa removes only what a killed conversion left)")]
    LiveWriter {
        /// The process id in the name.
        pid: u32,
    },
    /// A temporary file `.NAME.tmp-PID` whose content is not what tarfa writes under NAME.
    #[error("a temporary file whose content is not what tarfa writes under that name")]
    NotOurTemp,
    /// Any other name.
    #[error("not a file tarfa writes")]
    Unknown,
}
