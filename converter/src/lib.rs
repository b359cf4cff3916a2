//! # tarfa-converter
//!
//! Turns Hugging Face safetensors checkpoints and GGUF files into JNF v1 model directories, one
//! layer range at a time (`tarfa convert --layers A-B`). It is built in its own issues (HF BF16
//! conversion; GGUF reading and conversion) on top of [`tarfa_format::JnfWriter`]; until then this
//! crate holds no code, and the `tarfa` binary offers no `convert` command.
