//! # tarfa-decode
//!
//! Exact decoding of a JNF model directory on the CPU. The output is a function of the
//! checkpoint's bytes and the tokens alone: not of the I/O backend, queue depth, ring or cache
//! size, thread count, instruction set or whether a prompt ran as one batch. The way there is
//! the canonical reduction order (`spec/EXACTNESS.md`), implemented once as a scalar reference
//! ([`canon`]) and again per instruction set ([`kernels`]) with identical bits.
//!
//! - [`canon`]: the order of every sum, tarfa's own `exp`/`sigmoid`/`silu`/`rsqrt` and the `f64`
//!   helpers of the RoPE tables; the scalar reference of every kernel.
//! - [`kernels`]: [`Isa`] (scalar, AVX2+FMA, AVX-512) chosen once; matrix products split across
//!   threads only along outputs.
//! - [`weights`]: the checkpoint's bytes viewed as weights (BF16 widened at use); the resident
//!   [`TensorStore`], every region hash-checked.
//! - [`quant`]: GGUF quantised types (Q4_0 … Q6_K, TQ, IQ4, MXFP4) dequantised to `f32` bit for bit as gguf-py
//!   does; a quantised row's dot is the `f32` canonical dot of its dequantised values.
//! - [`experts`]: routed experts streamed through the runtime's `ExpertSource`, cached in RAM,
//!   or all resident.
//! - [`rope`], [`blocks`]: RoPE as transformers computes it; norms, attention with a KV cache,
//!   router, SwiGLU, the expert combine.
//! - [`family`]: one module per model family (`qwen3_moe`, `qwen3_5_moe` (text and the VL
//!   checkpoint's text model), `glm4_moe`, `mixtral`) over the shared parts in `family::common`.
//! - [`gguf_model`]: a GGUF-sourced model (llama.cpp's `qwen3moe`, `glm4moe`) run by those
//!   families: llama.cpp tensor names renamed to transformers names at load, the family's
//!   `config.json` synthesised from the GGUF key/values kept in the manifest (llama.cpp's
//!   semantics where its graph hard-codes them, e.g. qwen3moe always renormalises the top-k),
//!   and a byte-level BPE tokenizer rebuilt from `tokenizer.ggml.*`. The weights are the same
//!   bytes either way, so the logits are the same bits as the safetensors-sourced model's.
//! - [`offload`]: where routed experts are computed: the CPU, or (feature `cuda`, module `gpu`)
//!   the GPU for all or a share of them, with a VRAM cache; the same bits either way.
//! - [`sequence`]: [`Sequence`], a sequence's state apart from the model (KV caches, DeltaNet
//!   states, position): created, forked and truncated; any number share one [`Decoder`].
//! - [`session`]: [`Decoder`], greedy generation and its figures; [`npy`] for logits files.
//!
//! `unsafe` lives only in `kernels/x86.rs` (intrinsics behind run-time feature detection).

#![deny(unsafe_code)]

pub mod blocks;
pub mod canon;
pub mod config;
pub mod error;
pub mod experts;
pub mod family;
pub mod gguf_model;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod gpu_resident;
pub mod kernels;
pub mod npy;
pub mod offload;
pub mod quant;
pub mod rope;
pub mod sequence;
pub mod session;
pub mod team;
pub mod text;
pub mod weights;

pub use error::{DecodeError, Result};
pub use experts::{ExpertMode, ExpertOptions, ExpertStats};
pub use kernels::Isa;
pub use offload::{Device, GpuOptions, OffloadReport};
pub use sequence::Sequence;
pub use session::{argmax, AuxFile, Decoder, DecoderOptions, PhaseStats};
pub use weights::TensorStore;
