//! Why a model could not be loaded or decoded. Each variant names what and where.

use std::path::PathBuf;

use tarfa_format::{Dtype, Role};

/// A decode error.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A JNF file broke a rule of the format, or could not be read.
    #[error(transparent)]
    Format(#[from] tarfa_format::Error),
    /// Streaming an expert failed: a read error, or bytes that do not hash to the record.
    #[error(transparent)]
    Stream(#[from] tarfa_runtime::StreamError),
    /// The GPU could not be used or failed.
    #[error("GPU: {0}")]
    Gpu(#[from] tarfa_cuda::CudaError),
    /// A sequence asked what it cannot do.
    #[error(transparent)]
    Sequence(#[from] SequenceFault),
    /// A file of the model directory is not the one its manifest records.
    #[error("{}: not the file the model's manifest names: {fault}; the directory was changed after conversion (tarfa verify names every fault)", path.display())]
    NotInManifest {
        /// The file.
        path: PathBuf,
        /// What differs.
        fault: ManifestMismatch,
    },
    /// The model is a part: layers of its config have no layer file (a `--layers` conversion
    /// of part of the depth). Not damage: converting the missing layers into the directory
    /// makes it whole.
    #[error("{}: the model is incomplete: {} of {layers} layers missing ({}); it runs only with every layer", dir.display(), missing.len(), tarfa_format::manifest::layer_ranges(missing))]
    Incomplete {
        /// The model directory.
        dir: PathBuf,
        /// The layers missing, ascending.
        missing: Vec<u32>,
        /// Layers of the config.
        layers: usize,
    },
    /// The manifest's config (the one computed with) is not the model directory's config.json.
    #[error("{}: the manifest's config differs from the model directory's config.json at {}: one of them was edited after conversion; tarfa verify --source compares both with the checkpoint", dir.display(), keys.join(", "))]
    ConfigFileDiffers {
        /// The model directory.
        dir: PathBuf,
        /// The keys that differ (at most 8).
        keys: Vec<String>,
    },
    /// The model's layers and its config disagree (layers the config does not declare, which
    /// would never run), or a layer count is beyond any model's.
    #[error("{}: {fault}", dir.display())]
    LayerCount {
        /// The model directory.
        dir: PathBuf,
        /// What disagrees.
        fault: tarfa_format::manifest::LayerCountFault,
    },
    /// The architecture config lacks a key, or holds a value this decoder cannot honour.
    #[error("config.json: {key}: {fault}")]
    Config {
        /// The config key.
        key: String,
        /// The rule broken.
        fault: ConfigFault,
    },
    /// A family's plan contradicts itself (a bug in the family's module, not in the model).
    #[error("{family}: the family's plan is inconsistent: {what}")]
    BadPlan {
        /// The family.
        family: &'static str,
        /// What contradicts what.
        what: &'static str,
    },
    /// The model's family has no decoder (yet).
    #[error("no decoder for model_type {model_type:?} (tarfa runs: {supported})")]
    UnsupportedFamily {
        /// `model_type` of the config.
        model_type: String,
        /// The families this build decodes.
        supported: String,
    },
    /// A tensor the family needs is not in the model directory.
    #[error("tensor {name} is missing from the model directory (layer files and trunk.jnf)")]
    MissingTensor {
        /// Its name.
        name: String,
    },
    /// A tensor has the wrong shape or an element type the decoder does not compute with.
    #[error("tensor {name}: {fault}")]
    BadTensor {
        /// Its name.
        name: String,
        /// The rule broken.
        fault: TensorFault,
    },
    /// An expert's regions are not what the family needs.
    #[error("expert (layer {layer}, expert {expert}): {fault}")]
    BadExpert {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
        /// The rule broken.
        fault: ExpertFault,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (vocab_size {vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A position past what the decoder was asked to hold.
    #[error("position {pos} is past the context limit {limit}")]
    ContextFull {
        /// The position.
        pos: usize,
        /// The limit.
        limit: usize,
    },
    /// A system call on a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Options this build, this machine or this decoder's state cannot honour.
    #[error("{0}")]
    Options(OptionsFault),
    /// The decoder's thread team could not be started.
    #[error("cannot start {threads} threads: {source}")]
    ThreadPool {
        /// Threads asked.
        threads: usize,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// A `.npy` file that is not a 1-D or 2-D little-endian float array in C order.
    #[error("{}: {fault}", path.display())]
    Npy {
        /// The file.
        path: PathBuf,
        /// The rule broken.
        fault: NpyFault,
    },
    /// A GGUF-sourced model's key/values (kept in the manifest) lack a key, hold a value this
    /// decoder cannot honour, or name an architecture it does not run.
    #[error("GGUF key {key}: {fault}")]
    Gguf {
        /// The GGUF key.
        key: String,
        /// The rule broken.
        fault: GgufFault,
    },
}

/// Result of decoding.
pub type Result<T> = std::result::Result<T, DecodeError>;

/// How a file of the model directory differs from what its manifest records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestMismatch {
    /// A JNF file's root digest is not the manifest's.
    #[error("root digest {found} differs from the manifest's {recorded}")]
    RootDigest {
        /// Its SHA-256 root digest, hex.
        found: String,
        /// The manifest's, hex.
        recorded: String,
    },
    /// An aux file's SHA-256 is not the manifest's.
    #[error("SHA-256 {found} differs from the manifest's {recorded}")]
    Sha256 {
        /// Its SHA-256, hex.
        found: String,
        /// The manifest's, hex.
        recorded: String,
    },
    /// An aux file's size is not the manifest's.
    #[error("size differs from the manifest's {expected} bytes")]
    Size {
        /// The manifest's size.
        expected: u64,
    },
}

/// What is wrong with a tensor the decoder reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorFault {
    /// An element type this build does not compute with.
    #[error("{}", crate::quant::QuantError::Unsupported { dtype: *dtype })]
    Unsupported {
        /// The type.
        dtype: Dtype,
    },
    /// A dtype code not in the table.
    #[error("unknown dtype code {code}")]
    UnknownDtype {
        /// The code.
        code: u32,
    },
    /// A shape whose element count overflows this machine's sizes.
    #[error("shape {shape:?} overflows")]
    ShapeOverflow {
        /// The shape.
        shape: Vec<u64>,
    },
    /// Stored bytes of another length than the shape takes.
    #[error("{bytes} bytes for shape {shape:?} of {dtype}, which takes {want}")]
    ByteLength {
        /// Bytes stored.
        bytes: usize,
        /// The shape.
        shape: Vec<usize>,
        /// The type.
        dtype: Dtype,
        /// Bytes the shape takes.
        want: u64,
    },
    /// A shape that is not whole rows of the type's blocks.
    #[error("shape {shape:?} is not whole rows of {dtype} blocks of {block_elems}")]
    PartialBlock {
        /// The shape.
        shape: Vec<usize>,
        /// The type.
        dtype: Dtype,
        /// Elements per block.
        block_elems: usize,
    },
    /// The bytes could not be dequantised.
    #[error("{0}")]
    Quant(crate::quant::QuantError),
    /// Decoded elements of another count than the shape's.
    #[error("{elems} elements for shape {shape:?}")]
    ElementCount {
        /// Elements decoded.
        elems: usize,
        /// The shape.
        shape: Vec<usize>,
    },
    /// Another shape than the family needs.
    #[error("shape {shape:?}, expected {expected:?}")]
    Shape {
        /// Its shape.
        shape: Vec<usize>,
        /// The shape needed.
        expected: Vec<usize>,
    },
    /// One half of a tensor stored in two without the other.
    #[error("present without {missing}, its other half")]
    Unpaired {
        /// The missing half.
        missing: String,
    },
    /// A tensor stored both whole and in halves.
    #[error("present beside {other}: a layer holds one form or the other")]
    BothForms {
        /// The other form.
        other: String,
    },
    /// A GGUF token embedding whose row length is not the hidden size.
    #[error("shape {shape:?} (row-major), expected [vocab, {hidden}]")]
    EmbeddingShape {
        /// Its shape.
        shape: Vec<usize>,
        /// The hidden size.
        hidden: u64,
    },
    /// A GGUF tensor the family's decoder has no use for.
    #[error("a GGUF tensor with no meaning in tarfa's {model_type} decoder (llama.cpp architecture {gguf_arch}); refusing rather than leaving it out of the computation")]
    NoMeaning {
        /// The decoder's `model_type`.
        model_type: &'static str,
        /// llama.cpp's architecture name.
        gguf_arch: &'static str,
    },
    /// Two tensors renamed to one name.
    #[error("renamed to {new}, which {first} is renamed to as well")]
    RenameClash {
        /// The name both get.
        new: String,
        /// The other tensor renamed to it.
        first: String,
    },
}

/// What is wrong with an expert's regions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExpertFault {
    /// The expert is not in the model's layer files.
    #[error("not in the model's layer files")]
    NotInModel,
    /// A role code not in the table.
    #[error("unknown role code {code}")]
    UnknownRole {
        /// The code.
        code: u32,
    },
    /// A dtype code not in the table.
    #[error("unknown dtype code {code}")]
    UnknownDtype {
        /// The code.
        code: u32,
    },
    /// A region of an element type this build does not compute with.
    #[error("region {region}: {}", crate::quant::QuantError::Unsupported { dtype: *dtype })]
    Unsupported {
        /// The region name.
        region: String,
        /// The type.
        dtype: Dtype,
    },
    /// A region outside the expert's extent.
    #[error("region {region} lies outside its extent")]
    OutsideExtent {
        /// The region name.
        region: String,
    },
    /// A region of rank other than 1 or 2.
    #[error("region {region} has shape {shape:?}")]
    Rank {
        /// The region name.
        region: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A region's bytes are not a whole number of blocks.
    #[error("region {region} ({dtype}): {bytes} bytes are not a whole number of blocks")]
    PartialBlock {
        /// The region name.
        region: String,
        /// The type.
        dtype: Dtype,
        /// Its bytes.
        bytes: usize,
    },
    /// A region's element count or row length does not fit its shape.
    #[error("region {region} ({dtype}): {elems} elements for shape {shape:?} (rows of whole {block_elems}-element blocks)")]
    ElementCount {
        /// The region name.
        region: String,
        /// The type.
        dtype: Dtype,
        /// Elements held.
        elems: usize,
        /// Its shape.
        shape: Vec<usize>,
        /// Elements per block.
        block_elems: usize,
    },
    /// A projection role the family's experts do not have (a bias).
    #[error("has a {} region; this family's experts have none", role.name())]
    ForeignRole {
        /// The role.
        role: Role,
    },
    /// No down projection.
    #[error("no down projection")]
    NoDown,
    /// Neither gate and up nor one fused gate_up (of an even row count).
    #[error("needs gate and up projections, or one fused gate_up")]
    NoGateUp,
    /// Projection shapes that do not fit each other or the hidden size.
    #[error("shapes gate [{}, {}], up [{}, {}], down [{}, {}] do not fit hidden size {hidden}", gate[0], gate[1], up[0], up[1], down[0], down[1])]
    ShapesMisfit {
        /// `[rows, cols]` of gate.
        gate: [usize; 2],
        /// `[rows, cols]` of up.
        up: [usize; 2],
        /// `[rows, cols]` of down.
        down: [usize; 2],
        /// The hidden size.
        hidden: usize,
    },
    /// A quantised expert on the GPU (placement refuses it).
    #[error("a quantised expert cannot run on the GPU (placement refuses it)")]
    QuantisedOnGpu,
    /// Gate and up of different element types on the GPU (placement refuses it).
    #[error("gate and up of different element types cannot run on the GPU (placement refuses it)")]
    MixedGateUpOnGpu,
}

/// What is wrong with a key of the architecture config.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigFault {
    /// The config itself is not a JSON object.
    #[error("the architecture config is not a JSON object")]
    NotAnObject,
    /// A config file of the model directory that is not a JSON object.
    #[error("not a JSON object: {detail}")]
    FileNotJson {
        /// The parser's words.
        detail: String,
    },
    /// A required key is absent.
    #[error("missing")]
    Missing,
    /// A value that is not a string.
    #[error("not a string")]
    NotAString,
    /// A value that is not a non-negative integer.
    #[error("{value} is not a non-negative integer")]
    NotUnsigned {
        /// The value, as JSON.
        value: String,
    },
    /// An integer over the decoder's limit.
    #[error("{value} is over the limit {limit}")]
    OverLimit {
        /// The value.
        value: u64,
        /// The limit.
        limit: usize,
    },
    /// A zero where at least 1 is needed.
    #[error("must be at least 1")]
    Zero,
    /// A value that is not a number.
    #[error("{value} is not a number")]
    NotANumber {
        /// The value, as JSON.
        value: String,
    },
    /// A value that is not a boolean.
    #[error("{value} is not a boolean")]
    NotABool {
        /// The value, as JSON.
        value: String,
    },
    /// A value that is not a list.
    #[error("{value} is not a list")]
    NotAList {
        /// The value, as JSON.
        value: String,
    },
    /// A list element that is not an integer.
    #[error("element {value} is not an integer")]
    ElementNotInteger {
        /// The element, as JSON.
        value: String,
    },
    /// A value that is not an object.
    #[error("{value} is not an object")]
    NotAnObjectValue {
        /// The value, as JSON.
        value: String,
    },
    /// A value this build does not decode (a RoPE type, an activation).
    #[error("{value:?} is not decoded by this build (only \"{supported}\")")]
    Unsupported {
        /// The value.
        value: String,
        /// The one value decoded.
        supported: &'static str,
    },
    /// A RoPE base that is not finite (as f32 too) and over 1.
    #[error("{theta} is not a finite base > 1")]
    RopeTheta {
        /// The base.
        theta: f64,
    },
    /// A partial rotary factor outside (0, 1].
    #[error("{factor} is not in (0, 1]")]
    RotaryFactor {
        /// The factor.
        factor: f64,
    },
    /// A rotary width that is odd or zero.
    #[error("gives {rotary_dim} rotary dimensions of a {head_dim}-wide head; it must be even and non-zero")]
    RotaryDims {
        /// Rotary dimensions.
        rotary_dim: usize,
        /// Head width.
        head_dim: usize,
    },
    /// A count that does not divide another key's.
    #[error("{value} does not divide {of_key} {of}")]
    NotADivisor {
        /// The value.
        value: usize,
        /// The other key.
        of_key: &'static str,
        /// Its value.
        of: usize,
    },
    /// A count that is not a multiple of another key's.
    #[error("{value} is not a multiple of {of_key} {of}")]
    NotAMultiple {
        /// The value.
        value: usize,
        /// The other key.
        of_key: &'static str,
        /// Its value.
        of: usize,
    },
    /// An RMS norm epsilon that is not a finite non-negative number.
    #[error("{value} is not a finite non-negative number")]
    Epsilon {
        /// The value.
        value: f64,
    },
    /// A number that is not finite (as f32 too).
    #[error("{value} is not a finite number")]
    NotFinite {
        /// The value.
        value: f64,
    },
    /// A number that must be finite and above zero.
    #[error("{value} is not a finite number above zero")]
    NotPositive {
        /// The value.
        value: f64,
    },
    /// A count outside `1..=max`.
    #[error("{value} is not in 1..={max}")]
    OutOfRange {
        /// The value.
        value: usize,
        /// The largest allowed.
        max: usize,
    },
    /// Expert groups of fewer than two experts.
    #[error("groups of {size} expert; a group needs two")]
    GroupTooSmall {
        /// Experts per group.
        size: usize,
    },
    /// `layer_types` of another length than the layers.
    #[error("{entries} entries for {layers} layers")]
    LayerTypesCount {
        /// Entries.
        entries: usize,
        /// Layers.
        layers: usize,
    },
    /// A `layer_types` entry that is neither kind.
    #[error("{value} is not \"full_attention\" or \"linear_attention\"")]
    LayerType {
        /// The entry, as JSON.
        value: String,
    },
}

/// What is wrong with a key/value of a GGUF source (kept in the manifest).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufFault {
    /// The key/values are not a JSON object.
    #[error("the architecture config of a GGUF source is not an object")]
    NotAnObject,
    /// A key/value without its `"type"`.
    #[error("not a typed GGUF value (no \"type\")")]
    NoType,
    /// A key/value without its `"value"`.
    #[error("not a typed GGUF value (no \"value\")")]
    NoValue,
    /// A required key is absent.
    #[error("missing")]
    Missing,
    /// A required key with no safe default is absent.
    #[error("missing (no default is safe)")]
    MissingNoDefault,
    /// An integer value that is negative or not an integer.
    #[error("{value} is not a non-negative integer")]
    NotUnsigned {
        /// The value, as JSON.
        value: String,
    },
    /// A per-layer array where one value is decoded.
    #[error("a per-layer array; only one value for every layer is supported")]
    PerLayerArray,
    /// A value of another GGUF type than the key needs.
    #[error("has type {found}, expected {expected}")]
    WrongType {
        /// The type found.
        found: String,
        /// The type needed, in words.
        expected: &'static str,
    },
    /// A float that is not finite.
    #[error("{value} is not a finite number")]
    NotFinite {
        /// The value, as JSON.
        value: String,
    },
    /// A bool value that is not a boolean.
    #[error("{value} is not a boolean")]
    NotABool {
        /// The value, as JSON.
        value: String,
    },
    /// A string value that is not a string.
    #[error("{value} is not a string")]
    NotAString {
        /// The value, as JSON.
        value: String,
    },
    /// An array of another element type than needed.
    #[error("an array of {elem}, expected {}", expected.join(" or "))]
    WrongElement {
        /// The element type found.
        elem: String,
        /// The element types accepted.
        expected: Vec<&'static str>,
    },
    /// An array whose value is not a list.
    #[error("the array value is not a list")]
    NotAList,
    /// An architecture this build does not run.
    #[error("{arch:?} is not run by this build (GGUF architectures run: {})", crate::gguf_model::supported().map(|(g, f)| format!("{g} (as {f})")).collect::<Vec<_>>().join(", "))]
    UnsupportedArch {
        /// The architecture.
        arch: String,
    },
    /// MTP layers that leave no decoder layer.
    #[error("{nextn} leaves no decoder layer of block_count {blocks}")]
    NoDecoderLayer {
        /// `nextn_predict_layers`.
        nextn: u64,
        /// `block_count`.
        blocks: u64,
    },
    /// A block the key/values call an MTP (nextn) layer that holds no `nextn.*` tensor: an
    /// ordinary block, which the decoder would skip.
    #[error("{nextn} makes blk.{block} an MTP (nextn) layer, but it holds no blk.{block}.nextn.* tensor: it is an ordinary block, which would never run")]
    NotAnMtpBlock {
        /// `nextn_predict_layers`.
        nextn: u64,
        /// The block.
        block: u64,
    },
    /// A zero where at least 1 is needed.
    #[error("must be at least 1")]
    Zero,
    /// A value head size other than the key head size.
    #[error("{value_length} differs from the key length {key_length}; the families need equal q/k and v head sizes")]
    ValueLength {
        /// `attention.value_length`.
        value_length: u64,
        /// `attention.key_length` (or hidden / heads).
        key_length: u64,
    },
    /// A RoPE scaling this build does not decode.
    #[error("{kind:?}: RoPE scaling is not decoded by this build")]
    RopeScaling {
        /// `rope.scaling.type`.
        kind: String,
    },
    /// Rotary dimensions of zero or wider than the head.
    #[error("{rot} rotary dimensions of a {head_dim}-wide head")]
    RotaryDims {
        /// `rope.dimension_count`.
        rot: u64,
        /// The head width.
        head_dim: u64,
    },
    /// No `feed_forward_length` while dense layers need it.
    #[error("missing, and layers {dense:?} are dense")]
    DenseWithoutWidth {
        /// The dense layers.
        dense: Vec<u64>,
    },
    /// A partial rotation where qwen3_moe rotates the whole head.
    #[error("{rot} of a {head_dim}-wide head: qwen3_moe rotates the whole head")]
    PartialRotation {
        /// `rope.dimension_count`.
        rot: u64,
        /// The head width.
        head_dim: u64,
    },
    /// qwen3moe without top-k renormalisation.
    #[error("false, but llama.cpp's qwen3moe always renormalises the top-k weights; the file contradicts its architecture")]
    NoRenormalisation,
    /// A qwen3moe gating function other than softmax.
    #[error("{found}: qwen3moe routes by softmax (1)")]
    NotSoftmax {
        /// The gating function.
        found: u64,
    },
    /// Shared experts in a qwen3moe.
    #[error("{count}: qwen3_moe has no shared experts")]
    SharedExperts {
        /// `expert_shared_count`.
        count: u64,
    },
    /// A glm4moe or deepseek2 gating function other than sigmoid.
    #[error("{found}: the family routes by sigmoid (2); nothing else is decoded")]
    NotSigmoid {
        /// The gating function.
        found: u64,
    },
    /// No gating function in a deepseek2 GGUF, which llama.cpp takes as softmax.
    #[error("missing, which llama.cpp's deepseek2 takes as softmax routing (DeepSeek-V2's); deepseek_v3 routes by sigmoid (2), which a DeepSeek-V3 GGUF says")]
    SoftmaxByDefault,
    /// An MLA width the other key/values contradict.
    #[error("{found}, but MLA needs {rule} = {expected}")]
    MlaWidth {
        /// The value found.
        found: u64,
        /// What it must equal, in words.
        rule: &'static str,
        /// What the other keys give.
        expected: u64,
    },
    /// One of the two MLA head widths without the other.
    #[error("present without {other}")]
    MlaHalf {
        /// The missing key.
        other: &'static str,
    },
    /// A width above what tarfa reads.
    #[error("{value} is above the most tarfa reads ({max})")]
    TooLarge {
        /// The value.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// A key/value llama.cpp computes with in a way no transformers config reproduces.
    #[error("{value}: {why}")]
    NoEquivalent {
        /// The value (or "missing").
        value: String,
        /// Why, in words.
        why: &'static str,
    },
    /// M-RoPE sections.
    #[error("M-RoPE (the vision model's sections) is not decoded by this build")]
    MRope,
    /// A rotary width transformers' factor does not give back.
    #[error("{rot} of {head_dim} is not a factor transformers reproduces")]
    RotaryFactor {
        /// `rope.dimension_count`.
        rot: u64,
        /// The head width.
        head_dim: u64,
    },
    /// A shared-expert width other than width × count.
    #[error("{found} is not expert_feed_forward_length {width} × expert_shared_count {count}, the only shared width glm4_moe has")]
    SharedWidth {
        /// `expert_shared_feed_forward_length`.
        found: u64,
        /// `expert_feed_forward_length`.
        width: u64,
        /// `expert_shared_count`.
        count: u64,
    },
    /// Leading dense layers other than the layers without a router.
    #[error("{lead}, but the layers without a router (ffn_gate_inp) are {dense:?}")]
    DenseLayers {
        /// `leading_dense_block_count`.
        lead: u64,
        /// The layers without a router.
        dense: Vec<u64>,
    },
    /// No tokenizer.
    #[error("missing: the GGUF has no tokenizer")]
    NoTokenizer,
    /// A tokenizer model other than gpt2.
    #[error("{model:?}: only \"gpt2\" (byte-level BPE) is rebuilt from a GGUF")]
    TokenizerModel {
        /// `tokenizer.ggml.model`.
        model: String,
    },
    /// No pre-tokenizer.
    #[error("missing: the pre-tokenizer is unknown")]
    NoPreTokenizer,
    /// A pre-tokenizer this build does not rebuild.
    #[error("{pre:?} is not rebuilt (supported: {})", crate::gguf_model::SUPPORTED_PRE.join(", "))]
    PreTokenizer {
        /// `tokenizer.ggml.pre`.
        pre: String,
    },
    /// Too few or too many tokens.
    #[error("{count} tokens, expected 1..={max}")]
    TokenCount {
        /// Tokens.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// No merges.
    #[error("missing: a BPE needs its merges")]
    NoMerges,
    /// Too many merges.
    #[error("{count} merges, over the limit {max}")]
    MergeCount {
        /// Merges.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// Token types of another count than the tokens.
    #[error("{types} types for {tokens} tokens")]
    TypeCount {
        /// Types.
        types: usize,
        /// Tokens.
        tokens: usize,
    },
    /// An array element that is not a string.
    #[error("element {index} is not a string")]
    ElementNotAString {
        /// Its index.
        index: usize,
    },
    /// A merge that is not two tokens separated by one space.
    #[error("element {index} {merge:?} is not two tokens separated by one space")]
    BadMerge {
        /// Its index.
        index: usize,
        /// The merge.
        merge: String,
    },
}

/// Why options or a call cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsFault {
    /// An instruction-set path unknown or not run by this CPU.
    #[error("{0}")]
    Isa(crate::kernels::IsaFault),
    /// A GPU asked of a build without CUDA.
    #[error("this build of tarfa has no CUDA support (rebuild with `cargo build --release --features cuda`)")]
    NoCuda,
    /// `--experts resident` with less memory available than the experts take.
    #[error("--experts resident needs {:.1} GiB for the experts and {:.1} GiB of memory is available; stream them instead (--experts stream, with --cache-gib for a RAM cache)", gib(*need), gib(*available))]
    ResidentTooLarge {
        /// Bytes of the experts.
        need: u64,
        /// Bytes of memory available.
        available: u64,
    },
    /// `--n-cpu-moe` beyond the model's layers.
    #[error("--n-cpu-moe {asked}: the model has {layers} layers")]
    CpuMoeLayers {
        /// Layers asked.
        asked: usize,
        /// Layers the model has.
        layers: usize,
    },
    /// `--n-cpu-moe` leaving more on the GPU than the VRAM it may use holds.
    #[error("--n-cpu-moe {asked} leaves {:.2} GiB on the GPU, beyond the {:.2} GiB it may use (the weights and a margin of 1 GiB); the experts of the first {fewest} layers on the CPU fit", gib(*need), gib(*limit))]
    CpuMoeTooFew {
        /// Layers asked.
        asked: usize,
        /// Bytes that leaves on the GPU (with the margin).
        need: u64,
        /// Bytes it may use (with the margin).
        limit: u64,
        /// The fewest layers that fit.
        fewest: usize,
    },
    /// A generation asked with an empty prompt.
    #[error("the prompt has no tokens")]
    EmptyPrompt,
    /// The whole forward pass on the GPU asked of a model whose MoE layer does not hold exactly
    /// the experts `0..num_experts` (the kernels read a layer's experts as one array).
    #[error("layer {layer} does not hold experts 0..{num_experts} (the config's num_experts)")]
    WholeModelExperts {
        /// The layer.
        layer: usize,
        /// The config's `num_experts`.
        num_experts: usize,
    },
}

/// Why a [`crate::Sequence`] cannot do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequenceFault {
    /// A recurrent state left unknown by a pass that failed part-way.
    #[error("{family}: an earlier pass failed part-way, so this sequence's recurrent state is unknown; truncate it to 0 (or start a new one)")]
    Unknown {
        /// The family.
        family: &'static str,
    },
    /// A truncation that would rewind a recurrent state.
    #[error("{family}: this sequence holds {at} positions and its recurrent state cannot be rewound to {asked}; only truncating to {at} or 0 is possible (fork the sequence before tokens you may take back)")]
    CannotRewind {
        /// The family.
        family: &'static str,
        /// Where its state stands.
        at: usize,
        /// The length asked.
        asked: usize,
    },
    /// A truncation past the end.
    #[error("a sequence of {len} positions cannot be truncated to {asked}")]
    Beyond {
        /// Positions held.
        len: usize,
        /// The length asked.
        asked: usize,
    },
    /// A sequence another decoder made.
    #[error("this sequence was made by another decoder")]
    Foreign,
    /// A pass that would take a sequence past the model's context.
    #[error("{asked} positions exceed the model's context of {limit} (max_position_embeddings)")]
    ContextFull {
        /// The model's context.
        limit: usize,
        /// Positions the pass would take the sequence to.
        asked: usize,
    },
    /// A sequence whose layer does not hold the state its layer kind needs.
    #[error("layer {layer} of the sequence does not hold the state of the model's layer")]
    Layout {
        /// The layer.
        layer: usize,
    },
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Why bytes are not a `.npy` array the decoder reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NpyFault {
    /// No `.npy` magic.
    #[error("not a .npy file (magic)")]
    NotNpy,
    /// A format version not read.
    #[error("unsupported .npy version {version}")]
    Version {
        /// The version byte.
        version: u8,
    },
    /// A header past the end of the bytes.
    #[error("header runs past the end")]
    HeaderPastEnd,
    /// A header that is not UTF-8.
    #[error("header is not UTF-8")]
    HeaderNotUtf8,
    /// A dtype other than `<f4` and `<f8`.
    #[error("dtype is not <f4 or <f8: {header}")]
    Dtype {
        /// The header.
        header: String,
    },
    /// Fortran order.
    #[error("Fortran order is not read")]
    FortranOrder,
    /// No shape in the header.
    #[error("no shape")]
    NoShape,
    /// A shape entry that is not a number.
    #[error("shape {shape:?}: {entry:?} is not a dimension")]
    BadDimension {
        /// The shape text.
        shape: String,
        /// The entry.
        entry: String,
    },
    /// A shape of rank other than 1 or 2.
    #[error("shape ({shape}) is not 1-D or 2-D")]
    Rank {
        /// The shape text.
        shape: String,
    },
    /// A shape whose byte count overflows.
    #[error("shape overflows")]
    ShapeOverflow,
    /// Data bytes of another count than the shape's.
    #[error("{bytes} data bytes for shape ({shape})")]
    DataLength {
        /// Data bytes.
        bytes: usize,
        /// The shape text.
        shape: String,
    },
}
