//! Which tensors to fetch: the MTP head (`--mtp`), names matching globs (`--tensors`), or both.
//!
//! MTP in GGUF: `{arch}.nextn_predict_layers = k` and `{arch}.block_count = n` (which counts the
//! MTP blocks) make blocks `n-k .. n-1` the MTP blocks; every `blk.N.*` tensor of those blocks is
//! taken (the full decoder block and its `blk.N.nextn.*` tensors), and so is any Qwen-style
//! `mtp.*` tensor. In Hugging Face safetensors: `model.layers.{num_hidden_layers + j}.*` for
//! `j < num_nextn_predict_layers` (at least the first, when the key is absent) and `mtp.*`.

/// What to select.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// The MTP head.
    pub mtp: bool,
    /// Glob patterns over tensor names (`*` any run of characters, `?` one character).
    pub globs: Vec<String>,
}

impl Selection {
    /// True when nothing would ever be selected.
    pub fn is_empty(&self) -> bool {
        !self.mtp && self.globs.is_empty()
    }

    /// Whether a glob selects `name`.
    pub fn glob_matches(&self, name: &str) -> bool {
        self.globs.iter().any(|g| glob_match(g, name))
    }
}

/// Shell-style match of the whole `name` against `pattern` (`*`, `?`; everything else literal).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0usize, 0usize);
    // Position of the last `*` and of the name when it was met: backtrack there on a mismatch.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The block index of a GGUF tensor name `blk.N.…`.
pub fn gguf_block(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

/// The layer index of a Hugging Face name `model.layers.N.…`.
pub fn hf_layer(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("model.layers.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

/// A Qwen-style MTP tensor (`mtp.…`, in either naming).
pub fn is_mtp_prefixed(name: &str) -> bool {
    name.starts_with("mtp.") || name.starts_with("model.mtp.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names_with_star_and_question_mark() {
        assert!(glob_match("blk.*.nextn.*", "blk.46.nextn.eh_proj.weight"));
        assert!(glob_match("*", ""));
        assert!(glob_match("blk.?.attn_*", "blk.3.attn_q.weight"));
        assert!(!glob_match("blk.?.attn_*", "blk.13.attn_q.weight"));
        assert!(!glob_match("token_embd", "token_embd.weight"));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("a*b*c", "aXbYbZ"));
    }

    #[test]
    fn block_and_layer_numbers_are_read_from_names() {
        assert_eq!(gguf_block("blk.46.nextn.eh_proj.weight"), Some(46));
        assert_eq!(gguf_block("blk.x.attn"), None);
        assert_eq!(gguf_block("output.weight"), None);
        assert_eq!(hf_layer("model.layers.92.eh_proj.weight"), Some(92));
        assert!(is_mtp_prefixed("mtp.fc.weight"));
        assert!(!is_mtp_prefixed("model.layers.1.mtp_x"));
    }
}
